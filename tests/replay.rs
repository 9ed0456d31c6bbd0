//! `tollgate replay` on generated logs whose answers the tests work out themselves: a combined
//! log read from standard input, and the HTML report opened in a real browser.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

/// Runs tollgate with `input` on standard input: exit code, stdout, stderr.
fn replay(args: &[&str], input: &[u8]) -> (Option<i32>, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .arg("replay")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run tollgate");
    child.stdin.take().unwrap().write_all(input).unwrap();
    let output = child.wait_with_output().unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The row of the limit `name` in a `--json` report.
fn limit_named(report: &serde_json::Value, name: &str) -> serde_json::Value {
    report["limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|limit| limit["limit"] == name)
        .unwrap_or_else(|| panic!("no limit {name} in {report}"))
        .clone()
}

/// Two limits on one route: one keyed by the client's network, which a combined log can
/// replay, and one keyed by a header, which it cannot. Behind one proxy hop.
const POLICY: &str = r#"
[upstreams.app]
url = "http://127.0.0.1:3000"

[client_ip]
trusted_hops = 1

[limits.per_client]
key = "client_network"
ipv4_prefix = 32
capacity = 3
rate = "1/h"

[limits.per_user]
key = { header = "x-user" }
capacity = 1
rate = "1/h"

[[routes]]
name = "api"
path_prefix = "/api"
upstream = "app"
limits = ["per_client", "per_user"]
"#;

#[test]
fn a_combined_log_on_standard_input_replays_what_it_can_and_says_what_it_cannot() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.toml");
    std::fs::write(&policy, POLICY).unwrap();
    // Client n sends n + 1 requests within one minute, all through the proxy 10.0.0.1: at
    // capacity 3 and 1 token an hour, each request past the third is refused.
    let mut log = String::new();
    let mut expected_refusals = 0;
    let mut requests = 0;
    for client in 0..8u32 {
        for request in 0..=client {
            log.push_str(&format!(
                "10.0.0.1 - - [01/Dec/2026:10:00:{:02} +0000] \"GET /api/items/{request}?page=2 HTTP/1.1\" 200 512 \"-\" \"test\" \"198.51.100.{client}\"\n",
                client * 7 + request
            ));
            requests += 1;
            expected_refusals += u64::from(request >= 3);
        }
    }
    // A request to no route, one the server could not read, and a line of another format.
    log.push_str("10.0.0.1 - - [01/Dec/2026:10:01:00 +0000] \"GET /other HTTP/1.1\" 404 0 \"-\" \"test\" \"198.51.100.1\"\n");
    log.push_str("10.0.0.1 - - [01/Dec/2026:10:01:00 +0000] \"-\" 400 0 \"-\" \"-\"\n");
    log.push_str("this is not a log line\n");

    let (code, stdout, stderr) = replay(
        &[
            "--config",
            policy.to_str().unwrap(),
            "--format",
            "combined",
            "--json",
            "-",
        ],
        log.as_bytes(),
    );
    assert_eq!(code, Some(0), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["lines"], requests + 2);
    assert_eq!(
        (report["unrouted"].as_u64(), report["undecided"].as_u64()),
        (Some(1), Some(1))
    );
    assert_eq!(report["bad_lines"], 1);
    assert_eq!(report["first_bad_lines"][0]["line"], requests + 3);
    let limit = |name: &str| limit_named(&report, name);
    let per_client = limit("per_client");
    assert_eq!(per_client["requests"], requests);
    assert_eq!(per_client["refusals"].as_u64(), Some(expected_refusals));
    assert_eq!(per_client["keys_refused"], 5, "clients 3 to 7");
    assert_eq!(per_client["top_keys"][0]["key"], "v4:198.51.100.7/32");
    assert_eq!(per_client["top_keys"][0]["refusals"], 5);
    assert_eq!(per_client["capacity_for_every_key"], 8.0);
    assert_eq!(per_client["not_replayable"], 0);
    // The header-keyed limit is not replayable from a combined log: not counted as admitted.
    let per_user = limit("per_user");
    assert_eq!(
        (
            per_user["not_replayable"].clone(),
            per_user["refusals"].clone()
        ),
        (requests.into(), 0.into())
    );

    // Read as tollgate's JSON log instead, every line is bad, and the run says so.
    let (code, stdout, _) = replay(
        &[
            "--config",
            policy.to_str().unwrap(),
            "--format",
            "json",
            "-",
        ],
        log.as_bytes(),
    );
    assert_eq!(code, Some(1));
    assert!(stdout.contains("line 1: not a JSON log line"), "{stdout}");
}

#[test]
fn caddy_and_traefik_logs_in_two_files_are_told_apart_and_read_as_one_log() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.toml");
    std::fs::write(&policy, POLICY).unwrap();
    // Client 198.51.100.9 sends 5 requests through one proxy hop, two logged by Caddy and
    // three by Traefik, in one minute: at capacity 3, 2 are refused, whatever the file.
    let caddy: String = (0..2)
        .map(|second| {
            format!(
                r#"{{"level":"info","ts":{},"logger":"http.log.access","msg":"handled request","request":{{"remote_ip":"10.0.0.1","method":"GET","uri":"/api/items?page=2","headers":{{"X-Forwarded-For":["198.51.100.9"]}}}},"status":200}}"#,
                1_796_385_600 + second
            ) + "\n"
        })
        .collect();
    let traefik: String = (2..5)
        .map(|second| {
            format!(
                r#"{{"ClientHost":"10.0.0.1","DownstreamStatus":200,"RequestMethod":"GET","RequestPath":"/api/items","StartUTC":"2026-12-04T12:00:0{second}Z","request_X-Forwarded-For":"198.51.100.9"}}"#
            ) + "\n"
        })
        .collect();
    let (caddy_log, traefik_log) = (dir.path().join("caddy.log"), dir.path().join("traefik.log"));
    std::fs::write(&caddy_log, caddy).unwrap();
    std::fs::write(&traefik_log, traefik).unwrap();
    let (code, stdout, stderr) = replay(
        &[
            "--config",
            policy.to_str().unwrap(),
            "--json",
            caddy_log.to_str().unwrap(),
            traefik_log.to_str().unwrap(),
        ],
        b"",
    );
    assert_eq!(code, Some(0), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["lines"], 5);
    assert_eq!(report["bad_lines"], 0);
    let per_client = limit_named(&report, "per_client");
    assert_eq!(per_client["refusals"], 2);
    assert_eq!(per_client["top_keys"][0]["key"], "v4:198.51.100.9/32");
}

