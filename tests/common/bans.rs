//! The policy the ban tests share, on the memory store and (with a `[store]` section put
//! before it) on Redis: an account limit whose second refusal within a minute bans for 15
//! minutes, and a shadow limit whose first refusal bans for an hour.

use super::{HttpClient, Reply};

pub const POLICY: &str = r#"
[upstreams.app]
url = "http://{upstream}"

[limits.per_account]
key = { header = "x-account" }
capacity = 1
rate = "1/h"
[limits.per_account.ban]
after = 2
within = "1m"
duration = "15m"

[limits.peek]
key = { header = "x-account" }
mode = "shadow"
capacity = 1
rate = "1/h"
[limits.peek.ban]
after = 1
within = "1m"
duration = "1h"

[[routes]]
name = "login"
path = "/login"
upstream = "app"
limits = ["per_account"]

[[routes]]
name = "watched"
path = "/watched"
upstream = "app"
limits = ["peek"]
"#;

pub async fn login(client: &HttpClient, account: &str) -> Reply {
    client.get("/login", &[("x-account", account)]).await
}

/// A refusal by the 15-minute ban, most of it left.
pub fn assert_banned(reply: &Reply) {
    assert_eq!(reply.status, 429);
    assert_eq!(reply.json()["ban"], true, "{:?}", reply.body);
    let retry_after: u64 = reply.header("retry-after").unwrap().parse().unwrap();
    assert!((880..=900).contains(&retry_after), "{retry_after}");
}
