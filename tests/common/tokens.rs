//! Signing keys and tokens for the identity tests: RSA from a test-only fixture (ring cannot
//! generate RSA keys), EC P-256 and Ed25519 generated per test, HMAC from a secret.

use base64::Engine as _;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::Value;

pub const RSA_PRIVATE: &str = include_str!("../fixtures/jwt/rsa-private.pem");
pub const RSA_PUBLIC_PEM: &str = include_str!("../fixtures/jwt/rsa-public.pem");
pub const RSA_JWK: &str = include_str!("../fixtures/jwt/rsa-public.jwk.json");

/// A key that signs tokens, and its public half as a JWK.
pub struct SigningKey {
    pub kid: String,
    pub algorithm: Algorithm,
    encoding: EncodingKey,
    pub jwk: Value,
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

impl SigningKey {
    /// The fixture's RSA key (kid `rsa-1`), RS256.
    pub fn rsa() -> SigningKey {
        SigningKey {
            kid: "rsa-1".to_owned(),
            algorithm: Algorithm::RS256,
            encoding: EncodingKey::from_rsa_pem(RSA_PRIVATE.as_bytes()).expect("rsa key"),
            jwk: serde_json::from_str(RSA_JWK).expect("rsa jwk"),
        }
    }

    /// A fresh P-256 key, ES256.
    pub fn ec(kid: &str) -> SigningKey {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("ec key");
        let point = pair.public_key_raw();
        SigningKey {
            kid: kid.to_owned(),
            algorithm: Algorithm::ES256,
            encoding: EncodingKey::from_ec_der(&pair.serialize_der()),
            jwk: serde_json::json!({
                "kty": "EC", "crv": "P-256", "kid": kid, "use": "sig",
                "x": b64(&point[1..33]), "y": b64(&point[33..65]),
            }),
        }
    }

    /// A fresh Ed25519 key, EdDSA.
    pub fn ed25519(kid: &str) -> SigningKey {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).expect("ed25519 key");
        SigningKey {
            kid: kid.to_owned(),
            algorithm: Algorithm::EdDSA,
            encoding: EncodingKey::from_ed_der(&pair.serialize_der()),
            jwk: serde_json::json!({
                "kty": "OKP", "crv": "Ed25519", "kid": kid, "x": b64(pair.public_key_raw()),
            }),
        }
    }

    /// A token with these claims, signed, naming this key.
    pub fn sign(&self, claims: &Value) -> String {
        let mut header = Header::new(self.algorithm);
        header.kid = Some(self.kid.clone());
        jsonwebtoken::encode(&header, claims, &self.encoding).expect("sign")
    }
}

/// A JWKS document of these keys.
pub fn key_set(keys: &[&SigningKey]) -> String {
    let keys: Vec<&Value> = keys.iter().map(|key| &key.jwk).collect();
    serde_json::json!({ "keys": keys }).to_string()
}

/// An HS256 token signed with `secret`.
pub fn hs256(secret: &[u8], claims: &Value) -> String {
    jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        claims,
        &EncodingKey::from_secret(secret),
    )
    .expect("sign")
}

/// Unix seconds now.
pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

/// Claims for `sub` valid for an hour, with extra claims merged in.
pub fn claims(sub: &str, extra: Value) -> Value {
    let mut claims = serde_json::json!({ "sub": sub, "exp": now() + 3600, "iat": now() });
    if let (Some(claims), Some(extra)) = (claims.as_object_mut(), extra.as_object()) {
        for (name, value) in extra {
            claims.insert(name.clone(), value.clone());
        }
    }
    claims
}

/// `alg: none`: a header and claims with an empty signature.
pub fn unsigned(claims: &Value) -> String {
    let header = b64(br#"{"alg":"none","typ":"JWT"}"#);
    format!("{header}.{}.", b64(claims.to_string().as_bytes()))
}
