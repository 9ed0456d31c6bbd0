//! Redis under Sentinel with real processes: a master, a replica and three sentinels on free
//! loopback ports. Two replicas of the gateway find the master through the sentinels and
//! follow it through a failover, a killed master's and a `SENTINEL FAILOVER`'s (the old
//! master stays up, read-only): the limit holds exactly across the switch, and in the gap
//! each route's `on_store_failure` decides (`deny` here: nothing is admitted unseen).
#![allow(clippy::disallowed_methods)] // real processes, waited for in real time

mod common;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::redis_server::{free_port, RedisServer};
use common::*;
use tollgate::Tollgate;

/// A master, its replica, and three sentinels watching it as `mymaster`.
struct Sentinels {
    master: RedisServer,
    replica: RedisServer,
    sentinels: Vec<(u16, Child)>,
    passwords: bool,
    _dir: tempfile::TempDir,
}

/// Passwords: the data nodes', and the sentinels' own.
const DATA_PASSWORD: &str = "data-password-0123";
const SENTINEL_PASSWORD: &str = "sentinel-password-0123";

impl Sentinels {
    fn start() -> Sentinels {
        Sentinels::start_with(false)
    }

    /// With `passwords`, the data nodes require `DATA_PASSWORD` and the sentinels
    /// `SENTINEL_PASSWORD`.
    fn start_with(passwords: bool) -> Sentinels {
        let auth: Vec<&str> = if passwords {
            vec![
                "--requirepass",
                DATA_PASSWORD,
                "--masterauth",
                DATA_PASSWORD,
            ]
        } else {
            Vec::new()
        };
        // Without the delay a replica's first sync waits 5 s for others to join it.
        let mut master_args = vec!["--repl-diskless-sync-delay", "0"];
        master_args.extend(&auth);
        let master = RedisServer::start_with(&master_args);
        let master_port = master.port.to_string();
        let mut replica_args = vec!["--replicaof", "127.0.0.1", &master_port];
        replica_args.extend(&auth);
        let replica = RedisServer::start_with(&replica_args);
        let sentinel_auth = if passwords {
            format!(
                "sentinel auth-pass mymaster {DATA_PASSWORD}\nrequirepass {SENTINEL_PASSWORD}\n"
            )
        } else {
            String::new()
        };
        let dir = tempfile::tempdir().unwrap();
        let sentinels = (0..3)
            .map(|index| {
                let port = free_port();
                let config = dir.path().join(format!("sentinel-{index}.conf"));
                std::fs::write(
                    &config,
                    format!(
                        "port {port}\nbind 127.0.0.1\ndir {}\nsentinel monitor mymaster 127.0.0.1 {master_port} 2\nsentinel down-after-milliseconds mymaster 1000\nsentinel failover-timeout mymaster 3000\n{sentinel_auth}",
                        dir.path().display()
                    ),
                )
                .unwrap();
                let child = Command::new("redis-server")
                    .arg(&config)
                    .arg("--sentinel")
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("redis-server --sentinel (scripts/test.sh installs redis)");
                (port, child)
            })
            .collect();
        let sentinels = Sentinels {
            master,
            replica,
            sentinels,
            passwords,
            _dir: dir,
        };
        sentinels.wait_for(|master| master == sentinels.master.port);
        sentinels.wait_until_every_sentinel_knows_the_replica();
        sentinels
    }

    /// Runs `redis-cli` against sentinel `index`, with its password when it has one.
    fn ask_sentinel(&self, index: usize, args: &[&str]) -> String {
        let mut command = Command::new("redis-cli");
        command.args(["-p", &self.sentinels[index].0.to_string()]);
        if self.passwords {
            command.args(["-a", SENTINEL_PASSWORD, "--no-auth-warning"]);
        }
        command
            .args(args)
            .output()
            .map(|output| String::from_utf8_lossy(&output.stdout).into_owned())
            .unwrap_or_default()
    }

