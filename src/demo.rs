//! `tollgate demo`: the gateway on the in-memory store in front of a built-in echo upstream,
//! with a policy small enough to see a 429 within seconds.

use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

/// Starts an upstream that answers every request with a JSON description of it.
pub async fn start_echo_upstream(address: SocketAddr) -> std::io::Result<SocketAddr> {
    let listener = TcpListener::bind(address).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let service = service_fn(|request: Request<Incoming>| async move {
                    Ok::<_, std::convert::Infallible>(echo(request).await)
                });
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok(bound)
}

async fn echo(request: Request<Incoming>) -> Response<Full<Bytes>> {
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let headers: serde_json::Map<String, serde_json::Value> = parts
        .headers
        .iter()
        .map(|(name, value)| {
            (
                name.to_string(),
                String::from_utf8_lossy(value.as_bytes()).into(),
            )
        })
        .collect();
    let description = serde_json::json!({
        "upstream": "tollgate demo echo",
        "method": parts.method.as_str(),
        "uri": parts.uri.to_string(),
        "headers": headers,
        "body_bytes": body.len(),
    });
    let mut response = Response::new(Full::new(Bytes::from(format!("{description:#}\n"))));
    *response.status_mut() = StatusCode::OK;
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    response
}

/// The demo policy in front of `upstream`.
pub fn policy_text(listen: SocketAddr, admin: SocketAddr, upstream: SocketAddr) -> String {
    format!(
        r#"# tollgate demo policy
[server]
listen = ["{listen}"]

[admin]
listen = "{admin}"

[upstreams.echo]
url = "http://{upstream}"

[limits.per_network]            # every client network: a burst of 10, then 1 request/s
key = "client_network"
capacity = 10
rate = "1/s"

[limits.per_account]            # login attempts per account: 3, then one every 20 s
key = {{ json_field = "email" }}
normalize = "email"
capacity = 3
rate = "1/20s"

[limits.api_user]               # API calls per user; an export costs 5
key = {{ header = "x-user-id" }}
missing = "reject"
capacity = 10
rate = "2/s"

[limits.login_global]           # the valve that keeps the app up whatever the keys
key = "global"
capacity = 100
rate = "20/s"

[[routes]]
name = "login"
methods = ["POST"]
path = "/login"
upstream = "echo"
limits = ["per_account", "login_global"]

[[routes]]
name = "export"
path = "/api/export"
upstream = "echo"
limits = [{{ limit = "api_user", cost = 5 }}]

[[routes]]
name = "api"
path_prefix = "/api/"
upstream = "echo"
limits = ["api_user"]

[[routes]]
name = "default"
path_prefix = "/"
upstream = "echo"
limits = ["per_network"]
"#
    )
}

/// What `tollgate demo` prints once it is listening.
pub fn instructions(listen: SocketAddr, admin: SocketAddr) -> String {
    format!(
        r#"tollgate demo: gateway on http://{listen} in front of a built-in echo upstream
(in-memory store, no Redis needed). Admin: http://{admin}/metrics

Try:
  # admitted, with RateLimit-* headers (10 per network, then 1/s):
  curl -i http://{listen}/hello

  # eleven requests in a row: the last ones get 429 with Retry-After:
  for i in $(seq 1 12); do curl -s -o /dev/null -w "%{{http_code}}\n" http://{listen}/hello; done

  # login attempts are counted per account (3, then one every 20 s), whatever the address:
  for i in 1 2 3 4; do curl -s -w " %{{http_code}}\n" -H 'content-type: application/json' \
       -d '{{"email":"Alice@Example.com","password":"x"}}' http://{listen}/login -o /dev/null; done

  # API calls need x-user-id (400 without); an export costs 5 of the user's 10 tokens:
  curl -i http://{listen}/api/items
  for i in 1 2 3; do curl -s -o /dev/null -w "%{{http_code}}\n" -H 'x-user-id: 42' http://{listen}/api/export; done

  # what the gateway counted:
  curl -s http://{admin}/metrics | grep ^tollgate_

Stop with Ctrl-C.
"#
    )
}
