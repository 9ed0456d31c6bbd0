//! Limits whose numbers the request carries, over real HTTP: a verified claim's capacity and
//! rate, cut to `max`, the defaults for a token that carries none; a trusted header's; an
//! operator's override beating both; and a forged token never choosing its own numbers.

mod common;

use common::tokens::{claims, hs256};
use common::*;
use serde_json::json;

const SECRET: &[u8] = b"carried-numbers-secret-0123456789abcdef";

const POLICY: &str = r#"
[auth.jwt]
secret_env = "TOLLGATE_TEST_CARRIED_SECRET"

[upstreams.app]
url = "http://{upstream}"

[limits.per_org]
key = { jwt_claim = "org" }
capacity = { jwt_claim = "rl.capacity", default = 2, max = 5 }
rate = { jwt_claim = "rl.rate", default = "1/h", max = "10/s" }

[limits.per_tenant]
key = { header = "x-tenant" }
capacity = { header = "x-tenant-capacity", trust_header = true, default = 1, max = 3 }
rate = "1/h"

[[routes]]
name = "api"
path_prefix = "/api"
upstream = "app"
limits = ["per_org"]

[[routes]]
name = "tenants"
path_prefix = "/tenants"
upstream = "app"
limits = ["per_tenant"]
"#;

async fn statuses(
    client: &HttpClient,
    path: &str,
    headers: &[(&str, &str)],
    count: usize,
) -> Vec<u16> {
    let mut seen = Vec::new();
    for _ in 0..count {
        seen.push(client.get(path, headers).await.status.as_u16());
    }
    seen
}

fn bearer(org: &str, numbers: serde_json::Value) -> String {
    let mut claims = claims("someone", json!({ "org": org }));
    if !numbers.is_null() {
        claims["rl"] = numbers;
    }
    format!("Bearer {}", hs256(SECRET, &claims))
}

fn policy() -> &'static str {
    std::env::set_var(
        "TOLLGATE_TEST_CARRIED_SECRET",
        std::str::from_utf8(SECRET).unwrap(),
    );
    POLICY
}

#[tokio::test]
async fn a_claims_numbers_decide_its_bucket_up_to_max() {
    let upstream = start_upstream().await;
    let gateway = start_gateway(policy(), upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);

    let three = bearer("acme", json!({ "capacity": 3 }));
    assert_eq!(
        statuses(&client, "/api", &[("authorization", &three)], 4).await,
        [200, 200, 200, 429]
    );
    let plain = bearer("beta", serde_json::Value::Null);
    assert_eq!(
        statuses(&client, "/api", &[("authorization", &plain)], 3).await,
        [200, 200, 429],
        "no numbers: the defaults"
    );
    let greedy = bearer("gamma", json!({ "capacity": 1_000_000 }));
    assert_eq!(
        statuses(&client, "/api", &[("authorization", &greedy)], 6).await,
        [200, 200, 200, 200, 200, 429],
        "cut to max"
    );
    let refused = client.get("/api", &[("authorization", &three)]).await;
    assert_eq!(
        refused.header("ratelimit-limit"),
        Some("3"),
        "told its own numbers"
    );

    // A token signed with another secret never picks its numbers: 401.
    let forged = format!(
        "Bearer {}",
        hs256(
            b"another-secret-0123456789abcdef0123",
            &claims("x", json!({"org": "delta", "rl": {"capacity": 5}}))
        )
    );
    assert_eq!(
        client
            .get("/api", &[("authorization", &forged)])
            .await
            .status,
        401
    );
}

#[tokio::test]
async fn a_trusted_headers_number_and_an_override_that_beats_it() {
    let upstream = start_upstream().await;
    let gateway = start_gateway(policy(), upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    let two = [("x-tenant", "t1"), ("x-tenant-capacity", "2")];
    assert_eq!(
        statuses(&client, "/tenants", &two, 3).await,
        [200, 200, 429]
    );
    let many = [("x-tenant", "t2"), ("x-tenant-capacity", "99")];
    assert_eq!(
        statuses(&client, "/tenants", &many, 4).await,
        [200, 200, 200, 429]
    );

    let admin = HttpClient::new(gateway.admin_address);
    let put = admin
        .send(
            "PUT",
            "/overrides/per_tenant?key=t3",
            &[],
            bytes::Bytes::from(r#"{"capacity": 1}"#),
        )
        .await;
    assert_eq!(put.status, 200, "{:?}", put.body);
    let asks_three = [("x-tenant", "t3"), ("x-tenant-capacity", "3")];
    assert_eq!(
        statuses(&client, "/tenants", &asks_three, 2).await,
        [200, 429],
        "the override beats the header's number"
    );
}
