//! What a replay found, per route and limit: requests, would-be refusals, the keys refused,
//! and the capacity at which 99 % of keys, and every key, would never have been refused.

use std::collections::HashMap;

use serde_json::json;

use super::{Hasher, LogLine, Replay, Timeline};
use crate::limit::{bucket, BucketState, Charge, Timestamp};

/// One key's use of its limit's bucket, over every route that charges it: what a bucket of no
/// capacity would owe (`bucket::owed`, the decisions' own rule), and the most it ever owed,
/// the smallest capacity that never refuses the key.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct KeyUsage {
    owed: Option<BucketState>,
    needed: f64,
    requests: u64,
    /// Tokens charged, and the times of the first and the last request (seconds).
    tokens: f64,
    first: f64,
    last: f64,
}

impl KeyUsage {
    /// A request at `now` with its charge (a quota refills nothing: it gets no suggestion).
    pub(crate) fn record(&mut self, now: Timestamp, charge: &Charge) {
        let seconds = now.0 as f64 / 1e9;
        if self.requests == 0 {
            (self.first, self.last) = (seconds, seconds);
        }
        self.requests += 1;
        self.tokens += charge.cost;
        self.first = self.first.min(seconds);
        self.last = self.last.max(seconds);
        if charge.period.is_some() {
            return;
        }
        let owed = bucket::owed(self.owed, charge, now);
        self.needed = self.needed.max(-owed.tokens);
        self.owed = Some(owed);
    }
}

/// How a log's lines went back in time: how many came after a later one, and by how much
/// at most.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(crate) struct TimeOrder {
    latest: Option<f64>,
    behind: u64,
    most_behind: f64,
}

impl TimeOrder {
    pub(crate) fn record(&mut self, time: f64) {
        match self.latest {
            Some(latest) if time < latest => {
                self.behind += 1;
                self.most_behind = self.most_behind.max(latest - time);
            }
            _ => self.latest = Some(time),
        }
    }
}

impl KeyUsage {
    /// Tokens a second the key averaged from its first request to its last; `None` for a key
    /// seen within one second (no rate to speak of).
    fn average_rate(&self) -> Option<f64> {
        let span = self.last - self.first;
        (span >= 1.0).then(|| self.tokens / span)
    }
}

/// How often each of a few values came (a refused key's paths, its user agents): the first
/// [`DISTINCT`] kept, the rest counted together.
#[derive(Debug, Default, Clone)]
struct Counts {
    values: Vec<(Box<str>, u64)>,
    others: u64,
}

const DISTINCT: usize = 16;

impl Counts {
    fn add(&mut self, value: &str) {
        if let Some((_, count)) = self.values.iter_mut().find(|(seen, _)| **seen == *value) {
            *count += 1;
        } else if self.values.len() < DISTINCT {
            self.values.push((value.into(), 1));
        } else {
            self.others += 1;
        }
    }

    /// The most frequent values, at most `n`, the others summed as `(others)`.
    fn top(&self, n: usize) -> Vec<(String, u64)> {
        let mut top: Vec<(String, u64)> = self
            .values
            .iter()
            .map(|(value, count)| (value.to_string(), *count))
            .collect();
        top.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        let rest: u64 = top.iter().skip(n).map(|(_, count)| count).sum::<u64>() + self.others;
        top.truncate(n);
        if rest > 0 {
            top.push(("(others)".to_owned(), rest));
        }
        top
    }
}

/// A refused key: its refusals, and the paths and user agents its refused requests carried
/// (a scanner and a person look different).
#[derive(Debug, Default, Clone)]
struct Refused {
    refusals: u64,
    paths: Counts,
    agents: Counts,
}

/// One limit of one route.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    pub(crate) requests: u64,
    pub(crate) not_replayable: u64,
    refusals: u64,
    /// Refused keys by their number in the limit's key table (only keys refused: most never
    /// are, and the common line costs no lookup).
    refused_keys: HashMap<u32, Refused, Hasher>,
    timeline: Timeline,
}

