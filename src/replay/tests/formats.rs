//! Caddy's, Traefik's and nginx's logs, and `auto` telling the formats apart.

use super::*;

#[test]
fn caddy_and_traefik_access_lines_are_read_and_their_other_events_passed_over() {
    let mut parser = LineParser::default();
    let caddy = parser.parse(&Format::Caddy, CADDY).unwrap().unwrap();
    assert_eq!(caddy.time, 1_796_385_600.25);
    assert_eq!((caddy.method, &*caddy.path), ("POST", "/api/login"));
    assert_eq!(caddy.client, Some("10.0.0.1".parse().unwrap()));
    assert_eq!(
        caddy.forwarded_for.as_deref(),
        Some("198.51.100.7, 203.0.113.9"),
        "the header's lines as one chain"
    );
    assert!(caddy.decided);
    let startup =
        br#"{"level":"info","ts":1796385600.0,"logger":"tls","msg":"cleaning storage unit"}"#;
    assert_eq!(parser.parse(&Format::Caddy, startup), Ok(None));

    let traefik = parser.parse(&Format::Traefik, TRAEFIK).unwrap().unwrap();
    assert_eq!(traefik.time, 1_796_385_600.5);
    assert_eq!((traefik.method, &*traefik.path), ("GET", "/api/x"));
    assert_eq!(traefik.client, Some("10.0.0.1".parse().unwrap()));
    assert_eq!(traefik.forwarded_for.as_deref(), Some("198.51.100.7"));
    let event = br#"{"level":"info","msg":"Configuration loaded from flags.","time":"2026-12-04T13:00:00+01:00"}"#;
    assert_eq!(parser.parse(&Format::Traefik, event), Ok(None));

    for bad in [
        &b"{\"logger\":\"http.log.access\",\"ts\":1}"[..],
        b"not json",
        b"{\"RequestMethod\":\"GET\"}",
    ] {
        assert!(
            parser.parse(&Format::Caddy, bad).is_err()
                || parser.parse(&Format::Traefik, bad).is_err(),
            "{bad:?}"
        );
    }
}

#[test]
fn auto_tells_each_format_by_its_first_line() {
    assert_eq!(Format::of_first_line(CADDY), Format::Caddy);
    assert_eq!(Format::of_first_line(TRAEFIK), Format::Traefik);
    assert_eq!(
        Format::of_first_line(
            br#"{"timestamp":"2026-12-02T12:00:00Z","target":"tollgate::access"}"#
        ),
        Format::Json
    );
    assert_eq!(
        Format::of_first_line(
            br#"192.0.2.1 - - [02/Dec/2026:12:00:00 +0000] "GET / HTTP/1.1" 200 5 "-" "-""#
        ),
        Format::Combined
    );
}

#[test]
fn a_caddy_log_replays_client_network_limits_through_trusted_hops() {
    let policy = Policy::parse(
        "replay.toml",
        "[client_ip]\ntrusted_hops = 1\n[upstreams.app]\nurl = \"http://127.0.0.1:1\"\n[limits.per_network]\nkey = \"client_network\"\ncapacity = 2\nrate = \"1/h\"\n[[routes]]\nname = \"api\"\npath_prefix = \"/api\"\nupstream = \"app\"\nlimits = [\"per_network\"]\n",
    )
    .unwrap();
    let mut replay = Replay::new(&policy);
    let mut parser = LineParser::default();
    // Three requests of 198.51.100.7 behind one proxy, one of another client.
    for client in [
        "198.51.100.7",
        "198.51.100.7",
        "198.51.100.7",
        "203.0.113.5",
    ] {
        let line = String::from_utf8_lossy(CADDY)
            .replace("\"198.51.100.7\",\"203.0.113.9\"", &format!("\"{client}\""));
        replay.decide(
            &parser
                .parse(&Format::Caddy, line.as_bytes())
                .unwrap()
                .unwrap(),
        );
    }
    let report = replay.report();
    assert_eq!(
        (report.limits[0].requests, report.limits[0].refusals),
        (4, 1)
    );
    assert_eq!(report.limits[0].keys_refused, 1);
}

#[test]
fn an_nginx_log_format_as_written_in_nginx_conf_reads_its_lines() {
    // Two quoted pieces, as nginx.conf spreads a log_format over lines; unknown variables
    // ($request_time, $upstream_response_time, $ssl_protocol) are read and passed over.
    let format = Format::parse(
        r#"nginx:'$remote_addr [$time_iso8601] "$request_method $request_uri" $status '
                 '$request_time "$http_x_forwarded_for" $upstream_response_time $ssl_protocol'"#,
    )
    .unwrap();
    let mut parser = LineParser::default();
    let line = br#"10.0.0.1 [2026-12-04T13:00:00+01:00] "POST /api/login?next=%2F" 200 0.004 "198.51.100.7" 0.003 TLSv1.3"#;
    let parsed = parser.parse(&format, line).unwrap().unwrap();
    assert_eq!(parsed.time, 1_796_385_600.0);
    assert_eq!((parsed.method, &*parsed.path), ("POST", "/api/login"));
    assert_eq!(parsed.client, Some("10.0.0.1".parse().unwrap()));
    assert_eq!(parsed.forwarded_for.as_deref(), Some("198.51.100.7"));
    assert!(parsed.decided);
    // `-` is no value; a 400 reached no limit; a line of another shape is an error.
    let unread = br#"10.0.0.1 [2026-12-04T13:00:00+01:00] "- -" 400 0.000 "-" - -"#;
    let parsed = parser.parse(&format, unread).unwrap().unwrap();
    assert!(!parsed.decided);
    assert_eq!(parsed.forwarded_for, None);
    let other = br#"10.0.0.1 - - [04/Dec/2026:13:00:00 +0100] "GET / HTTP/1.1" 200 5 "-" "-""#;
    assert!(parser.parse(&format, other).is_err());

    // The bare format, with $msec and $request; ${braced} names.
    let format = Format::parse("nginx:${remote_addr} $msec \"$request\" $status").unwrap();
    let parsed = parser
        .parse(
            &format,
            b"::1 1796385600.250 \"GET /api/x?y=1 HTTP/2.0\" 200",
        )
        .unwrap()
        .unwrap();
    assert_eq!(parsed.time, 1_796_385_600.25);
    assert_eq!((parsed.method, &*parsed.path), ("GET", "/api/x"));
    assert_eq!(parsed.client, Some("::1".parse().unwrap()));
}

#[test]
fn an_nginx_log_format_that_cannot_be_read_says_why() {
    for (format, expected) in [
        (
            "nginx:'$remote_addr [$time_local] \"$request\"",
            "unbalanced",
        ),
        (
            "nginx:'$remote_addr' x '$request'",
            "outside the quoted pieces",
        ),
        ("nginx:$remote_addr \"$request\" $status", "no time"),
        ("nginx:$remote_addr [$time_local] $status", "no request"),
        (
            "nginx:$remote_addr$time_local \"$request\"",
            "nothing between",
        ),
        (
            "nginx:${remote_addr [$time_local] \"$request\"",
            "without its }",
        ),
        ("ngnix", "unknown format"),
    ] {
        let error = Format::parse(format).unwrap_err().to_string();
        assert!(error.contains(expected), "{format}: {error}");
    }
}
