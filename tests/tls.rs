//! TLS termination (HTTP/1.1 and HTTP/2 via ALPN), certificate reload, https upstreams.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use common::*;
use http::{Request, Version};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::RootCertStore;

fn client_config(trusted: &CertificateDer<'static>, alpn: &[&[u8]]) -> rustls::ClientConfig {
    let mut roots = RootCertStore::empty();
    roots.add(trusted.clone()).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    config
}

type HttpsClient = Client<hyper_rustls::HttpsConnector<HttpConnector>, Full<Bytes>>;

fn https_client(trusted: &CertificateDer<'static>, http2: bool) -> HttpsClient {
    let builder = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(client_config(trusted, &[]))
        .https_only();
    let connector = if http2 {
        builder.enable_http2().build()
    } else {
        builder.enable_http1().build()
    };
    Client::builder(TokioExecutor::new())
        .http2_only(http2)
        .build(connector)
}

async fn get(
    client: &HttpsClient,
    address: SocketAddr,
    path: &str,
) -> (u16, Version, http::HeaderMap, Bytes) {
    let request = Request::get(format!("https://localhost:{}{path}", address.port()))
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = client.request(request).await.expect("https response");
    let (parts, body) = response.into_parts();
    (
        parts.status.as_u16(),
        parts.version,
        parts.headers,
        body.collect().await.unwrap().to_bytes(),
    )
}

fn tls_policy(certificate: &Certificate) -> String {
    format!(
        r#"
[server]
listen = ["127.0.0.1:0"]
tls = {{ cert = "{}", key = "{}" }}

[upstreams.app]
url = "http://{{upstream}}"

[limits.per_network]
key = "client_network"
capacity = 3
rate = "1/h"

[[routes]]
name = "default"
path_prefix = "/"
upstream = "app"
limits = ["per_network"]
"#,
        certificate.cert.display(),
        certificate.key.display()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_over_http1_and_http2_sees_the_same_limits() {
    let dir = tempfile::tempdir().unwrap();
    let certificate = certificate(dir.path(), "server");
    let upstream = start_upstream().await;
    let gateway = start_gateway(&tls_policy(&certificate), upstream.address).await;
    let address = gateway.addresses[0];

    let http1 = https_client(&certificate.der, false);
    let (status, version, headers, body) = get(&http1, address, "/hello").await;
    assert_eq!((status, version), (200, Version::HTTP_11));
    assert_eq!(headers["ratelimit-remaining"], "2");
    let seen: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(seen["headers"]["x-forwarded-proto"], "https");
    assert_eq!(
        seen["headers"]["host"],
        format!("localhost:{}", address.port())
    );

    let http2 = https_client(&certificate.der, true);
    let (status, version, headers, _) = get(&http2, address, "/hello").await;
    assert_eq!((status, version), (200, Version::HTTP_2), "ALPN h2");
    assert_eq!(headers["ratelimit-remaining"], "1");
    assert_eq!(get(&http2, address, "/hello").await.0, 200);
    let (status, version, headers, body) = get(&http2, address, "/hello").await;
    assert_eq!((status, version), (429, Version::HTTP_2));
    assert_eq!(headers["retry-after"], "3600");
    assert_eq!(headers["ratelimit-limit"], "3");
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&body).unwrap()["error"],
        "too_many_requests"
    );
}

