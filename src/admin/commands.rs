//! The commands that ask a running gateway's admin listener: `tollgate inspect`, `reset` and
//! `override`, each one call whose answer is printed for a person.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::config::{self, Policy};

/// Where the admin listener is, and the policy that says so (and names its token).
#[derive(clap::Args, Debug, Clone)]
pub struct AdminTarget {
    /// The admin listener (default: $TOLLGATE_ADMIN, then the policy's [admin] listen).
    #[arg(long, value_name = "URL", env = "TOLLGATE_ADMIN")]
    pub admin: Option<String>,
    /// The policy (default: $TOLLGATE_CONFIG, then config/tollgate.toml), for the admin
    /// address and the token's environment variable.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
}

impl AdminTarget {
    /// The admin listener's URL and the token to send; `None` (said on stderr) when the
    /// address cannot be found.
    pub(super) fn resolve(&self) -> Option<(String, Option<String>)> {
        let path = self.config.clone().unwrap_or_else(config::default_path);
        let policy = Policy::load(&path);
        let admin = match (&self.admin, &policy) {
            (Some(url), _) => url.trim_end_matches('/').to_owned(),
            (None, Ok(policy)) => super::local_url(policy.admin.listen),
            (None, Err(errors)) => {
                eprintln!("{errors}");
                eprintln!(
                    "tollgate: cannot read the admin address from {}: pass --admin http://host:port \
                     (or set TOLLGATE_ADMIN), or the gateway's policy with --config FILE (or \
                     TOLLGATE_CONFIG)",
                    path.display()
                );
                return None;
            }
        };
        let token = match &policy {
            Ok(policy) => policy
                .admin
                .token
                .as_ref()
                .map(|token| token.secret().to_owned()),
            Err(_) => std::env::var("TOLLGATE_ADMIN_TOKEN").ok(),
        };
        Some((admin, token))
    }
}

/// One key of one limit.
#[derive(clap::Args, Debug, Clone)]
pub struct KeyArguments {
    /// The limit's name.
    #[arg(long)]
    pub limit: String,
    /// The key's value as a request carries it (an email, a header's value, an address);
    /// once per part of a composite key, in order; none for a global limit.
    #[arg(long = "key", value_name = "VALUE")]
    pub keys: Vec<String>,
    /// For a limit with tiers: the tier whose numbers to read the key with.
    #[arg(long)]
    pub tier: Option<String>,
    #[command(flatten)]
    pub target: AdminTarget,
}

/// `tollgate inspect` and `tollgate reset`: one call to the admin API, its answer for a person.
pub async fn key_command(reset: bool, arguments: KeyArguments) -> ExitCode {
    let Some((admin, token)) = arguments.target.resolve() else {
        return ExitCode::FAILURE;
    };
    let url = key_url(&admin, &arguments);
    let method = if reset {
        http::Method::DELETE
    } else {
        http::Method::GET
    };
    let timeout = std::time::Duration::from_secs(5);
    let answer = super::call(method, &url, token.as_deref(), None, timeout).await;
    let code = report_key_answer(&arguments, &url, answer);
    if reset && code == ExitCode::SUCCESS {
        // What may still refuse the key: the other limits of its routes, read after the reset.
        let state = super::call(http::Method::GET, &url, token.as_deref(), None, timeout).await;
        if let Ok((200, body)) = state {
            let state: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            print_other_limits(&state, &arguments.keys.join(" + "));
        }
    }
    code
}

/// The other limits of the routes that apply the key's limit: the key's state in each keyed
/// the same way, else how each is keyed (a route may still refuse the key by one of them).
fn print_other_limits(state: &serde_json::Value, shown: &str) {
    for other in state["other_limits"].as_array().into_iter().flatten() {
        let (route, limit) = (
            other["route"].as_str().unwrap_or_default(),
            other["limit"].as_str().unwrap_or_default(),
        );
        let what = if other["tokens"].is_null() {
            format!(
                "keyed by {}: inspect it with --limit {limit} --key <that value>",
                other["key"].as_str().unwrap_or_default()
            )
        } else {
            format!("[{shown}]: {}", key_state(other))
        };
        println!("  route {route} also applies {limit} {what}");
    }
}

/// `/limits/NAME?key=…&tier=…` on the admin listener at `admin`.
fn key_url(admin: &str, arguments: &KeyArguments) -> String {
    let mut query = form_urlencoded::Serializer::new(String::new());
    for value in &arguments.keys {
        query.append_pair("key", value);
    }
    if let Some(tier) = &arguments.tier {
        query.append_pair("tier", tier);
    }
    format!("{admin}/limits/{}?{}", arguments.limit, query.finish())
}

