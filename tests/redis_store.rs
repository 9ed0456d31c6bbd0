//! The Redis store against real `redis-server` processes started by the tests: exactness
//! across replicas, atomicity, TTLs, no clear keys, the deny cache, faults and a Cluster.
#![allow(clippy::disallowed_methods)] // tests measure real time

mod common;

use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::redis_server::{RedisCluster, RedisServer};
use common::tokens;
use common::*;
use tollgate::limit::Clock;
use tollgate::Tollgate;

fn policy(store_url: &str, capacity: u32, rate: &str) -> String {
    format!(
        r#"
[client_ip]
trusted_hops = 1

[store]
backend = "redis"
url = "{store_url}"
timeout = "2s"
prefix = "tg:"
hash_key = "test-secret-0123456789"

[upstreams.app]
url = "http://{{upstream}}"

[limits.everyone]
key = "global"
capacity = {capacity}
rate = "{rate}"

[limits.per_network]
key = "client_network"
capacity = {capacity}
rate = "{rate}"

[limits.per_account]
key = {{ json_field = "email" }}
capacity = {capacity}
rate = "{rate}"

[limits.per_user]
key = {{ header = "x-user-id" }}
capacity = {capacity}
rate = "{rate}"

[[routes]]
name = "global"
path = "/global"
upstream = "app"
limits = ["everyone"]
on_store_failure = "deny"

[[routes]]
name = "network"
path = "/network"
upstream = "app"
limits = ["per_network"]
on_store_failure = "deny"

[[routes]]
name = "login"
path = "/login"
upstream = "app"
limits = ["per_account", "per_user"]
on_store_failure = "deny"
"#
    )
}

