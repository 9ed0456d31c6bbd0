//! The shared store: buckets in Redis (one node or a Cluster), so that any number of replicas
//! enforce exactly the configured limits.
//!
//! A request is decided by one script call (`decide.lua`, EVALSHA, reloaded on NOSCRIPT) on a
//! multiplexed connection: every applicable bucket is checked and, only if all pass, charged,
//! at the Redis server's time. On one node, the requests that arrive while calls are out share
//! the next call (see [`batch`]). In a Cluster, a request's buckets may live in different slots:
//! each slot's buckets are decided by one call (all concurrently), and if any slot refuses
//! while others charged, those charges are given back (`refund.lua`). Between the charge and
//! the refund another request may see those tokens missing: the protocol can refuse a request
//! it could have admitted, never admit one that a bucket refused, and leaks no tokens.
//!
//! Calls are bounded by the configured timeout; repeated failures open a circuit breaker; a
//! replica-local deny cache refuses requests on buckets Redis just reported empty without a
//! round trip.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwapOption;
use futures_util::future::{join_all, BoxFuture};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::io::tcp::TcpSettings;
use redis::IntoConnectionInfo;
use redis::Script;

mod batch;
mod cluster;
mod decide_call;
mod key_admin;
pub(crate) mod keys;
mod node;
mod overrides;
mod refund;
mod scans;
mod sentinel;
mod server_clock;
mod settings;
mod slots;
mod token_lease;
mod top;
mod verdict;

use batch::Batcher;
pub use keys::slot;
use keys::{group_by_slot, StoreKeys};
pub use refund::Refund;
use server_clock::{LateCalls, ServerClock};
pub use settings::{Credentials, Password, RedisSettings, SentinelSettings};
pub use slots::{PendingSlotLeases, SlotLeases};

use super::breaker::{Breaker, CircuitState};
use super::clock::{self, Clock};
use super::deny_cache::DenyCache;
use super::lease::Leases;
use super::{AdaptiveParams, OutcomeRequest, StoreError};

/// Slots of a Redis Cluster.
const SLOTS: usize = 16384;

/// How long a reply is waited for at most, a late one included.
const LATE_REPLIES: Duration = Duration::from_secs(30);

const DECIDE: &str = include_str!("decide.lua");
const REFUND: &str = include_str!("refund.lua");
const OUTCOME: &str = include_str!("outcome.lua");

enum Connection {
    Single(Arc<node::Node>),
    Cluster(Box<Cluster>),
}

struct Cluster {
    client: ClusterClient,
    /// Connected on first use, so that the gateway starts while Redis is down.
    connection: ArcSwapOption<ClusterConnection>,
    connecting: tokio::sync::Mutex<()>,
}

pub struct RedisStore {
    connection: Connection,
    prefix: String,
    timeout: Duration,
    decide: Arc<Script>,
    refund: Arc<Script>,
    outcome: Arc<Script>,
    breaker: Breaker,
    deny_cache: DenyCache,
    /// Whether this replica is subscribed to the reset channel: the deny cache remembers
    /// refusals only while it would hear a reset that lifts them.
    hearing_resets: AtomicBool,
    /// Told when another replica changed the overrides, or when changes may have gone
    /// unheard (the subscription began again).
    overrides_changed: tokio::sync::Notify,
    clock: Clock,
    deny_cache_refusals: AtomicU64,
    /// Decisions on a single node go out in batches.
    batcher: Batcher,
    server_clock: Arc<ServerClock>,
    late: LateCalls,
    /// The node (or the Cluster's seed nodes) to hear resets from.
    node_urls: Vec<String>,
    /// The CA certificates `[store] ca_file` names, for every connection this store opens.
    ca_roots: Option<Vec<u8>>,
    /// The ACL user and password of every connection this store opens.
    credentials: Credentials,
    /// Under Sentinel, the sentinels that name the master.
    sentinel: Option<Box<sentinel::Sentinels>>,
    /// How long a concurrency slot lasts unless renewed.
    pub(crate) lease: Duration,
    /// This replica's token leases of leased buckets, and the script that refills them.
    leases: Leases,
    lease_script: Arc<Script>,
    /// Calls made (`tollgate_store_calls_total`), batches' included.
    calls: prometheus::IntCounter,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .field("timeout", &self.timeout)
            .field(
                "cluster",
                &matches!(self.connection, Connection::Cluster(_)),
            )
            .finish_non_exhaustive()
    }
}

