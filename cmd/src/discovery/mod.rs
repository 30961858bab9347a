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
//! The planner hears of each change through [`Discovery::changes`], takes
//! in what changed with [`Discovery::update`] (the names whose remote came,
//! went or was read anew), and hands it on as it does a reload's: probes
//! for the new remotes, none for those gone, and a new plan for the
//! manager.

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
use crate::config::ranked::Remotes;
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

/// Where a discovered remote comes from: its source's place in the config,
/// and its Secret's name. The discovered remotes are kept in this order.
pub type Place = (usize, String);

/// The discovered remotes by name, each with where it comes from, as
/// [`Discovery::update`] keeps them.
pub type Found = BTreeMap<String, (Place, ResolvedRemote)>;

/// What one source gives, as last taken in: what `/status` and the metrics
/// show.
#[derive(Debug, Default)]
struct Given {
    /// How many remotes it gives.
    remotes: usize,
    /// Its Secrets that are skipped (their own errors and names already
    /// taken), by name.
    skipped: BTreeMap<String, SkippedSecret>,
    /// Whether its `tether_discovery_errors` series for its list (an
    /// empty `secret`) is exported.
    failing: bool,
    /// The Secrets, as shown, whose `tether_discovery_errors` series are
    /// exported.
    exported: BTreeSet<String>,
}

/// The merged set as last taken in, kept so that a change costs work in
/// proportion to what changed, not to the remotes.
#[derive(Debug, Default)]
struct Merged {
    /// The names no Secret may have: the home cluster's and the static
    /// remotes'.
    reserved: BTreeMap<String, Holder<'static>>,
    /// Each name the Secrets give, and the Secrets that give it, in order:
    /// the first has it unless it is reserved.
    claims: BTreeMap<String, BTreeSet<Place>>,
    /// The name each Secret gives.
    claimed: BTreeMap<Place, String>,
    /// Per source.
    given: Vec<Given>,
}

impl Merged {
    /// Takes in the static remotes' names (and the home cluster's), adding
    /// to `names` those reserved now or no longer.
    fn reserve(&mut self, statics: &Remotes, names: &mut BTreeSet<String>) {
        let mut now: BTreeMap<String, Holder<'static>> = statics
            .iter()
            .map(|r| (r.name.clone(), Holder::Static))
            .collect();
        now.insert(HOME.to_owned(), Holder::Home);
        let before = std::mem::replace(&mut self.reserved, now);
        names.extend(
            before
                .into_keys()
                .filter(|n| !self.reserved.contains_key(n)),
        );
        names.extend(statics.iter().map(|r| r.name.clone()));
    }

    /// Takes in what the Secret at `place` gives now (`None`: it is gone):
    /// its last claim withdrawn, its own error or its new claim recorded.
    /// Adds to `names` the names it gave and gives.
    fn read(
        &mut self,
        place: &Place,
        outcome: Option<&Outcome>,
        found: &mut Found,
        names: &mut BTreeSet<String>,
    ) {
        let (index, secret) = place;
        if let Some(name) = self.claimed.remove(place) {
            if let Some(of) = self.claims.get_mut(&name) {
                of.remove(place);
                if of.is_empty() {
                    self.claims.remove(&name);
                }
            }
            if found.get(&name).is_some_and(|(at, _)| at == place) {
                found.remove(&name);
                self.given[*index].remotes -= 1;
            }
            names.insert(name);
        }
        let skipped = &mut self.given[*index].skipped;
        skipped.remove(secret);
        match outcome {
            None | Some(Outcome::Ignored) => {}
            Some(Outcome::Skipped(why)) => {
                let why = SkippedSecret {
                    secret: shown(secret),
                    skipped: why.clone(),
                };
                skipped.insert(secret.clone(), why);
            }
            Some(Outcome::Found(remote)) => {
                self.claimed.insert(place.clone(), remote.name.clone());
                let of = self.claims.entry(remote.name.clone()).or_default();
                of.insert(place.clone());
                names.insert(remote.name.clone());
            }
        }
    }

