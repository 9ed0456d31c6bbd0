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

    /// Whether identical requests of this bucket may be decided as a run: slots, bans and
    /// booking are decided one request at a time.
    fn runs(&self) -> bool {
        matches!(self.enforce_code(), 0.0 | 1.0) && self.ban.is_none()
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

/// The buckets of one request. Boxed: a decision waiting for its batch is moved some seven
/// times on its way to the call, and inline, four buckets made each move 500 bytes.
pub(super) type Shape = Box<[BucketArguments]>;

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
/// shape's index and its keys' indexes. Identical requests in a row (one client's burst, a
/// flood) are sent as one entry and a count, and decided by the script as a run: Redis's work
/// for each further request is a few subtractions instead of the whole per-request step.
pub(super) struct DecideCall<'a> {
    /// The requests' keys, and the ban keys named after those of buckets with a ban rule.
    keys: Vec<Cow<'a, str>>,
    key_indexes: HashMap<Cow<'a, str>, usize, foldhash::fast::RandomState>,
    shapes: Vec<&'a [BucketArguments]>,
    /// The entries' arguments after their shape: keys' indexes (1-based, as Lua counts), then
    /// the name of the leases if the shape has slots.
    arguments: Vec<RequestArgument<'a>>,
    entries: Vec<Entry>,
}

/// One request, or a run of identical ones, in a call.
#[derive(Debug)]
struct Entry {
    /// The index of its shape in the call's shapes (0-based).
    shape: usize,
    /// The requests it stands for: more than one only for a shape whose buckets `runs()`.
    run: usize,
    /// Its arguments, in the call's `arguments`.
    arguments: std::ops::Range<usize>,
}

/// Requests in a run at most: the reply counts the admitted ones in a byte.
const MAX_RUN: usize = 255;

