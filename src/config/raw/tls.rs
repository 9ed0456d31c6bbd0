//! `[server.tls]` as written: the short `tls = { cert, key }` and the table with several
//! certificates share one shape.

use serde::Deserialize;
use toml::Spanned;

use super::HumanDuration;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTls {
    pub cert: Option<String>,
    pub key: Option<String>,
    pub min_version: Option<Spanned<String>>,
    pub hsts: Option<Spanned<String>>,
    pub redirect_plain: Option<bool>,
    #[serde(default)]
    pub certificates: Vec<RawCertificate>,
    pub acme: Option<RawAcme>,
}

/// `[server.tls.acme]`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawAcme {
    pub directory: String,
    pub email: Option<String>,
    pub hosts: Vec<String>,
    pub challenge: Option<String>,
    pub state_dir: String,
    pub renew_before: Option<HumanDuration>,
    pub ca_file: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawCertificate {
    #[serde(default)]
    pub hosts: Vec<String>,
    pub cert: String,
    pub key: String,
}
