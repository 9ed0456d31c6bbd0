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

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use futures_util::stream::{self, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const POLICY: &str = r#"
[server]
listen = ["127.0.0.1:0"]

[upstreams.app]
url = "http://{upstream}"

[limits.per_network]
key = "client_network"
capacity = 1000000000
rate = "1000000/s"

[[routes]]
name = "all"
path_prefix = "/"
upstream = "app"
limits = ["per_network"]
"#;

/// A small, seeded generator (xorshift64*): the same seed gives the same cases everywhere.
struct Generator(u64);

impl Generator {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn below(&mut self, bound: usize) -> usize {
        (self.next() % bound as u64) as usize
    }

    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }

    /// From the first `valid` items (the valid ones) in a plain case, from all in a hostile one.
    fn pick_for<'a>(&mut self, hostile: bool, (items, valid): (&[&'a str], usize)) -> &'a str {
        self.pick(if hostile { items } else { &items[..valid] })
    }
}

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

/// The probe sent once every request of a case is answered: answered too, the connection was
/// left open; closed, it was not.
const PROBE: &[u8] = b"GET /probe HTTP/1.1\r\nHost: example.test\r\n\r\n";

/// Sends a case on a new connection and reads until the gateway closes it, or until every
/// request and then the probe are answered (the connection stayed open), or until 5 s pass
/// (the gateway waits for more of the request: "stalled", alike on both paths).
async fn exchange(gateway: SocketAddr, case: &Case) -> String {
    let mut stream = TcpStream::connect(gateway).await.unwrap();
    let _ = stream.write_all(&case.bytes).await;
    let mut methods = case.methods.clone();
    let mut received = Vec::new();
    let mut probed = false;
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        let mut buffer = [0u8; 16384];
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return "closed",
                Ok(count) => received.extend_from_slice(&buffer[..count]),
            }
            let answered = responses(&received, &methods)
                .iter()
                .filter(|response| response.complete && !response.interim)
                .count();
            if answered == methods.len() {
                if probed {
                    return "open";
                }
                probed = true;
                methods.push("GET".to_owned());
                let _ = stream.write_all(PROBE).await;
            }
        }
    });
    let end = read.await.unwrap_or("stalled");
    let mut out: String = responses(&received, &methods)
        .iter()
        .map(|response| response.text.clone() + "\n")
        .collect();
    out.push_str(end);
    out
}

/// One response as comparable text: its status, its fields (names lowercased, sorted; minus
/// the date, framing and request id) and its decoded body.
struct Response {
    text: String,
    complete: bool,
    interim: bool,
}

fn responses(mut bytes: &[u8], methods: &[String]) -> Vec<Response> {
    let mut out = Vec::new();
    let mut index = 0;
    while !bytes.is_empty() {
        let Some(end) = bytes.windows(4).position(|window| window == b"\r\n\r\n") else {
            out.push(Response {
                text: format!("unframed: {:?}", String::from_utf8_lossy(bytes)),
                complete: false,
                interim: false,
            });
            break;
        };
        let head = String::from_utf8_lossy(&bytes[..end]).into_owned();
        bytes = &bytes[end + 4..];
        let mut lines = head.split("\r\n");
        let status: u16 = lines
            .next()
            .and_then(|line| line.split(' ').nth(1))
            .and_then(|code| code.parse().ok())
            .unwrap_or(0);
        let mut fields = BTreeMap::new();
        for line in lines {
            let (name, value) = line.split_once(':').unwrap_or((line, ""));
            fields
                .entry(name.trim().to_ascii_lowercase())
                .or_insert_with(Vec::new)
                .push(value.trim().to_owned());
        }
        let interim = (100..200).contains(&status) && status != 101;
        let bodyless = methods.get(index).is_some_and(|method| method == "HEAD")
            || (100..200).contains(&status)
            || status == 204
            || status == 304;
        let chunked = fields
            .get("transfer-encoding")
            .is_some_and(|values| values.iter().any(|value| value.contains("chunked")));
        let length = fields
            .get("content-length")
            .and_then(|values| values[0].parse::<usize>().ok());
        let (body, complete) = if bodyless {
            (Vec::new(), true)
        } else if chunked {
            let (body, rest, complete) = dechunk(bytes);
            bytes = rest;
            (body, complete)
        } else if let Some(length) = length {
            let available = length.min(bytes.len());
            let body = bytes[..available].to_vec();
            bytes = &bytes[available..];
            (body, available == length)
        } else {
            // Delimited by the connection's end.
            (std::mem::take(&mut bytes).to_vec(), false)
        };
        // Cases run at once and share one bucket: what remains in it depends on their order.
        for unordered in [
            "date",
            "content-length",
            "transfer-encoding",
            "x-request-id",
            "ratelimit-remaining",
        ] {
            fields.remove(unordered);
        }
        let body = without_request_ids(&String::from_utf8_lossy(&body));
        out.push(Response {
            text: format!("{status} {fields:?} {body}"),
            complete,
            interim,
        });
        if !interim {
            index += 1;
        }
    }
    out
}

