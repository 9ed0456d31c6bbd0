//! What `[server.tls.acme]` has obtained, and the challenges it is answering now: shared by
//! the order loop (which fills it) and the listeners (which serve from it).

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwapOption;
use parking_lot::Mutex;
use rustls::sign::CertifiedKey;

/// The ACME hosts' certificate and pending challenges.
#[derive(Debug, Default)]
pub struct Obtained {
    /// The names the certificate is for (lower-cased), as configured at start.
    pub hosts: Vec<String>,
    /// The certificate for all of `hosts`, once one is obtained (or read from `state_dir`).
    certificate: ArcSwapOption<Served>,
    /// tls-alpn-01: each host's challenge certificate while an order waits on it.
    alpn_challenges: Mutex<HashMap<String, Arc<CertifiedKey>>>,
    /// http-01: each token's key authorization while an order waits on it.
    http_challenges: Mutex<HashMap<String, String>>,
}

/// A certificate obtained, and when it ends.
#[derive(Debug)]
pub struct Served {
    pub key: Arc<CertifiedKey>,
    /// Seconds since the Unix epoch.
    pub not_after: i64,
}

impl Obtained {
    pub fn new(hosts: Vec<String>) -> Obtained {
        Obtained {
            hosts,
            ..Obtained::default()
        }
    }

    pub fn is_host(&self, name: &str) -> bool {
        self.hosts.iter().any(|host| host == name)
    }

    pub fn certificate(&self) -> Option<Arc<Served>> {
        self.certificate.load_full()
    }

    pub fn install(&self, served: Served) {
        self.certificate.store(Some(Arc::new(served)));
    }

    /// The tls-alpn-01 certificate for `host`, while its challenge is pending.
    pub fn alpn_challenge(&self, host: &str) -> Option<Arc<CertifiedKey>> {
        self.alpn_challenges.lock().get(host).cloned()
    }

    pub fn set_alpn_challenge(&self, host: &str, key: Arc<CertifiedKey>) {
        self.alpn_challenges.lock().insert(host.to_owned(), key);
    }

    /// The key authorization for an http-01 `token`, while its challenge is pending.
    pub fn http_challenge(&self, token: &str) -> Option<String> {
        self.http_challenges.lock().get(token).cloned()
    }

    pub fn set_http_challenge(&self, token: &str, key_authorization: String) {
        self.http_challenges
            .lock()
            .insert(token.to_owned(), key_authorization);
    }

    /// Forgets every challenge: the order they were for has ended.
    pub fn clear_challenges(&self) {
        self.alpn_challenges.lock().clear();
        self.http_challenges.lock().clear();
    }
}
