//! Resolving the client address from the TCP peer and `X-Forwarded-For`.
//!
//! The client writes `X-Forwarded-For` itself, so only the hops that the operator's own
//! proxies appended can be believed: exactly `trusted_hops` entries from the right, or
//! exactly the entries appended by addresses inside `trusted_proxies`.

use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

/// How many forwarding hops are believed.
#[derive(Debug, Clone, PartialEq)]
pub enum Trust {
    /// The client is the entry `n` places from the right of `X-Forwarded-For` + peer.
    Hops(usize),
    /// Walk leftwards from the peer while the address is inside one of these networks.
    Proxies(Vec<IpNet>),
}

impl Trust {
    /// Whether the TCP peer is a proxy of the operator's, whose forwarding fields (`Forwarded`,
    /// `X-Real-IP`) may be passed on: with `trusted_hops` > 0 every peer is taken for one,
    /// with `trusted_proxies` a peer inside them.
    pub fn trusts_peer(&self, peer: IpAddr) -> bool {
        match self {
            Trust::Hops(hops) => *hops > 0,
            Trust::Proxies(networks) => {
                let peer = peer.to_canonical();
                networks.iter().any(|network| network.contains(&peer))
            }
        }
    }
}

/// The resolved client, and anything about the request that suggests misconfiguration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resolved {
    pub client: IpAddr,
    pub warning: Option<TrustWarning>,
}

/// Signs that the trust configuration does not match the traffic (logged once per cause).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TrustWarning {
    /// `X-Forwarded-For` arrived while no hop is trusted: a proxy in front is not configured.
    ForwardedButNoHopTrusted,
    /// A peer outside `trusted_proxies` sent `X-Forwarded-For`.
    ForwardedByUntrustedPeer,
    /// The chain was shorter than `trusted_hops`: a client may be bypassing the proxy.
    ChainShorterThanTrustedHops,
    /// More distinct peers sent `X-Forwarded-For` than proxies usually are, while hops are
    /// trusted: clients may be reaching tollgate directly and choosing their own address.
    ForwardedByManyPeers,
}

/// How many distinct peers may send forwarding headers to a gateway that trusts hops before
/// they look like clients rather than proxies.
pub const MANY_FORWARDING_PEERS: usize = 16;

impl TrustWarning {
    pub const ALL: [TrustWarning; 4] = [
        TrustWarning::ForwardedButNoHopTrusted,
        TrustWarning::ForwardedByUntrustedPeer,
        TrustWarning::ChainShorterThanTrustedHops,
        TrustWarning::ForwardedByManyPeers,
    ];

