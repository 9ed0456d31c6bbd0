//! The settle phase: the response of a route that settles costs goes out through a body that
//! measures it as it passes (`crate::settle::Meter`). When it has ended — or its client left
//! — each settled bucket is charged the difference between what the response said and what
//! the request reserved, in the store that decided, by one call of its own. The end of the
//! body reaches the client once that call has answered, so the client's next request already
//! sees the settled bucket.

use std::future::Future as _;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use http::Response;
use http_body::{Frame, SizeHint};
use tokio::task::JoinHandle;

use super::access_log::DeferredLine;
use super::decide::Decider;
use super::{applied, Buckets};
use crate::body::{Body, BoxError};
use crate::limit::{
    clock, AdaptiveParams, BucketKey, Charge, KeyParts, OutcomeRequest, Store, StoreError,
};
use crate::runtime::{AppliedLimit, Runtime, ServedRoute};
use crate::settle::{Meter, PerMeasure, Reading};
use crate::shared::Shared;

/// What a response's settlement needs once the request's borrows are gone.
pub(super) struct Settlement {
    shared: Arc<Shared>,
    decider: Decider,
    /// Holds the route's limits, whatever reloads happen meanwhile.
    runtime: Arc<Runtime>,
    route: usize,
    entries: PerMeasure<Entry>,
    /// When the request was forwarded.
    sent: Instant,
    line: Option<DeferredLine>,
}

/// One settled bucket, as the decision charged it.
struct Entry {
    /// Its place in the route's limits.
    limit: usize,
    fingerprint: u64,
    parts: KeyParts,
    charge: Charge,
    adaptive: Option<AdaptiveParams>,
}

impl Settlement {
    /// The settlement of the buckets the decision charged whose route limit settles; `None`
    /// when there is none. Boxed: it is handed on three times before it settles.
    pub(super) fn of(
        shared: &Arc<Shared>,
        runtime: &Arc<Runtime>,
        route: &ServedRoute,
        buckets: &Buckets<'_>,
        charged: &[&crate::runtime::AppliedLimit],
        decider: Decider,
        sent: Instant,
    ) -> Option<Box<Settlement>> {
        if decider == Decider::Nobody {
            return None;
        }
        let entries: PerMeasure<Entry> = buckets
            .iter()
            .filter(|(limit, _)| {
                limit.settled.is_some()
                    && charged.iter().any(|charged| applied::same(charged, limit))
            })
            .filter_map(|(limit, bucket)| {
                Some(Entry {
                    limit: route
                        .limits
                        .iter()
                        .position(|own| applied::same(own, limit))?,
                    fingerprint: bucket.key.fingerprint,
                    parts: bucket.key.parts.clone(),
                    charge: bucket.charge,
                    adaptive: bucket.adaptive,
                })
            })
            .collect();
        let route = runtime
            .routes
            .iter()
            .position(|own| std::ptr::eq(own, route))?;
        (!entries.is_empty()).then(|| {
            Box::new(Settlement {
                shared: shared.clone(),
                decider,
                runtime: runtime.clone(),
                route,
                entries,
                sent,
                line: None,
            })
        })
    }

    /// The access-log line, written with the settled values once they are known.
    pub(super) fn defer_line(&mut self) -> DeferredLine {
        self.line.get_or_insert_with(Default::default).clone()
    }

    /// The response, with a body that settles when it ends.
    pub(super) fn meter(self: Box<Self>, response: Response<Body>, limit: usize) -> Response<Body> {
        let route = &self.runtime.routes[self.route];
        let measures = self
            .entries
            .iter()
            .filter_map(|entry| route.limits[entry.limit].settled.as_ref())
            .map(|settled| &settled.measuring);
        let meter = Meter::new(measures, response.headers(), limit);
        response.map(|inner| {
            Body::boxed(SettlingBody {
                inner,
                meter,
                settlement: Some(self),
                state: State::Streaming,
            })
        })
    }

