//! The proxy over real sockets: forwarding, protocol guards, upstream failures, upgrades,
//! streaming, admin listener, reload and shutdown.
#![allow(clippy::disallowed_methods)] // tests measure real time

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::HTTP1;
use crate::common::*;
use bytes::Bytes;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const BASIC: &str = r#"
[server]
listen = ["127.0.0.1:0"]
max_header_bytes = 8192
max_buffered_body = "1KiB"

[upstreams.app]
url = "http://{upstream}"
timeout = "300ms"

[upstreams.dead]
url = "http://127.0.0.1:1"

[limits.per_network]
key = "client_network"
capacity = 1000
rate = "1/h"

[limits.per_account]
key = { json_field = "email" }
capacity = 1000
rate = "1/h"

[[routes]]
name = "dead"
path_prefix = "/dead"
upstream = "dead"
limits = ["per_network"]

[[routes]]
name = "login"
path = "/login"
upstream = "app"
limits = ["per_account"]

[[routes]]
name = "default"
path_prefix = "/"
upstream = "app"
limits = ["per_network"]
"#;

#[tokio::test]
async fn forwards_with_forwarding_headers_and_without_hop_by_hop_headers() {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, BASIC, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let reply = client
        .get(
            "/hello?x=1",
            &[
                ("x-forwarded-for", "192.0.2.1"),
                ("connection", "x-private"),
                ("x-private", "must not pass"),
                ("keep-alive", "timeout=5"),
                ("host", "shop.example.com"),
                // The gateway's own fields replace what a client claims.
                ("x-forwarded-proto", "https"),
                ("x-forwarded-host", "spoofed.example"),
            ],
        )
        .await;
    assert_eq!(reply.status, 200);
    let seen = reply.json();
    assert_eq!(seen["uri"], "/hello?x=1");
    let headers = &seen["headers"];
    assert_eq!(headers["x-forwarded-for"], "192.0.2.1, 127.0.0.1");
    assert_eq!(headers["x-forwarded-proto"], "http");
    assert_eq!(headers["x-forwarded-host"], "shop.example.com");
    assert_eq!(headers["host"], "shop.example.com");
    assert!(headers.get("x-private").is_none());
    assert!(headers.get("keep-alive").is_none());
    assert!(headers["x-request-id"]
        .as_str()
        .is_some_and(|id| id.len() == 36 && id.as_bytes()[14] == b'7'));
    // Response hop-by-hop headers named by the upstream's Connection header are removed too.
    assert!(reply.header("x-upstream-hop").is_none());
    assert_eq!(
        reply.header("x-request-id"),
        headers["x-request-id"].as_str()
    );
}

#[tokio::test]
async fn request_ids_from_the_client_are_passed_through() {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, BASIC, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let reply = client.get("/", &[("x-request-id", "abc-123")]).await;
    assert_eq!(reply.json()["headers"]["x-request-id"], "abc-123");
    assert_eq!(reply.header("x-request-id"), Some("abc-123"));
}

#[tokio::test]
async fn unreachable_upstream_is_502_and_slow_upstream_is_504() {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, BASIC, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let refused = client.get("/dead", &[]).await;
    assert_eq!(refused.status, 502);
    assert_eq!(refused.json()["error"], "bad_gateway");
    let slow = client.get("/slow", &[]).await;
    assert_eq!(slow.status, 504);
    assert_eq!(slow.json()["error"], "gateway_timeout");
    let scrape = gateway.render_metrics();
    assert_metrics(
        &scrape,
        &[
            (
                r#"tollgate_upstream_responses_total{route="dead",status="error"}"#,
                1.0,
            ),
            (
                r#"tollgate_upstream_responses_total{route="default",status="error"}"#,
                1.0,
            ),
        ],
    );
}

#[tokio::test]
async fn the_upstream_deadline_is_set_afresh_on_reused_connections() {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, BASIC, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    assert_eq!(client.get("/", &[]).await.status, 200);
    // The first request's deadline (300 ms) passes while its connection is idle in the pool.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        client.get("/", &[]).await.status,
        200,
        "a request on the reused connection saw the old deadline"
    );
    upstream.delay_ms.store(3000, Ordering::SeqCst);
    let slow = client.get("/delayed", &[]).await;
    assert_eq!(slow.status, 504);
    upstream.delay_ms.store(0, Ordering::SeqCst);
    assert_eq!(client.get("/delayed", &[]).await.status, 200);
}

