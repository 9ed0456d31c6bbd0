//! Verified identity over real HTTP: limits keyed by a JWT claim, tokens refused for every
//! reason, tiers from a claim or a trusted header, and keys rotated by a reload.

use serde_json::json;

use super::HTTP1;
use crate::common::tokens::{self, SigningKey};
use crate::common::*;
use tollgate::config::Policy;
use tollgate::{Options, Tollgate};

const POLICY: &str = r#"
[server]
listen = ["127.0.0.1:0"]
ratelimit_headers = "both"

[auth.jwt]
jwks_file = "{jwks}"
issuer = "https://auth.example.com/"
audience = "api"
leeway = "5s"

[upstreams.app]
url = "http://{upstream}"

[limits.per_user]
key = { jwt_claim = "sub" }
missing = "reject"
capacity = 3
rate = "1/h"
tier = { jwt_claim = "plan" }

[limits.per_user.tiers]
pro = { capacity = 6, rate = "1/h" }
internal = "exempt"

[limits.per_org]
key = { jwt_claim = "org.id" }
capacity = 2
rate = "1/h"

[limits.per_plan_header]
key = { header = "x-user" }
capacity = 2
rate = "1/h"
tier = { header = "x-plan" }
trust_header = true

[limits.per_plan_header.tiers]
pro = { capacity = 4 }

[[routes]]
name = "api"
path_prefix = "/api/"
upstream = "app"
limits = ["per_user"]

[[routes]]
name = "reports"
path_prefix = "/reports/"
upstream = "app"
limits = ["per_org"]

[[routes]]
name = "partner"
path_prefix = "/partner/"
upstream = "app"
limits = ["per_plan_header"]

[[routes]]
name = "default"
path_prefix = "/"
upstream = "app"
"#;

