//! The response hooks: what a response's status charges (`charge_on_status`) and whether it
//! counts as an error for a key's adaptive penalty, recorded in the store that decided.

use super::decide::Decider;
use super::{Buckets, Gateway};
use crate::limit::{Charge, OutcomeRequest, StoreError};
use crate::runtime::{AppliedLimit, ServedRoute};

impl Gateway {
    /// Response hooks: extra charges by status and adaptive errors, recorded in the store that
    /// decided the request. Awaited before the response goes out, so the client's next
    /// request already sees them; it costs a store call only on configured statuses.
    pub(super) async fn after_response(
        &self,
        route: &ServedRoute,
        buckets: &Buckets<'_>,
        decider: Decider,
        status: u16,
    ) {
        let (requests, limits): (Vec<OutcomeRequest<'_>>, Vec<&AppliedLimit>) = buckets
            .iter()
            .filter_map(|(applied, bucket)| {
                let limit = &applied.limit;
                let (extra, error) = (limit.charge_for(status), limit.is_error(status));
                let outcome = OutcomeRequest {
                    key: bucket.key.clone(),
                    charge: Charge {
                        cost: extra,
                        ..bucket.charge
                    },
                    adaptive: bucket.adaptive,
                    error,
                };
                (extra > 0.0 || error).then_some((outcome, applied))
            })
            .unzip();
        if requests.is_empty() {
            return;
        }
        let tripped = match decider {
            Decider::Store => self.shared.store.record_outcomes(&requests).await,
            Decider::Local => Ok(self.shared.local.record_outcomes(&requests)),
            Decider::Nobody => return,
        };
        let tripped = match tripped {
            Ok(tripped) => tripped,
            Err(StoreError::Unavailable) => return,
            Err(error) => {
                self.shared.store_calls.errors.inc();
                tracing::warn!(backend = self.shared.store.backend(), %error, "store call failed (response hooks)");
                return;
            }
        };
        for ((request, applied), tripped) in requests.iter().zip(limits).zip(tripped) {
            let metrics = &applied.metrics;
            metrics.tokens_consumed.inc_by(request.charge.cost);
            if tripped {
                if let Some(penalties) = &metrics.penalties {
                    penalties.inc();
                }
                tracing::info!(route = %route.route.name, limit = %request.key.limit, "adaptive penalty: key tripped");
            }
        }
    }
}