#[test]
fn an_nginx_log_in_its_own_format_replays_out_of_time_order() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.toml");
    std::fs::write(&policy, POLICY).unwrap();
    // 198.51.100.4 sends 6 requests within a minute through the proxy, written as nginx writes
    // lines, when they end: out of time order. Capacity 3: 3 are refused.
    let seconds = [5, 3, 9, 1, 7, 2];
    let log: String = seconds
        .iter()
        .map(|second| {
            format!(
                "10.0.0.1|04/Dec/2026:12:00:{second:02} +0000|GET /api/x HTTP/1.1|200|0.002|198.51.100.4\n"
            )
        })
        .collect();
    // A line of another shape, and one that is not UTF-8: bad lines, counted with their numbers.
    let mut log = log.into_bytes();
    log.extend_from_slice(b"10.0.0.1 - - [04/Dec/2026:12:00:10 +0000] \"GET / HTTP/1.1\" 200 5\n");
    log.extend_from_slice(b"10.0.0.1|04/Dec/2026:12:00:11 +0000|GET /api/\xff HTTP/1.1|200|0|-\n");
    let file = dir.path().join("access.log");
    std::fs::write(&file, log).unwrap();
    let format =
        "nginx:'$remote_addr|$time_local|$request|$status|$request_time|$http_x_forwarded_for'";
    let (code, stdout, stderr) = replay(
        &[
            "--config",
            policy.to_str().unwrap(),
            "--format",
            format,
            "--json",
            file.to_str().unwrap(),
        ],
        b"",
    );
    assert_eq!(code, Some(0), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(
        (report["lines"].clone(), report["bad_lines"].clone()),
        (6.into(), 2.into())
    );
    assert_eq!(report["first_bad_lines"][0]["line"], 7);
    assert_eq!(report["first_bad_lines"][1]["line"], 8);
    let why = report["first_bad_lines"][1]["why"].as_str().unwrap();
    assert!(why.contains("UTF-8"), "{why}");
    let per_client = limit_named(&report, "per_client");
    assert_eq!(per_client["refusals"], 3);

    // A format that cannot be read is refused before any line is.
    let (code, _, stderr) = replay(
        &[
            "--config",
            policy.to_str().unwrap(),
            "--format",
            "nginx:'$remote_addr",
            file.to_str().unwrap(),
        ],
        b"",
    );
    assert_eq!(code, Some(2));
    assert!(stderr.contains("unbalanced"), "{stderr}");
}

