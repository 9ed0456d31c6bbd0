//! `[limits.NAME]` and `[overload]`: buckets, their keys, adaptive penalties, charges by
//! status, and the factor that shrinks every rate while the upstream struggles.

use std::ops::Range;
use std::sync::Arc;

use toml::Spanned;

use super::server::{networks, prefix_length};
use super::shaping::{compile_ban, compile_concurrency, compile_delay, compile_lease};
use super::tiers::{compile_amount, compile_tier_source, compile_tiers, NEEDS_JWT};
use super::{penalties, Errors};
use crate::config::raw::{self, RawKey};
use crate::config::{ClientIpSettings, KeySource, Limit, Rate};

pub(super) fn compile_limit(
    name: String,
    raw: Spanned<raw::RawLimit>,
    client_ip: &ClientIpSettings,
    (jwt_configured, base): (bool, Option<&std::path::Path>),
    errors: &mut Errors<'_>,
) -> Option<Limit> {
    let key = format!("limits.{name}");
    let span = raw.span();
    let mut raw = raw.into_inner();
    let jwt = jwt_configured;
    let refusal = raw
        .refusal
        .take()
        .and_then(|refusal| super::refusal::compile_refusal(refusal, &key, base, errors))
        .map(Arc::new);
    check_name(&name, &key, span.clone(), errors);
    let Counted {
        concurrency,
        max_delay,
        capacity,
        rate,
        calendar,
    } = compile_counted(&raw, &key, span.clone(), errors)?;
    let ban = compile_ban(&raw, &key, concurrency.is_some(), errors);
    let lease = compile_lease(&raw, &key, (capacity, rate), max_delay.is_some(), errors);
    let quota = calendar.is_some();
    let (adaptive, charge_on_status) =
        penalties::compile_penalties(&mut raw, &key, (capacity, quota), span.clone(), errors);
    let carried = super::carried::compile_carried(&raw, &key, jwt, errors);
    if carried.is_some() && (raw.tier.is_some() || raw.tiers.is_some()) {
        errors.at(
            Some(span.clone()),
            format!("{key}.tier"),
            "a limit whose numbers the request carries takes no tiers: the request's numbers are its plan",
        );
    }
    let key_sources = compile_key_sources(&raw.key, &key, jwt, errors);
    let amount = (capacity, rate, calendar.is_some());
    let (tier, tiers) = compile_tiering(&mut raw, &key, span.clone(), amount, jwt, errors);
    let prefixes = (raw.ipv4_prefix.as_ref(), raw.ipv6_prefix.as_ref());
    let (exempt, ipv4_prefix, ipv6_prefix) =
        compile_networks(raw.exempt.as_ref(), prefixes, &key, client_ip, errors);
    let (exempt_asns, exempt_countries) = super::geoip::compile_exemptions(
        raw.exempt_asns.as_ref(),
        raw.exempt_countries.as_ref(),
        &key,
        errors,
    );
    let normalize = raw.normalize.unwrap_or_default();
    let mut limit = Limit {
        name: Arc::from(name.as_str()),
        key: key_sources,
        normalize,
        missing: raw.missing.unwrap_or_default(),
        capacity,
        rate,
        mode: raw.mode.unwrap_or_default(),
        exempt,
        exempt_asns,
        exempt_countries,
        ipv4_prefix,
        ipv6_prefix,
        fingerprint: 0,
        adaptive,
        charge_on_status,
        tier,
        tiers,
        calendar,
        concurrency,
        max_delay,
        lease,
        ban,
        refusal,
        carried,
    };
    limit.fingerprint = definition_fingerprint(&limit);
    Some(limit)
}

