//! Forward-auth on the decision listener (nginx `auth_request`, Caddy `forward_auth`, Traefik
//! `ForwardAuth`): the original request a sub-request describes, its client as the asking
//! proxy saw it, and the phases it goes through ([`Asked`]): the proxy's own, up to the
//! admission. `respond.rs` writes the answers the asking proxy reads.

use std::net::IpAddr;

use http::header::{HeaderName, HOST};
use http::{HeaderMap, Method, Request, Response, Uri};

use crate::body::Body;
use crate::client_ip::{self, AskedError};
use crate::connection::Connection;
use crate::gateway::access_log::{Exchange, Listener};
use crate::gateway::checks::FieldScan;
use crate::gateway::client_facts::client_facts;
use crate::gateway::slots::SlotRequests;
use crate::gateway::{Gateway, Requested, Routed, Serving};
use crate::limit::Reading;
use crate::metrics::{DecisionProtocol, Outcome};
use crate::reject::{Cause, LimitReport, Reject, Reports};
use crate::request_body::RequestBody;
use crate::respond::{self, SetFields};
use crate::runtime::{Runtime, ServedRoute};
use crate::upstream::X_FORWARDED_FOR;

/// Where forward-auth sub-requests are sent.
pub(super) const DECIDE_PATH: &str = "/decide";

/// The header an asking proxy names the original connection's JA4 fingerprint in.
const JA4_HEADER: &str = "x-tollgate-ja4";

static X_FORWARDED_METHOD: HeaderName = HeaderName::from_static("x-forwarded-method");
static X_ORIGINAL_METHOD: HeaderName = HeaderName::from_static("x-original-method");
static X_FORWARDED_URI: HeaderName = HeaderName::from_static("x-forwarded-uri");
static X_ORIGINAL_URI: HeaderName = HeaderName::from_static("x-original-uri");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// The fields the original request's method and target come from, in order of preference
/// (Traefik and Caddy send the first, nginx is told to send the second). Looked up as names,
/// not text: a name given as text is parsed again on every lookup.
static METHOD_FIELDS: [&HeaderName; 2] = [&X_FORWARDED_METHOD, &X_ORIGINAL_METHOD];
static TARGET_FIELDS: [&HeaderName; 2] = [&X_FORWARDED_URI, &X_ORIGINAL_URI];

