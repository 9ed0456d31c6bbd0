use super::*;

fn policy() -> Policy {
    Policy::parse(
        "replay.toml",
        "[upstreams.app]\nurl = \"http://127.0.0.1:1\"\n[limits.per_user]\nkey = { header = \"x-user\" }\ncapacity = 3\nrate = \"1/min\"\n[limits.per_network]\nkey = \"client_network\"\ncapacity = 100\nrate = \"1/s\"\n[[routes]]\nname = \"api\"\npath_prefix = \"/api\"\nupstream = \"app\"\nlimits = [\"per_user\", \"per_network\"]\n",
    )
    .unwrap()
}

fn line(time: f64, user: Option<&str>, client: &str) -> LogLine {
    LogLine {
        time,
        method: "GET".to_owned(),
        path: "/api/x".to_owned(),
        client: client.parse().ok(),
        keys: user
            .map(|user| [("per_user".to_owned(), format!("h:{user}"))].into())
            .unwrap_or_default(),
        decided: true,
    }
}

#[test]
fn a_replay_decides_with_the_logs_clock_and_suggests_capacities() {
    let policy = policy();
    let mut replay = Replay::new(&policy);
    // alice: 5 requests in one second (2 refused at capacity 3); bob: 3, one a minute apart.
    for second in 0..5 {
        replay.decide(&line(
            1000.0 + f64::from(second) * 0.2,
            Some("alice"),
            "192.0.2.1",
        ));
    }
    for minute in 0..3 {
        replay.decide(&line(
            1000.0 + f64::from(minute) * 60.0,
            Some("bob"),
            "192.0.2.2",
        ));
    }
    replay.decide(&line(1300.0, None, "192.0.2.3"));
    let report = replay.report();
    let per_user = &report.limits[0];
    assert_eq!((per_user.requests, per_user.refusals), (9, 2));
    assert_eq!(
        per_user.not_replayable, 1,
        "a request without the key in the log"
    );
    assert_eq!(per_user.keys_refused, 1);
    assert_eq!(per_user.top_keys, [("h:alice".to_owned(), 2)]);
    // alice needs 5 minus what refills in 0.8 s at 1/min: 4.99 → 5; bob never more than 1.
    assert_eq!(per_user.capacity_for_all, Some(5.0));
    assert_eq!(
        per_user.capacity_for_99_percent,
        Some(5.0),
        "of 2 keys, the 99th is alice"
    );
    let per_network = &report.limits[1];
    assert_eq!(
        (
            per_network.requests,
            per_network.refusals,
            per_network.not_replayable
        ),
        (9, 0, 0)
    );
}

#[test]
fn json_lines_are_read_and_other_log_events_passed_over() {
    let access = br#"{"timestamp":"2026-12-02T12:00:00.250000Z","level":"INFO","target":"tollgate::access","client":"192.0.2.1","method":"POST","path":"/login","route":"login","status":429,"outcome":"limited","keys":"per_account=h:ab12,per_network=v4:192.0.2.1/32"}"#;
    let parsed = read::parse_json_line(access).unwrap().unwrap();
    assert_eq!(parsed.time, 1_796_212_800.25);
    assert_eq!(parsed.keys["per_network"], "v4:192.0.2.1/32");
    assert!(parsed.decided);
    let other = br#"{"timestamp":"2026-12-02T12:00:00Z","level":"INFO","target":"tollgate","message":"listening"}"#;
    assert_eq!(read::parse_json_line(other).unwrap(), None);
    assert!(read::parse_json_line(b"127.0.0.1 - - [02/Dec/2026]").is_err());
}
