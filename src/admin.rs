//! The admin listener: `/metrics`, `/healthz`, `/readyz`. Never served on the public listener.

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
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let shared = shared.clone();
                async move { Ok::<_, std::convert::Infallible>(answer(&shared, request).await) }
            });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn answer(shared: &Shared, request: Request<Incoming>) -> Response<Body> {
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

/// GETs `url` (plain HTTP) and returns the status: what `tollgate health` asks.
pub async fn probe(url: &str, timeout: std::time::Duration) -> Result<u16, String> {
    let uri: http::Uri = url
        .parse()
        .map_err(|error| format!("invalid url: {error}"))?;
    let client: hyper_util::client::legacy::Client<_, http_body_util::Empty<bytes::Bytes>> =
        hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http();
    match tokio::time::timeout(timeout, client.get(uri)).await {
        Ok(Ok(response)) => Ok(response.status().as_u16()),
        Ok(Err(error)) => Err(error.to_string()),
        Err(_) => Err(format!("no answer within {timeout:?}")),
    }
}
