//! The edge over real TCP on loopback: `[server.connections]` closes a connection before a
//! byte is read (TLS too), and the PROXY header of a listed peer names the client for keys,
//! limits and `X-Forwarded-For`; a listed peer without one, or with a malformed one, is closed
//! and counted; an unlisted peer's header is a malformed request. Each runs on both HTTP/1.1
//! paths where they differ.

mod common;

use std::time::Duration;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const ROUTES: &str = r#"
[upstreams.app]
url = "http://{upstream}"

[limits.per_client]
key = "client_network"
capacity = 2
rate = "1/h"

[[routes]]
name = "all"
path_prefix = "/"
upstream = "app"
limits = ["per_client"]
"#;

const GET: &[u8] = b"GET / HTTP/1.1\r\nHost: example.test\r\n\r\n";

fn policy(server: &str) -> String {
    format!("[server]\nlisten = [\"127.0.0.1:0\"]\n{server}\n{ROUTES}")
}

/// A keep-alive connection with one request answered: the gateway has counted it open.
async fn open_connection(address: std::net::SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: a\r\nX-Test: 1\r\n\r\n")
        .await
        .unwrap();
    let response = read_response(&mut stream, false).await;
    assert!(matches!(response.status(), 200 | 429), "{}", response.head);
    stream
}

/// A connection the gateway closes before it reads or writes a byte.
async fn closed_at_once(address: std::net::SocketAddr) {
    let mut stream = TcpStream::connect(address).await.unwrap();
    let _ = stream.write_all(GET).await;
    assert_eq!(rest_until_closed(&mut stream).await, Some(Vec::new()));
}

fn refused(gateway: &tollgate::Tollgate, reason: &str) -> f64 {
    metric(
        &gateway.render_metrics(),
        &format!("tollgate_connections_refused_total{{reason=\"{reason}\"}}"),
    )
}

#[tokio::test]
async fn open_connections_per_network_are_capped_and_a_closed_one_frees_its_place() {
    for http1 in ["fast", "hyper"] {
        let upstream = start_upstream().await;
        let text = policy("[server.connections]\nmax_per_network = 2\n");
        let gateway = start_gateway_on(http1, &text, upstream.address).await;
        let address = gateway.addresses[0];
        let first = open_connection(address).await;
        let _second = open_connection(address).await;
        closed_at_once(address).await;
        assert_eq!(refused(&gateway, "open"), 1.0, "{http1}");
        assert_eq!(
            metric(&gateway.render_metrics(), "tollgate_connections_open"),
            2.0
        );
        drop(first);
        eventually("the closed connection is counted closed", || {
            metric(&gateway.render_metrics(), "tollgate_connections_open") == 1.0
        })
        .await;
        open_connection(address).await;
    }
}

#[tokio::test]
async fn new_connections_per_network_and_in_all_are_limited_and_trusted_proxies_exempt() {
    let upstream = start_upstream().await;
    let text = policy("[server.connections]\nper_network = { capacity = 3, rate = \"1/h\" }\n");
    let gateway = start_gateway(&text, upstream.address).await;
    let address = gateway.addresses[0];
    for _ in 0..3 {
        drop(open_connection(address).await);
    }
    closed_at_once(address).await;
    assert_eq!(refused(&gateway, "rate"), 1.0);

    // The loopback proxy is trusted: not limited per network, but by `max` still.
    let text = format!(
        "[client_ip]\ntrusted_proxies = [\"127.0.0.1\"]\n{}",
        policy("[server.connections]\nmax = 3\nper_network = { capacity = 1, rate = \"1/h\" }\nmax_per_network = 1\n")
    );
    let gateway = start_gateway(&text, upstream.address).await;
    let address = gateway.addresses[0];
    let _held = [
        open_connection(address).await,
        open_connection(address).await,
        open_connection(address).await,
    ];
    closed_at_once(address).await;
    assert_eq!(refused(&gateway, "max"), 1.0);
    assert_eq!(refused(&gateway, "rate") + refused(&gateway, "open"), 0.0);
}

