//! One client, one connection, keep-alive: `REQUESTS` GETs of `PATH` one after another, over
//! HTTP/3 (quinn + h3) or HTTP/2 with TLS (hyper over rustls), trusting the certificate in
//! `CA`. Prints one line: requests, then how many got each status. Bounded in requests;
//! loopback only. Run by `bench/http3.sh`.
//!
//! Usage: h3_load h3|h2 ADDRESS CA PATH REQUESTS

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject as _;

type Error = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    let args: Vec<String> = std::env::args().collect();
    let usage = "usage: h3_load h3|h2 ADDRESS CA PATH REQUESTS";
    let [_, protocol, address, ca, path, requests] = &args[..] else {
        eprintln!("{usage}");
        std::process::exit(2);
    };
    let address: SocketAddr = address.parse()?;
    let requests: usize = requests.parse()?;
    assert!(address.ip().is_loopback(), "{usage}: loopback only");
    assert!(
        (1..=1_000_000).contains(&requests),
        "{usage}: 1 to 1000000 requests"
    );
    let uri = format!("https://localhost:{}{path}", address.port());
    let statuses = match protocol.as_str() {
        "h3" => over_h3(address, &tls(ca, b"h3")?, &uri, requests).await?,
        "h2" => over_h2(address, &tls(ca, b"h2")?, &uri, requests).await?,
        _ => {
            eprintln!("{usage}");
            std::process::exit(2);
        }
    };
    let counted: Vec<String> = statuses
        .iter()
        .map(|(status, count)| format!("{status}:{count}"))
        .collect();
    println!("{requests} {}", counted.join(" "));
    Ok(())
}

fn tls(ca: &str, alpn: &[u8]) -> Result<rustls::ClientConfig, Error> {
    let mut roots = rustls::RootCertStore::empty();
    for certificate in rustls::pki_types::CertificateDer::pem_file_iter(ca)? {
        roots.add(certificate?)?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(config)
}

async fn over_h3(
    address: SocketAddr,
    tls: &rustls::ClientConfig,
    uri: &str,
    requests: usize,
) -> Result<BTreeMap<u16, usize>, Error> {
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(tls.clone())?;
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse()?)?;
    endpoint.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
    let connection = endpoint.connect(address, "localhost")?.await?;
    let (mut driver, mut sender) = h3::client::new(h3_quinn::Connection::new(connection)).await?;
    let driving = tokio::spawn(async move { driver.wait_idle().await });
    let mut statuses = BTreeMap::new();
    for _ in 0..requests {
        let mut stream = sender
            .send_request(http::Request::get(uri).body(())?)
            .await?;
        stream.finish().await?;
        let response = stream.recv_response().await?;
        while stream.recv_data().await?.is_some() {}
        *statuses.entry(response.status().as_u16()).or_insert(0) += 1;
    }
    drop(sender);
    driving.abort();
    endpoint.close(0u32.into(), b"done");
    Ok(statuses)
}

async fn over_h2(
    address: SocketAddr,
    tls: &rustls::ClientConfig,
    uri: &str,
    requests: usize,
) -> Result<BTreeMap<u16, usize>, Error> {
    let connector = tokio_rustls::TlsConnector::from(Arc::new(tls.clone()));
    let tcp = tokio::net::TcpStream::connect(address).await?;
    tcp.set_nodelay(true)?;
    let name = rustls::pki_types::ServerName::try_from("localhost")?;
    let stream = connector.connect(name, tcp).await?;
    let (mut sender, connection) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let mut statuses = BTreeMap::new();
    for _ in 0..requests {
        let request = http::Request::get(uri).body(Empty::<Bytes>::new())?;
        let response = sender.send_request(request).await?;
        let status = response.status().as_u16();
        response.into_body().collect().await?;
        *statuses.entry(status).or_insert(0) += 1;
    }
    Ok(statuses)
}
