//! `tollgate replay`: a policy decided against logged traffic, line by line, with the log's
//! clock. Routes are found by the gateway's own matching, each bucket decided by its own
//! bucket math (`limit::bucket`); keys come from the log (`keys`, written by the gateway's
//! access log, or the client address for `client_network` limits). What a line cannot provide
//! is counted as not replayable, never guessed.

mod read;
mod report;

use std::collections::HashMap;

use http::Method;

use crate::config::{KeySource, Policy};
use crate::limit::{bucket, BucketState, Timestamp, Verdicts};
use crate::{key, path, route};

pub use read::{read_lines, LogLine};
pub use report::{LimitReport, Report};

/// Replays lines against `policy`; lines must come in time order (a log's order).
pub struct Replay<'p> {
    policy: &'p Policy,
    /// Per (limit, key): the bucket, as the gateway's store would hold it.
    buckets: HashMap<(usize, String), BucketState>,
    /// Per route, per entry: the limit's index in the policy (buckets are the limit's, whatever
    /// route charges them).
    limit_indexes: Vec<Vec<usize>>,
    /// Per (route, limit): what the report tells.
    pub(crate) tallies: Vec<Vec<report::Tally>>,
    pub(crate) lines: u64,
    pub(crate) bad_lines: Vec<(u64, String)>,
    pub(crate) bad_line_count: u64,
    pub(crate) unrouted: u64,
    pub(crate) undecided: u64,
}

impl<'p> Replay<'p> {
    pub fn new(policy: &'p Policy) -> Replay<'p> {
        Replay {
            policy,
            buckets: HashMap::new(),
            limit_indexes: policy
                .routes
                .iter()
                .map(|route| {
                    route
                        .limits
                        .iter()
                        .map(|entry| {
                            policy
                                .limits
                                .iter()
                                .position(|limit| std::sync::Arc::ptr_eq(limit, &entry.limit))
                                .unwrap_or(0)
                        })
                        .collect()
                })
                .collect(),
            tallies: policy
                .routes
                .iter()
                .map(|route| {
                    route
                        .limits
                        .iter()
                        .map(|_| report::Tally::default())
                        .collect()
                })
                .collect(),
            lines: 0,
            bad_lines: Vec::new(),
            bad_line_count: 0,
            unrouted: 0,
            undecided: 0,
        }
    }

    /// A line that could not be read: counted, and the first ones kept with their numbers.
    pub fn bad_line(&mut self, number: u64, why: String) {
        self.bad_line_count += 1;
        if self.bad_lines.len() < 10 {
            self.bad_lines.push((number, why));
        }
    }

    /// Decides one logged request, as the gateway would have with this policy.
    pub fn decide(&mut self, line: &LogLine) {
        self.lines += 1;
        if !line.decided {
            // The gateway answered it before any limit (a bad request, no route).
            self.undecided += 1;
            return;
        }
        let Ok(method) = line.method.parse::<Method>() else {
            self.undecided += 1;
            return;
        };
        let normalized = path::normalize(&line.path);
        let match_path = path::for_matching(&normalized, self.policy.server.path_matching);
        let Some(route_index) =
            route::find(&self.policy.routes, None, &method, &match_path).map(|found| {
                self.policy
                    .routes
                    .iter()
                    .position(|route| std::ptr::eq(route, found))
                    .unwrap_or(0)
            })
        else {
            self.unrouted += 1;
            return;
        };
        let route = &self.policy.routes[route_index];
        let now = Timestamp((line.time.max(0.0) * 1e9) as u64);
        let mut charges = Vec::new();
        let mut keys = Vec::new();
        let mut positions = Vec::new();
        for (position, entry) in route.limits.iter().enumerate() {
            let limit = &*entry.limit;
            let tally = &mut self.tallies[route_index][position];
            tally.requests += 1;
            let Some(bucket_key) = key_of(limit, line) else {
                tally.not_replayable += 1;
                continue;
            };
            if limit
                .exempt
                .iter()
                .any(|network| line.client.is_some_and(|client| network.contains(&client)))
            {
                continue;
            }
            let limit_index = self.limit_indexes[route_index][position];
            let Some(charge) = limit.charge(None, entry.cost, 1.0, || line.time) else {
                continue;
            };
            charges.push(charge);
            keys.push((limit_index, bucket_key));
            positions.push(position);
        }
        let mut states: Vec<Option<BucketState>> = keys
            .iter()
            .map(|key| self.buckets.get(key).copied())
            .collect();
        let mut verdicts = Verdicts::new();
        bucket::decide(&charges, &mut states, now, &mut verdicts);
        for (((key, state), verdict), (position, charge)) in keys
            .into_iter()
            .zip(states)
            .zip(&verdicts)
            .zip(positions.into_iter().zip(&charges))
        {
            let tally = &mut self.tallies[route_index][position];
            tally.record(
                &key.1,
                line.time,
                charge.cost,
                !verdict.sufficient,
                charge.rate,
            );
            if let Some(state) = state {
                self.buckets.insert(key, state);
            }
        }
    }

    /// What the replay found.
    pub fn report(&self) -> Report {
        report::report(self)
    }
}

/// The key a logged request has for `limit`: the gateway's own, from `keys`; or, for a limit
/// keyed by the client's network (or `global`), worked out from the logged client.
fn key_of(limit: &crate::config::Limit, line: &LogLine) -> Option<String> {
    if let Some(logged) = line.keys.get(&*limit.name) {
        return Some(logged.clone());
    }
    match limit.key.as_slice() {
        [] => Some("global".to_owned()),
        [KeySource::ClientNetwork] => {
            let network = key::client_network(line.client?, limit.ipv4_prefix, limit.ipv6_prefix);
            let mut text = String::new();
            crate::limit::KeyPart::Network(network).push_to(&mut text);
            Some(text)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests;
