//! Helpers for the configuration tests (compile a snippet, read its errors), and the tests of
//! checks that span the whole file.

use super::*;

const UPSTREAM: &str = "[upstreams.app]\nurl = \"http://127.0.0.1:3000\"\n";
const ROUTE: &str = "[[routes]]\nname = \"all\"\npath_prefix = \"/\"\nupstream = \"app\"\n";

/// `text`, with an upstream `app` and a catch-all route to it unless it has its own.
fn completed(text: &str) -> String {
    let mut text = text.to_owned();
    if !text.contains("[upstreams.") {
        text = format!("{UPSTREAM}{text}");
    }
    if !text.contains("[[routes]]") {
        text.push('\n');
        text.push_str(ROUTE);
    }
    text
}

pub(crate) fn policy(text: &str) -> Policy {
    compile("test.toml", &completed(text), None).unwrap_or_else(|errors| panic!("{errors}"))
}

/// Each error's key path and message.
pub(crate) fn errors(text: &str) -> Vec<(String, String)> {
    match compile("test.toml", &completed(text), None) {
        Ok(_) => panic!("compiled without errors:\n{text}"),
        Err(errors) => errors
            .0
            .into_iter()
            .map(|error| (error.key, error.message))
            .collect(),
    }
}

/// The first error's key path and message.
pub(crate) fn error(text: &str) -> (String, String) {
    errors(text).remove(0)
}

#[test]
fn key_paths_name_tables_array_entries_and_keys() {
    let text = "[server]\nlisten = 1\n[[routes]]\nname = \"a\"\n[[routes]]\ncost = 2\n";
    assert_eq!(
        key_path_at(text, text.find("listen").unwrap()),
        "server.listen"
    );
    assert_eq!(
        key_path_at(text, text.find("cost").unwrap()),
        "routes[1].cost"
    );
    assert_eq!(
        key_path_at(text, text.find("name").unwrap()),
        "routes[0].name"
    );
}

#[test]
fn a_route_below_one_that_matches_all_it_would_is_named_with_it() {
    let route = |name: &str, extra: &str| {
        format!("[[routes]]\nname = \"{name}\"\nupstream = \"app\"\n{extra}\n")
    };
    let limits = "[limits.login]\nkey = \"client_network\"\ncapacity = 5\nrate = \"1/min\"\n";
    let text = format!(
        "{limits}{}{}{}{}",
        route("all", "path_prefix = \"/\""),
        route(
            "login",
            "path = \"/login\"\nmethods = [\"POST\"]\nlimits = [\"login\"]"
        ),
        route("api", "path_prefix = \"/api\""),
        route("other_host", "host = \"a.example\"\npath = \"/x\""),
    );
    let warnings = policy(&text).warnings;
    let about = |needle: &str| warnings.iter().filter(|w| w.contains(needle)).count();
    assert_eq!(
        about("route \"login\" can never match: route \"all\""),
        1,
        "{warnings:?}"
    );
    assert_eq!(about("route \"api\" can never match"), 1, "{warnings:?}");
    assert_eq!(
        about("route \"other_host\" can never match"),
        1,
        "a catch-all takes every host"
    );
    assert_eq!(about("limit \"login\" never applies"), 1, "{warnings:?}");
    // In the right order, nothing is dead.
    let text = format!(
        "{limits}{}{}{}",
        route(
            "login",
            "path = \"/login\"\nmethods = [\"POST\"]\nlimits = [\"login\"]"
        ),
        route("login_get", "path = \"/login\"\nmethods = [\"GET\"]"),
        route("all", "path_prefix = \"/\""),
    );
    let warnings = policy(&text).warnings;
    let dead = |w: &String| w.contains("can never match") || w.contains("never applies");
    assert!(!warnings.iter().any(dead), "{warnings:?}");
    let text = format!(
        "{}{}",
        route("apiary", "path_prefix = \"/apiary\""),
        route("api", "path_prefix = \"/api\""),
    );
    assert!(!policy(&text).warnings.iter().any(dead));
}

