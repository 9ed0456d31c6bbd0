//! The gateway's own responses: statuses, fields and bodies.

use super::*;

fn report(
    name: &str,
    capacity: f64,
    rate: f64,
    tokens: f64,
    refused: bool,
    wait: f64,
) -> LimitReport<'_> {
    LimitReport {
        name,
        capacity,
        rate,
        cost: 1.0,
        tokens,
        full_in: (capacity - tokens) / rate,
        wait,
        refused,
        banned: false,
    }
}

fn ratelimit_headers(mode: HeaderMode, reports: &[LimitReport<'_>]) -> HeaderMap {
    let mut fields = SetFields::default();
    add_ratelimit_headers(&mut fields, mode, reports);
    let mut headers = HeaderMap::new();
    fields.apply(&mut headers);
    headers
}

fn refusal(mode: HeaderMode, reports: &[LimitReport<'_>]) -> Response<Body> {
    let mut fields = SetFields::default();
    let mut response = too_many_requests(mode, reports, &mut fields);
    fields.apply(response.headers_mut());
    response
}

fn header(response: &Response<Body>, name: &str) -> String {
    response.headers()[name].to_str().unwrap().to_owned()
}

#[test]
fn retry_after_is_rounded_up_and_at_least_one() {
    assert_eq!(retry_after_seconds(0.0), 1);
    assert_eq!(retry_after_seconds(0.2), 1);
    assert_eq!(retry_after_seconds(1.0), 1);
    assert_eq!(retry_after_seconds(1.01), 2);
    assert_eq!(retry_after_seconds(119.5), 120);
}

#[test]
fn a_refusal_announces_the_longest_wait_of_the_refusing_limits() {
    let reports = [
        report("per_network", 20.0, 1.0 / 30.0, 10.0, false, 0.0),
        report("per_account", 5.0, 1.0 / 120.0, 0.5, true, 60.0),
        report("global", 200.0, 50.0, 0.2, true, 0.016),
    ];
    let response = refusal(HeaderMode::Legacy, &reports);
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(header(&response, "retry-after"), "60");
    assert_eq!(header(&response, "content-type"), "application/json");
    assert_eq!(header(&response, "ratelimit-limit"), "5");
    assert_eq!(header(&response, "ratelimit-remaining"), "0");
    assert_eq!(header(&response, "ratelimit-reset"), "540");
}

#[test]
fn the_kept_refusal_body_always_names_its_own_wait() {
    for retry_after in [60, 60, 1, 60, 120, 120, 0] {
        let expected = format!(r#"{{"error":"too_many_requests","retry_after":{retry_after}}}"#);
        assert_eq!(legacy_refusal_body(retry_after), expected.as_bytes());
    }
}

#[test]
fn admitted_legacy_headers_describe_the_most_constrained_limit() {
    let reports = [
        report("per_network", 20.0, 1.0 / 30.0, 19.0, false, 0.0),
        report("per_account", 5.0, 1.0 / 120.0, 2.0, false, 0.0),
    ];
    let headers = ratelimit_headers(HeaderMode::Legacy, &reports);
    assert_eq!(headers["ratelimit-limit"], "5");
    assert_eq!(headers["ratelimit-remaining"], "2");
    assert_eq!(headers["ratelimit-reset"], "360");
    assert!(headers.get("ratelimit-policy").is_none());
}

#[test]
fn ietf_headers_name_every_policy() {
    let reports = [
        report("per_account", 5.0, 1.0 / 120.0, 2.0, false, 0.0),
        report("global", 200.0, 50.0, 200.0, false, 0.0),
    ];
    let headers = ratelimit_headers(HeaderMode::Ietf, &reports);
    assert_eq!(
        headers["ratelimit-policy"],
        "\"per_account\";q=5;w=600, \"global\";q=200;w=4"
    );
    assert_eq!(
        headers["ratelimit"],
        "\"per_account\";r=2;t=120, \"global\";r=200;t=0"
    );
    assert!(headers.get("ratelimit-limit").is_none());
}

#[test]
fn ietf_refusal_is_problem_json() {
    let reports = [report("per_account", 5.0, 1.0 / 120.0, 0.0, true, 120.0)];
    let response = refusal(HeaderMode::Both, &reports);
    assert_eq!(
        header(&response, "content-type"),
        "application/problem+json"
    );
    assert_eq!(header(&response, "ratelimit"), "\"per_account\";r=0;t=120");
    assert_eq!(header(&response, "ratelimit-reset"), "600");
}

#[test]
fn values_that_change_per_response_are_never_indexed_and_names_are() {
    static REMAINING: HeaderName = HeaderName::from_static("ratelimit-remaining");
    static ROUTE: HeaderName = HeaderName::from_static("x-tollgate-route");
    static POLICY: HeaderName = HeaderName::from_static("ratelimit-policy");
    static KIND: HeaderName = HeaderName::from_static("x-kind");
    let mut fields = SetFields::default();
    fields.set(&REMAINING, FieldValue::Number(7));
    fields.set(&ROUTE, FieldValue::Name("login".into()));
    fields.set(&POLICY, FieldValue::Text("10;w=60".to_owned()));
    fields.set(&KIND, FieldValue::Static("limited"));
    let mut headers = HeaderMap::new();
    fields.apply(&mut headers);
    let sensitive = |name: &HeaderName| headers[name].is_sensitive();
    assert!(sensitive(&REMAINING) && sensitive(&POLICY));
    assert!(!sensitive(&ROUTE) && !sensitive(&KIND));
    assert_eq!(headers[&REMAINING], "7");
    for number in [0, 9, 4095, 4096, u64::MAX] {
        assert_eq!(super::number_value(number), number.to_string().as_str());
    }
}
