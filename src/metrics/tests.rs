//! The metric families and handles: labels, series that can occur, rendering.

use super::*;

#[test]
fn each_outcome_and_status_class_indexes_its_own_counter() {
    for (index, outcome) in Outcome::ALL.into_iter().enumerate() {
        assert_eq!(outcome as usize, index, "{}", outcome.as_str());
    }
    for (index, class) in StatusClass::ALL.into_iter().enumerate() {
        assert_eq!(class as usize, index, "{}", class.as_str());
    }
}

#[test]
fn a_routes_counters_carry_its_name_and_only_outcomes_that_can_occur() {
    let metrics = Metrics::new();
    let policy = crate::config::Policy::parse(
        "test.toml",
        "[upstreams.app]\nurl = \"http://127.0.0.1:1\"\n[limits.peek]\nkey = \"global\"\ncapacity = 5\nrate = \"1/s\"\nmode = \"shadow\"\n[[routes]]\nname = \"login\"\npath = \"/login\"\nupstream = \"app\"\nlimits = [\"peek\"]\n[[routes]]\nname = \"open\"\npath_prefix = \"/\"\nupstream = \"app\"\n",
    )
    .unwrap();
    let route = metrics.for_route(&policy.routes[0]);
    metrics.for_route(&policy.routes[1]);
    route.outcome(Outcome::ShadowLimited).inc();
    route.upstream_status(StatusClass::Error).inc();
    let text = metrics.render();
    assert!(text.contains("tollgate_requests_total{outcome=\"shadow_limited\",route=\"login\"} 1"));
    assert!(text.contains("tollgate_upstream_responses_total{route=\"login\",status=\"error\"} 1"));
    let outcomes = |route: &str| -> Vec<&str> {
        let mut seen: Vec<&str> = text
            .lines()
            .filter(|line| {
                line.starts_with("tollgate_requests_total{")
                    && line.contains(&format!("route=\"{route}\""))
            })
            .filter_map(|line| line.split("outcome=\"").nth(1)?.split('"').next())
            .collect();
        seen.sort_unstable();
        seen
    };
    assert_eq!(
        outcomes("login"),
        [
            "allowed",
            "bad_request",
            "degraded_allowed",
            "shadow_limited"
        ],
        "a shadow limit never refuses; no route is not a named route's"
    );
    assert_eq!(
        outcomes("open"),
        ["allowed", "bad_request"],
        "a route without limits"
    );
}