/// A gateway whose key set, in a file of its own, holds `keys`; the policy file beside it.
struct Identity {
    gateway: Tollgate,
    client: HttpClient,
    jwks: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

async fn start(keys: &[&SigningKey], upstream: std::net::SocketAddr) -> Identity {
    let dir = tempfile::tempdir().expect("temp dir");
    let jwks = dir.path().join("jwks.json");
    std::fs::write(&jwks, tokens::key_set(keys)).expect("write jwks");
    let text = POLICY
        .replace("{jwks}", &jwks.display().to_string())
        .replace("{upstream}", &upstream.to_string())
        .replacen("[server]\n", &format!("[server]\nhttp1 = \"{HTTP1}\"\n"), 1);
    let text = format!("[admin]\nlisten = \"127.0.0.1:0\"\n{text}");
    let path = dir.path().join("tollgate.toml");
    std::fs::write(&path, &text).expect("write policy");
    let policy = Policy::load(&path).unwrap_or_else(|errors| panic!("{errors}"));
    let gateway = Tollgate::start(
        policy,
        Options {
            clock: None,
            config_path: Some(path),
        },
    )
    .await
    .expect("start gateway");
    let client = HttpClient::new(gateway.addresses[0]);
    Identity {
        gateway,
        client,
        jwks,
        _dir: dir,
    }
}

fn claims(sub: &str, extra: serde_json::Value) -> serde_json::Value {
    let mut extra = extra;
    for (name, value) in [("iss", "https://auth.example.com/"), ("aud", "api")] {
        if extra.get(name).is_none() {
            extra[name] = json!(value);
        }
    }
    tokens::claims(sub, extra)
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

#[tokio::test]
async fn tokens_of_each_algorithm_key_their_own_bucket_and_reach_the_upstream_unchanged() {
    let upstream = start_upstream().await;
    let (rsa, ec, ed) = (
        SigningKey::rsa(),
        SigningKey::ec("ec-1"),
        SigningKey::ed25519("ed-1"),
    );
    let identity = start(&[&rsa, &ec, &ed], upstream.address).await;
    for (user, key) in [("alice", &rsa), ("bob", &ec), ("carol", &ed)] {
        let authorization = bearer(&key.sign(&claims(user, json!({}))));
        for remaining in (0..3).rev() {
            let reply = identity
                .client
                .get("/api/orders", &[("authorization", &authorization)])
                .await;
            assert_eq!(reply.status, 200, "{user} with {:?}", key.algorithm);
            assert_eq!(
                reply.header("ratelimit-remaining"),
                Some(remaining.to_string().as_str())
            );
            let seen = reply.json()["headers"]["authorization"].clone();
            assert_eq!(seen, json!(authorization), "forwarded unchanged");
        }
        let refused = identity
            .client
            .get("/api/orders", &[("authorization", &authorization)])
            .await;
        assert_eq!(refused.status, 429, "{user}'s own bucket is empty");
    }
    // A fresh token of the same subject is the same bucket.
    let again = rsa.sign(&claims("alice", json!({ "jti": "another" })));
    let reply = identity
        .client
        .get("/api/orders", &[("authorization", &bearer(&again))])
        .await;
    assert_eq!(reply.status, 429);
}

#[tokio::test]
async fn a_token_failing_any_check_is_401_even_where_a_missing_key_is_skipped() {
    let upstream = start_upstream().await;
    let rsa = SigningKey::rsa();
    let identity = start(&[&rsa], upstream.address).await;
    let org = json!({ "org": { "id": 7 } });
    let good = rsa.sign(&claims("alice", org.clone()));
    let mut tampered = good.clone();
    tampered.replace_range(tampered.len() - 6.., "AAAAAA");
    let forged_payload = {
        let parts: Vec<&str> = good.split('.').collect();
        let other: Vec<String> = rsa
            .sign(&claims("mallory", json!({ "org": { "id": 8 } })))
            .split('.')
            .map(str::to_owned)
            .collect();
        format!("{}.{}.{}", parts[0], other[1], parts[2])
    };
    let confused = {
        // HS256 "signed" with the RSA public key, which everyone has.
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::HS256);
        header.kid = Some("rsa-1".to_owned());
        let secret = jsonwebtoken::EncodingKey::from_secret(tokens::RSA_PUBLIC_PEM.as_bytes());
        jsonwebtoken::encode(&header, &claims("mallory", org.clone()), &secret).unwrap()
    };
    let unknown_key = {
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
        header.kid = Some("rsa-9".to_owned());
        let key = jsonwebtoken::EncodingKey::from_rsa_pem(tokens::RSA_PRIVATE.as_bytes()).unwrap();
        jsonwebtoken::encode(&header, &claims("mallory", org.clone()), &key).unwrap()
    };
    let critical = {
        // RFC 7515 §4.1.11: an extension the verifier does not understand, marked critical.
        let header = json!({ "alg": "RS256", "kid": "rsa-1", "crit": ["exp-ext"], "exp-ext": 1 });
        let b64 = |bytes: &[u8]| {
            use base64::Engine as _;
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
        };
        let message = format!(
            "{}.{}",
            b64(header.to_string().as_bytes()),
            b64(claims("mallory", org.clone()).to_string().as_bytes())
        );
        let key = jsonwebtoken::EncodingKey::from_rsa_pem(tokens::RSA_PRIVATE.as_bytes()).unwrap();
        let signature =
            jsonwebtoken::crypto::sign(message.as_bytes(), &key, jsonwebtoken::Algorithm::RS256)
                .unwrap();
        format!("{message}.{signature}")
    };
    let now = tokens::now();
    let refusals = [
        (critical, "critical_extension"),
        (tampered, "signature"),
        (forged_payload, "signature"),
        (
            tokens::unsigned(&claims("mallory", org.clone())),
            "algorithm",
        ),
        (confused, "algorithm"),
        (unknown_key, "unknown_key"),
        ("not.a.token".to_owned(), "malformed"),
        (
            rsa.sign(&claims("a", json!({ "exp": now - 60 }))),
            "expired",
        ),
        (
            rsa.sign(&claims("a", json!({ "nbf": now + 600 }))),
            "not_yet_valid",
        ),
        (
            rsa.sign(&claims("a", json!({ "iss": "https://evil.example/" }))),
            "issuer",
        ),
        (
            rsa.sign(&claims("a", json!({ "aud": "billing" }))),
            "audience",
        ),
    ];
    for (token, reason) in &refusals {
        let reply = identity
            .client
            .get("/reports/q3", &[("authorization", &bearer(token))])
            .await;
        assert_eq!(reply.status, 401, "{reason}");
        assert_eq!(
            reply.header("www-authenticate"),
            Some(r#"Bearer error="invalid_token""#),
            "{reason}"
        );
        assert_eq!(reply.json(), json!({ "error": "invalid_token" }));
    }
    assert_eq!(upstream.hits.load(std::sync::atomic::Ordering::SeqCst), 0);
    let scrape = identity.gateway.render_metrics();
    for reason in [
        "critical_extension",
        "malformed",
        "unknown_key",
        "expired",
        "not_yet_valid",
        "issuer",
        "audience",
    ] {
        let series = format!("tollgate_jwt_rejected_total{{reason=\"{reason}\"}}");
        assert_eq!(metric(&scrape, &series), 1.0, "{series}");
    }
    for reason in ["signature", "algorithm"] {
        let series = format!("tollgate_jwt_rejected_total{{reason=\"{reason}\"}}");
        assert_eq!(metric(&scrape, &series), 2.0, "{series}");
    }
    // No token: the skip route admits without the limit, the reject route asks for one.
    assert_eq!(identity.client.get("/reports/q3", &[]).await.status, 200);
    let unauthenticated = identity.client.get("/api/orders", &[]).await;
    assert_eq!(unauthenticated.status, 401);
    assert_eq!(unauthenticated.header("www-authenticate"), Some("Bearer"));
    // Another scheme is not a token; routes that read no claim never judge one.
    let basic = [("authorization", "Basic dXNlcjpwYXNz")];
    assert_eq!(identity.client.get("/reports/q3", &basic).await.status, 200);
    let forged = [("authorization", "Bearer not.a.token")];
    assert_eq!(identity.client.get("/elsewhere", &forged).await.status, 200);
    // Two Authorization fields where a limit reads the token: the upstream might read the
    // other one, so neither is trusted (400); where no limit reads one, they pass.
    let two = [
        ("authorization", bearer(&good)),
        (
            "authorization",
            bearer(&rsa.sign(&claims("mallory", json!({})))),
        ),
    ];
    let two: Vec<(&str, &str)> = two
        .iter()
        .map(|(name, value)| (*name, value.as_str()))
        .collect();
    assert_eq!(identity.client.get("/reports/q3", &two).await.status, 400);
    assert_eq!(identity.client.get("/elsewhere", &two).await.status, 200);
    // The good token keys org 7's bucket of two.
    for expected in [200, 200, 429] {
        let reply = identity
            .client
            .get("/reports/q3", &[("authorization", &bearer(&good))])
            .await;
        assert_eq!(reply.status, expected);
    }
}

#[tokio::test]
async fn tiers_from_a_claim_set_the_numbers_and_a_change_of_tier_keeps_the_tokens() {
    let upstream = start_upstream().await;
    let ec = SigningKey::ec("ec-1");
    let identity = start(&[&ec], upstream.address).await;
    let get = |token: String| {
        let client = &identity.client;
        async move {
            client
                .get("/api/orders", &[("authorization", &bearer(&token))])
                .await
        }
    };
    let pro = ec.sign(&claims("dora", json!({ "plan": "pro" })));
    for remaining in (0..6).rev() {
        let reply = get(pro.clone()).await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.header("ratelimit-limit"), Some("6"));
        assert_eq!(
            reply.header("ratelimit-remaining"),
            Some(remaining.to_string().as_str())
        );
        let policy = reply.header("ratelimit-policy").unwrap_or_default();
        assert!(policy.contains("q=6"), "{policy}");
    }
    assert_eq!(get(pro).await.status, 429);
    // An unknown plan is the limit's own numbers.
    let unknown = get(ec.sign(&claims("erin", json!({ "plan": "gold" })))).await;
    assert_eq!(unknown.header("ratelimit-limit"), Some("3"));
    // Internal callers are exempt: no bucket, no limit headers.
    let internal = ec.sign(&claims("ops", json!({ "plan": "internal" })));
    for _ in 0..10 {
        let reply = get(internal.clone()).await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.header("ratelimit-limit"), None);
    }
    // Free fred spends 2 of 3, then upgrades: his bucket keeps its 1 token (not a fresh 6).
    let free = ec.sign(&claims("fred", json!({})));
    assert_eq!(get(free.clone()).await.status, 200);
    assert_eq!(get(free).await.status, 200);
    let upgraded = ec.sign(&claims("fred", json!({ "plan": "pro" })));
    let reply = get(upgraded.clone()).await;
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("ratelimit-limit"), Some("6"));
    assert_eq!(reply.header("ratelimit-remaining"), Some("0"));
    assert_eq!(get(upgraded).await.status, 429);
    // Pro gina spends 1 of 6, then downgrades: capped at the free capacity of 3.
    assert_eq!(
        get(ec.sign(&claims("gina", json!({ "plan": "pro" }))))
            .await
            .header("ratelimit-remaining"),
        Some("5")
    );
    let downgraded = get(ec.sign(&claims("gina", json!({})))).await;
    assert_eq!(downgraded.header("ratelimit-remaining"), Some("2"));
}

