//! Limits over real HTTP: bursts, costs, shared buckets, keys, shadow, exempt, headers.

use std::time::Duration;

use super::HTTP1;
use crate::common::*;
use tollgate::limit::Clock;

const LOGIN: &str = r#"
[client_ip]
trusted_hops = 1

[upstreams.app]
url = "http://{upstream}"

[limits.per_network]
key = "client_network"
capacity = 5
rate = "1/h"

[limits.per_account]
key = { json_field = "email" }
normalize = "email"
missing = "reject"
capacity = 3
rate = "1/h"

[limits.login_global]
key = "global"
capacity = 1000
rate = "50/s"

[limits.api_user]
key = { header = "x-user-id" }
missing = "reject"
capacity = 300
rate = "1/h"

[[routes]]
name = "login"
methods = ["POST"]
path = "/login"
upstream = "app"
limits = ["per_network", "per_account", "login_global"]

[[routes]]
name = "export"
methods = ["POST"]
path = "/api/export"
upstream = "app"
limits = [{ limit = "api_user", cost = 100 }]

[[routes]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limits = ["api_user"]

[[routes]]
name = "default"
path_prefix = "/"
upstream = "app"
limits = ["per_network"]
"#;

fn login_body(email: &str) -> String {
    format!(r#"{{"email":"{email}","password":"wrong"}}"#)
}

const JSON: (&str, &str) = ("content-type", "application/json");

#[tokio::test]
async fn burst_then_429_with_retry_after_and_ratelimit_headers() {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, LOGIN, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let from = ("x-forwarded-for", "198.51.100.7");
    for remaining in (0..5).rev() {
        let reply = client.get("/page", &[from]).await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.header("ratelimit-limit"), Some("5"));
        assert_eq!(
            reply.header("ratelimit-remaining"),
            Some(remaining.to_string().as_str())
        );
    }
    let refused = client.get("/page", &[from]).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("content-type"), Some("application/json"));
    // One token every hour: the next request passes in 3600 s.
    assert_eq!(refused.header("retry-after"), Some("3600"));
    assert_eq!(
        refused.json(),
        serde_json::json!({"error": "too_many_requests", "retry_after": 3600})
    );
    assert_eq!(refused.header("ratelimit-remaining"), Some("0"));
    assert_eq!(refused.header("ratelimit-reset"), Some("18000"));
    assert_eq!(
        upstream.hits.load(std::sync::atomic::Ordering::SeqCst),
        5,
        "refusals never reach the upstream"
    );
    // Another network is unaffected.
    assert_eq!(
        client
            .get("/page", &[("x-forwarded-for", "198.51.100.8")])
            .await
            .status,
        200
    );
}

#[tokio::test]
async fn refill_follows_the_clock() {
    let upstream = start_upstream().await;
    let clock = Clock::manual();
    let policy = LOGIN.replace(
        "rate = \"1/h\"\n\n[limits.per_account]",
        "rate = \"1/s\"\n\n[limits.per_account]",
    );
    let gateway =
        start_gateway_with_clock_on(HTTP1, &policy, upstream.address, Some(clock.clone())).await;
    let client = HttpClient::new(gateway.addresses[0]);
    for _ in 0..5 {
        assert_eq!(client.get("/", &[]).await.status, 200);
    }
    let refused = client.get("/", &[]).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("retry-after"), Some("1"));
    clock.advance(Duration::from_millis(999));
    assert_eq!(client.get("/", &[]).await.status, 429);
    clock.advance(Duration::from_millis(1));
    assert_eq!(client.get("/", &[]).await.status, 200);
    assert_eq!(client.get("/", &[]).await.status, 429);
    clock.advance(Duration::from_secs(3600));
    for _ in 0..5 {
        assert_eq!(
            client.get("/", &[]).await.status,
            200,
            "refilled to capacity, not beyond"
        );
    }
    assert_eq!(client.get("/", &[]).await.status, 429);
}

