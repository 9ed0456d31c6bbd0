//! The compiled policy as a readable table (`tollgate check`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::Duration;

use http::Method;

use super::{
    KeySource, Limit, Missing, Mode, Normalize, NumberSource, PathMatch, Policy, Tier, TierSource,
};
use crate::client_ip::Trust;

pub(super) fn summary(policy: &Policy) -> String {
    let mut out = String::new();
    write_header(&mut out, policy);
    write_routes(&mut out, policy);
    write_limits(&mut out, policy);
    write_overload_and_upstreams(&mut out, policy);
    for warning in &policy.warnings {
        let _ = writeln!(out, "\nwarning: {warning}");
    }
    out
}

/// Listeners, how the client address is found, identity, the store.
fn write_header(out: &mut String, policy: &Policy) {
    let listen: Vec<String> = policy
        .server
        .listen
        .iter()
        .map(ToString::to_string)
        .collect();
    let listen = if listen.is_empty() {
        "none".to_owned()
    } else {
        listen.join(", ")
    };
    let _ = writeln!(out, "listen {listen}   admin {}", policy.admin.listen);
    if let Some(decision) = &policy.decision {
        let allow: Vec<String> = decision.allow.iter().map(ToString::to_string).collect();
        let _ = writeln!(
            out,
            "decision {} (forward-auth /decide, gRPC rate limit service; {} descriptor rules), refusing with {}, asked by {}",
            decision.listen,
            decision.descriptors.len(),
            decision.refuse_status.map_or_else(
                || "each limit's refusal status (429 by default)".to_owned(),
                |status| status.as_u16().to_string()
            ),
            allow.join(", ")
        );
        for rule in &decision.descriptors {
            let entries: Vec<String> = rule
                .entries
                .iter()
                .map(|entry| match &entry.value {
                    Some(value) => format!("{}={value}", entry.key),
                    None => entry.key.clone(),
                })
                .collect();
            let _ = writeln!(
                out,
                "  descriptors {} [{}] -> {} (on store failure {})",
                rule.domain,
                entries.join(", "),
                rule.limit.name,
                rule.on_store_failure.as_str()
            );
        }
    }
    let trust = match &policy.client_ip.trust {
        Trust::Hops(0) => "the TCP peer is the client (trusted_hops = 0)".to_owned(),
        Trust::Hops(hops) => format!("trust {hops} X-Forwarded-For hop(s)"),
        Trust::Proxies(networks) => {
            let networks: Vec<String> = networks.iter().map(ToString::to_string).collect();
            format!("trust proxies in {}", networks.join(", "))
        }
    };
    let _ = writeln!(
        out,
        "client address: {trust}; networks /{} (IPv4), /{} (IPv6)",
        policy.client_ip.ipv4_prefix, policy.client_ip.ipv6_prefix
    );
    write_edge(out, policy);
    if policy.decision.is_some() {
        let _ = writeln!(
            out,
            "decisions: the asking proxy is one trusted hop; its last X-Forwarded-For entry counts as the peer"
        );
    }
    if let Some(jwt) = &policy.jwt {
        let _ = writeln!(out, "identity: {jwt}");
    }
    write_store(out, policy);
    if let Some(tracing) = &policy.tracing {
        let protocol = match tracing.protocol {
            crate::config::OtlpProtocol::Grpc => "gRPC",
            crate::config::OtlpProtocol::HttpProtobuf => "HTTP/protobuf",
        };
        let _ = writeln!(
            out,
            "tracing: spans of {} to {} over OTLP {protocol}; {}% of new traces sampled, a parent's flag followed",
            tracing.service_name,
            tracing.endpoint,
            tracing.sample_ratio * 100.0
        );
    }
    write_watching(out, policy);
}

