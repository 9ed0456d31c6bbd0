//! `[scan]` compiled: its key as a limit keys it, what counts, and the ban.

use std::sync::Arc;
use std::time::Duration;

use toml::Spanned;

use super::limits::{compile_key_sources, compile_networks};
use super::Errors;
use crate::config::raw::RawScan;
use crate::config::{ClientIpSettings, Limit, Missing, Rate, Route, ScanSettings};

/// More distinct paths than this per key would make the memory per key what an attacker
/// chooses.
const MAX_DISTINCT_PATHS: i64 = 10_000;

pub(super) fn compile_scan(
    raw: Spanned<RawScan>,
    client_ip: &ClientIpSettings,
    jwt_configured: bool,
    errors: &mut Errors<'_>,
) -> Option<ScanSettings> {
    let raw = raw.into_inner();
    let sources = compile_key_sources(&raw.key, "scan", jwt_configured, errors);
    let prefixes = (raw.ipv4_prefix.as_ref(), raw.ipv6_prefix.as_ref());
    let (exempt, ipv4_prefix, ipv6_prefix) =
        compile_networks(raw.exempt.as_ref(), prefixes, "scan", client_ip, errors);
    let key = Limit::keyed_only(
        "scan",
        sources,
        raw.normalize.unwrap_or_default(),
        (exempt, ipv4_prefix, ipv6_prefix),
    );
    if key.reads_body() || key.reads_token() {
        errors.at(
            Some(raw.key.span()),
            "scan.key",
            "a scan is counted on every route, and a body field or a token's claim is read only on routes whose limits need it: key scans by client_network, client_asn, client_country, tls_ja4, a header, a cookie or a query parameter",
        );
    }
    let statuses = match &raw.statuses {
        None => vec![404],
        Some(statuses) => {
            let valid = statuses.get_ref().iter().all(|s| (100..=599).contains(s));
            if !valid || statuses.get_ref().is_empty() {
                errors.at(
                    Some(statuses.span()),
                    "scan.statuses",
                    "a list of HTTP statuses (100 to 599), such as [404] or [404, 403, 400]",
                );
            }
            statuses
                .get_ref()
                .iter()
                .map(|s| (*s).clamp(100, 599) as u16)
                .collect()
        }
    };
    let distinct_paths = match &raw.distinct_paths {
        None => 30,
        Some(paths) => {
            if !(2..=MAX_DISTINCT_PATHS).contains(paths.get_ref()) {
                errors.at(
                    Some(paths.span()),
                    "scan.distinct_paths",
                    format!("must be between 2 and {MAX_DISTINCT_PATHS}"),
                );
            }
            (*paths.get_ref()).clamp(2, MAX_DISTINCT_PATHS) as usize
        }
    };
    let within =
        positive(raw.within.as_ref(), "scan.within", errors).unwrap_or(Duration::from_secs(10));
    let ban = positive(raw.ban.as_ref(), "scan.ban", errors);
    Some(ScanSettings {
        key: Arc::new(key),
        statuses,
        distinct_paths,
        within,
        ban,
    })
}

fn positive(
    raw: Option<&Spanned<crate::config::raw::HumanDuration>>,
    key: &str,
    errors: &mut Errors<'_>,
) -> Option<Duration> {
    let raw = raw?;
    let duration = raw.get_ref().0;
    if duration.is_zero() {
        errors.at(Some(raw.span()), key, "must be longer than zero");
    }
    Some(duration)
}

/// Every route may refuse a banned key, and reads the client's origin when the key does.
pub(super) fn mark_routes(scan: &ScanSettings, routes: &mut [Route]) {
    for route in routes {
        route.scan_bans |= scan.ban.is_some();
        route.reads_origin |= scan.key.reads_origin();
    }
}

impl Limit {
    /// A limit that only keys requests (`[scan]`'s key): no bucket is ever made of it.
    fn keyed_only(
        name: &str,
        key: Vec<crate::config::KeySource>,
        normalize: crate::config::Normalize,
        (exempt, ipv4_prefix, ipv6_prefix): (Vec<ipnet::IpNet>, u8, u8),
    ) -> Limit {
        Limit {
            name: Arc::from(name),
            key,
            normalize,
            missing: Missing::Skip,
            capacity: 1.0,
            rate: Rate {
                tokens: 1.0,
                period: Duration::from_secs(1),
            },
            mode: Default::default(),
            exempt,
            exempt_asns: Vec::new(),
            exempt_countries: Vec::new(),
            ipv4_prefix,
            ipv6_prefix,
            fingerprint: 0,
            adaptive: None,
            charge_on_status: Vec::new(),
            tier: None,
            tiers: Vec::new(),
            calendar: None,
            concurrency: None,
            max_delay: None,
            lease: None,
            ban: None,
            refusal: None,
            carried: None,
        }
    }
}
