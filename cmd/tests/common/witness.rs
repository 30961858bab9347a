//! A witness of managers, for the tests that prove two never run at once.
//!
//! Every replica runs the exec manager with a shell child that appends
//! `start <unix ns> <replica> <its TETHER_REMOTES>` to one log when it
//! starts, and `stop <unix ns> <replica>` when SIGTERM stops it. A child
//! killed by SIGKILL writes no stop, so a sampler also reads `/proc` every
//! few milliseconds and records which replicas' children are alive, and
//! with which remotes: two alive at once, for one remote, is the failure.

// Real processes: the sampler runs on the real clock.
#![allow(clippy::disallowed_methods)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// How often the sampler looks.
pub(crate) const SAMPLE_EVERY: Duration = Duration::from_millis(10);

/// The log, and the token that marks this witness's children.
pub(crate) struct Witness {
    _dir: tempfile::TempDir,
    pub(crate) log: PathBuf,
    token: String,
}

/// One manager child alive at a sample.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Alive {
    pub(crate) pid: u32,
    /// The replica that started it.
    pub(crate) replica: String,
    /// Its `TETHER_REMOTES`.
    pub(crate) remotes: BTreeSet<String>,
}

/// One run of a manager, from the log.
#[derive(Debug)]
pub(crate) struct Run {
    pub(crate) replica: String,
    pub(crate) start: u128,
    pub(crate) stop: Option<u128>,
}

impl Witness {
    pub(crate) fn new() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let log = dir.path().join("witness");
        std::fs::write(&log, "").expect("the witness log");
        let token = format!("witness-{}", fastrand::u64(..));
        Self {
            _dir: dir,
            log,
            token,
        }
    }

    /// The `manager:` section for replica `replica`: the witness child,
    /// stopped within `grace`. With `ignores_term`, the child shrugs SIGTERM
    /// off and only SIGKILL ends it, at the grace period.
    pub(crate) fn manager(&self, replica: &str, grace: &str, ignores_term: bool) -> String {
        let log = self.log.display();
        let token = &self.token;
        let on_term = if ignores_term {
            "trap '' TERM".to_owned()
        } else {
            format!("trap 'echo stop $(date +%s%N) {replica} >> {log}; exit 0' TERM")
        };
        format!(
            "{{exec: {{command: [sh, -c, \"echo start $(date +%s%N) {replica} $TETHER_REMOTES >> {log}; {on_term}; while :; do sleep 0.05; done # {token} {replica}\"], gracePeriod: {grace}}}}}"
        )
    }

    /// The runs in the log so far.
    pub(crate) fn runs(&self) -> Vec<Run> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let mut runs: Vec<Run> = Vec::new();
        for line in text.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (Some(what), Some(at), Some(replica)) =
                (fields.first(), fields.get(1), fields.get(2))
            else {
                continue;
            };
            let Ok(at) = at.parse::<u128>() else { continue };
            match *what {
                "start" => runs.push(Run {
                    replica: (*replica).to_owned(),
                    start: at,
                    stop: None,
                }),
                "stop" => {
                    if let Some(run) = runs
                        .iter_mut()
                        .rev()
                        .find(|r| r.replica == *replica && r.stop.is_none())
                    {
                        run.stop = Some(at);
                    }
                }
                _ => {}
            }
        }
        runs
    }

    /// This witness's children alive now.
    pub(crate) fn alive(&self) -> Vec<Alive> {
        alive(&self.token)
    }

    /// Kills every child of this witness still alive: what an old build
    /// left behind, so that the next trial starts clean.
    pub(crate) fn kill_all(&self) {
        for child in self.alive() {
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &child.pid.to_string()])
                .status();
        }
    }
}