/// Each limit body (under `[limits.x]`, keyed `global`) is refused with an error of that limit
/// whose message holds the needle.
fn limit_refused_with(cases: &[(&str, &str)]) {
    for (body, needle) in cases {
        let found = errors(&format!("[limits.x]\nkey = \"global\"\n{body}\n"));
        assert!(
            found
                .iter()
                .any(|(key, message)| key.starts_with("limits.x") && message.contains(needle)),
            "{body}: {found:?}"
        );
    }
}

#[test]
fn a_concurrency_limit_is_one_kind_of_limit_with_a_whole_number_of_slots() {
    let exports = "[limits.exports]\nkey = { header = \"x-user\" }\nconcurrency = 2\n";
    let compiled = policy(exports);
    let limit = &compiled.limits[0];
    assert_eq!((limit.concurrency, limit.capacity), (Some(2), 2.0));
    limit_refused_with(&[
        ("concurrency = 0", "out of range"),
        (
            "concurrency = 2\ncapacity = 5\nrate = \"1/s\"",
            "one of them",
        ),
        (
            "concurrency = 2\nquota = 5\nperiod = \"day\"",
            "one of them",
        ),
        ("concurrency = 2\nmode = \"shadow\"", "shadow"),
        (
            "concurrency = 2\ncharge_on_status = { \"401\" = 1 }",
            "charge_on_status",
        ),
    ]);
    // A route's cost applies to its buckets: an export that costs 100 tokens still takes one
    // of two slots.
    let costly = format!(
        "{exports}[limits.api]\nkey = {{ header = \"x-user\" }}\ncapacity = 1000\nrate = \"10/s\"\n\
         [[routes]]\nname = \"export\"\npath = \"/export\"\nupstream = \"app\"\ncost = 100\n\
         limits = [\"exports\", \"api\"]\n"
    );
    let compiled = policy(&costly);
    assert_eq!(compiled.routes[0].limits[0].limit.concurrency, Some(2));
    // Above a bucket's capacity, a cost is still refused.
    let too_costly = costly.replace("capacity = 1000", "capacity = 50");
    assert!(errors(&too_costly)
        .iter()
        .any(|(_, message)| message.contains("larger than limit \"api\"'s capacity 50")));
}

#[test]
fn a_delay_is_a_token_buckets_within_a_minute() {
    let smooth = "[limits.smooth]\nkey = \"client_network\"\ncapacity = 20\nrate = \"10/s\"\non_limit = \"delay\"\n";
    let compiled = policy(smooth);
    assert_eq!(
        compiled.limits[0].max_delay,
        Some(std::time::Duration::from_secs(1))
    );
    let charge = compiled.limits[0].charge(None, 1.0, 1.0, || 0.0).unwrap();
    assert_eq!(charge.debt, 10.0, "a second at 10 tokens a second");
    limit_refused_with(&[
        (
            "capacity = 2\nrate = \"1/s\"\nmax_delay = \"1s\"",
            "goes with",
        ),
        (
            "capacity = 2\nrate = \"1/s\"\non_limit = \"delay\"\nmax_delay = \"2min\"",
            "out of range",
        ),
        (
            "quota = 2\nperiod = \"day\"\non_limit = \"delay\"",
            "cannot delay",
        ),
        ("concurrency = 2\non_limit = \"delay\"", "cannot delay"),
        (
            "capacity = 2\nrate = \"1/s\"\non_limit = \"later\"",
            "expected `refuse` or `delay`",
        ),
    ]);
    let redis = policy(&format!(
        "[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\nhash_key = \"0123456789abcdef\"\n{smooth}"
    ));
    assert_eq!(
        redis.limits[0].max_delay,
        Some(std::time::Duration::from_secs(1)),
        "Redis delays too"
    );
}

