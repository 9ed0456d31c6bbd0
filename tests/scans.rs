//! `[scan]` over HTTP: distinct paths answered 404 make a scan and repeats do not, only the
//! listed statuses count, exempt networks are never counted, a ban refuses the key on every
//! route until it ends or is lifted, `/scans` lists it, and with Redis every replica bans it.

mod common;

use std::time::Duration;

use bytes::Bytes;

use common::redis_server::RedisServer;
use common::*;
use tollgate::{Options, Tollgate};

const POLICY: &str = r#"
[client_ip]
trusted_hops = 1

[upstreams.app]
url = "http://{upstream}"

[[routes]]
name = "api"
path_prefix = "/api"
upstream = "app"

[[routes]]
name = "site"
path_prefix = "/"
upstream = "app"

[scan]
key = "client_network"
ipv4_prefix = 24
statuses = [404]
distinct_paths = 5
within = "60s"
ban = "10m"
exempt = ["10.9.0.0/16"]
"#;

async fn get(client: &HttpClient, path: &str, from: &str) -> Reply {
    client.get(path, &[("x-forwarded-for", from)]).await
}

/// Walks `count` distinct missing paths from `from`, each answered 404 by the upstream.
async fn walk(client: &HttpClient, from: &str, count: usize) {
    for n in 0..count {
        let reply = get(client, &format!("/missing/{n}"), from).await;
        assert_eq!(reply.status, 404, "path {n} from {from}");
    }
}

