use base64::Engine as _;
use jsonwebtoken::{encode, EncodingKey, Header};
use serde_json::json;

use super::*;

const RSA_PRIVATE: &str = include_str!("../../tests/fixtures/jwt/rsa-private.pem");
const RSA_PUBLIC_PEM: &str = include_str!("../../tests/fixtures/jwt/rsa-public.pem");
const RSA_JWK: &str = include_str!("../../tests/fixtures/jwt/rsa-public.jwk.json");
const NOW: u64 = 1_800_000_000;

fn bearer() -> TokenSource {
    TokenSource::Header(http::header::AUTHORIZATION)
}

fn rsa_verifier(issuer: Option<&str>, audience: Option<&str>) -> JwtVerifier {
    JwtVerifier::with_key_set(
        bearer(),
        &format!("{{\"keys\":[{RSA_JWK}]}}"),
        issuer.map(str::to_owned),
        audience.map(str::to_owned),
        30,
    )
    .unwrap()
}

fn rsa_token(claims: serde_json::Value) -> String {
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some("rsa-1".to_owned());
    let key = EncodingKey::from_rsa_pem(RSA_PRIVATE.as_bytes()).unwrap();
    encode(&header, &claims, &key).unwrap()
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

#[test]
fn a_good_token_yields_its_claims_and_a_second_look_is_cached() {
    let verifier = rsa_verifier(Some("https://auth.example.com/"), Some("api"));
    let token = rsa_token(json!({
        "sub": "alice", "exp": NOW + 60, "nbf": NOW - 1,
        "iss": "https://auth.example.com/", "aud": ["other", "api"], "org": { "id": 7 }
    }));
    let claims = verifier.verify(&token, NOW).unwrap();
    assert_eq!(claims["sub"], "alice");
    assert_eq!(verifier.cache.len(), 1);
    assert!(Arc::ptr_eq(&verifier.verify(&token, NOW).unwrap(), &claims));
    assert_eq!(
        verifier.verify(&token, NOW + 90),
        Err(Rejection::Expired),
        "a cached token still expires (exp + 30 s leeway)"
    );
}

#[test]
fn each_failed_check_names_its_reason() {
    let verifier = rsa_verifier(Some("https://auth.example.com/"), Some("api"));
    let good =
        json!({ "sub": "a", "exp": NOW + 60, "iss": "https://auth.example.com/", "aud": "api" });
    let with = |change: serde_json::Value| {
        let mut claims = good.clone();
        for (name, value) in change.as_object().unwrap() {
            claims[name] = value.clone();
        }
        verifier.verify(&rsa_token(claims), NOW)
    };
    assert!(with(json!({})).is_ok());
    assert_eq!(with(json!({ "exp": NOW - 31 })), Err(Rejection::Expired));
    assert!(
        with(json!({ "exp": NOW - 29 })).is_ok(),
        "within the leeway"
    );
    assert_eq!(
        with(json!({ "nbf": NOW + 31 })),
        Err(Rejection::NotYetValid)
    );
    assert_eq!(
        with(json!({ "iss": "https://evil/" })),
        Err(Rejection::Issuer)
    );
    assert_eq!(with(json!({ "aud": ["web"] })), Err(Rejection::Audience));
    assert_eq!(
        with(json!({ "exp": "tomorrow" })),
        Err(Rejection::Malformed)
    );
    let mut tampered = rsa_token(good.clone());
    let payload = b64(json!({ "sub": "admin", "exp": NOW + 60 })
        .to_string()
        .as_bytes());
    let parts: Vec<&str> = tampered.split('.').collect();
    tampered = format!("{}.{payload}.{}", parts[0], parts[2]);
    assert_eq!(verifier.verify(&tampered, NOW), Err(Rejection::Signature));
    assert_eq!(
        verifier.verify("not-a-token", NOW),
        Err(Rejection::Malformed)
    );
    assert_eq!(verifier.verify("a.b.c", NOW), Err(Rejection::Malformed));
}

#[test]
fn alg_none_is_refused() {
    let verifier = rsa_verifier(None, None);
    let header = b64(br#"{"alg":"none","typ":"JWT","kid":"rsa-1"}"#);
    let payload = b64(json!({ "sub": "admin", "exp": NOW + 60 })
        .to_string()
        .as_bytes());
    for token in [
        format!("{header}.{payload}."),
        format!("{header}.{payload}"),
    ] {
        assert_eq!(verifier.verify(&token, NOW), Err(Rejection::Algorithm));
    }
}

#[test]
fn an_hs_token_signed_with_the_public_key_is_refused() {
    // Algorithm confusion: a verifier that took the header's word would check this HMAC with
    // the RSA public key's bytes as the secret, which everyone has.
    let verifier = rsa_verifier(None, None);
    let mut header = Header::new(Algorithm::HS256);
    header.kid = Some("rsa-1".to_owned());
    let claims = json!({ "sub": "admin", "exp": NOW + 60 });
    for secret in [RSA_PUBLIC_PEM.as_bytes(), RSA_JWK.as_bytes()] {
        let token = encode(&header, &claims, &EncodingKey::from_secret(secret)).unwrap();
        assert_eq!(verifier.verify(&token, NOW), Err(Rejection::Algorithm));
    }
}

#[test]
fn a_secret_verifies_hs_tokens_only() {
    let verifier = JwtVerifier::with_secret(bearer(), b"s3cret", None, None, 0);
    let claims = json!({ "sub": "bob", "exp": NOW + 60 });
    let token = encode(
        &Header::new(Algorithm::HS384),
        &claims,
        &EncodingKey::from_secret(b"s3cret"),
    )
    .unwrap();
    assert_eq!(verifier.verify(&token, NOW).unwrap()["sub"], "bob");
    let forged = encode(
        &Header::default(),
        &claims,
        &EncodingKey::from_secret(b"guess"),
    )
    .unwrap();
    assert_eq!(verifier.verify(&forged, NOW), Err(Rejection::Signature));
    assert_eq!(
        verifier.verify(&rsa_token(claims), NOW),
        Err(Rejection::Algorithm)
    );
}

#[test]
fn an_unknown_kid_and_a_key_of_another_type_are_told_apart() {
    let verifier = rsa_verifier(None, None);
    let claims = json!({ "sub": "a", "exp": NOW + 60 });
    let key = EncodingKey::from_rsa_pem(RSA_PRIVATE.as_bytes()).unwrap();
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some("rsa-2".to_owned());
    let token = encode(&header, &claims, &key).unwrap();
    assert_eq!(verifier.verify(&token, NOW), Err(Rejection::UnknownKey));
    // Without a kid, every key of the set is tried.
    let token = encode(&Header::new(Algorithm::RS512), &claims, &key).unwrap();
    assert!(verifier.verify(&token, NOW).is_ok());
    let es = b64(br#"{"alg":"ES256","kid":"rsa-1"}"#);
    assert_eq!(
        verifier.verify(&format!("{es}.e30.AAAA"), NOW),
        Err(Rejection::Algorithm)
    );
}

#[test]
fn key_sets_refuse_shared_secrets_and_mismatched_algorithms() {
    let oct = r#"{"keys":[{"kty":"oct","k":"c2VjcmV0"}]}"#;
    let error = JwtVerifier::with_key_set(bearer(), oct, None, None, 0).unwrap_err();
    assert!(
        matches!(
            error,
            KeySetError::Key {
                index: 0,
                error: JwkError::SharedSecret
            }
        ),
        "{error}"
    );
    assert!(error.to_string().contains("secret_env"), "{error}");
    let mismatched = RSA_JWK.replacen("\"kty\"", "\"alg\": \"ES256\", \"kty\"", 1);
    let error = JwtVerifier::with_key_set(
        bearer(),
        &format!("{{\"keys\":[{mismatched}]}}"),
        None,
        None,
        0,
    )
    .unwrap_err();
    assert!(error.to_string().contains("does not fit"), "{error}");
    assert!(JwtVerifier::with_key_set(bearer(), "{\"keys\":[]}", None, None, 0).is_err());
    assert!(JwtVerifier::with_key_set(bearer(), "[]", None, None, 0).is_err());
}

#[test]
fn tokens_are_found_in_bearer_headers_and_cookies() {
    let verifier = rsa_verifier(None, None);
    let mut headers = HeaderMap::new();
    assert_eq!(verifier.token(&headers), Ok(None));
    headers.insert("authorization", "Basic dXNlcjpwYXNz".parse().unwrap());
    assert_eq!(
        verifier.token(&headers),
        Ok(None),
        "another scheme carries none"
    );
    headers.insert("authorization", "bearer  abc.def.ghi ".parse().unwrap());
    assert_eq!(verifier.token(&headers), Ok(Some("abc.def.ghi")));
    headers.insert("authorization", "abc.def.ghi".parse().unwrap());
    assert_eq!(
        verifier.token(&headers),
        Ok(None),
        "Authorization needs its scheme"
    );
    let cookie = JwtVerifier::with_secret(
        TokenSource::Cookie("session".to_owned()),
        b"x",
        None,
        None,
        0,
    );
    headers.insert("cookie", "theme=dark; session=abc.def.ghi".parse().unwrap());
    assert_eq!(cookie.token(&headers), Ok(Some("abc.def.ghi")));
    // Two Authorization fields: the upstream may read the other one.
    headers.insert("authorization", "Bearer abc.def.ghi".parse().unwrap());
    headers.append("authorization", "Bearer jkl.mno.pqr".parse().unwrap());
    assert!(verifier.token(&headers).is_err());
}
