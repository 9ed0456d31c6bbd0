//! Overrides over real HTTP: one key's numbers changed while the gateway runs, through the
//! admin API and the CLI; a raise that does not fill a bucket and a cut that bites at once;
//! expiry; the memory store's file across a restart; a reload that drops them; the decision
//! listener deciding with them; and every malformed change refused with its field named.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use tollgate::limit::Clock;
use tollgate::{Options, Tollgate};

const TOKEN: &str = "override-admin-token-0123";

const POLICY: &str = r#"
[admin]
token_env = "TOLLGATE_TEST_OVERRIDES_TOKEN"

[decision]
listen = "127.0.0.1:0"

[overrides]
max_ttl = "30d"

[upstreams.app]
url = "http://{upstream}"

[limits.per_org]
key = { header = "x-org" }
capacity = 2
rate = "1/h"

[limits.per_network]
key = "client_network"
capacity = 1000
rate = "1000/s"

[limits.in_flight]
key = { header = "x-org" }
concurrency = 1

[[routes]]
name = "api"
path_prefix = "/api"
upstream = "app"
limits = ["per_org", "per_network"]

[[routes]]
name = "held"
path = "/held-body"
upstream = "app"
limits = ["in_flight"]
"#;

fn policy(extra: &str) -> String {
    std::env::set_var("TOLLGATE_TEST_OVERRIDES_TOKEN", TOKEN);
    format!("{extra}{POLICY}")
}

fn auth() -> String {
    format!("Bearer {TOKEN}")
}

struct Admin(HttpClient);

impl Admin {
    async fn call(&self, method: &str, path: &str, body: &str) -> Reply {
        let authorization = auth();
        self.0
            .send(
                method,
                path,
                &[("authorization", authorization.as_str())],
                Bytes::from(body.to_owned()),
            )
            .await
    }

    async fn put(&self, org: &str, body: &str) -> Reply {
        self.put_on("per_org", org, body).await
    }

    async fn put_on(&self, limit: &str, key: &str, body: &str) -> Reply {
        self.call("PUT", &format!("/overrides/{limit}?key={key}"), body)
            .await
    }
}

async fn api(client: &HttpClient, org: &str) -> u16 {
    client
        .get("/api/items", &[("x-org", org)])
        .await
        .status
        .as_u16()
}

async fn statuses(client: &HttpClient, org: &str, count: usize) -> Vec<u16> {
    let mut seen = Vec::new();
    for _ in 0..count {
        seen.push(api(client, org).await);
    }
    seen
}

