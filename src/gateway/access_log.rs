//! The access log: one line per request (target `tollgate::access`), filled in as the request
//! moves through the phases, written when the answer is known or when the client goes away.

use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::{Method, StatusCode};

use crate::geoip::Origin;
use crate::limit::Reading;
use crate::metrics::{DecisionProtocol, IntCounter, Outcome};
use crate::reject::Cause;
use crate::reject::{refusing, Reports};
use crate::request_id::RequestId;
use crate::traces::{Finished, RequestTrace};

/// Which listener a request came in on (the line's `listener`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Listener {
    /// Requests are decided and forwarded upstream.
    Proxy,
    /// Other proxies ask about their requests (`[decision]`); nothing is forwarded.
    Decision,
}

impl Listener {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Listener::Proxy => "proxy",
            Listener::Decision => "decision",
        }
    }
}

/// A line held until a settlement writes it, with the response's status.
pub(crate) type DeferredLine = Arc<Mutex<Option<(Exchange<'static>, StatusCode)>>>;

/// One line of the access log, and the request's count in `tollgate_requests_total` when its
/// client leaves before the answer.
pub(crate) struct Exchange<'r> {
    /// The request's one reading of the clock: when it came in, and the time it is decided,
    /// its id made and its refusal dated at.
    pub(crate) now: Reading,
    pub(crate) method: Method,
    pub(crate) path: String,
    pub(crate) client: Option<IpAddr>,
    /// What `[geoip]` says of the client, and the connection's TLS fingerprint.
    pub(crate) origin: Origin,
    pub(crate) ja4: Option<Arc<str>>,
    /// Only the access log reads it, like `started` and `limit`.
    pub(crate) route: Option<Arc<str>>,
    pub(crate) outcome: Option<Outcome>,
    /// Who caused a request to end early, when something did.
    pub(crate) cause: Option<Cause>,
    pub(crate) limit: Option<String>,
    /// Each applied limit's store key (`per_account=h:3f9a…,per_network=v4:…/32`): hashed,
    /// never a clear value, and what a replay of the log keys its buckets by.
    pub(crate) keys: Option<String>,
    /// The limits decided under an operator's override (`per_org`).
    pub(crate) overridden: Option<String>,
    pub(crate) upstream: Option<Duration>,
    pub(crate) request_id: RequestId,
    /// The counter of the outcome the request was admitted with, until the answer is known:
    /// a request whose client leaves before then (its future dropped) is counted on drop, so
    /// that every admitted request is counted exactly once.
    pub(crate) admitted_as: Option<&'r IntCounter>,
    pub(crate) listener: Listener,
    /// `grpc` for Envoy's rate limit service, else `http`.
    pub(crate) protocol: DecisionProtocol,
    /// Came over HTTP/3: the line's `protocol` is `h3`.
    pub(crate) http3: bool,
    /// Per settled limit, what the request reserved and what its response settled
    /// (`limit=tokens`), once the response has ended.
    pub(crate) reserved: Option<String>,
    pub(crate) settled: Option<String>,
    /// Where the line goes instead of the log when a settlement writes it, later.
    pub(crate) deferred: Option<DeferredLine>,
    /// The request's trace, with `[tracing]`: its SERVER span until the answer.
    pub(crate) trace: Option<RequestTrace>,
    /// The trace's id, for the line.
    pub(crate) trace_id: Option<String>,
    logged: bool,
}

