//! Remotes discovered from one namespace of a real home cluster
//! (`--discovery N`): N Secrets (multicluster-runtime's kubeconfig format),
//! each pointing at its own simulated remote, beside `--remotes` static
//! ones. With `--discovery-shares`, the Nth discovered remote shares the
//! Nth static one's apiserver (and so its probe): a process here may hold
//! 20,000 descriptors, fewer than 20,000 apiservers' connections need.

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::Api;
use kube::api::PostParams;

use crate::*;

/// The Secrets created at once before tether starts.
const IN_FLIGHT: usize = 32;

/// The Secret `name(i)`, for the apiserver of remote `server`: its
/// kubeconfig, with the CA and token inline.
fn secret_for(remotes: &Remotes, (i, server): (usize, usize)) -> Result<Secret> {
    let kubeconfig = std::fs::read_to_string(remotes.path(&format!("{}.kubeconfig", name(server))))
        .map_err(|e| e.to_string())?;
    serde_json::from_value(json!({
        "metadata": {
            "name": name(i),
            "labels": {"sigs.k8s.io/multicluster-runtime-kubeconfig": "true"},
        },
        "stringData": {"kubeconfig": kubeconfig},
    }))
    .map_err(|e| e.to_string())
}

/// A real home cluster, its kubeconfig written to `kubeconfig`, with a
/// Secret in `fleet` for each `(name, apiserver)` of `wanted`; and how long
/// creating them took.
fn home_with_secrets(
    runtime: &tokio::runtime::Runtime,
    remotes: &Remotes,
    kubeconfig: &Path,
    wanted: Vec<(usize, usize)>,
) -> Result<(ControlPlane, Api<Secret>, Duration)> {
    let home = runtime
        .block_on(ControlPlane::start(RealOptions::default().name("home")))
        .map_err(|e| format!("the home cluster: {e}"))?;
    home.kubeconfig()
        .write(kubeconfig)
        .map_err(|e| e.to_string())?;
    let client = runtime.block_on(async {
        let config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(kubeconfig).map_err(|e| e.to_string())?,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .map_err(|e| e.to_string())?;
        kube::Client::try_from(config).map_err(|e| e.to_string())
    })?;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "fleet");
    let created = Instant::now();
    runtime.block_on(async {
        let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": "fleet"}}))
            .map_err(|e| e.to_string())?;
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .map_err(|e| e.to_string())?;
        let made: Vec<Result<()>> = futures_util::stream::iter(wanted)
            .map(|(i, server)| {
                let secrets = secrets.clone();
                let secret = secret_for(remotes, (i, server));
                async move {
                    secrets
                        .create(&PostParams::default(), &secret?)
                        .await
                        .map(drop)
                        .map_err(|e| format!("Secret {i}: {e}"))
                }
            })
            .buffer_unordered(IN_FLIGHT)
            .collect()
            .await;
        made.into_iter().collect::<Result<Vec<()>>>().map(drop)
    })?;
    Ok((home, secrets, created.elapsed()))
}

/// What the built-in manager lists with `--watch default`.
const NAMESPACES: &str = "/api/v1/namespaces";

/// One series of tether's `/metrics` at `admin`.
fn metric(admin: &str, series: &str) -> Result<f64> {
    let (_, body, _) = http_get(admin, "/metrics")?;
    body.lines()
        .find_map(|l| {
            l.strip_prefix(series)?
                .strip_prefix(' ')?
                .trim()
                .parse()
                .ok()
        })
        .ok_or_else(|| format!("no {series} in /metrics"))
}

/// Creates the Secrets of `wanted` one at a time (each for an apiserver of
/// its own); for each, the milliseconds from its creation to its remote's
/// first probe, as tether logs it (within `patience`), and, when its
/// manager watches (tether's admin server at `watching`), to its cache
/// synced.
fn first_probes(
    tether: &mut Process,
    runtime: &tokio::runtime::Runtime,
    secrets: &Api<Secret>,
    remotes: &Remotes,
    wanted: Vec<(usize, usize)>,
    watching: Option<&str>,
    patience: Duration,
) -> Result<(Vec<f64>, Option<Vec<f64>>)> {
    let mut took = Vec::with_capacity(wanted.len());
    let mut synced = watching.map(|_| Vec::with_capacity(wanted.len()));
    for (i, server) in wanted {
        let secret = secret_for(remotes, (i, server))?;
        let at = now();
        runtime
            .block_on(secrets.create(&PostParams::default(), &secret))
            .map_err(|e| format!("Secret {i}: {e}"))?;
        let remote = name(i);
        let (probed, _) =
            tether.wait_event_within("remote apiserver reachable", patience, |when, f| {
                when >= at && names(f, &remote)
            })?;
        took.push((probed - at) * 1000.0);
        if let (Some(admin), Some(synced)) = (watching, synced.as_mut()) {
            let series =
                format!("tether_watch_synced{{remote=\"{remote}\",resource=\"namespaces\"}}");
            poll(
                "the new remote's cache synced",
                // Long enough for a tether that rebuilds every remote's
                // caches for one Secret, after its backoff, to be measured.
                Duration::from_secs(180),
                Duration::from_millis(5),
                || Ok((metric(admin, &series).ok() == Some(1.0)).then_some(())),
            )?;
            synced.push((now() - at) * 1000.0);
        }
    }
    Ok((took, synced))
}

