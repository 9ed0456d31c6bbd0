//! Envoy's rate limit service on the decision listener: a `ShouldRateLimit` call read from
//! its gRPC frame, its descriptors matched to `[[decision.descriptors]]` rules
//! (`descriptors.rs`), every matched descriptor decided together by the proxy's decide step
//! (all or nothing; on a store failure each rule's `on_store_failure` says what to do), and
//! the answer with a status per descriptor.

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code as DescriptorCode, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Limited};
use prost::Message;

use super::descriptors::{self, DescriptorError};
use crate::body::Body;
use crate::config::{HeaderMode, StoreFailurePolicy};
use crate::gateway::access_log::{Exchange, Listener};
use crate::gateway::accounting::BucketAccount;
use crate::gateway::{Buckets, Gateway, Requested};
use crate::grpc::{self, Code};
use crate::in_flight::RequestInFlight;
use crate::limit::Reading;
use crate::metrics::{DecisionProtocol, Outcome, RLS_ROUTE};
use crate::reject::{Reject, Reports};
use crate::request_body::RequestBody;
use crate::respond::{self, SetFields};
use crate::runtime::{AppliedLimit, DecisionRuntime, ServedRule};

/// The one method served.
pub(super) const SHOULD_RATE_LIMIT: &str =
    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The largest call read: descriptors are a handful of short strings.
const MAX_CALL_BYTES: usize = 64 * 1024;

/// What a descriptor that matched a rule is told: its bucket's share of the decision, or,
/// without one (the store failed, or did not look at it), only whether it is refused.
#[derive(Clone, Copy)]
enum Told {
    Share {
        refused: bool,
        tokens: f64,
        full_in: f64,
    },
    Unseen {
        refused: bool,
    },
}

/// Answers one `ShouldRateLimit` call; never fails (an unreadable call is a gRPC error).
pub(super) async fn answer(
    gateway: &Gateway,
    request: Request<RequestBody>,
    fields: &mut SetFields,
) -> Response<Body> {
    let _in_flight = RequestInFlight::new(&gateway.shared.metrics.inflight);
    let runtime = gateway.shared.runtime.load_full();
    let Some(decision) = &runtime.decision else {
        return respond::grpc_error(Code::Unavailable, "no [decision] section", fields);
    };
    let now = Reading::now();
    let request_id = gateway.shared.request_ids.for_request(None, now.unix());
    let mut exchange = Exchange::new(Method::POST, request_id, now);
    exchange.listener = Listener::Decision;
    exchange.protocol = DecisionProtocol::Grpc;
    exchange.path = SHOULD_RATE_LIMIT.to_owned();
    exchange.route = Some(RLS_ROUTE.into());
    if let Some(traces) = &gateway.shared.traces {
        // Parented by the asking proxy's context, from the call's metadata.
        exchange.trace = Some(traces.server_span(request.headers(), true, &Method::POST));
    }
    let mode = runtime.policy.server.ratelimit_headers;
    let answered = match read_call(request).await {
        Ok(call) => decide_call(gateway, decision, mode, &call, &mut exchange)
            .await
            .map_err(|error| (Code::InvalidArgument, error.to_string())),
        Err(error) => Err(error),
    };
    let outcome = match &answered {
        Ok((_, outcome)) => *outcome,
        Err(_) => Outcome::BadRequest,
    };
    count(decision, outcome);
    exchange.outcome = Some(outcome);
    exchange.end_trace(
        http::StatusCode::OK,
        Some(RLS_ROUTE),
        || None,
        &Reports::new(),
    );
    exchange.log(http::StatusCode::OK);
    match answered {
        Ok((response, _)) => respond::grpc_message(Bytes::from(response.encode_to_vec()), fields),
        Err((code, message)) => respond::grpc_error(code, &message, fields),
    }
}

