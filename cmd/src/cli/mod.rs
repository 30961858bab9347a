//! The command line: `run`, `validate`, `check`, `demo`, `install` and
//! `launcher`.
//!
//! - `validate.rs`: what a config means, checked as `run` would;
//! - `check.rs`: every remote probed once, and the Lease read;
//! - `demo.rs`: tether against three simulated remotes;
//! - here: the flags, the logs, and `run`.
//!
//! Exit codes: 0 success; 1 a failure at run time (`check` found an
//! unreachable remote); 2 bad input (configuration, flags), with nothing
//! started.

mod check;
#[cfg(feature = "demo")]
mod demo;
mod validate;

use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};

use crate::config::remote::{self, ResolvedRemote};
use crate::config::{Config, ConfigError};
use crate::daemon::{Daemon, Signals, StartError};
use crate::managers::exec;
use crate::stdout;

/// Keeps a multi-cluster Kubernetes controller attached to the remote
/// apiservers it watches.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// Log format: human-readable text, or JSON lines for pods.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the daemon. A command after `--` is run as the manager of each
    /// cycle (the exec manager).
    Run(RunArgs),
    /// Probe every remote once and print a table; exit 1 if any is
    /// unreachable or the Lease cannot be read, 2 for a config mistake.
    Check(CheckArgs),
    /// Check the configuration and print what it means.
    Validate(RunArgs),
    /// Run against three simulated remotes; lose one and bring it back.
    Demo(DemoArgs),
    /// Start the exec manager's process in this container when tether,
    /// in another container of the pod, asks (`manager.exec.launcher`):
    /// the controller runs without tether's credentials (see docs/exec.md).
    Launcher {
        /// The Unix socket to listen on, in a volume both containers mount.
        #[arg(long)]
        socket: PathBuf,
    },
    /// Copy this binary to PATH, for an init container that adds tether to
    /// another image (see docs/exec.md).
    Install {
        /// Where to put the binary, e.g. /tether/tether on a shared volume.
        path: PathBuf,
    },
}

#[derive(Debug, clap::Args)]
struct DemoArgs {
    /// The admin server's address. Default: a free port on 127.0.0.1 (the
    /// demo prints the URL), so it never clashes with a Prometheus or a
    /// tether already on 9090.
    #[arg(long, default_value = "127.0.0.1:0")]
    admin_address: std::net::SocketAddr,
    /// Stop by itself after this long (e.g. `40s`); default: at Ctrl-C.
    #[arg(long, value_parser = crate::config::parse_duration)]
    duration: Option<std::time::Duration>,
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// The exec manager's command and its arguments, after `--`: run as
    /// each cycle's manager, instead of the built-in watch manager.
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

#[derive(Debug, clap::Args)]
struct CheckArgs {
    #[command(flatten)]
    config: ConfigArgs,
    /// What to print: a table, or one JSON document.
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Json,
}

#[derive(Debug, clap::Args)]
struct ConfigArgs {
    /// The configuration file. Without one: defaults, and one remote from
    /// the in-cluster config or the current kubeconfig context.
    #[arg(long)]
    config: Option<PathBuf>,
}

/// The default log filter: tether at info, and kube's own reports of
/// trouble with a remote silenced, since tether reports what they say once,
/// classified, escaped and cut (`watch failing`, `remote apiserver
/// unreachable`):
/// - its client builder's trace layer logs every transport failure at
///   ERROR;
/// - its client logs a watch cut by a dying apiserver at WARN (`eof in
///   poll: ... peer closed connection without sending TLS close_notify:
///   https://docs.rs/...`), and a body it cannot decode at WARN, whole and
///   unescaped;
/// - its watcher logs each failed list or watch at WARN with the remote's
///   whole answer, a `Status` message of megabytes among them.
const DEFAULT_FILTER: &str =
    "info,kube_client::client=error,kube_client::client::builder=off,kube_runtime::watcher=off";

/// The demo narrates on stdout; its logs keep to errors unless `RUST_LOG`
/// says otherwise.
const DEMO_FILTER: &str =
    "error,kube_client::client=error,kube_client::client::builder=off,kube_runtime::watcher=off";

fn init_logs(format: LogFormat, default: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.with_ansi(std::io::stderr().is_terminal()).init(),
    }
}

/// The `tether` binary: every subcommand, and the exec manager's child.
#[must_use]
pub fn main() -> ExitCode {
    // As the exec manager's child, tether only asks to die with its parent
    // and becomes the command: no logs, no runtime.
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == exec::CHILD_SHIM) {
        return ExitCode::from(exec::become_child(&args[2..]));
    }
    let cli = Cli::parse();
    let default_filter = if matches!(cli.command, Command::Demo(_)) {
        DEMO_FILTER
    } else {
        DEFAULT_FILTER
    };
    init_logs(cli.log_format, default_filter);
    if let Some((from, to)) = crate::limits::raise_descriptor_limit() {
        tracing::info!(
            from,
            to,
            "raised the soft limit on open file descriptors to the hard limit"
        );
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("tether: cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let code = match cli.command {
        Command::Validate(args) => runtime.block_on(validate::run(&args)),
        Command::Check(args) => runtime.block_on(check::run(&args)),
        Command::Run(args) => runtime.block_on(run(&args)),
        Command::Demo(args) => runtime.block_on(demo(&args)),
        Command::Install { path } => install(&path),
        Command::Launcher { socket } => runtime.block_on(launcher(&socket)),
    };
    // A credential plugin that hangs keeps its blocking thread; dropping the
    // runtime would wait for it. Give the rest a moment, and leave it.
    runtime.shutdown_timeout(std::time::Duration::from_secs(1));
    code
}