/// The LISTs the first `servers` remotes served since they had served
/// `before`: the fleet's other remotes, while the Secrets came.
fn lists_since(remotes: &mut Remotes, before: &[u64], servers: usize) -> Result<u64> {
    Ok(before
        .iter()
        .zip(&remotes.lists(NAMESPACES)?)
        .take(servers)
        .map(|(before, after)| after - before)
        .sum())
}

/// tether's wrapper: under callgrind (`--callgrind`), uninstrumented until
/// the trials, as a start at 10,000 remotes is minutes of TLS handshakes
/// at callgrind's pace; else `--wrap`'s command, if any.
fn wrap(args: &Args, remotes: &Remotes) -> Vec<String> {
    if args.callgrind {
        callgrind_wrap(remotes, &["--instr-atstart=no"])
    } else {
        args.wrapper()
    }
}

/// Under callgrind, starts counting from now (when).
fn counting(args: &Args, tether: &Process) -> Result<Option<Instant>> {
    if !args.callgrind {
        return Ok(None);
    }
    callgrind_control(tether, "--instr=on")?;
    callgrind_control(tether, "-z")?;
    Ok(Some(Instant::now()))
}

/// What records one probe's result, called once a probe.
const A_PROBE: &str = "tether_probes::set::run::record";

/// A discovery change's instructions: callgrind's count over the trials'
/// window (from `start`), less its probes' part, over the trials.
///
/// - The probes' part is what a probe cost in a quiet window right after,
///   times the probes the trials' window ran, both counted by callgrind as
///   the calls of [`A_PROBE`]. Callgrind runs one thread at a time, so the
///   probes that wait out a change's work in the one window run in the
///   other. The quiet window is as long as the trials', and at least one
///   and a half probe intervals, since the probes tick together on a grid.
/// - Neither window reads `/metrics` (a read at 10,000 remotes is about 26
///   million instructions), but with `--watch default` the trials read
///   `tether_watch_synced`, and those reads are counted.
/// - What is left is the changes': each Secret's event, the merge, the
///   planner's value and what follows it, and its remote's first probe (a
///   TLS handshake).
fn per_change(tether: &Process, remotes: &Remotes, start: Instant, args: &Args) -> Result<Value> {
    let (interval, trials) = (args.interval, args.discovery_trials);
    let dir = target_dir().join("scale");
    let (trials_dump, quiet_dump) = (
        dir.join("callgrind-trials.out"),
        dir.join("callgrind-quiet.out"),
    );
    callgrind_control(tether, "-d")?;
    let length = start.elapsed();
    let changes = callgrind_instructions(remotes, &trials_dump)?;
    callgrind_control(tether, "-z")?;
    let quiet_for = length.max(interval * 3 / 2);
    std::thread::sleep(quiet_for);
    callgrind_control(tether, "-d")?;
    let quiet = callgrind_instructions(remotes, &quiet_dump)?;
    let (probes_trials, probes_quiet) = (
        callgrind_calls(&trials_dump, A_PROBE)?,
        callgrind_calls(&quiet_dump, A_PROBE)?,
    );
    if probes_quiet == 0 {
        return Err(format!(
            "the quiet window ({quiet_for:.1?}) ran no probe to count a probe's instructions by"
        ));
    }
    #[allow(clippy::cast_precision_loss)]
    let each = (changes as f64 - probes_trials as f64 * quiet as f64 / probes_quiet as f64)
        / trials as f64;
    Ok(json!({
        "window_seconds": length.as_secs_f64(),
        "quiet_window_seconds": quiet_for.as_secs_f64(),
        "trials_window": changes,
        "quiet_window": quiet,
        "probes_trials_window": probes_trials,
        "probes_quiet_window": probes_quiet,
        "a_change": each,
    }))
}

