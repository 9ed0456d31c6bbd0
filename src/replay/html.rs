//! `tollgate replay --report FILE.html`: the report as one self-contained page, readable
//! without scripts or a network: the table, then per limit a chart of admitted and refused
//! requests over time and one of keys' peak usage against the capacity.

use std::fmt::Write as _;

use super::svg::{self, escape};
use super::{Comparison, LimitReport, Report};

/// Bars in a timeline chart: enough to see an hour's burst in a day.
const TIMELINE_BARS: usize = 240;

const STYLE: &str = "body{font-family:sans-serif;margin:2em;color:#222;max-width:64em}\
table{border-collapse:collapse}td,th{padding:.25em .75em;border-bottom:1px solid #ddd;text-align:right}\
td:first-child,td:nth-child(2),th:first-child,th:nth-child(2){text-align:left}\
section{margin-top:2.5em}h2{font-size:1.15em}.note{color:#666}.key{font-family:monospace}\
.legend span{display:inline-block;width:.8em;height:.8em;margin:0 .3em 0 1em}\
.pair{display:flex;gap:1.5em}.pair>div{flex:1;min-width:0}svg{max-width:100%;height:auto}h3{font-size:1em}";

impl Report {
    /// The whole page; `policy` names the policy file replayed, `comparison` the same log
    /// under another policy (`--compare`).
    pub fn to_html(&self, policy: &str, comparison: Option<&Comparison>) -> String {
        let mut page = String::with_capacity(64 * 1024);
        let _ = write!(
            page,
            "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>tollgate replay: {policy}</title><style>{STYLE}</style></head><body><h1>tollgate replay</h1><p>Policy <code>{policy}</code>: {} requests replayed; {} not decided by limits (bad requests, no route); {} match no route of this policy; {} bad lines.</p>",
            self.lines,
            self.undecided,
            self.unrouted,
            self.bad_lines,
            policy = escape(policy),
        );
        for (line, why) in &self.first_bad_lines {
            let _ = write!(page, "<p class=\"note\">line {line}: {}</p>", escape(why));
        }
        if let Some(order) = self.time_order() {
            let _ = write!(page, "<p class=\"note\">{}</p>", escape(&order));
        }
        page.push_str("<table><tr><th>route</th><th>limit</th><th>requests</th><th>refused</th><th>share</th><th>keys refused</th><th>capacity for 99% of keys</th><th>for every key</th><th>not replayable</th></tr>");
        for limit in &self.limits {
            let capacity =
                |value: Option<f64>| value.map_or("–".to_owned(), |value| value.to_string());
            let _ = write!(
                page,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1}%</td><td>{} of {}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&limit.route),
                escape(&limit.limit),
                limit.requests,
                limit.refusals,
                limit.refused_share() * 100.0,
                limit.keys_refused,
                limit.keys,
                capacity(limit.capacity_for_99_percent),
                capacity(limit.capacity_for_all),
                limit.not_replayable,
            );
        }
        page.push_str("</table>");
        if let Some(comparison) = comparison {
            page.push_str(&comparison.to_html());
        }
        for limit in &self.limits {
            // Under --compare, the other policy's charts of the same route and limit beside.
            let other = comparison.and_then(|comparison| {
                let found = comparison
                    .other_limits
                    .iter()
                    .find(|other| other.route == limit.route && other.limit == limit.limit)?;
                Some((found, comparison.other_policy.as_str()))
            });
            section(&mut page, limit, other);
        }
        page.push_str("</body></html>\n");
        page
    }
}

fn section(page: &mut String, limit: &LimitReport, other: Option<(&LimitReport, &str)>) {
    let _ = write!(
        page,
        "<section><h2>{} · {}</h2>",
        escape(&limit.route),
        escape(&limit.limit),
    );
    match other {
        None => charts(page, limit),
        Some((other, other_policy)) => {
            page.push_str("<div class=\"pair\"><div><h3>this policy</h3>");
            charts(page, limit);
            let _ = write!(page, "</div><div><h3>{}</h3>", escape(other_policy));
            charts(page, other);
            page.push_str("</div></div>");
        }
    }
    top_keys(page, limit);
    page.push_str("</section>");
}

/// A limit's summary line and its two charts: requests over time, and keys' peak usage.
fn charts(page: &mut String, limit: &LimitReport) {
    let _ = write!(
        page,
        "<p>{}: {} of {} requests refused ({:.1}%); keys refused: {} of {}.</p>",
        escape(&limit.configured),
        limit.refusals,
        limit.requests,
        limit.refused_share() * 100.0,
        limit.keys_refused,
        limit.keys,
    );
    if let Some(rate) = limit.rate_for_99_percent {
        let _ = write!(
            page,
            "<p>99 % of keys averaged at most {} tokens a second from their first request to their last (configured: {}).</p>",
            super::report::round(rate),
            super::report::round(limit.rate),
        );
    }
    if limit.not_replayable > 0 {
        let _ = write!(
            page,
            "<p class=\"note\">{} requests are not replayable from this log: it does not carry this limit's key.</p>",
            limit.not_replayable
        );
    }
    match limit.timeline.start {
        None => {
            page.push_str("<p class=\"note\">No request of this log was decided by this limit.</p>")
        }
        Some(start) => {
            let (width, bins) = limit.timeline.coarsened(TIMELINE_BARS);
            let _ = write!(
                page,
                "<p class=\"legend\"><span style=\"background:{}\"></span>admitted<span style=\"background:{}\"></span>refused</p>",
                svg::ADMITTED,
                svg::REFUSED
            );
            page.push_str(&svg::timeline(start, width, &bins));
        }
    }
    if limit.rate > 0.0 && !limit.peak_usage.is_empty() {
        let mut marks = vec![("capacity", limit.capacity, "#222")];
        if let Some(tokens) = limit.capacity_for_99_percent {
            marks.push(("99% of keys", tokens, "#2e7d32"));
        }
        if let Some(tokens) = limit.capacity_for_all {
            marks.push(("every key", tokens, "#8e24aa"));
        }
        page.push_str(&svg::peak_usage(&limit.peak_usage, &marks));
    }
}

/// The keys refused most, with their requests and what their refused requests carried.
fn top_keys(page: &mut String, limit: &LimitReport) {
    if !limit.top_keys.is_empty() {
        page.push_str("<p>Refused most:</p><table><tr><th>key</th><th>refused</th><th>requests</th><th>paths refused</th><th>user agents</th></tr>");
        for top in &limit.top_keys {
            let _ = write!(
                page,
                "<tr><td class=\"key\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&top.key),
                top.refusals,
                top.requests,
                escape(&super::report::counted(&top.paths)),
                escape(&super::report::counted(&top.agents)),
            );
        }
        page.push_str("</table>");
    }
}
