//! Redis stalling and failing over under a running gateway, with real `redis-server`s started
//! by the tests: paused or asleep while scripts queue (which then run late and charge nothing),
//! a node restarted on its address, its connections killed, a Cluster master killed and its
//! replica promoted, a slot migrated (`ASK`, then `MOVED`). The gateway follows by itself, no
//! request waits longer than the store's timeout plus one reconnect, and no bucket is charged
//! for a request that was not admitted.
#![allow(clippy::disallowed_methods)] // tests measure real time

mod common;

use std::time::{Duration, Instant};

use common::redis_server::{RedisCluster, RedisServer};
use common::*;

const TEN: &str = r#"
[store]
backend = "redis"
url = "REDIS"
timeout = "100ms"
connect_timeout = "500ms"
prefix = "tg:"
hash_key = "test-secret-0123456789"

[upstreams.app]
url = "http://{upstream}"

[limits.ten]
key = "global"
capacity = 10
rate = "1/h"

[[routes]]
name = "deny"
path = "/deny"
upstream = "app"
limits = ["ten"]
on_store_failure = "deny"
"#;

/// The longest a request may take while Redis fails: the store's timeout (100 ms), one
/// reconnect (500 ms), and room for a loaded machine.
const LONGEST: Duration = Duration::from_secs(3);

/// A gateway with `policy` on the store at `url`, in front of an upstream of its own; both
/// live as long as this does.
struct Setup {
    gateway: tollgate::Tollgate,
    client: HttpClient,
    admin: HttpClient,
    _upstream: Upstream,
}

async fn gateway_on(policy: &str, url: &str) -> Setup {
    let upstream = start_upstream().await;
    let gateway = start_gateway(&policy.replace("REDIS", url), upstream.address).await;
    Setup {
        client: HttpClient::new(gateway.addresses[0]),
        admin: HttpClient::new(gateway.admin_address),
        gateway,
        _upstream: upstream,
    }
}

/// Sends `count` requests to `/deny` while the store fails: each is refused, within `LONGEST`.
async fn refused_in_time(client: &HttpClient, count: usize) {
    for _ in 0..count {
        let sent = Instant::now();
        assert_eq!(client.get("/deny", &[]).await.status, 503);
        assert!(sent.elapsed() < LONGEST, "waited {:?}", sent.elapsed());
    }
}

