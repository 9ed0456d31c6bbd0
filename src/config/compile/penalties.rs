//! What tightens limits while the gateway runs: a limit's adaptive penalties, its charges by
//! the upstream's status, and `[overload]`, the factor on every rate while the upstream
//! struggles.

use std::collections::BTreeMap;
use std::ops::Range;

use toml::Spanned;

use super::Errors;
use crate::config::raw;
use crate::config::{Adaptive, Overload};
use crate::limit::AdaptiveParams;

fn status_code(value: i64) -> Option<u16> {
    u16::try_from(value)
        .ok()
        .filter(|status| (100..=599).contains(status))
}

/// A limit's `[adaptive]` penalty and its charges by status: a token bucket's, never a
/// calendar quota's.
pub(super) fn compile_penalties(
    raw: &mut raw::RawLimit,
    key: &str,
    (capacity, quota): (f64, bool),
    span: std::ops::Range<usize>,
    errors: &mut Errors<'_>,
) -> (Option<crate::config::Adaptive>, Vec<(u16, f64)>) {
    let adaptive = raw
        .adaptive
        .take()
        .map(|adaptive| compile_adaptive(adaptive, key, capacity, errors));
    let charge_on_status = raw
        .charge_on_status
        .take()
        .map(|charges| compile_charges(charges, key, errors))
        .unwrap_or_default();
    if quota && (adaptive.is_some() || !charge_on_status.is_empty()) {
        errors.at(
            Some(span),
            key.to_owned(),
            "a calendar quota takes no adaptive penalty or charge_on_status: it counts requests per period; put those on a token bucket beside it",
        );
    }
    (adaptive, charge_on_status)
}

fn compile_adaptive(
    raw: Spanned<raw::RawAdaptive>,
    key: &str,
    capacity: f64,
    errors: &mut Errors<'_>,
) -> Adaptive {
    let span = Some(raw.span());
    let raw = raw.into_inner();
    let key = format!("{key}.adaptive");
    let mut on_status = Vec::new();
    for status in &raw.on_status {
        match status_code(*status) {
            Some(status) => on_status.push(status),
            None => errors.at(
                span.clone(),
                format!("{key}.on_status"),
                format!("{status} is not an HTTP status: expected 100 to 599"),
            ),
        }
    }
    if raw.on_status.is_empty() {
        errors.at(
            span.clone(),
            format!("{key}.on_status"),
            "empty: list the upstream statuses that count as errors, such as [401, 403]",
        );
    }
    let threshold = match u32::try_from(raw.threshold) {
        Ok(threshold) if (1..=1000).contains(&threshold) => threshold,
        _ => {
            errors.at(
                span.clone(),
                format!("{key}.threshold"),
                format!(
                    "{} is out of range: expected 1 to 1000 errors",
                    raw.threshold
                ),
            );
            1
        }
    };
    check_factor(raw.factor, &format!("{key}.factor"), span.clone(), errors);
    let min_capacity = raw.min_capacity.unwrap_or(1.0);
    if !(min_capacity.is_finite() && min_capacity > 0.0 && min_capacity <= capacity) {
        errors.at(span.clone(), format!("{key}.min_capacity"), format!("{min_capacity} is out of range: expected more than 0 and at most the limit's capacity {capacity}"));
    }
    if raw.window.0.is_zero() {
        errors.at(
            span.clone(),
            format!("{key}.window"),
            "must be longer than zero",
        );
    }
    if raw.hold.0 < raw.window.0 {
        errors.at(
            span,
            format!("{key}.hold"),
            format!(
                "hold ({}) must be at least the window ({})",
                humantime::format_duration(raw.hold.0),
                humantime::format_duration(raw.window.0)
            ),
        );
    }
    Adaptive {
        on_status,
        params: AdaptiveParams {
            threshold,
            window: raw.window.0.as_secs_f64(),
            factor: raw.factor,
            min_capacity,
            hold: raw.hold.0.as_secs_f64(),
        },
    }
}

fn compile_charges(
    raw: Spanned<BTreeMap<String, f64>>,
    key: &str,
    errors: &mut Errors<'_>,
) -> Vec<(u16, f64)> {
    let span = Some(raw.span());
    let mut charges = Vec::new();
    for (status, tokens) in raw.into_inner() {
        let Some(code) = status.parse::<i64>().ok().and_then(status_code) else {
            errors.at(
                span.clone(),
                format!("{key}.charge_on_status"),
                format!("{status:?} is not an HTTP status: expected 100 to 599, such as 404 = 5"),
            );
            continue;
        };
        if !(tokens.is_finite() && tokens >= 0.0) {
            errors.at(
                span.clone(),
                format!("{key}.charge_on_status.{status}"),
                format!("{tokens} is out of range: a charge is 0 or more tokens"),
            );
            continue;
        }
        charges.push((code, tokens));
    }
    charges
}

/// A multiplier that shrinks limits: in (0, 1].
fn check_factor(factor: f64, key: &str, span: Option<Range<usize>>, errors: &mut Errors<'_>) {
    if !(factor.is_finite() && factor > 0.0 && factor <= 1.0) {
        errors.at(
            span,
            key,
            format!("{factor} is out of range: expected a factor in (0, 1], such as 0.5"),
        );
    }
}

pub(super) fn compile_overload(
    raw: Spanned<raw::RawOverload>,
    errors: &mut Errors<'_>,
) -> Option<Overload> {
    let span = Some(raw.span());
    let raw = raw.into_inner();
    check_factor(raw.factor, "overload.factor", span.clone(), errors);
    let max_inflight = match raw.max_inflight {
        Some(value) if value >= 1 => Some(value as u64),
        Some(value) => {
            errors.at(
                span.clone(),
                "overload.max_inflight",
                format!("{value} is out of range: expected at least 1"),
            );
            None
        }
        None => None,
    };
    let latency_target = raw.latency_target.map(|target| target.0);
    if latency_target.is_some_and(|target| target.is_zero()) {
        errors.at(
            span.clone(),
            "overload.latency_target",
            "must be longer than zero",
        );
    }
    if max_inflight.is_none() && latency_target.is_none() {
        errors.at(
            span,
            "overload",
            "set max_inflight, latency_target or both: what counts as overloaded",
        );
        return None;
    }
    Some(Overload {
        max_inflight,
        latency_target,
        factor: raw.factor,
    })
}
