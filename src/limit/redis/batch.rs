//! Decisions on one Redis node, sent in batches: every decision that arrives while the
//! connection's calls are out waits for the next call, and one `decide.lua` call decides them
//! all, one after another. Under load, a batch costs Redis the script's fixed work (the call,
//! `TIME`) once, and writes a bucket that many requests share (a global limit, one busy client)
//! once, where one call per request would pay both for every request. Without load, a
//! decision finds no call out and goes at once, as before.
//!
//! Each request is still decided in one indivisible step against all of its buckets, at the
//! Redis server's time, exactly as a call of its own at that moment would decide it.
//!
//! Each request carries its deadline, and the sender keeps them with one timer per call, where
//! a timer per request cost the request path more than the queue itself. A call is given up at
//! the earliest deadline of its requests. Requests queue in the order of their deadlines (one
//! timeout per store), so the calls they wait for end before their own deadlines, and the
//! call they join gives up at the latest then: no request waits past its deadline.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, OnceLock};

use futures_util::stream::{FuturesUnordered, StreamExt};
use prometheus::{Histogram, HistogramOpts, IntCounter};
use redis::aio::ConnectionManager;
use redis::Script;
use smallvec::SmallVec;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::{evaluate, Number, StoreKeys};
use crate::limit::{clock, BucketRequest, StoreError};

/// Requests per call at most: a script holds Redis while it runs.
const BATCH_LIMIT: usize = 64;

/// Calls out at once on the node's connection. A second call goes out only for a batch of
/// `SECOND_CALL_BATCH` or more: a smaller one waits to join the next call, which keeps Redis's
/// work per decision low, while a distant Redis, or a busy replica, does not cap the rate at
/// one batch per round trip. On the benchmark's machine, with a second call for 8 or more
/// instead of 32, row 5 went from 32k to 40k requests/s and Redis's CPU per decision rose
/// 5 % (5.8 to 6.1 µs): with 32, the gateway and Redis took turns waiting for each other.
const CALLS_IN_FLIGHT: usize = 2;
const SECOND_CALL_BATCH: usize = 8;

/// What `decide.lua` needs to know of one bucket besides its key.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct BucketArguments {
    capacity: f64,
    rate: f64,
    cost: f64,
    enforce: bool,
    /// 0: not adaptive.
    factor: f64,
    min_capacity: f64,
}

impl BucketArguments {
    pub(super) fn of(request: &BucketRequest<'_>) -> BucketArguments {
        let (factor, min_capacity) = request
            .adaptive
            .map_or((0.0, 0.0), |params| (params.factor, params.min_capacity));
        BucketArguments {
            capacity: request.charge.capacity,
            rate: request.charge.rate,
            cost: request.charge.cost,
            enforce: request.charge.enforce,
            factor,
            min_capacity,
        }
    }
}

/// The buckets of one request, inline for the usual handful.
pub(super) type Shape = SmallVec<[BucketArguments; 4]>;

/// The reply of `decide.lua` for one request.
#[derive(Debug, PartialEq)]
pub(super) struct RequestReply {
    pub admitted: bool,
    /// (tokens after, sufficient, adaptive multiplier) per bucket of the request.
    pub buckets: Vec<(f64, bool, f64)>,
}