/// Why a sub-request describes no request: the field that is missing or broken.
#[derive(Debug, thiserror::Error)]
enum Undescribed {
    #[error("{0} (or {1}) is missing: the asking proxy must describe the original request")]
    Missing(&'static HeaderName, &'static HeaderName),
    #[error("{0} is not text")]
    NotText(&'static HeaderName),
    #[error("{0} is not a method: {1:?}")]
    NotAMethod(&'static HeaderName, String),
    #[error("{0} is not a request target such as /path?query: {1:?}")]
    NotATarget(&'static HeaderName, String),
}

/// The original request a sub-request describes: its method, target and host from the
/// forwarded fields, the sub-request's other fields as its own, and no body (a sub-request
/// carries none).
fn original_request(request: Request<RequestBody>) -> Result<Request<RequestBody>, Undescribed> {
    let (mut parts, _) = request.into_parts();
    let method = forwarded(&parts.headers, METHOD_FIELDS)?;
    let method = Method::from_bytes(method.trim().as_bytes())
        .map_err(|_| Undescribed::NotAMethod(METHOD_FIELDS[0], method.to_owned()))?;
    let target = forwarded(&parts.headers, TARGET_FIELDS)?;
    let uri = original_target(target)
        .ok_or_else(|| Undescribed::NotATarget(TARGET_FIELDS[0], shortened(target)))?;
    if let Some(host) = parts.headers.get(&X_FORWARDED_HOST).cloned() {
        parts.headers.insert(HOST, host);
    }
    parts.method = method;
    parts.uri = uri;
    Ok(Request::from_parts(parts, RequestBody::Empty))
}

/// The first of `names` the sub-request carries, as text.
fn forwarded<'h>(
    headers: &'h HeaderMap,
    names: [&'static HeaderName; 2],
) -> Result<&'h str, Undescribed> {
    let value = names
        .iter()
        .find_map(|name| headers.get(*name))
        .ok_or(Undescribed::Missing(names[0], names[1]))?;
    value.to_str().map_err(|_| Undescribed::NotText(names[0]))
}

/// The original target: origin-form (`/path?query`), or the path and query of an absolute
/// URI (some proxies send the whole URL).
fn original_target(target: &str) -> Option<Uri> {
    let uri: Uri = target.trim().parse().ok()?;
    match (uri.scheme(), uri.path_and_query()) {
        (None, Some(path)) if path.as_str().starts_with('/') => Some(uri),
        (Some(_), Some(path)) => Uri::builder().path_and_query(path.clone()).build().ok(),
        _ => None,
    }
}

fn shortened(text: &str) -> String {
    text.chars().take(64).collect()
}

/// The client: the asking proxy is one trusted hop, and `X-Forwarded-For` (which it must
/// send) is read from the entry it added on, as `[client_ip]` says.
fn client_address(routed: &Routed<'_>, headers: &HeaderMap) -> Result<IpAddr, Reject> {
    let lines = headers
        .get_all(X_FORWARDED_FOR)
        .into_iter()
        .filter_map(|value| value.to_str().ok());
    let trust = &routed.runtime.policy.client_ip.trust;
    match client_ip::resolve_asked(trust, lines) {
        Ok(resolved) => Ok(resolved.client),
        Err(error @ (AskedError::NoForwardedFor | AskedError::Unparseable(_))) => {
            Err(Reject::BadRequest(error.to_string()))
        }
    }
}

/// Answers a forward-auth sub-request: its original request through the proxy's steps, up
/// to the admission; a sub-request that describes no request is a 400 naming what it lacks.
pub(super) async fn answer(
    gateway: &Gateway,
    request: Request<RequestBody>,
    connection: &Connection,
    fields: &mut SetFields,
) -> Response<Body> {
    let method = request.method().clone();
    match original_request(request) {
        Ok(original) => {
            gateway
                .answer_with(&Asked, original, connection, fields)
                .await
        }
        Err(undescribed) => {
            let runtime = gateway.shared.runtime.load();
            count(&runtime, Some(Outcome::BadRequest));
            let response = respond::undescribed(&undescribed.to_string());
            let now = Reading::now();
            let request_id = gateway.shared.request_ids.for_request(None, now.unix());
            let mut exchange = Exchange::new(method, request_id, now);
            exchange.listener = Listener::Decision;
            exchange.path = DECIDE_PATH.to_owned();
            exchange.outcome = Some(Outcome::BadRequest);
            exchange.cause = Some(Cause::Client);
            exchange.log(response.status());
            response
        }
    }
}

/// The original request of a sub-request: decided, never forwarded. What a sub-request cannot
/// carry is not guessed: it has no body (a limit keyed by one finds its key missing), and a
/// decision never sees its request end, to give a concurrency slot back at.
struct Asked;

impl Serving for Asked {
    const LISTENER: Listener = Listener::Decision;

    async fn serve<'a, 'r>(
        &'a self,
        gateway: &'a Gateway,
        routed: &'a Routed<'r>,
        request: Request<RequestBody>,
        exchange: &'a mut Exchange<'r>,
        fields: &'a mut SetFields,
        reports: &'a mut Reports<'r>,
    ) -> Result<Response<Body>, Reject> {
        let client = client_address(routed, request.headers())?;
        exchange.client = Some(client);
        let (parts, _) = request.into_parts();
        let ja4 = parts
            .headers
            .get(JA4_HEADER)
            .and_then(|value| value.to_str().ok())
            .map(str::trim)
            .filter(|value| !value.is_empty());
        let client = client_facts(routed, client, ja4);
        exchange.note_client(client.origin, client.ja4);
        let mut requested = Requested::new();
        gateway.requested(routed, &client, &parts, None, &mut requested)?;
        requested.slots = SlotRequests::new();
        let mut headers = parts.headers;
        gateway
            .admit(routed, &requested, &mut headers, exchange, reports)
            .await?;
        let mode = routed.runtime.policy.server.ratelimit_headers;
        Ok(respond::forward_auth_admitted(mode, reports, fields))
    }

    fn reject(
        &self,
        reject: Reject,
        runtime: &Runtime,
        _: &FieldScan,
        reports: &[LimitReport<'_>],
        fields: &mut SetFields,
    ) -> Response<Body> {
        let mode = runtime.policy.server.ratelimit_headers;
        let refuse_status = runtime
            .policy
            .decision
            .as_ref()
            .and_then(|decision| decision.refuse_status);
        let shape = runtime.refusal_shape(reports);
        respond::forward_auth_rejection(reject, mode, (refuse_status, shape), reports, fields)
    }

    fn answered(
        &self,
        runtime: &Runtime,
        route: Option<&ServedRoute>,
        outcome: Option<Outcome>,
        fields: &mut SetFields,
    ) {
        respond::name_route(route.map(|route| &route.route.name), fields);
        count(runtime, outcome);
    }
}

/// Counts a forward-auth answer in `tollgate_decision_requests_total`.
fn count(runtime: &Runtime, outcome: Option<Outcome>) {
    if let (Some(decision), Some(outcome)) = (&runtime.decision, outcome) {
        decision
            .metrics
            .outcome(DecisionProtocol::Http, outcome)
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sub_request(fields: &[(&str, &str)]) -> Request<RequestBody> {
        let mut builder = Request::builder()
            .uri("/decide")
            .header("host", "tollgate:8081");
        for (name, value) in fields {
            builder = builder.header(*name, *value);
        }
        builder.body(RequestBody::Empty).unwrap()
    }

    #[test]
    fn the_original_request_comes_from_the_forwarded_fields() {
        let original = original_request(sub_request(&[
            ("x-forwarded-method", "POST"),
            ("x-forwarded-uri", "/api/login?next=%2F"),
            ("x-forwarded-host", "shop.example"),
            ("x-forwarded-proto", "https"),
            ("cookie", "session=abc"),
        ]))
        .unwrap();
        assert_eq!(original.method(), Method::POST);
        assert_eq!(original.uri().path(), "/api/login");
        assert_eq!(original.uri().query(), Some("next=%2F"));
        assert_eq!(original.headers()[HOST], "shop.example");
        assert_eq!(original.headers()["cookie"], "session=abc");
    }

    #[test]
    fn nginx_fields_are_read_when_the_forwarded_ones_are_absent() {
        let original = original_request(sub_request(&[
            ("x-original-method", "DELETE"),
            ("x-original-uri", "/items/7"),
        ]))
        .unwrap();
        assert_eq!(original.method(), Method::DELETE);
        assert_eq!(original.uri().path(), "/items/7");
        // The sub-request's own Host stands when no X-Forwarded-Host is sent.
        assert_eq!(original.headers()[HOST], "tollgate:8081");
        let absolute = original_request(sub_request(&[
            ("x-forwarded-method", "GET"),
            ("x-forwarded-uri", "https://shop.example/a/b?c=d"),
        ]))
        .unwrap();
        assert_eq!(absolute.uri().path(), "/a/b");
        assert_eq!(absolute.uri().query(), Some("c=d"));
    }

    #[test]
    fn a_sub_request_that_describes_nothing_names_what_it_lacks() {
        let error = original_request(sub_request(&[("x-forwarded-uri", "/a")]))
            .unwrap_err()
            .to_string();
        assert!(error.contains("x-forwarded-method"), "{error}");
        let error = original_request(sub_request(&[("x-forwarded-method", "GET")]))
            .unwrap_err()
            .to_string();
        assert!(error.contains("x-forwarded-uri"), "{error}");
        for target in ["*", "a/b", "", "http://"] {
            let error = original_request(sub_request(&[
                ("x-forwarded-method", "GET"),
                ("x-forwarded-uri", target),
            ]))
            .unwrap_err()
            .to_string();
            assert!(
                error.contains("not a request target"),
                "{target:?}: {error}"
            );
        }
        let error = original_request(sub_request(&[
            ("x-forwarded-method", "GE T"),
            ("x-forwarded-uri", "/"),
        ]))
        .unwrap_err()
        .to_string();
        assert!(error.contains("not a method"), "{error}");
    }
}
