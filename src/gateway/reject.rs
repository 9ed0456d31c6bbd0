//! Why a request ends before, or instead of, an upstream response. Each phase of the request
//! path returns one of these; `respond::rejection` renders them all.

use smallvec::SmallVec;

use crate::metrics::Outcome;
use crate::respond::LimitReport;
use crate::upstream::ForwardError;

/// The reports of a request's enforcing limits, inline for the usual handful.
pub type Reports<'a> = SmallVec<[LimitReport<'a>; 4]>;

/// Why the gateway answers a request itself, and who caused it.
#[derive(Debug, thiserror::Error)]
pub enum Reject<'a> {
    /// The gateway is draining (503, connection closed). Caused by the operator.
    #[error("shutting down")]
    ShuttingDown,
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
    /// No route matches (404). Caused by the client.
    #[error("no route")]
    NoRoute,
    /// An enforcing limit refused (429), with what the client is told of each limit.
    #[error("limited")]
    Limited(Reports<'a>),
    /// The store failed on a route with `on_store_failure = "deny"` (503). Caused by the store.
    #[error("store unavailable")]
    StoreUnavailable,
    /// No usable upstream response (502, or 504 on a timeout). Caused by the upstream.
    #[error(transparent)]
    Upstream(#[from] ForwardError),
    /// The upstream answered 101 but the upgrade could not be joined (502). Caused by the
    /// upstream.
    #[error("upgrade not completed")]
    UpgradeFailed,
}

impl Reject<'_> {
    /// The request's outcome, or `None` when the request was admitted and its admission's
    /// outcome stands (upstream failures), or it is not counted at all (draining).
    pub fn outcome(&self) -> Option<Outcome> {
        match self {
            Reject::BadRequest(_)
            | Reject::MethodNotAllowed
            | Reject::PayloadTooLarge(_)
            | Reject::HeaderFieldsTooLarge => Some(Outcome::BadRequest),
            Reject::NoRoute => Some(Outcome::NoRoute),
            Reject::Limited(_) => Some(Outcome::Limited),
            Reject::StoreUnavailable => Some(Outcome::StoreUnavailable),
            Reject::ShuttingDown | Reject::Upstream(_) | Reject::UpgradeFailed => None,
        }
    }
}
