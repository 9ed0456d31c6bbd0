//! Envoy's rate limit service on the decision listener: a `ShouldRateLimit` call read from
//! its gRPC frame, its descriptors matched to `[[decision.descriptors]]` rules (`crate::rls`),
//! every matched descriptor decided in one store call (all or nothing), and the answer with a
//! status per descriptor. On a store failure each rule's `on_store_failure` decides its own.

use bytes::Bytes;
use envoy_types::pb::envoy::config::core::v3::HeaderValue;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::{
    Code as DescriptorCode, DescriptorStatus, RateLimit,
};
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use http::{Method, Request, Response};
use http_body_util::{BodyExt, Limited};
use prost::Message;

use super::access_log::{self, Exchange};
use super::decide::record_share;
use super::{accounting, Gateway, Listener, RequestBody};
use crate::body::Body;
use crate::config::{HeaderMode, StoreFailurePolicy};
use crate::grpc::{self, Code};
use crate::in_flight::RequestInFlight;
use crate::limit::{BucketKey, BucketRequest, StoreVerdict, Verdict};
use crate::metrics::{DecisionProtocol, Outcome, RLS_ROUTE};
use crate::reject::Reports;
use crate::respond::{self, SetFields};
use crate::rls;
use crate::runtime::{DecisionRuntime, ServedRule};

/// The one method served.
pub(super) const SHOULD_RATE_LIMIT: &str =
    "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// The largest call read: descriptors are a handful of short strings.
const MAX_CALL_BYTES: usize = 64 * 1024;

/// A descriptor that matched a rule, and its bucket's place in the call's one decision.
struct Matched<'r> {
    rule: &'r ServedRule,
    bucket: usize,
}

/// What a descriptor is told.
#[derive(Clone)]
enum Told {
    /// No rule matched: OK, without a limit.
    Unmatched,
    /// Its limit's verdict.
    Verdict(Verdict, bool),
    /// The store failed and the rule allows (OK) or denies (OVER_LIMIT) without a verdict.
    Failed { refused: bool },
}

impl Gateway {
    /// Answers one `ShouldRateLimit` call; never fails (an unreadable call is a gRPC error).
    pub(super) async fn answer_rls(
        &self,
        request: Request<RequestBody>,
        fields: &mut SetFields,
    ) -> Response<Body> {
        let _in_flight = RequestInFlight::new(&self.shared.metrics.inflight);
        let runtime = self.shared.runtime.load_full();
        let Some(decision) = &runtime.decision else {
            return respond::grpc_error(Code::Unavailable, "no [decision] section", fields);
        };
        let mut exchange = Exchange::new(Method::POST, self.shared.request_ids.for_request(None));
        exchange.listener = Listener::Decision;
        exchange.protocol = DecisionProtocol::Grpc;
        exchange.path = SHOULD_RATE_LIMIT.to_owned();
        exchange.route = Some(RLS_ROUTE.into());
        let mode = runtime.policy.server.ratelimit_headers;
        let answered = match read_call(request).await {
            Ok(call) => self
                .decide_call(decision, mode, &call, &mut exchange)
                .await
                .map_err(|message| (Code::InvalidArgument, message)),
            Err(error) => Err(error),
        };
        let outcome = match &answered {
            Ok((_, outcome)) => *outcome,
            Err(_) => Outcome::BadRequest,
        };
        count(decision, outcome);
        exchange.outcome = Some(outcome);
        exchange.log(http::StatusCode::OK);
        match answered {
            Ok((response, _)) => {
                respond::grpc_message(Bytes::from(response.encode_to_vec()), fields)
            }
            Err((code, message)) => respond::grpc_error(code, &message, fields),
        }
    }

