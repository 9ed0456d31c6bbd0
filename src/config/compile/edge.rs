//! `[server.connections]`, `[server] proxy_protocol` and `[server.http3]`.

use toml::Spanned;

use super::server::{networks, socket_address};
use super::Errors;
use crate::client_ip::Trust;
use crate::config::raw::{RawConnections, RawHttp3, RawProxyProtocol};
use crate::config::{
    ConnectionLimits, Http3Settings, NetworkRate, Policy, ProxyProtocol, ServerSettings,
};

const MAX_CONNECTIONS: i64 = 100_000_000;

pub(super) fn compile_connections(
    raw: Option<RawConnections>,
    errors: &mut Errors<'_>,
) -> ConnectionLimits {
    let Some(raw) = raw else {
        return ConnectionLimits::default();
    };
    let count = |value: Option<Spanned<i64>>, key: &str, errors: &mut Errors<'_>| {
        let value = value?;
        if (1..=MAX_CONNECTIONS).contains(value.get_ref()) {
            return Some(*value.get_ref());
        }
        errors.at(
            Some(value.span()),
            key,
            format!(
                "{} is out of range: expected 1 to {MAX_CONNECTIONS}",
                value.get_ref()
            ),
        );
        None
    };
    let max = count(raw.max, "server.connections.max", errors);
    let max_per_network = count(
        raw.max_per_network,
        "server.connections.max_per_network",
        errors,
    );
    let per_network = raw.per_network.and_then(|per_network| {
        let span = per_network.span();
        let per_network = per_network.into_inner();
        let capacity = *per_network.capacity.get_ref();
        let rate = per_network.rate.0.per_second();
        if !(capacity.is_finite() && capacity >= 1.0) {
            errors.at(
                Some(per_network.capacity.span()),
                "server.connections.per_network.capacity",
                format!("{capacity} is out of range: at least 1 connection"),
            );
            return None;
        }
        if !(rate.is_finite() && rate > 0.0) {
            errors.at(
                Some(span),
                "server.connections.per_network.rate",
                "must be more than zero, such as \"20/s\"",
            );
            return None;
        }
        Some(NetworkRate { capacity, rate })
    });
    ConnectionLimits {
        max: max.map(|max| max as usize),
        per_network,
        max_per_network: max_per_network.map(|max| max as u32),
    }
}

pub(super) fn compile_proxy_protocol(
    raw: Option<Spanned<RawProxyProtocol>>,
    errors: &mut Errors<'_>,
) -> Option<ProxyProtocol> {
    let raw = raw?.into_inner();
    let span = raw.from.span();
    if raw.from.get_ref().is_empty() {
        errors.at(
            Some(span),
            "server.proxy_protocol.from",
            "is empty: name the load balancers that send PROXY headers, such as [\"10.0.0.0/8\"]",
        );
        return None;
    }
    let from = networks(
        raw.from.get_ref(),
        "server.proxy_protocol.from",
        span,
        errors,
    );
    Some(ProxyProtocol { from })
}

/// `[server.http3]`: UDP addresses, which need `[server] tls` (QUIC is TLS 1.3 only).
pub(super) fn compile_http3(
    raw: Spanned<RawHttp3>,
    server: &ServerSettings,
    errors: &mut Errors<'_>,
) -> Option<Http3Settings> {
    let span = raw.span();
    let raw = raw.into_inner();
    if server.tls.is_none() {
        errors.at(
            Some(span),
            "server.http3",
            "HTTP/3 is served with the TLS listeners' certificates: set [server] tls as well",
        );
        return None;
    }
    let listen_span = raw.listen.span();
    let listen: Vec<_> = raw
        .listen
        .get_ref()
        .iter()
        .filter_map(|address| {
            socket_address(
                address,
                "server.http3.listen",
                Some(listen_span.clone()),
                errors,
            )
        })
        .collect();
    if raw.listen.get_ref().is_empty() {
        errors.at(
            Some(listen_span),
            "server.http3.listen",
            "is empty: name the UDP addresses, such as [\"0.0.0.0:8443\"]",
        );
        return None;
    }
    Some(Http3Settings {
        listen,
        early_data: raw.early_data.unwrap_or(false),
    })
}