    /// Settles what `meter` measured (`ended`: the body ended whole): at once in process
    /// memory, or by a task whose Redis call the returned handle waits for.
    fn start(self: Box<Self>, meter: &Meter, ended: bool) -> Option<JoinHandle<()>> {
        // The clock is read only for a measure that needs it.
        let elapsed_ms = if meter.times_the_upstream() {
            clock::elapsed(self.sent).as_secs_f64() * 1e3
        } else {
            0.0
        };
        let readings: PerMeasure<Reading> = (0..self.entries.len())
            .map(|index| meter.reading(index, elapsed_ms))
            .collect();
        // The buckets that decided: this process's (settled at once), or Redis's.
        let here = match (&self.shared.store, self.decider) {
            (Store::Redis(redis), Decider::Store) => {
                // Without a runtime (the process is ending) the reservations stand.
                tokio::runtime::Handle::try_current().ok()?;
                let redis = redis.clone();
                let tasks = self.shared.tasks.clone();
                return Some(tasks.spawn(async move {
                    let charges = self.charges(readings, ended);
                    let landed = !charges.requests.is_empty()
                        && self.landed(redis.record_outcomes(&charges.requests).await);
                    self.finish(charges, landed);
                }));
            }
            (Store::Memory(memory), Decider::Store) => Some(memory),
            (_, Decider::Local) => Some(&self.shared.local),
            (_, Decider::Nobody) => None,
        };
        let charges = self.charges(readings, ended);
        let landed = match here {
            Some(buckets) if !charges.requests.is_empty() => {
                buckets.record_outcomes(&charges.requests);
                true
            }
            _ => false,
        };
        self.finish(charges, landed);
        None
    }

    /// What each settled bucket is charged beyond its reservation (negative: given back).
    fn charges(&self, readings: PerMeasure<Reading>, ended: bool) -> Charges<'_> {
        let route = &self.runtime.routes[self.route];
        let mut charges = Charges {
            requests: PerMeasure::new(),
            limits: PerMeasure::new(),
            reserved: String::new(),
            settled: String::new(),
        };
        for (entry, reading) in self.entries.iter().zip(readings) {
            let applied = &route.limits[entry.limit];
            let Some(settled) = &applied.settled else {
                continue;
            };
            let reserved = entry.charge.cost;
            let value = match reading {
                Reading::Number(value) => Some(value * settled.settle.scale),
                // Cut short before the value came: the reservation stands, and that is no
                // missing value.
                Reading::Absent if !ended => None,
                Reading::Absent | Reading::Invalid => {
                    settled.metrics.missing.inc();
                    None
                }
            };
            let name = &applied.limit.name;
            // The log's fields are built only for a line that is written.
            if self.line.is_some() {
                push_entry(&mut charges.reserved, name, reserved);
                push_entry(&mut charges.settled, name, value.unwrap_or(reserved));
            }
            let Some(value) = value else {
                continue;
            };
            let difference = value - reserved;
            if difference == 0.0 {
                continue;
            }
            charges.requests.push(OutcomeRequest {
                key: BucketKey {
                    limit: name,
                    fingerprint: entry.fingerprint,
                    parts: entry.parts.clone(),
                },
                charge: Charge {
                    cost: difference,
                    ..entry.charge
                },
                adaptive: entry.adaptive,
                error: false,
            });
            charges.limits.push(applied);
        }
        charges
    }

    /// Whether the store's answer says the charges landed.
    fn landed<T>(&self, recorded: Result<T, StoreError>) -> bool {
        match recorded {
            Ok(_) => true,
            // Late (counted by the store), or the store is known to be down: nothing landed.
            Err(StoreError::Timeout | StoreError::Unavailable) => false,
            Err(error) => {
                self.shared.store_calls.errors.inc();
                tracing::warn!(backend = self.shared.store.backend(), %error, "store call failed (settlement)");
                false
            }
        }
    }

    /// Counts what landed, and writes the request's access-log line.
    fn finish(&self, charges: Charges<'_>, landed: bool) {
        if landed {
            for (request, applied) in charges.requests.iter().zip(charges.limits) {
                let (Some(settled), difference) = (&applied.settled, request.charge.cost) else {
                    continue;
                };
                if difference > 0.0 {
                    settled.metrics.charged.inc_by(difference);
                    applied.metrics.tokens_consumed.inc_by(difference);
                } else {
                    settled.metrics.refunded.inc_by(-difference);
                }
            }
        }
        let line = self.line.as_ref().and_then(|line| line.lock().ok()?.take());
        if let Some((mut exchange, status)) = line {
            exchange.reserved = Some(charges.reserved);
            exchange.settled = Some(charges.settled);
            exchange.log(status);
        }
    }
}

