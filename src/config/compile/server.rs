//! `[server]`, `[admin]` and `[client_ip]`: listeners, timeouts and sizes, and which
//! forwarding hops are trusted.

use std::net::SocketAddr;
use std::ops::Range;
use std::path::Path;
use std::time::Duration;

use ipnet::IpNet;
use toml::Spanned;

use super::{duration_or, Errors};
use crate::client_ip::Trust;
use crate::config::raw;
use crate::config::{AdminSettings, AdminToken, ClientIpSettings, ServerSettings};

const DEFAULT_LISTEN: &str = "0.0.0.0:8080";
const DEFAULT_ADMIN_LISTEN: &str = "127.0.0.1:9090";
/// Probes, a scraper and a few operators: far more than they need at once.
const DEFAULT_ADMIN_CONNECTIONS: usize = 64;
const MAX_ADMIN_CONNECTIONS: i64 = 65_536;
/// hyper cannot read request heads into a buffer smaller than this.
const MIN_HEADER_BYTES: i64 = 8192;

pub(super) fn compile_server(
    raw: raw::RawServer,
    base: Option<&Path>,
    errors: &mut Errors<'_>,
) -> ServerSettings {
    let listen = match raw.listen {
        // An empty list is judged with `[decision]`, which may be the only listener.
        Some(listen) => {
            let span = listen.span();
            listen
                .into_inner()
                .iter()
                .filter_map(|address| {
                    socket_address(address, "server.listen", Some(span.clone()), errors)
                })
                .collect()
        }
        None => vec![DEFAULT_LISTEN
            .parse()
            .expect("the default listen address is valid")],
    };
    let tls = raw
        .tls
        .and_then(|tls| super::tls::compile_tls(tls, base, errors));
    let plain_listen = raw.plain_listen.map_or_else(Vec::new, |plain| {
        let span = plain.span();
        plain
            .into_inner()
            .iter()
            .filter_map(|address| {
                socket_address(address, "server.plain_listen", Some(span.clone()), errors)
            })
            .collect()
    });
    let http_01 = tls
        .as_ref()
        .and_then(|tls| tls.acme.as_ref())
        .is_some_and(|acme| acme.challenge == crate::config::AcmeChallenge::Http01);
    if http_01 && plain_listen.is_empty() {
        errors.at(
            None,
            "server.tls.acme.challenge",
            "\"http-01\" is answered on the plain listeners: set [server] plain_listen, such as [\"0.0.0.0:80\"]",
        );
    }
    if let Some(taken) = plain_listen
        .iter()
        .find(|plain| listen.iter().any(|tls| same_listener(plain, tls)))
    {
        errors.at(
            None,
            "server.plain_listen",
            format!("{taken} is also a listener in `listen`: give the plain listener its own port"),
        );
    }
    let max_header_bytes = compile_max_header_bytes(raw.max_header_bytes, errors);
    let max_buffered_body = match raw.max_buffered_body {
        Some(size) if size.get_ref().0 == 0 => {
            errors.at(
                Some(size.span()),
                "server.max_buffered_body",
                "must be greater than zero, such as \"64KiB\"",
            );
            0
        }
        Some(size) => usize::try_from(size.get_ref().0).unwrap_or(usize::MAX),
        None => 64 * 1024,
    };
    let header_read_timeout = duration_or(raw.header_read_timeout, Duration::from_secs(10));
    let idle_timeout = duration_or(raw.idle_timeout, Duration::from_secs(60));
    for (key, value) in [
        ("server.header_read_timeout", header_read_timeout),
        ("server.idle_timeout", idle_timeout),
    ] {
        if value.is_zero() {
            errors.at(None, key, "must be longer than zero");
        }
    }
    ServerSettings {
        listen,
        tls,
        plain_listen,
        header_read_timeout,
        idle_timeout,
        max_header_bytes,
        max_buffered_body,
        grace_period: duration_or(raw.grace_period, Duration::from_secs(30)),
        ratelimit_headers: raw.ratelimit_headers.unwrap_or_default(),
        http1: raw.http1.unwrap_or_default(),
        path_matching: raw.path_matching.unwrap_or_default(),
        underscores_in_headers: raw.underscores_in_headers.unwrap_or(false),
        // `compile_listeners` sets these (`edge.rs`).
        connections: Default::default(),
        proxy_protocol: None,
        http3: None,
    }
}

/// `max_header_bytes`: 16384 unless set, within what hyper can read and 1 MiB.
fn compile_max_header_bytes(raw: Option<Spanned<i64>>, errors: &mut Errors<'_>) -> usize {
    match raw {
        Some(bytes) if (MIN_HEADER_BYTES..=1 << 20).contains(bytes.get_ref()) => {
            *bytes.get_ref() as usize
        }
        Some(bytes) => {
            errors.at(
                Some(bytes.span()),
                "server.max_header_bytes",
                format!(
                    "{} is out of range: expected {MIN_HEADER_BYTES} to 1048576",
                    bytes.get_ref()
                ),
            );
            16384
        }
        None => 16384,
    }
}

