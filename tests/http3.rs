//! HTTP/3 over QUIC (`[server.http3]`), driven by a real HTTP/3 client (aioquic, from the tests'
//! Python environment) over UDP loopback: limits shared with the TCP listener, refusals with
//! their headers and body, bodies both ways, `Alt-Svc`, Retries for a network over its
//! connection rate and for a flood of Initials, 0-RTT (425 for an unsafe early request,
//! `Early-Data: 1` on a safe one), and garbage datagrams that leave the listener serving.
#![allow(clippy::disallowed_methods)] // the flood waits in real time for the gateway's answers

mod common;

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use common::*;
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};

fn policy(certificate: &Certificate, extra: &str) -> String {
    format!(
        r#"
[server]
listen = ["127.0.0.1:0"]
tls = {{ cert = "{cert}", key = "{key}" }}

[server.http3]
listen = ["127.0.0.1:0"]
{extra}

[upstreams.app]
url = "http://{{upstream}}"

[limits.per_network]
key = "client_network"
capacity = 3
rate = "1/h"

[[routes]]
name = "limited"
path_prefix = "/limited"
upstream = "app"
limits = ["per_network"]

[[routes]]
name = "open"
path_prefix = "/"
upstream = "app"
"#,
        cert = certificate.cert.display(),
        key = certificate.key.display(),
    )
}

async fn h3(address: SocketAddr, certificate: &Certificate, spec: Value) -> Vec<Value> {
    quic::h3_client(address, &certificate.cert, spec).await
}

fn get(path: &str) -> Value {
    json!({"method": "GET", "path": path})
}

fn header<'a>(response: &'a Value, name: &str) -> Option<&'a str> {
    response["headers"]
        .as_array()?
        .iter()
        .find(|pair| pair[0] == name)
        .and_then(|pair| pair[1].as_str())
}

fn responses(connection: &Value) -> &Vec<Value> {
    connection["responses"]
        .as_array()
        .unwrap_or_else(|| panic!("the connection failed: {connection}"))
}

/// A TLS client over TCP trusting `certificate`, speaking HTTP/1.1.
async fn tcp_get(
    address: SocketAddr,
    certificate: &Certificate,
    path: &str,
) -> http::Response<Bytes> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(certificate.der.clone()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(config)
        .https_only()
        .enable_http1()
        .build();
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, Full<Bytes>>(connector);
    let request = http::Request::get(format!("https://localhost:{}{path}", address.port()))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let (parts, body) = client.request(request).await.unwrap().into_parts();
    http::Response::from_parts(parts, body.collect().await.unwrap().to_bytes())
}

