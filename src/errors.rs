//! Why a gateway did not start, and why a reload changed nothing.

use std::net::SocketAddr;

use crate::config::ConfigErrors;
use crate::limit::StoreError;
use crate::tls::TlsError;
use crate::upstream::UpstreamSetupError;

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("TLS: {0}")]
    Tls(TlsError),
    #[error("upstream client: {0}")]
    Upstream(UpstreamSetupError),
    #[error("cannot set up the store: {0}")]
    Store(StoreError),
    #[error("{0}")]
    Overrides(crate::overrides::FileError),
    #[error("cannot listen on {address}: {source}")]
    Listen {
        address: SocketAddr,
        source: std::io::Error,
    },
}

/// Why a reload changed nothing.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("{0}")]
    Invalid(ConfigErrors),
    #[error("TLS: {0}")]
    Tls(TlsError),
    #[error("upstream client: {0}")]
    Upstream(UpstreamSetupError),
}
