//! `--fleet-controller N`: the mirror controller in its fleet mode (tether's
//! Go package, `fleet/`), under tether's exec manager following its remotes
//! file, over N optional simulated remotes and a real home cluster. A
//! labelled ConfigMap is made on one remote after another, and each timed to
//! its mirror at home: while every remote answers, then while one is lost.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::PostParams;

use crate::*;

/// Samples taken in each phase.
const SAMPLES: usize = 200;

/// A client from the kubeconfig at `path`.
fn client_of(runtime: &tokio::runtime::Runtime, path: &Path) -> Result<kube::Client> {
    runtime.block_on(async {
        let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|e| e.to_string())?;
        let config = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .map_err(|e| e.to_string())?;
        kube::Client::try_from(config).map_err(|e| e.to_string())
    })
}

/// Makes ConfigMap `name` on remote `i`, labelled for the mirror, and the
/// milliseconds until its mirror is at home.
fn mirror_latency(
    runtime: &tokio::runtime::Runtime,
    remote: &kube::Client,
    home: &Api<ConfigMap>,
    i: usize,
    name: &str,
) -> Result<f64> {
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"tether.test/mirror": "yes"}},
        "data": {"made": name},
    }))
    .map_err(|e| e.to_string())?;
    let made = Instant::now();
    runtime
        .block_on(
            Api::<ConfigMap>::namespaced(remote.clone(), "default")
                .create(&PostParams::default(), &cm),
        )
        .map_err(|e| format!("{name} on remote {i}: {e}"))?;
    let mirror = format!("{}-default-{name}", crate::remotes::name(i));
    poll(
        "the mirror at home",
        Duration::from_secs(60),
        Duration::from_millis(2),
        || {
            Ok(runtime
                .block_on(home.get_opt(&mirror))
                .ok()
                .flatten()
                .map(|_| made.elapsed().as_secs_f64() * 1000.0))
        },
    )
}

/// The p50 and p99 of `samples`, in ms.
fn percentiles(samples: &mut [f64]) -> Value {
    samples.sort_by(f64::total_cmp);
    let at = |q: f64| {
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples.get(i).copied().unwrap_or(f64::NAN)
    };
    json!({"p50_ms": at(0.5), "p99_ms": at(0.99), "max_ms": at(1.0), "samples": samples.len()})
}

/// One phase: `SAMPLES` ConfigMaps on remotes 1.., one after another.
fn phase(
    runtime: &tokio::runtime::Runtime,
    clients: &[kube::Client],
    home: &Api<ConfigMap>,
    label: &str,
) -> Result<Vec<f64>> {
    (0..SAMPLES)
        .map(|k| {
            let i = 1 + k % (clients.len() - 1);
            mirror_latency(runtime, &clients[i], home, i, &format!("{label}-{k}"))
        })
        .collect()
}

/// Waits until tether calls `remote` unreachable.
fn until_lost(admin: &str, remote: &str) -> Result<()> {
    let label = format!("remote=\"{remote}\"");
    poll(
        "the remote lost",
        Duration::from_secs(30),
        Duration::from_millis(100),
        || {
            let (_, text, _) = http_get(admin, "/metrics")?;
            Ok(text
                .lines()
                .any(|l| {
                    l.starts_with("tether_remote_apiserver_reachable{")
                        && l.contains(&label)
                        && l.ends_with(" 0")
                })
                .then_some(()))
        },
    )
}

/// The report as the table prints it.
fn table(r: &Value) -> Vec<(String, String)> {
    let ms = |phase: &str| {
        format!(
            "{:.0} / {:.0} ms",
            r[phase]["p50_ms"].as_f64().unwrap_or_default(),
            r[phase]["p99_ms"].as_f64().unwrap_or_default()
        )
    };
    vec![
        (
            "remotes (optional, simulated), home cluster real".to_owned(),
            r["remotes"].to_string(),
        ),
        (
            "start to every remote reachable, controller ready".to_owned(),
            format!("{:.1}s", r["warmup_seconds"].as_f64().unwrap_or_default()),
        ),
        (
            format!("ConfigMap to its mirror, all reachable (p50 / p99 of {SAMPLES})"),
            ms("mirror_latency_all_reachable"),
        ),
        (
            format!("ConfigMap to its mirror, one remote lost (p50 / p99 of {SAMPLES})"),
            ms("mirror_latency_one_lost"),
        ),
        (
            "controller process starts, restarts; tether's cycle".to_owned(),
            format!(
                "{}, {}; {}",
                r["controller_process_starts"], r["controller_process_restarts"], r["tether_cycle"]
            ),
        ),
    ]
}

