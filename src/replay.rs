//! `tollgate replay`: a policy decided against logged traffic, line by line, with the log's
//! clock. Routes are found by the gateway's own matching, each bucket decided by its own
//! bucket math (`limit::bucket`); keys come from the log (`keys`, written by the gateway's
//! access log, or the client address for `client_network` limits). What a line cannot provide
//! is counted as not replayable, never guessed.

mod compare;
mod errors;
mod flat_json;
mod html;
mod log_line;
mod nginx_format;
mod proxy_json;
mod read;
mod report;
mod svg;
mod time;
mod timeline;

use std::cell::RefCell;
use std::collections::HashMap;
use std::net::IpAddr;
use std::rc::Rc;

use http::Method;

use crate::config::{KeySource, Limit, Policy, Route, RouteLimit};
use crate::geoip::Origin;
use crate::key::KeyHasher;
use crate::limit::{bucket, BucketState, Charge, KeyPart, Timestamp, Verdicts};
use crate::{client_ip, key, path, route};

pub use compare::{Compared, Comparison};
pub use errors::{FormatError, LineError, OpenError};
pub use nginx_format::NginxFormat;
pub use read::{read_lines, Format, LineParser, LogLine, LoggedField, LoggedKeys};
pub use report::{LimitReport, Report, TopKey};
pub use timeline::Timeline;

/// A hasher that is the same in every run, so that a report's order of equal keys is too.
type Hasher = foldhash::fast::FixedState;

/// Replays lines against `policy`, in whatever order their times come (a bucket's moment only
/// moves forward, as in the gateway); the report says how far they went back.
pub struct Replay<'p> {
    policy: &'p Policy,
    /// The policy's routes, in match order, each with its limits' keys and tallies.
    pub(crate) routes: Vec<ReplayedRoute<'p>>,
    pub(crate) lines: u64,
    pub(crate) bad_lines: Vec<(u64, String)>,
    pub(crate) bad_line_count: u64,
    pub(crate) unrouted: u64,
    pub(crate) undecided: u64,
    /// How the log's lines went back in time (no real log is in order, to the second).
    pub(crate) order: report::TimeOrder,
    /// Reused from line to line: one line's charges, buckets and verdicts.
    scratch: Scratch,
    /// Hashes values a log recorded (a header, cookie or query parameter) into keys, as the
    /// gateway does: with the policy's `hash_key` they read as the gateway's store keys.
    hasher: KeyHasher,
}

/// A route as the replay decides it.
pub(crate) struct ReplayedRoute<'p> {
    pub(crate) route: &'p Route,
    pub(crate) entries: Vec<ReplayedEntry<'p>>,
}

impl AsRef<Route> for ReplayedRoute<'_> {
    fn as_ref(&self) -> &Route {
        self.route
    }
}

/// One limit of a route: the limit's keys and buckets (shared by every route that names it,
/// as the gateway's buckets are), and what the report tells of this route's use of it.
pub(crate) struct ReplayedEntry<'p> {
    pub(crate) entry: &'p RouteLimit,
    pub(crate) keys: Rc<RefCell<KeyTable>>,
    pub(crate) tally: report::Tally,
}

/// One limit's keys, each numbered once: a line's key is looked up, never copied.
#[derive(Default)]
pub(crate) struct KeyTable {
    numbers: HashMap<Box<str>, u32, Hasher>,
    pub(crate) names: Vec<Box<str>>,
    buckets: Vec<Option<BucketState>>,
    pub(crate) usage: Vec<report::KeyUsage>,
}

impl KeyTable {
    fn number(&mut self, key: &str) -> u32 {
        if let Some(number) = self.numbers.get(key) {
            return *number;
        }
        let number = self.names.len() as u32;
        self.numbers.insert(key.into(), number);
        self.names.push(key.into());
        self.buckets.push(None);
        self.usage.push(report::KeyUsage::default());
        number
    }
}

#[derive(Default)]
struct Scratch {
    charges: Vec<Charge>,
    /// Per charge: the entry's position in the route, the key's number in its limit's table.
    buckets: Vec<(usize, u32)>,
    states: Vec<Option<BucketState>>,
    verdicts: Verdicts,
    /// Per charge: what the response settled it to, when the log says.
    settled: Vec<Option<f64>>,
    network_key: String,
}