/// The children alive now of the witness marked `token`, from `/proc`: the
/// shells whose command line carries the token (their `sleep`s do not).
fn alive(token: &str) -> Vec<Alive> {
    let mark = format!("# {token} ");
    {
        let mut alive = Vec::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|p| p.parse::<u32>().ok())
            else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                continue;
            };
            let cmdline = String::from_utf8_lossy(&cmdline);
            let Some(tail) = cmdline
                .split('\0')
                .find_map(|arg| arg.split_once(&mark))
                .map(|(_, tail)| tail.trim().to_owned())
            else {
                continue;
            };
            if !super::running(pid) {
                continue;
            }
            let remotes = std::fs::read(format!("/proc/{pid}/environ"))
                .ok()
                .and_then(|env| {
                    String::from_utf8_lossy(&env)
                        .split('\0')
                        .find_map(|v| v.strip_prefix("TETHER_REMOTES=").map(str::to_owned))
                })
                .map(|r| {
                    r.split(',')
                        .filter(|s| !s.is_empty())
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default();
            alive.push(Alive {
                pid,
                replica: tail,
                remotes,
            });
        }
        alive
    }
}

/// Samples a witness's children in the background.
pub(crate) struct Sampler {
    samples: Arc<Mutex<Vec<Vec<Alive>>>>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    pub(crate) fn start(witness: &Witness) -> Self {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let token = witness.token.clone();
        let (kept, until) = (Arc::clone(&samples), stop.clone());
        let task = tokio::spawn(async move {
            while !until.is_cancelled() {
                let token = token.clone();
                let alive = tokio::task::spawn_blocking(move || alive(&token))
                    .await
                    .unwrap_or_default();
                kept.lock().expect("not poisoned").push(alive);
                tokio::time::sleep(SAMPLE_EVERY).await;
            }
        });
        Self {
            samples,
            stop,
            task,
        }
    }

    /// Stops sampling; the samples taken.
    pub(crate) async fn finish(self) -> Samples {
        self.stop.cancel();
        let _ = self.task.await;
        Samples(std::mem::take(
            &mut *self.samples.lock().expect("not poisoned"),
        ))
    }
}

/// What a sampler saw.
#[derive(Debug, Default)]
pub(crate) struct Samples(pub(crate) Vec<Vec<Alive>>);

impl Samples {
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    /// How many samples `bad` holds of.
    pub(crate) fn count(&self, bad: impl Fn(&[Alive]) -> bool) -> usize {
        self.0.iter().filter(|alive| bad(alive)).count()
    }

    /// The first sample `bad` holds of, for a failure's message.
    pub(crate) fn first(&self, bad: impl Fn(&[Alive]) -> bool) -> Option<&[Alive]> {
        self.0.iter().map(Vec::as_slice).find(|alive| bad(alive))
    }
}

/// Whether children of two replicas are alive: two managers, with the
/// election.
pub(crate) fn two_replicas(alive: &[Alive]) -> bool {
    alive
        .iter()
        .map(|a| &a.replica)
        .collect::<BTreeSet<_>>()
        .len()
        > 1
}

/// Whether some remote is in the shares of children of two replicas: a
/// remote held twice, with sharding.
pub(crate) fn a_remote_twice(alive: &[Alive]) -> bool {
    let mut holders: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for a in alive {
        for remote in &a.remotes {
            holders.entry(remote).or_default().insert(&a.replica);
        }
    }
    holders.values().any(|h| h.len() > 1)
}

/// The total time that managers of two different replicas ran at once, by
/// the log; a run with no stop counts to the end of time.
pub(crate) fn overlap(runs: &[Run]) -> Duration {
    let mut total = 0u128;
    for (i, a) in runs.iter().enumerate() {
        for b in &runs[i + 1..] {
            if a.replica == b.replica {
                continue;
            }
            let end = a.stop.unwrap_or(u128::MAX).min(b.stop.unwrap_or(u128::MAX));
            let start = a.start.max(b.start);
            total += end.saturating_sub(start);
        }
    }
    Duration::from_nanos(u64::try_from(total).unwrap_or(u64::MAX))
}
