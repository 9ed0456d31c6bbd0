//! The gateway's own HTTP/1.1 client against an upstream that answers with scripted bytes:
//! body framings, informational responses, keep-alive reuse, connections the upstream closes,
//! and responses it breaks off.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;
use parking_lot::Mutex;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const POLICY: &str = r#"
[server]
listen = ["127.0.0.1:0"]

[upstreams.scripted]
url = "http://{upstream}"
timeout = "5s"

[limits.per_network]
key = "client_network"
capacity = 1000
rate = "1/h"

[limits.per_account]
key = { json_field = "email" }
capacity = 1000
rate = "1/h"

[[routes]]
name = "login"
path = "/login"
upstream = "scripted"
limits = ["per_account"]

[[routes]]
name = "default"
path_prefix = "/"
upstream = "scripted"
limits = ["per_network"]
"#;

/// What the scripted upstream does after answering.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Then {
    KeepOpen,
    Close,
    /// Keeps the connection for a moment, then closes it while it sits idle.
    CloseWhenIdle,
    /// Reads the next request on the connection, then closes it without an answer.
    DropNextRequest,
    /// Sends these bytes 300 ms later, unasked, and keeps the connection open.
    SendLate(&'static str),
}

/// What an upstream sends unasked after a response: a response of its own.
const LATE_RESPONSE: &str = "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nforged";

/// The raw answer to a request path.
fn script(path: &str) -> (Vec<u8>, Then) {
    let answer = |text: &str, then| (text.as_bytes().to_vec(), then);
    match path {
        "/chunked" => answer(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Kind: chunked\r\n\r\n\
             5;ext=1\r\nhello\r\n6\r\n world\r\n0\r\nX-Trailer: dropped\r\n\r\n",
            Then::KeepOpen,
        ),
        "/until-close" => answer(
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nread until the end",
            Then::Close,
        ),
        "/early-hints" => answer(
            "HTTP/1.1 103 Early Hints\r\nLink: </style.css>\r\n\r\n\
             HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfinal",
            Then::KeepOpen,
        ),
        "/no-body" => answer(
            "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n",
            Then::KeepOpen,
        ),
        "/broken-off" => answer(
            "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this much",
            Then::Close,
        ),
        // Both framings: the coding wins, and the length must not reach the client (a length
        // shorter than the body forged the client's next response, a longer one swallowed it).
        "/length-3-and-chunked" => answer(
            "HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n\
             b\r\nhello world\r\n0\r\n\r\n",
            Then::Close,
        ),
        "/length-100-and-chunked" => answer(
            "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n\
             5\r\nhello\r\n0\r\n\r\n",
            Then::Close,
        ),
        // Bytes the framing says are not there, sent after a pause, shaped as a response.
        "/late-after-204" => answer(
            "HTTP/1.1 204 No Content\r\n\r\n",
            Then::SendLate(LATE_RESPONSE),
        ),
        "/late-after-length" => answer(
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
            Then::SendLate(LATE_RESPONSE),
        ),
        "/garbage" => answer("SSH-2.0-OpenSSH_9.6\r\n\r\n", Then::Close),
        // Answers without a body that announce one: a buggy upstream may send it later.
        "/204-with-length" => answer(
            "HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\n",
            Then::KeepOpen,
        ),
        "/304-chunked" => answer(
            "HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n",
            Then::KeepOpen,
        ),
        // A 1xx nobody asked for, then the answer.
        "/processing" => answer(
            "HTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
            Then::KeepOpen,
        ),
        "/switch-unasked" => answer(
            "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
            Then::KeepOpen,
        ),
        // RFC 9112 §6.1: an HTTP/1.0 message cannot be chunked; its framing is faulty.
        "/http10-chunked" => answer(
            "HTTP/1.0 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
            Then::Close,
        ),
        "/huge-head" => (
            format!(
                "HTTP/1.1 200 OK\r\nX-Huge: {}\r\nContent-Length: 2\r\n\r\nok",
                "x".repeat(70_000)
            )
            .into_bytes(),
            Then::Close,
        ),
        "/drop-next" => answer(
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
            Then::DropNextRequest,
        ),
        "/idle-close" => answer(
            "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nonce",
            Then::CloseWhenIdle,
        ),
        "/large" => {
            let body: Vec<u8> = (0..1_048_576u32).map(|index| (index % 251) as u8).collect();
            let mut answer =
                format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n", body.len()).into_bytes();
            answer.extend_from_slice(&body);
            (answer, Then::KeepOpen)
        }
        _ => answer(
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
            Then::KeepOpen,
        ),
    }
}

