//! The two HTTP/1.1 server paths held to one behaviour on generated input: a seeded generator
//! of valid and near-valid request heads (methods, targets, versions, Host, Content-Length and
//! Transfer-Encoding combinations, obs-fold, bare LF and CR, NUL, long lines, pipelining) is
//! sent to a gateway with `[server] http1 = "fast"` and to one with `"hyper"`; what each client
//! receives, and so what the upstream saw (the test upstream answers with its view of the
//! request), must agree, up to the date and the request id.
//!
//! `TOLLGATE_DIFFERENTIAL_CASES` (default 2,000) and `TOLLGATE_DIFFERENTIAL_SEED` set the run;
//! `bench/fuzz.sh` runs a million.
#![allow(clippy::disallowed_methods)] // tests measure real time

mod common;

use common::differential::{cases_to_run, compare, exchange, Generator, POLICY};
use common::*;

// Each list starts with its valid entries; the number says how many.
const METHODS: (&[&str], usize) = (
    &[
        "GET", "GET", "GET", "POST", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE",
        "get", "G ET", "", "CONNECT", "M\0",
    ],
    11,
);
const TARGETS: (&[&str], usize) = (
    &[
        "/",
        "/echo?x=1",
        "/a/../b",
        "/%2e%2e/c",
        "/%2F/d",
        "//double//slash",
        "/login;jsessionid=1",
        "http://example.test/absolute",
        "/q?a=%zz&b",
        "*",
        "http://user:pw@example.test/",
        "http://example.test:99999/",
        "/sp ace",
        "/tab\there",
        "/\u{fc}ml\u{e4}ut",
        "/#fragment",
        "relative",
        "",
    ],
    9,
);
const VERSIONS: (&[&str], usize) = (
    &[
        "HTTP/1.1",
        "HTTP/1.1",
        "HTTP/1.1",
        "HTTP/1.1",
        "HTTP/1.0",
        "HTTP/1.2",
        "HTTP/2.0",
        "http/1.1",
        "HTTP/1.1 ",
        "HTTP/11",
        "HTTP/1.1\t",
    ],
    5,
);
const HOSTS: (&[&str], usize) = (
    &[
        "Host: example.test",
        "Host: example.test",
        "host: EXAMPLE.test:8080",
        "Host:\texample.test\t",
        "Host: example.test\r\nHost: other.test",
        "Host: example.test\r\nHost: example.test",
        "Host:",
        "Host : example.test",
        "Host: exa mple",
        "Host: example.test:abc",
    ],
    4,
);
const LENGTHS: (&[&str], usize) = (
    &[
        "Content-Length: 5",
        "Content-Length: 5",
        "Content-Length: 0",
        "Content-Length: 3",
        "Content-Length: 5\r\nContent-Length: 5",
        "Content-Length: 5, 5",
        "Content-Length: 5\r\nContent-Length: 6",
        "Content-Length: +5",
        "Content-Length: -1",
        "Content-Length: 0x5",
        "Content-Length: 99999999999999999999",
        "Content-Length:  5 ",
        "Content_Length: 3",
    ],
    4,
);
const ENCODINGS: (&[&str], usize) = (
    &[
        "Transfer-Encoding: chunked",
        "Transfer-Encoding: Chunked",
        "Transfer-Encoding: gzip, chunked",
        "Transfer-Encoding: chunked, gzip",
        "Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked",
        "Transfer-Encoding: identity",
        "Transfer-Encoding:\tchunked",
        "Transfer-Encoding: chunked ",
        "Transfer_Encoding: chunked",
    ],
    2,
);
const CHUNKED_BODIES: (&[&str], usize) = (
    &[
        "5\r\nhello\r\n0\r\n\r\n",
        "5;name=value\r\nhello\r\n0\r\n\r\n",
        "0\r\nTrailer-Field: x\r\n\r\n",
        "2\r\nhe\r\n3\r\nllo\r\n0\r\n\r\n",
        "zz\r\nhello\r\n0\r\n\r\n",
        "5\r\nhelloXX\r\n0\r\n\r\n",
        "5\nhello\n0\n\n",
        "FFFFFFFFFFFFFFFFFFFF\r\nhello\r\n0\r\n\r\n",
        "-5\r\nhello\r\n0\r\n\r\n",
        "5\r\nhello\r\n",
    ],
    4,
);
const OTHERS: (&[&str], usize) = (
    &[
        "X-Ok: fine",
        "X-Ok: fine",
        "Connection: close",
        "Connection: keep-alive",
        "Connection: x-hop\r\nX-Hop: dropped",
        "X-Forwarded-For: 198.51.100.7",
        "Cookie: a=1\r\nCookie: b=2",
        "X-Empty:",
        "X-Fold: first\r\n second",
        "X-Nul: a\0b",
        "X-Cr: a\rb",
        "X Space: y",
        ": no-name",
        "Expect: 100-continue",
        "Upgrade: h2c\r\nConnection: Upgrade, HTTP2-Settings\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA",
        "X-Unicode: caf\u{e9}",
        "\tleading-whitespace: x",
        "X-Bare-Lf: yes\nX-After: yes",
    ],
    8,
);

