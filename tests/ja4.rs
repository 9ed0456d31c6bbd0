//! `tls_ja4`: the JA4 fingerprint of each TLS connection's ClientHello. Hellos captured from
//! real clients (curl, Python's ssl, Chromium) are fingerprinted by tollgate and by the
//! `ja4plus` package (PyPI) alike; through the gateway, clients with different TLS settings
//! land in different buckets and the same settings share one; a hello cut into many records
//! and TCP segments is fingerprinted and its handshake completes; the decision listener takes
//! the asking proxy's `X-Tollgate-JA4`; an HTTP/3 client's hello, read off its QUIC Initial
//! packets, is fingerprinted as ja4plus reads it, with JA4's `q`.

mod common;

use std::io::Write as _;
use std::net::SocketAddr;
use std::pin::Pin;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use common::*;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tollgate::ja4::{self, Hello};

/// What `ja4plus` makes of a ClientHello message.
fn ja4plus(message: &[u8]) -> String {
    let mut child = Command::new(test_python())
        .arg(crate_root().join("tests/fixtures/ja4plus_fingerprint.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python with ja4plus (scripts/test.sh installs it)");
    let hex: String = message.iter().map(|byte| format!("{byte:02x}")).collect();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(hex.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap().trim().to_owned()
}

/// Runs `client` against a listener that only reads, and returns the ClientHello message it
/// sent (the client then fails, having no answer).
async fn capture_hello(client: impl FnOnce(u16) -> Command) -> Vec<u8> {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let mut child = client(port)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the TLS client");
    let (mut stream, _) = tokio::time::timeout(Duration::from_secs(60), listener.accept())
        .await
        .expect("the client connects")
        .unwrap();
    let mut bytes = Vec::new();
    let message = loop {
        let mut chunk = [0u8; 4096];
        let read = tokio::time::timeout(Duration::from_secs(30), stream.read(&mut chunk))
            .await
            .expect("the hello arrives")
            .unwrap();
        assert!(read > 0, "the client closed before its hello was whole");
        bytes.extend_from_slice(&chunk[..read]);
        match ja4::reassemble(&bytes) {
            Hello::Complete(message) => break message,
            Hello::Partial => continue,
            Hello::Unreadable => panic!("not a ClientHello: {bytes:?}"),
        }
    };
    drop(stream);
    let _ = child.kill();
    let _ = child.wait();
    message
}

fn curl(extra: &'static [&'static str]) -> impl FnOnce(u16) -> Command {
    move |port| {
        let mut command = Command::new("curl");
        command
            .args(["-sk", "--max-time", "20"])
            .args(extra)
            .arg(format!("https://localhost:{port}/"));
        command
    }
}

fn python_ssl(port: u16) -> Command {
    let mut command = Command::new("python3");
    command.arg("-c").arg(format!(
        "import socket, ssl\n\
         context = ssl.create_default_context()\n\
         context.check_hostname = False\n\
         context.verify_mode = ssl.CERT_NONE\n\
         context.set_alpn_protocols(['http/1.1'])\n\
         with socket.create_connection(('127.0.0.1', {port})) as raw:\n\
         \x20   with context.wrap_socket(raw, server_hostname='localhost') as tls:\n\
         \x20       tls.sendall(b'GET / HTTP/1.1\\r\\nHost: localhost\\r\\nConnection: close\\r\\n\\r\\n')\n\
         \x20       print(tls.recv(100).split(b' ')[1].decode())\n"
    ));
    command
}

fn chromium(port: u16) -> Command {
    let binary = chromium_binary();
    let profile = std::env::temp_dir().join(format!("tollgate-ja4-chromium-{port}"));
    let mut command = Command::new(binary);
    command
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--ignore-certificate-errors",
            "--dump-dom",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("https://localhost:{port}/"));
    command
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn real_clients_are_fingerprinted_as_ja4plus_does() {
    let curl_default = capture_hello(curl(&[])).await;
    let curl_tls12 = capture_hello(curl(&["--tls-max", "1.2", "--http1.1"])).await;
    let python = capture_hello(python_ssl).await;
    let browser = capture_hello(chromium).await;
    let mut seen = Vec::new();
    for (client, message) in [
        ("curl", &curl_default),
        ("curl TLS 1.2", &curl_tls12),
        ("python ssl", &python),
        ("chromium", &browser),
    ] {
        let ours = ja4::fingerprint(message).unwrap_or_else(|| panic!("{client}: no fingerprint"));
        assert_eq!(ours, ja4plus(message), "{client}");
        assert_eq!(ours.len(), 36, "{client}: {ours}");
        seen.push(ours);
    }
    assert!(seen[0].starts_with("t13d"), "{seen:?}");
    assert!(seen[1].starts_with("t12d"), "{seen:?}");
    assert!(seen[3].starts_with("t13d"), "{seen:?}");
    seen.sort();
    seen.dedup();
    assert_eq!(seen.len(), 4, "four TLS stacks, four fingerprints");
    // Chromium sends GREASE; a second connection's fingerprint is the same all the same.
    let again = capture_hello(chromium).await;
    assert_eq!(ja4::fingerprint(&again), ja4::fingerprint(&browser));
}

fn tls_policy(certificate: &Certificate) -> String {
    format!(
        r#"
[server]
listen = ["127.0.0.1:0"]
tls = {{ cert = "{}", key = "{}" }}

[upstreams.app]
url = "http://{{upstream}}"

[limits.per_fingerprint]
key = "tls_ja4"
missing = "reject"
capacity = 2
rate = "1/h"

[[routes]]
name = "default"
path_prefix = "/"
upstream = "app"
limits = ["per_fingerprint"]
"#,
        certificate.cert.display(),
        certificate.key.display()
    )
}

/// A status line's code, from a client that prints the response head or the status.
fn status_of(command: &mut Command) -> u16 {
    let output = command.output().unwrap();
    let text = String::from_utf8_lossy(&output.stdout);
    text.trim()
        .parse()
        .unwrap_or_else(|_| panic!("no status: {text:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_same_tls_settings_share_a_bucket_and_others_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = start_upstream().await;
    let gateway = start_gateway(
        &tls_policy(&certificate(dir.path(), "server")),
        upstream.address,
    )
    .await;
    let port = gateway.addresses[0].port();
    let curl_status = |extra: &[&str]| {
        let mut command = Command::new("curl");
        command
            .args([
                "-sk",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
                "--max-time",
                "20",
            ])
            .args(extra)
            .arg(format!("https://localhost:{port}/"));
        tokio::task::block_in_place(|| status_of(&mut command))
    };
    assert_eq!(curl_status(&[]), 200);
    assert_eq!(curl_status(&[]), 200);
    assert_eq!(curl_status(&[]), 429, "curl's third connection, same stack");
    assert_eq!(curl_status(&["--tls-max", "1.2", "--http1.1"]), 200);
    assert_eq!(
        tokio::task::block_in_place(|| status_of(&mut python_ssl(port))),
        200
    );
    // The admin API finds curl's bucket by the fingerprint ja4plus gives its hello.
    let curl_hello = capture_hello(curl(&[])).await;
    let fingerprint = ja4plus(&curl_hello);
    assert_bucket_spent(&gateway, &fingerprint).await;
}

/// The admin API shows `per_fingerprint`'s bucket for `fingerprint` spent.
async fn assert_bucket_spent(gateway: &tollgate::Tollgate, fingerprint: &str) {
    let admin = HttpClient::new(gateway.admin_address);
    let state = admin
        .get(&format!("/limits/per_fingerprint?key={fingerprint}"), &[])
        .await;
    assert_eq!(state.status, 200);
    assert!(
        state.json()["tokens"].as_f64().unwrap() < 0.01,
        "{:?}",
        state.body
    );
}

/// A stream that writes at most `chunk` bytes at a time, each in a TCP segment of its own.
struct Trickle {
    inner: TcpStream,
    chunk: usize,
}

impl AsyncRead for Trickle {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Trickle {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        let end = buf.len().min(this.chunk);
        Pin::new(&mut this.inner).poll_write(cx, &buf[..end])
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// One GET over rustls, its hello cut into records of `fragment` bytes and written
/// `segment` bytes at a time; the response's status.
async fn rustls_get(address: SocketAddr, fragment: Option<usize>, segment: usize) -> u16 {
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .dangerous()
    .with_custom_certificate_verifier(Arc::new(AnyCertificate))
    .with_no_client_auth();
    config.max_fragment_size = fragment;
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = TcpStream::connect(address).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let stream = Trickle {
        inner: tcp,
        chunk: segment,
    };
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = connector.connect(name, stream).await.expect("handshake");
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(connection);
    let request = http::Request::get("/")
        .header("host", "localhost")
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .unwrap();
    sender
        .send_request(request)
        .await
        .unwrap()
        .status()
        .as_u16()
}

#[derive(Debug)]
struct AnyCertificate;

impl rustls::client::danger::ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn verify_tls13_signature(
        &self,
        _: &[u8],
        _: &rustls::pki_types::CertificateDer<'_>,
        _: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        Ok(rustls::client::danger::HandshakeSignatureValid::assertion())
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hello_in_many_records_and_segments_is_fingerprinted_and_served() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = start_upstream().await;
    let gateway = start_gateway(
        &tls_policy(&certificate(dir.path(), "server")),
        upstream.address,
    )
    .await;
    let address = gateway.addresses[0];
    // The same stack, its hello whole, in 64-byte records, and in 7-byte segments: one
    // fingerprint (a missing one would be a 400: `missing = "reject"`).
    assert_eq!(rustls_get(address, None, 1 << 16).await, 200);
    assert_eq!(rustls_get(address, Some(64), 7).await, 200);
    assert_eq!(rustls_get(address, Some(64), 1).await, 429);
    // Bytes that are not TLS get no answer of the gateway's and harm nothing after them.
    let mut plain = TcpStream::connect(address).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut plain, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), plain.read_to_end(&mut rest)).await;
    assert!(!String::from_utf8_lossy(&rest).contains("HTTP/1.1 200"));
    let curl = Command::new("curl")
        .args([
            "-sk",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "20",
        ])
        .arg(format!("https://localhost:{}/", address.port()))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&curl.stdout), "200");
}

#[tokio::test]
async fn the_decision_listener_takes_the_asking_proxy_s_fingerprint() {
    let upstream = start_upstream().await;
    let policy = r#"
[decision]
listen = "127.0.0.1:0"

[upstreams.app]
url = "http://{upstream}"

[limits.per_fingerprint]
key = "tls_ja4"
capacity = 1
rate = "1/h"

[[routes]]
name = "default"
path_prefix = "/"
upstream = "app"
limits = ["per_fingerprint"]
"#;
    let gateway = start_gateway(policy, upstream.address).await;
    let decision = HttpClient::new(gateway.decision_address.unwrap());
    let ask = |ja4: Option<&'static str>| {
        let decision = decision.clone();
        async move {
            let mut headers = vec![
                ("x-forwarded-method", "GET"),
                ("x-forwarded-uri", "/"),
                ("x-forwarded-for", "192.0.2.1"),
            ];
            headers.extend(ja4.map(|ja4| ("x-tollgate-ja4", ja4)));
            decision.get("/decide", &headers).await.status.as_u16()
        }
    };
    let chrome = Some("t13d1516h2_8daaf6152771_e5627efa2ab1");
    assert_eq!(ask(chrome).await, 200);
    assert_eq!(ask(chrome).await, 429);
    assert_eq!(ask(Some("t13d1517h2_8daaf6152771_b0da82dd1658")).await, 200);
    // Without the header the key is missing, and the limit (missing = "skip") does not apply.
    assert_eq!(ask(None).await, 200);
    assert_eq!(ask(None).await, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_names_the_connection_s_fingerprint() {
    let dir = tempfile::tempdir().unwrap();
    let upstream = start_upstream().await;
    let policy = tls_policy(&certificate(dir.path(), "server"))
        .replace("{upstream}", &upstream.address.to_string())
        + "[admin]\nlisten = \"127.0.0.1:0\"\n";
    let file = dir.path().join("tollgate.toml");
    std::fs::write(&file, policy).unwrap();
    let gateway = logged::LoggedGateway::start(&file);
    let listening = gateway.next_line("\"listening\"");
    let address: SocketAddr = listening["address"].as_str().unwrap().parse().unwrap();
    let port = address.port();
    let status = Command::new("curl")
        .args([
            "-sk",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--max-time",
            "20",
        ])
        .arg(format!("https://localhost:{port}/"))
        .output()
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&status.stdout), "200");
    let access = gateway.next_line("tollgate::access");
    drop(gateway);
    let expected = ja4plus(&capture_hello(curl(&[])).await);
    assert_eq!(access["ja4"], expected.as_str(), "{access}");
    assert!(access["keys"]
        .as_str()
        .unwrap()
        .starts_with("per_fingerprint=h:"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quic_clients_are_fingerprinted_with_q_from_the_hello_their_initials_carry() {
    let dir = tempfile::tempdir().unwrap();
    let certificate = certificate(dir.path(), "server");
    // aioquic's Initials, caught by a socket that never answers.
    let catcher = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let caught = catcher.local_addr().unwrap();
    let one_get = serde_json::json!({"connections": [[{"method": "GET", "path": "/"}]]});
    let (ca, asked) = (certificate.cert.clone(), one_get.clone());
    let client = tokio::spawn(async move { quic::h3_client(caught, &ca, asked).await });
    let mut datagrams = Vec::new();
    let hello = loop {
        let mut buffer = [0u8; 2048];
        let received =
            tokio::time::timeout(Duration::from_secs(10), catcher.recv_from(&mut buffer));
        let (length, _) = received.await.expect("an Initial").unwrap();
        datagrams.push(buffer[..length].to_vec());
        if let Some(hello) = ja4::quic::client_hello(datagrams.iter().map(Vec::as_slice)) {
            break hello;
        }
    };
    client.abort();
    let expected = format!("q{}", &ja4plus(&hello)[1..]);
    assert!(expected.starts_with("q13d"), "{expected}");
    assert_eq!(
        ja4::quic_fingerprint(&hello).as_deref(),
        Some(expected.as_str())
    );

    // The listener reads the same hello off the wire: a limit keyed by it (a connection
    // without a fingerprint would be refused) counts each connection of that stack.
    let upstream = start_upstream().await;
    let policy = format!(
        "{}\n[server.http3]\nlisten = [\"127.0.0.1:0\"]\n",
        tls_policy(&certificate)
    );
    let gateway = start_gateway(&policy, upstream.address).await;
    let request = one_get["connections"][0].clone();
    let connections = serde_json::json!({"connections": [request, request, request]});
    let results = quic::h3_client(gateway.http3_addresses[0], &certificate.cert, connections).await;
    let statuses: Vec<&serde_json::Value> = results
        .iter()
        .map(|result| &result["responses"][0]["status"])
        .collect();
    assert_eq!(statuses, [200, 200, 429], "{results:?}");
    assert_bucket_spent(&gateway, &expected).await;
}
