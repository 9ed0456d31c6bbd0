//! The gateway's own upstream client held to hyper's client on generated responses: a seeded
//! generator of valid and near-valid response heads and bodies (status lines, 1xx before the
//! final answer, Content-Length and Transfer-Encoding combinations, bodies on 204, 304 and
//! HEAD, bodies delimited by the connection's end, obs-fold, NUL, bare LF, huge heads) is
//! served by a scripted upstream. Each case is asked for twice through one gateway: once
//! bodyless (the own client takes it) and once with an empty chunked body (streamed: hyper's
//! client takes it). What the gateway's client receives must agree, up to the date, the
//! request id and the wording of a 502.
//!
//! `TOLLGATE_DIFFERENTIAL_CASES` (default 2,000) and `TOLLGATE_DIFFERENTIAL_SEED` set the run.
#![allow(clippy::disallowed_methods)] // tests measure real time

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::differential::{cases_to_run, compare, exchange, Generator, POLICY};
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

// Each list starts with its valid entries; the number says how many.
const STATUS_LINES: (&[&str], usize) = (
    &[
        "HTTP/1.1 200 OK",
        "HTTP/1.1 200 OK",
        "HTTP/1.1 201 Created",
        "HTTP/1.1 404 Not Found",
        "HTTP/1.1 500 Internal Server Error",
        "HTTP/1.1 200",
        "HTTP/1.0 200 OK",
        "HTTP/1.1 204 No Content",
        "HTTP/1.1 304 Not Modified",
        "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK",
        "HTTP/1.1 103 Early Hints\r\nLink: </style.css>\r\n\r\nHTTP/1.1 200 OK",
        "HTTP/1.1 101 Switching Protocols",
        "HTTP/1.1 999 Odd",
        "HTTP/1.1 600 Beyond",
        "HTTP/1.1 20 OK",
        "HTTP/2 200",
        "HTTP/1.1 200 OK\r\nHTTP/1.1 200 OK",
        "ICY 200 OK",
        "",
    ],
    11,
);
const FIELDS: (&[&str], usize) = (
    &[
        "X-A: 1",
        "Cache-Control: no-store",
        "Set-Cookie: a=1\r\nSet-Cookie: b=2",
        "Connection: x-hop\r\nX-Hop: secret",
        "Keep-Alive: timeout=5",
        "Connection: close",
        "X-Fold: first\r\n second",
        "X-Nul: a\0b",
        "X Bad: y",
        "Content-Type : text/plain",
        ": no-name",
        "X-Cr: a\rb",
    ],
    6,
);
/// How the body is framed: a field, and how much of the body follows.
const FRAMINGS: (&[&str], usize) = (
    &[
        "length",
        "length",
        "chunked",
        "chunked",
        "to-close",
        "length-short",
        "length-long",
        "length-invalid",
        "length-negative",
        "length-list",
        "length-twice-differing",
        "length-and-chunked",
        "gzip-only",
        "chunked-bad",
        "chunked-truncated",
        "chunked-then-gzip",
        "chunked-trailers",
    ],
    5,
);

const BODY: &str = "hello world";

struct Case {
    method: &'static str,
    response: Vec<u8>,
}

fn generate(generator: &mut Generator) -> Case {
    let hostile = generator.chance(50);
    let method = if generator.chance(20) { "HEAD" } else { "GET" };
    let end = if hostile && generator.chance(5) {
        "\n"
    } else {
        "\r\n"
    };
    let mut head = generator.pick_for(hostile, STATUS_LINES).to_owned();
    head.push_str(end);
    for _ in 0..generator.below(3) {
        head.push_str(generator.pick_for(hostile, FIELDS));
        head.push_str(end);
    }
    if hostile && generator.chance(3) {
        head.push_str(&format!("X-Huge: {}{end}", "x".repeat(70_000)));
    }
    let framing = generator.pick_for(hostile, FRAMINGS);
    let (field, body): (String, String) = match framing {
        "length" => (format!("Content-Length: {}", BODY.len()), BODY.into()),
        "chunked" => (
            "Transfer-Encoding: chunked".into(),
            format!("{:x}\r\n{BODY}\r\n0\r\n\r\n", BODY.len()),
        ),
        "to-close" => (String::new(), BODY.into()),
        "length-short" => ("Content-Length: 5".into(), BODY.into()),
        "length-long" => ("Content-Length: 100".into(), BODY.into()),
        "length-invalid" => ("Content-Length: abc".into(), BODY.into()),
        "length-negative" => ("Content-Length: -1".into(), BODY.into()),
        "length-list" => ("Content-Length: 11, 11".into(), BODY.into()),
        "length-twice-differing" => (
            "Content-Length: 11\r\nContent-Length: 12".into(),
            BODY.into(),
        ),
        "length-and-chunked" => (
            "Content-Length: 3\r\nTransfer-Encoding: chunked".into(),
            format!("{:x}\r\n{BODY}\r\n0\r\n\r\n", BODY.len()),
        ),
        "gzip-only" => ("Transfer-Encoding: gzip".into(), BODY.into()),
        "chunked-bad" => (
            "Transfer-Encoding: chunked".into(),
            "zz\r\nhello\r\n0\r\n\r\n".into(),
        ),
        "chunked-truncated" => ("Transfer-Encoding: chunked".into(), "b\r\nhello".into()),
        "chunked-then-gzip" => (
            "Transfer-Encoding: chunked, gzip".into(),
            format!("{:x}\r\n{BODY}\r\n0\r\n\r\n", BODY.len()),
        ),
        "chunked-trailers" => (
            "Transfer-Encoding: chunked".into(),
            format!("{:x}\r\n{BODY}\r\n0\r\nX-Trailer: t\r\n\r\n", BODY.len()),
        ),
        other => unreachable!("{other}"),
    };
    if !field.is_empty() {
        head.push_str(&field);
        head.push_str(end);
    }
    head.push_str(end);
    let mut response = head.into_bytes();
    // A body even where none may be (HEAD, 204, 304) in a hostile case; a valid one sends
    // none there.
    let bodyless = method == "HEAD"
        || response.starts_with(b"HTTP/1.1 204")
        || response.starts_with(b"HTTP/1.1 304");
    if hostile || !bodyless {
        response.extend_from_slice(body.as_bytes());
    }
    Case {
        method,
        response: response.clone(),
    }
}

