//! `tether`: keeps a multi-cluster controller attached to the remote
//! apiservers it watches.
//!
//! Exit codes: 0 success; 1 a failure at run time (`check` found an
//! unreachable remote); 2 bad input (configuration, flags), with nothing
//! started.

use std::fmt::Write as _;
use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use tether_probes::{Identity, Outcome, ProbeResult};

use tether::config::{Config, ConfigError};
use tether::daemon::{Daemon, Signals, StartError};
use tether::human;
use tether::remote::{self, ResolvedRemote};
use tether::stdout;

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
    #[arg(long, value_parser = tether::config::parse_duration)]
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

fn main() -> ExitCode {
    // As the exec manager's child, tether only asks to die with its parent
    // and becomes the command: no logs, no runtime.
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == tether::exec::CHILD_SHIM) {
        return ExitCode::from(tether::exec::become_child(&args[2..]));
    }
    let cli = Cli::parse();
    let default_filter = if matches!(cli.command, Command::Demo(_)) {
        DEMO_FILTER
    } else {
        DEFAULT_FILTER
    };
    init_logs(cli.log_format, default_filter);
    if let Some((from, to)) = tether::limits::raise_descriptor_limit() {
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
        Command::Validate(args) => runtime.block_on(validate(&args)),
        Command::Check(args) => runtime.block_on(check(&args)),
        Command::Run(args) => runtime.block_on(run(&args)),
        Command::Demo(args) => runtime.block_on(demo(&args)),
        Command::Install { path } => install(&path),
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
    tether::reaper::start_if_init();
    match Daemon::start(config).await {
        Ok(daemon) => ExitCode::from(daemon.run_until_signalled(signals).await),
        Err(err) => start_failed(&err, "admin.address in the config"),
    }
}

async fn demo(args: &DemoArgs) -> ExitCode {
    match tether::demo::run(args.admin_address, args.duration).await {
        Ok(code) => ExitCode::from(code),
        Err(tether::demo::DemoError::Start(err)) => start_failed(&err, "--admin-address"),
        Err(err) => {
            eprintln!("tether demo: {}", tether_supervisor::error_chain(&err));
            ExitCode::FAILURE
        }
    }
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
    tether::daemon::preflight(&config)
        .await
        .map_err(|err| start_failed(&err, "admin.address in the config"))?;
    Ok((config, remotes))
}

fn gate(required: bool) -> &'static str {
    if required { "required" } else { "optional" }
}

async fn validate(args: &RunArgs) -> ExitCode {
    let (config, remotes) = match load_with_remotes(&args.config, &args.command).await {
        Ok(loaded) => loaded,
        Err(exit) => return exit,
    };
    let mut out = String::new();
    let _ = writeln!(out, "configuration: {} is valid", config.label());
    let _ = writeln!(out, "admin address: {}", config.admin_address);
    let p = &config.probe;
    let statuses = if p.unreachable_statuses.is_empty() {
        "none".to_owned()
    } else {
        let codes: Vec<String> = p.unreachable_statuses.iter().map(u16::to_string).collect();
        codes.join(", ")
    };
    let _ = writeln!(
        out,
        "probe: GET {} every {} ±{:.0}%, timeout {}, unreachable after {}, reachable after {}, unreachable statuses: {statuses}, a new connection at least every {}; a dead remote is found within {}",
        p.path,
        human::exact(p.interval),
        p.jitter * 100.0,
        human::exact(p.timeout),
        human::count(u64::from(p.failure_threshold), "failure", "failures"),
        human::count(u64::from(p.success_threshold), "success", "successes"),
        human::exact(p.max_connection_age),
        human::exact(p.detection_bound()),
    );
    let s = &config.supervisor;
    let _ = writeln!(
        out,
        "supervisor: backoff {}..{} ×{} ±{:.0}%, stable after {}, shutdown grace {}, rebuild on recovery: {}",
        human::exact(s.backoff.initial),
        human::exact(s.backoff.max),
        s.backoff.factor,
        s.backoff.jitter * 100.0,
        human::exact(s.stable_after),
        human::exact(s.shutdown_grace),
        if s.rebuild_on_recovery { "yes" } else { "no" },
    );
    let _ = writeln!(
        out,
        "remotes (required: gates /readyz, its loss ends the cycle; optional: its loss restarts only its own watches):"
    );
    let resolved: std::collections::BTreeMap<&str, &ResolvedRemote> =
        remotes.iter().map(|r| (r.name.as_str(), r)).collect();
    for spec in &config.remotes {
        let _ = writeln!(
            out,
            "  {} ({}): {}",
            spec.name,
            gate(spec.required),
            spec.source
        );
        let warnings = resolved
            .get(spec.name.as_str())
            .map(|r| remote::warnings(&r.config))
            .unwrap_or_default();
        for warning in warnings {
            let _ = writeln!(out, "    warning: {warning}");
        }
    }
    match &config.exec {
        Some(exec) => write_exec(&mut out, exec),
        None => {
            let _ = writeln!(out, "manager: the built-in watch manager, caching:");
        }
    }
    for watch in &config.watch {
        let scope = watch
            .namespace
            .as_deref()
            .map_or("all namespaces".to_owned(), |ns| format!("namespace {ns}"));
        let selector = watch
            .label_selector
            .as_deref()
            .map_or(String::new(), |l| format!(", labels {l}"));
        let _ = writeln!(
            out,
            "  {} {} ({scope}{selector})",
            watch.api_version, watch.kind
        );
    }
    if let Some(spec) = &config.leader_election {
        write_leases(&mut out, spec, config.sharding.as_ref());
    }
    if let Err(exit) = write_identities(&mut out, &remotes) {
        return exit;
    }
    stdout::write(&out);
    ExitCode::SUCCESS
}

