//! The admin API over real HTTP: the compiled limits, one key's state, a reset that unlocks a
//! locked-out account (on one replica's memory, and for every replica through Redis), and the
//! bearer token that guards it.

mod common;

use std::sync::Arc;

use common::redis_server::RedisServer;
use common::*;
use serde_json::json;

const POLICY: &str = r#"
[admin]
token_env = "TOLLGATE_TEST_ADMIN_TOKEN"

[upstreams.app]
url = "http://{upstream}"

[limits.per_account]
key = { json_field = "email" }
normalize = "email"
capacity = 3
rate = "1/h"

[limits.per_network]
key = "client_network"
capacity = 100
rate = "1/h"
ipv4_prefix = 24

[[routes]]
name = "login"
path = "/login"
upstream = "app"
limits = ["per_account", "per_network"]
"#;

const TOKEN: &str = "admin-token-0123456789";

fn with_token() -> [(&'static str, String); 1] {
    [("authorization", format!("Bearer {TOKEN}"))]
}

fn bearer() -> String {
    format!("Bearer {TOKEN}")
}

async fn login(client: &HttpClient, email: &str) -> u16 {
    client
        .post(
            "/login",
            &[("content-type", "application/json")],
            &format!(r#"{{"email":"{email}"}}"#),
        )
        .await
        .status
        .as_u16()
}

fn policy_with(store: &str) -> String {
    std::env::set_var("TOLLGATE_TEST_ADMIN_TOKEN", TOKEN);
    format!("{store}{POLICY}")
}

#[tokio::test]
async fn a_locked_out_account_is_looked_up_and_reset() {
    let upstream = start_upstream().await;
    let gateway = start_gateway(&policy_with(""), upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let admin = HttpClient::new(gateway.admin_address);
    let authorization = bearer();
    let auth = [("authorization", authorization.as_str())];
    for _ in 0..3 {
        assert_eq!(login(&client, "alice@example.com").await, 200);
    }
    assert_eq!(login(&client, "alice@example.com").await, 429);

    let listed = admin.get("/limits", &auth).await;
    assert_eq!(listed.status, 200);
    let limits = listed.json()["limits"].clone();
    assert_eq!(limits[0]["name"], "per_account");
    assert_eq!(limits[0]["kind"], "bucket");
    assert_eq!(limits[0]["capacity"], 3.0);
    assert!((limits[0]["rate_per_second"].as_f64().unwrap() - 1.0 / 3600.0).abs() < 1e-12);

    // The value as the request carried it, normalized as the limit says.
    let state = admin
        .get("/limits/per_account?key=%20Alice@Example.COM", &auth)
        .await;
    assert_eq!(state.status, 200);
    let state = state.json();
    assert_eq!(
        (state["limit"].clone(), state["capacity"].clone()),
        (json!("per_account"), json!(3.0))
    );
    assert!(state["tokens"].as_f64().unwrap() < 0.01, "{state}");
    assert_eq!(state["penalty"], json!(null));
    let never_seen = admin
        .get("/limits/per_account?key=bob@example.com", &auth)
        .await;
    assert_eq!(
        never_seen.json()["tokens"],
        3.0,
        "a key never seen reads as full"
    );
    // An address is masked as the limit masks it: 127.0.0.x is one /24, which the three
    // admitted requests were charged to (the refused one charged nothing).
    let network = admin
        .get("/limits/per_network?key=127.0.0.99", &auth)
        .await
        .json();
    assert!(
        (network["tokens"].as_f64().unwrap() - 97.0).abs() < 0.01,
        "{network}"
    );

    let reset = admin
        .send(
            "DELETE",
            "/limits/per_account?key=alice@example.com",
            &auth,
            Default::default(),
        )
        .await;
    assert_eq!(reset.status, 204);
    assert_eq!(login(&client, "alice@example.com").await, 200, "unlocked");
    let state = admin
        .get("/limits/per_account?key=alice@example.com", &auth)
        .await
        .json();
    assert!(
        (state["tokens"].as_f64().unwrap() - 2.0).abs() < 0.01,
        "{state}"
    );

    assert_eq!(admin.get("/limits/nope?key=x", &auth).await.status, 404);
    assert_eq!(admin.get("/limits/per_account", &auth).await.status, 400);
    assert_eq!(
        admin
            .get("/limits/per_network?key=not-an-address", &auth)
            .await
            .status,
        400
    );
}

#[tokio::test]
async fn the_token_guards_limits_and_leaves_metrics_and_health_open() {
    let upstream = start_upstream().await;
    let gateway = start_gateway(&policy_with(""), upstream.address).await;
    let admin = HttpClient::new(gateway.admin_address);
    for headers in [
        vec![],
        vec![("authorization", "Bearer wrong-token-0123456789")],
        vec![("authorization", TOKEN)],
    ] {
        let reply = admin.get("/limits", &headers).await;
        assert_eq!(reply.status, 401, "{headers:?}");
        assert_eq!(reply.header("www-authenticate"), Some("Bearer"));
        let reset = admin
            .send(
                "DELETE",
                "/limits/per_account?key=a@b.c",
                &headers,
                Default::default(),
            )
            .await;
        assert_eq!(reset.status, 401);
    }
    let token = with_token();
    let headers: Vec<(&str, &str)> = token.iter().map(|(n, v)| (*n, v.as_str())).collect();
    assert_eq!(admin.get("/limits", &headers).await.status, 200);
    assert_eq!(admin.get("/metrics", &[]).await.status, 200);
    assert_eq!(admin.get("/healthz", &[]).await.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_a_reset_reaches_every_replica_and_their_deny_caches() {
    let redis = RedisServer::start();
    let upstream = start_upstream().await;
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\nhash_key = \"test-secret-0123456789\"\ntimeout = \"2s\"\n",
        redis.url()
    );
    let policy = policy_with(&store);
    let first = Arc::new(start_gateway(&policy, upstream.address).await);
    let second = Arc::new(start_gateway(&policy, upstream.address).await);
    eventually("the second replica hears resets", || {
        second.redis_store().unwrap().hears_resets()
    })
    .await;
    let (one, two) = (
        HttpClient::new(first.addresses[0]),
        HttpClient::new(second.addresses[0]),
    );
    for _ in 0..3 {
        assert_eq!(login(&one, "carol@example.com").await, 200);
    }
    // The second replica learns from Redis that the bucket is empty and remembers it.
    assert_eq!(login(&two, "carol@example.com").await, 429);
    let calls = redis.calls("evalsha");
    assert_eq!(login(&two, "carol@example.com").await, 429);
    assert_eq!(redis.calls("evalsha"), calls, "refused from the deny cache");

    let authorization = bearer();
    let auth = [("authorization", authorization.as_str())];
    let seen = HttpClient::new(second.admin_address)
        .get("/limits/per_account?key=carol@example.com", &auth)
        .await
        .json();
    assert!(seen["tokens"].as_f64().unwrap() < 0.01, "{seen}");
    let reset = HttpClient::new(first.admin_address)
        .send(
            "DELETE",
            "/limits/per_account?key=carol@example.com",
            &auth,
            Default::default(),
        )
        .await;
    assert_eq!(reset.status, 204);
    // The reset reaches the second replica's deny cache through Redis, within moments.
    let mut admitted = false;
    for _ in 0..100 {
        if login(&two, "carol@example.com").await == 200 {
            admitted = true;
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(admitted, "the second replica still refuses a reset key");
    let state = HttpClient::new(first.admin_address)
        .get("/limits/per_account?key=carol@example.com", &auth)
        .await
        .json();
    assert!(
        (state["tokens"].as_f64().unwrap() - 2.0).abs() < 0.01,
        "{state}"
    );
}