/// `[top]` and `[scan]`: what operators see of whom the gateway stops.
fn write_watching(out: &mut String, policy: &Policy) {
    let _ = match policy.top.keys_per_limit {
        0 => writeln!(out, "top keys: off"),
        keys => writeln!(
            out,
            "top keys: {keys} per limit, refused and charged, over 1, 5 and 15 minutes"
        ),
    };
    if let Some(scan) = &policy.scan {
        let key: Vec<String> = scan.key.key.iter().map(describe_source).collect();
        let statuses: Vec<String> = scan.statuses.iter().map(u16::to_string).collect();
        let then = match scan.ban {
            Some(ban) => format!(
                "banned on every route for {}",
                humantime::format_duration(ban)
            ),
            None => "logged and counted (no ban)".to_owned(),
        };
        let _ = writeln!(
            out,
            "scan: a {} with {} distinct paths answered {} within {} is {then}",
            key.join(" + "),
            scan.distinct_paths,
            statuses.join("/"),
            humantime::format_duration(scan.within),
        );
    }
}

/// Which peers send PROXY headers, and `[server.connections]`.
fn write_edge(out: &mut String, policy: &Policy) {
    if let Some(proxy_protocol) = &policy.server.proxy_protocol {
        let from: Vec<String> = proxy_protocol
            .from
            .iter()
            .map(ToString::to_string)
            .collect();
        let _ = writeln!(
            out,
            "PROXY headers from {}: their source is the client",
            from.join(", ")
        );
    }
    let connections = &policy.server.connections;
    let mut limits = Vec::new();
    if let Some(max) = connections.max {
        limits.push(format!("{max} open in all"));
    }
    if let Some(max) = connections.max_per_network {
        limits.push(format!("{max} open per network"));
    }
    if let Some(rate) = connections.per_network {
        limits.push(format!(
            "{} new per network, then {}/s",
            rate.capacity, rate.rate
        ));
    }
    if !limits.is_empty() {
        let _ = writeln!(out, "connections: {}", limits.join(", "));
    }
    write_tls(out, policy);
}

/// Which certificate answers which names, and how TLS is spoken.
fn write_tls(out: &mut String, policy: &Policy) {
    let Some(tls) = &policy.server.tls else {
        return;
    };
    let version = match tls.min_version {
        crate::config::TlsVersion::Tls12 => "1.2",
        crate::config::TlsVersion::Tls13 => "1.3",
    };
    let mut traits = vec![format!("TLS {version} and up")];
    if tls.hsts.is_some() {
        traits.push("HSTS".to_owned());
    }
    if tls.redirect_plain {
        traits.push("plain listeners redirect to https".to_owned());
    }
    if let Some(http3) = &policy.server.http3 {
        let listen: Vec<String> = http3.listen.iter().map(ToString::to_string).collect();
        let early = if http3.early_data { ", 0-RTT" } else { "" };
        traits.push(format!("HTTP/3 on UDP {}{early}", listen.join(", ")));
    }
    let _ = writeln!(out, "tls: {}", traits.join(", "));
    for entry in &tls.certificates {
        let hosts: Vec<String> = entry.hosts.iter().map(ToString::to_string).collect();
        let hosts = if hosts.is_empty() {
            "every other name (default)".to_owned()
        } else {
            hosts.join(", ")
        };
        let _ = writeln!(out, "  {hosts} -> {}", entry.files.cert.display());
    }
    if !tls.certificates.iter().any(|entry| entry.hosts.is_empty()) {
        let _ = writeln!(out, "  any other name -> unrecognized_name");
    }
}

/// Where buckets live, and where overrides are kept.
fn write_store(out: &mut String, policy: &Policy) {
    let sentinel = policy
        .store
        .redis
        .as_ref()
        .and_then(|redis| redis.sentinel.as_ref())
        .map_or(String::new(), |sentinel| {
            format!(
                " under Sentinel (master {:?}, {} sentinels)",
                sentinel.master,
                sentinel.sentinels.len()
            )
        });
    let _ = writeln!(
        out,
        "store: {}{sentinel}, max {} keys",
        policy.store.backend.as_str(),
        policy.store.max_keys
    );
    let kept = match (&policy.store.redis, &policy.overrides.file) {
        (Some(_), _) => "in Redis".to_owned(),
        (None, Some(file)) => format!("in {}", file.display()),
        (None, None) => "until the process ends".to_owned(),
    };
    let longest = policy.overrides.max_ttl.map_or(String::new(), |max_ttl| {
        format!(", each for at most {}", humantime::format_duration(max_ttl))
    });
    let _ = writeln!(out, "overrides: kept {kept}{longest}");
}

