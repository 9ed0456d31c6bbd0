//! One logged request as replay reads it, whatever the format: what the readers of each
//! format produce, and the small pieces of a line they share.

use std::borrow::Cow;
use std::net::IpAddr;

/// What replay needs of one logged request.
#[derive(Debug, Clone, PartialEq)]
pub struct LogLine<'a> {
    /// Unix seconds.
    pub time: f64,
    pub method: &'a str,
    pub path: Cow<'a, str>,
    /// The logged client (`client`), or the TCP peer (`$remote_addr`) when `forwarded_for` is
    /// set.
    pub client: Option<IpAddr>,
    /// `X-Forwarded-For` as the log recorded it, for `[client_ip]` to resolve.
    pub forwarded_for: Option<Cow<'a, str>>,
    /// The request's host (`Host`), for routes that match one; `None` when not logged.
    pub host: Option<Cow<'a, str>>,
    /// Each applied limit's store key, as the gateway logged it (`limit=key,…`); `None` when
    /// the format carries no keys.
    pub keys: Option<Cow<'a, str>>,
    /// The gateway took a decision on it (not a bad request, not an unrouted one).
    pub decided: bool,
    /// Header, cookie and query values the log recorded (nginx's `$http_NAME`,
    /// `$cookie_NAME`, `$arg_NAME`; the headers Caddy and Traefik log), for limits keyed by
    /// them.
    pub logged: Vec<(LoggedField, Cow<'a, str>)>,
    /// What each settled limit reserved and settled (`limit=tokens,…`), as tollgate's JSON
    /// log carries them for routes whose costs settle after the response.
    pub costs: Option<LoggedCosts<'a>>,
    /// The client's autonomous system and country, as tollgate's log carries them.
    pub origin: crate::geoip::Origin,
    /// The connection's JA4 fingerprint, as tollgate's log carries it.
    pub ja4: Option<Cow<'a, str>>,
    /// The client's `User-Agent`, where the log has it (combined's last quoted field, a
    /// proxy's logged headers).
    pub user_agent: Option<Cow<'a, str>>,
}

impl LogLine<'_> {
    /// The client's `User-Agent`: the format's own field, else a logged header.
    pub fn agent(&self) -> Option<&str> {
        self.user_agent.as_deref().or_else(|| {
            self.logged.iter().find_map(|(field, value)| {
                matches!(field, LoggedField::Header(name) if name == "user-agent")
                    .then_some(value.as_ref())
            })
        })
    }
}

/// A settled request's costs as the gateway logged them.
#[derive(Debug, Clone, PartialEq)]
pub struct LoggedCosts<'a> {
    pub reserved: Cow<'a, str>,
    pub settled: Cow<'a, str>,
}

impl LoggedCosts<'_> {
    /// What `limit` reserved and settled to, when logged.
    pub fn of(&self, limit: &str) -> Option<(f64, f64)> {
        Some((
            tokens(&self.reserved, limit)?,
            tokens(&self.settled, limit)?,
        ))
    }
}

/// The tokens logged for `limit` in `limit=tokens,…`.
fn tokens(pairs: &str, limit: &str) -> Option<f64> {
    pairs.split(',').find_map(|pair| {
        let (name, tokens) = pair.split_once('=')?;
        (name == limit).then(|| tokens.parse().ok()).flatten()
    })
}

/// What a logged value is: a request header (its name in lower case), a cookie or a query
/// parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LoggedField {
    Header(String),
    Cookie(String),
    Arg(String),
    /// The request's whole query string (`$args`, or the query of a logged target).
    Query,
}

/// The query of a request target, if it has one.
pub(super) fn query_of(target: &str) -> Option<&str> {
    let (_, query) = target.split_once('?')?;
    let query = query.split('#').next().unwrap_or(query);
    (!query.is_empty()).then_some(query)
}

impl<'a> LogLine<'a> {
    /// The keys the gateway logged, to be asked for in the route's order of limits.
    pub fn logged_keys(&self) -> LoggedKeys<'_> {
        let all = self.keys.as_deref();
        LoggedKeys { all, rest: all }
    }
}

/// A line's logged keys (`limit=key,…`). The gateway writes them in its route's order of
/// limits, so asked in that order each is found where the last one ended.
pub struct LoggedKeys<'a> {
    all: Option<&'a str>,
    rest: Option<&'a str>,
}

impl<'a> LoggedKeys<'a> {
    /// The key logged for `limit`.
    pub fn key(&mut self, limit: &str) -> Option<&'a str> {
        if let Some((key, rest)) = self.rest.and_then(|rest| first_pair(rest, limit)) {
            self.rest = rest;
            return Some(key);
        }
        let mut pairs = self.all?;
        loop {
            match first_pair(pairs, limit) {
                Some((key, _)) => return Some(key),
                None => pairs = &pairs[memchr::memchr(b',', pairs.as_bytes())? + 1..],
            }
        }
    }
}

/// When `pairs` starts with `limit=key`: the key, and the pairs after it.
fn first_pair<'a>(pairs: &'a str, limit: &str) -> Option<(&'a str, Option<&'a str>)> {
    let rest = pairs.strip_prefix(limit)?.strip_prefix('=')?;
    Some(match memchr::memchr(b',', rest.as_bytes()) {
        Some(comma) => (&rest[..comma], Some(&rest[comma + 1..])),
        None => (rest, None),
    })
}

/// The path of a request target (origin form, or absolute form), without its query.
pub(super) fn origin_path(target: &str) -> Option<&str> {
    let target = match target.split_once("://") {
        Some((_scheme, rest)) => &rest[rest.find('/')?..],
        None => target,
    };
    target
        .starts_with('/')
        .then(|| target.split(['?', '#']).next().unwrap_or(target))
}

/// A string field, borrowed unless it holds an escape (serde borrows a `Cow` only as a field
/// of its own, not inside an `Option`).
pub(super) fn text<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Cow<'de, str>>, D::Error> {
    #[derive(serde::Deserialize)]
    struct Text<'a>(#[serde(borrow)] Cow<'a, str>);
    Ok(Some(
        <Text<'de> as serde::Deserialize>::deserialize(deserializer)?.0,
    ))
}
