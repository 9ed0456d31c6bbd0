//! `[store]`: where buckets live (memory, or Redis on one node or a Cluster), its bounds and
//! the secret that hashes request-derived keys.

use std::path::Path;
use std::time::Duration;

use toml::Spanned;

use super::{duration_or, resolve, Errors};
use crate::config::raw;
use crate::config::{Backend, OverrideSettings, RedisSettings, StoreSettings};
use crate::limit::redis::{Credentials, Password, SentinelSettings};

const DEFAULT_MAX_KEYS: i64 = 1_000_000;

pub(super) fn compile_store(
    raw: raw::RawStore,
    base: Option<&Path>,
    errors: &mut Errors<'_>,
) -> StoreSettings {
    let backend = raw
        .backend
        .as_ref()
        .map_or(Backend::Memory, |backend| *backend.get_ref());
    let max_keys = match &raw.max_keys {
        None => DEFAULT_MAX_KEYS as usize,
        Some(keys) if *keys.get_ref() >= 1 => *keys.get_ref() as usize,
        Some(keys) => {
            errors.at(
                Some(keys.span()),
                "store.max_keys",
                format!("{} is out of range: expected at least 1", keys.get_ref()),
            );
            1
        }
    };
    if let Some(key) = &raw.hash_key {
        if key.get_ref().len() < 16 {
            errors.at(
                Some(key.span()),
                "store.hash_key",
                "too short: use at least 16 characters of secret (or set TOLLGATE_HASH_KEY)",
            );
        }
    }
    let hash_key = raw.hash_key.clone().map(Spanned::into_inner).or_else(|| {
        std::env::var("TOLLGATE_HASH_KEY")
            .ok()
            .filter(|key| !key.is_empty())
    });
    let redis = match backend {
        Backend::Memory => None,
        Backend::Redis => compile_redis(&raw, hash_key.is_some(), base, errors),
    };
    StoreSettings {
        backend,
        max_keys,
        hash_key,
        redis,
    }
}

/// `[overrides]`: the memory store's file (Redis keeps overrides itself), and the longest
/// an override may last.
pub(super) fn compile_overrides(
    raw: raw::RawOverrides,
    store: &StoreSettings,
    base: Option<&Path>,
    errors: &mut Errors<'_>,
) -> OverrideSettings {
    if let (Some(file), Backend::Redis) = (&raw.file, store.backend) {
        errors.at(
            Some(file.span()),
            "overrides.file",
            "with the redis backend, overrides live in Redis: remove file",
        );
    }
    let file = raw.file.as_ref().map(|file| resolve(base, file.get_ref()));
    let max_ttl = raw.max_ttl.map(|max_ttl| {
        let span = max_ttl.span();
        let max_ttl = max_ttl.into_inner().0;
        if max_ttl.is_zero() {
            errors.at(Some(span), "overrides.max_ttl", "must be longer than zero");
        }
        max_ttl
    });
    OverrideSettings { file, max_ttl }
}

