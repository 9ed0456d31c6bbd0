//! The decision listener's forward-auth over real sockets: sub-requests to `/decide` decided
//! by the proxy listener's routes, keys and buckets; the answers, headers and counts an asking
//! proxy reads; the client found in the asking proxy's `X-Forwarded-For` however a client
//! rotates its own; and who may ask. Both HTTP/1.1 paths.

mod common;

use std::net::SocketAddr;

use common::*;
use tollgate::Tollgate;

const POLICY: &str = r#"
[decision]
listen = "127.0.0.1:0"

[upstreams.app]
url = "http://{upstream}"

[limits.per_network]
key = "client_network"
capacity = 2
rate = "1/h"

[limits.per_account]
key = { json_field = "email" }
missing = "skip"
capacity = 1
rate = "1/h"

[limits.slots]
key = "global"
concurrency = 1

[limits.per_user]
key = { header = "x-user" }
capacity = 1
rate = "1/h"

[[routes]]
name = "login"
path = "/login"
methods = ["POST"]
upstream = "app"
limits = ["per_account", "slots", "per_network"]

[[routes]]
name = "users"
path_prefix = "/users"
upstream = "app"
limits = ["per_user"]
"#;

fn decision_address(gateway: &Tollgate) -> SocketAddr {
    gateway.decision_address.expect("a decision listener")
}

/// A sub-request as Caddy's `forward_auth` sends it.
async fn ask(
    client: &HttpClient,
    method: &str,
    uri: &str,
    forwarded_for: &str,
    extra: &[(&str, &str)],
) -> Reply {
    let mut headers = vec![
        ("x-forwarded-method", method),
        ("x-forwarded-uri", uri),
        ("x-forwarded-host", "shop.example"),
        ("x-forwarded-proto", "https"),
        ("x-forwarded-for", forwarded_for),
    ];
    headers.extend_from_slice(extra);
    client.get("/decide", &headers).await
}

#[tokio::test]
async fn limits_hold_for_the_client_the_asking_proxy_saw() {
    for http1 in ["fast", "hyper"] {
        let upstream = start_upstream().await;
        let gateway = start_gateway_on(http1, POLICY, upstream.address).await;
        let client = HttpClient::new(decision_address(&gateway));
        // A client rotating its own X-Forwarded-For: the entry the proxy appended decides.
        for (n, expected) in [(1, 200), (2, 200), (3, 429), (4, 429)] {
            let forwarded = format!("198.51.100.{n}, 203.0.113.9");
            let reply = ask(&client, "POST", "/login", &forwarded, &[]).await;
            assert_eq!(reply.status, expected, "{http1}: request {n}");
            assert_eq!(reply.header("x-tollgate-route"), Some("login"));
            if expected == 429 {
                assert_eq!(reply.header("x-tollgate-limit"), Some("per_network"));
                let wait: u64 = reply.header("retry-after").unwrap().parse().unwrap();
                assert!(wait > 0 && wait <= 3600, "{wait}");
                assert_eq!(reply.json()["error"], "too_many_requests");
            } else {
                assert_eq!(reply.header("x-tollgate-limit"), None);
                assert_eq!(reply.header("ratelimit-limit"), Some("2"));
            }
        }
        // Another client is decided on its own bucket; no request went upstream.
        let other = ask(&client, "POST", "/login", "203.0.113.10", &[]).await;
        assert_eq!(other.status, 200);
        assert_eq!(upstream.hits.load(std::sync::atomic::Ordering::Relaxed), 0);
        let scrape = gateway.render_metrics();
        assert_metrics(
            &scrape,
            &[
                (
                    "tollgate_decision_requests_total{outcome=\"allowed\",protocol=\"http\"}",
                    3.0,
                ),
                (
                    "tollgate_decision_requests_total{outcome=\"limited\",protocol=\"http\"}",
                    2.0,
                ),
                (
                    "tollgate_requests_total{outcome=\"limited\",route=\"login\"}",
                    2.0,
                ),
                (
                    "tollgate_limited_total{limit=\"per_network\",route=\"login\"}",
                    2.0,
                ),
            ],
        );
        gateway.shutdown().await;
    }
}

