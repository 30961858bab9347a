//! The whole-process scale and speed harness: `tether run` (the release
//! binary) against simulated remotes held in this process.
//!
//! ```text
//! cargo build --release -p tether
//! cargo run --release -p tether-tests --bin scale -- --remotes 1000 --blackbox
//! cargo run --release -p tether-tests --bin scale -- --remotes 10000
//! cargo run --release -p tether-tests --bin scale -- --detection 20
//! cargo run --release -p tether-tests --bin scale -- --detection 20 --apiservers real
//! cargo run --release -p tether-tests --bin scale -- --discovery 10000
//! cargo run --release -p tether-tests --bin scale -- --discovery 10000 --remotes 10000 --discovery-shares
//! cargo run --release -p tether-tests --bin scale -- --fleet-controller 200
//! ```
//!
//! It prints a table and writes the same figures as JSON (`--json`,
//! default `target/scale/<mode>.json`). It runs the release `tether` next to
//! it, or the one `TETHER_BINARY` names.
//!
//! - `process.rs`: child processes, and what `/proc` and their logs say;
//! - `remotes.rs`: the simulated remotes, and tether's config over them;
//! - `load.rs`: N remotes' load (`--remotes`), and `--blackbox`;
//! - `blackbox.rs`: `blackbox_exporter` and Prometheus beside tether;
//! - `callgrind.rs`: instruction counts (`--callgrind`);
//! - `reload.rs`: a reload adding remotes (`--reload-add`);
//! - `shards.rs`: several replicas sharing the remotes (`--replicas`);
//! - `discovery.rs`: remotes from a real home cluster's Secrets
//!   (`--discovery`);
//! - `detection.rs`: detection and rebuild latency (`--detection`);
//! - `fleet.rs`: the mirror controller on tether's Go package over a fleet,
//!   one remote lost (`--fleet-controller`).

// A benchmark measures wall-clock time; no paused clock here.
#![allow(clippy::disallowed_methods)]
// One harness in rooms that share one namespace: each module uses the
// others' items through `crate::*`.
#![allow(clippy::wildcard_imports)]

mod blackbox;
mod callgrind;
mod detection;
mod discovery;
mod fleet;
mod load;
mod process;
mod reload;
mod remotes;
mod shards;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use clap::Parser;
use serde_json::{Value, json};
use tether_testkit::{ApiServer, ControlPlane, Fault, Options, RealOptions, procfs};

use crate::blackbox::*;
use crate::callgrind::*;
use crate::detection::*;
use crate::discovery::*;
use crate::fleet::*;
use crate::load::*;
use crate::process::*;
use crate::reload::*;
use crate::remotes::*;
use crate::shards::*;

/// Whole-process figures of tether, optionally beside `blackbox_exporter` and
/// Prometheus probing the same remotes.
#[derive(Debug, Parser)]
struct Args {
    /// Simulated remotes (HTTPS, a CA and a token each) to probe.
    #[arg(long, default_value_t = 0)]
    remotes: usize,
    /// Probe interval of the scale run.
    #[arg(long, default_value = "10s", value_parser = tether_testkit::parse_duration)]
    interval: Duration,
    /// How long to measure once every remote is reachable.
    #[arg(long, default_value = "120s", value_parser = tether_testkit::parse_duration)]
    measure: Duration,
    /// Also run Debian's prometheus-blackbox-exporter and Prometheus against
    /// the same remotes, and compare.
    #[arg(long)]
    blackbox: bool,
    /// Detection trials per fault (refuse, hang) in the side-by-side run.
    #[arg(long, default_value_t = 5)]
    blackbox_trials: usize,
    /// Instead of a scale run: this many detection and rebuild trials per
    /// fault against three remotes (interval 1s, threshold 3, timeout 500ms).
    #[arg(long)]
    detection: Option<usize>,
    /// The remotes: simulated, or (with `--detection` only) real
    /// kube-apiservers and etcd built by `scripts/peers`, where `refuse`
    /// kills the apiserver and restarts it and `hang` stops it (SIGSTOP).
    #[arg(long, value_enum, default_value = "simulated")]
    apiservers: Apiservers,
    /// The built-in manager's watch list: `default` (Namespaces on every
    /// remote) or `none` (`watch: []`: probes only, as blackbox does).
    #[arg(long, default_value = "default")]
    watch: String,
    /// Configure this many of the remotes only after the measurement, by a
    /// reload (SIGHUP), and time the probes already running across it.
    #[arg(long, default_value_t = 0)]
    reload_add: usize,
    /// Run tether under callgrind, and count the instructions it runs while
    /// measuring (its wall-clock figures are then valgrind's); with
    /// `--discovery`, those of a change: the trials' window less a quiet one.
    #[arg(long)]
    callgrind: bool,
    /// With `--callgrind`: fail (exit 1, after the report) if a probe cost
    /// more instructions than this; `scripts/test` keeps the figure from
    /// sliding back by a count, not a timing.
    #[arg(long, requires = "callgrind")]
    most_instructions_a_probe: Option<f64>,
    /// With `--callgrind` and `--discovery`: fail (exit 1, after the
    /// report) if a discovery change cost more instructions than this.
    #[arg(long, requires_all = ["callgrind", "discovery"])]
    most_instructions_a_change: Option<f64>,
    /// Run tether under this command (`heaptrack -o FILE`), in a process
    /// group stopped with SIGTERM; its CPU and RSS are then the wrapper's.
    /// With `--replicas`, the first replica alone.
    #[arg(long)]
    wrap: Option<String>,
    /// Share the remotes among this many tether processes (sharding on
    /// Leases in one more simulated apiserver), and time a member's loss.
    #[arg(long, default_value_t = 1)]
    replicas: usize,
    /// Instead of a scale run: this many Secrets in one namespace of a real
    /// home cluster (`scripts/peers`), each a remote of its own, beside
    /// `--remotes` static ones; then 100 more, one at a time, each timed
    /// from its creation to its first probe.
    #[arg(long)]
    discovery: Option<usize>,
    /// With `--discovery`: each discovered remote shares a static one's
    /// apiserver (20,000 descriptors a process cannot hold 20,000
    /// apiservers' connections).
    #[arg(long, requires = "discovery")]
    discovery_shares: bool,
    /// With `--discovery`: how many Secrets are then created one at a
    /// time, each timed to its remote's first probe (and, with `--watch
    /// default`, to its cache synced).
    #[arg(long, default_value_t = 100, requires = "discovery")]
    discovery_trials: usize,
    /// Instead of a scale run: the mirror controller in its fleet mode
    /// (`tests/peers`, on tether's Go package) under the exec manager over
    /// this many optional remotes and a real home cluster; mirror latency
    /// while all answer and while one is lost, and the controller's starts.
    #[arg(long)]
    fleet_controller: Option<usize>,
    /// Where to write the JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// With `--replicas`: a folder to write each replica's log in
    /// (`shard-<i>.log`), once the run ends.
    #[arg(long, requires = "replicas")]
    logs: Option<PathBuf>,
    /// Internal: serve remotes `FROM..FROM+COUNT` into this folder.
    #[arg(long, hide = true, requires = "serve_count")]
    serve_dir: Option<PathBuf>,
    #[arg(long, hide = true, default_value_t = Ipv4Addr::LOCALHOST)]
    serve_address: Ipv4Addr,
    #[arg(long, hide = true, default_value_t = 0)]
    serve_from: usize,
    #[arg(long, hide = true)]
    serve_count: Option<usize>,
}

