//! THE request path, top to bottom. Each phase is a function that hands the request on or
//! rejects it with a [`Reject`]; `respond::rejection` renders every rejection in one place.
//!
//! ```text
//! answer ─ route ─ client_address ─ read_body ─ requested ─ admit (decide, delay) ─ forward ─ after_response ─ finish ─ (settle)
//!           400/405/431/404    400         413/400     400/401       429/503              502/504                502
//! ```
//!
//! Every request leaves one access-log line and its counters. The phases from routing to the
//! admission are steps the decision service (`crate::decision`) calls too, for the requests
//! other proxies ask about: [`Serving`] is what differs between the listeners (what follows
//! the admission, and how a rejection is answered). Beside this file, each phase of its own
//! named for it: `read_body.rs`, `decide.rs` (with `slots.rs`, the concurrency slots it
//! takes), `delay.rs`, `forward.rs`, `after_response.rs`, `finish.rs`, `settle.rs` (costs
//! settled when the response body ends); and the pure parts, `checks.rs` (the request head),
//! `accounting.rs` (what a decision means), `access_log.rs` (the log line). Why a request ends
//! early is `crate::reject`.

pub(crate) mod access_log;
pub mod accounting;
mod after_response;
pub(crate) mod applied;
pub(crate) mod checks;
pub(crate) mod client_facts;
pub(crate) mod decide;
pub(crate) mod delay;
mod finish;
mod forward;
mod plain_listener;
mod read_body;
mod scans;
mod settle;
pub(crate) mod slots;

use std::future::Future;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use http::header::HeaderValue;
use http::request::Parts;
use http::{HeaderMap, Request, Response};
use hyper::upgrade::OnUpgrade;

use self::access_log::{Exchange, Listener};
use self::applied::Applied;
use self::checks::FieldScan;
use self::client_facts::{client_facts, ClientFacts};
use self::decide::{Admission, NoObserver};
use self::read_body::read_body;
use self::settle::Settlement;
use self::slots::SlotRequests;
use crate::body::Body;
use crate::config::Limit;
use crate::connection::{Answering, Connection};
use crate::in_flight::RequestInFlight;
use crate::jwt::{self, JwtVerifier};
use crate::key::{self, KeyError, RequestFacts};
use crate::limit::{clock, BucketRequest, KeyParts, Reading};
use crate::metrics::Outcome;
use crate::overrides::{Override, Table};
use crate::reject::{LimitReport, Reject, Reports};
use crate::request_body::RequestBody;
use crate::request_id::{REQUEST_ID_NAME, X_REQUEST_ID};
use crate::respond::{self, FieldValue, SetFields};
use crate::runtime::{Runtime, ServedRoute};
use crate::shared::Shared;
use crate::upstream::OutgoingBody;
use crate::wire::header_maps;
use crate::wire::message::UpgradeExpected;
use crate::{client_ip, path, route};

/// Serves requests against the current policy. Cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    pub(crate) shared: Arc<Shared>,
}

/// A request that found its route: what its later phases read.
pub(crate) struct Routed<'r> {
    pub(crate) runtime: &'r Arc<Runtime>,
    pub(crate) route: &'r ServedRoute,
    /// The request's `Host` (or `:authority`), forwarded as it came.
    host: Option<HeaderValue>,
    scan: FieldScan,
    pub(crate) connection: &'r Connection,
}

/// A request's buckets, one per applicable limit, inline for the usual handful.
pub(crate) type Buckets<'r> = Applied<'r, BucketRequest<'r>>;

/// What a request asks of its route's limits: tokens of its buckets, slots of its concurrency
/// limits.
pub(crate) struct Requested<'r> {
    pub(crate) buckets: Buckets<'r>,
    pub(crate) slots: SlotRequests<'r>,
    /// The limits decided under an override, for the access log.
    pub(crate) overridden: smallvec::SmallVec<[&'r str; 2]>,
    /// The request's `[scan]` key, counted when its answer has a listed status.
    pub(crate) scan_key: Option<KeyParts>,
}

impl Requested<'_> {
    pub(crate) fn new() -> Self {
        Requested {
            buckets: Buckets::new(),
            slots: SlotRequests::new(),
            overridden: smallvec::SmallVec::new(),
            scan_key: None,
        }
    }
}

