//! The `tollgate` binary as an operator runs it: logs, signals, reload, demo.
#![allow(clippy::disallowed_methods)] // tests measure real time

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{metric, start_upstream, HttpClient};

/// A running `tollgate` process whose stderr (and stdout) lines are collected.
struct Process {
    child: Child,
    stderr: Arc<Mutex<Vec<String>>>,
    stdout: Arc<Mutex<Vec<String>>>,
}

impl Process {
    fn spawn(args: &[&str]) -> Process {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn tollgate");
        let stderr = collect(child.stderr.take().expect("stderr"));
        let stdout = collect(child.stdout.take().expect("stdout"));
        Process {
            child,
            stderr,
            stdout,
        }
    }

    /// Waits (up to 20 s) for a line satisfying `wanted` and returns it.
    fn wait_for(&self, from_stdout: bool, wanted: impl Fn(&str) -> bool) -> String {
        let lines = if from_stdout {
            &self.stdout
        } else {
            &self.stderr
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Some(line) = lines.lock().unwrap().iter().find(|line| wanted(line)) {
                return line.clone();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "no such line; stderr so far:\n{}",
            self.stderr.lock().unwrap().join("\n")
        );
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill");
        assert!(status.success());
    }

    fn wait_exit(&mut self) -> i32 {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status.code().unwrap_or(-1);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        panic!("tollgate did not exit");
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn collect(stream: impl std::io::Read + Send + 'static) -> Arc<Mutex<Vec<String>>> {
    let lines = Arc::new(Mutex::new(Vec::new()));
    let sink = lines.clone();
    std::thread::spawn(move || {
        for line in BufReader::new(stream).lines().map_while(Result::ok) {
            sink.lock().unwrap().push(line);
        }
    });
    lines
}

fn policy(upstream: std::net::SocketAddr, capacity: u32) -> String {
    format!(
        r#"
[server]
listen = ["127.0.0.1:0"]
[admin]
listen = "127.0.0.1:0"
[upstreams.app]
url = "http://{upstream}"
[limits.per_network]
key = "client_network"
capacity = {capacity}
rate = "1/h"
[[routes]]
name = "default"
path_prefix = "/"
upstream = "app"
limits = ["per_network"]
"#
    )
}

fn address_in(line: &str) -> std::net::SocketAddr {
    let json: serde_json::Value = serde_json::from_str(line).expect("JSON log line");
    json["address"]
        .as_str()
        .expect("address field")
        .parse()
        .expect("socket address")
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).expect("write policy");
}

#[tokio::test(flavor = "multi_thread")]
async fn json_logs_one_access_line_per_request_and_sigterm_exits_0() {
    let upstream = start_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tollgate.toml");
    write(&file, &policy(upstream.address, 2));
    let file_arg = file.to_str().unwrap();
    for args in [
        vec!["--log-format", "json", "run", "--config", file_arg],
        vec!["run", "--config", file_arg, "--log-format", "json"],
    ] {
        let mut process = Process::spawn(&args);
        let listening = process.wait_for(false, |line| line.contains("\"listening\""));
        let client = HttpClient::new(address_in(&listening));
        let statuses: Vec<u16> = [
            client.get("/a", &[]).await.status.as_u16(),
            client.get("/b", &[]).await.status.as_u16(),
            client.get("/c", &[]).await.status.as_u16(),
        ]
        .to_vec();
        assert_eq!(statuses, [200, 200, 429]);
        process.wait_for(false, |line| line.contains("\"status\":429"));
        process.signal("TERM");
        assert_eq!(process.wait_exit(), 0);
        let lines = process.stderr.lock().unwrap().clone();
        let mut access = Vec::new();
        for line in &lines {
            let json: serde_json::Value =
                serde_json::from_str(line).unwrap_or_else(|_| panic!("not JSON: {line}"));
            if json["target"] == "tollgate::access" {
                access.push(json);
            }
        }
        assert_eq!(access.len(), 3, "{lines:#?}");
        let refused = &access[2];
        assert_eq!(refused["client"], "127.0.0.1");
        assert_eq!(refused["route"], "default");
        assert_eq!(refused["outcome"], "limited");
        assert_eq!(refused["cause"], "", "a refusal is nobody's fault");
        assert_eq!(refused["limit"], "per_network");
        assert_eq!(
            refused["keys"], "per_network=v4:127.0.0.1/32",
            "each limit's store key"
        );
        assert_eq!(refused["path"], "/c");
        assert_eq!(refused["method"], "GET");
        assert!(refused["duration_ms"].as_f64().is_some());
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_override_is_logged_and_named_on_the_access_lines_it_decides() {
    let upstream = start_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tollgate.toml");
    write(&file, &policy(upstream.address, 1));
    let (process, client, admin) = serving(&file);
    let admin = HttpClient::new(admin);
    let put = admin
        .send(
            "PUT",
            "/overrides/per_network?key=127.0.0.1",
            &[],
            bytes::Bytes::from(r#"{"capacity": 3, "reason": "load test"}"#),
        )
        .await;
    assert_eq!(put.status, 200);
    let changed = process.wait_for(false, |line| line.contains("tollgate::overrides"));
    let changed: serde_json::Value = serde_json::from_str(&changed).unwrap();
    assert_eq!(changed["action"], "set");
    assert_eq!(changed["limit"], "per_network");
    assert_eq!(changed["key"], "v4:127.0.0.1/32");
    assert_eq!(changed["before"], "null");
    assert!(changed["after"]
        .as_str()
        .unwrap()
        .contains("\"capacity\":3.0"));
    assert_eq!(changed["reason"], "load test");
    assert_eq!(changed["by"], "127.0.0.1");
    assert_eq!(client.get("/", &[]).await.status, 200);
    let line = process.wait_for(false, |line| line.contains("tollgate::access"));
    let access: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(access["override"], "per_network", "{line}");
}

#[tokio::test(flavor = "multi_thread")]
async fn sighup_reloads_a_valid_file_and_keeps_serving_on_an_invalid_one() {
    let upstream = start_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tollgate.toml");
    write(&file, &policy(upstream.address, 1));
    let (process, client, admin) = serving(&file);
    let admin = HttpClient::new(admin);
    assert_eq!(client.get("/", &[]).await.status, 200);
    assert_eq!(client.get("/", &[]).await.status, 429);

    write(&file, &policy(upstream.address, 3));
    process.signal("HUP");
    process.wait_for(false, |line| line.contains("configuration reloaded"));
    // The redefined limit starts fresh with its new capacity.
    for _ in 0..3 {
        assert_eq!(client.get("/", &[]).await.status, 200);
    }
    assert_eq!(client.get("/", &[]).await.status, 429);

    write(&file, "[limits.broken]\nrate = \"0/s\"\n");
    process.signal("HUP");
    process.wait_for(false, |line| line.contains("configuration reload refused"));
    assert_eq!(
        client.get("/", &[]).await.status,
        429,
        "still serving the previous policy"
    );
    let scrape = String::from_utf8_lossy(&admin.get("/metrics", &[]).await.body).into_owned();
    assert!(metric(&scrape, r#"tollgate_config_reloads_total{result="ok"}"#) >= 1.0);
    assert!(metric(&scrape, r#"tollgate_config_reloads_total{result="error"}"#) >= 1.0);
}

#[tokio::test(flavor = "multi_thread")]
async fn demo_shows_a_429_within_seconds() {
    let process = Process::spawn(&["demo", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0"]);
    let banner = process.wait_for(true, |line| line.contains("gateway on http://"));
    let address: std::net::SocketAddr = banner
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .expect("address in banner")
        .parse()
        .expect("socket address");
    process.wait_for(true, |line| line.contains("Stop with Ctrl-C"));
    let client = HttpClient::new(address);
    let mut statuses = Vec::new();
    for _ in 0..12 {
        statuses.push(client.get("/hello", &[]).await.status.as_u16());
    }
    assert_eq!(&statuses[..10], &[200; 10]);
    assert_eq!(&statuses[10..], &[429, 429]);
    let instructions = process.stdout.lock().unwrap().join("\n");
    assert!(instructions.contains(&format!("curl -i http://{address}/hello")));
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_during_a_slow_request_lets_it_finish_then_exits_0() {
    let upstream = start_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tollgate.toml");
    write(&file, &policy(upstream.address, 10));
    let mut process = run_with_json_logs(&file);
    let address = address_in(&process.wait_for(false, |line| line.contains("\"listening\"")));
    let slow = tokio::spawn(async move {
        HttpClient::new(address)
            .get("/slow", &[])
            .await
            .status
            .as_u16()
    });
    while upstream.hits.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    process.signal("TERM");
    process.wait_for(false, |line| line.contains("shutting down"));
    assert!(
        tokio::net::TcpStream::connect(address).await.is_err(),
        "no new connections while draining"
    );
    assert_eq!(slow.await.unwrap(), 200, "the in-flight request completed");
    assert_eq!(process.wait_exit(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn health_asks_the_admin_listener() {
    let upstream = start_upstream().await;
    let gateway = common::start_gateway(
        &policy(upstream.address, 1).replace(
            "[server]\nlisten = [\"127.0.0.1:0\"]\n[admin]\nlisten = \"127.0.0.1:0\"\n",
            "",
        ),
        upstream.address,
    )
    .await;
    let binary = env!("CARGO_BIN_EXE_tollgate");
    let healthy = format!("http://{}/healthz", gateway.admin_address);
    let status = tokio::process::Command::new(binary)
        .args(["health", "--url", &healthy])
        .status()
        .await
        .unwrap();
    assert_eq!(status.code(), Some(0));
    let missing = format!("http://{}/nothing-here", gateway.admin_address);
    let status = tokio::process::Command::new(binary)
        .args(["health", "--url", &missing])
        .status()
        .await
        .unwrap();
    assert_eq!(status.code(), Some(1), "404 is not healthy");
    let closed = common::redis_server::free_port();
    let status = tokio::process::Command::new(binary)
        .args([
            "health",
            "--url",
            &format!("http://127.0.0.1:{closed}/healthz"),
        ])
        .status()
        .await
        .unwrap();
    assert_eq!(status.code(), Some(1));
    // Without --url, the admin address comes from the policy, and failures are plain words.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tollgate.toml");
    let with_admin = |admin: &str| {
        policy(upstream.address, 1).replace(
            "[admin]\nlisten = \"127.0.0.1:0\"",
            &format!("[admin]\nlisten = \"{admin}\""),
        )
    };
    write(&file, &with_admin(&gateway.admin_address.to_string()));
    let (code, stdout, _) = run_cli(&["health", "--config", file.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{stdout}");
    write(&file, &with_admin(&format!("127.0.0.1:{closed}")));
    let (code, _, stderr) = run_cli(&["health", "--config", file.to_str().unwrap()]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("nothing answers at"), "{stderr}");
    assert!(!stderr.contains("client error"), "hyper's words: {stderr}");
}

#[test]
fn text_logs_into_a_pipe_carry_no_colour_codes() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tollgate.toml");
    write(&file, &policy("127.0.0.1:9".parse().unwrap(), 1));
    let process = Process::spawn(&["run", "--config", file.to_str().unwrap()]);
    let line = process.wait_for(false, |line| line.contains("listening"));
    assert!(!line.contains('\u{1b}'), "an escape code in {line:?}");
}

#[test]
fn an_invalid_policy_in_json_mode_is_reported_as_json() {
    let bad = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/bad/zero_rate.toml");
    let output = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["--log-format", "json", "run", "--config"])
        .arg(&bad)
        .output()
        .expect("run");
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert!(!lines.is_empty());
    for line in lines {
        let json: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|_| panic!("not JSON: {line}"));
        assert!(json["errors"]
            .as_str()
            .unwrap()
            .contains("limits.per_network.rate"));
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_changed_policy_file_is_reloaded_without_a_signal() {
    let upstream = start_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tollgate.toml");
    write(&file, &policy(upstream.address, 1));
    let process = run_with_json_logs(&file);
    let client = HttpClient::new(address_in(
        &process.wait_for(false, |line| line.contains("\"listening\"")),
    ));
    assert_eq!(client.get("/", &[]).await.status, 200);
    assert_eq!(client.get("/", &[]).await.status, 429);
    write(&file, &policy(upstream.address, 4));
    process.wait_for(false, |line| line.contains("policy file changed"));
    process.wait_for(false, |line| line.contains("configuration reloaded"));
    for _ in 0..4 {
        assert_eq!(client.get("/", &[]).await.status, 200);
    }
    assert_eq!(client.get("/", &[]).await.status, 429);
}

/// `tollgate --log-format json run --config FILE`.
/// `tollgate run` of `file` with JSON logs, once it listens: the process, a client of its
/// proxy listener, and its admin listener's address.
fn serving(file: &std::path::Path) -> (Process, HttpClient, std::net::SocketAddr) {
    let process = run_with_json_logs(file);
    let listening = process.wait_for(false, |line| line.contains("\"listening\""));
    let admin = process.wait_for(false, |line| line.contains("admin listening"));
    let client = HttpClient::new(address_in(&listening));
    (process, client, address_in(&admin))
}

fn run_with_json_logs(file: &std::path::Path) -> Process {
    Process::spawn(&[
        "--log-format",
        "json",
        "run",
        "--config",
        file.to_str().unwrap(),
    ])
}

/// Runs `tollgate ARGS` to completion: exit code, stdout, stderr.
fn run_cli(args: &[&str]) -> (Option<i32>, String, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(args)
        .output()
        .expect("run tollgate");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// After a reset, a support desk sees what still refuses the key: the route's other limit
/// keyed the same way, with its state, and one keyed otherwise, with how.
#[tokio::test(flavor = "multi_thread")]
async fn a_reset_shows_the_routes_other_limits_that_may_still_refuse() {
    let upstream = start_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tollgate.toml");
    let text = policy(upstream.address, 2)
        .replace(
            "limits = [\"per_network\"]",
            "limits = [\"per_user\", \"per_user_daily\", \"per_network\"]",
        )
        .replace("capacity = 2\n", "capacity = 100\n")
        + "[limits.per_user]\nkey = { header = \"x-user\" }\ncapacity = 2\nrate = \"1/h\"\n"
        + "[limits.per_user_daily]\nkey = { header = \"x-user\" }\ncapacity = 2\nrate = \"1/d\"\n";
    write(&file, &text);
    let (_process, client, admin) = serving(&file);
    let admin_url = format!("http://{admin}");
    let user = [("x-user", "erin")];
    for expected in [200, 200, 429] {
        assert_eq!(client.get("/", &user).await.status, expected);
    }
    let key = [
        "--limit", "per_user", "--key", "erin", "--admin", &admin_url,
    ];
    let (code, stdout, _) = run_cli(&[&["reset"], &key[..]].concat());
    assert_eq!(code, Some(0));
    assert!(
        stdout.contains("route default also applies per_user_daily [erin]: 0 of 2 tokens left"),
        "{stdout}"
    );
    assert!(
        stdout.contains("route default also applies per_network keyed by client network: inspect it with --limit per_network --key <that value>"),
        "{stdout}"
    );
    assert_eq!(
        client.get("/", &user).await.status,
        429,
        "still refused by per_user_daily"
    );
    let (code, stdout, _) = run_cli(&[&["inspect"], &key[..]].concat());
    assert_eq!(code, Some(0));
    assert!(
        stdout.starts_with("per_user [erin]: 2 of 2 tokens left\n"),
        "{stdout}"
    );
    assert!(stdout.contains("per_user_daily [erin]: 0 of 2"), "{stdout}");
}

#[tokio::test(flavor = "multi_thread")]
async fn inspect_and_reset_unlock_a_key_and_the_reset_is_logged_without_its_value() {
    let upstream = start_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tollgate.toml");
    std::env::set_var(
        "TOLLGATE_TEST_CLI_ADMIN_TOKEN",
        "cli-admin-token-0123456789",
    );
    let text = policy(upstream.address, 2)
        .replace(
            "[admin]\n",
            "[admin]\ntoken_env = \"TOLLGATE_TEST_CLI_ADMIN_TOKEN\"\n",
        )
        .replace("key = \"client_network\"", "key = { header = \"x-user\" }")
        + "[limits.per_network.ban]\nafter = 1\nwithin = \"1m\"\nduration = \"15m\"\n";
    write(&file, &text);
    let (process, client, admin) = serving(&file);
    let admin_url = format!("http://{admin}");
    let user = [("x-user", "dora-4242")];
    assert_eq!(client.get("/", &user).await.status, 200);
    assert_eq!(client.get("/", &user).await.status, 200);
    assert_eq!(client.get("/", &user).await.status, 429);
    let config = file.to_str().unwrap();
    let key = [
        "--limit",
        "per_network",
        "--key",
        "dora-4242",
        "--admin",
        &admin_url,
        "--config",
        config,
    ];
    let (code, stdout, _) = run_cli(&[&["inspect"], &key[..]].concat());
    assert_eq!(code, Some(0));
    // The refusal began a ban (after = 1), which the state names with its end.
    let (state, banned) = stdout.trim().split_once(", banned until ").unwrap();
    assert_eq!(state, "per_network [dora-4242]: 0 of 2 tokens left");
    assert!(banned.ends_with('Z'), "{stdout}");
    let (code, stdout, _) = run_cli(&[&["reset"], &key[..]].concat());
    assert_eq!(code, Some(0));
    assert!(stdout.contains("reset"), "{stdout}");
    assert_eq!(client.get("/", &user).await.status, 200, "unlocked");
    let access = process.wait_for(false, |line| line.contains("\"keys\":\"per_network=h:"));
    assert!(
        !access.contains("dora-4242"),
        "the access log's keys are hashed: {access}"
    );
    let logged = process.wait_for(false, |line| line.contains("key reset"));
    assert!(
        logged.contains("per_network:h:"),
        "the hashed key: {logged}"
    );
    assert!(!logged.contains("dora-4242"), "no clear value: {logged}");
    // Without the token the API refuses, and the command says why.
    let (code, _, stderr) = run_cli(&[
        "inspect",
        "--limit",
        "per_network",
        "--key",
        "x",
        "--admin",
        &admin_url,
        "--config",
        "/nonexistent.toml",
    ]);
    assert_eq!(code, Some(1));
    assert!(
        stderr.contains("admin token is missing or wrong"),
        "{stderr}"
    );
    let (code, _, stderr) = run_cli(&[
        "inspect", "--limit", "nope", "--admin", &admin_url, "--config", config,
    ]);
    assert_eq!(code, Some(1));
    assert!(stderr.contains("no limit named \"nope\""), "{stderr}");
    // Outside the repository, the admin address and the policy come from the environment;
    // with neither, the error says what to pass.
    let elsewhere = tempfile::tempdir().unwrap();
    let inspect = |environment: &[(&str, &str)]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_tollgate"));
        command
            .args(["inspect", "--limit", "per_network", "--key", "dora-4242"])
            .current_dir(elsewhere.path())
            .env_remove("TOLLGATE_ADMIN")
            .env_remove("TOLLGATE_CONFIG");
        for (name, value) in environment {
            command.env(name, value);
        }
        command.output().expect("run tollgate")
    };
    let output = inspect(&[("TOLLGATE_ADMIN", &admin_url), ("TOLLGATE_CONFIG", config)]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(output.status.code(), Some(0), "{stdout}");
    assert!(
        stdout.starts_with("per_network [dora-4242]: 1 of 2 tokens left"),
        "{stdout}"
    );
    let output = inspect(&[]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        stderr.contains("TOLLGATE_ADMIN") && stderr.contains("TOLLGATE_CONFIG"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn replaying_a_gateways_own_log_reproduces_its_refusals() {
    let upstream = start_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tollgate.toml");
    let text = policy(upstream.address, 5).replace(
        "[[routes]]",
        "[limits.per_user]\nkey = { header = \"x-user\" }\ncapacity = 2\nrate = \"1/h\"\n[[routes]]",
    ).replace("limits = [\"per_network\"]", "limits = [\"per_user\", \"per_network\"]");
    write(&file, &text);
    let mut process = run_with_json_logs(&file);
    let listening = process.wait_for(false, |line| line.contains("\"listening\""));
    let client = HttpClient::new(address_in(&listening));
    let mut statuses = Vec::new();
    for user in [
        "ann", "ann", "ann", "ben", "ben", "cid", "cid", "cid", "ann",
    ] {
        statuses.push(client.get("/", &[("x-user", user)]).await.status.as_u16());
    }
    // per_user (2 each) refuses ann's third, cid's third and ann's fourth; per_network (5)
    // runs out at cid's second.
    assert_eq!(statuses, [200, 200, 429, 200, 200, 200, 429, 429, 429]);
    process.signal("TERM");
    assert_eq!(process.wait_exit(), 0);
    let lines = process.stderr.lock().unwrap().clone();
    let log = dir.path().join("access.log");
    write(&log, &(lines.join("\n") + "\n"));
    let refused_by = |limit: &str| {
        lines
            .iter()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|json| json["target"] == "tollgate::access")
            .filter(|json| {
                json["limit"]
                    .as_str()
                    .unwrap_or("")
                    .split(',')
                    .any(|name| name == limit)
            })
            .count() as u64
    };
    let (code, stdout, stderr) = run_cli(&[
        "replay",
        "--config",
        file.to_str().unwrap(),
        "--json",
        log.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["lines"], 9);
    for limit in ["per_user", "per_network"] {
        let replayed = report["limits"]
            .as_array()
            .unwrap()
            .iter()
            .find(|entry| entry["limit"] == limit)
            .unwrap();
        assert_eq!(
            replayed["refusals"].as_u64(),
            Some(refused_by(limit)),
            "{limit}: {report}"
        );
        assert_eq!(replayed["not_replayable"], 0);
    }
    assert!(refused_by("per_user") > 0 && refused_by("per_network") > 0);
    // The same log gzip-compressed replays the same.
    let gzipped = dir.path().join("access.log.gz");
    let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut encoder, std::fs::read(&log).unwrap().as_slice()).unwrap();
    std::fs::write(&gzipped, encoder.finish().unwrap()).unwrap();
    let (code, again, _) = run_cli(&[
        "replay",
        "--config",
        file.to_str().unwrap(),
        "--json",
        gzipped.to_str().unwrap(),
    ]);
    assert_eq!((code, again), (Some(0), stdout));
    // A log with no request in it is exit 1; a bad policy exit 2.
    let empty = dir.path().join("empty.log");
    write(&empty, "not json\n");
    let (code, stdout, _) = run_cli(&[
        "replay",
        "--config",
        file.to_str().unwrap(),
        "--format",
        "json",
        empty.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(1));
    assert!(stdout.contains("line 1: not a JSON log line"), "{stdout}");
    // Told by its first line, a file not starting with `{` is read as a combined log.
    let (code, stdout, _) = run_cli(&[
        "replay",
        "--config",
        file.to_str().unwrap(),
        empty.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(1));
    assert!(
        stdout.contains("line 1: not a combined log line"),
        "{stdout}"
    );
    let (code, _, _) = run_cli(&[
        "replay",
        "--config",
        "/nonexistent.toml",
        log.to_str().unwrap(),
    ]);
    assert_eq!(code, Some(2));
}

#[tokio::test(flavor = "multi_thread")]
async fn decision_answers_are_logged_with_their_listener_and_protocol() {
    let upstream = start_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tollgate.toml");
    let decision = "[decision]\nlisten = \"127.0.0.1:0\"\n";
    write(&file, &format!("{}{decision}", policy(upstream.address, 5)));
    let process = run_with_json_logs(&file);
    let listening = process.wait_for(false, |line| line.contains("\"decision listener"));
    let client = HttpClient::new(address_in(&listening));
    let asked = client
        .get(
            "/decide",
            &[
                ("x-forwarded-method", "GET"),
                ("x-forwarded-uri", "/a"),
                ("x-forwarded-for", "203.0.113.9"),
            ],
        )
        .await;
    assert_eq!(asked.status, 200);
    let undescribed = client
        .get("/decide", &[("x-forwarded-for", "203.0.113.9")])
        .await;
    assert_eq!(undescribed.status, 400);
    process.wait_for(false, |line| line.contains("\"status\":400"));
    let lines = process.stderr.lock().unwrap().clone();
    let access: Vec<serde_json::Value> = lines
        .iter()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|json| json["target"] == "tollgate::access")
        .collect();
    assert_eq!(access.len(), 2, "{lines:#?}");
    assert_eq!(access[0]["listener"], "decision");
    assert_eq!(access[0]["protocol"], "http");
    assert_eq!(access[0]["client"], "203.0.113.9");
    assert_eq!(access[0]["route"], "default");
    assert_eq!(access[0]["path"], "/a");
    assert_eq!(access[1]["listener"], "decision");
    assert_eq!(access[1]["outcome"], "bad_request");
    assert_eq!(access[1]["cause"], "client");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_settled_response_is_logged_with_what_it_reserved_and_settled() {
    let upstream = common::llm::start_llm_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tollgate.toml");
    let settled = policy(upstream.address, 1000).replace(
        "limits = [\"per_network\"]",
        "limits = [\"per_network\", { limit = \"tokens\", cost = { header = \"x-reserve\", default = 50 }, settle = { header = \"x-tokens\" } }]",
    ) + "[limits.tokens]\nkey = \"global\"\ncapacity = 1000\nrate = \"1/s\"\n";
    write(&file, &settled);
    let process = run_with_json_logs(&file);
    let listening = process.wait_for(false, |line| line.contains("\"listening\""));
    let client = HttpClient::new(address_in(&listening));
    let reply = client
        .get("/header", &[("x-reserve", "70"), ("x-test-tokens", "12")])
        .await;
    assert_eq!(reply.status, 200);
    let line = process.wait_for(false, |line| line.contains("tollgate::access"));
    let access: serde_json::Value = serde_json::from_str(&line).unwrap();
    assert_eq!(access["path"], "/header");
    assert_eq!(access["status"], 200);
    assert_eq!(access["reserved"], "tokens=70");
    assert_eq!(access["settled"], "tokens=12");
}