fn tls_certificates(root_cert: Option<Vec<u8>>) -> redis::TlsCertificates {
    redis::TlsCertificates {
        client_tls: None,
        root_cert,
    }
}

/// A client of `url` with `credentials`, trusting `roots` (PEM) besides the system's when
/// given.
fn node_client(
    url: String,
    credentials: &Credentials,
    roots: Option<&[u8]>,
) -> redis::RedisResult<redis::Client> {
    let info = credentials.apply(url.into_connection_info()?.set_tcp_settings(tcp_settings()));
    match roots {
        Some(roots) => redis::Client::build_with_tls(info, tls_certificates(Some(roots.to_vec()))),
        None => redis::Client::open(info),
    }
}

/// The store's connection to one node at `url`, made lazily: the gateway serves while Redis
/// is down.
fn node_manager(
    url: &str,
    settings: &RedisSettings,
    roots: Option<&[u8]>,
) -> Result<ConnectionManager, StoreError> {
    let client = node_client(url.to_owned(), &settings.credentials, roots)
        .map_err(|error| StoreError::Setup(error.to_string()))?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(settings.connect_timeout))
        // The store's timeout is kept by the callers (the batches' deadlines): a reply that
        // comes after it is still read, to learn that its script ran late.
        .set_response_timeout(Some(settings.timeout.max(LATE_REPLIES)))
        .set_number_of_retries(1)
        .set_max_delay(Duration::from_millis(200));
    ConnectionManager::new_lazy_with_config(client, config)
        .map_err(|error| StoreError::Setup(error.to_string()))
}

/// Nagle's algorithm off. The store multiplexes calls on one connection: with it on (the redis
/// crate's default), a call written while the one before is unacknowledged waits for that
/// acknowledgement, a round trip on a network (on loopback it measured no different).
fn tcp_settings() -> TcpSettings {
    TcpSettings::default().set_nodelay(true)
}

impl RedisStore {
    /// Prepares the connection without connecting: the gateway serves while Redis is down.
    pub fn new(settings: &RedisSettings, clock: Clock) -> Result<RedisStore, StoreError> {
        let roots = match &settings.ca_file {
            Some(path) => Some(std::fs::read(path).map_err(|error| {
                StoreError::Setup(format!("cannot read {}: {error}", path.display()))
            })?),
            None => None,
        };
        let connection = if settings.cluster {
            let mut builder = ClusterClient::builder(settings.nodes.clone())
                .connection_timeout(settings.connect_timeout)
                // As on one node: the callers keep the store's timeout, and a late reply is
                // still read.
                .response_timeout(settings.timeout.max(LATE_REPLIES))
                .retries(1)
                .tcp_settings(tcp_settings());
            if roots.is_some() {
                builder = builder.certs(tls_certificates(roots.clone()));
            }
            if let Some(username) = &settings.credentials.username {
                builder = builder.username(username);
            }
            if let Some(Password(password)) = &settings.credentials.password {
                builder = builder.password(password);
            }
            let client = builder
                .build()
                .map_err(|error| StoreError::Setup(error.to_string()))?;
            Connection::Cluster(Box::new(Cluster {
                client,
                connection: ArcSwapOption::empty(),
                connecting: tokio::sync::Mutex::new(()),
            }))
        } else {
            match settings.nodes.first() {
                Some(url) => {
                    let manager = node_manager(url, settings, roots.as_deref())?;
                    Connection::Single(Arc::new(node::Node::fixed(url.clone(), manager)))
                }
                // Under Sentinel: the master is asked for (`find_master`).
                None => Connection::Single(Arc::new(node::Node::awaiting())),
            }
        };
        let sentinel = match &settings.sentinel {
            Some(sentinel) => Some(Box::new(sentinel::Sentinels::new(
                settings,
                sentinel,
                roots.as_deref(),
            )?)),
            None => None,
        };
        let slots = if settings.cluster { SLOTS } else { 1 };
        Ok(RedisStore {
            connection,
            prefix: settings.prefix.clone(),
            timeout: settings.timeout,
            decide: Arc::new(Script::new(DECIDE)),
            refund: Arc::new(Script::new(REFUND)),
            outcome: Arc::new(Script::new(OUTCOME)),
            breaker: Breaker::new(clock.clone()),
            deny_cache: DenyCache::default(),
            hearing_resets: AtomicBool::new(false),
            overrides_changed: tokio::sync::Notify::new(),
            clock,
            deny_cache_refusals: AtomicU64::new(0),
            batcher: Batcher::new(),
            server_clock: Arc::new(ServerClock::new(slots)),
            late: LateCalls::counted_by(
                prometheus::IntCounter::new("late_calls", "Calls that ran late.")
                    .expect("valid counter"),
            ),
            node_urls: settings.nodes.clone(),
            ca_roots: roots,
            credentials: settings.credentials.clone(),
            sentinel,
            lease: settings.lease,
            leases: Leases::default(),
            lease_script: token_lease::script(),
            calls: prometheus::IntCounter::new("calls", "Calls made.").expect("valid counter"),
        })
    }

