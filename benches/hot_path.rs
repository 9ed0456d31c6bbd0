//! Micro-benchmarks of the request path's pure parts: `cargo bench --bench hot_path`.

use std::hint::black_box;
use std::net::IpAddr;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion};
use http::{HeaderMap, Method};
use tollgate::client_ip::{self, Trust};
use tollgate::config::costs::{Field, Measure};
use tollgate::config::{HeaderMode, KeySource, Policy};
use tollgate::geoip::Origin;
use tollgate::key::{self, KeyHasher, RequestFacts};
use tollgate::limit::{BucketKey, BucketRequest, Charge, Clock, KeyPart, MemoryStore};
use tollgate::reject::LimitReport;
use tollgate::respond::{self, SetFields};
use tollgate::settle::{Measuring, Meter, Reading};
use tollgate::{path, route};

fn three_limit_policy() -> Policy {
    Policy::parse(
        "bench",
        r#"
        [upstreams.app]
        url = "http://127.0.0.1:3000"
        [limits.per_network]
        key = "client_network"
        capacity = 1e12
        rate = "1000000000/s"
        [limits.per_user]
        key = { header = "x-user-id" }
        capacity = 1e12
        rate = "1000000000/s"
        [limits.everyone]
        key = "global"
        capacity = 1e12
        rate = "1000000000/s"
        [[routes]]
        name = "bench"
        path_prefix = "/"
        upstream = "app"
        limits = ["per_network", "per_user", "everyone"]
        "#,
    )
    .expect("bench policy")
}

fn decision(c: &mut Criterion) {
    let store = MemoryStore::new(1_000_000, Clock::monotonic());
    let charge = Charge {
        capacity: 1e12,
        rate: 1e9,
        cost: 1.0,
        enforce: true,
        period: None,
        debt: 0.0,
    };
    let bucket = |limit: &'static str, parts: Vec<KeyPart>| BucketRequest {
        key: BucketKey {
            limit,
            fingerprint: 1,
            parts: parts.into(),
        },
        charge,
        adaptive: None,
        lease: None,
        ban: None,
    };
    let requests = [
        bucket(
            "per_network",
            vec![KeyPart::Network("203.0.113.0/24".parse().unwrap())],
        ),
        bucket("per_user", vec![KeyPart::Digest([7; 16])]),
        bucket("everyone", vec![]),
    ];
    c.bench_function("memory store: one decision for a 3-limit route", |b| {
        b.iter(|| black_box(store.decide(black_box(&requests))))
    });
}

fn keys(c: &mut Criterion) {
    let policy = three_limit_policy();
    let hasher = KeyHasher::from_secret(b"bench secret value");
    let mut headers = HeaderMap::new();
    headers.insert("x-user-id", "user-4242".parse().unwrap());
    let client: IpAddr = "2001:db8:1:2::77".parse().unwrap();
    c.bench_function("key extraction: network, header, global", |b| {
        b.iter(|| {
            let facts = RequestFacts::new(client, &headers, None, None);
            for limit in &policy.limits {
                black_box(key::extract(limit, &facts, &hasher).unwrap());
            }
        })
    });
    // What a bot-facing key costs beside the network's: the origin is looked up once per
    // connection and the fingerprint read once per connection, so a request only keys them.
    let network = policy.limit("per_network").unwrap().clone();
    let mut fingerprint = network.clone();
    fingerprint.key = vec![KeySource::TlsJa4, KeySource::ClientAsn];
    let origin = Origin {
        asn: Some(64500),
        country: None,
    };
    let ja4 = Some("t13d1516h2_8daaf6152771_e5627efa2ab1");
    for (name, limit) in [
        ("client_network", &network),
        ("tls_ja4 + client_asn", &fingerprint),
    ] {
        c.bench_function(&format!("key extraction: {name}"), |b| {
            b.iter(|| {
                let facts =
                    RequestFacts::new(client, &headers, None, None).with_client(origin, ja4);
                black_box(key::extract(limit, &facts, &hasher).unwrap());
            })
        });
    }
}

