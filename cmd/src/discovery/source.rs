//! One source's reflector: its Secrets listed, then watched (with
//! bookmarks), each read as a cluster once per change of its data.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use futures_util::StreamExt as _;
use k8s_openapi::api::core::v1::Secret;
use kube::api::Api;
use kube::runtime::watcher;
use tether_supervisor::{Backoff, BackoffConfig};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::secret::{self, Skipped};
use crate::config::remote::{self, ResolvedRemote};
use crate::config::{DiscoverySpec, SecretSource};
use crate::lock;

/// How a failing list or watch is retried: 1s doubling to 30s, ±20%, reset
/// by an answer. Each retry lists anew, so that a set changed during an
/// outage is reconciled whole.
const RETRY: BackoffConfig = BackoffConfig {
    initial: Duration::from_secs(1),
    max: Duration::from_secs(30),
    factor: 2.0,
    jitter: 0.2,
};

/// How many Secrets one page of a list may hold. kube's watcher asks for
/// 500; a Cluster API namespace labels every Secret of a cluster, bootstrap
/// data of up to 1 MiB included, and a real kube-apiserver answered one list
/// of 60 such Secrets with 76 MiB, past [`MAX_RESPONSE`] (64 MiB), so that
/// the source never listed. An object is at most 1.5 MiB in etcd and at most
/// [`MAX_WATCH_EVENT`] (4 MiB) as tether reads it: ten of them, 40 MiB at
/// most, always fit, and a page costs tether at most that, once.
///
/// [`MAX_RESPONSE`]: tether_probes::client::MAX_RESPONSE
/// [`MAX_WATCH_EVENT`]: tether_probes::client::MAX_WATCH_EVENT
const PAGE: u32 = 10;

/// How long a watch of the home cluster's Secrets lasts before the
/// apiserver ends it (`timeoutSeconds`) and tether watches again from where
/// it was: an idle watch ends this often, well within [`READ_TIMEOUT`], so
/// that silence past it means a dead path, never a quiet namespace. (kube's
/// watcher also gives up on a watch silent for this plus 5 s, and starts
/// another.)
const WATCH_TIMEOUT: u32 = 10;

/// How long a request to the home cluster may go without a byte of its
/// answer: a list, the start of a watch, or a watch between two events. A
/// path that drops packets fails the request within it, the source shows
/// as failing, and it lists anew when the path heals: a watch gone silent
/// is given up after 15 s, and the request that replaces it fails 20 s
/// later, so a source shows as failing within 35 s. client-go finds such a
/// connection dead in about 45 s (a 30 s HTTP/2 ping, 15 s to answer it).
const READ_TIMEOUT: Duration = Duration::from_secs(20);

/// How long the home cluster may take to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The home cluster's config as discovery uses it: every request with a
/// deadline. kube's defaults have none: a list or a watch whose packets are
/// dropped would wait forever, and clusters added, removed or rotated in
/// the meantime would go unseen until a restart.
pub(super) fn client_config(mut config: kube::Config) -> kube::Config {
    config.read_timeout = Some(READ_TIMEOUT);
    config.write_timeout = Some(READ_TIMEOUT);
    config.connect_timeout = Some(CONNECT_TIMEOUT);
    config
}

/// What one Secret gave.
#[derive(Debug, Clone)]
pub(super) enum Outcome {
    /// A remote.
    Found(ResolvedRemote),
    /// Nothing: it is not a cluster of this format (Cluster API's other
    /// Secrets of a cluster).
    Ignored,
    /// An error on this Secret alone.
    Skipped(Skipped),
}

/// One Secret as last read: the digest of what it was read from, and what
/// it gave.
#[derive(Debug, Clone)]
pub(super) struct Entry {
    digest: Vec<u8>,
    pub(super) outcome: Outcome,
}

#[cfg(test)]
impl Entry {
    /// An entry that gave `outcome`, for the tests.
    pub(super) fn of(outcome: Outcome) -> Self {
        Self {
            digest: Vec::new(),
            outcome,
        }
    }
}

/// What a source knows, as its reflector keeps it.
#[derive(Debug, Default)]
pub(super) struct Known {
    /// Whether it has listed its Secrets once: until then, it knows none.
    pub(super) listed: bool,
    /// When it last listed them whole.
    pub(super) listed_at: Option<SystemTime>,
    /// Its Secrets by name, in name order.
    pub(super) secrets: BTreeMap<String, Entry>,
    /// The Secrets whose outcome may have changed since the discovery last
    /// took them in (added, read anew, or gone): what a change costs it.
    pub(super) touched: BTreeSet<String>,
    /// Why its list or watch fails, and since when; `None` while it works.
    pub(super) failing: Option<(String, SystemTime)>,
}