/// What tells one definition of a limit from another, so that a redefined limit starts
/// fresh buckets. Neither the delay nor the lease is part of it: changing them keeps the
/// buckets.
fn definition_fingerprint(limit: &Limit) -> u64 {
    let calendar = limit
        .calendar
        .as_ref()
        .map(|calendar| format!("{} {}", calendar.period.as_str(), calendar.zone_name));
    fingerprint(&[
        &format!("{:?}", limit.key),
        &format!("{:?}", limit.tiers),
        &calendar.unwrap_or_default(),
        &format!("{:?}", limit.normalize),
        &limit.capacity.to_bits().to_string(),
        &limit.rate.per_second().to_bits().to_string(),
        &limit.ipv4_prefix.to_string(),
        &limit.ipv6_prefix.to_string(),
        &format!("{:?}", limit.concurrency),
    ])
}

/// What a limit counts: slots (`concurrency`, with the capacity and rate the headers speak
/// of), or tokens of a bucket or a calendar quota; and how long a request may wait for them.
struct Counted {
    concurrency: Option<u32>,
    max_delay: Option<std::time::Duration>,
    capacity: f64,
    rate: Rate,
    calendar: Option<crate::limit::calendar::Calendar>,
}

fn compile_counted(
    raw: &raw::RawLimit,
    key: &str,
    span: Range<usize>,
    errors: &mut Errors<'_>,
) -> Option<Counted> {
    let concurrency = raw
        .concurrency
        .as_ref()
        .map(|concurrency| compile_concurrency(concurrency, raw, key, errors));
    let delays = concurrency.is_none() && raw.quota.is_none();
    let max_delay = compile_delay(raw, key, delays, errors);
    let (capacity, rate, calendar) = match concurrency {
        // A slot held is one token of a bucket that refills at once when it is given back:
        // the headers speak of it as of a bucket of `concurrency` tokens a second.
        Some(slots) => (
            f64::from(slots),
            Rate {
                tokens: f64::from(slots),
                period: std::time::Duration::from_secs(1),
            },
            None,
        ),
        None => compile_amount(raw, key, span, errors)?,
    };
    Some(Counted {
        concurrency,
        max_delay,
        capacity,
        rate,
        calendar,
    })
}

/// Where a request's tier comes from, and each tier's numbers: the two go together.
fn compile_tiering(
    raw: &mut raw::RawLimit,
    key: &str,
    span: Range<usize>,
    amount: (f64, Rate, bool),
    jwt_configured: bool,
    errors: &mut Errors<'_>,
) -> (
    Option<crate::config::TierSource>,
    Vec<(String, crate::config::Tier)>,
) {
    let trust_header = raw.trust_header;
    let tier = raw
        .tier
        .take()
        .map(|tier| compile_tier_source(tier, key, trust_header, jwt_configured, errors));
    let tiers = raw
        .tiers
        .take()
        .map(|tiers| compile_tiers(tiers, key, amount, errors))
        .unwrap_or_default();
    if tier.is_some() == tiers.is_empty() {
        errors.at(
            Some(span),
            format!("{key}.tiers"),
            "tier (where a request's tier comes from) and [limits.NAME.tiers] (the numbers of each tier) go together",
        );
    }
    (tier.flatten(), tiers)
}

/// What a limit is keyed by: its sources in order (`global` is none), each one that needs a
/// verified token only where `[auth.jwt]` is configured.
pub(super) fn compile_key_sources(
    raw_key: &Spanned<RawKey>,
    key: &str,
    jwt_configured: bool,
    errors: &mut Errors<'_>,
) -> Vec<KeySource> {
    let sources = match raw_key.get_ref() {
        RawKey::One(source) => vec![source.clone()],
        RawKey::Composite(sources) => sources.clone(),
    };
    if sources.len() > 1 && sources.contains(&KeySource::Global) {
        errors.at(
            Some(raw_key.span()),
            format!("{key}.key"),
            "\"global\" cannot be part of a composite key: it is one bucket for everyone",
        );
    }
    let key_sources: Vec<KeySource> = sources
        .into_iter()
        .filter(|source| *source != KeySource::Global)
        .collect();
    if !jwt_configured
        && key_sources
            .iter()
            .any(|source| matches!(source, KeySource::JwtClaim(_)))
    {
        errors.at(Some(raw_key.span()), format!("{key}.key"), NEEDS_JWT);
    }
    key_sources
}

