//! THE request path, top to bottom. Each phase either hands the request on or answers it:
//!
//! ```text
//! check the request ─ route ─ client address ─ (buffer body) ─ keys ─ decide ─ forward ─ respond
//!        400/405/431     404          400             413/400      400     429/503   502/504
//! ```
//!
//! Every response the gateway writes itself comes from `respond.rs`; every request leaves
//! one access-log line and its counters.

use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use smallvec::SmallVec;

use crate::client_ip;
use crate::config::{Mode, Policy, Route, StoreFailurePolicy};
use crate::key::{self, RequestFacts};
use crate::limit::{
    BucketKey, BucketRequest, Charge, Decision, OutcomeRequest, StoreError, Verdicts,
};
use crate::metrics::{Outcome, RouteMetrics, StatusClass};
use crate::respond::{self, FieldValue, LimitReport, Refusal, SetFields};
use crate::upstream::{self, ForwardError, OutgoingBody, X_FORWARDED_FOR};
use crate::{path, route, Body, RequestId, Runtime, Shared};

/// A client request's body as the server hands it over.
#[derive(Debug)]
pub enum RequestBody {
    /// The request has no body (the server's own HTTP/1.1 path takes only such requests).
    Empty,
    /// A body read by hyper as the gateway consumes it.
    Incoming(Incoming),
}

/// What the gateway knows of the connection a request came on.
#[derive(Debug, Clone)]
pub struct Connection {
    pub peer: IpAddr,
    /// The peer as an `X-Forwarded-For` entry, rendered once per connection.
    pub peer_header: HeaderValue,
    /// `X-Forwarded-Proto` for the upstream.
    pub proto: &'static str,
}

impl Connection {
    pub fn new(peer: IpAddr, proto: &'static str) -> Connection {
        let peer = peer.to_canonical();
        Connection {
            peer,
            peer_header: upstream::peer_header(peer),
            proto,
        }
    }
}

/// Serves requests against the current policy. Cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    pub(crate) shared: Arc<Shared>,
}

/// One line of the access log, filled in as the request moves through the phases.
struct Exchange {
    /// When the request came in; read only when the access log is on (a clock read per
    /// request is not free on a virtual machine).
    started: Option<Instant>,
    method: Method,
    path: String,
    client: Option<IpAddr>,
    route: Option<Arc<str>>,
    outcome: Option<Outcome>,
    limit: Option<String>,
    upstream: Option<Duration>,
    request_id: RequestId,
    logged: bool,
}

impl Exchange {
    fn log(&mut self, status: StatusCode) {
        self.logged = true;
        access_log(self, status);
    }
}

impl Drop for Exchange {
    /// A request whose client went away before the answer still gets its line, with nginx's
    /// 499 ("client closed request").
    fn drop(&mut self) {
        if !self.logged {
            if let Ok(status) = StatusCode::from_u16(499) {
                access_log(self, status);
            }
        }
    }
}

/// Why a request reached no route.
enum Unrouted {
    ShuttingDown,
    Refused(Refusal),
    NoRoute,
}

impl Unrouted {
    fn render(self) -> Response<Body> {
        match self {
            Unrouted::ShuttingDown => respond::shutting_down(),
            Unrouted::Refused(refusal) => refusal.render(),
            Unrouted::NoRoute => respond::not_found(),
        }
    }
}

/// Counts a request in `tollgate_inflight_requests` until dropped, even when the client goes
/// away and the request's future is dropped half-way.
struct InFlightRequest<'a>(&'a crate::metrics::IntGauge);

