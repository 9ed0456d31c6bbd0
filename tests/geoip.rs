//! Limits keyed by the network's owner and country (`[geoip]`), with MaxMind DB files the test
//! writes with `mmdb-writer` (PyPI, in the test script's virtual environment): a bot rotating
//! through one provider's ranges shares one bucket, exempt networks and countries pass,
//! unknown addresses count as the key missing, and a broken file is an error naming it — at
//! start, in `check`, and on a reload, which then changes nothing.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use tollgate::config::Policy;
use tollgate::{Options, Tollgate};

/// `asn.mmdb` and `country.mmdb` in a new directory (see tests/fixtures/geoip_databases.py).
fn databases() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(test_python())
        .arg(crate_root().join("tests/fixtures/geoip_databases.py"))
        .arg(dir.path())
        .output()
        .expect("run python (scripts/test.sh installs mmdb-writer)");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    dir
}

fn policy(dir: &Path) -> String {
    format!(
        r#"
[client_ip]
trusted_hops = 1

[geoip]
asn_db = "{asn}"
country_db = "{country}"

[upstreams.app]
url = "http://{{upstream}}"

[limits.per_asn]
key = "client_asn"
missing = "skip"
capacity = 2
rate = "1/h"
exempt_asns = ["AS4200000001"]

[limits.per_country]
key = "client_country"
missing = "skip"
capacity = 3
rate = "1/h"
exempt_countries = ["us"]

[[routes]]
name = "all"
path_prefix = "/"
upstream = "app"
limits = ["per_asn", "per_country"]
"#,
        asn = dir.join("asn.mmdb").display(),
        country = dir.join("country.mmdb").display(),
    )
}

/// The policy as a file of its own holds it: listeners on ephemeral ports, the upstream named.
fn policy_file(dir: &Path, upstream: std::net::SocketAddr) -> String {
    format!(
        "[server]\nlisten = [\"127.0.0.1:0\"]\n[admin]\nlisten = \"127.0.0.1:0\"\n{}",
        policy(dir).replace("{upstream}", &upstream.to_string())
    )
}

async fn from(client: &HttpClient, address: &str) -> u16 {
    client
        .get("/", &[("x-forwarded-for", address)])
        .await
        .status
        .as_u16()
}