async fn gateway(extra: &str) -> (tollgate::Tollgate, Upstream, Certificate, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let certificate = certificate(dir.path(), "server");
    let upstream = start_upstream().await;
    let gateway = start_gateway(&policy(&certificate, extra), upstream.address).await;
    (gateway, upstream, certificate, dir)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http3_shares_limits_with_tcp_and_refuses_alike() {
    let (gateway, _upstream, certificate, _dir) = gateway("").await;
    let quic = gateway.http3_addresses[0];
    for _ in 0..2 {
        let response = tcp_get(gateway.addresses[0], &certificate, "/limited").await;
        assert_eq!(response.status(), 200);
        // Advertised on the TCP TLS listener, with the UDP port.
        assert_eq!(
            response.headers()["alt-svc"],
            format!("h3=\":{}\"; ma=86400", quic.port()).as_str()
        );
    }
    let results = h3(
        quic,
        &certificate,
        json!({"connections": [[get("/limited")], [get("/limited"), get("/limited")]]}),
    )
    .await;
    let admitted = &responses(&results[0])[0];
    assert_eq!(admitted["status"], 200, "{admitted}");
    let echoed: Value = serde_json::from_str(admitted["body"].as_str().unwrap()).unwrap();
    assert_eq!(echoed["headers"]["x-forwarded-proto"], "https");
    assert_eq!(echoed["headers"]["x-forwarded-for"], "127.0.0.1");
    assert_eq!(
        header(admitted, "alt-svc"),
        None,
        "not advertised over HTTP/3 itself"
    );
    assert_eq!(header(admitted, "ratelimit-remaining"), Some("0"));
    for refused in responses(&results[1]) {
        assert_eq!(refused["status"], 429, "{refused}");
        let retry_after: u64 = header(refused, "retry-after").unwrap().parse().unwrap();
        assert!(retry_after >= 1, "{refused}");
        assert_eq!(header(refused, "content-type"), Some("application/json"));
        let body: Value = serde_json::from_str(refused["body"].as_str().unwrap()).unwrap();
        assert_eq!(body["error"], "too_many_requests");
    }
    let scrape = gateway.render_metrics();
    let limited = r#"tollgate_requests_total{outcome="limited",route="limited"}"#;
    assert_eq!(metric(&scrape, limited), 2.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_stream_both_ways_over_http3() {
    let (gateway, _upstream, certificate, _dir) = gateway("").await;
    let large: String = (0..200_000)
        .map(|i| char::from(b'a' + (i % 26) as u8))
        .collect();
    let results = h3(
        gateway.http3_addresses[0],
        &certificate,
        json!({"connections": [[
            {"method": "POST", "path": "/echo-body", "body": large},
            {"method": "POST", "path": "/form", "body": "name=value",
             "headers": [["content-type", "application/x-www-form-urlencoded"], ["content-length", "10"]]},
        ]]}),
    )
    .await;
    let answers = responses(&results[0]);
    assert_eq!(answers[0]["status"], 200);
    assert_eq!(answers[0]["body"].as_str().unwrap().len(), large.len());
    assert_eq!(answers[0]["body"], large.as_str());
    let echoed: Value = serde_json::from_str(answers[1]["body"].as_str().unwrap()).unwrap();
    assert_eq!(echoed["method"], "POST");
    assert_eq!(echoed["body"], "name=value");
    assert_eq!(echoed["headers"]["content-length"], "10");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_network_over_its_connection_rate_gets_a_retry_then_is_closed() {
    let extra = "[server.connections]\nper_network = { capacity = 2, rate = \"1/h\" }\n";
    let (gateway, upstream, certificate, _dir) = gateway(extra).await;
    let results = h3(
        gateway.http3_addresses[0],
        &certificate,
        json!({"connections": [[get("/")], [get("/")], [get("/")]]}),
    )
    .await;
    assert_eq!(responses(&results[0])[0]["status"], 200);
    assert_eq!(responses(&results[1])[0]["status"], 200);
    assert!(results[2]["error"].is_string(), "{}", results[2]);
    assert_eq!(upstream.hits.load(std::sync::atomic::Ordering::SeqCst), 2);
    let scrape = gateway.render_metrics();
    // One, or more if the client sent its first Initial again before the Retry came.
    assert!(metric(&scrape, "tollgate_quic_retries_total") >= 1.0);
    let refused = r#"tollgate_connections_refused_total{reason="rate"}"#;
    assert_eq!(metric(&scrape, refused), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn early_data_forwards_safe_requests_marked_and_refuses_others_with_425() {
    let (gateway, upstream, certificate, _dir) = gateway("early_data = true").await;
    let results = h3(
        gateway.http3_addresses[0],
        &certificate,
        json!({"early": true, "connections": [[
            {"method": "POST", "path": "/limited", "body": "pay"},
            get("/limited"),
        ]]}),
    )
    .await;
    let connection = &results[0];
    assert_eq!(connection["early_data_accepted"], true, "{connection}");
    let answers = responses(connection);
    assert_eq!(answers[0]["status"], 425, "{}", answers[0]);
    assert_eq!(answers[1]["status"], 200);
    let echoed: Value = serde_json::from_str(answers[1]["body"].as_str().unwrap()).unwrap();
    assert_eq!(echoed["headers"]["early-data"], "1");
    // The ticket's connection and the GET; the POST never went upstream, nor was it charged:
    // the GET (and the ticket's "/") leave two of the three tokens.
    assert_eq!(upstream.hits.load(std::sync::atomic::Ordering::SeqCst), 2);
    assert_eq!(header(&answers[1], "ratelimit-remaining"), Some("2"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_and_a_flood_of_initials_leave_the_listener_serving() {
    let (gateway, _upstream, certificate, _dir) = gateway("").await;
    let quic = gateway.http3_addresses[0];
    let report = quic::fixture(
        "quic_flood.py",
        json!({"host": "127.0.0.1", "port": quic.port(), "initials": 1300})
            .to_string()
            .as_bytes(),
    )
    .await;
    let report: Value = serde_json::from_str(&report).unwrap();
    eprintln!("flood: {report}");
    // Past 1,000 handshakes in progress, every Initial is answered with a Retry.
    let (handshakes, retries) = (
        report["handshakes"].as_u64().unwrap(),
        report["retries"].as_u64().unwrap(),
    );
    assert!(handshakes <= 1000, "{report}");
    assert!(retries >= 1, "{report}");
    let counted = metric(&gateway.render_metrics(), "tollgate_quic_retries_total");
    assert!(counted >= retries as f64, "{counted} < {retries}");
    // A real client is served meanwhile (proving its address first, if the flood is still on).
    let results = h3(quic, &certificate, json!({"connections": [[get("/")]]})).await;
    assert_eq!(responses(&results[0])[0]["status"], 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_requests_in_flight_end_and_takes_no_new_connection() {
    let (gateway, upstream, certificate, _dir) = gateway("").await;
    upstream
        .delay_ms
        .store(1500, std::sync::atomic::Ordering::SeqCst);
    let quic = gateway.http3_addresses[0];
    let spec = |path: &str| {
        json!({"host": "127.0.0.1", "port": quic.port(), "server_name": "localhost",
               "ca": certificate.cert.display().to_string(), "connections": [[get(path)]]})
        .to_string()
    };
    let in_flight = spec("/delayed");
    let slow =
        tokio::spawn(async move { quic::fixture("h3_client.py", in_flight.as_bytes()).await });
    eventually("the request reaches the upstream", || {
        upstream.hits.load(std::sync::atomic::Ordering::SeqCst) == 1
    })
    .await;
    assert!(gateway.shutdown().await, "drained within the grace period");
    let answered: Vec<Value> = serde_json::from_str(&slow.await.unwrap()).unwrap();
    let answer = &responses(&answered[0])[0];
    assert_eq!(answer["status"], 200, "{answer}");
    assert_eq!(answer["body"], "eventually");
    let after: Vec<Value> =
        serde_json::from_str(&quic::fixture("h3_client.py", spec("/").as_bytes()).await).unwrap();
    assert!(after[0]["error"].is_string(), "{}", after[0]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_s_renewed_certificate_serves_the_next_quic_connection() {
    let (gateway, upstream, first, dir) = gateway("").await;
    let quic = gateway.http3_addresses[0];
    let second = certificate(dir.path(), "second");
    let old = dir.path().join("old.pem");
    std::fs::copy(&first.cert, &old).unwrap();
    let one_get = || json!({"connections": [[get("/")]]});
    let trusting = |ca: std::path::PathBuf| async move {
        let results = quic::h3_client(quic, &ca, one_get()).await;
        results[0]["responses"][0]["status"] == 200
    };
    assert!(trusting(old.clone()).await);
    assert!(!trusting(second.cert.clone()).await);
    // Renewed certificate, same file names.
    std::fs::copy(&second.cert, &first.cert).unwrap();
    std::fs::copy(&second.key, &first.key).unwrap();
    gateway
        .reload(compile(&policy(&first, ""), upstream.address))
        .unwrap();
    assert!(trusting(second.cert.clone()).await);
    assert!(!trusting(old).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_says_h3_and_names_the_quic_fingerprint() {
    let dir = tempfile::tempdir().unwrap();
    let certificate = certificate(dir.path(), "server");
    let upstream = start_upstream().await;
    let file = dir.path().join("tollgate.toml");
    let policy = policy(&certificate, "").replace("{upstream}", &upstream.address.to_string());
    std::fs::write(&file, policy + "[admin]\nlisten = \"127.0.0.1:0\"\n").unwrap();
    let gateway = logged::LoggedGateway::start(&file);
    let listening = gateway.next_line("listening for HTTP/3");
    let quic: SocketAddr = listening["address"].as_str().unwrap().parse().unwrap();
    let results = h3(
        quic,
        &certificate,
        json!({"connections": [[get("/limited")]]}),
    )
    .await;
    assert_eq!(responses(&results[0])[0]["status"], 200);
    let access = gateway.next_line("tollgate::access");
    assert_eq!(access["protocol"], "h3", "{access}");
    assert_eq!(access["route"], "limited");
    assert!(
        access["ja4"].as_str().unwrap().starts_with("q13d"),
        "{access}"
    );
}
