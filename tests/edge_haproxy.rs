//! A real HAProxy (Debian's) in front of the gateway, as operators run it: TCP mode,
//! `send-proxy-v2` to the gateway, health checks that send a PROXY header of their own
//! (`LOCAL`). The client's address reaches the upstream through the header, and the checks
//! are neither refused nor counted as missing headers. `scripts/test.sh` installs HAProxy.
#![allow(clippy::disallowed_methods)] // a real process, waited for in real time

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::redis_server::free_port;
use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const POLICY: &str = r#"
[server]
listen = ["127.0.0.1:0"]
proxy_protocol = { from = ["127.0.0.1"] }

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

/// HAProxy, stopped by its PID when the test ends.
struct HaProxy(Child);

impl Drop for HaProxy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn haproxy() -> std::path::PathBuf {
    [
        "/usr/sbin/haproxy",
        "/usr/bin/haproxy",
        "/usr/local/sbin/haproxy",
    ]
    .iter()
    .map(std::path::PathBuf::from)
    .find(|path| path.is_file())
    .expect("haproxy: scripts/test.sh installs it from Debian")
}

/// What HAProxy's stats socket says of the gateway's server: its status and last check.
fn server_state(socket: &std::path::Path) -> Option<(String, String)> {
    use std::io::{Read, Write};
    let mut stream = std::os::unix::net::UnixStream::connect(socket).ok()?;
    stream.write_all(b"show stat\n").ok()?;
    let mut stats = String::new();
    stream.read_to_string(&mut stats).ok()?;
    let header: Vec<&str> = stats
        .lines()
        .next()?
        .trim_start_matches("# ")
        .split(',')
        .collect();
    let row: Vec<&str> = stats
        .lines()
        .find(|line| line.starts_with("gate,tollgate,"))?
        .split(',')
        .collect();
    let field = |name: &str| {
        Some(
            row.get(header.iter().position(|h| *h == name)?)?
                .to_string(),
        )
    };
    Some((field("status")?, field("check_status")?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn haproxy_with_send_proxy_v2_names_the_client_and_its_checks_pass() {
    let upstream = start_upstream().await;
    let gateway = start_gateway(POLICY, upstream.address).await;
    let dir = tempfile::tempdir().unwrap();
    let (port, socket) = (free_port(), dir.path().join("haproxy.sock"));
    let config = dir.path().join("haproxy.cfg");
    std::fs::write(
        &config,
        format!(
            "global\n  maxconn 100\n  stats socket {}\n\ndefaults\n  mode tcp\n  timeout connect 2s\n  timeout client 10s\n  timeout server 10s\n\nfrontend front\n  bind 127.0.0.1:{port}\n  default_backend gate\n\nbackend gate\n  server tollgate {} send-proxy-v2 check check-send-proxy inter 100ms\n",
            socket.display(),
            gateway.addresses[0]
        ),
    )
    .unwrap();
    let _haproxy = HaProxy(
        Command::new(haproxy())
            .arg("-db")
            .arg("-f")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("haproxy starts"),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some((status, check)) = server_state(&socket) {
            if status == "UP" && check == "L4OK" {
                break;
            }
        }
        assert!(
            Instant::now() < deadline,
            "HAProxy's checks of the gateway never passed"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // The client comes from 127.0.0.3; HAProxy reaches the gateway from 127.0.0.1.
    let ask = || async {
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind("127.0.0.3:0".parse().unwrap()).unwrap();
        let mut stream = socket
            .connect(format!("127.0.0.1:{port}").parse().unwrap())
            .await
            .unwrap();
        stream
            .write_all(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut response = Vec::new();
        let _ = stream.read_to_end(&mut response).await;
        String::from_utf8_lossy(&response).into_owned()
    };
    for _ in 0..2 {
        let response = ask().await;
        assert_eq!(raw_status(&response), 200, "{response}");
        assert!(
            response.contains("\"x-forwarded-for\":\"127.0.0.3\""),
            "{response}"
        );
    }
    assert_eq!(
        raw_status(&ask().await),
        429,
        "the client's own limit, not HAProxy's"
    );
    assert_eq!(
        metric(
            &gateway.render_metrics(),
            "tollgate_connections_refused_total{reason=\"proxy_protocol\"}"
        ),
        0.0,
        "a health check's LOCAL header is a valid one"
    );
}
