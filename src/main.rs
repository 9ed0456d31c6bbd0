//! The `tollgate` command: run, check, demo.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
use tollgate::admin::commands::{self, KeyArguments};
use tollgate::admin::top_command;
use tollgate::config::{self, Policy};
use tollgate::{demo, Options, Tollgate};
use tracing_subscriber::EnvFilter;

#[derive(Parser)]
#[command(
    name = "tollgate",
    version,
    about = "A reverse-proxy gateway with rate limits that actually hold"
)]
struct Cli {
    /// Log format on stderr.
    #[arg(long, value_enum, global = true, default_value = "text")]
    log_format: LogFormat,
    /// Threads serving requests (default: one per core).
    #[arg(long, global = true, env = "TOLLGATE_WORKER_THREADS", value_name = "N")]
    worker_threads: Option<std::num::NonZeroUsize>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the policy in FILE (default: $TOLLGATE_CONFIG, then config/tollgate.toml).
    Run {
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Validate FILE and print the compiled policy; exit 0 if valid, 1 if not.
    Check {
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Ask a running gateway's admin listener whether it is healthy (for container health
    /// checks): exit 0 if /healthz answers 200 within two seconds, 1 otherwise.
    Health {
        /// The admin listener's /healthz (or /readyz); default: /healthz on the policy's
        /// [admin] listen.
        #[arg(long)]
        url: Option<String>,
        /// The policy to read the admin address from (default: $TOLLGATE_CONFIG, then
        /// config/tollgate.toml).
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
    },
    /// Show one key's state in a limit, from a running gateway's admin API.
    Inspect(KeyArguments),
    /// Reset one key of a limit (its bucket full again, its penalty gone), for every replica
    /// sharing a Redis store.
    Reset(KeyArguments),
    /// Change one key's numbers in a limit while the gateway runs (for every replica sharing
    /// a Redis store), list the overrides, or delete one.
    #[command(subcommand)]
    Override(commands::OverrideCommand),
    /// Whom a running gateway stops now: each route's requests by outcome, then each limit's
    /// top keys (the fleet's, with Redis), refreshed every second until q; --once prints one
    /// table and exits.
    Top(top_command::TopArguments),
    /// Decide logged traffic (tollgate's JSON access log; gzip and `-` for stdin too) against a
    /// policy, with the log's clock, and report what it would refuse. Exit 0 when it ran, 1
    /// when no line could be read, 2 for a bad policy.
    Replay {
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// The log format: json (tollgate's access log), combined (nginx/Apache), caddy,
        /// traefik, nginx:'LOG_FORMAT' (an nginx log_format string), or auto (told by each
        /// file's first line).
        #[arg(long, default_value = "auto", value_parser = tollgate::replay::Format::parse)]
        format: tollgate::replay::Format,
        /// The report as JSON.
        #[arg(long)]
        json: bool,
        /// Also write the report, with a chart per limit, as one self-contained HTML file.
        #[arg(long, value_name = "FILE.html")]
        report: Option<PathBuf>,
        /// Decide the same log against this policy too, and report both side by side with
        /// the keys one refuses and the other admits.
        #[arg(long, value_name = "OTHER.toml")]
        compare: Option<PathBuf>,
        /// Log files, read as one log in any order of time (`-`: standard input;
        /// gzip-compressed files too).
        #[arg(required = true, value_name = "LOG")]
        logs: Vec<String>,
    },
    /// Run the gateway in front of a built-in echo upstream, with a demo policy.
    Demo {
        /// Public address of the demo gateway.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
        /// Admin address (/metrics, /healthz, /readyz).
        #[arg(long, default_value = "127.0.0.1:9090")]
        admin: SocketAddr,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging(cli.log_format);
    // One thread needs no work stealing: the single-threaded scheduler does less per task.
    let mut builder = match cli.worker_threads.map(std::num::NonZeroUsize::get) {
        Some(1) => tokio::runtime::Builder::new_current_thread(),
        Some(threads) => {
            let mut builder = tokio::runtime::Builder::new_multi_thread();
            builder.worker_threads(threads);
            builder
        }
        None => tokio::runtime::Builder::new_multi_thread(),
    };
    let runtime = match builder.enable_all().build() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("tollgate: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Check { config } => Ok(check(&config.unwrap_or_else(config::default_path))),
            Command::Run { config } => {
                run(config.unwrap_or_else(config::default_path), cli.log_format).await
            }
            Command::Demo { listen, admin } => demo(listen, admin).await,
            Command::Health { url, config } => Ok(health(url, config).await),
            Command::Replay {
                config,
                format,
                json,
                report,
                compare,
                logs,
            } => Ok(replay(
                config,
                ReplayOutput {
                    format,
                    json,
                    html: report,
                    compare,
                },
                &logs,
            )),
            Command::Inspect(arguments) => Ok(commands::key_command(false, arguments).await),
            Command::Reset(arguments) => Ok(commands::key_command(true, arguments).await),
            Command::Override(command) => Ok(commands::override_command(command).await),
            Command::Top(arguments) => Ok(top_command::top_command(arguments).await),
        }
    });
    match result {
        Ok(code) => code,
        Err(error) => {
            tracing::error!("{error:#}");
            ExitCode::FAILURE
        }
    }
}

fn init_logging(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Colours only for a person at a terminal, never into files and pipes.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .init(),
    }
}