/// One `decide.lua` call being put together: each key is sent once, and so is each shape (the
/// numbers of a request's buckets, the same for every request of a route); a request is its
/// shape's index and its keys' indexes.
pub(super) struct DecideCall<'a> {
    keys: Vec<&'a str>,
    key_indexes: HashMap<&'a str, usize, foldhash::fast::RandomState>,
    shapes: Vec<&'a [BucketArguments]>,
    /// Per request: its shape's index, then its keys' indexes (all 1-based, as Lua counts).
    requests: Vec<usize>,
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

    /// Adds a request: its buckets' keys and numbers, in the same order.
    pub(super) fn push(
        &mut self,
        keys: impl IntoIterator<Item = &'a str>,
        shape: &'a [BucketArguments],
    ) {
        let shape_index = match self.shapes.iter().position(|known| *known == shape) {
            Some(index) => index,
            None => {
                self.shapes.push(shape);
                self.shapes.len() - 1
            }
        };
        self.requests.push(shape_index + 1);
        let before = self.requests.len();
        for key in keys {
            let next = self.keys.len();
            let index = *self.key_indexes.entry(key).or_insert(next);
            if index == next {
                self.keys.push(key);
            }
            self.requests.push(index + 1);
        }
        debug_assert_eq!(
            self.requests.len() - before,
            shape.len(),
            "a key per bucket"
        );
        self.bucket_counts.push(shape.len());
    }

    /// The call, with its deadline in the server's time (microseconds; 0: none).
    pub(super) fn command(&self, script: &Script, deadline: u64) -> redis::Cmd {
        let key_bytes = self.keys.iter().map(|key| key.len()).sum::<usize>();
        let shape_arguments = self
            .shapes
            .iter()
            .map(|shape| 1 + 6 * shape.len())
            .sum::<usize>();
        let arguments = 5 + self.keys.len() + shape_arguments + self.requests.len();
        // Sized up front: grown argument by argument, the buffers would be reallocated
        // several times per call.
        let mut command = redis::Cmd::with_capacity(arguments, 64 + key_bytes + 24 * arguments);
        command
            .arg("EVALSHA")
            .arg(script.get_hash())
            .arg(self.keys.len());
        for key in &self.keys {
            command.arg(*key);
        }
        command.arg(deadline);
        command.arg(self.shapes.len());
        for shape in &self.shapes {
            command.arg(shape.len());
            for bucket in shape.iter() {
                command
                    .arg(Number(bucket.capacity))
                    .arg(Number(bucket.rate))
                    .arg(Number(bucket.cost))
                    .arg(u8::from(bucket.enforce))
                    .arg(Number(bucket.factor))
                    .arg(Number(bucket.min_capacity));
            }
        }
        let mut index = itoa::Buffer::new();
        for value in &self.requests {
            command.arg(index.format(*value));
        }
        command
    }

    /// Reads the reply: the server's time, a byte (1: the call was late, and nothing follows);
    /// then per request, a byte for admitted, then per bucket the tokens after (a
    /// little-endian double) and a byte: 1 sufficient, 0 not, plus 2 when the adaptive
    /// multiplier (a double) follows.
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
                let (sufficient, multiplier) = match fields.byte().ok_or_else(malformed)? {
                    flags @ 0..=1 => (flags == 1, 1.0),
                    flags @ 2..=3 => (flags == 3, fields.number().ok_or_else(malformed)?),
                    _ => return Err(malformed()),
                };
                buckets.push((tokens, sufficient, multiplier));
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
    fn byte(&mut self) -> Option<u8> {
        let (first, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(*first)
    }

    fn number(&mut self) -> Option<f64> {
        let (bytes, rest) = self.0.split_first_chunk::<8>()?;
        self.0 = rest;
        Some(f64::from_le_bytes(*bytes))
    }
}

/// How long a call given up on is still listened to: a script that runs later is counted
/// late (it charged nothing), and its reply keeps the server clock's estimate fresh.
const LATE_LISTEN: std::time::Duration = std::time::Duration::from_secs(30);

/// The gateway's estimate of the Redis server's clock, from the latest reply: the server's
/// `TIME` when the script ran, against the gateway's clock when the reply arrived. A deadline
/// moved into the server's time by that offset is the last moment at which a script's reply
/// still reaches the gateway in time (the reply's way back is in the offset).
#[derive(Debug)]
pub(super) struct ServerClock {
    origin: std::time::Instant,
    /// Server microseconds minus the gateway's microseconds since `origin`; `i64::MIN` until
    /// the first reply.
    offset: AtomicI64,
}

impl ServerClock {
    pub(super) fn new() -> ServerClock {
        ServerClock {
            origin: clock::instant(),
            offset: AtomicI64::new(i64::MIN),
        }
    }

    fn micros(&self, at: std::time::Instant) -> i64 {
        i64::try_from(at.saturating_duration_since(self.origin).as_micros()).unwrap_or(i64::MAX)
    }

    /// Notes a reply that arrived now, with the server's time when its script ran.
    pub(super) fn observe(&self, server_time: f64) {
        let offset = server_time as i64 - self.micros(clock::instant());
        self.offset.store(offset, Ordering::Relaxed);
    }

