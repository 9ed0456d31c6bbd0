//! Envoy's rate limit service as tollgate reads it (pure): which `[[decision.descriptors]]`
//! rule a descriptor matches, the bucket key its values make, and how a limit is described
//! back to Envoy (`current_limit`). The gRPC exchange itself is `rls.rs`.

use std::net::IpAddr;

use crate::config::{DescriptorRule, KeySource, Limit};
use crate::key::{self, KeyHasher, ValuesError};
use crate::limit::calendar::Period;
use crate::limit::{KeyPart, KeyParts};

/// The descriptor entry Envoy fills with the client's address.
pub const REMOTE_ADDRESS: &str = "remote_address";

/// The rule a descriptor of `domain` with these `(key, value)` entries matches: same domain,
/// the rule's keys in the rule's order and no others, equal values where the rule fixes one.
/// Of two rules that match, the one that fixes more values wins (then the first written).
pub fn matching_rule<'r, 'e>(
    rules: impl IntoIterator<Item = &'r DescriptorRule>,
    domain: &str,
    entries: &[(&'e str, &'e str)],
) -> Option<(usize, &'r DescriptorRule)> {
    let mut best: Option<(usize, &DescriptorRule, usize)> = None;
    for (index, rule) in rules.into_iter().enumerate() {
        let matches = rule.domain == domain
            && rule.entries.len() == entries.len()
            && rule
                .entries
                .iter()
                .zip(entries)
                .all(|(wanted, (key, value))| {
                    wanted.key == *key
                        && wanted.value.as_deref().is_none_or(|fixed| fixed == *value)
                });
        if !matches {
            continue;
        }
        let fixed = rule
            .entries
            .iter()
            .filter(|entry| entry.value.is_some())
            .count();
        if best.is_none_or(|(_, _, most)| fixed > most) {
            best = Some((index, rule, fixed));
        }
    }
    best.map(|(index, rule, _)| (index, rule))
}

/// A descriptor whose values cannot key its rule's limit, named by its entries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("descriptor {descriptor}: {error}")]
pub struct DescriptorError {
    /// The entries as `(key=value, …)`, each value cut to 64 characters.
    pub descriptor: String,
    pub error: ValuesError,
}

/// The bucket key a matched descriptor makes from its variable entries' values. With as many
/// values as the limit's key has parts, each is read as that part would be (a
/// `client_network` part masks an address by the limit's prefixes), so the proxy listener's
/// requests and Envoy's descriptors share buckets; otherwise each value is hashed, and a
/// `remote_address` value of a limit keyed by `client_network` is masked.
pub fn key_parts(
    rule: &DescriptorRule,
    entries: &[(&str, &str)],
    hasher: &KeyHasher,
) -> Result<KeyParts, DescriptorError> {
    let variable: Vec<(&str, &str)> = rule
        .entries
        .iter()
        .zip(entries)
        .filter(|(wanted, _)| wanted.value.is_none())
        .map(|(_, entry)| *entry)
        .collect();
    let limit = &rule.limit;
    let named = |error| DescriptorError {
        descriptor: describe(entries),
        error,
    };
    if variable.len() == limit.key.len() {
        let values: Vec<&str> = variable.iter().map(|(_, value)| *value).collect();
        return key::parts_of_values(limit, &values, hasher).map_err(named);
    }
    let masks = limit.key.contains(&KeySource::ClientNetwork);
    variable
        .iter()
        .map(|(key, value)| {
            if masks && *key == REMOTE_ADDRESS {
                network(limit, value).map_err(named)
            } else {
                Ok(KeyPart::Digest(hasher.digest(value.as_bytes())))
            }
        })
        .collect()
}

fn network(limit: &Limit, value: &str) -> Result<KeyPart, ValuesError> {
    let address: IpAddr = value
        .trim()
        .parse()
        .map_err(|_| ValuesError::Address(value.to_owned()))?;
    Ok(KeyPart::Network(key::client_network(
        address.to_canonical(),
        limit.ipv4_prefix,
        limit.ipv6_prefix,
    )))
}

