//! The plan: what this replica's manager runs, resolved from the config.
//!
//! The daemon makes a plan from the config and the remotes this replica
//! holds, at the start and at each reload, rotation or change of share, and
//! hands it to the manager (see `crate::managers`). Which remotes are
//! required is a fact of the plan, not of a manager.

use std::collections::BTreeSet;

use super::ranked::Remotes;
use super::{Config, ExecSpec, WatchSpec};

/// What the manager runs: the remotes, what is cached on each, and the
/// process, if the manager is one.
#[derive(Debug, Clone, Default)]
pub struct Plan {
    /// The remotes this replica holds, in config order (the discovered
    /// ones after the static ones).
    pub remotes: Remotes,
    /// The resource types the built-in manager caches on every remote.
    pub watch: Vec<WatchSpec>,
    /// The process the exec manager runs, when the manager is one.
    pub exec: Option<ExecSpec>,
}

impl Plan {
    /// The plan for `remotes` under `config`.
    #[must_use]
    pub fn new(config: &Config, remotes: Remotes) -> Self {
        Self {
            remotes,
            watch: config.watch.clone(),
            exec: config.exec.clone(),
        }
    }

    /// The names of the required remotes.
    #[must_use]
    pub fn required(&self) -> BTreeSet<String> {
        self.remotes
            .iter()
            .filter(|r| r.required)
            .map(|r| r.name.clone())
            .collect()
    }

    /// Every `(remote, resource)` pair the built-in manager caches.
    #[must_use]
    pub fn pairs(&self) -> BTreeSet<(String, String)> {
        if self.watch.is_empty() {
            return BTreeSet::new();
        }
        self.remotes
            .iter()
            .flat_map(|r| {
                self.watch
                    .iter()
                    .map(|w| (r.name.clone(), w.resource_label()))
            })
            .collect()
    }
}
