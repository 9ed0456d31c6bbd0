//! The admin listener's `/metrics`: every metric of the specification with its type and
//! labels, counters that add up, and output that `promtool check metrics` accepts.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::process::{Command, Stdio};

use common::*;

const POLICY: &str = r#"
[client_ip]
trusted_hops = 1

[upstreams.app]
url = "http://{upstream}"

[upstreams.dead]
url = "http://127.0.0.1:1"

[limits.per_network]
key = "client_network"
capacity = 10
rate = "1/h"

[limits.api_user]
key = { header = "x-user-id" }
missing = "reject"
capacity = 100
rate = "1/h"

[limits.shadowed]
key = "global"
capacity = 1
rate = "1/h"
mode = "shadow"

[[routes]]
name = "export"
path = "/export"
upstream = "app"
limits = [{ limit = "api_user", cost = 30 }, "per_network"]

[limits.bytes_sent]
key = "global"
capacity = 100000
rate = "100000/s"

[[routes]]
name = "download"
path = "/download"
upstream = "app"
limits = [{ limit = "bytes_sent", cost = 1, settle = "response_bytes" }]

[[routes]]
name = "broken"
path = "/broken"
upstream = "dead"
limits = ["per_network"]

[[routes]]
name = "default"
path_prefix = "/"
upstream = "app"
limits = ["per_network", "shadowed"]
"#;

/// One parsed exposition: metric family → type, and series → value.
struct Scrape {
    types: BTreeMap<String, String>,
    series: Vec<(String, BTreeMap<String, String>, f64)>,
}

fn parse(text: &str) -> Scrape {
    let mut types = BTreeMap::new();
    let mut series = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE line");
            types.insert(name.to_owned(), kind.to_owned());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (head, value) = line.rsplit_once(' ').expect("sample line");
        let (name, labels) = match head.split_once('{') {
            Some((name, labels)) => {
                let labels = labels.trim_end_matches('}');
                let parsed = labels
                    .split("\",")
                    .filter(|pair| !pair.is_empty())
                    .map(|pair| {
                        let (key, value) = pair.split_once('=').expect("label");
                        (key.to_owned(), value.trim_matches('"').to_owned())
                    })
                    .collect();
                (name.to_owned(), parsed)
            }
            None => (head.to_owned(), BTreeMap::new()),
        };
        series.push((name, labels, value.parse().expect("numeric value")));
    }
    Scrape { types, series }
}

