//! Remotes discovered from the home cluster's Secrets, in the formats fleets
//! already keep (Argo CD, Cluster API, multicluster-runtime's kubeconfig
//! provider).
//!
//! - `secret.rs`: one Secret read as a cluster, or why not, by field;
//! - `source.rs`: one source's reflector (list, then watch), which reads
//!   each Secret once per change of its data;
//! - here: the sources together, the names they give merged with the
//!   static remotes', the home cluster's probe, the metrics and the status.
//!
//! The daemon hears of each change through [`Discovery::changes`], takes
//! the set with [`Discovery::remotes`], and hands it on as it does a
//! reload's: probes for the new remotes, none for those gone, and a new
//! plan for the manager.

pub mod secret;
mod source;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use prometheus::{IntGaugeVec, Opts, Registry};
use tether_probes::Remote;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use self::secret::Skipped;
use self::source::{Known, Outcome, Source};
use crate::config::DiscoverySpec;
use crate::config::discovery::HOME;
use crate::config::remote::ResolvedRemote;
use crate::lock;

/// How long tether waits at start for every source's first list, so that
/// its first cycle runs the discovered remotes too. A home cluster that does
/// not answer in time delays nothing further: its remotes join when it does.
pub const FIRST_LIST_WAIT: Duration = Duration::from_secs(30);

/// Why discovery cannot start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The home cluster's kubeconfig (or the in-cluster config) cannot be
    /// loaded.
    #[error("cannot load the home cluster's config: {0}")]
    Config(String),
    /// Its client cannot be built.
    #[error("cannot build the home cluster's client: {0}")]
    Client(String),
    /// The metrics' names are taken.
    #[error("registering the discovery metrics failed")]
    Metrics(#[from] prometheus::Error),
}

/// The home cluster's connection settings, as the Leases take them
/// ([`crate::lease::home_config`]), its errors told with the file.
///
/// # Errors
///
/// [`Error::Config`].
pub async fn home_config(kubeconfig: Option<&Path>) -> Result<kube::Config, Error> {
    crate::lease::home_config(kubeconfig).await.map_err(|err| {
        let cause = tether_probes::client::root_cause(&err);
        Error::Config(match kubeconfig {
            Some(path) => format!("{}: {cause}", path.display()),
            None => format!("not in a pod, and no kubeconfig: {cause}"),
        })
    })
}

/// A Secret's name as tether shows it: a hostile or proxied home cluster
/// may send one that no apiserver would take, with control characters that
/// would rewrite a terminal or a page. Escaped once here, for every place
/// that shows it (`check`, `/status`, `/status.json`, the metrics).
fn shown(name: &str) -> String {
    tether_supervisor::printable(name, 253).into_owned()
}

/// One discovered Secret that is skipped, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedSecret {
    /// The Secret's name, control characters escaped.
    pub secret: String,
    /// The field, and what is wrong.
    pub skipped: Skipped,
}

/// A source as `/status` shows it.
#[derive(Debug, Clone)]
pub struct SourceStatus {
    /// `<namespace>/<format>`.
    pub source: String,
    /// The label selector its Secrets are listed with.
    pub selector: String,
    /// Whether the remotes it finds are required.
    pub required: bool,
    /// Whether it has listed its Secrets once.
    pub listed: bool,
    /// When it last listed them whole.
    pub listed_at: Option<SystemTime>,
    /// The remotes it gives.
    pub remotes: usize,
    /// Its Secrets that are skipped, by name.
    pub skipped: Vec<SkippedSecret>,
    /// Why its list or watch fails, and since when.
    pub failing: Option<(String, SystemTime)>,
}

/// Who has a name first, as a later Secret's error tells it: told only
/// then, not made for every name at every merge.
#[derive(Debug, Clone, Copy)]
enum Holder<'a> {
    /// The home cluster's reserved name.
    Home,
    /// A static remote's.
    Static,
    /// A Secret's, earlier in order.
    Secret { namespace: &'a str, secret: &'a str },
}

