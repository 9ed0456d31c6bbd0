use super::*;

fn facts<'a>(headers: &'a HeaderMap, query: Option<&'a str>, body: &'a str) -> RequestFacts<'a> {
    RequestFacts::new(
        "192.0.2.1".parse().unwrap(),
        headers,
        query,
        Some(body.as_bytes()),
    )
}

#[test]
fn claims_key_by_dotted_path_and_pick_tiers() {
    std::env::set_var("TOLLGATE_TEST_KEY_SECRET", "k".repeat(32));
    let policy = policy(
        "[auth.jwt]\nsecret_env = \"TOLLGATE_TEST_KEY_SECRET\"\n[limits.a]\nkey = { jwt_claim = \"org.id\" }\nmissing = \"reject\"\ncapacity = 5\nrate = \"1/s\"\ntier = { jwt_claim = \"plan\" }\n[limits.a.tiers]\npro = { capacity = 50 }\nstaff = \"exempt\"\n",
    );
    let limit = policy.limit("a").unwrap();
    let headers = HeaderMap::new();
    let hasher = KeyHasher::from_secret(b"k");
    let claims = |json: serde_json::Value| json.as_object().unwrap().clone();
    let keyed = |claims: &serde_json::Map<String, serde_json::Value>| {
        let facts = RequestFacts::new("192.0.2.1".parse().unwrap(), &headers, None, None)
            .with_claims(Some(claims));
        (
            extract(limit, &facts, &hasher),
            tier(limit, &facts).copied(),
        )
    };
    let (numeric, pro) = keyed(&claims(
        serde_json::json!({"org": {"id": 7}, "plan": "pro"}),
    ));
    let (text, none) = keyed(&claims(
        serde_json::json!({"org": {"id": "7"}, "plan": "gold"}),
    ));
    assert_eq!(numeric, text, "7 and \"7\" are one key");
    assert!(matches!(pro, Some(Tier::Bucket { capacity, .. }) if capacity == 50.0));
    assert_eq!(none, None, "an unknown tier is the limit's own numbers");
    let (_, staff) = keyed(&claims(
        serde_json::json!({"org": {"id": 7}, "plan": "staff"}),
    ));
    assert_eq!(staff, Some(Tier::Exempt));
    let (missing, _) = keyed(&claims(serde_json::json!({"org": {"name": "x"}})));
    assert!(matches!(missing, Err(KeyError::Unauthenticated { .. })));
    let (object, _) = keyed(&claims(serde_json::json!({"org": {"id": {"n": 1}}})));
    assert!(object.is_err(), "an object is not a key");
}

#[test]
fn a_json_body_that_names_a_key_twice_or_in_two_cases_is_unclear() {
    let headers = HeaderMap::new();
    for body in [
        r#"{"email":"a@x.org","email":"b@x.org"}"#,
        r#"{"email":"a@x.org","EMAIL":"b@x.org"}"#,
        r#"{"user":{"email":"a@x.org","Email":"a@x.org"}}"#,
    ] {
        assert!(
            matches!(facts(&headers, None, body).json(), JsonBody::Ambiguous),
            "{body}"
        );
    }
    let clear = facts(
        &headers,
        None,
        r#"{"email":"a@x.org","emails":["a","a"],"x":{"email":1}}"#,
    );
    assert!(matches!(clear.json(), JsonBody::Parsed(_)));
    assert!(matches!(
        facts(&headers, None, "not json").json(),
        JsonBody::Unreadable
    ));
}

use crate::config::Policy;

fn policy(limits: &str) -> Policy {
    let text = format!(
        "[upstreams.app]\nurl = \"http://127.0.0.1:1\"\n{limits}\n[[routes]]\nname = \"r\"\npath_prefix = \"/\"\nupstream = \"app\"\n"
    );
    Policy::parse("test.toml", &text).unwrap()
}

fn key_of(
    limit: &Limit,
    client: &str,
    headers: &[(&str, &str)],
    query: Option<&str>,
    body: Option<&str>,
) -> Result<Option<KeyParts>, KeyError> {
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        map.append(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value.parse().unwrap(),
        );
    }
    let facts = RequestFacts::new(
        client.parse().unwrap(),
        &map,
        query,
        body.map(str::as_bytes),
    );
    extract(limit, &facts, &KeyHasher::from_secret(b"test secret value"))
}

