//! The forward phase: the admitted request goes upstream with its forwarding fields, and the
//! response head comes back (or a 502/504), timed and counted.

use std::borrow::Cow;

use http::header::{HeaderName, FORWARDED};
use http::request::Parts;
use hyper::upgrade::OnUpgrade;

use super::access_log::Exchange;
use super::{Forwarded, Gateway, Routed};
use crate::limit::clock;
use crate::metrics::StatusClass;
use crate::reject::Reject;
use crate::upstream::{self, ForwardError, OutgoingBody};
use crate::wire::message::{self, UpgradeExpected};

const X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

impl Gateway {
    /// Sends the admitted request upstream and waits for the response head.
    pub(super) async fn forward(
        &self,
        routed: &Routed<'_>,
        mut parts: Parts,
        body: OutgoingBody,
        exchange: &mut Exchange<'_>,
    ) -> Result<Forwarded, Reject> {
        let (scan, connection) = (&routed.scan, routed.connection);
        let upgrade = scan.upgrade && message::is_upgrade(&parts.headers);
        let client_upgrade = if upgrade {
            let expected = UpgradeExpected::of(&parts.headers);
            parts
                .extensions
                .remove::<OnUpgrade>()
                .map(|client| (client, expected))
        } else {
            None
        };
        message::remove_hop_by_hop(&mut parts.headers, upgrade);
        let real_ip = clean_fields(routed, &mut parts, exchange.client);
        let route = routed.route;
        // Its context goes upstream in `traceparent`, sampled or not.
        let target = (route.upstream.settings.targets.first()).map(|target| &target.url);
        let traced = exchange.trace.as_ref().map(|trace| trace.upstream(target));
        let (upstream_span, context) = match traced {
            Some((span, traceparent, tracestate)) => (span, Some((traceparent, tracestate))),
            None => (None, None),
        };
        let forwarding = upstream::Forwarding::new(
            scan.forwarded_for(&parts.headers),
            &exchange.request_id,
            connection.peer_header(),
            connection.proto,
            routed.host.as_ref(),
            real_ip,
        );
        let forwarding = match &context {
            Some((traceparent, tracestate)) => forwarding.with_trace(traceparent, *tracestate),
            None => forwarding,
        };
        let sent = clock::instant();
        let watching_load = routed.runtime.policy.overload.is_some();
        let in_flight = watching_load.then(|| self.shared.load.start_request());
        // `OPTIONS *` goes on in asterisk-form (routed as `/*`, it asks about the server).
        let path = if parts.uri.path() == upstream::ASTERISK {
            upstream::ASTERISK
        } else {
            exchange.path.as_str()
        };
        let result = route
            .upstream
            .send(parts, forwarding, path, body, sent, connection.id)
            .await;
        let elapsed = clock::elapsed(sent);
        exchange.upstream = Some(elapsed);
        if let Some(span) = &upstream_span {
            match &result {
                Ok(response) => span.status(response.status()),
                Err(error) => span.failed(error),
            }
        }
        drop(upstream_span);
        let mut response = result.map_err(|error| {
            if matches!(error, ForwardError::ClientBody) {
                tracing::debug!(route = %route.route.name, %error, "client body failed");
            } else {
                route.metrics.upstream_status(StatusClass::Error).inc();
                tracing::warn!(route = %route.route.name, upstream = %route.upstream.settings.name, %error, "upstream failed");
            }
            Reject::Upstream(error)
        })?;
        route
            .metrics
            .upstream_duration
            .observe(elapsed.as_secs_f64());
        route
            .metrics
            .upstream_status(StatusClass::of(response.status()))
            .inc();
        if watching_load {
            self.shared.load.observe(elapsed);
        }
        // The upstream counts as loaded until its response body ends.
        response.body_mut().in_flight().upstream = in_flight;
        Ok(Forwarded {
            response,
            client_upgrade,
            sent,
        })
    }
}

/// What of the client's fields an upstream must not read as they came: HTTP/2 cookie fields
/// joined, fields named with underscores dropped (unless allowed), `Forwarded` and `X-Real-IP`
/// dropped unless a trusted proxy sent them. Returns the `X-Real-IP` to write: the resolved
/// client, unless `x_real_ip = false`.
fn clean_fields<'c>(
    routed: &Routed<'c>,
    parts: &mut Parts,
    client: Option<std::net::IpAddr>,
) -> Option<Cow<'c, http::HeaderValue>> {
    let (policy, connection) = (&routed.runtime.policy, routed.connection);
    if matches!(parts.version, http::Version::HTTP_2 | http::Version::HTTP_3) {
        message::join_cookies(&mut parts.headers);
    }
    if !policy.server.underscores_in_headers {
        message::remove_underscored(&mut parts.headers);
    }
    // X-Forwarded-* are rewritten; these two only a trusted proxy may pass on.
    if routed.scan.other_forwarding && !policy.client_ip.trust.trusts_peer(connection.peer) {
        parts.headers.remove(FORWARDED);
        parts.headers.remove(X_REAL_IP);
    }
    match client {
        Some(client) if policy.client_ip.x_real_ip && client != connection.peer => {
            Some(Cow::Owned(upstream::peer_header(client)))
        }
        Some(_) if policy.client_ip.x_real_ip => Some(Cow::Borrowed(connection.peer_header())),
        _ => None,
    }
}
