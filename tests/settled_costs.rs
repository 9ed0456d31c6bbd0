//! Costs settled after the response, over real sockets: reserved from the request, settled
//! from a JSON body, an event stream's last usage event, a header, an HTTP/1.1 or HTTP/2
//! trailer, the upstream's time or the bytes sent; the debt a response above its reservation
//! leaves and the exact wait it costs the key; what a value that never comes, or a client
//! that leaves, settles to; and a stream that is never held for its settlement.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::llm::{start_llm_upstream, BODIES};
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate::limit::Clock;

const POLICY: &str = r#"
[upstreams.llm]
url = "http://{upstream}"

[limits.org_tokens]
key = { header = "x-org" }
capacity = 1000
rate = "1000/min"

[limits.export_time]
key = { header = "x-org" }
capacity = 100
rate = "100/min"

[limits.download_bytes]
key = { header = "x-org" }
capacity = 100
rate = "100/min"

[[routes]]
name = "chat"
path = "/v1/chat/completions"
methods = ["POST"]
upstream = "llm"
limits = [{ limit = "org_tokens", cost = { json = "max_tokens", default = 256, max = 800 }, settle = { json = "usage.total_tokens" } }]

[[routes]]
name = "bodies"
path_prefix = "/body"
upstream = "llm"
limits = [{ limit = "org_tokens", cost = 300, settle = { json = "usage.total_tokens" } }]

[[routes]]
name = "gzip"
path_prefix = "/gzip"
upstream = "llm"
limits = [{ limit = "org_tokens", cost = 300, settle = { json = "usage.total_tokens" } }]

[[routes]]
name = "events"
path_prefix = "/events"
upstream = "llm"
limits = [{ limit = "org_tokens", cost = 300, settle = { json = "usage.total_tokens" } }]

[[routes]]
name = "held"
path_prefix = "/held"
upstream = "llm"
limits = [{ limit = "org_tokens", cost = 300, settle = { json = "usage.total_tokens" } }]

[[routes]]
name = "endless"
path_prefix = "/endless"
upstream = "llm"
limits = [
  { limit = "org_tokens", cost = 300, settle = { json = "usage.total_tokens" } },
  { limit = "download_bytes", cost = 1, settle = "response_bytes", scale = 0.001 },
]

[[routes]]
name = "header"
path_prefix = "/header"
upstream = "llm"
limits = [{ limit = "org_tokens", cost = { header = "x-reserve", default = 50 }, settle = { header = "x-tokens" } }]

[[routes]]
name = "export"
path_prefix = "/sleep"
upstream = "llm"
limits = [{ limit = "export_time", cost = 0, settle = "upstream_ms", scale = 0.01 }]

[[routes]]
name = "download"
path_prefix = "/bytes"
upstream = "llm"
limits = [{ limit = "download_bytes", cost = 1, settle = "response_bytes", scale = 0.0009765625 }]
"#;

const JSON: (&str, &str) = ("content-type", "application/json");

fn org(name: &str) -> (&str, &str) {
    ("x-org", name)
}

/// `tollgate_settled_cost_total` of the route's `org_tokens` in one direction.
fn settled(gateway: &tollgate::Tollgate, route: &str, limit: &str, direction: &str) -> f64 {
    let scrape = gateway.render_metrics();
    metric(
        &scrape,
        &format!(
            r#"tollgate_settled_cost_total{{direction="{direction}",limit="{limit}",route="{route}"}}"#
        ),
    )
}