#[tokio::test]
async fn round_robin_skips_an_address_that_refuses_connections() {
    let first = start_upstream().await;
    let second = start_upstream().await;
    let policy = BASIC.replace(
        "url = \"http://{upstream}\"",
        &format!(
            "urls = [\"http://{}\", \"http://127.0.0.1:1\", \"http://{}\"]",
            first.address, second.address
        ),
    );
    let gateway = start_gateway_on(HTTP1, &policy, first.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    for _ in 0..12 {
        assert_eq!(client.get("/", &[]).await.status, 200);
    }
    let (a, b) = (
        first.hits.load(Ordering::SeqCst),
        second.hits.load(Ordering::SeqCst),
    );
    assert_eq!(a + b, 12);
    assert!(
        a >= 3 && b >= 3,
        "both live addresses share the load: {a} / {b}"
    );
}

#[tokio::test]
async fn no_route_is_404() {
    let upstream = start_upstream().await;
    let policy = BASIC.replace(
        "name = \"default\"\npath_prefix = \"/\"",
        "name = \"default\"\npath_prefix = \"/app\"",
    );
    let gateway = start_gateway_on(HTTP1, &policy, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let reply = client.get("/elsewhere", &[]).await;
    assert_eq!(reply.status, 404);
    assert_eq!(reply.json()["error"], "not_found");
    let scrape = gateway.render_metrics();
    assert_metrics(
        &scrape,
        &[(
            r#"tollgate_requests_total{outcome="no_route",route="none"}"#,
            1.0,
        )],
    );
    // Series of what cannot occur are not exported: no route reads a token here.
    assert!(!scrape.contains("tollgate_jwt_rejected_total"), "{scrape}");
    assert!(!scrape.contains(r#"outcome="no_route",route="default""#));
}

#[tokio::test]
async fn protocol_guards_answer_400_405_413_431() {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, BASIC, upstream.address).await;
    let address = gateway.addresses[0];
    let cases: [(&str, &[u8], u16); 6] = [
        ("no Host", b"GET / HTTP/1.1\r\nConnection: close\r\n\r\n", 400),
        ("two Hosts", b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\nConnection: close\r\n\r\n", 400),
        ("invalid Host", b"GET / HTTP/1.1\r\nHost: a b/c\r\nConnection: close\r\n\r\n", 400),
        (
            "conflicting Content-Length",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nContent-Length: 5\r\nConnection: close\r\n\r\nabcde",
            400,
        ),
        ("CONNECT", b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\nConnection: close\r\n\r\n", 405),
        ("HTTP/1.0 without Host", b"GET / HTTP/1.0\r\n\r\n", 200),
    ];
    for (case, request, expected) in cases {
        let response = raw(address, request).await;
        assert_eq!(raw_status(&response), expected, "{case}: {response}");
        assert!(!response.contains("panicked"), "{case}");
    }
    let huge = format!(
        "GET / HTTP/1.1\r\nHost: a\r\nX-Big: {}\r\nConnection: close\r\n\r\n",
        "a".repeat(9000)
    );
    assert_eq!(raw_status(&raw(address, huge.as_bytes()).await), 431);
    let body = format!(r#"{{"email":"{}"}}"#, "a".repeat(2000));
    let client = HttpClient::new(address);
    let too_large = client
        .post("/login", &[("content-type", "application/json")], &body)
        .await;
    assert_eq!(too_large.status, 413);
    assert_eq!(
        upstream.hits.load(Ordering::SeqCst),
        1,
        "only the HTTP/1.0 request was forwarded"
    );
}

#[tokio::test]
async fn content_length_with_transfer_encoding_is_forwarded_chunked_only() {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, BASIC, upstream.address).await;
    let smuggling = b"POST /x HTTP/1.1\r\nHost: a\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n6\r\nabcdef\r\n0\r\n\r\n";
    let response = raw(gateway.addresses[0], smuggling).await;
    assert_eq!(raw_status(&response), 200, "{response}");
    let body = &response[response.find("\r\n\r\n").unwrap() + 4..];
    let seen: serde_json::Value = serde_json::from_str(body).unwrap();
    assert_eq!(seen["body"], "abcdef", "the chunked framing was used");
    assert!(
        seen["headers"].get("content-length").is_none(),
        "never both framing headers: {seen}"
    );
}

#[tokio::test]
async fn a_chunked_body_larger_than_the_buffer_cap_is_413() {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, BASIC, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let chunks = vec![Bytes::from(vec![b'{'; 600]), Bytes::from(vec![b' '; 600])];
    assert_eq!(client.post_stream("/login", chunks).await.status, 413);
}

#[tokio::test]
async fn multi_megabyte_bodies_stream_through_intact() {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, BASIC, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let chunks: Vec<Bytes> = (0..64u32)
        .map(|index| {
            Bytes::from(
                (0..65_536u32)
                    .map(|byte| (byte.wrapping_mul(31) ^ index) as u8)
                    .collect::<Vec<u8>>(),
            )
        })
        .collect();
    let expected: Vec<u8> = chunks
        .iter()
        .flat_map(|chunk| chunk.iter().copied())
        .collect();
    let reply = client.post_stream("/echo-body", chunks).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body.len(), 4 * 1024 * 1024);
    assert!(reply.body == expected, "4 MiB came back byte for byte");
}

#[tokio::test]
async fn an_upgrade_on_hyper_s_client_also_skips_an_address_that_refuses_connections() {
    let upstream = start_upstream().await;
    let policy = BASIC.replace(
        "url = \"http://{upstream}\"",
        &format!(
            "urls = [\"http://127.0.0.1:1\", \"http://{}\"]",
            upstream.address
        ),
    );
    let gateway = start_gateway_on(HTTP1, &policy, upstream.address).await;
    // Whichever address round-robin starts with, every handshake reaches the live one.
    for _ in 0..4 {
        let (head, _stream) = raw_head(
            gateway.addresses[0],
            b"GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
        )
        .await;
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    }
}

/// Sends raw `request` bytes and returns the test upstream's JSON view of what it received
/// (the answer must be a 200).
async fn upstream_view(gateway: std::net::SocketAddr, request: &[u8]) -> serde_json::Value {
    let mut stream = TcpStream::connect(gateway).await.unwrap();
    stream.write_all(request).await.unwrap();
    let response = read_response(&mut stream, false).await;
    assert_eq!(response.status(), 200, "{}", response.head);
    serde_json::from_slice(&response.body).expect("the upstream's JSON view")
}

#[tokio::test]
async fn an_h2c_upgrade_is_served_as_http1_without_its_upgrade_fields() {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, BASIC, upstream.address).await;
    let request = b"GET /h2c HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\r\n";
    let seen = upstream_view(gateway.addresses[0], request).await;
    let headers = seen["headers"]
        .as_object()
        .expect("the upstream's view of the headers");
    for name in ["upgrade", "http2-settings", "connection"] {
        assert!(
            !headers.contains_key(name),
            "{name} reached the upstream: {headers:?}"
        );
    }
}

#[tokio::test]
async fn a_101_without_the_proof_of_the_websocket_key_is_a_502() {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, BASIC, upstream.address).await;
    let (head, _stream) = raw_head(
        gateway.addresses[0],
        b"GET /ws-wrong-proof HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n",
    )
    .await;
    assert_eq!(raw_status(&head), 502, "{head}");
}

#[tokio::test]
async fn websocket_upgrade_passes_through_after_the_limits() {
    let upstream = start_upstream().await;
    let policy = BASIC.replace(
        "capacity = 1000\nrate = \"1/h\"\n\n[limits.per_account]",
        "capacity = 1\nrate = \"1/h\"\n\n[limits.per_account]",
    );
    let gateway = start_gateway_on(HTTP1, &policy, upstream.address).await;
    let address = gateway.addresses[0];
    let handshake = b"GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n";
    let (head, mut stream) = raw_head(address, handshake).await;
    let head = head.to_lowercase();
    assert!(head.starts_with("http/1.1 101"), "{head}");
    assert!(head.contains("upgrade: websocket"), "{head}");
    stream.write_all(b"ping through the tunnel").await.unwrap();
    let mut echoed = [0u8; 23];
    tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut echoed))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&echoed, b"ping through the tunnel");
    // The upgrade consumed the network's only token: the next handshake is refused.
    let (refused, _) = raw_head(
        address,
        b"GET /ws HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
    )
    .await;
    assert_eq!(raw_status(&refused), 429);
    // The tunnel counts in flight until it closes (the refusal's answer is sent).
    until_metric(&gateway, "tollgate_inflight_requests", |value| value == 1.0).await;
    drop(stream);
    until_metric(&gateway, "tollgate_inflight_requests", |value| value == 0.0).await;
}

