//! `/overrides` on the admin listener: one key's numbers in one limit set, read, listed and
//! deleted while the gateway runs. The key's value is read as `/limits` reads it (normalized
//! and hashed as a request's would be); every change is logged with who made it.

use std::net::IpAddr;

use http::{Method, StatusCode};
use http_body_util::{BodyExt as _, Limited};
use hyper::body::Incoming;
use serde_json::json;

use super::limits::{key_of, method_not_allowed, query_pairs, store_failed};
use crate::body::Body;
use crate::config::Limit;
use crate::limit::KeyParts;
use crate::overrides::live::ChangeError;
use crate::overrides::{Change, Override};
use crate::respond;
use crate::shared::Shared;

/// The largest body a change may have: a few numbers and two short texts fit many times.
const MAX_BODY: usize = 16 * 1024;

/// Answers `/overrides` and `/overrides/{limit}?key=VALUE[&key=VALUE…]`.
pub(super) async fn answer(
    shared: &Shared,
    request: http::Request<Incoming>,
    peer: IpAddr,
) -> http::Response<Body> {
    let (head, body) = request.into_parts();
    let name = match head.uri.path().strip_prefix("/overrides") {
        Some("" | "/") if matches!(head.method, Method::GET | Method::HEAD) => {
            return all_overrides(shared)
        }
        Some("" | "/") => return method_not_allowed(),
        Some(rest) => rest.trim_start_matches('/'),
        None => return respond::error(StatusCode::NOT_FOUND, "not_found", None),
    };
    let runtime = shared.runtime.load_full();
    let Some(limit) = runtime
        .policy
        .limits
        .iter()
        .find(|limit| &*limit.name == name)
    else {
        return respond::error(StatusCode::NOT_FOUND, "unknown_limit", Some(name));
    };
    let parts = match key_of(limit, &query_pairs(head.uri.query()), shared) {
        Ok(parts) => parts,
        Err(error) => return respond::bad_request(&error.to_string()),
    };
    match head.method {
        Method::GET | Method::HEAD => one_override(shared, limit, &parts),
        Method::PUT => {
            let body = match Limited::new(body, MAX_BODY).collect().await {
                Ok(body) => body.to_bytes(),
                Err(error) if error.is::<http_body_util::LengthLimitError>() => {
                    let detail = format!("an override's body is at most {MAX_BODY} bytes");
                    return respond::error(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "payload_too_large",
                        Some(&detail),
                    );
                }
                Err(_) => return respond::bad_request("the body broke off"),
            };
            let max_ttl = runtime.policy.overrides.max_ttl;
            let change = match Change::read(&body, limit, max_ttl) {
                Ok(change) => change,
                Err(error) => return field_refused(&error),
            };
            let now = shared.overrides.now();
            let entry = Override::new(limit, parts, change, now, peer.to_string());
            match shared.overrides.set(entry.clone()).await {
                Ok(_) => json_answer(StatusCode::OK, serde_json::to_value(&entry)),
                Err(error) => change_failed(&error),
            }
        }
        Method::DELETE => match shared
            .overrides
            .delete(&limit.name, &parts, &peer.to_string())
            .await
        {
            Ok(Some(_)) => {
                let mut response = http::Response::new(Body::empty());
                *response.status_mut() = StatusCode::NO_CONTENT;
                response
            }
            Ok(None) => no_override(limit),
            Err(error) => change_failed(&error),
        },
        _ => method_not_allowed(),
    }
}

/// Every override in force, soonest to end first, those without an end last.
fn all_overrides(shared: &Shared) -> http::Response<Body> {
    let now = shared.overrides.now();
    let listed = shared.overrides.table().listed();
    let listed: Vec<&Override> = listed
        .iter()
        .map(|entry| &**entry)
        .filter(|entry| entry.active_at(now))
        .collect();
    json_answer(StatusCode::OK, Ok(json!({ "overrides": listed })))
}

fn one_override(shared: &Shared, limit: &Limit, parts: &KeyParts) -> http::Response<Body> {
    let overrides = shared.overrides.table();
    match overrides.in_force(limit, parts, shared.overrides.now()) {
        Some(entry) => json_answer(StatusCode::OK, serde_json::to_value(&**entry)),
        None => no_override(limit),
    }
}

fn no_override(limit: &Limit) -> http::Response<Body> {
    let detail = format!("this key has no override in {}", limit.name);
    respond::error(StatusCode::NOT_FOUND, "no_override", Some(&detail))
}

/// 400 with the field that was refused, and why.
fn field_refused(error: &crate::overrides::FieldError) -> http::Response<Body> {
    json_answer(
        StatusCode::BAD_REQUEST,
        Ok(json!({
            "error": "bad_request",
            "field": error.field,
            "detail": error.to_string(),
        })),
    )
}

fn change_failed(error: &ChangeError) -> http::Response<Body> {
    match error {
        ChangeError::Store(_) => store_failed(&error.to_string()),
        ChangeError::File(_) => respond::error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "not_kept",
            Some(&error.to_string()),
        ),
    }
}

fn json_answer(
    status: StatusCode,
    value: Result<serde_json::Value, serde_json::Error>,
) -> http::Response<Body> {
    match value {
        Ok(value) => respond::full(status, "application/json", value.to_string()),
        Err(error) => respond::error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            Some(&error.to_string()),
        ),
    }
}
