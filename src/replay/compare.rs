//! `--compare OTHER.toml`: one log decided against two policies, side by side per route and
//! limit (matched by name), with the keys one policy refuses and the other admits.

use std::collections::BTreeSet;

use serde_json::json;

use super::report::{printable, Report};
use super::svg::escape;

/// How many keys of each side a comparison names (the counts are whole).
const KEYS_NAMED: usize = 10;

/// One route and limit as each policy decided it; `None` where a policy has no such pair.
#[derive(Debug, Clone, PartialEq)]
pub struct Compared {
    pub route: String,
    pub limit: String,
    /// (requests, refusals) under this policy and under the other.
    pub this: Option<(u64, u64)>,
    pub other: Option<(u64, u64)>,
    /// Keys this policy refused at least once and the other never did, and the other way.
    pub only_this: Vec<String>,
    pub only_other: Vec<String>,
    pub only_this_count: usize,
    pub only_other_count: usize,
}

/// The same log under two policies.
#[derive(Debug, Clone, PartialEq)]
pub struct Comparison {
    pub other_policy: String,
    pub rows: Vec<Compared>,
    /// The other policy's findings, for its charts beside this policy's.
    pub other_limits: Vec<super::LimitReport>,
}

impl Comparison {
    pub fn new(this: &Report, other: &Report, other_policy: &str) -> Comparison {
        let mut names: Vec<(&str, &str)> = Vec::new();
        for limit in this.limits.iter().chain(&other.limits) {
            let name = (limit.route.as_str(), limit.limit.as_str());
            if !names.contains(&name) {
                names.push(name);
            }
        }
        let rows = names
            .into_iter()
            .map(|(route, limit)| {
                let find = |report: &'_ Report| {
                    report
                        .limits
                        .iter()
                        .find(|found| found.route == route && found.limit == limit)
                        .cloned()
                };
                let (this, other) = (find(this), find(other));
                let refused = |side: &Option<super::LimitReport>| -> BTreeSet<String> {
                    side.as_ref()
                        .map(|side| side.refused_keys.iter().cloned().collect())
                        .unwrap_or_default()
                };
                let (this_keys, other_keys) = (refused(&this), refused(&other));
                let only_this: Vec<String> = this_keys.difference(&other_keys).cloned().collect();
                let only_other: Vec<String> = other_keys.difference(&this_keys).cloned().collect();
                Compared {
                    route: route.to_owned(),
                    limit: limit.to_owned(),
                    this: this.as_ref().map(|side| (side.requests, side.refusals)),
                    other: other.as_ref().map(|side| (side.requests, side.refusals)),
                    only_this_count: only_this.len(),
                    only_other_count: only_other.len(),
                    only_this: only_this.into_iter().take(KEYS_NAMED).collect(),
                    only_other: only_other.into_iter().take(KEYS_NAMED).collect(),
                }
            })
            .collect();
        Comparison {
            other_policy: other_policy.to_owned(),
            rows,
            other_limits: other.limits.clone(),
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        let side = |side: Option<(u64, u64)>| {
            side.map(|(requests, refusals)| json!({"requests": requests, "refusals": refusals}))
        };
        json!({
            "policy": self.other_policy,
            "limits": self.rows.iter().map(|row| json!({
                "route": row.route,
                "limit": row.limit,
                "this": side(row.this),
                "other": side(row.other),
                "keys_refused_only_by_this": row.only_this_count,
                "keys_refused_only_by_other": row.only_other_count,
                "some_keys_refused_only_by_this": row.only_this,
                "some_keys_refused_only_by_other": row.only_other,
            })).collect::<Vec<_>>(),
        })
    }

    pub fn to_text(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "\ncompared with {}: refusals under this policy and under the other",
            printable(&self.other_policy)
        );
        let _ = writeln!(
            out,
            "{:<16} {:<16} {:>12} {:>12} {:>14} {:>14}",
            "route", "limit", "refused", "other", "only this", "only other"
        );
        let number =
            |side: Option<(u64, u64)>| side.map_or("-".to_owned(), |side| side.1.to_string());
        for row in &self.rows {
            let _ = writeln!(
                out,
                "{:<16} {:<16} {:>12} {:>12} {:>9} keys {:>9} keys",
                row.route,
                row.limit,
                number(row.this),
                number(row.other),
                row.only_this_count,
                row.only_other_count
            );
            for key in row.only_this.iter().take(3) {
                let _ = writeln!(out, "  refused only by this policy:  {}", printable(key));
            }
            for key in row.only_other.iter().take(3) {
                let _ = writeln!(out, "  refused only by the other:    {}", printable(key));
            }
        }
        out
    }

    /// The comparison as a section of the report page.
    pub fn to_html(&self) -> String {
        use std::fmt::Write as _;
        let mut section = String::new();
        let _ = write!(
            section,
            "<h2>Compared with <code>{}</code></h2><table><tr><th>route</th><th>limit</th><th>refused</th><th>refused by the other</th><th>keys refused only by this policy</th><th>keys refused only by the other</th></tr>",
            escape(&self.other_policy)
        );
        let number =
            |side: Option<(u64, u64)>| side.map_or("–".to_owned(), |side| side.1.to_string());
        for row in &self.rows {
            let keys = |count: usize, keys: &[String]| {
                let named: Vec<String> = keys.iter().map(|key| escape(key)).collect();
                if named.is_empty() {
                    count.to_string()
                } else {
                    format!("{count}: <code>{}</code>", named.join("</code>, <code>"))
                }
            };
            let _ = write!(
                section,
                "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
                escape(&row.route),
                escape(&row.limit),
                number(row.this),
                number(row.other),
                keys(row.only_this_count, &row.only_this),
                keys(row.only_other_count, &row.only_other),
            );
        }
        section.push_str("</table>");
        section
    }
}