impl std::fmt::Display for Holder<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Home => f.write_str("the home cluster"),
            Self::Static => f.write_str("a static remote"),
            Self::Secret { namespace, secret } => {
                write!(f, "Secret {namespace}/{}", shown(secret))
            }
        }
    }
}

/// The merged set as last taken: what `/status` and the metrics show.
#[derive(Debug, Default)]
struct Merged {
    /// Per source: remotes given, and Secrets skipped (their own errors and
    /// names already taken).
    per_source: Vec<(usize, Vec<SkippedSecret>)>,
    /// The `(source, secret)` series of `tether_discovery_errors` now.
    exported: BTreeSet<(String, String)>,
}

/// The running discovery: one reflector per source on one home cluster.
#[derive(Debug)]
pub struct Discovery {
    sources: Vec<Arc<Source>>,
    home: Remote,
    changes: watch::Receiver<u64>,
    merged: Mutex<Merged>,
    errors: IntGaugeVec,
    found: IntGaugeVec,
    stop: CancellationToken,
}

impl Discovery {
    /// Starts a reflector for each of `specs` (at least one; they share one
    /// home cluster). Its metrics go in `registry`.
    ///
    /// # Errors
    ///
    /// [`Error`]: the home cluster's config or client, or the metrics.
    pub async fn start(specs: &[DiscoverySpec], registry: &Registry) -> Result<Self, Error> {
        let kubeconfig = specs.first().and_then(|s| s.kubeconfig.clone());
        let config = home_config(kubeconfig.as_deref()).await?;
        let home = Remote::new(HOME.to_owned(), Arc::new(config.clone()));
        let config = source::client_config(config);
        // Off the workers: an exec credential plugin runs in the build.
        let client = tether_probes::client::once_off_workers(move || {
            tether_probes::client::bounded_client(config)
        })
        .await
        .map_err(|e| Error::Client(e.to_string()))?
        .map_err(|e| Error::Client(tether_probes::client::root_cause(&e)))?;
        let (discovery, notify) = Self::new(specs, home, registry)?;
        for source in &discovery.sources {
            tokio::spawn(Arc::clone(source).run(
                client.clone(),
                notify.clone(),
                discovery.stop.clone(),
            ));
        }
        Ok(discovery)
    }

    /// The discovery of `specs`, its metrics registered, its sources
    /// knowing nothing yet and not running; and the sender they tell
    /// their changes on.
    fn new(
        specs: &[DiscoverySpec],
        home: Remote,
        registry: &Registry,
    ) -> Result<(Self, watch::Sender<u64>), Error> {
        let errors = IntGaugeVec::new(
            Opts::new(
                "tether_discovery_errors",
                "1 for each discovered Secret that is skipped (it does not read as a cluster, or its name is taken), and for each source that cannot list or watch its Secrets (secret=\"\").",
            ),
            &["source", "secret"],
        )?;
        let found = IntGaugeVec::new(
            Opts::new(
                "tether_discovery_remotes",
                "The remotes each discovery source gives.",
            ),
            &["source"],
        )?;
        registry.register(Box::new(errors.clone()))?;
        registry.register(Box::new(found.clone()))?;
        let (notify, changes) = watch::channel(0);
        let sources: Vec<Arc<Source>> = specs
            .iter()
            .map(|spec| {
                found.with_label_values(&[&spec.label()]).set(0);
                Arc::new(Source {
                    spec: spec.clone(),
                    known: Mutex::new(Known::default()),
                })
            })
            .collect();
        let discovery = Self {
            sources,
            home,
            changes,
            merged: Mutex::new(Merged::default()),
            errors,
            found,
            stop: CancellationToken::new(),
        };
        Ok((discovery, notify))
    }

