use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::config::Policy;
use crate::limit::KeyPart;

const LIMITS: &str = r#"
[upstreams.app]
url = "http://127.0.0.1:3000"

[limits.per_org]
key = { header = "x-org" }
capacity = 100
rate = "10/s"

[limits.monthly]
key = { header = "x-org" }
quota = 1000
period = "month"

[limits.in_flight]
key = { header = "x-org" }
concurrency = 4

[[routes]]
name = "all"
path_prefix = "/"
upstream = "app"
limits = ["per_org", "monthly", "in_flight"]
"#;

fn limit(name: &str) -> Arc<Limit> {
    let policy = Policy::parse("test.toml", LIMITS).unwrap_or_else(|errors| panic!("{errors}"));
    policy
        .limits
        .iter()
        .find(|limit| &*limit.name == name)
        .unwrap()
        .clone()
}

fn read(limit_name: &str, body: &str) -> Result<Change, FieldError> {
    Change::read(body.as_bytes(), &limit(limit_name), None)
}

fn refused_field(limit_name: &str, body: &str) -> String {
    read(limit_name, body).unwrap_err().field
}

fn parts(byte: u8) -> KeyParts {
    smallvec::smallvec![KeyPart::Digest([byte; 16])]
}

fn entry(limit_name: &str, byte: u8, body: &str, now: u64) -> Override {
    let limit = limit(limit_name);
    let change = Change::read(body.as_bytes(), &limit, None).unwrap();
    Override::new(&limit, parts(byte), change, now, "203.0.113.9".to_owned())
}