impl<'r> Exchange<'r> {
    pub(crate) fn new(method: Method, request_id: RequestId, now: Reading) -> Exchange<'r> {
        Exchange {
            now,
            method,
            path: String::new(),
            client: None,
            origin: Origin::default(),
            ja4: None,
            route: None,
            outcome: None,
            cause: None,
            limit: None,
            keys: None,
            overridden: None,
            upstream: None,
            request_id,
            admitted_as: None,
            listener: Listener::Proxy,
            protocol: DecisionProtocol::Http,
            http3: false,
            reserved: None,
            settled: None,
            deferred: None,
            trace: None,
            trace_id: None,
            logged: false,
        }
    }

    /// Ends the request's SERVER span, when it is traced, with what became of the request
    /// (`limits`: the applied limits' names, worked out only for a sampled span); the trace's
    /// id goes into the line.
    pub(crate) fn end_trace(
        &mut self,
        status: StatusCode,
        route: Option<&str>,
        limits: impl FnOnce() -> Option<String>,
        reports: &Reports<'_>,
    ) {
        let Some(trace) = self.trace.take() else {
            return;
        };
        if enabled() {
            self.trace_id = Some(trace.trace_id());
        }
        trace.finish(&self.method, || Finished {
            status,
            path: &self.path,
            client: self.client,
            route,
            outcome: self.outcome.map(Outcome::as_str),
            limits: limits(),
            refused_by: reports
                .iter()
                .any(|report| report.refused)
                .then(|| refusing(reports)),
        });
    }

    /// What the line says of the client besides its address: its origin and fingerprint.
    pub(crate) fn note_client(&mut self, origin: Origin, ja4: Option<&str>) {
        if enabled() {
            self.origin = origin;
            self.ja4 = ja4.map(Arc::from);
        }
    }

    pub(crate) fn log(&mut self, status: StatusCode) {
        self.logged = true;
        if let Some(deferred) = self.deferred.take() {
            if let Ok(mut slot) = deferred.lock() {
                *slot = Some((self.detach(), status));
                return;
            }
        }
        write(self, status);
    }

    /// The line's fields, moved into a line of its own that outlives the request.
    fn detach(&mut self) -> Exchange<'static> {
        Exchange {
            now: self.now,
            method: self.method.clone(),
            path: std::mem::take(&mut self.path),
            client: self.client,
            origin: self.origin,
            ja4: self.ja4.take(),
            route: self.route.take(),
            outcome: self.outcome,
            cause: self.cause,
            limit: self.limit.take(),
            keys: self.keys.take(),
            overridden: self.overridden.take(),
            upstream: self.upstream,
            request_id: self.request_id.clone(),
            admitted_as: None,
            listener: self.listener,
            protocol: self.protocol,
            http3: self.http3,
            reserved: self.reserved.take(),
            settled: self.settled.take(),
            deferred: None,
            trace: None,
            trace_id: self.trace_id.take(),
            logged: false,
        }
    }
}

impl Drop for Exchange<'_> {
    /// A request whose client went away before the answer still gets its line, with nginx's
    /// 499 ("client closed request"), and its count.
    fn drop(&mut self) {
        if let Some(counter) = self.admitted_as.take() {
            counter.inc();
        }
        if !self.logged {
            if let Ok(status) = StatusCode::from_u16(499) {
                write(self, status);
            }
        }
    }
}

/// `limit=key` for each bucket, comma-separated: the store keys without their prefix.
pub(crate) fn keys(buckets: &[crate::limit::BucketRequest<'_>]) -> String {
    let mut text = String::new();
    for bucket in buckets {
        if !text.is_empty() {
            text.push(',');
        }
        text.push_str(bucket.key.limit);
        text.push('=');
        bucket.key.push_key_to(&mut text);
    }
    text
}

/// Whether access lines are written: what only the log reads is not worked out otherwise.
pub(crate) fn enabled() -> bool {
    tracing::enabled!(target: "tollgate::access", tracing::Level::INFO)
}

fn write(exchange: &Exchange<'_>, status: StatusCode) {
    if !enabled() {
        return;
    }
    let outcome = exchange.outcome.map_or("", Outcome::as_str);
    let client = exchange
        .client
        .map(|client| client.to_string())
        .unwrap_or_default();
    let route = exchange.route.as_deref().unwrap_or("");
    let limit = exchange.limit.as_deref().unwrap_or("");
    let keys = exchange.keys.as_deref().unwrap_or("");
    let milliseconds = |elapsed: Duration| (elapsed.as_secs_f64() * 1e6).round() / 1e3;
    let upstream_ms = exchange.upstream.map_or(-1.0, milliseconds);
    let asn = exchange
        .origin
        .asn
        .map(|asn| format!("AS{asn}"))
        .unwrap_or_default();
    let country = exchange.origin.country;
    tracing::info!(
        target: "tollgate::access",
        client = %client,
        method = %exchange.method,
        path = %exchange.path,
        route,
        status = status.as_u16(),
        outcome,
        cause = exchange.cause.map_or("", Cause::as_str),
        limit,
        keys,
        "override" = exchange.overridden.as_deref().unwrap_or(""),
        duration_ms = milliseconds(exchange.now.elapsed()),
        upstream_ms,
        request_id = exchange.request_id.as_str(),
        listener = exchange.listener.as_str(),
        protocol = if exchange.http3 { "h3" } else { exchange.protocol.as_str() },
        reserved = exchange.reserved.as_deref().unwrap_or(""),
        settled = exchange.settled.as_deref().unwrap_or(""),
        asn,
        country = country.as_ref().map_or("", |country| country.as_str()),
        ja4 = exchange.ja4.as_deref().unwrap_or(""),
        trace_id = exchange.trace_id.as_deref(),
    );
}
