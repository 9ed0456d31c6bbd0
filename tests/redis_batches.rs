//! Decisions on one Redis node share script calls when they arrive together: a batch must
//! decide every request exactly as a call of its own would have, one after another. Driven on
//! a current-thread runtime, where every decision started before the test yields is queued
//! before the store's sender runs: which requests share a call does not depend on timing.
#![allow(clippy::disallowed_methods)] // tests measure real time

mod common;

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use futures_util::FutureExt;
use ipnet::IpNet;
use tollgate::config::RedisSettings;
use tollgate::limit::{
    AdaptiveParams, BucketKey, BucketRequest, Charge, Clock, KeyPart, RedisStore, StoreError,
    StoreVerdict,
};

use common::redis_server::RedisServer;

fn store(redis: &RedisServer, prefix: &str) -> RedisStore {
    store_with_timeout(redis, prefix, Duration::from_secs(5))
}

fn store_with_timeout(redis: &RedisServer, prefix: &str, timeout: Duration) -> RedisStore {
    let settings = RedisSettings {
        nodes: vec![redis.url()],
        cluster: false,
        timeout,
        connect_timeout: Duration::from_secs(1),
        prefix: prefix.to_owned(),
        ca_file: None,
        lease: Duration::from_secs(60),
        credentials: Default::default(),
        sentinel: None,
    };
    RedisStore::new(&settings, Clock::monotonic()).expect("store")
}

const NETWORKS: [&str; 3] = ["203.0.113.0/24", "198.51.100.0/24", "192.0.2.0/24"];

/// Refill slow enough that the test's own duration adds nothing measurable.
const RATE: f64 = 1e-9;

fn bucket(
    limit: &'static str,
    network: Option<&str>,
    capacity: f64,
    cost: f64,
) -> BucketRequest<'static> {
    BucketRequest {
        key: BucketKey {
            limit,
            fingerprint: 1,
            parts: network
                .map(|network| KeyPart::Network(network.parse::<IpNet>().unwrap()))
                .into_iter()
                .collect(),
        },
        charge: Charge {
            capacity,
            rate: RATE,
            cost,
            enforce: true,
            period: None,
            debt: 0.0,
        },
        adaptive: None,
        lease: None,
        ban: None,
    }
}

/// Three routes' worth of buckets: a shared global limit, per-network limits, one in shadow
/// mode and one adaptive (whose first network is under a penalty that halves it).
fn request(route: u64, network: &str) -> Vec<BucketRequest<'static>> {
    let mut shadow = bucket("shadow", Some(network), 3.0, 1.0);
    shadow.charge.enforce = false;
    let mut adaptive = bucket("adaptive", Some(network), 6.0, 1.0);
    adaptive.adaptive = Some(AdaptiveParams {
        threshold: 3,
        window: 10.0,
        factor: 0.5,
        min_capacity: 2.0,
        hold: 60.0,
    });
    match route {
        0 => vec![
            bucket("global", None, 12.0, 1.0),
            bucket("net", Some(network), 5.0, 1.0),
        ],
        1 => vec![bucket("net", Some(network), 5.0, 2.0), shadow, adaptive],
        _ => {
            adaptive.charge.cost = 2.0;
            vec![bucket("global", None, 12.0, 2.0), adaptive]
        }
    }
}

/// A fixed, varied sequence of requests (a linear congruential generator, seeded).
fn sequence(count: usize) -> Vec<Vec<BucketRequest<'static>>> {
    let mut state: u64 = 0x2545_F491_4F6C_DD1D;
    (0..count)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let draw = state >> 33;
            request(draw % 3, NETWORKS[(draw / 3 % 3) as usize])
        })
        .collect()
}

const PENALISED_TOKENS: f64 = 1e18;

/// Puts the first network's adaptive key under a penalty of one level for an hour.
fn penalise(redis: &RedisServer, prefix: &str) {
    let time = redis.cli(&["TIME"]);
    let mut lines = time.lines();
    let seconds: u64 = lines.next().unwrap().trim().parse().unwrap();
    let hold = (seconds + 3600) * 1_000_000;
    let key = format!("{prefix}adaptive:v4:{}", NETWORKS[0]);
    // Tokens far above the capacity, as of now: a full bucket (tokens are capped as read).
    let now = seconds as f64 * 1e6;
    let hold = hold as f64;
    redis.store_bucket(&key, &[PENALISED_TOKENS, now, 1.0, hold, hold]);
}