#[test]
fn compare_sets_two_policies_side_by_side_with_the_keys_only_one_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let (policy, looser) = (
        dir.path().join("policy.toml"),
        dir.path().join("looser.toml"),
    );
    std::fs::write(&policy, POLICY).unwrap();
    std::fs::write(&looser, POLICY.replacen("capacity = 3", "capacity = 5", 1)).unwrap();
    // Client n sends n + 1 requests: capacity 3 refuses clients 3 to 7, capacity 5 only 5 to 7.
    let mut log = String::new();
    for client in 0..8u32 {
        for request in 0..=client {
            log.push_str(&format!(
                "10.0.0.1 - - [01/Dec/2026:10:00:{:02} +0000] \"GET /api/x HTTP/1.1\" 200 1 \"-\" \"-\" \"198.51.100.{client}\"\n",
                client * 7 + request
            ));
        }
    }
    let html = dir.path().join("report.html");
    let arguments = |json: bool| {
        let mut arguments = vec![
            "--config".to_owned(),
            policy.display().to_string(),
            "--compare".to_owned(),
            looser.display().to_string(),
            "--report".to_owned(),
            html.display().to_string(),
        ];
        if json {
            arguments.push("--json".to_owned());
        }
        arguments.push("-".to_owned());
        arguments
    };
    let json_arguments = arguments(true);
    let json_arguments: Vec<&str> = json_arguments.iter().map(String::as_str).collect();
    let (code, stdout, stderr) = replay(&json_arguments, log.as_bytes());
    assert_eq!(code, Some(0), "{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    let row = report["compare"]["limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|row| row["limit"] == "per_client")
        .unwrap()
        .clone();
    // Refused per client: max(0, n + 1 - 3) under this policy, max(0, n + 1 - 5) under the other.
    assert_eq!(row["this"]["refusals"], 1 + 2 + 3 + 4 + 5);
    assert_eq!(row["other"]["refusals"], 1 + 2 + 3);
    assert_eq!(row["keys_refused_only_by_this"], 2);
    assert_eq!(row["keys_refused_only_by_other"], 0);
    assert_eq!(
        row["some_keys_refused_only_by_this"],
        serde_json::json!(["v4:198.51.100.3/32", "v4:198.51.100.4/32"])
    );
    let per_client = report["limits"]
        .as_array()
        .unwrap()
        .iter()
        .find(|limit| limit["limit"] == "per_client")
        .unwrap();
    assert_eq!(per_client["keys"], 8, "every client, refused or not");
    let top = &per_client["top_keys"][0];
    assert_eq!(
        (&top["key"], &top["requests"], &top["refusals"]),
        (
            &serde_json::json!("v4:198.51.100.7/32"),
            &serde_json::json!(8),
            &serde_json::json!(5)
        ),
        "the top key's requests beside its refusals"
    );
    assert_eq!(
        top["paths"],
        serde_json::json!([{"path": "/api/x", "count": 5}])
    );
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.contains("Compared with <code>"),
        "the page shows the comparison"
    );
    assert!(page.contains("v4:198.51.100.3/32"));
    // Each limit's charts under both policies, side by side.
    let pairs = page.matches("<div class=\"pair\">").count();
    assert_eq!(pairs, report["limits"].as_array().unwrap().len(), "{page}");
    let looser_name = format!("<h3>{}</h3>", looser.display());
    assert_eq!(page.matches(&looser_name).count(), pairs);
    assert!(page.matches("<svg").count() >= 2 * pairs);

    let text_arguments = arguments(false);
    let text_arguments: Vec<&str> = text_arguments.iter().map(String::as_str).collect();
    let (code, stdout, _) = replay(&text_arguments, log.as_bytes());
    assert_eq!(code, Some(0));
    assert!(stdout.contains("compared with"), "{stdout}");
    assert!(
        stdout.contains("refused only by this policy:  v4:198.51.100.3/32"),
        "{stdout}"
    );
}

/// A JSON access line as the gateway writes it.
fn access_line(seconds: u32, user: u32) -> String {
    format!(
        r#"{{"timestamp":"2026-12-01T10:{:02}:{:02}.000000Z","level":"INFO","client":"192.0.2.{user}","method":"GET","path":"/api/x","route":"api","status":200,"outcome":"allowed","keys":"per_client=v4:192.0.2.{user}/32,per_user=h:{user:032x}","target":"tollgate::access"}}"#,
        seconds / 60,
        seconds % 60
    )
}