    /// Waits until every source has listed its Secrets once, or `within`
    /// has passed. Whether they all have.
    pub async fn first_lists(&self, within: Duration) -> bool {
        let mut changes = self.changes.clone();
        let listed = || self.sources.iter().all(|s| lock(&s.known).listed);
        let wait = async {
            while !listed() {
                if changes.changed().await.is_err() {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(within, wait).await;
        let all = listed();
        if !all {
            warn!(waited = ?within, "the home cluster's Secrets are not all listed yet; tether starts with the remotes it knows, and adds the rest when they come");
        }
        all
    }

    /// Says when what the sources know changes.
    #[must_use]
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.clone()
    }

    /// The home cluster, probed as a remote is.
    #[must_use]
    pub fn home(&self) -> Remote {
        self.home.clone()
    }

    /// The discovered remotes, sources in config order and each source's
    /// in Secret name order. A name that tether reserves (the home
    /// cluster's), a static remote (of `taken`) or an earlier Secret already
    /// has is an error on the later Secret alone. The metrics and the
    /// status follow.
    pub fn remotes(&self, taken: &[ResolvedRemote]) -> Vec<ResolvedRemote> {
        let known: Vec<_> = self.sources.iter().map(|s| lock(&s.known)).collect();
        let mut holders: BTreeMap<&str, Holder<'_>> = taken
            .iter()
            .map(|r| (r.name.as_str(), Holder::Static))
            .collect();
        holders.insert(HOME, Holder::Home);
        let mut remotes = Vec::new();
        let mut per_source = Vec::with_capacity(self.sources.len());
        for (source, known) in self.sources.iter().zip(&known) {
            let mut given = 0;
            let mut skipped = Vec::new();
            for (secret, entry) in &known.secrets {
                match &entry.outcome {
                    Outcome::Ignored => {}
                    Outcome::Skipped(why) => skipped.push(SkippedSecret {
                        secret: shown(secret),
                        skipped: why.clone(),
                    }),
                    Outcome::Found(remote) => {
                        if let Some(holder) = holders.get(remote.name.as_str()) {
                            skipped.push(SkippedSecret {
                                secret: shown(secret),
                                skipped: Skipped {
                                    field: "name".to_owned(),
                                    message: format!(
                                        "{:?} is already the name of {holder}",
                                        remote.name
                                    ),
                                },
                            });
                            continue;
                        }
                        let namespace = source.spec.namespace.as_str();
                        holders.insert(&remote.name, Holder::Secret { namespace, secret });
                        remotes.push(remote.clone());
                        given += 1;
                    }
                }
            }
            self.found
                .with_label_values(&[&source.spec.label()])
                .set(given);
            per_source.push((usize::try_from(given).unwrap_or(0), skipped));
        }
        drop(holders);
        drop(known);
        self.export_errors(&per_source);
        lock(&self.merged).per_source = per_source;
        remotes
    }

    /// `tether_discovery_errors`: a series for each Secret skipped now,
    /// one with an empty `secret` for each source that cannot list or
    /// watch now, and none for those fixed or gone.
    fn export_errors(&self, per_source: &[(usize, Vec<SkippedSecret>)]) {
        let mut now = BTreeSet::new();
        for (source, (_, skipped)) in self.sources.iter().zip(per_source) {
            let label = source.spec.label();
            if lock(&source.known).failing.is_some() {
                now.insert((label.clone(), String::new()));
            }
            for s in skipped {
                now.insert((label.clone(), s.secret.clone()));
            }
        }
        let mut merged = lock(&self.merged);
        for (source, secret) in merged.exported.difference(&now) {
            let _ = self.errors.remove_label_values(&[source, secret]);
        }
        for (source, secret) in &now {
            self.errors.with_label_values(&[source, secret]).set(1);
        }
        merged.exported = now;
    }

    /// Each source as `/status` shows it.
    #[must_use]
    pub fn status(&self) -> Vec<SourceStatus> {
        let merged = lock(&self.merged);
        self.sources
            .iter()
            .enumerate()
            .map(|(i, source)| {
                let known = lock(&source.known);
                let (remotes, skipped) = merged.per_source.get(i).cloned().unwrap_or_default();
                SourceStatus {
                    source: source.spec.label(),
                    selector: source.spec.selector(),
                    required: source.spec.required,
                    listed: known.listed,
                    listed_at: known.listed_at,
                    remotes,
                    skipped,
                    failing: known.failing.clone(),
                }
            })
            .collect()
    }

    /// Stops every reflector.
    pub fn stop(&self) {
        self.stop.cancel();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{RemoteSource, SecretFormat};

    fn remote(name: &str) -> ResolvedRemote {
        let config = kube::Config::new("https://h:6443".parse().expect("a URL"));
        ResolvedRemote::new(name, true, RemoteSource::Inferred, Arc::new(config))
            .expect("a server to probe")
    }

    /// A discovery of one source that knows `secrets`, as its reflector
    /// would have them.
    fn knowing(secrets: Vec<(&str, Outcome)>) -> Discovery {
        let spec = DiscoverySpec {
            namespace: "fleet".to_owned(),
            format: SecretFormat::Kubeconfig,
            label_selector: None,
            required: true,
            kubeconfig: None,
        };
        let home = Remote::new(
            HOME.to_owned(),
            Arc::new(kube::Config::new(
                "https://home:6443".parse().expect("a URL"),
            )),
        );
        let (discovery, _) = Discovery::new(&[spec], home, &Registry::new()).expect("discovery");
        {
            let mut known = lock(&discovery.sources[0].known);
            known.listed = true;
            for (name, outcome) in secrets {
                known
                    .secrets
                    .insert(name.to_owned(), source::Entry::of(outcome));
            }
        }
        discovery
    }

    #[test]
    fn a_name_tether_reserves_or_holds_is_that_secrets_error_alone() {
        let discovery = knowing(vec![
            ("home", Outcome::Found(remote("home"))),
            ("edge-1", Outcome::Found(remote("edge-1"))),
            ("edge-1-again", Outcome::Found(remote("edge-1"))),
            ("s", Outcome::Found(remote("s"))),
        ]);
        let taken = [remote("s")];
        let found: Vec<String> = discovery
            .remotes(&taken)
            .into_iter()
            .map(|r| r.name)
            .collect();
        assert_eq!(found, ["edge-1"]);
        let status = discovery.status();
        let skipped: Vec<(&str, &str, &str)> = status[0]
            .skipped
            .iter()
            .map(|k| {
                (
                    k.secret.as_str(),
                    k.skipped.field.as_str(),
                    k.skipped.message.as_str(),
                )
            })
            .collect();
        assert_eq!(
            skipped,
            [
                (
                    "edge-1-again",
                    "name",
                    "\"edge-1\" is already the name of Secret fleet/edge-1"
                ),
                (
                    "home",
                    "name",
                    "\"home\" is already the name of the home cluster"
                ),
                ("s", "name", "\"s\" is already the name of a static remote"),
            ]
        );
    }

    #[test]
    fn a_hostile_secret_name_is_shown_escaped_everywhere() {
        let hostile = "x\u{1b}]0;owned\u{7}\u{1b}[2J";
        let discovery = knowing(vec![(
            hostile,
            Outcome::Skipped(Skipped {
                field: "data.kubeconfig".to_owned(),
                message: "is missing".to_owned(),
            }),
        )]);
        discovery.remotes(&[]);
        let shown = &discovery.status()[0].skipped[0].secret;
        assert!(!shown.chars().any(char::is_control), "{shown:?}");
        assert!(shown.contains("\\u{1b}"), "{shown:?}");
        let series = discovery
            .errors
            .get_metric_with_label_values(&["fleet/kubeconfig", shown])
            .expect("its series");
        assert_eq!(series.get(), 1);
    }

    #[test]
    fn a_source_that_cannot_list_has_an_error_series_of_its_own_until_it_lists() {
        let discovery = knowing(Vec::new());
        lock(&discovery.sources[0].known).failing =
            Some(("no answer within 30s".to_owned(), SystemTime::now()));
        discovery.remotes(&[]);
        let failing = || {
            discovery
                .errors
                .get_metric_with_label_values(&["fleet/kubeconfig", ""])
                .map(|g| g.get())
        };
        assert_eq!(failing().ok(), Some(1));
        lock(&discovery.sources[0].known).failing = None;
        discovery.remotes(&[]);
        let exported = prometheus::core::Collector::collect(&discovery.errors);
        assert!(
            exported.iter().all(|family| family.get_metric().is_empty()),
            "the series went: {exported:?}"
        );
    }
}