/// What a route charges a limit: its cost, or where the cost is read, and how it settles.
fn describe_cost(entry: &crate::config::RouteLimit) -> String {
    let mut text = match &entry.read_cost {
        None => entry.cost.to_string(),
        Some(read) => {
            let field = crate::config::costs::Measure::Field(read.field.clone()).describe();
            let max = match read.max {
                max if max.is_finite() => format!(", max {max}"),
                _ => String::new(),
            };
            format!("{field}, default {}{max}", read.default)
        }
    };
    if let Some(settle) = &entry.settle {
        text.push_str(&format!("; settled by {}", settle.measure.describe()));
        if settle.scale != 1.0 {
            text.push_str(&format!(" × {}", settle.scale));
        }
    }
    text
}

/// One line per route, in matching order.
fn write_routes(out: &mut String, policy: &Policy) {
    let _ = writeln!(out, "\nroutes (first match wins):");
    let _ = writeln!(
        out,
        "  {:<16} {:<10} {:<28} {:<12} {:<16} limits (cost)",
        "name", "methods", "path", "upstream", "on store failure"
    );
    for route in &policy.routes {
        let methods = route.methods.as_ref().map_or("any".to_owned(), |methods| {
            methods
                .iter()
                .map(Method::as_str)
                .collect::<Vec<_>>()
                .join(",")
        });
        let path = match &route.path {
            PathMatch::Exact(path) => path.clone(),
            PathMatch::Prefix(prefix) => format!("{}/*", prefix.trim_end_matches('/')),
        };
        let path = match &route.host {
            Some(host) => format!("{host}{path}"),
            None => path,
        };
        let limits: Vec<String> = route
            .limits
            .iter()
            .map(|entry| format!("{} ({})", entry.limit.name, describe_cost(entry)))
            .collect();
        let _ = writeln!(
            out,
            "  {:<16} {:<10} {:<28} {:<12} {:<16} {}",
            route.name,
            methods,
            path,
            route.upstream.name,
            route.on_store_failure.as_str(),
            if limits.is_empty() {
                "-".to_owned()
            } else {
                limits.join(", ")
            }
        );
    }
}

/// One line per limit: key, numbers, and notes on what else it does.
fn write_limits(out: &mut String, policy: &Policy) {
    let _ = writeln!(out, "\nlimits:");
    let _ = writeln!(
        out,
        "  {:<16} {:<30} {:>9} {:>14} {:>12}  notes",
        "name", "key", "capacity", "rate", "refill"
    );
    for limit in &policy.limits {
        let key = if limit.key.is_empty() {
            "global".to_owned()
        } else {
            limit
                .key
                .iter()
                .map(describe_source)
                .collect::<Vec<_>>()
                .join(" + ")
        };
        let (rate, refill) = match &limit.calendar {
            _ if limit.concurrency.is_some() => ("in flight".to_owned(), "-".to_owned()),
            Some(calendar) => (
                format!("per {}", calendar.period.as_str()),
                calendar.zone_name.clone(),
            ),
            None => (
                limit.rate.to_string(),
                humantime::format_duration(Duration::from_secs_f64(
                    limit.refill_seconds().min(1e9).round(),
                ))
                .to_string(),
            ),
        };
        let _ = writeln!(
            out,
            "  {:<16} {:<30} {:>9} {:>14} {:>12}  {}",
            limit.name,
            key,
            limit.capacity,
            rate,
            refill,
            limit_notes(limit).join(", ")
        );
    }
}

