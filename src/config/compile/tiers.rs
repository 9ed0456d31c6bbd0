//! What a limit counts, a token bucket or a calendar quota, and the numbers each of its tiers
//! puts in place of the limit's own; where a tier comes from.

use std::collections::BTreeMap;
use std::ops::Range;

use toml::Spanned;

use super::Errors;
use crate::config::raw;
use crate::config::units::MAX_EXACT_TOKENS;
use crate::config::units::MAX_REFILL_SECONDS;
use crate::config::{Rate, Tier, TierSource};
use crate::limit::calendar::{Calendar, Period};

/// What a limit counts: a token bucket (`capacity`, `rate`) or a calendar quota (`quota`,
/// `period`, `timezone`), as (capacity, rate, calendar). A quota's rate is its quota over a
/// nominal period (a month of 30 days), for display only.
pub(super) fn compile_amount(
    raw: &raw::RawLimit,
    key: &str,
    span: Range<usize>,
    errors: &mut Errors<'_>,
) -> Option<(f64, Rate, Option<Calendar>)> {
    match (&raw.capacity, &raw.rate, &raw.quota, &raw.period) {
        (Some(capacity), Some(rate), None, None) => {
            if let Some(timezone) = &raw.timezone {
                errors.at(
                    Some(timezone.span()),
                    format!("{key}.timezone"),
                    "a timezone places a calendar quota's periods: it needs quota and period",
                );
            }
            let value = number(capacity, &format!("{key}.capacity"), errors)?;
            let rate = number(rate, &format!("{key}.rate"), errors)?.0;
            if !(value.is_finite() && value > 0.0) {
                errors.at(Some(capacity.span()), format!("{key}.capacity"), format!("{value} is out of range: a capacity (burst, in tokens) must be greater than zero"));
            } else if value > MAX_EXACT_TOKENS {
                errors.at(Some(capacity.span()), format!("{key}.capacity"), format!("{value} is out of range: a capacity is at most 2^53 (9007199254740992), what the bucket math holds exactly"));
            } else {
                let refill = value / rate.per_second();
                if refill > MAX_REFILL_SECONDS {
                    errors.at(Some(raw.rate.as_ref()?.span()), format!("{key}.rate"), format!("an empty bucket would take {} to fill at this rate: at most 10 years; raise the rate or lower the capacity", humantime::format_duration(std::time::Duration::from_secs_f64(refill.min(1e15).round()))));
                }
            }
            Some((value, rate, None))
        }
        (None, None, Some(quota), Some(period)) => {
            let value = number(quota, &format!("{key}.quota"), errors)?;
            if !is_token_count(value) {
                errors.at(Some(quota.span()), format!("{key}.quota"), format!("{value} is out of range: a quota is more than 0 and at most 2^53 requests (or cost) per period"));
            }
            let zone = raw.timezone.as_ref().map(|zone| zone.get_ref().as_str());
            let calendar = match Calendar::new(*period.get_ref(), zone) {
                Ok(calendar) => calendar,
                Err(error) => {
                    let span = raw.timezone.as_ref().map(Spanned::span);
                    errors.at(span, format!("{key}.timezone"), error.to_string());
                    return None;
                }
            };
            let rate = Rate {
                tokens: value,
                period: nominal_length(calendar.period),
            };
            Some((value, rate, Some(calendar)))
        }
        _ => {
            errors.at(Some(span), key, "set capacity and rate (a token bucket), or quota and period (a calendar quota): one pair, not both");
            None
        }
    }
}

/// A number as written, or the `default` of one the request carries (required: the number
/// of requests that carry none).
fn number<T: Clone>(
    raw: &Spanned<raw::RawNumber<T>>,
    key: &str,
    errors: &mut Errors<'_>,
) -> Option<T> {
    let value = raw.get_ref().value();
    if value.is_none() {
        errors.at(
            Some(raw.span()),
            format!("{key}.default"),
            "a number the request carries needs a default: the number of requests that carry none",
        );
    }
    value
}

fn nominal_length(period: Period) -> std::time::Duration {
    let hours = match period {
        Period::Hour => 1,
        Period::Day => 24,
        Period::Week => 7 * 24,
        Period::Month => 30 * 24,
    };
    std::time::Duration::from_secs(hours * 3600)
}

pub(super) const NEEDS_JWT: &str =
    "a jwt_claim is read from a verified token: configure [auth.jwt] (jwks_file or secret_env)";

