//! The decision listener's front door: who may ask (`[decision] allow`), and what is asked —
//! a forward-auth sub-request to `/decide` (`forward_auth.rs`), or Envoy's rate limit service
//! over gRPC (`rls.rs`).

use http::{Request, Response, StatusCode};

use super::access_log::Exchange;
use super::{forward_auth, Connection, Gateway, Listener, RequestBody};
use crate::body::Body;
use crate::metrics::Outcome;
use crate::reject::Cause;
use crate::respond::{self, SetFields};

/// Where forward-auth sub-requests are sent.
pub(super) const DECIDE_PATH: &str = "/decide";

impl Gateway {
    /// Answers a request on the decision listener; never fails.
    pub(super) async fn answer_asking(
        &self,
        request: Request<RequestBody>,
        connection: &Connection,
        fields: &mut SetFields,
    ) -> Response<Body> {
        // A guard, not a clone: the answers load the runtime they serve with themselves.
        let runtime = self.shared.runtime.load();
        let Some(decision) = &runtime.policy.decision else {
            // A reload took `[decision]` away; the listener stays until a restart.
            return respond::error(
                StatusCode::SERVICE_UNAVAILABLE,
                "decision_disabled",
                Some("the policy has no [decision] section since it was reloaded"),
            );
        };
        if !decision.allows(connection.peer) {
            tracing::debug!(peer = %connection.peer, "decision asked by a peer outside [decision] allow");
            return respond::error(
                StatusCode::FORBIDDEN,
                "forbidden",
                Some("this address may not ask for decisions: see [decision] allow"),
            );
        }
        drop(runtime);
        if request.uri().path() == super::rls::SHOULD_RATE_LIMIT {
            return self.answer_rls(request, fields).await;
        }
        if request.uri().path() != DECIDE_PATH {
            return respond::not_found();
        }
        let method = request.method().clone();
        match forward_auth::original_request(request) {
            Ok(original) => self.answer(original, connection, fields).await,
            Err(detail) => {
                let response = forward_auth::undescribed(&self.shared.runtime.load(), &detail);
                let mut exchange = Exchange::new(method, self.shared.request_ids.for_request(None));
                exchange.listener = Listener::Decision;
                exchange.path = DECIDE_PATH.to_owned();
                exchange.outcome = Some(Outcome::BadRequest);
                exchange.cause = Some(Cause::Client);
                exchange.log(response.status());
                response
            }
        }
    }
}
