//! Calendar quotas over real HTTP, on the memory store with an injected clock: a period's
//! count, its end in a time zone whose midnight is not UTC's, tiers, and all-or-nothing with
//! a token bucket on the same route.

use std::time::Duration;

use super::HTTP1;
use crate::common::*;
use tollgate::limit::Clock;

const POLICY: &str = r#"
[upstreams.app]
url = "http://{upstream}"

[limits.daily]
key = { header = "x-user" }
quota = 3
period = "day"
timezone = "Europe/Rome"
tier = { header = "x-plan" }
trust_header = true

[limits.daily.tiers]
pro = { quota = 5 }

[limits.monthly]
key = { header = "x-user" }
quota = 2
period = "month"

[limits.burst]
key = { header = "x-user" }
capacity = 1
rate = "1/h"

[[routes]]
name = "daily"
path = "/daily"
upstream = "app"
limits = ["daily"]

[[routes]]
name = "both"
path = "/both"
upstream = "app"
limits = ["monthly", "burst"]
"#;

/// 2026-12-01T22:59:00Z: one minute before midnight in Rome (UTC+1), 23:59 in Rome.
const BEFORE_ROME_MIDNIGHT: u64 = 1_796_165_940;

#[tokio::test]
async fn a_day_quota_ends_at_midnight_in_its_zone_and_starts_over() {
    let upstream = start_upstream().await;
    let clock = Clock::manual_at(BEFORE_ROME_MIDNIGHT);
    let gateway =
        start_gateway_with_clock_on(HTTP1, POLICY, upstream.address, Some(clock.clone())).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let alice = [("x-user", "alice")];
    for remaining in ["2", "1", "0"] {
        let reply = client.get("/daily", &alice).await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.header("ratelimit-limit"), Some("3"));
        assert_eq!(reply.header("ratelimit-remaining"), Some(remaining));
        assert_eq!(
            reply.header("ratelimit-reset"),
            Some("60"),
            "to Rome's midnight"
        );
    }
    let refused = client.get("/daily", &alice).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("retry-after"), Some("60"));
    clock.advance(Duration::from_secs(59));
    assert_eq!(client.get("/daily", &alice).await.status, 429);
    assert_eq!(
        client.get("/daily", &alice).await.header("retry-after"),
        Some("1")
    );
    // Midnight in Rome, 23:00 in UTC: a new day, a new count.
    clock.advance(Duration::from_secs(1));
    let reply = client.get("/daily", &alice).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("ratelimit-remaining"), Some("2"));
    assert_eq!(reply.header("ratelimit-reset"), Some("86400"));
    // A pro user's quota is the tier's.
    let pro = [("x-user", "bruno"), ("x-plan", "pro")];
    for _ in 0..5 {
        let reply = client.get("/daily", &pro).await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.header("ratelimit-limit"), Some("5"));
    }
    assert_eq!(client.get("/daily", &pro).await.status, 429);
}

#[tokio::test]
async fn a_request_refused_by_another_limit_uses_none_of_the_quota() {
    let upstream = start_upstream().await;
    let clock = Clock::manual_at(BEFORE_ROME_MIDNIGHT);
    let gateway =
        start_gateway_with_clock_on(HTTP1, POLICY, upstream.address, Some(clock.clone())).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let carla = [("x-user", "carla")];
    assert_eq!(client.get("/both", &carla).await.status, 200);
    // The burst bucket (1 per hour) refuses the next ones: the monthly quota is not charged.
    for _ in 0..5 {
        assert_eq!(client.get("/both", &carla).await.status, 429);
    }
    clock.advance(Duration::from_secs(3600));
    let reply = client.get("/both", &carla).await;
    assert_eq!(reply.status, 200, "the second of two this month");
    clock.advance(Duration::from_secs(3600));
    let refused = client.get("/both", &carla).await;
    assert_eq!(refused.status, 429, "the month's quota is spent");
    // December (UTC) ends 30 days and 61 minutes after the start (22:59 on the 1st), less
    // the two hours the clock moved.
    let to_january = 30 * 86_400 + 61 * 60 - 2 * 3600;
    assert_eq!(
        refused.header("retry-after"),
        Some(to_january.to_string().as_str())
    );
}
