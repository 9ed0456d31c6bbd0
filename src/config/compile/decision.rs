//! `[decision]`: the decision listener, who may ask it, and the descriptor rules of its gRPC
//! service; and what of a route's limits a sub-request cannot carry.

use std::net::SocketAddr;
use std::sync::Arc;

use http::StatusCode;
use ipnet::IpNet;
use toml::Spanned;

use super::Errors;
use crate::config::costs::Field;
use crate::config::raw::{self, KeySource};
use crate::config::{DecisionSettings, DescriptorEntry, DescriptorRule, Limit, Policy};

const DEFAULT_LISTEN: &str = "127.0.0.1:8081";
const DEFAULT_ALLOW: [&str; 2] = ["127.0.0.0/8", "::1/128"];

pub(super) fn compile_decision(
    raw: Spanned<raw::RawDecision>,
    limits: &[Arc<Limit>],
    errors: &mut Errors<'_>,
) -> Option<DecisionSettings> {
    let raw = raw.into_inner();
    let listen = match &raw.listen {
        Some(listen) => match listen.get_ref().parse::<SocketAddr>() {
            Ok(address) => Some(address),
            Err(_) => {
                errors.at(
                    Some(listen.span()),
                    "decision.listen",
                    format!(
                        "invalid address {:?}: expected IP:port such as \"127.0.0.1:8081\"",
                        listen.get_ref()
                    ),
                );
                None
            }
        },
        None => DEFAULT_LISTEN.parse().ok(),
    };
    let allow = match raw.allow {
        Some(allow) => {
            let span = allow.span();
            let networks: Vec<IpNet> = allow
                .into_inner()
                .iter()
                .filter_map(|text| match network(text) {
                    Some(network) => Some(network),
                    None => {
                        errors.at(Some(span.clone()), "decision.allow", format!("invalid network {text:?}: expected an address or CIDR such as \"10.0.0.0/8\" or \"::1\""));
                        None
                    }
                })
                .collect();
            if networks.is_empty() {
                errors.at(Some(span), "decision.allow", "no network may ask: list the proxies that ask for decisions, such as [\"10.0.0.0/8\"]");
            }
            networks
        }
        None => DEFAULT_ALLOW
            .iter()
            .filter_map(|text| text.parse().ok())
            .collect(),
    };
    let refuse_status = match raw.refuse_status {
        Some(status) => match u16::try_from(*status.get_ref())
            .ok()
            .filter(|code| (400..=599).contains(code))
            .and_then(|code| StatusCode::from_u16(code).ok())
        {
            Some(status) => Some(status),
            None => {
                errors.at(Some(status.span()), "decision.refuse_status", format!("{} is not a refusal: expected a status from 400 to 599, such as 429 (or 403 for nginx's auth_request)", status.get_ref()));
                None
            }
        },
        None => None,
    };
    let mut descriptors: Vec<DescriptorRule> = Vec::with_capacity(raw.descriptors.len());
    for (index, rule) in raw.descriptors.into_iter().enumerate() {
        if let Some(rule) = compile_rule(index, rule, limits, &descriptors, errors) {
            descriptors.push(rule);
        }
    }
    Some(DecisionSettings {
        listen: listen?,
        allow,
        refuse_status,
        descriptors,
    })
}

/// An address is a network of one.
fn network(text: &str) -> Option<IpNet> {
    text.parse::<IpNet>()
        .ok()
        .or_else(|| text.parse::<std::net::IpAddr>().ok().map(IpNet::from))
}