impl Tally {
    /// A decided request of `key` at `time` (seconds), refused or not.
    pub(crate) fn record(&mut self, key: u32, line: &LogLine<'_>, refused: bool) {
        if refused {
            let entry = self.refused_keys.entry(key).or_default();
            entry.refusals += 1;
            entry.paths.add(&line.path);
            entry.agents.add(line.agent().unwrap_or("-"));
            self.refusals += 1;
        }
        self.timeline.record(line.time, refused);
    }
}

/// A key refused most: its requests and refusals in the limit, and what its refused
/// requests asked for and with which user agents.
#[derive(Debug, Clone, PartialEq)]
pub struct TopKey {
    pub key: String,
    pub requests: u64,
    pub refusals: u64,
    pub paths: Vec<(String, u64)>,
    pub agents: Vec<(String, u64)>,
}

/// The replay's findings for one limit of one route.
#[derive(Debug, Clone, PartialEq)]
pub struct LimitReport {
    pub route: String,
    pub limit: String,
    pub requests: u64,
    pub refusals: u64,
    pub not_replayable: u64,
    pub keys_refused: u64,
    /// Every key the limit saw.
    pub keys: u64,
    /// The keys refused most.
    pub top_keys: Vec<TopKey>,
    /// Every key refused at least once, in order (what `--compare` sets side by side).
    pub refused_keys: Vec<String>,
    /// The smallest capacity (at the limit's rate) that never refuses 99 % of keys, and every
    /// key; `None` for a quota.
    pub capacity_for_99_percent: Option<f64>,
    pub capacity_for_all: Option<f64>,
    /// The rate (tokens a second) that 99 % of keys seen for a second or more stayed under
    /// on average from their first request to their last; `None` for a quota.
    pub rate_for_99_percent: Option<f64>,
    /// The limit as configured (a quota's `quota`), its rate in tokens a second (0 for a
    /// quota), and both as a person reads them (`20 tokens, 1/min`).
    pub capacity: f64,
    pub rate: f64,
    pub configured: String,
    /// Admitted and refused requests over time.
    pub timeline: Timeline,
    /// Every key's peak usage (the capacity it needed), highest first.
    pub peak_usage: Vec<f64>,
}

impl LimitReport {
    /// Refusals per request (0 without requests).
    pub fn refused_share(&self) -> f64 {
        if self.requests == 0 {
            0.0
        } else {
            self.refusals as f64 / self.requests as f64
        }
    }
}

/// Everything a replay found.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub lines: u64,
    pub bad_lines: u64,
    /// The first bad lines, with their numbers.
    pub first_bad_lines: Vec<(u64, String)>,
    pub unrouted: u64,
    pub undecided: u64,
    /// Lines whose time is before an earlier line's, and the most seconds one was behind.
    pub lines_behind: u64,
    pub most_seconds_behind: f64,
    pub limits: Vec<LimitReport>,
}

pub(super) fn report(replay: &Replay<'_>) -> Report {
    let limits = replay
        .routes
        .iter()
        .flat_map(|replayed_route| {
            replayed_route
                .entries
                .iter()
                .map(|replayed| limit_report(replayed_route.route, replayed))
        })
        .collect();
    Report {
        lines: replay.lines,
        bad_lines: replay.bad_line_count,
        first_bad_lines: replay.bad_lines.clone(),
        unrouted: replay.unrouted,
        undecided: replay.undecided,
        lines_behind: replay.order.behind,
        most_seconds_behind: replay.order.most_behind,
        limits,
    }
}