impl<'a> InFlightRequest<'a> {
    fn new(gauge: &'a crate::metrics::IntGauge) -> InFlightRequest<'a> {
        gauge.inc();
        InFlightRequest(gauge)
    }
}

impl Drop for InFlightRequest<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

impl Gateway {
    /// Answers one request; never fails (errors become responses).
    pub async fn handle(
        &self,
        request: Request<RequestBody>,
        connection: &Connection,
        fields: &mut SetFields,
    ) -> Response<Body> {
        let _inflight = InFlightRequest::new(&self.shared.metrics.inflight);
        let runtime = self.shared.runtime.load_full();
        let scan = FieldScan::of(request.headers());
        let client_id = scan
            .request_id
            .then(|| request.headers().get(X_REQUEST_ID))
            .flatten();
        let request_id = self.shared.request_id(client_id);
        let mut exchange = Exchange {
            started: access_logging().then(Instant::now),
            method: request.method().clone(),
            path: String::new(),
            client: None,
            route: None,
            outcome: None,
            limit: None,
            upstream: None,
            request_id,
            logged: false,
        };
        let response = match self.find_route(&runtime, &request, &scan, &mut exchange) {
            Ok((index, host)) => {
                let route = &runtime.policy.routes[index];
                let metrics = &runtime.metrics[index];
                let (outcome, response) = self
                    .serve_route(
                        &runtime,
                        route,
                        metrics,
                        request,
                        host,
                        &scan,
                        connection,
                        &mut exchange,
                        fields,
                    )
                    .await;
                metrics.outcome(outcome).inc();
                exchange.outcome = Some(outcome);
                response
            }
            Err(unrouted) => unrouted.render(),
        };
        exchange.log(response.status());
        fields.set(
            &REQUEST_ID_NAME,
            FieldValue::RequestId(exchange.request_id.clone()),
        );
        response
    }

    /// Checks the request and finds its route: its index and the request's `Host`, or the
    /// answer to a request that has none.
    fn find_route(
        &self,
        runtime: &Runtime,
        request: &Request<RequestBody>,
        scan: &FieldScan,
        exchange: &mut Exchange,
    ) -> Result<(usize, Option<HeaderValue>), Unrouted> {
        let policy = &runtime.policy;
        exchange.path = path::normalize(request.uri().path());
        if self.shared.shutting_down.load(Ordering::Relaxed) {
            return Err(Unrouted::ShuttingDown);
        }
        let host = match check_request(request, scan, policy.server.max_header_bytes) {
            Ok(host) => host,
            Err(refusal) => {
                self.shared.metrics.bad_request_without_route();
                exchange.outcome = Some(Outcome::BadRequest);
                return Err(Unrouted::Refused(refusal));
            }
        };
        // Only routes with a `host` need the host name (parsed again, lower-cased).
        let host_name = runtime
            .matches_hosts
            .then(|| host.as_ref().map(host_without_port))
            .flatten();
        let Some(index) = route::find(
            &policy.routes,
            host_name.as_deref(),
            request.method(),
            &exchange.path,
        ) else {
            self.shared.metrics.no_route();
            exchange.outcome = Some(Outcome::NoRoute);
            return Err(Unrouted::NoRoute);
        };
        // Only the access log reads it, like `started` and `limit`.
        if access_logging() {
            exchange.route = Some(policy.routes[index].name.clone());
        }
        Ok((index, host))
    }

