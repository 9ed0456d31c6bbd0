//! THE request path, top to bottom. Each phase is a function that hands the request on or
//! rejects it with a [`Reject`]; `respond::rejection` renders every rejection in one place.
//!
//! ```text
//! handle ─ route ─ client_address ─ read_body ─ bucket_requests ─ decide ─ (delay) ─ forward ─ after_response ─ finish ─ (settle)
//!           400/405/431/404    400         413/400       400/401       429/503            502/504                502
//! ```
//!
//! Every request leaves one access-log line and its counters. Beside this file, each phase of
//! its own named for it: `read_body.rs`, `decide.rs` (with `slots.rs`, the concurrency slots it
//! takes), `delay.rs`, `forward.rs`, `after_response.rs`, `finish.rs`, `settle.rs` (costs
//! settled when the response body ends); and the pure parts, `checks.rs` (the request head),
//! `accounting.rs` (what a decision means), `access_log.rs` (the log line). Why a request ends
//! early is `crate::reject`.

mod access_log;
pub mod accounting;
mod after_response;
mod applied;
mod checks;
mod client_facts;
mod decide;
mod decision;
mod delay;
mod finish;
mod forward;
mod forward_auth;
mod read_body;
mod rls;
mod settle;
pub(crate) mod slots;

use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use http::header::HeaderValue;
use http::request::Parts;
use http::{HeaderMap, Request, Response};
use hyper::body::Incoming;
use hyper::upgrade::OnUpgrade;

use self::access_log::Exchange;
use self::applied::Applied;
use self::checks::FieldScan;
use self::client_facts::{client_facts, ClientFacts};
use self::decide::Decider;
use self::read_body::read_body;
use self::settle::Settlement;
use self::slots::SlotRequests;
use crate::body::Body;
use crate::in_flight::RequestInFlight;
use crate::jwt::{self, JwtVerifier};
use crate::key::{self, KeyError, RequestFacts};
use crate::limit::concurrency::{SlotKey, SlotRequest};
use crate::limit::{clock, BucketKey, BucketRequest};
use crate::reject::{Reject, Reports};
use crate::request_id::{REQUEST_ID_NAME, X_REQUEST_ID};
use crate::respond::{self, FieldValue, SetFields};
use crate::runtime::{Runtime, ServedRoute};
use crate::shared::Shared;
use crate::upstream::{self, OutgoingBody};
use crate::wire::header_maps;
use crate::wire::message::UpgradeExpected;
use crate::{client_ip, path, route};

/// A client request's body as the server hands it over.
#[derive(Debug)]
pub enum RequestBody {
    /// The request has no body (the server's own HTTP/1.1 path takes only such requests).
    Empty,
    /// A body read by hyper as the gateway consumes it.
    Incoming(Incoming),
}

/// Which listener a connection came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// Requests are decided and forwarded upstream.
    Proxy,
    /// Other proxies ask about their requests (`[decision]`); nothing is forwarded.
    Decision,
}

impl Listener {
    pub fn as_str(self) -> &'static str {
        match self {
            Listener::Proxy => "proxy",
            Listener::Decision => "decision",
        }
    }
}

/// What the gateway knows of the connection a request came on.
#[derive(Debug, Clone)]
pub struct Connection {
    /// Unique to the connection in this process: what `reuse = "per_client"` keeps upstream
    /// connections for.
    pub id: u64,
    pub peer: IpAddr,
    /// The peer as an `X-Forwarded-For` entry, rendered once per connection, when a request
    /// is first forwarded (a connection whose requests are all refused never needs it).
    peer_header: std::sync::OnceLock<HeaderValue>,
    /// `X-Forwarded-Proto` for the upstream.
    pub proto: &'static str,
    pub listener: Listener,
    /// The JA4 fingerprint of the connection's TLS ClientHello, when it was read.
    pub ja4: Option<Arc<str>>,
    /// What `[geoip]` said of the connection's first client (see `client_facts.rs`).
    origin: std::sync::OnceLock<(usize, IpAddr, crate::geoip::Origin)>,
}

