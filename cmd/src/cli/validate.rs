//! `tether validate`: the config checked as `run` would check it, and
//! what it means, in words.

use std::fmt::Write as _;
use std::process::ExitCode;

use tether_probes::Identity;

use super::{RunArgs, load_with_remotes};
use crate::config::remote::{self, ResolvedRemote};
use crate::human;
use crate::stdout;

pub(super) fn gate(required: bool) -> &'static str {
    if required { "required" } else { "optional" }
}

/// `tether validate`: what the config means, checked as `run` would.
pub(super) async fn run(args: &RunArgs) -> ExitCode {
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
    write_discovery(&mut out, &config.discovery);
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

/// Where remotes are discovered, and the home cluster that holds them.
fn write_discovery(out: &mut String, sources: &[crate::config::DiscoverySpec]) {
    let Some(first) = sources.first() else {
        return;
    };
    let home = first.kubeconfig.as_ref().map_or_else(
        || "in-cluster in a pod, else the current kubeconfig context".to_owned(),
        |path| format!("kubeconfig {}", path.display()),
    );
    let _ = writeln!(
        out,
        "discovery: remotes from the home cluster's Secrets ({home}, probed as the remote {:?}), listed and watched:",
        crate::config::discovery::HOME
    );
    for source in sources {
        let _ = writeln!(
            out,
            "  {} Secrets in namespace {} labelled {} ({})",
            source.format,
            source.namespace,
            source.selector(),
            gate(source.required)
        );
    }
}

/// The Lease (or, with sharding, the Leases) this configuration keeps, and
/// on which cluster.
fn write_leases(
    out: &mut String,
    spec: &crate::config::LeaderElectionSpec,
    sharding: Option<&crate::config::ShardingSpec>,
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
fn write_exec(out: &mut String, exec: &crate::config::ExecSpec) {
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
    if let Some(socket) = &exec.launcher {
        let _ = writeln!(
            out,
            "  started in another container by `tether launcher --socket {}`, which finds the program there",
            socket.display()
        );
    }
    if let Some(account) = &exec.service_account {
        let _ = writeln!(
            out,
            "  KUBECONFIG: the home cluster as ServiceAccount {}/{}, whose tokens tether requests ({} each, replaced at 80%)",
            account
                .namespace
                .as_deref()
                .unwrap_or("<tether's namespace>"),
            account.name,
            human::exact(account.expiration)
        );
    }
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
        "  a cycle's end sends {} to the group, then SIGKILL after {}; the loss of a required remote ends the cycle",
        exec.stop_signal,
        human::exact(exec.grace_period)
    );
    let _ = if exec.follows_remotes_file {
        writeln!(
            out,
            "  an optional remote lost, or a remote added, removed or read anew, is told in TETHER_REMOTES_FILE, with no restart"
        )
    } else {
        writeln!(
            out,
            "  an optional remote lost restarts the process without it, and it is put back after {} reachable",
            human::exact(exec.put_back_after)
        )
    };
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
