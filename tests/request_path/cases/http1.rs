//! The server's own HTTP/1.1 path over real sockets: pipelining, HEAD, `Connection: close`,
//! the hand-over to hyper in the middle of a connection, and the connection guards (header
//! read timeout, shutdown) on connections it serves.

use super::HTTP1;
use crate::common::*;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tollgate::limit::clock::unix_time;
use tollgate::Tollgate;

const POLICY: &str = r#"
[server]
listen = ["127.0.0.1:0"]
header_read_timeout = "400ms"

[upstreams.app]
url = "http://{upstream}"

[limits.per_network]
key = "client_network"
capacity = 1000
rate = "1/h"

[[routes]]
name = "all"
path_prefix = "/"
upstream = "app"
limits = ["per_network"]
"#;

/// Starts an upstream and a gateway, and sends `request` on a new connection to the gateway.
async fn connect_and_send(policy: &str, request: &[u8]) -> (Upstream, Tollgate, TcpStream) {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, policy, upstream.address).await;
    let mut stream = TcpStream::connect(gateway.addresses[0]).await.unwrap();
    stream.write_all(request).await.unwrap();
    (upstream, gateway, stream)
}

/// The URI the test upstream saw, from its JSON description of the request.
fn upstream_uri(response: &RawResponse) -> String {
    let description: serde_json::Value =
        serde_json::from_slice(&response.body).expect("the upstream's JSON description");
    description["uri"].as_str().unwrap_or_default().to_owned()
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order_and_head_has_no_body() {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, POLICY, upstream.address).await;
    let mut stream = TcpStream::connect(gateway.addresses[0]).await.unwrap();
    stream
        .write_all(
            b"GET /first HTTP/1.1\r\nHost: a\r\n\r\n\
              HEAD /second HTTP/1.1\r\nHost: a\r\n\r\n\
              GET /third?x=1 HTTP/1.1\r\nHost: a\r\n\r\n",
        )
        .await
        .unwrap();
    let first = read_response(&mut stream, false).await;
    assert_eq!(first.status(), 200, "{}", first.head);
    assert_eq!(upstream_uri(&first), "/first");
    assert!(first.header("date").is_some(), "{}", first.head);
    assert!(first.header("x-request-id").is_some(), "{}", first.head);
    assert!(
        first.header("ratelimit-remaining").is_some(),
        "{}",
        first.head
    );
    let second = read_response(&mut stream, true).await;
    assert_eq!(second.status(), 200, "{}", second.head);
    assert!(second.header("content-length").is_some(), "{}", second.head);
    let third = read_response(&mut stream, false).await;
    assert_eq!(upstream_uri(&third), "/third?x=1");
    assert_eq!(upstream.hits.load(std::sync::atomic::Ordering::SeqCst), 3);
}

#[tokio::test]
async fn pipelined_refusals_and_admissions_come_back_in_order_each_with_its_own_id() {
    let policy = POLICY.replace("capacity = 1000", "capacity = 2");
    let mut requests = Vec::new();
    for index in 0..6 {
        requests.extend_from_slice(format!("GET /{index} HTTP/1.1\r\nHost: a\r\n\r\n").as_bytes());
    }
    let (_upstream, _gateway, mut stream) = connect_and_send(&policy, &requests).await;
    let mut ids = std::collections::HashSet::new();
    for index in 0..6 {
        let response = read_response(&mut stream, false).await;
        if index < 2 {
            assert_eq!(response.status(), 200, "{}", response.head);
            assert_eq!(upstream_uri(&response), format!("/{index}"));
        } else {
            assert_eq!(response.status(), 429, "{}", response.head);
            assert!(response.text().contains("too_many_requests"));
        }
        assert!(ids.insert(response.header("x-request-id").unwrap()));
    }
}

#[tokio::test]
async fn an_answer_read_ahead_of_a_slow_one_is_not_held_behind_it() {
    let upstream = start_upstream().await;
    upstream
        .delay_ms
        .store(60_000, std::sync::atomic::Ordering::SeqCst);
    let gateway = start_gateway_on(HTTP1, POLICY, upstream.address).await;
    let mut stream = TcpStream::connect(gateway.addresses[0]).await.unwrap();
    stream
        .write_all(
            b"GET /first HTTP/1.1\r\nHost: a\r\n\r\n\
              GET /delayed HTTP/1.1\r\nHost: a\r\n\r\n",
        )
        .await
        .unwrap();
    let first = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        read_response(&mut stream, false),
    )
    .await
    .expect("the first answer waited for the second");
    assert_eq!(upstream_uri(&first), "/first");
}

#[tokio::test]
async fn an_answer_read_with_a_body_request_comes_before_hyper_takes_over() {
    let (_upstream, _gateway, mut stream) = connect_and_send(
        POLICY,
        b"GET /before HTTP/1.1\r\nHost: a\r\n\r\n\
          POST /echo-body HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
    )
    .await;
    let before = read_response(&mut stream, false).await;
    assert_eq!(upstream_uri(&before), "/before");
    let echoed = read_response(&mut stream, false).await;
    assert_eq!(echoed.text(), "hello");
}