/// What a limit does besides counting: shadow mode, missing keys, normalization, exemptions,
/// adaptive penalties, charges by status, tiers, delays.
fn limit_notes(limit: &Limit) -> Vec<String> {
    let mut notes = Vec::new();
    if limit.mode == Mode::Shadow {
        notes.push("shadow".to_owned());
    }
    if limit.missing == Missing::Reject {
        let status = if limit.reads_token() { 401 } else { 400 };
        notes.push(format!("missing key → {status}"));
    }
    if limit.normalize != Normalize::None {
        notes.push(format!("normalize {:?}", limit.normalize).to_lowercase());
    }
    if !limit.exempt.is_empty() {
        notes.push(format!("{} exempt network(s)", limit.exempt.len()));
    }
    if let Some(ban) = &limit.ban {
        notes.push(format!(
            "ban after {} refusals in {} for {}",
            ban.after,
            humantime::format_duration(ban.within),
            humantime::format_duration(ban.duration)
        ));
    }
    if !limit.exempt_asns.is_empty() {
        notes.push(format!("{} exempt ASN(s)", limit.exempt_asns.len()));
    }
    if !limit.exempt_countries.is_empty() {
        notes.push(format!(
            "{} exempt countr(ies)",
            limit.exempt_countries.len()
        ));
    }
    if let Some(adaptive) = &limit.adaptive {
        let statuses: Vec<String> = adaptive.on_status.iter().map(u16::to_string).collect();
        let params = adaptive.params;
        notes.push(format!(
            "adaptive: {} × {} within {} → ×{} (min {}) for {}",
            params.threshold,
            statuses.join("/"),
            humantime::format_duration(Duration::from_secs_f64(params.window)),
            params.factor,
            params.min_capacity,
            humantime::format_duration(Duration::from_secs_f64(params.hold)),
        ));
    }
    for (status, tokens) in &limit.charge_on_status {
        notes.push(format!("{status} costs +{tokens}"));
    }
    if let Some(source) = &limit.tier {
        let source = match source {
            TierSource::JwtClaim(path) => format!("jwt claim {path}"),
            TierSource::Header(name) => format!("header {name}"),
        };
        let tiers: Vec<String> = limit
            .tiers
            .iter()
            .map(|(name, tier)| match tier {
                Tier::Exempt => format!("{name} exempt"),
                Tier::Bucket { capacity, .. } if limit.calendar.is_some() => {
                    format!("{name} {capacity}")
                }
                Tier::Bucket { capacity, rate } => format!("{name} {capacity} @ {rate}"),
            })
            .collect();
        notes.push(format!("tiers by {source}: {}", tiers.join("; ")));
    }
    if let Some(max_delay) = limit.max_delay {
        notes.push(format!(
            "delays up to {}",
            humantime::format_duration(max_delay)
        ));
    }
    notes.extend(steering_notes(limit));
    notes
}

/// The numbers a limit's requests carry, and how its refusals are shaped.
fn steering_notes(limit: &Limit) -> Vec<String> {
    let mut notes = Vec::new();
    if let Some(carried) = &limit.carried {
        let sources: Vec<String> = carried
            .sources()
            .map(|(number, source)| match source {
                NumberSource::JwtClaim(path) => format!("{number} from jwt claim {path}"),
                NumberSource::Header(name) => format!("{number} from header {name}"),
            })
            .collect();
        notes.push(format!(
            "{} (the numbers above are the defaults)",
            sources.join(", ")
        ));
    }
    if let Some(refusal) = &limit.refusal {
        let mut shape = format!("refused with {}", refusal.status.as_u16());
        if refusal.body.is_some() {
            shape.push_str(", its own body");
        }
        if !refusal.retry_after {
            shape.push_str(", no Retry-After");
        }
        notes.push(shape);
    }
    notes
}

