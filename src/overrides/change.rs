//! What an operator asks an override to be (`PUT /overrides/{limit}`), read strictly: every
//! field is named in its error, and numbers that do not fit the limit's kind are refused
//! rather than ignored.

use std::time::Duration;

use serde_json::Value;

use super::LimitKind;
use crate::config::units::{self, Rate, MAX_EXACT_TOKENS, MAX_REFILL_SECONDS};
use crate::config::Limit;

/// The fields a change may carry.
const FIELDS: &str = "capacity, rate, quota, concurrency, exempt, ttl, reason, label";

/// The longest `reason` or `label`, in characters.
const MAX_TEXT: usize = 200;

/// A change as asked, checked against its limit.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Change {
    pub capacity: Option<f64>,
    pub rate: Option<Rate>,
    pub quota: Option<f64>,
    pub concurrency: Option<u32>,
    pub exempt: bool,
    /// How long it lasts: as asked, else `max_ttl`, else until deleted.
    pub ttl: Option<Duration>,
    pub reason: Option<String>,
    pub label: Option<String>,
}

/// Why a change was refused, naming the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    pub field: String,
    pub message: String,
}

fn refused(field: &str, message: impl Into<String>) -> FieldError {
    FieldError {
        field: field.to_owned(),
        message: message.into(),
    }
}

impl Change {
    /// Reads a change of `limit` from a JSON object; `max_ttl` bounds how long it may last.
    pub fn read(
        body: &[u8],
        limit: &Limit,
        max_ttl: Option<Duration>,
    ) -> Result<Change, FieldError> {
        let object = match serde_json::from_slice::<Value>(body) {
            Ok(Value::Object(object)) => object,
            Ok(_) => return Err(refused("body", "must be a JSON object")),
            Err(error) => return Err(refused("body", format!("is not JSON: {error}"))),
        };
        let mut change = Change::default();
        for (field, value) in &object {
            change.take(field, value)?;
        }
        change.fits(limit)?;
        change.ttl = match (change.ttl, max_ttl) {
            (Some(ttl), Some(max)) if ttl > max => {
                return Err(refused(
                    "ttl",
                    format!(
                        "longer than [overrides] max_ttl ({})",
                        humantime::format_duration(max)
                    ),
                ))
            }
            (None, max) => max,
            (ttl, _) => ttl,
        };
        Ok(change)
    }

    fn take(&mut self, field: &str, value: &Value) -> Result<(), FieldError> {
        match field {
            "capacity" => self.capacity = Some(tokens(field, value)?),
            "quota" => self.quota = Some(tokens(field, value)?),
            "rate" => self.rate = Some(rate(value)?),
            "concurrency" => self.concurrency = Some(slots(value)?),
            "exempt" => {
                self.exempt = value
                    .as_bool()
                    .ok_or_else(|| refused(field, "must be true or false"))?;
            }
            "ttl" => self.ttl = Some(ttl(value)?),
            "reason" => self.reason = Some(text(field, value)?),
            "label" => self.label = Some(text(field, value)?),
            _ => {
                return Err(refused(
                    field,
                    format!("unknown field (an override takes {FIELDS})"),
                ))
            }
        }
        Ok(())
    }

    /// Whether the numbers are those of the limit's kind, and there are some.
    fn fits(&self, limit: &Limit) -> Result<(), FieldError> {
        let kind = LimitKind::of(limit);
        let set: Vec<&str> = [
            ("capacity", self.capacity.is_some()),
            ("rate", self.rate.is_some()),
            ("quota", self.quota.is_some()),
            ("concurrency", self.concurrency.is_some()),
        ]
        .into_iter()
        .filter_map(|(field, set)| set.then_some(field))
        .collect();
        if self.exempt {
            return match set.first() {
                Some(field) => Err(refused(field, "an exempt key has no numbers to set")),
                None => Ok(()),
            };
        }
        let allowed: &[&str] = match kind {
            LimitKind::Bucket => &["capacity", "rate"],
            LimitKind::Quota => &["quota"],
            LimitKind::Concurrency => &["concurrency"],
        };
        if let Some(field) = set.iter().find(|field| !allowed.contains(field)) {
            let what = match kind {
                LimitKind::Bucket => "a token bucket: set capacity and/or rate",
                LimitKind::Quota => "a calendar quota: set quota",
                LimitKind::Concurrency => "a concurrency limit: set concurrency",
            };
            return Err(refused(field, format!("{} is {what}", limit.name)));
        }
        if set.is_empty() {
            return Err(refused(
                "body",
                format!(
                    "an override sets {} or \"exempt\": true",
                    allowed.join(" or ")
                ),
            ));
        }
        if kind == LimitKind::Bucket {
            let capacity = self.capacity.unwrap_or(limit.capacity);
            let rate = self.rate.unwrap_or(limit.rate);
            if capacity / rate.per_second() > MAX_REFILL_SECONDS {
                let field = if self.rate.is_some() {
                    "rate"
                } else {
                    "capacity"
                };
                return Err(refused(
                    field,
                    "an empty bucket would take more than 10 years to fill",
                ));
            }
        }
        Ok(())
    }
}

/// A count of tokens: more than 0, at most 2^53 (what the bucket math holds exactly).
fn tokens(field: &str, value: &Value) -> Result<f64, FieldError> {
    match value.as_f64() {
        Some(number) if number.is_finite() && number > 0.0 && number <= MAX_EXACT_TOKENS => {
            Ok(number)
        }
        Some(number) => Err(refused(
            field,
            format!("{number} is out of range: more than 0 and at most 2^53"),
        )),
        None => Err(refused(field, "must be a number")),
    }
}

fn rate(value: &Value) -> Result<Rate, FieldError> {
    let text = value
        .as_str()
        .ok_or_else(|| refused("rate", "must be a rate such as \"500/s\" or \"10/min\""))?;
    units::parse_rate(text).map_err(|error| refused("rate", error.to_string()))
}

fn slots(value: &Value) -> Result<u32, FieldError> {
    value
        .as_u64()
        .filter(|slots| *slots > 0)
        .and_then(|slots| u32::try_from(slots).ok())
        .ok_or_else(|| refused("concurrency", "must be a whole number from 1 to 4294967295"))
}

fn ttl(value: &Value) -> Result<Duration, FieldError> {
    let text = value
        .as_str()
        .ok_or_else(|| refused("ttl", "must be a duration such as \"12h\" or \"7d\""))?;
    let ttl = units::parse_duration(text).map_err(|error| refused("ttl", error.to_string()))?;
    if ttl.is_zero() {
        return Err(refused("ttl", "must be longer than zero"));
    }
    Ok(ttl)
}

fn text(field: &str, value: &Value) -> Result<String, FieldError> {
    let text = value
        .as_str()
        .ok_or_else(|| refused(field, "must be a string"))?;
    if text.chars().count() > MAX_TEXT {
        return Err(refused(field, format!("longer than {MAX_TEXT} characters")));
    }
    Ok(text.to_owned())
}
