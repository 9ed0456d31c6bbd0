//! `[server.tls]`, compiled: which certificate answers which server name, and how TLS is
//! spoken on the listeners.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

/// PEM files of a certificate chain and its private key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// `[server.tls]` (or the short `tls = { cert, key }`): TLS on every `listen` address.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsSettings {
    /// In the file's order; at most one without hosts (the default).
    pub certificates: Vec<CertificateFiles>,
    pub min_version: TlsVersion,
    /// `Strict-Transport-Security` for responses sent over TLS.
    pub hsts: Option<http::HeaderValue>,
    /// Plain listeners answer every request with a redirect to `https`.
    pub redirect_plain: bool,
    /// `[server.tls.acme]`: certificates obtained and renewed by tollgate itself.
    pub acme: Option<AcmeSettings>,
}

/// `[server.tls.acme]`: one certificate for all of `hosts`, from an ACME (RFC 8555) directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AcmeSettings {
    pub directory: String,
    pub email: Option<String>,
    /// Lower-cased names (no wildcards: those need DNS challenges).
    pub hosts: Vec<String>,
    pub challenge: AcmeChallenge,
    /// The account key and the certificate, kept across restarts.
    pub state_dir: PathBuf,
    pub renew_before: Duration,
    /// Roots to trust the directory's TLS certificate with, instead of the system's.
    pub ca_file: Option<PathBuf>,
}

/// How the ACME server checks that tollgate answers for a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcmeChallenge {
    /// RFC 8737: a handshake on the TLS listeners offering ALPN `acme-tls/1`.
    TlsAlpn01,
    /// A plain `GET /.well-known/acme-challenge/TOKEN` on the plain listeners.
    Http01,
}

impl TlsSettings {
    /// One certificate for every name: the short `tls = { cert, key }`.
    pub fn single(files: TlsFiles) -> TlsSettings {
        TlsSettings {
            certificates: vec![CertificateFiles {
                hosts: Vec::new(),
                files,
            }],
            min_version: TlsVersion::Tls12,
            hsts: None,
            redirect_plain: false,
            acme: None,
        }
    }
}

/// A `[[server.tls.certificates]]` entry: its files and the names it is served for (none: the
/// default).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertificateFiles {
    pub hosts: Vec<HostPattern>,
    pub files: TlsFiles,
}

/// The lowest TLS version spoken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsVersion {
    Tls12,
    Tls13,
}

/// A host a certificate is chosen for: a name, or `*.` and the name whose one-label
/// subdomains it covers. Lower-cased.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostPattern {
    Exact(String),
    /// The parent: `shop.example.com` for `*.shop.example.com`.
    Wildcard(String),
}

impl HostPattern {
    /// Parses a host as written in the policy; `Err` says what is wrong with it.
    pub fn parse(written: &str) -> Result<HostPattern, String> {
        let lower = written.to_ascii_lowercase();
        let lower = lower.strip_suffix('.').unwrap_or(&lower);
        let (pattern, name) = match lower.strip_prefix("*.") {
            Some(parent) => (HostPattern::Wildcard(parent.to_owned()), parent),
            None => (HostPattern::Exact(lower.to_owned()), lower),
        };
        if name.contains('*') {
            return Err("a wildcard is only `*.` before the name, covering one label".to_owned());
        }
        if !is_dns_name(name) {
            return Err(
                "not a host name (letters, digits and hyphens in dot-separated labels)".to_owned(),
            );
        }
        if matches!(pattern, HostPattern::Wildcard(_)) && !name.contains('.') {
            return Err("a wildcard needs a parent of at least two labels".to_owned());
        }
        Ok(pattern)
    }

    /// Whether `name` (lower-cased, no trailing dot) is this host or, for a wildcard, one
    /// label below its parent.
    pub fn matches(&self, name: &str) -> bool {
        match self {
            HostPattern::Exact(host) => host == name,
            HostPattern::Wildcard(parent) => name
                .strip_suffix(parent.as_str())
                .and_then(|label| label.strip_suffix('.'))
                .is_some_and(|label| !label.is_empty() && !label.contains('.')),
        }
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HostPattern::Exact(host) => f.write_str(host),
            HostPattern::Wildcard(parent) => write!(f, "*.{parent}"),
        }
    }
}

/// RFC 1123 names: at most 253 characters in labels of 1 to 63 letters, digits and inner
/// hyphens.
fn is_dns_name(name: &str) -> bool {
    name.len() <= 253
        && name.split('.').all(|label| {
            (1..=63).contains(&label.len())
                && !label.starts_with('-')
                && !label.ends_with('-')
                && label
                    .bytes()
                    .all(|byte| byte.is_ascii_alphanumeric() || byte == b'-')
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wildcard_covers_one_label_below_its_parent() {
        let wildcard = HostPattern::parse("*.Shop.Example.com").unwrap();
        assert_eq!(wildcard.to_string(), "*.shop.example.com");
        assert!(wildcard.matches("a.shop.example.com"));
        assert!(!wildcard.matches("shop.example.com"));
        assert!(!wildcard.matches("a.b.shop.example.com"));
        assert!(!wildcard.matches("ashop.example.com"));
        assert!(!wildcard.matches(".shop.example.com"));
    }

    #[test]
    fn hosts_are_compared_without_case_or_a_trailing_dot() {
        let exact = HostPattern::parse("API.example.com.").unwrap();
        assert_eq!(exact, HostPattern::Exact("api.example.com".to_owned()));
        assert!(exact.matches("api.example.com"));
        assert!(!exact.matches("x.api.example.com"));
    }

    #[test]
    fn what_is_no_host_name_is_refused() {
        for written in [
            "",
            "*",
            "*.com",
            "a.*.example.com",
            "**.example.com",
            "exa mple.com",
            "-a.example.com",
            "a..example.com",
            "127.0.0.1:443",
            &"a".repeat(64),
        ] {
            assert!(HostPattern::parse(written).is_err(), "{written:?} accepted");
        }
        assert!(HostPattern::parse("localhost").is_ok());
        assert!(HostPattern::parse("xn--bcher-kva.example").is_ok());
    }
}
