//! Bans over real HTTP (`[limits.NAME.ban]`): a key refused often is refused entirely for a
//! while, with the ban's rest as `Retry-After` and `ban` in the body, whatever its bucket
//! holds; other keys are untouched; the admin API shows and lifts it; the metrics count it;
//! in shadow mode it is counted, never enforced.

mod common;

use common::bans::{login, POLICY};
use common::*;

#[tokio::test]
async fn a_key_refused_twice_is_banned_and_the_admin_lifts_it() {
    let upstream = start_upstream().await;
    let gateway = start_gateway(POLICY, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    assert_eq!(login(&client, "alice").await.status, 200);
    let refused = login(&client, "alice").await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.json().get("ban"), None, "a plain refusal");
    assert_eq!(login(&client, "alice").await.status, 429);
    // The second refusal began the ban: now the wait is the ban's, not the bucket's hour.
    let banned = login(&client, "alice").await;
    assert_eq!(banned.status, 429);
    assert_eq!(banned.json()["ban"], true, "{:?}", banned.body);
    let retry_after: u64 = banned.header("retry-after").unwrap().parse().unwrap();
    assert!((895..=900).contains(&retry_after), "{retry_after}");
    assert_eq!(login(&client, "bob").await.status, 200);

    let admin = HttpClient::new(gateway.admin_address);
    let state = admin.get("/limits/per_account?key=alice", &[]).await.json();
    let until = state["banned_until_unix"]
        .as_f64()
        .expect("banned_until_unix");
    let now = tollgate::limit::clock::unix_seconds() as f64;
    assert!((until - now - 900.0).abs() < 10.0, "{state}");
    let bob = admin.get("/limits/per_account?key=bob", &[]).await.json();
    assert_eq!(bob["banned_until_unix"], serde_json::Value::Null);
    let lifted = admin
        .send(
            "DELETE",
            "/limits/per_account?key=alice",
            &[],
            Default::default(),
        )
        .await;
    assert_eq!(lifted.status, 204);
    assert_eq!(login(&client, "alice").await.status, 200);

    let scrape = gateway.render_metrics();
    assert_eq!(
        metric(&scrape, r#"tollgate_bans_total{limit="per_account"}"#),
        1.0
    );
    assert_eq!(
        metric(
            &scrape,
            r#"tollgate_requests_total{outcome="banned",route="login"}"#
        ),
        1.0
    );
    assert_eq!(
        metric(
            &scrape,
            r#"tollgate_requests_total{outcome="limited",route="login"}"#
        ),
        2.0
    );
}

#[tokio::test]
async fn a_shadow_ban_is_counted_and_never_enforced() {
    let upstream = start_upstream().await;
    let gateway = start_gateway(POLICY, upstream.address).await;
    let client = HttpClient::new(gateway.addresses[0]);
    for _ in 0..4 {
        let reply = client.get("/watched", &[("x-account", "carol")]).await;
        assert_eq!(reply.status, 200);
    }
    let scrape = gateway.render_metrics();
    assert_eq!(metric(&scrape, r#"tollgate_bans_total{limit="peek"}"#), 1.0);
    assert!(
        !scrape.contains(r#"outcome="banned",route="watched""#),
        "{scrape}"
    );
}