/// Prints what the admin listener answered to `inspect` or `reset`, in a line for people.
fn report_key_answer(
    arguments: &KeyArguments,
    url: &str,
    answer: Result<(u16, String), super::CallError>,
) -> ExitCode {
    let shown = arguments.keys.join(" + ");
    match answer {
        Ok((204, _)) => {
            println!(
                "{} [{shown}]: reset, the bucket is full again",
                arguments.limit
            );
            ExitCode::SUCCESS
        }
        Ok((200, body)) => {
            let state: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            println!("{} [{shown}]: {}", arguments.limit, key_state(&state));
            print_other_limits(&state, &shown);
            ExitCode::SUCCESS
        }
        Ok((status, body)) => {
            let detail: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            let what = match status {
                401 => "the admin token is missing or wrong (it comes from the policy's [admin] token_env)".to_owned(),
                404 => format!("no limit named {:?}", arguments.limit),
                _ => detail["detail"].as_str().or(detail["error"].as_str()).unwrap_or(&body).to_owned(),
            };
            eprintln!("tollgate: {url}: {status}: {what}");
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("tollgate: {error}");
            ExitCode::FAILURE
        }
    }
}

/// A key's state as `/limits` gives it: tokens left, when a quota's period ends, a penalty, a
/// ban.
fn key_state(state: &serde_json::Value) -> String {
    let number = |name: &str| state[name].as_f64().unwrap_or(0.0);
    let mut line = format!(
        "{} of {} tokens left",
        number("tokens").max(0.0).floor(),
        number("capacity")
    );
    if let Some(resets_in) = state["resets_in"].as_f64() {
        line.push_str(&format!(
            ", the period ends in {}",
            humantime::format_duration(std::time::Duration::from_secs(resets_in.ceil() as u64))
        ));
    }
    if let Some(factor) = state["penalty"]["factor"].as_f64() {
        let until = state["penalty"]["until_unix"].as_f64().unwrap_or(0.0);
        let until = std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(until.max(0.0));
        line.push_str(&format!(
            ", penalised ×{factor} until {}",
            humantime::format_rfc3339_seconds(until)
        ));
    }
    if let Some(until) = state["banned_until_unix"].as_f64() {
        let until = std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(until.max(0.0));
        line.push_str(&format!(
            ", banned until {}",
            humantime::format_rfc3339_seconds(until)
        ));
    }
    line
}

/// `tollgate override set|list|delete`.
#[derive(clap::Subcommand, Debug, Clone)]
pub enum OverrideCommand {
    /// Set one key's numbers (those left out stay the limit's own), replacing its override.
    Set(OverrideSet),
    /// List the overrides in force, soonest to end first.
    List(AdminTarget),
    /// Delete one key's override: its limit's own numbers apply again.
    Delete(OverrideKey),
}

/// The key an override is of.
#[derive(clap::Args, Debug, Clone)]
pub struct OverrideKey {
    /// The limit's name.
    #[arg(long)]
    pub limit: String,
    /// The key's value as a request carries it; once per part of a composite key, in order.
    #[arg(long = "key", value_name = "VALUE")]
    pub keys: Vec<String>,
    #[command(flatten)]
    pub target: AdminTarget,
}

#[derive(clap::Args, Debug, Clone)]
pub struct OverrideSet {
    #[command(flatten)]
    pub key: OverrideKey,
    /// A token bucket's capacity.
    #[arg(long)]
    pub capacity: Option<f64>,
    /// A token bucket's rate, as the policy writes rates ("500/s").
    #[arg(long)]
    pub rate: Option<String>,
    /// A calendar quota's quota.
    #[arg(long)]
    pub quota: Option<f64>,
    /// A concurrency limit's requests in flight.
    #[arg(long)]
    pub concurrency: Option<u32>,
    /// The limit does not apply to this key.
    #[arg(long)]
    pub exempt: bool,
    /// How long it lasts ("12h", "7d"); default: until deleted, or [overrides] max_ttl.
    #[arg(long)]
    pub ttl: Option<String>,
    /// Why, shown in lists and logs.
    #[arg(long)]
    pub reason: Option<String>,
    /// A short name, shown in lists and logs.
    #[arg(long)]
    pub label: Option<String>,
}

