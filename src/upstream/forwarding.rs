//! The fields the gateway writes on every forwarded request: `X-Request-Id`, `Host` and
//! `X-Forwarded-Host`, `X-Forwarded-For` (the client's chain with the peer appended),
//! `X-Forwarded-Proto`; and with `[tracing]`, the trace context (`traceparent`,
//! `tracestate`).

use std::borrow::Cow;
use std::net::IpAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};

use crate::request_id::{RequestId, REQUEST_ID_NAME, X_REQUEST_ID};

pub const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
const X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// A peer address as an `X-Forwarded-For` entry (IPv4-mapped IPv6 written as IPv4).
pub fn peer_header(peer: IpAddr) -> HeaderValue {
    HeaderValue::from_str(&peer.to_canonical().to_string())
        .unwrap_or_else(|_| HeaderValue::from_static("unknown"))
}

/// The fields the gateway sets on a forwarded request, replacing any the client sent:
/// `X-Request-Id`; `Host` (the client's) and `X-Forwarded-Host` when the request named a host;
/// `X-Forwarded-For`, the client's chain with the peer appended; `X-Forwarded-Proto`.
///
/// Kept apart from the request's header map: the gateway's own client writes them straight
/// into the request head, which saves inserting five fields into the map and dropping them
/// again on every request. Only hyper's client path puts them into the map ([`Self::apply`]).
///
/// It borrows what it can from the request and its connection: a clone of a header value is
/// a reference count, a locked instruction, and so is its drop.
#[derive(Debug, Clone)]
pub struct Forwarding<'a> {
    request_id: &'a RequestId,
    host: Option<&'a HeaderValue>,
    forwarded_for: Option<Cow<'a, HeaderValue>>,
    proto: &'static str,
    /// `X-Real-IP`: the resolved client (`[client_ip] x_real_ip`).
    real_ip: Option<Cow<'a, HeaderValue>>,
    /// With `[tracing]`: `traceparent`, and the caller's `tracestate` passed on (the client's
    /// own fields give way to these either way).
    trace: Option<(&'a [u8], Option<&'a HeaderValue>)>,
}

// The names as statics, so that `Forwarding::fields` can hand out references to them.
static HOST: HeaderName = header::HOST;
static FORWARDED_HOST: HeaderName = X_FORWARDED_HOST;
static FORWARDED_FOR: HeaderName = X_FORWARDED_FOR;
static FORWARDED_PROTO: HeaderName = X_FORWARDED_PROTO;
static REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");
static TRACEPARENT: HeaderName = HeaderName::from_static("traceparent");
static TRACESTATE: HeaderName = HeaderName::from_static("tracestate");