#[tokio::test]
async fn a_scan_is_banned_on_every_route_listed_and_lifted() {
    let upstream = start_upstream().await;
    let gateway = start_gateway(POLICY, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let admin = HttpClient::new(gateway.admin_address);

    // One missing path asked again and again is not a scan.
    for _ in 0..10 {
        assert_eq!(get(&client, "/missing/same", "10.0.1.7").await.status, 404);
    }
    assert_eq!(get(&client, "/api/a", "10.0.1.7").await.status, 200);
    // Four more distinct paths make five: the fifth is answered, the next is refused.
    walk(&client, "10.0.1.7", 4).await;
    for path in ["/api/orders", "/index.html"] {
        let refused = get(&client, path, "10.0.1.8").await;
        assert_eq!(refused.status, 429, "{path}: the whole /24 is banned");
        let retry_after: u64 = refused.header("retry-after").unwrap().parse().unwrap();
        assert!((590..=600).contains(&retry_after), "{retry_after}");
        let body = refused.json();
        assert_eq!(body["ban"]["reason"], "scan", "{body}");
        assert!(body["ban"]["until_unix"].as_u64().is_some());
    }
    assert_eq!(
        get(&client, "/api/a", "10.0.2.7").await.status,
        200,
        "another network"
    );

    let metrics = gateway.render_metrics();
    assert_eq!(metric(&metrics, "tollgate_scans_detected_total"), 1.0);
    assert_eq!(
        metric(
            &metrics,
            r#"tollgate_requests_total{outcome="banned",route="api"}"#
        ),
        1.0
    );
    let scans = admin.get("/scans", &[]).await.json();
    let listed = scans["scans"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{scans}");
    assert_eq!(listed[0]["key"], "v4:10.0.1.0/24");
    assert_eq!(listed[0]["distinct_paths"], 5);
    assert!(listed[0]["banned_until_unix"].as_u64().is_some());
    assert!(listed[0]["first_seen_unix"].as_u64() <= listed[0]["last_seen_unix"].as_u64());

    // Lifted by an address of the network, read as the key reads it.
    assert_eq!(
        admin
            .send("DELETE", "/scans?key=10.0.1.99", &[], Bytes::new())
            .await
            .status,
        204
    );
    assert_eq!(get(&client, "/api/a", "10.0.1.7").await.status, 200);
    assert_eq!(
        admin
            .send("DELETE", "/scans?key=10.0.1.99", &[], Bytes::new())
            .await
            .status,
        404
    );
    assert_eq!(
        admin
            .send("DELETE", "/scans?key=not-an-address", &[], Bytes::new())
            .await
            .status,
        400
    );
    // Lifted means counted afresh: four paths are not five.
    walk(&client, "10.0.1.7", 4).await;
    assert_eq!(get(&client, "/api/a", "10.0.1.7").await.status, 200);
}

#[tokio::test]
async fn only_listed_statuses_count_and_exempt_networks_never_do() {
    let upstream = start_upstream().await;
    let gateway = start_gateway(POLICY, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    // Twenty distinct pages answered 200.
    for n in 0..20 {
        assert_eq!(
            get(&client, &format!("/page/{n}"), "10.0.3.7").await.status,
            200
        );
    }
    // An exempt network walks twenty missing paths.
    walk(&client, "10.9.4.7", 20).await;
    assert_eq!(get(&client, "/api/a", "10.9.4.7").await.status, 200);
    assert_eq!(get(&client, "/api/a", "10.0.3.7").await.status, 200);
    assert_eq!(
        metric(&gateway.render_metrics(), "tollgate_scans_detected_total"),
        0.0
    );
    let scans = HttpClient::new(gateway.admin_address)
        .get("/scans", &[])
        .await;
    assert_eq!(scans.json()["scans"], serde_json::json!([]));
}

#[tokio::test]
async fn without_ban_a_scan_is_only_logged_and_counted() {
    let upstream = start_upstream().await;
    let policy = POLICY.replace("ban = \"10m\"\n", "");
    let gateway = start_gateway(&policy, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    walk(&client, "10.0.5.7", 5).await;
    assert_eq!(get(&client, "/api/a", "10.0.5.7").await.status, 200);
    assert_eq!(
        metric(&gateway.render_metrics(), "tollgate_scans_detected_total"),
        1.0
    );
    let scans = HttpClient::new(gateway.admin_address)
        .get("/scans", &[])
        .await
        .json();
    assert_eq!(
        scans["scans"][0]["banned_until_unix"],
        serde_json::Value::Null
    );
}

/// Two replicas on one `redis-server`: a scan detected on one is banned by the other, and a
/// ban lifted on the other is lifted on the first.
#[tokio::test]
async fn a_scan_ban_holds_on_every_replica() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\nhash_key = \"scan-test-secret-0123456789\"\n",
        redis.url()
    );
    let policy = compile(&format!("{store}{POLICY}"), upstream.address);
    let one = Tollgate::start(policy.clone(), Options::default())
        .await
        .unwrap();
    let two = Tollgate::start(policy, Options::default()).await.unwrap();
    let (client_one, client_two) = (
        HttpClient::new(one.addresses[0]),
        HttpClient::new(two.addresses[0]),
    );
    walk(&client_one, "10.0.6.7", 5).await;
    assert_eq!(get(&client_one, "/api/a", "10.0.6.7").await.status, 429);
    assert!(
        answered_within(&client_two, "10.0.6.7", 429).await,
        "the other replica bans the key"
    );
    let admin_two = HttpClient::new(two.admin_address);
    assert_eq!(
        admin_two
            .send("DELETE", "/scans?key=10.0.6.1", &[], Bytes::new())
            .await
            .status,
        204
    );
    assert!(
        answered_within(&client_one, "10.0.6.7", 200).await,
        "the first replica lifts the ban"
    );
}

/// Whether `/api/a` from `from` is answered `status` within 10 s.
async fn answered_within(client: &HttpClient, from: &str, status: u16) -> bool {
    for _ in 0..100 {
        if get(client, "/api/a", from).await.status == status {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

#[test]
fn scan_settings_that_cannot_work_are_refused_with_the_reason() {
    let base = POLICY.replace("{upstream}", "127.0.0.1:1");
    for (change, named) in [
        (
            (
                "key = \"client_network\"",
                "key = { json_field = \"user\" }",
            ),
            "scan.key",
        ),
        (
            ("distinct_paths = 5", "distinct_paths = 1"),
            "scan.distinct_paths",
        ),
        (("statuses = [404]", "statuses = [1404]"), "scan.statuses"),
        (("within = \"60s\"", "within = \"0s\""), "scan.within"),
        (
            ("ban = \"10m\"", "ban = \"10m\"\nwindow = \"1s\""),
            "window",
        ),
    ] {
        let text = base.replace(change.0, change.1);
        let errors = tollgate::config::Policy::parse("test", &text).unwrap_err();
        assert!(errors.to_string().contains(named), "{named}: {errors}");
    }
}