impl OverrideSet {
    /// The body of the `PUT`: only what was given.
    fn body(&self) -> String {
        let mut body = serde_json::Map::new();
        let mut put = |name: &str, value: Option<serde_json::Value>| {
            if let Some(value) = value {
                body.insert(name.to_owned(), value);
            }
        };
        put("capacity", self.capacity.map(Into::into));
        put("rate", self.rate.clone().map(Into::into));
        put("quota", self.quota.map(Into::into));
        put("concurrency", self.concurrency.map(Into::into));
        put("exempt", self.exempt.then_some(true.into()));
        put("ttl", self.ttl.clone().map(Into::into));
        put("reason", self.reason.clone().map(Into::into));
        put("label", self.label.clone().map(Into::into));
        serde_json::Value::Object(body).to_string()
    }
}

/// `tollgate override …`: one call to `/overrides`, its answer for a person.
pub async fn override_command(command: OverrideCommand) -> ExitCode {
    let target = match &command {
        OverrideCommand::Set(set) => &set.key.target,
        OverrideCommand::List(target) => target,
        OverrideCommand::Delete(key) => &key.target,
    };
    let Some((admin, token)) = target.resolve() else {
        return ExitCode::FAILURE;
    };
    let key_url = |key: &OverrideKey| {
        let mut query = form_urlencoded::Serializer::new(String::new());
        for value in &key.keys {
            query.append_pair("key", value);
        }
        format!("{admin}/overrides/{}?{}", key.limit, query.finish())
    };
    let (method, url, body) = match &command {
        OverrideCommand::Set(set) => (http::Method::PUT, key_url(&set.key), Some(set.body())),
        OverrideCommand::List(_) => (http::Method::GET, format!("{admin}/overrides"), None),
        OverrideCommand::Delete(key) => (http::Method::DELETE, key_url(key), None),
    };
    let timeout = std::time::Duration::from_secs(5);
    let answer = super::call(method, &url, token.as_deref(), body, timeout).await;
    match answer {
        Ok((204, _)) => {
            println!("override deleted: the limit's own numbers apply again");
            ExitCode::SUCCESS
        }
        Ok((200, body)) => {
            let answer: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            match answer["overrides"].as_array() {
                Some(listed) if listed.is_empty() => println!("no overrides"),
                Some(listed) => listed
                    .iter()
                    .for_each(|entry| println!("{}", override_line(entry))),
                None => println!("{}", override_line(&answer)),
            }
            ExitCode::SUCCESS
        }
        Ok((status, body)) => {
            let detail: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            let what = match status {
                401 => "the admin token is missing or wrong (it comes from the policy's [admin] token_env)".to_owned(),
                _ => detail["detail"].as_str().or(detail["error"].as_str()).unwrap_or(&body).to_owned(),
            };
            eprintln!("tollgate: {url}: {status}: {what}");
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("tollgate: {error}");
            ExitCode::FAILURE
        }
    }
}

/// One override in a line: `per_org h:3f9a…: capacity 5000, 500/s until … (acme: ACME launch)`.
fn override_line(entry: &serde_json::Value) -> String {
    let text = |name: &str| entry[name].as_str().unwrap_or_default().to_owned();
    let mut numbers = Vec::new();
    if entry["exempt"].as_bool() == Some(true) {
        numbers.push("exempt".to_owned());
    }
    for (name, shown) in [
        ("capacity", "capacity"),
        ("quota", "quota"),
        ("concurrency", "concurrency"),
    ] {
        if let Some(number) = entry[name].as_f64() {
            numbers.push(format!("{shown} {number}"));
        }
    }
    if let Some(rate) = entry["rate_per_second"].as_f64() {
        numbers.push(format!("{rate}/s"));
    }
    let mut line = format!("{} {}: {}", text("limit"), text("key"), numbers.join(", "));
    match entry["expires_unix"].as_u64() {
        Some(expires) => {
            let until = std::time::UNIX_EPOCH + std::time::Duration::from_secs(expires);
            line.push_str(&format!(
                " until {}",
                humantime::format_rfc3339_seconds(until)
            ));
        }
        None => line.push_str(" until deleted"),
    }
    let notes: Vec<String> = ["label", "reason"]
        .into_iter()
        .map(text)
        .filter(|note| !note.is_empty())
        .collect();
    if !notes.is_empty() {
        line.push_str(&format!(" ({})", notes.join(": ")));
    }
    line
}
