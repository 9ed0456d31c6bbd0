//! A route limit entry's `cost` (fixed, or read from the request) and its `settle` and
//! `scale`: what a request reserves, and how the reservation is settled after the response.

use std::ops::Range;

use http::HeaderName;

use super::Errors;
use crate::config::costs::{Field, Measure, ReadCost, Settle};
use crate::config::raw::{RawCost, RawReadCost, RawRouteLimit, RawSettle};
use crate::config::Limit;

/// What one entry charges its limit.
pub(super) struct EntryCost {
    /// The reservation: fixed, or the default of a cost read from the request.
    pub(super) cost: f64,
    pub(super) read_cost: Option<ReadCost>,
    pub(super) settle: Option<Settle>,
}

/// Compiles the entry's `cost`, `settle` and `scale`; `route_cost` is the route's own `cost`,
/// which an entry without one charges.
pub(super) fn entry_cost(
    entry: &RawRouteLimit,
    limit: &Limit,
    route_cost: f64,
    span: &Range<usize>,
    key: &str,
    errors: &mut Errors<'_>,
) -> EntryCost {
    let mut error = |message: String| errors.at(Some(span.clone()), key, message);
    let name = &limit.name;
    let settle = entry
        .settle
        .as_ref()
        .and_then(|raw| settle(raw, &mut error));
    let scale = match entry.scale {
        Some(scale) if entry.settle.is_none() => {
            error(format!("limit {name:?}: scale {scale} without settle: scale is the tokens per unit of the settled measure"));
            1.0
        }
        Some(scale) if !(scale.is_finite() && scale > 0.0) => {
            error(format!(
                "limit {name:?}: scale {scale} is out of range: it must be greater than zero"
            ));
            1.0
        }
        Some(scale) => scale,
        None => 1.0,
    };
    let settle = settle.map(|measure| Settle { measure, scale });
    let on_slots = limit.concurrency.is_some();
    if on_slots && entry.settle.is_some() {
        error(format!("limit {name:?} is a concurrency limit: it takes a slot per request, and there is no cost to settle"));
    }
    let (cost, read_cost) = match &entry.cost {
        None => (route_cost, None),
        Some(RawCost::Fixed(cost)) => {
            // Paid after the response, a request may reserve nothing up front.
            let valid = if settle.is_some() {
                *cost >= 0.0
            } else {
                *cost > 0.0
            };
            if !(cost.is_finite() && valid) {
                error(format!("cost {cost} is out of range: a cost must be greater than zero (zero with settle; use mode = \"shadow\" on the limit to observe without refusing)"));
            }
            (*cost, None)
        }
        Some(RawCost::Read(_)) if on_slots => {
            error(format!("limit {name:?} is a concurrency limit: a cost read from the request applies to buckets only"));
            (route_cost, None)
        }
        Some(RawCost::Read(raw)) => match read_cost(raw, &mut error) {
            Some(read) => (read.default, Some(read)),
            None => (route_cost, None),
        },
    };
    let capacity = limit.capacity;
    if !on_slots && cost > capacity {
        error(format!("cost {cost} is larger than limit {name:?}'s capacity {capacity}: no request could ever pass; raise the capacity or lower the cost"));
    }
    if let Some(read) = &read_cost {
        if !on_slots && read.max.is_finite() && read.max > capacity {
            error(format!("cost max {} is larger than limit {name:?}'s capacity {capacity}: a request asking for it could never pass; lower max or raise the capacity", read.max));
        }
    }
    EntryCost {
        cost,
        read_cost,
        settle,
    }
}

/// `{ json = "…" }` or `{ header = "…" }`, with `default` (required) and `max`.
fn read_cost(raw: &RawReadCost, error: &mut impl FnMut(String)) -> Option<ReadCost> {
    let field = field(raw.json.as_deref(), raw.header.as_deref(), "cost", error)?;
    let Some(default) = raw.default else {
        error("a cost read from the request needs a default: what a request without the field, or with a value that is not a non-negative number, reserves".to_owned());
        return None;
    };
    if !(default.is_finite() && default >= 0.0) {
        error(format!(
            "cost default {default} is out of range: it must be zero or more"
        ));
        return None;
    }
    let max = raw.max.unwrap_or(f64::INFINITY);
    if !(max > 0.0 && max >= default) || max.is_nan() {
        error(format!(
            "cost max {max} is out of range: it must be greater than zero and at least the default {default}"
        ));
        return None;
    }
    Some(ReadCost {
        field,
        default,
        max,
    })
}

/// `"upstream_ms"`, `"response_bytes"`, `{ json = "…" }` or `{ header = "…" }`.
fn settle(raw: &RawSettle, error: &mut impl FnMut(String)) -> Option<Measure> {
    match raw {
        RawSettle::Measure(name) => match name.as_str() {
            "upstream_ms" => Some(Measure::UpstreamMs),
            "response_bytes" => Some(Measure::ResponseBytes),
            other => {
                error(format!("unknown settle {other:?}: expected \"upstream_ms\", \"response_bytes\", {{ json = \"field\" }} or {{ header = \"name\" }}"));
                None
            }
        },
        RawSettle::Field(raw) => {
            field(raw.json.as_deref(), raw.header.as_deref(), "settle", error).map(Measure::Field)
        }
    }
}

