//! Each limit's refusal, shaped (`[limits.NAME.refusal]`) over real HTTP on both HTTP/1.1
//! paths: its status, no rate-limit headers, no `Retry-After`, its own body; the first
//! refusing limit in the route's list shapes the answer; the body file re-read on reload; and
//! the decision listener answering with the limit's status unless `refuse_status` is set.

mod common;

use common::*;

fn policy(dir: &std::path::Path, decision: &str) -> String {
    let body = dir.join("busy.html");
    format!(
        r#"
{decision}
[upstreams.app]
url = "http://{{upstream}}"

[limits.anti_flood]
key = {{ header = "x-user" }}
capacity = 1
rate = "1/h"

[limits.anti_flood.refusal]
status = 503
headers = "none"
retry_after = false
body_file = "{}"
content_type = "text/html; charset=utf-8"

[limits.per_user]
key = {{ header = "x-user" }}
capacity = 2
rate = "1/h"

[limits.quiet]
key = {{ header = "x-user" }}
capacity = 1
rate = "1/h"

[limits.quiet.refusal]
status = 420
retry_after = false

[[routes]]
name = "flood_first"
path = "/a"
upstream = "app"
limits = ["anti_flood", "per_user"]

[[routes]]
name = "plain_first"
path = "/b"
upstream = "app"
limits = ["per_user", "quiet"]

[[routes]]
name = "plain"
path = "/c"
upstream = "app"
limits = ["per_user"]
"#,
        body.display()
    )
}

async fn get(client: &HttpClient, path: &str, user: &str) -> Reply {
    client.get(path, &[("x-user", user)]).await
}

#[tokio::test]
async fn the_first_refusing_limit_shapes_the_answer() {
    for http1 in ["fast", "hyper"] {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("busy.html"), "<h1>Busy</h1>\n").unwrap();
        let upstream = start_upstream().await;
        let gateway = start_gateway_on(http1, &policy(dir.path(), ""), upstream.address).await;
        let client = HttpClient::new(gateway.addresses[0]);

        assert_eq!(get(&client, "/a", "ann").await.status, 200);
        let shaped = get(&client, "/a", "ann").await;
        assert_eq!(shaped.status, 503, "{http1}");
        assert_eq!(shaped.body, "<h1>Busy</h1>\n");
        assert_eq!(
            shaped.header("content-type"),
            Some("text/html; charset=utf-8")
        );
        assert_eq!(shaped.header("retry-after"), None);
        assert!(
            !shaped
                .headers
                .keys()
                .any(|name| name.as_str().starts_with("ratelimit")),
            "{:?}",
            shaped.headers
        );

        // Both refuse: the route lists per_user first, which is not shaped.
        assert_eq!(get(&client, "/b", "bob").await.status, 200);
        assert_eq!(get(&client, "/c", "bob").await.status, 200);
        let usual = get(&client, "/b", "bob").await;
        assert_eq!(usual.status, 429);
        assert!(usual.header("retry-after").is_some());
        assert!(usual.header("ratelimit-limit").is_some());
        // Only quiet refuses (per_user of a new user has a token): its status, the usual
        // headers, the usual JSON without a wait.
        let cat = get(&client, "/b", "cat").await;
        assert_eq!(cat.status, 200);
        let quiet = get(&client, "/b", "cat").await;
        assert_eq!(quiet.status, 420);
        assert_eq!(
            quiet.json(),
            serde_json::json!({"error": "too_many_requests"})
        );
        assert_eq!(quiet.header("retry-after"), None);
        assert!(quiet.header("ratelimit-limit").is_some());

        // A limit without a refusal of its own answers as always.
        for _ in 0..2 {
            let _ = get(&client, "/c", "dan").await;
        }
        let plain = get(&client, "/c", "dan").await;
        assert_eq!(plain.status, 429);
        assert_eq!(plain.json()["error"], "too_many_requests");
        let scrape = gateway.render_metrics();
        assert_eq!(
            metric(
                &scrape,
                "tollgate_requests_total{outcome=\"limited\",route=\"flood_first\"}"
            ),
            1.0,
            "counted as limited, as always"
        );
    }
}

#[tokio::test]
async fn a_reload_reads_the_body_file_again() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("busy.html");
    std::fs::write(&file, "first").unwrap();
    let upstream = start_upstream().await;
    let text = policy(dir.path(), "");
    let gateway = start_gateway(&text, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let _ = get(&client, "/a", "ann").await;
    assert_eq!(get(&client, "/a", "ann").await.body, "first");
    std::fs::write(&file, "second").unwrap();
    gateway.reload(compile(&text, upstream.address)).unwrap();
    assert_eq!(get(&client, "/a", "ann").await.body, "second");
}

#[tokio::test]
async fn the_decision_listener_answers_with_the_limits_status_unless_refuse_status_is_set() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("busy.html"), "busy").unwrap();
    for (decision, expected) in [
        ("[decision]\nlisten = \"127.0.0.1:0\"\n", 503),
        (
            "[decision]\nlisten = \"127.0.0.1:0\"\nrefuse_status = 403\n",
            403,
        ),
    ] {
        let upstream = start_upstream().await;
        let gateway = start_gateway(&policy(dir.path(), decision), upstream.address).await;
        let decision = HttpClient::new(gateway.decision_address.unwrap());
        let ask = || {
            decision.get(
                "/decide",
                &[
                    ("x-forwarded-method", "GET"),
                    ("x-forwarded-uri", "/a"),
                    ("x-forwarded-host", "shop.example"),
                    ("x-forwarded-for", "198.51.100.7"),
                    ("x-user", "eve"),
                ],
            )
        };
        assert_eq!(ask().await.status, 200);
        let refused = ask().await;
        assert_eq!(refused.status, expected);
        assert_eq!(refused.header("x-tollgate-limit"), Some("anti_flood"));
        assert_eq!(refused.header("retry-after"), None);
    }
}
