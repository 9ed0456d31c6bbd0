//! The rate-limit headers of `[server] ratelimit_headers`, on refusals and admitted
//! responses alike: the legacy `RateLimit-Limit`/`-Remaining`/`-Reset` of the most constrained
//! limit, and the IETF draft's `RateLimit-Policy` and `RateLimit` lists.

use http::header::HeaderName;

use super::{retry_after_seconds, whole, FieldValue, SetFields};
use crate::config::HeaderMode;
use crate::reject::LimitReport;

static RATELIMIT_LIMIT: HeaderName = HeaderName::from_static("ratelimit-limit");
static RATELIMIT_REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
static RATELIMIT_RESET: HeaderName = HeaderName::from_static("ratelimit-reset");
static RATELIMIT_POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
static RATELIMIT: HeaderName = HeaderName::from_static("ratelimit");

impl LimitReport<'_> {
    fn remaining(&self) -> u64 {
        whole(self.tokens.max(0.0).floor())
    }

    /// How many more requests of this cost the limit admits now.
    fn requests_left(&self) -> f64 {
        (self.tokens / self.cost).floor()
    }
}

/// Adds the headers of `mode` describing `reports` (no headers when there is no report).
pub fn add_ratelimit_headers(
    headers: &mut SetFields,
    mode: HeaderMode,
    reports: &[LimitReport<'_>],
) {
    if reports.is_empty() {
        return;
    }
    if matches!(mode, HeaderMode::Legacy | HeaderMode::Both) {
        add_legacy_headers(headers, reports);
    }
    if matches!(mode, HeaderMode::Ietf | HeaderMode::Both) {
        add_ietf_headers(headers, reports);
    }
}

/// The most constrained limit: on a refusal the refusing one with the longest wait,
/// otherwise the one that admits the fewest further requests of this route.
fn most_constrained<'r, 'a>(reports: &'r [LimitReport<'a>]) -> Option<&'r LimitReport<'a>> {
    let refused = reports
        .iter()
        .filter(|report| report.refused)
        .max_by(|a, b| a.wait.total_cmp(&b.wait));
    refused.or_else(|| {
        reports.iter().min_by(|a, b| {
            a.requests_left()
                .total_cmp(&b.requests_left())
                .then(b.full_in.total_cmp(&a.full_in))
        })
    })
}

fn add_legacy_headers(headers: &mut SetFields, reports: &[LimitReport<'_>]) {
    let Some(report) = most_constrained(reports) else {
        return;
    };
    let mut reset = whole(report.full_in.ceil());
    if report.refused {
        reset = reset.max(retry_after_seconds(report.wait));
    }
    headers.set(
        &RATELIMIT_LIMIT,
        FieldValue::Number(whole(report.capacity.floor())),
    );
    headers.set(&RATELIMIT_REMAINING, FieldValue::Number(report.remaining()));
    headers.set(&RATELIMIT_RESET, FieldValue::Number(reset));
}

/// `RateLimit-Policy: "name";q=<capacity>;w=<seconds to refill>` and
/// `RateLimit: "name";r=<remaining>;t=<seconds>` where `t` is, for a refusing policy, the
/// wait until the request would pass, otherwise the wait for the next whole token
/// (0 when full). For a calendar quota (rate 0), `w` and `t` run to its period's end. Names
/// are limit names, never client keys.
fn add_ietf_headers(headers: &mut SetFields, reports: &[LimitReport<'_>]) {
    let mut policy = String::new();
    let mut state = String::new();
    for (index, report) in reports.iter().enumerate() {
        if index > 0 {
            policy.push_str(", ");
            state.push_str(", ");
        }
        let quota = report.rate <= 0.0;
        let window = if quota {
            whole(report.full_in.ceil()).max(1)
        } else {
            whole((report.capacity / report.rate).ceil()).max(1)
        };
        policy.push_str(&format!(
            "\"{}\";q={};w={window}",
            report.name,
            whole(report.capacity.floor())
        ));
        let t = if report.refused {
            retry_after_seconds(report.wait)
        } else if report.tokens >= report.capacity {
            0
        } else if quota {
            whole(report.full_in.ceil())
        } else {
            let next = report.tokens.max(0.0).floor() + 1.0;
            whole(((next.min(report.capacity) - report.tokens) / report.rate).ceil())
        };
        state.push_str(&format!(
            "\"{}\";r={};t={t}",
            report.name,
            report.remaining()
        ));
    }
    headers.set(&RATELIMIT_POLICY, FieldValue::Text(policy));
    headers.set(&RATELIMIT, FieldValue::Text(state));
}