fn check(path: &std::path::Path) -> ExitCode {
    match Policy::load(path) {
        Ok(policy) => {
            println!("{}: valid\n", path.display());
            print!("{}", policy.summary());
            ExitCode::SUCCESS
        }
        Err(errors) => {
            eprintln!("{errors}");
            eprintln!("{}: invalid ({} error(s))", path.display(), errors.0.len());
            ExitCode::FAILURE
        }
    }
}

async fn run(path: PathBuf, log_format: LogFormat) -> anyhow::Result<ExitCode> {
    let policy = match Policy::load(&path) {
        Ok(policy) => policy,
        Err(errors) => {
            match log_format {
                // Every stderr line stays one JSON object.
                LogFormat::Json => tracing::error!(
                    file = %path.display(),
                    errors = %errors,
                    "invalid policy, not starting"
                ),
                LogFormat::Text => {
                    eprintln!("{errors}");
                    eprintln!("{}: invalid, not starting", path.display());
                }
            }
            return Ok(ExitCode::FAILURE);
        }
    };
    let options = Options {
        config_path: Some(path),
        ..Options::default()
    };
    let gateway = Arc::new(Tollgate::start(policy, options).await?);
    gateway.watch_config_file();
    serve_until_signal(&gateway).await
}

async fn demo(listen: SocketAddr, admin: SocketAddr) -> anyhow::Result<ExitCode> {
    let upstream = demo::start_echo_upstream("127.0.0.1:0".parse()?)
        .await
        .context("cannot start the demo upstream")?;
    let text = demo::policy_text(listen, admin, upstream);
    let policy =
        Policy::parse("demo policy", &text).map_err(|errors| anyhow::anyhow!("{errors}"))?;
    let gateway = Arc::new(
        Tollgate::start(policy, Options::default())
            .await
            .context("cannot start the demo gateway (is the port taken? try --listen 127.0.0.1:8081 --admin 127.0.0.1:9091)")?,
    );
    println!(
        "{}",
        demo::instructions(gateway.addresses[0], gateway.admin_address)
    );
    serve_until_signal(&gateway).await
}

