//! Redis under Sentinel. redis-rs's `SentinelClient` finds the master: the first sentinel
//! that names one which answers `ROLE` as a master. This module follows it: at once when a
//! sentinel announces `+switch-master` or a call meets a read-only node or a lost connection,
//! and every few seconds in any case. In between, calls fail as the store's failures do, and
//! each route's `on_store_failure` decides.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures_util::StreamExt;
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{IntoConnectionInfo, TlsMode};

use super::node::Node;
use super::{node_manager, tcp_settings, tls_certificates, Connection, Password, RedisStore};
use super::{RedisSettings, SentinelSettings};
use crate::limit::StoreError;

/// How often the sentinels are asked while their announcements are heard, and while they are
/// not: a switch is then followed within this of the sentinels' naming the new master.
const ASK_WHILE_HEARING: Duration = Duration::from_secs(5);
const ASK_WHILE_DEAF: Duration = Duration::from_secs(1);

/// The channel on which a sentinel announces a failover's new master.
const SWITCH_MASTER: &str = "+switch-master";

/// The sentinels of a store's master, and the settings a new master's connection is made with.
pub(super) struct Sentinels {
    client: tokio::sync::Mutex<SentinelClient>,
    master: String,
    settings: Box<RedisSettings>,
    hearing_switches: AtomicBool,
}

impl Sentinels {
    pub(super) fn new(
        settings: &RedisSettings,
        sentinel: &SentinelSettings,
        roots: Option<&[u8]>,
    ) -> Result<Sentinels, StoreError> {
        let client = sentinel_client(settings, sentinel, roots)
            .map_err(|error| StoreError::Setup(format!("sentinels: {error}")))?;
        Ok(Sentinels {
            client: tokio::sync::Mutex::new(client),
            master: sentinel.master.clone(),
            settings: Box::new(settings.clone()),
            hearing_switches: AtomicBool::new(false),
        })
    }
}

/// A client of the sentinels that finds the master with the store's credentials, database,
/// TLS and roots (the sentinels' own password apart).
fn sentinel_client(
    settings: &RedisSettings,
    sentinel: &SentinelSettings,
    roots: Option<&[u8]>,
) -> redis::RedisResult<SentinelClient> {
    let addresses = sentinel
        .sentinels
        .iter()
        .map(|url| Ok(url.as_str().into_connection_info()?.addr().clone()))
        .collect::<redis::RedisResult<Vec<_>>>()?;
    let tls = sentinel.scheme == "rediss";
    let mut builder =
        SentinelClientBuilder::new(addresses, &sentinel.master, SentinelServerType::Master)?
            .set_client_to_redis_db(sentinel.db)
            .set_client_to_redis_tcp_settings(tcp_settings())
            .set_client_to_sentinel_tcp_settings(tcp_settings());
    if tls {
        builder = builder
            .set_client_to_redis_tls_mode(TlsMode::Secure)
            .set_client_to_sentinel_tls_mode(TlsMode::Secure);
        if let Some(roots) = roots {
            let certificates = tls_certificates(Some(roots.to_vec()));
            builder = builder
                .set_client_to_redis_certificates(certificates.clone())
                .set_client_to_sentinel_certificates(certificates);
        }
    }
    if let Some(username) = &settings.credentials.username {
        builder = builder.set_client_to_redis_username(username);
    }
    if let Some(Password(password)) = &settings.credentials.password {
        builder = builder.set_client_to_redis_password(password);
    }
    if let Some(Password(password)) = &sentinel.credentials.password {
        builder = builder.set_client_to_sentinel_password(password);
    }
    builder.build()
}

