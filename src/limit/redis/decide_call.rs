//! One `decide.lua` call: the requests of a batch put into its arguments (each key and each
//! shape of buckets sent once), and its binary reply read back, strictly.

use std::collections::HashMap;

use redis::Script;
use smallvec::SmallVec;

use super::server_clock::{LateCalls, ServerClock};
use crate::limit::{BucketRequest, Charge, StoreError, Verdict};

/// What `decide.lua` needs to know of one bucket besides its key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct BucketArguments {
    capacity: f64,
    rate: f64,
    cost: f64,
    enforce: bool,
    /// Tokens a delaying bucket may book below zero (`on_limit = "delay"`); 0: none.
    debt: f64,
    /// 0: not adaptive. For a quota: the end of its period (Unix seconds).
    factor: f64,
    /// For a quota: the end of the next period.
    min_capacity: f64,
    /// A concurrency limit's slots (`capacity` of them, each a lease of `rate` milliseconds),
    /// not a bucket.
    lease: bool,
}

impl BucketArguments {
    pub(super) fn of(request: &BucketRequest<'_>) -> BucketArguments {
        let (factor, min_capacity) = match (request.charge.period, request.adaptive) {
            (Some(period), _) => (period.end as f64, period.next_end as f64),
            (None, Some(params)) => (params.factor, params.min_capacity),
            (None, None) => (0.0, 0.0),
        };
        BucketArguments {
            capacity: request.charge.capacity,
            rate: request.charge.rate,
            cost: request.charge.cost,
            enforce: request.charge.enforce,
            debt: request.charge.debt,
            factor,
            min_capacity,
            lease: false,
        }
    }

    /// A concurrency limit of `slots`, each a lease lasting `lease`.
    pub(super) fn lease(slots: u32, lease: std::time::Duration) -> BucketArguments {
        BucketArguments {
            capacity: f64::from(slots),
            rate: lease.as_millis() as f64,
            cost: 1.0,
            enforce: true,
            debt: 0.0,
            factor: 0.0,
            min_capacity: 0.0,
            lease: true,
        }
    }

    pub(super) fn is_lease(&self) -> bool {
        self.lease
    }

    /// `decide.lua`'s enforce number: 1, 0 for shadow, 2 for concurrency slots, or for a
    /// delaying bucket the (negative) tokens it may book down to.
    fn enforce_code(&self) -> f64 {
        match self {
            BucketArguments { lease: true, .. } => 2.0,
            BucketArguments { enforce: false, .. } => 0.0,
            BucketArguments { debt, .. } if *debt > 0.0 => -debt,
            _ => 1.0,
        }
    }
}

/// The buckets of one request, inline for the usual handful.
pub(super) type Shape = SmallVec<[BucketArguments; 4]>;

/// The reply of `decide.lua` for one request.
#[derive(Debug, PartialEq)]
pub(super) struct RequestReply {
    pub admitted: bool,
    pub buckets: Vec<BucketReply>,
}

/// What `decide.lua` says of one bucket of a request.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct BucketReply {
    /// Tokens after the decision.
    pub tokens: f64,
    pub sufficient: bool,
    /// The request booked the tokens it lacked and waits for them.
    pub booked: bool,
    /// The key's adaptive penalty (1: none).
    pub multiplier: f64,
}

impl BucketReply {
    /// The verdict for the bucket that `charge` (as configured) describes.
    pub(super) fn verdict(&self, charge: &Charge) -> Verdict {
        let charge = charge.scaled(self.multiplier);
        if self.booked {
            Verdict::booked(&charge, self.tokens)
        } else {
            Verdict::observed(&charge, self.tokens, self.sufficient)
        }
    }
}

/// One `decide.lua` call being put together: each key is sent once, and so is each shape (the
/// numbers of a request's buckets, the same for every request of a route); a request is its
/// shape's index and its keys' indexes.
pub(super) struct DecideCall<'a> {
    keys: Vec<&'a str>,
    key_indexes: HashMap<&'a str, usize, foldhash::fast::RandomState>,
    shapes: Vec<&'a [BucketArguments]>,
    /// Per request: its shape's index, then its keys' indexes (all 1-based, as Lua counts),
    /// then the name of its leases if its shape has slots.
    requests: Vec<RequestArgument<'a>>,
    /// Buckets per request, to read the reply.
    bucket_counts: Vec<usize>,
}

