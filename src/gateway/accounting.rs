//! What a store's decision means for a request, as a pure function: what each bucket is
//! charged and how full it is left, which enforcing limits refused, whether a shadow limit
//! would have, and what the client is told. The gateway records each bucket's share in the
//! metrics as it is told it.

use crate::limit::{BucketRequest, StoreVerdict};
use crate::reject::{LimitReport, Reports};

/// A decision, accounted for (each bucket's share went to the caller, what the client is told
/// into the request's reports).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Accounting {
    pub admitted: bool,
    /// The request was admitted although a shadow limit would have refused it.
    pub shadow_refused: bool,
    /// Seconds the request waits for tokens it booked (`on_limit = "delay"`); 0: none.
    pub delay: f64,
}

/// One observed bucket's share of a decision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BucketAccount<L> {
    /// The route limit it belongs to (the handle the caller paired the bucket with).
    pub limit: L,
    /// The bucket's place among the request's buckets.
    pub position: usize,
    /// Tokens left after the decision, and seconds until the bucket is full again.
    pub tokens: f64,
    pub full_in: f64,
    /// Tokens left over capacity, within [0, 1].
    pub fill_ratio: f64,
    /// Tokens charged (0 unless the request was admitted and the bucket could pay, or booked
    /// what it lacked).
    pub charged: f64,
    /// The bucket was charged its cost, whatever it was (zero too): the request was
    /// admitted, and the bucket could pay or booked what it lacked.
    pub paid: bool,
    /// An enforcing bucket that could not pay (nor book).
    pub refused: bool,
    /// The bucket booked tokens the request waits for.
    pub delayed: bool,
    /// This decision began a ban of the bucket's key.
    pub ban_began: bool,
}

