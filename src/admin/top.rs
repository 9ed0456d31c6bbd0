//! `/top` and `/top/routes` on the admin listener: each limit's top refused or charged keys
//! over a window (the fleet's, with Redis), and each route's requests by outcome.

use std::sync::Arc;

use http::StatusCode;
use serde_json::{json, Value};

use super::limits::query_pairs;
use crate::body::Body;
use crate::limit::Store;
use crate::respond;
use crate::shared::Shared;
use crate::top::fleet::{self, ReplicaView};
use crate::top::summary::Summary;
use crate::top::windows::Window;
use crate::top::By;

/// The most keys one answer lists per limit.
pub(super) const MAX_KEYS: usize = 1000;

/// What `/top` was asked.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct TopQuery {
    pub(super) limit: Option<String>,
    pub(super) by: By,
    pub(super) window: Window,
    pub(super) n: usize,
}

impl TopQuery {
    /// Reads the query; a refusal names the parameter.
    pub(super) fn parse(pairs: &[(String, String)]) -> Result<TopQuery, String> {
        let mut query = TopQuery {
            limit: None,
            by: By::Refused,
            window: Window::OneMinute,
            n: 20,
        };
        for (name, value) in pairs {
            match name.as_str() {
                "limit" => query.limit = Some(value.clone()),
                "by" => {
                    query.by = By::parse(value)
                        .ok_or_else(|| format!("by: {value:?} is not refused or charged"))?
                }
                "window" => query.window = parse_window(value)?,
                "n" => {
                    query.n = value
                        .parse()
                        .ok()
                        .filter(|n| *n <= MAX_KEYS)
                        .ok_or_else(|| {
                            format!("n: {value:?} is not a count from 0 to {MAX_KEYS}")
                        })?
                }
                _ => {
                    return Err(format!(
                        "{name}: not a parameter of /top (limit, by, window, n)"
                    ))
                }
            }
        }
        Ok(query)
    }
}

fn parse_window(value: &str) -> Result<Window, String> {
    Window::parse(value).ok_or_else(|| format!("window: {value:?} is not 1m, 5m or 15m"))
}

/// Answers `GET /top` and `GET /top/routes`.
pub(super) async fn answer(
    shared: &Shared,
    path: &str,
    query: Option<&str>,
) -> http::Response<Body> {
    let pairs = query_pairs(query);
    match path {
        "/top" | "/top/" => {}
        "/top/routes" => return routes(shared, &pairs),
        _ => return respond::error(StatusCode::NOT_FOUND, "not_found", None),
    }
    let query = match TopQuery::parse(&pairs) {
        Ok(query) => query,
        Err(error) => return respond::bad_request(&error),
    };
    let top = &shared.metrics.top;
    if top.capacity() == 0 {
        return respond::error(
            StatusCode::CONFLICT,
            "top_keys_off",
            Some("[top] keys_per_limit = 0: no keys are counted"),
        );
    }
    let runtime = shared.runtime.load_full();
    let limits: Vec<Arc<str>> = match &query.limit {
        Some(name) => match runtime.policy.limits.iter().find(|l| &*l.name == name) {
            Some(limit) => vec![limit.name.clone()],
            None => return respond::error(StatusCode::NOT_FOUND, "unknown_limit", Some(name)),
        },
        None => (runtime.policy.limits.iter())
            .map(|limit| limit.name.clone())
            .collect(),
    };
    let (scope, others) = fleet_views(shared).await;
    let answers: Vec<Value> = (limits.iter())
        .map(|limit| {
            let own = top
                .spelled(limit, query.by, query.window)
                .unwrap_or_default();
            let what = (&**limit, query.by, query.window);
            let summary = match &others {
                Some(others) => fleet::merged(own, others, what, top.capacity()),
                None => own,
            };
            limit_answer(limit, &query, scope, &summary)
        })
        .collect();
    let body = match query.limit {
        Some(_) => answers.into_iter().next().unwrap_or_default(),
        None => json!({
            "by": query.by.as_str(),
            "window_seconds": query.window.seconds(),
            "scope": scope,
            "limits": answers,
        }),
    };
    respond::full(StatusCode::OK, "application/json", body.to_string())
}