pub(super) fn compile_tier_source(
    raw: Spanned<raw::RawTierSource>,
    key: &str,
    trust_header: Option<bool>,
    jwt_configured: bool,
    errors: &mut Errors<'_>,
) -> Option<TierSource> {
    let span = Some(raw.span());
    let key = format!("{key}.tier");
    match raw.into_inner() {
        raw::RawTierSource {
            jwt_claim: Some(path),
            header: None,
        } if !path.is_empty() => {
            if !jwt_configured {
                errors.at(span, key, NEEDS_JWT);
            }
            Some(TierSource::JwtClaim(path))
        }
        raw::RawTierSource {
            jwt_claim: None,
            header: Some(name),
        } => {
            let Ok(name) = http::HeaderName::from_bytes(name.as_bytes()) else {
                errors.at(span, key, format!("{name:?} is not a valid header name"));
                return None;
            };
            if trust_header != Some(true) {
                errors.at(span, key, "a tier from a header lets every client that can set it pick its own tier: set trust_header = true on the limit when a proxy in front sets it, or use { jwt_claim = \"..\" }");
            }
            Some(TierSource::Header(name))
        }
        _ => {
            errors.at(
                span,
                key,
                "name one source: { jwt_claim = \"plan\" } or { header = \"x-plan\" }",
            );
            None
        }
    }
}

/// `[limits.X.tiers]`: each tier's numbers (the limit's own where a tier leaves one out), or
/// `"exempt"`.
pub(super) fn compile_tiers(
    raw: Spanned<BTreeMap<String, raw::RawTier>>,
    key: &str,
    (capacity, rate, quota): (f64, Rate, bool),
    errors: &mut Errors<'_>,
) -> Vec<(String, Tier)> {
    let span = Some(raw.span());
    let mut tiers = Vec::new();
    for (name, tier) in raw.into_inner() {
        let tier_key = format!("{key}.tiers.{name}");
        let compiled = compile_tier(tier, tier_key, (capacity, rate, quota), &span, errors);
        tiers.extend(compiled.map(|tier| (name, tier)));
    }
    tiers
}

/// One tier's numbers; `None` (and an error) for numbers that do not fit the limit's kind.
fn compile_tier(
    tier: raw::RawTier,
    tier_key: String,
    (capacity, rate, quota): (f64, Rate, bool),
    span: &Option<Range<usize>>,
    errors: &mut Errors<'_>,
) -> Option<Tier> {
    Some(match tier {
        raw::RawTier::Exempt => Tier::Exempt,
        raw::RawTier::Numbers {
            quota: Some(_),
            capacity: Some(_),
            ..
        }
        | raw::RawTier::Numbers {
            quota: Some(_),
            rate: Some(_),
            ..
        } => {
            errors.at(
                span.clone(),
                tier_key,
                "a tier sets capacity and rate, or quota: not both",
            );
            return None;
        }
        raw::RawTier::Numbers {
            quota: tier_quota,
            capacity: None,
            rate: None,
        } if quota => {
            let quota = tier_quota.unwrap_or(capacity);
            quota_tier(quota, rate, &tier_key, span, errors)
        }
        raw::RawTier::Numbers { .. } if quota => {
            errors.at(
                span.clone(),
                tier_key,
                "this limit is a calendar quota: its tiers set quota",
            );
            return None;
        }
        raw::RawTier::Numbers { quota: Some(_), .. } => {
            errors.at(
                span.clone(),
                format!("{tier_key}.quota"),
                "this limit is a token bucket: its tiers set capacity and rate",
            );
            return None;
        }
        raw::RawTier::Numbers {
            capacity: tier_capacity,
            rate: tier_rate,
            ..
        } => {
            let capacity = tier_capacity.unwrap_or(capacity);
            let rate = tier_rate.map_or(rate, |rate| rate.0);
            bucket_tier(capacity, rate, &tier_key, span, errors)
        }
    })
}

/// More than zero and no more than the bucket math holds exactly (2^53).
fn is_token_count(value: f64) -> bool {
    value.is_finite() && value > 0.0 && value <= MAX_EXACT_TOKENS
}

/// A calendar quota's tier: `quota` requests (or cost) per period.
fn quota_tier(
    quota: f64,
    rate: Rate,
    tier_key: &str,
    span: &Option<Range<usize>>,
    errors: &mut Errors<'_>,
) -> Tier {
    if !is_token_count(quota) {
        errors.at(
            span.clone(),
            format!("{tier_key}.quota"),
            format!("{quota} is out of range: a quota is more than 0 and at most 2^53"),
        );
    }
    Tier::Bucket {
        capacity: quota,
        rate: Rate {
            tokens: quota,
            period: rate.period,
        },
    }
}

/// A token bucket's tier: its capacity and rate.
fn bucket_tier(
    capacity: f64,
    rate: Rate,
    tier_key: &str,
    span: &Option<Range<usize>>,
    errors: &mut Errors<'_>,
) -> Tier {
    if !is_token_count(capacity) {
        errors.at(
            span.clone(),
            format!("{tier_key}.capacity"),
            format!("{capacity} is out of range: a capacity is more than 0 and at most 2^53"),
        );
    } else if capacity / rate.per_second() > MAX_REFILL_SECONDS {
        errors.at(
            span.clone(),
            format!("{tier_key}.rate"),
            "an empty bucket would take more than 10 years to fill at this rate",
        );
    }
    Tier::Bucket { capacity, rate }
}