#[tokio::test]
async fn costs_charge_more_tokens_and_a_limit_shared_by_routes_is_one_bucket() {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, LOGIN, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let user = ("x-user-id", "42");
    for _ in 0..2 {
        assert_eq!(client.post("/api/export", &[user], "").await.status, 200);
    }
    // 100 tokens left: 100 cost-1 API calls fit, then the bucket is empty for both routes.
    for _ in 0..99 {
        assert_eq!(client.get("/api/items", &[user]).await.status, 200);
    }
    let reply = client.get("/api/items", &[user]).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("ratelimit-remaining"), Some("0"));
    assert_eq!(client.get("/api/items", &[user]).await.status, 429);
    let export = client.post("/api/export", &[user], "").await;
    assert_eq!(export.status, 429);
    assert_eq!(
        export.header("retry-after"),
        Some("360000"),
        "100 tokens at 1/h"
    );
    assert_eq!(
        client
            .get("/api/items", &[("x-user-id", "43")])
            .await
            .status,
        200
    );
    let missing = client.get("/api/items", &[]).await;
    assert_eq!(missing.status, 400);
    assert!(missing.json()["detail"]
        .as_str()
        .unwrap()
        .contains("x-user-id"));
}

#[tokio::test]
async fn credential_stuffing_from_many_addresses_is_stopped_per_account() {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, LOGIN, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let mut statuses = Vec::new();
    for attempt in 0..10 {
        let address = format!("203.0.113.{attempt}");
        // The same account, spelled differently each time.
        let email = if attempt % 2 == 0 {
            "Victim@Example.com"
        } else {
            " victim@example.com"
        };
        let reply = client
            .post(
                "/login",
                &[JSON, ("x-forwarded-for", &address)],
                &login_body(email),
            )
            .await;
        statuses.push(reply.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429, 429, 429, 429, 429]);
    // Another account from one of those addresses still gets through.
    let other = client
        .post(
            "/login",
            &[JSON, ("x-forwarded-for", "203.0.113.5")],
            &login_body("other@example.com"),
        )
        .await;
    assert_eq!(other.status, 200);
    let scrape = gateway.render_metrics();
    assert_metrics(
        &scrape,
        &[
            (
                r#"tollgate_limited_total{limit="per_account",route="login"}"#,
                7.0,
            ),
            (
                r#"tollgate_requests_total{outcome="limited",route="login"}"#,
                7.0,
            ),
        ],
    );
}

#[tokio::test]
async fn rotating_addresses_inside_one_ipv6_64_share_a_bucket() {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, LOGIN, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let mut statuses = Vec::new();
    for attempt in 0..8 {
        let address = format!("2001:db8:1:2:{attempt:x}:{:x}::1", attempt * 7919);
        let reply = client
            .post(
                "/login",
                &[JSON, ("x-forwarded-for", &address)],
                &login_body(&format!("user{attempt}@example.com")),
            )
            .await;
        statuses.push(reply.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429, 429]);
    // The neighbouring /64 is another subscriber.
    let neighbour = client
        .post(
            "/login",
            &[JSON, ("x-forwarded-for", "2001:db8:1:3::1")],
            &login_body("n@example.com"),
        )
        .await;
    assert_eq!(neighbour.status, 200);
}

#[tokio::test]
async fn spoofed_forwarded_for_entries_get_no_fresh_bucket() {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, LOGIN, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let mut statuses = Vec::new();
    for attempt in 0..7 {
        // The client invents addresses; the trusted proxy appended the real one last.
        let chain = format!("10.9.{attempt}.1, 192.0.2.{attempt}, 198.51.100.77");
        statuses.push(
            client
                .get("/", &[("x-forwarded-for", &chain)])
                .await
                .status
                .as_u16(),
        );
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429, 429]);
    // Garbage at the deciding position is a 400, not a fresh bucket.
    let garbage = client
        .get("/", &[("x-forwarded-for", "198.51.100.77, not-an-address")])
        .await;
    assert_eq!(garbage.status, 400);
}