#[test]
fn networks_group_ipv6_by_prefix_and_ipv4_by_address() {
    let p = policy("[limits.n]\nkey = \"client_network\"\ncapacity = 1\nrate = \"1/s\"\n[limits.wide]\nkey = \"client_network\"\nipv6_prefix = 48\nipv4_prefix = 24\ncapacity = 1\nrate = \"1/s\"");
    let n = p.limit("n").unwrap();
    let a = key_of(n, "2001:db8:1:2::1", &[], None, None)
        .unwrap()
        .unwrap();
    let b = key_of(n, "2001:db8:1:2:aaaa:bbbb:cccc:dddd", &[], None, None)
        .unwrap()
        .unwrap();
    let c = key_of(n, "2001:db8:1:3::1", &[], None, None)
        .unwrap()
        .unwrap();
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_eq!(a[0].to_string(), "v6:2001:db8:1:2::/64");
    let v4 = key_of(n, "203.0.113.7", &[], None, None).unwrap().unwrap();
    assert_eq!(v4[0].to_string(), "v4:203.0.113.7/32");
    let wide = p.limit("wide").unwrap();
    assert_eq!(
        key_of(wide, "2001:db8:1:3::1", &[], None, None)
            .unwrap()
            .unwrap()[0]
            .to_string(),
        "v6:2001:db8:1::/48"
    );
    assert_eq!(
        key_of(wide, "203.0.113.7", &[], None, None)
            .unwrap()
            .unwrap()[0]
            .to_string(),
        "v4:203.0.113.0/24"
    );
}

