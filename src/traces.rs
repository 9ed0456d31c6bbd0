//! `[tracing]`: an OpenTelemetry span per request, continuing the W3C Trace Context it came
//! with (or starting a trace, sampled by `sample_ratio`), with a child span for the forward
//! upstream and one per store call; every forwarded request carries the context on, sampled
//! or not. Spans are exported by `traces/export.rs`, off the request path.

use std::net::IpAddr;
use std::time::Duration;

use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use opentelemetry::trace::{
    SamplingDecision, SamplingResult, SpanContext, SpanId, SpanKind, Status, TraceContextExt,
    TraceFlags, TraceId, TraceState, Tracer as _, TracerProvider as _,
};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{Sampler, Tracer, TracerProvider};
use opentelemetry_sdk::Resource;
use prometheus::IntCounter;

use crate::config::TraceSettings;

use context::TraceParent;

mod context;
mod export;

/// The tracer every request's spans come from, and the export behind it.
#[derive(Debug)]
pub(crate) struct Traces {
    tracer: Tracer,
    sample_ratio: f64,
    // Kept for as long as the tracer: it owns the processor.
    _provider: TracerProvider,
    flush: export::Flush,
}

const TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
const TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

impl Traces {
    /// Starts the export task (needs the runtime); spans dropped by a full queue count in
    /// `dropped`.
    pub(crate) fn start(settings: &TraceSettings, dropped: IntCounter) -> Traces {
        let resource =
            Resource::new([KeyValue::new("service.name", settings.service_name.clone())]);
        let (queue, flush) = export::start(settings, &resource, dropped);
        // Requests' own spans are sampled here (`server_span`); their children follow them.
        let provider = TracerProvider::builder()
            .with_span_processor(queue)
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)))
            .with_resource(resource)
            .build();
        Traces {
            tracer: provider.tracer("tollgate"),
            sample_ratio: settings.sample_ratio,
            _provider: provider,
            flush,
        }
    }

    /// A request's SERVER span, continuing the trace its fields carry (a malformed
    /// `traceparent` starts a new one). Only a sampled trace makes a span of the SDK's: the
    /// others are their ids alone, which is all their propagation needs.
    /// `carried`: whether the fields may hold a context (their scan saw `traceparent` or
    /// `tracestate`); most requests do not, and are spared two lookups.
    pub(crate) fn server_span(
        &self,
        headers: &HeaderMap,
        carried: bool,
        method: &Method,
    ) -> RequestTrace {
        let incoming = carried
            .then(|| headers.get(TRACEPARENT))
            .flatten()
            .and_then(|value| TraceParent::parse(value.as_bytes()));
        let caller_state = carried.then(|| headers.get(TRACESTATE)).flatten();
        let tracestate = incoming.and(caller_state).cloned();
        let trace_id = incoming.map_or_else(context::new_trace_id, |parent| parent.trace_id);
        let sampled = match incoming {
            Some(parent) => parent.sampled,
            None => context::sampled_at(self.sample_ratio, &trace_id),
        };
        let span_id = context::new_span_id();
        let recorded = sampled.then(|| {
            let state = tracestate
                .as_ref()
                .and_then(|value| value.to_str().ok())
                .and_then(|text| text.parse::<TraceState>().ok())
                .unwrap_or_default();
            let parent = match incoming {
                Some(parent) => Context::new().with_remote_span_context(SpanContext::new(
                    TraceId::from_bytes(trace_id),
                    SpanId::from_bytes(parent.parent_id),
                    TraceFlags::SAMPLED,
                    true,
                    state.clone(),
                )),
                None => Context::new(),
            };
            let mut builder = self
                .tracer
                .span_builder(method.to_string())
                .with_kind(SpanKind::Server)
                .with_trace_id(TraceId::from_bytes(trace_id))
                .with_span_id(SpanId::from_bytes(span_id));
            builder.sampling_result = Some(SamplingResult {
                decision: SamplingDecision::RecordAndSample,
                attributes: Vec::new(),
                trace_state: state,
            });
            let span = builder.start_with_context(&self.tracer, &parent);
            Box::new((parent.with_span(span), self.tracer.clone()))
        });
        RequestTrace {
            trace_id,
            span_id,
            sampled,
            tracestate,
            recorded,
        }
    }

    /// Sends what is queued, waiting at most `within` (at shutdown).
    pub(crate) async fn flush(&self, within: Duration) {
        self.flush.now(within).await;
    }
}