#[test]
fn the_html_report_renders_its_charts_in_a_browser() {
    let dir = tempfile::tempdir().unwrap();
    let policy = dir.path().join("policy.toml");
    let smoother = POLICY
        .replace(
            "capacity = 3\nrate = \"1/h\"",
            "capacity = 5\nrate = \"2/min\"",
        )
        .replace(
            "capacity = 1\nrate = \"1/h\"",
            "capacity = 5\nrate = \"2/min\"",
        );
    std::fs::write(&policy, &smoother).unwrap();
    // The page also compares with a stricter policy: the comparison is part of it.
    let stricter = dir.path().join("stricter.toml");
    std::fs::write(&stricter, smoother.replace("capacity = 5", "capacity = 2")).unwrap();
    // Ten users, a request a minute each for half an hour (never refused); user 1 sends one
    // every two seconds throughout, and 3 in 4 of them are refused.
    let mut log = String::new();
    let mut lines = Vec::new();
    for second in (0..1800).step_by(60) {
        for user in 2..12 {
            lines.push((second + user, user));
        }
    }
    for second in (0..1800).step_by(2) {
        lines.push((second, 1));
    }
    lines.sort();
    for (second, user) in lines {
        log.push_str(&access_line(second, user));
        log.push('\n');
    }
    let log_file = dir.path().join("access.log");
    std::fs::write(&log_file, &log).unwrap();
    let page = dir.path().join("report.html");
    let (code, _, stderr) = replay(
        &[
            "--config",
            policy.to_str().unwrap(),
            "--report",
            page.to_str().unwrap(),
            "--compare",
            stricter.to_str().unwrap(),
            log_file.to_str().unwrap(),
        ],
        b"",
    );
    assert_eq!(code, Some(0), "{stderr}");
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.contains("Compared with <code>"),
        "the comparison is on the page"
    );
    assert!(!html.contains("<script"), "the page needs no scripts");
    assert!(
        !html.contains("src=") && !html.contains("href="),
        "the page loads nothing"
    );

    let screenshot = dir.path().join("report.png");
    let (pixels, console) = screenshot_of(&page, &screenshot);
    if let Ok(keep) = std::env::var("TOLLGATE_KEEP_SCREENSHOT") {
        std::fs::copy(&screenshot, keep).unwrap();
    }
    assert!(
        !console.contains("CONSOLE") && !console.contains("Failed to load"),
        "the browser reported errors:\n{console}"
    );
    // Pixels near each bar colour (edges are blended): admitted #4a7ebb, refused #d9534f.
    let near = |colour: [u8; 3]| {
        pixels
            .iter()
            .filter(|pixel| {
                pixel
                    .iter()
                    .zip(colour)
                    .all(|(have, want)| have.abs_diff(want) < 24)
            })
            .count()
    };
    let (admitted, refused) = (near([0x4a, 0x7e, 0xbb]), near([0xd9, 0x53, 0x4f]));
    // Each legend swatch is about 13 × 13 pixels, two per colour: the bars must be far more.
    eprintln!("admitted bars: {admitted} pixels, refused bars: {refused} pixels");
    assert!(
        admitted > 5_000 && admitted < pixels.len() / 2,
        "admitted bars: {admitted} pixels"
    );
    assert!(refused > 10_000, "refused bars: {refused} pixels");
    let white = near([0xff, 0xff, 0xff]);
    assert!(white < pixels.len() * 99 / 100, "the page is blank");
}

/// Opens `page` in headless Chromium and returns the screenshot's RGB pixels and what the
/// browser logged.
fn screenshot_of(page: &Path, screenshot: &Path) -> (Vec<[u8; 3]>, String) {
    let browser = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|name| {
            Command::new(name)
                .arg("--version")
                .output()
                .is_ok_and(|output| output.status.success())
        })
        .expect("no Chromium: scripts/test.sh installs it (apt-get install chromium)");
    let profile = tempfile::tempdir().unwrap();
    let output = Command::new(browser)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-first-run",
            "--enable-logging=stderr",
            "--v=0",
            "--window-size=1000,2200",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg(format!("--screenshot={}", screenshot.display()))
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("run chromium");
    let log = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "chromium failed:\n{log}");
    let decoder = png::Decoder::new(std::fs::File::open(screenshot).unwrap());
    let mut reader = decoder.read_info().unwrap();
    let mut buffer = vec![0; reader.output_buffer_size()];
    let frame = reader.next_frame(&mut buffer).unwrap();
    let channels = frame.color_type.samples();
    assert_eq!(frame.bit_depth, png::BitDepth::Eight);
    let pixels = buffer[..frame.buffer_size()]
        .chunks(channels)
        .map(|pixel| [pixel[0], pixel[1], pixel[2]])
        .collect();
    // Console messages are logged with "CONSOLE"; nothing else of the log is the page's.
    let console = log
        .lines()
        .filter(|line| line.contains("CONSOLE") || line.contains("Failed to load"))
        .collect::<Vec<_>>()
        .join("\n");
    (pixels, console)
}
