//! Spans leave the request path through a bounded queue: a background task sends them to the
//! collector in batches over OTLP (gRPC or HTTP/protobuf). A full queue drops spans and counts
//! them; a collector that fails is logged at most once a minute. No request ever waits for it.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use opentelemetry::trace::TraceResult;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::InstrumentationScope;
use opentelemetry_proto::tonic::resource::v1::Resource as ProtoResource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span as ProtoSpan};
use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
use opentelemetry_sdk::export::trace::SpanData;
use opentelemetry_sdk::trace::{Span, SpanProcessor};
use opentelemetry_sdk::Resource;
use prometheus::IntCounter;
use prost::Message;
use tokio::sync::{mpsc, oneshot};

use crate::config::{OtlpProtocol, TraceSettings};
use crate::limit::clock;

/// Spans waiting for export at most; past it they are dropped.
const QUEUE: usize = 2048;
/// The most spans one export carries.
const BATCH: usize = 512;
/// How long a span waits for others to fill its batch (OpenTelemetry's default): a sampled
/// share of a busy gateway's requests fills batches, rather than sending a few spans a call.
const BATCH_DELAY: Duration = Duration::from_secs(5);
/// How long one export may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// A failing collector is logged at most this often.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// The SDK's processor: each ended, sampled span into the queue, or counted as dropped.
#[derive(Debug)]
pub(super) struct Queue {
    spans: mpsc::Sender<SpanData>,
    dropped: IntCounter,
}

impl SpanProcessor for Queue {
    fn on_start(&self, _span: &mut Span, _cx: &opentelemetry::Context) {}

    fn on_end(&self, span: SpanData) {
        if self.spans.try_send(span).is_err() {
            self.dropped.inc();
        }
    }

    fn force_flush(&self) -> TraceResult<()> {
        Ok(())
    }

    fn shutdown(&self) -> TraceResult<()> {
        Ok(())
    }
}

/// Asks the export task to send everything queued now.
#[derive(Debug, Clone)]
pub(super) struct Flush(mpsc::Sender<oneshot::Sender<()>>);

impl Flush {
    /// Waits until what was queued is sent (or `within` passes).
    pub(super) async fn now(&self, within: Duration) {
        let (done, sent) = oneshot::channel();
        if self.0.send(done).await.is_ok() {
            let _ = tokio::time::timeout(within, sent).await;
        }
    }
}

/// Starts the export task; the queue feeds it.
pub(super) fn start(
    settings: &TraceSettings,
    resource: &Resource,
    dropped: IntCounter,
) -> (Queue, Flush) {
    let (spans, queued) = mpsc::channel(QUEUE);
    let (flush, flushes) = mpsc::channel(1);
    let collector = Collector::new(settings);
    let resource = ResourceAttributesWithSchema::from(resource);
    tokio::spawn(export_loop(queued, flushes, collector, resource));
    (Queue { spans, dropped }, Flush(flush))
}

async fn export_loop(
    mut queued: mpsc::Receiver<SpanData>,
    mut flushes: mpsc::Receiver<oneshot::Sender<()>>,
    mut collector: Collector,
    resource: ResourceAttributesWithSchema,
) {
    let mut warned: Option<std::time::Instant> = None;
    loop {
        let mut batch = Vec::new();
        let mut flushed = None;
        tokio::select! {
            span = queued.recv() => match span {
                Some(span) => batch.push(span),
                None => return,
            },
            done = flushes.recv() => flushed = done,
        }
        let deadline = tokio::time::Instant::from_std(clock::instant() + BATCH_DELAY);
        while batch.len() < BATCH && flushed.is_none() {
            tokio::select! {
                span = queued.recv() => match span {
                    Some(span) => batch.push(span),
                    None => break,
                },
                done = flushes.recv() => flushed = done,
                () = tokio::time::sleep_until(deadline) => break,
            }
        }
        if flushed.is_some() {
            while let Ok(span) = queued.try_recv() {
                batch.push(span);
            }
        }
        while !batch.is_empty() {
            // Moved, not copied, into the request.
            let chunk: Vec<SpanData> = batch.drain(..batch.len().min(BATCH)).collect();
            let spans = chunk.len();
            let sent = tokio::time::timeout(EXPORT_TIMEOUT, collector.export(chunk, &resource));
            let error = match sent.await {
                Ok(Ok(())) => continue,
                Ok(Err(error)) => error,
                Err(_) => format!("no answer within {EXPORT_TIMEOUT:?}"),
            };
            if warned.is_none_or(|at| clock::elapsed(at) >= WARN_EVERY) {
                warned = Some(clock::instant());
                tracing::warn!(%error, endpoint = %collector.endpoint(), spans, "spans not exported (logged at most once a minute)");
            }
        }
        if let Some(done) = flushed {
            let _ = done.send(());
        }
    }
}

/// The collector, over one of OTLP's two transports.
enum Collector {
    Grpc {
        endpoint: String,
        client: Option<TraceServiceClient<tonic::transport::Channel>>,
    },
    Http {
        endpoint: http::Uri,
        client: Client<HttpConnector, Full<Bytes>>,
    },
}

impl Collector {
    fn new(settings: &TraceSettings) -> Collector {
        match settings.protocol {
            OtlpProtocol::Grpc => Collector::Grpc {
                client: tonic::transport::Endpoint::from_shared(settings.endpoint.clone())
                    .ok()
                    .map(|endpoint| {
                        TraceServiceClient::new(endpoint.timeout(EXPORT_TIMEOUT).connect_lazy())
                    }),
                endpoint: settings.endpoint.clone(),
            },
            OtlpProtocol::HttpProtobuf => Collector::Http {
                // Checked when the policy was compiled.
                endpoint: settings.endpoint.parse().unwrap_or_default(),
                client: Client::builder(TokioExecutor::new()).build_http(),
            },
        }
    }

    fn endpoint(&self) -> String {
        match self {
            Collector::Grpc { endpoint, .. } => endpoint.clone(),
            Collector::Http { endpoint, .. } => endpoint.to_string(),
        }
    }

    async fn export(
        &mut self,
        spans: Vec<SpanData>,
        resource: &ResourceAttributesWithSchema,
    ) -> Result<(), String> {
        // One resource and one scope (the gateway's tracer): the spans move into the request
        // (the transform's own grouping clones each span).
        let scope = spans
            .first()
            .map(|span| InstrumentationScope::from((&span.instrumentation_scope, None)));
        let request = ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(ProtoResource {
                    attributes: resource.attributes.0.clone(),
                    dropped_attributes_count: 0,
                }),
                scope_spans: vec![ScopeSpans {
                    scope,
                    spans: spans.into_iter().map(ProtoSpan::from).collect(),
                    schema_url: String::new(),
                }],
                schema_url: resource.schema_url.clone().unwrap_or_default(),
            }],
        };
        match self {
            Collector::Grpc { client, endpoint } => {
                let client = client
                    .as_mut()
                    .ok_or_else(|| format!("{endpoint:?} is no gRPC endpoint"))?;
                client
                    .export(request)
                    .await
                    .map(drop)
                    .map_err(|status| status.to_string())
            }
            Collector::Http { endpoint, client } => {
                let post = http::Request::post(endpoint.clone())
                    .header(http::header::CONTENT_TYPE, "application/x-protobuf")
                    .body(Full::new(Bytes::from(request.encode_to_vec())))
                    .map_err(|error| error.to_string())?;
                let response = client
                    .request(post)
                    .await
                    .map_err(|error| error.to_string())?;
                if response.status().is_success() {
                    Ok(())
                } else {
                    Err(format!("the collector answered {}", response.status()))
                }
            }
        }
    }
}