/// One request's trace: its ids, and for a sampled one the SDK's SERVER span, the parent of
/// its children.
#[derive(Debug)]
pub(crate) struct RequestTrace {
    trace_id: [u8; 16],
    /// The SERVER span's id.
    span_id: [u8; 8],
    sampled: bool,
    /// The caller's `tracestate`, passed on with a valid `traceparent` (without one, the
    /// caller's is not passed on).
    tracestate: Option<HeaderValue>,
    /// Boxed: most requests are not sampled, and the request's state is moved about.
    recorded: Option<Box<(Context, Tracer)>>,
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
        context::hex(&self.trace_id)
    }

    /// The CLIENT span of the forward (sampled traces only), and the context the upstream
    /// request carries either way (`traceparent`, and `tracestate`), in place of the client's:
    /// written by the forward with the other fields it sets (`upstream::Forwarding`).
    pub(crate) fn upstream(
        &self,
        target: Option<&http::Uri>,
    ) -> (
        Option<ChildSpan>,
        [u8; context::LENGTH],
        Option<&HeaderValue>,
    ) {
        let child = self.recorded.as_deref().map(|(server, tracer)| {
            let mut builder = tracer.span_builder("upstream").with_kind(SpanKind::Client);
            if let Some(target) = target {
                let port = target.port_u16().unwrap_or(match target.scheme_str() {
                    Some("https") => 443,
                    _ => 80,
                });
                builder = builder.with_attributes([
                    KeyValue::new("server.address", target.host().unwrap_or("").to_owned()),
                    KeyValue::new("server.port", i64::from(port)),
                ]);
            }
            let span = builder.start_with_context(tracer, server);
            ChildSpan(server.with_span(span))
        });
        let parent_id = child.as_ref().map_or(self.span_id, |child| {
            child.0.span().span_context().span_id().to_bytes()
        });
        let traceparent = TraceParent {
            trace_id: self.trace_id,
            parent_id,
            sampled: self.sampled,
        };
        (child, traceparent.render(), self.tracestate.as_ref())
    }

    /// An INTERNAL span of one store call (sampled traces only).
    pub(crate) fn store(&self, backend: &'static str) -> Option<ChildSpan> {
        let (server, tracer) = self.recorded.as_deref()?;
        let span = tracer
            .span_builder("tollgate.store")
            .with_kind(SpanKind::Internal)
            .with_attributes([KeyValue::new("tollgate.store.backend", backend)])
            .start_with_context(tracer, server);
        Some(ChildSpan(server.with_span(span)))
    }

    /// Names the span `METHOD ROUTE`, gives it the request's attributes (worked out only for
    /// a sampled span) and ends it.
    pub(crate) fn finish<'a>(self, method: &Method, finished: impl FnOnce() -> Finished<'a>) {
        let Some(recorded) = self.recorded else {
            return;
        };
        let (server, _) = *recorded;
        let span = server.span();
        let finished = finished();
        if let Some(route) = finished.route {
            span.update_name(format!("{method} {route}"));
        }
        let mut attributes = Vec::with_capacity(8);
        attributes.extend([
            KeyValue::new("http.request.method", method_name(method)),
            KeyValue::new("url.path", finished.path.to_owned()),
            KeyValue::new(
                "http.response.status_code",
                i64::from(finished.status.as_u16()),
            ),
        ]);
        if let Some(outcome) = finished.outcome {
            attributes.push(KeyValue::new("tollgate.outcome", outcome));
        }
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
        text("tollgate.limits", finished.limits);
        text("tollgate.refused_by", finished.refused_by);
        span.set_attributes(attributes);
        if finished.status.is_server_error() {
            span.set_status(Status::error(finished.status.to_string()));
        }
        span.end();
    }
}

/// A method's name, without an allocation for the standard ones.
fn method_name(method: &Method) -> opentelemetry::StringValue {
    let name: &'static str = match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        Method::PATCH => "PATCH",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => return method.as_str().to_owned().into(),
    };
    name.into()
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