/// An upstream response, and the client's side of an upgrade it may complete with what its
/// 101 must say.
struct Forwarded {
    response: Response<Body>,
    client_upgrade: Option<(OnUpgrade, UpgradeExpected)>,
    /// When the request went upstream.
    sent: std::time::Instant,
}

/// What a listener does with a request once it is routed, and how it answers one that ends
/// early: the proxy forwards it ([`Proxying`]); forward-auth on the decision listener answers
/// whether it would pass. [`Gateway::answer_with`] runs everything around it.
pub(crate) trait Serving: Sync {
    /// The access log's `listener`.
    const LISTENER: Listener;

    /// The phases from the client's address to the answer.
    fn serve<'a, 'r>(
        &'a self,
        gateway: &'a Gateway,
        routed: &'a Routed<'r>,
        request: Request<RequestBody>,
        exchange: &'a mut Exchange<'r>,
        fields: &'a mut SetFields,
        reports: &'a mut Reports<'r>,
    ) -> impl Future<Output = Result<Response<Body>, Reject>> + Send + 'a;

    /// The answer to a request the phases ended early.
    fn reject(
        &self,
        reject: Reject,
        runtime: &Runtime,
        scan: &FieldScan,
        reports: &[LimitReport<'_>],
        fields: &mut SetFields,
    ) -> Response<Body>;

    /// Told once the request is answered: the route that decided it (`None`: no route
    /// matched) and its outcome.
    fn answered(
        &self,
        _runtime: &Runtime,
        _route: Option<&ServedRoute>,
        _outcome: Option<Outcome>,
        _fields: &mut SetFields,
    ) {
    }
}

/// The proxy listener's requests: decided and forwarded.
pub(crate) struct Proxying;

impl Answering for Gateway {
    fn answer<'a>(
        &'a self,
        request: Request<RequestBody>,
        connection: &'a Connection,
        fields: &'a mut SetFields,
    ) -> impl Future<Output = Response<Body>> + Send + 'a {
        self.answer_with(&Proxying, request, connection, fields)
    }
}

impl Serving for Proxying {
    const LISTENER: Listener = Listener::Proxy;

    async fn serve<'a, 'r>(
        &'a self,
        gateway: &'a Gateway,
        routed: &'a Routed<'r>,
        request: Request<RequestBody>,
        exchange: &'a mut Exchange<'r>,
        fields: &'a mut SetFields,
        reports: &'a mut Reports<'r>,
    ) -> Result<Response<Body>, Reject> {
        let client = gateway.client_address(routed, request.headers())?;
        exchange.client = Some(client);
        let (mut parts, body) = request.into_parts();
        let client = client_facts(routed, client, routed.connection.ja4.as_deref());
        exchange.note_client(client.origin, client.ja4);
        let max_body = routed.runtime.policy.server.max_buffered_body;
        let body = read_body(routed.route, max_body, &parts.headers, body).await?;
        let keyed_body = match &body {
            OutgoingBody::Buffered(bytes) if routed.route.route.reads_body => Some(bytes.as_ref()),
            _ => None,
        };
        // Filled in place: a handful of buckets is a lot of bytes to move.
        let mut requested = Requested::new();
        gateway.requested(routed, &client, &parts, keyed_body, &mut requested)?;
        let route = routed.route;
        let admitted = gateway.admit(routed, &requested, &mut parts.headers, exchange, reports);
        let mut admission = admitted.await?;
        let mut forwarded = gateway.forward(routed, parts, body, exchange).await?;
        // Held until the response body is sent whole or dropped (an upgrade: its tunnel).
        forwarded.response.body_mut().in_flight().slots = admission.slots.take();
        let status = forwarded.response.status().as_u16();
        let scan_key = requested.scan_key.as_ref();
        gateway
            .count_scan(routed, scan_key, &exchange.path, status)
            .await;
        let buckets = &requested.buckets;
        gateway
            .after_response(route, buckets, admission.decider, status)
            .await;
        let header_mode = routed.runtime.policy.server.ratelimit_headers;
        let sent = forwarded.sent;
        let response = gateway.finish(forwarded, header_mode, reports, fields)?;
        if !route.settles || status == 101 {
            return Ok(response);
        }
        Ok(gateway.settled(routed, buckets, &admission, sent, response, exchange))
    }