fn describe(entries: &[(&str, &str)]) -> String {
    let text: Vec<String> = entries
        .iter()
        .map(|(key, value)| format!("{key}={}", value.chars().take(64).collect::<String>()))
        .collect();
    format!("({})", text.join(", "))
}

/// Envoy's units of `current_limit`, as `RateLimit.Unit` numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Second = 1,
    Minute = 2,
    Hour = 3,
    Day = 4,
    Month = 5,
    Week = 7,
}

/// A limit as Envoy's `current_limit` says it: requests per unit. A rate is given in the
/// shortest fixed-length unit in which it is a whole number (`100/min` is 100 per MINUTE, as
/// it was written), else per second rounded up; a calendar quota per its period.
pub fn current_limit(limit: &Limit) -> (u32, Unit) {
    if let Some(calendar) = &limit.calendar {
        let unit = match calendar.period {
            Period::Hour => Unit::Hour,
            Period::Day => Unit::Day,
            Period::Week => Unit::Week,
            Period::Month => Unit::Month,
        };
        return (saturating_u32(limit.capacity.floor()), unit);
    }
    rate_per_unit(limit.rate.per_second())
}

/// `per_second` in the shortest unit in which it is whole (within rounding of the division
/// that made it).
pub fn rate_per_unit(per_second: f64) -> (u32, Unit) {
    const UNITS: [(Unit, f64); 5] = [
        (Unit::Second, 1.0),
        (Unit::Minute, 60.0),
        (Unit::Hour, 3600.0),
        (Unit::Day, 86_400.0),
        (Unit::Week, 604_800.0),
    ];
    for (unit, seconds) in UNITS {
        let count = per_second * seconds;
        let whole = count.round();
        if whole >= 1.0 && (count - whole).abs() <= 1e-6 * whole.max(1.0) {
            return (saturating_u32(whole), unit);
        }
    }
    (saturating_u32(per_second.ceil()), Unit::Second)
}

