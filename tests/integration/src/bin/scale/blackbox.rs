//! `blackbox_exporter` and Prometheus beside tether.

use crate::*;

pub(crate) fn start_blackbox(
    remotes: &Remotes,
    interval: f64,
) -> Result<(Process, Process, String)> {
    let blackbox_bin = which(
        "prometheus-blackbox-exporter",
        "apt-get install -y prometheus-blackbox-exporter",
    )?;
    let prometheus_bin = which("prometheus", "apt-get install -y prometheus")?;
    // One module per remote: its own CA and token, as tether has, in a
    // folder of blackbox_exporter's own. It opens both files at every
    // probe; in tether's folder, each open would be an inotify event that
    // wakes tether's watcher, and blackbox_exporter's reads would count
    // in tether's CPU.
    let files = remotes.path("blackbox");
    std::fs::create_dir_all(&files).map_err(|e| e.to_string())?;
    let mut modules = String::from("modules:\n");
    let mut targets = String::new();
    for (i, url) in remotes.urls.iter().enumerate() {
        let n = name(i);
        let own = |file: String| {
            let path = files.join(&file);
            std::fs::copy(remotes.path(&file), &path)
                .map(|_| path)
                .map_err(|e| format!("{file}: {e}"))
        };
        let (token, ca) = (own(format!("{n}.token"))?, own(format!("{n}.ca.pem"))?);
        let _ = write!(
            modules,
            "  {n}:\n    prober: http\n    timeout: {timeout}s\n    http:\n      preferred_ip_protocol: ip4\n      bearer_token_file: {token}\n      tls_config: {{ ca_file: {ca} }}\n",
            timeout = interval / 2.0,
            token = token.display(),
            ca = ca.display(),
        );
        let _ = write!(
            targets,
            "      - targets: [\"{url}/readyz\"]\n        labels: {{ module: {n}, remote: {n} }}\n",
        );
    }
    let blackbox_config = files.join("blackbox.yml");
    std::fs::write(&blackbox_config, modules).map_err(|e| e.to_string())?;
    let blackbox_addr = format!("127.0.0.1:{}", tether_testkit::free_port());
    let blackbox = Process::spawn(
        "blackbox_exporter",
        Command::new(blackbox_bin).args([
            &format!("--config.file={}", blackbox_config.display()),
            &format!("--web.listen-address={blackbox_addr}"),
        ]),
    )?;
    let prom_config = files.join("prometheus.yml");
    std::fs::write(
        &prom_config,
        format!(
            "global: {{ scrape_interval: {interval}s, scrape_timeout: {timeout}s }}\nscrape_configs:\n  - job_name: blackbox\n    metrics_path: /probe\n    static_configs:\n{targets}    relabel_configs:\n      - {{ source_labels: [__address__], target_label: __param_target }}\n      - {{ source_labels: [module], target_label: __param_module }}\n      - {{ target_label: __address__, replacement: \"{blackbox_addr}\" }}\n",
            timeout = interval / 2.0 + 1.0,
        ),
    )
    .map_err(|e| e.to_string())?;
    let prom_addr = format!("127.0.0.1:{}", tether_testkit::free_port());
    let prometheus = Process::spawn(
        "prometheus",
        Command::new(prometheus_bin).args([
            &format!("--config.file={}", prom_config.display()),
            &format!("--web.listen-address={prom_addr}"),
            &format!("--storage.tsdb.path={}", files.join("tsdb").display()),
        ]),
    )?;
    Ok((blackbox, prometheus, prom_addr))
}

/// An instant query: (labels, value) per series.
pub(crate) fn prom_query(addr: &str, query: &str) -> Result<Vec<(Value, f64)>> {
    let mut encoded = String::new();
    for byte in query.bytes() {
        if byte.is_ascii_alphanumeric() || b"-_.~".contains(&byte) {
            encoded.push(char::from(byte));
        } else {
            let _ = write!(encoded, "%{byte:02X}");
        }
    }
    let Ok((200, body, _)) = http_get(addr, &format!("/api/v1/query?query={encoded}")) else {
        return Ok(Vec::new());
    };
    let value: Value =
        serde_json::from_str(&body).map_err(|e| format!("Prometheus answer: {e}"))?;
    Ok(value["data"]["result"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| {
            let v = r["value"][1].as_str()?.parse().ok()?;
            Some((r["metric"].clone(), v))
        })
        .collect())
}

pub(crate) type Detections = Vec<(String, (Vec<f64>, Vec<f64>))>;

/// Faults one remote at a time and times each side's verdict: tether's
/// "remote apiserver unreachable" log line, and the timestamp of the
/// `probe_success` 0 sample in Prometheus.
pub(crate) fn side_by_side_detection(
    remotes: &mut Remotes,
    tether: &mut Process,
    prom_addr: &str,
    trials: usize,
) -> Result<Detections> {
    let mut results = Vec::new();
    for fault in [Fault::Refuse, Fault::Hang] {
        let (mut tether_s, mut blackbox_s) = (Vec::new(), Vec::new());
        for trial in 0..trials {
            let i = (trial * 7919 + usize::from(fault == Fault::Hang) * 13) % remotes.len();
            let remote = name(i);
            // A random phase against both sides' intervals.
            std::thread::sleep(Duration::from_millis(fastrand::u64(..10_000)));
            let struck = now();
            remotes.set_fault(i, &fault)?;
            let (t, b) = poll(
                &format!("{remote} {fault} seen by both"),
                Duration::from_secs(120),
                Duration::from_millis(100),
                || {
                    tether.alive()?;
                    let t = tether
                        .events("remote apiserver unreachable")
                        .into_iter()
                        .filter(|(at, f)| {
                            *at >= struck
                                && f["remotes"].as_str().is_some_and(|r| r.contains(&remote))
                        })
                        .map(|(at, _)| at)
                        .next();
                    let b = prom_query(
                        prom_addr,
                        &format!("timestamp(probe_success{{remote=\"{remote}\"}} == 0)"),
                    )?
                    .first()
                    .map(|(_, at)| *at)
                    .filter(|at| *at >= struck);
                    Ok(t.zip(b))
                },
            )?;
            eprintln!(
                "{fault} on {remote}: tether {:.2}s, blackbox {:.2}s",
                t - struck,
                b - struck
            );
            tether_s.push(t - struck);
            blackbox_s.push(b - struck);
            remotes.set_fault(i, &Fault::Up)?;
            poll(
                &format!("{remote} back for both"),
                Duration::from_secs(120),
                Duration::from_millis(200),
                || {
                    let back = prom_query(
                        prom_addr,
                        &format!("probe_success{{remote=\"{remote}\"}} == 1"),
                    )?;
                    let reachable =
                        tether
                            .events("remote apiserver reachable")
                            .iter()
                            .any(|(at, f)| {
                                *at >= struck
                                    && f["remotes"].as_str().is_some_and(|r| r.contains(&remote))
                            });
                    Ok((!back.is_empty() && reachable).then_some(()))
                },
            )?;
        }
        results.push((fault.to_string(), (tether_s, blackbox_s)));
    }
    Ok(results)
}