/// Sends `total` requests spread round-robin over `gateways`, `concurrency` at a time;
/// returns how many were admitted (200).
async fn hammer(
    gateways: &[Arc<Tollgate>],
    path: &str,
    headers: Vec<(String, String)>,
    total: usize,
    concurrency: usize,
) -> usize {
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let next = next.clone();
        let gateways: Vec<_> = gateways
            .iter()
            .map(|gateway| gateway.addresses[0])
            .collect();
        let clients: Vec<HttpClient> = gateways
            .iter()
            .map(|address| HttpClient::new(*address))
            .collect();
        let path = path.to_owned();
        let headers = headers.clone();
        tasks.push(tokio::spawn(async move {
            let mut admitted = 0;
            loop {
                let index = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if index >= total {
                    return admitted;
                }
                let header_refs: Vec<(&str, &str)> = headers
                    .iter()
                    .map(|(n, v)| (n.as_str(), v.as_str()))
                    .collect();
                let reply = clients[index % clients.len()]
                    .get(&path, &header_refs)
                    .await;
                assert!(
                    reply.status == 200 || reply.status == 429,
                    "unexpected {}: {:?}",
                    reply.status,
                    reply.body
                );
                if reply.status == 200 {
                    admitted += 1;
                }
            }
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.expect("client task");
    }
    admitted
}

async fn replicas(
    policy: &str,
    upstream: std::net::SocketAddr,
    count: usize,
) -> Vec<Arc<Tollgate>> {
    let mut gateways = Vec::new();
    for _ in 0..count {
        gateways.push(Arc::new(start_gateway(policy, upstream).await));
    }
    gateways
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_replicas_sharing_redis_admit_exactly_the_capacity() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let gateways = replicas(&policy(&redis.url(), 50, "1/h"), upstream.address, 3).await;
    let admitted = hammer(&gateways, "/global", vec![], 300, 24).await;
    assert_eq!(admitted, 50, "one global bucket, whatever replica answers");
    // Per network: five networks, each hammered through all three replicas.
    for network in 1..=5 {
        let from = vec![(
            "x-forwarded-for".to_owned(),
            format!("198.51.100.{network}"),
        )];
        assert_eq!(hammer(&gateways, "/network", from, 90, 9).await, 50);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_memory_backend_multiplies_the_limit_by_the_replicas() {
    // Why the Redis store exists: three replicas with their own memory admit three times
    // the configured capacity.
    let upstream = start_upstream().await;
    let memory_policy = policy("redis://127.0.0.1:1", 50, "1/h")
        .replace("backend = \"redis\"", "backend = \"memory\"");
    let gateways = replicas(&memory_policy, upstream.address, 3).await;
    let admitted = hammer(&gateways, "/global", vec![], 300, 24).await;
    assert_eq!(admitted, 150);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admitted_stays_within_capacity_plus_refill_while_time_passes() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let (capacity, rate) = (20.0, 40.0);
    let gateways = replicas(&policy(&redis.url(), 20, "40/s"), upstream.address, 3).await;
    let started = Instant::now();
    let deadline = started + Duration::from_millis(1500);
    let mut tasks = Vec::new();
    for task in 0..12 {
        let address = gateways[task % 3].addresses[0];
        tasks.push(tokio::spawn(async move {
            let client = HttpClient::new(address);
            let mut admitted = 0u32;
            while Instant::now() < deadline {
                if client.get("/global", &[]).await.status == 200 {
                    admitted += 1;
                }
            }
            admitted
        }));
    }
    let mut admitted = 0;
    for task in tasks {
        admitted += task.await.unwrap();
    }
    let elapsed = started.elapsed().as_secs_f64();
    let allowed = capacity + rate * elapsed;
    println!(
        "admitted {admitted} of at most {allowed:.1} allowed in {elapsed:.3}s: ratio {:.3}",
        f64::from(admitted) / allowed
    );
    assert!(
        f64::from(admitted) <= allowed + 1.0,
        "{admitted} > {allowed}"
    );
    assert!(
        f64::from(admitted) >= capacity,
        "at least the burst is admitted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_on_one_bucket_never_over_admit() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let gateways = replicas(&policy(&redis.url(), 100, "1/h"), upstream.address, 1).await;
    assert_eq!(hammer(&gateways, "/global", vec![], 400, 64).await, 100);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_expire_and_carry_no_clear_values() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let gateway = start_gateway(&policy(&redis.url(), 5, "1/min"), upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    for _ in 0..2 {
        let reply = client
            .post(
                "/login",
                &[
                    ("content-type", "application/json"),
                    ("x-user-id", "user-secret-4242"),
                ],
                r#"{"email":"alice@example.com"}"#,
            )
            .await;
        assert_eq!(reply.status, 200);
        client
            .get("/network", &[("x-forwarded-for", "203.0.113.9")])
            .await;
        client.get("/global", &[]).await;
    }
    let keys: Vec<String> = redis
        .cli(&["--scan", "--pattern", "*"])
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(keys.len(), 4, "{keys:?}");
    for key in &keys {
        assert!(key.starts_with("tg:"), "{key}");
        assert!(
            !key.contains("alice") && !key.contains("example.com") && !key.contains("4242"),
            "clear value in {key}"
        );
        let ttl: i64 = redis.cli(&["PTTL", key]).trim().parse().unwrap();
        // Two tokens spent at 1/min: full again in about 120 s (+1 s margin).
        assert!(ttl > 100_000 && ttl <= 121_000, "{key}: PTTL {ttl}");
        let stored = redis.stored_bucket(key).expect("a bucket");
        assert_eq!(stored.len(), 2, "tokens and time only: {key}");
        assert!(
            (3.0..3.1).contains(&stored[0]),
            "two of five tokens spent: {key}: {stored:?}"
        );
    }
    assert!(keys.contains(&"tg:everyone:global".to_owned()));
    assert!(keys.contains(&"tg:per_network:v4:203.0.113.9/32".to_owned()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_deny_cache_spares_redis_while_a_bucket_is_empty() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let gateway = start_gateway(&policy(&redis.url(), 3, "1/h"), upstream.address).await;
    eventually("the replica hears resets", || {
        gateway.redis_store().unwrap().hears_resets()
    })
    .await;
    let client = HttpClient::new(gateway.addresses[0]);
    for _ in 0..3 {
        assert_eq!(client.get("/global", &[]).await.status, 200);
    }
    let refused = client.get("/global", &[]).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.header("retry-after"), Some("3600"));
    let calls_before = redis.calls("evalsha");
    for _ in 0..50 {
        let reply = client.get("/global", &[]).await;
        assert_eq!(reply.status, 429);
        assert_eq!(reply.header("retry-after"), Some("3600"));
    }
    assert_eq!(
        redis.calls("evalsha"),
        calls_before,
        "no Redis call for a bucket known to be empty"
    );
    assert_eq!(gateway.redis_store().unwrap().deny_cache_refusals(), 50);
    assert_metrics(
        &gateway.render_metrics(),
        &[(
            r#"tollgate_limited_total{limit="everyone",route="global"}"#,
            51.0,
        )],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_script_call_per_request() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let gateway = start_gateway(&policy(&redis.url(), 1000, "1/h"), upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    client.get("/global", &[]).await; // loads the script
    let before = redis.calls("evalsha") + redis.calls("eval");
    for _ in 0..40 {
        let reply = client
            .post(
                "/login",
                &[("content-type", "application/json"), ("x-user-id", "7")],
                r#"{"email":"bob@example.com"}"#,
            )
            .await;
        assert_eq!(reply.status, 200);
    }
    let after = redis.calls("evalsha") + redis.calls("eval");
    assert_eq!(after - before, 40, "two buckets, one call per request");
    // One after another, no request waits for another's call: 41 calls of one request each.
    assert_metrics(
        &gateway.render_metrics(),
        &[
            (
                r#"tollgate_store_batch_requests_count{backend="redis"}"#,
                41.0,
            ),
            (
                r#"tollgate_store_batch_requests_sum{backend="redis"}"#,
                41.0,
            ),
        ],
    );
}

const FAULTS: &str = r#"
[store]
backend = "redis"
url = "REDIS"
timeout = "200ms"
hash_key = "test-secret-0123456789"

[upstreams.app]
url = "http://{upstream}"

[limits.tight]
key = "global"
capacity = 2
rate = "1/h"

[limits.open]
key = "global"
capacity = 1000
rate = "1/h"

[[routes]]
name = "allow"
path = "/allow"
upstream = "app"
limits = ["open"]
on_store_failure = "allow"

[[routes]]
name = "deny"
path = "/deny"
upstream = "app"
limits = ["open"]
on_store_failure = "deny"

[[routes]]
name = "local"
path = "/local"
upstream = "app"
limits = ["tight"]
on_store_failure = "local"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_follows_each_routes_failure_policy_and_recovers() {
    let mut redis = RedisServer::start();
    let upstream = start_upstream().await;
    let gateway = start_gateway(&FAULTS.replace("REDIS", &redis.url()), upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let admin = HttpClient::new(gateway.admin_address);
    assert_eq!(client.get("/deny", &[]).await.status, 200);
    assert_eq!(admin.get("/readyz", &[]).await.status, 200);

    redis.stop();
    let mut slowest = Duration::ZERO;
    let mut timed = |started: Instant| slowest = slowest.max(started.elapsed());
    for _ in 0..10 {
        let started = Instant::now();
        let reply = client.get("/allow", &[]).await;
        timed(started);
        assert_eq!(reply.status, 200, "fail-open admits");
        let started = Instant::now();
        let reply = client.get("/deny", &[]).await;
        timed(started);
        assert_eq!(reply.status, 503, "fail-closed refuses");
        assert_eq!(reply.header("retry-after"), Some("1"));
        assert_eq!(reply.json()["error"], "store_unavailable");
    }
    // Local buckets of the same limit decide while Redis is away.
    let local: Vec<u16> = [
        client.get("/local", &[]).await.status.as_u16(),
        client.get("/local", &[]).await.status.as_u16(),
        client.get("/local", &[]).await.status.as_u16(),
    ]
    .to_vec();
    assert_eq!(local, [200, 200, 429]);
    assert!(
        slowest < Duration::from_secs(3),
        "no request hangs: slowest took {slowest:?}"
    );
    let store = gateway.redis_store().unwrap();
    assert!(
        store.is_circuit_open(),
        "repeated failures open the circuit"
    );
    let scrape = gateway.render_metrics();
    let errors = metric(&scrape, r#"tollgate_store_errors_total{backend="redis"}"#);
    let degraded = metric(
        &scrape,
        r#"tollgate_degraded_decisions_total{policy="allow",route="allow"}"#,
    ) + metric(
        &scrape,
        r#"tollgate_degraded_decisions_total{policy="deny",route="deny"}"#,
    ) + metric(
        &scrape,
        r#"tollgate_degraded_decisions_total{policy="local",route="local"}"#,
    );
    assert_eq!(degraded, 23.0);
    assert!(
        errors >= 3.0 && errors < degraded,
        "the open circuit spares calls: {errors} errors for {degraded} degraded decisions"
    );
    assert_metrics(
        &scrape,
        &[
            (
                r#"tollgate_requests_total{outcome="degraded_allowed",route="allow"}"#,
                10.0,
            ),
            (
                r#"tollgate_requests_total{outcome="store_unavailable",route="deny"}"#,
                10.0,
            ),
        ],
    );
    assert_eq!(admin.get("/readyz", &[]).await.status, 503);

    // Back, and empty: shared decisions resume without a restart; buckets start full.
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if client.get("/deny", &[]).await.status == 200 {
            break;
        }
        assert!(Instant::now() < deadline, "shared decisions did not resume");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    assert_eq!(admin.get("/readyz", &[]).await.status, 200);
    assert_eq!(
        client.get("/local", &[]).await.status,
        200,
        "Redis restarted empty: full bucket"
    );
    assert_eq!(client.get("/local", &[]).await.status, 200);
    assert_eq!(client.get("/local", &[]).await.status, 429);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_that_stops_answering_fails_every_waiting_request_within_the_timeout() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let gateway = start_gateway(&FAULTS.replace("REDIS", &redis.url()), upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    assert_eq!(client.get("/deny", &[]).await.status, 200);

    // Connected, but silent: Redis holds every command for 20 s. Requests sent together queue
    // behind the first call; each must still fail within the store's timeout (200 ms).
    redis.cli(&["CLIENT", "PAUSE", "20000", "ALL"]);
    let started = Instant::now();
    let paths = ["/deny", "/allow"].repeat(6);
    let replies =
        futures_util::future::join_all(paths.iter().map(|path| client.get(path, &[]))).await;
    let elapsed = started.elapsed();
    for (path, reply) in paths.iter().zip(&replies) {
        let expected = if *path == "/deny" { 503 } else { 200 };
        assert_eq!(reply.status, expected, "{path}");
    }
    assert!(
        elapsed < Duration::from_secs(10),
        "the waits end with the timeout, not with Redis: {elapsed:?}"
    );
}

const PROBE: &str = r#"
[store]
backend = "redis"
url = "REDIS"
timeout = "2s"
hash_key = "test-secret-0123456789"

[upstreams.app]
url = "http://{upstream}"

[limits.three]
key = "global"
capacity = 3
rate = "1/h"

[limits.open]
key = "global"
capacity = 1000
rate = "1/h"

[[routes]]
name = "allow"
path = "/allow"
upstream = "app"
limits = ["three"]
on_store_failure = "allow"

[[routes]]
name = "deny"
path = "/deny"
upstream = "app"
limits = ["open"]
on_store_failure = "deny"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_whose_client_goes_away_does_not_leave_the_circuit_open() {
    use tokio::io::AsyncWriteExt;
    use tollgate::limit::breaker::CircuitState;

    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let gateway = start_gateway(&PROBE.replace("REDIS", &redis.url()), upstream.address).await;
    let gateway_address = gateway.addresses[0];
    let client = HttpClient::new(gateway_address);
    assert_eq!(client.get("/deny", &[]).await.status, 200, "connected");
    let store = gateway.redis_store().unwrap();

    // Connected but silent: each call waits out the 2 s timeout, and three failures open the
    // circuit.
    redis.freeze();
    while store.circuit_state() == CircuitState::Closed {
        let replies =
            futures_util::future::join_all((0..3).map(|_| client.get("/deny", &[]))).await;
        assert!(replies.iter().all(|reply| reply.status == 503));
    }
    // After the backoff the next request carries the probe; its client gives up and closes
    // the connection while the probe waits on the frozen Redis.
    let mut probing = None;
    eventually("a request carries the probe", || {
        if store.circuit_state() == CircuitState::Probing {
            return true;
        }
        if probing.is_none() && store.circuit_state() == CircuitState::Open {
            probing = Some(tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(300)).await;
                let mut stream = tokio::net::TcpStream::connect(gateway_address)
                    .await
                    .expect("connect");
                stream
                    .write_all(b"GET /allow HTTP/1.1\r\nHost: app\r\n\r\n")
                    .await
                    .expect("write");
                stream
            }));
        }
        false
    })
    .await;
    drop(probing.take().unwrap().await.expect("probing client"));
    eventually("the abandoned probe leaves the probing state", || {
        store.circuit_state() != CircuitState::Probing
    })
    .await;

    // Redis answers again: the next request probes, the circuit closes, and the limit holds.
    redis.thaw();
    let mut admitted = 0;
    for _ in 0..10 {
        if client.get("/allow", &[]).await.status == 200 {
            admitted += 1;
        }
    }
    assert!(
        admitted <= 3,
        "{admitted} of 10 admitted through a limit of 3: the limiter was off"
    );
    assert_eq!(store.circuit_state(), CircuitState::Closed);
    assert_eq!(client.get("/deny", &[]).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decisions_go_back_to_redis_as_it_answers_not_after_the_backoff() {
    use tollgate::limit::breaker::CircuitState;
    use tollgate::limit::Clock;

    let mut redis = RedisServer::start();
    let upstream = start_upstream().await;
    // The breaker reads this clock: its backoff only passes when the test says so.
    let clock = Clock::manual();
    let gateway = start_gateway_with_clock(
        &FAULTS.replace("REDIS", &redis.url()),
        upstream.address,
        Some(clock.clone()),
    )
    .await;
    let client = HttpClient::new(gateway.addresses[0]);
    assert_eq!(client.get("/deny", &[]).await.status, 200);

    // Down for long enough that failed probes stretch the backoff to its longest (5 s).
    redis.stop();
    for _ in 0..8 {
        assert_eq!(client.get("/deny", &[]).await.status, 503);
        clock.advance(Duration::from_secs(6));
    }
    assert_eq!(client.get("/deny", &[]).await.status, 503);
    let store = gateway.redis_store().unwrap();
    assert_ne!(store.circuit_state(), CircuitState::Closed);

    // Back: its backoff never ends on this clock, yet decisions go to Redis once it answers.
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    while client.get("/deny", &[]).await.status != 200 {
        assert!(
            Instant::now() < deadline,
            "decisions waited for the backoff instead of Redis"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(store.circuit_state(), CircuitState::Closed);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_starts_while_redis_is_down() {
    let mut redis = RedisServer::start();
    let url = redis.url();
    redis.stop();
    let upstream = start_upstream().await;
    let gateway = start_gateway(&FAULTS.replace("REDIS", &url), upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let admin = HttpClient::new(gateway.admin_address);
    assert_eq!(admin.get("/readyz", &[]).await.status, 503);
    assert_eq!(client.get("/allow", &[]).await.status, 200);
    assert_eq!(client.get("/deny", &[]).await.status, 503);
    redis.restart();
    let deadline = Instant::now() + Duration::from_secs(30);
    while admin.get("/readyz", &[]).await.status != 200 {
        assert!(Instant::now() < deadline, "never became ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Names of two `global` limits whose keys (prefix `tg:`) live in different Cluster slots.
fn names_in_two_slots() -> (&'static str, &'static str) {
    let slot = |name: &str| tollgate::limit::redis::slot(format!("tg:{name}:global").as_bytes());
    let names = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"];
    let first = names[0];
    let second = names
        .iter()
        .copied()
        .find(|name| slot(name) != slot(first))
        .expect("two slots among six names");
    (first, second)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_of_three_masters_is_exact_and_refunds_across_slots() {
    let cluster = RedisCluster::start();
    let upstream = start_upstream().await;
    let (first, second) = names_in_two_slots();
    let text = policy(&cluster.url(), 50, "1/h")
        + &format!(
            r#"
[limits.{first}]
key = "global"
capacity = 10
rate = "1/h"

[limits.{second}]
key = "global"
capacity = 3
rate = "1/h"

[[routes]]
name = "both"
path = "/both"
upstream = "app"
limits = ["{first}", "{second}"]

[[routes]]
name = "first"
path = "/first"
upstream = "app"
limits = ["{first}"]
"#
        );
    let gateways = replicas(&text, upstream.address, 3).await;
    assert_eq!(
        hammer(&gateways, "/global", vec![], 300, 24).await,
        50,
        "exact on a cluster too"
    );

    // Three requests use up the second limit (and three of the first's ten tokens).
    assert_eq!(hammer(&gateways, "/both", vec![], 3, 1).await, 3);
    // Refused by the second limit: these must not charge the first one.
    assert_eq!(hammer(&gateways, "/both", vec![], 30, 6).await, 0);
    assert_eq!(
        hammer(&gateways, "/first", vec![], 20, 4).await,
        7,
        "no token leaked from the first limit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_users_passwords_and_database_numbers_come_from_the_url() {
    let redis = RedisServer::start_with(&["--requirepass", "admin-pass"]);
    let created = Command::new("redis-cli")
        .args([
            "-p",
            &redis.port.to_string(),
            "-a",
            "admin-pass",
            "--no-auth-warning",
        ])
        .args([
            "ACL",
            "SETUSER",
            "gateway",
            "on",
            ">gateway-pass",
            "~tg:*",
            "&tg:*",
            "+@all",
        ])
        .output()
        .expect("redis-cli");
    assert!(String::from_utf8_lossy(&created.stdout).contains("OK"));
    let url = format!("redis://gateway:gateway-pass@127.0.0.1:{}/3", redis.port);
    let upstream = start_upstream().await;
    let gateway = start_gateway(&policy(&url, 2, "1/h"), upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    assert_eq!(client.get("/global", &[]).await.status, 200);
    assert_eq!(client.get("/global", &[]).await.status, 200);
    assert_eq!(client.get("/global", &[]).await.status, 429);
    let in_db3 = Command::new("redis-cli")
        .args([
            "-p",
            &redis.port.to_string(),
            "-a",
            "admin-pass",
            "--no-auth-warning",
            "-n",
            "3",
            "EXISTS",
            "tg:everyone:global",
        ])
        .output()
        .expect("redis-cli");
    assert_eq!(
        String::from_utf8_lossy(&in_db3.stdout).trim(),
        "1",
        "the bucket lives in database 3"
    );

    let wrong = format!("redis://gateway:wrong@127.0.0.1:{}/3", redis.port);
    let refused = start_gateway(&policy(&wrong, 2, "1/h"), upstream.address).await;
    let client = HttpClient::new(refused.addresses[0]);
    assert_eq!(
        client.get("/global", &[]).await.status,
        503,
        "a wrong password is a store failure, fail-closed here"
    );

    // The same user with its password from the environment, the url naming only the node:
    // decisions, and the reset channel's own connection, authenticate with them.
    std::env::set_var("TOLLGATE_TEST_REDIS_PASSWORD", "gateway-pass");
    let bare = format!("redis://127.0.0.1:{}/3", redis.port);
    let from_env = policy(&bare, 2, "1/h").replace(
        "prefix = \"tg:\"\n",
        "prefix = \"tg:\"\nusername = \"gateway\"\npassword_env = \"TOLLGATE_TEST_REDIS_PASSWORD\"\n",
    );
    let gateway = start_gateway(&from_env, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    assert_eq!(
        client.get("/global", &[]).await.status,
        429,
        "the bucket two requests emptied above, in database 3"
    );
    let store = gateway.redis_store().unwrap();
    eventually(
        "the reset channel is subscribed with the credentials",
        || store.hears_resets(),
    )
    .await;
}

/// A TLS-only redis-server (stopped on drop).
struct TlsRedis {
    port: u16,
    child: std::process::Child,
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_verifies_the_server_against_the_configured_roots() {
    let dir = tempfile::tempdir().unwrap();
    let generated = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let (cert, key) = (dir.path().join("redis.pem"), dir.path().join("redis.key"));
    std::fs::write(&cert, generated.cert.pem()).unwrap();
    std::fs::write(&key, generated.signing_key.serialize_pem()).unwrap();
    let port = common::redis_server::free_port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            "0",
            "--tls-port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .arg("--tls-cert-file")
        .arg(&cert)
        .arg("--tls-key-file")
        .arg(&key)
        .arg("--tls-ca-cert-file")
        .arg(&cert)
        .args(["--tls-auth-clients", "no"])
        .arg("--dir")
        .arg(dir.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("redis-server");
    let redis = TlsRedis { port, child };
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let ping = Command::new("redis-cli")
            .args(["--tls", "--cacert"])
            .arg(&cert)
            .args(["-h", "localhost", "-p", &redis.port.to_string(), "PING"])
            .output()
            .expect("redis-cli");
        if String::from_utf8_lossy(&ping.stdout).trim() == "PONG" {
            break;
        }
        assert!(Instant::now() < deadline, "TLS redis-server did not answer");
        std::thread::sleep(Duration::from_millis(50));
    }
    let upstream = start_upstream().await;
    let url = format!("rediss://localhost:{}", redis.port);
    let trusted = policy(&url, 2, "1/h").replace(
        "prefix = \"tg:\"",
        &format!("prefix = \"tg:\"\nca_file = \"{}\"", cert.display()),
    );
    let gateway = start_gateway(&trusted, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    assert_eq!(client.get("/global", &[]).await.status, 200);
    assert_eq!(client.get("/global", &[]).await.status, 200);
    assert_eq!(
        client.get("/global", &[]).await.status,
        429,
        "the shared bucket lives behind TLS"
    );
    // A reset reaches every replica over the same TLS: the second replica, which learned
    // from Redis that the bucket is empty and remembers it, lets go of it.
    let second = start_gateway(&trusted, upstream.address).await;
    eventually("the second replica hears resets", || {
        second.redis_store().unwrap().hears_resets()
    })
    .await;
    let two = HttpClient::new(second.addresses[0]);
    assert_eq!(two.get("/global", &[]).await.status, 429);
    let reset = HttpClient::new(gateway.admin_address)
        .send("DELETE", "/limits/everyone", &[], Default::default())
        .await;
    assert_eq!(reset.status, 204);
    let mut admitted = false;
    for _ in 0..250 {
        if two.get("/global", &[]).await.status == 200 {
            admitted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(admitted, "the second replica did not hear of the reset");

    // Without the CA the self-signed server is not trusted: a store failure (fail-closed here).
    let untrusted = start_gateway(&policy(&url, 2, "1/h"), upstream.address).await;
    assert_eq!(
        HttpClient::new(untrusted.addresses[0])
            .get("/global", &[])
            .await
            .status,
        503
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiers_from_verified_claims_are_shared_by_replicas_and_keep_tokens() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let secret = "redis-tier-test-secret-0123456789abcdef";
    std::env::set_var("TOLLGATE_TEST_REDIS_JWT_SECRET", secret);
    let policy = format!(
        r#"
[store]
backend = "redis"
url = "{}"
timeout = "2s"
hash_key = "test-secret-0123456789"

[auth.jwt]
secret_env = "TOLLGATE_TEST_REDIS_JWT_SECRET"

[upstreams.app]
url = "http://{{upstream}}"

[limits.per_user]
key = {{ jwt_claim = "sub" }}
missing = "reject"
capacity = 3
rate = "1/h"
tier = {{ jwt_claim = "plan" }}

[limits.per_user.tiers]
pro = {{ capacity = 6 }}
internal = "exempt"

[[routes]]
name = "api"
path_prefix = "/"
upstream = "app"
limits = ["per_user"]
on_store_failure = "deny"
"#,
        redis.url()
    );
    let gateways = replicas(&policy, upstream.address, 2).await;
    let token = |sub: &str, plan: Option<&str>| {
        let mut claims = tokens::claims(sub, serde_json::json!({}));
        if let Some(plan) = plan {
            claims["plan"] = plan.into();
        }
        vec![(
            "authorization".to_owned(),
            format!("Bearer {}", tokens::hs256(secret.as_bytes(), &claims)),
        )]
    };
    assert_eq!(hammer(&gateways, "/", token("pat", None), 20, 4).await, 3);
    assert_eq!(
        hammer(&gateways, "/", token("quinn", Some("pro")), 20, 4).await,
        6
    );
    assert_eq!(
        hammer(&gateways, "/", token("ops", Some("internal")), 20, 4).await,
        20
    );
    // pat, empty at the free tier, upgrades: the bucket is the same, still empty.
    assert_eq!(
        hammer(&gateways, "/", token("pat", Some("pro")), 4, 2).await,
        0
    );
    // A forged token is refused on both replicas; it never reaches the bucket.
    let forged = format!(
        "Bearer {}",
        tokens::hs256(
            b"guessed-secret-guessed-secret-00",
            &tokens::claims("rex", serde_json::json!({}))
        )
    );
    for gateway in &gateways {
        let client = HttpClient::new(gateway.addresses[0]);
        for _ in 0..3 {
            let reply = client.get("/", &[("authorization", &forged)]).await;
            assert_eq!(reply.status, 401);
        }
    }
    let client = HttpClient::new(gateways[1].addresses[0]);
    let reply = client
        .get("/", &[("authorization", &token("rex", None)[0].1)])
        .await;
    assert_eq!(
        reply.status, 200,
        "rex's bucket was never charged by the forgeries"
    );
    assert_eq!(reply.header("ratelimit-remaining"), Some("2"));
}

fn quota_policy(store_url: &str, quota: u32) -> String {
    format!(
        r#"
[store]
backend = "redis"
url = "{store_url}"
timeout = "2s"
prefix = "tg:"
hash_key = "test-secret-0123456789"

[upstreams.app]
url = "http://{{upstream}}"

[limits.hourly]
key = "global"
quota = {quota}
period = "hour"

[[routes]]
name = "all"
path_prefix = "/"
upstream = "app"
limits = ["hourly"]
on_store_failure = "deny"
"#
    )
}

/// Unix seconds now, waited past the next hour's start if it is less than 15 s away: the
/// tests below count within one hour of Redis's clock.
async fn well_inside_an_hour() -> u64 {
    let now = tokens::now();
    let to_next_hour = 3600 - now % 3600;
    if to_next_hour < 15 {
        tokio::time::sleep(Duration::from_secs(to_next_hour + 1)).await;
    }
    tokens::now()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_a_quota_counted_in_the_period_redis_time_says() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let policy = quota_policy(&redis.url(), 12);
    let now = well_inside_an_hour().await;
    // One replica's clock is an hour behind: it names the previous hour, whose end Redis's
    // clock has passed, so its requests count in the same hour as the others'.
    let behind = Clock::manual_at(now - 3600);
    let mut gateways = replicas(&policy, upstream.address, 2).await;
    gateways.push(Arc::new(
        start_gateway_with_clock(&policy, upstream.address, Some(behind)).await,
    ));
    assert_eq!(hammer(&gateways, "/", vec![], 60, 6).await, 12);
    let keys = redis.cli(&["--scan", "--pattern", "tg:hourly:*"]);
    assert_eq!(keys.trim(), "tg:hourly:global", "one key for the period");
    let hour_end = (now / 3600 + 1) * 3600;
    assert_eq!(
        redis.stored_bucket("tg:hourly:global"),
        Some(vec![0.0, hour_end as f64]),
        "the count, and the end of the hour it belongs to"
    );
    let ttl: u64 = redis
        .cli(&["PTTL", "tg:hourly:global"])
        .trim()
        .parse()
        .unwrap();
    let to_end_ms = (hour_end - now) * 1000;
    assert!(
        ttl <= to_end_ms + 1000 && ttl + 10_000 >= to_end_ms,
        "expires with its hour: PTTL {ttl}, {to_end_ms} ms to go"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_starts_over_when_the_gateway_clock_enters_the_next_period() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let now = well_inside_an_hour().await;
    // A test-only clock: the Redis server's own clock cannot be moved.
    let clock = Clock::manual_at(now);
    let gateway = start_gateway_with_clock(
        &quota_policy(&redis.url(), 2),
        upstream.address,
        Some(clock.clone()),
    )
    .await;
    let client = HttpClient::new(gateway.addresses[0]);
    assert_eq!(client.get("/", &[]).await.status, 200);
    assert_eq!(client.get("/", &[]).await.status, 200);
    let refused = client.get("/", &[]).await;
    assert_eq!(refused.status, 429);
    let to_next_hour = 3600 - now % 3600;
    let retry_after: u64 = refused.header("retry-after").unwrap().parse().unwrap();
    assert!(
        retry_after.abs_diff(to_next_hour) <= 2,
        "Retry-After {retry_after}, {to_next_hour} s to the next hour"
    );
    // A second into the next hour (the servers' clock may read a moment behind this one's).
    clock.advance(Duration::from_secs(to_next_hour + 1));
    let reply = client.get("/", &[]).await;
    assert_eq!(reply.status, 200, "the next hour's count");
    assert_eq!(reply.header("ratelimit-remaining"), Some("1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_on_a_cluster_is_exact_and_given_back_when_another_slot_refuses() {
    let cluster = RedisCluster::start();
    let upstream = start_upstream().await;
    well_inside_an_hour().await;
    let slot = |name: &str| tollgate::limit::redis::slot(format!("tg:{name}:global").as_bytes());
    let names = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"];
    let (quota, bucket) = (
        names[0],
        names
            .iter()
            .copied()
            .find(|name| slot(name) != slot(names[0]))
            .unwrap(),
    );
    let text = quota_policy(&cluster.url(), 50).replace(
        "[[routes]]",
        &format!(
            r#"
[limits.{quota}]
key = "global"
quota = 10
period = "hour"

[limits.{bucket}]
key = "global"
capacity = 3
rate = "1/h"

[[routes]]
name = "both"
path = "/both"
upstream = "app"
limits = ["{quota}", "{bucket}"]

[[routes]]
name = "quota"
path = "/quota"
upstream = "app"
limits = ["{quota}"]

[[routes]]"#
        ),
    );
    let gateways = replicas(&text, upstream.address, 3).await;
    assert_eq!(
        hammer(&gateways, "/", vec![], 200, 24).await,
        50,
        "exact on a cluster"
    );
    assert_eq!(hammer(&gateways, "/both", vec![], 3, 1).await, 3);
    // Refused by the bucket in another slot: the quota's charge is given back.
    assert_eq!(hammer(&gateways, "/both", vec![], 30, 6).await, 0);
    assert_eq!(hammer(&gateways, "/quota", vec![], 20, 4).await, 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_in_an_earlier_versions_hash_is_taken_over() {
    // Before 2026-12, a bucket was a hash {tokens, ts}: a fleet upgraded in place finds such
    // keys, reads them as full buckets and writes them in the current form.
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let gateway = start_gateway(&policy(&redis.url(), 2, "1/h"), upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    redis.cli(&["HSET", "tg:everyone:global", "tokens", "0", "ts", "1"]);
    let statuses = [
        client.get("/global", &[]).await.status,
        client.get("/global", &[]).await.status,
        client.get("/global", &[]).await.status,
    ];
    assert_eq!(statuses, [200, 200, 429]);
    assert_eq!(redis.cli(&["TYPE", "tg:everyone:global"]).trim(), "string");
    let tokens = redis.stored_bucket("tg:everyone:global").unwrap()[0];
    assert!(tokens < 0.01, "both tokens spent: {tokens}");
}

/// The Redis store (`{redis}`) and the upstream `app` (`{upstream}`), for a test's limits
/// and routes to follow.
const STORE_AND_APP: &str = r#"
[store]
backend = "redis"
url = "{redis}"
timeout = "2s"
prefix = "tg:"
hash_key = "test-secret-0123456789"

[upstreams.app]
url = "http://{upstream}"
"#;

/// A redis-server of its own, and a gateway on it with `policy` (its `{redis}` the server's
/// URL) in front of an upstream of its own.
struct OnRedis {
    redis: RedisServer,
    client: HttpClient,
    _gateway: Tollgate,
    _upstream: Upstream,
}

async fn on_redis(policy: &str) -> OnRedis {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let gateway = start_gateway(&policy.replace("{redis}", &redis.url()), upstream.address).await;
    OnRedis {
        client: HttpClient::new(gateway.addresses[0]),
        redis,
        _gateway: gateway,
        _upstream: upstream,
    }
}

/// The Redis server's time in microseconds.
fn redis_time_us(redis: &RedisServer) -> f64 {
    let reply = redis.cli(&["TIME"]);
    let mut parts = reply
        .split_whitespace()
        .map(|part| part.parse::<f64>().unwrap());
    parts.next().unwrap() * 1e6 + parts.next().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_stored_ahead_of_redis_time_keeps_its_moment_and_refills_nothing() {
    // As after a failover to a node whose clock is behind the one that wrote the buckets, or
    // a clock stepped back: the stored moment is ahead of the server's time.
    let policy = STORE_AND_APP.to_owned()
        + r#"
[limits.everyone]
key = "global"
capacity = 5
rate = "1/s"

[limits.charged]
key = { header = "x-user" }
capacity = 5
rate = "1/s"
charge_on_status = { "200" = 1 }

[[routes]]
name = "global"
path = "/global"
upstream = "app"
limits = ["everyone"]

[[routes]]
name = "charged"
path = "/charged"
upstream = "app"
limits = ["charged"]
"#;
    // The gateway and the upstream live as long as their bindings.
    let OnRedis {
        redis,
        client,
        _gateway,
        _upstream,
    } = on_redis(&policy).await;
    let ahead = redis_time_us(&redis) + 100e6;

    // decide.lua: 3 tokens counted 100 s ahead. Behind that moment nothing refills, and the
    // moment is written back as it was, not moved to the server's time.
    redis.store_bucket("tg:everyone:global", &[3.0, ahead]);
    let statuses: Vec<u16> =
        futures_util::future::join_all((0..4).map(|_| client.get("/global", &[])))
            .await
            .iter()
            .map(|reply| reply.status.as_u16())
            .collect();
    assert_eq!(
        statuses.iter().filter(|status| **status == 200).count(),
        3,
        "{statuses:?}"
    );
    let stored = redis.stored_bucket("tg:everyone:global").unwrap();
    assert_eq!(
        stored[1], ahead,
        "the moment moved back to the server's time"
    );
    assert!(stored[0].abs() < 1e-9, "{stored:?}");

    // outcome.lua: the charge after the response keeps the moment too.
    let user = [("x-user", "alice")];
    assert_eq!(client.get("/charged", &user).await.status, 200);
    let key = redis
        .cli(&["--scan", "--pattern", "tg:charged:*"])
        .trim()
        .to_owned();
    let stored = redis.stored_bucket(&key).unwrap();
    redis.store_bucket(&key, &[stored[0], ahead]);
    assert_eq!(client.get("/charged", &user).await.status, 200);
    let stored = redis.stored_bucket(&key).unwrap();
    assert_eq!(stored[1], ahead, "outcome.lua moved the moment back");
}

/// `tests/fixtures/clock_shift/clock_shift.c` built as a preloadable library in `dir`.
fn clock_shift_library(dir: &std::path::Path) -> std::path::PathBuf {
    let library = dir.join("clock_shift.so");
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/clock_shift/clock_shift.c");
    let built = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&library)
        .arg(&source)
        .status()
        .expect("cc (the linker Rust builds with)");
    assert!(built.success(), "building {}", source.display());
    library
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restarted_with_its_clock_behind_refills_nothing_twice() {
    let policy = STORE_AND_APP.to_owned()
        + r#"
[limits.everyone]
key = "global"
capacity = 5
rate = "1/h"

[[routes]]
name = "global"
path = "/global"
upstream = "app"
limits = ["everyone"]
on_store_failure = "deny"
"#;
    let scratch = tempfile::tempdir().unwrap();
    let library = clock_shift_library(scratch.path());
    // The gateway and the upstream live as long as their bindings.
    let OnRedis {
        mut redis,
        client,
        _gateway,
        _upstream,
    } = on_redis(&policy).await;
    for _ in 0..2 {
        assert_eq!(client.get("/global", &[]).await.status, 200);
    }
    let written = redis.stored_bucket("tg:everyone:global").unwrap();
    assert!((written[0] - 3.0).abs() < 0.01, "{written:?}");

    // The same data on a server whose clock is 100 s behind the one that wrote it.
    let before = redis_time_us(&redis);
    redis.restart_with_data_and_env(&[
        ("LD_PRELOAD", library.to_str().unwrap()),
        ("CLOCK_SHIFT_SECONDS", "-100"),
    ]);
    let behind = redis_time_us(&redis);
    assert!(
        before - behind > 90e6,
        "the clock did not go back: {before} → {behind}"
    );

    // Decisions resume once the gateway has reconnected; the three tokens left are spent,
    // at the stored moment, which stays where the other clock put it.
    let mut statuses = Vec::new();
    for _ in 0..200 {
        let status = client.get("/global", &[]).await.status.as_u16();
        if status != 503 {
            statuses.push(status);
            if statuses.len() == 4 {
                break;
            }
        } else {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    assert_eq!(statuses, [200, 200, 200, 429]);
    let stored = redis.stored_bucket("tg:everyone:global").unwrap();
    assert_eq!(
        stored[1], written[1],
        "the stored moment went back with the clock"
    );
    assert!(stored[0].abs() < 0.01, "{stored:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_lease_keeps_a_stored_moment_ahead_of_redis_time() {
    let policy = STORE_AND_APP.to_owned()
        + r#"
[limits.everyone]
key = "global"
capacity = 100
rate = "100/s"
lease = "100ms"

[[routes]]
name = "global"
path = "/global"
upstream = "app"
limits = ["everyone"]
"#;
    // The gateway and the upstream live as long as their bindings.
    let OnRedis {
        redis,
        client,
        _gateway,
        _upstream,
    } = on_redis(&policy).await;
    let ahead = redis_time_us(&redis) + 100e6;
    redis.store_bucket("tg:everyone:global", &[50.0, ahead]);
    assert_eq!(client.get("/global", &[]).await.status, 200);
    let stored = redis.stored_bucket("tg:everyone:global").unwrap();
    assert_eq!(stored[1], ahead, "lease.lua moved the moment back");
    assert!(
        stored[0] < 50.0,
        "a lease was taken from the 50 tokens: {stored:?}"
    );
}

#[test]
fn a_refund_keeps_a_stored_moment_ahead_of_redis_time() {
    let redis = RedisServer::start();
    let script = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/limit/refund.lua"),
    )
    .unwrap();
    let ahead = redis_time_us(&redis) + 100e6;
    redis.store_bucket("tg:everyone:global", &[1.0, ahead]);
    // Capacity 5, a token per second, 2 given back.
    redis.cli(&["EVAL", &script, "1", "tg:everyone:global", "5", "1", "2"]);
    let stored = redis.stored_bucket("tg:everyone:global").unwrap();
    assert_eq!(stored, [3.0, ahead], "nothing refilled, the moment kept");
}