impl<'a> DecideCall<'a> {
    /// A call for `requests` requests, its lists sized for them (and for four buckets each):
    /// grown entry by entry, they were reallocated a dozen times a call.
    pub(super) fn for_requests(requests: usize) -> DecideCall<'a> {
        DecideCall {
            keys: Vec::with_capacity(4),
            key_indexes: HashMap::with_capacity_and_hasher(4, Default::default()),
            shapes: Vec::with_capacity(1),
            arguments: Vec::with_capacity(requests * 4),
            entries: Vec::with_capacity(requests),
        }
    }

    /// Adds a request: its buckets' keys and numbers, in the same order, and the name of its
    /// leases when the shape has concurrency slots.
    pub(super) fn push<K>(&mut self, keys: K, shape: &'a [BucketArguments], lease: Option<&'a str>)
    where
        K: IntoIterator<Item = &'a str>,
        K::IntoIter: Clone,
    {
        let keys = keys.into_iter();
        if lease.is_none() && self.joins_last_run(keys.clone(), shape) {
            return;
        }
        let shape_index = match self.shapes.iter().position(|known| *known == shape) {
            Some(index) => index,
            None => {
                self.shapes.push(shape);
                self.shapes.len() - 1
            }
        };
        let start = self.arguments.len();
        let mut pushed = 0;
        for (key, bucket) in keys.into_iter().zip(shape) {
            let index = self.key_index(Cow::Borrowed(key));
            self.arguments.push(RequestArgument::Index(index));
            if bucket.ban.is_some() {
                let index = self.key_index(Cow::Owned(ban_key(key)));
                self.arguments.push(RequestArgument::Index(index));
            }
            pushed += 1;
        }
        debug_assert_eq!(pushed, shape.len(), "a key per bucket");
        if shape.iter().any(BucketArguments::is_lease) {
            debug_assert!(lease.is_some(), "slots are taken in a lease's name");
            self.arguments
                .push(RequestArgument::Lease(lease.unwrap_or_default()));
        }
        self.entries.push(Entry {
            shape: shape_index,
            run: 1,
            arguments: start..self.arguments.len(),
        });
    }

    /// Counts a request of `keys` and `shape` into the last entry's run if it is that entry's
    /// request again; says whether it did. The keys are compared where they lie, unhashed.
    fn joins_last_run(
        &mut self,
        keys: impl Iterator<Item = &'a str>,
        shape: &[BucketArguments],
    ) -> bool {
        let Some(last) = self.entries.last() else {
            return false;
        };
        // A shape that runs has one argument per bucket: its key's index.
        let same = last.run < MAX_RUN
            && self.shapes[last.shape] == shape
            && shape.iter().all(BucketArguments::runs)
            && keys
                .zip(&self.arguments[last.arguments.clone()])
                .all(|(key, argument)| match argument {
                    RequestArgument::Index(index) => self.keys[index - 1] == key,
                    RequestArgument::Lease(_) => false,
                });
        if let (true, Some(last)) = (same, self.entries.last_mut()) {
            last.run += 1;
        }
        same
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
                + 4 * self.entries.len()
                + 8 * self.arguments.len(),
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
        for entry in &self.entries {
            for number in [entry.shape + 1, entry.run] {
                let number =
                    u16::try_from(number).expect("a batch's shapes and runs fit in 16 bits");
                arguments.extend_from_slice(&number.to_le_bytes());
            }
            for value in &self.arguments[entry.arguments.clone()] {
                match value {
                    RequestArgument::Index(index) => push_u32(&mut arguments, *index),
                    RequestArgument::Lease(name) => {
                        push_u32(&mut arguments, name.len());
                        arguments.extend_from_slice(name.as_bytes());
                    }
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

    /// Reads the reply, strictly: the server's time, a byte (1: the call was late, and nothing
    /// follows); then per entry a request's reply (`read_request`) or a run's (`read_run`).
    /// The replies come back one per request, runs worked out, in the order pushed.
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
        let requests = self.entries.iter().map(|entry| entry.run).sum();
        let mut parsed = Vec::with_capacity(requests);
        for entry in &self.entries {
            let shape = self.shapes[entry.shape];
            if entry.run == 1 {
                parsed.push(read_request(&mut fields, shape.len()).ok_or_else(malformed)?);
            } else {
                read_run(&mut fields, shape, entry.run, &mut parsed).ok_or_else(malformed)?;
            }
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

/// One request's reply: a byte for admitted, then per bucket the tokens after (a
/// little-endian double) and a byte: 1 sufficient, 4 booked, 0 neither, plus 16 when the
/// refusal began a ban, plus 2 when the adaptive multiplier (a double) follows, plus 8 when
/// the key is banned and the seconds left (a double) follow. `None` if it is not one.
fn read_request(fields: &mut ReplyReader<'_>, buckets: usize) -> Option<RequestReply> {
    let admitted = match fields.byte()? {
        flag @ 0..=1 => flag == 1,
        _ => return None,
    };
    let mut replies = SmallVec::with_capacity(buckets);
    for _ in 0..buckets {
        let tokens = fields.number()?;
        let flags = fields.byte()?;
        let (sufficient, booked, ban_began) = match flags & !(2 | 8) {
            0 => (false, false, false),
            16 => (false, false, true),
            1 => (true, false, false),
            4 if admitted => (false, true, false),
            _ => return None,
        };
        let multiplier = match flags & 2 {
            0 => 1.0,
            _ => fields.number()?,
        };
        let banned = match flags & 8 {
            0 => None,
            _ if admitted || ban_began => return None,
            _ => Some(fields.number()?),
        };
        replies.push(BucketReply {
            tokens,
            sufficient,
            booked,
            multiplier,
            banned,
            ban_began,
        });
    }
    Some(RequestReply {
        admitted,
        buckets: replies,
    })
}

/// A run of `run` identical requests' reply: how many were admitted (a byte: the first ones),
/// then per bucket its tokens before the first (a double) and a byte, 2 when the multiplier
/// (a double) follows, else 0. Each request's reply is worked out as `decide.lua` charged
/// them, one after another, and pushed to `parsed`; `None` if the reply is not one, or
/// contradicts itself (an admitted request that a bucket could not pay for, or a refusal
/// that every bucket could).
fn read_run(
    fields: &mut ReplyReader<'_>,
    shape: &[BucketArguments],
    run: usize,
    parsed: &mut Vec<RequestReply>,
) -> Option<()> {
    let admitted = usize::from(fields.byte()?);
    if admitted > run {
        return None;
    }
    let mut buckets: SmallVec<[BucketReply; 4]> = SmallVec::with_capacity(shape.len());
    for _ in shape {
        let tokens = fields.number()?;
        let multiplier = match fields.byte()? {
            0 => 1.0,
            2 => fields.number()?,
            _ => return None,
        };
        buckets.push(BucketReply {
            tokens,
            sufficient: false,
            booked: false,
            multiplier,
            banned: None,
            ban_began: false,
        });
    }
    for index in 0..run {
        let admit = index < admitted;
        let mut payable = true;
        for (bucket, arguments) in buckets.iter_mut().zip(shape) {
            bucket.sufficient = bucket.tokens >= arguments.cost;
            payable &= bucket.sufficient || !arguments.enforce;
            if admit && bucket.sufficient {
                bucket.tokens -= arguments.cost;
            }
        }
        // Only the first refusal can tell: the ones after it find the same buckets.
        if payable != admit && (admit || index == admitted) {
            return None;
        }
        parsed.push(RequestReply {
            admitted: admit,
            buckets: buckets.clone(),
        });
    }
    Some(())
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