/// The Redis backend's settings; `None` (and an error) without a usable url.
fn compile_redis(
    raw: &raw::RawStore,
    has_hash_key: bool,
    base: Option<&Path>,
    errors: &mut Errors<'_>,
) -> Option<RedisSettings> {
    let span = raw.backend.as_ref().map(Spanned::span);
    if !has_hash_key {
        errors.at(
            span.clone(),
            "store.hash_key",
            "the redis backend needs a secret shared by every replica to hash keys taken from requests: set hash_key or the TOLLGATE_HASH_KEY environment variable",
        );
    }
    let timeout = duration_or(raw.timeout, Duration::from_millis(50));
    if timeout.is_zero() {
        errors.at(span.clone(), "store.timeout", "must be longer than zero");
    }
    let lease = duration_or(raw.lease, Duration::from_secs(60));
    if lease < Duration::from_secs(1) {
        errors.at(
            span.clone(),
            "store.lease",
            "at least 1s: a request renews its slots every third of it",
        );
    }
    if let Some(prefix) = raw.prefix.as_deref() {
        if !crate::limit::redis::keys::prefix_keeps_ban_keys_in_slot(prefix) {
            errors.at(
                span.clone(),
                "store.prefix",
                format!("{prefix:?}: a '}}' may appear only to close a hash tag such as \"{{tollgate}}:\""),
            );
        }
    }
    let connect_timeout = duration_or(raw.connect_timeout, Duration::from_secs(1));
    if connect_timeout.is_zero() {
        errors.at(
            span.clone(),
            "store.connect_timeout",
            "must be longer than zero",
        );
    }
    let Some(url) = &raw.url else {
        errors.at(
            span,
            "store.url",
            "backend = \"redis\" needs url = \"redis://host:6379/0\" (or \"redis+cluster://host:port,host:port\")",
        );
        return None;
    };
    let credentials = compile_credentials(raw, errors);
    let settings =
        |nodes: Vec<String>, cluster: bool, sentinel: Option<SentinelSettings>| RedisSettings {
            nodes,
            cluster,
            timeout,
            connect_timeout,
            prefix: raw.prefix.clone().unwrap_or_else(|| "tollgate:".to_owned()),
            ca_file: raw.ca_file.as_deref().map(|path| resolve(base, path)),
            lease,
            credentials: credentials.clone(),
            sentinel,
        };
    if let Some(sentinel) = compile_sentinel(raw, url, errors) {
        return sentinel.map(|sentinel| settings(Vec::new(), false, Some(sentinel)));
    }
    match redis_nodes(url.get_ref(), raw.cluster.unwrap_or(false)) {
        Ok((nodes, cluster)) => Some(settings(nodes, cluster, None)),
        Err(error) => {
            errors.at(Some(url.span()), "store.url", error.to_string());
            None
        }
    }
}

/// A `redis+sentinel://` url's sentinels and master, with the sentinels' password; `None` for
/// another url (where `sentinel_password_env` is an error), `Some(None)` for a bad one.
#[allow(clippy::option_option)]
fn compile_sentinel(
    raw: &raw::RawStore,
    url: &Spanned<String>,
    errors: &mut Errors<'_>,
) -> Option<Option<SentinelSettings>> {
    let password = raw
        .sentinel_password_env
        .as_ref()
        .and_then(|variable| password_from(variable, "store.sentinel_password_env", errors));
    let Some(parsed) = sentinel_url(url.get_ref()) else {
        if let Some(variable) = &raw.sentinel_password_env {
            errors.at(
                Some(variable.span()),
                "store.sentinel_password_env",
                "applies to a redis+sentinel:// url only",
            );
        }
        return None;
    };
    Some(match parsed {
        Ok(mut sentinel) => {
            sentinel.credentials.password = password;
            Some(sentinel)
        }
        Err(error) => {
            errors.at(Some(url.span()), "store.url", error.to_string());
            None
        }
    })
}

/// `username`, and the password read from `password_env` (an unset or empty variable is an
/// error naming it; the password itself is never shown).
fn compile_credentials(raw: &raw::RawStore, errors: &mut Errors<'_>) -> Credentials {
    let username = raw.username.as_ref().map(|username| {
        if username.get_ref().is_empty() {
            errors.at(
                Some(username.span()),
                "store.username",
                "empty: leave it out for the default user",
            );
        }
        username.get_ref().clone()
    });
    let password = raw
        .password_env
        .as_ref()
        .and_then(|variable| password_from(variable, "store.password_env", errors));
    Credentials { username, password }
}

/// The password in the environment variable `variable` names; an unset or empty one is an
/// error at `key`, naming the variable.
fn password_from(
    variable: &Spanned<String>,
    key: &str,
    errors: &mut Errors<'_>,
) -> Option<Password> {
    match std::env::var(variable.get_ref()) {
        Ok(password) if !password.is_empty() => Some(Password(password)),
        _ => {
            errors.at(
                Some(variable.span()),
                key.to_owned(),
                format!(
                    "${} is not set (or empty): set it to the password",
                    variable.get_ref()
                ),
            );
            None
        }
    }
}