/// A settlement's charges, with their route limits and the access log's fields.
struct Charges<'s> {
    requests: PerMeasure<OutcomeRequest<'s>>,
    limits: PerMeasure<&'s AppliedLimit>,
    reserved: String,
    settled: String,
}

/// `limit=tokens`, comma-separated, as the access log carries them.
fn push_entry(text: &mut String, limit: &str, tokens: f64) {
    if !text.is_empty() {
        text.push(',');
    }
    text.push_str(limit);
    text.push('=');
    let rounded = (tokens * 1e3).round() / 1e3;
    text.push_str(&rounded.to_string());
}

/// A response body that measures what passes and settles when it ends.
struct SettlingBody {
    inner: Body,
    meter: Meter,
    /// Taken when the settlement starts.
    settlement: Option<Box<Settlement>>,
    state: State,
}

enum State {
    Streaming,
    /// The body ended; its last frame waits for the settlement's store call.
    Settling {
        task: Option<JoinHandle<()>>,
        last: Option<Frame<Bytes>>,
    },
    Done,
}

impl SettlingBody {
    fn start(&mut self, ended: bool) -> Option<JoinHandle<()>> {
        self.settlement
            .take()
            .and_then(|settlement| settlement.start(&self.meter, ended))
    }
}

impl http_body::Body for SettlingBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            match &mut this.state {
                State::Streaming => match ready!(Pin::new(&mut this.inner).poll_frame(cx)) {
                    Some(Ok(frame)) => {
                        if let Some(data) = frame.data_ref() {
                            this.meter.data(data);
                        } else if let Some(trailers) = frame.trailers_ref() {
                            this.meter.trailers(trailers);
                        }
                        if !(frame.is_trailers() || this.inner.is_end_stream()) {
                            return Poll::Ready(Some(Ok(frame)));
                        }
                        this.meter.end();
                        let task = this.start(true);
                        this.state = State::Settling {
                            task,
                            last: Some(frame),
                        };
                    }
                    None => {
                        this.meter.end();
                        let task = this.start(true);
                        this.state = State::Settling { task, last: None };
                    }
                    Some(Err(error)) => {
                        // The upstream failed mid-body: what was measured is settled.
                        this.start(false);
                        this.state = State::Done;
                        return Poll::Ready(Some(Err(error)));
                    }
                },
                State::Settling { task, last } => {
                    if let Some(handle) = task {
                        // A settlement that failed has logged why; the body still ends.
                        let _ = ready!(Pin::new(handle).poll(cx));
                    }
                    let last = last.take();
                    this.state = State::Done;
                    return Poll::Ready(last.map(Ok));
                }
                State::Done => return Poll::Ready(None),
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.state, State::Done)
    }

    fn size_hint(&self) -> SizeHint {
        match &self.state {
            State::Streaming => self.inner.size_hint(),
            State::Settling { last, .. } => SizeHint::with_exact(
                last.as_ref()
                    .and_then(Frame::data_ref)
                    .map_or(0, |data| data.len() as u64),
            ),
            State::Done => SizeHint::with_exact(0),
        }
    }
}

impl Drop for SettlingBody {
    /// A client that leaves early settles what was measured up to then.
    fn drop(&mut self) {
        self.start(false);
    }
}