    /// A client of one of the store's nodes (by `index`, round the list), with the store's
    /// TLS roots: for the connections beside the store's own (the reset subscription).
    pub(crate) fn node_client(&self, index: usize) -> Option<redis::Client> {
        let url = match &self.connection {
            Connection::Single(node) => node.url()?,
            Connection::Cluster(_) => self
                .node_urls
                .get(index % self.node_urls.len().max(1))?
                .clone(),
        };
        node_client(url, &self.credentials, self.ca_roots.as_deref()).ok()
    }

    /// Records the requests each batch's call decides in `batches`, calls that ran after
    /// their deadline (charging nothing) in `late`, and every call made in `calls`.
    pub fn observing(
        mut self,
        batches: prometheus::Histogram,
        late: prometheus::IntCounter,
        calls: prometheus::IntCounter,
    ) -> RedisStore {
        self.batcher = Batcher::observed_by(batches, calls.clone());
        self.late = LateCalls::counted_by(late);
        self.calls = calls;
        self
    }

    /// The servers' time (Unix seconds) as the store's clock places it: the store's clock,
    /// moved by how far the servers' clock is ahead of this machine's. In production that is
    /// Redis `TIME`; a test's manual clock moves it.
    pub fn calendar_now(&self) -> f64 {
        self.clock.unix() + self.server_clock.skew()
    }

    /// Calls that ran after the gateway gave up on them and charged nothing.
    pub fn late_calls(&self) -> u64 {
        self.late.get()
    }

    /// Whether this replica hears resets published by the others (and so uses its deny cache).
    pub fn hears_resets(&self) -> bool {
        self.hearing_resets.load(Ordering::Acquire)
    }

    /// Requests refused by the deny cache without a store call.
    pub fn deny_cache_refusals(&self) -> u64 {
        self.deny_cache_refusals.load(Ordering::Relaxed)
    }

    /// `decide.lua` calls made for batches of decisions on a single node (one call may decide
    /// many requests; a Cluster's calls are not counted here).
    pub fn batch_calls(&self) -> u64 {
        self.batcher.calls()
    }

    pub fn is_circuit_open(&self) -> bool {
        self.breaker.is_open()
    }

    pub fn circuit_state(&self) -> CircuitState {
        self.breaker.state()
    }

