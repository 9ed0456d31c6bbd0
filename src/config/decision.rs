//! `[decision]` compiled: the listener other proxies ask for decisions (forward-auth and
//! Envoy's rate limit service), who may ask, and how descriptors map to limits.

use std::net::SocketAddr;
use std::sync::Arc;

use http::StatusCode;
use ipnet::IpNet;

use super::{Limit, StoreFailurePolicy};

#[derive(Debug, Clone, PartialEq)]
pub struct DecisionSettings {
    /// HTTP/1.1 forward-auth and gRPC (h2c) on one port, without TLS.
    pub listen: SocketAddr,
    /// Peers that may ask; any other gets 403.
    pub allow: Vec<IpNet>,
    /// The status of a refusal (429; 403 for nginx's `auth_request`).
    /// The status of every refusal, when set; else each limit's (`[limits.NAME.refusal]`),
    /// else 429.
    pub refuse_status: Option<StatusCode>,
    /// In the file's order; no two share a domain and entry list.
    pub descriptors: Vec<DescriptorRule>,
}

impl DecisionSettings {
    pub fn allows(&self, peer: std::net::IpAddr) -> bool {
        let peer = peer.to_canonical();
        self.allow.iter().any(|network| network.contains(&peer))
    }
}

/// A `[[decision.descriptors]]` rule: the descriptors it matches, and the limit that decides
/// them.
#[derive(Debug, Clone, PartialEq)]
pub struct DescriptorRule {
    pub domain: String,
    pub entries: Vec<DescriptorEntry>,
    pub limit: Arc<Limit>,
    pub on_store_failure: StoreFailurePolicy,
}

/// An entry a matching descriptor must have, in its place: with this value, or any value
/// (which then keys the bucket).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DescriptorEntry {
    pub key: String,
    pub value: Option<String>,
}
