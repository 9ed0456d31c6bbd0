//! Shaping through a real redis-server. Concurrency slots: two replicas (one of them a
//! separate `tollgate` process) share a key's slots, and the slots of a replica killed with
//! SIGKILL come back once their lease runs out. Delays: two replicas book one debt, forward in
//! booking order, refuse beyond `max_delay`, and a client that leaves gives its tokens back.

mod common;

use std::time::Duration;

use common::redis_server::RedisServer;
use common::*;

/// The store and the upstream of every policy here.
fn store(redis: &RedisServer) -> String {
    format!(
        r#"
[store]
backend = "redis"
url = "{url}"
timeout = "2s"
hash_key = "test-secret-0123456789"
lease = "3s"

[upstreams.app]
url = "http://{{upstream}}"
"#,
        url = redis.url()
    )
}

/// The shared policy; the separate replica's file adds its listeners.
fn policy(redis: &RedisServer) -> String {
    store(redis)
        + r#"
[limits.exports]
key = { header = "x-user" }
concurrency = 2

[[routes]]
name = "exports"
path_prefix = "/"
upstream = "app"
limits = ["exports"]
"#
}

async fn export(address: std::net::SocketAddr, user: &str) -> (u16, tokio::net::TcpStream) {
    let request = format!("GET /held-body HTTP/1.1\r\nHost: a\r\nx-user: {user}\r\n\r\n");
    let (head, stream) = raw_head(address, request.as_bytes()).await;
    (raw_status(&head), stream)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_slots_and_a_killed_replicas_slots_come_back_after_the_lease() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let text = policy(&redis).replace("{upstream}", &upstream.address.to_string());
    let mut killed = Replica::start(&text).await;
    let first = killed.address;
    let second = start_gateway(&text, upstream.address).await;

    // One export of ann on each replica: both of her slots, shared through Redis.
    let (status, _held_first) = export(first, "ann").await;
    assert_eq!(status, 200);
    let (status, _held_second) = export(second.addresses[0], "ann").await;
    assert_eq!(status, 200);
    let (status, _) = export(second.addresses[0], "ann").await;
    assert_eq!(status, 429, "the slots are shared by both replicas");
    let slots = format!("tollgate:exports:{}:slots", ann_key());
    assert_eq!(
        redis.cli(&["ZCARD", &slots]).trim(),
        "2",
        "two leases in Redis"
    );

    // The first replica dies without giving its slot back; the slot returns with its lease.
    killed.kill();
    let mut admitted = None;
    for _ in 0..200 {
        let (status, stream) = export(second.addresses[0], "ann").await;
        if status == 200 {
            admitted = Some(stream);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        admitted.is_some(),
        "the killed replica's slot never came back"
    );
    // A request that ends gives its slot back (in the background, within moments): bob's
    // five short requests never find his two slots taken (leases left behind last 3 s).
    let client = HttpClient::new(second.addresses[0]);
    for _ in 0..5 {
        assert_eq!(client.get("/", &[("x-user", "bob")]).await.status, 200);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        metric(
            &second.render_metrics(),
            r#"tollgate_concurrency_in_use{limit="exports"}"#
        ),
        2.0
    );
}

/// Ann's key as the store spells it: the keyed hash of her header.
fn ann_key() -> String {
    let hasher = tollgate::key::KeyHasher::from_secret(b"test-secret-0123456789");
    let mut text = String::new();
    tollgate::limit::KeyPart::Digest(hasher.digest(b"ann")).push_to(&mut text);
    text
}

/// Delays at Redis's real clock: the rates are slow enough that a refill during the test
/// changes nothing asserted (the margins are seconds, not milliseconds).
fn delay_policy(redis: &RedisServer) -> String {
    store(redis)
        + r#"
# A token every 2 s, up to 4 s of waiting: two tokens of debt.
[limits.smooth]
key = { header = "x-user" }
capacity = 2
rate = "30/min"
on_limit = "delay"
max_delay = "4s"

# A token a minute, up to a minute of waiting: one token of debt.
[limits.patient]
key = { header = "x-user" }
capacity = 2
rate = "1/min"
on_limit = "delay"
max_delay = "60s"

[[routes]]
name = "patient"
path_prefix = "/patient"
upstream = "app"
limits = ["patient"]

[[routes]]
name = "api"
path_prefix = "/"
upstream = "app"
limits = ["smooth"]
"#
}

const DELAYED: &str = r#"tollgate_delayed_total{limit="smooth",route="api"}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_book_one_debt_and_forward_a_burst_in_booking_order() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let text = delay_policy(&redis);
    let (one, two) = (
        start_gateway(&text, upstream.address).await,
        start_gateway(&text, upstream.address).await,
    );
    let (first, second) = (
        HttpClient::new(one.addresses[0]),
        HttpClient::new(two.addresses[0]),
    );
    let ann = [("x-user", "ann")];
    assert_eq!(first.get("/", &ann).await.status, 200);
    assert_eq!(second.get("/", &ann).await.status, 200);

    // A burst of twice the capacity: the third books on the first replica (2 s), the fourth
    // on the second, behind the first's debt (4 s). Both go upstream, in that order.
    let finished = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let held = |client: HttpClient, finished: std::sync::Arc<std::sync::atomic::AtomicUsize>| async move {
        let reply = client.get("/", &[("x-user", "ann")]).await;
        let order = finished.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        (reply.status.as_u16(), order)
    };
    let third = tokio::spawn(held(first.clone(), finished.clone()));
    eventually("the first replica holds the third", || {
        metric(&one.render_metrics(), DELAYED) == 1.0
    })
    .await;
    let fourth = tokio::spawn(held(second.clone(), finished.clone()));
    eventually("the second replica holds the fourth", || {
        metric(&two.render_metrics(), DELAYED) == 1.0
    })
    .await;
    // The debt is booked up: a fifth would wait 6 s, beyond max_delay, on either replica
    // (until the debt has shrunk by a token, 2 s from the fourth's booking).
    let refused = first.get("/", &ann).await;
    assert_eq!(refused.status, 429, "beyond max_delay, refused");
    assert_eq!(
        (third.await.unwrap(), fourth.await.unwrap()),
        ((200, 0), (200, 1)),
        "none of the burst is lost, and it goes upstream in booking order"
    );
    assert_eq!(
        upstream.hits.load(std::sync::atomic::Ordering::SeqCst),
        4,
        "the refused one never went upstream"
    );
    let held_for = metric(&two.render_metrics(), "tollgate_delay_seconds_sum");
    assert!(
        (2.0..=4.0).contains(&held_for),
        "the fourth was held for the debt of both replicas: {held_for} s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_burst_of_twice_the_capacity_across_replicas_loses_nothing() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    // Ten tokens, ten a second, up to a second of waiting: ten tokens of debt.
    let text = delay_policy(&redis)
        .replace(
            "capacity = 2\nrate = \"30/min\"",
            "capacity = 10\nrate = \"10/s\"",
        )
        .replace("max_delay = \"4s\"", "max_delay = \"1s\"");
    let replicas = [
        start_gateway(&text, upstream.address).await,
        start_gateway(&text, upstream.address).await,
    ];
    let burst: Vec<_> = (0..20)
        .map(|index| {
            let client = HttpClient::new(replicas[index % 2].addresses[0]);
            tokio::spawn(async move { client.get("/", &[("x-user", "ann")]).await.status })
        })
        .collect();
    let mut admitted = 0;
    for request in burst {
        admitted += u32::from(request.await.unwrap() == 200);
    }
    assert_eq!(
        admitted, 20,
        "a burst within max_delay is delayed, not refused"
    );
    // Time passing while the burst arrives only refills: at most the second ten were held.
    let delayed: f64 = replicas
        .iter()
        .map(|gateway| metric(&gateway.render_metrics(), DELAYED))
        .sum();
    assert!(delayed <= 10.0, "{delayed} held");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_leaves_while_held_gives_its_tokens_back_in_redis() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let gateway = start_gateway(&delay_policy(&redis), upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let ann = [("x-user", "ann")];
    for _ in 0..2 {
        assert_eq!(client.get("/patient", &ann).await.status, 200);
    }
    // The third books its token (a minute's wait), and its client goes away.
    let mut leaving = tokio::net::TcpStream::connect(gateway.addresses[0])
        .await
        .unwrap();
    tokio::io::AsyncWriteExt::write_all(
        &mut leaving,
        b"GET /patient HTTP/1.1\r\nHost: a\r\nx-user: ann\r\n\r\n",
    )
    .await
    .unwrap();
    let delayed = r#"tollgate_delayed_total{limit="patient",route="patient"}"#;
    eventually("the third is held", || {
        metric(&gateway.render_metrics(), delayed) == 1.0
    })
    .await;
    let admin = HttpClient::new(gateway.admin_address);
    let tokens = || async {
        admin.get("/limits/patient?key=ann", &[]).await.json()["tokens"]
            .as_f64()
            .unwrap()
    };
    let booked = tokens().await;
    assert!(booked < -0.9, "the third booked a token: {booked}");
    assert_eq!(
        metric(&gateway.render_metrics(), "tollgate_inflight_requests"),
        1.0,
        "a held request is in flight"
    );
    drop(leaving);
    // Given back, the bucket is at zero again; refill alone would take half a minute to
    // bring it to -0.5.
    let mut given_back = booked;
    for _ in 0..100 {
        given_back = tokens().await;
        if given_back > -0.5 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        (-0.1..0.5).contains(&given_back),
        "the held request's token was not given back: {given_back}"
    );
    eventually("the held request is no longer in flight", || {
        metric(&gateway.render_metrics(), "tollgate_inflight_requests") == 0.0
    })
    .await;
    assert_eq!(
        upstream.hits.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "the request whose client left never went upstream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_booking_and_a_lease_are_given_back_when_a_cluster_slot_refuses_the_request() {
    let cluster = common::redis_server::RedisCluster::start();
    let upstream = start_upstream().await;
    let slot = |name: &str| tollgate::limit::redis::slot(format!("tg:{name}:global").as_bytes());
    let names = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"];
    let delaying = names[0];
    let refusing = *names
        .iter()
        .find(|name| slot(name) != slot(delaying))
        .unwrap();
    let slots_key = |name: &str| format!("tg:{name}:global:slots");
    let cluster_slot = |key: &str| tollgate::limit::redis::slot(key.as_bytes());
    let leasing = *names
        .iter()
        .find(|name| cluster_slot(&slots_key(name)) != slot(refusing))
        .unwrap();
    let text = format!(
        r#"
[store]
backend = "redis"
url = "{url}"
timeout = "2s"
prefix = "tg:"
hash_key = "test-secret-0123456789"

[upstreams.app]
url = "http://{{upstream}}"

[limits.{delaying}]
key = "global"
capacity = 1
rate = "1/min"
on_limit = "delay"
max_delay = "60s"

[limits.{refusing}]
key = "global"
capacity = 1
rate = "1/h"

[limits.{leasing}_slots]
key = "global"
concurrency = 2

[[routes]]
name = "both"
path_prefix = "/"
upstream = "app"
limits = ["{delaying}", "{refusing}", "{leasing}_slots"]
"#,
        url = cluster.url()
    );
    let gateway = start_gateway(&text, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    assert_eq!(client.get("/", &[]).await.status, 200);
    // The delaying limit's slot books a token; the other slot refuses: the booking goes back.
    assert_eq!(client.get("/", &[]).await.status, 429);
    let admin = HttpClient::new(gateway.admin_address);
    let tokens = admin.get(&format!("/limits/{delaying}"), &[]).await.json()["tokens"]
        .as_f64()
        .unwrap();
    assert!(
        (0.0..0.5).contains(&tokens),
        "the refused request's booking was given back: {tokens}"
    );
    // So was the lease its concurrency limit's slot took (the first request's goes back
    // when its response ends); left behind, it would stay a minute.
    let key = slots_key(&format!("{leasing}_slots"));
    let node = &cluster.nodes[cluster.master_of(cluster_slot(&key))];
    eventually("every lease is given back", || {
        node.cli(&["ZCARD", &key]).trim() == "0"
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slots_and_tokens_are_taken_all_or_none_in_one_call() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let text = store(&redis)
        + r#"
[limits.exports]
key = { header = "x-user" }
concurrency = 1

[limits.hourly]
key = { header = "x-user" }
capacity = 2
rate = "1/h"

[[routes]]
name = "exports"
path_prefix = "/"
upstream = "app"
limits = ["exports", "hourly"]
"#;
    let gateway = start_gateway(&text, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let admin = HttpClient::new(gateway.admin_address);
    let tokens = |user: &'static str| {
        let admin = admin.clone();
        async move {
            admin
                .get(&format!("/limits/hourly?key={user}"), &[])
                .await
                .json()["tokens"]
                .as_f64()
                .unwrap()
        }
    };
    let slots = format!("tollgate:exports:{}:slots", ann_key());

    // Ann's one slot is held: her second export is refused by it, and charged no token.
    let (status, held) = export(gateway.addresses[0], "ann").await;
    assert_eq!(status, 200);
    let (status, _) = export(gateway.addresses[0], "ann").await;
    assert_eq!(status, 429, "no slot free");
    let left = tokens("ann").await;
    assert!(
        (1.0..1.01).contains(&left),
        "the refused export was charged nothing: {left} left"
    );
    drop(held);
    eventually("ann's slot is given back", || {
        redis.cli(&["ZCARD", &slots]).trim() == "0"
    })
    .await;
    // Her last token goes; then the bucket refuses, and takes no slot.
    assert_eq!(client.get("/", &[("x-user", "ann")]).await.status, 200);
    eventually("ann's slot is given back", || {
        redis.cli(&["ZCARD", &slots]).trim() == "0"
    })
    .await;
    let before = (redis.calls("evalsha"), redis.calls("zadd"));
    assert_eq!(client.get("/", &[("x-user", "ann")]).await.status, 429);
    assert_eq!(
        (
            redis.calls("evalsha") - before.0,
            redis.calls("zadd") - before.1
        ),
        (1, 0),
        "refused by the bucket in the one call, no lease taken"
    );
    assert_eq!(redis.cli(&["ZCARD", &slots]).trim(), "0");

    // Calls per admitted request: the decision (tokens and lease together) and the give-back.
    let before: Vec<u64> = ["evalsha", "eval", "zrem"]
        .iter()
        .map(|command| redis.calls(command))
        .collect();
    for index in 0..20 {
        let user = format!("user{index}");
        assert_eq!(client.get("/", &[("x-user", &user)]).await.status, 200);
    }
    eventually("every lease is given back", || {
        redis.calls("zrem") - before[2] == 20
    })
    .await;
    assert_eq!(
        (
            redis.calls("evalsha") - before[0],
            redis.calls("eval") - before[1]
        ),
        (20, 0),
        "one script call per request takes both its slot and its token"
    );
}