impl<'p> Replay<'p> {
    pub fn new(policy: &'p Policy) -> Replay<'p> {
        let mut tables: HashMap<&str, Rc<RefCell<KeyTable>>> = HashMap::new();
        let routes = policy
            .routes
            .iter()
            .map(|route| ReplayedRoute {
                route,
                entries: route
                    .limits
                    .iter()
                    .map(|entry| ReplayedEntry {
                        entry,
                        keys: tables.entry(&entry.limit.name).or_default().clone(),
                        tally: report::Tally::default(),
                    })
                    .collect(),
            })
            .collect();
        Replay {
            policy,
            routes,
            lines: 0,
            bad_lines: Vec::new(),
            bad_line_count: 0,
            unrouted: 0,
            undecided: 0,
            order: report::TimeOrder::default(),
            scratch: Scratch::default(),
            hasher: match &policy.store.hash_key {
                Some(secret) => KeyHasher::from_secret(secret.as_bytes()),
                None => KeyHasher::random(),
            },
        }
    }

    /// A line that could not be read: counted, and the first ones kept with their numbers.
    pub fn bad_line(&mut self, number: u64, why: LineError) {
        self.bad_line_count += 1;
        if self.bad_lines.len() < 10 {
            self.bad_lines.push((number, why.to_string()));
        }
    }

    /// Decides one logged request, as the gateway would have with this policy.
    pub fn decide(&mut self, line: &LogLine<'_>) {
        self.lines += 1;
        self.order.record(line.time);
        if !line.decided {
            // The gateway answered it before any limit (a bad request, no route).
            self.undecided += 1;
            return;
        }
        let Ok(method) = Method::from_bytes(line.method.as_bytes()) else {
            self.undecided += 1;
            return;
        };
        let normalized = path::normalize(&line.path);
        let match_path = path::for_matching(&normalized, self.policy.server.path_matching);
        let host = line.host.as_deref().map(route::host_name);
        let client = self.client(line);
        let Some(route) = route::find_mut(&mut self.routes, host.as_deref(), &method, &match_path)
        else {
            self.unrouted += 1;
            return;
        };
        let now = Timestamp((line.time.max(0.0) * 1e9) as u64);
        let scratch = &mut self.scratch;
        charge_entries(route, line, client, &self.hasher, scratch);
        let Scratch {
            charges,
            buckets,
            states,
            verdicts,
            settled,
            ..
        } = scratch;
        states.clear();
        states.extend(
            buckets.iter().map(|&(position, key)| {
                route.entries[position].keys.borrow().buckets[key as usize]
            }),
        );
        let admitted = bucket::decide(charges, states, now, verdicts);
        let decided = buckets.iter().zip(states.iter_mut()).zip(verdicts.iter());
        for ((((&(position, key), state), verdict), charge), settled) in
            decided.zip(charges.iter()).zip(settled.iter())
        {
            let paid = admitted && (verdict.sufficient || verdict.booked);
            // A settled cost is replayed as it happened: its reservation decided, then the
            // difference to what the response settled is charged.
            let charge = match settled {
                Some(settled) if paid => {
                    *state = Some(bucket::charge_after(
                        *state,
                        charge,
                        settled - charge.cost,
                        now,
                    ));
                    Charge {
                        cost: *settled,
                        ..*charge
                    }
                }
                _ => *charge,
            };
            let replayed = &mut route.entries[position];
            let mut keys = replayed.keys.borrow_mut();
            keys.usage[key as usize].record(now, &charge);
            if state.is_some() {
                keys.buckets[key as usize] = *state;
            }
            replayed.tally.record(key, line, !verdict.sufficient);
        }
    }

    /// The client the gateway would have resolved: the logged one, or for a combined log with
    /// `X-Forwarded-For`, the one `[client_ip]` trusts.
    fn client(&self, line: &LogLine<'_>) -> Option<IpAddr> {
        let peer = line.client?;
        match &line.forwarded_for {
            Some(forwarded_for) => {
                client_ip::resolve(&self.policy.client_ip.trust, peer, [&**forwarded_for])
                    .ok()
                    .map(|resolved| resolved.client)
            }
            None => Some(peer),
        }
    }

    /// What the replay found.
    pub fn report(&self) -> Report {
        report::report(self)
    }
}

/// One charge per limit of `route` that applies to `line`, into `scratch` (a limit whose key
/// the log does not carry is counted as not replayable; an exempt client has no bucket).
fn charge_entries(
    route: &mut ReplayedRoute<'_>,
    line: &LogLine<'_>,
    client: Option<IpAddr>,
    hasher: &KeyHasher,
    scratch: &mut Scratch,
) {
    scratch.charges.clear();
    scratch.buckets.clear();
    scratch.settled.clear();
    let mut logged_keys = line.logged_keys();
    for (position, replayed) in route.entries.iter_mut().enumerate() {
        let limit = &*replayed.entry.limit;
        replayed.tally.requests += 1;
        if client.is_some_and(|client| key::exempts(limit, client, line.origin)) {
            continue;
        }
        let found = key_of(limit, &mut logged_keys, client, &mut scratch.network_key)
            .map(std::borrow::Cow::Borrowed)
            .or_else(|| {
                key_from_logged_values(limit, line, client, hasher).map(std::borrow::Cow::Owned)
            });
        let Some(key) = found.as_deref() else {
            replayed.tally.not_replayable += 1;
            continue;
        };
        let logged = replayed
            .entry
            .settle
            .as_ref()
            .and(line.costs.as_ref())
            .and_then(|costs| costs.of(&limit.name));
        let cost = logged.map_or(replayed.entry.cost, |(reserved, _)| reserved);
        let Some(charge) = limit.charge(None, cost, 1.0, || line.time) else {
            continue;
        };
        let number = replayed.keys.borrow_mut().number(key);
        scratch.charges.push(charge);
        scratch.settled.push(logged.map(|(_, settled)| settled));
        scratch.buckets.push((position, number));
    }
}

/// The key of a limit keyed by headers, cookies or query parameters, from the values the log
/// recorded, extracted and hashed as the gateway does; `None` when the log did not record
/// them (or the request lacked one).
fn key_from_logged_values(
    limit: &Limit,
    line: &LogLine<'_>,
    client: Option<IpAddr>,
    hasher: &KeyHasher,
) -> Option<String> {
    if line.logged.is_empty() && line.origin == Origin::default() && line.ja4.is_none() {
        return None;
    }
    let mut headers = http::HeaderMap::new();
    let mut cookies = String::new();
    let mut query = String::new();
    let mut args = form_urlencoded::Serializer::new(String::new());
    for (field, value) in &line.logged {
        match field {
            LoggedField::Header(name) => {
                let name = http::HeaderName::from_bytes(name.as_bytes()).ok();
                let value = http::HeaderValue::from_str(value).ok();
                if let (Some(name), Some(value)) = (name, value) {
                    headers.append(name, value);
                }
            }
            LoggedField::Cookie(name) => {
                if !cookies.is_empty() {
                    cookies.push_str("; ");
                }
                cookies.push_str(name);
                cookies.push('=');
                cookies.push_str(value);
            }
            LoggedField::Arg(name) => {
                args.append_pair(name, value);
            }
            LoggedField::Query => {
                if !query.is_empty() {
                    query.push('&');
                }
                query.push_str(value);
            }
        }
    }
    if let Ok(cookies) = http::HeaderValue::from_str(&cookies) {
        if !cookies.is_empty() {
            headers.append(http::header::COOKIE, cookies);
        }
    }
    let args = args.finish();
    if !args.is_empty() {
        if !query.is_empty() {
            query.push('&');
        }
        query.push_str(&args);
    }
    let client = client.unwrap_or(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED));
    let facts = key::RequestFacts::new(
        client,
        &headers,
        (!query.is_empty()).then_some(&query),
        None,
    )
    .with_client(line.origin, line.ja4.as_deref());
    let parts = key::extract(limit, &facts, hasher).ok()??;
    let bucket = crate::limit::BucketKey {
        limit: &limit.name,
        fingerprint: limit.fingerprint,
        parts,
    };
    let mut key = String::new();
    bucket.push_key_to(&mut key);
    Some(key)
}

/// The key a logged request has for `limit`: the gateway's own, from `keys`; or, for a limit
/// keyed by the client's network (or `global`), worked out from the client (spelled into
/// `scratch`).
fn key_of<'k: 's, 's>(
    limit: &Limit,
    logged_keys: &mut LoggedKeys<'k>,
    client: Option<IpAddr>,
    scratch: &'s mut String,
) -> Option<&'s str> {
    if let Some(logged) = logged_keys.key(&limit.name) {
        return Some(logged);
    }
    match limit.key.as_slice() {
        [] => Some("global"),
        [KeySource::ClientNetwork] => {
            let network = key::client_network(client?, limit.ipv4_prefix, limit.ipv6_prefix);
            scratch.clear();
            KeyPart::Network(network).push_to(scratch);
            Some(scratch)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests;
