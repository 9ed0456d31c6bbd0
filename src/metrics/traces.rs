//! `[tracing]`'s own series: spans the export queue had no room for.

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