    /// `deadline` in the server's time, in microseconds; 0 (none) before the first reply.
    pub(super) fn deadline(&self, deadline: Instant) -> u64 {
        let offset = self.offset.load(Ordering::Relaxed);
        if offset == i64::MIN {
            return 0;
        }
        u64::try_from(self.micros(deadline.into_std()).saturating_add(offset)).unwrap_or(0)
    }
}

/// A decision waiting for its batch. Its keys travel with it and come back with the reply.
struct Queued {
    keys: StoreKeys,
    shape: Shape,
    deadline: Instant,
    reply: oneshot::Sender<(StoreKeys, Result<RequestReply, StoreError>)>,
}

/// The queue of decisions for one node, and the task that sends them (started on first use,
/// since the store is built before the runtime serves; it ends when the store is dropped).
pub(super) struct Batcher {
    queue: OnceLock<mpsc::UnboundedSender<Queued>>,
    /// Requests per call: the gateway's metric, or one of the batcher's own.
    sizes: Histogram,
    /// Calls whose script ran after the gateway gave up on them, and charged nothing.
    late: IntCounter,
    server_clock: Arc<ServerClock>,
}

impl Batcher {
    /// Counts its calls in a histogram of its own, for tests and diagnostics.
    pub(super) fn new() -> Batcher {
        let sizes = Histogram::with_opts(HistogramOpts::new(
            "batch_requests",
            "Requests decided per call.",
        ))
        .expect("valid histogram");
        let late = IntCounter::new("late_calls", "Calls that ran late.").expect("valid counter");
        Batcher::observed_by(sizes, late)
    }

    pub(super) fn observed_by(sizes: Histogram, late: IntCounter) -> Batcher {
        Batcher {
            queue: OnceLock::new(),
            sizes,
            late,
            server_clock: Arc::new(ServerClock::new()),
        }
    }

    /// `deadline` in the server's time (0 before the first reply), for the store's other calls.
    pub(super) fn server_deadline(&self, deadline: Instant) -> u64 {
        self.server_clock.deadline(deadline)
    }

    /// Counts a call of the store's that ran after its deadline.
    pub(super) fn count_late(&self) {
        self.late.inc();
    }

    /// Calls that ran after their deadline and charged nothing, counted so far.
    pub(super) fn late_calls(&self) -> u64 {
        self.late.get()
    }

    /// Decides one request in the next batch; gives its keys back with the reply, which is a
    /// timeout if it is not there by `deadline`.
    pub(super) async fn decide(
        &self,
        connection: &ConnectionManager,
        script: &Script,
        keys: StoreKeys,
        shape: Shape,
        deadline: Instant,
    ) -> (StoreKeys, Result<RequestReply, StoreError>) {
        let queue = self.queue.get_or_init(|| {
            let (sender, receiver) = mpsc::unbounded_channel();
            tokio::spawn(send_batches(
                connection.clone(),
                script.clone(),
                receiver,
                Observers {
                    sizes: self.sizes.clone(),
                    late: self.late.clone(),
                    server_clock: self.server_clock.clone(),
                },
            ));
            sender
        });
        let (reply, replied) = oneshot::channel();
        let queued = Queued {
            keys,
            shape,
            deadline,
            reply,
        };
        if let Err(refused) = queue.send(queued) {
            return (refused.0.keys, Err(gone()));
        }
        replied
            .await
            .unwrap_or_else(|_| (StoreKeys::default(), Err(gone())))
    }

    /// `decide.lua` calls made so far.
    pub(super) fn calls(&self) -> u64 {
        self.sizes.get_sample_count()
    }
}

fn gone() -> StoreError {
    StoreError::Redis("the batch sender has stopped".to_owned())
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("calls", &self.calls())
            .finish_non_exhaustive()
    }
}

/// Gathers queued decisions and sends them as one call whenever no call is out (or, for a
/// batch of `SECOND_CALL_BATCH` or more, one is). Runs until the store, and with it the
/// queue's sender, is dropped.
/// What the sender reports to, and the server clock it keeps.
struct Observers {
    sizes: Histogram,
    late: IntCounter,
    server_clock: Arc<ServerClock>,
}