/// Per-network connection limits count connections by their source: behind proxies that
/// `trusted_hops` trusts without naming them, that source is a proxy.
pub(super) fn warnings(policy: &Policy, warnings: &mut Vec<String>) {
    let connections = &policy.server.connections;
    if connections.per_network_apply()
        && matches!(policy.client_ip.trust, Trust::Hops(hops) if hops > 0)
        && policy.server.proxy_protocol.is_none()
    {
        warnings.push("server.connections counts connections per network of their source, which behind trusted_hops is your proxy: name the proxies in client_ip.trusted_proxies (they are exempt), or have them send PROXY headers (server.proxy_protocol)".to_owned());
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{errors, policy};
    use crate::config::NetworkRate;

    #[test]
    fn connection_limits_and_proxy_peers_compile() {
        let compiled = policy("[server]\nproxy_protocol = { from = [\"10.0.0.0/8\", \"192.0.2.7\"] }\n[server.connections]\nmax = 20000\nper_network = { capacity = 60, rate = \"20/s\" }\nmax_per_network = 200\n");
        let server = &compiled.server;
        assert_eq!(server.connections.max, Some(20000));
        assert_eq!(server.connections.max_per_network, Some(200));
        assert_eq!(
            server.connections.per_network,
            Some(NetworkRate {
                capacity: 60.0,
                rate: 20.0
            })
        );
        let from = &server.proxy_protocol.as_ref().unwrap().from;
        assert!(from[1].contains(&"192.0.2.7".parse::<std::net::IpAddr>().unwrap()));
        let plain = policy("");
        assert_eq!(plain.server.connections, Default::default());
        assert!(plain.server.proxy_protocol.is_none());
    }

    #[test]
    fn out_of_range_numbers_and_empty_peer_lists_are_errors() {
        let keys =
            |text: &str| -> Vec<String> { errors(text).into_iter().map(|(key, _)| key).collect() };
        assert_eq!(
            keys("[server.connections]\nmax = 0\nmax_per_network = -1\nper_network = { capacity = 0, rate = \"1/s\" }\n"),
            [
                "server.connections.max",
                "server.connections.max_per_network",
                "server.connections.per_network.capacity"
            ]
        );
        assert_eq!(
            keys("[server]\nproxy_protocol = { from = [] }\n"),
            ["server.proxy_protocol.from"]
        );
        assert_eq!(
            keys("[server]\nproxy_protocol = { from = [\"10.0.0.0/33\"] }\n"),
            ["server.proxy_protocol.from"]
        );
        assert_eq!(keys("[server.connections]\nmax_conections = 5\n").len(), 1);
    }

    #[test]
    fn http3_compiles_beside_tls_and_is_refused_without_it() {
        let tls = "[server.tls]\ncert = \"c.pem\"\nkey = \"k.pem\"\n";
        let compiled = policy(&format!(
            "{tls}[server.http3]\nlisten = [\"0.0.0.0:8443\", \"[::]:8443\"]\nearly_data = true\n"
        ));
        let http3 = compiled.server.http3.as_ref().unwrap();
        assert_eq!(http3.listen[0], "0.0.0.0:8443".parse().unwrap());
        assert!(http3.early_data);
        let summary = compiled.summary();
        assert!(
            summary.contains("HTTP/3 on UDP 0.0.0.0:8443, [::]:8443, 0-RTT"),
            "{summary}"
        );
        assert!(policy("").server.http3.is_none());
        let keys =
            |text: &str| -> Vec<String> { errors(text).into_iter().map(|(key, _)| key).collect() };
        assert_eq!(
            keys("[server.http3]\nlisten = [\"0.0.0.0:8443\"]\n"),
            ["server.http3"]
        );
        assert_eq!(
            keys(&format!("{tls}[server.http3]\nlisten = []\n")),
            ["server.http3.listen"]
        );
        assert_eq!(
            keys(&format!("{tls}[server.http3]\nlisten = [\"8443\"]\n")),
            ["server.http3.listen"]
        );
        assert_eq!(
            keys(&format!(
                "{tls}[server.http3]\nlisten = [\"0.0.0.0:8443\"]\nzero_rtt = true\n"
            ))
            .len(),
            1
        );
    }

    #[test]
    fn per_network_limits_behind_unnamed_proxies_are_warned_of() {
        let warned = |text: &str| {
            policy(text)
                .warnings
                .iter()
                .any(|warning| warning.starts_with("server.connections counts"))
        };
        let limits = "[server.connections]\nmax_per_network = 10\n";
        assert!(warned(&format!("[client_ip]\ntrusted_hops = 1\n{limits}")));
        assert!(!warned(&format!(
            "[client_ip]\ntrusted_proxies = [\"10.0.0.0/8\"]\n{limits}"
        )));
        assert!(!warned(&format!("[client_ip]\ntrusted_hops = 1\n[server]\nproxy_protocol = {{ from = [\"10.0.0.0/8\"] }}\n{limits}")));
        assert!(!warned(
            "[client_ip]\ntrusted_hops = 1\n[server.connections]\nmax = 10\n"
        ));
    }
}