#[tokio::test]
async fn addresses_of_one_network_owner_share_a_bucket() {
    let dir = databases();
    let upstream = start_upstream().await;
    let gateway = start_gateway(&policy(dir.path()), upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    // Two /24s of AS64500: a bot rotating between them meets one bucket of 2.
    assert_eq!(from(&client, "203.0.113.5").await, 200);
    assert_eq!(from(&client, "198.51.100.77").await, 200);
    assert_eq!(from(&client, "203.0.113.200").await, 429);
    // AS4200000001 is exempt from per_asn, and its country (US) from per_country.
    for _ in 0..5 {
        assert_eq!(from(&client, "192.0.2.9").await, 200);
        assert_eq!(from(&client, "2001:db8::1").await, 200);
    }
    // Unknown to both databases: the keys are missing, and these limits skip it.
    for _ in 0..5 {
        assert_eq!(from(&client, "10.1.2.3").await, 200);
    }
    let scrape = gateway.render_metrics();
    assert_eq!(
        metric(
            &scrape,
            r#"tollgate_limited_total{limit="per_asn",route="all"}"#
        ),
        1.0
    );
    assert_eq!(
        metric(
            &scrape,
            r#"tollgate_limited_total{limit="per_country",route="all"}"#
        ),
        0.0
    );
}

#[tokio::test]
async fn a_country_is_the_network_s_or_else_where_it_is_registered() {
    let dir = databases();
    let upstream = start_upstream().await;
    let policy = policy(dir.path()).replace("capacity = 2", "capacity = 100");
    let gateway = start_gateway(&policy, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    // 203.0.113.0/24 is in DE; 198.51.100.0/24 only registered in FR: separate buckets of 3.
    for _ in 0..3 {
        assert_eq!(from(&client, "203.0.113.1").await, 200);
        assert_eq!(from(&client, "198.51.100.1").await, 200);
    }
    assert_eq!(from(&client, "203.0.113.2").await, 429);
    assert_eq!(from(&client, "198.51.100.2").await, 429);
    // The admin API names the buckets by what a request is keyed by.
    let admin = HttpClient::new(gateway.admin_address);
    let germany = admin.get("/limits/per_country?key=de", &[]).await;
    assert_eq!(germany.status, 200, "{:?}", germany.body);
    assert!(germany.json()["tokens"].as_f64().unwrap() < 0.01);
    let asn = admin.get("/limits/per_asn?key=AS64500", &[]).await;
    assert_eq!(asn.status, 200);
    // Its 6 admitted requests were charged; the 2 refused were not.
    let tokens = asn.json()["tokens"].as_f64().unwrap();
    assert!((tokens - 94.0).abs() < 0.1, "{tokens}");
    let wrong = admin.get("/limits/per_asn?key=cloud", &[]).await;
    assert_eq!(wrong.status, 400);
    let reset = admin.send(
        "DELETE",
        "/limits/per_country?key=DE",
        &[],
        Default::default(),
    );
    assert_eq!(reset.await.status.as_u16(), 204);
    assert_eq!(from(&client, "203.0.113.3").await, 200);
}

#[tokio::test]
async fn a_broken_database_is_named_and_a_reload_with_it_changes_nothing() {
    let dir = databases();
    let upstream = start_upstream().await;
    let file = dir.path().join("tollgate.toml");
    let text = policy_file(dir.path(), upstream.address);
    std::fs::write(&file, &text).unwrap();
    let gateway = Tollgate::start(
        Policy::load(&file).unwrap(),
        Options {
            clock: None,
            config_path: Some(file.clone()),
        },
    )
    .await
    .unwrap();
    let client = HttpClient::new(gateway.addresses[0]);
    assert_eq!(from(&client, "203.0.113.5").await, 200);

    let asn_db = dir.path().join("asn.mmdb");
    let good = std::fs::read(&asn_db).unwrap();
    std::fs::write(&asn_db, b"<html>not a database</html>").unwrap();
    let error = gateway.reload_from_file().unwrap_err().to_string();
    assert!(error.contains("geoip.asn_db"), "{error}");
    assert!(error.contains("asn.mmdb"), "{error}");
    // The loaded databases still key requests: AS64500's second request, then its refusal.
    assert_eq!(from(&client, "198.51.100.5").await, 200);
    assert_eq!(from(&client, "198.51.100.6").await, 429);

    let check = |config: &Path| {
        Command::new(env!("CARGO_BIN_EXE_tollgate"))
            .args(["check", "--config", config.to_str().unwrap()])
            .output()
            .unwrap()
    };
    let refused = check(&file);
    assert_eq!(refused.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("asn.mmdb"), "{stderr}");
    std::fs::remove_file(&asn_db).unwrap();
    let missing = check(&file);
    assert_eq!(missing.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&missing.stderr).contains("asn.mmdb"));
    std::fs::write(&asn_db, good).unwrap();
    let accepted = check(&file);
    assert!(
        accepted.status.success(),
        "{}",
        String::from_utf8_lossy(&accepted.stderr)
    );
    gateway.reload_from_file().unwrap();

    // A key that needs a database the policy does not name is an error too.
    let without_country = text.replace(
        &format!(
            "country_db = \"{}\"\n",
            dir.path().join("country.mmdb").display()
        ),
        "",
    );
    std::fs::write(&file, without_country).unwrap();
    let error = check(&file);
    assert_eq!(error.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&error.stderr);
    assert!(stderr.contains("limits.per_country.key"), "{stderr}");
    assert!(
        stderr.contains("limits.per_country.exempt_countries"),
        "{stderr}"
    );
    assert!(stderr.contains("country_db"), "{stderr}");
}

#[tokio::test]
async fn the_access_log_carries_the_origin_and_replay_keys_by_it() {
    let dir = databases();
    let upstream = start_upstream().await;
    let file = dir.path().join("tollgate.toml");
    let text = policy_file(dir.path(), upstream.address);
    // The running policy has a limit per network only; the replayed one keys by country.
    let running = text.replace(
        "limits = [\"per_asn\", \"per_country\"]",
        "limits = [\"per_network\"]",
    )
        + "\n[limits.per_network]\nkey = \"client_network\"\ncapacity = 100\nrate = \"1/h\"\n";
    std::fs::write(&file, &running).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["--log-format", "json", "run", "--config"])
        .arg(&file)
        .env("RUST_LOG", "info")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (lines_tx, lines_rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        use std::io::BufRead;
        for line in std::io::BufReader::new(stderr)
            .lines()
            .map_while(Result::ok)
        {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut lines = Vec::new();
    let listening = loop {
        let line = lines_rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("a listening line");
        lines.push(line.clone());
        if line.contains("\"listening\"") && !line.contains("admin") {
            break line;
        }
    };
    let json: serde_json::Value = serde_json::from_str(&listening).unwrap();
    let address = json["fields"]["address"]
        .as_str()
        .or_else(|| json["address"].as_str())
        .unwrap_or_else(|| panic!("{listening}"))
        .parse()
        .unwrap();
    let client = HttpClient::new(address);
    for address in ["203.0.113.5", "203.0.113.6", "192.0.2.1", "10.0.0.1"] {
        assert_eq!(from(&client, address).await, 200);
    }
    for _ in 0..4 {
        assert_eq!(from(&client, "198.51.100.4").await, 200);
    }
    let access_lines = |lines: &[String]| {
        lines
            .iter()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|json| json["target"] == "tollgate::access")
            .count()
    };
    while access_lines(&lines) < 8 {
        let line = lines_rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("access lines");
        lines.push(line);
    }
    let _ = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let _ = child.wait();
    let access: Vec<serde_json::Value> = lines
        .iter()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|json| json["target"] == "tollgate::access")
        .collect();
    let field = |index: usize, name: &str| {
        let line = &access[index];
        line.get(name)
            .or_else(|| line["fields"].get(name))
            .and_then(|value| value.as_str())
            .unwrap_or_else(|| panic!("{name} in {line}"))
            .to_owned()
    };
    assert_eq!(
        (field(0, "asn"), field(0, "country")),
        ("AS64500".into(), "DE".into())
    );
    assert_eq!(
        (field(2, "asn"), field(2, "country")),
        ("AS4200000001".into(), "US".into())
    );
    assert_eq!(
        (field(3, "asn"), field(3, "country")),
        (String::new(), String::new())
    );
    assert_eq!(field(0, "ja4"), "", "no fingerprint on plain HTTP");

    let log = dir.path().join("access.log");
    std::fs::write(&log, lines.join("\n") + "\n").unwrap();
    std::fs::write(&file, text.replace("capacity = 2", "capacity = 5")).unwrap();
    let replay = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(["replay", "--json", "--config"])
        .arg(&file)
        .arg(&log)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&replay.stdout);
    assert!(
        replay.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&replay.stderr)
    );
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let replayed = |name: &str| {
        report["limits"]
            .as_array()
            .unwrap()
            .iter()
            .find(|entry| entry["limit"] == name)
            .unwrap_or_else(|| panic!("{name} in {report}"))
            .clone()
    };
    // AS64500 sent 6 against 5 tokens, the last of them also FR's (registered) 4th against
    // 3; AS4200000001 and US are exempt; 10.0.0.1 is unknown to the databases.
    for limit in ["per_asn", "per_country"] {
        assert_eq!(replayed(limit)["refusals"], 1, "{limit}: {report}");
        assert_eq!(replayed(limit)["not_replayable"], 1, "{limit}: {report}");
    }
}