struct ScriptedUpstream {
    address: SocketAddr,
    connections: Arc<AtomicUsize>,
    /// Every request as it arrived, head and body.
    requests: Arc<Mutex<Vec<String>>>,
}

async fn start_scripted_upstream() -> ScriptedUpstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let requests = Arc::new(Mutex::new(Vec::new()));
    let (counter, log) = (connections.clone(), requests.clone());
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let number = counter.fetch_add(1, Ordering::SeqCst) + 1;
            tokio::spawn(serve_scripted(stream, number, log.clone()));
        }
    });
    ScriptedUpstream {
        address,
        connections,
        requests,
    }
}

/// Serves connection `number` (from 1): `/which` answers with that number.
async fn serve_scripted(mut stream: TcpStream, number: usize, log: Arc<Mutex<Vec<String>>>) {
    let mut buffer = Vec::new();
    let mut drop_next = false;
    loop {
        let Some(end) = read_request(&mut stream, &mut buffer).await else {
            return;
        };
        let request: Vec<u8> = buffer.drain(..end).collect();
        let request = String::from_utf8_lossy(&request).into_owned();
        let path = request.split_whitespace().nth(1).unwrap_or("/").to_owned();
        log.lock().push(request);
        if drop_next {
            return;
        }
        let (answer, then) = match path.as_str() {
            "/which" => (
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{number}",
                    number.to_string().len()
                )
                .into_bytes(),
                Then::KeepOpen,
            ),
            _ => script(&path),
        };
        if stream.write_all(&answer).await.is_err() {
            return;
        }
        match then {
            Then::KeepOpen => {}
            Then::DropNextRequest => drop_next = true,
            Then::Close => return,
            Then::CloseWhenIdle => {
                tokio::time::sleep(Duration::from_millis(100)).await;
                return;
            }
            Then::SendLate(bytes) => {
                tokio::time::sleep(Duration::from_millis(300)).await;
                if stream.write_all(bytes.as_bytes()).await.is_err() {
                    return;
                }
            }
        }
    }
}

/// Reads one whole request (head and Content-Length body) into `buffer`; its length.
async fn read_request(stream: &mut TcpStream, buffer: &mut Vec<u8>) -> Option<usize> {
    loop {
        if let Some(head_end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buffer[..head_end]).to_lowercase();
            let length: usize = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length:"))
                .map_or(0, |value| value.trim().parse().unwrap());
            let end = head_end + 4 + length;
            if buffer.len() >= end {
                return Some(end);
            }
        }
        let mut chunk = [0u8; 4096];
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return None,
            Ok(read) => buffer.extend_from_slice(&chunk[..read]),
        }
    }
}

/// A POST whose body the gateway reads (for the account key), so it is in memory.
async fn login(client: &HttpClient) -> Reply {
    client
        .post(
            "/login",
            &[("content-type", "application/json")],
            r#"{"email":"a@example.com"}"#,
        )
        .await
}