    #[allow(clippy::too_many_arguments)]
    async fn serve_route(
        &self,
        runtime: &Runtime,
        route: &Route,
        metrics: &RouteMetrics,
        request: Request<RequestBody>,
        host: Option<HeaderValue>,
        scan: &FieldScan,
        connection: &Connection,
        exchange: &mut Exchange,
        fields: &mut SetFields,
    ) -> (Outcome, Response<Body>) {
        let policy = &runtime.policy;
        let forwarded_for = scan
            .forwarded_for(request.headers())
            .filter_map(|value| value.to_str().ok());
        let resolved =
            match client_ip::resolve(&policy.client_ip.trust, connection.peer, forwarded_for) {
                Ok(resolved) => resolved,
                Err(error) => {
                    return (
                        Outcome::BadRequest,
                        respond::bad_request(&error.to_string()),
                    )
                }
            };
        if let Some(warning) = resolved.warning {
            self.shared.trust_warning(warning);
        }
        let client = resolved.client;
        exchange.client = Some(client);

        let (mut parts, body) = request.into_parts();
        let body = match body {
            RequestBody::Empty => OutgoingBody::Buffered(Bytes::new()),
            RequestBody::Incoming(body) if route.reads_body => {
                let buffered = buffer_body(&parts.headers, body, policy.server.max_buffered_body);
                match Box::pin(buffered).await {
                    Ok(bytes) => OutgoingBody::Buffered(bytes),
                    Err(refusal) => return (Outcome::BadRequest, refusal.render()),
                }
            }
            RequestBody::Incoming(body) if http_body::Body::is_end_stream(&body) => {
                OutgoingBody::Buffered(Bytes::new())
            }
            RequestBody::Incoming(body) => OutgoingBody::Streamed(body),
        };

        // Keys: one bucket per applicable limit; `applied[i]` is the route entry of bucket i.
        let mut buckets: SmallVec<[BucketRequest<'_>; 4]> = SmallVec::new();
        let mut applied: SmallVec<[usize; 4]> = SmallVec::new();
        {
            let body_bytes = match &body {
                OutgoingBody::Buffered(bytes) if route.reads_body => Some(bytes.as_ref()),
                _ => None,
            };
            let facts = RequestFacts::new(client, &parts.headers, parts.uri.query(), body_bytes);
            let load_factor = self.shared.load.factor();
            for (position, entry) in route.limits.iter().enumerate() {
                let limit = &policy.limits[entry.limit];
                match key::extract(limit, &facts, &self.shared.hasher) {
                    Ok(Some(key_parts)) => {
                        buckets.push(BucketRequest {
                            key: BucketKey {
                                limit: &limit.name,
                                fingerprint: limit.fingerprint,
                                parts: key_parts,
                            },
                            charge: Charge {
                                capacity: limit.capacity,
                                rate: limit.rate.per_second() * load_factor,
                                cost: entry.cost,
                                enforce: limit.mode == Mode::Enforce,
                            },
                            adaptive: limit.adaptive.as_ref().map(|adaptive| adaptive.params),
                        });
                        applied.push(position);
                    }
                    Ok(None) => {}
                    Err(error) => {
                        return (
                            Outcome::BadRequest,
                            respond::bad_request(&error.to_string()),
                        )
                    }
                }
            }
        }

        let mut outcome = Outcome::Allowed;
        let admit_all = Decision {
            admitted: true,
            verdicts: Verdicts::new(),
        };
        let (decision, decider) = if buckets.is_empty() {
            (admit_all, Decider::Nobody)
        } else {
            match self.decide(&buckets).await {
                Ok(decision) => (decision, Decider::Store),
                Err(()) => {
                    metrics.degraded.inc();
                    outcome = Outcome::DegradedAllowed;
                    match route.on_store_failure {
                        StoreFailurePolicy::Allow => (admit_all, Decider::Nobody),
                        StoreFailurePolicy::Deny => {
                            return (Outcome::StoreUnavailable, respond::store_unavailable(1));
                        }
                        StoreFailurePolicy::Local => {
                            (self.shared.local.decide(&buckets), Decider::Local)
                        }
                    }
                }
            }
        };

        let mut reports: SmallVec<[LimitReport<'_>; 4]> = SmallVec::new();
        let mut refusing: SmallVec<[&str; 4]> = SmallVec::new();
        for ((bucket, verdict), position) in buckets.iter().zip(&decision.verdicts).zip(&applied) {
            if !verdict.observed {
                continue;
            }
            let limit_metrics = &metrics.limits[*position];
            limit_metrics
                .fill_ratio
                .observe((verdict.tokens / verdict.capacity).clamp(0.0, 1.0));
            if decision.admitted && verdict.sufficient {
                limit_metrics.tokens_consumed.inc_by(bucket.charge.cost);
            }
            if !verdict.sufficient {
                if bucket.charge.enforce {
                    limit_metrics.limited.inc();
                    refusing.push(bucket.key.limit);
                } else if decision.admitted && outcome == Outcome::Allowed {
                    outcome = Outcome::ShadowLimited;
                }
            }
            if bucket.charge.enforce {
                reports.push(LimitReport {
                    name: bucket.key.limit,
                    capacity: verdict.capacity,
                    rate: verdict.rate,
                    cost: bucket.charge.cost,
                    tokens: verdict.tokens,
                    full_in: verdict.full_in,
                    wait: verdict.wait,
                    refused: !decision.admitted && !verdict.sufficient,
                });
            }
        }
        let header_mode = policy.server.ratelimit_headers;
        if !decision.admitted {
            // Only the access log reads it: not spelled out when nobody will read it.
            if access_logging() {
                exchange.limit = Some(refusing.join(","));
            }
            tracing::debug!(route = %route.name, limits = %refusing.join(","), "refused");
            // Refusals come in floods: the request's map can hold the next request's head.
            crate::header_maps::give_back(parts.headers);
            return (
                Outcome::Limited,
                respond::too_many_requests(header_mode, &reports, fields),
            );
        }

        let upgrade = scan.upgrade && upstream::is_upgrade(&parts.headers);
        let client_upgrade = if upgrade {
            parts.extensions.remove::<OnUpgrade>()
        } else {
            None
        };
        if scan.transfer_encoding {
            parts.headers.remove(header::CONTENT_LENGTH);
        }
        upstream::remove_hop_by_hop(&mut parts.headers, upgrade);
        let forwarding = upstream::Forwarding::new(
            scan.forwarded_for(&parts.headers),
            &exchange.request_id,
            &connection.peer_header,
            connection.proto,
            host.as_ref(),
        );

        let pool = &runtime.upstreams[route.upstream];
        let sent = Instant::now();
        let watching_load = policy.overload.is_some();
        let in_flight = watching_load.then(|| self.shared.load.start_request());
        let result = pool
            .send(parts, forwarding, &exchange.path, body, sent)
            .await;
        let elapsed = sent.elapsed();
        drop(in_flight);
        exchange.upstream = Some(elapsed);
        let mut response = match result {
            Ok(response) => response,
            Err(error) => {
                metrics.upstream_status(StatusClass::Error).inc();
                tracing::warn!(route = %route.name, upstream = %pool.settings.name, %error, "upstream failed");
                let response = match error {
                    ForwardError::Timeout(_) => respond::gateway_timeout(),
                    ForwardError::Connect(_) | ForwardError::Exchange(_) => respond::bad_gateway(),
                };
                return (outcome, response);
            }
        };
        metrics.upstream_duration.observe(elapsed.as_secs_f64());
        metrics
            .upstream_status(StatusClass::of(response.status()))
            .inc();
        if watching_load {
            self.shared.load.observe(elapsed);
        }
        let after = AfterResponse {
            route,
            metrics,
            buckets: &buckets,
            applied: &applied,
            decider,
        };
        self.after_response(policy, after, response.status().as_u16())
            .await;

        let switching = response.status() == StatusCode::SWITCHING_PROTOCOLS;
        if switching {
            match (
                client_upgrade,
                response.extensions_mut().remove::<OnUpgrade>(),
            ) {
                (Some(client), Some(server)) => self.splice_upgraded(client, server),
                _ => return (outcome, respond::bad_gateway()),
            }
        }
        upstream::remove_hop_by_hop(response.headers_mut(), switching);
        respond::add_ratelimit_headers(fields, header_mode, &reports);
        (outcome, response)
    }

    /// Response hooks: extra charges by status and adaptive errors, recorded in the store that
    /// decided the request. Awaited before the response goes out, so the client's next
    /// request already sees them; it costs a store call only on configured statuses.
    async fn after_response(&self, policy: &Policy, after: AfterResponse<'_>, status: u16) {
        let mut positions = Vec::new();
        let mut requests = Vec::new();
        for (bucket, position) in after.buckets.iter().zip(after.applied) {
            let limit = &policy.limits[after.route.limits[*position].limit];
            let (extra, error) = (limit.charge_for(status), limit.is_error(status));
            if extra > 0.0 || error {
                positions.push(*position);
                requests.push(OutcomeRequest {
                    key: bucket.key.clone(),
                    charge: Charge {
                        cost: extra,
                        ..bucket.charge
                    },
                    adaptive: bucket.adaptive,
                    error,
                });
            }
        }
        if requests.is_empty() {
            return;
        }
        let tripped = match after.decider {
            Decider::Store => self.shared.store.record_outcomes(&requests).await,
            Decider::Local => Ok(self.shared.local.record_outcomes(&requests)),
            Decider::Nobody => return,
        };
        let tripped = match tripped {
            Ok(tripped) => tripped,
            Err(StoreError::Unavailable) => return,
            Err(error) => {
                self.shared.store_metrics.1.inc();
                tracing::warn!(backend = self.shared.store.backend(), %error, "store call failed (response hooks)");
                return;
            }
        };
        for ((position, request), tripped) in positions.iter().zip(&requests).zip(tripped) {
            let limit_metrics = &after.metrics.limits[*position];
            limit_metrics.tokens_consumed.inc_by(request.charge.cost);
            if tripped {
                if let Some(penalties) = &limit_metrics.penalties {
                    penalties.inc();
                }
                tracing::info!(route = %after.route.name, limit = %request.key.limit, "adaptive penalty: key tripped");
            }
        }
    }

    /// One store call for all of the request's buckets; `Err` is a store failure (counted).
    async fn decide(&self, buckets: &[BucketRequest<'_>]) -> Result<Decision, ()> {
        let store = &self.shared.store;
        let (duration, errors) = &self.shared.store_metrics;
        let started = Instant::now();
        let result = store.decide(buckets).await;
        duration.observe(started.elapsed().as_secs_f64());
        result.map_err(|error| match error {
            // The circuit is open: no call was made, nothing new to report.
            StoreError::Unavailable => {}
            error => {
                errors.inc();
                tracing::warn!(backend = store.backend(), %error, "store call failed");
            }
        })
    }

    /// Copies bytes both ways between an upgraded client and upstream connection.
    fn splice_upgraded(&self, client: OnUpgrade, server: OnUpgrade) {
        self.shared.tasks.spawn(async move {
            let (client, server) = match tokio::try_join!(client, server) {
                Ok(pair) => pair,
                Err(error) => {
                    tracing::debug!(%error, "upgrade did not complete");
                    return;
                }
            };
            let (mut client, mut server) = (TokioIo::new(client), TokioIo::new(server));
            if let Err(error) = tokio::io::copy_bidirectional(&mut client, &mut server).await {
                tracing::debug!(%error, "upgraded connection ended");
            }
        });
    }
}

/// Which store took a request's decision (and so receives its response hooks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Decider {
    Store,
    /// The in-process buckets of `on_store_failure = "local"`.
    Local,
    /// No bucket applied, or the store failed on an `allow` route.
    Nobody,
}

/// What the response hooks need to know about a forwarded request.
struct AfterResponse<'a> {
    route: &'a Route,
    metrics: &'a RouteMetrics,
    buckets: &'a [BucketRequest<'a>],
    /// The route-limit position of each bucket.
    applied: &'a [usize],
    decider: Decider,
}

pub(crate) const X_REQUEST_ID: http::HeaderName = http::HeaderName::from_static("x-request-id");
/// As a static, for `SetFields` and `upstream::Forwarding`, which hand out references to it.
pub(crate) static REQUEST_ID_NAME: http::HeaderName = X_REQUEST_ID;

/// What one pass over a request's fields finds: their size, and which of the fields the
/// request path looks up by name the request carries. Most requests carry none of them, and
/// looking up a missing name still costs a hash and a probe.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct FieldScan {
    /// Names and values, with 4 bytes per field for `: ` and the line end.
    bytes: usize,
    forwarded_for: bool,
    request_id: bool,
    transfer_encoding: bool,
    content_length: bool,
    upgrade: bool,
}

