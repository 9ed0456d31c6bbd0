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

use std::sync::{Arc, OnceLock};

use futures_util::stream::{FuturesUnordered, StreamExt};
use prometheus::{Histogram, HistogramOpts, IntCounter};

use redis::Script;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::decide_call::{read_late_reply, DecideCall, RequestReply, Shape};
use super::node::Node;
use super::server_clock::{LateCalls, ServerClock};
use super::{evaluate, StoreKeys};
use crate::limit::StoreError;

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

/// A decision waiting for its batch. Its keys travel with it and come back with the reply.
struct Queued {
    keys: StoreKeys,
    shape: Shape,
    /// The name of the request's leases when it takes concurrency slots.
    lease: Option<String>,
    deadline: Instant,
    reply: oneshot::Sender<(StoreKeys, Result<RequestReply, StoreError>)>,
}

/// The queue of decisions for one node, and the task that sends them (started on first use,
/// since the store is built before the runtime serves; it ends when the store is dropped).
pub(super) struct Batcher {
    queue: OnceLock<mpsc::UnboundedSender<Queued>>,
    /// Requests per call: the gateway's metric, or one of the batcher's own.
    sizes: Histogram,
    calls: IntCounter,
}

impl Batcher {
    /// Counts its calls in a histogram of its own, for tests and diagnostics.
    pub(super) fn new() -> Batcher {
        let sizes = Histogram::with_opts(HistogramOpts::new(
            "batch_requests",
            "Requests decided per call.",
        ))
        .expect("valid histogram");
        let calls = IntCounter::new("calls", "Calls made.").expect("valid counter");
        Batcher::observed_by(sizes, calls)
    }

    /// Records the requests each call decides in `sizes`, and counts the calls in `calls`.
    pub(super) fn observed_by(sizes: Histogram, calls: IntCounter) -> Batcher {
        Batcher {
            queue: OnceLock::new(),
            sizes,
            calls,
        }
    }

    /// Decides one request (its keys, their numbers, the name of its leases) in the next
    /// batch; gives its keys back with the reply, which is a timeout if it is not there by
    /// `deadline`. The first call starts the sender, which
    /// keeps `server_clock` and counts late calls in `late`.
    pub(super) async fn decide(
        &self,
        (node, script): (&Arc<Node>, &Arc<Script>),
        (server_clock, late): (&Arc<ServerClock>, &LateCalls),
        (keys, shape, lease): (StoreKeys, Shape, Option<String>),
        deadline: Instant,
    ) -> (StoreKeys, Result<RequestReply, StoreError>) {
        let queue = self.queue.get_or_init(|| {
            let (sender, receiver) = mpsc::unbounded_channel();
            tokio::spawn(send_batches(
                node.clone(),
                script.clone(),
                receiver,
                Observers {
                    sizes: self.sizes.clone(),
                    calls: self.calls.clone(),
                    late: late.clone(),
                    server_clock: server_clock.clone(),
                },
            ));
            sender
        });
        let (reply, replied) = oneshot::channel();
        let queued = Queued {
            keys,
            shape,
            lease,
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

/// What the sender reports to, and the server clock it keeps.
struct Observers {
    sizes: Histogram,
    calls: IntCounter,
    late: LateCalls,
    server_clock: Arc<ServerClock>,
}

/// Gathers queued decisions and sends them as one call whenever no call is out (or, for a
/// batch of `SECOND_CALL_BATCH` or more, one is). Runs until the store, and with it the
/// queue's sender, is dropped.
async fn send_batches(
    node: Arc<Node>,
    script: Arc<Script>,
    mut queue: mpsc::UnboundedReceiver<Queued>,
    observers: Observers,
) {
    let mut in_flight = FuturesUnordered::new();
    let mut pending: Vec<Queued> = Vec::new();
    // Batches' vectors, emptied by their calls and filled again: grown entry by entry, a new
    // one per call was reallocated and copied several times over.
    let mut spare: Vec<Vec<Queued>> = Vec::new();
    let mut open = true;
    while open || !pending.is_empty() || !in_flight.is_empty() {
        tokio::select! {
            biased;
            Some(emptied) = in_flight.next(), if !in_flight.is_empty() => spare.push(emptied),
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
            let mut batch = std::mem::replace(&mut pending, spare.pop().unwrap_or_default());
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
                observers.calls.inc();
                in_flight.push(call(&node, &script, batch, &observers));
            }
        }
    }
}

/// One call for a batch; every request of it gets its own reply, or the call's error, or a
/// timeout once the earliest deadline of the batch has passed (a request may so time out a
/// little before its own deadline, never after). The call carries that deadline in the
/// server's time: run later, its script charges nothing. A call given up on is still listened
/// to for a while, by a task of its own, to count it if it ran late. Gives back the batch's
/// vector, emptied.
async fn call(
    node: &Node,
    script: &Arc<Script>,
    mut batch: Vec<Queued>,
    observers: &Observers,
) -> Vec<Queued> {
    // The node the batch goes to is the one known as it leaves (a master may change between
    // batches, never within one).
    let connection = match node.current() {
        Ok(connection) => connection,
        Err(error) => {
            for queued in batch.drain(..) {
                let _ = queued.reply.send((queued.keys, Err(error.clone())));
            }
            return batch;
        }
    };
    let mut decide = DecideCall::for_requests(batch.len());
    for queued in &batch {
        decide.push(queued.keys.iter(), &queued.shape, queued.lease.as_deref());
    }
    let Some(deadline) = batch.iter().map(|queued| queued.deadline).min() else {
        return batch;
    };
    let command = decide.command(script, observers.server_clock.deadline(0, deadline));
    // The Arc, not the script: a script's clone copies its source, 12 KB per call (3,200
    // instructions a request at 3.8 requests a call).
    let script = Arc::clone(script);
    let mut connection = connection;
    let watcher = node.watcher();
    // Owns what it needs, so that a call given up on can go on being listened to.
    let evaluated = Box::pin(async move {
        let reply = evaluate::<Vec<u8>>(&script, &command, &mut connection).await;
        watcher.saw(&reply);
        reply
    });
    let read_late = read_late_reply(observers.server_clock.clone(), 0);
    let replies = observers
        .late
        .wait(evaluated, deadline, read_late)
        .await
        .and_then(|reply| decide.read(&reply, (&observers.server_clock, 0), &observers.late));
    match replies {
        Ok(replies) => {
            for (queued, reply) in batch.drain(..).zip(replies) {
                let _ = queued.reply.send((queued.keys, Ok(reply)));
            }
        }
        Err(error) => {
            for queued in batch.drain(..) {
                let _ = queued.reply.send((queued.keys, Err(error.clone())));
            }
        }
    }
    batch
}
