//! The docs' recipes (docs/decision.md), run as written: nginx (`auth_request`) and Caddy (`forward_auth`) from
//! Debian's packages in front of an upstream, asking tollgate's decision listener. A client
//! sees the limits hold (200s, then 429 with `Retry-After`), and rotating its own
//! `X-Forwarded-For` does not get it out of them. `scripts/test.sh` installs both.
#![allow(clippy::disallowed_methods)] // the peers are real processes, waited for in real time

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use common::redis_server::free_port;
use common::*;
use tollgate::Tollgate;

const POLICY: &str = r#"
[decision]
listen = "127.0.0.1:0"

[upstreams.app]
url = "http://{upstream}"

[limits.per_network]
key = "client_network"
capacity = 3
rate = "1/h"

[[routes]]
name = "app"
path_prefix = "/"
upstream = "app"
limits = ["per_network"]
"#;

/// The `index`th fenced block of `language` in docs/decision.md's tested recipes.
fn recipe(language: &str, index: usize) -> String {
    let docs =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/decision.md"))
            .expect("docs/decision.md");
    let section = docs
        .split("### nginx and Caddy, as tested")
        .nth(1)
        .and_then(|rest| rest.split("\n### ").next())
        .expect("the docs' \"nginx and Caddy, as tested\" section");
    let fence = format!("```{language}\n");
    let start = section
        .match_indices(&fence)
        .nth(index)
        .expect("the recipe")
        .0
        + fence.len();
    let length = section[start..].find("```").expect("the recipe's end");
    section[start..start + length].to_owned()
}

/// The recipe's addresses as this test has them: the proxy's port, tollgate's decision
/// listener, the upstream.
fn placed(recipe: &str, port: u16, decision: SocketAddr, upstream: SocketAddr) -> String {
    recipe
        .replace("127.0.0.1:8081", &decision.to_string())
        .replace("127.0.0.1:3000", &upstream.to_string())
        .replace("listen 8080;", &format!("listen 127.0.0.1:{port};"))
        .replace(":8080 {", &format!("http://127.0.0.1:{port} {{"))
}

fn program(name: &str) -> PathBuf {
    let candidates = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default();
    candidates
        .into_iter()
        .chain(["/usr/sbin".into(), "/usr/bin".into()])
        .map(|dir: PathBuf| dir.join(name))
        .find(|path| path.is_file())
        .unwrap_or_else(|| panic!("{name} not found: scripts/test.sh installs it from Debian"))
}

