//! Prometheus metrics. Labels are bounded by configuration (route and limit names, outcomes,
//! status classes), never by client keys: no addresses, emails or paths in labels.
//!
//! Request-path handles are resolved once per policy ([`RouteMetrics`]), so a request
//! increments counters without looking labels up.

use prometheus::{
    Encoder, Gauge, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry, TextEncoder,
};

/// A counter shared by every thread (the request path's own are per thread: [`IntCounter`]).
pub use prometheus::IntCounter as SharedIntCounter;

pub use decision::{DecisionMetrics, DecisionProtocol, RlsMetrics, RLS_ROUTE};
pub use labels::{Outcome, StatusClass, NO_ROUTE};
use per_thread::Family;
pub use per_thread::{Counter, Histogram, IntCounter, IntGauge};

mod connections;
mod decision;
mod labels;
mod overrides;
mod per_thread;
mod settled;
mod tls;
mod traces;

pub use connections::ConnectionMetrics;
pub use overrides::{OverrideChange, OverrideMetrics};
pub use settled::SettleMetrics;
pub use tls::TlsMetrics;

use crate::client_ip::TrustWarning;
use crate::config::{Limit, Route, StoreFailurePolicy};
use crate::jwt::Rejection;

/// Every metric of one gateway, in a registry of its own.
#[derive(Debug, Clone)]
pub struct Metrics {
    registry: Registry,
    // The request path's families record per thread (see `per_thread`); the others are
    // `prometheus`'s own.
    requests: Family,
    /// `tollgate_requests_total` of requests that reached no route, resolved once: a flood of
    /// them finds its counters without a lookup.
    unrouted_bad_requests: IntCounter,
    unrouted: IntCounter,
    limited: Family,
    decisions: Family,
    tokens_consumed: Family,
    fill_ratio: Family,
    store_duration: Family,
    store_errors: IntCounterVec,
    store_calls: IntCounterVec,
    store_batch_requests: HistogramVec,
    store_late: IntCounterVec,
    degraded: IntCounterVec,
    upstream_duration: Family,
    upstream_responses: Family,
    pub inflight: IntGauge,
    config_reloads: IntCounterVec,
    admin_over_limit: SharedIntCounter,
    client_ip_warnings: IntCounterVec,
    penalties: IntCounterVec,
    bans: IntCounterVec,
    concurrency_in_use: prometheus::IntGaugeVec,
    delayed: IntCounterVec,
    /// `tollgate_delay_seconds`: how long delayed requests were held.
    pub delay_seconds: prometheus::Histogram,
    jwt_rejected: IntCounterVec,
    pub load_factor: Gauge,
    settle: settled::SettleFamilies,
    /// `tollgate_overrides_active`, `tollgate_override_changes_total`.
    pub overrides: OverrideMetrics,
    /// `tollgate_connections_open`, `tollgate_connections_refused_total`.
    pub connections: ConnectionMetrics,
    /// `tollgate_tls_handshake_failures_total`, `tollgate_tls_certificate_expiry_seconds`.
    pub tls: TlsMetrics,
    /// Each limit's top keys (`[top]`); what its limits' handles count into.
    pub top: std::sync::Arc<crate::top::TopKeys>,
    /// `tollgate_trace_spans_dropped_total`: spans the export queue had no room for.
    pub trace_spans_dropped: SharedIntCounter,
    /// `tollgate_scans_detected_total`.
    pub scans_detected: prometheus::IntCounter,
}

/// Latency buckets from 100 µs to 10 s.
const LATENCY_BUCKETS: [f64; 16] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0,
];
/// Requests per store call, up to the Redis store's batch limit.
const BATCH_BUCKETS: [f64; 7] = [1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0];
const FILL_BUCKETS: [f64; 11] = [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0];
/// How long delayed requests are held, up to the longest delay a limit may impose.
const DELAY_BUCKETS: [f64; 13] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