    /// A sentinel learns of replicas from the master's `INFO`, every 10 s: until each knows
    /// the replica, linked to the master, none could fail over to it.
    fn wait_until_every_sentinel_knows_the_replica(&self) {
        let port = self.replica.port.to_string();
        let deadline = Instant::now() + Duration::from_secs(60);
        for index in 0..self.sentinels.len() {
            loop {
                let replicas = self.ask_sentinel(index, &["SENTINEL", "REPLICAS", "mymaster"]);
                let lines: Vec<&str> = replicas.lines().map(str::trim).collect();
                let field = |name: &str| {
                    lines
                        .iter()
                        .position(|line| *line == name)
                        .and_then(|at| lines.get(at + 1))
                        .copied()
                };
                if field("port") == Some(port.as_str()) && field("master-link-status") == Some("ok")
                {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "sentinel {index} never saw the replica linked: {replicas}"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }

    fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|(port, _)| format!("127.0.0.1:{port}"))
            .collect();
        format!("redis+sentinel://{}/mymaster", hosts.join(","))
    }

    /// The master's port, as the first sentinel names it.
    fn named(&self) -> Option<u16> {
        self.ask_sentinel(0, &["SENTINEL", "get-master-addr-by-name", "mymaster"])
            .lines()
            .nth(1)?
            .trim()
            .parse()
            .ok()
    }

    /// Waits (up to a minute) until the sentinels name a master that `wanted` accepts.
    fn wait_for(&self, wanted: impl Fn(u16) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if self.named().is_some_and(&wanted) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("the sentinels never named the master wanted");
    }
}

impl Drop for Sentinels {
    fn drop(&mut self) {
        for (_, child) in &mut self.sentinels {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

const POLICY: &str = r#"
[upstreams.app]
url = "http://{upstream}"

[limits.everyone]
key = "global"
capacity = 6
rate = "1/h"

[[routes]]
name = "all"
path_prefix = "/"
upstream = "app"
limits = ["everyone"]
on_store_failure = "deny"
"#;

fn policy(url: &str) -> String {
    format!(
        "[store]\nbackend = \"redis\"\nurl = \"{url}\"\ntimeout = \"2s\"\nprefix = \"tg:\"\nhash_key = \"sentinel-test-secret-0123\"\n{POLICY}"
    )
}

/// Statuses of requests sent one at a time, alternating between the replicas, until
/// `admitted` were admitted or a refusal (429) came; a 503 is the gap of a failover.
async fn until_refused(clients: &[HttpClient; 2]) -> (u32, u32) {
    let (mut admitted, mut gap) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    for n in 0.. {
        assert!(Instant::now() < deadline, "no refusal within a minute");
        match clients[n % 2].get("/", &[]).await.status.as_u16() {
            200 => admitted += 1,
            429 => return (admitted, gap),
            503 => {
                gap += 1;
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => panic!("status {other}"),
        }
    }
    unreachable!()
}

async fn gateways(url: &str) -> ([Tollgate; 2], [HttpClient; 2]) {
    let upstream = start_upstream().await;
    let one = start_gateway(&policy(url), upstream.address).await;
    let two = start_gateway(&policy(url), upstream.address).await;
    let clients = [
        HttpClient::new(one.addresses[0]),
        HttpClient::new(two.addresses[0]),
    ];
    ([one, two], clients)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_is_followed_and_the_limit_holds_across_the_switch() {
    let mut set = Sentinels::start();
    let (_gateways, clients) = gateways(&set.url()).await;
    for client in &clients {
        assert_eq!(client.get("/", &[]).await.status, 200);
    }
    assert_eq!(clients[0].get("/", &[]).await.status, 200);
    set.master.wait_replicated();
    let replica = set.replica.port;
    set.master.stop();
    set.wait_for(|master| master == replica);
    // 3 of 6 were taken before the switch: exactly 3 more, whatever the gap refused.
    let (admitted, gap) = until_refused(&clients).await;
    eprintln!("after the kill: {admitted} admitted, {gap} refused in the gap");
    assert_eq!(admitted, 3);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_is_followed_while_the_old_master_is_read_only() {
    let set = Sentinels::start();
    let (_gateways, clients) = gateways(&set.url()).await;
    for _ in 0..2 {
        assert_eq!(clients[1].get("/", &[]).await.status, 200);
    }
    set.master.wait_replicated();
    let (old, replica) = (set.master.port, set.replica.port);
    let failover = set.ask_sentinel(1, &["SENTINEL", "FAILOVER", "mymaster"]);
    assert_eq!(failover.trim(), "OK");
    set.wait_for(|master| master == replica);
    // The sentinels turn the old master, still up, into a replica of the new one: from then
    // on it refuses writes (READONLY), which the gateway meets as a store failure until it
    // follows. (Before that moment Redis itself may take writes on both: Sentinel's own
    // window, which `min-replicas-to-write` narrows.)
    eventually(&format!("the old master {old} is a replica"), || {
        set.master.cli(&["ROLE"]).starts_with("slave")
    })
    .await;
    let (admitted, gap) = until_refused(&clients).await;
    eprintln!("after SENTINEL FAILOVER: {admitted} admitted, {gap} refused in the gap");
    assert_eq!(admitted, 4, "2 of 6 were taken at the old master");
}

/// Passwords kept out of the file: the data nodes' from `password_env`, the sentinels' from
/// `sentinel_password_env`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sentinels_and_the_master_are_asked_with_their_passwords() {
    let set = Sentinels::start_with(true);
    std::env::set_var("TOLLGATE_TEST_SENTINEL_DATA_PASSWORD", DATA_PASSWORD);
    std::env::set_var("TOLLGATE_TEST_SENTINEL_OWN_PASSWORD", SENTINEL_PASSWORD);
    let upstream = start_upstream().await;
    let text = policy(&set.url()).replace(
        "prefix = \"tg:\"\n",
        "prefix = \"tg:\"\npassword_env = \"TOLLGATE_TEST_SENTINEL_DATA_PASSWORD\"\nsentinel_password_env = \"TOLLGATE_TEST_SENTINEL_OWN_PASSWORD\"\n",
    );
    let gateway = start_gateway(&text, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let mut statuses = Vec::new();
    for _ in 0..7 {
        statuses.push(client.get("/", &[]).await.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 200, 429]);
    let store = gateway.redis_store().unwrap();
    eventually("the reset channel is subscribed at the master", || {
        store.hears_resets()
    })
    .await;
    eventually("a sentinel's switches are heard", || store.hears_switches()).await;
}