/// With Redis, the other replicas' views (`"fleet"`); this replica's alone when there is no
/// fleet, or Redis cannot be read now (an incident is when `/top` is asked).
async fn fleet_views(shared: &Shared) -> (&'static str, Option<Vec<ReplicaView>>) {
    let Store::Redis(redis) = &shared.store else {
        return ("replica", None);
    };
    let replica = shared.metrics.top.replica();
    match redis.fleet_top(replica, fleet::VIEW_TTL_MS).await {
        Ok(texts) => {
            let views = (texts.iter())
                .filter_map(|text| match serde_json::from_str(text) {
                    Ok(view) => Some(view),
                    Err(error) => {
                        tracing::debug!(%error, "a replica's top keys could not be read");
                        None
                    }
                })
                .collect();
            ("fleet", Some(views))
        }
        Err(error) => {
            tracing::warn!(%error, "the fleet's top keys could not be read: answering with this replica's");
            ("replica", None)
        }
    }
}

fn limit_answer(limit: &str, query: &TopQuery, scope: &str, summary: &Summary<String>) -> Value {
    let keys: Vec<Value> = (summary.top(query.n).into_iter())
        .map(|entry| json!({"key": entry.key, "count": number(entry.count), "error": number(entry.error)}))
        .collect();
    json!({
        "limit": limit,
        "by": query.by.as_str(),
        "window_seconds": query.window.seconds(),
        "scope": scope,
        "keys": keys,
    })
}

/// Whole counts as integers (refusals always are; tokens charged mostly).
fn number(value: f64) -> Value {
    if value.fract() == 0.0 && value.abs() < 9e15 {
        json!(value as i64)
    } else {
        json!((value * 1000.0).round() / 1000.0)
    }
}

fn routes(shared: &Shared, pairs: &[(String, String)]) -> http::Response<Body> {
    let (mut window, mut with_series) = (Window::OneMinute, false);
    for (name, value) in pairs {
        match (name.as_str(), value.as_str()) {
            ("window", _) => match parse_window(value) {
                Ok(parsed) => window = parsed,
                Err(error) => return respond::bad_request(&error),
            },
            ("series", "true") => with_series = true,
            ("series", "false") => with_series = false,
            ("series", _) => return respond::bad_request("series: true or false"),
            _ => {
                let detail = format!("{name}: not a parameter of /top/routes (window, series)");
                return respond::bad_request(&detail);
            }
        }
    }
    let now = shared.metrics.route_outcomes();
    let counts = shared.route_history.window(window, &now);
    let mut series = with_series.then(|| shared.route_history.series(&now));
    let routes: Vec<Value> = (counts.into_iter())
        .map(|(route, outcomes)| {
            let requests: u64 = outcomes.values().sum();
            let mut answer = json!({"route": route, "requests": requests, "outcomes": outcomes});
            if let Some(series) = &mut series {
                answer["series"] = json!(series.remove(&route).unwrap_or_default());
            }
            answer
        })
        .collect();
    let body = json!({"window_seconds": window.seconds(), "routes": routes});
    respond::full(StatusCode::OK, "application/json", body.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(query: &str) -> Vec<(String, String)> {
        query_pairs(Some(query))
    }

    #[test]
    fn a_query_without_parameters_asks_for_the_last_minutes_top_refusals() {
        let query = TopQuery::parse(&[]).unwrap();
        assert_eq!(
            (query.by, query.window, query.n),
            (By::Refused, Window::OneMinute, 20)
        );
        let query = TopQuery::parse(&pairs("limit=a&by=charged&window=15m&n=1000")).unwrap();
        assert_eq!(query.limit.as_deref(), Some("a"));
        assert_eq!(
            (query.by, query.window, query.n),
            (By::Charged, Window::FifteenMinutes, 1000)
        );
    }

    #[test]
    fn each_bad_parameter_is_named() {
        for (query, named) in [
            ("n=1001", "n:"),
            ("n=-1", "n:"),
            ("by=tokens", "by:"),
            ("window=1h", "window:"),
            ("limits=a", "limits:"),
        ] {
            let error = TopQuery::parse(&pairs(query)).unwrap_err();
            assert!(error.starts_with(named), "{query}: {error}");
        }
    }

    #[test]
    fn whole_counts_are_integers() {
        assert_eq!(number(1416.0).to_string(), "1416");
        assert_eq!(number(2.5).to_string(), "2.5");
    }
}