    /// The call's descriptors decided together; an error names a descriptor whose values
    /// cannot key its limit.
    async fn decide_call(
        &self,
        decision: &DecisionRuntime,
        mode: HeaderMode,
        call: &RateLimitRequest,
        exchange: &mut Exchange<'_>,
    ) -> Result<(RateLimitResponse, Outcome), String> {
        let load_factor = self.shared.load.factor();
        let mut calendar_time = None;
        let mut matched: Vec<Option<Matched<'_>>> = Vec::with_capacity(call.descriptors.len());
        let mut buckets: Vec<BucketRequest<'_>> = Vec::new();
        for descriptor in &call.descriptors {
            let entries: Vec<(&str, &str)> = descriptor
                .entries
                .iter()
                .map(|entry| (entry.key.as_str(), entry.value.as_str()))
                .collect();
            let rules = decision.rules.iter().map(|served| &served.rule);
            let Some((index, rule)) = rls::matching_rule(rules, &call.domain, &entries) else {
                matched.push(None);
                continue;
            };
            let parts = rls::key_parts(rule, &entries, &self.shared.hasher)?;
            let cost = match &descriptor.hits_addend {
                Some(addend) => addend.value as f64,
                None if call.hits_addend > 0 => f64::from(call.hits_addend),
                None => 1.0,
            };
            let limit = &rule.limit;
            let calendar_now =
                || *calendar_time.get_or_insert_with(|| self.shared.store.calendar_now());
            let Some(mut charge) = limit.charge(None, cost, load_factor, calendar_now) else {
                matched.push(None);
                continue;
            };
            // Envoy cannot be told to hold a request: a limit that delays refuses here.
            charge.debt = 0.0;
            matched.push(Some(Matched {
                rule: &decision.rules[index],
                bucket: buckets.len(),
            }));
            buckets.push(BucketRequest {
                key: BucketKey {
                    limit: &limit.name,
                    fingerprint: limit.fingerprint,
                    parts,
                },
                charge,
                adaptive: None,
                lease: limit.lease,
                ban: limit.ban,
            });
        }
        if access_log::enabled() {
            exchange.keys = Some(access_log::keys(&buckets));
        }
        let rules: Vec<&ServedRule> = matched.iter().flatten().map(|m| m.rule).collect();
        let mut reports = Reports::new();
        let (told, outcome) = if buckets.is_empty() {
            (Vec::new(), Outcome::NoRoute)
        } else {
            match self.store_decision(&buckets, None).await {
                Ok((stored, _)) => {
                    let admitted = stored.is_admitted();
                    let accounting = accounting::account(
                        rules.iter().map(|rule| &rule.applied).zip(&buckets),
                        &stored,
                        &mut reports,
                        record_share,
                    );
                    let outcome = match (admitted, accounting.shadow_refused) {
                        (false, _) => Outcome::Limited,
                        (true, true) => Outcome::ShadowLimited,
                        (true, false) => Outcome::Allowed,
                    };
                    (told_of(&stored, &buckets), outcome)
                }
                Err(_) => self.failed_over(decision, &rules, &buckets, &mut reports),
            }
        };
        if matches!(outcome, Outcome::Limited | Outcome::StoreUnavailable) {
            exchange.limit = Some(accounting::refusing(&reports));
        }
        let statuses = matched
            .iter()
            .map(|matched| match matched {
                None => status(Told::Unmatched, None),
                Some(matched) => {
                    let told = told.get(matched.bucket).cloned().unwrap_or(Told::Unmatched);
                    status(told, Some(&matched.rule.rule.limit))
                }
            })
            .collect();
        let overall = if matches!(outcome, Outcome::Limited | Outcome::StoreUnavailable) {
            DescriptorCode::OverLimit
        } else {
            DescriptorCode::Ok
        };
        let response = RateLimitResponse {
            overall_code: overall as i32,
            statuses,
            response_headers_to_add: headers_to_add(mode, &reports, overall),
            ..RateLimitResponse::default()
        };
        Ok((response, outcome))
    }