/// The certificate a fresh TLS connection to `address` is shown.
async fn presented_certificate(
    address: SocketAddr,
    trusted: &[&CertificateDer<'static>],
) -> CertificateDer<'static> {
    let mut roots = RootCertStore::empty();
    for certificate in trusted {
        roots.add((*certificate).clone()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let tls = connector
        .connect(ServerName::try_from("localhost").unwrap(), stream)
        .await
        .expect("handshake");
    tls.get_ref().1.peer_certificates().unwrap()[0].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn certificates_are_re_read_on_reload_and_tls_1_2_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let first = certificate(dir.path(), "first");
    let upstream = start_upstream().await;
    let gateway = start_gateway(&tls_policy(&first), upstream.address).await;
    let address = gateway.addresses[0];
    let second = certificate(dir.path(), "second");
    assert_eq!(
        presented_certificate(address, &[&first.der, &second.der]).await,
        first.der
    );
    // Renewed certificate, same file names.
    std::fs::copy(&second.cert, &first.cert).unwrap();
    std::fs::copy(&second.key, &first.key).unwrap();
    gateway
        .reload(compile(&tls_policy(&first), upstream.address))
        .unwrap();
    assert_eq!(
        presented_certificate(address, &[&first.der, &second.der]).await,
        second.der
    );

    // A broken key file makes the reload fail and keeps the current certificate.
    std::fs::write(&first.key, "not a key").unwrap();
    assert!(gateway
        .reload(compile(&tls_policy(&first), upstream.address))
        .is_err());
    assert_eq!(
        presented_certificate(address, &[&first.der, &second.der]).await,
        second.der
    );
    assert!(
        metric(
            &gateway.render_metrics(),
            r#"tollgate_config_reloads_total{result="error"}"#
        ) >= 1.0
    );

    // TLS 1.2 clients are served too (1.3 is preferred; nothing older is offered).
    let tls12 = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_protocol_versions(&[&rustls::version::TLS12])
    .unwrap()
    .with_root_certificates({
        let mut roots = RootCertStore::empty();
        roots.add(second.der.clone()).unwrap();
        roots
    })
    .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls12));
    let stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let tls = connector
        .connect(ServerName::try_from("localhost").unwrap(), stream)
        .await
        .expect("TLS 1.2 works");
    assert_eq!(
        tls.get_ref().1.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_2)
    );
}

/// An upstream that speaks TLS only, answering 200 "secure upstream".
async fn start_tls_upstream(certificate: &Certificate) -> SocketAddr {
    let files = tollgate::config::TlsFiles {
        cert: certificate.cert.clone(),
        key: certificate.key.clone(),
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(tollgate::tls::server_config(&files).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(stream).await else {
                    return;
                };
                let service = hyper::service::service_fn(|_request| async {
                    Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                        Bytes::from_static(b"secure upstream"),
                    )))
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    address
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_upstreams_are_verified_against_the_configured_roots() {
    let dir = tempfile::tempdir().unwrap();
    let certificate = certificate(dir.path(), "upstream");
    let secure = start_tls_upstream(&certificate).await;
    let policy = format!(
        r#"
[upstreams.trusted]
url = "https://localhost:{port}"
ca_file = "{ca}"

[upstreams.system_roots]
url = "https://localhost:{port}"

[[routes]]
name = "trusted"
path = "/trusted"
upstream = "trusted"

[[routes]]
name = "untrusted"
path = "/untrusted"
upstream = "system_roots"
"#,
        port = secure.port(),
        ca = certificate.cert.display()
    );
    let gateway = start_gateway(&policy, secure).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let reply = client.get("/trusted", &[]).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.body, "secure upstream");
    assert_eq!(
        client.get("/untrusted", &[]).await.status,
        502,
        "a self-signed upstream is not trusted by default"
    );
}

#[test]
fn unusable_certificate_files_are_configuration_errors() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tollgate.toml");
    std::fs::write(dir.path().join("server.pem"), "garbage").unwrap();
    std::fs::write(
        &file,
        "[server]\ntls = { cert = \"server.pem\", key = \"missing.key\" }\n[upstreams.app]\nurl = \"http://127.0.0.1:1\"\n[[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"app\"\n",
    )
    .unwrap();
    let errors = tollgate::config::Policy::load(&file)
        .unwrap_err()
        .to_string();
    assert!(errors.contains("server.tls: no certificate in"), "{errors}");
    assert!(
        errors.contains("server.pem"),
        "paths are relative to the policy file: {errors}"
    );
}