/// A running source: what it knows, shared with the discovery.
#[derive(Debug)]
pub(super) struct Source {
    pub(super) spec: DiscoverySpec,
    /// Whether each remote keeps its Secret's kubeconfig (as JSON), for
    /// the exec manager's process.
    pub(super) keep_kubeconfigs: bool,
    pub(super) known: Mutex<Known>,
}

/// A digest of what a Secret is read from: its name, the label Cluster API
/// names its cluster by, and its data. Other labels and annotations may
/// change without a rebuild.
fn digest(secret: &Secret) -> Vec<u8> {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    let mut add = |bytes: &[u8]| {
        context.update(&(bytes.len() as u64).to_le_bytes());
        context.update(bytes);
    };
    add(secret
        .metadata
        .name
        .as_deref()
        .unwrap_or_default()
        .as_bytes());
    let cluster = secret
        .metadata
        .labels
        .as_ref()
        .and_then(|labels| labels.get(secret::CLUSTER_NAME));
    add(cluster.map_or(&[][..], String::as_bytes));
    for (key, value) in secret.data.iter().flatten() {
        add(key.as_bytes());
        add(&value.0);
    }
    context.finish().as_ref().to_vec()
}

/// The Secrets a new list changes from `before`: those gone, those new, and
/// those read anew (another digest). A list is whole, so this is the one
/// place a change costs work in proportion to the Secrets.
fn relisted(before: &BTreeMap<String, Entry>, now: &BTreeMap<String, Entry>) -> Vec<String> {
    let gone = before.keys().filter(|name| !now.contains_key(*name));
    let changed = now
        .iter()
        .filter(|(name, entry)| before.get(*name).is_none_or(|b| b.digest != entry.digest))
        .map(|(name, _)| name);
    gone.chain(changed).cloned().collect()
}

impl Source {
    /// What `secret` gives: the last entry again if its data is unchanged
    /// (its probe keeps its client and connection), else read anew. A
    /// Secret that is skipped is logged here, once per change.
    async fn read(&self, secret: &Secret, last: Option<Entry>) -> Entry {
        let digest = digest(secret);
        if let Some(last) = last
            && last.digest == digest
        {
            return last;
        }
        let name = secret.metadata.name.clone().unwrap_or_default();
        let outcome = match secret::read(self.spec.format, secret) {
            Ok(None) => Outcome::Ignored,
            Err(skipped) => Outcome::Skipped(skipped),
            Ok(Some(found)) => {
                let source = Arc::new(SecretSource {
                    namespace: self.spec.namespace.clone(),
                    name: name.clone(),
                    digest: digest.clone(),
                    kubeconfig: self.keep_kubeconfigs.then_some(found.json),
                });
                let required = self.spec.required;
                match remote::discovered(&found.name, required, &found.kubeconfig, source).await {
                    Ok(remote) => Outcome::Found(remote),
                    Err((field, message)) => Outcome::Skipped(Skipped {
                        field: secret::field_of(self.spec.format, field),
                        message,
                    }),
                }
            }
        };
        if let Outcome::Skipped(skipped) = &outcome {
            warn!(
                source = %self.spec.label(),
                secret = %tether_supervisor::printable(&name, 253),
                field = %skipped.field,
                error = %skipped.message,
                "a discovered Secret is skipped; every other remote runs on"
            );
        }
        Entry { digest, outcome }
    }

    /// Takes in `secret`, added or changed; whether what the source knows
    /// changed. A Secret whose data did not (another label, a resync)
    /// changes nothing downstream.
    async fn apply(&self, secret: &Secret) -> bool {
        let Some(name) = secret.metadata.name.clone() else {
            return false;
        };
        let last = lock(&self.known).secrets.get(&name).cloned();
        let read_before = last.as_ref().map(|e| e.digest.clone());
        let entry = self.read(secret, last).await;
        if read_before.as_ref() == Some(&entry.digest) {
            return false;
        }
        let mut known = lock(&self.known);
        known.secrets.insert(name.clone(), entry);
        known.touched.insert(name);
        true
    }

    /// Forgets `secret`, deleted; whether the source knew it.
    fn delete(&self, secret: &Secret) -> bool {
        let Some(name) = &secret.metadata.name else {
            return false;
        };
        let mut known = lock(&self.known);
        let knew = known.secrets.remove(name).is_some();
        if knew {
            known.touched.insert(name.clone());
        }
        knew
    }

