//! How the Redis store reaches its nodes, as `[store]` compiles: one node, a Cluster's seed
//! nodes, or the sentinels of a master; and the credentials every connection carries, kept
//! out of the file and never printed.

use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq)]
/// How the Redis store reaches its nodes (`[store]` with `backend = "redis"`, compiled).
pub struct RedisSettings {
    /// Connection URLs: one for a single node, the seed nodes of a Cluster.
    pub nodes: Vec<String>,
    pub cluster: bool,
    /// A store call slower than this is a store failure.
    pub timeout: Duration,
    /// How long one (re)connection to a node may take.
    pub connect_timeout: Duration,
    /// Prepended to every key: `<prefix><limit>:<key>`.
    pub prefix: String,
    /// PEM roots for `rediss://`; `None`: the system's.
    pub ca_file: Option<PathBuf>,
    /// How long a concurrency slot lasts in Redis unless renewed (its request renews it while
    /// in flight): what a replica that dies holds for at most.
    pub lease: Duration,
    /// `username` and the password of `password_env`, for every node; they beat what a url
    /// carries.
    pub credentials: Credentials,
    /// `redis+sentinel://`: the master is the one the sentinels name (`nodes` is empty).
    pub sentinel: Option<SentinelSettings>,
}

/// Where the sentinels are, which master they watch, and how its node is reached.
#[derive(Debug, Clone, PartialEq)]
pub struct SentinelSettings {
    /// Each sentinel's url (`redis://host:port`, or `rediss://`).
    pub sentinels: Vec<String>,
    /// The master's name (`sentinel monitor NAME …`).
    pub master: String,
    /// `redis` or `rediss`, and the database number: the master's url once its address is
    /// known.
    pub scheme: String,
    pub db: i64,
    /// The sentinels' password (`sentinel_password_env`).
    pub credentials: Credentials,
}

/// An ACL user and a password, kept out of the policy file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Credentials {
    pub username: Option<String>,
    pub password: Option<Password>,
}

/// A password: never printed.
#[derive(Clone, PartialEq)]
pub struct Password(pub String);

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Password(..)")
    }
}

impl Credentials {
    /// `info` with these credentials in place of its own.
    pub(super) fn apply(&self, info: redis::ConnectionInfo) -> redis::ConnectionInfo {
        let mut settings = info.redis_settings().clone();
        if let Some(username) = &self.username {
            settings = settings.set_username(username);
        }
        if let Some(Password(password)) = &self.password {
            settings = settings.set_password(password);
        }
        info.set_redis_settings(settings)
    }
}