fn compile_rule(
    index: usize,
    rule: Spanned<raw::RawDescriptorRule>,
    limits: &[Arc<Limit>],
    earlier: &[DescriptorRule],
    errors: &mut Errors<'_>,
) -> Option<DescriptorRule> {
    let key = format!("decision.descriptors[{index}]");
    let rule_span = rule.span();
    let rule = rule.into_inner();
    let mut valid = true;
    if rule.domain.get_ref().is_empty() {
        errors.at(
            Some(rule.domain.span()),
            format!("{key}.domain"),
            "a domain is needed: Envoy sends one with every call, such as \"edge\"",
        );
        valid = false;
    }
    let entries_span = rule.entries.span();
    let entries: Vec<DescriptorEntry> = rule
        .entries
        .into_inner()
        .into_iter()
        .map(|entry| DescriptorEntry {
            key: entry.key,
            value: entry.value,
        })
        .collect();
    if entries.is_empty() || entries.iter().any(|entry| entry.key.is_empty()) {
        errors.at(
            Some(entries_span.clone()),
            format!("{key}.entries"),
            "every entry needs a key, and a rule at least one entry, such as [\"remote_address\"]",
        );
        valid = false;
    }
    let name = rule.limit.get_ref();
    let limit = limits.iter().find(|limit| &*limit.name == name).cloned();
    match &limit {
        None => {
            let known: Vec<&str> = limits.iter().map(|limit| &*limit.name).collect();
            errors.at(
                Some(rule.limit.span()),
                format!("{key}.limit"),
                format!(
                    "unknown limit {name:?}; defined limits: {}",
                    super::list_or_none(&known)
                ),
            );
        }
        Some(limit) if limit.concurrency.is_some() => {
            errors.at(Some(rule.limit.span()), format!("{key}.limit"), format!("limit {name:?} is a concurrency limit: a rate limit service call has no end to give a slot back at; use a rate or quota limit"));
            valid = false;
        }
        Some(_) => {}
    }
    let domain = rule.domain.into_inner();
    if let Some(twin) = earlier
        .iter()
        .position(|other| other.domain == domain && other.entries == entries)
    {
        errors.at(Some(rule_span), key, format!("the same domain and entries as decision.descriptors[{twin}]: a descriptor would match both; merge them or tell them apart"));
        valid = false;
    }
    Some(DescriptorRule {
        domain,
        entries,
        limit: limit?,
        on_store_failure: rule.on_store_failure.unwrap_or_default(),
    })
    .filter(|_| valid)
}