impl<'a> DecideCall<'a> {
    pub(super) fn new() -> DecideCall<'a> {
        DecideCall {
            keys: Vec::new(),
            key_indexes: HashMap::default(),
            shapes: Vec::new(),
            requests: Vec::new(),
            bucket_counts: Vec::new(),
        }
    }

    /// Adds a request: its buckets' keys and numbers, in the same order, and the name of its
    /// leases when the shape has concurrency slots.
    pub(super) fn push(
        &mut self,
        keys: impl IntoIterator<Item = &'a str>,
        shape: &'a [BucketArguments],
        lease: Option<&'a str>,
    ) {
        let shape_index = match self.shapes.iter().position(|known| *known == shape) {
            Some(index) => index,
            None => {
                self.shapes.push(shape);
                self.shapes.len() - 1
            }
        };
        self.requests.push(RequestArgument::Index(shape_index + 1));
        let before = self.requests.len();
        for key in keys {
            let next = self.keys.len();
            let index = *self.key_indexes.entry(key).or_insert(next);
            if index == next {
                self.keys.push(key);
            }
            self.requests.push(RequestArgument::Index(index + 1));
        }
        debug_assert_eq!(
            self.requests.len() - before,
            shape.len(),
            "a key per bucket"
        );
        if shape.iter().any(BucketArguments::is_lease) {
            debug_assert!(lease.is_some(), "slots are taken in a lease's name");
            self.requests
                .push(RequestArgument::Lease(lease.unwrap_or_default()));
        }
        self.bucket_counts.push(shape.len());
    }

    /// The call, with its deadline in the server's time (microseconds; 0: none): the keys,
    /// then one binary argument (little-endian) that `decide.lua` reads with `struct.unpack`.
    pub(super) fn command(&self, script: &Script, deadline: u64) -> redis::Cmd {
        let key_bytes = self.keys.iter().map(|key| key.len()).sum::<usize>();
        let mut arguments = Vec::with_capacity(
            10 + self
                .shapes
                .iter()
                .map(|shape| 2 + 48 * shape.len())
                .sum::<usize>()
                + 4 * self.requests.len(),
        );
        arguments.extend_from_slice(&(deadline as f64).to_le_bytes());
        push_u16(&mut arguments, self.shapes.len());
        for shape in &self.shapes {
            push_u16(&mut arguments, shape.len());
            for bucket in shape.iter() {
                for number in [
                    bucket.capacity,
                    bucket.rate,
                    bucket.cost,
                    bucket.enforce_code(),
                    bucket.factor,
                    bucket.min_capacity,
                ] {
                    arguments.extend_from_slice(&number.to_le_bytes());
                }
            }
        }
        for value in &self.requests {
            match value {
                RequestArgument::Index(index) => push_u16(&mut arguments, *index),
                RequestArgument::Lease(name) => {
                    push_u16(&mut arguments, name.len());
                    arguments.extend_from_slice(name.as_bytes());
                }
            }
        }
        let mut command =
            redis::Cmd::with_capacity(4 + self.keys.len(), 64 + key_bytes + arguments.len());
        command
            .arg("EVALSHA")
            .arg(script.get_hash())
            .arg(self.keys.len());
        for key in &self.keys {
            command.arg(*key);
        }
        command.arg(arguments);
        command
    }

    /// Reads the reply: the server's time, a byte (1: the call was late, and nothing follows);
    /// then per request, a byte for admitted, then per bucket the tokens after (a
    /// little-endian double) and a byte: 1 sufficient, 4 booked, 0 neither, plus 2 when the
    /// adaptive multiplier (a double) follows.
    pub(super) fn parse_reply(&self, reply: &[u8]) -> Result<CallReply, StoreError> {
        let malformed = || StoreError::Reply(format!("{reply:?}"));
        let mut fields = ReplyReader(reply);
        let server_time = fields.number().ok_or_else(malformed)?;
        match fields.byte().ok_or_else(malformed)? {
            0 => {}
            1 if fields.0.is_empty() => {
                return Ok(CallReply {
                    server_time,
                    requests: None,
                })
            }
            _ => return Err(malformed()),
        }
        let mut parsed = Vec::with_capacity(self.bucket_counts.len());
        for count in &self.bucket_counts {
            let admitted = match fields.byte().ok_or_else(malformed)? {
                flag @ 0..=1 => flag == 1,
                _ => return Err(malformed()),
            };
            let mut buckets = Vec::with_capacity(*count);
            for _ in 0..*count {
                let tokens = fields.number().ok_or_else(malformed)?;
                let flags = fields.byte().ok_or_else(malformed)?;
                let (sufficient, booked) = match flags & !2 {
                    0 => (false, false),
                    1 => (true, false),
                    4 if admitted => (false, true),
                    _ => return Err(malformed()),
                };
                let multiplier = match flags & 2 {
                    0 => 1.0,
                    _ => fields.number().ok_or_else(malformed)?,
                };
                buckets.push(BucketReply {
                    tokens,
                    sufficient,
                    booked,
                    multiplier,
                });
            }
            parsed.push(RequestReply { admitted, buckets });
        }
        if !fields.0.is_empty() {
            return Err(malformed());
        }
        Ok(CallReply {
            server_time,
            requests: Some(parsed),
        })
    }

    /// Reads the reply of a call to `slot`'s node: the clock notes its time; a call that ran
    /// late is counted, and answers its requests as timed out (the gateway gave up on them).
    pub(super) fn read(
        &self,
        reply: &[u8],
        (server_clock, slot): (&ServerClock, u16),
        late: &LateCalls,
    ) -> Result<Vec<RequestReply>, StoreError> {
        let CallReply {
            server_time,
            requests,
        } = self.parse_reply(reply)?;
        server_clock.observe(slot, server_time);
        requests.ok_or_else(|| {
            late.count();
            StoreError::Timeout
        })
    }
}