async fn health(url: Option<String>, config: Option<PathBuf>) -> ExitCode {
    let url = match url {
        Some(url) => url,
        None => match admin_url(config) {
            Ok(admin) => format!("{admin}/healthz"),
            Err(message) => {
                eprintln!("tollgate: {message}");
                return ExitCode::FAILURE;
            }
        },
    };
    let answer = tollgate::admin::call(
        http::Method::GET,
        &url,
        None,
        None,
        std::time::Duration::from_secs(2),
    )
    .await;
    match answer {
        Ok((200, _)) => {
            println!("{url}: 200, healthy");
            ExitCode::SUCCESS
        }
        Ok((status, _)) => {
            eprintln!("tollgate: {url} answered {status}, not 200: not healthy");
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("tollgate: {error}");
            ExitCode::FAILURE
        }
    }
}

/// `http://host:port` of the admin listener the policy names (the loopback address where it
/// listens on every address).
fn admin_url(config: Option<PathBuf>) -> Result<String, String> {
    let path = config.unwrap_or_else(config::default_path);
    let policy = Policy::load(&path).map_err(|errors| {
        format!(
            "cannot read the admin address from {}: {errors}\n(pass --url, or --config with the gateway's policy)",
            path.display()
        )
    })?;
    Ok(tollgate::admin::local_url(policy.admin.listen))
}

/// How `tollgate replay` reads its logs and what it writes.
struct ReplayOutput {
    format: tollgate::replay::Format,
    json: bool,
    html: Option<PathBuf>,
    compare: Option<PathBuf>,
}

fn replay(config: Option<PathBuf>, output: ReplayOutput, logs: &[String]) -> ExitCode {
    let load = |path: &PathBuf| {
        Policy::load(path).map_err(|errors| {
            eprintln!("{errors}");
            ExitCode::from(2)
        })
    };
    let path = config.unwrap_or_else(config::default_path);
    let policy = match load(&path) {
        Ok(policy) => policy,
        Err(code) => return code,
    };
    let other_policy = match output.compare.as_ref().map(load).transpose() {
        Ok(other) => other,
        Err(code) => return code,
    };
    let mut replay = tollgate::replay::Replay::new(&policy);
    let mut other = other_policy.as_ref().map(tollgate::replay::Replay::new);
    let read = tollgate::replay::read_lines(logs, &output.format, |number, line| match line {
        Ok(line) => {
            replay.decide(&line);
            if let Some(other) = &mut other {
                other.decide(&line);
            }
        }
        Err(why) => replay.bad_line(number, why),
    });
    if let Err(error) = read {
        eprintln!("tollgate: {error}");
        return ExitCode::FAILURE;
    }
    let report = replay.report();
    let comparison = other.zip(output.compare.as_ref()).map(|(other, path)| {
        tollgate::replay::Comparison::new(&report, &other.report(), &path.display().to_string())
    });
    if let Some(html) = &output.html {
        let page = report.to_html(&path.display().to_string(), comparison.as_ref());
        if let Err(error) = std::fs::write(html, page) {
            eprintln!("tollgate: cannot write {}: {error}", html.display());
            return ExitCode::FAILURE;
        }
    }
    if output.json {
        let mut json = report.to_json();
        if let Some(comparison) = &comparison {
            json["compare"] = comparison.to_json();
        }
        println!("{json}");
    } else {
        print!("{}", report.to_text());
        if let Some(comparison) = &comparison {
            print!("{}", comparison.to_text());
        }
    }
    if report.lines == 0 {
        eprintln!(
            "tollgate: no request could be read from {}",
            logs.join(", ")
        );
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// SIGHUP reloads; SIGTERM and SIGINT drain and exit 0.
async fn serve_until_signal(gateway: &Tollgate) -> anyhow::Result<ExitCode> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hangup = signal(SignalKind::hangup())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    loop {
        tokio::select! {
            _ = hangup.recv() => {
                tracing::info!("SIGHUP: reloading the policy");
                let _ = gateway.reload_from_file();
            }
            _ = terminate.recv() => break,
            _ = interrupt.recv() => break,
        }
    }
    gateway.shutdown().await;
    Ok(ExitCode::SUCCESS)
}
