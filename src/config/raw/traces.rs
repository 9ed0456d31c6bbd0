//! `[tracing]` as written.

use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTracing {
    pub otlp_endpoint: Option<String>,
    pub protocol: Option<String>,
    pub sample_ratio: Option<f64>,
    pub service_name: Option<String>,
}