pub(super) fn socket_address(
    text: &str,
    key: &str,
    span: Option<Range<usize>>,
    errors: &mut Errors<'_>,
) -> Option<SocketAddr> {
    match text.parse() {
        Ok(address) => Some(address),
        Err(_) => {
            errors.at(span, key, format!("invalid address {text:?}: expected IP:port such as \"0.0.0.0:8080\", \"127.0.0.1:9090\" or \"[::]:8080\""));
            None
        }
    }
}

pub(super) fn compile_admin(raw: raw::RawAdmin, errors: &mut Errors<'_>) -> AdminSettings {
    let listen = match raw.listen {
        Some(listen) => socket_address(
            listen.get_ref(),
            "admin.listen",
            Some(listen.span()),
            errors,
        ),
        None => None,
    };
    let token = raw.token_env.and_then(|variable| {
        match std::env::var(variable.get_ref()) {
            Ok(token) if token.len() >= 16 => Some(AdminToken::new(variable.into_inner(), token)),
            Ok(_) => {
                errors.at(Some(variable.span()), "admin.token_env", format!("${} is shorter than 16 characters: too easy to guess for a token that resets limits", variable.get_ref()));
                None
            }
            Err(_) => {
                errors.at(Some(variable.span()), "admin.token_env", format!("${} is not set: /limits would be open to anyone who reaches the admin listener", variable.get_ref()));
                None
            }
        }
    });
    let max_connections = match raw.max_connections {
        Some(count) if (1..=MAX_ADMIN_CONNECTIONS).contains(count.get_ref()) => {
            *count.get_ref() as usize
        }
        Some(count) => {
            errors.at(
                Some(count.span()),
                "admin.max_connections",
                format!(
                    "{} is out of range: expected 1 to {MAX_ADMIN_CONNECTIONS}",
                    count.get_ref()
                ),
            );
            DEFAULT_ADMIN_CONNECTIONS
        }
        None => DEFAULT_ADMIN_CONNECTIONS,
    };
    AdminSettings {
        max_connections,
        listen: listen.unwrap_or_else(|| {
            DEFAULT_ADMIN_LISTEN
                .parse()
                .expect("the default admin address is valid")
        }),
        token,
    }
}

