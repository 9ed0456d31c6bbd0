//! Prints a bearer token for `bench/jwt.sh`, signed RS256 with the test key in
//! `tests/fixtures/jwt` (kid `rsa-1`), and writes the matching key set to the given file:
//! `cargo run --release --example sign_token -- JWKS_OUT [SUBJECT]`.
#![allow(clippy::disallowed_methods)] // a token's expiry is the wall clock's business

use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};

fn main() {
    let mut arguments = std::env::args().skip(1);
    let Some(jwks_out) = arguments.next() else {
        eprintln!("usage: sign_token JWKS_OUT [SUBJECT]");
        std::process::exit(2);
    };
    let subject = arguments.next().unwrap_or_else(|| "bench-user".to_owned());
    let jwk = include_str!("../tests/fixtures/jwt/rsa-public.jwk.json");
    if let Err(error) = std::fs::write(&jwks_out, format!("{{\"keys\":[{jwk}]}}")) {
        eprintln!("cannot write {jwks_out}: {error}");
        std::process::exit(1);
    }
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs());
    let claims = serde_json::json!({ "sub": subject, "exp": now + 3600, "plan": "pro" });
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some("rsa-1".to_owned());
    let key = include_str!("../tests/fixtures/jwt/rsa-private.pem");
    match EncodingKey::from_rsa_pem(key.as_bytes()).and_then(|key| encode(&header, &claims, &key)) {
        Ok(token) => println!("{token}"),
        Err(error) => {
            eprintln!("cannot sign: {error}");
            std::process::exit(1);
        }
    }
}
