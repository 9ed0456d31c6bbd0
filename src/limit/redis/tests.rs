//! The store's pure parts: its arguments, its deny cache's arithmetic, its connections' settings.

use super::*;
use crate::limit::{BucketKey, BucketRequest, Charge, KeyParts};
use redis::ToRedisArgs;

/// A store's settings for a node nothing listens on: stores made of them never connect.
fn unreachable_node(cluster: bool) -> RedisSettings {
    RedisSettings {
        nodes: vec!["redis://127.0.0.1:1".to_owned()],
        cluster,
        timeout: Duration::from_secs(1),
        connect_timeout: Duration::from_secs(1),
        prefix: "t:".to_owned(),
        ca_file: None,
        lease: Duration::from_secs(60),
        credentials: Default::default(),
        sentinel: None,
    }
}

#[tokio::test]
async fn the_deny_cache_refuses_a_delaying_bucket_only_once_its_debt_is_booked_up() {
    let clock = Clock::manual();
    // Made without connecting (the connection is lazy); nothing here calls Redis.
    let store = RedisStore::new(&unreachable_node(false), clock.clone()).unwrap();
    // One token a second, two of debt; Redis said the bucket held -1.5 after a refusal.
    let request = BucketRequest {
        key: BucketKey {
            limit: "smooth",
            fingerprint: 1,
            parts: KeyParts::default(),
        },
        charge: Charge {
            capacity: 2.0,
            rate: 1.0,
            cost: 1.0,
            enforce: true,
            period: None,
            debt: 2.0,
        },
        adaptive: None,
        lease: None,
        ban: None,
    };
    let requests = [request];
    let keys = StoreKeys::new(&store.prefix, requests.iter().map(|request| &request.key));
    store
        .deny_cache
        .remember(&keys[0], -1.5, clock.now(), 1.0, 2.0);
    assert!(
        store
            .refuse_from_cache(&requests, &keys, clock.now())
            .is_some(),
        "booking a token would take the bucket to -2.5"
    );
    clock.advance(Duration::from_millis(600));
    assert!(
        store
            .refuse_from_cache(&requests, &keys, clock.now())
            .is_none(),
        "at -0.9 a token can be booked: the call goes to Redis"
    );
}

#[test]
fn whole_numbers_go_to_redis_as_integers_and_the_rest_as_floats() {
    let text = |value: f64| String::from_utf8(Number(value).to_redis_args().remove(0)).unwrap();
    assert_eq!(text(1e12), "1000000000000");
    assert_eq!(text(-3.0), "-3");
    assert_eq!(text(0.0), "0");
    assert_eq!(text(0.25), "0.25");
    assert_eq!(text(2.5e-7), "2.5e-7");
    assert_eq!(text(1e300).parse::<f64>().unwrap(), 1e300);
}

#[test]
fn connections_to_redis_turn_nagles_algorithm_off() {
    let credentials = Credentials {
        username: Some("gateway".to_owned()),
        password: Some(Password("from-the-environment".to_owned())),
    };
    let client = node_client(
        "redis://old:user@127.0.0.1:1".to_owned(),
        &credentials,
        None,
    )
    .unwrap();
    assert!(client.get_connection_info().tcp_settings().nodelay());
    let settings = client.get_connection_info().redis_settings();
    assert_eq!(
        (settings.username(), settings.password()),
        (Some("gateway"), Some("from-the-environment")),
        "the environment's credentials beat the url's"
    );
    // A Cluster client's settings show only in its description.
    let store = RedisStore::new(&unreachable_node(true), Clock::manual()).unwrap();
    let Connection::Cluster(cluster) = &store.connection else {
        panic!("a Cluster store");
    };
    let description = format!("{:?}", cluster.client);
    assert!(description.contains("nodelay: true"), "{description}");
}