impl RedisStore {
    /// Asks the sentinels for the master (checked with `ROLE`) and points the store at it if
    /// it moved. Whether it moved.
    pub async fn find_master(&self) -> Result<bool, StoreError> {
        let (Some(sentinels), Connection::Single(node)) = (&self.sentinel, &self.connection) else {
            return Ok(false);
        };
        let settings = &sentinels.settings;
        let asking = async { sentinels.client.lock().await.async_get_client().await };
        // Each sentinel and the master it names get a second to connect: a dead one is
        // passed over, a dead first one too.
        let master = tokio::time::timeout(settings.timeout.max(Duration::from_secs(5)), asking)
            .await
            .map_err(|_| StoreError::Timeout)?
            .map_err(|error| {
                StoreError::Redis(format!(
                    "no sentinel names a master {:?} that says it is one: {error}",
                    sentinels.master
                ))
            })?;
        let address = master.get_connection_info().addr().to_string();
        let scheme = if settings
            .sentinel
            .as_ref()
            .is_some_and(|s| s.scheme == "rediss")
        {
            "rediss"
        } else {
            "redis"
        };
        let db = settings.sentinel.as_ref().map_or(0, |sentinel| sentinel.db);
        let url = format!("{scheme}://{address}/{db}");
        if node.url().as_deref() == Some(url.as_str()) {
            return Ok(false);
        }
        let manager = node_manager(&url, settings, self.ca_roots.as_deref())?;
        node.replace(url, manager);
        // What this replica remembers was decided at the old master.
        self.deny_cache.clear();
        tracing::info!(master = %sentinels.master, %address, "store: following the master the sentinels name");
        Ok(true)
    }

    /// Follows the master until the store is dropped: asks the sentinels when one announces
    /// a switch, when a call meets a sign of one, and every few seconds.
    pub(crate) async fn follow_master(store: Weak<RedisStore>) {
        tokio::spawn(hear_switches(store.clone()));
        loop {
            let Some(redis) = store.upgrade() else {
                return;
            };
            let Some((sentinels, node)) = redis.sentinels_and_node() else {
                return;
            };
            let every = if sentinels.hearing_switches.load(Ordering::Acquire) {
                ASK_WHILE_HEARING
            } else {
                ASK_WHILE_DEAF
            };
            let node = Arc::clone(node);
            drop(redis);
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                () = node.doubted() => {}
            }
            let Some(redis) = store.upgrade() else {
                return;
            };
            if let Err(error) = redis.find_master().await {
                tracing::warn!(%error, "store: the master could not be found");
                drop(redis);
                // A master that is gone fails every call: asked again after a pause, not
                // at each failure.
                tokio::time::sleep(ASK_WHILE_DEAF).await;
            }
        }
    }

    /// Under Sentinel, the sentinels and the node they name.
    fn sentinels_and_node(&self) -> Option<(&Sentinels, &Arc<Node>)> {
        match (&self.sentinel, &self.connection) {
            (Some(sentinels), Connection::Single(node)) => Some((sentinels, node)),
            _ => None,
        }
    }

    /// Whether the store's node is the master the sentinels name.
    pub fn under_sentinel(&self) -> bool {
        self.sentinel.is_some()
    }

    /// Whether this replica hears the sentinels announce switches.
    pub fn hears_switches(&self) -> bool {
        self.sentinel
            .as_ref()
            .is_some_and(|sentinels| sentinels.hearing_switches.load(Ordering::Acquire))
    }
}

/// Listens to a sentinel (the first that answers) for `+switch-master` of the store's master,
/// and tells the follower at once; subscribes again, to the next that answers, when it stops.
async fn hear_switches(store: Weak<RedisStore>) {
    loop {
        let Some(redis) = store.upgrade() else {
            return;
        };
        let Some((sentinels, node)) = redis.sentinels_and_node() else {
            return;
        };
        let (master, node) = (sentinels.master.clone(), Arc::clone(node));
        let client = sentinels
            .client
            .lock()
            .await
            .async_get_sentinel_client()
            .await;
        drop(redis);
        if let Ok(client) = client {
            if let Ok(mut pubsub) = client.get_async_pubsub().await {
                if pubsub.subscribe(SWITCH_MASTER).await.is_ok() {
                    set_hearing(&store, true);
                    let mut messages = pubsub.into_on_message();
                    while let Some(message) = messages.next().await {
                        // "<master name> <old ip> <old port> <new ip> <new port>"
                        let payload = message.get_payload::<String>().unwrap_or_default();
                        if payload.split(' ').next() == Some(master.as_str()) {
                            node.watcher().doubt();
                        }
                    }
                    set_hearing(&store, false);
                }
            }
        }
        tokio::time::sleep(ASK_WHILE_DEAF).await;
    }
}

fn set_hearing(store: &Weak<RedisStore>, hearing: bool) {
    if let Some(sentinels) = store
        .upgrade()
        .as_ref()
        .and_then(|redis| redis.sentinel.as_ref())
    {
        sentinels.hearing_switches.store(hearing, Ordering::Release);
    }
}