/// The head of tether's config: its admin address, probes, watch list
/// (`--watch`), and the one discovery source; and whether it watches.
fn head(args: &Args, admin: &str, home_kubeconfig: &Path) -> Result<(String, bool)> {
    let interval = args.interval.as_secs_f64();
    let watches = match args.watch.as_str() {
        "default" => true,
        "none" => false,
        other => return Err(format!("--watch {other}: say default or none")),
    };
    let head = format!(
        "admin: {{ address: \"{admin}\" }}\nprobe: {{ interval: {interval}s, timeout: {}s }}\nwatch: {}\ndiscovery:\n  - secrets: {{ namespace: fleet, format: kubeconfig, kubeconfig: {} }}\n",
        interval / 2.0,
        if watches {
            "[{ apiVersion: v1, kind: Namespace }]"
        } else {
            "[]"
        },
        home_kubeconfig.display()
    );
    Ok((head, watches))
}

pub(crate) fn discovery(args: &Args, count: usize) -> Result<Value> {
    let statics = args.remotes;
    let interval = args.interval.as_secs_f64();
    // Discovered remote `i` is named name(statics + i), and served by
    // apiserver `statics + i`, or `i` when it shares; the trials' come last.
    let servers = if args.discovery_shares {
        statics.max(count)
    } else {
        statics + count
    };
    let server_of = |i: usize| {
        if args.discovery_shares {
            i
        } else {
            statics + i
        }
    };
    eprintln!(
        "starting {} simulated remotes (HTTPS, token each) and a real home cluster",
        servers + args.discovery_trials
    );
    let trials = args.discovery_trials;
    let mut remotes = Remotes::start(servers + trials)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("tokio runtime: {e}"))?;
    let home_kubeconfig = remotes.path("home.kubeconfig");
    let listed = (0..count).map(|i| (statics + i, server_of(i))).collect();
    let (home, secrets, creating) =
        home_with_secrets(&runtime, &remotes, &home_kubeconfig, listed)?;
    eprintln!("{count} Secrets created in {creating:.1?}");

    let admin = format!("127.0.0.1:{}", tether_testkit::free_port());
    let (head, watches) = head(args, &admin, &home_kubeconfig)?;
    let config = tether_config_as(&remotes, statics, "tether.yaml", &head)?;
    let started_at = now();
    let mut tether = start_tether_under(&config, &wrap(args, &remotes))?;
    // Every static and discovered remote, and the home cluster.
    let warmup = until_all_reachable(&mut tether, &admin, statics + count + 1)?;
    let (listed_at, _) = tether.wait_event("tether started", |_, f| {
        f["discovered"].as_u64() == Some(count as u64)
    })?;
    eprintln!("tether: all reachable after {warmup:.1?}");
    std::thread::sleep(Duration::from_secs_f64(interval * 2.0));
    tether.alive()?;
    let (peak, rss) = (tether.kib("VmHWM"), tether.kib("VmRSS"));

    let trials = (0..trials)
        .map(|t| (statics + count + t, servers + t))
        .collect();
    let lists_before = remotes.lists(NAMESPACES)?;
    let cycle_before = metric(&admin, "tether_cycle")?;
    let window = counting(args, &tether)?;
    let (took, synced) = first_probes(
        &mut tether,
        &runtime,
        &secrets,
        &remotes,
        trials,
        watches.then_some(admin.as_str()),
        // Under callgrind, one change at 10,000 took a minute.
        Duration::from_secs(if args.callgrind { 600 } else { 30 }),
    )?;
    // Counted before anything reads tether's /metrics again.
    let instructions = window
        .map(|start| per_change(&tether, &remotes, start, args))
        .transpose()?;
    let relists = lists_since(&mut remotes, &lists_before, servers)?;
    let cycles = metric(&admin, "tether_cycle")? - cycle_before;
    let (peak_after, rss_after) = (tether.kib("VmHWM"), tether.kib("VmRSS"));
    let max = took.iter().copied().fold(0.0, f64::max);
    let med = median(&mut took.clone());
    let (scrape_median, _, size) = timed_gets(&admin, "/metrics")?;
    drop(tether);
    drop(home);
    let report = json!({
        "static_remotes": statics,
        "secrets": count,
        "apiservers": servers,
        "discovered_share_static_apiservers": args.discovery_shares,
        "interval_seconds": interval,
        "create_seconds": creating.as_secs_f64(),
        "start_to_discovered_set_seconds": listed_at - started_at,
        "start_to_all_reachable_seconds": warmup.as_secs_f64(),
        "tether": {"peak_rss_kib": peak, "rss_kib": rss},
        "tether_after_trials": {"peak_rss_kib": peak_after, "rss_kib": rss_after},
        "secret_to_first_probe_ms": {"samples": took, "median": med, "max": max},
        "watch": args.watch,
        "trials": args.discovery_trials,
        "secret_to_cache_synced_ms": synced.as_ref().map(|s| json!({
            "samples": s,
            "median": median(&mut s.clone()),
            "max": s.iter().copied().fold(0.0, f64::max),
        })),
        "lists_on_the_other_remotes_during_trials": relists,
        "cycles_during_trials": cycles,
        "instructions": instructions,
        "metrics_scrape_ms_median": scrape_median,
        "metrics_bytes": size,
    });
    print_table(&table(&report));
    Ok(report)
}