/// What of the policy's limits cannot apply on the decision path, one warning per limit: a
/// sub-request carries no body and no response.
pub(super) fn warnings(policy: &Policy) -> Vec<String> {
    let mut warnings = Vec::new();
    for limit in &policy.limits {
        let on_routes = policy.routes.iter().any(|route| {
            route
                .limits
                .iter()
                .any(|entry| Arc::ptr_eq(&entry.limit, limit))
        });
        if !on_routes {
            continue;
        }
        let name = &limit.name;
        let body_key = limit
            .key
            .iter()
            .any(|source| matches!(source, KeySource::JsonField(_) | KeySource::FormField(_)));
        if body_key {
            warnings.push(format!("limit {name:?} is keyed by a body field, which a forward-auth sub-request does not carry: on the decision listener its key counts as missing ({:?})", limit.missing));
        }
        if limit.concurrency.is_some() {
            warnings.push(format!("limit {name:?} is a concurrency limit: the decision listener never sees the response end, so it does not apply there"));
        }
        if !limit.charge_on_status.is_empty() {
            warnings.push(format!("limit {name:?} charges by response status: the decision listener never sees the response, so charge_on_status does not apply there"));
        }
        if limit.adaptive.is_some() {
            warnings.push(format!("limit {name:?} is adaptive: the decision listener never sees the response, so its penalties do not apply there"));
        }
    }
    for route in &policy.routes {
        for entry in &route.limits {
            let (name, limit) = (&route.name, &entry.limit.name);
            if entry.settle.is_some() {
                warnings.push(format!("route {name:?} settles limit {limit:?} after the response: the decision listener never sees the response, so its answers keep the reservation"));
            }
            if matches!(&entry.read_cost, Some(read) if matches!(read.field, Field::Json(_))) {
                warnings.push(format!("route {name:?} reads limit {limit:?}'s cost from the body, which a forward-auth sub-request does not carry: on the decision listener it reserves the default"));
            }
        }
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::super::testing::{error, policy};
    use crate::config::StoreFailurePolicy;

    const LIMITS: &str = "[upstreams.app]\nurl = \"http://127.0.0.1:1\"\n[limits.per_network]\nkey = \"client_network\"\ncapacity = 10\nrate = \"1/s\"\n[limits.slots]\nkey = \"global\"\nconcurrency = 4\n[[routes]]\nname = \"all\"\npath_prefix = \"/\"\nupstream = \"app\"\nlimits = [\"per_network\"]\n";

    #[test]
    fn a_decision_listener_has_defaults_an_operator_expects() {
        let policy = policy(&format!("{LIMITS}[decision]\n"));
        let decision = policy.decision.unwrap();
        assert_eq!(decision.listen, "127.0.0.1:8081".parse().unwrap());
        assert!(decision.allows("127.0.0.1".parse().unwrap()));
        assert!(decision.allows("::1".parse().unwrap()));
        assert!(decision.allows("::ffff:127.0.0.1".parse().unwrap()));
        assert!(!decision.allows("10.0.0.1".parse().unwrap()));
        assert_eq!(decision.refuse_status, None, "each limit's, else 429");
    }

    #[test]
    fn rules_map_descriptors_to_limits() {
        let policy = policy(&format!("{LIMITS}[decision]\nallow = [\"10.0.0.0/8\", \"192.0.2.7\"]\nrefuse_status = 403\n[[decision.descriptors]]\ndomain = \"edge\"\nentries = [{{ key = \"generic_key\", value = \"login\" }}, \"remote_address\"]\nlimit = \"per_network\"\non_store_failure = \"deny\"\n"));
        let decision = policy.decision.unwrap();
        assert!(decision.allows("192.0.2.7".parse().unwrap()));
        assert!(!decision.allows("127.0.0.1".parse().unwrap()));
        assert_eq!(decision.refuse_status, Some(http::StatusCode::FORBIDDEN));
        let rule = &decision.descriptors[0];
        assert_eq!(rule.entries[0].value.as_deref(), Some("login"));
        assert_eq!(rule.entries[1].key, "remote_address");
        assert_eq!(&*rule.limit.name, "per_network");
        assert_eq!(rule.on_store_failure, StoreFailurePolicy::Deny);
    }

    #[test]
    fn check_rejects_what_a_rule_cannot_mean() {
        let rule = |limit: &str| {
            format!("[[decision.descriptors]]\ndomain = \"edge\"\nentries = [\"remote_address\"]\nlimit = \"{limit}\"\n")
        };
        let (key, message) = error(&format!("{LIMITS}[decision]\n{}", rule("nope")));
        assert_eq!(key, "decision.descriptors[0].limit");
        assert!(message.contains("unknown limit \"nope\""), "{message}");
        let (_, message) = error(&format!("{LIMITS}[decision]\n{}", rule("slots")));
        assert!(message.contains("concurrency limit"), "{message}");
        let (key, message) = error(&format!(
            "{LIMITS}[decision]\n{}{}",
            rule("per_network"),
            rule("per_network")
        ));
        assert_eq!(key, "decision.descriptors[1]");
        assert!(message.contains("decision.descriptors[0]"), "{message}");
        let (key, _) = error(&format!("{LIMITS}[decision]\nrefuse_status = 200\n"));
        assert_eq!(key, "decision.refuse_status");
        let (key, _) = error(&format!("{LIMITS}[decision]\nallow = [\"nowhere\"]\n"));
        assert_eq!(key, "decision.allow");
    }

    #[test]
    fn the_proxy_listener_may_be_left_out_only_beside_a_decision_listener() {
        let without = format!("[server]\nlisten = []\n{LIMITS}");
        assert_eq!(error(&without).0, "server.listen");
        let policy = policy(&format!("{without}[decision]\n"));
        assert!(policy.server.listen.is_empty());
    }

    #[test]
    fn check_names_each_limit_a_sub_request_cannot_carry() {
        let text = "[upstreams.app]\nurl = \"http://127.0.0.1:1\"\n[limits.by_body]\nkey = { json_field = \"user\" }\ncapacity = 10\nrate = \"1/s\"\n[limits.slots]\nkey = \"global\"\nconcurrency = 4\n[limits.by_status]\nkey = \"client_network\"\ncapacity = 10\nrate = \"1/s\"\ncharge_on_status = { 401 = 5 }\n[[routes]]\nname = \"all\"\npath_prefix = \"/\"\nupstream = \"app\"\nlimits = [\"by_body\", \"slots\", \"by_status\"]\n";
        let quiet = policy(text);
        assert!(!quiet
            .warnings
            .iter()
            .any(|w| w.contains("decision listener")));
        let warned = policy(&format!("{text}[decision]\n"));
        for name in ["by_body", "slots", "by_status"] {
            assert!(
                warned
                    .warnings
                    .iter()
                    .any(|w| w.contains(&format!("limit \"{name}\""))
                        && w.contains("decision listener")),
                "{name}: {:?}",
                warned.warnings
            );
        }
        let settled = text.replace(
            "\"by_status\"]",
            "{ limit = \"by_status\", cost = { json = \"n\", default = 1 }, settle = \"upstream_ms\" }]",
        );
        let warned = policy(&format!("{settled}[decision]\n"));
        for what in ["settles limit \"by_status\"", "cost from the body"] {
            assert!(
                warned.warnings.iter().any(|w| w.contains(what)),
                "{what}: {:?}",
                warned.warnings
            );
        }
    }
}