fn write_overload_and_upstreams(out: &mut String, policy: &Policy) {
    if let Some(overload) = &policy.overload {
        let mut triggers = Vec::new();
        if let Some(max) = overload.max_inflight {
            triggers.push(format!("more than {max} upstream requests in flight"));
        }
        if let Some(target) = overload.latency_target {
            triggers.push(format!(
                "upstream latency above {}",
                humantime::format_duration(target)
            ));
        }
        let _ = writeln!(
            out,
            "\noverload: every rate × {} while {} (per replica)",
            overload.factor,
            triggers.join(" or ")
        );
    }
    let upstreams: BTreeMap<&str, String> = policy
        .upstreams
        .iter()
        .map(|upstream| {
            let urls: Vec<String> = upstream
                .targets
                .iter()
                .map(|target| target.url.to_string())
                .collect();
            (upstream.name.as_str(), urls.join(", "))
        })
        .collect();
    let _ = writeln!(out, "\nupstreams:");
    for (name, urls) in upstreams {
        let _ = writeln!(out, "  {name:<16} {urls}");
    }
}

fn describe_source(source: &KeySource) -> String {
    match source {
        KeySource::ClientNetwork => "client_network".to_owned(),
        KeySource::Global => "global".to_owned(),
        KeySource::Header(name) => format!("header {name}"),
        KeySource::Query(name) => format!("query {name}"),
        KeySource::Cookie(name) => format!("cookie {name}"),
        KeySource::JsonField(name) => format!("json {name}"),
        KeySource::FormField(name) => format!("form {name}"),
        KeySource::JwtClaim(path) => format!("jwt claim {path}"),
        KeySource::ClientAsn => "client_asn".to_owned(),
        KeySource::ClientCountry => "client_country".to_owned(),
        KeySource::TlsJa4 => "tls_ja4".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use crate::config::Policy;

    #[test]
    fn check_names_carried_numbers_shaped_refusals_and_where_overrides_are_kept() {
        let policy = Policy::parse(
            "test.toml",
            "[overrides]\nfile = \"/var/lib/tollgate/overrides.json\"\nmax_ttl = \"7d\"\n[upstreams.app]\nurl = \"http://127.0.0.1:3000\"\n[limits.per_tenant]\nkey = { header = \"x-tenant\" }\ncapacity = { header = \"x-capacity\", trust_header = true, default = 10, max = 100 }\nrate = \"1/s\"\n[limits.per_tenant.refusal]\nstatus = 503\nretry_after = false\n[[routes]]\nname = \"all\"\npath_prefix = \"/\"\nupstream = \"app\"\nlimits = [\"per_tenant\"]\n",
        )
        .unwrap_or_else(|errors| panic!("{errors}"));
        let summary = policy.summary();
        assert!(
            summary.contains(
                "overrides: kept in /var/lib/tollgate/overrides.json, each for at most 7days"
            ),
            "{summary}"
        );
        assert!(
            summary
                .contains("capacity from header x-capacity (the numbers above are the defaults)"),
            "{summary}"
        );
        assert!(
            summary.contains("refused with 503, no Retry-After"),
            "{summary}"
        );
    }

    #[test]
    fn check_names_the_proxy_header_peers_and_the_connection_limits() {
        let policy = Policy::parse(
            "test.toml",
            "[server]\nproxy_protocol = { from = [\"10.0.0.0/8\"] }\n[server.connections]\nmax = 20000\nper_network = { capacity = 60, rate = \"20/s\" }\nmax_per_network = 200\n[upstreams.app]\nurl = \"http://127.0.0.1:3000\"\n[[routes]]\nname = \"all\"\npath_prefix = \"/\"\nupstream = \"app\"\n",
        )
        .unwrap_or_else(|errors| panic!("{errors}"));
        let summary = policy.summary();
        assert!(
            summary.contains("PROXY headers from 10.0.0.0/8: their source is the client"),
            "{summary}"
        );
        assert!(
            summary.contains(
                "connections: 20000 open in all, 200 open per network, 60 new per network, then 20/s"
            ),
            "{summary}"
        );
    }
}