/// One limit of one route: its tally, and what its keys (the limit's, whatever route charged
/// them) suggest.
fn limit_report(route: &crate::config::Route, replayed: &super::ReplayedEntry<'_>) -> LimitReport {
    let (limit, tally) = (&*replayed.entry.limit, &replayed.tally);
    let keys = replayed.keys.borrow();
    let mut top: Vec<TopKey> = tally
        .refused_keys
        .iter()
        .map(|(number, refused)| TopKey {
            key: keys.names[*number as usize].to_string(),
            requests: keys.usage[*number as usize].requests,
            refusals: refused.refusals,
            paths: refused.paths.top(5),
            agents: refused.agents.top(3),
        })
        .collect();
    top.sort_by(|a, b| b.refusals.cmp(&a.refusals).then_with(|| a.key.cmp(&b.key)));
    let mut refused_keys: Vec<String> = top.iter().map(|top| top.key.clone()).collect();
    refused_keys.sort();
    let bucket = limit.calendar.is_none();
    let mut rates: Vec<f64> = keys
        .usage
        .iter()
        .filter_map(KeyUsage::average_rate)
        .collect();
    let mut needed: Vec<f64> = keys.usage.iter().map(|usage| usage.needed).collect();
    LimitReport {
        route: route.name.to_string(),
        limit: limit.name.to_string(),
        requests: tally.requests,
        refusals: tally.refusals,
        not_replayable: tally.not_replayable,
        keys_refused: top.len() as u64,
        keys: keys.names.len() as u64,
        top_keys: top.into_iter().take(10).collect(),
        refused_keys,
        capacity_for_99_percent: quantile(&mut needed, 0.99)
            .filter(|_| bucket)
            .map(f64::ceil),
        capacity_for_all: quantile(&mut needed, 1.0).filter(|_| bucket).map(f64::ceil),
        rate_for_99_percent: quantile(&mut rates, 0.99).filter(|_| bucket),
        capacity: limit.capacity,
        rate: if bucket { limit.rate.per_second() } else { 0.0 },
        configured: match &limit.calendar {
            Some(calendar) => format!(
                "quota {} per {} ({})",
                limit.capacity,
                format!("{:?}", calendar.period).to_lowercase(),
                calendar.zone_name
            ),
            None => format!("capacity {}, rate {}", limit.capacity, limit.rate),
        },
        timeline: tally.timeline.clone(),
        peak_usage: needed.iter().rev().copied().collect(),
    }
}

/// The value at `share` of `values` (sorted here, ascending); `None` for none.
fn quantile(values: &mut [f64], share: f64) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let index = ((values.len() as f64 * share).ceil() as usize).clamp(1, values.len().max(1));
    values.get(index - 1).copied()
}

impl Report {
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "lines": self.lines,
            "bad_lines": self.bad_lines,
            "first_bad_lines": self.first_bad_lines.iter().map(|(line, why)| json!({"line": line, "why": why})).collect::<Vec<_>>(),
            "unrouted": self.unrouted,
            "undecided": self.undecided,
            "lines_behind": self.lines_behind,
            "most_seconds_behind": self.most_seconds_behind,
            "limits": self.limits.iter().map(|limit| json!({
                "route": limit.route,
                "limit": limit.limit,
                "requests": limit.requests,
                "refusals": limit.refusals,
                "refused_share": limit.refused_share(),
                "not_replayable": limit.not_replayable,
                "keys_refused": limit.keys_refused,
                "keys": limit.keys,
                "top_keys": limit.top_keys.iter().map(|top| json!({
                    "key": top.key,
                    "requests": top.requests,
                    "refusals": top.refusals,
                    "paths": top.paths.iter().map(|(path, count)| json!({"path": path, "count": count})).collect::<Vec<_>>(),
                    "user_agents": top.agents.iter().map(|(agent, count)| json!({"user_agent": agent, "count": count})).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
                "capacity_for_99_percent_of_keys": limit.capacity_for_99_percent,
                "capacity_for_every_key": limit.capacity_for_all,
                "rate_for_99_percent_of_keys": limit.rate_for_99_percent,
            })).collect::<Vec<_>>(),
        })
    }