fn missing(gateway: &tollgate::Tollgate, route: &str) -> f64 {
    metric(
        &gateway.render_metrics(),
        &format!(r#"tollgate_settle_missing_total{{limit="org_tokens",route="{route}"}}"#),
    )
}

fn remaining(reply: &Reply) -> f64 {
    reply
        .header("ratelimit-remaining")
        .unwrap_or_else(|| panic!("no ratelimit-remaining: {:?}", reply.headers))
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completion_reserves_what_it_asks_and_settles_its_usage_on_both_paths() {
    for http1 in ["fast", "hyper"] {
        let upstream = start_llm_upstream().await;
        let gateway =
            start_gateway_with_clock_on(http1, POLICY, upstream.address, Some(Clock::manual()))
                .await;
        let client = HttpClient::new(gateway.addresses[0]);
        let ask = |max_tokens: u64, tokens: &str, stream: bool| {
            let body = format!(
                r#"{{"model":"m","max_tokens":{max_tokens},"stream":{stream},"stream_options":{{"include_usage":true}},"messages":[]}}"#
            );
            let client = client.clone();
            let tokens = tokens.to_owned();
            async move {
                client
                    .post(
                        "/v1/chat/completions",
                        &[JSON, org("acme"), ("x-test-tokens", &tokens)],
                        &body,
                    )
                    .await
            }
        };
        // Reserves 500 (its max_tokens) of 1000, settles to 120: 880 left.
        let first = ask(500, "120", false).await;
        assert_eq!(first.status, 200, "{http1}");
        assert_eq!(remaining(&first), 500.0, "{http1}: the reservation");
        assert_eq!(first.json()["usage"]["total_tokens"], 120);
        // A stream reserves at most `max` (800) and settles by its last usage event.
        let streamed = ask(5000, "30", true).await;
        assert_eq!(streamed.status, 200);
        assert_eq!(remaining(&streamed), 80.0, "{http1}: 880 less the max 800");
        let text = String::from_utf8_lossy(&streamed.body).into_owned();
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        // Now 880 - 30 = 850: the next reservation of 800 still passes.
        let third = ask(800, "800", false).await;
        assert_eq!(remaining(&third), 50.0, "{http1}");
        assert_eq!(
            settled(&gateway, "chat", "org_tokens", "refund"),
            380.0 + 770.0
        );
        assert_eq!(settled(&gateway, "chat", "org_tokens", "charge"), 0.0);
        // Another organisation is untouched.
        let other = client
            .post(
                "/v1/chat/completions",
                &[JSON, org("other"), ("x-test-tokens", "10")],
                r#"{"max_tokens":10}"#,
            )
            .await;
        assert_eq!(remaining(&other), 990.0);
        gateway.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_above_its_reservation_leaves_a_debt_with_an_exact_wait() {
    let upstream = start_llm_upstream().await;
    let clock = Clock::manual();
    let gateway = start_gateway_with_clock(POLICY, upstream.address, Some(clock.clone())).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let chat = |tokens: &'static str, max: u64| {
        let client = client.clone();
        async move {
            let body = format!(r#"{{"max_tokens":{max},"messages":[]}}"#);
            client
                .post(
                    "/v1/chat/completions",
                    &[JSON, org("debtor"), ("x-test-tokens", tokens)],
                    &body,
                )
                .await
        }
    };
    // Reserves 10, uses 1600: the bucket goes to 1000 - 1600 = -600.
    assert_eq!(chat("1600", 10).await.status, 200);
    assert_eq!(settled(&gateway, "chat", "org_tokens", "charge"), 1590.0);
    let refused = chat("1", 10).await;
    assert_eq!(refused.status, 429);
    // 610 tokens at 1000/min: 36.6 s.
    assert_eq!(refused.header("retry-after"), Some("37"));
    clock.advance(Duration::from_millis(36_500));
    assert_eq!(chat("1", 10).await.status, 429);
    clock.advance(Duration::from_millis(100));
    assert_eq!(chat("1", 10).await.status, 200);
    // A debt is at most one capacity: 5000 used when 1000 were there leaves -1000.
    clock.advance(Duration::from_secs(600));
    assert_eq!(chat("5000", 10).await.status, 200);
    let refused = chat("1", 10).await;
    assert_eq!(refused.header("retry-after"), Some("61"), "1010 tokens");
    gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_that_cannot_be_read_keeps_the_reservation_and_is_counted() {
    let upstream = start_llm_upstream().await;
    let clock = Clock::manual();
    let gateway = start_gateway_with_clock(POLICY, upstream.address, Some(clock.clone())).await;
    let client = HttpClient::new(gateway.addresses[0]);
    for (index, (case, _)) in BODIES.iter().enumerate() {
        let name = format!("org-{index}");
        let reply = client.get(&format!("/body/{case}"), &[org(&name)]).await;
        assert_eq!(reply.status, 200, "{case}");
        let next = client.get("/body/absent", &[org(&name)]).await;
        assert_eq!(remaining(&next), 400.0, "{case}: both reservations stand");
    }
    assert_eq!(missing(&gateway, "bodies"), 2.0 * BODIES.len() as f64);
    assert_eq!(settled(&gateway, "bodies", "org_tokens", "refund"), 0.0);

    // A compressed body is read inflated; the client gets it as it came.
    let reply = client
        .get("/gzip", &[org("gz"), ("x-test-tokens", "25")])
        .await;
    assert_eq!(reply.header("content-encoding"), Some("gzip"));
    let next = client
        .get("/gzip", &[org("gz"), ("x-test-tokens", "25")])
        .await;
    assert_eq!(remaining(&next), 1000.0 - 25.0 - 300.0);

    // 3,000 events without usage and one with it: the stream settles to the last.
    let reply = client.get("/events/3000", &[org("events")]).await;
    assert!(reply.body.len() > 100_000);
    let next = client.get("/events/0", &[org("events")]).await;
    assert_eq!(
        next.status, 429,
        "3000 tokens of 1000: a debt of the whole capacity"
    );
    assert_eq!(
        next.header("retry-after"),
        Some("78"),
        "1300 tokens at 1000/min"
    );
    let reply = client.get("/events/2", &[org("events-2")]).await;
    assert!(String::from_utf8_lossy(&reply.body).ends_with("data: [DONE]\n\n"));
    let next = client.get("/events/0", &[org("events-2")]).await;
    assert_eq!(remaining(&next), 998.0 - 300.0);
    gateway.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_trailers_time_and_bytes_settle() {
    let upstream = start_llm_upstream().await;
    let clock = Clock::manual();
    let gateway = start_gateway_with_clock(POLICY, upstream.address, Some(clock.clone())).await;
    let client = HttpClient::new(gateway.addresses[0]);

    // A header: reserves what the request says (x-reserve), settles to x-tokens.
    let reply = client
        .get(
            "/header",
            &[org("h"), ("x-reserve", "70"), ("x-test-tokens", "20")],
        )
        .await;
    assert_eq!(remaining(&reply), 930.0);
    let reply = client
        .get("/header", &[org("h"), ("x-test-tokens", "0")])
        .await;
    assert_eq!(remaining(&reply), 980.0 - 50.0, "the default reservation");
    assert_eq!(
        settled(&gateway, "header", "org_tokens", "refund"),
        50.0 + 50.0
    );

    // Time: one token per 100 ms, nothing reserved.
    let reply = client.get("/sleep/300", &[org("t")]).await;
    assert_eq!(reply.status, 200);
    let charged = settled(&gateway, "export", "export_time", "charge");
    assert!((3.0..30.0).contains(&charged), "{charged}");

    // Bytes: 5 KiB at one token per KiB, 1 reserved.
    let reply = client.get("/bytes/5120", &[org("b")]).await;
    assert_eq!(reply.body.len(), 5120);
    assert_eq!(
        settled(&gateway, "download", "download_bytes", "charge"),
        4.0
    );
    let reply = client.get("/bytes/0", &[org("b")]).await;
    assert_eq!(remaining(&reply), 94.0);
    gateway.shutdown().await;
}

/// An upstream that answers every request with a chunked body and an `x-tokens` trailer (a
/// hyper server sends trailers only to a client that asked for them).
async fn start_trailer_upstream(tokens: &'static str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let mut buffer = Vec::new();
                let mut chunk = [0u8; 4096];
                loop {
                    while let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
                        buffer.drain(..end + 4);
                        let response = format!(
                            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-tokens\r\n\r\n2\r\n{{}}\r\n0\r\nx-tokens: {tokens}\r\n\r\n"
                        );
                        if stream.write_all(response.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                    match stream.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(read) => buffer.extend_from_slice(&chunk[..read]),
                    }
                }
            });
        }
    });
    address
}

const TRAILER_POLICY: &str = r#"
[upstreams.app]
url = "{scheme}://{upstream}"

[limits.org_tokens]
key = "global"
capacity = 1000
rate = "1000/min"

[[routes]]
name = "trailer"
path_prefix = "/"
upstream = "app"
limits = [{ limit = "org_tokens", cost = 100, settle = { header = "x-tokens" } }]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trailers_settle_over_http1_and_http2() {
    let http1 = start_trailer_upstream("30").await;
    let http2 = start_llm_upstream().await;
    for (scheme, address, path) in [("http", http1, "/any"), ("h2c", http2.address, "/trailer")] {
        for http1_path in ["fast", "hyper"] {
            let policy = TRAILER_POLICY.replace("{scheme}", scheme);
            let gateway =
                start_gateway_with_clock_on(http1_path, &policy, address, Some(Clock::manual()))
                    .await;
            let client = HttpClient::new(gateway.addresses[0]);
            let reply = client.get(path, &[("x-test-tokens", "30")]).await;
            assert_eq!(reply.status, 200, "{scheme} {http1_path}");
            assert_eq!(reply.body, "{}");
            let reply = client.get(path, &[("x-test-tokens", "30")]).await;
            assert_eq!(remaining(&reply), 870.0, "{scheme} {http1_path}");
            gateway.shutdown().await;
        }
    }
}

/// Reads a response head and the body bytes after it until `until` appears.
async fn read_until(stream: &mut TcpStream, until: &str) -> String {
    let mut text = Vec::new();
    let mut chunk = [0u8; 4096];
    while !String::from_utf8_lossy(&text).contains(until) {
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut chunk))
            .await
            .expect("the stream went on")
            .unwrap();
        assert!(read > 0, "closed before {until:?}");
        text.extend_from_slice(&chunk[..read]);
    }
    String::from_utf8_lossy(&text).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_is_never_held_and_a_client_that_leaves_settles_what_was_measured() {
    let upstream = start_llm_upstream().await;
    let clock = Clock::manual();
    let gateway = start_gateway_with_clock(POLICY, upstream.address, Some(clock.clone())).await;
    let address = gateway.addresses[0];

    // The first event reaches the client while the upstream still holds the last.
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream
        .write_all(b"GET /held HTTP/1.1\r\nHost: a\r\nx-org: s\r\nx-test-tokens: 40\r\n\r\n")
        .await
        .unwrap();
    let first = read_until(&mut stream, "\"usage\":null").await;
    assert!(first.starts_with("HTTP/1.1 200"), "{first}");
    assert_eq!(settled(&gateway, "held", "org_tokens", "refund"), 0.0);
    upstream.release.notify_one();
    read_until(&mut stream, "0\r\n\r\n").await;
    assert_eq!(settled(&gateway, "held", "org_tokens", "refund"), 260.0);

    // A client that leaves an endless stream: the JSON field never came, so its reservation
    // stands (not counted missing); the bytes sent so far are charged.
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream
        .write_all(b"GET /endless HTTP/1.1\r\nHost: a\r\nx-org: e\r\n\r\n")
        .await
        .unwrap();
    read_until(&mut stream, "\"index\":3}").await;
    drop(stream);
    // 1 token reserved, a few dozen bytes at one token per 1000 sent: mostly given back.
    eventually("the download settled", || {
        settled(&gateway, "endless", "download_bytes", "refund") > 0.9
    })
    .await;
    assert_eq!(missing(&gateway, "endless"), 0.0);
    assert_eq!(settled(&gateway, "endless", "org_tokens", "refund"), 0.0);
    eventually("the request ended", || {
        metric(&gateway.render_metrics(), "tollgate_inflight_requests") == 0.0
    })
    .await;
    gateway.shutdown().await;
}
