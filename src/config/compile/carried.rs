//! Numbers a request carries (`capacity = { jwt_claim = "rl.capacity", default = 100, max =
//! 10000 }`): where each is read, and the most it may ask for. Its default is the limit's
//! number (`tiers.rs` reads it); a tier cannot apply beside them.

use toml::Spanned;

use super::tiers::NEEDS_JWT;
use super::Errors;
use crate::config::raw::{self, HumanRate, RawCarried, RawNumber};
use crate::config::units::MAX_EXACT_TOKENS;
use crate::config::{Carried, CarriedNumbers, NumberSource, Rate};

/// The numbers `raw` reads from requests; `None` when it reads none.
pub(super) fn compile_carried(
    raw: &raw::RawLimit,
    key: &str,
    jwt_configured: bool,
    errors: &mut Errors<'_>,
) -> Option<CarriedNumbers> {
    let carried =
        |number: &Option<Spanned<RawNumber<f64>>>, name: &str, errors: &mut Errors<'_>| {
            let (span, raw) = carried_of(number)?;
            let key = format!("{key}.{name}");
            let source = source(raw, &key, span.clone(), jwt_configured, errors)?;
            let max = max(raw.max, &key, span.clone(), errors, |max| {
                (max.is_finite() && max > 0.0 && max <= MAX_EXACT_TOKENS).then_some(max)
            })?;
            if raw.default.is_some_and(|default| default > max) {
                errors.at(Some(span), format!("{key}.default"), "more than max");
            }
            Some(Carried { source, max })
        };
    let numbers = CarriedNumbers {
        capacity: carried(&raw.capacity, "capacity", errors),
        quota: carried(&raw.quota, "quota", errors),
        rate: carried_of(&raw.rate).and_then(|(span, carried)| {
            let key = format!("{key}.rate");
            let source = source(carried, &key, span.clone(), jwt_configured, errors)?;
            let max = max(carried.max, &key, span.clone(), errors, |max: HumanRate| {
                Some(max.0)
            })?;
            if carried
                .default
                .is_some_and(|default| default.0.per_second() > max.per_second())
            {
                errors.at(Some(span), format!("{key}.default"), "faster than max");
            }
            Some(Carried::<Rate> { source, max })
        }),
    };
    (numbers != CarriedNumbers::default()).then_some(numbers)
}

fn carried_of<T>(
    number: &Option<Spanned<RawNumber<T>>>,
) -> Option<(std::ops::Range<usize>, &RawCarried<T>)> {
    let number = number.as_ref()?;
    match number.get_ref() {
        RawNumber::Carried(carried) => Some((number.span(), carried)),
        RawNumber::Fixed(_) => None,
    }
}

/// Where the number is read: a verified claim, or a header a proxy in front sets.
fn source<T>(
    raw: &RawCarried<T>,
    key: &str,
    span: std::ops::Range<usize>,
    jwt_configured: bool,
    errors: &mut Errors<'_>,
) -> Option<NumberSource> {
    match (&raw.jwt_claim, &raw.header) {
        (Some(path), None) if !path.is_empty() => {
            if !jwt_configured {
                errors.at(Some(span), format!("{key}.jwt_claim"), NEEDS_JWT);
            }
            Some(NumberSource::JwtClaim(path.clone()))
        }
        (None, Some(header)) => {
            let Ok(name) = http::HeaderName::try_from(header.as_str()) else {
                errors.at(
                    Some(span),
                    format!("{key}.header"),
                    format!("{header:?} is not a header name"),
                );
                return None;
            };
            if raw.trust_header != Some(true) {
                errors.at(Some(span), format!("{key}.trust_header"), "a number read from a header lets every client that can set it pick its own: set trust_header = true when a proxy in front sets it, or use { jwt_claim = \"..\" }");
            }
            Some(NumberSource::Header(name))
        }
        _ => {
            errors.at(Some(span), key.to_owned(), "name one source: { jwt_claim = \"rl.capacity\", … } or { header = \"x-ratelimit-capacity\", trust_header = true, … }");
            None
        }
    }
}

/// The most a request may ask for: required, and a number the limit could hold.
fn max<T, M>(
    raw: Option<T>,
    key: &str,
    span: std::ops::Range<usize>,
    errors: &mut Errors<'_>,
    valid: impl FnOnce(T) -> Option<M>,
) -> Option<M> {
    let Some(raw) = raw else {
        errors.at(
            Some(span),
            format!("{key}.max"),
            "required: the most a request may ask for (a larger number is cut to it)",
        );
        return None;
    };
    let valid = valid(raw);
    if valid.is_none() {
        errors.at(
            Some(span),
            format!("{key}.max"),
            "out of range: more than 0 and at most 2^53",
        );
    }
    valid
}