/// A count as protobuf's `uint32` holds it: NaN and below zero as 0, too large as the largest.
pub fn saturating_u32(value: f64) -> u32 {
    if value >= f64::from(u32::MAX) {
        u32::MAX
    } else if value > 0.0 {
        value as u32
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::policy;

    const POLICY: &str = "[upstreams.app]\nurl = \"http://127.0.0.1:1\"\n[limits.per_network]\nkey = \"client_network\"\ncapacity = 10\nrate = \"10/s\"\n[limits.per_account]\nkey = { header = \"x-user\" }\ncapacity = 5\nrate = \"100/min\"\n[limits.daily]\nkey = \"global\"\nquota = 1000\nperiod = \"day\"\n[[routes]]\nname = \"all\"\npath_prefix = \"/\"\nupstream = \"app\"\nlimits = [\"per_network\", \"per_account\", \"daily\"]\n[decision]\n[[decision.descriptors]]\ndomain = \"edge\"\nentries = [\"remote_address\"]\nlimit = \"per_network\"\n[[decision.descriptors]]\ndomain = \"edge\"\nentries = [{ key = \"generic_key\", value = \"login\" }, \"header_match_email\"]\nlimit = \"per_account\"\n[[decision.descriptors]]\ndomain = \"edge\"\nentries = [\"generic_key\", \"header_match_email\"]\nlimit = \"per_network\"\n[[decision.descriptors]]\ndomain = \"edge\"\nentries = [\"generic_key\", \"remote_address\"]\nlimit = \"per_network\"\n";

    fn rules() -> Vec<DescriptorRule> {
        policy(POLICY).decision.unwrap().descriptors
    }

    #[test]
    fn a_descriptor_matches_a_rule_by_domain_keys_in_order_and_fixed_values() {
        let rules = rules();
        let found = |domain: &str, entries: &[(&str, &str)]| {
            matching_rule(&rules, domain, entries).map(|(index, _)| index)
        };
        assert_eq!(found("edge", &[("remote_address", "1.2.3.4")]), Some(0));
        assert_eq!(found("other", &[("remote_address", "1.2.3.4")]), None);
        // The fixed value is more specific than the rule that takes any value.
        let login = [("generic_key", "login"), ("header_match_email", "a@b")];
        assert_eq!(found("edge", &login), Some(1));
        let signup = [("generic_key", "signup"), ("header_match_email", "a@b")];
        assert_eq!(found("edge", &signup), Some(2));
        // Keys out of order, too many or too few entries: no rule.
        assert_eq!(
            found(
                "edge",
                &[("header_match_email", "a"), ("generic_key", "login")]
            ),
            None
        );
        assert_eq!(
            found(
                "edge",
                &[("remote_address", "1.2.3.4"), ("x", "y"), ("z", "w")]
            ),
            None
        );
        assert_eq!(found("edge", &[]), None);
    }

    #[test]
    fn a_client_network_limit_masks_remote_addresses_by_its_prefixes() {
        let rules = rules();
        let hasher = KeyHasher::from_secret(b"test");
        let parts =
            |rule: usize, entries: &[(&str, &str)]| key_parts(&rules[rule], entries, &hasher);
        let one = parts(0, &[("remote_address", "2001:db8:1:2::1")]).unwrap();
        let neighbour = parts(0, &[("remote_address", "2001:db8:1:2:ffff::9")]).unwrap();
        let other = parts(0, &[("remote_address", "2001:db8:1:3::1")]).unwrap();
        assert_eq!(one, neighbour, "one /64, one bucket");
        assert_ne!(one, other);
        assert_eq!(
            one[0],
            KeyPart::Network("2001:db8:1:2::/64".parse().unwrap())
        );
        let error = parts(0, &[("remote_address", "not-an-address")]).unwrap_err();
        assert_eq!(
            error.error,
            ValuesError::Address("not-an-address".to_owned())
        );
        assert!(error.to_string().contains("not an IP address"), "{error}");
        // Two variable entries on a one-part limit: hashed, the address masked.
        let mixed = parts(
            3,
            &[("generic_key", "x"), ("remote_address", "198.51.100.77")],
        )
        .unwrap();
        assert_eq!(mixed.len(), 2);
        assert!(
            matches!(mixed[1], KeyPart::Network(network) if network.to_string().ends_with("/32") || network.prefix_len() <= 32)
        );
        assert!(parts(3, &[("generic_key", "x"), ("remote_address", "nope")]).is_err());
    }

    #[test]
    fn a_header_keyed_limit_keys_a_descriptor_as_it_keys_the_header() {
        let rules = rules();
        let hasher = KeyHasher::from_secret(b"test");
        let limit = &rules[1].limit;
        let from_descriptor = key_parts(
            &rules[1],
            &[
                ("generic_key", "login"),
                ("header_match_email", "a@b.example"),
            ],
            &hasher,
        )
        .unwrap();
        assert_eq!(
            from_descriptor,
            key::parts_of_values(limit, &["a@b.example"], &hasher).unwrap()
        );
    }

    #[test]
    fn a_rate_is_told_in_the_shortest_unit_it_is_whole_in() {
        assert_eq!(rate_per_unit(10.0), (10, Unit::Second));
        assert_eq!(rate_per_unit(100.0 / 60.0), (100, Unit::Minute));
        assert_eq!(rate_per_unit(5.0 / 3600.0), (5, Unit::Hour));
        assert_eq!(rate_per_unit(1000.0 / 86_400.0), (1000, Unit::Day));
        assert_eq!(rate_per_unit(3.0 / 604_800.0), (3, Unit::Week));
        assert_eq!(rate_per_unit(0.5), (30, Unit::Minute));
        // Not whole in any unit: per second, rounded up.
        assert_eq!(rate_per_unit(1.0 / 1_000_000.0), (1, Unit::Second));
        let limits = policy(POLICY).limits;
        let named = |name: &str| {
            limits
                .iter()
                .find(|limit| &*limit.name == name)
                .unwrap()
                .clone()
        };
        assert_eq!(current_limit(&named("per_account")), (100, Unit::Minute));
        assert_eq!(current_limit(&named("daily")), (1000, Unit::Day));
    }
}