/// Sends `/deny` until it is admitted; returns how long that took and the statuses before.
async fn until_admitted(client: &HttpClient) -> (Duration, Vec<u16>) {
    let started = Instant::now();
    let mut before = Vec::new();
    loop {
        let sent = Instant::now();
        let status = client.get("/deny", &[]).await.status.as_u16();
        assert!(
            sent.elapsed() < LONGEST,
            "a request waited {:?}",
            sent.elapsed()
        );
        if status == 200 {
            return (started.elapsed(), before);
        }
        assert_eq!(status, 503, "refused only for the store");
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "decisions did not go back to Redis: {before:?}"
        );
        before.push(status);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Asks `/readyz` until it answers 200; returns how long that took.
async fn until_ready(admin: &HttpClient) -> Duration {
    let started = Instant::now();
    while admin.get("/readyz", &[]).await.status != 200 {
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "/readyz did not go back to 200"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    started.elapsed()
}

/// How many of `count` requests to `/deny` are admitted, one after another.
async fn admitted(client: &HttpClient, count: usize) -> usize {
    let mut admitted = 0;
    for _ in 0..count {
        if client.get("/deny", &[]).await.status == 200 {
            admitted += 1;
        }
    }
    admitted
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restarted_on_its_address_decides_again_as_soon_as_it_answers() {
    let mut redis = RedisServer::start();
    let setup = gateway_on(TEN, &redis.url()).await;
    let (client, admin) = (&setup.client, &setup.admin);
    assert_eq!(admitted(client, 2).await, 2);

    redis.stop();
    refused_in_time(client, 5).await;
    assert_eq!(admin.get("/readyz", &[]).await.status, 503);

    // `restart` returns once the new process answers a PING.
    redis.restart();
    let (reconnect, refused) = until_admitted(client).await;
    eprintln!(
        "restart: decisions through Redis {reconnect:?} after it answered ({} refused before)",
        refused.len()
    );
    assert!(reconnect < LONGEST, "{reconnect:?}");
    assert_eq!(admin.get("/readyz", &[]).await.status, 200);
    // Restarted empty: a full bucket of ten, one of them just taken.
    assert_eq!(admitted(client, 12).await, 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_connections_are_replaced_and_refusals_charge_nothing() {
    let redis = RedisServer::start();
    let setup = gateway_on(TEN, &redis.url()).await;
    let client = &setup.client;
    assert_eq!(admitted(client, 3).await, 3);

    for round in 0..3 {
        let killed = redis.cli(&["CLIENT", "KILL", "TYPE", "normal"]);
        assert!(
            killed.trim().parse::<u32>().unwrap_or(0) >= 1,
            "round {round}: no connection of the gateway's was killed: {killed}"
        );
        let (reconnect, refused) = until_admitted(client).await;
        eprintln!(
            "CLIENT KILL: decisions through Redis {reconnect:?} later ({} refused before)",
            refused.len()
        );
    }
    // 3 + 3 admitted; whatever was refused on the way took nothing from the bucket.
    assert_eq!(admitted(client, 10).await, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_follows_a_replica_promoted_in_place_of_a_killed_master() {
    let mut cluster = RedisCluster::start_with(1, "1000");
    let setup = gateway_on(TEN, &cluster.url()).await;
    let (client, admin) = (&setup.client, &setup.admin);
    assert_eq!(admitted(client, 3).await, 3);

    let slot = tollgate::limit::redis::slot(b"tg:ten:global");
    let master = cluster.master_of(slot);
    // Replication is asynchronous: a charge made in the moment before a master dies may be
    // lost with it. Here the replica has them all.
    cluster.wait_replicated(master);
    cluster.nodes[master].stop();
    let killed = Instant::now();
    refused_in_time(client, 3).await;
    cluster.wait_until_ok(|cluster| cluster.serving(slot).is_some_and(|node| node != master));
    let promoted = killed.elapsed();
    let (reconnect, refused) = until_admitted(client).await;
    eprintln!(
        "failover: replica promoted {promoted:?} after the kill; decisions through it {reconnect:?} later ({} refused before)",
        refused.len()
    );
    // `/readyz` pings every master the client knows of, and the client rebuilds its slot map
    // in the background after the first redirect: it may name the dead master a moment longer.
    let ready = until_ready(admin).await;
    eprintln!("failover: ready {ready:?} after decisions went through");
    // The replica had the charges: 3 + 1 admitted so far.
    assert_eq!(admitted(client, 10).await, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_keeps_its_tokens_while_its_slot_migrates_to_another_node() {
    let cluster = RedisCluster::start();
    let setup = gateway_on(TEN, &cluster.url()).await;
    let client = &setup.client;
    assert_eq!(admitted(client, 3).await, 3);

    let key = "tg:ten:global";
    let slot = tollgate::limit::redis::slot(key.as_bytes()).to_string();
    let source = &cluster.nodes[cluster.master_of(slot.parse().unwrap())];
    let target = cluster
        .nodes
        .iter()
        .find(|node| node.port != source.port)
        .unwrap();
    let id = |node: &RedisServer| node.cli(&["CLUSTER", "MYID"]).trim().to_owned();
    let (source_id, target_id) = (id(source), id(target));
    assert_eq!(
        target
            .cli(&["CLUSTER", "SETSLOT", &slot, "IMPORTING", &source_id])
            .trim(),
        "OK"
    );
    assert_eq!(
        source
            .cli(&["CLUSTER", "SETSLOT", &slot, "MIGRATING", &target_id])
            .trim(),
        "OK"
    );
    // Migrating, the key still on its old node: served there.
    assert_eq!(admitted(client, 2).await, 2);

    // Moved to the new node while the slot is still the old one's: the old node answers ASK.
    let port = target.port.to_string();
    let migrated = source.cli(&["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS", key]);
    assert_eq!(migrated.trim(), "OK", "MIGRATE: {migrated}");
    assert_eq!(admitted(client, 2).await, 2, "followed ASK");

    // The slot now belongs to the new node: the old one answers MOVED.
    for node in &cluster.nodes {
        node.cli(&["CLUSTER", "SETSLOT", &slot, "NODE", &target_id]);
    }
    assert_eq!(
        admitted(client, 10).await,
        3,
        "followed MOVED with the bucket's tokens: 10 in all"
    );
}

const SIX: &str = r#"
[store]
backend = "redis"
url = "REDIS"
timeout = "100ms"
prefix = "tg:"
hash_key = "test-secret-0123456789"

[upstreams.app]
url = "http://{upstream}"

[limits.six]
key = "global"
capacity = 6
rate = "1/h"

[[routes]]
name = "deny"
path = "/deny"
upstream = "app"
limits = ["six"]
on_store_failure = "deny"

[[routes]]
name = "local"
path = "/local"
upstream = "app"
limits = ["six"]
on_store_failure = "local"
"#;

/// Blocks a node with `DEBUG SLEEP` sent from a connection of the test's own; returns once a
/// second connection's PING goes unanswered (the node sleeps), with the first connection,
/// which answers when the sleep ends.
async fn put_to_sleep(redis: &RedisServer, seconds: &str) -> tokio::net::TcpStream {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = ("127.0.0.1", redis.port);
    let mut sleeper = tokio::net::TcpStream::connect(address).await.unwrap();
    let command = format!(
        "*3\r\n$5\r\nDEBUG\r\n$5\r\nSLEEP\r\n${}\r\n{seconds}\r\n",
        seconds.len()
    );
    sleeper.write_all(command.as_bytes()).await.unwrap();
    let mut probe = tokio::net::TcpStream::connect(address).await.unwrap();
    loop {
        probe.write_all(b"PING\r\n").await.unwrap();
        let mut reply = [0u8; 7];
        let answered =
            tokio::time::timeout(Duration::from_millis(300), probe.read_exact(&mut reply));
        if answered.await.is_err() {
            return sleeper;
        }
    }
}

/// Three requests on a `deny` route (503) and three on a `local` route (decided by the
/// replica's own buckets) while the node that holds the bucket sleeps for 3 s (`DEBUG SLEEP`
/// from a connection of the test's own): their scripts run when it wakes, late, and charge
/// nothing: 5 of the 6 tokens are left.
async fn calls_a_sleeping_node_runs_late_charge_nothing(url: &str, node: &RedisServer) {
    use tokio::io::AsyncReadExt;

    let setup = gateway_on(SIX, url).await;
    let (gateway, client) = (&setup.gateway, &setup.client);
    let store = gateway.redis_store().unwrap();
    // One decision first: its reply tells the gateway the server's clock. 5 tokens left.
    assert_eq!(client.get("/deny", &[]).await.status, 200);

    let mut sleeper = put_to_sleep(node, "3").await;
    for _ in 0..3 {
        assert_eq!(client.get("/deny", &[]).await.status, 503);
    }
    for _ in 0..3 {
        assert_eq!(client.get("/local", &[]).await.status, 200);
    }
    let mut ok = [0u8; 5];
    sleeper.read_exact(&mut ok).await.unwrap();
    assert_eq!(&ok, b"+OK\r\n", "the sleep ended");
    eventually("the late calls are counted", || {
        store.late_calls() > 0 && !store.is_circuit_open()
    })
    .await;

    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(client.get("/deny", &[]).await.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_run_after_a_debug_sleep_charge_nothing_on_deny_and_local_routes() {
    let redis = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    calls_a_sleeping_node_runs_late_charge_nothing(&redis.url(), &redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_a_sleeping_cluster_node_runs_late_charge_nothing() {
    let cluster = RedisCluster::start();
    let node = &cluster.nodes[cluster.master_of(tollgate::limit::redis::slot(b"tg:six:global"))];
    calls_a_sleeping_node_runs_late_charge_nothing(&cluster.url(), node).await;
}

/// Five requests while the node that holds the bucket (`slot` of `url`) pauses for 1.5 s: the
/// gateway gives up on each call after 100 ms and answers 503, while the scripts wait in Redis
/// to run when the pause ends. They run late and charge nothing: 5 of the 6 tokens are left.
/// `calls`: how many calls the five requests make at least (one node batches them).
async fn paused_calls_charge_nothing(url: &str, calls: u64, pause: impl FnOnce()) {
    use tollgate::limit::breaker::CircuitState;

    let setup = gateway_on(SIX, url).await;
    let (gateway, client) = (&setup.gateway, &setup.client);
    let store = gateway.redis_store().unwrap();
    // One decision first: its reply tells the gateway the server's clock. 5 tokens left.
    assert_eq!(client.get("/deny", &[]).await.status, 200);

    pause();
    let refused = futures_util::future::join_all((0..5).map(|_| client.get("/deny", &[]))).await;
    assert!(refused.iter().all(|reply| reply.status == 503));
    eventually("the late calls are counted and the circuit closes", || {
        store.late_calls() >= calls && store.circuit_state() == CircuitState::Closed
    })
    .await;

    let mut statuses = Vec::new();
    for _ in 0..6 {
        statuses.push(client.get("/deny", &[]).await.status.as_u16());
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
    let late = metric(
        &gateway.render_metrics(),
        r#"tollgate_store_late_total{backend="redis"}"#,
    );
    assert!(late >= calls as f64, "{late}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_that_run_after_the_gateway_gave_up_charge_nothing() {
    let redis = RedisServer::start();
    paused_calls_charge_nothing(&redis.url(), 1, || {
        redis.cli(&["CLIENT", "PAUSE", "1500", "ALL"]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_a_paused_cluster_node_runs_late_charge_nothing() {
    let cluster = RedisCluster::start();
    let slot = tollgate::limit::redis::slot(b"tg:six:global");
    let node = &cluster.nodes[cluster.master_of(slot)];
    paused_calls_charge_nothing(&cluster.url(), 5, || {
        node.cli(&["CLIENT", "PAUSE", "1500", "ALL"]);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_charge_by_status_that_runs_after_the_gateway_gave_up_is_dropped() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let policy = SIX
        .replace("REDIS", &redis.url())
        .replace("capacity = 6", "capacity = 10")
        .replace("path = \"/deny\"", "path = \"/delayed\"")
        + "\n[limits.six.charge_on_status]\n200 = 3\n";
    let gateway = start_gateway(&policy, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let tokens = || -> f64 {
        let keys = redis.cli(&["KEYS", "*six*"]);
        let key = keys
            .lines()
            .next()
            .expect("the bucket's key")
            .trim()
            .to_owned();
        redis.stored_bucket(&key).expect("the bucket's state")[0]
    };
    // A first request learns the server's clock: 1 token, then 3 by its status.
    assert_eq!(client.get("/delayed", &[]).await.status, 200);
    assert!((tokens() - 6.0).abs() < 0.01, "{}", tokens());

    // The next is decided at once, then its upstream takes a second; meanwhile Redis pauses,
    // so the charge by its status waits in Redis past the gateway's 100 ms.
    upstream
        .delay_ms
        .store(1000, std::sync::atomic::Ordering::SeqCst);
    let pending = {
        let client = HttpClient::new(gateway.addresses[0]);
        tokio::spawn(async move { client.get("/delayed", &[]).await.status })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    redis.cli(&["CLIENT", "PAUSE", "2000", "ALL"]);
    assert_eq!(
        pending.await.unwrap(),
        200,
        "the response does not wait for its hooks' store"
    );
    // PING waits for the pause to end; the queued charge has run by the time it answers.
    assert_eq!(redis.cli(&["PING"]).trim(), "PONG");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let left = tokens();
    assert!(
        (left - 5.0).abs() < 0.01,
        "{left} tokens: only the decision's was taken, the late charge was dropped"
    );
}