impl FieldScan {
    fn of(headers: &HeaderMap) -> FieldScan {
        let mut scan = FieldScan::default();
        for (name, value) in headers {
            let name = name.as_str();
            scan.bytes += name.len() + value.len() + 4;
            // Names are lower case; their lengths tell these apart from most others cheaply.
            match name.len() {
                7 => scan.upgrade |= name == "upgrade",
                12 => scan.request_id |= name == "x-request-id",
                14 => scan.content_length |= name == "content-length",
                15 => scan.forwarded_for |= name == "x-forwarded-for",
                17 => scan.transfer_encoding |= name == "transfer-encoding",
                _ => {}
            }
        }
        scan
    }

    /// The `X-Forwarded-For` values of `headers` (the scanned ones, or what is left of them).
    fn forwarded_for<'h>(&self, headers: &'h HeaderMap) -> impl Iterator<Item = &'h HeaderValue> {
        self.forwarded_for
            .then(|| headers.get_all(X_FORWARDED_FOR))
            .into_iter()
            .flatten()
    }
}

/// Request-level checks before routing; returns the request's host (Host or :authority).
fn check_request<B>(
    request: &Request<B>,
    scan: &FieldScan,
    max_header_bytes: usize,
) -> Result<Option<HeaderValue>, Refusal> {
    if request.method() == Method::CONNECT {
        return Err(Refusal::MethodNotAllowed);
    }
    let headers = request.headers();
    let uri = request.uri();
    let header_bytes = scan.bytes
        + uri.path_and_query().map_or(0, |pq| pq.as_str().len())
        + uri
            .authority()
            .map_or(0, |authority| authority.as_str().len());
    if header_bytes > max_header_bytes {
        return Err(Refusal::HeaderFieldsTooLarge);
    }
    if scan.transfer_encoding && scan.content_length {
        return Err(Refusal::BadRequest(
            "both Content-Length and Transfer-Encoding are present".to_owned(),
        ));
    }
    if scan.content_length {
        let mut lengths = headers.get_all(header::CONTENT_LENGTH).iter();
        if let Some(first) = lengths.next() {
            if lengths.any(|other| other != first) {
                return Err(Refusal::BadRequest(
                    "conflicting Content-Length values".to_owned(),
                ));
            }
        }
    }
    request_host(request.uri(), headers, request.version())
        .map_err(|detail| Refusal::BadRequest(detail.to_owned()))
}