#[test]
fn body_fields_are_hashed_and_normalized() {
    let p = policy("[limits.acct]\nkey = { json_field = \"user.email\" }\nnormalize = \"email\"\ncapacity = 1\nrate = \"1/s\"\n[limits.form]\nkey = { form_field = \"username\" }\ncapacity = 1\nrate = \"1/s\"");
    let acct = p.limit("acct").unwrap();
    let a = key_of(
        acct,
        "1.2.3.4",
        &[],
        None,
        Some(r#"{"user":{"email":" Alice@Example.com "}}"#),
    )
    .unwrap()
    .unwrap();
    let b = key_of(
        acct,
        "5.6.7.8",
        &[],
        None,
        Some(r#"{"user":{"email":"alice@example.com"}}"#),
    )
    .unwrap()
    .unwrap();
    assert_eq!(a, b);
    assert!(!a[0].to_string().contains("alice"));
    assert_eq!(
        key_of(acct, "1.2.3.4", &[], None, Some(r#"{"user":{}}"#)),
        Ok(None)
    );
    assert_eq!(
        key_of(acct, "1.2.3.4", &[], None, Some("not json")),
        Ok(None)
    );
    let form = p.limit("form").unwrap();
    assert!(
        key_of(form, "1.2.3.4", &[], None, Some("username=bob&password=x"))
            .unwrap()
            .is_some()
    );
    assert!(matches!(
        key_of(
            form,
            "1.2.3.4",
            &[],
            None,
            Some("username=bob&username=eve")
        ),
        Err(KeyError::Ambiguous { .. })
    ));
}

#[test]
fn missing_keys_skip_or_reject() {
    let p = policy("[limits.user]\nkey = { header = \"X-User-Id\" }\nmissing = \"reject\"\ncapacity = 1\nrate = \"1/s\"\n[limits.q]\nkey = { query = \"api_key\" }\ncapacity = 1\nrate = \"1/s\"");
    let user = p.limit("user").unwrap();
    assert!(matches!(
        key_of(user, "1.2.3.4", &[], None, None),
        Err(KeyError::Missing { .. })
    ));
    assert!(matches!(
        key_of(user, "1.2.3.4", &[("x-user-id", "  ")], None, None),
        Err(KeyError::Missing { .. })
    ));
    assert!(key_of(user, "1.2.3.4", &[("x-user-id", "42")], None, None)
        .unwrap()
        .is_some());
    let q = p.limit("q").unwrap();
    assert_eq!(key_of(q, "1.2.3.4", &[], Some("other=1"), None), Ok(None));
    assert!(key_of(q, "1.2.3.4", &[], Some("api_key=k1"), None)
        .unwrap()
        .is_some());
}

#[test]
fn cookies_composites_and_exemptions() {
    let p = policy("[limits.c]\nkey = [\"client_network\", { cookie = \"session\" }]\nexempt = [\"10.0.0.0/8\"]\ncapacity = 1\nrate = \"1/s\"");
    let c = p.limit("c").unwrap();
    let key = key_of(c, "1.2.3.4", &[("cookie", "a=1; session=abc")], None, None)
        .unwrap()
        .unwrap();
    assert_eq!(key.len(), 2);
    let other = key_of(c, "1.2.3.4", &[("cookie", "session=abd")], None, None)
        .unwrap()
        .unwrap();
    assert_ne!(key, other);
    assert_eq!(
        key_of(c, "10.1.2.3", &[("cookie", "session=abc")], None, None),
        Ok(None)
    );
    assert_eq!(key_of(c, "1.2.3.4", &[], None, None), Ok(None));
}

#[test]
fn the_digest_depends_on_the_secret() {
    let one = KeyHasher::from_secret(b"one secret value").digest(b"alice");
    let two = KeyHasher::from_secret(b"two secret value").digest(b"alice");
    assert_ne!(one, two);
}

#[test]
fn a_remembered_digest_is_the_digest_of_that_value_only() {
    let hasher = KeyHasher::from_secret(b"one secret value");
    let longest = "m".repeat(REMEMBERED);
    let longer = "m".repeat(REMEMBERED + 1);
    let values: [&[u8]; 10] = [
        b"alice",
        b"alice",
        b"alic",
        b"alice\0",
        b"",
        b"alice",
        longest.as_bytes(),
        longer.as_bytes(),
        longest.as_bytes(),
        b"bob",
    ];
    for value in values {
        assert_eq!(hasher.digest(value), hasher.hash(value), "{value:?}");
    }
    assert_ne!(hasher.digest(b"alice"), hasher.digest(b"alicf"));
}

#[test]
fn network_owner_country_and_fingerprint_keys() {
    let p = policy("[limits.c]\nkey = \"client_network\"\ncapacity = 1\nrate = \"1/s\"");
    let mut limit = p.limit("c").unwrap().clone();
    limit.key = vec![
        KeySource::ClientAsn,
        KeySource::ClientCountry,
        KeySource::TlsJa4,
    ];
    limit.missing = Missing::Reject;
    limit.exempt_asns = vec![15169];
    limit.exempt_countries = vec![Country::parse("us").unwrap()];
    let hasher = KeyHasher::from_secret(b"test secret value");
    let headers = HeaderMap::new();
    let extract_with = |asn, country: &str, ja4| {
        let origin = Origin {
            asn,
            country: Country::parse(country),
        };
        let facts = RequestFacts::new("192.0.2.1".parse().unwrap(), &headers, None, None)
            .with_client(origin, ja4);
        extract(&limit, &facts, &hasher)
    };
    let ja4 = "t13d1516h2_8daaf6152771_02713d6af862";
    let key = extract_with(Some(64500), "de", Some(ja4)).unwrap().unwrap();
    let mut spelled = String::new();
    for part in &key[..2] {
        part.push_to(&mut spelled);
        spelled.push('|');
    }
    assert_eq!(spelled, "as:64500|cc:DE|");
    // The admin API names the same bucket by the values an operator reads in the log.
    assert_eq!(
        parts_of_values(&limit, &["AS64500", "de", ja4], &hasher),
        Ok(key.clone())
    );
    assert!(parts_of_values(&limit, &["cloud", "de", ja4], &hasher).is_err());
    assert!(parts_of_values(&limit, &["AS64500", "deu", ja4], &hasher).is_err());
    // Exempt networks and countries; unknown origin or no fingerprint is a missing key.
    assert_eq!(extract_with(Some(15169), "de", Some(ja4)), Ok(None));
    assert_eq!(extract_with(Some(64500), "US", Some(ja4)), Ok(None));
    for (asn, country, ja4) in [
        (None, "de", Some(ja4)),
        (Some(1), "", Some(ja4)),
        (Some(1), "de", None),
    ] {
        assert!(matches!(
            extract_with(asn, country, ja4),
            Err(KeyError::Missing { .. })
        ));
    }
}

#[test]
fn header_values_are_trimmed_alike_in_ascii_and_beyond() {
    let p = policy("[limits.user]\nkey = { header = \"X-User-Id\" }\ncapacity = 1\nrate = \"1/s\"");
    let user = p.limit("user").unwrap();
    let key = |value: &[u8]| {
        let mut headers = HeaderMap::new();
        headers.append("x-user-id", http::HeaderValue::from_bytes(value).unwrap());
        extract(
            user,
            &facts(&headers, None, ""),
            &KeyHasher::from_secret(b"test secret value"),
        )
        .unwrap()
    };
    let bob = key(b"bob");
    assert!(bob.is_some());
    assert_eq!(key(b" \tbob\t "), bob, "spaces and tabs around");
    assert_eq!(
        key("\u{a0}bob\u{a0}".as_bytes()),
        bob,
        "no-break spaces around"
    );
    let accented = key("b\u{f3}b".as_bytes());
    assert!(accented.is_some());
    assert_ne!(accented, bob);
    assert_ne!(key(b"b\xf3b"), bob, "bytes that are not UTF-8 still key");
    assert_eq!(key(b" \t "), None, "only blanks: missing");
}

#[test]
fn carried_numbers_are_read_cut_to_max_and_default_when_absent_or_malformed() {
    std::env::set_var("TOLLGATE_TEST_CARRIED_SECRET", "c".repeat(32));
    let policy = policy(
        "[auth.jwt]\nsecret_env = \"TOLLGATE_TEST_CARRIED_SECRET\"\n[limits.org]\nkey = { jwt_claim = \"org\" }\ncapacity = { jwt_claim = \"rl.capacity\", default = 100, max = 10000 }\nrate = { jwt_claim = \"rl.rate\", default = \"10/s\", max = \"1000/s\" }\n[limits.quota]\nkey = { header = \"x-org\" }\nquota = { header = \"x-quota\", trust_header = true, default = 50, max = 500 }\nperiod = \"day\"\n",
    );
    let org = policy.limit("org").unwrap();
    let carried = org.carried.as_ref().unwrap();
    assert_eq!(org.capacity, 100.0, "the default is the limit's own number");
    let headers = HeaderMap::new();
    let decided = |json: serde_json::Value| {
        let claims = json.as_object().unwrap().clone();
        let facts = RequestFacts::new("192.0.2.1".parse().unwrap(), &headers, None, None)
            .with_claims(Some(&claims));
        match carried_tier(org, carried, &facts) {
            Tier::Bucket { capacity, rate } => (capacity, rate.per_second()),
            Tier::Exempt => panic!("never exempt"),
        }
    };
    assert_eq!(
        decided(serde_json::json!({"rl": {"capacity": 5000, "rate": "500/s"}})),
        (5000.0, 500.0)
    );
    assert_eq!(
        decided(serde_json::json!({"rl": {"capacity": "250", "rate": 20}})),
        (250.0, 20.0),
        "text and tokens per second"
    );
    assert_eq!(
        decided(serde_json::json!({"rl": {"capacity": 1e9, "rate": "1e9/s"}})).0,
        10000.0,
        "cut to max"
    );
    assert_eq!(
        decided(serde_json::json!({"rl": {"rate": "5000/s"}})),
        (100.0, 1000.0),
        "cut to max"
    );
    assert_eq!(
        decided(serde_json::json!({})),
        (100.0, 10.0),
        "absent: the defaults"
    );
    assert_eq!(
        decided(serde_json::json!({"rl": {"capacity": -5, "rate": "fast"}})),
        (100.0, 10.0),
        "malformed"
    );
    assert_eq!(
        decided(serde_json::json!({"rl": {"capacity": 0, "rate": {"n": 1}}})),
        (100.0, 10.0)
    );
    assert_eq!(
        decided(serde_json::json!({"rl": {"capacity": 10000, "rate": "1/d"}})),
        (100.0, 10.0),
        "more than 10 years to fill: the defaults"
    );

    let quota = policy.limit("quota").unwrap();
    let counted = |values: &[&str]| {
        let mut headers = HeaderMap::new();
        for value in values {
            headers.append("x-quota", value.parse().unwrap());
        }
        let facts = RequestFacts::new("192.0.2.1".parse().unwrap(), &headers, None, None);
        match carried_tier(quota, quota.carried.as_ref().unwrap(), &facts) {
            Tier::Bucket { capacity, rate } => (capacity, rate.period),
            Tier::Exempt => panic!("never exempt"),
        }
    };
    assert_eq!(counted(&["200"]).0, 200.0);
    assert_eq!(
        counted(&["200"]).1,
        quota.rate.period,
        "spread over the same period"
    );
    assert_eq!(counted(&["9000"]).0, 500.0);
    assert_eq!(counted(&[]).0, 50.0);
    assert_eq!(counted(&["200", "300"]).0, 50.0, "sent twice: unclear");
}