/// A request's token: verified (signature and claims) per algorithm, then found in the cache.
fn tokens(c: &mut Criterion) {
    use jsonwebtoken::{Algorithm, EncodingKey, Header};
    use tollgate::jwt::{JwtVerifier, TokenSource};
    let rsa_jwk = include_str!("../tests/fixtures/jwt/rsa-public.jwk.json");
    let rsa_private = include_str!("../tests/fixtures/jwt/rsa-private.pem");
    let b64 = |bytes: &[u8]| {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    };
    let ec = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let point = ec.public_key_raw();
    let ed = rcgen::KeyPair::generate_for(&rcgen::PKCS_ED25519).unwrap();
    let jwks = format!(
        r#"{{"keys":[{rsa_jwk},{{"kty":"EC","crv":"P-256","kid":"ec","x":"{}","y":"{}"}},{{"kty":"OKP","crv":"Ed25519","kid":"ed","x":"{}"}}]}}"#,
        b64(&point[1..33]),
        b64(&point[33..65]),
        b64(ed.public_key_raw())
    );
    let source = TokenSource::Header(http::header::AUTHORIZATION);
    let public = JwtVerifier::with_key_set(source.clone(), &jwks, None, None, 30).unwrap();
    let secret = b"bench-secret-bench-secret-bench-secret";
    let shared = JwtVerifier::with_secret(source, secret, None, None, 30);
    let now = 1_800_000_000;
    let claims = serde_json::json!({ "sub": "user-4242", "plan": "pro", "exp": now + 3600 });
    let sign = |algorithm: Algorithm, kid: &str, key: &EncodingKey| {
        let mut header = Header::new(algorithm);
        header.kid = Some(kid.to_owned());
        jsonwebtoken::encode(&header, &claims, key).unwrap()
    };
    let cases = [
        (
            "RS256",
            &public,
            sign(
                Algorithm::RS256,
                "rsa-1",
                &EncodingKey::from_rsa_pem(rsa_private.as_bytes()).unwrap(),
            ),
        ),
        (
            "ES256",
            &public,
            sign(
                Algorithm::ES256,
                "ec",
                &EncodingKey::from_ec_der(&ec.serialize_der()),
            ),
        ),
        (
            "EdDSA",
            &public,
            sign(
                Algorithm::EdDSA,
                "ed",
                &EncodingKey::from_ed_der(&ed.serialize_der()),
            ),
        ),
        (
            "HS256",
            &shared,
            sign(Algorithm::HS256, "hs", &EncodingKey::from_secret(secret)),
        ),
    ];
    for (name, verifier, token) in &cases {
        c.bench_function(&format!("token: {name} verified"), |b| {
            b.iter(|| black_box(verifier.verify_uncached(black_box(token), now).unwrap()))
        });
    }
    let (_, verifier, token) = &cases[0];
    verifier.verify(token, now).unwrap();
    c.bench_function("token: RS256 found in the cache", |b| {
        b.iter(|| black_box(verifier.verify(black_box(token), now).unwrap()))
    });
}

fn calendar(c: &mut Criterion) {
    use tollgate::limit::calendar::{Calendar, Period};
    let calendar = Calendar::new(Period::Month, Some("Europe/Rome")).unwrap();
    c.bench_function("quota period: a month in Europe/Rome", |b| {
        b.iter(|| black_box(calendar.quota_period(black_box(1_796_165_940.5))))
    });
}

fn client_address(c: &mut Criterion) {
    let trust = Trust::Hops(2);
    let peer: IpAddr = "10.0.0.2".parse().unwrap();
    let chain = ["198.51.100.1, 203.0.113.9, 10.0.0.1"];
    c.bench_function("client address: 3-hop chain", |b| {
        b.iter(|| {
            black_box(client_ip::resolve(&trust, peer, black_box(chain).iter().copied()).unwrap())
        })
    });
}

fn routing(c: &mut Criterion) {
    let mut text = String::from("[upstreams.app]\nurl = \"http://127.0.0.1:3000\"\n");
    for index in 0..50 {
        text.push_str(&format!("[[routes]]\nname = \"r{index}\"\npath_prefix = \"/service{index}/\"\nupstream = \"app\"\n"));
    }
    let policy = Policy::parse("bench", &text).unwrap();
    c.bench_function("route matching: last of 50 routes", |b| {
        b.iter(|| {
            black_box(route::find(
                &policy.routes,
                None,
                &Method::GET,
                &tollgate::path::MatchPath::exactly(black_box("/service49/items/7")),
            ))
        })
    });
}

