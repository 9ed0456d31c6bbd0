//! Concurrency slots shared through a real redis-server: two replicas (one of them a separate
//! `tollgate` process) share a key's slots, and the slots of a replica killed with SIGKILL
//! come back once their lease runs out.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::redis_server::{free_port, RedisServer};
use common::*;

/// The shared policy; the separate replica's file adds its listeners.
fn policy(redis: &RedisServer) -> String {
    format!(
        r#"
[store]
backend = "redis"
url = "{url}"
timeout = "2s"
hash_key = "test-secret-0123456789"
lease = "3s"

[upstreams.app]
url = "http://{{upstream}}"

[limits.exports]
key = {{ header = "x-user" }}
concurrency = 2

[[routes]]
name = "exports"
path_prefix = "/"
upstream = "app"
limits = ["exports"]
"#,
        url = redis.url()
    )
}

/// A replica of its own process, killed (SIGKILL) however the test ends.
struct Replica(std::process::Child);

impl Drop for Replica {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn export(address: std::net::SocketAddr, user: &str) -> (u16, tokio::net::TcpStream) {
    let request = format!("GET /held-body HTTP/1.1\r\nHost: a\r\nx-user: {user}\r\n\r\n");
    let (head, stream) = raw_head(address, request.as_bytes()).await;
    (raw_status(&head), stream)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_slots_and_a_killed_replicas_slots_come_back_after_the_lease() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let (listen, admin) = (free_port(), free_port());
    let text = policy(&redis).replace("{upstream}", &upstream.address.to_string());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tollgate.toml");
    let listeners = format!(
        "[server]\nlisten = [\"127.0.0.1:{listen}\"]\n[admin]\nlisten = \"127.0.0.1:{admin}\"\n"
    );
    std::fs::write(&file, format!("{listeners}{text}")).unwrap();
    let mut killed = Replica(
        Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["run", "--config", file.to_str().unwrap()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("tollgate"),
    );
    let first: std::net::SocketAddr = format!("127.0.0.1:{listen}").parse().unwrap();
    eventually("the first replica listens", || {
        std::net::TcpStream::connect(first).is_ok()
    })
    .await;
    let second = start_gateway(&text, upstream.address).await;

    // One export of ann on each replica: both of her slots, shared through Redis.
    let (status, _held_first) = export(first, "ann").await;
    assert_eq!(status, 200);
    let (status, _held_second) = export(second.addresses[0], "ann").await;
    assert_eq!(status, 200);
    let (status, _) = export(second.addresses[0], "ann").await;
    assert_eq!(status, 429, "the slots are shared by both replicas");
    let slots = format!("tollgate:exports:{}:slots", ann_key());
    assert_eq!(
        redis.cli(&["ZCARD", &slots]).trim(),
        "2",
        "two leases in Redis"
    );

    // The first replica dies without giving its slot back; the slot returns with its lease.
    killed.0.kill().unwrap();
    killed.0.wait().unwrap();
    let mut admitted = None;
    for _ in 0..200 {
        let (status, stream) = export(second.addresses[0], "ann").await;
        if status == 200 {
            admitted = Some(stream);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        admitted.is_some(),
        "the killed replica's slot never came back"
    );
    // A request that ends gives its slot back (in the background, within moments): bob's
    // five short requests never find his two slots taken (leases left behind last 3 s).
    let client = HttpClient::new(second.addresses[0]);
    for _ in 0..5 {
        assert_eq!(client.get("/", &[("x-user", "bob")]).await.status, 200);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        metric(
            &second.render_metrics(),
            r#"tollgate_concurrency_in_use{limit="exports"}"#
        ),
        2.0
    );
}

/// Ann's key as the store spells it: the keyed hash of her header.
fn ann_key() -> String {
    let hasher = tollgate::key::KeyHasher::from_secret(b"test-secret-0123456789");
    let mut text = String::new();
    tollgate::limit::KeyPart::Digest(hasher.digest(b"ann")).push_to(&mut text);
    text
}