/// The client networks a limit exempts, and how it groups addresses (its own prefixes, else
/// `[client_ip]`'s).
pub(super) fn compile_networks(
    exempt: Option<&Spanned<Vec<String>>>,
    (ipv4_prefix, ipv6_prefix): (Option<&Spanned<i64>>, Option<&Spanned<i64>>),
    key: &str,
    client_ip: &ClientIpSettings,
    errors: &mut Errors<'_>,
) -> (Vec<ipnet::IpNet>, u8, u8) {
    let exempt = exempt
        .map(|exempt| {
            networks(
                exempt.get_ref(),
                &format!("{key}.exempt"),
                exempt.span(),
                errors,
            )
        })
        .unwrap_or_default();
    let ipv4_prefix = prefix_length(
        ipv4_prefix,
        32,
        client_ip.ipv4_prefix,
        &format!("{key}.ipv4_prefix"),
        errors,
    );
    let ipv6_prefix = prefix_length(
        ipv6_prefix,
        128,
        client_ip.ipv6_prefix,
        &format!("{key}.ipv6_prefix"),
        errors,
    );
    (exempt, ipv4_prefix, ipv6_prefix)
}

fn fingerprint(parts: &[&str]) -> u64 {
    let mut hasher = blake3::Hasher::new();
    for part in parts {
        hasher.update(part.as_bytes());
        hasher.update(&[0]);
    }
    let digest = hasher.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest.as_bytes()[..8]);
    u64::from_le_bytes(first)
}

fn check_name(name: &str, key: &str, span: Range<usize>, errors: &mut Errors<'_>) {
    if !valid_name(name) {
        errors.at(
            Some(span),
            key,
            format!("invalid limit name {name:?}: use letters, digits, '_', '-' and '.'"),
        );
    }
}

pub(super) fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|byte| byte.is_ascii_alphanumeric() || matches!(byte, b'_' | b'-' | b'.'))
}

#[cfg(test)]
mod tests {
    use super::super::testing::{error, errors, policy};
    use crate::config::{KeySource, Mode, Tier, TierSource};

    #[test]
    fn a_limit_is_compiled_with_its_key_and_prefixes() {
        let policy = policy(
            "[client_ip]\nipv6_prefix = 48\n[limits.login]\nkey = [\"client_network\", { header = \"x-user\" }]\ncapacity = 5\nrate = \"1/min\"\nmode = \"shadow\"\n",
        );
        let limit = policy.limit("login").unwrap();
        assert_eq!(limit.capacity, 5.0);
        assert!((limit.rate.per_second() - 1.0 / 60.0).abs() < 1e-12);
        assert_eq!(limit.mode, Mode::Shadow);
        assert_eq!(limit.key.len(), 2);
        assert!(matches!(limit.key[0], KeySource::ClientNetwork));
        assert_eq!(
            (limit.ipv4_prefix, limit.ipv6_prefix),
            (32, 48),
            "the client_ip defaults"
        );
        assert!((limit.refill_seconds() - 300.0).abs() < 1e-9);
    }

    #[test]
    fn a_changed_definition_changes_the_fingerprint_and_a_renamed_mode_does_not() {
        let fingerprint = |text: &str| policy(text).limit("a").unwrap().fingerprint;
        let base = "[limits.a]\nkey = \"global\"\ncapacity = 5\nrate = \"1/s\"\n";
        assert_eq!(fingerprint(base), fingerprint(base));
        assert_ne!(fingerprint(base), fingerprint(&base.replace("5", "6")));
        assert_ne!(fingerprint(base), fingerprint(&base.replace("1/s", "2/s")));
        assert_eq!(
            fingerprint(base),
            fingerprint(&format!("{base}mode = \"shadow\"\n")),
            "shadow and enforce share the bucket: switching keeps its state"
        );
    }