#[tokio::test]
async fn without_trusted_hops_the_peer_is_the_client_whatever_it_claims() {
    let upstream = start_upstream().await;
    let policy = LOGIN.replace("trusted_hops = 1", "trusted_hops = 0");
    let gateway = start_gateway_on(HTTP1, &policy, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    for attempt in 0..5 {
        let claim = format!("203.0.113.{attempt}");
        assert_eq!(
            client.get("/", &[("x-forwarded-for", &claim)]).await.status,
            200
        );
    }
    assert_eq!(
        client
            .get("/", &[("x-forwarded-for", "203.0.113.200")])
            .await
            .status,
        429
    );
    let scrape = gateway.render_metrics();
    assert!(
        metric(
            &scrape,
            r#"tollgate_client_ip_warnings_total{cause="forwarded_but_no_hop_trusted"}"#
        ) >= 6.0
    );
}

#[tokio::test]
async fn path_variants_share_the_login_bucket() {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, LOGIN, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let variants = [
        "/login",
        "//login",
        "/login/",
        "/./login",
        "/%6Cogin",
        "/x/../login",
    ];
    let mut statuses = Vec::new();
    for (index, path) in variants.iter().enumerate() {
        let address = format!("192.0.2.{index}");
        let reply = client
            .post(
                path,
                &[JSON, ("x-forwarded-for", &address)],
                &login_body("alice@example.com"),
            )
            .await;
        statuses.push(reply.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429]);
    let echoed = client
        .post(
            "//login",
            &[JSON, ("x-forwarded-for", "192.0.2.99")],
            &login_body("bob@example.com"),
        )
        .await;
    assert_eq!(
        echoed.json()["uri"],
        "/login",
        "the upstream receives the normalized path"
    );
}

#[tokio::test]
async fn shadow_limits_count_but_never_refuse() {
    let upstream = start_upstream().await;
    let policy = LOGIN.replace(
        "capacity = 5\nrate = \"1/h\"",
        "capacity = 5\nrate = \"1/h\"\nmode = \"shadow\"",
    );
    let gateway = start_gateway_on(HTTP1, &policy, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    for _ in 0..8 {
        let reply = client.get("/", &[]).await;
        assert_eq!(reply.status, 200);
        assert!(
            reply.header("ratelimit-limit").is_none(),
            "shadow limits stay invisible to clients"
        );
    }
    let scrape = gateway.render_metrics();
    assert_metrics(
        &scrape,
        &[
            (
                r#"tollgate_requests_total{outcome="allowed",route="default"}"#,
                5.0,
            ),
            (
                r#"tollgate_requests_total{outcome="shadow_limited",route="default"}"#,
                3.0,
            ),
            (
                r#"tollgate_tokens_consumed_total{limit="per_network",route="default"}"#,
                5.0,
            ),
        ],
    );
}

#[tokio::test]
async fn exempt_networks_are_never_limited() {
    let upstream = start_upstream().await;
    let policy = LOGIN.replace(
        "capacity = 5\nrate = \"1/h\"",
        "capacity = 5\nrate = \"1/h\"\nexempt = [\"10.0.0.0/8\"]",
    );
    let gateway = start_gateway_on(HTTP1, &policy, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    for _ in 0..10 {
        assert_eq!(
            client
                .get("/", &[("x-forwarded-for", "10.1.2.3")])
                .await
                .status,
            200
        );
    }
    for _ in 0..5 {
        assert_eq!(
            client
                .get("/", &[("x-forwarded-for", "11.1.2.3")])
                .await
                .status,
            200
        );
    }
    assert_eq!(
        client
            .get("/", &[("x-forwarded-for", "11.1.2.3")])
            .await
            .status,
        429
    );
}

#[tokio::test]
async fn all_or_nothing_a_refusal_charges_no_other_limit() {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, LOGIN, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let from = ("x-forwarded-for", "198.51.100.50");
    for _ in 0..3 {
        assert_eq!(
            client
                .post("/login", &[JSON, from], &login_body("carol@example.com"))
                .await
                .status,
            200
        );
    }
    // The account is exhausted; these refusals must not drain the network bucket (2 left).
    for _ in 0..5 {
        assert_eq!(
            client
                .post("/login", &[JSON, from], &login_body("carol@example.com"))
                .await
                .status,
            429
        );
    }
    assert_eq!(client.get("/", &[from]).await.status, 200);
    assert_eq!(client.get("/", &[from]).await.status, 200);
    assert_eq!(client.get("/", &[from]).await.status, 429);
    let scrape = gateway.render_metrics();
    assert_metrics(
        &scrape,
        &[
            (
                r#"tollgate_tokens_consumed_total{limit="per_network",route="login"}"#,
                3.0,
            ),
            (
                r#"tollgate_tokens_consumed_total{limit="per_network",route="default"}"#,
                2.0,
            ),
        ],
    );
}

#[tokio::test]
async fn missing_body_key_with_reject_is_400_and_form_bodies_are_read() {
    let upstream = start_upstream().await;
    let policy = format!(
        "{LOGIN}\n[limits.form_account]\nkey = {{ form_field = \"username\" }}\ncapacity = 1\nrate = \"1/h\"\n"
    )
    .replace("limits = [\"per_network\", \"per_account\", \"login_global\"]", "limits = [\"per_network\", \"per_account\", \"login_global\"]\n\n[[routes]]\nname = \"form-login\"\npath = \"/form-login\"\nupstream = \"app\"\nlimits = [\"form_account\"]");
    let gateway = start_gateway_on(HTTP1, &policy, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let reply = client.post("/login", &[JSON], r#"{"password":"x"}"#).await;
    assert_eq!(reply.status, 400);
    assert!(reply.json()["detail"].as_str().unwrap().contains("email"));
    let form = ("content-type", "application/x-www-form-urlencoded");
    assert_eq!(
        client
            .post("/form-login", &[form], "username=dave&password=x")
            .await
            .status,
        200
    );
    assert_eq!(
        client
            .post("/form-login", &[form], "username=dave&password=y")
            .await
            .status,
        429
    );
    let ambiguous = client
        .post("/form-login", &[form], "username=erin&username=frank")
        .await;
    assert_eq!(ambiguous.status, 400);
    // The query string may say it too, and a Servlet reads the query's first: unclear.
    let also_in_query = client
        .post("/form-login?username=harry", &[form], "username=ivan")
        .await;
    assert_eq!(also_in_query.status, 400);
    assert!(also_in_query.json()["detail"]
        .as_str()
        .unwrap()
        .contains("query string"));
    // A JSON key twice, or in two cases (Go and ASP.NET bind ignoring case): never keyed.
    for body in [
        r#"{"email":"joe@example.com","email":"kim@example.com"}"#,
        r#"{"email":"joe@example.com","EMAIL":"kim@example.com"}"#,
    ] {
        assert_eq!(
            client.post("/login", &[JSON], body).await.status,
            400,
            "{body}"
        );
    }
    // The buffered body still reaches the upstream intact.
    let echoed = client
        .post("/form-login", &[form], "username=gina&password=z")
        .await;
    assert_eq!(echoed.json()["body"], "username=gina&password=z");
}

#[tokio::test]
async fn ietf_headers_and_problem_json() {
    let upstream = start_upstream().await;
    let policy =
        format!("[server]\nlisten = [\"127.0.0.1:0\"]\nratelimit_headers = \"ietf\"\n{LOGIN}");
    let gateway = start_gateway_on(HTTP1, &policy, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let from = ("x-forwarded-for", "198.51.100.9");
    let reply = client
        .post("/login", &[JSON, from], &login_body("hal@example.com"))
        .await;
    assert_eq!(reply.status, 200);
    assert_eq!(
        reply.header("ratelimit-policy"),
        Some("\"per_network\";q=5;w=18000, \"per_account\";q=3;w=10800, \"login_global\";q=1000;w=20")
    );
    let state = reply.header("ratelimit").unwrap();
    assert!(state.starts_with("\"per_network\";r=4;t="), "{state}");
    assert!(state.contains("\"per_account\";r=2;t="), "{state}");
    assert!(reply.header("ratelimit-limit").is_none());
    for _ in 0..2 {
        client
            .post("/login", &[JSON, from], &login_body("hal@example.com"))
            .await;
    }
    let refused = client
        .post("/login", &[JSON, from], &login_body("hal@example.com"))
        .await;
    assert_eq!(refused.status, 429);
    assert_eq!(
        refused.header("content-type"),
        Some("application/problem+json")
    );
    let body = refused.json();
    assert_eq!(
        body["violated-policies"],
        serde_json::json!(["per_account"])
    );
    assert_eq!(
        body["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
    assert_eq!(body["retry_after"], 3600);
    assert!(
        !refused.header("ratelimit").unwrap().contains("hal"),
        "no clear key in headers"
    );
}

#[tokio::test]
async fn h2c_prior_knowledge_gets_the_same_limits() {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, LOGIN, upstream.address).await;
    let client = HttpClient::h2c(gateway.addresses[0]);
    for _ in 0..5 {
        assert_eq!(client.get("/", &[]).await.status, 200);
    }
    let refused = client.get("/", &[]).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("retry-after"), Some("3600"));
}

#[tokio::test]
async fn ipv6_peers_are_grouped_by_prefix() {
    let upstream = start_upstream().await;
    let policy = format!(
        "[server]\nlisten = [\"[::1]:0\"]\n{}",
        LOGIN.replace("trusted_hops = 1", "trusted_hops = 0")
    );
    let gateway = start_gateway_on(HTTP1, &policy, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    for _ in 0..5 {
        assert_eq!(client.get("/", &[]).await.status, 200);
    }
    assert_eq!(client.get("/", &[]).await.status, 429);
}

#[tokio::test]
async fn variants_an_application_server_routes_to_login_share_its_bucket() {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, LOGIN, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    // Express and ASP.NET fold case, Tomcat and Spring drop ;parameters, IIS reads \ as /.
    let variants = ["/LOGIN", "/login;x", "/login/..;/login", "/Login%5C"];
    let mut statuses = Vec::new();
    for (index, path) in variants.iter().enumerate() {
        let address = format!("192.0.2.{index}");
        let reply = client
            .post(
                path,
                &[JSON, ("x-forwarded-for", &address)],
                &login_body("carol@example.com"),
            )
            .await;
        statuses.push(reply.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 429], "{variants:?}");
    // The upstream still receives the path as normalized, not folded.
    let echoed = client
        .post(
            "/LOGIN;x",
            &[JSON, ("x-forwarded-for", "192.0.2.50")],
            &login_body("dan@example.com"),
        )
        .await;
    assert_eq!(echoed.json()["uri"], "/LOGIN;x");
}

#[tokio::test]
async fn strict_path_matching_leaves_case_and_parameters_alone() {
    let upstream = start_upstream().await;
    let policy =
        format!("[server]\nlisten = [\"127.0.0.1:0\"]\npath_matching = \"strict\"\n{LOGIN}");
    let gateway = start_gateway_on(HTTP1, &policy, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    for index in 0..4 {
        let address = format!("192.0.2.{index}");
        let reply = client
            .post(
                "/LOGIN",
                &[JSON, ("x-forwarded-for", &address)],
                &login_body("erin@example.com"),
            )
            .await;
        assert_eq!(
            reply.status, 200,
            "/LOGIN is not /login here (request {index})"
        );
    }
}

#[tokio::test]
async fn forwarding_headers_from_many_peers_while_trusting_hops_are_warned_about() {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, LOGIN, upstream.address).await;
    let warned = |gateway: &tollgate::Tollgate| {
        metric(
            &gateway.render_metrics(),
            r#"tollgate_client_ip_warnings_total{cause="forwarded_by_many_peers"}"#,
        )
    };
    // Clients that reach the gateway directly, each from its own address (127.0.0.0/8 is all
    // loopback), each naming an address of its choosing.
    for peer in 2..=18u8 {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket
            .bind(std::net::SocketAddr::from(([127, 0, 0, peer], 0)))
            .unwrap();
        let mut stream = socket.connect(gateway.addresses[0]).await.unwrap();
        let request = format!(
            "GET /page HTTP/1.1\r\nHost: app\r\nX-Forwarded-For: 198.51.100.{peer}\r\nConnection: close\r\n\r\n"
        );
        tokio::io::AsyncWriteExt::write_all(&mut stream, request.as_bytes())
            .await
            .unwrap();
        let response = read_response(&mut stream, false).await;
        assert_eq!(response.status(), 200);
        let expected = if usize::from(peer) - 1 > 16 { 1.0 } else { 0.0 };
        assert_eq!(warned(&gateway), expected, "after {} peers", peer - 1);
    }
}

/// A login route whose account limit admits one request per account; what else the gateway
/// serves goes to a catch-all route without limits.
const ONE_LOGIN: &str = r#"
[server]
listen = ["127.0.0.1:0"]
{matching}

[upstreams.app]
url = "http://{upstream}"

[limits.per_account]
key = { json_field = "email" }
normalize = "lowercase"
capacity = 1
rate = "1/h"

[[routes]]
name = "login"
methods = ["POST"]
path = "/login"
upstream = "app"
limits = ["per_account"]

[[routes]]
name = "rest"
path_prefix = "/"
upstream = "app"
"#;

async fn login(client: &HttpClient, method: &str, path: &str, email: &str) -> u16 {
    let body = format!(r#"{{"email":"{email}"}}"#);
    let headers = [("content-type", "application/json")];
    client
        .send(method, path, &headers, bytes::Bytes::from(body))
        .await
        .status
        .as_u16()
}

#[tokio::test]
async fn variants_an_application_treats_as_the_login_meet_its_limit() {
    let upstream = start_upstream().await;
    let policy = ONE_LOGIN.replace("{matching}", "");
    let gateway = start_gateway_on(HTTP1, &policy, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    assert_eq!(login(&client, "POST", "/login", "alice").await, 200);
    // IIS routes `/login.` as `/login`; spaces around an account name are no part of it.
    assert_eq!(login(&client, "POST", "/login.", " Alice ").await, 429);
    // A lower-case method is another method (RFC 9110), but must not escape the route.
    assert_eq!(login(&client, "post", "/login", "bob").await, 200);
    assert_eq!(login(&client, "POST", "/login", "bob").await, 429);
    // Without `path_matching = "without_format"`, `/login.json` is another path.
    assert_eq!(login(&client, "POST", "/login.json", "alice").await, 200);
}

#[tokio::test]
async fn without_format_a_format_suffix_meets_the_same_route() {
    let upstream = start_upstream().await;
    let matching = "path_matching = \"without_format\"";
    let policy = ONE_LOGIN.replace("{matching}", matching);
    let gateway = start_gateway_on(HTTP1, &policy, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    assert_eq!(login(&client, "POST", "/login.json", "carol").await, 200);
    assert_eq!(login(&client, "POST", "/login", "carol").await, 429);
    assert_eq!(login(&client, "POST", "/Login.XML", "carol").await, 429);
    // A prefix route still sees the whole path; the upstream gets it unchanged.
    let reply = client.get("/assets/app.js", &[]).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.json()["uri"], "/assets/app.js");
}
