//! Differential testing of two HTTP/1.1 implementations behind one gateway: a seeded
//! generator, a client that reads responses whatever their framing, and a runner that compares
//! the two sides' outcomes case by case.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use futures_util::stream::{self, StreamExt};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One route for everything, under a limit no case reaches. The upstream's timeout stays at its
/// default (30 s), far from the 5 s after which a case counts as stalled.
pub const POLICY: &str = r#"
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

/// The number of cases and the seed: `TOLLGATE_DIFFERENTIAL_CASES` (default 2,000) and
/// `TOLLGATE_DIFFERENTIAL_SEED`.
pub fn cases_to_run() -> (usize, u64) {
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

/// A small, seeded generator (xorshift64*): the same seed gives the same cases everywhere.
pub struct Generator(u64);

impl Generator {
    /// A generator whose cases follow from `seed`.
    pub fn seeded(seed: u64) -> Generator {
        Generator(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    pub fn below(&mut self, bound: usize) -> usize {
        (self.next() % bound as u64) as usize
    }

    pub fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    pub fn pick<'a>(&mut self, items: &[&'a str]) -> &'a str {
        items[self.below(items.len())]
    }

    /// From the first `valid` items (the valid ones) in a plain case, from all in a hostile one.
    pub fn pick_for<'a>(&mut self, hostile: bool, (items, valid): (&[&'a str], usize)) -> &'a str {
        self.pick(if hostile { items } else { &items[..valid] })
    }
}

/// The probe sent once every request of a case is answered: answered too, the connection was
/// left open; closed, it was not. Both upstreams' answers to it name it.
pub const PROBE: &[u8] = b"GET /probe HTTP/1.1\r\nHost: example.test\r\n\r\n";

/// Sends `bytes` (requests with `methods`) on a new connection and reads until the gateway
/// closes it, or until every request and then the probe are answered (the connection stayed
/// open), or until 5 s pass (the gateway waits for more of the request: "stalled"). Gives
/// what the client received as comparable text.
pub async fn exchange(gateway: SocketAddr, bytes: &[u8], methods: &[String]) -> String {
    let mut stream = TcpStream::connect(gateway).await.unwrap();
    let _ = stream.write_all(bytes).await;
    let mut methods = methods.to_vec();
    let mut received = Vec::new();
    let mut probed = false;
    let read = tokio::time::timeout(Duration::from_secs(5), async {
        let mut buffer = [0u8; 16384];
        loop {
            match stream.read(&mut buffer).await {
                Ok(0) | Err(_) => return "closed",
                Ok(count) => received.extend_from_slice(&buffer[..count]),
            }
            let seen = responses(&received, &methods);
            let mut answers = seen
                .iter()
                .filter(|response| response.complete && !response.interim);
            if probed {
                // The gateway may answer more than was asked (bytes it took for a request of
                // their own): only the probe's answer shows the connection open.
                if answers.any(|response| response.text.contains("probe")) {
                    return "open";
                }
            } else if answers.count() >= methods.len() {
                probed = true;
                methods.push("GET".to_owned());
                let _ = stream.write_all(PROBE).await;
            }
        }
    });
    let end = read.await.unwrap_or("stalled");
    let mut responses = responses(&received, &methods);
    // A response the connection's end cut off counts as none: whether its head reached the
    // client before the gateway gave up on the broken body depends on when it was flushed.
    while responses.last().is_some_and(|response| !response.complete) {
        responses.pop();
    }
    let mut out: String = responses
        .iter()
        .map(|response| response.text.clone() + "\n")
        .collect();
    out.push_str(end);
    out
}

/// One response as comparable text: its status, its fields (names lowercased, sorted; minus
/// the date, framing and request id) and its decoded body.
pub struct Response {
    pub text: String,
    pub complete: bool,
    pub interim: bool,
}

pub fn responses(mut bytes: &[u8], methods: &[String]) -> Vec<Response> {
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

/// Runs every generated case through `run`, 32 at a time, which gives the two outcomes to
/// compare; prints the outcomes' counts and panics with the first disagreements. Cases are
/// made as they are sent and only counts and disagreements kept: a million take little memory.
pub async fn compare<C, F, Fut>(
    (count, seed): (usize, u64),
    mut generate: impl FnMut(&mut Generator) -> C,
    run: F,
) where
    F: Fn(C) -> Fut,
    Fut: std::future::Future<Output = (String, String, String)>,
{
    let mut generator = Generator::seeded(seed);
    let cases = stream::iter((0..count).map(move |index| (index, generate(&mut generator))));
    let mut outcomes = cases
        .map(|(index, case)| {
            let outcome = run(case);
            async move { (index, outcome.await) }
        })
        .buffer_unordered(32);
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    let mut disagreements = Vec::new();
    while let Some((index, (case, one, other))) = outcomes.next().await {
        let summary: Vec<&str> = one
            .lines()
            .map(|line| line.split(' ').next().unwrap_or(""))
            .collect();
        *counts.entry(summary.join("+")).or_default() += 1;
        if one != other {
            disagreements.push(format!(
                "case {index}: {case}\n  one:   {one}\n  other: {other}"
            ));
        }
    }
    eprintln!("{count} cases (seed {seed:#x}); the outcomes: {counts:?}");
    assert!(
        disagreements.is_empty(),
        "{} of {count} cases disagree; the first:\n{}",
        disagreements.len(),
        disagreements[..disagreements.len().min(5)].join("\n")
    );
    assert!(
        counts.len() > 5,
        "the generator reaches few outcomes: {counts:?}"
    );
}
