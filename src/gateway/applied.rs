//! A request's buckets (or concurrency slots), each with the route limit it belongs to. The
//! stores take the requests as one slice and answer in its order; the gateway reads each one's
//! limit and metrics through the handle beside it, never through a position in the route's
//! list.

use smallvec::SmallVec;

use crate::runtime::AppliedLimit;

/// What the request asks of each applicable limit, with the limit, in the route's order.
#[derive(Debug)]
pub(crate) struct Applied<'r, T> {
    requests: SmallVec<[T; 4]>,
    limits: SmallVec<[&'r AppliedLimit; 4]>,
}

impl<'r, T> Applied<'r, T> {
    pub(crate) fn new() -> Applied<'r, T> {
        Applied {
            requests: SmallVec::new(),
            limits: SmallVec::new(),
        }
    }

    #[inline(always)]
    pub(crate) fn push(&mut self, limit: &'r AppliedLimit, request: T) {
        self.requests.push(request);
        self.limits.push(limit);
    }

    /// The requests, as the stores take them.
    pub(crate) fn requests(&self) -> &[T] {
        &self.requests
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.requests.is_empty()
    }

    /// Each request with its limit.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&'r AppliedLimit, &T)> + '_ {
        self.limits.iter().copied().zip(&self.requests)
    }
}

/// Whether `a` and `b` are the same compiled route limit.
pub(crate) fn same(a: &AppliedLimit, b: &AppliedLimit) -> bool {
    std::ptr::eq(a, b)
}
