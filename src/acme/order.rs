//! One ACME order (RFC 8555) for all of `[server.tls.acme]`'s hosts: the account (made once,
//! then read from `state_dir`), each host's challenge answered by the listeners, the
//! certificate fetched and kept.

use std::sync::Arc;
use std::time::Duration;

use instant_acme::{
    Account, AccountCredentials, AuthorizationStatus, ChallengeType, Identifier, NewAccount,
    NewOrder, OrderStatus, RetryPolicy,
};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::sign::CertifiedKey;

use super::state_dir::StateDir;
use crate::config::{AcmeChallenge, AcmeSettings};
use crate::tls::Obtained;

/// How long validation and issuance may take before the order counts as failed.
const ORDER_PATIENCE: Duration = Duration::from_secs(120);

/// Why an order failed; the loop retries it later.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OrderError {
    #[error("ACME server: {0}")]
    Acme(#[from] instant_acme::Error),
    #[error("state_dir: {0}")]
    StateDir(#[from] std::io::Error),
    #[error("the account in state_dir cannot be read: {0}")]
    Account(serde_json::Error),
    #[error("{0}")]
    Refused(String),
    #[error("the certificate obtained: {0}")]
    Certificate(#[from] crate::tls::TlsError),
    #[error("the challenge certificate: {0}")]
    ChallengeCertificate(#[from] rcgen::Error),
}

/// Orders a certificate for every host, answers its challenges through `obtained`, and keeps
/// the certificate in `state_dir`.
pub(crate) async fn order(
    settings: &AcmeSettings,
    state_dir: &StateDir,
    obtained: &Obtained,
) -> Result<(), OrderError> {
    let account = account(settings, state_dir).await?;
    let identifiers: Vec<Identifier> = settings
        .hosts
        .iter()
        .map(|host| Identifier::Dns(host.clone()))
        .collect();
    let mut order = account.new_order(&NewOrder::new(&identifiers)).await?;
    let challenge_type = match settings.challenge {
        AcmeChallenge::TlsAlpn01 => ChallengeType::TlsAlpn01,
        AcmeChallenge::Http01 => ChallengeType::Http01,
    };
    let mut authorizations = order.authorizations();
    while let Some(authorization) = authorizations.next().await {
        let mut authorization = authorization?;
        match authorization.status {
            AuthorizationStatus::Pending => {}
            AuthorizationStatus::Valid => continue,
            status => {
                return Err(OrderError::Refused(format!(
                    "an authorization is {status:?}"
                )))
            }
        }
        let mut challenge = authorization
            .challenge(challenge_type.clone())
            .ok_or_else(|| {
                OrderError::Refused(format!("the server offers no {challenge_type:?} challenge"))
            })?;
        let host = challenge.identifier().to_string();
        let key_authorization = challenge.key_authorization();
        match settings.challenge {
            AcmeChallenge::TlsAlpn01 => {
                let certificate = alpn_challenge_certificate(&host, key_authorization.digest())?;
                obtained.set_alpn_challenge(&host, certificate);
            }
            AcmeChallenge::Http01 => {
                obtained.set_http_challenge(&challenge.token, key_authorization.as_str().to_owned())
            }
        }
        challenge.set_ready().await?;
    }
    let patience = RetryPolicy::new()
        .initial_delay(Duration::from_millis(250))
        .timeout(ORDER_PATIENCE);
    let status = order.poll_ready(&patience).await?;
    if status != OrderStatus::Ready {
        let state = order.refresh().await?;
        return Err(OrderError::Refused(format!(
            "the order is {status:?}: {}",
            state
                .error
                .as_ref()
                .map_or_else(|| "no reason given".to_owned(), ToString::to_string)
        )));
    }
    let key_pem = order.finalize().await?;
    let chain_pem = order.poll_certificate(&patience).await?;
    state_dir.save_certificate(&chain_pem, &key_pem)?;
    Ok(())
}

/// The account: read from `state_dir`, or made now (and kept there).
async fn account(settings: &AcmeSettings, state_dir: &StateDir) -> Result<Account, OrderError> {
    let builder = match &settings.ca_file {
        Some(ca_file) => Account::builder_with_root(ca_file)?,
        None => Account::builder()?,
    };
    if let Some(saved) = state_dir.account()? {
        let credentials: AccountCredentials =
            serde_json::from_str(&saved).map_err(OrderError::Account)?;
        return Ok(builder.from_credentials(credentials).await?);
    }
    let contact = settings
        .email
        .as_ref()
        .map(|email| format!("mailto:{email}"));
    let contact: Vec<&str> = contact.iter().map(String::as_str).collect();
    let (account, credentials) = builder
        .create(
            &NewAccount {
                contact: &contact,
                terms_of_service_agreed: true,
                only_return_existing: false,
            },
            settings.directory.clone(),
            None,
        )
        .await?;
    let credentials = serde_json::to_string(&credentials).map_err(OrderError::Account)?;
    state_dir.save_account(&credentials)?;
    tracing::info!(directory = %settings.directory, "ACME account made");
    Ok(account)
}

/// RFC 8737's certificate: self-signed for `host` alone, with the critical acmeIdentifier
/// extension holding the key authorization's SHA-256 digest.
fn alpn_challenge_certificate(
    host: &str,
    digest: impl AsRef<[u8]>,
) -> Result<Arc<CertifiedKey>, OrderError> {
    let mut params = rcgen::CertificateParams::new(vec![host.to_owned()])?;
    params.custom_extensions = vec![rcgen::CustomExtension::new_acme_identifier(digest.as_ref())];
    let key_pair = rcgen::KeyPair::generate()?;
    let certificate = params.self_signed(&key_pair)?;
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key_pair.serialize_der()));
    let provider = rustls::crypto::ring::default_provider();
    let signing_key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|error| OrderError::Refused(error.to_string()))?;
    Ok(Arc::new(CertifiedKey::new(
        vec![certificate.der().clone()],
        signing_key,
    )))
}