/// Responses by case number, for the scripted upstream.
type Script = Arc<Mutex<HashMap<usize, Vec<u8>>>>;

/// An upstream that reads one request (`/case/N`, its empty chunked body if it has one),
/// answers with case N's bytes, and closes the connection: what follows the bytes is delimited
/// by the close alone. Any other path gets a plain 200. Each head says `Connection: close`, as
/// a server that closes should: a client that pooled the connection could otherwise pick it up
/// for its next request just as it closes, a race that is not what these cases compare.
async fn scripted_upstream(script: Script) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let script = script.clone();
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buffer = [0u8; 4096];
                let complete = |request: &[u8]| {
                    let text = String::from_utf8_lossy(request).to_ascii_lowercase();
                    match text.find("\r\n\r\n") {
                        Some(end) if text[..end].contains("transfer-encoding: chunked") => {
                            text[end..].contains("0\r\n\r\n")
                        }
                        Some(_) => true,
                        None => false,
                    }
                };
                while !complete(&request) {
                    match stream.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(count) => request.extend_from_slice(&buffer[..count]),
                    }
                }
                let text = String::from_utf8_lossy(&request);
                let case = text
                    .split(' ')
                    .nth(1)
                    .and_then(|target| target.strip_prefix("/case/"))
                    .and_then(|number| number.parse::<usize>().ok());
                let response = case
                    .and_then(|case| script.lock().unwrap().get(&case).cloned())
                    .unwrap_or_else(|| {
                        b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nprobe".to_vec()
                    });
                let response = closing(&response);
                let _ = stream.write_all(&response).await;
                let _ = stream.shutdown().await;
                // Drained until the gateway closes: an unread request must not reset the
                // connection before the gateway read the response.
                let _ = tokio::time::timeout(Duration::from_secs(5), async {
                    while matches!(stream.read(&mut buffer).await, Ok(count) if count > 0) {}
                })
                .await;
            });
        }
    });
    address
}

/// `response` with `Connection: close` after each status line.
fn closing(response: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(response.len() + 64);
    for line in response.split_inclusive(|byte| *byte == b'\n') {
        out.extend_from_slice(line);
        if line.starts_with(b"HTTP/") {
            out.extend_from_slice(b"Connection: close\r\n");
        }
    }
    out
}

/// A 502's wording names the client's error, which differs between the two clients.
fn without_502_details(outcome: String) -> String {
    outcome
        .lines()
        .map(|line| {
            if line.starts_with("502 ") {
                "502"
            } else {
                line
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_own_client_and_hyper_s_read_every_generated_response_alike() {
    let script: Script = Arc::default();
    let upstream = scripted_upstream(script.clone()).await;
    let gateway = start_gateway_on("hyper", POLICY, upstream).await;
    let address = gateway.addresses[0];
    let mut number = 0;
    let numbered = |generator: &mut Generator| {
        number += 1;
        let case = generate(generator);
        script.lock().unwrap().insert(number, case.response.clone());
        (number, case)
    };
    compare(cases_to_run(), numbered, |(number, case): (usize, Case)| async move {
        let methods = [case.method.to_owned()];
        let bodyless = format!(
            "{} /case/{number} HTTP/1.1\r\nHost: example.test\r\n\r\n",
            case.method
        );
        let streamed = format!(
            "{} /case/{number} HTTP/1.1\r\nHost: example.test\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            case.method
        );
        let (own, hyper) = tokio::join!(
            exchange(address, bodyless.as_bytes(), &methods),
            exchange(address, streamed.as_bytes(), &methods)
        );
        (
            format!("{} {:?}", case.method, String::from_utf8_lossy(&case.response)),
            without_502_details(own),
            without_502_details(hyper),
        )
    })
    .await;
}