fn request_host(
    uri: &Uri,
    headers: &HeaderMap,
    version: Version,
) -> Result<Option<HeaderValue>, &'static str> {
    if let Some(authority) = uri.authority() {
        return HeaderValue::from_str(authority.as_str())
            .map(Some)
            .map_err(|_| "invalid authority");
    }
    let mut hosts = headers.get_all(header::HOST).iter();
    let host = match (hosts.next(), hosts.next()) {
        (None, _) if version == Version::HTTP_11 => return Err("missing Host header"),
        (None, _) => return Ok(None),
        (Some(_), Some(_)) => return Err("several Host headers"),
        (Some(host), None) => host,
    };
    if is_valid_host(host.as_bytes()) {
        Ok(Some(host.clone()))
    } else {
        Err("invalid Host header")
    }
}

/// Whether a `Host` value is `uri-host [":" port]` (RFC 9110 §7.2): a bracketed IPv6 address,
/// or an IPv4 address or registered name, without userinfo.
fn is_valid_host(value: &[u8]) -> bool {
    let (host, port) = match value.iter().rposition(|byte| *byte == b':') {
        Some(colon) if !value[colon..].contains(&b']') => {
            (&value[..colon], Some(&value[colon + 1..]))
        }
        _ => (value, None),
    };
    let port_valid = port.is_none_or(|port| {
        !port.is_empty()
            && port.iter().all(u8::is_ascii_digit)
            && std::str::from_utf8(port).is_ok_and(|port| port.parse::<u16>().is_ok())
    });
    let host_valid = match host {
        [b'[', address @ .., b']'] => std::str::from_utf8(address)
            .is_ok_and(|address| address.parse::<std::net::Ipv6Addr>().is_ok()),
        [] => false,
        name => name.iter().all(|byte| REG_NAME_BYTES[usize::from(*byte)]),
    };
    port_valid && host_valid
}