/// The Lease (or, with sharding, the Leases) this configuration keeps, and
/// on which cluster.
fn write_leases(
    out: &mut String,
    spec: &tether::config::LeaderElectionSpec,
    sharding: Option<&tether::config::ShardingSpec>,
) {
    let cluster = spec.kubeconfig.as_ref().map_or_else(
        || "the pod's cluster (in-cluster), else the current kubeconfig context".to_owned(),
        |path| format!("the cluster of kubeconfig {}", path.display()),
    );
    let namespace = spec
        .lease_namespace
        .as_deref()
        .unwrap_or("the pod's namespace, else the kubeconfig's");
    let _ = match sharding {
        None => writeln!(
            out,
            "leader election: Lease {} in {namespace}, on {cluster}; held for {}, renewed within {}, tried every {}",
            spec.lease_name,
            human::exact(spec.lease_duration.duration()),
            human::exact(spec.renew_deadline),
            human::exact(spec.retry_period),
        ),
        Some(sharding) => writeln!(
            out,
            "sharding: a Lease per replica, named {}<identity>, in {namespace}, on {cluster}; each held for {}, renewed within {}",
            sharding.lease_prefix,
            human::exact(spec.lease_duration.duration()),
            human::exact(spec.renew_deadline),
        ),
    };
}

/// What the exec manager will run, and how it is stopped.
fn write_exec(out: &mut String, exec: &tether::config::ExecSpec) {
    let _ = writeln!(
        out,
        "manager: exec, a new process each cycle, in a process group of its own: {}",
        human::command(&exec.command)
    );
    for (name, _) in &exec.env {
        let _ = writeln!(out, "  env {name} (value not shown)");
    }
    if let Some(dir) = &exec.working_dir {
        let _ = writeln!(out, "  working directory {}", dir.display());
    }
    let _ = writeln!(out, "  TETHER_CYCLE=<the cycle number> in its environment");
    match &exec.readiness {
        Some(r) => {
            let _ = writeln!(
                out,
                "  up when GET http://127.0.0.1:{}{} answers 2xx (every {}, timeout {}); down after {} in a row",
                r.port,
                r.path,
                human::exact(r.period),
                human::exact(r.timeout),
                human::count(u64::from(r.failure_threshold), "failure", "failures"),
            );
        }
        None => {
            let _ = writeln!(out, "  up once started (no readiness check)");
        }
    }
    let _ = writeln!(
        out,
        "  a cycle's end sends {} to the group, then SIGKILL after {}; the loss of any remote ends the cycle",
        exec.stop_signal,
        human::exact(exec.grace_period)
    );
}

/// The probe identities and the names each one answers for.
fn write_identities(out: &mut String, remotes: &[ResolvedRemote]) -> Result<(), ExitCode> {
    let _ = writeln!(out, "probe identities (each probed once):");
    let mut identities: std::collections::BTreeMap<Identity, Vec<&str>> =
        std::collections::BTreeMap::new();
    for remote in remotes {
        match Identity::of(&remote.config) {
            Ok(identity) => identities.entry(identity).or_default().push(&remote.name),
            Err(err) => {
                eprintln!(
                    "tether: invalid configuration: remote {}: {err}",
                    remote.name
                );
                return Err(ExitCode::from(2));
            }
        }
    }
    for (identity, names) in identities {
        let tls = identity
            .tls_server_name
            .as_deref()
            .map_or(String::new(), |n| format!(", TLS name {n}"));
        let ca = if identity.ca_hash == 0 {
            String::new()
        } else {
            format!(", CA {:016x}", identity.ca_hash)
        };
        let cert = if identity.client_cert_hash == 0 {
            String::new()
        } else {
            format!(", client certificate {:016x}", identity.client_cert_hash)
        };
        let insecure = if identity.insecure {
            ", TLS verification OFF"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "  {}{tls}{ca}{cert}{insecure}: {}",
            identity.url,
            names.join(", ")
        );
    }
    Ok(())
}