/// One generated case: its bytes and the methods of the requests in it (to frame replies).
struct Case {
    bytes: Vec<u8>,
    methods: Vec<String>,
}

fn generate(generator: &mut Generator) -> Case {
    // Half the cases are valid requests; the other half may go wrong anywhere.
    let hostile = generator.chance(50);
    let method = generator.pick_for(hostile, METHODS);
    let target = if generator.chance(3) {
        format!("/{}", "a".repeat(3000 + generator.below(6000)))
    } else {
        generator.pick_for(hostile, TARGETS).to_owned()
    };
    let version = generator.pick_for(hostile, VERSIONS);
    let end = if hostile && generator.chance(5) {
        "\n"
    } else {
        "\r\n"
    };
    let mut head = format!("{method} {target} {version}{end}");
    let mut fields: Vec<String> = Vec::new();
    if !hostile || generator.chance(85) {
        fields.push(generator.pick_for(hostile, HOSTS).to_owned());
    }
    let length = generator
        .chance(30)
        .then(|| generator.pick_for(hostile, LENGTHS));
    let encoding = (hostile || length.is_none())
        .then(|| {
            generator
                .chance(25)
                .then(|| generator.pick_for(hostile, ENCODINGS))
        })
        .flatten();
    fields.extend(length.map(str::to_owned));
    fields.extend(encoding.map(str::to_owned));
    for _ in 0..generator.below(4) {
        fields.push(generator.pick_for(hostile, OTHERS).to_owned());
    }
    if generator.chance(3) {
        fields.push(format!(
            "X-Long: {}",
            "x".repeat(4000 + generator.below(12000))
        ));
    }
    // Shuffled, so that framing fields come in every order.
    for index in (1..fields.len()).rev() {
        fields.swap(index, generator.below(index + 1));
    }
    for field in &fields {
        head.push_str(field);
        head.push_str(if hostile && generator.chance(4) {
            "\n"
        } else {
            "\r\n"
        });
    }
    head.push_str(end);
    let mut bytes = head.into_bytes();
    match (encoding, length) {
        (Some(_), _) => {
            bytes.extend_from_slice(generator.pick_for(hostile, CHUNKED_BODIES).as_bytes())
        }
        (None, Some(length)) => {
            let length: usize = length.rsplit(' ').next().unwrap().parse().unwrap_or(5);
            bytes.extend_from_slice(&b"hello"[..length.min(5)])
        }
        (None, None) if hostile && generator.chance(10) => bytes.extend_from_slice(b"stray"),
        _ => {}
    }
    let mut methods = vec![method.to_owned()];
    if generator.chance(30) {
        bytes.extend_from_slice(b"GET /second HTTP/1.1\r\nHost: example.test\r\n\r\n");
        methods.push("GET".to_owned());
    }
    Case { bytes, methods }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fast_path_and_hyper_answer_every_generated_request_alike() {
    let upstream = start_upstream().await;
    let fast = start_gateway_on("fast", POLICY, upstream.address).await;
    let hyper = start_gateway_on("hyper", POLICY, upstream.address).await;
    let (fast_address, hyper_address) = (fast.addresses[0], hyper.addresses[0]);
    compare(cases_to_run(), generate, |case: Case| async move {
        let (fast, hyper) = tokio::join!(
            exchange(fast_address, &case.bytes, &case.methods),
            exchange(hyper_address, &case.bytes, &case.methods)
        );
        (
            format!("{:?}", String::from_utf8_lossy(&case.bytes)),
            fast,
            hyper,
        )
    })
    .await;
}