    #[test]
    fn bad_limits_name_the_key_that_is_wrong() {
        let limit = |extra: &str| {
            format!("[limits.a]\nkey = \"global\"\ncapacity = 5\nrate = \"1/s\"\n{extra}")
        };
        assert_eq!(
            error(&limit("").replace("capacity = 5", "capacity = 0")).0,
            "limits.a.capacity"
        );
        assert_eq!(
            error("[limits.a]\nkey = [\"global\", \"client_network\"]\ncapacity = 5\nrate = \"1/s\"\n").0,
            "limits.a.key"
        );
        assert_eq!(
            error(&limit("ipv6_prefix = 129\n")).0,
            "limits.a.ipv6_prefix"
        );
        assert_eq!(error(&limit("exempt = [\"nope\"]\n")).0, "limits.a.exempt");
        assert_eq!(
            error(&limit("[limits.a.charge_on_status]\n99 = 1\n")).0,
            "limits.a.charge_on_status"
        );
        let adaptive = errors(&limit(
            "[limits.a.adaptive]\non_status = [401]\nthreshold = 0\nwindow = \"1m\"\nfactor = 2.0\nhold = \"10m\"\n",
        ));
        let keys: Vec<&str> = adaptive.iter().map(|(key, _)| key.as_str()).collect();
        assert!(keys.contains(&"limits.a.adaptive.threshold"), "{keys:?}");
        assert!(keys.contains(&"limits.a.adaptive.factor"), "{keys:?}");
    }

    #[test]
    fn numbers_beyond_what_the_bucket_math_holds_are_refused() {
        let limit = |capacity: &str, rate: &str| {
            format!("[limits.a]\nkey = \"global\"\ncapacity = {capacity}\nrate = \"{rate}\"\n")
        };
        assert_eq!(error(&limit("1e308", "1/s")).0, "limits.a.capacity");
        assert_eq!(
            error(&limit("1e16", "1000000000000000/s")).0,
            "limits.a.capacity"
        );
        assert_eq!(error(&limit("5", "1e-300/s")).0, "limits.a.rate");
        assert_eq!(error(&limit("5", "1/1ns")).0, "limits.a.rate");
        assert_eq!(error(&limit("5", "1e300/s")).0, "limits.a.rate");
        assert!(error(&limit("5", "5/sec")).1.contains("s, min, h or d"));
        // The largest exact numbers, and the benchmark's never-refusing limit, still compile.
        policy(&limit("9007199254740992", "9007199254740992/s"));
        policy(&limit("1000000000000", "1000000000/s"));
        policy(&limit("10", "1/d"));
    }

    #[test]
    fn tiers_inherit_what_they_leave_out_and_header_tiers_need_trust() {
        let base = "[limits.a]\nkey = { header = \"x-key\" }\ncapacity = 5\nrate = \"1/s\"\n";
        let policy = policy(&format!(
            "{base}tier = {{ header = \"x-plan\" }}\ntrust_header = true\n[limits.a.tiers]\npro = {{ capacity = 50 }}\nfree = {{ rate = \"1/min\" }}\nstaff = \"exempt\"\n"
        ));
        let limit = policy.limit("a").unwrap();
        assert_eq!(
            limit.tier,
            Some(TierSource::Header("x-plan".parse().unwrap()))
        );
        let tier = |name: &str| limit.tiers.iter().find(|(tier, _)| tier == name).unwrap().1;
        assert_eq!(
            tier("pro"),
            Tier::Bucket {
                capacity: 50.0,
                rate: limit.rate
            }
        );
        match tier("free") {
            Tier::Bucket { capacity, rate } => {
                assert_eq!(capacity, 5.0);
                assert!((rate.per_second() - 1.0 / 60.0).abs() < 1e-12);
            }
            Tier::Exempt => panic!("free is a bucket"),
        }
        assert_eq!(tier("staff"), Tier::Exempt);
        assert!(
            policy
                .warnings
                .iter()
                .any(|warning| warning.contains("picks its own tier")),
            "{:?}",
            policy.warnings
        );
        let untrusted = error(&format!(
            "{base}tier = {{ header = \"x-plan\" }}\n[limits.a.tiers]\npro = {{ capacity = 50 }}\n"
        ));
        assert_eq!(untrusted.0, "limits.a.tier");
        assert!(untrusted.1.contains("trust_header"), "{}", untrusted.1);
        assert_eq!(
            error(&format!(
                "{base}[limits.a.tiers]\npro = {{ capacity = 50 }}\n"
            ))
            .0,
            "limits.a.tiers",
            "tiers without a source"
        );
        assert_eq!(
            error(&format!(
                "{base}tier = {{ header = \"x-plan\" }}\ntrust_header = true\n[limits.a.tiers]\npro = {{ capacity = 0 }}\n"
            ))
            .0,
            "limits.a.tiers.pro.capacity"
        );
        let unknown = errors(&format!(
            "{base}tier = {{ header = \"x-plan\" }}\ntrust_header = true\n[limits.a.tiers]\npro = \"unlimited\"\n"
        ));
        assert!(unknown[0].1.contains("exempt"), "{unknown:?}");
    }

