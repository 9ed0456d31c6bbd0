//! The answers a forward-auth sub-request gets (nginx `auth_request`, Caddy `forward_auth`,
//! Traefik `ForwardAuth`): 200 with the rate-limit headers, `refuse_status` for a refusal
//! naming the limits that refused, and the route that decided on every answer.

use std::sync::Arc;

use http::header::HeaderName;
use http::{HeaderValue, Response, StatusCode};

use super::{add_ratelimit_headers, bad_request, rejection, FieldValue, SetFields};
use crate::body::Body;
use crate::config::{HeaderMode, Refusal};
use crate::reject::{refusing, LimitReport, Reject};

/// The route that decided (`none` when no route matched), on every answer.
static X_TOLLGATE_ROUTE: HeaderName = HeaderName::from_static("x-tollgate-route");
/// The limits that refused, on a refusal.
static X_TOLLGATE_LIMIT: HeaderName = HeaderName::from_static("x-tollgate-limit");

/// Names the route that decided on the answer.
pub fn name_route(route: Option<&Arc<str>>, fields: &mut SetFields) {
    let value = match route {
        Some(name) => FieldValue::Name(name.clone()),
        None => FieldValue::Static("none"),
    };
    fields.set(&X_TOLLGATE_ROUTE, value);
}

/// The answer to an admitted request: 200, with the rate-limit headers.
pub fn forward_auth_admitted(
    mode: HeaderMode,
    reports: &[LimitReport<'_>],
    fields: &mut SetFields,
) -> Response<Body> {
    add_ratelimit_headers(fields, mode, reports);
    Response::new(Body::empty())
}

/// The answer to a request the phases ended early: a refusal (shaped as the refusing limit's
/// `[limits.NAME.refusal]` says, with `refuse_status` when it is set) naming the limits that
/// refused, 200 for a request no route decides, anything else as the proxy listener answers
/// it.
pub fn forward_auth_rejection(
    reject: Reject,
    mode: HeaderMode,
    (refuse_status, shape): (Option<StatusCode>, Option<&Refusal>),
    reports: &[LimitReport<'_>],
    fields: &mut SetFields,
) -> Response<Body> {
    match reject {
        Reject::NoRoute => Response::new(Body::empty()),
        Reject::Limited | Reject::Banned => {
            fields.set(&X_TOLLGATE_LIMIT, FieldValue::Text(refusing(reports)));
            let mut response = rejection(reject, mode, shape, reports, fields);
            if let Some(status) = refuse_status {
                *response.status_mut() = status;
            }
            response
        }
        Reject::ScanBanned { .. } => {
            fields.set(&X_TOLLGATE_LIMIT, FieldValue::Static("scan"));
            let mut response = rejection(reject, mode, None, reports, fields);
            if let Some(status) = refuse_status {
                *response.status_mut() = status;
            }
            response
        }
        other => rejection(other, mode, None, reports, fields),
    }
}

/// The answer to a sub-request that does not describe a request: 400, naming what it lacks.
pub fn undescribed(detail: &str) -> Response<Body> {
    let mut response = bad_request(detail);
    response
        .headers_mut()
        .insert(X_TOLLGATE_ROUTE.clone(), HeaderValue::from_static("none"));
    response
}
