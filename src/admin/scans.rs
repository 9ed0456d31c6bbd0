//! `/scans` on the admin listener: the keys `[scan]` found scanning in the last hour, and a
//! ban lifted (on every replica, with Redis).

use std::net::IpAddr;

use http::{Method, StatusCode};
use serde_json::json;

use super::limits::{key_of, method_not_allowed, query_pairs, store_failed};
use crate::body::Body;
use crate::respond;
use crate::shared::Shared;

/// Answers `GET /scans` and `DELETE /scans?key=VALUE`.
pub(super) async fn answer(
    shared: &Shared,
    method: &Method,
    query: Option<&str>,
    peer: IpAddr,
) -> http::Response<Body> {
    let runtime = shared.runtime.load_full();
    let Some(scan) = &runtime.policy.scan else {
        return respond::error(
            StatusCode::NOT_FOUND,
            "no_scan",
            Some("the policy has no [scan] section"),
        );
    };
    match *method {
        Method::GET | Method::HEAD => {
            let body = json!({ "scans": shared.scans.listed() });
            respond::full(StatusCode::OK, "application/json", body.to_string())
        }
        Method::DELETE => {
            let pairs = query_pairs(query);
            let key = match key_of(&scan.key, &pairs, shared) {
                Ok(key) => key,
                Err(error) => return respond::bad_request(&error.to_string()),
            };
            match shared.scans.lift(&key).await {
                Ok(true) => {
                    tracing::info!(target: "tollgate::scan", %peer, "scan ban lifted through the admin API");
                    respond::full(StatusCode::NO_CONTENT, "text/plain", "")
                }
                Ok(false) => respond::error(StatusCode::NOT_FOUND, "no_scan_of_key", None),
                Err(error) => store_failed(&error.to_string()),
            }
        }
        _ => method_not_allowed(),
    }
}