/// The bytes of a registered name or IPv4 address (RFC 3986 `unreserved` and `sub-delims`),
/// as a table: looked up for every byte of every request's `Host`.
const REG_NAME_BYTES: [bool; 256] = {
    let mut table = [false; 256];
    let mut byte = 0;
    while byte < 256 {
        table[byte] = (byte as u8).is_ascii_alphanumeric();
        byte += 1;
    }
    let others = b"-._~!$&'()*+,;=";
    let mut index = 0;
    while index < others.len() {
        table[others[index] as usize] = true;
        index += 1;
    }
    table
};

fn host_without_port(host: &HeaderValue) -> String {
    let text = host.to_str().unwrap_or_default();
    text.parse::<http::uri::Authority>()
        .map(|authority| authority.host().to_ascii_lowercase())
        .unwrap_or_else(|_| text.to_ascii_lowercase())
}

/// Reads the whole body, up to `max` bytes (413 beyond; 400 if the client breaks off).
async fn buffer_body(headers: &HeaderMap, body: Incoming, max: usize) -> Result<Bytes, Refusal> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > max as u64) {
        return Err(Refusal::PayloadTooLarge(max));
    }
    match Limited::new(body, max).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(error) if error.is::<http_body_util::LengthLimitError>() => {
            Err(Refusal::PayloadTooLarge(max))
        }
        Err(_) => Err(Refusal::BadRequest(
            "the request body could not be read".to_owned(),
        )),
    }
}

fn access_logging() -> bool {
    tracing::enabled!(target: "tollgate::access", tracing::Level::INFO)
}

