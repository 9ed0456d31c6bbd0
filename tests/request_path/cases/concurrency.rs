//! Concurrency limits: a key's requests in flight, each holding a slot until its response
//! body is sent or its client leaves; all or nothing with the route's token buckets.
#![allow(clippy::disallowed_methods)] // tests measure real time

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

/// One HTTP/2 connection to the gateway (prior knowledge), driven in the background.
async fn http2_connection(
    gateway: &tollgate::Tollgate,
) -> (
    hyper::client::conn::http2::SendRequest<http_body_util::Empty<bytes::Bytes>>,
    tokio::task::JoinHandle<()>,
) {
    let stream = TcpStream::connect(gateway.addresses[0])
        .await
        .expect("connect");
    let (sender, connection) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(stream),
    )
    .await
    .expect("an HTTP/2 connection");
    let driving = tokio::spawn(async move {
        let _ = connection.await;
    });
    (sender, driving)
}

fn http2_get(path: &str, user: &str) -> http::Request<http_body_util::Empty<bytes::Bytes>> {
    http::Request::get(format!("http://a{path}"))
        .header("x-user", user)
        .body(http_body_util::Empty::new())
        .expect("a request")
}

#[tokio::test]
async fn an_http2_connections_streams_are_served_side_by_side() {
    // An upstream that answers none of its requests until all of them have arrived: streams
    // served one after another would wait for ever.
    const STREAMS: usize = 16;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let upstream = listener.local_addr().expect("address");
    let all_arrived = std::sync::Arc::new(tokio::sync::Barrier::new(STREAMS));
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let all_arrived = all_arrived.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |_| {
                    let all_arrived = all_arrived.clone();
                    async move {
                        all_arrived.wait().await;
                        Ok::<_, std::convert::Infallible>(http::Response::new(
                            http_body_util::Full::new(bytes::Bytes::from("together")),
                        ))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    let gateway = start_gateway_on(HTTP1, POLICY, upstream).await;
    let (sender, _driving) = http2_connection(&gateway).await;
    let requests = (0..STREAMS).map(|stream| {
        let mut sender = sender.clone();
        async move {
            sender
                .send_request(http2_get("/", &format!("user-{stream}")))
                .await
        }
    });
    let answered = tokio::time::timeout(
        std::time::Duration::from_secs(30),
        futures_util::future::join_all(requests),
    )
    .await
    .expect("every stream answered while the others waited");
    for response in answered {
        assert_eq!(response.expect("a response").status(), 200);
    }
}

#[tokio::test]
async fn an_http2_client_that_leaves_gives_its_streams_slots_back() {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, POLICY, upstream.address).await;
    let (mut sender, driving) = http2_connection(&gateway).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let response = sender
            .send_request(http2_get("/held-body", "ann"))
            .await
            .expect("a response");
        assert_eq!(response.status(), 200);
        held.push(response);
    }
    let refused = sender
        .send_request(http2_get("/held-body", "ann"))
        .await
        .expect("a response");
    assert_eq!(refused.status(), 429, "both of ann's slots are held");
    assert_eq!(metric(&gateway.render_metrics(), IN_USE), 2.0);

    // The connection closes with both bodies still coming (the upstream holds them for 10 s):
    // the streams end with it, and their slots come back well before the bodies would have.
    let left = std::time::Instant::now();
    driving.abort();
    drop((sender, held));
    until_in_use(&gateway, 0.0).await;
    assert!(
        left.elapsed() < std::time::Duration::from_secs(8),
        "the slots came back only as the bodies ended"
    );
}
