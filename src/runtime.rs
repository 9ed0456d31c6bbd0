//! What requests read that a reload replaces at once: the policy, and each route compiled with
//! everything its requests need — its limits with their costs and metric handles, its
//! upstream pool, its own counters. Built once per reload and swapped whole: requests in
//! flight keep the runtime they started with.

use std::sync::Arc;

use crate::config::costs::{ReadCost, Settle};
use crate::config::{DescriptorRule, Limit, Policy, Refusal, Route, StoreFailurePolicy};
use crate::limit::concurrency::{SlotKey, SlotRequest};
use crate::limit::{BucketKey, BucketRequest, Charge, KeyParts};
use crate::metrics::{
    DecisionMetrics, LimitMetrics, Metrics, RlsMetrics, RouteMetrics, SettleMetrics,
    SharedIntCounter, RLS_ROUTE,
};
use crate::reject::LimitReport;
use crate::settle::Measuring;
use crate::upstream::{UpstreamPool, UpstreamSetupError};

#[derive(Debug)]
pub struct Runtime {
    pub policy: Policy,
    /// In match order: the first that matches wins.
    pub routes: Vec<ServedRoute>,
    /// Some route matches on the host.
    pub matches_hosts: bool,
    /// What the decision listener reads, with `[decision]`.
    pub decision: Option<DecisionRuntime>,
    /// The limits whose refusals are shaped (`[limits.NAME.refusal]`), by name.
    pub refusals: Vec<(Arc<str>, Arc<Refusal>)>,
}

/// The decision listener's share of a runtime: its counters, and its descriptor rules with
/// their limits' handles.
#[derive(Debug)]
pub struct DecisionRuntime {
    pub metrics: DecisionMetrics,
    /// In the rules' order.
    pub rules: Vec<ServedRule>,
    pub rls: RlsMetrics,
}

/// A descriptor rule as gRPC decisions apply it: its limit counts under the route `rls`.
#[derive(Debug)]
pub struct ServedRule {
    pub rule: DescriptorRule,
    pub applied: AppliedLimit,
}

/// A route as the gateway serves it.
#[derive(Debug)]
pub struct ServedRoute {
    pub route: Route,
    /// In the route's order.
    pub limits: Vec<AppliedLimit>,
    pub upstream: Arc<UpstreamPool>,
    pub metrics: RouteMetrics,
    /// Some limit's cost is settled after the response.
    pub settles: bool,
}

/// One of a route's limits (or of a gRPC descriptor rule), with what the route charges,
/// what it does when the store fails, and where it counts.
#[derive(Debug)]
pub struct AppliedLimit {
    pub limit: Arc<Limit>,
    /// The route's `on_store_failure` (a rule's own, for a descriptor rule's limit).
    pub on_store_failure: StoreFailurePolicy,
    /// Where a decision taken without the store counts: shared by a route's limits.
    pub degraded: Arc<SharedIntCounter>,
    /// What a request reserves: fixed, or the default of `read_cost`.
    pub cost: f64,
    pub read_cost: Option<ReadCost>,
    /// How the reservation is settled after the response, with its counters.
    pub settled: Option<SettledLimit>,
    pub metrics: LimitMetrics,
}

/// A route limit's settlement, and where it counts.
#[derive(Debug)]
pub struct SettledLimit {
    pub settle: Settle,
    /// `settle.measure`, compiled for reading responses.
    pub measuring: Measuring,
    pub metrics: SettleMetrics,
}

impl AppliedLimit {
    /// The request for this limit's bucket of `key`, charged `charge`.
    #[inline(always)]
    pub fn bucket(&self, key: KeyParts, charge: Charge) -> BucketRequest<'_> {
        let limit = &*self.limit;
        BucketRequest {
            key: BucketKey {
                limit: &limit.name,
                fingerprint: limit.fingerprint,
                parts: key,
            },
            charge,
            adaptive: limit.adaptive.as_ref().map(|adaptive| adaptive.params),
            lease: limit.lease,
            ban: limit.ban,
        }
    }
}

