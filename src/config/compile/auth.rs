//! `[auth.jwt]`: where a request's token is found and the keys that verify it. The key file is
//! read here (and again on every reload, which is how keys rotate); a shared secret comes only
//! from the environment, never from the file.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use toml::Spanned;

use super::{duration_or, resolve, Errors};
use crate::config::raw;
use crate::jwt::{JwtVerifier, TokenSource};

/// How much clock skew `exp` and `nbf` allow unless `leeway` says otherwise.
const DEFAULT_LEEWAY: Duration = Duration::from_secs(30);

pub(super) fn compile_jwt(
    raw: Spanned<raw::RawJwt>,
    base: Option<&Path>,
    errors: &mut Errors<'_>,
) -> Option<Arc<JwtVerifier>> {
    let span = Some(raw.span());
    let raw = raw.into_inner();
    let source = token_source(raw.from, errors)?;
    let leeway = duration_or(raw.leeway, DEFAULT_LEEWAY).as_secs();
    let issuer = raw.issuer.filter(|issuer| !issuer.is_empty());
    let audience = raw.audience.filter(|audience| !audience.is_empty());
    match (raw.jwks_file, raw.secret_env) {
        (Some(file), None) => {
            let path = resolve(base, file.get_ref());
            let verifier = std::fs::read_to_string(&path)
                .map_err(|error| format!("cannot read {}: {error}", path.display()))
                .and_then(|jwks| {
                    JwtVerifier::with_key_set(source, &jwks, issuer, audience, leeway)
                        .map_err(|error| format!("{}: {error}", path.display()))
                });
            match verifier {
                Ok(verifier) => Some(Arc::new(verifier)),
                Err(message) => {
                    errors.at(Some(file.span()), "auth.jwt.jwks_file", message);
                    None
                }
            }
        }
        (None, Some(variable)) => {
            match std::env::var(variable.get_ref()) {
                Ok(secret) if secret.len() >= 32 => Some(Arc::new(JwtVerifier::with_secret(
                    source,
                    secret.as_bytes(),
                    issuer,
                    audience,
                    leeway,
                ))),
                Ok(_) => {
                    errors.at(Some(variable.span()), "auth.jwt.secret_env", format!("${} is shorter than 32 bytes: an HMAC secret that short can be guessed", variable.get_ref()));
                    None
                }
                Err(_) => {
                    errors.at(
                        Some(variable.span()),
                        "auth.jwt.secret_env",
                        format!(
                            "${} is not set: it holds the HS256/HS384/HS512 secret",
                            variable.get_ref()
                        ),
                    );
                    None
                }
            }
        }
        _ => {
            errors.at(span, "auth.jwt", "set exactly one of jwks_file (RSA, EC and Ed25519 public keys) and secret_env (the environment variable holding an HMAC secret)");
            None
        }
    }
}

/// Where tokens are read (`from`): the `Authorization` header unless a header or a cookie
/// is named.
fn token_source(
    from: Option<Spanned<raw::RawTokenSource>>,
    errors: &mut Errors<'_>,
) -> Option<TokenSource> {
    Some(match from {
        None => TokenSource::Header(http::header::AUTHORIZATION),
        Some(from) => {
            let from_span = Some(from.span());
            match from.into_inner() {
                raw::RawTokenSource {
                    header: Some(name),
                    cookie: None,
                } => match http::HeaderName::from_bytes(name.as_bytes()) {
                    Ok(name) => TokenSource::Header(name),
                    Err(_) => {
                        errors.at(
                            from_span,
                            "auth.jwt.from.header",
                            format!("{name:?} is not a valid header name"),
                        );
                        return None;
                    }
                },
                raw::RawTokenSource {
                    header: None,
                    cookie: Some(name),
                } if !name.is_empty() => TokenSource::Cookie(name),
                _ => {
                    errors.at(from_span, "auth.jwt.from", "name one place: { header = \"authorization\" } or { cookie = \"session\" }");
                    return None;
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::{error, policy};

    #[test]
    fn a_key_file_is_read_relative_to_the_policy() {
        let dir = tempfile::tempdir().unwrap();
        let jwk = include_str!("../../../tests/fixtures/jwt/rsa-public.jwk.json");
        std::fs::write(
            dir.path().join("jwks.json"),
            format!("{{\"keys\":[{jwk}]}}"),
        )
        .unwrap();
        let text = "[auth.jwt]\njwks_file = \"jwks.json\"\n[upstreams.app]\nurl = \"http://127.0.0.1:3000\"\n[[routes]]\nname = \"all\"\npath_prefix = \"/\"\nupstream = \"app\"\n";
        let policy = super::super::compile("p.toml", text, Some(dir.path())).unwrap();
        assert!(policy.jwt.is_some());
    }

    #[test]
    fn bad_auth_sections_say_what_to_set() {
        assert_eq!(error("[auth.jwt]\nleeway = \"5s\"\n").0, "auth.jwt");
        assert_eq!(
            error("[auth.jwt]\njwks_file = \"/nonexistent/jwks.json\"\n").0,
            "auth.jwt.jwks_file"
        );
        assert_eq!(
            error("[auth.jwt]\nsecret_env = \"TOLLGATE_TEST_UNSET_SECRET\"\n").0,
            "auth.jwt.secret_env"
        );
        assert_eq!(
            error("[auth.jwt]\nsecret_env = \"TOLLGATE_TEST_UNSET_SECRET\"\nfrom = { header = \"a\", cookie = \"b\" }\n").0,
            "auth.jwt.from"
        );
        let (key, message) =
            error("[limits.u]\nkey = { jwt_claim = \"sub\" }\ncapacity = 5\nrate = \"1/s\"\n");
        assert_eq!(key, "limits.u.key");
        assert!(message.contains("[auth.jwt]"), "{message}");
    }

    #[test]
    fn the_secret_comes_from_the_environment_and_must_be_long() {
        std::env::set_var("TOLLGATE_TEST_JWT_SECRET_LONG", "x".repeat(32));
        std::env::set_var("TOLLGATE_TEST_JWT_SECRET_SHORT", "x".repeat(31));
        let policy = policy("[auth.jwt]\nsecret_env = \"TOLLGATE_TEST_JWT_SECRET_LONG\"\n");
        assert!(policy.jwt.is_some());
        let (key, message) = error("[auth.jwt]\nsecret_env = \"TOLLGATE_TEST_JWT_SECRET_SHORT\"\n");
        assert_eq!(key, "auth.jwt.secret_env");
        assert!(message.contains("shorter than 32"), "{message}");
    }
}
