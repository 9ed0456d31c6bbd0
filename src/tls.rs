//! TLS with rustls: the listener's configuration (TLS 1.2 and 1.3, ALPN `h2` and
//! `http/1.1`) and the client configuration for `https://` upstreams.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

/// PEM files of the listener's certificate chain and private key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

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
    #[error("{0}")]
    Protocol(rustls::Error),
}

/// Reads a PEM certificate chain.
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
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

/// The listener's configuration from a PEM chain and a PKCS#8, RSA or EC key.
pub fn server_config(files: &TlsFiles) -> Result<Arc<ServerConfig>, TlsError> {
    let chain = certificates(&files.cert)?;
    let key =
        PrivateKeyDer::from_pem_file(&files.key).map_err(|source| TlsError::UnreadableKey {
            path: files.key.clone(),
            source,
        })?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(TlsError::Protocol)?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|source| TlsError::Unusable {
            files: files.clone(),
            source,
        })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
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

/// The listeners' TLS acceptor, reading the certificate files now; `None` without `tls`.
pub(crate) fn acceptor(
    files: Option<&TlsFiles>,
) -> Result<Option<tokio_rustls::TlsAcceptor>, TlsError> {
    files
        .map(|files| server_config(files).map(tokio_rustls::TlsAcceptor::from))
        .transpose()
}