#[test]
fn a_lease_is_a_plain_buckets_within_a_second_and_four_leases_of_capacity() {
    let global = "[limits.everyone]\nkey = \"global\"\ncapacity = 100000\nrate = \"50000/s\"\nlease = \"20ms\"\n";
    let redis = policy(&format!(
        "[store]\nbackend = \"redis\"\nurl = \"redis://127.0.0.1:6379\"\nhash_key = \"0123456789abcdef\"\n{global}"
    ));
    assert_eq!(
        redis.limits[0].lease,
        Some(std::time::Duration::from_millis(20))
    );
    assert!(
        !redis
            .warnings
            .iter()
            .any(|warning| warning.contains("lease")),
        "{:?}",
        redis.warnings
    );
    let memory = policy(global);
    assert!(
        memory
            .warnings
            .iter()
            .any(|warning| warning.contains("only the Redis store")),
        "{:?}",
        memory.warnings
    );
    limit_refused_with(&[
        (
            "capacity = 1000\nrate = \"10/s\"\nlease = \"2s\"",
            "at most 1s",
        ),
        (
            "capacity = 30\nrate = \"100/s\"\nlease = \"100ms\"",
            "four leases' worth",
        ),
        (
            "quota = 100\nperiod = \"day\"\nlease = \"10ms\"",
            "plain token bucket",
        ),
        (
            "capacity = 100\nrate = \"10/s\"\non_limit = \"delay\"\nlease = \"10ms\"",
            "plain token bucket",
        ),
    ]);
}

#[test]
fn a_grpc_service_behind_an_http1_upstream_is_warned_of() {
    let text = "[upstreams.app]\nurl = \"http://127.0.0.1:3000\"\n[upstreams.grpc]\nurl = \"h2c://127.0.0.1:50051\"\n[[routes]]\nname = \"users\"\npath_prefix = \"/acme.users.v1.Users/\"\nupstream = \"app\"\n[[routes]]\nname = \"orders\"\npath_prefix = \"/acme.Orders/\"\nupstream = \"grpc\"\n[[routes]]\nname = \"versioned\"\npath_prefix = \"/v1.2/\"\nupstream = \"app\"\n";
    let warnings = policy(text).warnings;
    let grpc: Vec<&String> = warnings.iter().filter(|w| w.contains("gRPC")).collect();
    assert_eq!(grpc.len(), 1, "{warnings:?}");
    assert!(grpc[0].contains("route \"users\"") && grpc[0].contains("h2c://"));
}

#[test]
fn every_unknown_key_and_syntax_error_is_reported_with_its_own_path() {
    let text = "[server]\nlisen = [\"127.0.0.1:8080\"]\n[limit.x]\nkey = \"global\"\ncapacity = 5\n[admin]\nlisten = \"127.0.0.1:9090\"\ntimeout = 3\n";
    let found = errors(text);
    let keys: Vec<&str> = found.iter().map(|(key, _)| key.as_str()).collect();
    assert_eq!(
        keys,
        ["server.lisen", "limit.x", "admin.timeout"],
        "{found:?}"
    );
    assert!(found[1].1.contains("unknown field `limit`"), "{found:?}");
    let syntax = errors("[server]\nlisten = [\"a\"\n[admin]\nlisten = \n[store]\nmax_keys = 5\n");
    assert!(syntax.len() >= 2, "both syntax errors: {syntax:?}");
}

#[test]
fn every_error_of_a_file_is_reported_at_once_with_its_line() {
    let text = "[server]\nlisten = [\"nowhere\"]\n[admin]\nlisten = \"x\"\n";
    let found = compile("test.toml", &completed(text), None).unwrap_err();
    let located: Vec<(&str, Option<(usize, usize)>)> = found
        .0
        .iter()
        .map(|error| (error.key.as_str(), error.position))
        .collect();
    assert_eq!(
        located,
        [
            ("server.listen", Some((4, 10))),
            ("admin.listen", Some((6, 10)))
        ]
    );
}