#[tokio::test]
async fn the_original_request_is_routed_as_the_proxy_routes_it() {
    let upstream = start_upstream().await;
    let gateway = start_gateway(POLICY, upstream.address).await;
    let client = HttpClient::new(decision_address(&gateway));
    // nginx's fields, a path in another spelling, a method in lower case.
    let headers = [
        ("x-original-method", "get"),
        ("x-original-uri", "/users/./7/../8?tab=1"),
        ("x-forwarded-for", "203.0.113.9"),
        ("x-user", "ada"),
    ];
    let first = client.get("/decide", &headers).await;
    assert_eq!(first.status, 200);
    assert_eq!(first.header("x-tollgate-route"), Some("users"));
    let second = client.get("/decide", &headers).await;
    assert_eq!(second.status, 429);
    assert_eq!(second.header("x-tollgate-limit"), Some("per_user"));
    // Nothing routes it: admitted, and said so.
    let none = ask(&client, "GET", "/elsewhere", "203.0.113.9", &[]).await;
    assert_eq!(none.status, 200);
    assert_eq!(none.header("x-tollgate-route"), Some("none"));
    let scrape = gateway.render_metrics();
    assert_eq!(
        metric(
            &scrape,
            "tollgate_decision_requests_total{outcome=\"no_route\",protocol=\"http\"}"
        ),
        1.0
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn what_a_sub_request_cannot_carry_is_not_guessed() {
    let upstream = start_upstream().await;
    let gateway = start_gateway(POLICY, upstream.address).await;
    let client = HttpClient::new(decision_address(&gateway));
    // A body-keyed limit counts its key as missing (`skip`), the concurrency limit (one slot)
    // does not apply: two decisions at once both pass; the third request is the network's.
    let (a, b) = tokio::join!(
        ask(&client, "POST", "/login", "203.0.113.20", &[]),
        ask(&client, "POST", "/login", "203.0.113.20", &[]),
    );
    assert_eq!((a.status.as_u16(), b.status.as_u16()), (200, 200));
    assert_eq!(
        ask(&client, "POST", "/login", "203.0.113.20", &[])
            .await
            .status,
        429
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_sub_request_that_does_not_describe_a_request_is_a_400_naming_what_it_lacks() {
    let upstream = start_upstream().await;
    let gateway = start_gateway(POLICY, upstream.address).await;
    let client = HttpClient::new(decision_address(&gateway));
    let no_method = client
        .get(
            "/decide",
            &[
                ("x-forwarded-uri", "/login"),
                ("x-forwarded-for", "203.0.113.9"),
            ],
        )
        .await;
    assert_eq!(no_method.status, 400);
    assert!(no_method.json()["detail"]
        .as_str()
        .unwrap()
        .contains("x-forwarded-method"));
    let no_target = client
        .get(
            "/decide",
            &[
                ("x-forwarded-method", "GET"),
                ("x-forwarded-for", "203.0.113.9"),
            ],
        )
        .await;
    assert_eq!(no_target.status, 400);
    assert!(no_target.json()["detail"]
        .as_str()
        .unwrap()
        .contains("x-forwarded-uri"));
    // Without X-Forwarded-For the client is unknown: never the asking proxy's own address.
    let no_client = client
        .get(
            "/decide",
            &[
                ("x-forwarded-method", "GET"),
                ("x-forwarded-uri", "/users/1"),
                ("x-user", "bob"),
            ],
        )
        .await;
    assert_eq!(no_client.status, 400);
    assert!(no_client.json()["detail"]
        .as_str()
        .unwrap()
        .contains("X-Forwarded-For"));
    let elsewhere = client.get("/other", &[]).await;
    assert_eq!(elsewhere.status, 404);
    gateway.shutdown().await;
}

#[tokio::test]
async fn only_the_allowed_networks_may_ask_and_refusals_take_the_configured_status() {
    let upstream = start_upstream().await;
    let policy = POLICY.replace(
        "listen = \"127.0.0.1:0\"\n",
        "listen = \"127.0.0.1:0\"\nallow = [\"10.0.0.0/8\"]\n",
    );
    let gateway = start_gateway(&policy, upstream.address).await;
    let client = HttpClient::new(decision_address(&gateway));
    let refused = ask(
        &client,
        "GET",
        "/users/1",
        "203.0.113.9",
        &[("x-user", "x")],
    )
    .await;
    assert_eq!(refused.status, 403);
    assert_eq!(refused.json()["error"], "forbidden");
    gateway.shutdown().await;

    let policy = POLICY.replace(
        "listen = \"127.0.0.1:0\"\n",
        "listen = \"127.0.0.1:0\"\nrefuse_status = 403\n",
    );
    let gateway = start_gateway(&policy, upstream.address).await;
    let client = HttpClient::new(decision_address(&gateway));
    let ask_user = || {
        ask(
            &client,
            "GET",
            "/users/1",
            "203.0.113.9",
            &[("x-user", "y")],
        )
    };
    assert_eq!(ask_user().await.status, 200);
    let refused = ask_user().await;
    assert_eq!(refused.status, 403);
    assert!(refused.header("retry-after").is_some());
    assert_eq!(refused.header("x-tollgate-limit"), Some("per_user"));
    gateway.shutdown().await;
}

#[tokio::test]
async fn the_proxy_listener_and_the_decision_listener_share_buckets() {
    let upstream = start_upstream().await;
    let gateway = start_gateway(POLICY, upstream.address).await;
    let proxy = HttpClient::new(gateway.addresses[0]);
    let decision = HttpClient::new(decision_address(&gateway));
    let through = proxy.get("/users/1", &[("x-user", "carol")]).await;
    assert_eq!(through.status, 200);
    let asked = ask(
        &decision,
        "GET",
        "/users/2",
        "203.0.113.9",
        &[("x-user", "carol")],
    )
    .await;
    assert_eq!(asked.status, 429, "the proxy's request took carol's token");
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_decision_listener_may_be_the_only_listener() {
    let upstream = start_upstream().await;
    let policy = format!("[server]\nlisten = []\n{POLICY}");
    let gateway = start_gateway(&policy, upstream.address).await;
    assert!(gateway.addresses.is_empty());
    let client = HttpClient::h2c(decision_address(&gateway));
    let reply = ask(
        &client,
        "GET",
        "/users/1",
        "2001:db8::1",
        &[("x-user", "dan")],
    )
    .await;
    assert_eq!(reply.status, 200, "h2c on the same port");
    assert_eq!(reply.header("x-tollgate-route"), Some("users"));
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_reload_changes_what_the_decision_listener_decides() {
    let upstream = start_upstream().await;
    let gateway = start_gateway(POLICY, upstream.address).await;
    let client = HttpClient::new(decision_address(&gateway));
    let ask_user = |user: &'static str| {
        let client = client.clone();
        async move {
            ask(
                &client,
                "GET",
                "/users/1",
                "203.0.113.9",
                &[("x-user", user)],
            )
            .await
            .status
        }
    };
    assert_eq!(ask_user("fay").await, 200);
    assert_eq!(ask_user("fay").await, 429);
    // Twice the capacity: a redefined limit starts fresh with it.
    let roomier = POLICY.replace(
        "[limits.per_user]\nkey = { header = \"x-user\" }\ncapacity = 1",
        "[limits.per_user]\nkey = { header = \"x-user\" }\ncapacity = 2",
    );
    gateway.reload(compile(&roomier, upstream.address)).unwrap();
    assert_eq!(ask_user("fay").await, 200);
    assert_eq!(ask_user("fay").await, 200);
    assert_eq!(ask_user("fay").await, 429);
    // Draining: the listener stops accepting, and what was asked is answered.
    assert!(gateway.shutdown().await);
    assert!(std::net::TcpStream::connect(decision_address(&gateway)).is_err());
}
