//! Concurrency limits: a key's requests in flight, each holding a slot until its response
//! body is sent or its client leaves; all or nothing with the route's token buckets.

use tokio::net::TcpStream;

use super::HTTP1;
use crate::common::*;

const POLICY: &str = r#"
[upstreams.app]
url = "http://{upstream}"

[limits.exports]
key = { header = "x-user" }
concurrency = 2

[limits.per_user]
key = { header = "x-user" }
capacity = 3
rate = "1/h"

[[routes]]
name = "exports"
path = "/held-body"
upstream = "app"
limits = ["exports"]

[[routes]]
name = "reports"
path = "/report"
upstream = "app"
limits = ["exports", "per_user"]

[[routes]]
name = "default"
path_prefix = "/"
upstream = "app"
"#;

const IN_USE: &str = r#"tollgate_concurrency_in_use{limit="exports"}"#;

/// `GET path` for `user` on a new connection: the response head, and the connection (its
/// body still coming for `/held-body`).
async fn request(gateway: &tollgate::Tollgate, path: &str, user: &str) -> (String, TcpStream) {
    let request = format!("GET {path} HTTP/1.1\r\nHost: a\r\nx-user: {user}\r\n\r\n");
    raw_head(gateway.addresses[0], request.as_bytes()).await
}

async fn until_in_use(gateway: &tollgate::Tollgate, expected: f64) {
    eventually(&format!("{IN_USE} reaches {expected}"), || {
        metric(&gateway.render_metrics(), IN_USE) == expected
    })
    .await;
}

#[tokio::test]
async fn two_exports_per_user_and_a_client_that_leaves_gives_its_slot_back() {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, POLICY, upstream.address).await;
    let (first, held_first) = request(&gateway, "/held-body", "ann").await;
    let (second, _held_second) = request(&gateway, "/held-body", "ann").await;
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    assert!(second.contains("ratelimit-remaining: 0"), "{second}");
    assert_eq!(metric(&gateway.render_metrics(), IN_USE), 2.0);

    // Both of ann's slots are held while their bodies are still coming: a third is refused.
    let (refused, _) = request(&gateway, "/held-body", "ann").await;
    assert_eq!(raw_status(&refused), 429, "{refused}");
    for field in [
        "retry-after: 1",
        "ratelimit-limit: 2",
        "ratelimit-remaining: 0",
    ] {
        assert!(refused.contains(field), "{field}: {refused}");
    }
    // Another user has slots of their own.
    let (other, _held_other) = request(&gateway, "/held-body", "ben").await;
    assert!(other.starts_with("HTTP/1.1 200"), "{other}");

    // Ann's first client goes away: its slot comes back, and her next export is admitted.
    drop(held_first);
    until_in_use(&gateway, 2.0).await;
    let (again, _held_again) = request(&gateway, "/held-body", "ann").await;
    assert!(again.starts_with("HTTP/1.1 200"), "{again}");
    assert_eq!(upstream.hits.load(std::sync::atomic::Ordering::SeqCst), 4);
}

#[tokio::test]
async fn slots_and_tokens_are_taken_all_or_nothing() {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, POLICY, upstream.address).await;
    let held = [
        request(&gateway, "/held-body", "ann").await.1,
        request(&gateway, "/held-body", "ann").await.1,
    ];
    // Refused for want of a slot, the report takes none of ann's 3 tokens.
    let (refused, _) = request(&gateway, "/report", "ann").await;
    assert_eq!(raw_status(&refused), 429, "{refused}");
    drop(held);
    until_in_use(&gateway, 0.0).await;
    for _ in 0..3 {
        let (admitted, _) = request(&gateway, "/report", "ann").await;
        assert!(admitted.starts_with("HTTP/1.1 200"), "{admitted}");
    }
    // Refused by the bucket, the fourth holds no slot.
    let (refused, _) = request(&gateway, "/report", "ann").await;
    assert_eq!(raw_status(&refused), 429, "{refused}");
    until_in_use(&gateway, 0.0).await;
    assert_metrics(
        &gateway.render_metrics(),
        &[
            (
                r#"tollgate_limited_total{limit="exports",route="reports"}"#,
                1.0,
            ),
            (
                r#"tollgate_limited_total{limit="per_user",route="reports"}"#,
                1.0,
            ),
        ],
    );
}
