//! The admin listener: `/metrics`, `/healthz`, `/readyz`, and behind `[admin] token_env`:
//! `/limits` (look up and reset a key), `/overrides` and `/top`. Never served on the public
//! listener.

pub mod commands;
mod limits;
mod overrides;
mod scans;
mod top;
pub mod top_command;
mod ui;

use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use http::{Method, Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

use crate::body::Body;
use crate::server::StreamExecutor;
use crate::shared::Shared;
use crate::{respond, server};

/// Connections past `[admin] max_connections` that still get an answer, one request each.
const OVERFLOW_CONNECTIONS: usize = 32;

/// How long an overflow connection has for its one request and answer.
const OVERFLOW_DEADLINE: Duration = Duration::from_secs(1);

/// Serves until the process exits: while draining, `/readyz` answers 503 so load balancers
/// take the replica out.
///
/// The public listener's guards apply (header read timeout, idle timeout, back-off on a failed
/// accept) with a connection cap of its own. Past the cap a connection gets one answer within
/// [`OVERFLOW_DEADLINE`] and is closed: `/healthz` still 200, so that a probe does not restart a
/// healthy gateway whose admin port is flooded, anything else 503.
pub(crate) async fn serve(listener: TcpListener, shared: Arc<Shared>) {
    let policy = shared.runtime.load().policy.clone();
    let timeouts = (
        policy.server.header_read_timeout,
        policy.server.idle_timeout,
    );
    let connections = Arc::new(Semaphore::new(policy.admin.max_connections));
    let overflow = Arc::new(Semaphore::new(OVERFLOW_CONNECTIONS));
    let builder = Arc::new(connection_builder(timeouts.0));
    // The admin listener is never drained: its connections never hear a shutdown.
    let (_never_sent, no_shutdown) = watch::channel(false);
    loop {
        let Some((stream, peer)) = server::accept(&listener).await else {
            continue;
        };
        let peer = peer.ip().to_canonical();
        let shared = shared.clone();
        let permit = connections.clone().try_acquire_owned();
        if permit.is_err() {
            shared.metrics.admin_over_limit();
        }
        if let Ok(permit) = permit {
            let (builder, no_shutdown) = (builder.clone(), no_shutdown.clone());
            tokio::spawn(async move {
                let answer = move |request| {
                    let shared = shared.clone();
                    async move { answer(&shared, request, peer).await }
                };
                server::serve_guarded(stream, peer, &builder, timeouts, answer, no_shutdown).await;
                drop(permit);
            });
        } else if let Ok(permit) = overflow.clone().try_acquire_owned() {
            tokio::spawn(async move {
                answer_overflow(stream).await;
                drop(permit);
            });
        } else {
            tracing::debug!(%peer, "admin listener full; connection closed");
        }
    }
}

fn connection_builder(header_read_timeout: Duration) -> auto::Builder<StreamExecutor> {
    let mut builder = auto::Builder::new(StreamExecutor);
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout);
    builder.http2().timer(TokioTimer::new());
    builder
}

/// One HTTP/1.1 request on a connection past the cap: `/healthz` 200 (the process serves),
/// anything else 503; then the connection is closed.
async fn answer_overflow(stream: TcpStream) {
    let service = service_fn(move |request: Request<Incoming>| {
        let response = if request.uri().path() == "/healthz" {
            respond::full(StatusCode::OK, "text/plain", "ok\n")
        } else {
            respond::full(
                StatusCode::SERVICE_UNAVAILABLE,
                "text/plain",
                "admin listener at max_connections\n",
            )
        };
        async move { Ok::<_, std::convert::Infallible>(response) }
    });
    let connection = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(OVERFLOW_DEADLINE)
        .keep_alive(false)
        .serve_connection(TokioIo::new(stream), service);
    let _ = tokio::time::timeout(OVERFLOW_DEADLINE, connection).await;
}

