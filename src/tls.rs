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

/// Reads a PEM certificate chain.
fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let certificates = CertificateDer::pem_file_iter(path)
        .map_err(|error| format!("cannot read certificates from {}: {error}", path.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|error| format!("invalid PEM in {}: {error}", path.display()))?;
    if certificates.is_empty() {
        return Err(format!("no certificate in {}", path.display()));
    }
    Ok(certificates)
}

/// The listener's configuration from a PEM chain and a PKCS#8, RSA or EC key.
pub fn server_config(files: &TlsFiles) -> Result<Arc<ServerConfig>, String> {
    let chain = certificates(&files.cert)?;
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|error| {
        format!(
            "cannot read a private key from {}: {error}",
            files.key.display()
        )
    })?;
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|error| error.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|error| {
            format!(
                "{} and {} do not form a usable certificate: {error}",
                files.cert.display(),
                files.key.display()
            )
        })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The configuration for `https://` upstreams: the roots in `ca_file` if given, else the
/// system's roots (and the bundled Mozilla roots when the system has none).
pub fn client_config(ca_file: Option<&Path>) -> Result<ClientConfig, String> {
    let mut roots = RootCertStore::empty();
    match ca_file {
        Some(path) => {
            for certificate in certificates(path)? {
                roots.add(certificate).map_err(|error| {
                    format!("unusable CA certificate in {}: {error}", path.display())
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
        .map_err(|error| error.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(config)
}

/// The listeners' TLS acceptor, reading the certificate files now; `None` without `tls`.
pub(crate) fn acceptor(
    files: Option<&TlsFiles>,
) -> Result<Option<tokio_rustls::TlsAcceptor>, String> {
    files
        .map(|files| server_config(files).map(tokio_rustls::TlsAcceptor::from))
        .transpose()
}
