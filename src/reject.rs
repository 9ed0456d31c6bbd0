//! Why a request ends before, or instead of, an upstream response. Each phase of the request
//! path returns one of these, with the reports of the limits that decided; `respond::rejection`
//! renders them all.

use smallvec::SmallVec;

use crate::metrics::Outcome;
use crate::upstream::ForwardError;

/// What a client is told about one applicable, enforcing limit after a decision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimitReport<'a> {
    pub name: &'a str,
    pub capacity: f64,
    /// Tokens per second.
    pub rate: f64,
    pub cost: f64,
    /// Tokens left after this decision.
    pub tokens: f64,
    /// Seconds until the bucket is full.
    pub full_in: f64,
    /// Seconds until this request's cost would be available; 0 when it was.
    pub wait: f64,
    pub refused: bool,
    /// Refused by a ban in force on the key (`wait` is what is left of it).
    pub banned: bool,
}

/// The reports of a request's enforcing limits, inline for the usual handful.
pub type Reports<'a> = SmallVec<[LimitReport<'a>; 4]>;

/// Whether a ban in force refused the request (rather than a bucket).
pub fn banned(reports: &[LimitReport<'_>]) -> bool {
    reports.iter().any(|report| report.refused && report.banned)
}

/// The names of the limits that refused, comma-separated (for logs and `X-Tollgate-Limit`).
pub fn refusing(reports: &[LimitReport<'_>]) -> String {
    let names: SmallVec<[&str; 4]> = reports
        .iter()
        .filter(|report| report.refused)
        .map(|report| report.name)
        .collect();
    names.join(",")
}

/// Why the gateway answers a request itself. Small on purpose: every phase returns it in a
/// `Result`, and what a 429 tells (its limits' reports) waits in the request's [`Reports`].
#[derive(Debug, thiserror::Error)]
pub enum Reject {
    /// The gateway is draining (503, connection closed). Caused by the operator.
    #[error("shutting down")]
    ShuttingDown,
    /// A plain request where `redirect_plain` sends every one to `https` (308 to this
    /// location). Neither routed nor counted.
    #[error("redirected to https")]
    ToHttps(http::HeaderValue),
    /// An ACME http-01 validation on a plain listener: the token's key authorization (200),
    /// or 404 for a token no order is waiting on. Neither routed nor counted.
    #[error("ACME challenge")]
    AcmeChallenge(Option<String>),
    /// A malformed request (400). Caused by the client.
    #[error("bad request: {0}")]
    BadRequest(String),
    /// `CONNECT` (405). Caused by the client.
    #[error("method not allowed")]
    MethodNotAllowed,
    /// A body over `max_buffered_body` on a route that reads bodies (413). Caused by the client.
    #[error("body larger than {0} bytes")]
    PayloadTooLarge(usize),
    /// A head over `max_header_bytes` (431). Caused by the client.
    #[error("request head too large")]
    HeaderFieldsTooLarge,
    /// The request carries a token that fails verification, on a route whose limits read a
    /// claim (401, `Bearer error="invalid_token"`). Caused by the client.
    #[error("invalid token")]
    InvalidToken,
    /// A `missing = "reject"` limit keyed by a claim, and no token carries it (401). Caused by
    /// the client.
    #[error("unauthenticated: {0}")]
    Unauthenticated(String),
    /// No route matches (404). Caused by the client.
    #[error("no route")]
    NoRoute,
    /// An enforcing limit refused (429); the request's reports say which and how long to wait.
    #[error("limited")]
    Limited,
    /// A ban in force on a key refused it (429, the ban's rest as `Retry-After`).
    #[error("banned")]
    Banned,
    /// `[scan]` found the request's key scanning and bans it on every route (429, what is
    /// left of the ban as `Retry-After`).
    #[error("banned: scan")]
    ScanBanned { retry_after: u64, until_unix: u64 },
    /// The store failed on a route with `on_store_failure = "deny"` (503). Caused by the store.
    #[error("store unavailable")]
    StoreUnavailable,
    /// No usable upstream response (502, or 504 on a timeout). Caused by the upstream.
    #[error(transparent)]
    Upstream(#[from] ForwardError),
    /// The upstream answered 101 without accepting the upgrade asked for (another protocol, a
    /// wrong `Sec-WebSocket-Accept`, or no upgrade was asked), or the upgrade could not be
    /// joined (502). Caused by the upstream.
    #[error("upgrade not completed")]
    UpgradeFailed,
}

/// Who caused a request to end early (pingora's error sources): for the access log, and for
/// telling an attack from an outage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    Client,
    Upstream,
    Store,
    /// The gateway itself (draining).
    Gateway,
}

impl Cause {
    pub fn as_str(self) -> &'static str {
        match self {
            Cause::Client => "client",
            Cause::Upstream => "upstream",
            Cause::Store => "store",
            Cause::Gateway => "gateway",
        }
    }
}

impl Reject {
    /// Who caused it; `None` for a refusal by a limit, which is a decision, not a fault.
    pub fn cause(&self) -> Option<Cause> {
        match self {
            Reject::BadRequest(_)
            | Reject::MethodNotAllowed
            | Reject::PayloadTooLarge(_)
            | Reject::HeaderFieldsTooLarge
            | Reject::InvalidToken
            | Reject::Unauthenticated(_)
            | Reject::NoRoute => Some(Cause::Client),
            Reject::Limited | Reject::Banned | Reject::ScanBanned { .. } => None,
            Reject::StoreUnavailable => Some(Cause::Store),
            Reject::Upstream(ForwardError::ClientBody) => Some(Cause::Client),
            Reject::Upstream(_) | Reject::UpgradeFailed => Some(Cause::Upstream),
            Reject::ShuttingDown => Some(Cause::Gateway),
            Reject::ToHttps(_) | Reject::AcmeChallenge(_) => None,
        }
    }

    /// The request's outcome, or `None` when the request was admitted and its admission's
    /// outcome stands (upstream failures), or it is not counted at all (draining).
    pub fn outcome(&self) -> Option<Outcome> {
        match self {
            Reject::BadRequest(_)
            | Reject::MethodNotAllowed
            | Reject::PayloadTooLarge(_)
            | Reject::HeaderFieldsTooLarge
            | Reject::InvalidToken
            | Reject::Unauthenticated(_) => Some(Outcome::BadRequest),
            Reject::NoRoute => Some(Outcome::NoRoute),
            Reject::Limited => Some(Outcome::Limited),
            Reject::Banned | Reject::ScanBanned { .. } => Some(Outcome::Banned),
            Reject::StoreUnavailable => Some(Outcome::StoreUnavailable),
            Reject::Upstream(ForwardError::ClientBody) => Some(Outcome::BadRequest),
            Reject::ShuttingDown
            | Reject::ToHttps(_)
            | Reject::AcmeChallenge(_)
            | Reject::Upstream(_)
            | Reject::UpgradeFailed => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_the_client_did_wrong_is_a_bad_request_of_its_own_making() {
        let client_errors = [
            Reject::BadRequest("x".to_owned()),
            Reject::MethodNotAllowed,
            Reject::PayloadTooLarge(1),
            Reject::HeaderFieldsTooLarge,
            Reject::InvalidToken,
            Reject::Unauthenticated("x".to_owned()),
        ];
        for reject in &client_errors {
            assert_eq!(reject.outcome(), Some(Outcome::BadRequest), "{reject}");
            assert_eq!(reject.cause(), Some(Cause::Client), "{reject}");
        }
        assert_eq!(Reject::NoRoute.cause(), Some(Cause::Client));
    }

    #[test]
    fn a_refusal_is_nobodys_fault_and_failures_name_their_source() {
        let limited = Reject::Limited;
        assert_eq!(limited.outcome(), Some(Outcome::Limited));
        assert_eq!(limited.cause(), None);
        assert_eq!(
            Reject::StoreUnavailable.outcome(),
            Some(Outcome::StoreUnavailable)
        );
        assert_eq!(Reject::StoreUnavailable.cause(), Some(Cause::Store));
        let upstream = Reject::Upstream(ForwardError::Connect(
            crate::upstream::ConnectError::NoTarget,
        ));
        assert_eq!(
            upstream.outcome(),
            None,
            "an admitted request keeps its admission's outcome"
        );
        assert_eq!(upstream.cause(), Some(Cause::Upstream));
        assert_eq!(Reject::ShuttingDown.cause(), Some(Cause::Gateway));
    }
}
