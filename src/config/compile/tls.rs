//! `[server.tls]`: certificates by server name, the lowest version, HSTS, and the plain
//! listeners' redirect.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use super::{resolve, Errors};
use crate::config::raw::{RawAcme, RawTls};
use crate::config::{
    AcmeChallenge, AcmeSettings, CertificateFiles, HostPattern, TlsFiles, TlsSettings, TlsVersion,
};

pub(super) fn compile_tls(
    raw: RawTls,
    base: Option<&Path>,
    errors: &mut Errors<'_>,
) -> Option<TlsSettings> {
    let mut certificates = Vec::with_capacity(raw.certificates.len() + 1);
    match (&raw.cert, &raw.key) {
        (Some(cert), Some(key)) => certificates.push(CertificateFiles {
            hosts: Vec::new(),
            files: files(base, cert, key),
        }),
        (None, None) => {}
        _ => errors.at(
            None,
            "server.tls",
            "`cert` and `key` go together: the certificate chain and its private key",
        ),
    }
    let mut owners: HashMap<HostPattern, usize> = HashMap::new();
    for (index, entry) in raw.certificates.into_iter().enumerate() {
        let key = format!("server.tls.certificates[{index}]");
        let mut hosts = Vec::with_capacity(entry.hosts.len());
        for written in &entry.hosts {
            match HostPattern::parse(written) {
                Ok(host) => match owners.get(&host) {
                    Some(_) => errors.at(
                        None,
                        format!("{key}.hosts"),
                        format!("{host} is listed twice: a name is served one certificate"),
                    ),
                    None => {
                        owners.insert(host.clone(), index);
                        hosts.push(host);
                    }
                },
                Err(why) => errors.at(None, format!("{key}.hosts"), format!("{written:?}: {why}")),
            }
        }
        if entry.hosts.is_empty() && certificates.iter().any(|c| c.hosts.is_empty()) {
            errors.at(
                None,
                key,
                "a second certificate without `hosts`: one default answers every other name",
            );
        }
        certificates.push(CertificateFiles {
            hosts,
            files: files(base, &entry.cert, &entry.key),
        });
    }
    let acme = raw
        .acme
        .and_then(|acme| compile_acme(acme, &owners, base, errors));
    if certificates.is_empty() && acme.is_none() {
        errors.at(
            None,
            "server.tls",
            "no certificate: give `cert` and `key`, [[server.tls.certificates]] entries, or [server.tls.acme]",
        );
    }
    let min_version = match raw.min_version {
        None => TlsVersion::Tls12,
        Some(version) => match version.get_ref().as_str() {
            "1.2" => TlsVersion::Tls12,
            "1.3" => TlsVersion::Tls13,
            other => {
                errors.at(
                    Some(version.span()),
                    "server.tls.min_version",
                    format!("{other:?}: expected \"1.2\" or \"1.3\""),
                );
                TlsVersion::Tls12
            }
        },
    };
    let hsts = raw.hsts.and_then(|hsts| {
        match http::HeaderValue::from_str(hsts.get_ref().trim()) {
            Ok(value) if !value.is_empty() => Some(value),
            _ => {
                errors.at(
                    Some(hsts.span()),
                    "server.tls.hsts",
                    "expected a Strict-Transport-Security value such as \"max-age=31536000; includeSubDomains\"",
                );
                None
            }
        }
    });
    Some(TlsSettings {
        certificates,
        min_version,
        hsts,
        redirect_plain: raw.redirect_plain.unwrap_or(false),
        acme,
    })
}

/// Thirty days: Let's Encrypt's own advice for 90-day certificates.
const DEFAULT_RENEW_BEFORE: Duration = Duration::from_secs(30 * 86_400);

