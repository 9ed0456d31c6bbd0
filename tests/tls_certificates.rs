//! `[server.tls]`: certificates chosen by server name, `unrecognized_name` without a default,
//! `min_version`, HSTS, plain listeners beside TLS and their redirect, and certificate files
//! checked and read again on reload. Certificates come from a private CA made by `openssl`.

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;

use common::pki::{Leaf, Pki};
use common::*;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::RootCertStore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::client::TlsStream;

/// A TLS client trusting `ca`, for these protocol versions.
fn connector(
    ca: &CertificateDer<'static>,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> tokio_rustls::TlsConnector {
    let mut roots = RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(versions)
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// A handshake asking for `name` (an IP address sends no server name).
async fn handshake(
    address: SocketAddr,
    ca: &CertificateDer<'static>,
    name: &str,
) -> std::io::Result<TlsStream<tokio::net::TcpStream>> {
    let stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let name = ServerName::try_from(name.to_owned()).unwrap();
    connector(ca, rustls::DEFAULT_VERSIONS)
        .connect(name, stream)
        .await
}

async fn presented(address: SocketAddr, ca: &CertificateDer<'static>, name: &str) -> Vec<u8> {
    let tls = handshake(address, ca, name)
        .await
        .unwrap_or_else(|error| panic!("handshake for {name}: {error}"));
    tls.get_ref().1.peer_certificates().unwrap()[0].to_vec()
}

fn policy(entries: &[(&[&str], &Leaf)], extra: &str) -> String {
    let mut policy = format!("[server]\nlisten = [\"127.0.0.1:0\"]\n{extra}\n");
    for (hosts, leaf) in entries {
        let hosts: Vec<String> = hosts.iter().map(|host| format!("{host:?}")).collect();
        policy.push_str(&format!(
            "[[server.tls.certificates]]\nhosts = [{}]\ncert = {:?}\nkey = {:?}\n",
            hosts.join(", "),
            leaf.cert,
            leaf.key
        ));
    }
    policy.push_str("[upstreams.app]\nurl = \"http://{upstream}\"\n[[routes]]\nname = \"all\"\npath_prefix = \"/\"\nupstream = \"app\"\n");
    policy
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_name_gets_its_certificate_and_other_names_the_default() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let shop = pki.leaf("shop", &["shop.example.com", "*.shop.example.com"], 30);
    let api = pki.leaf("api", &["api.example.com"], 30);
    // Names the default is served for, so that the client takes it.
    let default = pki.leaf(
        "default",
        &[
            "default.example",
            "a.b.shop.example.com",
            "other.example",
            "127.0.0.1",
        ],
        30,
    );
    let upstream = start_upstream().await;
    let text = policy(
        &[
            (&["shop.example.com", "*.shop.example.com"], &shop),
            (&["API.example.com"], &api),
            (&[], &default),
        ],
        "",
    );
    let gateway = start_gateway(&text, upstream.address).await;
    let address = gateway.addresses[0];
    for (name, expected) in [
        ("shop.example.com", &shop),
        ("a.shop.example.com", &shop),
        ("api.example.com", &api),
        ("a.b.shop.example.com", &default),
        ("other.example", &default),
        ("127.0.0.1", &default),
    ] {
        assert_eq!(
            presented(address, &pki.ca, name).await,
            expected.der.to_vec(),
            "{name}"
        );
    }
    // Each host's certificate end is exported, and the default's.
    let scrape = gateway.render_metrics();
    for host in [
        "shop.example.com",
        "*.shop.example.com",
        "api.example.com",
        "default",
    ] {
        let left = metric(
            &scrape,
            &format!("tollgate_tls_certificate_expiry_seconds{{host=\"{host}\"}}"),
        );
        assert!(
            (29.0 * 86_400.0..=30.0 * 86_400.0 + 60.0).contains(&left),
            "{host}: {left}"
        );
    }

    // A renewed file is served to new connections after a reload; an open one keeps its own.
    let mut open = handshake(address, &pki.ca, "api.example.com")
        .await
        .unwrap();
    let renewed = pki.leaf("api-renewed", &["api.example.com"], 60);
    std::fs::copy(&renewed.cert, &api.cert).unwrap();
    std::fs::copy(&renewed.key, &api.key).unwrap();
    gateway.reload(compile(&text, upstream.address)).unwrap();
    assert_eq!(
        presented(address, &pki.ca, "api.example.com").await,
        renewed.der.to_vec()
    );
    open.write_all(b"GET / HTTP/1.1\r\nHost: api.example.com\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    open.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");

    // A key that is not the certificate's fails the reload, and the old pair serves on.
    std::fs::copy(&shop.key, &api.key).unwrap();
    let error = gateway
        .reload(compile(&text, upstream.address))
        .unwrap_err()
        .to_string();
    assert!(error.contains("api.pem"), "{error}");
    assert_eq!(
        presented(address, &pki.ca, "api.example.com").await,
        renewed.der.to_vec()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_default_an_unknown_name_is_refused_with_unrecognized_name() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let shop = pki.leaf("shop", &["shop.example.com"], 30);
    let upstream = start_upstream().await;
    let gateway = start_gateway(
        &policy(&[(&["shop.example.com"], &shop)], ""),
        upstream.address,
    )
    .await;
    let address = gateway.addresses[0];
    assert_eq!(
        presented(address, &pki.ca, "shop.example.com").await,
        shop.der.to_vec()
    );
    for name in ["other.example", "127.0.0.1"] {
        let error = handshake(address, &pki.ca, name).await.unwrap_err();
        let alert = error
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>());
        assert_eq!(
            alert,
            Some(&rustls::Error::AlertReceived(
                rustls::AlertDescription::UnrecognisedName
            )),
            "{name}: {error}"
        );
    }
    let scrape = gateway.render_metrics();
    assert_metrics(
        &scrape,
        &[(
            r#"tollgate_tls_handshake_failures_total{reason="unrecognized_name"}"#,
            2.0,
        )],
    );
}

/// A TLS 1.2 ClientHello asking for `name` (any length), offering ECDHE-ECDSA with P-256.
fn client_hello(name: &[u8]) -> Vec<u8> {
    let vector16 = |bytes: &[u8]| {
        let mut out = (bytes.len() as u16).to_be_bytes().to_vec();
        out.extend_from_slice(bytes);
        out
    };
    let extension = |kind: u16, data: &[u8]| {
        let mut out = kind.to_be_bytes().to_vec();
        out.extend(vector16(data));
        out
    };
    let mut server_name = vec![0];
    server_name.extend(vector16(name));
    let mut extensions = extension(0x0000, &vector16(&server_name));
    extensions.extend(extension(0x000a, &vector16(&[0x00, 0x17])));
    extensions.extend(extension(0x000b, &[1, 0]));
    extensions.extend(extension(0x000d, &vector16(&[0x04, 0x03])));
    let mut body = vec![0x03, 0x03];
    body.extend([7u8; 32]);
    body.push(0);
    body.extend(vector16(&[0xc0, 0x2b]));
    body.extend([1, 0]);
    body.extend(vector16(&extensions));
    let mut handshake = vec![1];
    handshake.extend(&(body.len() as u32).to_be_bytes()[1..]);
    handshake.extend(body);
    let mut record = vec![0x16, 0x03, 0x01];
    record.extend(vector16(&handshake));
    record
}

/// The first record a server answers `hello` with: its content type and first payload byte.
async fn first_answer(address: SocketAddr, hello: &[u8]) -> Option<(u8, Vec<u8>)> {
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    stream.write_all(hello).await.unwrap();
    let mut header = [0; 5];
    stream.read_exact(&mut header).await.ok()?;
    let mut payload = vec![0; usize::from(u16::from_be_bytes([header[3], header[4]]))];
    stream.read_exact(&mut payload).await.ok()?;
    Some((header[0], payload))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_300_byte_server_name_is_one_no_certificate_answers() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let shop = pki.leaf("shop", &["shop.example.com"], 30);
    let default = pki.leaf("default", &["default.example"], 30);
    let upstream = start_upstream().await;
    let long_name = [b'a'; 300];
    // Our hand-made hello is one a server takes: with a known name it gets a ServerHello.
    let with_default = start_gateway(
        &policy(&[(&["shop.example.com"], &shop), (&[], &default)], ""),
        upstream.address,
    )
    .await;
    let answer = first_answer(
        with_default.addresses[0],
        &client_hello(b"shop.example.com"),
    )
    .await;
    assert_eq!(
        answer.map(|(kind, payload)| (kind, payload[0])),
        Some((0x16, 2))
    );
    // The long name: never a panic; the default certificate's ServerHello or a TLS alert.
    let answer = first_answer(with_default.addresses[0], &client_hello(&long_name)).await;
    let (kind, payload) = answer.expect("an answer, not a dropped connection");
    assert!(
        (kind, payload[0]) == (0x16, 2) || kind == 0x15,
        "record type {kind}: {payload:?}"
    );
    // Without a default, the name is unrecognized.
    let without = start_gateway(
        &policy(&[(&["shop.example.com"], &shop)], ""),
        upstream.address,
    )
    .await;
    let answer = first_answer(without.addresses[0], &client_hello(&long_name)).await;
    assert_eq!(
        answer,
        Some((0x15, vec![2, 112])),
        "fatal unrecognized_name"
    );
    // Both still serve.
    assert_eq!(
        presented(with_default.addresses[0], &pki.ca, "shop.example.com").await,
        shop.der.to_vec()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hsts_goes_on_tls_responses_only_and_plain_listeners_redirect_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let default = pki.leaf("default", &["shop.example.com"], 30);
    let upstream = start_upstream().await;
    let extra = "plain_listen = [\"127.0.0.1:0\"]\n[server.tls]\nhsts = \"max-age=31536000; includeSubDomains\"\nREDIRECT";
    let serving = policy(&[(&[], &default)], &extra.replace("REDIRECT", ""));
    let gateway = start_gateway(&serving, upstream.address).await;
    let (tls_address, plain_address) = (gateway.addresses[0], gateway.plain_addresses[0]);

    let mut tls = handshake(tls_address, &pki.ca, "shop.example.com")
        .await
        .unwrap();
    tls.write_all(b"GET /a HTTP/1.1\r\nHost: shop.example.com\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    tls.read_to_string(&mut answer).await.unwrap();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer
            .to_ascii_lowercase()
            .contains("strict-transport-security: max-age=31536000; includesubdomains\r\n"),
        "{answer}"
    );
    // The plain listener serves the same routes, without HSTS.
    let plain = raw(
        plain_address,
        b"GET /a HTTP/1.1\r\nHost: shop.example.com\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(raw_status(&plain), 200, "{plain}");
    assert!(
        !plain
            .to_ascii_lowercase()
            .contains("strict-transport-security"),
        "{plain}"
    );

    // With redirect_plain, every plain request is sent to https, target and all.
    let redirecting = policy(
        &[(&[], &default)],
        &extra.replace("REDIRECT", "redirect_plain = true\n"),
    );
    gateway
        .reload(compile(&redirecting, upstream.address))
        .unwrap();
    let plain = raw(
        plain_address,
        b"POST /a/b?c=d HTTP/1.1\r\nHost: shop.example.com:80\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(raw_status(&plain), 308, "{plain}");
    let location = format!(
        "location: https://shop.example.com:{}/a/b?c=d\r\n",
        tls_address.port()
    );
    assert!(plain.to_ascii_lowercase().contains(&location), "{plain}");
    let hostless = raw(plain_address, b"GET / HTTP/1.0\r\n\r\n").await;
    assert_eq!(raw_status(&hostless), 400, "{hostless}");
    // TLS is not redirected.
    assert_eq!(
        presented(tls_address, &pki.ca, "shop.example.com").await,
        default.der.to_vec()
    );
    let scrape = gateway.render_metrics();
    assert_eq!(
        metric(
            &scrape,
            r#"tollgate_requests_total{outcome="allowed",route="all"}"#
        ),
        2.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_version_1_3_refuses_tls_1_2_clients() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let default = pki.leaf("default", &["shop.example.com"], 30);
    let upstream = start_upstream().await;
    let text = policy(&[(&[], &default)], "[server.tls]\nmin_version = \"1.3\"\n");
    let gateway = start_gateway(&text, upstream.address).await;
    let address = gateway.addresses[0];
    let stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let name = ServerName::try_from("shop.example.com").unwrap();
    let tls12 = connector(&pki.ca, &[&rustls::version::TLS12])
        .connect(name.clone(), stream)
        .await;
    assert!(tls12.is_err(), "TLS 1.2 refused");
    let stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let tls13 = connector(&pki.ca, &[&rustls::version::TLS13])
        .connect(name, stream)
        .await
        .unwrap();
    assert_eq!(
        tls13.get_ref().1.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_3)
    );
    let scrape = gateway.render_metrics();
    eventually("the refused handshake is counted", || {
        metric(
            &gateway.render_metrics(),
            r#"tollgate_tls_handshake_failures_total{reason="incompatible"}"#,
        ) == 1.0
    })
    .await;
    assert_eq!(
        metric(
            &scrape,
            r#"tollgate_tls_handshake_failures_total{reason="other"}"#
        ),
        0.0
    );
}

#[test]
fn certificate_files_are_checked_when_the_policy_is_read() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let shop = pki.leaf("shop", &["shop.example.com"], 30);
    let old = pki.leaf("old", &["old.example"], -1);
    let upstream: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 1);
    let load = |text: String| {
        let file = dir.path().join("tollgate.toml");
        std::fs::write(&file, text.replace("{upstream}", &upstream.to_string())).unwrap();
        tollgate::config::Policy::load(&file)
    };
    // A key of another certificate.
    let mismatched = Leaf {
        cert: shop.cert.clone(),
        key: old.key.clone(),
        der: shop.der.clone(),
    };
    let error = load(policy(&[(&["shop.example.com"], &mismatched)], ""))
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("shop.pem") && error.contains("old.key"),
        "{error}"
    );
    // An ended certificate and a host its certificate does not name are warnings: both serve.
    let policy = load(policy(
        &[(&["old.example"], &old), (&["www.shop.example.com"], &shop)],
        "",
    ))
    .unwrap();
    let warnings = policy.warnings.join("\n");
    assert!(
        warnings.contains("old.pem for old.example has expired"),
        "{warnings}"
    );
    assert!(
        warnings.contains("shop.pem does not name www.shop.example.com"),
        "{warnings}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_certificate_is_served_with_a_negative_expiry() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let old = pki.leaf("old", &["old.example"], -1);
    let upstream = start_upstream().await;
    let gateway = start_gateway(&policy(&[(&["old.example"], &old)], ""), upstream.address).await;
    let left = metric(
        &gateway.render_metrics(),
        r#"tollgate_tls_certificate_expiry_seconds{host="old.example"}"#,
    );
    assert!((-86_460.0..=-86_000.0).contains(&left), "{left}");
    // Served: the client is the one to refuse it.
    let error = handshake(gateway.addresses[0], &pki.ca, "old.example")
        .await
        .unwrap_err();
    assert!(
        error.to_string().to_lowercase().contains("expired"),
        "{error}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renegotiation_attempt_is_counted_and_nothing_else_fails() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let default = pki.leaf("default", &["shop.example.com"], 30);
    let upstream = start_upstream().await;
    let gateway = start_gateway(&policy(&[(&[], &default)], ""), upstream.address).await;
    // openssl's client asks to renegotiate when it reads "R" on its input (TLS 1.2 only).
    let mut client = tokio::process::Command::new("openssl")
        .args([
            "s_client",
            "-tls1_2",
            "-servername",
            "shop.example.com",
            "-CAfile",
        ])
        .arg(&pki.ca_file)
        .args(["-connect", &gateway.addresses[0].to_string()])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("openssl s_client runs");
    let mut output = client.stdout.take().unwrap();
    // The handshake is done once the session is printed.
    let mut printed = Vec::new();
    let mut chunk = [0; 4096];
    while !String::from_utf8_lossy(&printed).contains("Verify return code") {
        let read = output.read(&mut chunk).await.unwrap();
        assert!(read > 0, "{}", String::from_utf8_lossy(&printed));
        printed.extend_from_slice(&chunk[..read]);
    }
    let mut input = client.stdin.take().unwrap();
    input.write_all(b"R\n").await.unwrap();
    eventually("the attempt is counted", || {
        metric(
            &gateway.render_metrics(),
            r#"tollgate_tls_handshake_failures_total{reason="renegotiation"}"#,
        ) == 1.0
    })
    .await;
    drop(input);
    let _ = client.kill().await;
    // Nothing else failed: the handshake itself was fine.
    let scrape = gateway.render_metrics();
    for reason in ["other", "bad_record", "client_alert", "incompatible"] {
        let series = format!("tollgate_tls_handshake_failures_total{{reason=\"{reason}\"}}");
        assert_eq!(metric(&scrape, &series), 0.0, "{reason}");
    }
}
