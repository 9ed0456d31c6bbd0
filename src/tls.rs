//! TLS with rustls: the listener's configuration (TLS 1.2 and 1.3, ALPN `h2` and
//! `http/1.1`) and the client configuration for `https://` upstreams.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore, ServerConfig};

use crate::config::{TlsFiles, TlsSettings, TlsVersion};
pub use certificates::{asks_acme_challenge, CertificateEnd, Certificates, ACME_TLS_ALPN};
pub use failure::HandshakeFailure;
pub use obtained::{Obtained, Served};

mod certificates;
mod failure;
mod obtained;

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Why a TLS configuration could not be built from its files: the operator's to mend.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read certificates from {}: {source}", path.display())]
    Unreadable {
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    #[error("invalid PEM in {}: {source}", path.display())]
    InvalidPem {
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    #[error("no certificate in {}", .0.display())]
    NoCertificate(PathBuf),
    #[error("cannot read a private key from {}: {source}", path.display())]
    UnreadableKey {
        path: PathBuf,
        source: rustls::pki_types::pem::Error,
    },
    #[error("{} and {} do not form a usable certificate: {source}", files.cert.display(), files.key.display())]
    Unusable {
        files: TlsFiles,
        source: rustls::Error,
    },
    #[error("unusable CA certificate in {}: {source}", path.display())]
    UnusableCa {
        path: PathBuf,
        source: rustls::Error,
    },
    #[error("cannot read the certificate in {}: {reason}", path.display())]
    Unparsable { path: PathBuf, reason: String },
    #[error("{0}")]
    Protocol(rustls::Error),
}

/// Reads a PEM certificate chain.
pub(crate) fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certificates = CertificateDer::pem_file_iter(path)
        .map_err(|source| TlsError::Unreadable {
            path: path.to_owned(),
            source,
        })?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|source| TlsError::InvalidPem {
            path: path.to_owned(),
            source,
        })?;
    if certificates.is_empty() {
        return Err(TlsError::NoCertificate(path.to_owned()));
    }
    Ok(certificates)
}

/// What the TLS listeners serve: their configuration and the certificates it chooses from.
#[derive(Debug)]
pub struct TlsListener {
    pub config: Arc<ServerConfig>,
    pub certificates: Arc<Certificates>,
}

impl TlsListener {
    /// Reads the certificate files `settings` names; an error names the file. `acme`: what
    /// `[server.tls.acme]` obtains, served beside them.
    pub fn new(
        settings: &TlsSettings,
        acme: Option<Arc<Obtained>>,
    ) -> Result<TlsListener, TlsError> {
        let provider = provider();
        let certificates = Arc::new(Certificates::load(settings, acme, &provider)?);
        let versions: &[&rustls::SupportedProtocolVersion] = match settings.min_version {
            TlsVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
            TlsVersion::Tls13 => &[&rustls::version::TLS13],
        };
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(versions)
            .map_err(TlsError::Protocol)?
            .with_no_client_auth()
            .with_cert_resolver(certificates.clone());
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let tls_alpn_01 = settings.acme.as_ref().map(|acme| acme.challenge);
        if tls_alpn_01 == Some(crate::config::AcmeChallenge::TlsAlpn01) {
            // Negotiated only by a validation offering it alone; such a connection is closed
            // after its handshake.
            config.alpn_protocols.push(ACME_TLS_ALPN.to_vec());
        }
        // Every suite offered is an AEAD with forward secrecy; the server's order puts the
        // strongest first whatever a client prefers.
        config.ignore_client_order = true;
        Ok(TlsListener {
            config: Arc::new(config),
            certificates,
        })
    }

    /// The same certificates for QUIC: TLS 1.3 only, ALPN `h3`, and 0-RTT accepted when
    /// `early_data` (QUIC allows no early-data size but none or unbounded).
    pub fn quic_config(&self, early_data: bool) -> Result<ServerConfig, TlsError> {
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13])
            .map_err(TlsError::Protocol)?
            .with_no_client_auth()
            .with_cert_resolver(self.certificates.clone());
        config.alpn_protocols = vec![b"h3".to_vec()];
        config.ignore_client_order = true;
        config.max_early_data_size = if early_data { u32::MAX } else { 0 };
        Ok(config)
    }
}

/// A listener's configuration serving one certificate chain (PEM) and its PKCS#8, RSA or EC
/// key for every name.
pub fn server_config(files: &TlsFiles) -> Result<Arc<ServerConfig>, TlsError> {
    TlsListener::new(&TlsSettings::single(files.clone()), None).map(|listener| listener.config)
}

/// A certificate chain and key read from their files, checked to belong together, with the
/// DNS names the leaf lists and when it ends (Unix seconds).
pub fn read_pair(
    files: &TlsFiles,
) -> Result<(Arc<rustls::sign::CertifiedKey>, Vec<String>, i64), TlsError> {
    let (key, leaf) = certificates::load_pair(files, &provider())?;
    Ok((Arc::new(key), leaf.names, leaf.not_after))
}

/// The configuration for `https://` upstreams: the roots in `ca_file` if given, else the
/// system's roots (and the bundled Mozilla roots when the system has none).
pub fn client_config(ca_file: Option<&Path>) -> Result<ClientConfig, TlsError> {
    let mut roots = RootCertStore::empty();
    match ca_file {
        Some(path) => {
            for certificate in certificates(path)? {
                roots
                    .add(certificate)
                    .map_err(|source| TlsError::UnusableCa {
                        path: path.to_owned(),
                        source,
                    })?;
            }
        }
        None => {
            let native = rustls_native_certs::load_native_certs();
            for certificate in native.certs {
                let _ = roots.add(certificate);
            }
            if roots.is_empty() {
                roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
            }
        }
    }
    let config = ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(TlsError::Protocol)?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config)
}