#[cfg(test)]
mod tests {
    use super::super::testing::{error, errors, policy};

    const JWT: &str = "[auth.jwt]\nsecret_env = \"TOLLGATE_TEST_CARRIED_COMPILE\"\n";

    fn limit(numbers: &str) -> String {
        std::env::set_var("TOLLGATE_TEST_CARRIED_COMPILE", "s".repeat(32));
        format!("{JWT}[limits.org]\nkey = {{ jwt_claim = \"org\" }}\n{numbers}")
    }

    #[test]
    fn carried_numbers_compile_with_their_defaults_as_the_limits_own() {
        let policy = policy(&limit(
            "capacity = { jwt_claim = \"rl.capacity\", default = 100, max = 10000 }\nrate = \"10/s\"\n",
        ));
        let org = &policy.limits[0];
        assert_eq!(org.capacity, 100.0);
        let carried = org.carried.as_ref().unwrap();
        assert_eq!(carried.capacity.as_ref().unwrap().max, 10000.0);
        assert!(
            carried.rate.is_none(),
            "a number as written is the limit's own"
        );
        assert!(org.reads_token());
        let fixed = super::super::testing::policy(
            "[limits.a]\nkey = \"global\"\ncapacity = 5\nrate = \"1/s\"\n",
        );
        assert!(fixed.limits[0].carried.is_none());
    }

    #[test]
    fn a_carried_number_needs_one_source_a_default_and_a_max() {
        for (numbers, key) in [
            ("capacity = { jwt_claim = \"c\", max = 10 }\nrate = \"1/s\"\n", "limits.org.capacity.default"),
            ("capacity = { jwt_claim = \"c\", default = 5 }\nrate = \"1/s\"\n", "limits.org.capacity.max"),
            ("capacity = { jwt_claim = \"c\", default = 50, max = 10 }\nrate = \"1/s\"\n", "limits.org.capacity.default"),
            ("capacity = { jwt_claim = \"c\", default = 5, max = -1 }\nrate = \"1/s\"\n", "limits.org.capacity.max"),
            ("capacity = { default = 5, max = 10 }\nrate = \"1/s\"\n", "limits.org.capacity"),
            ("capacity = { jwt_claim = \"c\", header = \"x-c\", default = 5, max = 10 }\nrate = \"1/s\"\n", "limits.org.capacity"),
            ("capacity = { header = \"x-c\", default = 5, max = 10 }\nrate = \"1/s\"\n", "limits.org.capacity.trust_header"),
            ("capacity = 5\nrate = { jwt_claim = \"r\", default = \"10/s\", max = \"1/s\" }\n", "limits.org.rate.default"),
            ("capacity = 5\nrate = { jwt_claim = \"r\", default = \"10/s\", max = \"fast\" }\n", "limits.org.rate"),
            ("capacity = { jwt_claim = \"c\", default = 5, max = 10, min = 1 }\nrate = \"1/s\"\n", "limits.org.capacity"),
        ] {
            assert_eq!(error(&limit(numbers)).0, key, "{numbers}");
        }
        let tiered = errors(&limit(
            "capacity = { jwt_claim = \"c\", default = 5, max = 10 }\nrate = \"1/s\"\ntier = { jwt_claim = \"plan\" }\n[limits.org.tiers]\npro = { capacity = 50 }\n",
        ));
        assert!(
            tiered.iter().any(|(key, _)| key == "limits.org.tier"),
            "{tiered:?}"
        );
        let unverified = error("[limits.org]\nkey = \"global\"\ncapacity = { jwt_claim = \"c\", default = 5, max = 10 }\nrate = \"1/s\"\n");
        assert_eq!(unverified.0, "limits.org.capacity.jwt_claim");
    }

    #[test]
    fn a_header_read_on_a_proxy_listener_is_named_by_check() {
        let policy = policy("[limits.org]\nkey = \"global\"\ncapacity = { header = \"x-capacity\", trust_header = true, default = 5, max = 10 }\nrate = \"1/s\"\n");
        assert!(
            policy
                .warnings
                .iter()
                .any(|warning| warning.contains("x-capacity")
                    && warning.contains("max is the most it gets")),
            "{:?}",
            policy.warnings
        );
    }
}
