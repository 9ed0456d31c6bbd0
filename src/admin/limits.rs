//! `/limits` on the admin listener: the compiled limits, one key's state, and a reset (a
//! support desk unlocking a locked-out account). The key's value is normalized and hashed as a
//! request's would be; every reset is logged with the hashed key, never the value.

use std::net::IpAddr;

use http::{Method, StatusCode};
use serde_json::{json, Value};

use crate::body::Body;
use crate::config::{Limit, Mode, Tier};
use crate::key;
use crate::limit::{BucketKey, Charge, KeyParts};
use crate::overrides::Override;
use crate::respond;
use crate::shared::Shared;

/// Answers `/limits` and `/limits/{limit}?key=VALUE[&key=VALUE…][&tier=NAME]`.
pub(super) async fn answer(
    shared: &Shared,
    method: &Method,
    path: &str,
    query: Option<&str>,
    peer: IpAddr,
) -> http::Response<Body> {
    let runtime = shared.runtime.load_full();
    let policy = &runtime.policy;
    let name = match path.strip_prefix("/limits") {
        Some("" | "/") if *method == Method::GET => return all_limits(&policy.limits),
        Some("" | "/") => return method_not_allowed(),
        Some(rest) => rest.trim_start_matches('/'),
        None => return respond::error(StatusCode::NOT_FOUND, "not_found", None),
    };
    let Some(limit) = policy.limits.iter().find(|limit| &*limit.name == name) else {
        return respond::error(StatusCode::NOT_FOUND, "unknown_limit", Some(name));
    };
    let pairs = query_pairs(query);
    let parts = match key_of(limit, &pairs, shared) {
        Ok(parts) => parts,
        Err(error) => return respond::bad_request(&error.to_string()),
    };
    let bucket = BucketKey {
        limit: &limit.name,
        fingerprint: limit.fingerprint,
        parts,
    };
    let tier = pairs
        .iter()
        .find(|(name, _)| name == "tier")
        .and_then(|(_, tier)| limit.tiers.iter().find(|(name, _)| name == tier))
        .map(|(_, tier)| tier);
    let (charge, overridden) = numbers(shared, limit, &bucket.parts, tier);
    match *method {
        Method::GET | Method::HEAD => {
            let mut state = key_state(shared, limit, &bucket, &charge).await;
            if let Ok(state) = &mut state {
                state["override"] = serde_json::to_value(overridden.as_deref()).unwrap_or_default();
                state["other_limits"] = other_limits(shared, policy, limit, &bucket.parts)
                    .await
                    .into();
            }
            answered(state)
        }
        Method::DELETE => reset(shared, limit, &bucket, peer).await,
        _ => method_not_allowed(),
    }
}

/// The numbers `limit`'s key `parts` is read with: its override's, else `tier`'s, else the
/// limit's own (an exempt tier has no bucket: the key reads as the limit's own).
fn numbers(
    shared: &Shared,
    limit: &Limit,
    parts: &KeyParts,
    tier: Option<&Tier>,
) -> (Charge, Option<std::sync::Arc<Override>>) {
    let overrides = shared.overrides.table();
    let overridden = overrides
        .in_force(limit, parts, shared.overrides.now())
        .cloned();
    let tier_of_override = overridden.as_ref().map(|entry| entry.tier(limit));
    let tier = tier_of_override.as_ref().or(tier);
    let charge = limit
        .charge(tier, 1.0, 1.0, || shared.store.calendar_now())
        .or_else(|| limit.charge(None, 1.0, 1.0, || shared.store.calendar_now()))
        .expect("a limit's own numbers always make a charge");
    (charge, overridden)
}

/// The other limits of the routes that apply `limit`, so that a support desk sees why a key
/// is still refused after a reset: each with its state for the same key where it is keyed the
/// same way, else how it is keyed.
async fn other_limits(
    shared: &Shared,
    policy: &crate::config::Policy,
    limit: &Limit,
    parts: &KeyParts,
) -> Vec<Value> {
    let mut others = Vec::new();
    for route in &policy.routes {
        if !route
            .limits
            .iter()
            .any(|entry| entry.limit.name == limit.name)
        {
            continue;
        }
        for entry in &route.limits {
            let other = &*entry.limit;
            if other.name == limit.name {
                continue;
            }
            let mut described = json!({
                "route": &*route.name,
                "limit": &*other.name,
                "key": other.key.iter().map(key::describe).collect::<Vec<_>>().join(" + "),
                "tokens": null,
                "capacity": null,
            });
            if other.key == limit.key && other.normalize == limit.normalize {
                let bucket = BucketKey {
                    limit: &other.name,
                    fingerprint: other.fingerprint,
                    parts: parts.clone(),
                };
                let (charge, _) = numbers(shared, other, parts, None);
                if let Ok(state) = key_state(shared, other, &bucket, &charge).await {
                    described["tokens"] = state["tokens"].clone();
                    described["capacity"] = state["capacity"].clone();
                }
            }
            others.push(described);
        }
    }
    others
}

