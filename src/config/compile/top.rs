//! `[top]` compiled.

use super::Errors;
use crate::config::raw::RawTop;
use crate::config::TopSettings;

/// More counters than this per limit would cost memory (every thread keeps a table per limit)
/// without listing anything an operator reads.
const MAX_KEYS_PER_LIMIT: i64 = 100_000;

pub(super) fn compile_top(raw: RawTop, errors: &mut Errors<'_>) -> TopSettings {
    let keys_per_limit = match raw.keys_per_limit {
        None => TopSettings::default().keys_per_limit,
        Some(keys) => {
            let (span, keys) = (keys.span(), *keys.get_ref());
            if !(0..=MAX_KEYS_PER_LIMIT).contains(&keys) {
                errors.at(
                    Some(span),
                    "top.keys_per_limit",
                    format!("must be between 0 (top keys off) and {MAX_KEYS_PER_LIMIT}"),
                );
            }
            keys.clamp(0, MAX_KEYS_PER_LIMIT) as usize
        }
    };
    TopSettings { keys_per_limit }
}