    fn reject(
        &self,
        reject: Reject,
        runtime: &Runtime,
        scan: &FieldScan,
        reports: &[LimitReport<'_>],
        fields: &mut SetFields,
    ) -> Response<Body> {
        let mode = runtime.policy.server.ratelimit_headers;
        if scan.grpc {
            respond::grpc_rejection(reject, mode, reports, fields)
        } else {
            let shape = runtime.refusal_shape(reports);
            respond::rejection(reject, mode, shape, reports, fields)
        }
    }
}

impl Gateway {
    /// Answers a request: routes it, hands it to `serving`'s phases, renders what ended it
    /// early as `serving` answers it, and counts and logs it, once.
    pub(crate) async fn answer_with<S: Serving>(
        &self,
        serving: &S,
        request: Request<RequestBody>,
        connection: &Connection,
        fields: &mut SetFields,
    ) -> Response<Body> {
        // Counted until the response body is dropped, or this future if the client leaves first.
        let in_flight = RequestInFlight::new(&self.shared.metrics.inflight);
        let runtime = self.shared.runtime.load_full();
        let scan = FieldScan::of(request.headers());
        let client_id = scan
            .request_id
            .then(|| request.headers().get(X_REQUEST_ID))
            .flatten();
        let now = Reading::now();
        let request_id = self.shared.request_ids.for_request(client_id, now.unix());
        let mut exchange = Exchange::new(request.method().clone(), request_id, now);
        exchange.listener = S::LISTENER;
        exchange.http3 = connection.http3;
        if let Some(traces) = &self.shared.traces {
            let method = request.method();
            exchange.trace =
                Some(traces.server_span(request.headers(), scan.trace_context, method));
        }
        // What the client is told of the route's limits, on a 429 or beside an admission.
        let mut reports = Reports::new();
        let (result, route) = match self.route(&runtime, &request, scan, connection, &mut exchange)
        {
            Ok(routed) => {
                let result = serving
                    .serve(self, &routed, request, &mut exchange, fields, &mut reports)
                    .await;
                // Answered: the final outcome is counted here, once.
                exchange.admitted_as = None;
                let outcome = match &result {
                    Ok(_) => exchange.outcome,
                    Err(reject) => reject.outcome().or(exchange.outcome),
                };
                if let Some(outcome) = outcome {
                    routed.route.metrics.outcome(outcome).inc();
                }
                exchange.outcome = outcome;
                (result, Some(routed.route))
            }
            Err(reject) => {
                exchange.outcome = reject.outcome();
                self.shared.metrics.unrouted(exchange.outcome);
                (Err(reject), None)
            }
        };
        let mut response = result.unwrap_or_else(|reject| {
            exchange.cause = reject.cause();
            serving.reject(reject, &runtime, &scan, &reports, fields)
        });
        serving.answered(&runtime, route, exchange.outcome, fields);
        if connection.proto == "https" {
            if let Some(hsts) = runtime
                .policy
                .server
                .tls
                .as_ref()
                .and_then(|tls| tls.hsts.as_ref())
            {
                response
                    .headers_mut()
                    .entry(http::header::STRICT_TRANSPORT_SECURITY)
                    .or_insert_with(|| hsts.clone());
            }
            if let Some(alt_svc) = self.shared.alt_svc.get().filter(|_| !connection.http3) {
                // The gateway's own: an upstream cannot know which ports its clients reach.
                response
                    .headers_mut()
                    .insert(http::header::ALT_SVC, alt_svc.clone());
            }
        }
        response.body_mut().in_flight().request = Some(in_flight);
        exchange.end_trace(
            response.status(),
            route.map(|route| &*route.route.name),
            || {
                let limits = route?.route.limits.iter().map(|entry| &*entry.limit.name);
                Some(limits.collect::<Vec<_>>().join(","))
            },
            &reports,
        );
        exchange.log(response.status());
        fields.set(
            &REQUEST_ID_NAME,
            FieldValue::RequestId(exchange.request_id.clone()),
        );
        fields.date_at(exchange.now);
        response
    }

