//! The admin listener's connection guards, over real sockets and as an attacker would probe
//! them: a head trickled a byte at a time, connections left idle, and more connections than
//! its cap, while `/healthz` keeps answering for the probes.

#![allow(clippy::disallowed_methods)] // tests measure real time

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const POLICY: &str = r#"
[server]
listen = ["127.0.0.1:0"]
header_read_timeout = "{head}"
idle_timeout = "{idle}"

[admin]
max_connections = 4

[upstreams.app]
url = "http://{upstream}"

[[routes]]
name = "all"
path_prefix = "/"
upstream = "app"
"#;

/// Far beyond every timeout the policies here set: a connection still open then was not cut.
const LONG_AFTER: Duration = Duration::from_secs(20);

async fn gateway(head: &str, idle: &str) -> (tollgate::Tollgate, Upstream) {
    let upstream = start_upstream().await;
    let policy = POLICY.replace("{head}", head).replace("{idle}", idle);
    (start_gateway(&policy, upstream.address).await, upstream)
}

/// Whether the server closes `stream` before `LONG_AFTER`, reading (and dropping) whatever
/// it sends meanwhile.
async fn closed_by_server(stream: &mut TcpStream) -> bool {
    let mut buffer = [0u8; 1024];
    let deadline = Instant::now() + LONG_AFTER;
    while Instant::now() < deadline {
        match tokio::time::timeout_at(deadline.into(), stream.read(&mut buffer)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
    false
}

async fn get(address: SocketAddr, path: &str) -> (u16, String) {
    let response = raw(
        address,
        format!("GET {path} HTTP/1.1\r\nhost: admin\r\nconnection: close\r\n\r\n").as_bytes(),
    )
    .await;
    (raw_status(&response), response)
}

#[tokio::test]
async fn a_head_trickled_a_byte_at_a_time_is_cut_at_the_header_read_timeout() {
    let (gateway, _upstream) = gateway("500ms", "60s").await;
    let mut stream = TcpStream::connect(gateway.admin_address).await.unwrap();
    let started = Instant::now();
    let trickle = b"GET /metrics HTTP/1.1\r\nx-slow: "
        .iter()
        .chain([b'a'; 400].iter());
    let mut cut = false;
    for byte in trickle {
        if stream.write_all(&[*byte]).await.is_err() {
            cut = true;
            break;
        }
        let mut probe = [0u8; 256];
        match tokio::time::timeout(Duration::from_millis(100), stream.read(&mut probe)).await {
            Ok(Ok(0)) | Ok(Err(_)) => {
                cut = true;
                break;
            }
            // A 408 or the like before closing is fine; the close is what counts.
            Ok(Ok(_)) => {}
            Err(_) => {}
        }
        if started.elapsed() > LONG_AFTER {
            break;
        }
    }
    assert!(
        cut,
        "a trickled head was still open after {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_connection_that_sends_nothing_is_cut_at_the_header_read_timeout() {
    let (gateway, _upstream) = gateway("500ms", "60s").await;
    let mut stream = TcpStream::connect(gateway.admin_address).await.unwrap();
    assert!(closed_by_server(&mut stream).await);
}

#[tokio::test]
async fn an_idle_keep_alive_connection_is_closed_at_the_idle_timeout() {
    let (gateway, _upstream) = gateway("10s", "1s").await;
    let mut stream = TcpStream::connect(gateway.admin_address).await.unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: admin\r\n\r\n")
        .await
        .unwrap();
    let response = read_response(&mut stream, false).await;
    assert_eq!(response.status(), 200);
    assert!(closed_by_server(&mut stream).await);
}

#[tokio::test]
async fn past_max_connections_healthz_answers_and_the_rest_is_503() {
    let (gateway, _upstream) = gateway("60s", "60s").await;
    let admin = gateway.admin_address;
    // Four keep-alive connections take the cap and stay.
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut stream = TcpStream::connect(admin).await.unwrap();
        stream
            .write_all(b"GET /healthz HTTP/1.1\r\nhost: admin\r\n\r\n")
            .await
            .unwrap();
        assert_eq!(read_response(&mut stream, false).await.status(), 200);
        held.push(stream);
    }

    let (status, _) = get(admin, "/healthz").await;
    assert_eq!(
        status, 200,
        "a probe must not see a flooded admin port as dead"
    );
    let (status, response) = get(admin, "/metrics").await;
    assert_eq!(status, 503, "{response}");
    assert!(response.contains("max_connections"), "{response}");

    // An overflow connection answers once and closes, even when its client wants more.
    let mut stream = TcpStream::connect(admin).await.unwrap();
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nhost: admin\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_response(&mut stream, false).await.status(), 200);
    assert!(closed_by_server(&mut stream).await);

    // A slot that frees up serves everything again, and the overflow was counted.
    drop(held.pop());
    let mut scrape = String::new();
    for _ in 0..100 {
        let (status, response) = get(admin, "/metrics").await;
        if status == 200 {
            scrape = response;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        !scrape.is_empty(),
        "/metrics stayed 503 after a connection closed"
    );
    assert!(metric(&scrape, "tollgate_admin_connections_over_limit_total") >= 3.0);
}

/// Out of file descriptors, neither accept loop spins: each backs off 50 ms after a failed
/// accept. Counted from the gateway's own warnings, not from its CPU, so that a loaded machine
/// cannot make a spinning loop look idle.
#[test]
fn out_of_file_descriptors_the_accept_loops_back_off() {
    use std::io::Read as _;
    let free = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|listener| listener.local_addr())
            .unwrap()
            .port()
    };
    let (listen, admin) = (free(), free());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tollgate.toml");
    std::fs::write(
        &file,
        format!(
            "[server]\nlisten = [\"127.0.0.1:{listen}\"]\nheader_read_timeout = \"30s\"\n\
             [admin]\nlisten = \"127.0.0.1:{admin}\"\n\
             [upstreams.app]\nurl = \"http://127.0.0.1:9\"\n\
             [[routes]]\nname = \"all\"\npath_prefix = \"/\"\nupstream = \"app\"\n"
        ),
    )
    .unwrap();
    // 40 descriptors: the process's own and a handful of connections.
    let mut gateway = std::process::Command::new("prlimit")
        .args(["--nofile=40:40", "--"])
        .arg(env!("CARGO_BIN_EXE_tollgate"))
        .args(["--worker-threads", "1", "run", "--config"])
        .arg(&file)
        .env("RUST_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("prlimit (util-linux) and tollgate");
    let started = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", admin)).is_err() {
        assert!(started.elapsed() < LONG_AFTER, "the gateway did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Connections that send nothing hold descriptors until the header read timeout; the
    // kernel keeps accepting more into the backlog, which the gateway cannot take.
    let mut held = Vec::new();
    for port in [listen, admin].into_iter().cycle().take(120) {
        if let Ok(stream) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            held.push(stream);
        }
    }
    std::thread::sleep(Duration::from_millis(1500));
    let _ = gateway.kill();
    let mut stderr = String::new();
    gateway
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    let _ = gateway.wait();
    let failures: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains("accept failed"))
        .collect();
    // Both listeners ran out, and went through the one accept that backs off.
    for port in [listen, admin] {
        let of_port = format!("127.0.0.1:{port}");
        assert!(
            failures.iter().any(|line| line.contains(&of_port)),
            "no failed accept of {of_port} was logged:\n{stderr}"
        );
    }
    // Two listeners backing off 50 ms for 1.5 s fail at most about 60 times; a loop that
    // retries at once fails thousands of times, even on a busy machine.
    let failed = failures.len();
    assert!(
        failed < 150,
        "{failed} failed accepts in 1.5 s: an accept loop spins"
    );
}
