//! Verified identity: a JSON Web Token is checked against the policy's keys before one of its
//! claims may pick a request's bucket or tier, so that a forged token never picks its own.
//!
//! The signature is checked by `jsonwebtoken`; which algorithm a key accepts, and the time and
//! issuer/audience checks, are decided here (pure, with the time passed in), so that `none`
//! and algorithm confusion are refused by construction, not by configuration.

mod cache;

use std::str::FromStr;
use std::sync::Arc;

use base64::Engine as _;
use http::HeaderMap;
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, Jwk, JwkSet, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use serde_json::Value;

use cache::TokenCache;

/// A verified token's claims (a JSON object).
pub type Claims = Arc<serde_json::Map<String, Value>>;

/// Why a token was refused: the `reason` of `tollgate_jwt_rejected_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// Not three base64url parts of JSON, or a claim of the wrong type.
    Malformed,
    Signature,
    Expired,
    NotYetValid,
    Issuer,
    Audience,
    /// `none`, an unknown name, or an algorithm the key is not for (an HS token against a
    /// public key).
    Algorithm,
    /// The token names a key (`kid`) the key set does not hold, or no key fits it.
    UnknownKey,
    /// The header lists `crit` extensions, which a verifier that does not understand them must
    /// refuse (RFC 7515 §4.1.11); tollgate understands none.
    CriticalExtension,
}

impl Rejection {
    pub const ALL: [Rejection; 9] = [
        Rejection::Malformed,
        Rejection::Signature,
        Rejection::Expired,
        Rejection::NotYetValid,
        Rejection::Issuer,
        Rejection::Audience,
        Rejection::Algorithm,
        Rejection::UnknownKey,
        Rejection::CriticalExtension,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Rejection::Malformed => "malformed",
            Rejection::Signature => "signature",
            Rejection::Expired => "expired",
            Rejection::NotYetValid => "not_yet_valid",
            Rejection::Issuer => "issuer",
            Rejection::Audience => "audience",
            Rejection::Algorithm => "algorithm",
            Rejection::UnknownKey => "unknown_key",
            Rejection::CriticalExtension => "critical_extension",
        }
    }
}

/// A request that carries the token's header field more than once.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the {0} field is sent more than once: which token to trust is ambiguous")]
pub struct TwoTokenFields(pub http::HeaderName);

/// Where a request carries its token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenSource {
    /// `Bearer <token>` (or, in a header other than `Authorization`, the bare token).
    Header(http::HeaderName),
    Cookie(String),
}

/// A public key of the key set, with the algorithms it verifies.
struct PublicKey {
    id: Option<String>,
    algorithms: Vec<Algorithm>,
    key: DecodingKey,
}

enum Keys {
    /// From `jwks_file`: RSA, EC and Ed25519 keys, never a shared secret.
    Public(Vec<PublicKey>),
    /// From `secret_env`: HS256/HS384/HS512 only.
    Secret(DecodingKey),
}

/// The compiled `[auth.jwt]`: how to find, verify and check a request's token.
pub struct JwtVerifier {
    pub source: TokenSource,
    keys: Keys,
    issuer: Option<String>,
    audience: Option<String>,
    /// Seconds of clock skew allowed on `exp` and `nbf`.
    leeway: u64,
    cache: TokenCache,
}

impl std::fmt::Debug for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let keys = match &self.keys {
            Keys::Public(keys) => format!("{} public keys", keys.len()),
            Keys::Secret(_) => "a secret".to_owned(),
        };
        f.debug_struct("JwtVerifier")
            .field("source", &self.source)
            .field("keys", &keys)
            .field("issuer", &self.issuer)
            .field("audience", &self.audience)
            .field("leeway", &self.leeway)
            .finish()
    }
}

