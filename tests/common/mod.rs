//! Helpers for end-to-end tests: a test upstream, a gateway on ephemeral ports, clients.
#![allow(dead_code, unreachable_pub)]
#![allow(clippy::disallowed_methods)] // tests measure real time

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tollgate::config::Policy;
use tollgate::limit::Clock;
use tollgate::{Options, Tollgate};

pub mod bans;
pub mod differential;
pub mod llm;
pub mod logged;
pub mod pki;
pub mod quic;
pub mod redis_server;
pub mod tokens;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type TestBody = http_body_util::combinators::BoxBody<Bytes, BoxError>;

/// A test upstream. Paths:
/// - `/slow`: answers after 5 s;
/// - `/held-body`: sends its head and a first piece of body at once, the rest after 10 s;
/// - `/echo-body`: streams the request body back;
/// - `/ws`: switches protocols and echoes bytes; `/ws-wrong-proof` too, with a wrong
///   `Sec-WebSocket-Accept`;
/// - `/auth`: 401 when the body contains "wrong", else 200;
/// - `/missing/...`: 404;
/// - `/delayed`: answers after `delay_ms`;
/// - anything else: 200 with a JSON description of the request it received.
pub struct Upstream {
    pub address: SocketAddr,
    pub hits: Arc<AtomicUsize>,
    pub delay_ms: Arc<AtomicU64>,
}