    /// How far the log's lines went back in time, for a person; `None` for a log in order.
    pub fn time_order(&self) -> Option<String> {
        (self.lines_behind > 0).then(|| {
            format!(
                "{} lines came after a later one (at most {:.3} s behind): each bucket counted them at its latest moment, as the gateway does",
                self.lines_behind, self.most_seconds_behind
            )
        })
    }

    /// The report as a table for a person.
    pub fn to_text(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{} requests replayed; {} not decided by limits (bad requests, no route); {} match no route of this policy; {} bad lines",
            self.lines, self.undecided, self.unrouted, self.bad_lines
        );
        for (line, why) in &self.first_bad_lines {
            let _ = writeln!(out, "  line {line}: {}", printable(why));
        }
        if let Some(order) = self.time_order() {
            let _ = writeln!(out, "{order}");
        }
        let _ = writeln!(
            out,
            "\n{:<16} {:<16} {:>9} {:>9} {:>7} {:>12} {:>10} {:>10}",
            "route", "limit", "requests", "refused", "share", "keys refused", "cap 99%", "cap all"
        );
        for limit in &self.limits {
            let capacity =
                |value: Option<f64>| value.map_or("-".to_owned(), |value| value.to_string());
            let _ = writeln!(
                out,
                "{:<16} {:<16} {:>9} {:>9} {:>6.1}% {:>12} {:>10} {:>10}",
                limit.route,
                limit.limit,
                limit.requests,
                limit.refusals,
                limit.refused_share() * 100.0,
                limit.keys_refused,
                capacity(limit.capacity_for_99_percent),
                capacity(limit.capacity_for_all),
            );
            if limit.not_replayable > 0 {
                let _ = writeln!(
                    out,
                    "  {} requests not replayable from this log (the limit's key is not in it)",
                    limit.not_replayable
                );
            }
            let _ = writeln!(
                out,
                "  {} keys in all{}",
                limit.keys,
                limit
                    .rate_for_99_percent
                    .map_or(String::new(), |rate| format!(
                        "; 99 % of keys averaged at most {} tokens/s (configured: {})",
                        round(rate),
                        round(limit.rate)
                    ))
            );
            for top in limit.top_keys.iter().take(5) {
                let _ = writeln!(
                    out,
                    "  {:>6} of {:>6} refused  {}",
                    top.refusals,
                    top.requests,
                    printable(&top.key)
                );
                let _ = writeln!(out, "           paths: {}", counted(&top.paths));
                let _ = writeln!(out, "           user agents: {}", counted(&top.agents));
            }
        }
        out
    }
}
/// Values with their counts: `/login (209), /favicon.ico (3)`.
pub(super) fn counted(values: &[(String, u64)]) -> String {
    let shown: Vec<String> = values
        .iter()
        .map(|(value, count)| format!("{} ({count})", printable(value)))
        .collect();
    shown.join(", ")
}

/// Three significant digits or so: rates as a person reads them.
pub(super) fn round(value: f64) -> f64 {
    if value == 0.0 || !value.is_finite() {
        return value;
    }
    let scale = 10f64.powi(2 - value.abs().log10().floor() as i32);
    (value * scale).round() / scale
}

/// Text from a log as a terminal may show it: control characters (an escape sequence a log
/// line carried, a carriage return) written as `\u{1b}`, never acted on.
pub(super) fn printable(text: &str) -> std::borrow::Cow<'_, str> {
    if !text.chars().any(char::is_control) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut shown = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if c.is_control() {
            shown.extend(c.escape_unicode());
        } else {
            shown.push(c);
        }
    }
    std::borrow::Cow::Owned(shown)
}

#[cfg(test)]
mod tests {
    use super::printable;

    #[test]
    fn control_characters_from_a_log_are_shown_not_acted_on() {
        assert_eq!(printable("alice"), "alice");
        assert_eq!(printable("a\u{1b}[2Jb\r"), "a\\u{1b}[2Jb\\u{d}");
    }
}