    /// Gives `name` to its holder: the home cluster, a static remote, or
    /// the first Secret that claims it. Every other claim is an error on
    /// its Secret. Adds the claims' places to `places`.
    fn settle(
        &mut self,
        name: &str,
        sources: &[Arc<Source>],
        known: &[std::sync::MutexGuard<'_, Known>],
        found: &mut Found,
        places: &mut BTreeSet<Place>,
    ) {
        let Some(of) = self.claims.get(name) else {
            return;
        };
        let reserved = self.reserved.get(name).copied();
        let Some(first) = of.first() else { return };
        if reserved.is_some()
            && let Some(((at, _), _)) = found.remove(name)
        {
            self.given[at].remotes -= 1;
        }
        let holder = reserved.unwrap_or(Holder::Secret {
            namespace: &sources[first.0].spec.namespace,
            secret: &first.1,
        });
        for place in of {
            let Some(Outcome::Found(remote)) =
                known[place.0].secrets.get(&place.1).map(|e| &e.outcome)
            else {
                continue;
            };
            if reserved.is_none() && place == first {
                self.given[place.0].skipped.remove(&place.1);
                let entry = (place.clone(), remote.clone());
                match found.insert(name.to_owned(), entry) {
                    Some((was, _)) if was == *place => {}
                    was => {
                        if let Some((was, _)) = was {
                            self.given[was.0].remotes -= 1;
                        }
                        self.given[place.0].remotes += 1;
                    }
                }
            } else {
                let given = &mut self.given[place.0];
                let why = SkippedSecret {
                    secret: shown(&place.1),
                    skipped: Skipped {
                        field: "name".to_owned(),
                        message: format!("{name:?} is already the name of {holder}"),
                    },
                };
                given.skipped.insert(place.1.clone(), why);
            }
            places.insert(place.clone());
        }
    }
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
    /// home cluster). Its metrics go in `registry`. Each remote keeps its
    /// Secret's kubeconfig if `keep_kubeconfigs` (for the exec manager).
    ///
    /// # Errors
    ///
    /// [`Error`]: the home cluster's config or client, or the metrics.
    pub async fn start(
        specs: &[DiscoverySpec],
        keep_kubeconfigs: bool,
        registry: &Registry,
    ) -> Result<Self, Error> {
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
        let (discovery, notify) = Self::new(specs, keep_kubeconfigs, home, registry)?;
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
        keep_kubeconfigs: bool,
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
                    keep_kubeconfigs,
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

    /// Brings `found` up to date with what the sources learned since the
    /// last call, and with `statics` (the static remotes), when they are
    /// new: the first call, and each reload. `found` is the map that only
    /// these calls change; each call costs work in proportion to the
    /// Secrets that changed (and to the static remotes, when they are new),
    /// not to the remotes. The names whose remote in `found` may have
    /// changed.
    ///
    /// Sources are in config order, and each source's Secrets in name
    /// order. A name that tether reserves (the home cluster's), a static
    /// remote or an earlier Secret already has is an error on the later
    /// Secret alone. The metrics and the status follow.
    pub fn update(&self, statics: Option<&Remotes>, found: &mut Found) -> BTreeSet<String> {
        let mut known: Vec<_> = self.sources.iter().map(|s| lock(&s.known)).collect();
        let mut merged = lock(&self.merged);
        merged.given.resize_with(self.sources.len(), Given::default);
        // The names whose holder may have changed, and the Secrets whose
        // error series may have.
        let mut names: BTreeSet<String> = BTreeSet::new();
        let mut places: BTreeSet<Place> = BTreeSet::new();
        if let Some(statics) = statics {
            merged.reserve(statics, &mut names);
        }
        for (index, known) in known.iter_mut().enumerate() {
            for secret in std::mem::take(&mut known.touched) {
                let place = (index, secret);
                let outcome = known.secrets.get(&place.1).map(|e| &e.outcome);
                merged.read(&place, outcome, found, &mut names);
                places.insert(place);
            }
        }
        for name in &names {
            merged.settle(name, &self.sources, &known, found, &mut places);
        }
        for (index, (source, known)) in self.sources.iter().zip(&known).enumerate() {
            let label = source.spec.label();
            let given = &mut merged.given[index];
            self.found
                .with_label_values(&[&label])
                .set(i64::try_from(given.remotes).unwrap_or(i64::MAX));
            let failing = known.failing.is_some();
            if failing != given.failing {
                given.failing = failing;
                self.export(&label, "", failing);
            }
            for (_, secret) in places.range((index, String::new())..(index + 1, String::new())) {
                let shown = shown(secret);
                if given.skipped.contains_key(secret) {
                    self.export(&label, &shown, true);
                    given.exported.insert(shown);
                } else if given.exported.contains(&shown)
                    // Two names a hostile home cluster sends may show alike.
                    && !given.skipped.values().any(|k| k.secret == shown)
                {
                    self.export(&label, &shown, false);
                    given.exported.remove(&shown);
                }
            }
        }
        names
    }

    /// Sets `tether_discovery_errors{source, secret}` to 1, or removes it.
    fn export(&self, source: &str, secret: &str, error: bool) {
        if error {
            self.errors.with_label_values(&[source, secret]).set(1);
        } else {
            let _ = self.errors.remove_label_values(&[source, secret]);
        }
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
                let (remotes, skipped) = merged.given.get(i).map_or_else(Default::default, |g| {
                    (g.remotes, g.skipped.values().cloned().collect())
                });
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
    use crate::config::SecretFormat;

    fn remote(name: &str) -> ResolvedRemote {
        ResolvedRemote::on(name, "h")
    }

    /// A discovery of a source in each of `namespaces`, knowing nothing.
    fn sources_in(namespaces: &[&str]) -> Discovery {
        let specs: Vec<DiscoverySpec> = namespaces
            .iter()
            .map(|namespace| DiscoverySpec {
                namespace: (*namespace).to_owned(),
                format: SecretFormat::Kubeconfig,
                label_selector: None,
                required: true,
                kubeconfig: None,
            })
            .collect();
        let home = Remote::new(
            HOME.to_owned(),
            Arc::new(kube::Config::new(
                "https://home:6443".parse().expect("a URL"),
            )),
        );
        let (discovery, _) =
            Discovery::new(&specs, false, home, &Registry::new()).expect("discovery");
        discovery
    }

    /// A discovery of one source that knows `secrets`, as its reflector
    /// would have them.
    fn knowing(secrets: Vec<(&str, Outcome)>) -> Discovery {
        let discovery = sources_in(&["fleet"]);
        {
            let mut known = lock(&discovery.sources[0].known);
            known.listed = true;
            for (name, outcome) in secrets {
                known
                    .secrets
                    .insert(name.to_owned(), source::Entry::of(outcome));
                known.touched.insert(name.to_owned());
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
        let taken: Remotes = [remote("s")].into_iter().collect();
        let mut found = Found::new();
        discovery.update(Some(&taken), &mut found);
        let found: Vec<String> = found.into_values().map(|(_, r)| r.name).collect();
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
        discovery.update(Some(&Remotes::default()), &mut Found::new());
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
        let mut found = Found::new();
        discovery.update(Some(&Remotes::default()), &mut found);
        let failing = || {
            discovery
                .errors
                .get_metric_with_label_values(&["fleet/kubeconfig", ""])
                .map(|g| g.get())
        };
        assert_eq!(failing().ok(), Some(1));
        lock(&discovery.sources[0].known).failing = None;
        discovery.update(None, &mut found);
        let exported = prometheus::core::Collector::collect(&discovery.errors);
        assert!(
            exported.iter().all(|family| family.get_metric().is_empty()),
            "the series went: {exported:?}"
        );
    }

    /// What [`Discovery::update`] must give, worked out from every Secret
    /// at once: the winners by place (name and generation), each source's
    /// count and skipped Secrets (name, field, message), and the error
    /// series.
    type Whole = (
        BTreeMap<Place, (String, u64)>,
        Status,
        BTreeSet<(String, String)>,
    );

    /// Each source's count of remotes and its skipped Secrets (name,
    /// field, message).
    type Status = Vec<(usize, Vec<(String, String, String)>)>;

    /// What a Secret gives, in [`Step::Put`].
    #[derive(Debug, Clone, Copy)]
    enum Gives {
        /// A remote of this name, of a few: 4 is the home cluster's.
        Remote(usize),
        /// An error.
        Error,
        /// Nothing.
        Nothing,
    }

    fn whole(discovery: &Discovery, statics: &BTreeSet<String>) -> Whole {
        let mut holders: BTreeMap<String, String> = statics
            .iter()
            .map(|n| (n.clone(), "a static remote".to_owned()))
            .collect();
        holders.insert(HOME.to_owned(), "the home cluster".to_owned());
        let mut found = BTreeMap::new();
        let mut per_source = Vec::new();
        let mut series = BTreeSet::new();
        for (index, source) in discovery.sources.iter().enumerate() {
            let known = lock(&source.known);
            let label = source.spec.label();
            if known.failing.is_some() {
                series.insert((label.clone(), String::new()));
            }
            let (mut given, mut skipped) = (0, Vec::new());
            for (secret, entry) in &known.secrets {
                match &entry.outcome {
                    Outcome::Ignored => {}
                    Outcome::Skipped(why) => {
                        skipped.push((secret.clone(), why.field.clone(), why.message.clone()));
                    }
                    Outcome::Found(remote) => {
                        if let Some(holder) = holders.get(&remote.name) {
                            let message =
                                format!("{:?} is already the name of {holder}", remote.name);
                            skipped.push((secret.clone(), "name".to_owned(), message));
                        } else {
                            let holder = format!("Secret {}/{secret}", source.spec.namespace);
                            holders.insert(remote.name.clone(), holder);
                            found.insert(
                                (index, secret.clone()),
                                (remote.name.clone(), remote.generation),
                            );
                            given += 1;
                        }
                    }
                }
            }
            series.extend(
                skipped
                    .iter()
                    .map(|(secret, ..)| (label.clone(), secret.clone())),
            );
            per_source.push((given, skipped));
        }
        (found, per_source, series)
    }

    /// One step of what the sources and the daemon may do.
    #[derive(Debug, Clone)]
    enum Step {
        /// A Secret read (anew): a remote (of a few names, the home
        /// cluster's and the static remotes' among them), an error, or
        /// nothing.
        Put(usize, usize, Gives),
        /// A Secret gone.
        Delete(usize, usize),
        /// A reload: the static remotes' names now.
        Statics(BTreeSet<usize>),
        /// A source's list fails, or works again.
        Failing(usize, bool),
        /// The discovery takes in what changed.
        Update,
    }

    fn step() -> impl proptest::strategy::Strategy<Value = Step> {
        use proptest::prelude::*;
        prop_oneof![
            6 => (0usize..2, 0usize..5, prop_oneof![
                4 => (0usize..5).prop_map(Gives::Remote),
                1 => Just(Gives::Error),
                1 => Just(Gives::Nothing),
            ]).prop_map(|(s, k, g)| Step::Put(s, k, g)),
            2 => (0usize..2, 0usize..5).prop_map(|(s, k)| Step::Delete(s, k)),
            1 => proptest::collection::btree_set(0usize..5, 0..3).prop_map(Step::Statics),
            1 => (0usize..2, any::<bool>()).prop_map(|(s, f)| Step::Failing(s, f)),
            4 => Just(Step::Update),
        ]
    }

    proptest::proptest! {
        /// Whatever the sources learn, in whatever batches, the set kept
        /// up to date change by change is the set worked out whole: the
        /// remotes, who has each name, the status and the error series.
        #[test]
        fn the_set_kept_change_by_change_is_the_set_worked_out_whole(
            steps in proptest::collection::vec(step(), 1..60)
        ) {
            // Name 4 is the home cluster's.
            let name = |n: usize| if n == 4 { HOME.to_owned() } else { format!("n{n}") };
            let discovery = sources_in(&["a", "b"]);
            let mut found = Found::new();
            let mut statics: BTreeSet<String> = BTreeSet::new();
            let mut reload: Option<Remotes> = Some(Remotes::default());
            for step in steps.into_iter().chain([Step::Update]) {
                match step {
                    Step::Put(source, secret, outcome) => {
                        let outcome = match outcome {
                            Gives::Nothing => Outcome::Ignored,
                            Gives::Error => Outcome::Skipped(Skipped {
                                field: "data.kubeconfig".to_owned(),
                                message: "is missing".to_owned(),
                            }),
                            Gives::Remote(n) => Outcome::Found(remote(&name(n))),
                        };
                        let secret = format!("x{secret}");
                        let mut known = lock(&discovery.sources[source].known);
                        known.secrets.insert(secret.clone(), source::Entry::of(outcome));
                        known.touched.insert(secret);
                    }
                    Step::Delete(source, secret) => {
                        let secret = format!("x{secret}");
                        let mut known = lock(&discovery.sources[source].known);
                        if known.secrets.remove(&secret).is_some() {
                            known.touched.insert(secret);
                        }
                    }
                    Step::Statics(names) => {
                        statics = names.into_iter().map(name).filter(|n| n != HOME).collect();
                        reload = Some(statics.iter().map(|n| remote(n)).collect());
                    }
                    Step::Failing(source, failing) => {
                        lock(&discovery.sources[source].known).failing =
                            failing.then(|| ("no answer".to_owned(), SystemTime::now()));
                    }
                    Step::Update => {
                        discovery.update(reload.take().as_ref(), &mut found);
                        let (winners, per_source, series) = whole(&discovery, &statics);
                        let kept: BTreeMap<Place, (String, u64)> = found
                            .iter()
                            .map(|(name, (place, r))| {
                                assert_eq!(*name, r.name);
                                (place.clone(), (r.name.clone(), r.generation))
                            })
                            .collect();
                        proptest::prop_assert_eq!(kept, winners);
                        let status: Status = discovery
                            .status()
                            .into_iter()
                            .map(|s| {
                                let skipped = s.skipped.into_iter().map(|k| {
                                    (k.secret, k.skipped.field, k.skipped.message)
                                });
                                (s.remotes, skipped.collect())
                            })
                            .collect();
                        proptest::prop_assert_eq!(&status, &per_source);
                        let exported: BTreeSet<(String, String)> =
                            prometheus::core::Collector::collect(&discovery.errors)
                                .iter()
                                .flat_map(prometheus::proto::MetricFamily::get_metric)
                                .map(|m| {
                                    let label = |n: &str| {
                                        m.get_label().iter().find(|l| l.name() == n)
                                            .map(|l| l.value().to_owned()).unwrap_or_default()
                                    };
                                    (label("source"), label("secret"))
                                })
                                .collect();
                        proptest::prop_assert_eq!(exported, series);
                        for (index, source) in discovery.sources.iter().enumerate() {
                            let gauge = discovery
                                .found
                                .get_metric_with_label_values(&[&source.spec.label()])
                                .map(|g| g.get());
                            proptest::prop_assert_eq!(
                                gauge.ok(),
                                Some(i64::try_from(per_source[index].0).unwrap_or(-1))
                            );
                        }
                    }
                }
            }
        }
    }
}
