//! `[overrides]`: where the memory store keeps overrides, and how long one may last.

use serde::Deserialize;
use toml::Spanned;

use super::HumanDuration;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawOverrides {
    pub file: Option<Spanned<String>>,
    pub max_ttl: Option<Spanned<HumanDuration>>,
}