    /// The call decided without the store, each rule as its `on_store_failure` says: `deny`
    /// refuses the call, `local` decides with this process's buckets, `allow` admits.
    fn failed_over<'r>(
        &self,
        decision: &DecisionRuntime,
        rules: &[&'r ServedRule],
        buckets: &[BucketRequest<'r>],
        reports: &mut Reports<'r>,
    ) -> (Vec<Told>, Outcome) {
        for rule in rules {
            decision.rls.degraded(rule.rule.on_store_failure).inc();
        }
        let policy = |index: usize| rules[index].rule.on_store_failure;
        if (0..rules.len()).any(|index| policy(index) == StoreFailurePolicy::Deny) {
            let told = (0..rules.len())
                .map(|index| Told::Failed {
                    refused: policy(index) == StoreFailurePolicy::Deny,
                })
                .collect();
            return (told, Outcome::StoreUnavailable);
        }
        let local: Vec<usize> = (0..rules.len())
            .filter(|index| policy(*index) == StoreFailurePolicy::Local)
            .collect();
        let local_buckets: Vec<BucketRequest<'r>> =
            local.iter().map(|index| buckets[*index].clone()).collect();
        let mut told: Vec<Told> = (0..rules.len())
            .map(|_| Told::Failed { refused: false })
            .collect();
        let mut outcome = Outcome::DegradedAllowed;
        if !local_buckets.is_empty() {
            let stored = self.shared.local.decide(&local_buckets);
            accounting::account(
                local
                    .iter()
                    .map(|index| &rules[*index].applied)
                    .zip(&local_buckets),
                &stored,
                reports,
                record_share,
            );
            if !stored.is_admitted() {
                outcome = Outcome::Limited;
            }
            for (index, local_told) in local.iter().zip(told_of(&stored, &local_buckets)) {
                told[*index] = local_told;
            }
        }
        (told, outcome)
    }
}

/// Each bucket's verdict, and whether its limit enforces.
fn told_of(decision: &StoreVerdict, buckets: &[BucketRequest<'_>]) -> Vec<Told> {
    decision
        .verdicts()
        .iter()
        .zip(buckets)
        .map(|(verdict, bucket)| Told::Verdict(*verdict, bucket.charge.enforce))
        .collect()
}

/// One descriptor's status: its limit's code, the limit as Envoy reads it, the whole tokens
/// left and the time until its bucket is full.
fn status(told: Told, limit: Option<&crate::config::Limit>) -> DescriptorStatus {
    let current_limit = limit.map(|limit| {
        let (requests_per_unit, unit) = rls::current_limit(limit);
        RateLimit {
            name: limit.name.to_string(),
            requests_per_unit,
            unit: unit as i32,
        }
    });
    match told {
        Told::Unmatched => DescriptorStatus {
            code: DescriptorCode::Ok as i32,
            ..DescriptorStatus::default()
        },
        Told::Failed { refused } => DescriptorStatus {
            code: code(refused),
            current_limit,
            ..DescriptorStatus::default()
        },
        Told::Verdict(verdict, enforce) => {
            let refused = enforce && verdict.observed && !verdict.sufficient;
            DescriptorStatus {
                code: code(refused),
                current_limit,
                limit_remaining: rls::saturating_u32(verdict.tokens.floor()),
                duration_until_reset: Some(duration(verdict.full_in)),
                ..DescriptorStatus::default()
            }
        }
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
        let wait = reports
            .iter()
            .filter(|report| report.refused)
            .map(|report| report.wait)
            .fold(0.0, f64::max);
        fields.set(
            &respond::RETRY_AFTER_NAME,
            respond::FieldValue::Number(respond::retry_after_seconds(wait)),
        );
    }
    respond::add_ratelimit_headers(&mut fields, mode, reports);
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
    let body = match request.into_body() {
        RequestBody::Incoming(body) => Limited::new(body, MAX_CALL_BYTES)
            .collect()
            .await
            .map_err(|error| invalid(format!("the call could not be read: {error}")))?
            .to_bytes(),
        RequestBody::Empty => Bytes::new(),
    };
    let message = grpc::unary_message(&body).map_err(|error| match error {
        grpc::FrameError::Compressed => (Code::Unimplemented, error.to_string()),
        grpc::FrameError::Malformed => invalid(error.to_string()),
    })?;
    RateLimitRequest::decode(message)
        .map_err(|error| invalid(format!("not a RateLimitRequest: {error}")))
}