fn stored_tokens(redis: &RedisServer, key: &str) -> Option<f64> {
    redis.stored_bucket(key).map(|numbers| numbers[0])
}

fn assert_same_decisions(alone: &[StoreVerdict], batched: &[StoreVerdict]) {
    assert_eq!(alone.len(), batched.len());
    for (index, (alone, batched)) in alone.iter().zip(batched).enumerate() {
        assert_eq!(
            alone.is_admitted(),
            batched.is_admitted(),
            "request {index}"
        );
        for (alone, batched) in alone.verdicts().iter().zip(batched.verdicts()) {
            assert_eq!(alone.sufficient, batched.sufficient, "request {index}");
            assert_eq!(alone.capacity, batched.capacity, "request {index}");
            assert!(batched.observed, "request {index}");
            assert!(
                (alone.tokens - batched.tokens).abs() < 1e-6,
                "request {index}: {} alone, {} batched",
                alone.tokens,
                batched.tokens
            );
        }
    }
}

/// Decides `requests` one call each, then all together in one batch (each under a prefix of
/// its own, the first network penalised in both), and asserts that the two agree, request by
/// request and in what they stored. Gives back the batch's verdicts.
async fn decide_alone_and_together(requests: &[Vec<BucketRequest<'static>>]) -> Vec<StoreVerdict> {
    let redis = RedisServer::start();
    penalise(&redis, "alone:");
    penalise(&redis, "batched:");

    // One at a time, each from a fresh store: no deny cache between them, one call each.
    let mut alone = Vec::new();
    for request in requests {
        alone.push(
            store(&redis, "alone:")
                .decide(request)
                .await
                .expect("decision"),
        );
    }

    let batched_store = store(&redis, "batched:");
    let batched: Vec<StoreVerdict> =
        join_all(requests.iter().map(|request| batched_store.decide(request)))
            .await
            .into_iter()
            .map(|decision| decision.expect("decision"))
            .collect();
    assert_eq!(
        batched_store.batch_calls(),
        1,
        "{} requests queued together, one call",
        requests.len()
    );

    assert_same_decisions(&alone, &batched);
    let admitted = alone
        .iter()
        .filter(|decision| decision.is_admitted())
        .count();
    assert!(
        admitted > 5 && admitted < requests.len() - 8,
        "the sequence both admits and refuses ({admitted} admitted)"
    );

    let mut keys = vec!["global:global".to_owned()];
    for network in NETWORKS {
        for limit in ["net", "shadow", "adaptive"] {
            keys.push(format!("{limit}:v4:{network}"));
        }
    }
    for key in keys {
        let alone_tokens = stored_tokens(&redis, &format!("alone:{key}"));
        let batched_tokens = stored_tokens(&redis, &format!("batched:{key}"));
        match (alone_tokens, batched_tokens) {
            (Some(alone), Some(batched)) => {
                assert!(
                    (alone - batched).abs() < 1e-6,
                    "{key}: {alone} against {batched}"
                );
                let ttl: i64 = redis
                    .cli(&["PTTL", &format!("batched:{key}")])
                    .trim()
                    .parse()
                    .unwrap();
                // `penalise` stored one key without an expiry: it has one once charged.
                assert!(ttl > 0 || batched == PENALISED_TOKENS, "{key} expires");
            }
            (None, None) => {}
            other => panic!("{key} stored differently: {other:?}"),
        }
    }
    batched
}

fn penalty_applied(verdicts: &[StoreVerdict]) -> bool {
    verdicts
        .iter()
        .flat_map(|decision| decision.verdicts())
        .any(|verdict| verdict.capacity == 3.0)
}

#[tokio::test]
async fn a_batch_decides_each_request_as_its_own_call_in_turn_would() {
    let batched = decide_alone_and_together(&sequence(48)).await;
    assert!(
        penalty_applied(&batched),
        "the penalty applies inside a batch"
    );
}

#[tokio::test]
async fn identical_requests_in_a_row_decide_as_each_would_alone() {
    // The same sequence's requests, each repeated one to seven times in a row: runs that the
    // batch sends as one entry, each decided through its buckets' refusals, beside single ones.
    let requests: Vec<_> = sequence(16)
        .into_iter()
        .enumerate()
        .flat_map(|(index, request)| std::iter::repeat_n(request, 1 + index * 5 % 7))
        .collect();
    assert!(requests.len() > 48);
    let batched = decide_alone_and_together(&requests).await;
    assert!(
        penalty_applied(&batched),
        "the penalty applies inside a run"
    );
}

#[tokio::test]
async fn a_request_given_up_before_its_batch_is_sent_is_not_charged() {
    let redis = RedisServer::start();
    let store = store(&redis, "gone:");
    let only = || vec![bucket("net", Some(NETWORKS[0]), 5.0, 1.0)];
    let warm_up = only();
    assert!(store.decide(&warm_up).await.unwrap().is_admitted());
    let calls = store.batch_calls();

    let first_request = only();
    let mut first = Box::pin(store.decide(&first_request));
    assert!((&mut first).now_or_never().is_none(), "queued");
    let given_up = only();
    assert!(
        store.decide(&given_up).now_or_never().is_none(),
        "queued, then dropped"
    );
    let third_request = only();
    let third = store.decide(&third_request).await.unwrap();
    let first = first.await.unwrap();

    assert!(first.is_admitted() && third.is_admitted());
    assert_eq!(store.batch_calls() - calls, 1, "one call for the three");
    let key = format!("gone:net:v4:{}", NETWORKS[0]);
    let tokens = stored_tokens(&redis, &key).unwrap();
    assert!(
        (tokens - 2.0).abs() < 1e-6,
        "5 - 3 charges, not 4: {tokens}"
    );
}

/// Requests have no timer of their own: the calls keep their deadlines. One that waits for a
/// call Redis never answers must still time out by its own deadline, neither waiting for that
/// call and then a whole timeout more for its own, nor giving up before its time.
#[tokio::test]
async fn requests_queued_behind_a_silent_call_time_out_by_their_own_deadlines() {
    let redis = RedisServer::start();
    let timeout = Duration::from_secs(3);
    let store = store_with_timeout(&redis, "silent:", timeout);
    let only = || vec![bucket("net", Some(NETWORKS[0]), 5.0, 1.0)];
    let warm_up = only();
    assert!(store.decide(&warm_up).await.unwrap().is_admitted());
    redis.cli(&["CLIENT", "PAUSE", "60000", "ALL"]);

    let timed = |request: Vec<BucketRequest<'static>>| {
        let store = &store;
        async move {
            let started = Instant::now();
            let result = store.decide(&request).await;
            (result, started.elapsed())
        }
    };
    let first = timed(only());
    let second = async {
        // Queued while the first call is out: it would wait 1.5 s for that call to give up,
        // then 3 s for its own.
        tokio::time::sleep(timeout / 2).await;
        timed(only()).await
    };
    let ((first, first_waited), (second, second_waited)) = tokio::join!(first, second);
    for (result, waited) in [(first, first_waited), (second, second_waited)] {
        // The connection's own response timeout, as long, may say so first.
        assert!(
            matches!(result, Err(StoreError::Timeout | StoreError::Redis(_))),
            "{result:?}"
        );
        assert!(waited >= timeout, "gave up early: {waited:?}");
        assert!(
            waited < timeout * 5 / 4,
            "waited past its deadline: {waited:?}"
        );
    }
}