/// The exit for a daemon that did not start; `address_flag` is how to
/// choose another admin address, for a clash.
fn start_failed(err: &StartError, address_flag: &str) -> ExitCode {
    match err {
        StartError::Config(err) => bad_input(err),
        StartError::Bind { addr, source } => {
            eprintln!(
                "tether: cannot listen on the admin address {addr}: {source}; choose another with {address_flag}"
            );
            ExitCode::from(2)
        }
        StartError::Setup { .. } => {
            eprintln!("tether: {}", tether_supervisor::error_chain(err));
            ExitCode::FAILURE
        }
    }
}

async fn run(args: &RunArgs) -> ExitCode {
    // Before anything slow: a SIGHUP during start must not end the process.
    let signals = match Signals::install() {
        Ok(signals) => signals,
        Err(err) => {
            eprintln!("tether: cannot install the signal handlers: {err}");
            return ExitCode::FAILURE;
        }
    };
    let config = match load(&args.config).and_then(|c| c.with_command(args.command.clone())) {
        Ok(config) => config,
        Err(err) => return bad_input(&err),
    };
    // As PID 1 in a container, orphans are ours to reap.
    crate::managers::reaper::start_if_init();
    match Daemon::start(config).await {
        Ok(daemon) => ExitCode::from(daemon.run_until_signalled(signals).await),
        Err(err) => start_failed(&err, "admin.address in the config"),
    }
}

async fn launcher(socket: &std::path::Path) -> ExitCode {
    // As PID 1 in the controller's container, orphans are ours to reap.
    crate::managers::reaper::start_if_init();
    match exec::serve_launcher(socket).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!(
                "tether launcher: cannot serve on {}: {err}",
                socket.display()
            );
            ExitCode::from(2)
        }
    }
}

#[cfg(feature = "demo")]
async fn demo(args: &DemoArgs) -> ExitCode {
    match demo::run(args.admin_address, args.duration).await {
        Ok(code) => ExitCode::from(code),
        Err(demo::DemoError::Start(err)) => start_failed(&err, "--admin-address"),
        Err(err) => {
            eprintln!("tether demo: {}", tether_supervisor::error_chain(&err));
            ExitCode::FAILURE
        }
    }
}

/// Without the simulated remotes, which come from the test kit, there is
/// no demo: the shipped image is built so.
#[cfg(not(feature = "demo"))]
#[allow(clippy::unused_async)] // the same signature as with the feature
async fn demo(args: &DemoArgs) -> ExitCode {
    let _ = (args.admin_address, args.duration);
    eprintln!(
        "tether: this build has no demo (it was built without the `demo` feature); run it from a clone with `cargo run --release -- demo`"
    );
    ExitCode::from(2)
}

/// Bad input: say what and where, exit 2.
fn bad_input(err: &ConfigError) -> ExitCode {
    eprintln!("tether: invalid configuration: {err}");
    ExitCode::from(2)
}

fn load(args: &ConfigArgs) -> Result<Config, ConfigError> {
    match &args.config {
        Some(path) => Config::load(path),
        None => Ok(Config::defaults()),
    }
}

/// `tether install PATH`: copies this binary to `PATH`, executable. An init
/// container from tether's image (which has no shell and no `cp`) runs it
/// to add tether to another image's container through a shared volume.
fn install(to: &std::path::Path) -> ExitCode {
    use std::os::unix::fs::PermissionsExt as _;
    let copied = std::env::current_exe().and_then(|me| {
        std::fs::copy(&me, to)?;
        std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o755))
    });
    match copied {
        Ok(()) => {
            stdout::write(&format!("tether: installed at {}\n", to.display()));
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("tether: cannot install at {}: {err}", to.display());
            ExitCode::FAILURE
        }
    }
}

/// The config, with the command given after `--`, and every remote's kube
/// config; or the exit for bad input.
async fn load_with_remotes(
    args: &ConfigArgs,
    command: &[String],
) -> Result<(Config, Vec<ResolvedRemote>), ExitCode> {
    let config = load(args)
        .and_then(|c| c.with_command(command.to_vec()))
        .map_err(|err| bad_input(&err))?;
    let remotes = remote::resolve(&config)
        .await
        .map_err(|err| bad_input(&err))?;
    // What `run` needs beyond the file: the Lease's client, the command.
    crate::daemon::preflight(&config)
        .await
        .map_err(|err| start_failed(&err, "admin.address in the config"))?;
    Ok((config, remotes))
}
