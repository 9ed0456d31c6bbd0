//! The series of what operators watch beside the limits: spans the export queue had no room
//! for (`[tracing]`), and scans detected (`[scan]`).

use prometheus::{IntCounter, Registry};

use super::registered;

/// `tollgate_trace_spans_dropped_total`.
pub(super) fn spans_dropped(registry: &Registry) -> IntCounter {
    registered(
        registry,
        IntCounter::new(
            "tollgate_trace_spans_dropped_total",
            "Spans dropped because the export queue to the OTLP collector was full ([tracing]).",
        )
        .expect("valid metric"),
    )
}

/// `tollgate_scans_detected_total`.
pub(super) fn scans_detected(registry: &Registry) -> IntCounter {
    registered(
        registry,
        IntCounter::new(
            "tollgate_scans_detected_total",
            "Keys found walking many distinct paths answered with [scan]'s statuses.",
        )
        .expect("valid metric"),
    )
}
