//! What the request path's labels can say: a request's outcome and an upstream status class,
//! each a fixed set (so a label never carries a client's value), their discriminants indexing
//! a route's counters.

use crate::config::Route;

/// How a request ended, as counted in `tollgate_requests_total{outcome}`. The discriminant
/// indexes a route's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Allowed = 0,
    Limited = 1,
    ShadowLimited = 2,
    BadRequest = 3,
    StoreUnavailable = 4,
    DegradedAllowed = 5,
    NoRoute = 6,
    /// Refused by a ban in force (`[limits.NAME.ban]`).
    Banned = 7,
}

impl Outcome {
    pub const ALL: [Outcome; 8] = [
        Outcome::Allowed,
        Outcome::Limited,
        Outcome::ShadowLimited,
        Outcome::BadRequest,
        Outcome::StoreUnavailable,
        Outcome::DegradedAllowed,
        Outcome::NoRoute,
        Outcome::Banned,
    ];

    /// Whether a request of `route` can end so: series of what cannot occur are not exported.
    pub fn can_occur_on(self, route: &Route) -> bool {
        use crate::config::{Mode, StoreFailurePolicy};
        let has = |mode: Mode| route.limits.iter().any(|entry| entry.limit.mode == mode);
        let limited = !route.limits.is_empty();
        match self {
            Outcome::Allowed | Outcome::BadRequest => true,
            Outcome::Limited => has(Mode::Enforce),
            Outcome::ShadowLimited => has(Mode::Shadow),
            Outcome::StoreUnavailable => {
                limited && route.on_store_failure == StoreFailurePolicy::Deny
            }
            Outcome::DegradedAllowed => {
                limited && route.on_store_failure != StoreFailurePolicy::Deny
            }
            Outcome::NoRoute => false,
            Outcome::Banned => {
                route.scan_bans
                    || (route.limits.iter())
                        .any(|entry| entry.limit.ban.is_some() && entry.limit.mode == Mode::Enforce)
            }
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allowed => "allowed",
            Outcome::Limited => "limited",
            Outcome::ShadowLimited => "shadow_limited",
            Outcome::BadRequest => "bad_request",
            Outcome::StoreUnavailable => "store_unavailable",
            Outcome::DegradedAllowed => "degraded_allowed",
            Outcome::NoRoute => "no_route",
            Outcome::Banned => "banned",
        }
    }
}

/// The `status` label of `tollgate_upstream_responses_total`. The discriminant indexes a
/// route's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusClass {
    Informational = 0,
    Success = 1,
    Redirection = 2,
    ClientError = 3,
    ServerError = 4,
    /// No usable response: the gateway answered 502 or 504.
    Error = 5,
}

impl StatusClass {
    pub(super) const ALL: [StatusClass; 6] = [
        StatusClass::Informational,
        StatusClass::Success,
        StatusClass::Redirection,
        StatusClass::ClientError,
        StatusClass::ServerError,
        StatusClass::Error,
    ];

    pub fn of(status: http::StatusCode) -> StatusClass {
        match status.as_u16() {
            100..=199 => StatusClass::Informational,
            200..=299 => StatusClass::Success,
            300..=399 => StatusClass::Redirection,
            400..=499 => StatusClass::ClientError,
            _ => StatusClass::ServerError,
        }
    }

    pub(super) fn as_str(self) -> &'static str {
        match self {
            StatusClass::Informational => "1xx",
            StatusClass::Success => "2xx",
            StatusClass::Redirection => "3xx",
            StatusClass::ClientError => "4xx",
            StatusClass::ServerError => "5xx",
            StatusClass::Error => "error",
        }
    }
}

/// Route label for requests that matched no route.
pub const NO_ROUTE: &str = "none";