/// Whether two listen addresses take the same socket: the same port (not an ephemeral 0) on the
/// same address, or on every address.
pub(super) fn same_listener(a: &std::net::SocketAddr, b: &std::net::SocketAddr) -> bool {
    a.port() == b.port()
        && a.port() != 0
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

pub(super) fn prefix_length(
    value: Option<&Spanned<i64>>,
    max: i64,
    default: u8,
    key: &str,
    errors: &mut Errors<'_>,
) -> u8 {
    match value {
        None => default,
        Some(value) if (0..=max).contains(value.get_ref()) => *value.get_ref() as u8,
        Some(value) => {
            errors.at(
                Some(value.span()),
                key,
                format!(
                    "prefix length {} is out of range: expected 0 to {max}",
                    value.get_ref()
                ),
            );
            default
        }
    }
}

pub(super) fn compile_client_ip(
    raw: raw::RawClientIp,
    errors: &mut Errors<'_>,
) -> ClientIpSettings {
    let ipv4_prefix = prefix_length(
        raw.ipv4_prefix.as_ref(),
        32,
        32,
        "client_ip.ipv4_prefix",
        errors,
    );
    let ipv6_prefix = prefix_length(
        raw.ipv6_prefix.as_ref(),
        128,
        64,
        "client_ip.ipv6_prefix",
        errors,
    );
    let trust = match (raw.trusted_hops, raw.trusted_proxies) {
        (Some(hops), Some(_)) => {
            errors.at(Some(hops.span()), "client_ip", "trusted_hops and trusted_proxies are both set: choose one (hops counts proxies from the right, proxies names their networks)");
            Trust::Hops(0)
        }
        (Some(hops), None) => match usize::try_from(*hops.get_ref()) {
            Ok(count) if count <= 32 => Trust::Hops(count),
            _ => {
                errors.at(
                    Some(hops.span()),
                    "client_ip.trusted_hops",
                    format!(
                        "{} is out of range: expected 0 (the TCP peer is the client) to 32",
                        hops.get_ref()
                    ),
                );
                Trust::Hops(0)
            }
        },
        (None, Some(proxies)) => {
            let span = proxies.span();
            Trust::Proxies(networks(
                proxies.get_ref(),
                "client_ip.trusted_proxies",
                span,
                errors,
            ))
        }
        (None, None) => Trust::Hops(0),
    };
    ClientIpSettings {
        trust,
        ipv4_prefix,
        ipv6_prefix,
        x_real_ip: raw.x_real_ip.unwrap_or(true),
    }
}

/// Parses networks (`"10.0.0.0/8"`) and single addresses (`"10.0.0.1"`, taken as /32 or /128).
pub(super) fn networks(
    texts: &[String],
    key: &str,
    span: Range<usize>,
    errors: &mut Errors<'_>,
) -> Vec<IpNet> {
    texts
        .iter()
        .filter_map(|text| {
            let parsed = text
                .parse::<IpNet>()
                .or_else(|_| text.parse::<std::net::IpAddr>().map(IpNet::from));
            match parsed {
                Ok(network) => Some(network.trunc()),
                Err(_) => {
                    errors.at(Some(span.clone()), key, format!("invalid network {text:?}: expected CIDR such as \"10.0.0.0/8\" or \"fd00::/8\", or an address"));
                    None
                }
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::testing::{error, policy};
    use crate::client_ip::Trust;
    use crate::config::Http1Path;

    #[test]
    fn the_admin_listener_never_shares_the_public_address() {
        let text = |public: &str, admin: &str| {
            format!("[server]\nlisten = [\"{public}\"]\n[admin]\nlisten = \"{admin}\"\n")
        };
        assert_eq!(
            error(&text("0.0.0.0:8080", "127.0.0.1:8080")).0,
            "admin.listen"
        );
        assert_eq!(
            error(&text("127.0.0.1:8080", "127.0.0.1:8080")).0,
            "admin.listen"
        );
        policy(&text("0.0.0.0:8080", "127.0.0.1:9090"));
        policy(&text("127.0.0.1:0", "127.0.0.1:0"));
        policy(&text("127.0.0.1:8080", "127.0.0.2:8080"));
    }

    #[test]
    fn defaults_listen_on_8080_with_the_admin_on_loopback() {
        let policy = policy("");
        let server = &policy.server;
        assert_eq!(server.listen, ["0.0.0.0:8080".parse().unwrap()]);
        assert_eq!(policy.admin.listen, "127.0.0.1:9090".parse().unwrap());
        assert_eq!(policy.admin.max_connections, 64);
        assert_eq!(server.max_header_bytes, 16384);
        assert_eq!(server.max_buffered_body, 64 * 1024);
        assert_eq!(server.header_read_timeout, Duration::from_secs(10));
        assert_eq!(server.idle_timeout, Duration::from_secs(60));
        assert_eq!(server.grace_period, Duration::from_secs(30));
        assert_eq!(server.http1, Http1Path::Fast);
        assert_eq!(policy.client_ip.trust, Trust::Hops(0));
        assert_eq!(
            (policy.client_ip.ipv4_prefix, policy.client_ip.ipv6_prefix),
            (32, 64)
        );
    }

    #[test]
    fn settings_are_read_and_checked() {
        let policy = policy(
            "[server]\nlisten = [\"[::]:80\", \"127.0.0.1:81\"]\nmax_header_bytes = 8192\nmax_buffered_body = \"1MiB\"\nidle_timeout = \"5s\"\nhttp1 = \"hyper\"\n",
        );
        assert_eq!(policy.server.http1, Http1Path::Hyper);
        assert_eq!(policy.server.listen.len(), 2);
        assert_eq!(policy.server.max_header_bytes, 8192);
        assert_eq!(policy.server.max_buffered_body, 1 << 20);
        assert_eq!(policy.server.idle_timeout, Duration::from_secs(5));
        assert_eq!(
            error("[server]\nmax_header_bytes = 100\n"),
            (
                "server.max_header_bytes".to_owned(),
                "100 is out of range: expected 8192 to 1048576".to_owned()
            )
        );
        assert_eq!(error("[server]\nlisten = []\n").0, "server.listen");
        assert_eq!(
            error("[server]\nidle_timeout = \"0s\"\n").0,
            "server.idle_timeout"
        );
        assert_eq!(
            error("[server]\nmax_buffered_body = 0\n").0,
            "server.max_buffered_body"
        );
    }

    #[test]
    fn client_ip_trusts_hops_or_networks_never_both() {
        let hops = policy("[client_ip]\ntrusted_hops = 2\nipv6_prefix = 56\n");
        assert_eq!(hops.client_ip.trust, Trust::Hops(2));
        assert_eq!(hops.client_ip.ipv6_prefix, 56);
        let proxies = policy("[client_ip]\ntrusted_proxies = [\"10.1.2.3/8\", \"fd00::1\"]\n");
        assert_eq!(
            proxies.client_ip.trust,
            Trust::Proxies(vec![
                "10.0.0.0/8".parse().unwrap(),
                "fd00::1/128".parse().unwrap()
            ]),
            "networks are truncated to their prefix, addresses taken whole"
        );
        assert_eq!(
            error("[client_ip]\ntrusted_hops = 1\ntrusted_proxies = [\"10.0.0.0/8\"]\n").0,
            "client_ip"
        );
        assert_eq!(
            error("[client_ip]\ntrusted_hops = 33\n").0,
            "client_ip.trusted_hops"
        );
        assert_eq!(
            error("[client_ip]\nipv4_prefix = 33\n"),
            (
                "client_ip.ipv4_prefix".to_owned(),
                "prefix length 33 is out of range: expected 0 to 32".to_owned()
            )
        );
        assert_eq!(
            error("[client_ip]\ntrusted_proxies = [\"10.0.0.0/33\"]\n").0,
            "client_ip.trusted_proxies"
        );
    }
}