impl Connection {
    pub fn new(peer: IpAddr, proto: &'static str, listener: Listener) -> Connection {
        static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let peer = peer.to_canonical();
        Connection {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            peer,
            peer_header: std::sync::OnceLock::new(),
            proto,
            listener,
            ja4: None,
            origin: std::sync::OnceLock::new(),
        }
    }

    /// The peer as an `X-Forwarded-For` entry.
    pub fn peer_header(&self) -> &HeaderValue {
        self.peer_header
            .get_or_init(|| upstream::peer_header(self.peer))
    }
}

/// Serves requests against the current policy. Cheap to clone.
#[derive(Clone)]
pub struct Gateway {
    pub(crate) shared: Arc<Shared>,
}

/// A request that found its route: what its later phases read.
struct Routed<'r> {
    runtime: &'r Arc<Runtime>,
    route: &'r ServedRoute,
    /// The request's `Host` (or `:authority`), forwarded as it came.
    host: Option<HeaderValue>,
    scan: FieldScan,
    connection: &'r Connection,
}

/// A request's buckets, one per applicable limit, inline for the usual handful.
type Buckets<'r> = Applied<'r, BucketRequest<'r>>;

/// An upstream response, and the client's side of an upgrade it may complete with what its
/// 101 must say.
struct Forwarded {
    response: Response<Body>,
    client_upgrade: Option<(OnUpgrade, UpgradeExpected)>,
    /// When the request went upstream.
    sent: std::time::Instant,
}

/// How a listener's requests are answered, chosen once per connection: a connection's future
/// then holds its own listener's request future only (the decision listener's is the larger,
/// and a connection's future is copied whole when it starts).
pub(crate) trait Answering {
    fn answer<'a>(
        gateway: &'a Gateway,
        request: Request<RequestBody>,
        connection: &'a Connection,
        fields: &'a mut SetFields,
    ) -> impl std::future::Future<Output = Response<Body>> + Send + 'a;
}

/// The proxy listener's requests: decided and forwarded.
pub(crate) struct Proxying;

/// The decision listener's questions: decided, never forwarded.
pub(crate) struct Deciding;

impl Answering for Proxying {
    fn answer<'a>(
        gateway: &'a Gateway,
        request: Request<RequestBody>,
        connection: &'a Connection,
        fields: &'a mut SetFields,
    ) -> impl std::future::Future<Output = Response<Body>> + Send + 'a {
        gateway.answer(request, connection, fields)
    }
}

impl Answering for Deciding {
    fn answer<'a>(
        gateway: &'a Gateway,
        request: Request<RequestBody>,
        connection: &'a Connection,
        fields: &'a mut SetFields,
    ) -> impl std::future::Future<Output = Response<Body>> + Send + 'a {
        gateway.answer_asking(request, connection, fields)
    }
}

impl Gateway {
    /// Answers one request; never fails (rejections become responses).
    pub async fn handle(
        &self,
        request: Request<RequestBody>,
        connection: &Connection,
        fields: &mut SetFields,
    ) -> Response<Body> {
        match connection.listener {
            Listener::Proxy => self.answer(request, connection, fields).await,
            Listener::Decision => self.answer_asking(request, connection, fields).await,
        }
    }