    /// The metric label and log cause.
    pub fn as_str(self) -> &'static str {
        match self {
            TrustWarning::ForwardedButNoHopTrusted => "forwarded_but_no_hop_trusted",
            TrustWarning::ForwardedByUntrustedPeer => "forwarded_by_untrusted_peer",
            TrustWarning::ChainShorterThanTrustedHops => "chain_shorter_than_trusted_hops",
            TrustWarning::ForwardedByManyPeers => "forwarded_by_many_peers",
        }
    }

    pub fn explanation(self) -> &'static str {
        match self {
            TrustWarning::ForwardedButNoHopTrusted => {
                "X-Forwarded-For received but trusted_hops = 0: if a proxy sits in front of tollgate, every client shares its bucket; set [client_ip] trusted_hops or trusted_proxies"
            }
            TrustWarning::ForwardedByUntrustedPeer => {
                "X-Forwarded-For received from a peer outside trusted_proxies: it was ignored; add the proxy's network to trusted_proxies if it is yours"
            }
            TrustWarning::ChainShorterThanTrustedHops => {
                "X-Forwarded-For chain shorter than trusted_hops: clients may be reaching tollgate without passing through the proxy"
            }
            TrustWarning::ForwardedByManyPeers => {
                "X-Forwarded-For arrives from more than 16 different peer addresses while trusted_hops > 0: proxies are rarely that many, so clients are likely reaching tollgate directly and choosing the address their limits key on; set trusted_hops = 0, or trusted_proxies to your proxies' networks"
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unparseable X-Forwarded-For entry {entry:?} at the position that decides the client")]
pub struct UnparseableEntry {
    pub entry: String,
}

/// A chain's entries. A Vec: collecting none costs nothing (a SmallVec's extend cost 846
/// instructions a request without the field).
type Entries<'a> = Vec<&'a str>;

/// Resolves the client of a request that arrived from `peer` with these `X-Forwarded-For`
/// header values (every line, in order).
pub fn resolve<'a>(
    trust: &Trust,
    peer: IpAddr,
    forwarded_for: impl IntoIterator<Item = &'a str>,
) -> Result<Resolved, UnparseableEntry> {
    let peer = peer.to_canonical();
    // Chains are short; collecting them keeps the walk from the right simple.
    let entries: Entries<'_> = forwarded_for
        .into_iter()
        .flat_map(|line| line.split(','))
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .collect();
    match trust {
        Trust::Hops(hops) => Ok(resolve_by_hops(*hops, peer, &entries)?),
        Trust::Proxies(networks) => Ok(resolve_by_proxies(networks, peer, &entries)?),
    }
}

/// Why the client of an asked-about request (the decision listener) cannot be told.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AskedError {
    #[error("X-Forwarded-For is missing: the asking proxy must send the client's address (nginx: proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for)")]
    NoForwardedFor,
    #[error(transparent)]
    Unparseable(#[from] UnparseableEntry),
}

/// Resolves the client of a request another proxy asks about. That proxy is the TCP peer and
/// is trusted as one hop: the entry it added, the rightmost, stands where the peer stands for
/// [`resolve`], and `trust` counts on from there (`trusted_hops = 0` takes that entry). What a
/// client wrote before it is not a warning here: the asking proxy appends to it.
pub fn resolve_asked<'a>(
    trust: &Trust,
    forwarded_for: impl IntoIterator<Item = &'a str>,
) -> Result<Resolved, AskedError> {
    let mut entries: Entries<'_> = forwarded_for
        .into_iter()
        .flat_map(|line| line.split(','))
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .collect();
    let added = entries.pop().ok_or(AskedError::NoForwardedFor)?;
    let peer = parse_entry(added)?;
    let mut resolved = match trust {
        Trust::Hops(hops) => resolve_by_hops(*hops, peer, &entries)?,
        Trust::Proxies(networks) => resolve_by_proxies(networks, peer, &entries)?,
    };
    if matches!(
        resolved.warning,
        Some(TrustWarning::ForwardedButNoHopTrusted | TrustWarning::ForwardedByUntrustedPeer)
    ) {
        resolved.warning = None;
    }
    Ok(resolved)
}

fn resolve_by_hops(
    hops: usize,
    peer: IpAddr,
    entries: &[&str],
) -> Result<Resolved, UnparseableEntry> {
    if hops == 0 {
        let warning = (!entries.is_empty()).then_some(TrustWarning::ForwardedButNoHopTrusted);
        return Ok(Resolved {
            client: peer,
            warning,
        });
    }
    // The chain is entries followed by the peer; the peer is 0 places from the right.
    let (position, warning) = if entries.len() >= hops {
        (entries.len() - hops, None)
    } else {
        (0, Some(TrustWarning::ChainShorterThanTrustedHops))
    };
    let client = match entries.get(position) {
        Some(entry) => parse_entry(entry)?,
        None => peer,
    };
    Ok(Resolved { client, warning })
}

fn resolve_by_proxies(
    networks: &[IpNet],
    peer: IpAddr,
    entries: &[&str],
) -> Result<Resolved, UnparseableEntry> {
    let trusted = |address: &IpAddr| networks.iter().any(|network| network.contains(address));
    if !trusted(&peer) {
        let warning = (!entries.is_empty()).then_some(TrustWarning::ForwardedByUntrustedPeer);
        return Ok(Resolved {
            client: peer,
            warning,
        });
    }
    let mut client = peer;
    for entry in entries.iter().rev() {
        client = parse_entry(entry)?;
        if !trusted(&client) {
            break;
        }
    }
    Ok(Resolved {
        client,
        warning: None,
    })
}