impl Args {
    /// `--wrap`'s command line, or none.
    fn wrapper(&self) -> Vec<String> {
        self.wrap
            .as_deref()
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    }
}

/// What serves the remotes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Apiservers {
    Simulated,
    Real,
}

/// Remotes per server process: each holds a listener and at least one
/// connection per remote, within the 20,000 descriptors a process may have.
const PER_PROCESS: usize = 2_500;

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("scale: {err}");
            ExitCode::FAILURE
        }
    }
}

type Result<T, E = String> = std::result::Result<T, E>;

fn run(args: &Args) -> Result<()> {
    if let (Some(dir), Some(count)) = (&args.serve_dir, args.serve_count) {
        return serve(
            dir,
            args.serve_address,
            args.serve_from,
            count,
            args.apiservers,
        );
    }
    if args.apiservers == Apiservers::Real && args.detection.is_none() {
        return Err("--apiservers real goes with --detection N".to_owned());
    }
    let (mode, report) = if let Some(trials) = args.detection {
        ("detection", detection(trials, args.apiservers)?)
    } else if let Some(count) = args.discovery {
        ("discovery", discovery(args, count)?)
    } else if let Some(count) = args.fleet_controller {
        ("fleet", fleet_controller(count)?)
    } else if args.remotes > 0 && args.replicas > 1 {
        ("shards", shards(args)?)
    } else if args.remotes > 0 {
        let mode = if args.blackbox { "blackbox" } else { "scale" };
        (mode, scale(args)?)
    } else {
        return Err("say --remotes N or --detection N".to_owned());
    };
    let file = if mode == "detection" && args.apiservers == Apiservers::Real {
        "detection-real.json".to_owned()
    } else if mode == "detection" {
        "detection.json".to_owned()
    } else if mode == "discovery" {
        format!(
            "discovery-{}-beside-{}{}.json",
            args.discovery.unwrap_or_default(),
            args.remotes,
            if args.discovery_shares { "-shared" } else { "" }
        )
    } else if mode == "fleet" {
        format!(
            "fleet-controller-{}.json",
            args.fleet_controller.unwrap_or_default()
        )
    } else if mode == "shards" {
        format!("shards-{}x{}.json", args.replicas, args.remotes)
    } else {
        format!("{mode}-{}-watch-{}.json", args.remotes, args.watch)
    };
    let path = args
        .json
        .clone()
        .unwrap_or_else(|| target_dir().join("scale").join(file));
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let mut report = report;
    report["machine"] = machine();
    report["date"] = json!(today());
    std::fs::write(&path, serde_json::to_string_pretty(&report).expect("JSON"))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    println!("JSON: {}", path.display());
    within(
        "a probe",
        &report["tether"]["instructions_per_probe"],
        args.most_instructions_a_probe,
    )?;
    within(
        "a discovery change",
        &report["instructions"]["a_change"],
        args.most_instructions_a_change,
    )
}

/// Whether `counted` instructions for `what` are within `most`, if a bound
/// is given.
fn within(what: &str, counted: &Value, most: Option<f64>) -> Result<()> {
    let Some(most) = most else {
        return Ok(());
    };
    let counted = counted.as_f64().ok_or("no instructions were counted")?;
    if counted > most {
        return Err(format!(
            "{what} cost {counted:.0} instructions, more than the {most:.0} allowed: \
             see docs/benchmarks.md for how to find where"
        ));
    }
    println!("instructions {what}: {counted:.0}, within {most:.0}");
    Ok(())
}

fn print_table(rows: &[(String, String)]) {
    let width = rows
        .iter()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0);
    println!();
    for (key, value) in rows {
        println!("{key:width$}  {value}");
    }
    println!();
}