#[tokio::test]
async fn admin_endpoints_live_only_on_the_admin_listener() {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, BASIC, upstream.address).await;
    let admin = HttpClient::new(gateway.admin_address);
    assert_eq!(admin.get("/healthz", &[]).await.status, 200);
    assert_eq!(admin.get("/readyz", &[]).await.status, 200);
    let public = HttpClient::new(gateway.addresses[0]);
    public.get("/x", &[]).await;
    let scrape = admin.get("/metrics", &[]).await;
    assert_eq!(scrape.status, 200);
    let text = String::from_utf8_lossy(&scrape.body);
    assert_metrics(
        &text,
        &[(
            r#"tollgate_requests_total{outcome="allowed",route="default"}"#,
            1.0,
        )],
    );
    // On the public listener, /metrics is just another path, proxied to the app.
    let proxied = public.get("/metrics", &[]).await;
    assert_eq!(proxied.json()["uri"], "/metrics");
}

/// The status of a login for account "a".
async fn login_status(client: &HttpClient) -> http::StatusCode {
    client
        .post(
            "/login",
            &[("content-type", "application/json")],
            r#"{"email":"a"}"#,
        )
        .await
        .status
}

#[tokio::test]
async fn reload_keeps_the_state_of_unchanged_limits_and_resets_changed_ones() {
    let upstream = start_upstream().await;
    let policy = BASIC.replace("capacity = 1000", "capacity = 2");
    let gateway = start_gateway_on(HTTP1, &policy, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    for _ in 0..2 {
        assert_eq!(client.get("/", &[]).await.status, 200);
        assert_eq!(login_status(&client).await, 200);
    }
    assert_eq!(client.get("/", &[]).await.status, 429);
    assert_eq!(login_status(&client).await, 429);
    // Raise per_account only: per_network keeps its (empty) bucket, per_account starts fresh.
    let raised = policy.replace(
        "key = { json_field = \"email\" }\ncapacity = 2",
        "key = { json_field = \"email\" }\ncapacity = 5",
    );
    assert_ne!(raised, policy);
    gateway
        .reload(compile_on(HTTP1, &raised, upstream.address))
        .unwrap();
    assert_eq!(
        client.get("/", &[]).await.status,
        429,
        "unchanged limit kept its state"
    );
    for _ in 0..5 {
        assert_eq!(login_status(&client).await, 200);
    }
    assert_eq!(login_status(&client).await, 429);
}

#[tokio::test]
async fn shutdown_lets_an_in_flight_request_finish() {
    let upstream = start_upstream().await;
    let policy = BASIC.replace("timeout = \"300ms\"", "timeout = \"30s\"");
    let gateway = std::sync::Arc::new(start_gateway_on(HTTP1, &policy, upstream.address).await);
    let address = gateway.addresses[0];
    let slow = tokio::spawn(async move { HttpClient::new(address).get("/slow", &[]).await.status });
    // Wait until the slow request has reached the upstream.
    while upstream.hits.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let drained = gateway.shutdown().await;
    assert!(
        drained,
        "the in-flight request finished within the grace period"
    );
    assert_eq!(slow.await.unwrap(), 200);
    assert!(
        TcpStream::connect(address).await.is_err(),
        "no new connections after shutdown"
    );
    let admin = HttpClient::new(gateway.admin_address);
    assert_eq!(admin.get("/readyz", &[]).await.status, 503);
}

#[tokio::test]
async fn a_request_head_that_trickles_in_is_cut_off() {
    let upstream = start_upstream().await;
    let policy = BASIC.replace(
        "max_header_bytes = 8192",
        "max_header_bytes = 8192\nheader_read_timeout = \"500ms\"",
    );
    let gateway = start_gateway_on(HTTP1, &policy, upstream.address).await;
    let mut stream = TcpStream::connect(gateway.addresses[0]).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: a\r\nX-Slow: ")
        .await
        .unwrap();
    // The head never completes: the gateway closes the connection after the timeout.
    assert!(
        rest_until_closed(&mut stream).await.is_some(),
        "connection still open after 10 s"
    );
    assert_eq!(upstream.hits.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn idle_keep_alive_connections_are_closed() {
    let upstream = start_upstream().await;
    let policy = BASIC.replace(
        "max_header_bytes = 8192",
        "max_header_bytes = 8192\nidle_timeout = \"300ms\"",
    );
    let gateway = start_gateway_on(HTTP1, &policy, upstream.address).await;
    let (head, mut stream) =
        raw_head(gateway.addresses[0], b"GET / HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(raw_status(&head), 200);
    let length: usize = head
        .lines()
        .find_map(|line| {
            line.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap())
        })
        .expect("content-length");
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.unwrap();
    // Nothing more is sent: the idle connection is closed by the gateway.
    let rest = rest_until_closed(&mut stream)
        .await
        .expect("idle connection still open after 10 s");
    assert!(rest.is_empty());
}

#[tokio::test]
async fn a_client_that_goes_away_mid_request_is_not_counted_in_flight_forever() {
    let upstream = start_upstream().await;
    let policy = BASIC.replace("timeout = \"300ms\"", "timeout = \"30s\"");
    let gateway = start_gateway_on(HTTP1, &policy, upstream.address).await;
    let mut stream = TcpStream::connect(gateway.addresses[0]).await.unwrap();
    stream
        .write_all(b"GET /slow HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    while upstream.hits.load(Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        metric(&gateway.render_metrics(), "tollgate_inflight_requests"),
        1.0
    );
    drop(stream);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while metric(&gateway.render_metrics(), "tollgate_inflight_requests") != 0.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the abandoned request is still counted"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Sends `GET /held-body` on `count` new connections and reads each response's head.
async fn held_bodies(gateway: &tollgate::Tollgate, count: usize) -> Vec<TcpStream> {
    let mut streams = Vec::new();
    for _ in 0..count {
        let (head, stream) = raw_head(
            gateway.addresses[0],
            b"GET /held-body HTTP/1.1\r\nHost: a\r\n\r\n",
        )
        .await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        streams.push(stream);
    }
    streams
}

/// Waits up to 10 s for `series` to read `expected`.
async fn until_metric(gateway: &tollgate::Tollgate, series: &str, done: impl Fn(f64) -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let value = metric(&gateway.render_metrics(), series);
        if done(value) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{series} stays {value}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_request_counts_in_flight_until_its_body_is_sent_or_its_client_leaves() {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, BASIC, upstream.address).await;
    let streams = held_bodies(&gateway, 2).await;
    // Both heads are out; both bodies are still coming.
    assert_eq!(
        metric(&gateway.render_metrics(), "tollgate_inflight_requests"),
        2.0
    );
    drop(streams);
    until_metric(&gateway, "tollgate_inflight_requests", |value| value == 0.0).await;
}

#[tokio::test]
async fn upstream_requests_whose_bodies_are_still_coming_count_as_load() {
    let upstream = start_upstream().await;
    let policy = format!("{BASIC}\n[overload]\nmax_inflight = 1\nfactor = 0.5\n");
    let gateway = start_gateway_on(HTTP1, &policy, upstream.address).await;
    let _streams = held_bodies(&gateway, 3).await;
    until_metric(&gateway, "tollgate_load_factor", |factor| factor < 1.0).await;
}

#[tokio::test]
async fn targets_an_upstream_could_read_otherwise_are_400_and_never_forwarded() {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, BASIC, upstream.address).await;
    let requests: [&[u8]; 4] = [
        b"GET /caf\xc3\xa9 HTTP/1.1\r\nHost: a\r\n\r\n",
        b"GET /\xff HTTP/1.1\r\nHost: a\r\n\r\n",
        b"GET http://user:pw@shop.example.com/ HTTP/1.1\r\nHost: shop.example.com\r\n\r\n",
        b"GET http://shop.example.com:99999/ HTTP/1.1\r\nHost: shop.example.com\r\n\r\n",
    ];
    for request in requests {
        let (response, _stream) = raw_head(gateway.addresses[0], request).await;
        assert_eq!(
            raw_status(&response),
            400,
            "{}: {response}",
            String::from_utf8_lossy(request)
        );
    }
    assert_eq!(
        upstream.hits.load(Ordering::SeqCst),
        0,
        "nothing was forwarded"
    );
}

async fn forwarded_fields_with_underscores(
    policy: &str,
) -> serde_json::Map<String, serde_json::Value> {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, policy, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let reply = client
        .get(
            "/",
            &[
                ("transfer_encoding", "chunked"),
                ("content_length", "5"),
                ("x_user", "from-client"),
                ("x-user", "checked"),
            ],
        )
        .await;
    assert_eq!(reply.status, 200);
    reply.json()["headers"].as_object().unwrap().clone()
}

/// The fields the upstream saw when a client at 127.0.0.1 claims other addresses in every
/// forwarding field, through a gateway with `client_ip` settings `client_ip`.
async fn forwarding_fields_seen(client_ip: &str) -> serde_json::Map<String, serde_json::Value> {
    let upstream = start_upstream().await;
    let policy = format!("{BASIC}\n[client_ip]\n{client_ip}\n");
    let gateway = start_gateway_on(HTTP1, &policy, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let reply = client
        .get(
            "/",
            &[
                ("forwarded", "for=198.51.100.9;proto=https"),
                ("x-real-ip", "198.51.100.9"),
                ("x-forwarded-for", "192.0.2.7"),
            ],
        )
        .await;
    assert_eq!(reply.status, 200);
    reply.json()["headers"].as_object().unwrap().clone()
}

#[tokio::test]
async fn a_client_cannot_pose_as_another_address_in_forwarded_or_x_real_ip() {
    let headers = forwarding_fields_seen("trusted_hops = 0").await;
    assert!(!headers.contains_key("forwarded"), "{headers:?}");
    assert_eq!(headers["x-real-ip"], "127.0.0.1", "the resolved client");

    let headers = forwarding_fields_seen("trusted_proxies = [\"10.0.0.0/8\"]").await;
    assert!(!headers.contains_key("forwarded"), "{headers:?}");
    assert_eq!(headers["x-real-ip"], "127.0.0.1");

    let headers = forwarding_fields_seen("x_real_ip = false").await;
    assert!(!headers.contains_key("forwarded"), "{headers:?}");
    assert!(!headers.contains_key("x-real-ip"), "{headers:?}");
}

#[tokio::test]
async fn a_trusted_proxy_passes_forwarded_on_and_x_real_ip_is_the_resolved_client() {
    let headers = forwarding_fields_seen("trusted_hops = 1").await;
    assert_eq!(headers["forwarded"], "for=198.51.100.9;proto=https");
    assert_eq!(headers["x-real-ip"], "192.0.2.7");

    let headers = forwarding_fields_seen("trusted_proxies = [\"127.0.0.0/8\"]").await;
    assert_eq!(headers["forwarded"], "for=198.51.100.9;proto=https");
    assert_eq!(headers["x-real-ip"], "192.0.2.7");

    // Without X-Real-IP of its own, the trusted proxy's one goes on as it sent it.
    let headers = forwarding_fields_seen("trusted_hops = 1\nx_real_ip = false").await;
    assert_eq!(headers["x-real-ip"], "198.51.100.9");
}

#[tokio::test]
async fn an_http2_clients_cookie_fields_reach_the_upstream_as_one_line() {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, BASIC, upstream.address).await;
    let client = HttpClient::h2c(gateway.addresses[0]);
    let reply = client
        .get("/", &[("cookie", "session=abc"), ("cookie", "theme=dark")])
        .await;
    assert_eq!(reply.status, 200);
    // The echo upstream shows a repeated field joined by ", ": one line shows as it came.
    assert_eq!(reply.json()["headers"]["cookie"], "session=abc; theme=dark");
}

#[tokio::test]
async fn fields_with_underscores_never_reach_the_upstream() {
    let headers = forwarded_fields_with_underscores(BASIC).await;
    for name in ["transfer_encoding", "content_length", "x_user"] {
        assert!(!headers.contains_key(name), "{name}: {headers:?}");
    }
    assert_eq!(headers["x-user"], "checked");
}

#[tokio::test]
async fn underscores_in_headers_keeps_them_but_never_framing_in_disguise() {
    let policy = BASIC.replacen("[server]\n", "[server]\nunderscores_in_headers = true\n", 1);
    let headers = forwarded_fields_with_underscores(&policy).await;
    assert!(!headers.contains_key("transfer_encoding"), "{headers:?}");
    assert!(!headers.contains_key("content_length"), "{headers:?}");
    assert_eq!(headers["x_user"], "from-client");
}

#[tokio::test]
async fn a_malformed_chunked_body_streamed_upstream_is_the_client_s_400() {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, BASIC, upstream.address).await;
    let (head, _stream) = raw_head(
        gateway.addresses[0],
        b"POST /echo-body HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\nbroken\r\n0\r\n\r\n",
    )
    .await;
    assert_eq!(raw_status(&head), 400, "{head}");
    let scrape = gateway.render_metrics();
    assert_eq!(
        metric(
            &scrape,
            r#"tollgate_upstream_responses_total{route="default",status="error"}"#
        ),
        0.0,
        "not counted as the upstream's failure"
    );
}

#[tokio::test]
async fn options_asterisk_is_forwarded_in_asterisk_form() {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, BASIC, upstream.address).await;
    let seen = upstream_view(
        gateway.addresses[0],
        b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n",
    )
    .await;
    assert_eq!(seen["method"], "OPTIONS");
    assert_eq!(seen["uri"], "*", "not /*");
    let (refused, _) = raw_head(gateway.addresses[0], b"GET * HTTP/1.1\r\nHost: a\r\n\r\n").await;
    assert_eq!(raw_status(&refused), 400, "{refused}");
}

/// A bare `host:port` target belongs to CONNECT; on any other method it is a 400, never taken
/// for the request's host (an upstream would see a target it did not expect).
#[tokio::test]
async fn an_authority_form_target_is_400_and_never_forwarded() {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, BASIC, upstream.address).await;
    for target in ["example.test:80", "relative", "internal.example:8080"] {
        let request = format!("GET {target} HTTP/1.1\r\nHost: a\r\n\r\n");
        let (refused, _) = raw_head(gateway.addresses[0], request.as_bytes()).await;
        assert_eq!(raw_status(&refused), 400, "{target}: {refused}");
    }
    assert_eq!(upstream.hits.load(Ordering::SeqCst), 0);
}

