//! Bans shared through a real `redis-server` (and a Redis Cluster): refusals on any replica
//! count toward one ban, decided in the bucket's own script call; every replica refuses the
//! banned key, whatever its bucket holds; the admin API of any replica shows and lifts it;
//! concurrent refusals begin exactly one ban; a shadow ban is counted and never enforced.

mod common;

use common::bans::{assert_banned, login, POLICY};
use common::redis_server::{RedisCluster, RedisServer};
use common::*;
use tollgate::Tollgate;

fn policy(store_url: &str) -> String {
    format!(
        r#"
[store]
backend = "redis"
url = "{store_url}"
timeout = "2s"
prefix = "tg:"
hash_key = "test-secret-0123456789"
"#
    ) + POLICY
}

async fn hearing(gateway: &Tollgate) {
    eventually("the replica hears resets", || {
        gateway.redis_store().unwrap().hears_resets()
    })
    .await;
}

/// The store keys of `limit` in Redis: buckets, and the ban keys beside them.
fn keys_of(redis: &RedisServer, limit: &str) -> (Vec<String>, Vec<String>) {
    let keys = redis.cli(&["--scan", "--pattern", &format!("*tg:{limit}:*")]);
    keys.lines()
        .map(str::to_owned)
        .partition(|key| !key.ends_with("|ban"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_on_two_replicas_ban_the_key_on_both() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let text = policy(&redis.url());
    let first = start_gateway(&text, upstream.address).await;
    let second = start_gateway(&text, upstream.address).await;
    hearing(&first).await;
    hearing(&second).await;
    let (one, two) = (
        HttpClient::new(first.addresses[0]),
        HttpClient::new(second.addresses[0]),
    );
    assert_eq!(login(&one, "alice").await.status, 200);
    let refused = login(&one, "alice").await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.json().get("ban"), None, "a plain refusal");
    // The second refusal, on the other replica, is the ban's second.
    let began = login(&two, "alice").await;
    assert_eq!(began.status, 429);
    assert_banned(&login(&two, "alice").await);
    assert_banned(&login(&one, "alice").await);
    assert_eq!(login(&one, "bob").await.status, 200);
    assert_eq!(login(&two, "carol").await.status, 200);

    // The ban lives in its own key in the bucket's slot, kept as long as the ban.
    let (buckets, bans) = keys_of(&redis, "per_account");
    assert_eq!(bans.len(), 1, "{bans:?}");
    assert!(bans[0].starts_with("{tg:per_account:h:"), "{bans:?}");
    assert_eq!(buckets.len(), 3, "{buckets:?}");
    let ttl: i64 = redis.cli(&["PTTL", &bans[0]]).trim().parse().unwrap();
    assert!((880_000..=901_000).contains(&ttl), "{ttl}");

    // Whatever its bucket holds: a replica that has not met alice reads the ban from Redis
    // even once her bucket is gone (full).
    for bucket in &buckets {
        redis.cli(&["DEL", bucket]);
    }
    let third = start_gateway(&text, upstream.address).await;
    let three = HttpClient::new(third.addresses[0]);
    assert_banned(&login(&three, "alice").await);

    let admin = HttpClient::new(first.admin_address);
    let state = admin.get("/limits/per_account?key=alice", &[]).await.json();
    let until = state["banned_until_unix"]
        .as_f64()
        .expect("banned_until_unix");
    let now = tollgate::limit::clock::unix_seconds() as f64;
    assert!((until - now - 900.0).abs() < 20.0, "{state}");
    let bob = admin.get("/limits/per_account?key=bob", &[]).await.json();
    assert_eq!(bob["banned_until_unix"], serde_json::Value::Null, "{bob}");

    let counted = |gateway: &Tollgate, series: &str| metric(&gateway.render_metrics(), series);
    let bans = r#"tollgate_bans_total{limit="per_account"}"#;
    assert_eq!(counted(&first, bans) + counted(&second, bans), 1.0);
    let banned = r#"tollgate_requests_total{outcome="banned",route="login"}"#;
    assert_eq!(counted(&first, banned), 1.0);
    assert_eq!(counted(&second, banned), 1.0);

    // Lifted on one replica, lifted for all: the others' deny caches hear of it.
    let lifted = admin
        .send(
            "DELETE",
            "/limits/per_account?key=alice",
            &[],
            Default::default(),
        )
        .await;
    assert_eq!(lifted.status, 204);
    assert_eq!(keys_of(&redis, "per_account").1, Vec::<String>::new());
    let mut admitted = false;
    for _ in 0..250 {
        if login(&two, "alice").await.status == 200 {
            admitted = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(admitted, "the second replica still refuses a lifted ban");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_banned_key_costs_redis_nothing_more() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let gateway = start_gateway(&policy(&redis.url()), upstream.address).await;
    hearing(&gateway).await;
    let client = HttpClient::new(gateway.addresses[0]);
    assert_eq!(login(&client, "mallory").await.status, 200);
    // Each refusal toward the ban is counted in Redis, not refused from the deny cache.
    let calls = redis.calls("evalsha");
    assert_eq!(login(&client, "mallory").await.status, 429);
    assert_eq!(login(&client, "mallory").await.status, 429);
    assert_eq!(redis.calls("evalsha") - calls, 2);
    let calls = redis.calls("evalsha");
    for _ in 0..30 {
        assert_banned(&login(&client, "mallory").await);
    }
    assert_eq!(redis.calls("evalsha"), calls, "the ban refused locally");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_refusals_on_two_replicas_begin_one_ban() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let text = policy(&redis.url());
    let first = start_gateway(&text, upstream.address).await;
    let second = start_gateway(&text, upstream.address).await;
    let requests = (0..40).map(|index| {
        let address = [first.addresses[0], second.addresses[0]][index % 2];
        tokio::spawn(async move {
            HttpClient::new(address)
                .get("/login", &[("x-account", "botnet")])
                .await
                .status
        })
    });
    let statuses: Vec<_> = futures_util::future::join_all(requests)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(
        statuses
            .iter()
            .filter(|status| status.as_u16() == 200)
            .count(),
        1
    );
    assert_eq!(
        statuses
            .iter()
            .filter(|status| status.as_u16() == 429)
            .count(),
        39
    );
    let bans = r#"tollgate_bans_total{limit="per_account"}"#;
    let total = metric(&first.render_metrics(), bans) + metric(&second.render_metrics(), bans);
    assert_eq!(total, 1.0, "refusals during a ban begin none");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shadow_ban_through_redis_is_counted_and_never_enforced() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let gateway = start_gateway(&policy(&redis.url()), upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    for _ in 0..4 {
        let reply = client.get("/watched", &[("x-account", "dave")]).await;
        assert_eq!(reply.status, 200);
    }
    let scrape = gateway.render_metrics();
    assert_eq!(metric(&scrape, r#"tollgate_bans_total{limit="peek"}"#), 1.0);
    let admin = HttpClient::new(gateway.admin_address);
    let state = admin.get("/limits/peek?key=dave", &[]).await.json();
    assert!(state["banned_until_unix"].is_number(), "{state}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ban_on_a_cluster_is_decided_in_its_buckets_slot() {
    let cluster = RedisCluster::start();
    let upstream = start_upstream().await;
    let gateway = start_gateway(&policy(&cluster.url()), upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    for account in ["erin", "frank", "grace", "heidi"] {
        assert_eq!(login(&client, account).await.status, 200);
        assert_eq!(login(&client, account).await.status, 429);
        assert_eq!(login(&client, account).await.status, 429);
        assert_banned(&login(&client, account).await);
    }
    assert_eq!(
        metric(
            &gateway.render_metrics(),
            r#"tollgate_bans_total{limit="per_account"}"#
        ),
        4.0
    );
    let admin = HttpClient::new(gateway.admin_address);
    let state = admin.get("/limits/per_account?key=grace", &[]).await.json();
    assert!(state["banned_until_unix"].is_number(), "{state}");
}