/// `redis+sentinel://host:port,host:port/NAME[/DB]` (`rediss+sentinel://` for TLS): the
/// sentinels, the master's name and its database; `None` for any other url.
fn sentinel_url(url: &str) -> Option<Result<SentinelSettings, RedisUrlError>> {
    let (scheme, rest) = url.split_once("://")?;
    let scheme = scheme.strip_suffix("+sentinel")?;
    if scheme != "redis" && scheme != "rediss" {
        return Some(Err(RedisUrlError::Scheme {
            url: redacted(url),
            scheme: format!("{scheme}+sentinel"),
        }));
    }
    let (hosts, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (master, db) = path.split_once('/').unwrap_or((path, "0"));
    let sentinels: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|host| !host.is_empty())
        .map(|host| format!("{scheme}://{host}"))
        .collect();
    let db = db.trim_end_matches('/').parse::<i64>().ok();
    Some(match (sentinels.is_empty(), master.is_empty(), db) {
        (true, _, _) => Err(RedisUrlError::NoHost(redacted(url))),
        (false, true, _) | (_, _, None) => Err(RedisUrlError::Node {
            url: redacted(url),
            reason: "after the sentinels come the master's name and, optionally, a database number"
                .to_owned(),
        }),
        (false, false, Some(db)) => Ok(SentinelSettings {
            sentinels,
            master: master.to_owned(),
            scheme: scheme.to_owned(),
            db,
            credentials: Credentials::default(),
        }),
    })
}

/// Whether a store url carries a password (`redis://user:password@host`), which belongs in
/// `password_env`.
pub(super) fn url_has_password(url: &str) -> bool {
    userinfo(url).is_some_and(|userinfo| {
        userinfo
            .split_once(':')
            .is_some_and(|(_, password)| !password.is_empty())
    })
}

fn userinfo(url: &str) -> Option<&str> {
    let (_, rest) = url.split_once("://")?;
    let authority = rest.split('/').next().unwrap_or(rest);
    Some(authority.rsplit_once('@')?.0)
}

/// `url` as errors show it: a password it carries written as `***`.
fn redacted(url: &str) -> String {
    match userinfo(url).and_then(|userinfo| userinfo.split_once(':')) {
        Some((user, password)) if !password.is_empty() => {
            url.replacen(&format!("{user}:{password}@"), &format!("{user}:***@"), 1)
        }
        _ => url.to_owned(),
    }
}

const EXPECTED: &str = "expected \"redis://[user:password@]host:port[/db]\", \"rediss://...\" or \"redis+cluster://host:port,host:port\"";

/// Why a store url is not one (each names the url).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum RedisUrlError {
    #[error("invalid url {0:?}: {EXPECTED}")]
    NoScheme(String),
    #[error("invalid url {url:?}: unknown scheme {scheme:?}; {EXPECTED}")]
    Scheme { url: String, scheme: String },
    #[error("invalid url {0:?}: no host; {EXPECTED}")]
    NoHost(String),
    #[error("invalid url {0:?}: several hosts need a cluster (\"redis+cluster://...\" or cluster = true)")]
    SeveralHosts(String),
    #[error("invalid url {url:?}: {reason}; {EXPECTED}")]
    Node { url: String, reason: String },
}

