//! What counts as in flight, and until when: a request from its head until its response body
//! has been sent whole, its client went away, or its upgraded connection closed
//! (`tollgate_inflight_requests`); an upstream request until its response body ends (the load
//! behind `[overload] max_inflight`). Each count is a guard that undoes itself when dropped,
//! so a request whose future or body is dropped half-way never stays counted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::metrics::IntGauge;

/// A request counted in `tollgate_inflight_requests` until dropped.
#[derive(Debug)]
pub(crate) struct RequestInFlight(IntGauge);

impl RequestInFlight {
    pub(crate) fn new(gauge: &IntGauge) -> RequestInFlight {
        gauge.inc();
        RequestInFlight(gauge.clone())
    }
}

impl Drop for RequestInFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// An upstream request counted in its load monitor until dropped.
#[derive(Debug)]
pub struct UpstreamInFlight(Arc<AtomicU64>);

impl UpstreamInFlight {
    pub(crate) fn new(count: &Arc<AtomicU64>) -> UpstreamInFlight {
        count.fetch_add(1, Ordering::Relaxed);
        UpstreamInFlight(count.clone())
    }
}

impl Drop for UpstreamInFlight {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The counts a response body holds until it is dropped.
#[derive(Debug, Default)]
pub(crate) struct InFlight {
    pub(crate) request: Option<RequestInFlight>,
    pub(crate) upstream: Option<UpstreamInFlight>,
    /// The request's slots of concurrency limits. Boxed: few routes have them, and every
    /// response moves its body several times on the way out (inline, they tripled its size).
    pub(crate) slots: Option<Box<crate::limit::Held>>,
}
