//! `[server.tls.acme]` against a real ACME server: Debian's `pebble`, resolving every name to
//! loopback through `pebble-challtestsrv`, validating tls-alpn-01 and http-01 against the
//! gateway's own listeners (no "always valid" switch).

#![allow(clippy::disallowed_methods)] // real processes, real time

mod common;

use std::net::SocketAddr;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use common::pki::Pki;
use common::redis_server::free_port;
use common::*;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::RootCertStore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tollgate::Tollgate;

/// pebble and its DNS, stopped by PID when dropped.
struct Pebble {
    processes: Vec<Child>,
    directory: String,
    management: SocketAddr,
}

impl Drop for Pebble {
    fn drop(&mut self) {
        for process in &mut self.processes {
            let _ = process.kill();
            let _ = process.wait();
        }
    }
}

fn program(name: &str) -> String {
    let found = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|dir| dir.join(name))
        .find(|path| path.is_file());
    found
        .unwrap_or_else(|| panic!("{name} not found: scripts/test.sh installs pebble from Debian"))
        .to_string_lossy()
        .into_owned()
}

/// Starts pebble (its directory over TLS with a certificate of `pki`), validating on the
/// gateway's `http_port` and `tls_port`, every name resolving to 127.0.0.1.
async fn start_pebble(dir: &Path, pki: &Pki, http_port: u16, tls_port: u16) -> Pebble {
    start_pebble_on(dir, pki, http_port, tls_port, None).await
}

/// As [`start_pebble`], its directory on `listen`.
async fn start_pebble_at(
    dir: &Path,
    pki: &Pki,
    http_port: u16,
    tls_port: u16,
    listen: u16,
) -> Pebble {
    start_pebble_on(dir, pki, http_port, tls_port, Some(listen)).await
}

