//! The numbers a request carries for a limit (`capacity = { jwt_claim = "rl.capacity", … }`):
//! read from its verified claims or a trusted header, the limit's own where it carries none
//! or one that is not a number, and never above the limit's `max`.

use std::borrow::Cow;
use std::time::Duration;

use super::{scalar_at, sent_once, RequestFacts};
use crate::config::units::{self, MAX_REFILL_SECONDS};
use crate::config::{CarriedNumbers, Limit, NumberSource, Rate, Tier};

/// The numbers this request is decided with in `limit`.
pub fn carried_tier(limit: &Limit, carried: &CarriedNumbers, facts: &RequestFacts<'_>) -> Tier {
    let read = |source: &NumberSource| text(source, facts);
    if let Some(quota) = &carried.quota {
        let quota = read(&quota.source)
            .and_then(|text| tokens(&text))
            .map_or(limit.capacity, |asked| asked.min(quota.max));
        // A quota's rate only spreads it over its nominal period, as a tier's does.
        return Tier::Bucket {
            capacity: quota,
            rate: Rate {
                tokens: quota,
                period: limit.rate.period,
            },
        };
    }
    let capacity = carried.capacity.as_ref().map_or(limit.capacity, |carried| {
        read(&carried.source)
            .and_then(|text| tokens(&text))
            .map_or(limit.capacity, |asked| asked.min(carried.max))
    });
    let rate = carried.rate.as_ref().map_or(limit.rate, |carried| {
        match read(&carried.source).and_then(|text| rate(&text)) {
            Some(asked) if asked.per_second() > carried.max.per_second() => carried.max,
            Some(asked) => asked,
            None => limit.rate,
        }
    });
    // Numbers whose empty bucket would take longer than any wait a client can use are not
    // the request's to ask for.
    if capacity / rate.per_second() > MAX_REFILL_SECONDS {
        return Tier::Bucket {
            capacity: limit.capacity,
            rate: limit.rate,
        };
    }
    Tier::Bucket { capacity, rate }
}

/// The carried value as text: a claim's scalar, or a header sent once.
fn text<'f>(source: &NumberSource, facts: &RequestFacts<'f>) -> Option<Cow<'f, str>> {
    match source {
        NumberSource::JwtClaim(path) => scalar_at(facts.claims?, path),
        NumberSource::Header(name) => {
            let value = sent_once(facts.headers, name)?.to_str().ok()?;
            Some(Cow::Borrowed(value.trim()))
        }
    }
}

/// A count of tokens: a number more than 0.
fn tokens(text: &str) -> Option<f64> {
    text.trim()
        .parse::<f64>()
        .ok()
        .filter(|tokens| tokens.is_finite() && *tokens > 0.0)
}

/// A rate in the policy's syntax (`"50/s"`), or a number of tokens per second.
fn rate(text: &str) -> Option<Rate> {
    units::parse_rate(text).ok().or_else(|| {
        tokens(text).map(|per_second| Rate {
            tokens: per_second,
            period: Duration::from_secs(1),
        })
    })
}
