//! Token leases (`lease` on a limit) through real `redis-server`s: three replicas hammering a
//! leased global limit never admit more than the bucket allows and, saturating it, admit at
//! least 98 % of it with at most about one store call per lease; a SIGKILLed replica loses at
//! most its lease; a request another limit refuses gives its leased token back.
#![allow(clippy::disallowed_methods)] // tests measure real time

mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::redis_server::{RedisCluster, RedisServer};
use common::*;

/// A global limit of 100 a second, leased 50 ms (5 tokens) at a time, capacity 40.
fn policy(url: &str) -> String {
    format!(
        r#"
[store]
backend = "redis"
url = "{url}"
timeout = "2s"
hash_key = "test-secret-0123456789"

[upstreams.app]
url = "http://{{upstream}}"

[limits.everyone]
key = "global"
capacity = 40
rate = "100/s"
lease = "50ms"

[limits.per_user]
key = {{ header = "x-user" }}
capacity = 1
rate = "1/h"

[[routes]]
name = "users"
path_prefix = "/users"
upstream = "app"
limits = ["everyone", "per_user"]

[[routes]]
name = "all"
path_prefix = "/"
upstream = "app"
limits = ["everyone"]
"#
    )
}

const CAPACITY: f64 = 40.0;
const RATE: f64 = 100.0;
const LEASE: f64 = 0.05;

/// Requests from `workers` clients per gateway until `duration` has passed: (admitted, sent,
/// seconds from the first request to the last answer).
async fn saturate(
    gateways: &[tollgate::Tollgate],
    workers: usize,
    duration: Duration,
) -> (usize, usize, f64) {
    let (admitted, sent) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let stop = Arc::new(AtomicBool::new(false));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for gateway in gateways {
        for _ in 0..workers {
            let client = HttpClient::new(gateway.addresses[0]);
            let (admitted, sent, stop) = (admitted.clone(), sent.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let status = client.get("/", &[]).await.status;
                    assert!(status == 200 || status == 429, "unexpected {status}");
                    sent.fetch_add(1, Ordering::Relaxed);
                    if status == 200 {
                        admitted.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }));
        }
    }
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.expect("client");
    }
    let elapsed = started.elapsed().as_secs_f64();
    (
        admitted.load(Ordering::Relaxed),
        sent.load(Ordering::Relaxed),
        elapsed,
    )
}

/// The saturating tests run one at a time: two of them at once on two cores starve each
/// other's replicas, and a bucket no replica drains for 0.4 s overflows (tokens lost to the
/// test's count, not to a client).
static SATURATING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn three_replicas_saturating_a_leased_limit(url: &str) {
    let _alone = SATURATING.lock().await;
    let upstream = start_upstream().await;
    let text = policy(url);
    let mut gateways = Vec::new();
    for _ in 0..3 {
        gateways.push(start_gateway(&text, upstream.address).await);
    }
    // Six seconds: what is left at the end, in Redis and in the replicas' unspent leases (up
    // to a lease each, 15 tokens), must stay well within the 2 % (13 of 640).
    let (admitted, sent, elapsed) = saturate(&gateways, 4, Duration::from_secs(6)).await;
    let allowed = CAPACITY + RATE * elapsed;
    let accuracy = admitted as f64 / allowed;
    eprintln!("leases: {admitted} admitted of {sent} sent in {elapsed:.2} s, {allowed:.0} allowed: accuracy {accuracy:.3}");
    assert!(
        admitted as f64 <= allowed,
        "over-admitted: {admitted} > {allowed}"
    );
    assert!(
        sent as f64 >= 2.0 * allowed,
        "the load did not saturate the limit ({sent} sent)"
    );
    assert!(accuracy >= 0.98, "accuracy {accuracy:.3}");
    // Calls per replica: one per lease, and one per lease's worth of the burst capacity
    // (while the bucket holds more than a lease, a spent lease may call again at once).
    let most = elapsed / LEASE + 1.0 + CAPACITY / (RATE * LEASE);
    for gateway in &gateways {
        let calls = metric(
            &gateway.render_metrics(),
            r#"tollgate_store_calls_total{backend="redis"}"#,
        );
        eprintln!("leases: {calls} store calls by a replica, {most:.0} at most");
        assert!(
            calls <= most,
            "{calls} store calls, at most {most:.0} expected"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_on_one_redis_admit_what_a_leased_limit_allows() {
    let redis = RedisServer::start();
    three_replicas_saturating_a_leased_limit(&redis.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_on_a_cluster_admit_what_a_leased_limit_allows() {
    let cluster = RedisCluster::start();
    three_replicas_saturating_a_leased_limit(&cluster.url()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_another_limit_refuses_gives_its_leased_token_back() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    // A slow refill (2 a second, 10 s leases: 20 tokens, capacity 80), so that what the test
    // counts is the capacity, not the refill.
    let text = policy(&redis.url()).replace(
        "capacity = 40\nrate = \"100/s\"\nlease = \"50ms\"",
        "capacity = 80\nrate = \"2/s\"\nlease = \"1s\"",
    );
    let gateway = start_gateway(&text, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let started = Instant::now();
    // Ann's first request passes; her next 40 are refused by her own limit, after their
    // global token was spent from the lease: each goes back.
    assert_eq!(client.get("/users", &[("x-user", "ann")]).await.status, 200);
    for _ in 0..40 {
        assert_eq!(client.get("/users", &[("x-user", "ann")]).await.status, 429);
    }
    let mut admitted = 0;
    for user in 0..90 {
        let user = format!("user{user}");
        admitted += usize::from(client.get("/users", &[("x-user", &user)]).await.status == 200);
    }
    let refill = 2.0 * started.elapsed().as_secs_f64();
    assert!(
        admitted as f64 >= 79.0 - 20.0,
        "{admitted} admitted: refused requests kept global tokens"
    );
    assert!(
        admitted as f64 <= 79.0 + refill,
        "{admitted} admitted, over the bucket"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_replica_loses_at_most_its_lease() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    // 10 tokens a second, 1 s leases (10 tokens), capacity 40.
    let text = policy(&redis.url())
        .replace(
            "rate = \"100/s\"\nlease = \"50ms\"",
            "rate = \"10/s\"\nlease = \"1s\"",
        )
        .replace("{upstream}", &upstream.address.to_string());
    let mut killed = Replica::start(&text).await;
    let first = killed.address;
    let started = Instant::now();
    // One request takes a lease of 10 and spends 1; then the replica dies holding 9.
    assert_eq!(HttpClient::new(first).get("/", &[]).await.status, 200);
    killed.kill();
    let survivor = start_gateway(&text, upstream.address).await;
    let client = HttpClient::new(survivor.addresses[0]);
    let mut admitted = 0;
    for _ in 0..60 {
        admitted += usize::from(client.get("/", &[]).await.status == 200);
    }
    let refill = 10.0 * started.elapsed().as_secs_f64();
    // 40 less the dead replica's 10 (one spent, nine lost with it), plus what refilled.
    assert!(
        admitted >= 30,
        "{admitted} admitted: more than one lease was lost"
    );
    assert!(
        admitted as f64 <= 30.0 + refill + 1.0,
        "{admitted} admitted, over the bucket"
    );
}