#[tokio::test]
async fn chunked_responses_arrive_whole_and_the_connection_is_reused() {
    let upstream = start_scripted_upstream().await;
    let gateway = start_gateway(POLICY, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    for _ in 0..3 {
        let reply = client.get("/chunked", &[]).await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.body, "hello world");
        assert_eq!(reply.headers["x-kind"], "chunked");
    }
    assert_eq!(upstream.connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn close_delimited_bodies_are_read_to_the_end_and_not_reused() {
    let upstream = start_scripted_upstream().await;
    let gateway = start_gateway(POLICY, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    for _ in 0..2 {
        let reply = client.get("/until-close", &[]).await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.body, "read until the end");
    }
    assert_eq!(upstream.connections.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn informational_responses_are_skipped_and_head_responses_have_no_body() {
    let upstream = start_scripted_upstream().await;
    let gateway = start_gateway(POLICY, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let reply = client.get("/early-hints", &[]).await;
    assert_eq!(
        (reply.status.as_u16(), &reply.body[..]),
        (200, &b"final"[..])
    );
    let reply = client
        .send("HEAD", "/no-body", &[], Default::default())
        .await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.headers["content-length"], "100");
    assert!(reply.body.is_empty());
    let reply = client.get("/", &[]).await;
    assert_eq!(reply.body, "ok");
    assert_eq!(
        upstream.connections.load(Ordering::SeqCst),
        2,
        "one connection served the 103 and the HEAD, whose Content-Length ends its reuse"
    );
}

#[tokio::test]
async fn a_large_response_streams_through_intact() {
    let upstream = start_scripted_upstream().await;
    let gateway = start_gateway(POLICY, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let reply = client.get("/large", &[]).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body.len(), 1_048_576);
    assert!(reply
        .body
        .iter()
        .enumerate()
        .all(|(index, byte)| *byte == (index % 251) as u8));
    assert_eq!(client.get("/", &[]).await.body, "ok");
    assert_eq!(upstream.connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_connection_the_upstream_closed_while_idle_is_not_used_again() {
    let upstream = start_scripted_upstream().await;
    let gateway = start_gateway(POLICY, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    assert_eq!(client.get("/idle-close", &[]).await.body, "once");
    // Wait until the upstream has closed it (it does after 100 ms idle).
    tokio::time::sleep(Duration::from_millis(400)).await;
    // Not idempotent, so never retried: it must not go out on the closed connection.
    let reply = login(&client).await;
    assert_eq!(reply.status, 200, "{:?}", reply.body);
    assert_eq!(upstream.connections.load(Ordering::SeqCst), 2);
    let requests = upstream.requests.lock();
    let login = requests.last().unwrap();
    assert!(
        login.starts_with("POST /login HTTP/1.1\r\n"),
        "origin-form request line: {login}"
    );
    assert!(login.contains("content-length: 25\r\n"), "{login}");
    assert!(login.ends_with(r#"{"email":"a@example.com"}"#), "{login}");
}

#[tokio::test]
async fn broken_and_invalid_responses_fail_cleanly() {
    let upstream = start_scripted_upstream().await;
    let gateway = start_gateway(POLICY, upstream.address).await;
    let address = gateway.addresses[0];
    let garbage = raw(
        address,
        b"GET /garbage HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(raw_status(&garbage), 502, "{garbage}");

    // The upstream announced 100 bytes and sent 14: the client's connection is cut, so it
    // sees an incomplete message, never one that looks whole.
    let broken = raw(
        address,
        b"GET /broken-off HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n",
    )
    .await;
    if let Some(head_end) = broken.find("\r\n\r\n") {
        assert_eq!(raw_status(&broken), 200, "{broken}");
        assert!(broken.len() - head_end - 4 < 100, "{broken}");
    }

    let client = HttpClient::new(address);
    assert_eq!(client.get("/", &[]).await.body, "ok", "the gateway goes on");
}

#[tokio::test]
async fn a_reused_connection_that_fails_unanswered_is_retried_only_for_idempotent_requests() {
    let upstream = start_scripted_upstream().await;
    let gateway = start_gateway(POLICY, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    assert_eq!(client.get("/drop-next", &[]).await.body, "ok");
    // The upstream takes the next request on that connection and closes it unanswered: a GET
    // goes out once more on a new connection.
    let reply = client.get("/", &[]).await;
    assert_eq!((reply.status.as_u16(), &reply.body[..]), (200, &b"ok"[..]));
    assert_eq!(upstream.connections.load(Ordering::SeqCst), 2);

    assert_eq!(client.get("/drop-next", &[]).await.body, "ok");
    // A POST might have been acted on: it is not sent twice.
    let reply = login(&client).await;
    assert_eq!(reply.status, 502);
    assert_eq!(upstream.connections.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_response_with_length_and_chunked_reaches_the_client_framed_once() {
    let upstream = start_scripted_upstream().await;
    for http1 in ["fast", "hyper"] {
        let gateway = start_gateway_on(http1, POLICY, upstream.address).await;
        for (path, body) in [
            ("/length-3-and-chunked", "hello world"),
            ("/length-100-and-chunked", "hello"),
        ] {
            let mut stream = TcpStream::connect(gateway.addresses[0]).await.unwrap();
            let request = format!(
                "GET {path} HTTP/1.1\r\nHost: a\r\n\r\nGET /ok HTTP/1.1\r\nHost: a\r\n\r\n"
            );
            stream.write_all(request.as_bytes()).await.unwrap();
            let first = read_response(&mut stream, false).await;
            assert_eq!(first.status(), 200, "{http1} {path}: {}", first.head);
            assert_eq!(first.text(), body, "{http1} {path}: {}", first.head);
            assert_ne!(
                first.header("content-length").as_deref(),
                Some(if body.len() == 11 { "3" } else { "100" }),
                "{http1} {path}: the upstream's length was forwarded"
            );
            let second = read_response(&mut stream, false).await;
            assert_eq!(
                (second.status(), second.text().as_str()),
                (200, "ok"),
                "{http1} {path}: the next response is the upstream's own"
            );
        }
    }
}

#[tokio::test]
async fn bytes_an_upstream_sends_unasked_never_answer_another_request() {
    let upstream = start_scripted_upstream().await;
    let gateway = start_gateway(POLICY, upstream.address).await;
    for (path, status) in [("/late-after-204", 204), ("/late-after-length", 200)] {
        for _ in 0..4 {
            let first = HttpClient::new(gateway.addresses[0]);
            assert_eq!(first.get(path, &[]).await.status.as_u16(), status, "{path}");
            // The unasked bytes arrive while the connection is back in the pool.
            tokio::time::sleep(Duration::from_millis(500)).await;
            let other = HttpClient::new(gateway.addresses[0]);
            let reply = other.get("/ok", &[]).await;
            assert_eq!(
                (reply.status.as_u16(), reply.body.as_ref()),
                (200, b"ok".as_ref()),
                "{path}: another client's request got the unasked bytes"
            );
        }
    }
}

/// Refused alike by the own client (a bodyless request) and by hyper's (a request whose body
/// streams): a chunked HTTP/1.0 response, and a response head over 64 KiB.
#[tokio::test]
async fn faulty_framing_and_huge_heads_are_502_on_both_clients() {
    let upstream = start_scripted_upstream().await;
    let gateway = start_gateway(POLICY, upstream.address).await;
    for path in ["/http10-chunked", "/huge-head"] {
        for (client, body) in [
            ("own", ""),
            ("hyper's", "Transfer-Encoding: chunked\r\n\r\n0"),
        ] {
            let request =
                format!("GET {path} HTTP/1.1\r\nHost: a\r\nConnection: close\r\n{body}\r\n\r\n");
            let response = raw(gateway.addresses[0], request.as_bytes()).await;
            assert_eq!(
                raw_status(&response),
                502,
                "{path} on {client} client: {response}"
            );
        }
    }
}

/// Sends `path` on a new client connection: bodyless on the own client, or with a body that
/// streams (hyper's client).
async fn one_request(gateway: &tollgate::Tollgate, path: &str, streamed: bool) -> Reply {
    let client = HttpClient::new(gateway.addresses[0]);
    if streamed {
        // A body on a route that reads none streams through hyper's client.
        client.post(path, &[], "streamed").await
    } else {
        client.get(path, &[]).await
    }
}

#[tokio::test]
async fn a_connection_whose_answer_was_suspect_carries_no_other_request() {
    for streamed in [false, true] {
        for (path, status) in [
            ("/204-with-length", 204),
            ("/304-chunked", 304),
            ("/processing", 200),
        ] {
            let upstream = start_scripted_upstream().await;
            let gateway = start_gateway(POLICY, upstream.address).await;
            let first = one_request(&gateway, path, streamed).await;
            assert_eq!(
                first.status.as_u16(),
                status,
                "{path}, streamed: {streamed}"
            );
            let other = one_request(&gateway, "/ok", streamed).await;
            assert_eq!(other.body, "ok");
            if (path, streamed) == ("/processing", true) {
                continue; // hyper's client hides the 1xx: nothing to go by.
            }
            assert_eq!(
                upstream.connections.load(Ordering::SeqCst),
                2,
                "{path}, streamed: {streamed}: the suspect connection was reused"
            );
        }
    }
    // The plain case still reuses: the rule is not a blanket.
    let upstream = start_scripted_upstream().await;
    let gateway = start_gateway(POLICY, upstream.address).await;
    one_request(&gateway, "/ok", false).await;
    one_request(&gateway, "/ok", false).await;
    assert_eq!(upstream.connections.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_unasked_101_on_a_reused_connection_is_a_502_sent_once() {
    for streamed in [false, true] {
        let upstream = start_scripted_upstream().await;
        let gateway = start_gateway(POLICY, upstream.address).await;
        assert_eq!(one_request(&gateway, "/ok", streamed).await.body, "ok");
        let reply = one_request(&gateway, "/switch-unasked", streamed).await;
        assert_eq!(reply.status, 502, "streamed: {streamed}");
        let sent = upstream
            .requests
            .lock()
            .iter()
            .filter(|request| request.contains("/switch-unasked"))
            .count();
        assert_eq!(
            sent, 1,
            "streamed: {streamed}: the upstream saw it {sent} times"
        );
    }
}

#[tokio::test]
async fn per_client_reuse_keeps_each_upstream_connection_to_one_client() {
    let policy = POLICY.replace(
        "timeout = \"5s\"",
        "timeout = \"5s\"\nreuse = \"per_client\"",
    );
    for streamed in [false, true] {
        let upstream = start_scripted_upstream().await;
        let gateway = start_gateway(&policy, upstream.address).await;
        let (alice, bob) = (
            HttpClient::new(gateway.addresses[0]),
            HttpClient::new(gateway.addresses[0]),
        );
        let which = |client: &HttpClient| {
            let client = client.clone();
            async move {
                let reply = if streamed {
                    client.post("/which", &[], "x").await
                } else {
                    client.get("/which", &[]).await
                };
                String::from_utf8(reply.body.to_vec()).unwrap()
            }
        };
        let first = which(&alice).await;
        let second = which(&bob).await;
        assert_ne!(
            first, second,
            "streamed: {streamed}: bob got alice's connection"
        );
        assert_eq!(which(&alice).await, first, "alice keeps hers");
        assert_eq!(which(&bob).await, second, "bob keeps his");
        assert_eq!(upstream.connections.load(Ordering::SeqCst), 2);
    }
    // Shared, the one idle connection serves both.
    let upstream = start_scripted_upstream().await;
    let gateway = start_gateway(POLICY, upstream.address).await;
    let first = one_request(&gateway, "/which", false).await;
    let second = one_request(&gateway, "/which", false).await;
    assert_eq!(first.body, second.body);
}
