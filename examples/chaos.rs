//! A bounded chaos run: three gateway replicas share one `redis-server`; for `SECONDS` a load
//! goes through them while Redis is paused, stopped (SIGSTOP), killed and restarted, the
//! upstream is killed and restarted, and every replica reloads its policy once a second.
//! Prints requests by status, the longest request, panics in the replicas' logs, what the
//! shared limit admitted against what it allows, and each replica's RSS at the start and end.
//! Loopback only; every process it starts it stops. Run by `bench/chaos.sh`.
//!
//! Usage: chaos TOLLGATE_BINARY UPSTREAM_BINARY [SECONDS]
#![allow(clippy::disallowed_methods)] // a load generator measures real time

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::net::TcpStream;

#[path = "support/load.rs"]
mod load;
use load::{request, rss_mib};

const CAPACITY: f64 = 200.0;
const RATE_PER_SECOND: f64 = 20.0;
/// Requests a second the load offers, over all connections.
const OFFERED: u64 = 1500;
const CONNECTIONS: u64 = 24;

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .expect("a free port")
}

fn signal(child: &Child, name: &str) {
    let _ = Command::new("kill")
        .args([format!("-{name}"), child.id().to_string()])
        .status();
}

fn wait_for(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "nothing listens on port {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

struct Redis {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl Redis {
    fn start(port: u16, dir: &Path) -> Redis {
        let mut redis = Redis {
            port,
            dir: dir.to_owned(),
            child: None,
        };
        redis.launch();
        redis
    }

    fn launch(&mut self) {
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(&self.dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server on PATH");
        self.child = Some(child);
        wait_for(self.port);
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    fn cli(&self, args: &[&str]) {
        let _ = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output();
    }
}

fn policy(port: u16, admin: u16, upstream: u16, redis: u16) -> String {
    format!(
        r#"
[server]
listen = ["127.0.0.1:{port}"]
[admin]
listen = "127.0.0.1:{admin}"
[store]
backend = "redis"
url = "redis://127.0.0.1:{redis}"
timeout = "100ms"
connect_timeout = "500ms"
hash_key = "chaos-secret-0123456789"
[upstreams.app]
url = "http://127.0.0.1:{upstream}"
connect_timeout = "500ms"
timeout = "5s"
[limits.shared]
key = "global"
capacity = {CAPACITY}
rate = "{RATE_PER_SECOND}/s"
[[routes]]
name = "limited"
path = "/limited"
upstream = "app"
limits = ["shared"]
on_store_failure = "deny"
"#
    )
}

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (Some(tollgate), Some(upstream_binary)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: chaos TOLLGATE_BINARY UPSTREAM_BINARY [SECONDS]");
        std::process::exit(2);
    };
    let run = Duration::from_secs(args.get(3).and_then(|s| s.parse().ok()).unwrap_or(60));
    let work = std::env::temp_dir().join(format!("tollgate-chaos-{}", std::process::id()));
    std::fs::create_dir_all(&work).expect("scratch directory");

    let mut redis = Redis::start(free_port(), &work);
    let upstream_port = free_port();
    let start_upstream = || {
        let child = Command::new(upstream_binary)
            .arg(format!("127.0.0.1:{upstream_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("upstream");
        wait_for(upstream_port);
        child
    };
    let mut upstream = Some(start_upstream());
    let mut replicas = Vec::new();
    let mut addresses = Vec::new();
    for index in 0..3 {
        let (port, admin) = (free_port(), free_port());
        let config = work.join(format!("replica-{index}.toml"));
        std::fs::write(&config, policy(port, admin, upstream_port, redis.port)).expect("policy");
        let log = std::fs::File::create(work.join(format!("replica-{index}.log"))).expect("log");
        let child = Command::new(tollgate)
            .args(["--worker-threads", "1", "run", "--config"])
            .arg(&config)
            .env("RUST_BACKTRACE", "1")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("tollgate");
        wait_for(port);
        addresses.push(SocketAddr::from(([127, 0, 0, 1], port)));
        replicas.push(child);
    }
    let rss_start: Vec<f64> = replicas.iter().map(|child| rss_mib(child.id())).collect();

    let started = Instant::now();
    let statuses: Arc<Mutex<BTreeMap<u16, u64>>> = Arc::default();
    let longest = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut load = Vec::new();
    for connection in 0..CONNECTIONS {
        let address = addresses[(connection % 3) as usize];
        let (statuses, longest, stop) = (statuses.clone(), longest.clone(), stop.clone());
        load.push(tokio::spawn(async move {
            let mut ticks =
                tokio::time::interval(Duration::from_secs_f64(CONNECTIONS as f64 / OFFERED as f64));
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut stream = TcpStream::connect(address).await.ok();
            let mut buffer = Vec::new();
            let head = b"GET /limited HTTP/1.1\r\nHost: chaos\r\n\r\n";
            while !stop.load(Ordering::Relaxed) {
                ticks.tick().await;
                let sent = Instant::now();
                let status = match stream.as_mut() {
                    Some(stream) => request(stream, head, &mut buffer).await.unwrap_or(0),
                    None => 0,
                };
                let took = sent.elapsed().as_micros() as u64;
                longest.fetch_max(took, Ordering::Relaxed);
                *statuses.lock().unwrap().entry(status).or_default() += 1;
                if status == 0 {
                    stream = TcpStream::connect(address).await.ok();
                }
            }
        }));
    }

    // The schedule, by second of the run (scaled to its length).
    let at = |fraction: f64| Duration::from_secs_f64(run.as_secs_f64() * fraction);
    let mut events: Vec<(Duration, &str)> = vec![
        (at(0.15), "CLIENT PAUSE 3000 ALL"),
        (at(0.30), "SIGSTOP redis for 2 s"),
        (at(0.45), "kill redis"),
        (at(0.50), "restart redis"),
        (at(0.65), "kill the upstream"),
        (at(0.70), "restart the upstream"),
        (at(0.85), "kill redis"),
        (at(0.88), "restart redis"),
    ];
    events.reverse();
    let mut redis_restarts = 0;
    let mut next_reload = Duration::from_secs(1);
    let mut reloads = 0;
    while started.elapsed() < run {
        tokio::time::sleep(Duration::from_millis(50)).await;
        if started.elapsed() >= next_reload {
            for replica in &replicas {
                signal(replica, "HUP");
            }
            reloads += 1;
            next_reload += Duration::from_secs(1);
        }
        while events
            .last()
            .is_some_and(|(when, _)| started.elapsed() >= *when)
        {
            let (_, event) = events.pop().unwrap();
            println!("{:>5.1} s  {event}", started.elapsed().as_secs_f64());
            match event {
                "CLIENT PAUSE 3000 ALL" => redis.cli(&["CLIENT", "PAUSE", "3000", "ALL"]),
                "SIGSTOP redis for 2 s" => {
                    if let Some(child) = &redis.child {
                        signal(child, "STOP");
                        tokio::time::sleep(Duration::from_secs(2)).await;
                        signal(child, "CONT");
                    }
                }
                "kill redis" => redis.kill(),
                "restart redis" => {
                    redis.launch();
                    redis_restarts += 1;
                }
                "kill the upstream" => {
                    if let Some(mut child) = upstream.take() {
                        let _ = child.kill();
                        let _ = child.wait();
                    }
                }
                "restart the upstream" => upstream = Some(start_upstream()),
                _ => unreachable!(),
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    for task in load {
        let _ = task.await;
    }
    let elapsed = started.elapsed();
    let rss_end: Vec<f64> = replicas.iter().map(|child| rss_mib(child.id())).collect();
    for replica in &mut replicas {
        signal(replica, "TERM");
    }
    for replica in &mut replicas {
        let _ = replica.wait();
    }
    if let Some(mut child) = upstream.take() {
        let _ = child.kill();
        let _ = child.wait();
    }
    redis.kill();

    let panics: usize = (0..3)
        .map(|index| {
            std::fs::read_to_string(work.join(format!("replica-{index}.log")))
                .unwrap_or_default()
                .matches("panicked")
                .count()
        })
        .sum();
    let statuses = statuses.lock().unwrap().clone();
    let admitted = statuses.get(&200).copied().unwrap_or(0);
    // Each restart empties Redis: the bucket starts full again.
    let allowed = CAPACITY * (1 + redis_restarts) as f64 + RATE_PER_SECOND * elapsed.as_secs_f64();
    println!("requests by status (0: the connection failed): {statuses:?}");
    println!(
        "longest request: {:.1} ms",
        longest.load(Ordering::Relaxed) as f64 / 1000.0
    );
    println!("reloads: {reloads} per replica; panics in the replicas' logs: {panics}");
    println!(
        "admitted {admitted} through the shared limit; it allows {allowed:.0} over {:.0} s ({} Redis restarts)",
        elapsed.as_secs_f64(),
        redis_restarts
    );
    println!("replica RSS MiB at the start {rss_start:.1?}, at the end {rss_end:.1?}");
    let _ = std::fs::remove_dir_all(&work);
    if panics > 0 || admitted as f64 > allowed {
        println!("FAIL");
        std::process::exit(1);
    }
}