fn compile_acme(
    raw: RawAcme,
    listed: &HashMap<HostPattern, usize>,
    base: Option<&Path>,
    errors: &mut Errors<'_>,
) -> Option<AcmeSettings> {
    let mut ok = true;
    let mut error = |key: &str, message: String| {
        errors.at(None, format!("server.tls.acme.{key}"), message);
        ok = false;
    };
    match raw.directory.parse::<http::Uri>() {
        Ok(uri) if uri.scheme_str() == Some("https") && uri.host().is_some() => {}
        _ => error(
            "directory",
            format!("{:?}: expected the https:// URL of an ACME directory, such as \"https://acme-v02.api.letsencrypt.org/directory\"", raw.directory),
        ),
    }
    if raw.hosts.is_empty() {
        error(
            "hosts",
            "needs at least one host to obtain a certificate for".to_owned(),
        );
    }
    let mut hosts = Vec::with_capacity(raw.hosts.len());
    for written in &raw.hosts {
        match HostPattern::parse(written) {
            Ok(HostPattern::Exact(host)) => {
                if listed.contains_key(&HostPattern::Exact(host.clone())) {
                    error("hosts", format!("{host} is also listed in [[server.tls.certificates]]: a name is served one certificate"));
                } else if hosts.contains(&host) {
                    error("hosts", format!("{host} is listed twice"));
                } else {
                    hosts.push(host);
                }
            }
            Ok(HostPattern::Wildcard(_)) => error(
                "hosts",
                format!("{written:?}: a wildcard certificate needs the dns-01 challenge, which tollgate does not answer"),
            ),
            Err(why) => error("hosts", format!("{written:?}: {why}")),
        }
    }
    let challenge = match raw.challenge.as_deref() {
        None | Some("tls-alpn-01") => AcmeChallenge::TlsAlpn01,
        Some("http-01") => AcmeChallenge::Http01,
        Some(other) => {
            error(
                "challenge",
                format!("{other:?}: expected \"tls-alpn-01\" or \"http-01\""),
            );
            AcmeChallenge::TlsAlpn01
        }
    };
    if raw.state_dir.is_empty() {
        error(
            "state_dir",
            "needs a directory for the account key and certificates".to_owned(),
        );
    }
    let renew_before = raw.renew_before.map_or(DEFAULT_RENEW_BEFORE, |d| d.0);
    if renew_before.is_zero() {
        error(
            "renew_before",
            "must be longer than zero, such as \"30d\"".to_owned(),
        );
    }
    ok.then(|| AcmeSettings {
        directory: raw.directory,
        email: raw.email,
        hosts,
        challenge,
        state_dir: resolve(base, &raw.state_dir),
        renew_before,
        ca_file: raw.ca_file.map(|file| resolve(base, &file)),
    })
}

fn files(base: Option<&Path>, cert: &str, key: &str) -> TlsFiles {
    TlsFiles {
        cert: resolve(base, cert),
        key: resolve(base, key),
    }
}

#[cfg(test)]
mod tests {
    use crate::config::compile::testing::{error, errors, policy};
    use crate::config::{HostPattern, TlsVersion};

    #[test]
    fn the_short_form_is_one_default_certificate() {
        let policy = policy("[server]\ntls = { cert = \"a.pem\", key = \"a.key\" }\n");
        let tls = policy.server.tls.unwrap();
        assert_eq!(tls.certificates.len(), 1);
        assert!(tls.certificates[0].hosts.is_empty());
        assert_eq!(tls.min_version, TlsVersion::Tls12);
        assert_eq!(tls.hsts, None);
    }

    #[test]
    fn certificates_are_listed_by_host() {
        let policy = policy(
            "[server.tls]\nmin_version = \"1.3\"\nhsts = \"max-age=60\"\n\
             [[server.tls.certificates]]\nhosts = [\"Shop.example.com\", \"*.shop.example.com\"]\ncert = \"s.pem\"\nkey = \"s.key\"\n\
             [[server.tls.certificates]]\ncert = \"d.pem\"\nkey = \"d.key\"\n",
        );
        let tls = policy.server.tls.unwrap();
        assert_eq!(tls.min_version, TlsVersion::Tls13);
        assert_eq!(tls.hsts.unwrap(), "max-age=60");
        assert_eq!(
            tls.certificates[0].hosts,
            [
                HostPattern::Exact("shop.example.com".to_owned()),
                HostPattern::Wildcard("shop.example.com".to_owned())
            ]
        );
        assert!(tls.certificates[1].hosts.is_empty());
    }