#[tokio::test]
async fn a_tier_from_a_trusted_header_sets_the_numbers() {
    let upstream = start_upstream().await;
    let identity = start(&[&SigningKey::rsa()], upstream.address).await;
    let send = |plan: Option<&'static str>| {
        let client = &identity.client;
        async move {
            let mut headers = vec![("x-user", "u1")];
            headers.extend(plan.map(|plan| ("x-plan", plan)));
            client.get("/partner/feed", &headers).await
        }
    };
    let reply = send(Some("pro")).await;
    assert_eq!(reply.header("ratelimit-limit"), Some("4"));
    assert_eq!(reply.header("ratelimit-remaining"), Some("3"));
    let reply = send(None).await;
    assert_eq!(reply.header("ratelimit-limit"), Some("2"));
    assert_eq!(
        reply.header("ratelimit-remaining"),
        Some("1"),
        "capped at 2"
    );
}

#[tokio::test]
async fn a_reload_reads_the_key_set_again() {
    let upstream = start_upstream().await;
    let (old, new) = (SigningKey::ec("2026-11"), SigningKey::ec("2026-12"));
    let identity = start(&[&old], upstream.address).await;
    let (old_token, new_token) = (
        old.sign(&claims("hana", json!({}))),
        new.sign(&claims("hana", json!({}))),
    );
    let status = |token: &str| {
        let client = &identity.client;
        let authorization = bearer(token);
        async move {
            client
                .get("/api/orders", &[("authorization", &authorization)])
                .await
                .status
        }
    };
    assert_eq!(status(&old_token).await, 200);
    assert_eq!(status(&new_token).await, 401, "not yet published");
    std::fs::write(&identity.jwks, tokens::key_set(&[&new])).expect("rotate");
    identity.gateway.reload_from_file().expect("reload");
    assert_eq!(status(&new_token).await, 200);
    assert_eq!(
        status(&old_token).await,
        401,
        "a retired key verifies nothing, even a token verified before"
    );
    let scrape = identity.gateway.render_metrics();
    assert_eq!(
        metric(
            &scrape,
            r#"tollgate_jwt_rejected_total{reason="unknown_key"}"#
        ),
        2.0
    );
}
