//! Top keys over HTTP: a workload of many light networks and a few heavy ones with known
//! counts, the heavy ones listed with counts within their error; every limit at once; routes
//! by outcome; bad queries; the admin token; and the fleet's counts added across two replicas
//! on one real `redis-server`.

mod common;

use common::redis_server::RedisServer;
use common::*;
use serde_json::Value;

const POLICY: &str = r#"
[client_ip]
trusted_hops = 1

[top]
keys_per_limit = 20

[upstreams.app]
url = "http://{upstream}"

[limits.strict]
key = "client_network"
ipv4_prefix = 24
capacity = 1
rate = "1/h"

[limits.wide]
key = "client_network"
ipv4_prefix = 24
capacity = 1000
rate = "1/s"

[[routes]]
name = "strict"
path = "/strict"
upstream = "app"
limits = ["strict"]

[[routes]]
name = "wide"
path = "/wide"
upstream = "app"
limits = ["wide"]
"#;

/// `requests` requests to `path` from the network 10.`a`.`b`.0/24.
async fn send(client: &HttpClient, path: &str, (a, b): (u8, u8), requests: usize) {
    let from = format!("10.{a}.{b}.7");
    for _ in 0..requests {
        let status = client.get(path, &[("x-forwarded-for", &from)]).await.status;
        assert!(status == 200 || status == 429, "{status}");
    }
}

/// The workload: networks 10.0.1 and 10.0.2 heavy, 10.1.0 to 10.1.199 light (two requests
/// each), on both routes.
async fn workload(client: &HttpClient) {
    for path in ["/strict", "/wide"] {
        send(client, path, (0, 1), 60).await;
        send(client, path, (0, 2), 40).await;
        for light in 0..200 {
            send(client, path, (1, light), 2).await;
        }
    }
}

fn keys(answer: &Value) -> Vec<(String, f64, f64)> {
    answer["keys"]
        .as_array()
        .unwrap_or_else(|| panic!("no keys: {answer}"))
        .iter()
        .map(|key| {
            let number = |field: &str| key[field].as_f64().unwrap();
            (
                key["key"].as_str().unwrap().to_owned(),
                number("count"),
                number("error"),
            )
        })
        .collect()
}

/// `key`'s listed count holds `true_count` within its error, which is within total ÷ 20.
fn assert_within_error(listed: &[(String, f64, f64)], key: &str, true_count: f64, total: f64) {
    let (_, count, error) = listed
        .iter()
        .find(|(listed, _, _)| listed == key)
        .unwrap_or_else(|| panic!("{key} not listed: {listed:?}"));
    assert!(
        *count >= true_count && count - error <= true_count,
        "{key}: {count} ± {error}, true {true_count}"
    );
    assert!(
        *error <= total / 20.0,
        "{key}: error {error} over total ÷ keys_per_limit"
    );
}

