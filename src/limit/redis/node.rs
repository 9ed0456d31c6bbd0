//! The one node a store that is not a Cluster talks to: fixed by its url, or the master the
//! sentinels name, replaced when they name another. Every call of the store (decisions'
//! batches, leases, refunds, the admin's reads, the subscription) takes the current one here,
//! so one place knows where the master is.

use std::sync::Arc;

use arc_swap::ArcSwapOption;
use redis::aio::ConnectionManager;
use tokio::sync::Notify;

use crate::limit::StoreError;

pub(super) struct Node {
    manager: ArcSwapOption<ConnectionManager>,
    /// Its url, for connections beside the store's own (the subscription).
    url: ArcSwapOption<String>,
    /// Told when a call met a sign that the master moved: under Sentinel, the sentinels are
    /// asked at once.
    doubts: Arc<Notify>,
}

/// Hears the replies of calls to a node for signs that it is no longer the master.
#[derive(Clone)]
pub(super) struct Watcher(Arc<Notify>);

impl Watcher {
    /// A read-only node (a master turned replica) or a lost connection (a master gone).
    pub(super) fn saw<T>(&self, reply: &redis::RedisResult<T>) {
        if let Err(error) = reply {
            let read_only =
                error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::ReadOnly);
            if read_only || error.is_connection_dropped() || error.is_connection_refusal() {
                self.doubt();
            }
        }
    }

    /// Another sign of a switch, a sentinel's announcement.
    pub(super) fn doubt(&self) {
        self.0.notify_one();
    }
}

impl Node {
    /// A node at a url that never changes.
    pub(super) fn fixed(url: String, manager: ConnectionManager) -> Node {
        Node {
            manager: ArcSwapOption::from_pointee(manager),
            url: ArcSwapOption::from_pointee(url),
            doubts: Arc::default(),
        }
    }

    /// A master not known yet: calls fail as the store's failures until one is.
    pub(super) fn awaiting() -> Node {
        Node {
            manager: ArcSwapOption::empty(),
            url: ArcSwapOption::empty(),
            doubts: Arc::default(),
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

    pub(super) fn watcher(&self) -> Watcher {
        Watcher(self.doubts.clone())
    }

    /// Until a call meets a sign that the master moved.
    pub(super) async fn doubted(&self) {
        self.doubts.notified().await;
    }

    pub(super) fn url(&self) -> Option<String> {
        self.url.load_full().map(|url| (*url).clone())
    }

    /// Puts the node at `url` in place of the one before.
    pub(super) fn replace(&self, url: String, manager: ConnectionManager) {
        self.manager.store(Some(Arc::new(manager)));
        self.url.store(Some(Arc::new(url)));
    }
}

#[cfg(test)]
mod tests {
    use super::Node;
    use std::time::Duration;

    fn doubted_at_once(node: &Node) -> bool {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        runtime.block_on(async {
            tokio::time::timeout(Duration::from_millis(1), node.doubted())
                .await
                .is_ok()
        })
    }

    fn error(kind: redis::ErrorKind, text: &'static str) -> redis::RedisResult<()> {
        Err(redis::RedisError::from((kind, text)))
    }

    #[test]
    fn a_read_only_node_or_a_lost_connection_is_doubted_and_nothing_else() {
        use redis::{ErrorKind, ServerErrorKind};
        let node = Node::awaiting();
        node.watcher().saw(&Ok(()));
        node.watcher().saw(&error(
            ErrorKind::Server(ServerErrorKind::NoScript),
            "NOSCRIPT",
        ));
        node.watcher().saw(&error(ErrorKind::Client, "a bad reply"));
        assert!(!doubted_at_once(&node));
        node.watcher().saw(&error(
            ErrorKind::Server(ServerErrorKind::ReadOnly),
            "READONLY",
        ));
        assert!(doubted_at_once(&node));
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        node.watcher().saw::<()>(&Err(refused.into()));
        assert!(doubted_at_once(&node));
        let dropped = std::io::Error::from(std::io::ErrorKind::BrokenPipe);
        node.watcher().saw::<()>(&Err(dropped.into()));
        assert!(doubted_at_once(&node));
    }
}
