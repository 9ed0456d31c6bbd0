//! Envoy's rate limit service on the decision listener, called as Envoy calls it: a tonic
//! client built from Envoy's own protos over h2c. Descriptor matching, per-/64 masking, one
//! call all or nothing, costs from `hits_addend`, the statuses and headers, a stopped
//! `redis-server` with `allow` and `deny` rules, and buckets shared with the proxy listener and
//! across replicas.

mod common;

use std::net::SocketAddr;

use common::redis_server::RedisServer;
use common::*;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use tollgate::Tollgate;
use tonic::transport::Channel;

const RULES: &str = r#"
[decision]
listen = "127.0.0.1:0"

[[decision.descriptors]]
domain = "edge"
entries = ["remote_address"]
limit = "per_network"

[[decision.descriptors]]
domain = "edge"
entries = [{ key = "generic_key", value = "login" }, "header_match_email"]
limit = "per_account"
on_store_failure = "deny"

[[decision.descriptors]]
domain = "edge"
entries = [{ key = "generic_key", value = "search" }]
limit = "search"

[upstreams.app]
url = "http://{upstream}"

[limits.per_network]
key = "client_network"
capacity = 2
rate = "10/s"

[limits.per_account]
key = { header = "x-email" }
capacity = 1
rate = "100/min"

[limits.search]
key = "global"
capacity = 5
rate = "1/h"

[[routes]]
name = "all"
path_prefix = "/"
upstream = "app"
limits = ["per_account"]
"#;