    /// Lists and watches the source's Secrets with `client` until `stop`,
    /// telling `changed` after each change of what it knows.
    pub(super) async fn run(
        self: Arc<Self>,
        client: kube::Client,
        changed: watch::Sender<u64>,
        stop: CancellationToken,
    ) {
        let api: Api<Secret> = Api::namespaced(client, &self.spec.namespace);
        // Paged, so that no page can pass the response bound (see PAGE),
        // and with the apiserver's default (consistent) semantics, which
        // honour the limit: a list at `resourceVersion=0` is one the watch
        // cache has long served whole, whatever the limit.
        let config = watcher::Config::default()
            .labels(&self.spec.selector())
            .page_size(PAGE)
            .timeout(WATCH_TIMEOUT);
        let label = self.spec.label();
        let mut retry = Backoff::new(RETRY);
        let mut failures = 0u32;
        loop {
            let mut stream = watcher(api.clone(), config.clone()).boxed();
            // The Secrets of a list in progress; the set is replaced whole
            // at its end, so that those deleted meanwhile go.
            let mut listing: Option<BTreeMap<String, Entry>> = None;
            let error = loop {
                let event = tokio::select! {
                    () = stop.cancelled() => return,
                    event = stream.next() => event,
                };
                let event = match event {
                    None => break "the watch ended".to_owned(),
                    Some(Err(err)) => break tether_probes::client::root_cause(&err),
                    Some(Ok(event)) => event,
                };
                if !matches!(event, watcher::Event::Init) && failures > 0 {
                    info!(source = %label, failures, "the home cluster answers again: listing its Secrets");
                    failures = 0;
                    retry.reset();
                    lock(&self.known).failing = None;
                }
                match event {
                    watcher::Event::Init => listing = Some(BTreeMap::new()),
                    watcher::Event::InitApply(secret) => {
                        let Some(name) = secret.metadata.name.clone() else {
                            continue;
                        };
                        let last = lock(&self.known).secrets.get(&name).cloned();
                        let entry = self.read(&secret, last).await;
                        listing.get_or_insert_default().insert(name, entry);
                    }
                    watcher::Event::InitDone => {
                        let secrets = listing.take().unwrap_or_default();
                        let count = secrets.len();
                        {
                            let mut known = lock(&self.known);
                            let touched = relisted(&known.secrets, &secrets);
                            known.touched.extend(touched);
                            known.secrets = secrets;
                            known.listed = true;
                            known.listed_at = Some(SystemTime::now());
                        }
                        debug!(source = %label, secrets = count, "listed");
                        changed.send_modify(|n| *n += 1);
                    }
                    watcher::Event::Apply(secret) => {
                        if self.apply(&secret).await {
                            changed.send_modify(|n| *n += 1);
                        }
                    }
                    watcher::Event::Delete(secret) => {
                        if self.delete(&secret) {
                            changed.send_modify(|n| *n += 1);
                        }
                    }
                }
            };
            failures += 1;
            if failures == 1 {
                warn!(source = %label, %error, "cannot list or watch the home cluster's Secrets; the last known remotes stay, retrying with backoff");
            } else {
                debug!(source = %label, %error, failures, "still cannot list or watch the home cluster's Secrets");
            }
            {
                let mut known = lock(&self.known);
                let since = known
                    .failing
                    .as_ref()
                    .map_or_else(SystemTime::now, |(_, since)| *since);
                known.failing = Some((error, since));
            }
            changed.send_modify(|n| *n += 1);
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(retry.next_delay()) => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(labels: &[(&str, &str)], data: &[u8]) -> Secret {
        secret::secret("s", labels, &[("value", data)])
    }

    /// A source of `format`, knowing nothing yet.
    fn source(format: crate::config::SecretFormat, keep_kubeconfigs: bool) -> Source {
        Source {
            spec: DiscoverySpec {
                namespace: "fleet".to_owned(),
                format,
                label_selector: None,
                required: true,
                kubeconfig: None,
            },
            keep_kubeconfigs,
            known: Mutex::new(Known::default()),
        }
    }

    /// Why a source of `format` skips `secret`.
    async fn skipped_as(format: crate::config::SecretFormat, secret: &Secret) -> Skipped {
        match source(format, false).read(secret, None).await.outcome {
            Outcome::Skipped(skipped) => skipped,
            _ => panic!("{:?} was not skipped", secret.metadata.name),
        }
    }

    #[tokio::test]
    async fn a_remote_keeps_its_secrets_kubeconfig_only_for_the_exec_manager() {
        use crate::config::RemoteSource;
        use secrecy::ExposeSecret as _;

        let kubeconfig = "clusters: [{name: c, cluster: {server: \"https://10.0.0.1:6443\"}}]\nusers: [{name: u, user: {token: abc}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\n";
        let provider = secret::secret("edge-1", &[], &[("kubeconfig", kubeconfig.as_bytes())]);
        let format = crate::config::SecretFormat::Kubeconfig;
        let mut kept = Vec::new();
        for keep in [true, false] {
            kept.push(
                match source(format, keep).read(&provider, None).await.outcome {
                    Outcome::Found(remote) => match remote.source {
                        RemoteSource::Secret(secret) => secret
                            .kubeconfig
                            .as_ref()
                            .map(|json| json.expose_secret().to_vec()),
                        other => panic!("a discovered remote from {other:?}"),
                    },
                    other => panic!("edge-1 gave no remote: {other:?}"),
                },
            );
        }
        let json = kept[0].as_deref().expect("kept for the exec manager");
        let read: kube::config::Kubeconfig = serde_json::from_slice(json).expect("a kubeconfig");
        let cluster = read.clusters[0].cluster.as_ref().expect("its cluster");
        assert_eq!(cluster.server.as_deref(), Some("https://10.0.0.1:6443"));
        assert_eq!(kept[1], None, "nothing else reads it");
    }

    #[tokio::test]
    async fn a_server_that_cannot_be_probed_is_named_by_its_field_and_never_quoted() {
        let token = "s3cret-in-the-query";
        for server in [
            format!("ftp://10.0.0.1:21/?token={token}"),
            format!("https://user:{token}@/?token={token}"),
        ] {
            let argo = secret::secret(
                "cluster-x",
                &[],
                &[
                    ("name", b"x"),
                    ("server", server.as_bytes()),
                    ("config", br#"{"bearerToken":"t"}"#),
                ],
            );
            let skipped = skipped_as(crate::config::SecretFormat::ArgoCd, &argo).await;
            assert_eq!(skipped.field, "data.server", "{skipped}");
            assert!(!skipped.to_string().contains(token), "{skipped}");
        }
        let kubeconfig = format!(
            "clusters: [{{name: c, cluster: {{server: \"ftp://h/?token={token}\"}}}}]\ncontexts: [{{name: c, context: {{cluster: c}}}}]\ncurrent-context: c\n"
        );
        let provider = secret::secret("edge-1", &[], &[("kubeconfig", kubeconfig.as_bytes())]);
        let skipped = skipped_as(crate::config::SecretFormat::Kubeconfig, &provider).await;
        assert_eq!(skipped.field, "data.kubeconfig", "{skipped}");
        assert!(skipped.message.contains("its server"), "{skipped}");
        assert!(!skipped.to_string().contains(token), "{skipped}");
    }

    #[test]
    fn a_secret_is_read_again_only_when_what_it_is_read_from_changes() {
        let cluster = secret::CLUSTER_NAME;
        let first = digest(&secret(&[(cluster, "a"), ("team", "x")], b"one"));
        assert_eq!(
            first,
            digest(&secret(&[(cluster, "a"), ("team", "y")], b"one")),
            "another label"
        );
        assert_ne!(
            first,
            digest(&secret(&[(cluster, "a")], b"two")),
            "the data"
        );
        assert_ne!(
            first,
            digest(&secret(&[(cluster, "b")], b"one")),
            "the cluster's name"
        );
    }

    #[test]
    fn a_new_list_touches_the_secrets_gone_new_and_read_anew_alone() {
        let entry = |digest: &[u8]| Entry {
            digest: digest.to_vec(),
            outcome: Outcome::Ignored,
        };
        let before = BTreeMap::from([
            ("kept".to_owned(), entry(b"1")),
            ("gone".to_owned(), entry(b"2")),
            ("rotated".to_owned(), entry(b"3")),
        ]);
        let now = BTreeMap::from([
            ("kept".to_owned(), entry(b"1")),
            ("rotated".to_owned(), entry(b"4")),
            ("new".to_owned(), entry(b"5")),
        ]);
        let mut touched = relisted(&before, &now);
        touched.sort();
        assert_eq!(touched, ["gone", "new", "rotated"]);
    }
}
