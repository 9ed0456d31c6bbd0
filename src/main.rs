//! The `tollgate` command: run, check, demo.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Parser, Subcommand, ValueEnum};
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
        /// The admin listener's /healthz (or /readyz).
        #[arg(long, default_value = "http://127.0.0.1:9090/healthz")]
        url: String,
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
            Command::Health { url } => Ok(health(&url).await),
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
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
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

async fn health(url: &str) -> ExitCode {
    match tollgate::admin::probe(url, std::time::Duration::from_secs(2)).await {
        Ok(status) if status == 200 => {
            println!("{url}: {status}");
            ExitCode::SUCCESS
        }
        Ok(status) => {
            eprintln!("{url}: {status}");
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("{url}: {error}");
            ExitCode::FAILURE
        }
    }
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