/// Accounts for `decision` on `buckets`, each with its route limit's handle (the verdicts are
/// in the buckets' order): tells `share` each observed bucket's share, and puts what the
/// client is told of each enforcing limit into `reports`.
#[inline]
pub fn account<'a, 'b, L: Copy>(
    buckets: impl Iterator<Item = (L, &'b BucketRequest<'a>)>,
    decision: &StoreVerdict,
    reports: &mut Reports<'a>,
    mut share: impl FnMut(BucketAccount<L>),
) -> Accounting
where
    'a: 'b,
{
    let admitted = decision.is_admitted();
    let mut accounting = Accounting {
        admitted,
        shadow_refused: false,
        delay: 0.0,
    };
    for (position, ((limit, bucket), verdict)) in buckets.zip(decision.verdicts()).enumerate() {
        if !verdict.observed {
            continue;
        }
        let enforce = bucket.charge.enforce;
        let paid = admitted && (verdict.sufficient || verdict.booked);
        share(BucketAccount {
            limit,
            position,
            tokens: verdict.tokens,
            full_in: verdict.full_in,
            fill_ratio: (verdict.tokens / verdict.capacity).clamp(0.0, 1.0),
            charged: if paid { bucket.charge.cost } else { 0.0 },
            paid,
            refused: enforce && !verdict.sufficient && !verdict.booked,
            delayed: verdict.booked,
            ban_began: verdict.ban_began,
        });
        if verdict.booked {
            accounting.delay = accounting.delay.max(verdict.wait);
        }
        accounting.shadow_refused |= admitted && !enforce && !verdict.sufficient;
        if enforce {
            reports.push(LimitReport {
                name: bucket.key.limit,
                capacity: verdict.capacity,
                rate: verdict.rate,
                cost: bucket.charge.cost,
                tokens: verdict.tokens,
                full_in: verdict.full_in,
                wait: verdict.wait,
                refused: !admitted && !verdict.sufficient,
                banned: verdict.banned,
            });
        }
    }
    accounting
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{BucketKey, Charge, KeyParts, Verdict, Verdicts};
    use crate::reject::refusing;

    /// The accounting, each bucket's share and the reports.
    /// Buckets paired with their position in the route's list as the handle.
    fn accounted<'a>(
        buckets: &[(usize, BucketRequest<'a>)],
        decision: &StoreVerdict,
    ) -> (Accounting, Vec<BucketAccount<usize>>, Reports<'a>) {
        let (mut shares, mut reports) = (Vec::new(), Reports::new());
        let paired = buckets.iter().map(|(limit, bucket)| (*limit, bucket));
        let accounting = account(paired, decision, &mut reports, |share| shares.push(share));
        (accounting, shares, reports)
    }

    fn bucket(
        limit: &'static str,
        route_limit: usize,
        cost: f64,
        enforce: bool,
    ) -> (usize, BucketRequest<'static>) {
        let request = BucketRequest {
            key: BucketKey {
                limit,
                fingerprint: 1,
                parts: KeyParts::new(),
            },
            charge: Charge {
                capacity: 10.0,
                rate: 1.0,
                cost,
                enforce,
                period: None,
                debt: 0.0,
            },
            adaptive: None,
            lease: None,
            ban: None,
        };
        (route_limit, request)
    }

    /// The verdict of a bucket of `bucket`'s charge that held `tokens` before the decision.
    fn verdict(
        (_, bucket): &(usize, BucketRequest<'_>),
        tokens_before: f64,
        charged: bool,
    ) -> Verdict {
        let sufficient = tokens_before >= bucket.charge.cost;
        let after = if charged {
            tokens_before - bucket.charge.cost
        } else {
            tokens_before
        };
        Verdict::observed(&bucket.charge, after, sufficient)
    }

    #[test]
    fn an_admitted_request_charges_every_bucket_and_reports_its_enforcing_ones() {
        let buckets = [
            bucket("per_network", 0, 2.0, true),
            bucket("everyone", 2, 1.0, true),
        ];
        let verdicts: Verdicts = [
            verdict(&buckets[0], 10.0, true),
            verdict(&buckets[1], 5.0, true),
        ]
        .into_iter()
        .collect();
        let (accounting, shares, reports) = accounted(&buckets, &StoreVerdict::Admit(verdicts));
        assert!(accounting.admitted);
        assert!(!accounting.shadow_refused);
        let charged: Vec<(usize, f64)> = shares
            .iter()
            .map(|bucket| (bucket.limit, bucket.charged))
            .collect();
        assert_eq!(charged, [(0, 2.0), (2, 1.0)]);
        assert_eq!(shares[0].fill_ratio, 0.8);
        assert_eq!(shares[1].fill_ratio, 0.4);
        assert_eq!(reports.len(), 2);
        assert!(reports.iter().all(|report| !report.refused));
        assert_eq!(reports[0].tokens, 8.0);
        assert_eq!(refusing(&reports), "");
    }

    #[test]
    fn a_refusal_charges_nothing_and_names_only_the_limits_that_could_not_pay() {
        let buckets = [
            bucket("per_account", 0, 1.0, true),
            bucket("per_network", 1, 1.0, true),
            bucket("everyone", 2, 1.0, true),
        ];
        let verdicts: Verdicts = [
            verdict(&buckets[0], 0.5, false),
            verdict(&buckets[1], 4.0, false),
            verdict(&buckets[2], 0.0, false),
        ]
        .into_iter()
        .collect();
        let (accounting, shares, reports) = accounted(&buckets, &StoreVerdict::Refuse(verdicts));
        assert!(!accounting.admitted);
        assert!(!accounting.admitted);
        assert!(shares.iter().all(|bucket| bucket.charged == 0.0));
        let refused: Vec<bool> = shares.iter().map(|bucket| bucket.refused).collect();
        assert_eq!(refused, [true, false, true]);
        assert_eq!(refusing(&reports), "per_account,everyone");
        assert!(reports[0].wait > 0.0);
    }

    #[test]
    fn a_shadow_limit_that_cannot_pay_marks_an_admitted_request_and_is_not_reported() {
        let buckets = [
            bucket("enforced", 0, 1.0, true),
            bucket("tuning", 1, 1.0, false),
        ];
        let verdicts: Verdicts = [
            verdict(&buckets[0], 3.0, true),
            verdict(&buckets[1], 0.0, false),
        ]
        .into_iter()
        .collect();
        let (accounting, shares, reports) = accounted(&buckets, &StoreVerdict::Admit(verdicts));
        assert!(accounting.admitted);
        assert!(accounting.shadow_refused);
        assert_eq!(reports.len(), 1, "shadow limits are not reported");
        assert_eq!(reports[0].name, "enforced");
        assert!(
            !shares[1].refused,
            "a shadow limit never counts as refusing"
        );
        assert_eq!(shares[1].charged, 0.0);
    }

    #[test]
    fn buckets_the_store_did_not_observe_are_left_out() {
        let buckets = [
            bucket("per_network", 0, 1.0, true),
            bucket("per_user", 1, 1.0, true),
        ];
        let verdicts: Verdicts = [Verdict::unobserved(), verdict(&buckets[1], 0.0, false)]
            .into_iter()
            .collect();
        let (_, shares, reports) = accounted(&buckets, &StoreVerdict::Refuse(verdicts));
        assert_eq!(shares.len(), 1);
        assert_eq!(shares[0].limit, 1);
        assert_eq!(refusing(&reports), "per_user");
    }
}
