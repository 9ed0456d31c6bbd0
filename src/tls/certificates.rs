//! The certificates a TLS listener serves, read from their files and chosen by the
//! ClientHello's server name: an exact host, else a wildcard one label above it, else the
//! default.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::PrivateKeyDer;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use x509_parser::extensions::GeneralName;

use super::obtained::Obtained;
use super::{certificates, TlsError};
use crate::config::{HostPattern, TlsFiles, TlsSettings};

/// The certificates of `[server.tls]`, each under the names it answers.
#[derive(Debug, Default)]
pub struct Certificates {
    exact: HashMap<String, Arc<CertifiedKey>>,
    /// By parent: `shop.example.com` holds `*.shop.example.com`'s.
    wildcard: HashMap<String, Arc<CertifiedKey>>,
    default: Option<Arc<CertifiedKey>>,
    /// `[server.tls.acme]`'s hosts and what was obtained for them.
    acme: Option<Arc<Obtained>>,
    /// Where each listed host's certificate (and the default's, as `default`) ends.
    pub ends: Vec<CertificateEnd>,
    /// Listed hosts that their certificate does not name: a client would reject it.
    pub uncovered: Vec<(String, PathBuf)>,
}

/// When the certificate served for `host` stops being valid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateEnd {
    pub host: String,
    pub file: PathBuf,
    /// Seconds since the Unix epoch.
    pub not_after: i64,
}

impl Certificates {
    /// Reads every certificate and key `settings` names; an error names the file.
    pub fn load(
        settings: &TlsSettings,
        acme: Option<Arc<Obtained>>,
        provider: &CryptoProvider,
    ) -> Result<Certificates, TlsError> {
        let mut loaded = Certificates {
            acme,
            ..Certificates::default()
        };
        for entry in &settings.certificates {
            let (key, leaf) = load_pair(&entry.files, provider)?;
            let key = Arc::new(key);
            let end = |host: String| CertificateEnd {
                host,
                file: entry.files.cert.clone(),
                not_after: leaf.not_after,
            };
            if entry.hosts.is_empty() {
                loaded.default = Some(key.clone());
                loaded.ends.push(end("default".to_owned()));
            }
            for host in &entry.hosts {
                if !leaf.names.iter().any(|name| covers(name, host)) {
                    loaded
                        .uncovered
                        .push((host.to_string(), entry.files.cert.clone()));
                }
                loaded.ends.push(end(host.to_string()));
                let (map, name) = match host {
                    HostPattern::Exact(name) => (&mut loaded.exact, name),
                    HostPattern::Wildcard(parent) => (&mut loaded.wildcard, parent),
                };
                map.insert(name.clone(), key.clone());
            }
        }
        Ok(loaded)
    }

    /// The certificate for a ClientHello's server name (`None`: the client sent none); `None`
    /// when nothing answers it. `challenge`: the hello offers only ALPN `acme-tls/1`, and gets
    /// a pending tls-alpn-01 challenge's certificate or nothing.
    pub fn choose(&self, server_name: Option<&str>, challenge: bool) -> Option<Arc<CertifiedKey>> {
        let name = server_name.map(|name| {
            let name = name.strip_suffix('.').unwrap_or(name);
            if name.bytes().any(|byte| byte.is_ascii_uppercase()) {
                std::borrow::Cow::Owned(name.to_ascii_lowercase())
            } else {
                std::borrow::Cow::Borrowed(name)
            }
        });
        let name = name.as_deref();
        if challenge {
            return self.acme.as_ref()?.alpn_challenge(name?);
        }
        let chosen = name.and_then(|name| {
            if let Some(key) = self.exact.get(name) {
                return Some(key.clone());
            }
            if let Some(acme) = self.acme.as_ref().filter(|acme| acme.is_host(name)) {
                // Until the first certificate arrives, the default answers.
                return acme.certificate().map(|served| served.key.clone());
            }
            let (_, parent) = name.split_once('.')?;
            self.wildcard.get(parent).cloned()
        });
        chosen.or_else(|| self.default.clone())
    }
}

/// Whether a ClientHello's ALPN offer is the tls-alpn-01 validation's: `acme-tls/1` alone.
pub fn asks_acme_challenge(alpn: Option<impl Iterator<Item = impl AsRef<[u8]>>>) -> bool {
    let Some(mut offered) = alpn else {
        return false;
    };
    offered
        .next()
        .is_some_and(|first| first.as_ref() == ACME_TLS_ALPN)
        && offered.next().is_none()
}