#[test]
fn a_change_takes_the_numbers_of_its_limits_kind() {
    let change = read(
        "per_org",
        r#"{"capacity": 5000, "rate": "500/s", "reason": "launch"}"#,
    )
    .unwrap();
    assert_eq!(change.capacity, Some(5000.0));
    assert_eq!(change.rate.map(|rate| rate.per_second()), Some(500.0));
    assert_eq!(change.reason.as_deref(), Some("launch"));
    assert_eq!(
        read("monthly", r#"{"quota": 50}"#).unwrap().quota,
        Some(50.0)
    );
    assert_eq!(
        read("in_flight", r#"{"concurrency": 1}"#)
            .unwrap()
            .concurrency,
        Some(1)
    );
    assert!(read("in_flight", r#"{"exempt": true}"#).unwrap().exempt);
}

#[test]
fn every_malformed_change_names_its_field() {
    for (limit, body, field) in [
        ("per_org", r#"{"capacity": 5, "burst": 3}"#, "burst"),
        ("per_org", r#"{"capacity": -5}"#, "capacity"),
        ("per_org", r#"{"capacity": 0}"#, "capacity"),
        ("per_org", r#"{"capacity": 1e300}"#, "capacity"),
        ("per_org", r#"{"capacity": "5"}"#, "capacity"),
        ("per_org", r#"{"rate": "fast"}"#, "rate"),
        ("per_org", r#"{"rate": 5}"#, "rate"),
        ("per_org", r#"{"rate": "0/s"}"#, "rate"),
        (
            "per_org",
            r#"{"capacity": 9007199254740992, "rate": "1/d"}"#,
            "rate",
        ),
        ("per_org", r#"{"quota": 5}"#, "quota"),
        ("per_org", r#"{"concurrency": 5}"#, "concurrency"),
        ("monthly", r#"{"capacity": 5}"#, "capacity"),
        ("in_flight", r#"{"concurrency": 0}"#, "concurrency"),
        ("in_flight", r#"{"concurrency": 4294967296}"#, "concurrency"),
        ("in_flight", r#"{"concurrency": 1.5}"#, "concurrency"),
        ("per_org", r#"{"exempt": "yes"}"#, "exempt"),
        ("per_org", r#"{"exempt": true, "capacity": 5}"#, "capacity"),
        ("per_org", r#"{"exempt": false}"#, "body"),
        ("per_org", r#"{}"#, "body"),
        ("per_org", r#"{"reason": "only words"}"#, "body"),
        ("per_org", r#"[1, 2]"#, "body"),
        ("per_org", r#"{"capacity": 5"#, "body"),
        ("per_org", r#"{"capacity": 5, "ttl": "soon"}"#, "ttl"),
        ("per_org", r#"{"capacity": 5, "ttl": "0s"}"#, "ttl"),
        ("per_org", r#"{"capacity": 5, "ttl": 60}"#, "ttl"),
        ("per_org", r#"{"capacity": 5, "label": 7}"#, "label"),
    ] {
        assert_eq!(refused_field(limit, body), field, "{body}");
    }
    let long = format!(r#"{{"capacity": 5, "reason": "{}"}}"#, "é".repeat(201));
    assert_eq!(refused_field("per_org", &long), "reason");
    let just_fits = format!(r#"{{"capacity": 5, "reason": "{}"}}"#, "é".repeat(200));
    assert!(read("per_org", &just_fits).is_ok());
}

#[test]
fn max_ttl_bounds_a_ttl_and_is_the_default() {
    let limit = limit("per_org");
    let day = Some(Duration::from_secs(86_400));
    let read = |body: &str| Change::read(body.as_bytes(), &limit, day);
    assert_eq!(
        read(r#"{"capacity": 5, "ttl": "2d"}"#).unwrap_err().field,
        "ttl"
    );
    assert_eq!(
        read(r#"{"capacity": 5, "ttl": "12h"}"#).unwrap().ttl,
        Some(Duration::from_secs(43_200))
    );
    assert_eq!(read(r#"{"capacity": 5}"#).unwrap().ttl, day);
}

#[test]
fn an_override_leaves_the_limits_own_numbers_where_it_sets_none() {
    let per_org = limit("per_org");
    let raised = entry("per_org", 1, r#"{"capacity": 5000}"#, 0);
    assert_eq!(
        raised.tier(&per_org),
        Tier::Bucket {
            capacity: 5000.0,
            rate: per_org.rate
        }
    );
    let slowed = entry("per_org", 1, r#"{"rate": "1/s"}"#, 0);
    match slowed.tier(&per_org) {
        Tier::Bucket { capacity, rate } => {
            assert_eq!(capacity, 100.0);
            assert_eq!(rate.per_second(), 1.0);
        }
        Tier::Exempt => panic!("not exempt"),
    }
    let monthly = limit("monthly");
    match entry("monthly", 1, r#"{"quota": 50}"#, 0).tier(&monthly) {
        Tier::Bucket { capacity, rate } => {
            assert_eq!(capacity, 50.0);
            assert_eq!(
                rate.period, monthly.rate.period,
                "spread over the same period"
            );
        }
        Tier::Exempt => panic!("not exempt"),
    }
    assert_eq!(
        entry("per_org", 1, r#"{"exempt": true}"#, 0).tier(&per_org),
        Tier::Exempt
    );
    assert_eq!(
        entry("in_flight", 1, r#"{"concurrency": 9}"#, 0).slots(4),
        Some(9)
    );
    assert_eq!(
        entry("in_flight", 1, r#"{"exempt": true}"#, 0).slots(4),
        None
    );
}

#[test]
fn a_ttl_ends_an_override_and_none_lasts() {
    let ending = entry("per_org", 1, r#"{"capacity": 5, "ttl": "1m"}"#, 1_000);
    assert_eq!(ending.expires_unix, Some(1_060));
    assert!(ending.active_at(1_059));
    assert!(!ending.active_at(1_060));
    let lasting = entry("per_org", 1, r#"{"capacity": 5}"#, 1_000);
    assert_eq!(lasting.expires_unix, None);
    assert!(lasting.active_at(u64::MAX));
}

#[test]
fn a_stored_override_reads_back_whole() {
    let stored = entry(
        "per_org",
        7,
        r#"{"capacity": 5, "rate": "1/min", "label": "x"}"#,
        5,
    );
    let json = stored.to_json();
    assert_eq!(Override::parse(&json), Some(stored.clone()));
    assert_eq!(
        Override::parse(&json).unwrap().to_json(),
        json,
        "spelled the same again"
    );
    let value: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(value["key"], format!("h:{}", "07".repeat(16)));
    assert_eq!(value["created_by"], "203.0.113.9");
    assert_eq!(value["exempt"], false);
    assert!(value["expires_unix"].is_null());
    assert_eq!(Override::parse(&json.replace("h:07", "h:zz")), None);
    assert_eq!(Override::parse("{}"), None);
}

#[test]
fn the_table_finds_a_key_only_in_the_limit_and_kind_it_was_set_for() {
    let per_org = limit("per_org");
    let (table, before) = Table::default().with(entry("per_org", 1, r#"{"capacity": 5}"#, 0));
    assert!(before.is_none());
    assert!(table.find(&per_org, &parts(1)).is_some());
    assert!(table.find(&per_org, &parts(2)).is_none());
    assert!(table.find(&limit("monthly"), &parts(1)).is_none());
    // The same name, redefined as a quota: the bucket's override is not its.
    let mut redefined = (*limit("monthly")).clone();
    redefined.name = per_org.name.clone();
    assert!(table.find(&redefined, &parts(1)).is_none());

    let (replaced, before) = table.with(entry("per_org", 1, r#"{"capacity": 9}"#, 0));
    assert_eq!(before.unwrap().capacity, Some(5.0));
    assert_eq!(
        replaced.find(&per_org, &parts(1)).unwrap().capacity,
        Some(9.0)
    );
    let (emptied, removed) = replaced.without("per_org", &parts(1));
    assert_eq!(removed.unwrap().capacity, Some(9.0));
    assert!(
        emptied.is_empty(),
        "a limit without overrides leaves no entry"
    );
}

#[test]
fn lists_show_the_soonest_to_end_first_and_the_endless_last() {
    let table = Table::new([
        entry("per_org", 1, r#"{"capacity": 5}"#, 0),
        entry("per_org", 2, r#"{"capacity": 5, "ttl": "1h"}"#, 0),
        entry("monthly", 3, r#"{"quota": 5, "ttl": "1m"}"#, 0),
    ]);
    let order: Vec<Option<u64>> = table
        .listed()
        .iter()
        .map(|entry| entry.expires_unix)
        .collect();
    assert_eq!(order, [Some(60), Some(3_600), None]);
    let (kept, dropped) = table.split_off(|entry| entry.limit == "monthly");
    assert_eq!(dropped.len(), 1);
    assert_eq!(kept.counts().collect::<Vec<_>>(), [("per_org", 2)]);
}