    #[test]
    fn a_quota_is_a_quota_and_a_period_in_a_zone_and_nothing_else() {
        let limit = |body: &str| format!("[limits.q]\nkey = \"global\"\n{body}");
        let policy = policy(&limit(
            "quota = 1000\nperiod = \"month\"\ntimezone = \"Europe/Rome\"\ntier = { header = \"x-plan\" }\ntrust_header = true\n[limits.q.tiers]\npro = { quota = 100000 }\n",
        ));
        let quota = policy.limit("q").unwrap();
        let calendar = quota.calendar.as_ref().expect("a calendar");
        assert_eq!(
            (calendar.period.as_str(), calendar.zone_name.as_str()),
            ("month", "Europe/Rome")
        );
        assert_eq!(quota.capacity, 1000.0);
        assert!(matches!(quota.tiers[0].1, Tier::Bucket { capacity, .. } if capacity == 100000.0));
        let key = |text: &str| error(&limit(text)).0;
        assert_eq!(key("quota = 10\n"), "limits.q");
        assert_eq!(
            key("quota = 10\nperiod = \"day\"\ncapacity = 5\nrate = \"1/s\"\n"),
            "limits.q"
        );
        assert_eq!(key("quota = 0\nperiod = \"day\"\n"), "limits.q.quota");
        assert_eq!(
            key("quota = 10\nperiod = \"day\"\ntimezone = \"Mars/Base\"\n"),
            "limits.q.timezone"
        );
        assert_eq!(
            key("capacity = 5\nrate = \"1/s\"\ntimezone = \"UTC\"\n"),
            "limits.q.timezone"
        );
        assert!(error(&limit("quota = 10\nperiod = \"fortnight\"\n"))
            .1
            .contains("fortnight"));
        assert_eq!(
            key("quota = 10\nperiod = \"day\"\n[limits.q.charge_on_status]\n500 = 1\n"),
            "limits.q"
        );
        assert_eq!(
            key("quota = 10\nperiod = \"day\"\ntier = { header = \"x-plan\" }\ntrust_header = true\n[limits.q.tiers]\npro = { capacity = 5 }\n"),
            "limits.q.tiers.pro"
        );
    }

    #[test]
    fn overload_needs_a_trigger_and_a_factor_in_range() {
        let policy = policy("[overload]\nmax_inflight = 100\nfactor = 0.5\n");
        let overload = policy.overload.expect("overload");
        assert_eq!(overload.max_inflight, Some(100));
        assert_eq!(overload.factor, 0.5);
        assert_eq!(error("[overload]\nfactor = 0.5\n").0, "overload");
        assert_eq!(
            error("[overload]\nmax_inflight = 100\nfactor = 0\n").0,
            "overload.factor"
        );
    }
}