#[tokio::test]
async fn heavy_networks_are_listed_with_their_counts_within_the_error() {
    let upstream = start_upstream().await;
    let gateway = start_gateway(POLICY, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    workload(&client).await;
    let admin = HttpClient::new(gateway.admin_address);

    // Refusals: the heavy networks 59 and 39, the 200 light ones one each (298 in all).
    let answer = admin.get("/top?limit=strict", &[]).await;
    assert_eq!(answer.status, 200, "{:?}", answer.body);
    let answer = answer.json();
    assert_eq!(answer["limit"], "strict");
    assert_eq!(answer["by"], "refused");
    assert_eq!(answer["window_seconds"], 60);
    assert_eq!(answer["scope"], "replica");
    let listed = keys(&answer);
    assert!(listed.len() <= 20);
    assert_eq!(listed[0].0, "v4:10.0.1.0/24", "largest first: {listed:?}");
    assert_eq!(listed[1].0, "v4:10.0.2.0/24", "{listed:?}");
    assert_within_error(&listed, "v4:10.0.1.0/24", 59.0, 298.0);
    assert_within_error(&listed, "v4:10.0.2.0/24", 39.0, 298.0);

    // Tokens charged: every request of the wide route paid one.
    let answer = admin
        .get("/top?limit=wide&by=charged&window=15m&n=2", &[])
        .await
        .json();
    assert_eq!(
        (answer["by"].as_str(), answer["window_seconds"].as_u64()),
        (Some("charged"), Some(900))
    );
    let listed = keys(&answer);
    assert_eq!(listed.len(), 2);
    assert_within_error(&listed, "v4:10.0.1.0/24", 60.0, 500.0);
    assert_within_error(&listed, "v4:10.0.2.0/24", 40.0, 500.0);
    // The wide limit refused nobody.
    let answer = admin.get("/top?limit=wide", &[]).await.json();
    assert!(keys(&answer).is_empty(), "{answer}");

    // Without a limit: every limit's answer.
    let all = admin.get("/top?n=1", &[]).await.json();
    let limits = all["limits"].as_array().unwrap();
    assert_eq!(limits.len(), 2, "{all}");
    let strict = limits
        .iter()
        .find(|answer| answer["limit"] == "strict")
        .unwrap();
    assert_eq!(keys(strict)[0].0, "v4:10.0.1.0/24");

    // Each route's requests by outcome.
    let routes = admin.get("/top/routes?window=5m", &[]).await.json();
    assert_eq!(routes["window_seconds"], 300);
    let strict = routes["routes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|route| route["route"] == "strict")
        .unwrap_or_else(|| panic!("{routes}"));
    assert_eq!(strict["requests"], 500);
    assert_eq!(strict["outcomes"]["allowed"], 202);
    assert_eq!(strict["outcomes"]["limited"], 298);

    // `tollgate top --once`: the same, as a table for scripts.
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["top", "--once", "--limit", "strict", "--admin"])
        .arg(format!("http://{}", gateway.admin_address))
        .env_remove("TOLLGATE_CONFIG")
        .output()
        .await
        .unwrap();
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{table} {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let lines: Vec<&str> = table.lines().collect();
    assert_eq!(lines[0], "ROUTES (last 60 s)", "{table}");
    let strict_route = lines
        .iter()
        .find(|line| line.trim_start().starts_with("strict "))
        .unwrap();
    let columns: Vec<&str> = strict_route.split_whitespace().collect();
    assert_eq!(columns, ["strict", "500", "202", "298", "0"], "{table}");
    let heading = lines
        .iter()
        .position(|line| *line == "strict by refused (last 60 s, replica)");
    let first_key = lines[heading.expect("the limit's heading") + 1];
    assert!(
        first_key.trim_start().starts_with("v4:10.0.1.0/24"),
        "{table}"
    );
    assert!(first_key.trim_end().ends_with("59 ±0"), "{table}");

    // `tollgate top` on a terminal: drawn, and gone on `q`.
    let screen = tokio::process::Command::new("python3")
        .arg(crate_root().join("tests/fixtures/tty_driver.py"))
        .args([
            "strict by refused",
            "q",
            env!("CARGO_BIN_EXE_tollgate"),
            "top",
            "--admin",
        ])
        .arg(format!("http://{}", gateway.admin_address))
        .env_remove("TOLLGATE_CONFIG")
        .output()
        .await
        .unwrap();
    let shown = String::from_utf8_lossy(&screen.stdout);
    assert!(
        screen.status.success(),
        "{shown} {}",
        String::from_utf8_lossy(&screen.stderr)
    );
    assert!(
        shown.contains("(q quits)") && shown.contains("strict by refused"),
        "{shown}"
    );
    assert!(shown.contains("v4:10.0.1.0/24"), "{shown}");
}

#[tokio::test]
async fn bad_queries_are_refused_and_the_token_is_asked_for() {
    let upstream = start_upstream().await;
    std::env::set_var("TOLLGATE_TOP_TEST_TOKEN", "top-secret-token-0123456789");
    let policy = format!("[admin]\ntoken_env = \"TOLLGATE_TOP_TEST_TOKEN\"\n{POLICY}");
    let gateway = start_gateway(&policy, upstream.address).await;
    let admin = HttpClient::new(gateway.admin_address);
    assert_eq!(admin.get("/top", &[]).await.status, 401);
    assert_eq!(admin.get("/top/routes", &[]).await.status, 401);
    let token = [("authorization", "Bearer top-secret-token-0123456789")];
    assert_eq!(admin.get("/top", &token).await.status, 200);
    for (query, status) in [
        ("/top?n=1001", 400),
        ("/top?by=tokens", 400),
        ("/top?window=2m", 400),
        ("/top?limit=nobody", 404),
        ("/top/routes?window=1h", 400),
        ("/top/other", 404),
    ] {
        let answer = admin.get(query, &token).await;
        assert_eq!(answer.status, status, "{query}: {:?}", answer.body);
    }
    let posted = admin.post("/top", &token, "").await;
    assert_eq!(posted.status, 405);
}

#[tokio::test]
async fn top_keys_off_answers_that_they_are() {
    let upstream = start_upstream().await;
    let policy = POLICY.replace("keys_per_limit = 20", "keys_per_limit = 0");
    let gateway = start_gateway(&policy, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    send(&client, "/strict", (0, 1), 3).await;
    let admin = HttpClient::new(gateway.admin_address);
    let answer = admin.get("/top", &[]).await;
    assert_eq!(answer.status, 409, "{:?}", answer.body);
    assert_eq!(answer.json()["error"], "top_keys_off");
}

/// Two replicas on one `redis-server`: each sends its view every second, and `/top` on
/// either adds both.
#[tokio::test]
async fn the_fleets_counts_are_added_across_replicas() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\nhash_key = \"top-test-secret-0123456789\"\n",
        redis.url()
    );
    let policy = format!("{store}{POLICY}");
    let one = start_gateway(&policy, upstream.address).await;
    let two = start_gateway(&policy, upstream.address).await;
    // 10.0.1.0/24: 30 requests on one replica, 20 on the other; one bucket in Redis, so 49
    // refusals in all.
    send(&HttpClient::new(one.addresses[0]), "/strict", (0, 1), 30).await;
    send(&HttpClient::new(two.addresses[0]), "/strict", (0, 1), 20).await;
    let admin = HttpClient::new(one.admin_address);
    // The other replica's view arrives within its next second.
    let mut answer = Value::Null;
    for _ in 0..200 {
        answer = admin.get("/top?limit=strict", &[]).await.json();
        if keys(&answer).first().map(|key| key.1) == Some(49.0) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(answer["scope"], "fleet");
    let listed = keys(&answer);
    assert_eq!(
        listed[0],
        ("v4:10.0.1.0/24".to_owned(), 49.0, 0.0),
        "{answer}"
    );
}

/// A concurrency limit's refusals are counted too: one request held, the next refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_limits_refusals_are_listed() {
    let upstream = start_upstream().await;
    upstream
        .delay_ms
        .store(3000, std::sync::atomic::Ordering::SeqCst);
    let policy = format!(
        "{POLICY}\n[limits.one_at_a_time]\nkey = \"client_network\"\nipv4_prefix = 24\nconcurrency = 1\n\n[[routes]]\nname = \"held\"\npath = \"/delayed\"\nupstream = \"app\"\nlimits = [\"one_at_a_time\"]\n"
    );
    let gateway = start_gateway(&policy, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let held = {
        let client = client.clone();
        tokio::spawn(async move {
            client
                .get("/delayed", &[("x-forwarded-for", "10.0.7.7")])
                .await
        })
    };
    // Once the first is upstream, holding the network's slot, the second is refused.
    let hits = upstream.hits.clone();
    eventually("the first request reaches the upstream", || {
        hits.load(std::sync::atomic::Ordering::SeqCst) == 1
    })
    .await;
    let second = client
        .get("/delayed", &[("x-forwarded-for", "10.0.7.8")])
        .await;
    assert_eq!(second.status, 429);
    let answer = HttpClient::new(gateway.admin_address)
        .get("/top?limit=one_at_a_time", &[])
        .await
        .json();
    assert_eq!(keys(&answer)[0].0, "v4:10.0.7.0/24", "{answer}");
    assert_eq!(held.await.unwrap().status, 200);
}