    #[test]
    fn acme_alone_is_enough_and_fills_its_defaults() {
        let policy = policy(
            "[server]\nplain_listen = [\"127.0.0.1:8081\"]\n[server.tls.acme]\ndirectory = \"https://acme.example/dir\"\n\
             hosts = [\"API.example.com\"]\nstate_dir = \"/var/lib/tollgate/acme\"\nchallenge = \"http-01\"\n",
        );
        let acme = policy.server.tls.unwrap().acme.unwrap();
        assert_eq!(acme.hosts, ["api.example.com"]);
        assert_eq!(acme.challenge, crate::config::AcmeChallenge::Http01);
        assert_eq!(
            acme.renew_before,
            std::time::Duration::from_secs(30 * 86_400)
        );
        assert_eq!(acme.ca_file, None);
    }

    #[test]
    fn a_host_listed_twice_is_an_error_naming_it() {
        let (key, message) = error(
            "[[server.tls.certificates]]\nhosts = [\"a.example.com\"]\ncert = \"a.pem\"\nkey = \"a.key\"\n\
             [[server.tls.certificates]]\nhosts = [\"A.example.com\"]\ncert = \"b.pem\"\nkey = \"b.key\"\n",
        );
        assert!(key.starts_with("server.tls.certificates"), "{key}");
        assert!(
            message.contains("a.example.com is listed twice"),
            "{message}"
        );
    }

    #[test]
    fn mistakes_in_the_tls_table_are_named() {
        for (text, expected) in [
            ("[server.tls]\ncert = \"a.pem\"\n", "`cert` and `key` go together"),
            ("[server.tls]\nmin_version = \"1.3\"\n", "no certificate"),
            (
                "[server.tls]\ncert = \"a.pem\"\nkey = \"a.key\"\nmin_version = \"1.1\"\n",
                "expected \"1.2\" or \"1.3\"",
            ),
            (
                "[server.tls]\ncert = \"a.pem\"\nkey = \"a.key\"\nhsts = \"a\\nb\"\n",
                "a Strict-Transport-Security value",
            ),
            (
                "[server.tls]\ncert = \"a.pem\"\nkey = \"a.key\"\n[[server.tls.certificates]]\ncert = \"b.pem\"\nkey = \"b.key\"\n",
                "a second certificate without `hosts`",
            ),
            (
                "[[server.tls.certificates]]\nhosts = [\"*.com\"]\ncert = \"b.pem\"\nkey = \"b.key\"\n",
                "a wildcard needs a parent",
            ),
            (
                "[server]\nplain_listen = [\"0.0.0.0:8080\"]\n",
                "also a listener",
            ),
            (
                "[server.tls.acme]\ndirectory = \"http://acme.example/dir\"\nhosts = [\"a.example\"]\nstate_dir = \"acme\"\n",
                "expected the https:// URL",
            ),
            (
                "[server.tls.acme]\ndirectory = \"https://acme.example/dir\"\nhosts = [\"*.a.example\"]\nstate_dir = \"acme\"\n",
                "needs the dns-01 challenge",
            ),
            (
                "[server.tls.acme]\ndirectory = \"https://acme.example/dir\"\nhosts = [\"a.example\"]\nstate_dir = \"acme\"\nchallenge = \"http-01\"\n",
                "set [server] plain_listen",
            ),
            (
                "[server.tls.acme]\ndirectory = \"https://acme.example/dir\"\nhosts = [\"a.example\"]\nstate_dir = \"acme\"\nchallenge = \"dns-01\"\n",
                "expected \"tls-alpn-01\" or \"http-01\"",
            ),
            (
                "[server.tls.acme]\ndirectory = \"https://acme.example/dir\"\nhosts = [\"a.example\"]\nstate_dir = \"acme\"\n\
                 [[server.tls.certificates]]\nhosts = [\"A.example\"]\ncert = \"b.pem\"\nkey = \"b.key\"\n",
                "a.example is also listed in [[server.tls.certificates]]",
            ),
        ] {
            let found = errors(text);
            assert!(
                found.iter().any(|(_, message)| message.contains(expected)),
                "{text}: {found:?}"
            );
        }
    }
}