/// One line for `tollgate check`.
impl std::fmt::Display for JwtVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.source {
            TokenSource::Header(name) => write!(f, "JWT from header {name}")?,
            TokenSource::Cookie(name) => write!(f, "JWT from cookie {name}")?,
        }
        match &self.keys {
            Keys::Public(keys) => write!(f, ", {} public key(s)", keys.len())?,
            Keys::Secret(_) => f.write_str(", HMAC secret")?,
        }
        if let Some(issuer) = &self.issuer {
            write!(f, ", issuer {issuer}")?;
        }
        if let Some(audience) = &self.audience {
            write!(f, ", audience {audience}")?;
        }
        write!(f, ", leeway {}s", self.leeway)
    }
}

/// What verification reads of a token's header: its algorithm and the key it names.
#[derive(serde::Deserialize)]
struct TokenHeader {
    alg: String,
    kid: Option<String>,
    /// Present at all, it names extensions this verifier would have to understand.
    crit: Option<serde_json::Value>,
}

/// Why a JWKS document gives no verifier.
#[derive(Debug, thiserror::Error)]
pub enum KeySetError {
    #[error("not a JWKS document: {0}")]
    NotAKeySet(serde_json::Error),
    #[error("key {index}: {error}")]
    Key { index: usize, error: JwkError },
    #[error("the key set holds no signing key")]
    NoSigningKey,
}

/// Why one key of a JWKS document is refused.
#[derive(Debug, thiserror::Error)]
pub enum JwkError {
    #[error("only the P-256 and P-384 curves are supported")]
    Curve,
    #[error("a shared secret (kty \"oct\") does not belong in a key file: use secret_env")]
    SharedSecret,
    #[error("alg {0} does not fit the key's type")]
    AlgorithmMismatch(String),
    #[error("unusable key: {0}")]
    Unusable(jsonwebtoken::errors::Error),
}

impl JwtVerifier {
    /// A verifier with the keys of a JWKS document (`jwks_file`).
    pub fn with_key_set(
        source: TokenSource,
        jwks: &str,
        issuer: Option<String>,
        audience: Option<String>,
        leeway: u64,
    ) -> Result<JwtVerifier, KeySetError> {
        let set: JwkSet = serde_json::from_str(jwks).map_err(KeySetError::NotAKeySet)?;
        let mut keys = Vec::new();
        for (index, jwk) in set.keys.iter().enumerate() {
            if jwk.common.public_key_use == Some(PublicKeyUse::Encryption) {
                continue;
            }
            keys.push(public_key(jwk).map_err(|error| KeySetError::Key { index, error })?);
        }
        if keys.is_empty() {
            return Err(KeySetError::NoSigningKey);
        }
        Ok(JwtVerifier::new(
            source,
            Keys::Public(keys),
            issuer,
            audience,
            leeway,
        ))
    }

    /// A verifier with a shared secret (`secret_env`).
    pub fn with_secret(
        source: TokenSource,
        secret: &[u8],
        issuer: Option<String>,
        audience: Option<String>,
        leeway: u64,
    ) -> JwtVerifier {
        let keys = Keys::Secret(DecodingKey::from_secret(secret));
        JwtVerifier::new(source, keys, issuer, audience, leeway)
    }

    fn new(
        source: TokenSource,
        keys: Keys,
        issuer: Option<String>,
        audience: Option<String>,
        leeway: u64,
    ) -> JwtVerifier {
        JwtVerifier {
            source,
            keys,
            issuer,
            audience,
            leeway,
            cache: TokenCache::new(),
        }
    }

