//! The decision listener's series: its answers by protocol and outcome, and the route `rls`
//! that gRPC decisions count under.

use super::{IntCounter, Outcome, SharedIntCounter};
use crate::config::StoreFailurePolicy;

/// The route label of gRPC decisions (`tollgate_requests_total{route="rls"}`).
pub const RLS_ROUTE: &str = "rls";

/// Which protocol asked the decision listener.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecisionProtocol {
    Http = 0,
    Grpc = 1,
}

impl DecisionProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            DecisionProtocol::Http => "http",
            DecisionProtocol::Grpc => "grpc",
        }
    }
}

/// `tollgate_decision_requests_total`, resolved.
#[derive(Debug, Clone)]
pub struct DecisionMetrics {
    pub(super) outcomes: [[IntCounter; 8]; 2],
}

impl DecisionMetrics {
    pub fn outcome(&self, protocol: DecisionProtocol, outcome: Outcome) -> &IntCounter {
        &self.outcomes[protocol as usize][outcome as usize]
    }
}

/// The series of gRPC decisions, counted under the route `rls`.
#[derive(Debug, Clone)]
pub struct RlsMetrics {
    pub(super) outcomes: [IntCounter; 8],
    pub(super) degraded: [SharedIntCounter; 3],
}

impl RlsMetrics {
    pub fn outcome(&self, outcome: Outcome) -> &IntCounter {
        &self.outcomes[outcome as usize]
    }

    pub fn degraded(&self, policy: StoreFailurePolicy) -> &SharedIntCounter {
        &self.degraded[policy as usize]
    }
}
