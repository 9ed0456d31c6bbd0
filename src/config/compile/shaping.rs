//! The settings that shape a limit's traffic rather than count it: `concurrency` (requests in
//! flight), `on_limit = "delay"` with `max_delay` (held instead of refused), and `lease`
//! (tokens taken from the store in batches); and bans, which refuse a key refused too often.

use toml::Spanned;

use super::Errors;
use crate::config::raw;

/// `on_limit = "delay"` and `max_delay`: a token bucket's requests held up to `max_delay`
/// (default 1s, at most a minute) instead of refused.
pub(super) fn compile_delay(
    raw: &raw::RawLimit,
    key: &str,
    bucket: bool,
    errors: &mut Errors<'_>,
) -> Option<std::time::Duration> {
    let delay = raw
        .on_limit
        .as_ref()
        .is_some_and(|on_limit| *on_limit.get_ref() == raw::OnLimit::Delay);
    let span = raw
        .on_limit
        .as_ref()
        .map(Spanned::span)
        .or_else(|| raw.max_delay.as_ref().map(Spanned::span));
    if !delay {
        if raw.max_delay.is_some() {
            errors.at(
                span,
                format!("{key}.max_delay"),
                "max_delay goes with on_limit = \"delay\"",
            );
        }
        return None;
    }
    if !bucket {
        errors.at(
            span.clone(),
            format!("{key}.on_limit"),
            "on_limit = \"delay\" holds a request until a token bucket refills: a calendar quota or a concurrency limit cannot delay",
        );
    }
    let max_delay = raw
        .max_delay
        .as_ref()
        .map_or(std::time::Duration::from_secs(1), |max_delay| {
            max_delay.get_ref().0
        });
    if max_delay.is_zero() || max_delay > std::time::Duration::from_secs(60) {
        errors.at(
            span,
            format!("{key}.max_delay"),
            "out of range: longer than zero, at most 60s (a held request holds its connection)",
        );
    }
    Some(max_delay)
}

/// `concurrency = N`: at least one slot, and none of a token bucket's or quota's settings.
pub(super) fn compile_concurrency(
    concurrency: &Spanned<i64>,
    raw: &raw::RawLimit,
    key: &str,
    errors: &mut Errors<'_>,
) -> u32 {
    let span = Some(concurrency.span());
    let slots = u32::try_from(*concurrency.get_ref())
        .ok()
        .filter(|slots| (1..=1_000_000).contains(slots));
    if slots.is_none() {
        errors.at(
            span.clone(),
            format!("{key}.concurrency"),
            format!(
                "{} is out of range: requests in flight at once, 1 to 1000000",
                concurrency.get_ref()
            ),
        );
    }
    let bucket = raw.capacity.is_some() || raw.rate.is_some();
    let quota = raw.quota.is_some() || raw.period.is_some();
    if bucket || quota {
        errors.at(
            span.clone(),
            key,
            "a limit has capacity and rate (a token bucket), quota and period (a calendar quota), or concurrency (requests in flight): one of them; put a second limit beside it for both",
        );
    }
    if raw.adaptive.is_some() || raw.charge_on_status.is_some() || raw.tiers.is_some() {
        errors.at(
            span.clone(),
            key,
            "a concurrency limit takes no adaptive penalty, charge_on_status or tiers: it counts requests in flight",
        );
    }
    if raw.mode == Some(crate::config::Mode::Shadow) {
        errors.at(
            span,
            key,
            "a concurrency limit has no shadow mode: it holds slots, which a request that is never refused would only fill",
        );
    }
    slots.unwrap_or(1)
}

/// `lease`: a token bucket's tokens taken from Redis `rate × lease` at a time. At most a
/// second, and a capacity of at least four leases' worth, or one replica's lease would starve
/// the others.
pub(super) fn compile_lease(
    raw: &raw::RawLimit,
    key: &str,
    (capacity, rate): (f64, crate::config::Rate),
    delay: bool,
    errors: &mut Errors<'_>,
) -> Option<std::time::Duration> {
    let lease = raw.lease.as_ref()?;
    let (span, duration) = (Some(lease.span()), lease.get_ref().0);
    let field = format!("{key}.lease");
    if duration.is_zero() || duration > std::time::Duration::from_secs(1) {
        errors.at(
            span.clone(),
            &field,
            "out of range: longer than zero, at most 1s (a replica holds a lease's tokens that long)",
        );
    }
    let bucket = raw.quota.is_none() && raw.period.is_none() && raw.concurrency.is_none();
    if !bucket || delay || raw.adaptive.is_some() || raw.tiers.is_some() {
        errors.at(
            span.clone(),
            &field,
            "a lease is for a plain token bucket: not with a calendar quota, a concurrency limit, on_limit = \"delay\", an adaptive penalty or tiers",
        );
    }
    if raw.ban.is_some() {
        errors.at(
            span.clone(),
            &field,
            "not with a ban: a leased bucket refuses from one replica's lease, where the refusals that lead to a ban cannot be counted for every replica; remove the lease or the ban",
        );
    }
    let per_lease = rate.per_second() * duration.as_secs_f64();
    if bucket && capacity < per_lease * 4.0 {
        errors.at(
            span,
            field,
            format!(
                "capacity {capacity} is smaller than four leases' worth (rate × lease × 4 = {}): one replica's lease would starve the others; shorten the lease or raise the capacity",
                per_lease * 4.0
            ),
        );
    }
    Some(duration)
}

/// `[limits.NAME.ban]`: at least one refusal, windows and bans of some length; never on a
/// concurrency limit (its refusals are slots in use, not a key misbehaving).
pub(super) fn compile_ban(
    raw: &raw::RawLimit,
    key: &str,
    concurrency: bool,
    errors: &mut Errors<'_>,
) -> Option<crate::limit::ban::Ban> {
    let ban = raw.ban.as_ref()?;
    let key = format!("{key}.ban");
    if concurrency {
        errors.at(
            Some(ban.span()),
            key.clone(),
            "a ban counts a bucket's refusals: a concurrency limit takes none",
        );
    }
    let ban = ban.get_ref();
    let after = u32::try_from(*ban.after.get_ref())
        .ok()
        .filter(|after| (1..=1_000_000).contains(after));
    if after.is_none() {
        errors.at(
            Some(ban.after.span()),
            format!("{key}.after"),
            "after is a number of refusals, from 1 to 1000000",
        );
    }
    for (name, duration) in [("within", &ban.within), ("duration", &ban.duration)] {
        if duration.get_ref().0.is_zero() {
            errors.at(
                Some(duration.span()),
                format!("{key}.{name}"),
                format!("{name} must be longer than 0s"),
            );
        }
    }
    Some(crate::limit::ban::Ban {
        after: after?,
        within: ban.within.get_ref().0,
        duration: ban.duration.get_ref().0,
    })
}