    /// Applies outcome charges and adaptive errors (`outcome.lua`, one call per slot);
    /// returns whether each key tripped. The calls carry their deadline in the server's time:
    /// run after it, a charge by status must not land (the gateway gave up on it).
    pub async fn record_outcomes(
        &self,
        requests: &[OutcomeRequest<'_>],
    ) -> Result<Vec<bool>, StoreError> {
        let call = self.breaker.permit().ok_or(StoreError::Unavailable)?;
        let keys = StoreKeys::new(&self.prefix, requests.iter().map(|request| &request.key));
        let groups = match &self.connection {
            Connection::Single(_) => vec![(0..requests.len()).collect::<Vec<usize>>()],
            Connection::Cluster(_) => group_by_slot(keys.iter()),
        };
        let replies = match self.call_outcomes(requests, &keys, &groups).await {
            Ok(replies) => replies,
            Err(error) => {
                call.failure();
                return Err(error);
            }
        };
        call.success();
        if replies.iter().any(|reply| is_late(reply)) {
            self.late.count();
            return Err(StoreError::Timeout);
        }
        let mut tripped = vec![false; requests.len()];
        for (group, reply) in groups.iter().zip(replies) {
            if reply.len() != group.len() {
                return Err(StoreError::Reply(format!("{reply:?}")));
            }
            for (index, flag) in group.iter().zip(reply) {
                tripped[*index] = flag == "1";
            }
        }
        Ok(tripped)
    }

    /// One `outcome.lua` call per group, all at once, each until the store's timeout.
    async fn call_outcomes(
        &self,
        requests: &[OutcomeRequest<'_>],
        keys: &StoreKeys,
        groups: &[Vec<usize>],
    ) -> Result<Vec<Vec<String>>, StoreError> {
        let deadline = clock::deadline_in(self.timeout);
        let calls = groups.iter().map(|group| {
            let server_deadline = self
                .server_clock
                .deadline(self.clock_slot(keys, group), deadline);
            let command = outcome_command(&self.outcome, requests, keys, group, server_deadline);
            self.call_until(&self.outcome, command, deadline, |reply: Vec<String>| {
                is_late(&reply)
            })
        });
        join_all(calls).await.into_iter().collect()
    }

    /// Sends a script's call and waits for its reply until `deadline` (connecting included);
    /// a call given up on is listened to, and `read` tells from its reply whether it ran late.
    async fn call_until<T: redis::FromRedisValue + Send + 'static>(
        &self,
        script: &Arc<Script>,
        command: redis::Cmd,
        deadline: tokio::time::Instant,
        read: impl FnOnce(T) -> bool + Send + 'static,
    ) -> Result<T, StoreError> {
        let call = tokio::time::timeout_at(deadline, self.owned_call(script, command))
            .await
            .map_err(|_| StoreError::Timeout)??;
        self.late.wait(call, deadline, read).await
    }

    /// The slot whose server's clock a call over `group` of `keys` reads (0 on a single node).
    fn clock_slot(&self, keys: &StoreKeys, group: &[usize]) -> u16 {
        match (&self.connection, group.first()) {
            (Connection::Cluster(_), Some(first)) => slot(keys[*first].as_bytes()),
            _ => 0,
        }
    }

    /// A call of `script` that owns what it needs, so that it can be listened to after the
    /// gateway gave up on it.
    async fn owned_call<T: redis::FromRedisValue + Send + 'static>(
        &self,
        script: &Arc<Script>,
        command: redis::Cmd,
    ) -> Result<BoxFuture<'static, redis::RedisResult<T>>, StoreError> {
        let script = script.clone();
        self.calls.inc();
        Ok(match &self.connection {
            Connection::Single(node) => {
                let (mut connection, watcher) = (node.current()?, node.watcher());
                Box::pin(async move {
                    let reply = evaluate(&script, &command, &mut connection).await;
                    watcher.saw(&reply);
                    reply
                })
            }
            Connection::Cluster(_) => {
                let mut connection = self.cluster().await?;
                Box::pin(async move { evaluate(&script, &command, &mut connection).await })
            }
        })
    }

    /// Sends a script's call to the node, or to the Cluster (which routes it by its keys).
    async fn send<T: redis::FromRedisValue + Send + 'static>(
        &self,
        script: &Arc<Script>,
        command: redis::Cmd,
    ) -> Result<T, StoreError> {
        self.owned_call(script, command)
            .await?
            .await
            .map_err(|error| StoreError::Redis(error.to_string()))
    }

    /// While the circuit is open, asks Redis for a PING (which also reconnects a broken
    /// connection) and closes the circuit when it answers: decisions go back to Redis as soon
    /// as it is back, not when a request's probe next comes up after a backoff of seconds.
    pub async fn probe_if_open(&self) {
        if self.breaker.state() != CircuitState::Closed && self.ping().await {
            tracing::info!("store answers a PING again");
            self.breaker.close();
        }
    }

    /// Whether Redis answers a PING within the timeout (`/readyz`).
    pub async fn ping(&self) -> bool {
        let ping = async {
            let result: redis::RedisResult<String> = match &self.connection {
                Connection::Single(node) => match node.current() {
                    Ok(mut connection) => {
                        let reply = redis::cmd("PING").query_async(&mut connection).await;
                        node.watcher().saw(&reply);
                        reply
                    }
                    Err(_) => return false,
                },
                Connection::Cluster(_) => match self.cluster().await {
                    Ok(mut connection) => redis::cmd("PING").query_async(&mut connection).await,
                    Err(_) => return false,
                },
            };
            result.is_ok()
        };
        tokio::time::timeout(self.timeout.max(Duration::from_millis(250)), ping)
            .await
            .unwrap_or(false)
    }
}