/// Exactly one of a JSON path and a header name.
fn field(
    json: Option<&str>,
    header: Option<&str>,
    what: &str,
    error: &mut impl FnMut(String),
) -> Option<Field> {
    match (json, header) {
        (Some(path), None) => {
            if path.is_empty() || path.split('.').any(str::is_empty) {
                error(format!("{what}: invalid JSON field {path:?}: expected a dotted path such as \"usage.total_tokens\""));
                return None;
            }
            Some(Field::Json(path.to_owned()))
        }
        (None, Some(name)) => match HeaderName::try_from(name) {
            Ok(name) => Some(Field::Header(name)),
            Err(_) => {
                error(format!("{what}: invalid header name {name:?}"));
                None
            }
        },
        _ => {
            error(format!(
                "{what}: name exactly one of json = \"field\" and header = \"name\""
            ));
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::testing::{error, policy};
    use crate::config::costs::{Field, Measure, ReadCost, Settle};

    const LIMITS: &str = "[limits.tokens]\nkey = \"global\"\ncapacity = 10000\nrate = \"10000/min\"\n[limits.slots]\nkey = \"global\"\nconcurrency = 4\n";

    fn with_entry(entry: &str) -> String {
        format!("{LIMITS}[[routes]]\nname = \"chat\"\npath = \"/chat\"\nupstream = \"app\"\nlimits = [{entry}]\n")
    }

    #[test]
    fn a_cost_read_from_the_request_reserves_its_default_and_settles_by_a_field() {
        let policy = policy(&with_entry(
            "{ limit = \"tokens\", cost = { json = \"max_tokens\", default = 256, max = 8192 }, settle = { json = \"usage.total_tokens\" } }",
        ));
        let entry = &policy.routes[0].limits[0];
        assert_eq!(entry.cost, 256.0);
        assert_eq!(
            entry.read_cost,
            Some(ReadCost {
                field: Field::Json("max_tokens".into()),
                default: 256.0,
                max: 8192.0
            })
        );
        assert_eq!(
            entry.settle,
            Some(Settle {
                measure: Measure::Field(Field::Json("usage.total_tokens".into())),
                scale: 1.0
            })
        );
        assert!(policy.routes[0].reads_body, "a cost in the body buffers it");
    }

    #[test]
    fn measures_take_a_scale_and_a_settled_entry_may_reserve_nothing() {
        let policy = policy(&with_entry(
            "{ limit = \"tokens\", cost = 0, settle = \"upstream_ms\", scale = 0.01 }",
        ));
        let entry = &policy.routes[0].limits[0];
        assert_eq!(entry.cost, 0.0);
        assert_eq!(
            entry.settle,
            Some(Settle {
                measure: Measure::UpstreamMs,
                scale: 0.01
            })
        );
        let policy = policy_of("{ limit = \"tokens\", cost = { header = \"X-Size\", default = 1 }, settle = { header = \"x-bytes\" } }");
        let entry = &policy.routes[0].limits[0];
        assert_eq!(entry.read_cost.as_ref().unwrap().max, f64::INFINITY);
        assert!(!policy.routes[0].reads_body);
    }

    fn policy_of(entry: &str) -> crate::config::Policy {
        policy(&with_entry(entry))
    }

    #[test]
    fn what_check_refuses() {
        let refused = [
            (
                "{ limit = \"tokens\", cost = { json = \"max_tokens\" } }",
                "needs a default",
            ),
            (
                "{ limit = \"slots\", settle = \"upstream_ms\" }",
                "concurrency limit",
            ),
            (
                "{ limit = \"slots\", cost = { header = \"x\", default = 1 } }",
                "concurrency limit",
            ),
            (
                "{ limit = \"tokens\", settle = \"seconds\" }",
                "unknown settle",
            ),
            ("{ limit = \"tokens\", scale = 2 }", "without settle"),
            (
                "{ limit = \"tokens\", settle = \"upstream_ms\", scale = 0 }",
                "out of range",
            ),
            (
                "{ limit = \"tokens\", settle = { json = \"a..b\" } }",
                "invalid JSON field",
            ),
            (
                "{ limit = \"tokens\", settle = { json = \"a\", header = \"b\" } }",
                "exactly one",
            ),
            ("{ limit = \"tokens\", settle = {} }", "exactly one"),
            (
                "{ limit = \"tokens\", cost = { header = \"bad name\", default = 1 } }",
                "invalid header name",
            ),
            (
                "{ limit = \"tokens\", cost = { header = \"x\", default = -1 } }",
                "out of range",
            ),
            (
                "{ limit = \"tokens\", cost = { header = \"x\", default = 10, max = 5 } }",
                "at least the default",
            ),
            (
                "{ limit = \"tokens\", cost = { header = \"x\", default = 10, max = 20000 } }",
                "larger than limit",
            ),
            ("{ limit = \"tokens\", cost = 0 }", "out of range"),
            (
                "{ limit = \"tokens\", cost = { json = \"x\", default = 1, min = 0 } }",
                "unknown field",
            ),
        ];
        for (entry, expected) in refused {
            let (_, message) = error(&with_entry(entry));
            assert!(message.contains(expected), "{entry}: {message}");
        }
    }
}
