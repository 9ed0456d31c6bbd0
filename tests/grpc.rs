//! gRPC through the gateway: a tonic client over h2c, to a gRPC upstream reached over h2c or
//! over TLS that picks HTTP/2, with messages and trailers passing both ways; and the refusals
//! the client reads as gRPC does, RESOURCE_EXHAUSTED with the wait in a RetryInfo,
//! UNAUTHENTICATED for a bad token, never an HTTP error that its library turns into
//! UNAVAILABLE and retries at once.

mod common;

use std::net::SocketAddr;
use std::path::Path;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use common::*;
use http_body_util::BodyExt as _;
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message as _;
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

# Shapes HTTP refusals only: a gRPC call is refused as gRPC reads it, with its wait.
[limits.per_user.refusal]
status = 503
headers = "none"
retry_after = false

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

/// A gRPC server for `/test.Echo/Say` (over h2c, or TLS when `tls` is given): it answers
/// `hello NAME` in one message, then trailers with `grpc-status: 0` and metadata of its own.
async fn start_grpc_upstream(tls: Option<tokio_rustls::TlsAcceptor>) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let tls = tls.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(say);
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                match tls {
                    Some(acceptor) => {
                        if let Ok(stream) = acceptor.accept(stream).await {
                            let _ = builder
                                .serve_connection(TokioIo::new(stream), service)
                                .await;
                        }
                    }
                    None => {
                        let _ = builder
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    }
                }
            });
        }
    });
    address
}

type GrpcBody = http_body_util::StreamBody<
    futures_util::stream::Iter<
        std::vec::IntoIter<Result<hyper::body::Frame<Bytes>, std::convert::Infallible>>,
    >,
>;

async fn say(
    request: http::Request<hyper::body::Incoming>,
) -> Result<http::Response<GrpcBody>, std::convert::Infallible> {
    let http2 = request.version() == http::Version::HTTP_2;
    let te = request.headers().get("te").cloned();
    let mut body = request.into_body().collect().await.unwrap().to_bytes();
    // One length-prefixed message: a flag byte (not compressed), four bytes of length.
    assert_eq!(body.get_u8(), 0);
    let length = body.get_u32() as usize;
    let hello = Hello::decode(&body[..length]).unwrap();
    let answer = Hello {
        name: format!("hello {}", hello.name),
    }
    .encode_to_vec();
    let mut framed = BytesMut::new();
    framed.put_u8(0);
    framed.put_u32(answer.len() as u32);
    framed.put_slice(&answer);
    let mut trailers = http::HeaderMap::new();
    trailers.insert("grpc-status", "0".parse().unwrap());
    trailers.insert(
        "x-served-over",
        if http2 { "h2" } else { "http/1.1" }.parse().unwrap(),
    );
    if let Some(te) = te {
        trailers.insert("x-te", te);
    }
    let frames = vec![
        Ok(hyper::body::Frame::data(framed.freeze())),
        Ok(hyper::body::Frame::trailers(trailers)),
    ];
    let mut response = http::Response::new(http_body_util::StreamBody::new(
        futures_util::stream::iter(frames),
    ));
    response
        .headers_mut()
        .insert("content-type", "application/grpc".parse().unwrap());
    Ok(response)
}

/// The policy of the pass-through tests: `/test.Echo/` to `url`, two calls per user.
fn echo_policy(url: &str, ca_file: Option<&Path>) -> String {
    let ca = ca_file
        .map(|path| format!("ca_file = \"{}\"\n", path.display()))
        .unwrap_or_default();
    format!(
        "[upstreams.grpc]\nurl = \"{url}\"\n{ca}\n[limits.per_user]\nkey = {{ header = \"x-user\" }}\ncapacity = 2\nrate = \"1/h\"\n\n[[routes]]\nname = \"echo\"\npath_prefix = \"/test.Echo/\"\nupstream = \"grpc\"\nlimits = [\"per_user\"]\n"
    )
}

/// Two calls answered by the upstream with its message and trailers, the third refused.
async fn two_calls_pass_and_the_third_is_refused(gateway: SocketAddr) {
    for _ in 0..2 {
        let response = call(gateway, "/test.Echo/Say", &[("x-user", "ann")])
            .await
            .expect("an admitted call is answered by the upstream");
        assert_eq!(response.get_ref().name, "hello tollgate");
        // tonic merges a unary call's trailers into its metadata.
        let metadata = response.metadata();
        assert_eq!(metadata.get("x-served-over").unwrap(), "h2", "{metadata:?}");
        assert_eq!(metadata.get("x-te").unwrap(), "trailers", "{metadata:?}");
    }
    let refused = call(gateway, "/test.Echo/Say", &[("x-user", "ann")])
        .await
        .expect_err("the third call of a capacity-2 limit is refused");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    let delay = refused
        .get_details_retry_info()
        .unwrap()
        .retry_delay
        .unwrap();
    // One token at 1 an hour.
    assert!(
        (3590.0..=3600.0).contains(&delay.as_secs_f64()),
        "{delay:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_calls_pass_to_an_h2c_upstream_with_their_trailers() {
    let upstream = start_grpc_upstream(None).await;
    let policy = echo_policy(&format!("h2c://{upstream}"), None);
    let gateway = start_gateway(&policy, upstream).await;
    two_calls_pass_and_the_third_is_refused(gateway.addresses[0]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_calls_pass_to_a_tls_upstream_that_picks_http2() {
    let dir = tempfile::tempdir().unwrap();
    let generated = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let files = tollgate::config::TlsFiles {
        cert: dir.path().join("upstream.pem"),
        key: dir.path().join("upstream.key"),
    };
    std::fs::write(&files.cert, generated.cert.pem()).unwrap();
    std::fs::write(&files.key, generated.signing_key.serialize_pem()).unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(tollgate::tls::server_config(&files).unwrap());
    let upstream = start_grpc_upstream(Some(acceptor)).await;
    let policy = echo_policy(
        &format!("https://localhost:{}", upstream.port()),
        Some(&files.cert),
    );
    let gateway = start_gateway(&policy, upstream).await;
    two_calls_pass_and_the_third_is_refused(gateway.addresses[0]).await;
}