/// A port from `free_port` can still be taken before pebble binds it (by a process outside
/// the tests, say): a pebble that exits is started again on fresh ports, and
/// what it said is in the panic when it never comes up.
async fn start_pebble_on(
    dir: &Path,
    pki: &Pki,
    http_port: u16,
    tls_port: u16,
    listen: Option<u16>,
) -> Pebble {
    let mut said = Vec::new();
    for attempt in 0..5 {
        let listen = listen.unwrap_or_else(free_port);
        let log = dir.join(format!("pebble-{attempt}.log"));
        let mut pebble = launch_pebble(dir, pki, http_port, tls_port, listen, &log);
        let address = SocketAddr::from(([127, 0, 0, 1], listen));
        match listening(&mut pebble, address).await {
            Ok(()) => return pebble,
            Err(exit) => said.push(format!(
                "attempt {attempt} on {address}: {exit}\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            )),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("pebble did not listen:\n{}", said.join("\n"));
}

/// Waits until pebble accepts on `address` (up to 30 s), or says how it or its DNS ended.
async fn listening(pebble: &mut Pebble, address: SocketAddr) -> Result<(), String> {
    for _ in 0..1500 {
        if tokio::net::TcpStream::connect(address).await.is_ok() {
            return Ok(());
        }
        for process in &mut pebble.processes {
            if let Ok(Some(status)) = process.try_wait() {
                return Err(format!("a process exited ({status})"));
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Err("still not listening after 30 s".to_owned())
}

/// pebble and `pebble-challtestsrv` on fresh ports of their own, both writing to `log`.
fn launch_pebble(
    dir: &Path,
    pki: &Pki,
    http_port: u16,
    tls_port: u16,
    listen: u16,
    log: &Path,
) -> Pebble {
    let own = pki.leaf("pebble", &["localhost", "127.0.0.1"], 30);
    let (management, dns, dns_management) = (free_port(), free_port(), free_port());
    let config = serde_json::json!({
        "pebble": {
            "listenAddress": format!("127.0.0.1:{listen}"),
            "managementListenAddress": format!("127.0.0.1:{management}"),
            "certificate": own.cert,
            "privateKey": own.key,
            "httpPort": http_port,
            "tlsPort": tls_port,
            "ocspResponderURL": "",
            "externalAccountBindingRequired": false
        }
    });
    let config_file = dir.join("pebble.json");
    std::fs::write(&config_file, config.to_string()).unwrap();
    let log = std::fs::File::create(log).unwrap();
    let to_log = || Stdio::from(log.try_clone().unwrap());
    let dns_server = Command::new(program("pebble-challtestsrv"))
        .args(["-defaultIPv4", "127.0.0.1", "-defaultIPv6", ""])
        .args(["-dns01", &format!("127.0.0.1:{dns}")])
        .args(["-http01", "", "-https01", "", "-tlsalpn01", ""])
        .args(["-management", &format!("127.0.0.1:{dns_management}")])
        .stdout(to_log())
        .stderr(to_log())
        .spawn()
        .expect("pebble-challtestsrv starts");
    let pebble = Command::new(program("pebble"))
        .args(["-config", config_file.to_str().unwrap()])
        .args(["-dnsserver", &format!("127.0.0.1:{dns}")])
        // No random pause before validating, and no nonce refused on purpose: validation
        // itself is real.
        .env("PEBBLE_VA_NOSLEEP", "1")
        .env("PEBBLE_WFE_NONCEREJECT", "0")
        .stdout(to_log())
        .stderr(to_log())
        .spawn()
        .expect("pebble starts");
    Pebble {
        processes: vec![pebble, dns_server],
        directory: format!("https://127.0.0.1:{listen}/dir"),
        management: SocketAddr::from(([127, 0, 0, 1], management)),
    }
}

/// A GET over TLS (trusting `ca`), its body.
async fn https_get(address: SocketAddr, ca: &CertificateDer<'static>, path: &str) -> String {
    let stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let mut tls = connector(std::slice::from_ref(ca))
        .connect(ServerName::try_from("127.0.0.1").unwrap(), stream)
        .await
        .unwrap();
    tls.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut answer = Vec::new();
    let _ = tls.read_to_end(&mut answer).await;
    let answer = String::from_utf8_lossy(&answer).into_owned();
    answer.split_once("\r\n\r\n").unwrap().1.to_owned()
}

fn connector(roots: &[CertificateDer<'static>]) -> tokio_rustls::TlsConnector {
    let mut store = RootCertStore::empty();
    for root in roots {
        store.add(root.clone()).unwrap();
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(store)
    .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// The leaf a handshake for `name` is shown, verified against `roots`.
async fn presented(
    address: SocketAddr,
    roots: &[CertificateDer<'static>],
    name: &str,
) -> std::io::Result<Vec<u8>> {
    let stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let tls = connector(roots)
        .connect(ServerName::try_from(name.to_owned()).unwrap(), stream)
        .await?;
    Ok(tls.get_ref().1.peer_certificates().unwrap()[0].to_vec())
}

/// Every root pebble may issue from (it makes them at start).
async fn pebble_roots(pebble: &Pebble, pki: &Pki) -> Vec<CertificateDer<'static>> {
    let pem = https_get(pebble.management, &pki.ca, "/roots/0").await;
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap()
}

fn acme_policy(
    pebble_directory: &str,
    pki: &Pki,
    state_dir: &Path,
    ports: (u16, u16),
    challenge: &str,
    default: &common::pki::Leaf,
) -> String {
    format!(
        "[server]\nlisten = [\"127.0.0.1:{}\"]\nplain_listen = [\"127.0.0.1:{}\"]\n\
         [[server.tls.certificates]]\ncert = {:?}\nkey = {:?}\n\
         [server.tls.acme]\ndirectory = {pebble_directory:?}\nemail = \"ops@example.com\"\n\
         hosts = [\"shop.test\", \"api.test\"]\nchallenge = {challenge:?}\nstate_dir = {state_dir:?}\n\
         ca_file = {:?}\n\
         [upstreams.app]\nurl = \"http://{{upstream}}\"\n\
         [[routes]]\nname = \"all\"\npath_prefix = \"/\"\nupstream = \"app\"\n",
        ports.0, ports.1, default.cert, default.key, pki.ca_file
    )
}

async fn orders(gateway: &Tollgate, result: &str) -> f64 {
    metric(
        &gateway.render_metrics(),
        &format!("tollgate_acme_orders_total{{result=\"{result}\"}}"),
    )
}

/// Waits up to `seconds` for an order to end well.
async fn obtained(gateway: &Tollgate, seconds: u64) {
    for _ in 0..seconds * 10 {
        if orders(gateway, "ok").await >= 1.0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "no certificate obtained in {seconds} s (orders failed: {})",
        orders(gateway, "error").await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_alpn_01_obtains_a_certificate_that_a_restart_keeps() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let default = pki.leaf("default", &["default.example"], 30);
    let ports = (free_port(), free_port());
    let pebble = start_pebble(dir.path(), &pki, ports.1, ports.0).await;
    let state_dir = dir.path().join("acme");
    let upstream = start_upstream().await;
    let text = acme_policy(
        &pebble.directory,
        &pki,
        &state_dir,
        ports,
        "tls-alpn-01",
        &default,
    );
    let gateway = start_gateway(&text, upstream.address).await;
    let address = gateway.addresses[0];
    obtained(&gateway, 60).await;

    let roots = pebble_roots(&pebble, &pki).await;
    let served = presented(address, &roots, "shop.test")
        .await
        .expect("a certificate pebble issued");
    assert_eq!(
        presented(address, &roots, "api.test").await.unwrap(),
        served,
        "one order for both"
    );
    // Other names keep the file's certificate.
    assert_eq!(
        presented(address, std::slice::from_ref(&pki.ca), "default.example")
            .await
            .unwrap(),
        default.der.to_vec()
    );
    let left = metric(
        &gateway.render_metrics(),
        r#"tollgate_tls_certificate_expiry_seconds{host="shop.test"}"#,
    );
    assert!(left > 86_400.0, "{left}");
    let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&state_dir), 0o700);
    for file in ["account.json", "certificate.pem", "certificate.key"] {
        assert_eq!(mode(&state_dir.join(file)), 0o600, "{file}");
    }
    assert_eq!(
        upstream.hits.load(std::sync::atomic::Ordering::Relaxed),
        0,
        "nothing forwarded"
    );

    // A restart serves what state_dir holds and orders nothing.
    gateway.shutdown().await;
    drop(gateway);
    let restarted = start_gateway(&text, upstream.address).await;
    assert_eq!(
        presented(restarted.addresses[0], &roots, "shop.test")
            .await
            .unwrap(),
        served
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(orders(&restarted, "ok").await, 0.0);
    assert_eq!(orders(&restarted, "error").await, 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http_01_is_answered_on_the_plain_listener_and_never_forwarded() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let default = pki.leaf("default", &["default.example"], 30);
    let ports = (free_port(), free_port());
    let pebble = start_pebble(dir.path(), &pki, ports.1, ports.0).await;
    let upstream = start_upstream().await;
    let text = acme_policy(
        &pebble.directory,
        &pki,
        &dir.path().join("acme"),
        ports,
        "http-01",
        &default,
    );
    let gateway = start_gateway(&text, upstream.address).await;
    obtained(&gateway, 60).await;
    let roots = pebble_roots(&pebble, &pki).await;
    presented(gateway.addresses[0], &roots, "api.test")
        .await
        .expect("a certificate pebble issued");
    assert_eq!(
        upstream.hits.load(std::sync::atomic::Ordering::Relaxed),
        0,
        "validations never reach the upstream"
    );
    // A token no order waits on is a 404 of the gateway's, not the upstream's.
    let plain = gateway.plain_addresses[0];
    let answer = raw(plain, b"GET /.well-known/acme-challenge/nothing HTTP/1.1\r\nHost: shop.test\r\nConnection: close\r\n\r\n").await;
    assert_eq!(raw_status(&answer), 404, "{answer}");
    assert_eq!(upstream.hits.load(std::sync::atomic::Ordering::Relaxed), 0);
    // Everything else on the plain listener is routed as usual.
    let answer = raw(
        plain,
        b"GET /app HTTP/1.1\r\nHost: shop.test\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(raw_status(&answer), 200, "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_down_at_start_leaves_the_default_serving_until_it_is_back() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(dir.path());
    let default = pki.leaf("default", &["shop.test", "api.test"], 30);
    let ports = (free_port(), free_port());
    let upstream = start_upstream().await;
    // The directory's address is fixed before pebble runs there.
    let pebble_port = free_port();
    let directory = format!("https://127.0.0.1:{pebble_port}/dir");
    let text = acme_policy(
        &directory,
        &pki,
        &dir.path().join("acme"),
        ports,
        "tls-alpn-01",
        &default,
    );
    let gateway = start_gateway(&text, upstream.address).await;
    eventually("the first order fails", || {
        metric(
            &gateway.render_metrics(),
            r#"tollgate_acme_orders_total{result="error"}"#,
        ) >= 1.0
    })
    .await;
    // Served meanwhile: the default certificate, for the ACME hosts too.
    assert_eq!(
        presented(
            gateway.addresses[0],
            std::slice::from_ref(&pki.ca),
            "shop.test"
        )
        .await
        .unwrap(),
        default.der.to_vec()
    );
    let pebble = start_pebble_at(dir.path(), &pki, ports.1, ports.0, pebble_port).await;
    // The retry comes a minute after the failure.
    obtained(&gateway, 90).await;
    let roots = pebble_roots(&pebble, &pki).await;
    presented(gateway.addresses[0], &roots, "shop.test")
        .await
        .expect("the ordered certificate, once the directory is back");
    assert_eq!(
        orders(&gateway, "error").await,
        1.0,
        "at most one order a minute"
    );
}