    /// Checks the request's head and finds its route.
    fn route<'r>(
        &self,
        runtime: &'r Arc<Runtime>,
        request: &Request<RequestBody>,
        scan: FieldScan,
        connection: &'r Connection,
        exchange: &mut Exchange<'r>,
    ) -> Result<Routed<'r>, Reject> {
        exchange.path = path::normalize(request.uri().path()).into_owned();
        if self.shared.shutting_down.load(Ordering::Relaxed) {
            return Err(Reject::ShuttingDown);
        }
        let host = checks::check_request(request, &scan, runtime.policy.server.max_header_bytes)?;
        let plain_beside_tls = runtime.policy.server.tls.is_some()
            && connection.proto == "http"
            && exchange.listener == Listener::Proxy;
        if plain_beside_tls {
            let answer = plain_listener::answer(&self.shared, runtime, request, host.as_ref());
            if let Some(answer) = answer {
                return Err(answer);
            }
        }
        // Only routes with a `host` need the host name (parsed again, lower-cased).
        let host_name = runtime
            .matches_hosts
            .then(|| host.as_ref().map(checks::host_without_port))
            .flatten();
        let match_path = path::for_matching(&exchange.path, runtime.policy.server.path_matching);
        let route = route::find(
            &runtime.routes,
            host_name.as_deref(),
            request.method(),
            &match_path,
        )
        .ok_or(Reject::NoRoute)?;
        if access_log::enabled() {
            exchange.route = Some(route.route.name.clone());
        }
        Ok(Routed {
            runtime,
            route,
            host,
            scan,
            connection,
        })
    }

    /// The step after the request's buckets, on every listener that decides requests: one
    /// decision for them all (`decide`), counted as the request's outcome until it is
    /// answered, then held for tokens it booked (`on_limit = "delay"`). A refused request's
    /// header map goes back to the thread's pool: refusals come in floods, and the map can
    /// hold the next request's head.
    pub(crate) async fn admit<'r>(
        &self,
        routed: &Routed<'r>,
        requested: &Requested<'r>,
        headers: &mut HeaderMap,
        exchange: &mut Exchange<'r>,
        reports: &mut Reports<'r>,
    ) -> Result<Admission<'r>, Reject> {
        let route = routed.route;
        let decided = self.decide(&route.route.name, requested, exchange, reports, NoObserver);
        let admission = match decided.await {
            Ok(admission) => admission,
            Err(reject) => {
                header_maps::give_back(std::mem::take(headers));
                return Err(reject);
            }
        };
        admission.count_in(route, exchange);
        if admission.delay > 0.0 {
            delay::hold(&self.shared, &requested.buckets, &admission).await;
        }
        Ok(admission)
    }

    /// A response whose route settles costs, sent through a body that measures it.
    fn settled<'r>(
        &self,
        routed: &Routed<'r>,
        buckets: &Buckets<'r>,
        admission: &Admission<'r>,
        sent: std::time::Instant,
        response: Response<Body>,
        exchange: &mut Exchange<'r>,
    ) -> Response<Body> {
        let runtime = routed.runtime;
        let settlement = Settlement::of(
            &self.shared,
            runtime,
            routed.route,
            buckets,
            &admission.charged,
            admission.decider,
            sent,
        );
        match settlement {
            Some(mut settlement) => {
                if access_log::enabled() {
                    exchange.deferred = Some(settlement.defer_line());
                }
                settlement.meter(response, runtime.policy.server.max_buffered_body)
            }
            None => response,
        }
    }

    /// The client's address, from the peer and the trusted forwarding hops.
    #[inline]
    fn client_address(&self, routed: &Routed<'_>, headers: &HeaderMap) -> Result<IpAddr, Reject> {
        let forwarded_for = routed
            .scan
            .forwarded_for(headers)
            .filter_map(|value| value.to_str().ok());
        let trust = &routed.runtime.policy.client_ip.trust;
        if matches!(trust, client_ip::Trust::Hops(hops) if *hops > 0)
            && routed.scan.forwarded_for_present()
        {
            self.shared.forwarding_peer(routed.connection.peer);
        }
        let resolved = client_ip::resolve(trust, routed.connection.peer, forwarded_for)
            .map_err(|error| Reject::BadRequest(error.to_string()))?;
        if let Some(warning) = resolved.warning {
            self.shared.trust_warning(warning);
        }
        Ok(resolved.client)
    }

    /// One bucket per limit of the route that applies to this request, and one slot request
    /// per concurrency limit (a limit whose key the request lacks, that exempts the client, or
    /// whose tier is exempt, is skipped as the limit says). `body` is the request's body when
    /// its route's keys read it.
    pub(crate) fn requested<'r>(
        &self,
        routed: &Routed<'r>,
        client: &ClientFacts<'_>,
        parts: &Parts,
        body: Option<&[u8]>,
        requested: &mut Requested<'r>,
    ) -> Result<(), Reject> {
        let route = routed.route;
        let claims = match &routed.runtime.policy.jwt {
            Some(jwt) if route.route.reads_token => self.verified_claims(jwt, &parts.headers)?,
            _ => None,
        };
        let facts = RequestFacts::new(client.address, &parts.headers, parts.uri.query(), body)
            .with_claims(claims.as_deref())
            .with_client(client.origin, client.ja4);
        if let Some(scan) = &routed.runtime.policy.scan {
            requested.scan_key = self.scan_key(scan, &facts)?;
        }
        let load_factor = self.shared.load.factor();
        let overrides = self.shared.overrides.table();
        // Read once, and only for a route with a calendar quota.
        let mut calendar_time = None;
        for applied in &route.limits {
            let limit = &*applied.limit;
            let Some(key_parts) =
                key::extract(limit, &facts, &self.shared.hasher).map_err(|error| match error {
                    KeyError::Unauthenticated { .. } => Reject::Unauthenticated(error.to_string()),
                    _ => Reject::BadRequest(error.to_string()),
                })?
            else {
                continue;
            };
            let overridden = self.overridden(&overrides, limit, &key_parts);
            if overridden.is_some() {
                requested.overridden.push(&limit.name);
            }
            if let Some(concurrency) = limit.concurrency {
                let slots = match overridden {
                    Some(entry) => entry.slots(concurrency),
                    None => Some(concurrency),
                };
                if let Some(slots) = slots {
                    requested
                        .slots
                        .push(applied, applied.slots(key_parts, slots));
                }
                continue;
            }
            let calendar_now =
                || *calendar_time.get_or_insert_with(|| self.shared.store.calendar_now());
            let cost = match &applied.read_cost {
                Some(read) => key::read_cost(read, &facts),
                None => applied.cost,
            };
            let numbers_in_place;
            let tier = match overridden {
                Some(entry) => {
                    numbers_in_place = entry.tier(limit);
                    Some(&numbers_in_place)
                }
                None => match &limit.carried {
                    Some(carried) => {
                        numbers_in_place = key::carried_tier(limit, carried, &facts);
                        Some(&numbers_in_place)
                    }
                    None => key::tier(limit, &facts),
                },
            };
            let Some(mut charge) = limit.charge(tier, cost, load_factor, calendar_now) else {
                continue;
            };
            // A request asking for more than the bucket (its tier's) holds reserves it whole.
            if applied.read_cost.is_some() {
                charge.cost = charge.cost.min(charge.capacity);
            }
            requested
                .buckets
                .push(applied, applied.bucket(key_parts, charge));
        }
        Ok(())
    }

    /// The override in force for `limit`'s key `parts`, if an operator set one: for a key
    /// without one, a look at a table that is nearly always empty.
    #[inline]
    pub(crate) fn overridden<'t>(
        &self,
        overrides: &'t Table,
        limit: &Limit,
        parts: &KeyParts,
    ) -> Option<&'t Override> {
        if overrides.is_empty() {
            return None;
        }
        let found = overrides.find(limit, parts)?;
        found
            .active_at(self.shared.overrides.now())
            .then_some(&**found)
    }

    /// The claims of the request's token, verified; `None` when it carries none. A token that
    /// fails any check is refused (401) whatever the limits' `missing` says: a forged token
    /// must never pick its own bucket.
    fn verified_claims(
        &self,
        jwt: &JwtVerifier,
        headers: &HeaderMap,
    ) -> Result<Option<jwt::Claims>, Reject> {
        let token = jwt
            .token(headers)
            .map_err(|error| Reject::BadRequest(error.to_string()))?;
        let Some(token) = token else {
            return Ok(None);
        };
        match jwt.verify(token, clock::unix_seconds()) {
            Ok(claims) => Ok(Some(claims)),
            Err(rejection) => {
                self.shared.metrics.jwt_rejected(rejection).inc();
                tracing::debug!(reason = rejection.as_str(), "token refused");
                Err(Reject::InvalidToken)
            }
        }
    }
}