/// A peer process, stopped by its PID when the test ends.
struct Peer(Child);

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn listening(port: u16, peer: &mut Peer, log: &Path) {
    for _ in 0..200 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        if let Ok(Some(status)) = peer.0.try_wait() {
            panic!(
                "the peer exited ({status}):\n{}",
                std::fs::read_to_string(log).unwrap_or_default()
            );
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    panic!(
        "the peer never listened on {port}:\n{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
}

/// Tollgate with its decision listener, refusing with `refuse_status`, and an upstream.
async fn start_tollgate(refuse_status: u16) -> (Tollgate, Upstream) {
    let upstream = start_upstream().await;
    let policy = POLICY.replace(
        "listen = \"127.0.0.1:0\"\n",
        &format!("listen = \"127.0.0.1:0\"\nrefuse_status = {refuse_status}\n"),
    );
    let gateway = start_gateway(&policy, upstream.address).await;
    (gateway, upstream)
}

/// Four requests from one client, each with another made-up `X-Forwarded-For`: three pass,
/// the fourth is refused with a wait (returned). With `told`, every answer carries the
/// RateLimit headers tollgate gave.
async fn the_limit_holds(proxy: SocketAddr, upstream: &Upstream, told: bool) -> Reply {
    let client = HttpClient::new(proxy);
    let mut refusal = None;
    for n in 1..=4 {
        let forged = format!("198.51.100.{n}");
        let reply = client
            .get(
                &format!("/items/{n}"),
                &[("x-forwarded-for", forged.as_str())],
            )
            .await;
        if n <= 3 {
            assert_eq!(reply.status, 200, "request {n}: {:?}", reply.body);
        } else {
            assert_eq!(reply.status, 429, "request {n}: {:?}", reply.body);
            let wait: u64 = reply
                .header("retry-after")
                .expect("Retry-After")
                .parse()
                .unwrap();
            assert!((1..=3600).contains(&wait), "{wait}");
            assert_eq!(reply.json()["error"], "too_many_requests");
        }
        if told {
            let remaining = (3 - n.min(3)).to_string();
            assert_eq!(reply.header("ratelimit-limit"), Some("3"), "request {n}");
            assert_eq!(
                reply.header("ratelimit-remaining"),
                Some(remaining.as_str()),
                "request {n}"
            );
            assert!(reply.header("ratelimit-reset").is_some(), "request {n}");
        }
        if n == 4 {
            refusal = Some(reply);
        }
    }
    assert_eq!(
        upstream.hits.load(std::sync::atomic::Ordering::Relaxed),
        3,
        "only admitted requests reach the upstream"
    );
    refusal.expect("the fourth request")
}

#[tokio::test]
async fn nginx_auth_request_asks_and_turns_403_into_429() {
    // As the docs say for nginx.
    let (gateway, upstream) = start_tollgate(403).await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let server = placed(
        &recipe("nginx", 0),
        port,
        gateway.decision_address.unwrap(),
        upstream.address,
    );
    let root = dir.path().display();
    let config = format!(
        "user root;\nworker_processes 1;\ndaemon off;\npid {root}/nginx.pid;\nerror_log {root}/error.log info;\nevents {{}}\nhttp {{\n    access_log off;\n    client_body_temp_path {root}/body;\n    proxy_temp_path {root}/proxy;\n    fastcgi_temp_path {root}/fastcgi;\n    uwsgi_temp_path {root}/uwsgi;\n    scgi_temp_path {root}/scgi;\n{server}}}\n"
    );
    let file = dir.path().join("nginx.conf");
    std::fs::write(&file, config).unwrap();
    let log = dir.path().join("error.log");
    let mut nginx = Peer(
        Command::new(program("nginx"))
            .arg("-c")
            .arg(&file)
            .arg("-p")
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nginx"),
    );
    listening(port, &mut nginx, &log).await;
    the_limit_holds(SocketAddr::from(([127, 0, 0, 1], port)), &upstream, true).await;
    let scrape = gateway.render_metrics();
    assert_eq!(
        metric(
            &scrape,
            "tollgate_decision_requests_total{outcome=\"limited\",protocol=\"http\"}"
        ),
        1.0
    );
    gateway.shutdown().await;
}

/// Caddy serving `site` (placed on `port`) in front of tollgate's decision listener and the
/// upstream.
async fn run_caddy(site: &str, port: u16, dir: &Path) -> Peer {
    let config = format!("{{\n\tadmin off\n\tauto_https off\n}}\n{site}");
    let file = dir.join("Caddyfile");
    std::fs::write(&file, config).unwrap();
    let log = dir.join("caddy.log");
    let mut caddy = Peer(
        Command::new(program("caddy"))
            .args(["run", "--adapter", "caddyfile", "--config"])
            .arg(&file)
            .env("HOME", dir)
            .env("XDG_DATA_HOME", dir)
            .env("XDG_CONFIG_HOME", dir)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("caddy"),
    );
    listening(port, &mut caddy, &log).await;
    caddy
}

#[tokio::test]
async fn caddy_forward_auth_asks_and_passes_the_429_on() {
    let (gateway, upstream) = start_tollgate(429).await;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let site = placed(
        &recipe("caddyfile", 0),
        port,
        gateway.decision_address.unwrap(),
        upstream.address,
    );
    let _caddy = run_caddy(&site, port, dir.path()).await;
    let refused = the_limit_holds(SocketAddr::from(([127, 0, 0, 1], port)), &upstream, false).await;
    assert_eq!(
        refused.header("x-tollgate-limit"),
        Some("per_network"),
        "Caddy passes it on"
    );
    assert_eq!(refused.header("ratelimit-limit"), Some("3"));
    gateway.shutdown().await;
}

#[tokio::test]
async fn caddy_drops_tollgates_own_fields_where_the_docs_say_how() {
    let (gateway, upstream) = start_tollgate(429).await;
    let dir = tempfile::tempdir().unwrap();
    let dropping = recipe("caddyfile", 1);
    let port = free_port();
    let site = placed(
        &recipe("caddyfile", 0),
        port,
        gateway.decision_address.unwrap(),
        upstream.address,
    )
    .replacen("{\n", &format!("{{\n{dropping}"), 1);
    let _caddy = run_caddy(&site, port, dir.path()).await;
    let refused = the_limit_holds(SocketAddr::from(([127, 0, 0, 1], port)), &upstream, false).await;
    assert_eq!(refused.header("x-tollgate-limit"), None);
    assert_eq!(refused.header("x-tollgate-route"), None);
    assert!(refused.header("retry-after").is_some());
    gateway.shutdown().await;
}

#[test]
fn the_deploy_example_is_the_tested_recipe_and_both_halves_check() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/decision");
    let output = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["check", "--config"])
        .arg(root.join("tollgate.toml"))
        .output()
        .unwrap();
    let summary = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(summary.contains("listen none"), "{summary}");
    assert!(
        summary.contains("decision 127.0.0.1:8081") && summary.contains("refusing with 403"),
        "{summary}"
    );
    let nginx_conf = std::fs::read_to_string(root.join("nginx.conf")).unwrap();
    let unindented =
        |text: &str| -> Vec<String> { text.lines().map(|line| line.trim().to_owned()).collect() };
    let recipe = unindented(&recipe("nginx", 0));
    let conf = unindented(&nginx_conf);
    assert!(
        conf.windows(recipe.len())
            .any(|window| window == recipe.as_slice()),
        "deploy/decision/nginx.conf does not hold the docs' nginx recipe"
    );
    let dir = tempfile::tempdir().unwrap();
    let checked = Command::new(program("nginx"))
        .args(["-t", "-e", "stderr", "-p"])
        .arg(dir.path())
        .arg("-c")
        .arg(root.join("nginx.conf"))
        .output()
        .unwrap();
    assert!(
        checked.status.success(),
        "nginx -t: {}",
        String::from_utf8_lossy(&checked.stderr)
    );
}