fn normalization(c: &mut Criterion) {
    c.bench_function("path normalization: already normal", |b| {
        b.iter(|| black_box(path::normalize(black_box("/api/v1/users/42/orders"))))
    });
    c.bench_function("path normalization: dot-segments and escapes", |b| {
        b.iter(|| black_box(path::normalize(black_box("/api//v1/./users/%61bc/../42"))))
    });
}

fn refusal(c: &mut Criterion) {
    let reports = [
        LimitReport {
            name: "per_network",
            capacity: 20.0,
            rate: 1.0 / 30.0,
            cost: 1.0,
            tokens: 12.0,
            full_in: 240.0,
            wait: 0.0,
            refused: false,
            banned: false,
        },
        LimitReport {
            name: "per_account",
            capacity: 5.0,
            rate: 1.0 / 120.0,
            cost: 1.0,
            tokens: 0.4,
            full_in: 552.0,
            wait: 72.0,
            refused: true,
            banned: false,
        },
        LimitReport {
            name: "login_global",
            capacity: 200.0,
            rate: 50.0,
            cost: 1.0,
            tokens: 150.0,
            full_in: 1.0,
            wait: 0.0,
            refused: false,
            banned: false,
        },
    ];
    // The response and its fields written as they go into the head.
    let mut fields = SetFields::default();
    let mut head = Vec::with_capacity(512);
    c.bench_function("render a 429 (legacy headers)", |b| {
        b.iter(|| {
            fields.clear();
            head.clear();
            let response =
                respond::too_many_requests(HeaderMode::Legacy, black_box(&reports), &mut fields);
            fields.write(|name, value| {
                head.extend_from_slice(name);
                head.extend_from_slice(b": ");
                head.extend_from_slice(value);
                head.extend_from_slice(b"\r\n");
            });
            black_box((response, &head));
        })
    });
}

/// A chat completion of 4 KiB, its usage last (as `examples/fast_upstream` serves it).
fn completion() -> Bytes {
    let head = r#"{"id":"chatcmpl-1","object":"chat.completion","created":1700000000,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":""#;
    let tail = r#""},"finish_reason":"stop"}],"usage":{"prompt_tokens":12,"completion_tokens":900,"total_tokens":912}}"#;
    let mut text = head.to_owned() + &"lorem ipsum ".repeat(4096 / 12);
    text.truncate(4096 - tail.len());
    Bytes::from(text + tail)
}

fn settlement(c: &mut Criterion) {
    let body = completion();
    let json = HeaderMap::new();
    let tokens = [Measuring::of(&Measure::Field(Field::Json(
        "usage.total_tokens".into(),
    )))];
    // The baseline: serde_json skipping the same document without building any of it.
    c.bench_function("skip a 4 KiB JSON body (serde_json)", |b| {
        b.iter(|| serde_json::from_slice::<serde::de::IgnoredAny>(black_box(&body)).unwrap())
    });
    c.bench_function("settle a 4 KiB JSON body", |b| {
        b.iter(|| {
            let mut meter = Meter::new(&tokens, &json, 1 << 20);
            meter.data(black_box(&body));
            meter.end();
            assert_eq!(meter.reading(0, 0.0), Reading::Number(912.0));
        })
    });
    let mut events = HeaderMap::new();
    events.insert(
        http::header::CONTENT_TYPE,
        "text/event-stream".parse().unwrap(),
    );
    let stream: Vec<Bytes> = (0..100)
        .map(|index| Bytes::from(format!(r#"data: {{"id":"c","object":"chat.completion.chunk","choices":[{{"index":0,"delta":{{"content":"word{index} "}},"finish_reason":null}}],"usage":null}}"#) + "\n\n"))
        .chain([Bytes::from_static(b"data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":100,\"total_tokens\":112}}\n\ndata: [DONE]\n\n")])
        .collect();
    c.bench_function("settle a 101-event stream", |b| {
        b.iter(|| {
            let mut meter = Meter::new(&tokens, &events, 1 << 20);
            for frame in &stream {
                meter.data(black_box(frame));
            }
            meter.end();
            assert_eq!(meter.reading(0, 0.0), Reading::Number(112.0));
        })
    });
}

criterion_group!(
    benches,
    decision,
    keys,
    tokens,
    calendar,
    client_address,
    routing,
    normalization,
    refusal,
    settlement
);
criterion_main!(benches);
