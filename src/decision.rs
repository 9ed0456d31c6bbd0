//! The decision service (`[decision]`): tollgate's limits for the proxy an operator already
//! runs. Its listener checks who asks (`[decision] allow`) and what: a forward-auth
//! sub-request to `/decide` (`forward_auth.rs`: nginx `auth_request`, Caddy `forward_auth`,
//! Traefik `ForwardAuth`), or Envoy's rate limit service over gRPC (`rls.rs`). Both are
//! adapters: they turn what they are asked into the facts a request has, call the steps the
//! proxy calls (`crate::gateway`: route, the requested buckets, decide, delay), and answer
//! with the outcome in their own protocol. `descriptors.rs` is the pure part of Envoy's:
//! which rule a descriptor matches, its bucket key, the limit as Envoy reads it.

pub mod descriptors;
mod forward_auth;
mod rls;

use http::{Request, Response, StatusCode};

use crate::body::Body;
use crate::connection::{Answering, Connection};
use crate::gateway::Gateway;
use crate::request_body::RequestBody;
use crate::respond::{self, SetFields};

/// Answers the decision listener's requests; never forwards one.
#[derive(Clone)]
pub(crate) struct DecisionService {
    gateway: Gateway,
}

impl DecisionService {
    pub(crate) fn new(gateway: Gateway) -> DecisionService {
        DecisionService { gateway }
    }

    /// Answers a request on the decision listener; never fails.
    async fn answer(
        &self,
        request: Request<RequestBody>,
        connection: &Connection,
        fields: &mut SetFields,
    ) -> Response<Body> {
        if let Some(refused) = self.refused_asker(connection) {
            return refused;
        }
        match request.uri().path() {
            rls::SHOULD_RATE_LIMIT => rls::answer(&self.gateway, request, fields).await,
            forward_auth::DECIDE_PATH => {
                forward_auth::answer(&self.gateway, request, connection, fields).await
            }
            _ => respond::not_found(),
        }
    }

    /// The answer to a peer that may not ask (`[decision] allow`: 403), or to any while the
    /// policy has no `[decision]` section (a reload may take it away; the listener stays until
    /// a restart): 503.
    fn refused_asker(&self, connection: &Connection) -> Option<Response<Body>> {
        let runtime = self.gateway.shared.runtime.load();
        let Some(decision) = &runtime.policy.decision else {
            return Some(respond::error(
                StatusCode::SERVICE_UNAVAILABLE,
                "decision_disabled",
                Some("the policy has no [decision] section since it was reloaded"),
            ));
        };
        if !decision.allows(connection.peer) {
            tracing::debug!(peer = %connection.peer, "decision asked by a peer outside [decision] allow");
            return Some(respond::error(
                StatusCode::FORBIDDEN,
                "forbidden",
                Some("this address may not ask for decisions: see [decision] allow"),
            ));
        }
        None
    }
}

impl Answering for DecisionService {
    fn answer<'a>(
        &'a self,
        request: Request<RequestBody>,
        connection: &'a Connection,
        fields: &'a mut SetFields,
    ) -> impl std::future::Future<Output = Response<Body>> + Send + 'a {
        self.answer(request, connection, fields)
    }
}
