//! An upstream that answers as the APIs settled costs are made for: OpenAI-compatible chat
//! completions (JSON, or an event stream with `stream_options.include_usage`), and responses
//! whose cost is in a header, a trailer (HTTP/1.1 chunked, HTTP/2), their time or their size.
//!
//! Paths:
//! - `POST /v1/chat/completions`: `usage.total_tokens` is the request's `x-test-tokens`
//!   (default 100); `"stream": true` streams three content events, the usage event when
//!   asked for, and `[DONE]`;
//! - `/body/<case>`: a JSON body of the case's (`BODIES`);
//! - `/events/<n>`: `n` events without usage, then one with `usage.total_tokens` = `n`;
//! - `/held`: one event at once, the usage event (`x-test-tokens`) once `release` is notified;
//! - `/endless`: an event every 10 ms for up to 10 s;
//! - `/gzip`: a gzip-compressed JSON body whose usage is `x-test-tokens`;
//! - `/header`: `x-tokens` from `x-test-tokens`; `/trailer`: the same as a trailer;
//! - `/sleep/<ms>`: answers after that long; `/bytes/<n>`: `n` bytes.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::Notify;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = http_body_util::combinators::BoxBody<Bytes, BoxError>;

/// Bodies whose field a settlement cannot read, by name.
pub const BODIES: [(&str, &str); 8] = [
    ("string", r#"{"usage":{"total_tokens":"50"}}"#),
    ("negative", r#"{"usage":{"total_tokens":-5}}"#),
    ("huge", r#"{"usage":{"total_tokens":1e300}}"#),
    ("overflow", r#"{"usage":{"total_tokens":1e999}}"#),
    ("nested", r#"{"usage":{"total_tokens":{"value":5}}}"#),
    ("twice", r#"{"usage":{"total_tokens":5,"total_tokens":6}}"#),
    ("absent", r#"{"usage":{}}"#),
    ("not-json", "total_tokens: 5"),
];

pub struct LlmUpstream {
    pub address: SocketAddr,
    /// Lets `/held` send its last event.
    pub release: Arc<Notify>,
}

pub async fn start_llm_upstream() -> LlmUpstream {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let release = Arc::new(Notify::new());
    let held = release.clone();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let held = held.clone();
            tokio::spawn(async move {
                let service = service_fn(move |request| answer(request, held.clone()));
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    LlmUpstream { address, release }
}

async fn answer(
    request: Request<Incoming>,
    release: Arc<Notify>,
) -> Result<Response<Body>, Infallible> {
    let tokens: u64 = request
        .headers()
        .get("x-test-tokens")
        .and_then(|value| value.to_str().ok()?.parse().ok())
        .unwrap_or(100);
    let path = request.uri().path().to_owned();
    let response = match path.split('/').nth(1).unwrap_or_default() {
        "v1" => {
            let body = request.into_body().collect().await.unwrap().to_bytes();
            let asked: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
            completion(&asked, tokens)
        }
        "body" => {
            let case = path.trim_start_matches("/body/");
            let (_, body) = BODIES.iter().find(|(name, _)| *name == case).unwrap();
            json(body.to_string())
        }
        "events" => {
            let count: u64 = path.trim_start_matches("/events/").parse().unwrap();
            let mut events: Vec<String> = (0..count)
                .map(|index| format!("data: {{\"index\":{index},\"usage\":null}}\n\n"))
                .collect();
            events.push(format!(
                "data: {{\"usage\":{{\"total_tokens\":{count}}}}}\n\ndata: [DONE]\n\n"
            ));
            events_of(events)
        }
        "held" => {
            let frames = futures_util::stream::unfold(0, move |step| {
                let release = release.clone();
                async move {
                    let event = match step {
                        0 => "data: {\"usage\":null}\n\n".to_owned(),
                        1 => {
                            release.notified().await;
                            format!("data: {{\"usage\":{{\"total_tokens\":{tokens}}}}}\n\n")
                        }
                        _ => return None,
                    };
                    Some((Ok(Frame::data(Bytes::from(event))), step + 1))
                }
            });
            event_stream(StreamBody::new(frames).boxed())
        }
        "endless" => {
            let frames = futures_util::stream::unfold(0u32, |index| async move {
                if index > 1000 {
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
                let event = format!("data: {{\"index\":{index}}}\n\n");
                Some((Ok(Frame::data(Bytes::from(event))), index + 1))
            });
            event_stream(StreamBody::new(frames).boxed())
        }
        "gzip" => {
            use std::io::Write as _;
            let body = format!(r#"{{"usage":{{"total_tokens":{tokens}}}}}"#);
            let mut encoder =
                flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            encoder.write_all(body.as_bytes()).unwrap();
            let mut response = json(String::new());
            *response.body_mut() = full(encoder.finish().unwrap());
            response
                .headers_mut()
                .insert("content-encoding", HeaderValue::from_static("gzip"));
            response
        }
        "header" => {
            let mut response = json("{}".to_owned());
            response
                .headers_mut()
                .insert("x-tokens", HeaderValue::from(tokens));
            response
        }
        "trailer" => {
            let mut trailers = HeaderMap::new();
            trailers.insert("x-tokens", HeaderValue::from(tokens));
            let frames = futures_util::stream::iter([
                Ok::<_, BoxError>(Frame::data(Bytes::from_static(b"{}"))),
                Ok(Frame::trailers(trailers)),
            ]);
            let mut response = Response::new(StreamBody::new(frames).boxed());
            response
                .headers_mut()
                .insert("trailer", HeaderValue::from_static("x-tokens"));
            response
        }
        "sleep" => {
            let ms: u64 = path.trim_start_matches("/sleep/").parse().unwrap();
            tokio::time::sleep(Duration::from_millis(ms)).await;
            json("{}".to_owned())
        }
        "bytes" => {
            let count: usize = path.trim_start_matches("/bytes/").parse().unwrap();
            Response::new(full(vec![b'x'; count]))
        }
        _ => Response::builder()
            .status(404)
            .body(full(Vec::new()))
            .unwrap(),
    };
    Ok(response)
}

/// A chat completion as OpenAI's API answers one, streamed when asked.
fn completion(asked: &serde_json::Value, total: u64) -> Response<Body> {
    let usage = serde_json::json!({
        "prompt_tokens": total / 2,
        "completion_tokens": total - total / 2,
        "total_tokens": total,
    });
    let model = asked["model"].as_str().unwrap_or("test-model");
    let base = |choices: serde_json::Value, usage: serde_json::Value, object: &str| {
        serde_json::json!({
            "id": "chatcmpl-test",
            "object": object,
            "created": 1_700_000_000,
            "model": model,
            "choices": choices,
            "usage": usage,
        })
    };
    if asked["stream"].as_bool() != Some(true) {
        let choices = serde_json::json!([{
            "index": 0,
            "message": {"role": "assistant", "content": "Hello there."},
            "finish_reason": "stop",
        }]);
        return json(base(choices, usage, "chat.completion").to_string());
    }
    let mut events = Vec::new();
    for (index, word) in ["Hello", " there", "."].iter().enumerate() {
        let finish = if index == 2 {
            serde_json::json!("stop")
        } else {
            serde_json::Value::Null
        };
        let choices = serde_json::json!([{
            "index": 0,
            "delta": {"role": "assistant", "content": word},
            "finish_reason": finish,
        }]);
        let chunk = base(choices, serde_json::Value::Null, "chat.completion.chunk");
        events.push(format!("data: {chunk}\n\n"));
    }
    if asked["stream_options"]["include_usage"].as_bool() == Some(true) {
        let chunk = base(serde_json::json!([]), usage, "chat.completion.chunk");
        events.push(format!("data: {chunk}\n\n"));
    }
    events.push("data: [DONE]\n\n".to_owned());
    events_of(events)
}

fn full(bytes: Vec<u8>) -> Body {
    http_body_util::Full::new(Bytes::from(bytes))
        .map_err(|never| match never {})
        .boxed()
}

fn json(text: String) -> Response<Body> {
    let mut response = Response::new(full(text.into_bytes()));
    response
        .headers_mut()
        .insert("content-type", HeaderValue::from_static("application/json"));
    response
}

/// Each event its own frame.
fn events_of(events: Vec<String>) -> Response<Body> {
    let frames = futures_util::stream::iter(
        events
            .into_iter()
            .map(|event| Ok::<_, BoxError>(Frame::data(Bytes::from(event)))),
    );
    event_stream(StreamBody::new(frames).boxed())
}

fn event_stream(body: Body) -> Response<Body> {
    let mut response = Response::new(body);
    response.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("text/event-stream"),
    );
    response
}
