//! A minimal upstream for load measurements: answers every request `200 ok`, but for the
//! bodies settled costs read, whatever the path before their last segment:
//! - `…/json`: a 4 KiB chat completion, `usage` last;
//! - `…/sse`: 100 events of an OpenAI-style stream, each its own frame, then the usage event;
//! - `…/sse-held`: 50 events, then nothing for 60 s before the usage event (streams in flight);
//! - `…/keep-alive`: `200 ok` with `Connection: keep-alive`, as nginx and Node upstreams send it.
//!
//! Usage: cargo run --release --example fast_upstream -- 127.0.0.1:3000

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

type Body = BoxBody<Bytes, Infallible>;

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let address: SocketAddr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:3000".to_owned())
        .parse()
        .map_err(|error| std::io::Error::new(std::io::ErrorKind::InvalidInput, error))?;
    let listener = TcpListener::bind(address).await?;
    eprintln!("fast upstream on http://{}", listener.local_addr()?);
    let json = Bytes::from(completion());
    let events: Vec<Bytes> = (0..100).map(|index| Bytes::from(event(index))).collect();
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let (json, events) = (json.clone(), events.clone());
        tokio::spawn(async move {
            let service = service_fn(move |request: Request<hyper::body::Incoming>| {
                let path = request.uri().path();
                let response = match path.rsplit('/').next().unwrap_or_default() {
                    "json" => typed(Full::new(json.clone()).boxed(), "application/json"),
                    "sse" => stream_of(events.clone(), Duration::ZERO),
                    "sse-held" => stream_of(events[..50].to_vec(), Duration::from_secs(60)),
                    "keep-alive" => {
                        let mut response =
                            Response::new(Full::new(Bytes::from_static(b"ok\n")).boxed());
                        response.headers_mut().insert(
                            hyper::header::CONNECTION,
                            hyper::header::HeaderValue::from_static("keep-alive"),
                        );
                        response
                    }
                    _ => Response::new(Full::new(Bytes::from_static(b"ok\n")).boxed()),
                };
                async move { Ok::<_, Infallible>(response) }
            });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

/// The events one frame each, then after `pause` the usage event and `[DONE]`.
fn stream_of(events: Vec<Bytes>, pause: Duration) -> Response<Body> {
    let last = Bytes::from_static(
        b"data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":100,\"total_tokens\":112}}\n\ndata: [DONE]\n\n",
    );
    let frames = futures_util::stream::iter(events.into_iter().map(Some))
        .chain(futures_util::stream::once(async move {
            if !pause.is_zero() {
                tokio::time::sleep(pause).await;
            }
            Some(last)
        }))
        .map(|bytes| Ok::<_, Infallible>(Frame::data(bytes.unwrap_or_default())));
    typed(BodyExt::boxed(StreamBody::new(frames)), "text/event-stream")
}

fn typed(body: Body, content_type: &'static str) -> Response<Body> {
    let mut response = Response::new(body);
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    response
}

/// One content event as OpenAI-compatible APIs stream them.
fn event(index: usize) -> String {
    format!("data: {{\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"word{index} \"}},\"finish_reason\":null}}],\"usage\":null}}\n\n")
}

/// A chat completion of 4 KiB, its usage last.
fn completion() -> String {
    let head = "{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion\",\"created\":1700000000,\"model\":\"m\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\"";
    let tail = "\"},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":900,\"total_tokens\":912}}";
    let filler = "lorem ipsum ".repeat((4096 - head.len() - tail.len()) / 12 + 1);
    let mut text = format!("{head}{filler}");
    text.truncate(4096 - tail.len());
    text + tail
}