/// Calls `script` by its hash over the keys `group` selects, with its deadline if it takes
/// one, then the arguments `args` writes for each key (given its position in `group`), all in
/// one command buffer: the script-invocation type would allocate a vector per argument.
fn script_command(
    script: &Script,
    keys: &StoreKeys,
    group: &[usize],
    deadline: Option<u64>,
    mut args: impl FnMut(&mut redis::Cmd, usize),
) -> redis::Cmd {
    // Sized up front: grown argument by argument, the buffers would be reallocated several
    // times per call. Each bucket has its key and at most 9 numbers.
    let data = group
        .iter()
        .map(|index| keys[*index].len() + 9 * 24)
        .sum::<usize>();
    let mut command = redis::Cmd::with_capacity(2 + 10 * group.len(), 64 + data);
    command
        .arg("EVALSHA")
        .arg(script.get_hash())
        .arg(group.len());
    for index in group {
        command.arg(&keys[*index]);
    }
    if let Some(deadline) = deadline {
        command.arg(deadline);
    }
    for position in 0..group.len() {
        args(&mut command, position);
    }
    command
}

/// An `outcome.lua` call for the requests `group` selects.
fn outcome_command(
    script: &Script,
    requests: &[OutcomeRequest<'_>],
    keys: &StoreKeys,
    group: &[usize],
    deadline: u64,
) -> redis::Cmd {
    script_command(script, keys, group, Some(deadline), |command, position| {
        let request = &requests[group[position]];
        let charge = &request.charge;
        let mut adaptive = request.adaptive.unwrap_or(AdaptiveParams {
            threshold: 1,
            window: 0.0,
            factor: 0.0,
            min_capacity: 0.0,
            hold: 0.0,
        });
        // A quota (rate 0) has no penalty: its places carry its period's ends.
        if let Some(period) = charge.period {
            adaptive.factor = period.end as f64;
            adaptive.min_capacity = period.next_end as f64;
        }
        command
            .arg(Number(charge.capacity))
            .arg(Number(charge.rate))
            .arg(Number(charge.cost))
            .arg(if request.error { 1 } else { 0 })
            .arg(adaptive.threshold)
            .arg((adaptive.window * 1e6).round() as i64)
            .arg(Number(adaptive.factor))
            .arg(Number(adaptive.min_capacity))
            .arg((adaptive.hold * 1e6).round() as i64);
    })
}

/// Whether an `outcome.lua` reply says the call came after its deadline.
fn is_late(reply: &[String]) -> bool {
    reply.first().is_some_and(|flag| flag == "late")
}

/// Sends a script's `EVALSHA`; on NOSCRIPT (the first call, or Redis restarted or flushed its
/// scripts) loads the script and sends it once more.
async fn evaluate<T: redis::FromRedisValue>(
    script: &Script,
    command: &redis::Cmd,
    connection: &mut impl redis::aio::ConnectionLike,
) -> redis::RedisResult<T> {
    match command.query_async(connection).await {
        Err(error)
            if error.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) =>
        {
            script.load_async(connection).await?;
            command.query_async(connection).await
        }
        result => result,
    }
}

/// A number as a script argument. Capacities, rates and costs are usually whole numbers:
/// those go out as integers, which format several times faster than floats (Lua reads both).
struct Number(f64);

impl redis::ToRedisArgs for Number {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + redis::RedisWrite,
    {
        const EXACT: f64 = 9_007_199_254_740_992.0; // 2^53: every integer below is exact
        let value = self.0;
        if value.fract() == 0.0 && value.abs() < EXACT {
            out.write_arg(itoa::Buffer::new().format(value as i64).as_bytes());
        } else {
            value.write_redis_args(out);
        }
    }
}

#[cfg(test)]
mod tests;
