//! gRPC clients (tonic, over h2c) refused by the gateway: they read the refusal as gRPC does,
//! RESOURCE_EXHAUSTED with the wait in a RetryInfo, UNAUTHENTICATED for a bad token, never an
//! HTTP error that their library turns into UNAVAILABLE and retries at once.

mod common;

use common::*;
use tonic::Code;
use tonic_types::StatusExt as _;

const POLICY: &str = r#"
[auth.jwt]
secret_env = "TOLLGATE_TEST_GRPC_JWT_SECRET"

[upstreams.app]
url = "http://{upstream}"

[limits.per_user]
key = { header = "x-user" }
capacity = 1
rate = "1/h"

[limits.per_subject]
key = { jwt_claim = "sub" }
capacity = 10
rate = "1/s"

[[routes]]
name = "echo"
path_prefix = "/test.Echo/"
upstream = "app"
limits = ["per_user"]

[[routes]]
name = "secure"
path_prefix = "/test.Secure/"
upstream = "app"
limits = ["per_subject"]
"#;

/// The one message the calls carry.
#[derive(Clone, PartialEq, prost::Message)]
struct Hello {
    #[prost(string, tag = "1")]
    name: String,
}

/// One unary call of `method` through the gateway, with these metadata entries.
async fn call(
    address: std::net::SocketAddr,
    method: &'static str,
    metadata: &[(&'static str, &str)],
) -> Result<tonic::Response<Hello>, tonic::Status> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{address}"))
        .unwrap()
        .connect()
        .await
        .expect("h2c connection to the gateway");
    let mut client = tonic::client::Grpc::new(channel);
    client.ready().await.unwrap();
    let mut request = tonic::Request::new(Hello {
        name: "tollgate".to_owned(),
    });
    for (name, value) in metadata {
        request.metadata_mut().insert(*name, value.parse().unwrap());
    }
    let codec = tonic::codec::ProstCodec::<Hello, Hello>::default();
    client
        .unary(request, http::uri::PathAndQuery::from_static(method), codec)
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_grpc_calls_are_told_in_grpc_status_with_the_wait() {
    std::env::set_var(
        "TOLLGATE_TEST_GRPC_JWT_SECRET",
        "grpc-test-secret-0123456789abcdef0123",
    );
    let upstream = start_upstream().await;
    let gateway = start_gateway(POLICY, upstream.address).await;
    let address = gateway.addresses[0];

    // The first call of ann is admitted (and forwarded); the second is refused by her limit.
    let _ = call(address, "/test.Echo/Say", &[("x-user", "ann")]).await;
    let refused = call(address, "/test.Echo/Say", &[("x-user", "ann")])
        .await
        .expect_err("the second call of a capacity-1 limit is refused");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(refused.message(), "limited");
    let retry_after: u64 = refused
        .metadata()
        .get("retry-after")
        .expect("retry-after")
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((3590..=3600).contains(&retry_after), "{retry_after}");
    let retry_info = refused
        .get_details_retry_info()
        .expect("a RetryInfo in grpc-status-details-bin");
    let delay = retry_info.retry_delay.expect("a retry delay");
    assert!(
        (3590.0..=3600.0).contains(&delay.as_secs_f64()),
        "{delay:?}"
    );
    // Another user is not refused by ann's limit.
    let other = call(address, "/test.Echo/Say", &[("x-user", "ben")]).await;
    assert!(
        other.as_ref().err().map(tonic::Status::code) != Some(Code::ResourceExhausted),
        "{other:?}"
    );

    // A token that does not verify: UNAUTHENTICATED, not a 401 the client cannot read.
    let unauthenticated = call(
        address,
        "/test.Secure/Say",
        &[("authorization", "Bearer not.a.token")],
    )
    .await
    .expect_err("a bad token is refused");
    assert_eq!(
        unauthenticated.code(),
        Code::Unauthenticated,
        "{unauthenticated:?}"
    );
    assert_eq!(unauthenticated.message(), "invalid token");

    // A method no route serves is the client's mistake: INVALID_ARGUMENT.
    let unrouted = call(address, "/test.Nowhere/Say", &[])
        .await
        .expect_err("no route");
    assert_eq!(unrouted.code(), Code::InvalidArgument, "{unrouted:?}");

    let scrape = gateway.render_metrics();
    assert_metrics(
        &scrape,
        &[(
            r#"tollgate_requests_total{outcome="limited",route="echo"}"#,
            1.0,
        )],
    );
}