pub(crate) fn fleet_controller(count: usize) -> Result<Value> {
    if count < 2 {
        return Err("--fleet-controller needs at least 2 remotes".to_owned());
    }
    eprintln!("starting {count} simulated remotes (HTTPS, token each) and a real home cluster");
    let mut remotes = Remotes::start(count)?;
    let (runtime, home, home_kubeconfig) = home_cluster(&remotes, 2)?;
    let controller = tether_testkit::peer("mirror-controller").map_err(|e| e.to_string())?;
    let admin = format!("127.0.0.1:{}", tether_testkit::free_port());
    let health = format!("127.0.0.1:{}", tether_testkit::free_port());
    let port = health.rsplit(':').next().unwrap_or_default();
    let head = format!(
        "admin: {{ address: \"{admin}\" }}\nprobe: {{ interval: 1s, timeout: 500ms, failureThreshold: 3 }}\n\
         manager: {{ exec: {{ command: [{}, --fleet, --home-kubeconfig, {}, \"--health-probe-bind-address={health}\", --kube-api-qps=1000, --kube-api-burst=1000], \
         followsRemotesFile: true, readiness: {{ httpGet: {{ port: {port}, path: /readyz }} }} }} }}\n",
        controller.display(),
        home_kubeconfig.display()
    );
    let config = tether_config_as(&remotes, count, "tether.yaml", &head)?;
    // Every remote optional: the fleet's way (docs/discovery.md).
    let text = std::fs::read_to_string(&config).map_err(|e| e.to_string())?;
    std::fs::write(
        &config,
        text.replace(".kubeconfig }", ".kubeconfig, required: false }"),
    )
    .map_err(|e| e.to_string())?;
    let mut tether = start_tether(&config)?;
    let warmup = until_all_reachable(&mut tether, &admin, count)?;
    eprintln!("tether: every remote reachable and the controller ready after {warmup:.1?}");
    let clients: Vec<kube::Client> = (0..count)
        .map(|i| {
            client_of(
                &runtime,
                &remotes.path(&format!("{}.kubeconfig", crate::remotes::name(i))),
            )
        })
        .collect::<Result<_>>()?;
    let home_api = Api::<ConfigMap>::namespaced(client_of(&runtime, &home_kubeconfig)?, "default");

    let mut steady = phase(&runtime, &clients, &home_api, "steady")?;
    remotes.set_fault(0, &Fault::Refuse)?;
    until_lost(&admin, &crate::remotes::name(0))?;
    let mut during = phase(&runtime, &clients, &home_api, "lost")?;
    let (_, text, _) = http_get(&admin, "/metrics")?;
    let starts = metric_sum(&text, "tether_manager_process_starts_total", "");
    let restarts = metric_sum(&text, "tether_manager_process_restarts_total", "");
    let cycles = metric_sum(&text, "tether_cycle", "");
    let (peak, rss) = (tether.kib("VmHWM"), tether.kib("VmRSS"));
    drop(tether);
    drop(home);
    let report = json!({
        "remotes": count,
        "warmup_seconds": warmup.as_secs_f64(),
        "mirror_latency_all_reachable": percentiles(&mut steady),
        "mirror_latency_one_lost": percentiles(&mut during),
        "controller_process_starts": starts,
        "controller_process_restarts": restarts,
        "tether_cycle": cycles,
        "tether": {"peak_rss_kib": peak, "rss_kib": rss},
    });
    print_table(&table(&report));
    Ok(report)
}
