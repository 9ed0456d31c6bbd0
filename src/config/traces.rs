//! `[tracing]`, compiled: where spans are exported, how, and which new traces are sampled.

/// OTLP export of request spans. Off without `[tracing]` and `OTEL_EXPORTER_OTLP_ENDPOINT`.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceSettings {
    /// Where spans are sent: the gRPC collector's URL, or the HTTP one's traces URL
    /// (`/v1/traces` added to a base endpoint).
    pub endpoint: String,
    pub protocol: OtlpProtocol,
    /// The share of new traces sampled; a parent's sampled flag is followed.
    pub sample_ratio: f64,
    pub service_name: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    Grpc,
    HttpProtobuf,
}
