//! `[server.connections]` and `[server] proxy_protocol`, compiled: what a proxy listener checks
//! of a connection before it reads a byte of its request; and `[server.http3]`.

use ipnet::IpNet;

/// `[server.connections]`: each unset by default (no limit).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ConnectionLimits {
    /// Open client connections in all.
    pub max: Option<usize>,
    /// New connections per client network: a token bucket.
    pub per_network: Option<NetworkRate>,
    /// Open connections per client network.
    pub max_per_network: Option<u32>,
}

impl ConnectionLimits {
    /// Whether connections are counted per client network.
    pub fn per_network_apply(&self) -> bool {
        self.per_network.is_some() || self.max_per_network.is_some()
    }
}

/// `per_network = { capacity, rate }`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct NetworkRate {
    pub capacity: f64,
    /// Connections per second.
    pub rate: f64,
}

/// `[server] proxy_protocol = { from = [...] }`: peers whose connections begin with a PROXY
/// header (v1 or v2).
#[derive(Debug, Clone, PartialEq)]
pub struct ProxyProtocol {
    pub from: Vec<IpNet>,
}

impl ProxyProtocol {
    pub fn expected_from(&self, peer: std::net::IpAddr) -> bool {
        self.from.iter().any(|network| network.contains(&peer))
    }
}

/// `[server.http3]`: HTTP/3 over QUIC on UDP, with the TCP listeners' certificates.
#[derive(Debug, Clone, PartialEq)]
pub struct Http3Settings {
    pub listen: Vec<std::net::SocketAddr>,
    /// 0-RTT: requests in early data (only safe methods are forwarded).
    pub early_data: bool,
}