/// RFC 8737's ALPN protocol.
pub const ACME_TLS_ALPN: &[u8] = b"acme-tls/1";

impl Certificates {
    /// What is wrong with certificates that still serve, in words: ended ones, and listed
    /// hosts their certificate does not name. `now`: Unix seconds.
    pub fn problems(&self, now: i64) -> Vec<String> {
        let ended = self
            .ends
            .iter()
            .filter(|end| end.not_after <= now)
            .map(|end| {
                format!(
                    "the certificate in {} for {} has expired: clients will refuse it",
                    end.file.display(),
                    end.host
                )
            });
        let uncovered = self.uncovered.iter().map(|(host, file)| {
            format!(
                "the certificate in {} does not name {host}: clients asking for {host} will refuse it",
                file.display()
            )
        });
        ended.chain(uncovered).collect()
    }
}

impl ResolvesServerCert for Certificates {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let challenge = asks_acme_challenge(hello.alpn());
        self.choose(hello.server_name(), challenge)
    }
}

/// What the leaf certificate says of itself.
pub(super) struct Leaf {
    pub(super) not_after: i64,
    /// Its DNS names (lower-cased), or its common name when it lists none.
    pub(super) names: Vec<String>,
}

/// A certificate chain and its key, checked to belong together.
pub(super) fn load_pair(
    files: &TlsFiles,
    provider: &CryptoProvider,
) -> Result<(CertifiedKey, Leaf), TlsError> {
    let chain = certificates(&files.cert)?;
    let key =
        PrivateKeyDer::from_pem_file(&files.key).map_err(|source| TlsError::UnreadableKey {
            path: files.key.clone(),
            source,
        })?;
    let unusable = |source| TlsError::Unusable {
        files: files.clone(),
        source,
    };
    let signing_key = provider
        .key_provider
        .load_private_key(key)
        .map_err(unusable)?;
    let certified = CertifiedKey::new(chain, signing_key);
    match certified.keys_match() {
        // A key that cannot tell its public half is judged by the first handshake instead.
        Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {}
        Err(error) => return Err(unusable(error)),
    }
    let leaf = read_leaf(&certified.cert[0], &files.cert)?;
    Ok((certified, leaf))
}

fn read_leaf(der: &[u8], path: &Path) -> Result<Leaf, TlsError> {
    let unparsable = |reason: String| TlsError::Unparsable {
        path: path.to_owned(),
        reason,
    };
    let (_, certificate) =
        x509_parser::parse_x509_certificate(der).map_err(|error| unparsable(error.to_string()))?;
    let mut names: Vec<String> = match certificate.subject_alternative_name() {
        Ok(Some(names)) => names
            .value
            .general_names
            .iter()
            .filter_map(|name| match name {
                GeneralName::DNSName(name) => Some(name.to_ascii_lowercase()),
                _ => None,
            })
            .collect(),
        Ok(None) => Vec::new(),
        Err(error) => return Err(unparsable(error.to_string())),
    };
    if names.is_empty() {
        names.extend(
            certificate
                .subject()
                .iter_common_name()
                .filter_map(|name| name.as_str().ok())
                .map(str::to_ascii_lowercase),
        );
    }
    Ok(Leaf {
        not_after: certificate.validity().not_after.timestamp(),
        names,
    })
}

