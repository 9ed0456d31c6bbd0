//! `[server.tls.acme]`: certificates obtained and renewed by tollgate itself (RFC 8555). At
//! start the certificate in `state_dir` is served if it covers every host; one is ordered when
//! there is none or its end is within `renew_before`, in the background, retried with backoff
//! (at most one order a minute). Until the first arrives, those hosts get the default
//! certificate.

use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::config::AcmeSettings;
use crate::shared::Shared;
use crate::tls::{Obtained, Served};
use state_dir::StateDir;

mod order;
mod state_dir;

/// The first retry of a failed order; then twice as long each time, up to `MAX_RETRY`.
const MIN_RETRY: Duration = Duration::from_secs(60);
const MAX_RETRY: Duration = Duration::from_secs(3600);
/// How long the loop sleeps at most before it looks at the certificate's end again.
const LONGEST_SLEEP: Duration = Duration::from_secs(12 * 3600);

/// Serves what `state_dir` holds, then keeps the hosts certified in the background.
pub(crate) fn start(shared: &Arc<Shared>, settings: &AcmeSettings) {
    let Some(obtained) = shared.acme.clone() else {
        return;
    };
    let state_dir = match StateDir::open(&settings.state_dir) {
        Ok(state_dir) => state_dir,
        Err(error) => {
            tracing::error!(%error, dir = %settings.state_dir.display(), "ACME state_dir cannot be made: no certificate will be ordered");
            return;
        }
    };
    install_saved(shared, &obtained, &state_dir);
    tokio::spawn(keep_certified(
        Arc::downgrade(shared),
        settings.clone(),
        state_dir,
        obtained,
    ));
}

/// Serves the certificate in `state_dir`, if there is one for every host.
fn install_saved(shared: &Shared, obtained: &Obtained, state_dir: &StateDir) -> bool {
    let files = state_dir.certificate_files();
    if !files.cert.exists() {
        return false;
    }
    match crate::tls::read_pair(&files) {
        Ok((key, names, not_after)) => {
            if let Some(missing) = obtained.hosts.iter().find(|host| !names.contains(host)) {
                tracing::info!(host = %missing, "the ACME certificate in state_dir does not name this host: ordering a new one");
                return false;
            }
            shared
                .metrics
                .tls
                .serving_obtained(&obtained.hosts, not_after);
            obtained.install(Served { key, not_after });
            true
        }
        Err(error) => {
            tracing::warn!(%error, "the ACME certificate in state_dir cannot be used: ordering a new one");
            false
        }
    }
}

/// How long until the certificate is due for renewal (zero: now).
fn renewal_due_in(obtained: &Obtained, renew_before: Duration) -> Duration {
    let Some(served) = obtained.certificate() else {
        return Duration::ZERO;
    };
    let now = crate::limit::clock::unix_seconds() as i64;
    let due = served.not_after - renew_before.as_secs() as i64;
    Duration::from_secs(u64::try_from(due - now).unwrap_or(0))
}

async fn keep_certified(
    shared: Weak<Shared>,
    settings: AcmeSettings,
    state_dir: StateDir,
    obtained: Arc<Obtained>,
) {
    let mut retry = MIN_RETRY;
    loop {
        let due_in = renewal_due_in(&obtained, settings.renew_before);
        if !due_in.is_zero() {
            tokio::time::sleep(due_in.min(LONGEST_SLEEP)).await;
            continue;
        }
        if shared.strong_count() == 0 {
            return;
        }
        let result = order::order(&settings, &state_dir, &obtained).await;
        obtained.clear_challenges();
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let installed = match result {
            Ok(()) => install_saved(&shared, &obtained, &state_dir),
            Err(error) => {
                tracing::warn!(%error, retry_in = ?retry, hosts = ?obtained.hosts, "ACME order failed");
                false
            }
        };
        shared.metrics.tls.ordered(installed);
        drop(shared);
        if installed {
            tracing::info!(hosts = ?obtained.hosts, "ACME certificate obtained and served");
            retry = MIN_RETRY;
        } else {
            tokio::time::sleep(retry).await;
            retry = (retry * 2).min(MAX_RETRY);
        }
    }
}
