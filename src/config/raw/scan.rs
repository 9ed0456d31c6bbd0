//! `[scan]`: many distinct paths answered "not found" to one key within a short window.

use serde::Deserialize;
use toml::Spanned;

use super::{HumanDuration, RawKey};
use crate::config::Normalize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawScan {
    pub key: Spanned<RawKey>,
    pub normalize: Option<Normalize>,
    pub ipv4_prefix: Option<Spanned<i64>>,
    pub ipv6_prefix: Option<Spanned<i64>>,
    pub statuses: Option<Spanned<Vec<i64>>>,
    pub distinct_paths: Option<Spanned<i64>>,
    pub within: Option<Spanned<HumanDuration>>,
    pub ban: Option<Spanned<HumanDuration>>,
    pub exempt: Option<Spanned<Vec<String>>>,
}
