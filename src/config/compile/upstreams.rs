//! `[upstreams.NAME]`: where admitted requests go.

use std::path::Path;
use std::time::Duration;

use http::Uri;
use toml::Spanned;

use super::{duration_or, resolve, Errors};
use crate::config::raw;
use crate::config::{Upstream, UpstreamTarget};

pub(super) fn compile_upstream(
    name: String,
    raw: Spanned<raw::RawUpstream>,
    base: Option<&Path>,
    errors: &mut Errors<'_>,
) -> Option<Upstream> {
    let key = format!("upstreams.{name}");
    let span = raw.span();
    let raw = raw.into_inner();
    let (urls, urls_span) = match (raw.url, raw.urls) {
        (Some(_), Some(urls)) => {
            errors.at(
                Some(urls.span()),
                &key,
                "both url and urls are set: use url for one address or urls for several",
            );
            return None;
        }
        (Some(url), None) => {
            let span = url.span();
            (vec![url.into_inner()], span)
        }
        (None, Some(urls)) => {
            let span = urls.span();
            (urls.into_inner(), span)
        }
        (None, None) => {
            errors.at(
                Some(span),
                &key,
                "no url: set url = \"http://host:port\" or urls = [...]",
            );
            return None;
        }
    };
    if urls.is_empty() {
        errors.at(
            Some(urls_span.clone()),
            &key,
            "urls is empty: list at least one \"http://host:port\"",
        );
    }
    let mut targets = Vec::with_capacity(urls.len());
    for text in &urls {
        match upstream_target(text) {
            Ok(target) => targets.push(target),
            Err(error) => errors.at(
                Some(urls_span.clone()),
                format!("{key}.url"),
                error.to_string(),
            ),
        }
    }
    let connect_timeout = duration_or(raw.connect_timeout, Duration::from_secs(2));
    let timeout = duration_or(raw.timeout, Duration::from_secs(30));
    if connect_timeout.is_zero() || timeout.is_zero() {
        errors.at(
            Some(span),
            &key,
            "connect_timeout and timeout must be longer than zero",
        );
    }
    Some(Upstream {
        name,
        targets,
        connect_timeout,
        timeout,
        ca_file: raw.ca_file.as_deref().map(|path| resolve(base, path)),
        reuse: raw.reuse.unwrap_or_default(),
    })
}

const EXPECTED: &str =
    "expected \"http://host:port\", \"https://host:port\" or \"h2c://host:port\" (HTTP/2 without TLS)";

/// Why an upstream url is not one (each names the url).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum UrlError {
    #[error("invalid url {0:?}: {EXPECTED}")]
    NotAUrl(String),
    #[error("invalid url {0:?}: no host; {EXPECTED}")]
    NoHost(String),
    #[error("invalid url {0:?}: an upstream url cannot carry a query")]
    Query(String),
}

fn upstream_target(text: &str) -> Result<UpstreamTarget, UrlError> {
    let url: Uri = text
        .parse()
        .map_err(|_| UrlError::NotAUrl(text.to_owned()))?;
    match url.scheme_str() {
        Some("http" | "https" | "h2c") => {}
        _ => return Err(UrlError::NotAUrl(text.to_owned())),
    }
    if url.authority().is_none() {
        return Err(UrlError::NoHost(text.to_owned()));
    }
    if url.query().is_some() {
        return Err(UrlError::Query(text.to_owned()));
    }
    let base_path = url.path().trim_end_matches('/').to_owned();
    Ok(UpstreamTarget { url, base_path })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::testing::{error, policy};
    use super::upstream_target;

    #[test]
    fn targets_keep_their_base_path_without_the_trailing_slash() {
        let target = upstream_target("http://app:3000/api/").unwrap();
        assert_eq!(target.base_path, "/api");
        assert_eq!(upstream_target("https://app").unwrap().base_path, "");
        assert!(upstream_target("h2c://grpc:50051")
            .unwrap()
            .speaks_http2_only());
        assert!(!upstream_target("https://app").unwrap().speaks_http2_only());
        for bad in [
            "ftp://app",
            "app:3000",
            "http://app/?x=1",
            "/path",
            "h2://app",
        ] {
            assert!(upstream_target(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_upstream_has_timeouts_and_one_or_more_targets() {
        let policy = policy(
            "[upstreams.app]\nurls = [\"http://10.0.0.1:80\", \"http://10.0.0.2:80\"]\ntimeout = \"3s\"\n",
        );
        let app = &policy.upstreams[0];
        assert_eq!(app.targets.len(), 2);
        assert_eq!(app.timeout, Duration::from_secs(3));
        assert_eq!(app.connect_timeout, Duration::from_secs(2));
        assert_eq!(
            error("[upstreams.app]\nurl = \"http://a:1\"\ntimeout = \"0s\"\n").0,
            "upstreams.app"
        );
    }
}
