//! The one node a store that is not a Cluster talks to: fixed by its url, or the master the
//! sentinels name, replaced when they name another. Every call of the store (decisions'
//! batches, leases, refunds, the admin's reads, the subscription) takes the current one here,
//! so one place knows where the master is.

use arc_swap::ArcSwapOption;
use redis::aio::ConnectionManager;

use crate::limit::StoreError;

pub(super) struct Node {
    manager: ArcSwapOption<ConnectionManager>,
    /// Its url, for connections beside the store's own (the subscription).
    url: ArcSwapOption<String>,
}

impl Node {
    /// A node at a url that never changes.
    pub(super) fn fixed(url: String, manager: ConnectionManager) -> Node {
        Node {
            manager: ArcSwapOption::from_pointee(manager),
            url: ArcSwapOption::from_pointee(url),
        }
    }

    /// A master not known yet: calls fail as the store's failures until one is.
    pub(super) fn awaiting() -> Node {
        Node {
            manager: ArcSwapOption::empty(),
            url: ArcSwapOption::empty(),
        }
    }

    /// A connection to the node now (a handle on the multiplexed connection, cheap to clone).
    #[inline]
    pub(super) fn current(&self) -> Result<ConnectionManager, StoreError> {
        match &*self.manager.load() {
            Some(manager) => Ok((**manager).clone()),
            None => Err(StoreError::Redis(
                "no master known yet: no sentinel has named one".to_owned(),
            )),
        }
    }

    pub(super) fn url(&self) -> Option<String> {
        self.url.load_full().map(|url| (*url).clone())
    }

    /// Puts the node at `url` in place of the one before.
    pub(super) fn replace(&self, url: String, manager: ConnectionManager) {
        self.manager.store(Some(std::sync::Arc::new(manager)));
        self.url.store(Some(std::sync::Arc::new(url)));
    }
}