/// What the reply of a call given up on tells, read in the background: `slot`'s server
/// clock notes its time, and the call is counted if it ran late.
pub(super) fn read_late_reply(
    server_clock: std::sync::Arc<ServerClock>,
    slot: u16,
) -> impl FnOnce(Vec<u8>) -> bool + Send + 'static {
    move |reply| {
        let mut fields = ReplyReader(&reply);
        let header = fields.number().zip(fields.byte());
        header.is_some_and(|(server_time, late)| {
            server_clock.observe(slot, server_time);
            late == 1
        })
    }
}

/// One of a request's arguments after its shape.
#[derive(Debug, Clone, Copy)]
enum RequestArgument<'a> {
    Index(usize),
    Lease(&'a str),
}

/// A count or index in `decide.lua`'s arguments. A batch is at most a few hundred buckets; the
/// panic would be a broken invariant, not input.
fn push_u16(out: &mut Vec<u8>, value: usize) {
    let value = u16::try_from(value).expect("a batch's counts fit in 16 bits");
    out.extend_from_slice(&value.to_le_bytes());
}

/// The reply of one `decide.lua` call.
#[derive(Debug, PartialEq)]
pub(super) struct CallReply {
    /// The server's time when the call ran, in microseconds.
    pub server_time: f64,
    /// Per request, in the order pushed; `None` when the call ran after its deadline and
    /// charged nothing.
    pub requests: Option<Vec<RequestReply>>,
}

/// The unread rest of a reply.
struct ReplyReader<'a>(&'a [u8]);