/// The call's descriptors decided together by the proxy's own decide step; an error names a
/// descriptor whose values cannot key its limit.
async fn decide_call(
    gateway: &Gateway,
    decision: &DecisionRuntime,
    mode: HeaderMode,
    call: &RateLimitRequest,
    exchange: &mut Exchange<'_>,
) -> Result<(RateLimitResponse, Outcome), DescriptorError> {
    let (matched, requested) = requested(gateway, decision, call)?;
    let mut reports = Reports::new();
    let mut shares: Vec<Option<Told>> = vec![None; requested.buckets.requests().len()];
    let result = if requested.buckets.is_empty() {
        Err(Reject::NoRoute)
    } else {
        let observe = |position: usize, share: &BucketAccount<&AppliedLimit>| {
            shares[position] = Some(Told::Share {
                refused: share.refused,
                tokens: share.tokens,
                full_in: share.full_in,
            });
        };
        gateway
            .decide(RLS_ROUTE, &requested, exchange, &mut reports, observe)
            .await
            .map(|admission| admission.outcome)
    };
    let outcome = match &result {
        Ok(outcome) => *outcome,
        Err(reject) => reject.outcome().unwrap_or(Outcome::Limited),
    };
    let store_denied = matches!(result, Err(Reject::StoreUnavailable));
    let statuses = matched
        .iter()
        .map(|matched| {
            let (rule, position) = (*matched)?;
            let told = shares[position].unwrap_or(Told::Unseen {
                refused: store_denied && rule.rule.on_store_failure == StoreFailurePolicy::Deny,
            });
            Some((rule, told))
        })
        .map(|told| status(told.map(|(rule, told)| (&*rule.rule.limit, told))))
        .collect();
    let overall = match result {
        Err(
            Reject::Limited | Reject::Banned | Reject::ScanBanned { .. } | Reject::StoreUnavailable,
        ) => DescriptorCode::OverLimit,
        _ => DescriptorCode::Ok,
    };
    let response = RateLimitResponse {
        overall_code: overall as i32,
        statuses,
        response_headers_to_add: headers_to_add(mode, &reports, overall),
        ..RateLimitResponse::default()
    };
    Ok((response, outcome))
}