/// Splits a store URL into one URL per node: `redis://[user:pass@]host:port[/db]`,
/// `rediss://...` (TLS), `redis+cluster://host:port,host:port` (or `cluster = true`).
fn redis_nodes(url: &str, cluster: bool) -> Result<(Vec<String>, bool), RedisUrlError> {
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| RedisUrlError::NoScheme(redacted(url)))?;
    let (scheme, cluster) = match scheme {
        "redis" | "rediss" => (scheme, cluster),
        "redis+cluster" => ("redis", true),
        "rediss+cluster" => ("rediss", true),
        _ => {
            return Err(RedisUrlError::Scheme {
                url: redacted(url),
                scheme: scheme.to_owned(),
            })
        }
    };
    let (authority, path) = match rest.find('/') {
        Some(slash) => rest.split_at(slash),
        None => (rest, ""),
    };
    let (userinfo, hosts) = match authority.rsplit_once('@') {
        Some((userinfo, hosts)) => (format!("{userinfo}@"), hosts),
        None => (String::new(), authority),
    };
    let nodes: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|host| !host.is_empty())
        .map(|host| format!("{scheme}://{userinfo}{host}{path}"))
        .collect();
    if nodes.is_empty() {
        return Err(RedisUrlError::NoHost(redacted(url)));
    }
    if !cluster && nodes.len() > 1 {
        return Err(RedisUrlError::SeveralHosts(redacted(url)));
    }
    for node in &nodes {
        redis::IntoConnectionInfo::into_connection_info(node.as_str()).map_err(|error| {
            RedisUrlError::Node {
                url: redacted(url),
                reason: error.to_string(),
            }
        })?;
    }
    Ok((nodes, cluster))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::testing::{error, policy};
    use super::redis_nodes;
    use crate::config::Backend;

    const SECRET: &str = "hash_key = \"0123456789abcdef\"\n";

    #[test]
    fn credentials_come_from_the_environment_and_a_password_in_the_url_is_warned_about() {
        let store = |extra: &str, url: &str| {
            format!("[store]\nbackend = \"redis\"\nurl = \"{url}\"\n{SECRET}{extra}")
        };
        std::env::set_var("TOLLGATE_TEST_STORE_PASSWORD", "from-the-environment");
        let policy = policy(&store(
            "username = \"gateway\"\npassword_env = \"TOLLGATE_TEST_STORE_PASSWORD\"\n",
            "redis://127.0.0.1:6379",
        ));
        let credentials = &policy.store.redis.as_ref().unwrap().credentials;
        assert_eq!(credentials.username.as_deref(), Some("gateway"));
        assert_eq!(
            credentials.password,
            Some(super::Password("from-the-environment".to_owned()))
        );
        assert!(
            !format!("{policy:?}").contains("from-the-environment"),
            "a password is never printed"
        );
        assert!(policy
            .warnings
            .iter()
            .all(|warning| !warning.contains("password")));

        let (key, message) = error(&store(
            "password_env = \"TOLLGATE_TEST_STORE_PASSWORD_UNSET\"\n",
            "redis://127.0.0.1:6379",
        ));
        assert_eq!(key, "store.password_env");
        assert!(
            message.contains("TOLLGATE_TEST_STORE_PASSWORD_UNSET"),
            "{message}"
        );

        let in_url = policy_with_url("redis://gateway:s3cret@127.0.0.1:6379/0");
        assert!(
            in_url
                .warnings
                .iter()
                .any(|warning| warning.contains("store.url carries a password")),
            "{:?}",
            in_url.warnings
        );
        let (_, message) = error(&store(
            "",
            "redis://gateway:s3cret@127.0.0.1:6379,127.0.0.1:6380",
        ));
        assert!(!message.contains("s3cret"), "{message}");
        assert!(message.contains("gateway:***@"), "{message}");
    }

    #[test]
    fn a_sentinel_url_names_the_sentinels_and_the_master() {
        let redis = policy_with_url("redis+sentinel://10.0.0.5:26379, 10.0.0.6:26379/mymaster/2")
            .store
            .redis
            .unwrap();
        assert!(redis.nodes.is_empty(), "the master is asked for");
        let sentinel = redis.sentinel.unwrap();
        assert_eq!(
            sentinel.sentinels,
            ["redis://10.0.0.5:26379", "redis://10.0.0.6:26379"]
        );
        assert_eq!((sentinel.master.as_str(), sentinel.db), ("mymaster", 2));
        assert_eq!(sentinel.scheme, "redis");
        let tls = policy_with_url("rediss+sentinel://s:26379/main")
            .store
            .redis
            .unwrap();
        assert_eq!(tls.sentinel.unwrap().scheme, "rediss");
        let store = |extra: &str, url: &str| {
            format!("[store]\nbackend = \"redis\"\nurl = \"{url}\"\n{SECRET}{extra}")
        };
        for url in [
            "redis+sentinel://s:26379",
            "redis+sentinel://s:26379/",
            "redis+sentinel:///mymaster",
            "redis+sentinel://s:26379/mymaster/x",
            "http+sentinel://s:26379/mymaster",
        ] {
            assert_eq!(error(&store("", url)).0, "store.url", "{url}");
        }
        std::env::set_var("TOLLGATE_TEST_SENTINEL_PASSWORD", "sentinel-secret");
        let with_password = policy(&store(
            "sentinel_password_env = \"TOLLGATE_TEST_SENTINEL_PASSWORD\"\n",
            "redis+sentinel://s:26379/mymaster",
        ));
        let sentinel = with_password.store.redis.unwrap().sentinel.unwrap();
        assert_eq!(
            sentinel.credentials.password,
            Some(super::Password("sentinel-secret".to_owned()))
        );
        assert_eq!(
            error(&store(
                "sentinel_password_env = \"TOLLGATE_TEST_SENTINEL_PASSWORD_UNSET\"\n",
                "redis+sentinel://s:26379/mymaster"
            ))
            .0,
            "store.sentinel_password_env"
        );
        assert_eq!(
            error(&store(
                "sentinel_password_env = \"TOLLGATE_TEST_SENTINEL_PASSWORD\"\n",
                "redis://127.0.0.1:6379"
            ))
            .0,
            "store.sentinel_password_env",
            "only beside sentinels"
        );
    }

    fn policy_with_url(url: &str) -> crate::config::Policy {
        policy(&format!(
            "[store]\nbackend = \"redis\"\nurl = \"{url}\"\n{SECRET}"
        ))
    }

    #[test]
    fn overrides_are_kept_in_a_file_beside_the_memory_store_only() {
        let kept_nowhere = |policy: &crate::config::Policy| {
            policy.warnings.iter().any(|warning| {
                warning.contains("overrides set through the admin API end with the process")
            })
        };
        assert!(kept_nowhere(&policy("")));
        let kept =
            policy("[overrides]\nfile = \"/var/lib/tollgate/overrides.json\"\nmax_ttl = \"90d\"\n");
        assert!(!kept_nowhere(&kept));
        assert_eq!(
            kept.overrides.file.as_deref(),
            Some(std::path::Path::new("/var/lib/tollgate/overrides.json"))
        );
        assert_eq!(
            kept.overrides.max_ttl,
            Some(Duration::from_secs(90 * 86_400))
        );
        let redis = policy(&format!(
            "[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\n{SECRET}"
        ));
        assert!(!kept_nowhere(&redis), "Redis keeps them");
        assert_eq!(
            error(&format!("[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\n{SECRET}[overrides]\nfile = \"o.json\"\n")).0,
            "overrides.file"
        );
        assert_eq!(
            error("[overrides]\nmax_ttl = \"0s\"\n").0,
            "overrides.max_ttl"
        );
        assert_eq!(
            error("[overrides]\nmax_ttl = \"soon\"\n").0,
            "overrides.max_ttl"
        );
        assert_eq!(
            error("[overrides]\nfiles = \"o.json\"\n").0,
            "overrides.files"
        );
    }

    #[test]
    fn memory_is_the_default_and_redis_needs_a_url_and_a_secret() {
        let memory = policy("");
        assert_eq!(memory.store.backend, Backend::Memory);
        assert_eq!(memory.store.max_keys, 1_000_000);
        assert!(memory.store.redis.is_none());

        let redis = policy(&format!(
            "[store]\nbackend = \"redis\"\nurl = \"redis://10.0.0.5:6380/2\"\n{SECRET}"
        ));
        let settings = redis.store.redis.expect("redis settings");
        assert_eq!(settings.nodes, ["redis://10.0.0.5:6380/2"]);
        assert!(!settings.cluster);
        assert_eq!(settings.timeout, Duration::from_millis(50));
        assert_eq!(settings.connect_timeout, Duration::from_secs(1));
        assert_eq!(settings.prefix, "tollgate:");
        let bounded = policy(&format!(
            "[store]\nbackend = \"redis\"\nurl = \"redis://h:1\"\nconnect_timeout = \"250ms\"\n{SECRET}"
        ));
        assert_eq!(
            bounded.store.redis.unwrap().connect_timeout,
            Duration::from_millis(250)
        );
        assert_eq!(
            error(&format!(
                "[store]\nbackend = \"redis\"\nurl = \"redis://h:1\"\nconnect_timeout = \"0s\"\n{SECRET}"
            ))
            .0,
            "store.connect_timeout"
        );

        assert_eq!(
            error(&format!("[store]\nbackend = \"redis\"\n{SECRET}")).0,
            "store.url"
        );
        assert_eq!(
            error("[store]\nbackend = \"redis\"\nhash_key = \"short\"\nurl = \"redis://h:1\"\n").0,
            "store.hash_key"
        );
        assert_eq!(error("[store]\nmax_keys = 0\n").0, "store.max_keys");
    }

    #[test]
    fn cluster_urls_list_their_seed_nodes() {
        let (nodes, cluster) = redis_nodes("redis+cluster://a:7000,b:7001", false).unwrap();
        assert!(cluster);
        assert_eq!(nodes, ["redis://a:7000", "redis://b:7001"]);
        let (nodes, cluster) = redis_nodes("redis://a:7000", true).unwrap();
        assert!(cluster, "cluster = true makes one URL a seed");
        assert_eq!(nodes, ["redis://a:7000"]);
        assert!(redis_nodes("http://a:7000", false).is_err());
    }
}
