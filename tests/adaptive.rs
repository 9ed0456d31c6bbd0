//! Adaptive limits over HTTP: penalties for keys that keep failing, charges by outcome, and
//! rates that shrink while the upstream is overloaded.
#![allow(clippy::disallowed_methods)] // tests measure real time

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::redis_server::RedisServer;
use common::*;
use tollgate::limit::Clock;

const LOGIN: &str = r#"
[client_ip]
trusted_hops = 1

[upstreams.app]
url = "http://{upstream}"

[limits.per_account]
key = { json_field = "email" }
missing = "reject"
capacity = 10
rate = "1/10s"

[limits.per_account.adaptive]
on_status = [401, 403]
threshold = 3
window = "60s"
factor = 0.5
min_capacity = 2
hold = "120s"

[[routes]]
name = "login"
methods = ["POST"]
path = "/auth"
upstream = "app"
limits = ["per_account"]
"#;

const JSON: (&str, &str) = ("content-type", "application/json");

fn attempt(email: &str, password: &str) -> String {
    format!(r#"{{"email":"{email}","password":"{password}"}}"#)
}

/// Posts login attempts until the first 429 (at most 50); returns the statuses and the
/// `RateLimit-Limit` of each admitted answer.
async fn attempts_until_refused(
    client: &HttpClient,
    email: &str,
    password: &str,
) -> (Vec<u16>, Vec<String>) {
    let mut statuses = Vec::new();
    let mut limits = Vec::new();
    for _ in 0..50 {
        let reply = client
            .post("/auth", &[JSON], &attempt(email, password))
            .await;
        statuses.push(reply.status.as_u16());
        if reply.status == 429 {
            break;
        }
        limits.push(reply.header("ratelimit-limit").unwrap_or("").to_owned());
    }
    (statuses, limits)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_that_keeps_failing_gets_a_smaller_limit_until_hold_passes() {
    let upstream = start_upstream().await;
    let clock = Clock::manual();
    let gateway = start_gateway_with_clock(LOGIN, upstream.address, Some(clock.clone())).await;
    let client = HttpClient::new(gateway.addresses[0]);

    let (fresh, _) = attempts_until_refused(&client, "fresh@example.com", "right").await;
    assert_eq!(
        fresh.iter().filter(|status| **status == 200).count(),
        10,
        "a well-behaved account gets the configured 10"
    );

    let (attacked, limits) = attempts_until_refused(&client, "victim@example.com", "wrong").await;
    // 3 errors trip the key (capacity 5, tokens clamped to 5), 3 more trip it again
    // (capacity 2.5): 3 + 3 + 2 attempts instead of 10.
    assert_eq!(attacked.iter().filter(|status| **status == 401).count(), 8);
    assert_eq!(attacked.last(), Some(&429));
    assert_eq!(
        limits,
        ["10", "10", "10", "5", "5", "5", "2", "2"],
        "the client sees its reduced limit"
    );
    let scrape = gateway.render_metrics();
    assert_eq!(
        metric(&scrape, r#"tollgate_penalties_total{limit="per_account"}"#),
        2.0
    );

    // Another account is untouched by the victim's penalty.
    let (other, _) = attempts_until_refused(&client, "other@example.com", "right").await;
    assert_eq!(other.iter().filter(|status| **status == 200).count(), 10);

    // 100 s later the reduction still holds: the bucket refilled only to its reduced capacity.
    clock.advance(Duration::from_secs(100));
    let (held, limits) = attempts_until_refused(&client, "victim@example.com", "right").await;
    assert_eq!(held, [200, 200, 429]);
    assert_eq!(limits, ["2", "2"]);

    // Past the hold (120 s after the last error) the configured limit is back.
    clock.advance(Duration::from_secs(1000));
    let (restored, limits) = attempts_until_refused(&client, "victim@example.com", "right").await;
    assert_eq!(restored.iter().filter(|status| **status == 200).count(), 10);
    assert!(limits.iter().all(|limit| limit == "10"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_sharing_redis_apply_the_same_penalty() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let policy = LOGIN.replace(
        "[upstreams.app]",
        &format!("[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout = \"2s\"\nhash_key = \"test-secret-0123456789\"\n\n[upstreams.app]", redis.url()),
    );
    let first = start_gateway(&policy, upstream.address).await;
    let second = start_gateway(&policy, upstream.address).await;
    let (a, b) = (
        HttpClient::new(first.addresses[0]),
        HttpClient::new(second.addresses[0]),
    );
    for _ in 0..3 {
        assert_eq!(
            a.post("/auth", &[JSON], &attempt("victim@example.com", "wrong"))
                .await
                .status,
            401
        );
    }
    let through_second = b
        .post("/auth", &[JSON], &attempt("victim@example.com", "right"))
        .await;
    assert_eq!(through_second.status, 200);
    assert_eq!(
        through_second.header("ratelimit-limit"),
        Some("5"),
        "the other replica applies the penalty"
    );
    assert_eq!(through_second.header("ratelimit-remaining"), Some("4"));
    let fresh = b
        .post("/auth", &[JSON], &attempt("fresh@example.com", "right"))
        .await;
    assert_eq!(fresh.header("ratelimit-limit"), Some("10"));
    assert_metrics(
        &first.render_metrics(),
        &[(r#"tollgate_penalties_total{limit="per_account"}"#, 1.0)],
    );
    // The adaptive state lives in the bucket's hash, with a TTL.
    let keys: Vec<String> = redis
        .cli(&["--scan", "--pattern", "tollgate:per_account:*"])
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(keys.len(), 2);
    for key in &keys {
        let ttl: i64 = redis.cli(&["PTTL", key]).trim().parse().unwrap();
        assert!(ttl > 0, "{key} has no TTL");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_404_scan_drains_its_network_bucket_while_browsing_does_not() {
    let upstream = start_upstream().await;
    let policy = r#"
[client_ip]
trusted_hops = 1

[upstreams.app]
url = "http://{upstream}"

[limits.per_network]
key = "client_network"
capacity = 30
rate = "1/h"

[limits.per_network.charge_on_status]
404 = 5

[[routes]]
name = "default"
path_prefix = "/"
upstream = "app"
limits = ["per_network"]
"#;
    let gateway = start_gateway(policy, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let scanner = ("x-forwarded-for", "198.51.100.1");
    let browser = ("x-forwarded-for", "198.51.100.2");
    let mut scanned = 0;
    let mut browsed = 0;
    for index in 0..40 {
        // Interleaved at the same pace: a dictionary scan and a reader of existing pages.
        if client
            .get(&format!("/missing/admin{index}.php"), &[scanner])
            .await
            .status
            == 404
        {
            scanned += 1;
        }
        if client
            .get(&format!("/articles/{index}"), &[browser])
            .await
            .status
            == 200
        {
            browsed += 1;
        }
    }
    assert_eq!(
        scanned, 5,
        "each 404 costs 1 + 5 tokens: the scan stops after 5 probes"
    );
    assert_eq!(browsed, 30, "the reader gets the whole capacity");
    let scrape = gateway.render_metrics();
    assert_metrics(
        &scrape,
        &[(
            r#"tollgate_tokens_consumed_total{limit="per_network",route="default"}"#,
            60.0,
        )],
    );
}

async fn load_factor(admin: &HttpClient) -> f64 {
    let text = String::from_utf8(admin.get("/metrics", &[]).await.body.to_vec()).unwrap();
    metric(&text, "tollgate_load_factor")
}

async fn wait_for_load_factor(admin: &HttpClient, wanted: f64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while load_factor(admin).await != wanted {
        assert!(
            Instant::now() < deadline,
            "load factor never reached {wanted}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_upstream_shrinks_every_rate_until_it_recovers() {
    let upstream = start_upstream().await;
    let clock = Clock::manual();
    let policy = r#"
[overload]
latency_target = "50ms"
factor = 0.5

[upstreams.app]
url = "http://{upstream}"

[limits.per_network]
key = "client_network"
capacity = 2
rate = "1/s"

[[routes]]
name = "work"
path = "/delayed"
upstream = "app"

[[routes]]
name = "default"
path_prefix = "/"
upstream = "app"
limits = ["per_network"]
"#;
    let gateway = start_gateway_with_clock(policy, upstream.address, Some(clock.clone())).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let admin = HttpClient::new(gateway.admin_address);
    assert_eq!(load_factor(&admin).await, 1.0);

    // Steady traffic to the upstream, which turns slow.
    upstream.delay_ms.store(200, Ordering::SeqCst);
    let running = Arc::new(AtomicBool::new(true));
    let worker = {
        let running = running.clone();
        let address = gateway.addresses[0];
        tokio::spawn(async move {
            let client = HttpClient::new(address);
            while running.load(Ordering::SeqCst) {
                client.get("/delayed", &[]).await;
            }
        })
    };
    wait_for_load_factor(&admin, 0.5).await;
    // Half the refill: after 2 s, one token instead of two.
    for _ in 0..2 {
        assert_eq!(client.get("/page", &[]).await.status, 200);
    }
    assert_eq!(client.get("/page", &[]).await.status, 429);
    clock.advance(Duration::from_secs(2));
    assert_eq!(client.get("/page", &[]).await.status, 200);
    assert_eq!(client.get("/page", &[]).await.status, 429);

    // The upstream speeds up: the factor climbs back to 1, and so does the refill.
    upstream.delay_ms.store(0, Ordering::SeqCst);
    wait_for_load_factor(&admin, 1.0).await;
    clock.advance(Duration::from_secs(2));
    assert_eq!(client.get("/page", &[]).await.status, 200);
    assert_eq!(client.get("/page", &[]).await.status, 200);
    assert_eq!(client.get("/page", &[]).await.status, 429);
    running.store(false, Ordering::SeqCst);
    worker.await.unwrap();
}
