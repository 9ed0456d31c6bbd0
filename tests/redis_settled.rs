//! Costs settled after the response through a real redis-server: a debt one replica's
//! response leaves is the debt the other sees; each settled response is one call of its own;
//! a monthly quota keeps its period through a settlement; and a settlement Redis runs after
//! its deadline (a `CLIENT PAUSE`) charges nothing and is counted.

mod common;

use std::time::Duration;

use common::llm::start_llm_upstream;
use common::redis_server::RedisServer;
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn policy(redis: &RedisServer, timeout: &str) -> String {
    format!(
        r#"
[store]
backend = "redis"
url = "{url}"
timeout = "{timeout}"
hash_key = "test-secret-0123456789"

[upstreams.llm]
url = "http://{{upstream}}"

[limits.org_tokens]
key = {{ header = "x-org" }}
capacity = 1000
rate = "1000/min"

[limits.org_month]
key = {{ header = "x-org" }}
quota = 5000
period = "month"

[[routes]]
name = "chat"
path = "/v1/chat/completions"
methods = ["POST"]
upstream = "llm"
limits = [{{ limit = "org_tokens", cost = {{ json = "max_tokens", default = 256, max = 1000 }}, settle = {{ json = "usage.total_tokens" }} }}]

[[routes]]
name = "monthly"
path = "/body/absent"
upstream = "llm"
limits = [{{ limit = "org_month", cost = 100, settle = {{ json = "usage.total_tokens" }} }}]

[[routes]]
name = "monthly_header"
path = "/header"
upstream = "llm"
limits = [{{ limit = "org_month", cost = 100, settle = {{ header = "x-tokens" }} }}]

[[routes]]
name = "held"
path = "/held"
upstream = "llm"
limits = [{{ limit = "org_tokens", cost = 300, settle = {{ json = "usage.total_tokens" }} }}]
"#,
        url = redis.url()
    )
}

async fn chat(client: &HttpClient, org: &str, max_tokens: u64, used: u64) -> Reply {
    client
        .post(
            "/v1/chat/completions",
            &[
                ("content-type", "application/json"),
                ("x-org", org),
                ("x-test-tokens", &used.to_string()),
            ],
            &format!(r#"{{"max_tokens":{max_tokens},"messages":[]}}"#),
        )
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_the_debt_of_a_settled_response_with_one_call_each() {
    let redis = RedisServer::start();
    let upstream = start_llm_upstream().await;
    let text = policy(&redis, "2s");
    let first = start_gateway(&text, upstream.address).await;
    let second = start_gateway(&text, upstream.address).await;
    let (one, two) = (
        HttpClient::new(first.addresses[0]),
        HttpClient::new(second.addresses[0]),
    );
    // Warm both replicas' scripts, then count.
    assert_eq!(chat(&one, "warm", 10, 10).await.status, 200);
    assert_eq!(chat(&two, "warm", 10, 20).await.status, 200);
    let calls = redis.calls("evalsha");
    // Reserves 10, uses 1600: 1000 - 1600, a debt of 600.
    let reply = chat(&one, "acme", 10, 1600).await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        redis.calls("evalsha") - calls,
        2,
        "one call to decide, one to settle"
    );
    let refused = chat(&two, "acme", 10, 10).await;
    assert_eq!(refused.status, 429, "the other replica sees the debt");
    let wait: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!((36..=37).contains(&wait), "610 tokens at 1000/min: {wait}");
    assert_eq!(
        metric(
            &first.render_metrics(),
            r#"tollgate_settled_cost_total{direction="charge",limit="org_tokens",route="chat"}"#
        ),
        1590.0
    );
    // A refund through the other replica lands in the same bucket.
    let reply = chat(&two, "refunded", 900, 100).await;
    assert_eq!(reply.header("ratelimit-remaining"), Some("100"));
    let reply = chat(&one, "refunded", 10, 10).await;
    let left: f64 = reply
        .header("ratelimit-remaining")
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (890.0..=891.0).contains(&left),
        "900 - 10 (+ refill): {left}"
    );
    first.shutdown().await;
    second.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_monthly_quota_keeps_its_period_through_settlements() {
    let redis = RedisServer::start();
    let upstream = start_llm_upstream().await;
    let gateway = start_gateway(&policy(&redis, "2s"), upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    // Reserves 100; the header settles to 2000, twice: 5000 - 4000.
    for _ in 0..2 {
        let reply = client
            .get("/header", &[("x-org", "q"), ("x-test-tokens", "2000")])
            .await;
        assert_eq!(reply.status, 200);
    }
    let reply = client.get("/body/absent", &[("x-org", "q")]).await;
    assert_eq!(reply.header("ratelimit-remaining"), Some("900"));
    // The absent usage kept its reservation of 100; the next settles to 1000: 5000 - 5100,
    // a debt, refused until the month ends.
    let reply = client
        .get("/header", &[("x-org", "q"), ("x-test-tokens", "1000")])
        .await;
    assert_eq!(reply.status, 200);
    let refused = client.get("/body/absent", &[("x-org", "q")]).await;
    assert_eq!(refused.status, 429);
    assert_eq!(
        metric(
            &gateway.render_metrics(),
            r#"tollgate_settle_missing_total{limit="org_month",route="monthly"}"#
        ),
        1.0
    );
    gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_settlement_redis_runs_after_its_deadline_charges_nothing_and_is_counted() {
    let redis = RedisServer::start();
    let upstream = start_llm_upstream().await;
    let gateway = start_gateway(&policy(&redis, "300ms"), upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    // Warm the scripts.
    assert_eq!(chat(&client, "warm", 10, 10).await.status, 200);

    let mut stream = TcpStream::connect(gateway.addresses[0]).await.unwrap();
    stream
        .write_all(b"GET /held HTTP/1.1\r\nHost: a\r\nx-org: paused\r\nx-test-tokens: 40\r\n\r\n")
        .await
        .unwrap();
    let mut text = Vec::new();
    let mut chunk = [0u8; 4096];
    while !String::from_utf8_lossy(&text).contains("\"usage\":null") {
        let read = stream.read(&mut chunk).await.unwrap();
        assert!(read > 0);
        text.extend_from_slice(&chunk[..read]);
    }
    // Decided and reserved (300 of 1000); the settlement's call meets a paused server.
    redis.cli(&["CLIENT", "PAUSE", "1500", "ALL"]);
    upstream.release.notify_one();
    while !String::from_utf8_lossy(&text).ends_with("0\r\n\r\n") {
        let read = stream.read(&mut chunk).await.unwrap();
        assert!(read > 0, "the body ended");
        text.extend_from_slice(&chunk[..read]);
    }
    eventually("the late settlement was counted", || {
        metric(
            &gateway.render_metrics(),
            r#"tollgate_store_late_total{backend="redis"}"#,
        ) >= 1.0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        metric(
            &gateway.render_metrics(),
            r#"tollgate_settled_cost_total{direction="refund",limit="org_tokens",route="held"}"#
        ),
        0.0
    );
    // The refund of 260 never landed: the reservation of 300 stands (plus refill).
    let reply = chat(&client, "paused", 10, 10).await;
    let left: f64 = reply
        .header("ratelimit-remaining")
        .unwrap()
        .parse()
        .unwrap();
    assert!(left < 900.0, "the late refund did not land: {left}");
    gateway.shutdown().await;
}