impl<'a> Forwarding<'a> {
    /// `peer` is the TCP peer's address as a header value (rendered once per connection);
    /// `forwarded_for` are the client's `X-Forwarded-For` values, the chain to extend.
    pub fn new<'h>(
        forwarded_for: impl Iterator<Item = &'h HeaderValue>,
        request_id: &'a RequestId,
        peer: &'a HeaderValue,
        proto: &'static str,
        host: Option<&'a HeaderValue>,
        real_ip: Option<Cow<'a, HeaderValue>>,
    ) -> Forwarding<'a> {
        let mut chain = String::new();
        for entry in forwarded_for
            .filter_map(|value| value.to_str().ok())
            .map(str::trim)
            .filter(|value| !value.is_empty())
        {
            chain.push_str(entry);
            chain.push_str(", ");
        }
        let forwarded_for = if chain.is_empty() {
            Some(Cow::Borrowed(peer))
        } else {
            chain.push_str(peer.to_str().unwrap_or_default());
            HeaderValue::from_str(&chain).ok().map(Cow::Owned)
        };
        Forwarding {
            request_id,
            host,
            forwarded_for,
            proto,
            real_ip,
            trace: None,
        }
    }

    /// The same fields, and the trace context: `traceparent` (its value's bytes) and the
    /// `tracestate` passed on, if any.
    pub fn with_trace(self, traceparent: &'a [u8], tracestate: Option<&'a HeaderValue>) -> Self {
        Forwarding {
            trace: Some((traceparent, tracestate)),
            ..self
        }
    }

    /// Whether the request will carry a `Host` set here.
    pub fn sets_host(&self) -> bool {
        self.host.is_some()
    }

    /// Whether a field of the client's named `name` gives way to one of these.
    pub fn replaces(&self, name: &HeaderName) -> bool {
        *name == X_REQUEST_ID
            || *name == X_FORWARDED_PROTO
            || (self.forwarded_for.is_some() && *name == X_FORWARDED_FOR)
            || (self.host.is_some() && (*name == header::HOST || *name == X_FORWARDED_HOST))
            || (self.real_ip.is_some() && *name == REAL_IP)
            || (self.trace.is_some() && (*name == TRACEPARENT || *name == TRACESTATE))
    }

    /// The fields as `(name, value)` pairs, in the order they are written.
    pub fn fields(&self) -> impl Iterator<Item = (&'static HeaderName, &[u8])> {
        let host = self
            .host
            .iter()
            .flat_map(|host| [(&HOST, *host), (&FORWARDED_HOST, *host)]);
        let forwarded_for = self
            .forwarded_for
            .iter()
            .map(|value| (&FORWARDED_FOR, value.as_ref()));
        let real_ip = self.real_ip.iter().map(|value| (&REAL_IP, value.as_ref()));
        let tracestate = self.trace.and_then(|(_, state)| state);
        let trace = (self.trace.iter())
            .map(|(traceparent, _)| (&TRACEPARENT, *traceparent))
            .chain(tracestate.map(|state| (&TRACESTATE, state.as_bytes())));
        host.chain(forwarded_for)
            .chain(real_ip)
            .map(|(name, value)| (name, value.as_bytes()))
            .chain([
                (&FORWARDED_PROTO, self.proto.as_bytes()),
                (&REQUEST_ID_NAME, self.request_id.as_bytes()),
            ])
            .chain(trace)
    }

    /// Puts the fields into `headers`, replacing the client's.
    pub fn apply(self, headers: &mut HeaderMap) {
        if self.trace.is_some() {
            // A `tracestate` of the client's that is not passed on is dropped.
            headers.remove(&TRACESTATE);
        }
        for (name, value) in self.fields() {
            // Every value is a header value's bytes or the request id's visible ASCII.
            if let Ok(value) = HeaderValue::from_bytes(value) {
                headers.insert(name.clone(), value);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forwarded_headers_append_the_peer() {
        let mut headers = HeaderMap::new();
        headers.append(X_FORWARDED_FOR, "1.1.1.1".parse().unwrap());
        headers.append(X_FORWARDED_FOR, "2.2.2.2".parse().unwrap());
        headers.append(X_FORWARDED_PROTO, "gopher".parse().unwrap());
        headers.append(X_REQUEST_ID, "from-client".parse().unwrap());
        let host = HeaderValue::from_static("shop.example.com");
        let request_id = RequestId::Client(HeaderValue::from_static("r-1"));
        let peer = peer_header("::ffff:10.0.0.1".parse().unwrap());
        let forwarding = Forwarding::new(
            headers.get_all(X_FORWARDED_FOR).iter(),
            &request_id,
            &peer,
            "http",
            Some(&host),
            None,
        );
        for name in headers.keys() {
            assert!(forwarding.replaces(name), "{name}");
        }
        let written: Vec<(String, String)> = forwarding
            .fields()
            .map(|(name, value)| (name.to_string(), String::from_utf8(value.to_vec()).unwrap()))
            .collect();
        let mut applied = headers.clone();
        forwarding.apply(&mut applied);
        assert_eq!(applied[X_FORWARDED_FOR], "1.1.1.1, 2.2.2.2, 10.0.0.1");
        assert_eq!(applied[X_FORWARDED_PROTO], "http");
        assert_eq!(applied[X_FORWARDED_HOST], "shop.example.com");
        assert_eq!(applied[header::HOST], "shop.example.com");
        assert_eq!(applied[X_REQUEST_ID], "r-1");
        assert_eq!(applied.len(), 5, "the client's fields were replaced");
        // Written or applied, the request carries the same fields.
        let mut from_map: Vec<(String, String)> = applied
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_str().unwrap().to_owned()))
            .collect();
        let mut written = written;
        from_map.sort();
        written.sort();
        assert_eq!(written, from_map);
    }

    #[test]
    fn the_trace_context_replaces_the_clients_written_or_applied() {
        let mut headers = HeaderMap::new();
        headers.append(&TRACEPARENT, "00-bad".parse().unwrap());
        headers.append(&TRACESTATE, "client=stale".parse().unwrap());
        let request_id = RequestId::Client(HeaderValue::from_static("r-1"));
        let peer = HeaderValue::from_static("10.0.0.1");
        let traceparent = b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        let passed_on = HeaderValue::from_static("vendor=kept");
        for tracestate in [None, Some(&passed_on)] {
            let forwarding =
                Forwarding::new(std::iter::empty(), &request_id, &peer, "http", None, None)
                    .with_trace(traceparent, tracestate);
            assert!(forwarding.replaces(&TRACEPARENT) && forwarding.replaces(&TRACESTATE));
            let written: Vec<(String, Vec<u8>)> = (forwarding.fields())
                .filter(|(name, _)| name.as_str().starts_with("trace"))
                .map(|(name, value)| (name.to_string(), value.to_vec()))
                .collect();
            let mut applied = headers.clone();
            forwarding.apply(&mut applied);
            let from_map: Vec<(String, Vec<u8>)> = (applied.iter())
                .filter(|(name, _)| name.as_str().starts_with("trace"))
                .map(|(name, value)| (name.to_string(), value.as_bytes().to_vec()))
                .collect();
            assert_eq!(written, from_map);
            assert_eq!(applied[&TRACEPARENT], &traceparent[..]);
            assert_eq!(
                applied.get(&TRACESTATE),
                tracestate,
                "the client's never stays"
            );
        }
    }

    #[test]
    fn without_a_host_the_clients_host_fields_stay() {
        let request_id = RequestId::Client(HeaderValue::from_static("r-1"));
        let peer = HeaderValue::from_static("10.0.0.1");
        let forwarding =
            Forwarding::new(std::iter::empty(), &request_id, &peer, "https", None, None);
        assert!(!forwarding.sets_host());
        assert!(!forwarding.replaces(&header::HOST));
        assert!(!forwarding.replaces(&X_FORWARDED_HOST));
        assert!(forwarding.replaces(&X_FORWARDED_FOR));
        assert!(!forwarding.replaces(&HeaderName::from_static("x-user-id")));
        let names: Vec<&str> = forwarding.fields().map(|(name, _)| name.as_str()).collect();
        assert_eq!(
            names,
            ["x-forwarded-for", "x-forwarded-proto", "x-request-id"]
        );
    }
}