impl ReplyReader<'_> {
    pub(super) fn byte(&mut self) -> Option<u8> {
        let (first, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(*first)
    }

    pub(super) fn number(&mut self) -> Option<f64> {
        let (bytes, rest) = self.0.split_first_chunk::<8>()?;
        self.0 = rest;
        Some(f64::from_le_bytes(*bytes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bucket(capacity: f64, cost: f64) -> BucketArguments {
        BucketArguments {
            capacity,
            rate: 1.0,
            cost,
            enforce: true,
            debt: 0.0,
            factor: 0.0,
            min_capacity: 0.0,
            lease: false,
        }
    }

    fn bucket_reply(tokens: f64, sufficient: bool, booked: bool, multiplier: f64) -> BucketReply {
        BucketReply {
            tokens,
            sufficient,
            booked,
            multiplier,
        }
    }

    /// The command's arguments before the binary one, and that one spelled as text: numbers
    /// (u16 counts and indexes, doubles) and lease names, read as `decide.lua` reads it.
    fn arguments(command: &redis::Cmd) -> (Vec<String>, String) {
        let mut arguments: Vec<Vec<u8>> = command
            .args_iter()
            .map(|argument| match argument {
                redis::Arg::Simple(bytes) => bytes.to_vec(),
                _ => panic!("only simple arguments are sent"),
            })
            .collect();
        let binary = arguments.pop().unwrap();
        let text = arguments
            .into_iter()
            .map(|argument| String::from_utf8(argument).unwrap())
            .collect();
        let mut rest = &binary[..];
        let take = |rest: &mut &[u8], n: usize| {
            let (taken, left) = rest.split_at(n);
            *rest = left;
            taken.to_vec()
        };
        let u16_of = |bytes: Vec<u8>| usize::from(u16::from_le_bytes([bytes[0], bytes[1]]));
        let f64_of = |bytes: Vec<u8>| f64::from_le_bytes(bytes.try_into().unwrap());
        let mut spelled = vec![f64_of(take(&mut rest, 8)).to_string()];
        let shape_count = u16_of(take(&mut rest, 2));
        spelled.push(shape_count.to_string());
        let mut shapes = Vec::new();
        for _ in 0..shape_count {
            let count = u16_of(take(&mut rest, 2));
            spelled.push(count.to_string());
            let mut leases = false;
            for _ in 0..count {
                let numbers: Vec<f64> = (0..6).map(|_| f64_of(take(&mut rest, 8))).collect();
                leases |= numbers[3] == 2.0;
                spelled.extend(numbers.iter().map(f64::to_string));
            }
            shapes.push((count, leases));
        }
        while !rest.is_empty() {
            let shape = u16_of(take(&mut rest, 2));
            spelled.push(shape.to_string());
            let (count, leases) = shapes[shape - 1];
            for _ in 0..count {
                spelled.push(u16_of(take(&mut rest, 2)).to_string());
            }
            if leases {
                let length = u16_of(take(&mut rest, 2));
                spelled.push(String::from_utf8(take(&mut rest, length)).unwrap());
            }
        }
        (text, spelled.join(" "))
    }

    #[test]
    fn keys_and_shapes_are_sent_once_each() {
        let login = [bucket(5.0, 1.0), bucket(100.0, 2.5)];
        let search = [bucket(5.0, 1.0)];
        let smoothed = [
            BucketArguments {
                debt: 2.5,
                ..bucket(5.0, 1.0)
            },
            BucketArguments {
                enforce: false,
                ..bucket(5.0, 1.0)
            },
        ];
        let mut call = DecideCall::new();
        call.push(["per_ip:a", "global"], &login, None);
        call.push(["per_ip:b", "global"], &login, None);
        call.push(["per_ip:a"], &search, None);
        call.push(["per_ip:b", "global"], &smoothed, None);
        let exports = [
            bucket(5.0, 1.0),
            BucketArguments::lease(2, std::time::Duration::from_secs(60)),
        ];
        call.push(["per_ip:a", "exports:slots"], &exports, Some("f00d"));
        let script = Script::new("return 1");
        let (keys, sent) = arguments(&call.command(&script, 1_700_000_000_000_000));
        assert_eq!(
            keys.join(" "),
            format!(
                "EVALSHA {} 4 per_ip:a global per_ip:b exports:slots",
                script.get_hash()
            )
        );
        let expected = [
            // The call's deadline in the server's time.
            "1700000000000000",
            // Four shapes: login's two buckets, then search's one (capacity, rate, cost,
            // enforce, factor, min_capacity), then a delaying bucket (enforce: the tokens it
            // may book down to) beside a shadow one, then a bucket and two slots (enforce 2)
            // leased for a minute.
            "4 2 5 1 1 1 0 0 100 1 2.5 1 0 0 1 5 1 1 1 0 0 2 5 1 1 -2.5 0 0 5 1 1 0 0 0",
            "2 5 1 1 1 0 0 2 60000 1 2 0 0",
            // Per request: its shape, then its keys, then the name of its leases if it takes
            // slots.
            "1 1 2 1 3 2 2 1 3 3 2 4 1 4 f00d",
        ];
        assert_eq!(sent, expected.join(" "));
    }

    #[test]
    fn replies_are_split_by_request_and_parsed_strictly() {
        let two_buckets = [bucket(5.0, 1.0), bucket(5.0, 1.0)];
        let one_bucket = [bucket(5.0, 1.0)];
        let mut call = DecideCall::new();
        call.push(["a", "b"], &two_buckets, None);
        call.push(["a"], &one_bucket, None);
        let double = |value: f64| value.to_le_bytes().to_vec();
        let reply: Vec<u8> = [
            double(1.7e15),
            vec![0],
            vec![1],
            double(4.5),
            vec![1],
            double(0.0),
            vec![2],
            double(0.5),
            vec![0],
            double(3.0),
            vec![0],
        ]
        .concat();
        assert_eq!(
            call.parse_reply(&reply).unwrap(),
            CallReply {
                server_time: 1.7e15,
                requests: Some(vec![
                    RequestReply {
                        admitted: true,
                        buckets: vec![
                            bucket_reply(4.5, true, false, 1.0),
                            bucket_reply(0.0, false, false, 0.5)
                        ],
                    },
                    RequestReply {
                        admitted: false,
                        buckets: vec![bucket_reply(3.0, false, false, 1.0)],
                    },
                ]),
            }
        );
        let late = [double(1.7e15), vec![1]].concat();
        assert_eq!(
            call.parse_reply(&late).unwrap(),
            CallReply {
                server_time: 1.7e15,
                requests: None,
            },
            "a late call charged nothing and says no more"
        );
        assert!(call.parse_reply(&[&late[..], &[0]].concat()).is_err());
        assert!(
            call.parse_reply(&reply[..reply.len() - 1]).is_err(),
            "too short"
        );
        assert!(
            call.parse_reply(&[&reply[..], &[7]].concat()).is_err(),
            "leftover bytes"
        );
        let mut bad_flag = reply.clone();
        bad_flag[18] = 8;
        assert!(call.parse_reply(&bad_flag).is_err(), "flags are 1, 2 and 4");
        bad_flag[18] = 5;
        assert!(
            call.parse_reply(&bad_flag).is_err(),
            "a bucket that held its cost booked nothing"
        );
        bad_flag[18] = 2;
        assert!(
            call.parse_reply(&bad_flag).is_err(),
            "a flag of 2 takes the next 8 bytes for a multiplier: the rest no longer fits"
        );
        let mut bad_admitted = reply.clone();
        bad_admitted[9] = 2;
        assert!(
            call.parse_reply(&bad_admitted).is_err(),
            "admitted is 0 or 1"
        );
    }

    #[test]
    fn a_booked_bucket_is_read_only_for_an_admitted_request() {
        let delaying = [BucketArguments {
            debt: 2.0,
            ..bucket(2.0, 1.0)
        }];
        let mut call = DecideCall::new();
        call.push(["a"], &delaying, None);
        let double = |value: f64| value.to_le_bytes().to_vec();
        let booked = [double(1.7e15), vec![0], vec![1], double(-1.0), vec![4]].concat();
        let requests = call.parse_reply(&booked).unwrap().requests.unwrap();
        assert_eq!(
            requests[0].buckets,
            vec![bucket_reply(-1.0, false, true, 1.0)]
        );
        let charge = Charge {
            capacity: 2.0,
            rate: 2.0,
            cost: 1.0,
            enforce: true,
            period: None,
            debt: 2.0,
        };
        let verdict = requests[0].buckets[0].verdict(&charge);
        assert!(verdict.booked && !verdict.sufficient);
        assert_eq!(verdict.wait, 0.5, "a token at 2 a second");
        let penalised = [
            double(1.7e15),
            vec![0],
            vec![1],
            double(-1.0),
            vec![6],
            double(0.5),
        ]
        .concat();
        let requests = call.parse_reply(&penalised).unwrap().requests.unwrap();
        assert_eq!(
            requests[0].buckets[0].verdict(&charge).wait,
            1.0,
            "half the rate"
        );
        let refused_but_booked = [double(1.7e15), vec![0], vec![0], double(-1.0), vec![4]].concat();
        assert!(
            call.parse_reply(&refused_but_booked).is_err(),
            "a refused request books nothing"
        );
    }
}
