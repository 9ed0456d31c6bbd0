//! `tollgate replay --report FILE.html`: the report as one self-contained page, readable
//! without scripts or a network: the table, then per limit a chart of admitted and refused
//! requests over time and one of keys' peak usage against the capacity.

use std::fmt::Write as _;

use super::svg::{self, escape};
use super::{Comparison, Report};

/// Bars in a timeline chart: enough to see an hour's burst in a day.
const TIMELINE_BARS: usize = 240;

const STYLE: &str = "body{font-family:sans-serif;margin:2em;color:#222;max-width:64em}\
table{border-collapse:collapse}td,th{padding:.25em .75em;border-bottom:1px solid #ddd;text-align:right}\
td:first-child,td:nth-child(2),th:first-child,th:nth-child(2){text-align:left}\
section{margin-top:2.5em}h2{font-size:1.15em}.note{color:#666}.key{font-family:monospace}\
.legend span{display:inline-block;width:.8em;height:.8em;margin:0 .3em 0 1em}";

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
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.1}%</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&limit.route),
                escape(&limit.limit),
                limit.requests,
                limit.refusals,
                limit.refused_share() * 100.0,
                limit.keys_refused,
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
            section(&mut page, limit);
        }
        page.push_str("</body></html>\n");
        page
    }
}

fn section(page: &mut String, limit: &super::LimitReport) {
    let _ = write!(
        page,
        "<section><h2>{} · {}</h2><p>{}: {} of {} requests refused ({:.1}%); keys refused: {}.</p>",
        escape(&limit.route),
        escape(&limit.limit),
        escape(&limit.configured),
        limit.refusals,
        limit.requests,
        limit.refused_share() * 100.0,
        limit.keys_refused,
    );
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
    if !limit.top_keys.is_empty() {
        page.push_str("<p>Refused most:</p><table>");
        for (key, refusals) in &limit.top_keys {
            let _ = write!(
                page,
                "<tr><td class=\"key\">{}</td><td>{refusals}</td></tr>",
                escape(key)
            );
        }
        page.push_str("</table>");
    }
    page.push_str("</section>");
}