/// Each descriptor's rule and its bucket's place, if it matched one, and what the call asks
/// of the rules' limits: one bucket per matched descriptor, keyed by its values, charged its
/// `hits_addend` (else the call's, else 1).
#[allow(clippy::type_complexity)]
fn requested<'r>(
    gateway: &Gateway,
    decision: &'r DecisionRuntime,
    call: &RateLimitRequest,
) -> Result<(Vec<Option<(&'r ServedRule, usize)>>, Requested<'r>), DescriptorError> {
    let load_factor = gateway.shared.load.factor();
    let overrides = gateway.shared.overrides.table();
    let mut noted = Requested::new();
    let mut calendar_time = None;
    let mut matched = Vec::with_capacity(call.descriptors.len());
    let mut buckets = Buckets::new();
    for descriptor in &call.descriptors {
        let entries: Vec<(&str, &str)> = descriptor
            .entries
            .iter()
            .map(|entry| (entry.key.as_str(), entry.value.as_str()))
            .collect();
        let rules = decision.rules.iter().map(|served| &served.rule);
        let Some((index, rule)) = descriptors::matching_rule(rules, &call.domain, &entries) else {
            matched.push(None);
            continue;
        };
        let parts = descriptors::key_parts(rule, &entries, &gateway.shared.hasher)?;
        let cost = match &descriptor.hits_addend {
            Some(addend) => addend.value as f64,
            None if call.hits_addend > 0 => f64::from(call.hits_addend),
            None => 1.0,
        };
        let calendar_now =
            || *calendar_time.get_or_insert_with(|| gateway.shared.store.calendar_now());
        let overridden = gateway.overridden(&overrides, &rule.limit, &parts);
        let tier = overridden.map(|entry| entry.tier(&rule.limit));
        let Some(mut charge) = rule
            .limit
            .charge(tier.as_ref(), cost, load_factor, calendar_now)
        else {
            matched.push(None);
            continue;
        };
        if overridden.is_some() {
            noted.overridden.push(&rule.limit.name);
        }
        // Envoy cannot be told to hold a request: a limit that delays refuses here.
        charge.debt = 0.0;
        let served = &decision.rules[index];
        matched.push(Some((served, buckets.requests().len())));
        let mut bucket = served.applied.bucket(parts, charge);
        bucket.adaptive = None;
        buckets.push(&served.applied, bucket);
    }
    noted.buckets = buckets;
    Ok((matched, noted))
}

/// One descriptor's status: OK without a limit when it matched no rule; else its limit's
/// code, the limit as Envoy reads it and, when its bucket was decided, the whole tokens left
/// and the time until the bucket is full.
fn status(told: Option<(&crate::config::Limit, Told)>) -> DescriptorStatus {
    let Some((limit, told)) = told else {
        return DescriptorStatus {
            code: DescriptorCode::Ok as i32,
            ..DescriptorStatus::default()
        };
    };
    let (requests_per_unit, unit) = descriptors::current_limit(limit);
    let current_limit = Some(RateLimit {
        name: limit.name.to_string(),
        requests_per_unit,
        unit: unit as i32,
    });
    match told {
        Told::Unseen { refused } => DescriptorStatus {
            code: code(refused),
            current_limit,
            ..DescriptorStatus::default()
        },
        Told::Share {
            refused,
            tokens,
            full_in,
        } => DescriptorStatus {
            code: code(refused),
            current_limit,
            limit_remaining: descriptors::saturating_u32(tokens.floor()),
            duration_until_reset: Some(duration(full_in)),
            ..DescriptorStatus::default()
        },
    }
}

fn code(refused: bool) -> i32 {
    match refused {
        true => DescriptorCode::OverLimit as i32,
        false => DescriptorCode::Ok as i32,
    }
}

/// `retry-after` on a refusal, and the rate-limit headers of `[server] ratelimit_headers`.
fn headers_to_add(
    mode: HeaderMode,
    reports: &Reports<'_>,
    overall: DescriptorCode,
) -> Vec<HeaderValue> {
    let mut fields = SetFields::default();
    if overall == DescriptorCode::OverLimit {
        respond::refusal_fields(
            respond::refusal_retry_after(reports),
            mode,
            reports,
            &mut fields,
        );
    } else {
        respond::add_ratelimit_headers(&mut fields, mode, reports);
    }
    let mut headers = Vec::new();
    fields.write(|name, value| {
        headers.push(HeaderValue {
            key: String::from_utf8_lossy(name).into_owned(),
            value: String::from_utf8_lossy(value).into_owned(),
            ..HeaderValue::default()
        });
    });
    headers
}

fn duration(seconds: f64) -> envoy_types::pb::google::protobuf::Duration {
    let seconds = if seconds.is_finite() {
        seconds.max(0.0)
    } else {
        0.0
    };
    let whole = seconds.floor();
    envoy_types::pb::google::protobuf::Duration {
        seconds: whole.min(i64::MAX as f64) as i64,
        nanos: ((seconds - whole) * 1e9).round().min(999_999_999.0) as i32,
    }
}

fn count(decision: &DecisionRuntime, outcome: Outcome) {
    decision
        .metrics
        .outcome(DecisionProtocol::Grpc, outcome)
        .inc();
    decision.rls.outcome(outcome).inc();
}

/// The call's message, read whole (at most [`MAX_CALL_BYTES`]).
async fn read_call(request: Request<RequestBody>) -> Result<RateLimitRequest, (Code, String)> {
    let invalid = |message: String| (Code::InvalidArgument, message);
    let is_grpc = request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|value| grpc::is_grpc(value.as_bytes()));
    if !is_grpc || request.method() != Method::POST {
        return Err(invalid(
            "ShouldRateLimit is a gRPC call: POST with content-type application/grpc".to_owned(),
        ));
    }
    let body = Limited::new(request.into_body(), MAX_CALL_BYTES)
        .collect()
        .await
        .map_err(|error| invalid(format!("the call could not be read: {error}")))?
        .to_bytes();
    let message = grpc::unary_message(&body).map_err(|error| match error {
        grpc::FrameError::Compressed => (Code::Unimplemented, error.to_string()),
        grpc::FrameError::Malformed => invalid(error.to_string()),
    })?;
    RateLimitRequest::decode(message)
        .map_err(|error| invalid(format!("not a RateLimitRequest: {error}")))
}