/// `metric`, registered in `registry`: every name is fixed in this file, so a clash is a bug.
fn registered<M: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    metric: M,
) -> M {
    registry
        .register(Box::new(metric.clone()))
        .expect("unique metric");
    metric
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let metric = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
            registered(&registry, metric)
        };
        let histogram = |name: &str, help: &str, labels: &[&str], buckets: &[f64]| {
            let opts = HistogramOpts::new(name, help).buckets(buckets.to_vec());
            registered(
                &registry,
                HistogramVec::new(opts, labels).expect("valid metric"),
            )
        };
        let per_thread = |family: Family| registered(&registry, family);
        let requests = per_thread(Family::int_counters(
            "tollgate_requests_total",
            "Requests by route and outcome.",
            &["route", "outcome"],
        ));
        let limited = per_thread(Family::int_counters(
            "tollgate_limited_total",
            "Refusals by route and by the limit that refused.",
            &["route", "limit"],
        ));
        let decisions = per_thread(Family::int_counters(
            "tollgate_decision_requests_total",
            "Decisions the decision listener answered, by protocol (http: forward-auth, grpc: Envoy's rate limit service) and outcome.",
            &["protocol", "outcome"],
        ));
        let tokens_consumed = per_thread(Family::counters(
            "tollgate_tokens_consumed_total",
            "Tokens charged, by route and limit.",
            &["route", "limit"],
        ));
        let fill_ratio = per_thread(Family::histograms(
            "tollgate_bucket_fill_ratio",
            "Tokens left / capacity after each decision, per limit.",
            &["limit"],
            &FILL_BUCKETS,
        ));
        let store_duration = per_thread(Family::histograms(
            "tollgate_store_duration_seconds",
            "Store call latency.",
            &["backend"],
            &LATENCY_BUCKETS,
        ));
        let store_errors = counter(
            "tollgate_store_errors_total",
            "Failed or timed-out store calls.",
            &["backend"],
        );
        let store_calls = counter(
            "tollgate_store_calls_total",
            "Calls made to the store (Redis): decisions, leases, refunds, outcomes, slots.",
            &["backend"],
        );
        let store_batch_requests = histogram(
            "tollgate_store_batch_requests",
            "Requests decided per store call (the Redis store batches them under load).",
            &["backend"],
            &BATCH_BUCKETS,
        );
        let store_late = counter(
            "tollgate_store_late_total",
            "Store calls that ran after the gateway gave up on them, and charged nothing.",
            &["backend"],
        );
        let degraded = counter(
            "tollgate_degraded_decisions_total",
            "Decisions taken without the store, by failure policy.",
            &["route", "policy"],
        );
        let upstream_duration = per_thread(Family::histograms(
            "tollgate_upstream_duration_seconds",
            "Time to the upstream response head.",
            &["route"],
            &LATENCY_BUCKETS,
        ));
        let upstream_responses = per_thread(Family::int_counters(
            "tollgate_upstream_responses_total",
            "Upstream responses by status class (error: 502/504 from the gateway).",
            &["route", "status"],
        ));
        let inflight = per_thread(Family::int_gauge(
            "tollgate_inflight_requests",
            "Requests being served: from the request head until the response body is sent, the client goes away, or an upgraded connection closes.",
        ))
        .gauge();
        let config_reloads = counter(
            "tollgate_config_reloads_total",
            "Configuration reloads by result.",
            &["result"],
        );
        let admin_over_limit = registered(
            &registry,
            SharedIntCounter::new(
                "tollgate_admin_connections_over_limit_total",
                "Admin connections accepted past [admin] max_connections (answered once, or closed).",
            )
            .expect("valid metric"),
        );
        let client_ip_warnings = counter(
            "tollgate_client_ip_warnings_total",
            "Requests whose forwarding headers suggest a trust misconfiguration, by cause.",
            &["cause"],
        );
        let penalties = counter(
            "tollgate_penalties_total",
            "Adaptive penalties: keys tripped by repeated upstream errors, per limit.",
            &["limit"],
        );
        let bans = counter(
            "tollgate_bans_total",
            "Bans begun: keys refused too often by a limit with a ban, per limit.",
            &["limit"],
        );
        let concurrency_in_use = registered(
            &registry,
            prometheus::IntGaugeVec::new(
                Opts::new(
                    "tollgate_concurrency_in_use",
                    "Slots of concurrency limits held by this replica's requests in flight, per limit.",
                ),
                &["limit"],
            )
            .expect("valid metric"),
        );
        let delayed = counter(
            "tollgate_delayed_total",
            "Requests held for tokens they booked (on_limit = \"delay\") instead of refused, per route and limit.",
            &["route", "limit"],
        );
        let delay_seconds = registered(
            &registry,
            prometheus::Histogram::with_opts(
                HistogramOpts::new(
                    "tollgate_delay_seconds",
                    "How long delayed requests were held before going upstream.",
                )
                .buckets(DELAY_BUCKETS.to_vec()),
            )
            .expect("valid metric"),
        );
        let jwt_rejected = counter(
            "tollgate_jwt_rejected_total",
            "Tokens refused (401) on routes whose limits read a claim, by reason.",
            &["reason"],
        );
        let load_factor = registered(
            &registry,
            Gauge::new(
                "tollgate_load_factor",
                "What every limit's refill rate is multiplied by now (1: no overload).",
            )
            .expect("valid metric"),
        );
        load_factor.set(1.0);
        let settle = settled::SettleFamilies::new(&registry);
        let overrides = OverrideMetrics::new(&registry);
        let connections = ConnectionMetrics::new(&registry);
        let tls = TlsMetrics::new(&registry);
        let trace_spans_dropped = traces::spans_dropped(&registry);
        let scans_detected = traces::scans_detected(&registry);
        for result in ["ok", "error"] {
            config_reloads.with_label_values(&[result]);
        }
        for warning in TrustWarning::ALL {
            client_ip_warnings.with_label_values(&[warning.as_str()]);
        }
        Metrics {
            top: std::sync::Arc::new(crate::top::TopKeys::new(0)),
            registry,
            unrouted_bad_requests: requests.int_counter(&[NO_ROUTE, Outcome::BadRequest.as_str()]),
            unrouted: requests.int_counter(&[NO_ROUTE, Outcome::NoRoute.as_str()]),
            requests,
            limited,
            decisions,
            tokens_consumed,
            fill_ratio,
            store_duration,
            store_errors,
            store_calls,
            store_batch_requests,
            store_late,
            degraded,
            upstream_duration,
            upstream_responses,
            inflight,
            config_reloads,
            admin_over_limit,
            client_ip_warnings,
            penalties,
            bans,
            concurrency_in_use,
            delayed,
            delay_seconds,
            jwt_rejected,
            load_factor,
            settle,
            overrides,
            connections,
            tls,
            trace_spans_dropped,
            scans_detected,
        }
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        let mut buffer = Vec::new();
        let encoder = TextEncoder::new();
        if let Err(error) = encoder.encode(&self.registry.gather(), &mut buffer) {
            tracing::warn!(%error, "cannot encode metrics");
        }
        String::from_utf8(buffer).unwrap_or_default()
    }

    /// `tollgate_jwt_rejected_total{reason}`.
    pub fn jwt_rejected(&self, reason: Rejection) -> SharedIntCounter {
        self.jwt_rejected.with_label_values(&[reason.as_str()])
    }

    pub fn store_call(&self, backend: &str) -> StoreCallMetrics {
        // Exported for every backend, so that dashboards find it (the memory store makes no
        // calls and leaves it at zero).
        self.store_batch_requests.with_label_values(&[backend]);
        self.store_late.with_label_values(&[backend]);
        self.store_calls.with_label_values(&[backend]);
        StoreCallMetrics {
            duration: self.store_duration.histogram(&[backend]),
            errors: self.store_errors.with_label_values(&[backend]),
        }
    }

    /// Where a store counts calls that ran after their deadline and charged nothing.
    pub fn store_late(&self, backend: &str) -> SharedIntCounter {
        self.store_late.with_label_values(&[backend])
    }

    /// Where a store counts the calls it makes.
    pub fn store_calls(&self, backend: &str) -> SharedIntCounter {
        self.store_calls.with_label_values(&[backend])
    }

    /// Where a store records how many requests each of its calls decided.
    pub fn store_batches(&self, backend: &str) -> prometheus::Histogram {
        self.store_batch_requests.with_label_values(&[backend])
    }

    /// An admin connection past `[admin] max_connections`.
    pub fn admin_over_limit(&self) {
        self.admin_over_limit.inc();
    }

    pub fn config_reload(&self, ok: bool) {
        self.config_reloads
            .with_label_values(&[if ok { "ok" } else { "error" }])
            .inc();
    }

    /// Counts one occurrence and returns how many there have been.
    pub fn client_ip_warning(&self, warning: TrustWarning) -> u64 {
        let counter = self
            .client_ip_warnings
            .with_label_values(&[warning.as_str()]);
        counter.inc();
        counter.get()
    }

    /// Requests counted so far, over every route and outcome (walks the label sets: not for
    /// the hot path).
    pub fn total_requests(&self) -> u64 {
        self.requests
            .values()
            .into_iter()
            .map(|(_, value)| value)
            .sum()
    }

    /// `tollgate_requests_total` by route, then outcome (what `/top/routes` differences).
    pub fn route_outcomes(&self) -> crate::top::routes::RouteCounts {
        let mut counts = crate::top::routes::RouteCounts::new();
        for (labels, value) in self.requests.values() {
            if let [route, outcome] = &labels[..] {
                counts
                    .entry(route.clone())
                    .or_default()
                    .insert(outcome.clone(), value);
            }
        }
        counts
    }

    /// Counts a request that reached no route, by its outcome (`None`: not counted).
    pub fn unrouted(&self, outcome: Option<Outcome>) {
        match outcome {
            Some(Outcome::NoRoute) => self.unrouted.inc(),
            Some(_) => self.unrouted_bad_requests.inc(),
            None => {}
        }
    }

    /// The handles of a route's own series. A route that reads a token also brings the token
    /// rejections' series (at zero) into the export; without one they cannot occur.
    pub fn for_route(&self, route: &Route) -> RouteMetrics {
        let name = &*route.name;
        if route.reads_token {
            for reason in Rejection::ALL {
                self.jwt_rejected.with_label_values(&[reason.as_str()]);
            }
        }
        RouteMetrics {
            outcomes: Outcome::ALL.map(|outcome| {
                if outcome.can_occur_on(route) {
                    self.requests.int_counter(&[name, outcome.as_str()])
                } else {
                    IntCounter::unexported()
                }
            }),
            statuses: StatusClass::ALL
                .map(|class| self.upstream_responses.int_counter(&[name, class.as_str()])),
            upstream_duration: self.upstream_duration.histogram(&[name]),
            degraded: self
                .degraded
                .with_label_values(&[name, route.on_store_failure.as_str()]),
        }
    }

    /// The handles of the decision listener's counts, by protocol and outcome.
    pub fn for_decisions(&self) -> DecisionMetrics {
        let outcomes = |protocol: DecisionProtocol| {
            Outcome::ALL.map(|outcome| {
                self.decisions
                    .int_counter(&[protocol.as_str(), outcome.as_str()])
            })
        };
        DecisionMetrics {
            outcomes: [
                outcomes(DecisionProtocol::Http),
                outcomes(DecisionProtocol::Grpc),
            ],
        }
    }

    /// The handles of the gRPC decisions' own route, `rls`: its outcomes, and its degraded
    /// decisions by the failing rule's policy.
    pub fn for_rls(&self) -> RlsMetrics {
        RlsMetrics {
            outcomes: Outcome::ALL.map(|outcome| match outcome {
                Outcome::NoRoute | Outcome::ShadowLimited => IntCounter::unexported(),
                _ => self.requests.int_counter(&[RLS_ROUTE, outcome.as_str()]),
            }),
            degraded: [
                StoreFailurePolicy::Allow,
                StoreFailurePolicy::Deny,
                StoreFailurePolicy::Local,
            ]
            .map(|policy| {
                self.degraded
                    .with_label_values(&[RLS_ROUTE, policy.as_str()])
            }),
        }
    }

    /// The handles of a route limit whose cost is settled after the response.
    pub fn for_settled(&self, route: &str, limit: &str) -> SettleMetrics {
        self.settle.for_limit(route, limit)
    }

    /// The handles of one limit as a route applies it.
    pub fn for_route_limit(&self, route: &str, limit: &Limit) -> LimitMetrics {
        let name = &*limit.name;
        LimitMetrics {
            concurrency_in_use: limit
                .concurrency
                .is_some()
                .then(|| self.concurrency_in_use.with_label_values(&[name])),
            delayed: limit
                .max_delay
                .is_some()
                .then(|| self.delayed.with_label_values(&[route, name])),
            penalties: limit
                .adaptive
                .is_some()
                .then(|| self.penalties.with_label_values(&[name])),
            bans: limit
                .ban
                .is_some()
                .then(|| self.bans.with_label_values(&[name])),
            limited: self.limited.int_counter(&[route, name]),
            tokens_consumed: self.tokens_consumed.counter(&[route, name]),
            fill_ratio: self.fill_ratio.histogram(&[name]),
            top: self.top.id(&limit.name),
        }
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

/// The store's call metrics, resolved for its backend.
#[derive(Debug, Clone)]
pub struct StoreCallMetrics {
    pub duration: Histogram,
    pub errors: SharedIntCounter,
}

/// The metric handles of one route's own series (its limits' are beside each limit).
#[derive(Debug, Clone)]
pub struct RouteMetrics {
    /// By [`Outcome`] discriminant.
    outcomes: [IntCounter; 8],
    /// By [`StatusClass`] discriminant.
    statuses: [IntCounter; 6],
    pub upstream_duration: Histogram,
    pub degraded: SharedIntCounter,
}

impl RouteMetrics {
    pub fn outcome(&self, outcome: Outcome) -> &IntCounter {
        &self.outcomes[outcome as usize]
    }

    pub fn upstream_status(&self, class: StatusClass) -> &IntCounter {
        &self.statuses[class as usize]
    }
}

#[derive(Debug, Clone)]
pub struct LimitMetrics {
    /// For adaptive limits only.
    pub penalties: Option<SharedIntCounter>,
    /// `tollgate_bans_total{limit}`, for a limit with a ban.
    pub bans: Option<SharedIntCounter>,
    /// `tollgate_concurrency_in_use{limit}`, for a concurrency limit.
    pub concurrency_in_use: Option<prometheus::IntGauge>,
    /// `tollgate_delayed_total{route,limit}`, for a limit that delays.
    pub delayed: Option<SharedIntCounter>,
    pub limited: IntCounter,
    pub tokens_consumed: Counter,
    pub fill_ratio: Histogram,
    /// Where top keys count the limit's shares; `None` while `[top]` is off.
    pub top: Option<crate::top::TopId>,
}

#[cfg(test)]
mod tests;