#[tokio::test]
async fn every_request_of_a_batch_learns_that_redis_is_down() {
    let mut redis = RedisServer::start();
    let store = store(&redis, "down:");
    let warm_up = request(0, NETWORKS[0]);
    assert!(store.decide(&warm_up).await.unwrap().is_admitted());
    redis.stop();
    let requests = sequence(5);
    let results = join_all(requests.iter().map(|request| store.decide(request))).await;
    assert!(results.iter().all(Result::is_err), "{results:?}");
}

#[tokio::test]
async fn tokens_arrive_exactly_as_the_script_computed_them() {
    let redis = RedisServer::start();
    let store = store(&redis, "exact:");
    let tenth = || {
        let mut request = bucket("fractions", None, 10.0, 0.1);
        // No refill that could show, however long the test takes.
        request.charge.rate = 1e-300;
        vec![request]
    };
    let requests: Vec<_> = (0..30).map(|_| tenth()).collect();
    let mut decisions: Vec<StoreVerdict> =
        join_all(requests.iter().map(|request| store.decide(request)))
            .await
            .into_iter()
            .map(|decision| decision.expect("decision"))
            .collect();
    for _ in 0..5 {
        decisions.push(store.decide(&tenth()).await.expect("decision"));
    }
    let mut expected = 10.0_f64;
    for decision in &decisions {
        expected -= 0.1;
        assert!(decision.is_admitted());
        assert_eq!(
            decision.verdicts()[0].tokens.to_bits(),
            expected.to_bits(),
            "{expected}"
        );
    }
}