#[tokio::test]
async fn a_tls_listener_closes_a_refused_connection_before_its_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let cert = certificate(dir.path(), "edge");
    let upstream = start_upstream().await;
    let server = format!(
        "tls = {{ cert = \"{}\", key = \"{}\" }}\n[server.connections]\nmax_per_network = 1\n",
        cert.cert.display(),
        cert.key.display()
    );
    let gateway = start_gateway(&policy(&server), upstream.address).await;
    let address = gateway.addresses[0];
    // The first holds the network's one place while its handshake waits for a ClientHello.
    let _first = TcpStream::connect(address).await.unwrap();
    eventually("the first connection is counted open", || {
        metric(&gateway.render_metrics(), "tollgate_connections_open") == 1.0
    })
    .await;
    let mut second = TcpStream::connect(address).await.unwrap();
    // A ClientHello's first bytes: the refused connection answers nothing, not even an alert.
    let _ = second.write_all(&[0x16, 0x03, 0x01, 0x00, 0x05]).await;
    assert_eq!(rest_until_closed(&mut second).await, Some(Vec::new()));
    assert_eq!(refused(&gateway, "open"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_connections_from_one_network_leave_the_gateway_serving() {
    let upstream = start_upstream().await;
    let text = policy("[server.connections]\nmax_per_network = 4\n");
    let gateway = start_gateway(&text, upstream.address).await;
    let address = gateway.addresses[0];
    let _held: Vec<TcpStream> = {
        let mut held = Vec::new();
        for _ in 0..4 {
            held.push(open_connection(address).await);
        }
        held
    };
    let mut closed = 0;
    for _ in 0..10_000 {
        let Ok(mut stream) = TcpStream::connect(address).await else {
            continue;
        };
        let mut byte = [0u8; 1];
        if matches!(
            tokio::time::timeout(Duration::from_secs(10), stream.read(&mut byte)).await,
            Ok(Ok(0) | Err(_))
        ) {
            closed += 1;
        }
    }
    assert_eq!(closed, 10_000);
    assert_eq!(refused(&gateway, "open"), 10_000.0);
    assert_eq!(
        metric(&gateway.render_metrics(), "tollgate_connections_open"),
        4.0
    );
}

/// A v2 header naming `source` (an IPv4 client) with an ALPN TLV, or LOCAL when `None`.
fn v2_header(source: Option<([u8; 4], u16)>) -> Vec<u8> {
    let mut header = b"\r\n\r\n\0\r\nQUIT\n".to_vec();
    match source {
        Some((address, port)) => {
            header.extend_from_slice(&[0x21, 0x11, 0, 17]);
            header.extend_from_slice(&address);
            header.extend_from_slice(&[127, 0, 0, 1]);
            header.extend_from_slice(&port.to_be_bytes());
            header.extend_from_slice(&8080u16.to_be_bytes());
            header.extend_from_slice(&[0x01, 0x00, 0x02, b'h', b'2']);
        }
        None => header.extend_from_slice(&[0x20, 0x00, 0, 0]),
    }
    header
}

/// The client address the upstream was told, after a request that began with `header`.
async fn forwarded_for(address: std::net::SocketAddr, header: &[u8]) -> (u16, Option<String>) {
    let mut stream = TcpStream::connect(address).await.unwrap();
    let mut bytes = header.to_vec();
    bytes.extend_from_slice(GET);
    stream.write_all(&bytes).await.unwrap();
    let response = read_response(&mut stream, false).await;
    let forwarded = (response.status() == 200).then(|| {
        let seen: serde_json::Value = serde_json::from_slice(&response.body).unwrap();
        seen["headers"]["x-forwarded-for"]
            .as_str()
            .unwrap()
            .to_owned()
    });
    (response.status(), forwarded)
}

#[tokio::test]
async fn a_listed_peers_proxy_header_names_the_client_for_keys_and_forwarding() {
    for http1 in ["fast", "hyper"] {
        let upstream = start_upstream().await;
        let text = policy("proxy_protocol = { from = [\"127.0.0.0/8\"] }\n");
        let gateway = start_gateway_on(http1, &text, upstream.address).await;
        let address = gateway.addresses[0];
        let v1 = b"PROXY TCP4 203.0.113.7 127.0.0.1 56324 8080\r\n";
        assert_eq!(
            forwarded_for(address, v1).await,
            (200, Some("203.0.113.7".to_owned()))
        );
        let v2 = v2_header(Some(([203, 0, 113, 7], 4000)));
        assert_eq!(
            forwarded_for(address, &v2).await,
            (200, Some("203.0.113.7".to_owned()))
        );
        // The limit keyed by the client: 203.0.113.7 has spent its two.
        assert_eq!(forwarded_for(address, v1).await.0, 429, "{http1}");
        let v6 = b"PROXY TCP6 2001:db8::9 ::1 56324 8080\r\n";
        assert_eq!(
            forwarded_for(address, v6).await,
            (200, Some("2001:db8::9".to_owned()))
        );
        // A health check's LOCAL, and v1's UNKNOWN: the peer's own address.
        assert_eq!(
            forwarded_for(address, &v2_header(None)).await,
            (200, Some("127.0.0.1".to_owned()))
        );
        assert_eq!(
            forwarded_for(address, b"PROXY UNKNOWN\r\n").await,
            (200, Some("127.0.0.1".to_owned()))
        );
        // A v1 header that arrives a few bytes at a time.
        let mut stream = TcpStream::connect(address).await.unwrap();
        for piece in v6.chunks(7) {
            stream.write_all(piece).await.unwrap();
            stream.flush().await.unwrap();
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        stream.write_all(GET).await.unwrap();
        assert_eq!(read_response(&mut stream, false).await.status(), 200);
        assert_eq!(refused(&gateway, "proxy_protocol"), 0.0);
    }
}

#[tokio::test]
async fn a_listed_peer_without_a_valid_header_is_closed_and_counted() {
    for http1 in ["fast", "hyper"] {
        let upstream = start_upstream().await;
        let text =
            policy("proxy_protocol = { from = [\"127.0.0.1\"] }\nheader_read_timeout = \"1s\"\n");
        let gateway = start_gateway_on(http1, &text, upstream.address).await;
        let address = gateway.addresses[0];
        let mut lying = v2_header(Some(([203, 0, 113, 7], 1)));
        lying[15] = 200; // claims 200 bytes after the fixed part, sends 17
        let too_long = format!("PROXY TCP4 {}\r\n", "1".repeat(120));
        let cases: Vec<Vec<u8>> = vec![
            GET.to_vec(),
            b"PROXY TCP4 203.0.113.7 127.0.0.1 56324\r\n".to_vec(),
            b"PROXY TCP4 203.0.113.7".to_vec(),
            too_long.into_bytes(),
            lying,
            b"\r\n\r\n\0\r\nQUIT".to_vec(),
        ];
        for (index, case) in cases.iter().enumerate() {
            let mut stream = TcpStream::connect(address).await.unwrap();
            stream.write_all(case).await.unwrap();
            let rest = rest_until_closed(&mut stream).await;
            assert_eq!(rest, Some(Vec::new()), "{http1} case {index}: answered");
        }
        assert_eq!(
            refused(&gateway, "proxy_protocol"),
            cases.len() as f64,
            "{http1}"
        );
        assert_eq!(upstream.hits.load(std::sync::atomic::Ordering::SeqCst), 0);
    }
}

#[tokio::test]
async fn an_unlisted_peers_proxy_header_is_a_malformed_request() {
    for http1 in ["fast", "hyper"] {
        let upstream = start_upstream().await;
        let text = policy("proxy_protocol = { from = [\"10.0.0.0/8\"] }\n");
        let gateway = start_gateway_on(http1, &text, upstream.address).await;
        let address = gateway.addresses[0];
        for header in [
            b"PROXY TCP4 203.0.113.7 127.0.0.1 56324 8080\r\n".to_vec(),
            v2_header(Some(([203, 0, 113, 7], 1))),
        ] {
            let mut bytes = header;
            bytes.extend_from_slice(GET);
            let response = raw(address, &bytes).await;
            assert_eq!(raw_status(&response), 400, "{http1}: {response}");
        }
        assert_eq!(upstream.hits.load(std::sync::atomic::Ordering::SeqCst), 0);
        // Without a header, an unlisted peer is served as ever.
        assert_eq!(
            forwarded_for(address, b"").await,
            (200, Some("127.0.0.1".to_owned()))
        );
    }
}

#[tokio::test]
async fn connection_limits_count_the_headers_client_not_the_balancer() {
    let upstream = start_upstream().await;
    let text = policy(
        "proxy_protocol = { from = [\"127.0.0.1\"] }\n[server.connections]\nper_network = { capacity = 1, rate = \"1/h\" }\n",
    );
    let gateway = start_gateway(&text, upstream.address).await;
    let address = gateway.addresses[0];
    let header = |client: &str| format!("PROXY TCP4 {client} 127.0.0.1 5000 8080\r\n");
    assert_eq!(
        forwarded_for(address, header("198.51.100.1").as_bytes())
            .await
            .0,
        200
    );
    assert_eq!(
        forwarded_for(address, header("198.51.100.2").as_bytes())
            .await
            .0,
        200
    );
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream
        .write_all(header("198.51.100.1").as_bytes())
        .await
        .unwrap();
    stream.write_all(GET).await.unwrap();
    assert_eq!(rest_until_closed(&mut stream).await, Some(Vec::new()));
    assert_eq!(refused(&gateway, "rate"), 1.0);
}

/// The decision listener reads PROXY headers too, and its `allow` judges the header's source;
/// `[server.connections]` does not apply to it.
#[tokio::test]
async fn the_decision_listener_judges_the_headers_source() {
    let upstream = start_upstream().await;
    let text = format!(
        "[server]\nlisten = [\"127.0.0.1:0\"]\nproxy_protocol = {{ from = [\"127.0.0.1\"] }}\n[server.connections]\nmax_per_network = 1\n[decision]\nlisten = \"127.0.0.1:0\"\nallow = [\"10.0.0.0/8\"]\n{ROUTES}"
    );
    let gateway = start_gateway(&text, upstream.address).await;
    let decision = gateway.decision_address.expect("a decision listener");
    let ask = |source: &str| {
        format!(
            "PROXY TCP4 {source} 127.0.0.1 5000 8081\r\nGET /decide HTTP/1.1\r\nHost: d\r\nX-Forwarded-Method: GET\r\nX-Forwarded-Uri: /\r\nX-Forwarded-For: 203.0.113.9\r\n\r\n"
        )
    };
    let held: Vec<TcpStream> = futures_util::future::join_all((0..2).map(|_| async {
        let mut stream = TcpStream::connect(decision).await.unwrap();
        stream.write_all(ask("10.1.2.3").as_bytes()).await.unwrap();
        assert_eq!(read_response(&mut stream, false).await.status(), 200);
        stream
    }))
    .await;
    assert_eq!(held.len(), 2, "two open from one network: not limited here");
    let mut stream = TcpStream::connect(decision).await.unwrap();
    stream.write_all(ask("192.0.2.1").as_bytes()).await.unwrap();
    assert_eq!(read_response(&mut stream, false).await.status(), 403);
    let mut stream = TcpStream::connect(decision).await.unwrap();
    stream
        .write_all(b"GET /decide HTTP/1.1\r\nHost: d\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(rest_until_closed(&mut stream).await, Some(Vec::new()));
    assert_eq!(refused(&gateway, "proxy_protocol"), 1.0);
    assert_eq!(refused(&gateway, "open"), 0.0);
}

/// On a TLS listener the PROXY header comes before the ClientHello.
#[tokio::test]
async fn a_proxy_header_precedes_the_tls_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let cert = certificate(dir.path(), "edge");
    let upstream = start_upstream().await;
    let server = format!(
        "tls = {{ cert = \"{}\", key = \"{}\" }}\nproxy_protocol = {{ from = [\"127.0.0.1\"] }}\n",
        cert.cert.display(),
        cert.key.display()
    );
    let gateway = start_gateway(&policy(&server), upstream.address).await;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert.der.clone()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let mut stream = TcpStream::connect(gateway.addresses[0]).await.unwrap();
    stream
        .write_all(&v2_header(Some(([203, 0, 113, 44], 4000))))
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, stream).await.expect("handshake");
    tls.write_all(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut response = Vec::new();
    let _ = tls.read_to_end(&mut response).await;
    let response = String::from_utf8_lossy(&response);
    assert_eq!(raw_status(&response), 200, "{response}");
    assert!(
        response.contains("\"x-forwarded-for\":\"203.0.113.44\""),
        "{response}"
    );
}