    /// The request's token, if it carries one. A header with another scheme (`Basic …`) carries
    /// none: it is not this gateway's to judge. The token's field twice is an error: the
    /// upstream might read the other one than the limits did.
    pub fn token<'h>(&self, headers: &'h HeaderMap) -> Result<Option<&'h str>, TwoTokenFields> {
        Ok(match &self.source {
            TokenSource::Header(name) => {
                let mut values = headers.get_all(name).iter();
                let (Some(value), None) = (values.next(), values.next()) else {
                    return match headers.contains_key(name) {
                        true => Err(TwoTokenFields(name.clone())),
                        false => Ok(None),
                    };
                };
                let Some(value) = value.to_str().ok().map(str::trim) else {
                    return Ok(None);
                };
                let token = match value.split_once(' ') {
                    Some((scheme, token)) if scheme.eq_ignore_ascii_case("bearer") => token.trim(),
                    Some(_) => return Ok(None),
                    None if *name == http::header::AUTHORIZATION => return Ok(None),
                    None => value,
                };
                (!token.is_empty()).then_some(token)
            }
            TokenSource::Cookie(name) => headers
                .get_all(http::header::COOKIE)
                .iter()
                .filter_map(|value| value.to_str().ok())
                .flat_map(|line| line.split(';'))
                .filter_map(|pair| pair.trim().split_once('='))
                .find(|(cookie, value)| cookie == name && !value.is_empty())
                .map(|(_, value)| value),
        })
    }

    /// The token's claims if it checks out at `now` (Unix seconds). A token verified before
    /// is found in the cache and costs no signature check, until it expires.
    pub fn verify(&self, token: &str, now: u64) -> Result<Claims, Rejection> {
        if let Some((claims, expires)) = self.cache.get(token, now) {
            return match expires {
                Some(exp) if self.expired(exp, now) => Err(Rejection::Expired),
                _ => Ok(claims),
            };
        }
        let (claims, expires) = self.verify_uncached(token, now)?;
        self.cache.insert(token, claims.clone(), expires, now);
        Ok(claims)
    }

    /// What a token costs when it is not in the cache: its signature and claims checked.
    /// Returns the claims and when the token expires.
    pub fn verify_uncached(
        &self,
        token: &str,
        now: u64,
    ) -> Result<(Claims, Option<u64>), Rejection> {
        let claims = self.verify_signature(token)?;
        let expires = self.check_claims(&claims, now)?;
        Ok((Arc::new(claims), expires))
    }

    fn expired(&self, exp: u64, now: u64) -> bool {
        now >= exp.saturating_add(self.leeway)
    }

    /// The claims of a token whose algorithm fits its key and whose signature holds.
    fn verify_signature(&self, token: &str) -> Result<serde_json::Map<String, Value>, Rejection> {
        let header = token.split('.').next().unwrap_or_default();
        let header: TokenHeader = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(header.trim_end_matches('='))
            .ok()
            .and_then(|json| serde_json::from_slice(&json).ok())
            .ok_or(Rejection::Malformed)?;
        if header.crit.is_some() {
            return Err(Rejection::CriticalExtension);
        }
        // `none`, and any name jsonwebtoken does not know, is refused before a key is chosen.
        let algorithm = Algorithm::from_str(&header.alg).map_err(|_| Rejection::Algorithm)?;
        let candidates: Vec<&DecodingKey> = match &self.keys {
            Keys::Secret(secret) if is_hmac(algorithm) => vec![secret],
            Keys::Secret(_) => return Err(Rejection::Algorithm),
            // A public key is never an HMAC secret: that is algorithm confusion.
            Keys::Public(_) if is_hmac(algorithm) => return Err(Rejection::Algorithm),
            Keys::Public(keys) => {
                let named: Vec<&PublicKey> = keys
                    .iter()
                    .filter(|key| header.kid.is_none() || key.id == header.kid)
                    .collect();
                if named.is_empty() {
                    return Err(Rejection::UnknownKey);
                }
                let fitting: Vec<&DecodingKey> = named
                    .iter()
                    .filter(|key| key.algorithms.contains(&algorithm))
                    .map(|key| &key.key)
                    .collect();
                if fitting.is_empty() {
                    return Err(Rejection::Algorithm);
                }
                fitting
            }
        };
        let mut validation = Validation::new(algorithm);
        // Time, issuer and audience are checked in `check_claims`, with the time passed in.
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.validate_aud = false;
        validation.required_spec_claims.clear();
        let mut refusal = Rejection::Signature;
        for key in candidates {
            match jsonwebtoken::decode::<Value>(token, key, &validation) {
                Ok(data) => {
                    return match data.claims {
                        Value::Object(claims) => Ok(claims),
                        _ => Err(Rejection::Malformed),
                    }
                }
                Err(error) => refusal = rejection_of(error.kind()),
            }
            if refusal != Rejection::Signature {
                break;
            }
        }
        Err(refusal)
    }

    /// Checks `exp`, `nbf`, `iss` and `aud` at `now`; returns when the token expires.
    fn check_claims(
        &self,
        claims: &serde_json::Map<String, Value>,
        now: u64,
    ) -> Result<Option<u64>, Rejection> {
        let time = |name: &str| match claims.get(name) {
            None => Ok(None),
            Some(value) => value
                .as_u64()
                .or_else(|| value.as_f64().filter(|t| *t >= 0.0).map(|t| t as u64))
                .map(Some)
                .ok_or(Rejection::Malformed),
        };
        let expires = time("exp")?;
        if expires.is_some_and(|exp| self.expired(exp, now)) {
            return Err(Rejection::Expired);
        }
        if time("nbf")?.is_some_and(|nbf| nbf > now.saturating_add(self.leeway)) {
            return Err(Rejection::NotYetValid);
        }
        if let Some(issuer) = &self.issuer {
            if claims.get("iss").and_then(Value::as_str) != Some(issuer) {
                return Err(Rejection::Issuer);
            }
        }
        if let Some(audience) = &self.audience {
            let named = match claims.get("aud") {
                Some(Value::String(aud)) => aud == audience,
                Some(Value::Array(auds)) => auds.iter().any(|aud| aud.as_str() == Some(audience)),
                _ => false,
            };
            if !named {
                return Err(Rejection::Audience);
            }
        }
        Ok(expires)
    }
}