impl AppliedLimit {
    /// The request for `slots` of this concurrency limit's slots of `key`.
    pub fn slots(&self, key: KeyParts, slots: u32) -> SlotRequest {
        let limit = &*self.limit;
        SlotRequest {
            key: SlotKey {
                limit: limit.name.clone(),
                fingerprint: limit.fingerprint,
                parts: key,
            },
            slots,
            in_use: self.metrics.concurrency_in_use.clone(),
        }
    }
}

impl AsRef<Route> for ServedRoute {
    fn as_ref(&self) -> &Route {
        &self.route
    }
}

impl Runtime {
    /// Compiles `policy` for serving: one pool per upstream, shared by the routes that name it.
    pub fn new(policy: Policy, metrics: &Metrics) -> Result<Runtime, UpstreamSetupError> {
        let pools = policy
            .upstreams
            .iter()
            .map(|upstream| Ok((upstream.clone(), Arc::new(UpstreamPool::new(upstream)?))))
            .collect::<Result<Vec<_>, UpstreamSetupError>>()?;
        let routes = policy
            .routes
            .iter()
            .map(|route| {
                let upstream = pools
                    .iter()
                    .find(|(upstream, _)| Arc::ptr_eq(upstream, &route.upstream))
                    .map(|(_, pool)| pool.clone())
                    .ok_or_else(|| UpstreamSetupError::NoPool(route.name.to_string()))?;
                let route_metrics = metrics.for_route(route);
                let degraded = Arc::new(route_metrics.degraded.clone());
                let limits = route
                    .limits
                    .iter()
                    .map(|entry| AppliedLimit {
                        limit: entry.limit.clone(),
                        on_store_failure: route.on_store_failure,
                        degraded: degraded.clone(),
                        cost: entry.cost,
                        read_cost: entry.read_cost.clone(),
                        settled: entry.settle.clone().map(|settle| SettledLimit {
                            measuring: Measuring::of(&settle.measure),
                            settle,
                            metrics: metrics.for_settled(&route.name, &entry.limit.name),
                        }),
                        metrics: metrics.for_route_limit(&route.name, &entry.limit),
                    })
                    .collect();
                Ok(ServedRoute {
                    settles: route.limits.iter().any(|entry| entry.settle.is_some()),
                    route: route.clone(),
                    limits,
                    upstream,
                    metrics: route_metrics,
                })
            })
            .collect::<Result<Vec<_>, UpstreamSetupError>>()?;
        let decision = policy.decision.as_ref().map(|decision| {
            let rls = metrics.for_rls();
            DecisionRuntime {
                metrics: metrics.for_decisions(),
                rules: decision
                    .descriptors
                    .iter()
                    .map(|rule| ServedRule {
                        applied: AppliedLimit {
                            limit: rule.limit.clone(),
                            on_store_failure: rule.on_store_failure,
                            degraded: Arc::new(rls.degraded(rule.on_store_failure).clone()),
                            cost: 1.0,
                            read_cost: None,
                            settled: None,
                            metrics: metrics.for_route_limit(RLS_ROUTE, &rule.limit),
                        },
                        rule: rule.clone(),
                    })
                    .collect(),
                rls,
            }
        });
        let refusals = policy
            .limits
            .iter()
            .filter_map(|limit| Some((limit.name.clone(), limit.refusal.clone()?)))
            .collect();
        Ok(Runtime {
            decision,
            matches_hosts: policy.routes.iter().any(|route| route.host.is_some()),
            routes,
            refusals,
            policy,
        })
    }

    /// How a refusal is answered: as the first refusing limit (in the route's order, which
    /// the reports keep) shapes it, if it does.
    #[inline]
    pub fn refusal_shape(&self, reports: &[LimitReport<'_>]) -> Option<&Refusal> {
        if self.refusals.is_empty() {
            return None;
        }
        let first = reports.iter().find(|report| report.refused)?;
        self.refusals
            .iter()
            .find(|(name, _)| **name == *first.name)
            .map(|(_, refusal)| &**refusal)
    }
}