#[tokio::test]
async fn a_raise_does_not_fill_a_bucket_a_cut_bites_and_both_end() {
    let upstream = start_upstream().await;
    let clock = Clock::manual_at(1_800_000_000);
    let gateway =
        start_gateway_with_clock(&policy(""), upstream.address, Some(clock.clone())).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let admin = Admin(HttpClient::new(gateway.admin_address));

    assert_eq!(statuses(&client, "acme", 3).await, [200, 200, 429]);
    let raised = admin
        .put(
            "acme",
            r#"{"capacity": 5, "reason": "ACME launch", "label": "acme"}"#,
        )
        .await;
    assert_eq!(raised.status, 200, "{:?}", raised.body);
    let stored = raised.json();
    assert_eq!(stored["limit"], "per_org");
    assert!(
        stored["key"].as_str().unwrap().starts_with("h:"),
        "{stored}"
    );
    assert_eq!(stored["capacity"], 5.0);
    assert!(stored["rate_per_second"].is_null(), "the limit's own rate");
    assert_eq!(stored["exempt"], false);
    assert_eq!(
        stored["expires_unix"],
        1_800_000_000u64 + 30 * 86_400,
        "without a ttl, max_ttl"
    );
    assert_eq!(stored["reason"], "ACME launch");
    assert_eq!(stored["created_unix"], 1_800_000_000u64);
    assert_eq!(stored["created_by"], "127.0.0.1");
    // The empty bucket stays empty: a raise does not fill it.
    assert_eq!(api(&client, "acme").await, 429);
    // A faster rate refills it, up to the new capacity.
    assert_eq!(
        admin
            .put("acme", r#"{"capacity": 5, "rate": "10/s"}"#)
            .await
            .status,
        200
    );
    clock.advance(Duration::from_secs(60));
    assert_eq!(
        statuses(&client, "acme", 6).await,
        [200, 200, 200, 200, 200, 429]
    );

    // A key never seen starts full at its override's numbers; a cut bites at once.
    assert_eq!(admin.put("beta", r#"{"capacity": 1}"#).await.status, 200);
    assert_eq!(statuses(&client, "beta", 2).await, [200, 429]);
    // Full again after an hour (two tokens), then cut to one: the tokens are capped at once.
    assert_eq!(statuses(&client, "gamma", 1).await, [200]);
    clock.advance(Duration::from_secs(3_600));
    assert_eq!(admin.put("gamma", r#"{"capacity": 1}"#).await.status, 200);
    assert_eq!(statuses(&client, "gamma", 2).await, [200, 429]);

    let listed = admin.call("GET", "/overrides", "").await.json();
    let keys: Vec<f64> = listed["overrides"]
        .as_array()
        .unwrap()
        .iter()
        .map(|entry| entry["capacity"].as_f64().unwrap())
        .collect();
    assert_eq!(keys.len(), 3, "{listed}");
    let one = admin.call("GET", "/overrides/per_org?key=beta", "").await;
    assert_eq!(one.status, 200);
    assert_eq!(one.json()["capacity"], 1.0);
    let state = admin
        .call("GET", "/limits/per_org?key=beta", "")
        .await
        .json();
    assert_eq!(state["override"]["capacity"], 1.0, "{state}");
    assert_eq!(
        state["capacity"], 1.0,
        "the key is read with its override's numbers"
    );
    assert!(admin
        .call("GET", "/limits/per_org?key=nobody", "")
        .await
        .json()["override"]
        .is_null());
    let scrape = gateway.render_metrics();
    assert_eq!(
        metric(&scrape, "tollgate_overrides_active{limit=\"per_org\"}"),
        3.0
    );
    assert_eq!(
        metric(&scrape, "tollgate_override_changes_total{action=\"set\"}"),
        4.0
    );

    // Deleted: the limit's own numbers again, its tokens kept (the one the hour refilled).
    assert_eq!(
        admin
            .call("DELETE", "/overrides/per_org?key=beta", "")
            .await
            .status,
        204
    );
    assert_eq!(
        admin
            .call("DELETE", "/overrides/per_org?key=beta", "")
            .await
            .status,
        404
    );
    assert_eq!(
        admin
            .call("GET", "/overrides/per_org?key=beta", "")
            .await
            .status,
        404
    );
    assert_eq!(statuses(&client, "beta", 2).await, [200, 429]);
    let scrape = gateway.render_metrics();
    assert_eq!(
        metric(&scrape, "tollgate_overrides_active{limit=\"per_org\"}"),
        2.0
    );
    assert_eq!(
        metric(
            &scrape,
            "tollgate_override_changes_total{action=\"delete\"}"
        ),
        1.0
    );

    // An exempt key for ten seconds: never limited, then its limit's own numbers.
    let exempt = admin
        .put("delta", r#"{"exempt": true, "ttl": "10s"}"#)
        .await;
    assert_eq!(
        exempt.json()["expires_unix"],
        1_800_000_000u64 + 60 + 3_600 + 10
    );
    assert_eq!(statuses(&client, "delta", 5).await, [200; 5]);
    clock.advance(Duration::from_secs(10));
    assert_eq!(statuses(&client, "delta", 3).await, [200, 200, 429]);
    assert_eq!(
        admin
            .call("GET", "/overrides/per_org?key=delta", "")
            .await
            .status,
        404
    );
    let ended = admin
        .call("DELETE", "/overrides/per_org?key=delta", "")
        .await;
    assert_eq!(ended.status, 404, "an override that ended is none");
    eventually("the ended override is counted as expired", || {
        metric(
            &gateway.render_metrics(),
            "tollgate_override_changes_total{action=\"expire\"}",
        ) == 1.0
    })
    .await;
}

#[tokio::test]
async fn the_decision_listener_and_concurrency_limits_decide_with_overrides() {
    let upstream = start_upstream().await;
    let gateway = start_gateway(&policy(""), upstream.address).await;
    let admin = Admin(HttpClient::new(gateway.admin_address));
    let decision = HttpClient::new(gateway.decision_address.unwrap());
    let ask = |org: &'static str| {
        let decision = decision.clone();
        async move {
            let headers = [
                ("x-forwarded-method", "GET"),
                ("x-forwarded-uri", "/api/items"),
                ("x-forwarded-host", "shop.example"),
                ("x-forwarded-for", "198.51.100.7"),
                ("x-org", org),
            ];
            decision.get("/decide", &headers).await.status.as_u16()
        }
    };
    assert_eq!(admin.put("acme", r#"{"capacity": 4}"#).await.status, 200);
    let mut seen = Vec::new();
    for _ in 0..5 {
        seen.push(ask("acme").await);
    }
    assert_eq!(seen, [200, 200, 200, 200, 429]);

    // A concurrency limit of one, raised to two for one key.
    let slots = admin
        .call(
            "PUT",
            "/overrides/in_flight?key=acme",
            r#"{"concurrency": 2}"#,
        )
        .await;
    assert_eq!(slots.status, 200, "{:?}", slots.body);
    let wrong = admin
        .call("PUT", "/overrides/in_flight?key=acme", r#"{"capacity": 2}"#)
        .await;
    assert_eq!(wrong.status, 400);
    assert_eq!(wrong.json()["field"], "capacity");
    // Each response's body is held open upstream: its slot stays taken meanwhile.
    let request = b"GET /held-body HTTP/1.1\r\nHost: app\r\nx-org: acme\r\n\r\n";
    let (first, _held_one) = raw_head(gateway.addresses[0], request).await;
    let (second, _held_two) = raw_head(gateway.addresses[0], request).await;
    assert_eq!((raw_status(&first), raw_status(&second)), (200, 200));
    let (third, _) = raw_head(gateway.addresses[0], request).await;
    assert_eq!(raw_status(&third), 429, "two slots, both taken");
}

#[tokio::test]
async fn every_malformed_change_is_refused_with_its_field() {
    let upstream = start_upstream().await;
    let gateway = start_gateway(&policy(""), upstream.address).await;
    let admin = Admin(HttpClient::new(gateway.admin_address));
    for (body, field) in [
        (r#"{"capacity": 5, "burst": 1}"#, "burst"),
        (r#"{"capacity": -1}"#, "capacity"),
        (r#"{"capacity": 1e300}"#, "capacity"),
        (r#"{"rate": "lots/s"}"#, "rate"),
        (r#"{"quota": 5}"#, "quota"),
        (r#"{"capacity": 5, "ttl": "31d"}"#, "ttl"),
        (r#"{}"#, "body"),
        ("not json", "body"),
    ] {
        let answer = admin.put("acme", body).await;
        assert_eq!(answer.status, 400, "{body}");
        assert_eq!(answer.json()["field"], field, "{body}");
    }
    let unknown = admin
        .call("PUT", "/overrides/nope?key=a", r#"{"capacity": 5}"#)
        .await;
    assert_eq!(unknown.status, 404);
    assert_eq!(unknown.json()["error"], "unknown_limit");
    // A network is just a value for a header-keyed limit; an address a network limit cannot
    // read is a 400.
    assert_eq!(
        admin.put("10.0.0.0%2F8", r#"{"capacity": 5}"#).await.status,
        200
    );
    let address = admin
        .call(
            "PUT",
            "/overrides/per_network?key=10.0.0.999",
            r#"{"capacity": 5}"#,
        )
        .await;
    assert_eq!(address.status, 400);
    let network = admin
        .call(
            "PUT",
            "/overrides/per_network?key=203.0.113.9",
            r#"{"capacity": 5}"#,
        )
        .await;
    assert_eq!(network.json()["key"], "v4:203.0.113.9/32");
    let huge = format!(
        r#"{{"capacity": 5, "reason": "{}"}}"#,
        "x".repeat(17 * 1024)
    );
    assert_eq!(admin.put("acme", &huge).await.status, 413);
    assert_eq!(
        admin
            .call("POST", "/overrides/per_org?key=a", "")
            .await
            .status,
        405
    );
    assert_eq!(admin.call("POST", "/overrides", "").await.status, 405);
    let anonymous = HttpClient::new(gateway.admin_address)
        .send(
            "PUT",
            "/overrides/per_org?key=a",
            &[],
            Bytes::from(r#"{"capacity": 5}"#),
        )
        .await;
    assert_eq!(anonymous.status, 401);
    let listed = admin.call("GET", "/overrides", "").await.json();
    assert_eq!(listed["overrides"].as_array().unwrap().len(), 2, "{listed}");
}

#[tokio::test]
async fn the_memory_stores_file_keeps_overrides_across_a_restart() {
    let upstream = start_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("overrides.json");
    let with_file = policy(&format!(
        "[overrides]\nfile = {:?}\n",
        file.display().to_string()
    ))
    .replacen("[overrides]\nmax_ttl = \"30d\"\n", "", 1);
    let start = || async {
        Tollgate::start(compile(&with_file, upstream.address), Options::default()).await
    };
    let first = start().await.unwrap();
    let admin = Admin(HttpClient::new(first.admin_address));
    assert_eq!(admin.put("acme", r#"{"exempt": true}"#).await.status, 200);
    assert!(file.exists());
    first.shutdown().await;
    drop(first);

    let second = start().await.unwrap();
    let client = HttpClient::new(second.addresses[0]);
    assert_eq!(statuses(&client, "acme", 4).await, [200; 4], "still exempt");
    assert_eq!(statuses(&client, "other", 3).await, [200, 200, 429]);

    // A reload that removes the limit drops its overrides, from the file too.
    let without = with_file
        .replace(
            "limits = [\"per_org\", \"per_network\"]",
            "limits = [\"per_network\"]",
        )
        .replace(
            "[limits.per_org]\nkey = { header = \"x-org\" }\ncapacity = 2\nrate = \"1/h\"\n",
            "",
        );
    second.reload(compile(&without, upstream.address)).unwrap();
    let admin = Admin(HttpClient::new(second.admin_address));
    let listed = admin.call("GET", "/overrides", "").await.json();
    assert_eq!(listed["overrides"], serde_json::json!([]));
    let kept: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(kept["overrides"], serde_json::json!([]));
    assert_eq!(
        admin
            .put_on("per_network", "127.0.0.1", r#"{"capacity": 7}"#)
            .await
            .status,
        200
    );
    second.shutdown().await;
    drop(second);

    // Started with a policy that no longer has the limit: its override is dropped, from the
    // file too.
    let without_network = with_file
        .replace(
            "limits = [\"per_org\", \"per_network\"]",
            "limits = [\"per_org\"]",
        )
        .replace(
            "[limits.per_network]\nkey = \"client_network\"\ncapacity = 1000\nrate = \"1000/s\"\n",
            "",
        );
    let third = Tollgate::start(
        compile(&without_network, upstream.address),
        Options::default(),
    )
    .await
    .unwrap();
    let admin = Admin(HttpClient::new(third.admin_address));
    let listed = admin.call("GET", "/overrides", "").await.json();
    assert_eq!(listed["overrides"], serde_json::json!([]), "{listed}");
    let kept: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(kept["overrides"], serde_json::json!([]));
    third.shutdown().await;
    drop(third);

    std::fs::write(&file, "{ not json").unwrap();
    let error = start()
        .await
        .err()
        .expect("a malformed file stops the start");
    assert!(error.to_string().contains("overrides.json"), "{error}");
}

fn redis_store(url: &str) -> String {
    format!(
        "[store]\nbackend = \"redis\"\nurl = \"{url}\"\nhash_key = \"override-test-secret-0123\"\n"
    )
}

/// Waits until `admin`'s replica answers `path` with `status`.
async fn until_answered(admin: &Admin, path: &str, status: u16) -> bool {
    for _ in 0..500 {
        if admin.call("GET", path, "").await.status == status {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

/// On a Redis Cluster the overrides' hash and version share a slot: a change on one replica
/// reaches the other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_keeps_overrides_for_every_replica() {
    let cluster = common::redis_server::RedisCluster::start();
    let upstream = start_upstream().await;
    let text = policy(&redis_store(&cluster.url()));
    let start = || async {
        Tollgate::start(compile(&text, upstream.address), Options::default())
            .await
            .unwrap()
    };
    let (one, two) = (start().await, start().await);
    let admin_one = Admin(HttpClient::new(one.admin_address));
    let admin_two = Admin(HttpClient::new(two.admin_address));
    let set = admin_one.put("acme", r#"{"capacity": 3}"#).await;
    assert_eq!(set.status, 200, "{:?}", set.body);
    assert!(until_answered(&admin_two, "/overrides/per_org?key=acme", 200).await);
    let client = HttpClient::new(two.addresses[0]);
    assert_eq!(statuses(&client, "acme", 4).await, [200, 200, 200, 429]);
    assert_eq!(
        admin_two
            .call("DELETE", "/overrides/per_org?key=acme", "")
            .await
            .status,
        204
    );
    assert!(until_answered(&admin_one, "/overrides/per_org?key=acme", 404).await);
}

/// Two replicas on one real `redis-server`: a change made on one is in force on the other
/// without a request to it, and both keep it across a restart of both.
#[tokio::test]
async fn every_replica_sees_a_change_and_a_restart_keeps_it() {
    let redis = common::redis_server::RedisServer::start();
    let upstream = start_upstream().await;
    let store = redis_store(&redis.url());
    let text = policy(&store);
    let start = || async {
        Tollgate::start(compile(&text, upstream.address), Options::default())
            .await
            .unwrap()
    };
    let (one, two) = (start().await, start().await);
    let (client_one, client_two) = (
        HttpClient::new(one.addresses[0]),
        HttpClient::new(two.addresses[0]),
    );
    let admin_one = Admin(HttpClient::new(one.admin_address));
    let admin_two = Admin(HttpClient::new(two.admin_address));
    assert_eq!(statuses(&client_two, "acme", 3).await, [200, 200, 429]);

    // Exempted on one; the other replica's deny cache forgets its refusal with the change.
    let raised = admin_one.put("acme", r#"{"exempt": true}"#).await;
    assert_eq!(raised.status, 200, "{:?}", raised.body);
    assert!(
        until_answered(&admin_two, "/overrides/per_org?key=acme", 200).await,
        "the other replica reads the change"
    );
    assert_eq!(statuses(&client_two, "acme", 3).await, [200; 3]);
    assert_eq!(statuses(&client_one, "acme", 3).await, [200; 3]);
    // A faster rate, set on one: the other's remembered refusal (an hour's wait at the old
    // rate) is forgotten with the change.
    assert_eq!(statuses(&client_two, "beta", 4).await, [200, 200, 429, 429]);
    assert_eq!(
        admin_one.put("beta", r#"{"rate": "3600/s"}"#).await.status,
        200
    );
    assert!(until_answered(&admin_two, "/overrides/per_org?key=beta", 200).await);
    assert_eq!(
        api(&client_two, "beta").await,
        200,
        "refilled at the new rate on the other replica"
    );
    eventually("both gauges count them", || {
        [&one, &two].iter().all(|replica| {
            metric(
                &replica.render_metrics(),
                "tollgate_overrides_active{limit=\"per_org\"}",
            ) == 2.0
        })
    })
    .await;

    one.shutdown().await;
    two.shutdown().await;
    drop((one, two));
    let (one, two) = (start().await, start().await);
    for replica in [&one, &two] {
        let admin = Admin(HttpClient::new(replica.admin_address));
        let kept = admin.call("GET", "/overrides/per_org?key=acme", "").await;
        assert_eq!(kept.status, 200, "in force from the start");
        assert_eq!(kept.json()["exempt"], true);
    }

    // Deleted on the second: gone for the first too.
    let admin_two = Admin(HttpClient::new(two.admin_address));
    assert_eq!(
        admin_two
            .call("DELETE", "/overrides/per_org?key=acme", "")
            .await
            .status,
        204
    );
    let admin_one = Admin(HttpClient::new(one.admin_address));
    assert!(
        until_answered(&admin_one, "/overrides/per_org?key=acme", 404).await,
        "the other replica reads the delete"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_sets_lists_and_deletes_overrides() {
    let upstream = start_upstream().await;
    let gateway = start_gateway(&policy(""), upstream.address).await;
    let admin = format!("http://{}", gateway.admin_address);
    let run = |args: &[&str]| {
        let output = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .arg("override")
            .args(args)
            .args(["--admin", &admin])
            .env("TOLLGATE_ADMIN_TOKEN", TOKEN)
            .env("TOLLGATE_CONFIG", "/nonexistent/tollgate.toml")
            .output()
            .unwrap();
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    };
    let (ok, out, err) = run(&[
        "set",
        "--limit",
        "per_org",
        "--key",
        "acme",
        "--capacity",
        "50",
        "--rate",
        "5/s",
        "--ttl",
        "1h",
        "--reason",
        "launch",
        "--label",
        "acme",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("per_org h:") && out.contains("capacity 50, 5/s until "),
        "{out}"
    );
    assert!(out.contains("(acme: launch)"), "{out}");
    let (ok, out, _) = run(&["list"]);
    assert!(ok);
    assert_eq!(out.lines().count(), 1, "{out}");
    let client = HttpClient::new(gateway.addresses[0]);
    assert_eq!(statuses(&client, "acme", 3).await, [200; 3], "capacity 50");

    let (ok, _, err) = run(&["set", "--limit", "per_org", "--key", "acme", "--quota", "5"]);
    assert!(!ok);
    assert!(err.contains("400") && err.contains("quota"), "{err}");
    let (ok, out, _) = run(&["delete", "--limit", "per_org", "--key", "acme"]);
    assert!(ok && out.contains("deleted"), "{out}");
    let (ok, _, err) = run(&["delete", "--limit", "per_org", "--key", "acme"]);
    assert!(!ok && err.contains("404"), "{err}");
    assert_eq!(run(&["list"]).1.trim(), "no overrides");
}