fn is_hmac(algorithm: Algorithm) -> bool {
    matches!(
        algorithm,
        Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512
    )
}

fn rejection_of(kind: &jsonwebtoken::errors::ErrorKind) -> Rejection {
    use jsonwebtoken::errors::ErrorKind;
    match kind {
        ErrorKind::InvalidSignature
        | ErrorKind::InvalidEcdsaKey
        | ErrorKind::InvalidRsaKey(_)
        | ErrorKind::Crypto(_) => Rejection::Signature,
        ErrorKind::InvalidAlgorithm
        | ErrorKind::InvalidAlgorithmName
        | ErrorKind::MissingAlgorithm => Rejection::Algorithm,
        _ => Rejection::Malformed,
    }
}

/// A JWK as a verifying key, with the algorithms it accepts: its own `alg` when it names one,
/// else those of its key type (and, for EC, its curve).
fn public_key(jwk: &Jwk) -> Result<PublicKey, JwkError> {
    let family: Vec<Algorithm> = match &jwk.algorithm {
        AlgorithmParameters::RSA(_) => vec![
            Algorithm::RS256,
            Algorithm::RS384,
            Algorithm::RS512,
            Algorithm::PS256,
            Algorithm::PS384,
            Algorithm::PS512,
        ],
        AlgorithmParameters::EllipticCurve(params) => match params.curve {
            EllipticCurve::P256 => vec![Algorithm::ES256],
            EllipticCurve::P384 => vec![Algorithm::ES384],
            _ => return Err(JwkError::Curve),
        },
        AlgorithmParameters::OctetKeyPair(_) => vec![Algorithm::EdDSA],
        AlgorithmParameters::OctetKey(_) => return Err(JwkError::SharedSecret),
    };
    let algorithms = match jwk.common.key_algorithm {
        None => family,
        Some(named) => {
            let named = Algorithm::from_str(&named.to_string())
                .ok()
                .filter(|algorithm| family.contains(algorithm))
                .ok_or_else(|| JwkError::AlgorithmMismatch(named.to_string()))?;
            vec![named]
        }
    };
    let key = DecodingKey::from_jwk(jwk).map_err(JwkError::Unusable)?;
    Ok(PublicKey {
        id: jwk.common.key_id.clone(),
        algorithms,
        key,
    })
}

#[cfg(test)]
mod tests;
