//! `[tracing]`: an OpenTelemetry span per request, continuing the W3C Trace Context it came
//! with (or starting a trace, sampled by `sample_ratio`), with a child span for the forward
//! upstream and one per store call; every forwarded request carries the context on, sampled
//! or not. Spans are exported by `traces/export.rs`, off the request path.

use std::net::IpAddr;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer as _, TracerProvider as _};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, Tracer, TracerProvider};
use opentelemetry_sdk::Resource;
use prometheus::IntCounter;

use crate::config::TraceSettings;

mod export;

/// The tracer every request's spans come from, and the export behind it.
#[derive(Debug)]
pub(crate) struct Traces {
    tracer: Tracer,
    // Kept for as long as the tracer: it owns the processor.
    _provider: TracerProvider,
    flush: export::Flush,
}

impl Traces {
    /// Starts the export task (needs the runtime); spans dropped by a full queue count in
    /// `dropped`.
    pub(crate) fn start(settings: &TraceSettings, dropped: IntCounter) -> Traces {
        let resource =
            Resource::new([KeyValue::new("service.name", settings.service_name.clone())]);
        let (queue, flush) = export::start(settings, &resource, dropped);
        let sampler =
            Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(settings.sample_ratio)));
        let provider = TracerProvider::builder()
            .with_span_processor(queue)
            .with_sampler(sampler)
            .with_resource(resource)
            .build();
        Traces {
            tracer: provider.tracer("tollgate"),
            _provider: provider,
            flush,
        }
    }

    /// A request's SERVER span, continuing the trace its fields carry (a malformed
    /// `traceparent` starts a new one). Named for the method until the route is known.
    pub(crate) fn server_span(&self, headers: &HeaderMap, method: &Method) -> RequestTrace {
        let parent = TraceContextPropagator::new().extract(&Fields(headers));
        let span = self
            .tracer
            .span_builder(method.to_string())
            .with_kind(SpanKind::Server)
            .start_with_context(&self.tracer, &parent);
        RequestTrace {
            context: parent.with_span(span),
            tracer: self.tracer.clone(),
        }
    }

    /// Sends what is queued, waiting at most `within` (at shutdown).
    pub(crate) async fn flush(&self, within: Duration) {
        self.flush.now(within).await;
    }
}

/// One request's trace: its SERVER span, the parent of its children.
#[derive(Debug)]
pub(crate) struct RequestTrace {
    context: Context,
    tracer: Tracer,
}

/// What a finished request's span says of it.
pub(crate) struct Finished<'a> {
    pub(crate) status: StatusCode,
    pub(crate) path: &'a str,
    pub(crate) client: Option<IpAddr>,
    pub(crate) route: Option<&'a str>,
    pub(crate) outcome: Option<&'static str>,
    /// The limits applied, comma-separated.
    pub(crate) limits: Option<String>,
    pub(crate) refused_by: Option<String>,
}

impl RequestTrace {
    /// The trace's id in hex, for the access log.
    pub(crate) fn trace_id(&self) -> String {
        self.context.span().span_context().trace_id().to_string()
    }

    /// Whether the span is recorded (sampled): only then are attributes worth making.
    pub(crate) fn is_recording(&self) -> bool {
        self.context.span().is_recording()
    }

    /// The CLIENT span of the forward, its context written into the upstream request's
    /// fields (`traceparent`, `tracestate`), sampled or not.
    pub(crate) fn upstream(&self, target: Option<&http::Uri>, fields: &mut HeaderMap) -> ChildSpan {
        let mut builder = self
            .tracer
            .span_builder("upstream")
            .with_kind(SpanKind::Client);
        if let Some(target) = target.filter(|_| self.is_recording()) {
            let port = target.port_u16().or(match target.scheme_str() {
                Some("https") => Some(443),
                _ => Some(80),
            });
            builder = builder.with_attributes([
                KeyValue::new("server.address", target.host().unwrap_or("").to_owned()),
                KeyValue::new("server.port", i64::from(port.unwrap_or(80))),
            ]);
        }
        let span = builder.start_with_context(&self.tracer, &self.context);
        let context = self.context.with_span(span);
        TraceContextPropagator::new().inject_context(&context, &mut FieldsOut(fields));
        ChildSpan(context)
    }

    /// An INTERNAL span of one store call.
    pub(crate) fn store(&self, backend: &'static str) -> ChildSpan {
        let span = self
            .tracer
            .span_builder("tollgate.store")
            .with_kind(SpanKind::Internal)
            .with_attributes([KeyValue::new("tollgate.store.backend", backend)])
            .start_with_context(&self.tracer, &self.context);
        ChildSpan(self.context.with_span(span))
    }

    /// Names the span `METHOD ROUTE`, gives it the request's attributes (worked out only for
    /// a sampled span) and ends it.
    pub(crate) fn finish<'a>(self, method: &Method, finished: impl FnOnce() -> Finished<'a>) {
        let span = self.context.span();
        if span.is_recording() {
            let finished = finished();
            if let Some(route) = finished.route {
                span.update_name(format!("{method} {route}"));
            }
            let mut attributes = vec![
                KeyValue::new("http.request.method", method.to_string()),
                KeyValue::new("url.path", finished.path.to_owned()),
                KeyValue::new(
                    "http.response.status_code",
                    i64::from(finished.status.as_u16()),
                ),
            ];
            let mut text = |key: &'static str, value: Option<String>| {
                if let Some(value) = value {
                    attributes.push(KeyValue::new(key, value));
                }
            };
            text(
                "client.address",
                finished.client.map(|client| client.to_string()),
            );
            text("tollgate.route", finished.route.map(str::to_owned));
            text("tollgate.outcome", finished.outcome.map(str::to_owned));
            text("tollgate.limits", finished.limits);
            text("tollgate.refused_by", finished.refused_by);
            span.set_attributes(attributes);
            if finished.status.is_server_error() {
                span.set_status(Status::error(finished.status.to_string()));
            }
        }
        span.end();
    }
}

/// A child span, ended when dropped.
#[derive(Debug)]
pub(crate) struct ChildSpan(Context);

impl ChildSpan {
    pub(crate) fn status(&self, status: StatusCode) {
        let span = self.0.span();
        span.set_attribute(KeyValue::new(
            "http.response.status_code",
            i64::from(status.as_u16()),
        ));
        if status.is_server_error() {
            span.set_status(Status::error(status.to_string()));
        }
    }

    pub(crate) fn failed(&self, error: &dyn std::fmt::Display) {
        self.0.span().set_status(Status::error(error.to_string()));
    }
}

impl Drop for ChildSpan {
    fn drop(&mut self) {
        self.0.span().end();
    }
}

/// A request's fields, read by the propagator.
struct Fields<'a>(&'a HeaderMap);

impl Extractor for Fields<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

/// An upstream request's fields, written by the propagator (replacing the client's).
struct FieldsOut<'a>(&'a mut HeaderMap);

impl Injector for FieldsOut<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}
