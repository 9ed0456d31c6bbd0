//! The series of costs settled after the response: the tokens each way, and the responses
//! whose value never came. Counted once per settled response, off the request path.

use prometheus::{CounterVec, IntCounter as SharedIntCounter, IntCounterVec, Opts, Registry};

use super::registered;

/// `tollgate_settled_cost_total` and `tollgate_settle_missing_total`.
#[derive(Debug, Clone)]
pub(super) struct SettleFamilies {
    settled: CounterVec,
    missing: IntCounterVec,
}

/// One settled route limit's handles.
#[derive(Debug, Clone)]
pub struct SettleMetrics {
    /// Tokens charged beyond the reservation.
    pub charged: prometheus::Counter,
    /// Tokens of the reservation given back.
    pub refunded: prometheus::Counter,
    /// Responses whose value was missing, unparseable or negative.
    pub missing: SharedIntCounter,
}

impl SettleFamilies {
    pub(super) fn new(registry: &Registry) -> SettleFamilies {
        let settled = CounterVec::new(
            Opts::new(
                "tollgate_settled_cost_total",
                "Tokens settled after the response, beyond the reservation (charge) or given back from it (refund), per route and limit.",
            ),
            &["route", "limit", "direction"],
        )
        .expect("valid metric");
        let missing = IntCounterVec::new(
            Opts::new(
                "tollgate_settle_missing_total",
                "Responses whose settlement value was missing, unparseable or negative: they kept their reservation. Per route and limit.",
            ),
            &["route", "limit"],
        )
        .expect("valid metric");
        SettleFamilies {
            settled: registered(registry, settled),
            missing: registered(registry, missing),
        }
    }

    pub(super) fn for_limit(&self, route: &str, limit: &str) -> SettleMetrics {
        SettleMetrics {
            charged: self.settled.with_label_values(&[route, limit, "charge"]),
            refunded: self.settled.with_label_values(&[route, limit, "refund"]),
            missing: self.missing.with_label_values(&[route, limit]),
        }
    }
}
