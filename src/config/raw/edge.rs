//! `[server.connections]`, `[server] proxy_protocol` and `[server.http3]` as written.

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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawHttp3 {
    pub listen: Spanned<Vec<String>>,
    pub early_data: Option<bool>,
}
