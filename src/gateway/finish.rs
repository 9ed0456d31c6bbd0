//! The last phase: an upgrade the upstream accepted is joined (its tunnel holds the request's
//! in-flight count and slots until it closes), and the response's fields are settled.

use http::{Response, StatusCode};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;

use super::{Forwarded, Gateway};
use crate::body::Body;
use crate::config::HeaderMode;
use crate::in_flight::RequestInFlight;
use crate::limit::Held;
use crate::reject::{Reject, Reports};
use crate::respond::{self, SetFields};
use crate::wire::message;

impl Gateway {
    /// Completes an upgrade the upstream accepted, strips the response's hop-by-hop fields
    /// and adds the rate-limit headers.
    pub(super) fn finish(
        &self,
        forwarded: Forwarded,
        header_mode: HeaderMode,
        reports: &Reports<'_>,
        fields: &mut SetFields,
    ) -> Result<Response<Body>, Reject> {
        let Forwarded {
            mut response,
            client_upgrade,
            ..
        } = forwarded;
        let switching = response.status() == StatusCode::SWITCHING_PROTOCOLS;
        if switching {
            match (
                client_upgrade,
                response.extensions_mut().remove::<OnUpgrade>(),
            ) {
                (Some((client, expected)), Some(server))
                    if expected.accepted_by(response.headers()) =>
                {
                    // The tunnel counts in flight, and holds its slots, until it closes.
                    let in_flight = RequestInFlight::new(&self.shared.metrics.inflight);
                    let slots = response
                        .body_mut()
                        .in_flight()
                        .slots
                        .take()
                        .map(|slots| *slots);
                    self.splice_upgraded(client, server, (in_flight, slots))
                }
                _ => return Err(Reject::UpgradeFailed),
            }
        }
        message::remove_hop_by_hop(response.headers_mut(), switching);
        respond::add_ratelimit_headers(fields, header_mode, reports);
        Ok(response)
    }

    /// Copies bytes both ways between an upgraded client and upstream connection.
    fn splice_upgraded(
        &self,
        client: OnUpgrade,
        server: OnUpgrade,
        in_flight: (RequestInFlight, Option<Held>),
    ) {
        self.shared.tasks.spawn(async move {
            let _in_flight = in_flight;
            let (client, server) = match tokio::try_join!(client, server) {
                Ok(pair) => pair,
                Err(error) => {
                    tracing::debug!(%error, "upgrade did not complete");
                    return;
                }
            };
            let (mut client, mut server) = (TokioIo::new(client), TokioIo::new(server));
            if let Err(error) = tokio::io::copy_bidirectional(&mut client, &mut server).await {
                tracing::debug!(%error, "upgraded connection ended");
            }
        });
    }
}