fn describe(result: &ProbeResult) -> (&'static str, String) {
    match &result.outcome {
        Outcome::Reachable { status } => ("reachable", status.to_string()),
        Outcome::Unreachable { cause, error } => ("unreachable", format!("{cause}: {error}")),
        Outcome::LocalError { kind, error } => ("error", format!("local ({kind}): {error}")),
    }
}

async fn check(args: &CheckArgs) -> ExitCode {
    let (config, remotes) = match load_with_remotes(&args.config, &[]).await {
        Ok(loaded) => loaded,
        Err(exit) => return exit,
    };
    let rows = match tether_probes::check(&remote::probed(&remotes), &config.probe).await {
        Ok(rows) => rows,
        Err(err) => {
            eprintln!(
                "tether: invalid configuration: {}",
                tether_supervisor::error_chain(&err)
            );
            return ExitCode::from(2);
        }
    };
    let required: std::collections::BTreeSet<&str> = remotes
        .iter()
        .filter(|r| r.required)
        .map(|r| r.name.as_str())
        .collect();
    let election = match &config.leader_election {
        Some(spec) => Some(election_finding(spec).await),
        None => None,
    };
    let all_reachable = rows
        .iter()
        .all(|row| matches!(row.result.outcome, Outcome::Reachable { .. }));
    let election_ok = election.as_ref().is_none_or(|(_, ok)| *ok);
    let out = match args.output {
        Output::Table => check_table(&rows, &required, election.as_ref()),
        Output::Json => check_json(&rows, &required, election.as_ref()),
    };
    stdout::write(&out);
    if all_reachable && election_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `tether check`'s table: a row a remote, then the Lease's finding.
fn check_table(
    rows: &[tether_probes::CheckRow],
    required: &std::collections::BTreeSet<&str>,
    election: Option<&(String, bool)>,
) -> String {
    let width = rows.iter().map(|r| r.name.len()).max().unwrap_or(4).max(4);
    let host_width = rows.iter().map(|r| r.host.len()).max().unwrap_or(4).max(4);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:width$}  {:host_width$}  {:8}  {:11}  {:>9}  STATUS/CAUSE",
        "NAME", "HOST", "GATE", "STATE", "LATENCY"
    );
    for row in rows {
        let (state, detail) = describe(&row.result);
        let _ = writeln!(
            out,
            "{:width$}  {:host_width$}  {:8}  {state:11}  {:>7.1}ms  {detail}",
            row.name,
            row.host,
            gate(required.contains(row.name.as_str())),
            row.result.latency.as_secs_f64() * 1000.0
        );
    }
    if let Some((finding, _)) = election {
        let _ = writeln!(out, "leader election: {finding}");
    }
    out
}

/// `tether check -o json`: one document, the same findings as the table.
fn check_json(
    rows: &[tether_probes::CheckRow],
    required: &std::collections::BTreeSet<&str>,
    election: Option<&(String, bool)>,
) -> String {
    let remotes: Vec<serde_json::Value> = rows
        .iter()
        .map(|row| {
            let (state, detail) = describe(&row.result);
            serde_json::json!({
                "name": row.name,
                "host": row.host,
                "gate": gate(required.contains(row.name.as_str())),
                "state": state,
                "latencySeconds": row.result.latency.as_secs_f64(),
                "detail": detail,
            })
        })
        .collect();
    let election = election.map(|(finding, ok)| serde_json::json!({"finding": finding, "ok": ok}));
    let mut out = serde_json::json!({"remotes": remotes, "leaderElection": election}).to_string();
    out.push('\n');
    out
}

/// The Lease's holder, and this replica's role, as `tether check` shows
/// them; and whether the Lease could be read.
async fn election_finding(spec: &tether::config::LeaderElectionSpec) -> (String, bool) {
    let registry = prometheus::Registry::new();
    let election = match tether::lease::election::Election::new(spec.clone(), &registry).await {
        Ok(election) => election,
        Err(err) => return (tether_supervisor::error_chain(&err), false),
    };
    let lease = election.handle().state().lease;
    let me = election.identity().to_owned();
    match election.holder().await {
        Ok(None) => (
            format!(
                "Lease {lease} does not exist yet; the first replica creates it (this one: {me})"
            ),
            true,
        ),
        Ok(Some((holder, age))) if holder.is_empty() => (
            format!(
                "Lease {lease} is free{}; this replica ({me}) would take it",
                age.map(|a| format!(", released {}s ago", a.as_secs()))
                    .unwrap_or_default()
            ),
            true,
        ),
        Ok(Some((holder, age))) => (
            format!(
                "Lease {lease} held by {holder}{}; this replica ({me}) {}",
                age.map(|a| format!(", renewed {}s ago", a.as_secs()))
                    .unwrap_or_default(),
                if holder == me { "leads" } else { "stands by" }
            ),
            true,
        ),
        Err(err) => (format!("cannot read Lease {lease}: {err}"), false),
    }
}
