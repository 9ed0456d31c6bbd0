//! `redis-server` processes started by the tests themselves, on free ports.
#![allow(clippy::disallowed_methods)] // tests measure real time

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where `free_port` looks: below Linux's ephemeral range (32768 and up), so that no
/// outgoing connection (a test's client, a pool's connection to Redis) can take a port between
/// its choice and the bind of the process it was chosen for, as happened with bind(0)'s ports;
/// and low enough that the cluster bus port (+10000) stays below it too.
const FREE_PORTS: std::ops::Range<u16> = 20_000..22_768;

/// A port that was free a moment ago (and whose cluster bus port, +10000, too), never handed
/// out twice in one test process: tests running side by side cannot be given the same one.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let span = u32::from(FREE_PORTS.end - FREE_PORTS.start);
    // Each process starts somewhere else in the range: a port the last one used may still
    // be held by a process it left behind, or by its connections.
    let _ = NEXT.compare_exchange(
        u32::MAX,
        std::process::id().wrapping_mul(7919) % span,
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
    for _ in 0..span {
        let offset = NEXT.fetch_add(1, Ordering::Relaxed) % span;
        let port = FREE_PORTS.start + offset as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok()
            && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok()
        {
            return port;
        }
    }
    panic!("no free port in {FREE_PORTS:?}");
}

pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    extra: Vec<String>,
    /// Environment of the next launch (a clock-shifting preload, say).
    env: Vec<(String, String)>,
    dir: tempfile::TempDir,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> RedisServer {
        let mut server = RedisServer {
            port: free_port(),
            child: None,
            extra: extra.iter().map(|arg| arg.to_string()).collect(),
            env: Vec::new(),
            dir: tempfile::tempdir().expect("tempdir"),
        };
        server.launch();
        server
    }

    fn launch(&mut self) {
        let child = Command::new("redis-server")
            .args([
                "--port",
                &self.port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra)
            .envs(self.env.iter().map(|(name, value)| (name, value)))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server on PATH (CI installs it)");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let answer = self.cli(&["PING"]);
            if answer.trim() == "PONG" || answer.contains("NOAUTH") {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server on port {} did not answer", self.port);
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Runs `redis-cli` against this server and returns its output.
    pub fn cli(&self, args: &[&str]) -> String {
        let output = Command::new("redis-cli")
            .args(["-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("redis-cli on PATH");
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Waits until this master has a replica and every replica of it has all it wrote.
    /// (`WAIT` from a new connection would not do: it waits only for that connection's writes.)
    pub fn wait_replicated(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let info = self.cli(&["INFO", "replication"]);
            let field = |name: &str| {
                info.lines()
                    .find_map(|line| line.strip_prefix(name))
                    .map(|value| value.trim().to_owned())
            };
            let written = field("master_repl_offset:");
            let replicas: Vec<&str> = info
                .lines()
                .filter(|line| line.starts_with("slave") && line.contains(":ip="))
                .collect();
            let caught_up = !replicas.is_empty()
                && replicas.iter().all(|replica| {
                    replica.contains("state=online")
                        && written
                            .as_deref()
                            .is_some_and(|written| replica.contains(&format!("offset={written},")))
                });
            if caught_up {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "replicas did not catch up: {info}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// A bucket's state as the gateway stores it (little-endian doubles: tokens, then the time
    /// of the last charge or a quota's period, then any adaptive state); `None`: no key.
    pub fn stored_bucket(&self, key: &str) -> Option<Vec<f64>> {
        const READ: &str = "local v = redis.call('GET', KEYS[1]) \
            if not v then return 'none' end \
            local out = {} \
            for at = 1, #v - 7, 8 do out[#out + 1] = string.format('%.17g', (struct.unpack('<d', v, at))) end \
            return table.concat(out, ' ')";
        let reply = self.cli(&["EVAL", READ, "1", key]);
        let reply = reply.trim();
        (reply != "none").then(|| {
            reply
                .split(' ')
                .map(|number| number.parse().expect("a number"))
                .collect()
        })
    }

    /// Writes a bucket's state as the gateway stores it, the numbers as little-endian doubles.
    pub fn store_bucket(&self, key: &str, numbers: &[f64]) {
        const WRITE: &str = "local out = {} \
            for i = 1, #ARGV do out[i] = struct.pack('<d', tonumber(ARGV[i])) end \
            return redis.call('SET', KEYS[1], table.concat(out))";
        let numbers: Vec<String> = numbers.iter().map(|number| format!("{number:e}")).collect();
        let mut args = vec!["EVAL", WRITE, "1", key];
        args.extend(numbers.iter().map(String::as_str));
        assert_eq!(self.cli(&args).trim(), "OK");
    }

    /// Stops the server (by the PID this test started).
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes the process (SIGSTOP): connections stay open and commands go unanswered.
    pub fn freeze(&self) {
        self.signal("-STOP");
    }

    /// Lets a frozen process run again (SIGCONT).
    pub fn thaw(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("a running redis-server");
        let status = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill {signal} {}", child.id());
    }

    /// Starts it again on the same port, empty.
    pub fn restart(&mut self) {
        self.stop();
        self.launch();
    }

    /// Saves the data, stops, and starts again on the same port with the data and `env`.
    pub fn restart_with_data_and_env(&mut self, env: &[(&str, &str)]) {
        assert_eq!(self.cli(&["SAVE"]).trim(), "OK");
        self.stop();
        self.env = env
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect();
        self.launch();
    }

    /// Calls of a command since start, from INFO commandstats (e.g. `evalsha`).
    pub fn calls(&self, command: &str) -> u64 {
        let stats = self.cli(&["INFO", "commandstats"]);
        let prefix = format!("cmdstat_{command}:calls=");
        stats
            .lines()
            .find_map(|line| line.strip_prefix(&prefix))
            .and_then(|rest| rest.split(',').next())
            .and_then(|calls| calls.parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `redis-server`s forming a Redis Cluster.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Three masters, no replicas.
    pub fn start() -> RedisCluster {
        RedisCluster::start_with(0, "5000")
    }

    /// Three masters, each with `replicas` replicas; a master unreachable for `node_timeout`
    /// milliseconds is failed over.
    pub fn start_with(replicas: usize, node_timeout: &str) -> RedisCluster {
        let nodes: Vec<RedisServer> = (0..3 * (1 + replicas))
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-node-timeout",
                    node_timeout,
                    // A replica fails over however long ago it heard from its master.
                    "--cluster-replica-validity-factor",
                    "0",
                    // Tests put a node to sleep (`DEBUG SLEEP`).
                    "--enable-debug-command",
                    "yes",
                ])
            })
            .collect();
        let addresses: Vec<String> = nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        let output = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addresses)
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .expect("redis-cli --cluster create");
        assert!(
            output.status.success(),
            "cluster create: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        let cluster = RedisCluster { nodes };
        cluster.wait_until_ok(|_| true);
        cluster
    }

    /// Waits until `master` has a replica and every replica of it has all it wrote.
    pub fn wait_replicated(&self, master: usize) {
        self.nodes[master].wait_replicated();
    }

    /// Waits until every running node reports the cluster healthy and `also` holds.
    pub fn wait_until_ok(&self, mut also: impl FnMut(&RedisCluster) -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if self
                .running()
                .all(|node| node.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"))
                && also(self)
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let view = self.running().next().expect("a running node");
        panic!(
            "cluster did not become ready: {}{}",
            view.cli(&["CLUSTER", "INFO"]),
            view.cli(&["CLUSTER", "NODES"])
        );
    }

    fn running(&self) -> impl Iterator<Item = &RedisServer> {
        self.nodes.iter().filter(|node| node.child.is_some())
    }

    /// The node serving `slot` as a master, as a running node sees it.
    pub fn master_of(&self, slot: u16) -> usize {
        self.serving(slot)
            .unwrap_or_else(|| panic!("no master serves slot {slot}"))
    }

    /// The node serving `slot` as a master, if one not suspected of failing does.
    pub fn serving(&self, slot: u16) -> Option<usize> {
        let view = self.running().next().expect("a running node");
        let nodes = view.cli(&["CLUSTER", "NODES"]);
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 9 || !fields[2].contains("master") || fields[2].contains("fail") {
                continue;
            }
            let serves = fields[8..].iter().any(|range| {
                let (low, high) = range.split_once('-').unwrap_or((range, range));
                match (low.parse::<u16>(), high.parse::<u16>()) {
                    (Ok(low), Ok(high)) => (low..=high).contains(&slot),
                    _ => false,
                }
            });
            if serves {
                let port: u16 = fields[1]
                    .split(['@', ':'])
                    .nth(1)
                    .and_then(|port| port.parse().ok())
                    .expect("a node's port");
                return self.nodes.iter().position(|node| node.port == port);
            }
        }
        None
    }

    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port))
            .collect();
        format!("redis+cluster://{}", hosts.join(","))
    }
}