impl Scrape {
    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.series
            .iter()
            .find(|(series, have, _)| {
                series == name
                    && labels
                        .iter()
                        .all(|(k, v)| have.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|(_, _, value)| *value)
            .unwrap_or_else(|| panic!("no {name} {labels:?}"))
    }

    fn label_names(&self, name: &str) -> BTreeSet<String> {
        self.series
            .iter()
            .filter(|(series, _, _)| series == name)
            .flat_map(|(_, labels, _)| labels.keys().cloned())
            .collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_of_the_specification_with_counters_that_add_up() {
    let upstream = start_upstream().await;
    let gateway = start_gateway(POLICY, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let user = ("x-user-id", "7");
    // Exports cost 30 of the user's 100 tokens: three pass, the fourth is refused.
    for _ in 0..4 {
        client
            .get("/export", &[user, ("x-forwarded-for", "192.0.2.1")])
            .await;
    }
    client
        .get("/export", &[("x-forwarded-for", "192.0.2.1")])
        .await; // missing key: 400
    client
        .get("/broken", &[("x-forwarded-for", "192.0.2.2")])
        .await; // 502
    for _ in 0..3 {
        client
            .get("/page", &[("x-forwarded-for", "192.0.2.3")])
            .await; // shadow limit trips twice
    }
    let download = client.get("/download", &[]).await;
    let admin = HttpClient::new(gateway.admin_address);
    // The client has the download's last byte a moment before the gateway drops the body
    // that sent it (and with it the request's in-flight count and the settlement's line):
    // scraped until that moment has passed, for at most 10 s.
    let mut text = String::new();
    for _ in 0..200 {
        text = String::from_utf8(admin.get("/metrics", &[]).await.body.to_vec()).unwrap();
        if parse(&text).value("tollgate_inflight_requests", &[]) == 0.0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let scrape = parse(&text);

    let expected = [
        (
            "tollgate_settled_cost_total",
            "counter",
            &["direction", "limit", "route"][..],
        ),
        (
            "tollgate_settle_missing_total",
            "counter",
            &["limit", "route"],
        ),
        (
            "tollgate_requests_total",
            "counter",
            &["outcome", "route"][..],
        ),
        ("tollgate_limited_total", "counter", &["limit", "route"]),
        (
            "tollgate_tokens_consumed_total",
            "counter",
            &["limit", "route"],
        ),
        ("tollgate_bucket_fill_ratio", "histogram", &["le", "limit"]),
        (
            "tollgate_store_duration_seconds",
            "histogram",
            &["backend", "le"],
        ),
        ("tollgate_store_errors_total", "counter", &["backend"]),
        (
            "tollgate_degraded_decisions_total",
            "counter",
            &["policy", "route"],
        ),
        (
            "tollgate_upstream_duration_seconds",
            "histogram",
            &["le", "route"],
        ),
        (
            "tollgate_upstream_responses_total",
            "counter",
            &["route", "status"],
        ),
        ("tollgate_inflight_requests", "gauge", &[]),
        ("tollgate_config_reloads_total", "counter", &["result"]),
    ];
    for (name, kind, labels) in expected {
        assert_eq!(
            scrape.types.get(name).map(String::as_str),
            Some(kind),
            "{name}"
        );
        let series_name = if kind == "histogram" {
            format!("{name}_bucket")
        } else {
            name.to_owned()
        };
        let want: BTreeSet<String> = labels.iter().map(|l| l.to_string()).collect();
        assert_eq!(scrape.label_names(&series_name), want, "{name} labels");
    }

    // Counter arithmetic.
    assert_eq!(
        scrape.value(
            "tollgate_settled_cost_total",
            &[("route", "download"), ("direction", "charge")]
        ),
        download.body.len() as f64 - 1.0,
        "the bytes sent, less the reservation"
    );
    let export = [("route", "export")];
    assert_eq!(
        scrape.value(
            "tollgate_requests_total",
            &[("route", "export"), ("outcome", "allowed")]
        ),
        3.0
    );
    assert_eq!(
        scrape.value(
            "tollgate_requests_total",
            &[("route", "export"), ("outcome", "limited")]
        ),
        1.0
    );
    assert_eq!(
        scrape.value(
            "tollgate_requests_total",
            &[("route", "export"), ("outcome", "bad_request")]
        ),
        1.0
    );
    assert_eq!(
        scrape.value(
            "tollgate_tokens_consumed_total",
            &[export[0], ("limit", "api_user")]
        ),
        90.0,
        "3 × cost 30"
    );
    assert_eq!(
        scrape.value(
            "tollgate_tokens_consumed_total",
            &[export[0], ("limit", "per_network")]
        ),
        3.0
    );
    assert_eq!(
        scrape.value(
            "tollgate_limited_total",
            &[export[0], ("limit", "api_user")]
        ),
        1.0
    );
    assert_eq!(
        scrape.value("tollgate_bucket_fill_ratio_count", &[("limit", "api_user")]),
        4.0,
        "refusals observed too"
    );
    assert_eq!(
        scrape.value(
            "tollgate_bucket_fill_ratio_count",
            &[("limit", "per_network")]
        ),
        4.0 + 1.0 + 3.0
    );
    assert_eq!(
        scrape.value(
            "tollgate_requests_total",
            &[("route", "default"), ("outcome", "shadow_limited")]
        ),
        2.0
    );
    assert_eq!(
        scrape.value(
            "tollgate_tokens_consumed_total",
            &[("route", "default"), ("limit", "shadowed")]
        ),
        1.0
    );
    assert_eq!(
        scrape.value(
            "tollgate_upstream_responses_total",
            &[export[0], ("status", "2xx")]
        ),
        3.0
    );
    assert_eq!(
        scrape.value(
            "tollgate_upstream_responses_total",
            &[("route", "broken"), ("status", "error")]
        ),
        1.0
    );
    assert_eq!(
        scrape.value("tollgate_upstream_duration_seconds_count", &export),
        3.0
    );
    // The memory store's decisions (exports, the broken route, pages, the download: 9) are
    // timed one in 64 per thread, the first of each: each of the two worker threads that
    // decided timed one.
    let timed = scrape.value(
        "tollgate_store_duration_seconds_count",
        &[("backend", "memory")],
    );
    assert!((1.0..=2.0).contains(&timed), "{timed} timed decisions");
    assert_eq!(scrape.value("tollgate_inflight_requests", &[]), 0.0);
    // Labels come from configuration only: no address, key or path appears anywhere.
    for forbidden in ["192.0.2", "/page", "/export\""] {
        assert!(!text.contains(forbidden), "{forbidden} leaked into a label");
    }

    // promtool agrees with the format.
    let mut promtool = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool on PATH (Debian package prometheus; CI installs it)");
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let output = promtool.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "promtool check metrics: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Clients that leave after their request was admitted and forwarded, before the response
/// head: each admitted request is still counted once in `tollgate_requests_total`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admitted_requests_whose_clients_leave_are_counted_once() {
    const POLICY: &str = r#"
[upstreams.app]
url = "http://{upstream}"
timeout = "30s"

[limits.everyone]
key = "global"
capacity = 1000
rate = "1/h"

[[routes]]
name = "slow"
path = "/slow"
upstream = "app"
limits = ["everyone"]
"#;
    const LEAVING: usize = 20;
    let upstream = start_upstream().await;
    let gateway = start_gateway(POLICY, upstream.address).await;
    let client = std::sync::Arc::new(HttpClient::h2c(gateway.addresses[0]));
    let requests: Vec<_> = (0..LEAVING)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.get("/slow", &[]).await })
        })
        .collect();
    eventually("every request reached the upstream", || {
        upstream.hits.load(std::sync::atomic::Ordering::SeqCst) == LEAVING
    })
    .await;
    for request in requests {
        request.abort();
    }
    drop(client);
    let allowed = r#"tollgate_requests_total{outcome="allowed",route="slow"}"#;
    eventually("each admitted request counted", || {
        metric(&gateway.render_metrics(), allowed) == LEAVING as f64
    })
    .await;
    // Nothing more is counted later, when the upstream would have answered.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(metric(&gateway.render_metrics(), allowed), LEAVING as f64);
}