/// A chunked body: its data, the bytes after it, and whether it was whole.
fn dechunk(mut bytes: &[u8]) -> (Vec<u8>, &[u8], bool) {
    let line_end = |bytes: &[u8]| bytes.windows(2).position(|window| window == b"\r\n");
    let mut body = Vec::new();
    loop {
        let Some(end) = line_end(bytes) else {
            return (body, &[], false);
        };
        let size = std::str::from_utf8(&bytes[..end])
            .ok()
            .and_then(|line| usize::from_str_radix(line.split(';').next()?.trim(), 16).ok())
            .unwrap_or(0);
        bytes = &bytes[end + 2..];
        if size == 0 {
            // Trailer fields, then an empty line.
            loop {
                let Some(end) = line_end(bytes) else {
                    return (body, &[], false);
                };
                bytes = &bytes[end + 2..];
                if end == 0 {
                    return (body, bytes, true);
                }
            }
        }
        if bytes.len() < size + 2 {
            body.extend_from_slice(&bytes[..size.min(bytes.len())]);
            return (body, &[], false);
        }
        body.extend_from_slice(&bytes[..size]);
        bytes = &bytes[size + 2..];
    }
}

/// The upstream's view names the request id the gateway gave; each gateway gives its own.
fn without_request_ids(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("x-request-id") {
        let (before, after) = rest.split_at(at + "x-request-id".len());
        out.push_str(before);
        let value_start = after
            .find(|c: char| c.is_ascii_alphanumeric())
            .unwrap_or(after.len());
        out.push_str(&after[..value_start]);
        let value = &after[value_start..];
        let value_end = value
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
            .unwrap_or(value.len());
        out.push('*');
        rest = &value[value_end..];
    }
    out.push_str(rest);
    out
}

fn cases_to_run() -> (usize, u64) {
    let number = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|value| value.parse().ok())
            .unwrap_or(default)
    };
    (
        number("TOLLGATE_DIFFERENTIAL_CASES", 2000) as usize,
        number("TOLLGATE_DIFFERENTIAL_SEED", 0x7011_6a7e),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fast_path_and_hyper_answer_every_generated_request_alike() {
    let upstream = start_upstream().await;
    let fast = start_gateway_on("fast", POLICY, upstream.address).await;
    let hyper = start_gateway_on("hyper", POLICY, upstream.address).await;
    let (fast_address, hyper_address) = (fast.addresses[0], hyper.addresses[0]);
    let (count, seed) = cases_to_run();
    let mut generator = Generator(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    // Generated as they are sent, and only the counts and disagreements kept: a million
    // cases (bench/fuzz.sh) take little memory.
    let cases = stream::iter((0..count).map(move |index| (index, generate(&mut generator))));
    let mut outcomes = cases
        .map(|(index, case)| async move {
            let (fast, hyper) = tokio::join!(
                exchange(fast_address, &case),
                exchange(hyper_address, &case)
            );
            (index, case, fast, hyper)
        })
        .buffer_unordered(32);
    let mut statuses: BTreeMap<String, usize> = BTreeMap::new();
    let mut disagreements = Vec::new();
    while let Some((index, case, fast, hyper)) = outcomes.next().await {
        let summary: Vec<&str> = fast
            .lines()
            .map(|line| line.split(' ').next().unwrap_or(""))
            .collect();
        *statuses.entry(summary.join("+")).or_default() += 1;
        if fast != hyper {
            disagreements.push(format!(
                "case {index}: {:?}\n  fast:  {fast}\n  hyper: {hyper}",
                String::from_utf8_lossy(&case.bytes)
            ));
        }
    }
    eprintln!("{count} cases (seed {seed:#x}); the responses by status: {statuses:?}");
    assert!(
        disagreements.is_empty(),
        "{} of {count} cases disagree; the first:\n{}",
        disagreements.len(),
        disagreements[..disagreements.len().min(5)].join("\n")
    );
    assert!(
        statuses.len() > 5,
        "the generator reaches few outcomes: {statuses:?}"
    );
}