async fn client(address: SocketAddr) -> RateLimitServiceClient<Channel> {
    let channel = Channel::from_shared(format!("http://{address}"))
        .unwrap()
        .connect()
        .await
        .expect("h2c channel");
    RateLimitServiceClient::new(channel)
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(key, value)| Entry {
                key: key.to_string(),
                value: value.to_string(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

async fn call(
    client: &mut RateLimitServiceClient<Channel>,
    descriptors: Vec<RateLimitDescriptor>,
    hits_addend: u32,
) -> RateLimitResponse {
    client
        .should_rate_limit(RateLimitRequest {
            domain: "edge".to_owned(),
            descriptors,
            hits_addend,
        })
        .await
        .expect("ShouldRateLimit")
        .into_inner()
}

fn header<'a>(response: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    response
        .response_headers_to_add
        .iter()
        .find(|header| header.key.eq_ignore_ascii_case(name))
        .map(|header| header.value.as_str())
}

async fn start(policy: &str) -> (Tollgate, RateLimitServiceClient<Channel>) {
    let upstream = start_upstream().await;
    let gateway = start_gateway(policy, upstream.address).await;
    let client = client(gateway.decision_address.unwrap()).await;
    (gateway, client)
}

#[tokio::test]
async fn remote_addresses_are_counted_per_64_and_the_statuses_say_why() {
    let (gateway, mut rls) = start(RULES).await;
    let address = |text: &str| vec![descriptor(&[("remote_address", text)])];
    let first = call(&mut rls, address("2001:db8:7:7::1"), 0).await;
    assert_eq!(first.overall_code, Code::Ok as i32);
    let status = &first.statuses[0];
    assert_eq!(status.code, Code::Ok as i32);
    assert_eq!(status.limit_remaining, 1);
    let limit = status.current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (10, Unit::Second as i32)
    );
    let reset = status.duration_until_reset.unwrap();
    assert!(reset.seconds == 0 && reset.nanos > 0, "{reset:?}");
    // Another address of the same /64 shares the bucket; another /64 does not.
    let second = call(&mut rls, address("2001:db8:7:7:ffff::2"), 0).await;
    assert_eq!(second.statuses[0].limit_remaining, 0);
    let third = call(&mut rls, address("2001:db8:7:7::3"), 0).await;
    assert_eq!(third.overall_code, Code::OverLimit as i32);
    assert_eq!(third.statuses[0].code, Code::OverLimit as i32);
    assert_eq!(header(&third, "retry-after"), Some("1"));
    assert_eq!(header(&third, "ratelimit-limit"), Some("2"));
    let elsewhere = call(&mut rls, address("2001:db8:7:8::1"), 0).await;
    assert_eq!(elsewhere.overall_code, Code::Ok as i32);
    assert_eq!(header(&elsewhere, "retry-after"), None);
    let scrape = gateway.render_metrics();
    assert_metrics(
        &scrape,
        &[
            (
                "tollgate_decision_requests_total{outcome=\"allowed\",protocol=\"grpc\"}",
                3.0,
            ),
            (
                "tollgate_decision_requests_total{outcome=\"limited\",protocol=\"grpc\"}",
                1.0,
            ),
            (
                "tollgate_requests_total{outcome=\"limited\",route=\"rls\"}",
                1.0,
            ),
            (
                "tollgate_limited_total{limit=\"per_network\",route=\"rls\"}",
                1.0,
            ),
        ],
    );
    // An entry that is not an address is the caller's error.
    let error = rls
        .should_rate_limit(RateLimitRequest {
            domain: "edge".to_owned(),
            descriptors: address("not-an-address"),
            hits_addend: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(error.code(), tonic::Code::InvalidArgument);
    assert!(
        error.message().contains("not an IP address"),
        "{}",
        error.message()
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_call_is_all_or_nothing_and_costs_what_it_says() {
    let (gateway, mut rls) = start(RULES).await;
    let search = || descriptor(&[("generic_key", "search")]);
    let login =
        |email: &str| descriptor(&[("generic_key", "login"), ("header_match_email", email)]);
    let unmatched = || descriptor(&[("generic_key", "other")]);
    let first = call(&mut rls, vec![search(), login("a@x"), unmatched()], 0).await;
    assert_eq!(first.overall_code, Code::Ok as i32);
    assert_eq!(first.statuses.len(), 3);
    assert_eq!(first.statuses[0].limit_remaining, 4);
    assert_eq!(first.statuses[1].limit_remaining, 0);
    let limit = first.statuses[1].current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit),
        (100, Unit::Minute as i32)
    );
    assert_eq!(first.statuses[2].code, Code::Ok as i32);
    assert!(first.statuses[2].current_limit.is_none());
    // The account is spent: the call is refused, and the search bucket charged nothing.
    let refused = call(&mut rls, vec![search(), login("a@x")], 0).await;
    assert_eq!(refused.overall_code, Code::OverLimit as i32);
    assert_eq!(
        refused.statuses[0].code,
        Code::Ok as i32,
        "its own limit had enough"
    );
    assert_eq!(
        refused.statuses[0].limit_remaining, 4,
        "a refused call charges nothing"
    );
    assert_eq!(refused.statuses[1].code, Code::OverLimit as i32);
    // The request's hits_addend is every descriptor's cost; a descriptor's own wins, and 0
    // asks without charging.
    let costly = call(&mut rls, vec![search()], 3).await;
    assert_eq!(costly.statuses[0].limit_remaining, 1);
    let mut query = search();
    query.hits_addend = Some(UInt64Value { value: 0 });
    let asked = call(&mut rls, vec![query], 3).await;
    assert_eq!(asked.overall_code, Code::Ok as i32);
    assert_eq!(asked.statuses[0].limit_remaining, 1);
    let mut two = search();
    two.hits_addend = Some(UInt64Value { value: 2 });
    let too_much = call(&mut rls, vec![two], 0).await;
    assert_eq!(too_much.overall_code, Code::OverLimit as i32);
    gateway.shutdown().await;
}

#[tokio::test]
async fn a_stopped_store_is_met_by_each_rules_own_policy_and_buckets_are_shared() {
    let mut redis = RedisServer::start();
    let store = format!(
        "[store]\nbackend = \"redis\"\nurl = \"{}\"\ntimeout = \"500ms\"\nprefix = \"rls:\"\nhash_key = \"test-secret-0123456789\"\n",
        redis.url()
    );
    let policy = format!("{store}{RULES}");
    let (gateway, mut rls) = start(&policy).await;
    let upstream = start_upstream().await;
    let replica = start_gateway(&policy, upstream.address).await;
    // The proxy listener of one replica spends the account; the other's RLS sees it spent.
    let proxy = HttpClient::new(replica.addresses[0]);
    assert_eq!(proxy.get("/", &[("x-email", "eve@x")]).await.status, 200);
    let login =
        |email: &str| descriptor(&[("generic_key", "login"), ("header_match_email", email)]);
    let spent = call(&mut rls, vec![login("eve@x")], 0).await;
    assert_eq!(spent.overall_code, Code::OverLimit as i32);
    // Two calls to the search limit through two replicas: one bucket.
    let mut other = client(replica.decision_address.unwrap()).await;
    let search = || descriptor(&[("generic_key", "search")]);
    assert_eq!(
        call(&mut rls, vec![search()], 0).await.statuses[0].limit_remaining,
        4
    );
    assert_eq!(
        call(&mut other, vec![search()], 0).await.statuses[0].limit_remaining,
        3
    );

    redis.stop();
    let allowed = call(&mut rls, vec![search()], 0).await;
    assert_eq!(allowed.overall_code, Code::Ok as i32, "allow: admitted");
    let denied = call(&mut rls, vec![search(), login("new@x")], 0).await;
    assert_eq!(denied.overall_code, Code::OverLimit as i32, "deny: refused");
    assert_eq!(denied.statuses[0].code, Code::Ok as i32);
    assert_eq!(denied.statuses[1].code, Code::OverLimit as i32);
    let scrape = gateway.render_metrics();
    assert!(
        metric(
            &scrape,
            "tollgate_degraded_decisions_total{policy=\"deny\",route=\"rls\"}"
        ) >= 1.0
    );
    assert!(
        metric(
            &scrape,
            "tollgate_decision_requests_total{outcome=\"store_unavailable\",protocol=\"grpc\"}"
        ) >= 1.0
    );
    replica.shutdown().await;
    gateway.shutdown().await;
}

/// A ban decided through `ShouldRateLimit` is a ban: counted as `banned` under `rls`, as on
/// the proxy listener, and told to Envoy as a refusal with the ban's rest.
#[tokio::test]
async fn a_ban_over_grpc_counts_as_banned() {
    let policy = RULES.replace(
        "[limits.search]\nkey = \"global\"\ncapacity = 5\nrate = \"1/h\"\n",
        "[limits.search]\nkey = \"global\"\ncapacity = 1\nrate = \"1/h\"\n[limits.search.ban]\nafter = 2\nwithin = \"1m\"\nduration = \"15m\"\n",
    );
    assert_ne!(policy, RULES, "the ban is in the policy");
    let (gateway, mut rls) = start(&policy).await;
    let search = || vec![descriptor(&[("generic_key", "search")])];
    assert_eq!(
        call(&mut rls, search(), 0).await.overall_code,
        Code::Ok as i32
    );
    // Two refusals by the bucket; the second begins the ban.
    for _ in 0..2 {
        let refused = call(&mut rls, search(), 0).await;
        assert_eq!(refused.overall_code, Code::OverLimit as i32);
    }
    let banned = call(&mut rls, search(), 0).await;
    assert_eq!(banned.overall_code, Code::OverLimit as i32);
    assert_eq!(banned.statuses[0].code, Code::OverLimit as i32);
    let retry_after: u64 = header(&banned, "retry-after").unwrap().parse().unwrap();
    assert!(
        retry_after > 800,
        "the ban's rest, not the bucket's wait: {retry_after}"
    );
    let scrape = gateway.render_metrics();
    assert_metrics(
        &scrape,
        &[
            ("tollgate_bans_total{limit=\"search\"}", 1.0),
            (
                "tollgate_requests_total{outcome=\"banned\",route=\"rls\"}",
                1.0,
            ),
            (
                "tollgate_requests_total{outcome=\"limited\",route=\"rls\"}",
                2.0,
            ),
            (
                "tollgate_decision_requests_total{outcome=\"banned\",protocol=\"grpc\"}",
                1.0,
            ),
        ],
    );
    gateway.shutdown().await;
}

#[tokio::test]
async fn what_is_not_a_call_is_answered_as_grpc_answers_it() {
    let (gateway, _) = start(RULES).await;
    let address = gateway.decision_address.unwrap();
    // Not gRPC at all: an HTTP/1.1 POST to the method's path.
    let plain = HttpClient::new(address)
        .post(
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            &[("content-type", "application/json")],
            "{}",
        )
        .await;
    assert_eq!(plain.header("grpc-status"), Some("3"));
    // A broken frame over h2c.
    let broken = HttpClient::h2c(address)
        .send(
            "POST",
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            &[("content-type", "application/grpc"), ("te", "trailers")],
            bytes::Bytes::from_static(&[0, 0, 0, 0, 9, 1]),
        )
        .await;
    assert_eq!(broken.header("grpc-status"), Some("3"));
    let compressed = HttpClient::h2c(address)
        .send(
            "POST",
            "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
            &[("content-type", "application/grpc"), ("te", "trailers")],
            bytes::Bytes::from_static(&[1, 0, 0, 0, 0]),
        )
        .await;
    assert_eq!(compressed.header("grpc-status"), Some("12"));
    gateway.shutdown().await;
}

/// Envoy's calls are decided with the operators' overrides, as the proxy's requests are: a
/// raised network bucket, and an exempt one.
#[tokio::test]
async fn overrides_decide_grpc_calls_too() {
    let (gateway, mut rls) = start(RULES).await;
    let admin = HttpClient::new(gateway.admin_address);
    let put = |key: &'static str, body: &'static str| {
        let admin = admin.clone();
        async move {
            admin
                .send(
                    "PUT",
                    &format!("/overrides/per_network?key={key}"),
                    &[],
                    bytes::Bytes::from(body),
                )
                .await
                .status
        }
    };
    assert_eq!(
        put("2001:db8:9:9::1", r#"{"capacity": 4, "rate": "1/h"}"#).await,
        200
    );
    assert_eq!(put("198.51.100.7", r#"{"exempt": true}"#).await, 200);
    let address = |text: &str| vec![descriptor(&[("remote_address", text)])];
    let mut codes = Vec::new();
    for _ in 0..5 {
        let answer = call(&mut rls, address("2001:db8:9:9::2"), 0).await;
        codes.push(answer.overall_code);
    }
    let (ok, over) = (Code::Ok as i32, Code::OverLimit as i32);
    assert_eq!(codes, [ok, ok, ok, ok, over], "four for the overridden /64");
    for _ in 0..5 {
        let answer = call(&mut rls, address("198.51.100.7"), 0).await;
        assert_eq!(answer.overall_code, ok, "exempt");
    }
    gateway.shutdown().await;
}