/// A body of unknown length on a method whose requests usually have none (GET, HEAD) still
/// goes upstream, chunked: dropped, it would be data lost, and the body would be left unread
/// on the client's connection, which then could not be kept.
#[tokio::test]
async fn a_chunked_body_on_get_or_head_reaches_the_upstream_and_keeps_the_connection() {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, BASIC, upstream.address).await;
    for method in ["GET", "HEAD"] {
        let mut stream = TcpStream::connect(gateway.addresses[0]).await.unwrap();
        let request = format!(
            "{method} /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"
        );
        stream.write_all(request.as_bytes()).await.unwrap();
        let response = read_response(&mut stream, method == "HEAD").await;
        assert_eq!(response.status(), 200, "{}", response.head);
        assert!(
            !response
                .head
                .to_ascii_lowercase()
                .contains("connection: close"),
            "{method}: the connection is kept: {}",
            response.head
        );
        // The same connection serves the next request, which shows what the first one carried.
        stream
            .write_all(b"POST /echo-body HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nok")
            .await
            .unwrap();
        let next = read_response(&mut stream, false).await;
        assert_eq!(next.status(), 200, "{}", next.head);
        assert_eq!(next.body, b"ok"[..]);
    }
    let seen = upstream_view(
        gateway.addresses[0],
        b"GET /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
    )
    .await;
    assert_eq!(seen["body"], "hello", "the body went upstream: {seen}");
}