async fn send_batches(
    connection: ConnectionManager,
    script: Script,
    mut queue: mpsc::UnboundedReceiver<Queued>,
    observers: Observers,
) {
    let mut in_flight = FuturesUnordered::new();
    let mut pending: Vec<Queued> = Vec::new();
    let mut open = true;
    while open || !pending.is_empty() || !in_flight.is_empty() {
        tokio::select! {
            biased;
            Some(()) = in_flight.next(), if !in_flight.is_empty() => {}
            received = queue.recv(), if open && pending.len() < BATCH_LIMIT => match received {
                Some(queued) => pending.push(queued),
                None => open = false,
            },
            // Only what is already pending is left to send.
            () = std::future::ready(()), if !open && in_flight.is_empty() => {}
        }
        while open && pending.len() < BATCH_LIMIT {
            match queue.try_recv() {
                Ok(queued) => pending.push(queued),
                Err(_) => break,
            }
        }
        // A request that stopped waiting (its client went away) is not charged.
        pending.retain(|queued| !queued.reply.is_closed());
        let may_send = in_flight.is_empty()
            || (in_flight.len() < CALLS_IN_FLIGHT && pending.len() >= SECOND_CALL_BATCH);
        if may_send && !pending.is_empty() {
            // A request whose deadline passed as the call it waited for gave up (the same
            // moment, give or take the timer's millisecond) is answered so, not sent.
            let now = crate::limit::clock::deadline_in(std::time::Duration::ZERO);
            let mut batch = std::mem::take(&mut pending);
            // Queued in the order of their deadlines: when the first has not passed, none has.
            if batch.first().is_some_and(|queued| queued.deadline <= now) {
                let (live, expired): (Vec<Queued>, Vec<Queued>) =
                    batch.into_iter().partition(|queued| queued.deadline > now);
                for queued in expired {
                    let _ = queued.reply.send((queued.keys, Err(StoreError::Timeout)));
                }
                batch = live;
            }
            if !batch.is_empty() {
                observers.sizes.observe(batch.len() as f64);
                in_flight.push(call(connection.clone(), &script, batch, &observers));
            }
        }
    }
}

/// One call for a batch; every request of it gets its own reply, or the call's error, or a
/// timeout once the earliest deadline of the batch has passed (a request may so time out a
/// little before its own deadline, never after). The call carries that deadline in the
/// server's time: run later, its script charges nothing. A call given up on is still listened
/// to for a while, by a task of its own, to count it if it ran late.
async fn call(
    connection: ConnectionManager,
    script: &Script,
    batch: Vec<Queued>,
    observers: &Observers,
) {
    let mut decide = DecideCall::new();
    for queued in &batch {
        decide.push(queued.keys.iter(), &queued.shape);
    }
    let Some(deadline) = batch.iter().map(|queued| queued.deadline).min() else {
        return;
    };
    let command = decide.command(script, observers.server_clock.deadline(deadline));
    let (script, server_clock, late) = (
        script.clone(),
        observers.server_clock.clone(),
        observers.late.clone(),
    );
    let mut connection = connection;
    // Owns what it needs, so that a call given up on can go on being listened to in a task
    // of its own (spawned only then: a task per call cost the usual call more than a box).
    let mut evaluated = Box::pin(async move {
        let reply = evaluate::<Vec<u8>>(&script, &command, &mut connection).await;
        reply.map(|reply| (reply, server_clock, late))
    });
    let replies = match tokio::time::timeout_at(deadline, evaluated.as_mut()).await {
        Ok(Ok((reply, server_clock, late))) => read_reply(&decide, &reply, &server_clock, &late),
        Ok(Err(error)) => Err(StoreError::Redis(error.to_string())),
        Err(_) => {
            // Given up on: listened to, for a while, in the background.
            tokio::spawn(async move {
                if let Ok(Ok((reply, server_clock, late))) =
                    tokio::time::timeout(LATE_LISTEN, evaluated).await
                {
                    if let Some((server_time, was_late)) = reply_header(&reply) {
                        server_clock.observe(server_time);
                        if was_late {
                            late.inc();
                        }
                    }
                }
            });
            Err(StoreError::Timeout)
        }
    };
    match replies {
        Ok(replies) => {
            for (queued, reply) in batch.into_iter().zip(replies) {
                let _ = queued.reply.send((queued.keys, Ok(reply)));
            }
        }
        Err(error) => {
            for queued in batch {
                let _ = queued.reply.send((queued.keys, Err(error.clone())));
            }
        }
    }
}