async fn answer(shared: &Shared, request: Request<Incoming>, peer: IpAddr) -> Response<Body> {
    let path = request.uri().path();
    let under = |prefix: &str| {
        path.strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    };
    if under("/limits") || under("/overrides") || under("/top") || under("/scans") {
        if !authorized(shared, request.headers()) {
            return respond::unauthorized("Bearer", "unauthorized", None);
        }
        if path == "/scans" {
            return scans::answer(shared, request.method(), request.uri().query(), peer).await;
        }
        if under("/top") {
            if request.method() != Method::GET && request.method() != Method::HEAD {
                return limits::method_not_allowed();
            }
            return top::answer(shared, path, request.uri().query()).await;
        }
        if under("/overrides") {
            return overrides::answer(shared, request, peer).await;
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
        "/ui" | "/ui/" => ui::page(),
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

/// Whether the request carries the admin token, when `[admin] token_env` sets one.
fn authorized(shared: &Shared, headers: &http::HeaderMap) -> bool {
    let runtime = shared.runtime.load();
    let Some(token) = &runtime.policy.admin.token else {
        return true;
    };
    let presented = headers
        .get(http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .unwrap_or_default();
    token.accepts(presented.trim().as_bytes())
}

/// Where a command on this host reaches an admin listener bound to `listen`: an unspecified
/// address (`0.0.0.0`, `[::]`) as the loopback address of its family.
pub fn local_url(mut listen: std::net::SocketAddr) -> String {
    if listen.ip().is_unspecified() {
        listen.set_ip(match listen {
            std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    format!("http://{listen}")
}

/// Why the CLI's call to the admin listener got no answer, in plain words.
#[derive(Debug, thiserror::Error)]
pub enum CallError {
    #[error("{url} is not a URL: {error}")]
    NotAUrl {
        url: String,
        error: http::uri::InvalidUri,
    },
    #[error("the request could not be built: {0}")]
    Request(http::Error),
    #[error(
        "nothing answers at {0} (is the gateway running, and is that its [admin] listen address?)"
    )]
    NoAnswer(String),
    #[error("the answer broke off: {0}")]
    BrokeOff(hyper::Error),
    #[error("{url} did not answer within {seconds} s")]
    Timeout { url: String, seconds: u64 },
}

/// Sends `method` to `url` with an optional bearer token and JSON body: what `tollgate
/// health`, `inspect`, `reset` and `override` ask. Returns the status and the body.
pub async fn call(
    method: Method,
    url: &str,
    token: Option<&str>,
    json: Option<String>,
    timeout: std::time::Duration,
) -> Result<(u16, String), CallError> {
    use http_body_util::BodyExt as _;
    let uri: http::Uri = url.parse().map_err(|error| CallError::NotAUrl {
        url: url.to_owned(),
        error,
    })?;
    let mut request = Request::builder().method(method).uri(uri);
    if let Some(token) = token {
        request = request.header(http::header::AUTHORIZATION, format!("Bearer {token}"));
    }
    if json.is_some() {
        request = request.header(http::header::CONTENT_TYPE, "application/json");
    }
    let request = request
        .body(http_body_util::Full::new(bytes::Bytes::from(
            json.unwrap_or_default(),
        )))
        .map_err(CallError::Request)?;
    let client: hyper_util::client::legacy::Client<_, http_body_util::Full<bytes::Bytes>> =
        hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http();
    let exchange = async {
        let response = client
            .request(request)
            .await
            .map_err(|_| CallError::NoAnswer(url.to_owned()))?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(CallError::BrokeOff)?
            .to_bytes();
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| CallError::Timeout {
            url: url.to_owned(),
            seconds: timeout.as_secs(),
        })?
}

#[cfg(test)]
mod tests {
    use super::local_url;

    #[test]
    fn the_cli_reaches_an_unspecified_listener_on_the_loopback_of_its_family() {
        let url = |listen: &str| local_url(listen.parse().unwrap());
        assert_eq!(url("0.0.0.0:9090"), "http://127.0.0.1:9090");
        assert_eq!(url("[::]:9090"), "http://[::1]:9090");
        assert_eq!(url("10.0.0.5:9090"), "http://10.0.0.5:9090");
    }
}
