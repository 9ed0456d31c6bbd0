//! A request's `[scan]` steps: its key read and refused while banned, before its limits; and
//! its answered path counted toward a scan when the upstream's status is listed.

use super::{Gateway, Routed};
use crate::config::ScanSettings;
use crate::key::{self, RequestFacts};
use crate::limit::KeyParts;
use crate::reject::Reject;

impl Gateway {
    /// The request's `[scan]` key (none when it lacks it or is exempt), or its refusal while
    /// the key is banned.
    pub(super) fn scan_key(
        &self,
        scan: &ScanSettings,
        facts: &RequestFacts<'_>,
    ) -> Result<Option<KeyParts>, Reject> {
        let Ok(Some(key)) = key::extract(&scan.key, facts, &self.shared.hasher) else {
            return Ok(None);
        };
        if let Some((until_unix, left)) = self.shared.scans.banned_until(&key) {
            return Err(Reject::ScanBanned {
                retry_after: left.max(1),
                until_unix,
            });
        }
        Ok(Some(key))
    }

    /// Counts an answered path toward a scan of the request's key when its status is listed.
    pub(super) async fn count_scan(
        &self,
        routed: &Routed<'_>,
        key: Option<&KeyParts>,
        path: &str,
        status: u16,
    ) {
        let (Some(scan), Some(key)) = (&routed.runtime.policy.scan, key) else {
            return;
        };
        if scan.statuses.contains(&status) {
            self.shared.scans.answered(key, path, scan).await;
        }
    }
}
