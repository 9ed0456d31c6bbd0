use super::*;

fn policy() -> Policy {
    Policy::parse(
        "replay.toml",
        "[upstreams.app]\nurl = \"http://127.0.0.1:1\"\n[limits.per_user]\nkey = { header = \"x-user\" }\ncapacity = 3\nrate = \"1/min\"\n[limits.per_network]\nkey = \"client_network\"\ncapacity = 100\nrate = \"1/s\"\n[[routes]]\nname = \"api\"\npath_prefix = \"/api\"\nupstream = \"app\"\nlimits = [\"per_user\", \"per_network\"]\n",
    )
    .unwrap()
}

fn line(time: f64, user: Option<&str>, client: &str) -> LogLine<'static> {
    LogLine {
        time,
        method: "GET",
        path: "/api/x".into(),
        client: client.parse().ok(),
        forwarded_for: None,
        host: None,
        keys: Some(
            user.map(|user| format!("per_user=h:{user}"))
                .unwrap_or_default()
                .into(),
        ),
        decided: true,
        logged: Vec::new(),
        costs: None,
        origin: Default::default(),
        ja4: None,
        user_agent: None,
    }
}

#[test]
fn a_replay_decides_with_the_logs_clock_and_suggests_capacities() {
    let policy = policy();
    let mut replay = Replay::new(&policy);
    // alice: 5 requests in one second (2 refused at capacity 3); bob: 3, one a minute apart.
    for second in 0..5 {
        replay.decide(&LogLine {
            path: if second == 4 { "/api/login" } else { "/api/x" }.into(),
            user_agent: Some("Mozilla/5.0 (X11; Linux x86_64)".into()),
            ..line(1000.0 + f64::from(second) * 0.2, Some("alice"), "192.0.2.1")
        });
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
    assert_eq!(per_user.keys, 2, "alice and bob");
    assert_eq!(
        per_user.top_keys,
        [TopKey {
            key: "h:alice".to_owned(),
            requests: 5,
            refusals: 2,
            paths: vec![("/api/login".to_owned(), 1), ("/api/x".to_owned(), 1)],
            agents: vec![("Mozilla/5.0 (X11; Linux x86_64)".to_owned(), 2)],
        }],
        "its requests beside its refusals, and what the refused ones carried"
    );
    // bob's 3 tokens over 120 s; alice's second of requests gives no rate.
    assert_eq!(per_user.rate_for_99_percent, Some(0.025));
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
    let mut parser = LineParser::default();
    let access = br#"{"timestamp":"2026-12-02T12:00:00.250000Z","level":"INFO","target":"tollgate::access","client":"192.0.2.1","method":"POST","path":"/lo\u0067in","route":"login","status":429,"outcome":"limited","keys":"per_account=h:ab12,per_network=v4:192.0.2.1/32"}"#;
    let parsed = parser.parse(&Format::Json, access).unwrap().unwrap();
    assert_eq!(parsed.time, 1_796_212_800.25);
    assert_eq!(parsed.path, "/login", "JSON escapes are read");
    // Asked in the logged order, or out of it.
    let mut keys = parsed.logged_keys();
    assert_eq!(keys.key("per_account"), Some("h:ab12"));
    assert_eq!(keys.key("per_network"), Some("v4:192.0.2.1/32"));
    let mut keys = parsed.logged_keys();
    assert_eq!(keys.key("per_network"), Some("v4:192.0.2.1/32"));
    assert_eq!(keys.key("per"), None);
    assert_eq!(keys.key("per_account"), Some("h:ab12"));
    assert!(parsed.decided);
    let other = br#"{"timestamp":"2026-12-02T12:00:00Z","level":"INFO","target":"tollgate","message":"listening"}"#;
    assert_eq!(parser.parse(&Format::Json, other).unwrap(), None);
    assert!(parser
        .parse(&Format::Json, b"127.0.0.1 - - [02/Dec/2026]")
        .is_err());
}

proptest::proptest! {
    /// The fast scan of an access line reads what serde_json reads, and gives way to it on
    /// any line it does not read in full.
    #[test]
    fn the_fast_scan_of_an_access_line_agrees_with_serde_json(
        path in "[ -~]{0,16}",
        method in proptest::prop_oneof![
            proptest::strategy::Just("\"GET\"".to_owned()),
            proptest::strategy::Just("12".to_owned()),
        ],
        twice in proptest::bool::ANY,
        extra in proptest::prop_oneof![
            proptest::strategy::Just(String::new()),
            proptest::strategy::Just(",\"span\":{\"a\":1}".to_owned()),
            proptest::strategy::Just(",\"n\":-1.5e3,\"ok\":true".to_owned()),
        ],
    ) {
        let path = serde_json::to_string(&path).unwrap();
        let repeated = if twice { format!(",\"path\":{path}") } else { String::new() };
        let line = format!(
            r#"{{"timestamp":"2026-12-02T12:00:00Z","client":"192.0.2.1","method":{method},"path":{path}{repeated},"outcome":"allowed","keys":"a=b"{extra},"target":"tollgate::access"}}"#
        );
        let by_serde = read::AccessFields::deserialize(&line);
        match read::AccessFields::scan(&line) {
            Some(scanned) => proptest::prop_assert_eq!(Ok(scanned), by_serde, "{}", line),
            None => proptest::prop_assert!(
                by_serde.is_err() || line.contains('\\') || extra.contains('{'),
                "the scan gave up on a plain line: {}", line
            ),
        }
    }
}

#[test]
fn combined_lines_are_read_with_their_forwarded_for() {
    let mut parser = LineParser::default();
    let nginx = br#"203.0.113.9 - alice [02/Dec/2026:13:00:00 +0100] "POST /login?next=/x HTTP/1.1" 429 0 "-" "curl/8.0" "198.51.100.7, 10.0.0.1""#;
    let parsed = parser.parse(&Format::Combined, nginx).unwrap().unwrap();
    assert_eq!(parsed.time, 1_796_212_800.0);
    assert_eq!((parsed.method, &*parsed.path), ("POST", "/login"));
    assert_eq!(parsed.client, Some("203.0.113.9".parse().unwrap()));
    assert_eq!(
        parsed.forwarded_for.as_deref(),
        Some("198.51.100.7, 10.0.0.1")
    );
    assert_eq!(parsed.agent(), Some("curl/8.0"));
    assert_eq!((parsed.keys, parsed.decided), (None, true));
    // Apache escapes quotes in a field; an absolute-form target has its path taken.
    let apache = br#"::1 - - [02/Dec/2026:12:00:00 +0000] "GET http://example.com/api/x HTTP/1.1" 200 5 "-" "say \"hi\""#;
    let parsed = parser.parse(&Format::Combined, apache).unwrap().unwrap();
    assert_eq!((&*parsed.path, &parsed.forwarded_for), ("/api/x", &None));
    assert!(parsed
        .agent()
        .is_some_and(|agent| agent.starts_with("say ")));
    // A request line the server could not read reached no limit.
    let garbage = br#"192.0.2.1 - - [02/Dec/2026:12:00:00 +0000] "\x16\x03\x01" 400 150 "-" "-""#;
    assert!(
        !parser
            .parse(&Format::Combined, garbage)
            .unwrap()
            .unwrap()
            .decided
    );
    for bad in [
        &b"not a log line"[..],
        b"192.0.2.1 - - 02/Dec/2026 \"GET / HTTP/1.1\" 200",
        b"192.0.2.1 - - [yesterday] \"GET / HTTP/1.1\" 200 1 \"-\" \"-\"",
        b"192.0.2.1 - - [02/Dec/2026:12:00:00 +0000] \"GET / HTTP/1.1\"",
    ] {
        assert!(parser.parse(&Format::Combined, bad).is_err(), "{bad:?}");
    }
}

#[test]
fn a_combined_log_replays_client_limits_and_reports_the_rest_not_replayable() {
    let policy = Policy::parse(
        "replay.toml",
        "[upstreams.app]\nurl = \"http://127.0.0.1:1\"\n[client_ip]\ntrusted_hops = 1\n[limits.per_user]\nkey = { header = \"x-user\" }\ncapacity = 3\nrate = \"1/min\"\n[limits.per_network]\nkey = \"client_network\"\ncapacity = 2\nrate = \"1/min\"\n[[routes]]\nname = \"api\"\npath_prefix = \"/api\"\nupstream = \"app\"\nlimits = [\"per_user\", \"per_network\"]\n",
    )
    .unwrap();
    let mut replay = Replay::new(&policy);
    let mut parser = LineParser::default();
    // Three clients behind one proxy (10.0.0.1), told apart by the hop it appended; the
    // third request of 198.51.100.7 is refused.
    for (second, client) in [
        "198.51.100.7",
        "198.51.100.7",
        "198.51.100.8",
        "198.51.100.7",
    ]
    .iter()
    .enumerate()
    {
        let text = format!(
            r#"10.0.0.1 - - [02/Dec/2026:12:00:0{second} +0000] "GET /api/x HTTP/1.1" 200 1 "-" "-" "{client}""#
        );
        replay.decide(
            &parser
                .parse(&Format::Combined, text.as_bytes())
                .unwrap()
                .unwrap(),
        );
    }
    let report = replay.report();
    let [per_user, per_network] = &report.limits[..] else {
        panic!("{report:?}")
    };
    assert_eq!(
        (
            per_user.requests,
            per_user.not_replayable,
            per_user.refusals
        ),
        (4, 4, 0)
    );
    assert_eq!((per_network.requests, per_network.refusals), (4, 1));
    assert_eq!(per_network.top_keys.len(), 1);
    assert_eq!(
        (
            per_network.top_keys[0].key.as_str(),
            per_network.top_keys[0].refusals
        ),
        ("v4:198.51.100.7/32", 1)
    );
}

#[test]
fn a_report_page_holds_a_chart_per_limit_and_escapes_names() {
    let policy = policy();
    let mut replay = Replay::new(&policy);
    for second in 0..5 {
        replay.decide(&line(
            1000.0 + f64::from(second),
            Some("<alice>"),
            "192.0.2.1",
        ));
    }
    let page = replay.report().to_html("policy <&>.toml", None);
    assert!(page.contains("policy &lt;&amp;&gt;.toml"));
    assert!(page.contains("h:&lt;alice&gt;"));
    assert!(!page.contains("<alice>"));
    // Two limits: a timeline each, and each has a key's peak usage to show.
    assert_eq!(page.matches("<svg").count(), 4);
    assert!(!page.contains("<script"), "readable without scripts");
    assert!(
        !page.contains("http://") || !page.contains("src="),
        "loads nothing"
    );
}

#[test]
fn a_line_longer_than_the_bound_is_skipped_and_counted_without_being_held() {
    use std::io::Write as _;
    let good = br#"192.0.2.1 - - [02/Dec/2026:12:00:00 +0000] "GET /api/x HTTP/1.1" 200 5 "-" "-""#;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("access.log.gz");
    let mut gzip = flate2::write::GzEncoder::new(
        std::fs::File::create(&path).unwrap(),
        flate2::Compression::fast(),
    );
    gzip.write_all(good).unwrap();
    gzip.write_all(b"\n").unwrap();
    // 64 MiB of one line: compressed to a few hundred KiB, as an attacker's file would be.
    let chunk = vec![b'a'; 1 << 20];
    for _ in 0..64 {
        gzip.write_all(&chunk).unwrap();
    }
    gzip.write_all(b"\n").unwrap();
    gzip.write_all(good).unwrap();
    gzip.write_all(b"\n").unwrap();
    gzip.finish().unwrap();

    let mut seen = Vec::new();
    read_lines(
        &[path.display().to_string()],
        &Format::Combined,
        |number, line| {
            seen.push((number, line.map(|line| line.path.into_owned())));
        },
    )
    .unwrap();
    assert_eq!(seen.len(), 3, "{seen:?}");
    assert_eq!(seen[0], (1, Ok("/api/x".to_owned())));
    assert_eq!(seen[1].0, 2);
    assert_eq!(seen[1].1, Err(LineError::TooLong(read::MAX_LINE_BYTES)));
    assert_eq!(seen[2], (3, Ok("/api/x".to_owned())));
}

#[test]
fn a_split_line_grows_no_further_than_one_byte_past_the_bound() {
    let mut line = Vec::new();
    for _ in 0..5 {
        read::extend_bounded(&mut line, &vec![b'a'; read::MAX_LINE_BYTES / 2]);
    }
    assert_eq!(line.len(), read::MAX_LINE_BYTES + 1);
}

#[test]
fn a_log_out_of_time_order_refills_each_interval_once() {
    // A web server writes lines as requests end: within a second or a minute they are not in
    // time order. Capacity 1 and a token per 100 s, 20 lines alternating between two moments
    // 100 s apart: the bucket allows 2, whatever the order.
    let policy = Policy::parse(
        "replay.toml",
        "[upstreams.app]\nurl = \"http://127.0.0.1:1\"\n[limits.per_user]\nkey = { header = \"x-user\" }\ncapacity = 1\nrate = \"1/100s\"\n[[routes]]\nname = \"api\"\npath_prefix = \"/api\"\nupstream = \"app\"\nlimits = [\"per_user\"]\n",
    )
    .unwrap();
    let mut replay = Replay::new(&policy);
    for request in 0..20 {
        let time = if request % 2 == 0 { 1000.0 } else { 1100.0 };
        replay.decide(&line(time, Some("alice"), "192.0.2.1"));
    }
    let report = replay.report();
    assert_eq!(
        (report.limits[0].requests, report.limits[0].refusals),
        (20, 18)
    );
}

const CADDY: &[u8] = br#"{"level":"info","ts":1796385600.25,"logger":"http.log.access.log0","msg":"handled request","request":{"remote_ip":"10.0.0.1","remote_port":"51234","client_ip":"10.0.0.1","proto":"HTTP/1.1","method":"POST","host":"shop.example.com","uri":"/api/login?next=%2F","headers":{"User-Agent":["curl/8.5.0"],"X-Forwarded-For":["198.51.100.7","203.0.113.9"]}},"bytes_read":25,"user_id":"","duration":0.0012,"size":2,"status":200,"resp_headers":{"Content-Type":["text/plain"]}}"#;

const TRAEFIK: &[u8] = br#"{"ClientAddr":"10.0.0.1:51234","ClientHost":"10.0.0.1","ClientPort":"51234","ClientUsername":"-","DownstreamContentSize":2,"DownstreamStatus":429,"Duration":1234567,"RequestAddr":"shop.example.com","RequestHost":"shop.example.com","RequestMethod":"GET","RequestPath":"/api/x?y=1","RequestProtocol":"HTTP/1.1","RouterName":"app@docker","StartLocal":"2026-12-04T13:00:00.5+01:00","StartUTC":"2026-12-04T12:00:00.5Z","entryPointName":"web","level":"info","msg":"","request_X-Forwarded-For":"198.51.100.7","time":"2026-12-04T13:00:00+01:00"}"#;

#[test]
fn limits_keyed_by_a_header_cookie_or_query_replay_when_the_log_recorded_the_value() {
    let policy = Policy::parse(
        "replay.toml",
        "[store]\nhash_key = \"a replay secret of some length\"\n[upstreams.app]\nurl = \"http://127.0.0.1:1\"\n\
         [limits.per_user]\nkey = { header = \"x-user-id\" }\ncapacity = 1\nrate = \"1/h\"\n\
         [limits.per_session]\nkey = { cookie = \"session\" }\ncapacity = 1\nrate = \"1/h\"\n\
         [limits.per_api_key]\nkey = { query = \"api_key\" }\nnormalize = \"lowercase\"\ncapacity = 1\nrate = \"1/h\"\n\
         [[routes]]\nname = \"api\"\npath_prefix = \"/api\"\nupstream = \"app\"\nlimits = [\"per_user\", \"per_session\", \"per_api_key\"]\n",
    )
    .unwrap();
    let format = Format::parse(
        "nginx:$remote_addr [$time_local] \"$request\" $status \"$http_x_user_id\" \"$cookie_session\" \"$arg_api_key\"",
    )
    .unwrap();
    let mut replay = Replay::new(&policy);
    let mut parser = LineParser::default();
    for (second, user, session, api_key) in [
        (1, "alice", "s1", "K1"),
        (2, "alice", "s2", "k2"),
        (3, "bob", "s1", "k3"),
        (4, "carol", "s3", "k1"),
        (5, "-", "-", "-"),
    ] {
        // The last request carried none of the three values (nginx logs them as `-`).
        let target = match api_key {
            "-" => "/api/x".to_owned(),
            api_key => format!("/api/x?api_key={api_key}"),
        };
        let line = format!(
            "192.0.2.1 [04/Dec/2026:12:00:0{second} +0000] \"GET {target} HTTP/1.1\" 200 \"{user}\" \"{session}\" \"{api_key}\""
        );
        replay.decide(&parser.parse(&format, line.as_bytes()).unwrap().unwrap());
    }
    let report = replay.report();
    let tally = |name: &str| {
        let limit = report
            .limits
            .iter()
            .find(|limit| limit.limit == name)
            .unwrap();
        (limit.refusals, limit.not_replayable)
    };
    // alice twice, session s1 twice, api key k1 twice (K1 normalized): one refusal each; the
    // line that logged none of them is not replayable for any.
    assert_eq!(tally("per_user"), (1, 1));
    assert_eq!(tally("per_session"), (1, 1));
    assert_eq!(tally("per_api_key"), (1, 1));
    // Hashed as the gateway hashes them: the key the gateway's log would carry.
    let per_user = report
        .limits
        .iter()
        .find(|limit| limit.limit == "per_user")
        .unwrap();
    let hasher = crate::key::KeyHasher::from_secret(b"a replay secret of some length");
    let mut expected = String::new();
    crate::limit::KeyPart::Digest(hasher.digest(b"alice")).push_to(&mut expected);
    assert_eq!(per_user.top_keys[0].key, expected);
}

#[test]
fn a_query_keyed_limit_replays_from_the_logged_target_of_any_format() {
    let policy = Policy::parse(
        "replay.toml",
        "[upstreams.app]\nurl = \"http://127.0.0.1:1\"\n[limits.per_api_key]\nkey = { query = \"api_key\" }\ncapacity = 1\nrate = \"1/h\"\n[[routes]]\nname = \"api\"\npath_prefix = \"/api\"\nupstream = \"app\"\nlimits = [\"per_api_key\"]\n",
    )
    .unwrap();
    let mut replay = Replay::new(&policy);
    let mut parser = LineParser::default();
    for (second, key) in [(1, "k1"), (2, "k1"), (3, "k2")] {
        let line = format!(
            "192.0.2.1 - - [04/Dec/2026:12:00:0{second} +0000] \"GET /api/x?page=2&api_key={key} HTTP/1.1\" 200 5 \"-\" \"-\""
        );
        replay.decide(
            &parser
                .parse(&Format::Combined, line.as_bytes())
                .unwrap()
                .unwrap(),
        );
    }
    let caddy = String::from_utf8_lossy(CADDY).replace("/api/login?next=%2F", "/api/x?api_key=k2");
    replay.decide(
        &parser
            .parse(&Format::Caddy, caddy.as_bytes())
            .unwrap()
            .unwrap(),
    );
    let report = replay.report();
    assert_eq!(
        (
            report.limits[0].requests,
            report.limits[0].refusals,
            report.limits[0].not_replayable
        ),
        (4, 2, 0),
        "k1 twice and k2 twice (once through Caddy's log), capacity 1"
    );
}

#[test]
fn a_logged_host_meets_the_routes_that_match_one() {
    let policy = Policy::parse(
        "replay.toml",
        "[upstreams.app]\nurl = \"http://127.0.0.1:1\"\n[limits.shop]\nkey = \"global\"\ncapacity = 1\nrate = \"1/h\"\n\
         [[routes]]\nname = \"shop\"\nhost = \"shop.example.com\"\npath_prefix = \"/\"\nupstream = \"app\"\nlimits = [\"shop\"]\n\
         [[routes]]\nname = \"rest\"\npath_prefix = \"/\"\nupstream = \"app\"\n",
    )
    .unwrap();
    let format = Format::parse("nginx:$host [$time_local] \"$request\" $status").unwrap();
    let mut replay = Replay::new(&policy);
    let mut parser = LineParser::default();
    for (second, host) in [
        (1, "SHOP.example.com:443"),
        (2, "shop.example.com"),
        (3, "other.example.com"),
    ] {
        let line = format!("{host} [04/Dec/2026:12:00:0{second} +0000] \"GET / HTTP/1.1\" 200");
        replay.decide(&parser.parse(&format, line.as_bytes()).unwrap().unwrap());
    }
    let report = replay.report();
    let shop = report
        .limits
        .iter()
        .find(|limit| limit.route == "shop")
        .unwrap();
    assert_eq!(
        (shop.requests, shop.refusals),
        (2, 1),
        "the host in any case, with a port"
    );
}

mod formats;
mod settled;

/// A one-limit policy whose bucket holds `capacity` tokens and refills 1 a second.
fn policy_of_capacity(capacity: f64) -> Policy {
    Policy::parse(
        "replay.toml",
        &format!("[upstreams.app]\nurl = \"http://127.0.0.1:1\"\n[limits.per_user]\nkey = {{ header = \"x-user\" }}\ncapacity = {capacity}\nrate = \"1/s\"\n[[routes]]\nname = \"api\"\npath_prefix = \"/api\"\nupstream = \"app\"\nlimits = [\"per_user\"]\n"),
    )
    .unwrap()
}

/// Refusals of each key when `times` are replayed (as one user each list) at `capacity`.
fn refusals_at(capacity: f64, users: &[Vec<f64>]) -> (u64, Option<f64>) {
    let policy = policy_of_capacity(capacity);
    let mut replay = Replay::new(&policy);
    for (user, times) in users.iter().enumerate() {
        for time in times {
            replay.decide(&line(*time, Some(&format!("u{user}")), "192.0.2.1"));
        }
    }
    let report = replay.report();
    (report.limits[0].refusals, report.limits[0].capacity_for_all)
}

#[test]
fn the_suggestion_holds_for_a_log_whose_lines_go_back_in_time() {
    // A burst at 100 s, then lines logged late: 96 s arrives after 100 s. The bucket's moment
    // stays at 100 s, so going back to 96 s and forward again refills nothing twice.
    let times = vec![100.0, 100.0, 100.0, 96.0, 100.0, 97.0, 100.0, 101.0];
    let (_, suggested) = refusals_at(1000.0, std::slice::from_ref(&times));
    let suggested = suggested.unwrap();
    assert_eq!(
        suggested, 7.0,
        "8 requests within 1 s of log time, nothing refilled twice"
    );
    assert_eq!(refusals_at(suggested, std::slice::from_ref(&times)).0, 0);
    assert!(refusals_at(suggested - 1.0, std::slice::from_ref(&times)).0 >= 1);
    // The report says how far the log went back: 96 s and 97 s came after 100 s.
    let policy = policy_of_capacity(5.0);
    let mut replay = Replay::new(&policy);
    for time in &times {
        replay.decide(&line(*time, Some("u0"), "192.0.2.1"));
    }
    let report = replay.report();
    assert_eq!((report.lines_behind, report.most_seconds_behind), (2, 4.0));
    assert!(report
        .to_text()
        .contains("2 lines came after a later one (at most 4.000 s behind)"));
    assert_eq!(report.to_json()["lines_behind"], 2);
}

proptest::proptest! {
    /// Whatever the order of a log's lines, replaying it at the capacity suggested for every
    /// key refuses nothing, and at one token less refuses something.
    #[test]
    fn the_suggested_capacity_never_refuses_and_one_less_does(
        users in proptest::collection::vec(
            proptest::collection::vec(0u32..400, 1..40),
            1..4,
        ),
    ) {
        // Quarter seconds, in the generated order: lines out of time order.
        let users: Vec<Vec<f64>> = users
            .iter()
            .map(|times| times.iter().map(|time| 1000.0 + f64::from(*time) / 4.0).collect())
            .collect();
        let (_, suggested) = refusals_at(1000.0, &users);
        let suggested = suggested.unwrap();
        proptest::prop_assert_eq!(refusals_at(suggested, &users).0, 0);
        if suggested > 1.0 {
            proptest::prop_assert!(refusals_at(suggested - 1.0, &users).0 >= 1);
        }
    }
}
