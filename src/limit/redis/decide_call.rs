//! One `decide.lua` call: the requests of a batch put into its arguments (each key and each
//! shape of buckets sent once), and its binary reply read back, strictly.

use std::borrow::Cow;
use std::collections::HashMap;

use redis::Script;
use smallvec::SmallVec;

use super::keys::ban_key;
use super::server_clock::{LateCalls, ServerClock};
use crate::limit::ban::Ban;
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
    /// The limit's ban rule: its state is read and written beside the bucket's.
    ban: Option<Ban>,
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
            ban: request.ban,
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
            ban: None,
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

/// The reply of `decide.lua` for one request: its buckets inline, as its shape's are.
#[derive(Debug, PartialEq)]
pub(super) struct RequestReply {
    pub admitted: bool,
    pub buckets: SmallVec<[BucketReply; 4]>,
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
    /// The key is banned: the seconds of its ban left.
    pub banned: Option<f64>,
    /// This refusal began a ban of the key.
    pub ban_began: bool,
}

impl BucketReply {
    /// The verdict for the bucket that `charge` (as configured) describes.
    pub(super) fn verdict(&self, charge: &Charge) -> Verdict {
        let charge = charge.scaled(self.multiplier);
        let mut verdict = match (self.banned, self.booked) {
            (Some(left), _) => Verdict::banned(&charge, self.tokens, left),
            (None, true) => Verdict::booked(&charge, self.tokens),
            (None, false) => Verdict::observed(&charge, self.tokens, self.sufficient),
        };
        verdict.ban_began = self.ban_began;
        verdict
    }
}

/// One `decide.lua` call being put together: each key is sent once, and so is each shape (the
/// numbers of a request's buckets, the same for every request of a route); a request is its
/// shape's index and its keys' indexes.
pub(super) struct DecideCall<'a> {
    /// The requests' keys, and the ban keys named after those of buckets with a ban rule.
    keys: Vec<Cow<'a, str>>,
    key_indexes: HashMap<Cow<'a, str>, usize, foldhash::fast::RandomState>,
    shapes: Vec<&'a [BucketArguments]>,
    /// Per request: its shape's index, then its keys' indexes (all 1-based, as Lua counts),
    /// then the name of its leases if its shape has slots.
    requests: Vec<RequestArgument<'a>>,
    /// Buckets per request, to read the reply.
    bucket_counts: Vec<usize>,
}

impl<'a> DecideCall<'a> {
    /// A call for `requests` requests, its lists sized for them (and for four buckets each):
    /// grown entry by entry, they were reallocated a dozen times a call.
    pub(super) fn for_requests(requests: usize) -> DecideCall<'a> {
        DecideCall {
            keys: Vec::with_capacity(4),
            key_indexes: HashMap::with_capacity_and_hasher(4, Default::default()),
            shapes: Vec::with_capacity(1),
            requests: Vec::with_capacity(requests * 5),
            bucket_counts: Vec::with_capacity(requests),
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
        let mut pushed = 0;
        for (key, bucket) in keys.into_iter().zip(shape) {
            let index = self.key_index(Cow::Borrowed(key));
            self.requests.push(RequestArgument::Index(index));
            if bucket.ban.is_some() {
                let index = self.key_index(Cow::Owned(ban_key(key)));
                self.requests.push(RequestArgument::Index(index));
            }
            pushed += 1;
        }
        debug_assert_eq!(pushed, shape.len(), "a key per bucket");
        if shape.iter().any(BucketArguments::is_lease) {
            debug_assert!(lease.is_some(), "slots are taken in a lease's name");
            self.requests
                .push(RequestArgument::Lease(lease.unwrap_or_default()));
        }
        self.bucket_counts.push(shape.len());
    }

    /// The 1-based index of `key` among the call's keys, added if new.
    fn key_index(&mut self, key: Cow<'a, str>) -> usize {
        if let Some(index) = self.key_indexes.get(key.as_ref()) {
            return *index;
        }
        self.keys.push(key.clone());
        let index = self.keys.len();
        self.key_indexes.insert(key, index);
        index
    }

    /// The call, with its deadline in the server's time (microseconds; 0: none): the keys,
    /// then one binary argument (little-endian) that `decide.lua` reads with `struct.unpack`.
    pub(super) fn command(&self, script: &Script, deadline: u64) -> redis::Cmd {
        let key_bytes = self.keys.iter().map(|key| key.len()).sum::<usize>();
        let mut arguments = Vec::with_capacity(
            12 + self
                .shapes
                .iter()
                .map(|shape| 4 + 68 * shape.len())
                .sum::<usize>()
                + 8 * self.requests.len(),
        );
        arguments.extend_from_slice(&(deadline as f64).to_le_bytes());
        push_u32(&mut arguments, self.shapes.len());
        for shape in &self.shapes {
            push_u32(&mut arguments, shape.len());
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
                match bucket.ban {
                    None => push_u32(&mut arguments, 0),
                    Some(ban) => {
                        arguments.extend_from_slice(&ban.after.to_le_bytes());
                        for duration in [ban.within, ban.duration] {
                            let micros = duration.as_micros() as f64;
                            arguments.extend_from_slice(&micros.to_le_bytes());
                        }
                    }
                }
            }
        }
        for value in &self.requests {
            match value {
                RequestArgument::Index(index) => push_u32(&mut arguments, *index),
                RequestArgument::Lease(name) => {
                    push_u32(&mut arguments, name.len());
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
            command.arg(key.as_ref());
        }
        command.arg(arguments);
        command
    }

    /// Reads the reply: the server's time, a byte (1: the call was late, and nothing follows);
    /// then per request, a byte for admitted, then per bucket the tokens after (a
    /// little-endian double) and a byte: 1 sufficient, 4 booked, 0 neither, plus 16 when the
    /// refusal began a ban, plus 2 when the adaptive multiplier (a double) follows, plus 8
    /// when the key is banned and the seconds left (a double) follow.
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
            let mut buckets = SmallVec::with_capacity(*count);
            for _ in 0..*count {
                let tokens = fields.number().ok_or_else(malformed)?;
                let flags = fields.byte().ok_or_else(malformed)?;
                let (sufficient, booked, ban_began) = match flags & !(2 | 8) {
                    0 => (false, false, false),
                    16 => (false, false, true),
                    1 => (true, false, false),
                    4 if admitted => (false, true, false),
                    _ => return Err(malformed()),
                };
                let multiplier = match flags & 2 {
                    0 => 1.0,
                    _ => fields.number().ok_or_else(malformed)?,
                };
                let banned = match flags & 8 {
                    0 => None,
                    _ if admitted || ban_began => return Err(malformed()),
                    _ => Some(fields.number().ok_or_else(malformed)?),
                };
                buckets.push(BucketReply {
                    tokens,
                    sufficient,
                    booked,
                    multiplier,
                    banned,
                    ban_began,
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

/// A count or index in `decide.lua`'s arguments (a batch never nears 2^32 of anything).
fn push_u32(out: &mut Vec<u8>, value: usize) {
    let value = u32::try_from(value).expect("a batch's counts fit in 32 bits");
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
mod tests;
