use std::time::Duration;

use super::*;
use crate::limit::KeyPart;

fn request(
    limit: &'static str,
    who: u8,
    capacity: f64,
    rate: f64,
    cost: f64,
) -> BucketRequest<'static> {
    BucketRequest {
        key: BucketKey {
            limit,
            fingerprint: 7,
            parts: smallvec::smallvec![KeyPart::Digest([who; 16])],
        },
        charge: Charge {
            capacity,
            rate,
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

#[test]
fn buckets_are_per_key_and_per_limit() {
    let store = MemoryStore::new(1000, Clock::manual());
    let alice = [request("login", 1, 2.0, 1.0, 1.0)];
    let bob = [request("login", 2, 2.0, 1.0, 1.0)];
    let alice_elsewhere = [request("export", 1, 2.0, 1.0, 1.0)];
    assert!(store.decide(&alice).is_admitted());
    assert!(store.decide(&alice).is_admitted());
    assert!(!store.decide(&alice).is_admitted());
    assert!(store.decide(&bob).is_admitted());
    assert!(store.decide(&alice_elsewhere).is_admitted());
}

#[test]
fn a_changed_definition_starts_fresh() {
    let store = MemoryStore::new(1000, Clock::manual());
    let old = [request("login", 1, 1.0, 1.0, 1.0)];
    let mut new = old.clone();
    new[0].key.fingerprint = 8;
    assert!(store.decide(&old).is_admitted());
    assert!(!store.decide(&old).is_admitted());
    assert!(store.decide(&new).is_admitted());
}

#[test]
fn refused_requests_charge_nothing_across_shards() {
    let store = MemoryStore::new(1_000_000, Clock::manual());
    let requests: Vec<BucketRequest<'_>> = (0..40)
        .map(|who| request("l", who, 1.0, 1.0, 1.0))
        .collect();
    let mut last = requests.clone();
    last.push(request("tiny", 0, 1.0, 1.0, 1.0));
    assert!(store.decide(&last[40..]).is_admitted());
    assert!(
        !store.decide(&last).is_admitted(),
        "the tiny bucket is empty"
    );
    assert!(
        store.decide(&requests).is_admitted(),
        "nothing was charged by the refusal"
    );
}

#[test]
fn full_buckets_are_swept_and_memory_follows_active_keys() {
    let clock = Clock::manual();
    let store = MemoryStore::new(1_000_000, clock.clone());
    for who in 0..=255u8 {
        assert!(store
            .decide(&[request("net", who, 10.0, 1.0, 1.0)])
            .is_admitted());
    }
    assert_eq!(store.len(), 256);
    clock.advance(Duration::from_millis(999));
    store.sweep();
    assert_eq!(store.len(), 256, "not full yet");
    clock.advance(Duration::from_millis(1));
    store.sweep();
    assert_eq!(store.len(), 0);
}

#[test]
fn a_refused_new_key_does_not_take_a_slot() {
    let store = MemoryStore::new(1000, Clock::manual());
    let mut requests = vec![request("a", 1, 1.0, 1.0, 1.0)];
    assert!(store.decide(&requests).is_admitted());
    requests.push(request("b", 2, 5.0, 1.0, 1.0));
    assert!(!store.decide(&requests).is_admitted());
    assert_eq!(store.len(), 1, "b's bucket is full and needs no state");
}

#[test]
fn bounded_by_max_keys_dropping_the_fullest_first() {
    let clock = Clock::manual();
    let store = MemoryStore::new(16, clock.clone());
    // An old, heavily used key: far from full.
    let heavy = [request("net", 0, 100.0, 0.001, 100.0)];
    assert!(store.decide(&heavy).is_admitted());
    for who in 1..=200u8 {
        clock.advance(Duration::from_millis(1));
        store.decide(&[request("net", who, 10.0, 1.0, 1.0)]);
        assert!(store.len() <= 16);
    }
    assert!(store.evicted_before_full() > 0);
    assert!(
        !store.decide(&heavy).is_admitted(),
        "the emptiest bucket survived the pressure"
    );
}

#[test]
fn a_key_refused_often_is_banned_whatever_its_bucket_holds() {
    let clock = Clock::manual();
    let store = MemoryStore::new(1000, clock.clone());
    let ban = Ban {
        after: 2,
        within: Duration::from_secs(60),
        duration: Duration::from_secs(600),
    };
    let mut alice = [request("login", 1, 1.0, 1.0, 1.0)];
    alice[0].ban = Some(ban);
    assert!(store.decide(&alice).is_admitted());
    let first = store.decide(&alice);
    assert!(!first.is_admitted() && !first.verdicts()[0].ban_began);
    let second = store.decide(&alice);
    assert!(!second.is_admitted() && second.verdicts()[0].ban_began);
    // The bucket refills within a second; the ban holds for ten minutes.
    clock.advance(Duration::from_secs(300));
    let banned = store.decide(&alice);
    assert!(!banned.is_admitted());
    assert!(banned.verdicts()[0].banned);
    assert!((banned.verdicts()[0].wait - 300.0).abs() < 1e-6);
    let state = store.inspect(&alice[0].key, &alice[0].charge, None);
    assert!(state.banned_until.is_some());
    // A banned request charges none of the request's other buckets.
    let mut with_other = vec![alice[0].clone(), request("api", 1, 5.0, 1.0, 1.0)];
    assert!(!store.decide(&with_other).is_admitted());
    with_other.remove(0);
    let other = store.decide(&with_other);
    assert!((other.verdicts()[0].tokens - 4.0).abs() < 1e-9, "{other:?}");
    clock.advance(Duration::from_secs(301));
    assert!(store.decide(&alice).is_admitted());
    // Lifting: a forgotten key is neither banned nor counted.
    store.decide(&alice);
    store.decide(&alice);
    assert!(store.decide(&alice).verdicts()[0].banned);
    store.forget(&alice[0].key);
    assert!(store.decide(&alice).is_admitted());
}

#[test]
fn a_shadow_ban_is_counted_never_enforced() {
    let store = MemoryStore::new(1000, Clock::manual());
    let mut peek = [request("login", 1, 1.0, 1.0, 1.0)];
    peek[0].charge.enforce = false;
    peek[0].ban = Some(Ban {
        after: 1,
        within: Duration::from_secs(60),
        duration: Duration::from_secs(600),
    });
    assert!(store.decide(&peek).is_admitted());
    let would_refuse = store.decide(&peek);
    assert!(would_refuse.is_admitted() && would_refuse.verdicts()[0].ban_began);
    let after = store.decide(&peek);
    assert!(after.is_admitted() && !after.verdicts()[0].banned);
}