#[tokio::test]
async fn a_request_with_a_body_hands_the_connection_to_hyper_mid_way() {
    let (_upstream, _gateway, mut stream) =
        connect_and_send(POLICY, b"GET /before HTTP/1.1\r\nHost: a\r\n\r\n").await;
    let before = read_response(&mut stream, false).await;
    assert_eq!(upstream_uri(&before), "/before");
    // The body request and the one after it arrive together: hyper gets both, in order.
    stream
        .write_all(
            b"POST /echo-body HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello\
              GET /after HTTP/1.1\r\nHost: a\r\n\r\n",
        )
        .await
        .unwrap();
    let echoed = read_response(&mut stream, false).await;
    assert_eq!(echoed.status(), 200, "{}", echoed.head);
    assert_eq!(echoed.text(), "hello");
    let after = read_response(&mut stream, false).await;
    assert_eq!(upstream_uri(&after), "/after");
}

#[tokio::test]
async fn connection_close_is_answered_in_kind_and_the_connection_ends() {
    let (_upstream, _gateway, mut stream) = connect_and_send(
        POLICY,
        b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await;
    let response = read_response(&mut stream, false).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.header("connection").as_deref(), Some("close"));
    // Closed with a FIN, not a reset.
    let mut rest = Vec::new();
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        tokio::io::AsyncReadExt::read_to_end(&mut stream, &mut rest),
    )
    .await
    .expect("the connection is still open");
    assert!(read.is_ok(), "{read:?}");
    assert!(rest.is_empty());
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_cut_off_after_the_header_read_timeout() {
    let upstream = start_upstream().await;
    let gateway = start_gateway_on(HTTP1, POLICY, upstream.address).await;
    let mut stream = TcpStream::connect(gateway.addresses[0]).await.unwrap();
    assert!(
        rest_until_closed(&mut stream).await.is_some(),
        "a silent connection is still open after 10 s"
    );
}

#[tokio::test]
async fn shutdown_closes_idle_keep_alive_connections_at_once() {
    let upstream = start_upstream().await;
    let policy = POLICY.replace("header_read_timeout = \"400ms\"", "");
    let gateway = start_gateway_on(HTTP1, &policy, upstream.address).await;
    let mut stream = TcpStream::connect(gateway.addresses[0]).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_response(&mut stream, false).await.status(), 200);
    assert!(
        gateway.shutdown().await,
        "an idle keep-alive connection held up the drain"
    );
    assert!(
        rest_until_closed(&mut stream).await.is_some(),
        "the idle connection is still open"
    );
}

/// An upstream that answers each request on its first connection 1.5 s late, with no `Date`.
async fn late_upstream_without_a_date() -> std::net::SocketAddr {
    use tokio::io::AsyncReadExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await.unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if stream.read(&mut byte).await.unwrap_or(0) == 0 {
                return;
            }
            head.push(byte[0]);
        }
        tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
        let _ = stream
            .write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            .await;
        let _ = stream.read(&mut byte).await;
    });
    address
}

/// The response's `Date` as seconds since the Unix epoch.
fn dated(response: &RawResponse) -> u64 {
    let date = response.header("date").expect("a Date field");
    httpdate::parse_http_date(&date)
        .expect("an HTTP date")
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

#[tokio::test]
async fn a_date_the_gateway_adds_is_the_time_of_the_answer_not_of_the_request() {
    let upstream = late_upstream_without_a_date().await;
    let policy = POLICY.replace("capacity = 1000", "capacity = 1");
    let gateway = start_gateway_on(HTTP1, &policy, upstream).await;
    let mut stream = TcpStream::connect(gateway.addresses[0]).await.unwrap();
    let sent = unix_time();
    stream
        .write_all(b"GET /late HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let late = read_response(&mut stream, false).await;
    assert_eq!(late.status(), 200, "{}", late.head);
    // Answered at least 1.5 s after it was sent: a date taken as the request came in would
    // be at most `sent`'s second (or the next, sent less than 0.5 s before it).
    let answered_no_earlier = (sent + std::time::Duration::from_millis(1500)).as_secs();
    assert!(dated(&late) >= answered_no_earlier, "{}", late.head);
    // A refusal is answered at once: dated within the seconds around it.
    let refused_at = unix_time().as_secs();
    stream
        .write_all(b"GET /refused HTTP/1.1\r\nHost: a\r\n\r\n")
        .await
        .unwrap();
    let refused = read_response(&mut stream, false).await;
    let after = unix_time().as_secs();
    assert_eq!(refused.status(), 429, "{}", refused.head);
    assert!(
        (refused_at..=after).contains(&dated(&refused)),
        "{}",
        refused.head
    );
}