/// The query's name and value pairs, decoded.
pub(super) fn query_pairs(query: Option<&str>) -> Vec<(String, String)> {
    query
        .map(|query| {
            form_urlencoded::parse(query.as_bytes())
                .into_owned()
                .collect()
        })
        .unwrap_or_default()
}

/// The key the query's `key=` values name in `limit`, read as a request's would be.
pub(super) fn key_of(
    limit: &Limit,
    pairs: &[(String, String)],
    shared: &Shared,
) -> Result<KeyParts, key::ValuesError> {
    let values: Vec<&str> = pairs
        .iter()
        .filter(|(name, _)| name == "key")
        .map(|(_, value)| value.as_str())
        .collect();
    key::parts_of_values(limit, &values, &shared.hasher)
}

/// One key's state: its tokens, penalty, ban and period.
async fn key_state(
    shared: &Shared,
    limit: &Limit,
    bucket: &BucketKey<'_>,
    charge: &Charge,
) -> Result<Value, String> {
    let params = limit.adaptive.as_ref().map(|adaptive| &adaptive.params);
    let state = shared
        .store
        .inspect(bucket, charge, params)
        .await
        .map_err(|error| error.to_string())?;
    Ok(json!({
        "limit": &*limit.name,
        "tokens": state.tokens,
        "capacity": state.capacity,
        "penalty": state.penalty.map(|(factor, until)| json!({
            "factor": factor,
            "until_unix": until,
        })),
        "resets_in": charge.period.map(|period| period.ends_in),
        "banned_until_unix": state.banned_until,
    }))
}

fn answered(state: Result<Value, String>) -> http::Response<Body> {
    match state {
        Ok(state) => respond::full(StatusCode::OK, "application/json", state.to_string()),
        Err(error) => store_failed(&error),
    }
}

/// Forgets a key's bucket, penalty and ban (it is full again), and logs who did.
async fn reset(
    shared: &Shared,
    limit: &Limit,
    bucket: &BucketKey<'_>,
    peer: IpAddr,
) -> http::Response<Body> {
    let result = shared.store.forget(bucket).await;
    // The on_store_failure = "local" buckets of this replica forget it too.
    shared.local.forget(bucket);
    match result {
        Ok(()) => {
            tracing::info!(limit = %limit.name, key = %bucket, who = %peer, "key reset");
            let mut response = http::Response::new(Body::empty());
            *response.status_mut() = StatusCode::NO_CONTENT;
            response
        }
        Err(error) => store_failed(&error.to_string()),
    }
}

fn all_limits(limits: &[std::sync::Arc<Limit>]) -> http::Response<Body> {
    let limits: Vec<Value> = limits.iter().map(|limit| describe(limit)).collect();
    respond::full(
        StatusCode::OK,
        "application/json",
        json!({ "limits": limits }).to_string(),
    )
}

fn describe(limit: &Limit) -> Value {
    let mut entry = json!({
        "name": &*limit.name,
        "kind": if limit.calendar.is_some() { "quota" } else { "bucket" },
        "capacity": limit.capacity,
        "mode": match limit.mode { Mode::Enforce => "enforce", Mode::Shadow => "shadow" },
        "key_parts": limit.key.len(),
    });
    match &limit.calendar {
        Some(calendar) => {
            entry["period"] = calendar.period.as_str().into();
            entry["timezone"] = calendar.zone_name.clone().into();
        }
        None => entry["rate_per_second"] = limit.rate.per_second().into(),
    }
    if !limit.tiers.is_empty() {
        let tiers: serde_json::Map<String, Value> = limit
            .tiers
            .iter()
            .map(|(name, tier)| {
                let value = match tier {
                    Tier::Exempt => "exempt".into(),
                    Tier::Bucket { capacity, rate } if limit.calendar.is_none() => {
                        json!({ "capacity": capacity, "rate_per_second": rate.per_second() })
                    }
                    Tier::Bucket { capacity, .. } => json!({ "quota": capacity }),
                };
                (name.clone(), value)
            })
            .collect();
        entry["tiers"] = tiers.into();
    }
    entry
}

pub(super) fn method_not_allowed() -> http::Response<Body> {
    respond::error(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", None)
}

pub(super) fn store_failed(detail: &str) -> http::Response<Body> {
    respond::error(
        StatusCode::SERVICE_UNAVAILABLE,
        "store_unavailable",
        Some(detail),
    )
}
