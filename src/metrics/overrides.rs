//! The series of overrides: how many each limit has, and their changes. Counted off the
//! request path, when an operator (or an expiry, or a reload) changes one.

use prometheus::{IntCounterVec, IntGaugeVec, Opts, Registry};

use super::registered;

/// `tollgate_overrides_active` and `tollgate_override_changes_total`.
#[derive(Debug, Clone)]
pub struct OverrideMetrics {
    active: IntGaugeVec,
    changes: IntCounterVec,
}

/// What happened to an override.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverrideChange {
    Set,
    Delete,
    Expire,
}

impl OverrideChange {
    pub fn as_str(self) -> &'static str {
        match self {
            OverrideChange::Set => "set",
            OverrideChange::Delete => "delete",
            OverrideChange::Expire => "expire",
        }
    }
}

impl OverrideMetrics {
    pub(super) fn new(registry: &Registry) -> OverrideMetrics {
        let active = IntGaugeVec::new(
            Opts::new(
                "tollgate_overrides_active",
                "Overrides in force, per limit.",
            ),
            &["limit"],
        )
        .expect("valid metric");
        let changes = IntCounterVec::new(
            Opts::new(
                "tollgate_override_changes_total",
                "Overrides set, deleted (by an operator, or by a reload that removed or redefined their limit) and expired on this replica.",
            ),
            &["action"],
        )
        .expect("valid metric");
        for change in [
            OverrideChange::Set,
            OverrideChange::Delete,
            OverrideChange::Expire,
        ] {
            changes.with_label_values(&[change.as_str()]);
        }
        OverrideMetrics {
            active: registered(registry, active),
            changes: registered(registry, changes),
        }
    }

    pub fn active(&self, limit: &str, count: usize) {
        self.active
            .with_label_values(&[limit])
            .set(i64::try_from(count).unwrap_or(i64::MAX));
    }

    pub fn changed(&self, change: OverrideChange) {
        self.changes.with_label_values(&[change.as_str()]).inc();
    }
}