pub async fn start_upstream() -> Upstream {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind upstream");
    let address = listener.local_addr().expect("upstream address");
    let hits = Arc::new(AtomicUsize::new(0));
    let delay_ms = Arc::new(AtomicU64::new(0));
    let (counter, delay) = (hits.clone(), delay_ms.clone());
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let (counter, delay) = (counter.clone(), delay.clone());
            tokio::spawn(async move {
                let service = service_fn(move |request: Request<Incoming>| {
                    counter.fetch_add(1, Ordering::SeqCst);
                    let delay = Duration::from_millis(delay.load(Ordering::SeqCst));
                    async move {
                        Ok::<_, std::convert::Infallible>(upstream_answer(request, delay).await)
                    }
                });
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection_with_upgrades(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Upstream {
        address,
        hits,
        delay_ms,
    }
}

async fn upstream_answer(mut request: Request<Incoming>, delay: Duration) -> Response<TestBody> {
    if request.uri().path().starts_with("/missing/") {
        return text(StatusCode::NOT_FOUND, "no such page");
    }
    match request.uri().path() {
        "/auth" => {
            let body = request
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            if String::from_utf8_lossy(&body).contains("wrong") {
                text(StatusCode::UNAUTHORIZED, "wrong password")
            } else {
                text(StatusCode::OK, "welcome")
            }
        }
        "/delayed" => {
            tokio::time::sleep(delay).await;
            text(StatusCode::OK, "eventually")
        }
        "/held-body" => {
            // The head and a first piece at once; the rest of the body is held for 10 s.
            let (sender, receiver) =
                tokio::sync::mpsc::channel::<Result<Frame<Bytes>, BoxError>>(1);
            tokio::spawn(async move {
                let _ = sender.send(Ok(Frame::data(Bytes::from("first ")))).await;
                tokio::time::sleep(Duration::from_secs(10)).await;
                let _ = sender.send(Ok(Frame::data(Bytes::from("last")))).await;
            });
            let body = StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(receiver));
            Response::new(BodyExt::boxed(body))
        }
        "/slow" => {
            tokio::time::sleep(Duration::from_secs(5)).await;
            text(StatusCode::OK, "slow")
        }
        "/echo-body" => {
            let body = request
                .into_body()
                .map_err(|e| -> BoxError { Box::new(e) })
                .boxed();
            Response::new(body)
        }
        "/ws" | "/ws-wrong-proof" => {
            // The proof of the key (RFC 6455 §4.2.2), or a wrong one.
            let accept = match request.headers().get("sec-websocket-key") {
                Some(key) if request.uri().path() == "/ws" => {
                    use base64::Engine as _;
                    let mut sha1 = sha1_smol::Sha1::new();
                    sha1.update(key.as_bytes());
                    sha1.update(b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11");
                    base64::engine::general_purpose::STANDARD.encode(sha1.digest().bytes())
                }
                _ => "AAAAAAAAAAAAAAAAAAAAAAAAAAA=".to_owned(),
            };
            let upgrade = hyper::upgrade::on(&mut request);
            tokio::spawn(async move {
                if let Ok(upgraded) = upgrade.await {
                    let mut io = TokioIo::new(upgraded);
                    let mut buffer = [0u8; 1024];
                    while let Ok(read) = io.read(&mut buffer).await {
                        if read == 0 || io.write_all(&buffer[..read]).await.is_err() {
                            break;
                        }
                    }
                }
            });
            let mut response = Response::new(empty());
            *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
            response
                .headers_mut()
                .insert("upgrade", "websocket".parse().unwrap());
            response
                .headers_mut()
                .insert("connection", "upgrade".parse().unwrap());
            response
                .headers_mut()
                .insert("sec-websocket-accept", accept.parse().unwrap());
            response
        }
        _ => {
            let (parts, body) = request.into_parts();
            let body = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            // A field that arrived more than once shows as its values joined by ", ".
            let mut headers = serde_json::Map::new();
            for name in parts.headers.keys() {
                let values: Vec<&str> = parts
                    .headers
                    .get_all(name)
                    .iter()
                    .map(|value| value.to_str().unwrap_or(""))
                    .collect();
                headers.insert(name.to_string(), values.join(", ").into());
            }
            let description = serde_json::json!({
                "method": parts.method.as_str(),
                "uri": parts.uri.to_string(),
                "headers": headers,
                "body": String::from_utf8_lossy(&body),
            });
            let mut response = text(StatusCode::OK, &description.to_string());
            response
                .headers_mut()
                .insert("connection", "x-upstream-hop".parse().unwrap());
            response
                .headers_mut()
                .insert("x-upstream-hop", "secret".parse().unwrap());
            response
        }
    }
}

fn empty() -> TestBody {
    Full::new(Bytes::new())
        .map_err(|never| match never {})
        .boxed()
}

fn text(status: StatusCode, body: &str) -> Response<TestBody> {
    let mut response = Response::new(
        Full::new(Bytes::from(body.to_owned()))
            .map_err(|never| match never {})
            .boxed(),
    );
    *response.status_mut() = status;
    response
}

/// Replaces `{upstream}` in `policy` and starts a gateway on ephemeral ports.
pub async fn start_gateway(policy: &str, upstream: SocketAddr) -> Tollgate {
    start_gateway_with_clock(policy, upstream, None).await
}

pub async fn start_gateway_with_clock(
    policy: &str,
    upstream: SocketAddr,
    clock: Option<Clock>,
) -> Tollgate {
    start_gateway_with_clock_on("fast", policy, upstream, clock).await
}

/// As [`start_gateway`], with `[server] http1` set to `http1` ("fast" or "hyper").
pub async fn start_gateway_on(http1: &str, policy: &str, upstream: SocketAddr) -> Tollgate {
    start_gateway_with_clock_on(http1, policy, upstream, None).await
}

pub async fn start_gateway_with_clock_on(
    http1: &str,
    policy: &str,
    upstream: SocketAddr,
    clock: Option<Clock>,
) -> Tollgate {
    let policy = compile_on(http1, policy, upstream);
    Tollgate::start(
        policy,
        Options {
            clock,
            config_path: None,
        },
    )
    .await
    .expect("start gateway")
}

pub fn compile(policy: &str, upstream: SocketAddr) -> Policy {
    compile_on("fast", policy, upstream)
}

/// Compiles `policy` with `{upstream}` replaced, listeners on ephemeral loopback ports (unless
/// it has its own `[server]`) and `[server] http1 = "<http1>"`.
pub fn compile_on(http1: &str, policy: &str, upstream: SocketAddr) -> Policy {
    let mut policy = policy.replace("{upstream}", &upstream.to_string());
    // The admin listener goes on an ephemeral port: into the policy's own [admin], or a new one.
    let admin = if policy.contains("[admin]\n") {
        policy = policy.replacen("[admin]\n", "[admin]\nlisten = \"127.0.0.1:0\"\n", 1);
        ""
    } else {
        "[admin]\nlisten = \"127.0.0.1:0\"\n"
    };
    let setting = format!("http1 = \"{http1}\"\n");
    let text = if policy.contains("[server]\n") {
        // The policy brings its own [server]; only the http1 setting is added.
        format!(
            "{admin}{}",
            policy.replacen("[server]\n", &format!("[server]\n{setting}"), 1)
        )
    } else {
        format!("[server]\nlisten = [\"127.0.0.1:0\"]\n{setting}{admin}{policy}")
    };
    Policy::parse("test policy", &text).unwrap_or_else(|errors| panic!("{errors}"))
}

/// A response read whole.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|_| panic!("not JSON: {:?}", self.body))
    }
}

#[derive(Clone)]
pub struct HttpClient {
    client: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    base: String,
}

impl HttpClient {
    pub fn new(address: SocketAddr) -> HttpClient {
        HttpClient {
            client: Client::builder(TokioExecutor::new()).build_http(),
            base: format!("http://{address}"),
        }
    }

    /// An HTTP/2 client with prior knowledge (h2c).
    pub fn h2c(address: SocketAddr) -> HttpClient {
        HttpClient {
            client: Client::builder(TokioExecutor::new())
                .http2_only(true)
                .build_http(),
            base: format!("http://{address}"),
        }
    }

    pub async fn get(&self, path: &str, headers: &[(&str, &str)]) -> Reply {
        self.send("GET", path, headers, Bytes::new()).await
    }

    pub async fn post(&self, path: &str, headers: &[(&str, &str)], body: &str) -> Reply {
        self.send("POST", path, headers, Bytes::from(body.to_owned()))
            .await
    }

    pub async fn send(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Bytes,
    ) -> Reply {
        let mut request = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request.body(Full::new(body)).expect("request");
        let response = self.client.request(request).await.expect("response");
        let (parts, body) = response.into_parts();
        let body = body.collect().await.expect("body").to_bytes();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    /// Sends a body of `chunks` streamed one by one and returns the response.
    pub async fn post_stream(&self, path: &str, chunks: Vec<Bytes>) -> Reply {
        let stream = futures_stream(chunks);
        let client: Client<_, StreamBody<_>> = Client::builder(TokioExecutor::new()).build_http();
        let request = Request::post(format!("{}{path}", self.base))
            .body(StreamBody::new(stream))
            .expect("request");
        let response = client.request(request).await.expect("response");
        let (parts, body) = response.into_parts();
        Reply {
            status: parts.status,
            headers: parts.headers,
            body: body.collect().await.expect("body").to_bytes(),
        }
    }
}

fn futures_stream(
    chunks: Vec<Bytes>,
) -> impl futures_core::Stream<Item = Result<Frame<Bytes>, std::io::Error>> + Send + 'static {
    let (sender, receiver) = tokio::sync::mpsc::channel(2);
    tokio::spawn(async move {
        for chunk in chunks {
            if sender.send(Ok(Frame::data(chunk))).await.is_err() {
                break;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(receiver)
}

/// Writes raw bytes on a new connection and reads until the server closes it (or 10 s).
pub async fn raw(address: SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(address).await.expect("connect");
    stream.write_all(request).await.expect("write");
    let mut response = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut response)).await;
    String::from_utf8_lossy(&response).into_owned()
}

/// Writes raw bytes on a new connection and reads the response head only.
pub async fn raw_head(address: SocketAddr, request: &[u8]) -> (String, TcpStream) {
    let mut stream = TcpStream::connect(address).await.expect("connect");
    stream.write_all(request).await.expect("write");
    (read_head(&mut stream).await, stream)
}

/// Reads a response head, byte by byte so that nothing after it is consumed.
pub async fn read_head(stream: &mut TcpStream) -> String {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        tokio::time::timeout(Duration::from_secs(10), stream.read_exact(&mut byte))
            .await
            .expect("response head within 10 s")
            .expect("read");
        head.push(byte[0]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// One response read off a keep-alive connection.
pub struct RawResponse {
    pub head: String,
    pub body: Vec<u8>,
}

impl RawResponse {
    pub fn status(&self) -> u16 {
        raw_status(&self.head)
    }

    pub fn header(&self, name: &str) -> Option<String> {
        self.head.lines().find_map(|line| {
            let (field, value) = line.split_once(':')?;
            field
                .eq_ignore_ascii_case(name)
                .then(|| value.trim().to_owned())
        })
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Reads one response, framed by Content-Length or chunked (no body after a HEAD).
pub async fn read_response(stream: &mut TcpStream, head_request: bool) -> RawResponse {
    let mut response = RawResponse {
        head: read_head(stream).await,
        body: Vec::new(),
    };
    if head_request {
        return response;
    }
    if let Some(length) = response.header("content-length") {
        response.body = vec![0; length.parse().expect("a numeric length")];
        stream.read_exact(&mut response.body).await.expect("body");
        return response;
    }
    assert_eq!(
        response.header("transfer-encoding").as_deref(),
        Some("chunked"),
        "{}",
        response.head
    );
    let mut byte = [0u8; 1];
    loop {
        let mut line = Vec::new();
        while !line.ends_with(b"\r\n") {
            stream.read_exact(&mut byte).await.expect("chunk size");
            line.push(byte[0]);
        }
        let size = usize::from_str_radix(std::str::from_utf8(&line).unwrap().trim(), 16)
            .expect("a hexadecimal chunk size");
        let mut chunk = vec![0; size + 2];
        stream.read_exact(&mut chunk).await.expect("chunk");
        if size == 0 {
            return response;
        }
        response.body.extend_from_slice(&chunk[..size]);
    }
}

/// What the peer sent before closing the connection, or `None` if it is still open after 10 s.
pub async fn rest_until_closed(stream: &mut TcpStream) -> Option<Vec<u8>> {
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut rest))
        .await
        .ok()
        .map(|_| rest)
}

/// The status code of a raw HTTP/1.1 response.
pub fn raw_status(response: &str) -> u16 {
    response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {response:?}"))
}

/// Asserts the value of each series in a metrics scrape.
pub fn assert_metrics(scrape: &str, expected: &[(&str, f64)]) {
    for (series, value) in expected {
        assert_eq!(metric(scrape, series), *value, "{series}");
    }
}

/// The value of one sample in a metrics scrape, e.g. `tollgate_requests_total{outcome="limited",route="login"}`.
pub fn metric(scrape: &str, series: &str) -> f64 {
    scrape
        .lines()
        .find_map(|line| {
            line.strip_prefix(series)
                .and_then(|rest| rest.trim().parse().ok())
        })
        .unwrap_or_else(|| panic!("no series {series} in:\n{scrape}"))
}

/// Polls `done` every 10 ms for up to 20 s.
pub async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(std::time::Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A `tollgate` process of its own (a replica that a test can SIGKILL), killed however the
/// test ends.
pub struct Replica {
    pub process: std::process::Child,
    /// Its public listener.
    pub address: SocketAddr,
    _config: tempfile::TempDir,
}

impl Replica {
    /// Runs `policy` (complete but for `[server] listen` and `[admin]`, which get free
    /// ports) in a process of its own, once it listens.
    pub async fn start(policy: &str) -> Replica {
        let free = || {
            std::net::TcpListener::bind("127.0.0.1:0")
                .and_then(|listener| listener.local_addr())
                .expect("a free port")
                .port()
        };
        let (listen, admin) = (free(), free());
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tollgate.toml");
        let listeners = format!(
            "[server]\nlisten = [\"127.0.0.1:{listen}\"]\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n"
        );
        std::fs::write(&file, format!("{listeners}{policy}")).unwrap();
        let process = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["run", "--config", file.to_str().unwrap()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("tollgate");
        let replica = Replica {
            process,
            address: SocketAddr::from(([127, 0, 0, 1], listen)),
            _config: dir,
        };
        eventually("the replica listens", || {
            std::net::TcpStream::connect(replica.address).is_ok()
        })
        .await;
        replica
    }

    /// SIGKILL: it gives nothing back.
    pub fn kill(&mut self) {
        self.process.kill().unwrap();
        self.process.wait().unwrap();
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// The crate's own directory, where fixtures and the README are.
pub fn crate_root() -> &'static std::path::Path {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The Chromium binary on PATH (scripts/test.sh installs Debian's `chromium` when missing).
pub fn chromium_binary() -> &'static str {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|name| {
            std::process::Command::new(name)
                .arg("--version")
                .output()
                .is_ok_and(|output| output.status.success())
        })
        .expect("no Chromium: scripts/test.sh installs it (apt-get install chromium)")
}

/// The Python with the tests' PyPI packages (openai, mmdb-writer, ja4plus):
/// `TOLLGATE_TEST_PYTHON`, or the virtual environment scripts/test.sh makes.
pub fn test_python() -> std::path::PathBuf {
    std::env::var_os("TOLLGATE_TEST_PYTHON")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| crate_root().join("target/test-python/bin/python"))
}

/// A self-signed certificate for `localhost` and 127.0.0.1, written as `NAME.pem` and
/// `NAME.key` into `dir`.
pub struct Certificate {
    pub der: rustls::pki_types::CertificateDer<'static>,
    pub cert: std::path::PathBuf,
    pub key: std::path::PathBuf,
}

pub fn certificate(dir: &std::path::Path, name: &str) -> Certificate {
    let generated =
        rcgen::generate_simple_self_signed(vec!["localhost".to_owned(), "127.0.0.1".to_owned()])
            .unwrap();
    let cert = dir.join(format!("{name}.pem"));
    let key = dir.join(format!("{name}.key"));
    std::fs::write(&cert, generated.cert.pem()).unwrap();
    std::fs::write(&key, generated.signing_key.serialize_pem()).unwrap();
    Certificate {
        der: generated.cert.der().clone(),
        cert,
        key,
    }
}
