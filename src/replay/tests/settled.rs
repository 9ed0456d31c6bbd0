//! Settled costs as a replay reads them from tollgate's JSON log.

use super::super::log_line::LoggedCosts;
use super::*;

#[test]
fn a_settled_cost_is_replayed_as_reserved_then_settled() {
    let policy = Policy::parse(
        "replay.toml",
        "[upstreams.llm]\nurl = \"http://127.0.0.1:1\"\n[limits.org_tokens]\nkey = \"global\"\ncapacity = 1000\nrate = \"1000/min\"\n[[routes]]\nname = \"chat\"\npath_prefix = \"/api\"\nupstream = \"llm\"\nlimits = [{ limit = \"org_tokens\", cost = { json = \"max_tokens\", default = 256 }, settle = { json = \"usage.total_tokens\" } }]\n",
    )
    .unwrap();
    let settled = |time: f64, reserved: &str, settled: &str| LogLine {
        costs: Some(LoggedCosts {
            reserved: format!("org_tokens={reserved}").into(),
            settled: format!("org_tokens={settled}").into(),
        }),
        ..line(time, None, "192.0.2.1")
    };
    let mut replay = Replay::new(&policy);
    // Reserved 10, used 1600: a debt of 600 that the next second's request waits for, and
    // that 40 s of refill (667 tokens) repays.
    replay.decide(&settled(1000.0, "10", "1600"));
    replay.decide(&settled(1001.0, "10", "10"));
    replay.decide(&settled(1040.0, "10", "10"));
    let report = replay.report();
    assert_eq!(
        (report.limits[0].requests, report.limits[0].refusals),
        (3, 1)
    );

    // Without the logged costs each request costs the default reservation: none refused.
    let mut replay = Replay::new(&policy);
    for time in [1000.0, 1001.0, 1040.0] {
        replay.decide(&line(time, None, "192.0.2.1"));
    }
    assert_eq!(replay.report().limits[0].refusals, 0);
}

#[test]
fn a_json_line_carries_its_settled_costs() {
    let mut parser = LineParser::default();
    let access = br#"{"timestamp":"2026-12-02T12:00:00Z","target":"tollgate::access","client":"192.0.2.1","method":"POST","path":"/v1","outcome":"allowed","keys":"org_tokens=h:ab","reserved":"org_tokens=256","settled":"org_tokens=153.5"}"#;
    let line = parser.parse(&Format::Json, access).unwrap().unwrap();
    assert_eq!(line.costs.unwrap().of("org_tokens"), Some((256.0, 153.5)));
    let plain = br#"{"timestamp":"2026-12-02T12:00:00Z","target":"tollgate::access","client":"192.0.2.1","method":"GET","path":"/","outcome":"allowed","keys":"","reserved":"","settled":""}"#;
    assert_eq!(
        parser.parse(&Format::Json, plain).unwrap().unwrap().costs,
        None
    );
}
