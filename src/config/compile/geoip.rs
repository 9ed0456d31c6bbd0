//! `[geoip]` and what limits ask of it: the databases opened (a file that is missing or not a
//! MaxMind DB is an error naming it), each limit's `exempt_asns` and `exempt_countries`, and
//! a key or exemption that needs a database not configured.

use std::path::Path;
use std::sync::Arc;

use toml::Spanned;

use super::{resolve, Errors};
use crate::config::raw::{self, RawAsn};
use crate::config::{KeySource, Limit};
use crate::geoip::{self, Country, GeoIp, Kind};

/// The databases `[geoip]` names, opened, and warnings about them.
pub(super) fn compile_geoip(
    raw: Spanned<raw::RawGeoIp>,
    base: Option<&Path>,
    errors: &mut Errors<'_>,
) -> (Option<Arc<GeoIp>>, Vec<String>) {
    let span = raw.span();
    let raw = raw.into_inner();
    if raw.asn_db.is_none() && raw.country_db.is_none() {
        errors.at(
            Some(span),
            "geoip",
            "[geoip] names no database: set asn_db, country_db or both",
        );
        return (None, Vec::new());
    }
    let path = |file: &Option<Spanned<String>>| file.as_ref().map(|f| resolve(base, f.get_ref()));
    let (asn_db, country_db) = (path(&raw.asn_db), path(&raw.country_db));
    match GeoIp::open(asn_db.as_deref(), country_db.as_deref()) {
        Ok((geoip, warnings)) => (Some(Arc::new(geoip)), warnings),
        Err(error) => {
            let file = match error.kind {
                Kind::Asn => &raw.asn_db,
                Kind::Country => &raw.country_db,
            };
            errors.at(
                file.as_ref().map(Spanned::span),
                format!("geoip.{}", error.kind.setting()),
                error.to_string(),
            );
            (None, Vec::new())
        }
    }
}

/// A limit's `exempt_asns` and `exempt_countries`.
pub(super) fn compile_exemptions(
    asns: Option<&Spanned<Vec<RawAsn>>>,
    countries: Option<&Spanned<Vec<String>>>,
    key: &str,
    errors: &mut Errors<'_>,
) -> (Vec<u32>, Vec<Country>) {
    let mut exempt_asns = Vec::new();
    for entry in asns
        .map(|asns| asns.get_ref().as_slice())
        .unwrap_or_default()
    {
        let asn = match entry {
            RawAsn::Number(number) => u32::try_from(*number).ok(),
            RawAsn::Text(text) => geoip::parse_asn(text),
        };
        match asn {
            Some(asn) => exempt_asns.push(asn),
            None => errors.at(
                asns.map(Spanned::span),
                format!("{key}.exempt_asns"),
                format!("{entry:?} is not an autonomous system number: write 15169 or \"AS15169\""),
            ),
        }
    }
    let mut exempt_countries = Vec::new();
    for code in countries
        .map(|countries| countries.get_ref().as_slice())
        .unwrap_or_default()
    {
        match Country::parse(code) {
            Some(country) => exempt_countries.push(country),
            None => errors.at(
                countries.map(Spanned::span),
                format!("{key}.exempt_countries"),
                format!("{code:?} is not a country code: write two letters, ISO 3166 alpha-2, such as \"DE\""),
            ),
        }
    }
    (exempt_asns, exempt_countries)
}

/// A limit keyed by, or exempting, what a database not configured would say.
pub(super) fn check_databases(
    limits: &[Arc<Limit>],
    geoip: Option<&GeoIp>,
    errors: &mut Errors<'_>,
) {
    let has = |kind| geoip.is_some_and(|geoip| geoip.has(kind));
    for limit in limits {
        for (kind, keyed, exempts, setting) in [
            (
                Kind::Asn,
                limit.key.contains(&KeySource::ClientAsn),
                !limit.exempt_asns.is_empty(),
                "exempt_asns",
            ),
            (
                Kind::Country,
                limit.key.contains(&KeySource::ClientCountry),
                !limit.exempt_countries.is_empty(),
                "exempt_countries",
            ),
        ] {
            if has(kind) {
                continue;
            }
            let needs = |what: &str| {
                format!(
                    "{what} needs [geoip] {}, a MaxMind DB file ({}): configure it",
                    kind.setting(),
                    match kind {
                        Kind::Asn => "GeoLite2-ASN.mmdb",
                        Kind::Country => "GeoLite2-Country.mmdb",
                    }
                )
            };
            if keyed {
                let what = match kind {
                    Kind::Asn => "key \"client_asn\"",
                    Kind::Country => "key \"client_country\"",
                };
                errors.at(None, format!("limits.{}.key", limit.name), needs(what));
            }
            if exempts {
                errors.at(
                    None,
                    format!("limits.{}.{setting}", limit.name),
                    needs(setting),
                );
            }
        }
    }
}
