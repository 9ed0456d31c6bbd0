//! `[server.connections]` and `[server] proxy_protocol` as written.

use serde::Deserialize;
use toml::Spanned;

use super::HumanRate;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConnections {
    pub max: Option<Spanned<i64>>,
    pub per_network: Option<Spanned<RawNetworkRate>>,
    pub max_per_network: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawNetworkRate {
    pub capacity: Spanned<f64>,
    pub rate: HumanRate,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawProxyProtocol {
    pub from: Spanned<Vec<String>>,
}