fn access_log(exchange: &Exchange, status: StatusCode) {
    if !access_logging() {
        return;
    }
    let outcome = exchange.outcome.map_or("", Outcome::as_str);
    let client = exchange
        .client
        .map(|client| client.to_string())
        .unwrap_or_default();
    let route = exchange.route.as_deref().unwrap_or("");
    let limit = exchange.limit.as_deref().unwrap_or("");
    let milliseconds = |elapsed: Duration| (elapsed.as_secs_f64() * 1e6).round() / 1e3;
    let upstream_ms = exchange.upstream.map_or(-1.0, milliseconds);
    tracing::info!(
        target: "tollgate::access",
        client = %client,
        method = %exchange.method,
        path = %exchange.path,
        route,
        status = status.as_u16(),
        outcome,
        limit,
        duration_ms = exchange.started.map_or(-1.0, |started| milliseconds(started.elapsed())),
        upstream_ms,
        request_id = exchange.request_id.as_str(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// The check `is_valid_host` replaced: http's authority parser, at the cost of a copy.
    fn valid_as_authority(text: &str) -> bool {
        !text.is_empty()
            && text.parse::<http::uri::Authority>().is_ok_and(|authority| {
                authority.as_str() == authority.host() || authority.port().is_some()
            })
    }

    proptest! {
        /// The scan finds a name exactly when a lookup would, whatever else the request
        /// carries, and counts every field, repeated ones too.
        #[test]
        fn the_field_scan_agrees_with_lookups(
            fields in proptest::collection::vec(
                (
                    prop::sample::select(vec![
                        "upgrade", "x-request-id", "content-length", "x-forwarded-for",
                        "transfer-encoding", "host", "x-user-id", "x-forwarded-fo",
                        "connection", "x-request-ids", "accept-encoding",
                    ]),
                    "[a-z0-9]{0,12}",
                ),
                0..12,
            )
        ) {
            let mut headers = HeaderMap::new();
            for (name, value) in &fields {
                headers.append(*name, HeaderValue::from_str(value).unwrap());
            }
            let scan = FieldScan::of(&headers);
            prop_assert_eq!(scan.upgrade, headers.contains_key(header::UPGRADE));
            prop_assert_eq!(scan.request_id, headers.contains_key(X_REQUEST_ID));
            prop_assert_eq!(scan.content_length, headers.contains_key(header::CONTENT_LENGTH));
            prop_assert_eq!(scan.forwarded_for, headers.contains_key(X_FORWARDED_FOR));
            prop_assert_eq!(
                scan.transfer_encoding,
                headers.contains_key(header::TRANSFER_ENCODING)
            );
            let bytes: usize = fields
                .iter()
                .map(|(name, value)| name.len() + value.len() + 4)
                .sum();
            prop_assert_eq!(scan.bytes, bytes);
            prop_assert_eq!(
                scan.forwarded_for(&headers).count(),
                headers.get_all(X_FORWARDED_FOR).iter().count()
            );
        }
    }

    #[test]
    fn hosts_are_names_or_addresses_with_an_optional_port() {
        let valid = [
            "example.com",
            "Example.COM:8080",
            "127.0.0.1:1",
            "[::1]",
            "[2001:db8::1]:443",
            "a_b~c-d.e",
            "x:65535",
        ];
        let invalid = [
            "",
            ":80",
            "a:",
            "a:65536",
            "a:+80",
            "a:b:c",
            "user@host",
            "user@host:80",
            "a b",
            "a/b",
            "a%20b",
            "[::1",
            "[zz::1]",
            "::1",
            "é.com",
        ];
        for host in valid {
            assert!(is_valid_host(host.as_bytes()), "{host}");
        }
        for host in invalid {
            assert!(!is_valid_host(host.as_bytes()), "{host}");
        }
    }

    proptest! {
        /// Outside userinfo, IPv6 literals and empty names with a port (where it is stricter),
        /// it agrees with http's authority parser.
        #[test]
        fn agrees_with_the_authority_parser(
            name in "[a-zA-Z0-9.~_!$&'()*,;= /?#%-]{0,12}",
            port in proptest::option::of("[0-9a]{0,6}"),
        ) {
            prop_assume!(!name.is_empty());
            let host = match port {
                Some(port) => format!("{name}:{port}"),
                None => name,
            };
            prop_assert_eq!(is_valid_host(host.as_bytes()), valid_as_authority(&host), "{}", host);
        }
    }
}
