//! `[top]`: how many heavy hitters each limit tracks.

use serde::Deserialize;
use toml::Spanned;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawTop {
    pub keys_per_limit: Option<Spanned<i64>>,
}