/// The instructions a change, as the table prints them.
fn instructions(i: &serde_json::Map<String, Value>) -> String {
    format!(
        "{:.0} ({} over {:.1}s, {} probes; a quiet window: {} over {:.1}s, {} probes)",
        i["a_change"].as_f64().unwrap_or_default(),
        i["trials_window"],
        i["window_seconds"].as_f64().unwrap_or_default(),
        i["probes_trials_window"],
        i["quiet_window"],
        i["quiet_window_seconds"].as_f64().unwrap_or_default(),
        i["probes_quiet_window"]
    )
}

/// The report as the table prints it.
fn table(r: &Value) -> Vec<(String, String)> {
    let secs = |key: &str| format!("{:.1}s", r[key].as_f64().unwrap_or_default());
    let mib = |key: &str| r["tether"][key].as_f64().unwrap_or_default() / 1024.0;
    let ms = &r["secret_to_first_probe_ms"];
    vec![
        ("static remotes".to_owned(), r["static_remotes"].to_string()),
        (
            "Secrets in one namespace".to_owned(),
            r["secrets"].to_string(),
        ),
        (
            "apiservers (a discovered remote shares a static one's)".to_owned(),
            format!(
                "{} ({})",
                r["apiservers"], r["discovered_share_static_apiservers"]
            ),
        ),
        ("probe interval".to_owned(), secs("interval_seconds")),
        (
            format!("creating the Secrets ({IN_FLIGHT} at a time)"),
            secs("create_seconds"),
        ),
        (
            "start to the discovered set (\"tether started\")".to_owned(),
            secs("start_to_discovered_set_seconds"),
        ),
        (
            "start to every remote reachable, manager up".to_owned(),
            secs("start_to_all_reachable_seconds"),
        ),
        (
            "tether RSS (peak / now)".to_owned(),
            format!("{:.1} / {:.1} MiB", mib("peak_rss_kib"), mib("rss_kib")),
        ),
        (
            format!(
                "a Secret's creation to its first probe (median / max of {})",
                r["trials"]
            ),
            format!(
                "{:.0} / {:.0} ms",
                ms["median"].as_f64().unwrap_or_default(),
                ms["max"].as_f64().unwrap_or_default()
            ),
        ),
        (
            "tether RSS after the trials (peak / now)".to_owned(),
            format!(
                "{:.1} / {:.1} MiB",
                r["tether_after_trials"]["peak_rss_kib"]
                    .as_f64()
                    .unwrap_or_default()
                    / 1024.0,
                r["tether_after_trials"]["rss_kib"]
                    .as_f64()
                    .unwrap_or_default()
                    / 1024.0
            ),
        ),
        (
            format!(
                "a Secret's creation to its cache synced (median / max of {})",
                r["trials"]
            ),
            r["secret_to_cache_synced_ms"].as_object().map_or_else(
                || "not watched (--watch none)".to_owned(),
                |s| {
                    format!(
                        "{:.0} / {:.0} ms",
                        s["median"].as_f64().unwrap_or_default(),
                        s["max"].as_f64().unwrap_or_default()
                    )
                },
            ),
        ),
        (
            "LISTs on the other remotes, and cycles ended, during the trials".to_owned(),
            format!(
                "{} LISTs, {} cycles",
                r["lists_on_the_other_remotes_during_trials"], r["cycles_during_trials"]
            ),
        ),
        (
            "instructions a change (the trials' window less its probes)".to_owned(),
            r["instructions"]
                .as_object()
                .map_or_else(|| "not counted (no --callgrind)".to_owned(), instructions),
        ),
        (
            "/metrics scrape (median of 5)".to_owned(),
            format!(
                "{:.1} ms, {} KiB",
                r["metrics_scrape_ms_median"].as_f64().unwrap_or_default(),
                r["metrics_bytes"].as_u64().unwrap_or_default() / 1024
            ),
        ),
    ]
}