/// Parses one entry: an address, optionally with a port (`1.2.3.4:5678`, `[2001:db8::1]:443`)
/// or in brackets (`[2001:db8::1]`). IPv4-mapped IPv6 addresses become IPv4.
pub fn parse_entry(entry: &str) -> Result<IpAddr, UnparseableEntry> {
    let parsed = entry
        .parse::<IpAddr>()
        .ok()
        .or_else(|| entry.parse::<SocketAddr>().ok().map(|socket| socket.ip()))
        .or_else(|| {
            entry
                .strip_prefix('[')
                .and_then(|rest| rest.strip_suffix(']'))
                .and_then(|inner| inner.parse::<std::net::Ipv6Addr>().ok())
                .map(IpAddr::V6)
        });
    parsed
        .map(|address| address.to_canonical())
        .ok_or_else(|| UnparseableEntry {
            entry: entry.chars().take(64).collect(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_asking_proxy_is_one_trusted_hop() {
        let hops = |n| Trust::Hops(n);
        let client = |trust: &Trust, lines: &[&str]| {
            resolve_asked(trust, lines.iter().copied()).map(|resolved| resolved.client)
        };
        let ip = |text: &str| text.parse::<IpAddr>().unwrap();
        // A client's own X-Forwarded-For, appended to by nginx: the appended entry decides.
        assert_eq!(
            client(&hops(0), &["6.6.6.6, 7.7.7.7", "203.0.113.9"]),
            Ok(ip("203.0.113.9"))
        );
        assert_eq!(client(&hops(0), &["203.0.113.9"]), Ok(ip("203.0.113.9")));
        // One load balancer in front of the asking proxy.
        assert_eq!(
            client(&hops(1), &["6.6.6.6, 203.0.113.9, 10.0.0.2"]),
            Ok(ip("203.0.113.9"))
        );
        let proxies = Trust::Proxies(vec!["10.0.0.0/8".parse().unwrap()]);
        assert_eq!(
            client(&proxies, &["6.6.6.6, 203.0.113.9, 10.0.0.2"]),
            Ok(ip("203.0.113.9"))
        );
        assert_eq!(
            client(&proxies, &["6.6.6.6, 203.0.113.9"]),
            Ok(ip("203.0.113.9"))
        );
        assert_eq!(client(&hops(0), &[]), Err(AskedError::NoForwardedFor));
        assert_eq!(client(&hops(0), &[" , "]), Err(AskedError::NoForwardedFor));
        assert!(matches!(
            client(&hops(0), &["1.2.3.4, junk"]),
            Err(AskedError::Unparseable(_))
        ));
        let quiet = resolve_asked(&hops(0), ["6.6.6.6, 203.0.113.9"]).unwrap();
        assert_eq!(quiet.warning, None);
    }

    #[test]
    fn a_peer_is_trusted_only_as_a_proxy_the_policy_names() {
        let peer: IpAddr = "10.1.2.3".parse().unwrap();
        assert!(!Trust::Hops(0).trusts_peer(peer));
        assert!(Trust::Hops(2).trusts_peer(peer));
        let networks = Trust::Proxies(vec!["10.0.0.0/8".parse().unwrap()]);
        assert!(networks.trusts_peer(peer));
        assert!(networks.trusts_peer("::ffff:10.1.2.3".parse().unwrap()));
        assert!(!networks.trusts_peer("192.0.2.1".parse().unwrap()));
    }

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    fn hops(n: usize, peer: &str, lines: &[&str]) -> Result<Resolved, UnparseableEntry> {
        resolve(&Trust::Hops(n), ip(peer), lines.iter().copied())
    }

    fn proxies(nets: &[&str], peer: &str, lines: &[&str]) -> Result<Resolved, UnparseableEntry> {
        let nets = nets.iter().map(|n| n.parse().unwrap()).collect();
        resolve(&Trust::Proxies(nets), ip(peer), lines.iter().copied())
    }

    #[test]
    fn zero_hops_is_the_peer_and_warns_about_forwarded_headers() {
        let resolved = hops(0, "198.51.100.7", &["203.0.113.9"]).unwrap();
        assert_eq!(resolved.client, ip("198.51.100.7"));
        assert_eq!(
            resolved.warning,
            Some(TrustWarning::ForwardedButNoHopTrusted)
        );
        assert_eq!(hops(0, "198.51.100.7", &[]).unwrap().warning, None);
    }

    #[test]
    fn one_hop_takes_the_entry_the_proxy_appended() {
        let resolved = hops(1, "10.0.0.1", &["203.0.113.9"]).unwrap();
        assert_eq!(resolved.client, ip("203.0.113.9"));
        assert_eq!(resolved.warning, None);
    }

    #[test]
    fn spoofed_entries_to_the_left_are_ignored() {
        // The client wrote "1.1.1.1, 2.2.2.2"; the proxy appended the real address.
        let resolved = hops(1, "10.0.0.1", &["1.1.1.1, 2.2.2.2, 203.0.113.9"]).unwrap();
        assert_eq!(resolved.client, ip("203.0.113.9"));
        // Garbage written by the client left of the deciding position does not matter.
        let resolved = hops(1, "10.0.0.1", &["not-an-ip, 203.0.113.9"]).unwrap();
        assert_eq!(resolved.client, ip("203.0.113.9"));
    }

    #[test]
    fn several_header_lines_form_one_chain_in_order() {
        let resolved = hops(2, "10.0.0.2", &["1.1.1.1", "203.0.113.9, 10.0.0.1"]).unwrap();
        assert_eq!(resolved.client, ip("203.0.113.9"));
    }

    #[test]
    fn shorter_chain_takes_the_leftmost_entry_and_warns() {
        let resolved = hops(3, "10.0.0.2", &["203.0.113.9"]).unwrap();
        assert_eq!(resolved.client, ip("203.0.113.9"));
        assert_eq!(
            resolved.warning,
            Some(TrustWarning::ChainShorterThanTrustedHops)
        );
        let resolved = hops(2, "198.51.100.7", &[]).unwrap();
        assert_eq!(resolved.client, ip("198.51.100.7"));
        assert_eq!(
            resolved.warning,
            Some(TrustWarning::ChainShorterThanTrustedHops)
        );
    }

    #[test]
    fn unparseable_entry_at_the_deciding_position_is_an_error() {
        assert!(hops(1, "10.0.0.1", &["203.0.113.9, unknown"]).is_err());
        assert!(hops(1, "10.0.0.1", &["203.0.113.999"]).is_err());
        assert!(hops(2, "10.0.0.1", &["_hidden, 10.0.0.5"]).is_err());
    }

    #[test]
    fn entries_with_ports_and_brackets() {
        assert_eq!(
            hops(1, "10.0.0.1", &["1.2.3.4:5678"]).unwrap().client,
            ip("1.2.3.4")
        );
        assert_eq!(
            hops(1, "10.0.0.1", &["[2001:db8::1]:443"]).unwrap().client,
            ip("2001:db8::1")
        );
        assert_eq!(
            hops(1, "10.0.0.1", &["[2001:db8::1]"]).unwrap().client,
            ip("2001:db8::1")
        );
        assert_eq!(
            hops(1, "10.0.0.1", &["2001:DB8:0:0::1"]).unwrap().client,
            ip("2001:db8::1")
        );
    }

    #[test]
    fn ipv4_mapped_addresses_are_ipv4_clients() {
        assert_eq!(
            hops(0, "::ffff:198.51.100.7", &[]).unwrap().client,
            ip("198.51.100.7")
        );
        assert_eq!(
            hops(1, "10.0.0.1", &["::ffff:203.0.113.9"]).unwrap().client,
            ip("203.0.113.9")
        );
    }

    #[test]
    fn trusted_proxies_peel_only_trusted_hops() {
        let nets = ["10.0.0.0/8", "fd00::/8"];
        let resolved = proxies(&nets, "10.0.0.2", &["1.1.1.1, 203.0.113.9, 10.0.0.1"]).unwrap();
        assert_eq!(resolved.client, ip("203.0.113.9"));
        // A peer outside the trusted networks is the client, whatever it claims.
        let resolved = proxies(&nets, "198.51.100.7", &["203.0.113.9"]).unwrap();
        assert_eq!(resolved.client, ip("198.51.100.7"));
        assert_eq!(
            resolved.warning,
            Some(TrustWarning::ForwardedByUntrustedPeer)
        );
        // All trusted: the leftmost is the client.
        let resolved = proxies(&nets, "10.0.0.2", &["10.0.0.3"]).unwrap();
        assert_eq!(resolved.client, ip("10.0.0.3"));
        // No header from a trusted peer: the peer itself.
        assert_eq!(
            proxies(&nets, "fd00::1", &[]).unwrap().client,
            ip("fd00::1")
        );
        // Garbage where the walk stops is an error; beyond it, irrelevant.
        assert!(proxies(&nets, "10.0.0.2", &["203.0.113.9, garbage"]).is_err());
        assert!(proxies(&nets, "10.0.0.2", &["garbage, 203.0.113.9"]).is_ok());
    }
}