/// Whether a certificate name (`a.example.com` or `*.example.com`) covers a listed host.
fn covers(name: &str, host: &HostPattern) -> bool {
    match (HostPattern::parse(name), host) {
        (Ok(HostPattern::Wildcard(parent)), HostPattern::Wildcard(listed)) => parent == *listed,
        (Ok(HostPattern::Exact(name)), HostPattern::Exact(listed)) => name == *listed,
        (Ok(wildcard @ HostPattern::Wildcard(_)), HostPattern::Exact(listed)) => {
            wildcard.matches(listed)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tls::Served;

    fn key() -> Arc<CertifiedKey> {
        let certificate = rcgen::generate_simple_self_signed(["a.test".to_owned()]).unwrap();
        let der = PrivateKeyDer::Pkcs8(certificate.signing_key.serialize_der().into());
        let provider = rustls::crypto::ring::default_provider();
        let signing = provider.key_provider.load_private_key(der).unwrap();
        Arc::new(CertifiedKey::new(
            vec![certificate.cert.der().clone()],
            signing,
        ))
    }

    fn chosen(certificates: &Certificates, name: Option<&str>) -> Option<usize> {
        let candidates = [
            certificates.exact.get("shop.example.com"),
            certificates.wildcard.get("shop.example.com"),
            certificates.default.as_ref(),
        ];
        let choice = certificates.choose(name, false)?;
        candidates
            .iter()
            .position(|candidate| candidate.is_some_and(|c| Arc::ptr_eq(c, &choice)))
    }

    #[test]
    fn an_exact_host_beats_a_wildcard_which_beats_the_default() {
        let mut certificates = Certificates::default();
        certificates.exact.insert("shop.example.com".into(), key());
        certificates
            .wildcard
            .insert("shop.example.com".into(), key());
        certificates.default = Some(key());
        let cases = [
            (Some("shop.example.com"), Some(0)),
            (Some("SHOP.Example.COM."), Some(0)),
            (Some("a.shop.example.com"), Some(1)),
            (Some("A.Shop.example.com"), Some(1)),
            (Some("a.b.shop.example.com"), Some(2)),
            (Some("example.com"), Some(2)),
            (Some(&*"x".repeat(300)), Some(2)),
            (None, Some(2)),
        ];
        for (name, expected) in cases {
            assert_eq!(chosen(&certificates, name), expected, "{name:?}");
        }
        certificates.default = None;
        assert_eq!(chosen(&certificates, Some("other.example.com")), None);
        assert_eq!(chosen(&certificates, None), None);
        assert_eq!(chosen(&certificates, Some("a.shop.example.com")), Some(1));
    }

    #[test]
    fn acme_hosts_get_what_was_obtained_and_the_default_until_then() {
        let obtained = Arc::new(Obtained::new(vec!["api.example.com".to_owned()]));
        let mut certificates = Certificates {
            acme: Some(obtained.clone()),
            default: Some(key()),
            ..Certificates::default()
        };
        let is = |chosen: Option<Arc<CertifiedKey>>, expected: &Arc<CertifiedKey>| {
            chosen.is_some_and(|chosen| Arc::ptr_eq(&chosen, expected))
        };
        let default = certificates.default.clone().unwrap();
        assert!(is(
            certificates.choose(Some("api.example.com"), false),
            &default
        ));
        // A validation gets a pending challenge's certificate, and nothing else.
        assert!(certificates.choose(Some("api.example.com"), true).is_none());
        let challenge = key();
        obtained.set_alpn_challenge("api.example.com", challenge.clone());
        assert!(is(
            certificates.choose(Some("API.example.com"), true),
            &challenge
        ));
        assert!(certificates
            .choose(Some("other.example.com"), true)
            .is_none());
        let served = key();
        obtained.install(Served {
            key: served.clone(),
            not_after: 0,
        });
        assert!(is(
            certificates.choose(Some("api.example.com"), false),
            &served
        ));
        assert!(is(
            certificates.choose(Some("other.example.com"), false),
            &default
        ));
        certificates.default = None;
        assert!(is(
            certificates.choose(Some("api.example.com"), false),
            &served
        ));
    }

    #[test]
    fn only_acme_tls_alone_asks_for_a_challenge() {
        let offer = |protocols: &[&'static [u8]]| asks_acme_challenge(Some(protocols.iter()));
        assert!(offer(&[b"acme-tls/1"]));
        assert!(!offer(&[b"acme-tls/1", b"h2"]));
        assert!(!offer(&[b"h2"]));
        assert!(!offer(&[]));
        assert!(!asks_acme_challenge(None::<std::slice::Iter<'_, &[u8]>>));
    }

    #[test]
    fn a_certificate_name_covers_a_listed_host_as_a_client_would_judge_it() {
        let host = |written| HostPattern::parse(written).unwrap();
        assert!(covers("a.example.com", &host("A.example.com")));
        assert!(covers("*.example.com", &host("a.example.com")));
        assert!(covers("*.example.com", &host("*.example.com")));
        assert!(!covers("*.example.com", &host("example.com")));
        assert!(!covers("a.example.com", &host("*.example.com")));
        assert!(!covers("b.example.com", &host("a.example.com")));
    }
}