    /// Answers a request through the phases: on the proxy listener, the client's request;
    /// on the decision listener, the original request a forward-auth sub-request describes,
    /// which is decided and never forwarded.
    async fn answer(
        &self,
        request: Request<RequestBody>,
        connection: &Connection,
        fields: &mut SetFields,
    ) -> Response<Body> {
        let asked = connection.listener == Listener::Decision;
        // Counted until the response body is dropped (sent whole, or its client went away);
        // dropped with this future if the client goes away before the answer.
        let in_flight = RequestInFlight::new(&self.shared.metrics.inflight);
        let runtime = self.shared.runtime.load_full();
        let scan = FieldScan::of(request.headers());
        let client_id = scan
            .request_id
            .then(|| request.headers().get(X_REQUEST_ID))
            .flatten();
        let request_id = self.shared.request_ids.for_request(client_id);
        let mut exchange = Exchange::new(request.method().clone(), request_id);
        exchange.listener = connection.listener;
        // What the client is told of the route's limits, on a 429 or beside an admission.
        let mut reports = Reports::new();
        let result = match self.route(&runtime, &request, scan, connection, &mut exchange) {
            Ok(routed) => {
                let result = self
                    .serve(&routed, request, &mut exchange, fields, &mut reports)
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
                if asked {
                    forward_auth::name_route(Some(&routed.route.route.name), fields);
                }
                result
            }
            Err(reject) => {
                exchange.outcome = reject.outcome();
                self.shared.metrics.unrouted(exchange.outcome);
                if asked {
                    forward_auth::name_route(None, fields);
                }
                Err(reject)
            }
        };
        let header_mode = runtime.policy.server.ratelimit_headers;
        let response = result.unwrap_or_else(|reject| {
            exchange.cause = reject.cause();
            if asked {
                forward_auth::rejection(reject, &runtime, &reports, fields)
            } else if scan.grpc {
                respond::grpc_rejection(reject, header_mode, &reports, fields)
            } else {
                respond::rejection(reject, header_mode, &reports, fields)
            }
        });
        if asked {
            forward_auth::count(&runtime, exchange.outcome);
        }
        let mut response = response;
        response.body_mut().in_flight().request = Some(in_flight);
        exchange.log(response.status());
        fields.set(
            &REQUEST_ID_NAME,
            FieldValue::RequestId(exchange.request_id.clone()),
        );
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

    /// The phases of a routed request, from its client's address to the response.
    async fn serve<'r>(
        &self,
        routed: &Routed<'r>,
        request: Request<RequestBody>,
        exchange: &mut Exchange<'r>,
        fields: &mut SetFields,
        reports: &mut Reports<'r>,
    ) -> Result<Response<Body>, Reject> {
        let asked = routed.connection.listener == Listener::Decision;
        let client = if asked {
            forward_auth::client_address(routed, request.headers())?
        } else {
            self.client_address(routed, request.headers())?
        };
        exchange.client = Some(client);
        let (parts, body) = request.into_parts();
        let client = client_facts(routed, client, &parts.headers);
        if access_log::enabled() {
            exchange.origin = client.origin;
            exchange.ja4 = client.ja4.map(Arc::from);
        }
        let max_body = routed.runtime.policy.server.max_buffered_body;
        // A sub-request carries no body of the original request: none is read.
        let body = match asked {
            true => OutgoingBody::Buffered(bytes::Bytes::new()),
            false => read_body(routed.route, max_body, &parts.headers, body).await?,
        };
        let mut buckets = Buckets::new();
        let mut slot_requests = SlotRequests::new();
        self.bucket_requests(
            routed,
            &client,
            &parts,
            &body,
            &mut buckets,
            &mut slot_requests,
        )?;
        if access_log::enabled() {
            exchange.keys = Some(access_log::keys(buckets.requests()));
        }
        let admission = match self
            .decide(routed.route, &buckets, &slot_requests, exchange, reports)
            .await
        {
            Ok(admission) => admission,
            Err(reject) => {
                // Refusals come in floods: the request's map can hold the next request's head.
                header_maps::give_back(parts.headers);
                return Err(reject);
            }
        };
        exchange.outcome = Some(admission.outcome);
        exchange.admitted_as = Some(routed.route.metrics.outcome(admission.outcome));
        if admission.delay > 0.0 {
            let local = admission.decider == Decider::Local;
            delay::hold(
                &self.shared,
                local,
                &buckets,
                &admission.charged,
                admission.delay,
            )
            .await;
        }
        if asked {
            return Ok(forward_auth::admitted(routed.runtime, reports, fields));
        }
        let mut forwarded = self.forward(routed, parts, body, exchange).await?;
        // Held until the response body is sent whole or dropped (an upgrade: its tunnel).
        forwarded.response.body_mut().in_flight().slots = admission.slots.map(Box::new);
        let status = forwarded.response.status().as_u16();
        self.after_response(routed.route, &buckets, admission.decider, status)
            .await;
        let header_mode = routed.runtime.policy.server.ratelimit_headers;
        let sent = forwarded.sent;
        let response = self.finish(forwarded, header_mode, reports, fields)?;
        if !routed.route.settles || status == 101 {
            return Ok(response);
        }
        let settlement = Settlement::of(
            &self.shared,
            routed.runtime,
            routed.route,
            &buckets,
            &admission.charged,
            admission.decider,
            sent,
        );
        Ok(match settlement {
            Some(mut settlement) => {
                if access_log::enabled() {
                    exchange.deferred = Some(settlement.defer_line());
                }
                settlement.meter(response, max_body)
            }
            None => response,
        })
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

    /// One bucket per limit of the route that applies to this request (a limit whose key the
    /// request lacks, that exempts the client, or whose tier is exempt, is skipped as the limit
    /// says), into `buckets` (filled in place: a handful of buckets is a lot of bytes to move).
    fn bucket_requests<'r>(
        &self,
        routed: &Routed<'r>,
        client: &ClientFacts<'_>,
        parts: &Parts,
        body: &OutgoingBody,
        buckets: &mut Buckets<'r>,
        slot_requests: &mut SlotRequests<'r>,
    ) -> Result<(), Reject> {
        let route = routed.route;
        let asked = routed.connection.listener == Listener::Decision;
        let body = match body {
            OutgoingBody::Buffered(bytes) if route.route.reads_body && !asked => {
                Some(bytes.as_ref())
            }
            _ => None,
        };
        let claims = match &routed.runtime.policy.jwt {
            Some(jwt) if route.route.reads_token => self.verified_claims(jwt, &parts.headers)?,
            _ => None,
        };
        let facts = RequestFacts::new(client.address, &parts.headers, parts.uri.query(), body)
            .with_claims(claims.as_deref())
            .with_client(client.origin, client.ja4);
        let load_factor = self.shared.load.factor();
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
            if let Some(concurrency) = limit.concurrency {
                // A decision never sees its request end, to give a slot back at.
                if asked {
                    continue;
                }
                slot_requests.push(
                    applied,
                    SlotRequest {
                        key: SlotKey {
                            limit: limit.name.clone(),
                            fingerprint: limit.fingerprint,
                            parts: key_parts,
                        },
                        slots: concurrency,
                        in_use: applied.metrics.concurrency_in_use.clone(),
                    },
                );
                continue;
            }
            let calendar_now =
                || *calendar_time.get_or_insert_with(|| self.shared.store.calendar_now());
            let cost = match &applied.read_cost {
                Some(read) => key::read_cost(read, &facts),
                None => applied.cost,
            };
            let Some(mut charge) =
                limit.charge(key::tier(limit, &facts), cost, load_factor, calendar_now)
            else {
                continue;
            };
            // A request asking for more than the bucket (its tier's) holds reserves it whole.
            if applied.read_cost.is_some() {
                charge.cost = charge.cost.min(charge.capacity);
            }
            buckets.push(
                applied,
                BucketRequest {
                    key: BucketKey {
                        limit: &limit.name,
                        fingerprint: limit.fingerprint,
                        parts: key_parts,
                    },
                    charge,
                    adaptive: limit.adaptive.as_ref().map(|adaptive| adaptive.params),
                    lease: limit.lease,
                    ban: limit.ban,
                },
            );
        }
        Ok(())
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