/// The server's time and whether the call was late, from the start of a reply.
fn reply_header(reply: &[u8]) -> Option<(f64, bool)> {
    let mut fields = ReplyReader(reply);
    let server_time = fields.number()?;
    Some((server_time, fields.byte()? == 1))
}

/// A call's reply: the server clock notes its time; a late call is counted, and answers its
/// requests as timed out (the gateway had given up on them already).
fn read_reply(
    decide: &DecideCall<'_>,
    reply: &[u8],
    server_clock: &ServerClock,
    late: &IntCounter,
) -> Result<Vec<RequestReply>, StoreError> {
    let CallReply {
        server_time,
        requests,
    } = decide.parse_reply(reply)?;
    server_clock.observe(server_time);
    requests.ok_or_else(|| {
        late.inc();
        StoreError::Timeout
    })
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
            factor: 0.0,
            min_capacity: 0.0,
        }
    }

    fn arguments(command: &redis::Cmd) -> Vec<String> {
        command
            .args_iter()
            .map(|argument| match argument {
                redis::Arg::Simple(bytes) => String::from_utf8(bytes.to_vec()).unwrap(),
                _ => panic!("only simple arguments are sent"),
            })
            .collect()
    }

    #[test]
    fn keys_and_shapes_are_sent_once_each() {
        let login = [bucket(5.0, 1.0), bucket(100.0, 2.5)];
        let search = [bucket(5.0, 1.0)];
        let mut call = DecideCall::new();
        call.push(["per_ip:a", "global"], &login);
        call.push(["per_ip:b", "global"], &login);
        call.push(["per_ip:a"], &search);
        let script = Script::new("return 1");
        let sent = arguments(&call.command(&script, 1_700_000_000_000_000));
        let expected = [
            format!("EVALSHA {} 3 per_ip:a global per_ip:b", script.get_hash()),
            // The call's deadline in the server's time.
            "1700000000000000".to_owned(),
            // Two shapes: login's two buckets, then search's one (capacity, rate, cost,
            // enforce, factor, min_capacity).
            "2 2 5 1 1 1 0 0 100 1 2.5 1 0 0 1 5 1 1 1 0 0".to_owned(),
            // Per request: its shape, then its keys.
            "1 1 2 1 3 2 2 1".to_owned(),
        ];
        assert_eq!(sent.join(" "), expected.join(" "));
    }

    #[test]
    fn replies_are_split_by_request_and_parsed_strictly() {
        let two_buckets = [bucket(5.0, 1.0), bucket(5.0, 1.0)];
        let one_bucket = [bucket(5.0, 1.0)];
        let mut call = DecideCall::new();
        call.push(["a", "b"], &two_buckets);
        call.push(["a"], &one_bucket);
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
                        buckets: vec![(4.5, true, 1.0), (0.0, false, 0.5)],
                    },
                    RequestReply {
                        admitted: false,
                        buckets: vec![(3.0, false, 1.0)],
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
        bad_flag[18] = 4;
        assert!(call.parse_reply(&bad_flag).is_err(), "flags are 0 to 3");
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
    fn deadlines_move_into_the_servers_time_once_a_reply_gave_its_clock() {
        let clock = ServerClock::new();
        let deadline = Instant::from_std(clock.origin) + std::time::Duration::from_millis(1500);
        assert_eq!(clock.deadline(deadline), 0, "no estimate yet: no deadline");
        // The server said 1e15 µs when the gateway's clock read about 0 µs since its origin.
        clock.observe(1e15);
        let moved = clock.deadline(deadline);
        let expected = 1e15 as u64 + 1_500_000;
        assert!(
            moved <= expected && moved > expected - 1_000_000,
            "{moved} against {expected}"
        );
    }
}
