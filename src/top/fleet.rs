//! A replica's top keys as it sends them to the fleet, and the fleet's merged from them (pure).
//!
//! Each replica sends, every second, each limit's summaries of every window with keys as the
//! access log spells them; `/top` on any replica adds them up with the summary's own merge,
//! so the fleet's counts keep the same bound on their error.

use serde::{Deserialize, Serialize};

use super::summary::{Entry, Summary};
use super::windows::Window;
use super::By;

/// How long a replica's view counts after it was sent: a replica that stopped sending drops
/// out of the fleet's counts within this.
pub const VIEW_TTL_MS: u64 = 3_000;

/// One replica's view: per limit and thing counted, the summary of each window.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ReplicaView {
    pub replica: String,
    pub limits: Vec<LimitView>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LimitView {
    pub limit: String,
    pub by: String,
    /// In [`Window::ALL`]'s order.
    pub windows: Vec<SentSummary>,
}

/// A summary as sent: total, bound, and `[key, count, error]` triples.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SentSummary {
    #[serde(rename = "t")]
    pub total: f64,
    #[serde(rename = "b")]
    pub bound: f64,
    #[serde(rename = "k")]
    pub entries: Vec<(String, f64, f64)>,
}

impl From<&Summary<String>> for SentSummary {
    fn from(summary: &Summary<String>) -> Self {
        SentSummary {
            total: summary.total,
            bound: summary.bound,
            entries: (summary.entries.iter())
                .map(|entry| (entry.key.clone(), entry.count, entry.error))
                .collect(),
        }
    }
}

impl From<SentSummary> for Summary<String> {
    fn from(sent: SentSummary) -> Self {
        Summary {
            entries: (sent.entries.into_iter())
                .map(|(key, count, error)| Entry { key, count, error })
                .collect(),
            bound: sent.bound,
            total: sent.total,
        }
    }
}

impl ReplicaView {
    /// The summary this view holds for a limit, thing counted and window, if any.
    pub fn summary(&self, limit: &str, by: By, window: Window) -> Option<Summary<String>> {
        let view =
            (self.limits.iter()).find(|view| view.limit == limit && view.by == by.as_str())?;
        let place = Window::ALL.iter().position(|known| *known == window)?;
        view.windows.get(place).cloned().map(Summary::from)
    }
}

/// The fleet's summary: this replica's own, added to every other replica's.
pub fn merged(
    own: Summary<String>,
    others: &[ReplicaView],
    (limit, by, window): (&str, By, Window),
    capacity: usize,
) -> Summary<String> {
    let mut summaries = vec![own];
    summaries.extend(
        others
            .iter()
            .filter_map(|view| view.summary(limit, by, window)),
    );
    Summary::merge(&summaries, capacity)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::top::summary::SpaceSaving;

    fn summary(counts: &[(&str, f64)]) -> Summary<String> {
        let mut summary = SpaceSaving::new(10);
        for (key, count) in counts {
            summary.add(&key.to_string(), *count);
        }
        summary.freeze()
    }

    fn view(replica: &str, counts: &[(&str, f64)]) -> ReplicaView {
        let sent = SentSummary::from(&summary(counts));
        ReplicaView {
            replica: replica.into(),
            limits: vec![LimitView {
                limit: "per_network".into(),
                by: "refused".into(),
                windows: vec![sent.clone(), sent.clone(), sent],
            }],
        }
    }

    #[test]
    fn a_view_reads_back_as_it_was_sent() {
        let sent = view("a", &[("v4:10.0.0.0/24", 3.0)]);
        let text = serde_json::to_string(&sent).unwrap();
        let read: ReplicaView = serde_json::from_str(&text).unwrap();
        assert_eq!(read, sent);
        let window = read.summary("per_network", By::Refused, Window::FiveMinutes);
        assert_eq!(window.unwrap().entries[0].count, 3.0);
        assert!(read
            .summary("per_network", By::Charged, Window::OneMinute)
            .is_none());
    }

    #[test]
    fn the_fleets_counts_are_every_replicas_added() {
        let own = summary(&[("v4:10.0.0.0/24", 5.0), ("v4:10.0.1.0/24", 1.0)]);
        let others = [
            view("b", &[("v4:10.0.0.0/24", 7.0)]),
            view("c", &[("v4:10.0.1.0/24", 2.0)]),
        ];
        let fleet = merged(
            own,
            &others,
            ("per_network", By::Refused, Window::OneMinute),
            10,
        );
        let top = fleet.top(5);
        assert_eq!(
            (top[0].key.as_str(), top[0].count),
            ("v4:10.0.0.0/24", 12.0)
        );
        assert_eq!((top[1].key.as_str(), top[1].count), ("v4:10.0.1.0/24", 3.0));
        assert_eq!(fleet.total, 15.0);
    }
}
