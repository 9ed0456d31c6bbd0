//! The admin listener: `/metrics`, `/healthz`, `/readyz`, and `/limits` (look up and reset a
//! key, behind `[admin] token_env`). Never served on the public listener.

mod limits;

use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

use crate::{respond, Body, Shared};

/// Serves until the process exits: while draining, `/readyz` answers 503 so load balancers
/// take the replica out.
pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((stream, peer)) = listener.accept().await else {
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let shared = shared.clone();
                async move {
                    Ok::<_, std::convert::Infallible>(answer(&shared, request, peer.ip()).await)
                }
            });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn answer(shared: &Shared, request: Request<Incoming>, peer: IpAddr) -> Response<Body> {
    let path = request.uri().path();
    if path == "/limits" || path.starts_with("/limits/") {
        let runtime = shared.runtime.load_full();
        if let Some(token) = &runtime.policy.admin.token {
            let presented = request
                .headers()
                .get(http::header::AUTHORIZATION)
                .and_then(|value| value.to_str().ok())
                .and_then(|value| value.strip_prefix("Bearer "))
                .unwrap_or_default();
            if !token.accepts(presented.trim().as_bytes()) {
                return respond::unauthorized("Bearer", "unauthorized", None);
            }
        }
        return limits::answer(shared, request.method(), path, request.uri().query(), peer).await;
    }
    if request.method() != Method::GET && request.method() != Method::HEAD {
        return respond::error(StatusCode::METHOD_NOT_ALLOWED, "method_not_allowed", None);
    }
    match request.uri().path() {
        "/metrics" => respond::full(
            StatusCode::OK,
            "text/plain; version=0.0.4; charset=utf-8",
            shared.metrics.render(),
        ),
        "/healthz" => respond::full(StatusCode::OK, "text/plain", "ok\n"),
        "/readyz" => {
            if shared.shutting_down.load(Ordering::Relaxed) {
                respond::full(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "shutting down\n",
                )
            } else if shared.store.ready().await {
                respond::full(StatusCode::OK, "text/plain", "ready\n")
            } else {
                respond::full(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "text/plain",
                    "store unavailable\n",
                )
            }
        }
        _ => respond::error(StatusCode::NOT_FOUND, "not_found", None),
    }
}

/// Sends `method` to `url` with an optional bearer token: what `tollgate health`, `inspect`
/// and `reset` ask. Returns the status and the body; a failure is said in plain words.
pub async fn call(
    method: Method,
    url: &str,
    token: Option<&str>,
    timeout: std::time::Duration,
) -> Result<(u16, String), String> {
    use http_body_util::BodyExt as _;
    let uri: http::Uri = url
        .parse()
        .map_err(|error| format!("{url} is not a URL: {error}"))?;
    let mut request = Request::builder().method(method).uri(uri);
    if let Some(token) = token {
        request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    let request = request
        .body(http_body_util::Empty::<bytes::Bytes>::new())
        .map_err(|error| error.to_string())?;
    let client: hyper_util::client::legacy::Client<_, http_body_util::Empty<bytes::Bytes>> =
        hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http();
    let exchange = async {
        let response = client
            .request(request)
            .await
            .map_err(|_| format!("nothing answers at {url} (is the gateway running, and is that its [admin] listen address?)"))?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|error| format!("the answer broke off: {error}"))?
            .to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| format!("{url} did not answer within {} s", timeout.as_secs()))?
}
