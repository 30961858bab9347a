//! The tether daemon as a library; the `tether` binary is `cli::main`.
//!
//! Where each concern lives, around one value, the [`config::Plan`]:
//!
//! - `config/`: the file's raw shape, its checks and defaults, each
//!   remote's settings resolved (and their files watched), and the plan
//!   made from them;
//! - `managers/`: the built-in watch manager and the exec manager, each
//!   consuming the plan, behind one seam the supervisor drives;
//! - `discovery/`: remotes from the home cluster's Secrets, beside the
//!   static ones;
//! - `lease/`: leader election and sharding, on one shared claim type;
//! - `admin/`: the admin server, with one status view rendered as JSON and
//!   HTML. It holds no handle to the supervisor, the Leases or discovery:
//!   for each request the daemon hands it an [`admin::Snapshot`], readiness
//!   decided once in it; it reads the manager only through
//!   [`admin::ManagerStatus`];
//! - `cli/`: the subcommands (`run`, `validate`, `check`, `demo`,
//!   `install`);
//! - `daemon/`: the wiring of config, probes, supervisor, manager, lease
//!   and admin, the snapshot the admin server is handed, and the reloads;
//! - `events.rs`: Kubernetes Events on tether's own Pod;
//! - `human.rs`, `stdout.rs`, `limits.rs`: words and numbers for people,
//!   stdout that never panics, and the descriptor limit.
//!
//! Data flows one way: config → plan → supervisor → (probes, manager) →
//! metrics and health.
#![deny(missing_docs)]

// The crate's API is what `main`, the benches and the integration tests
// use; every other module is the crate's own (`unreachable_pub` keeps
// their items `pub(crate)`).
pub mod admin;
pub mod cli;
pub mod config;
pub mod daemon;
pub(crate) mod desired;
pub mod discovery;
pub(crate) mod events;
pub(crate) mod human;
pub mod lease;
pub(crate) mod limits;
pub mod managers;
pub(crate) mod stdout;

/// Locks `mutex`. Every critical section in tether only assigns whole
/// values, so a poisoned lock still guards a consistent value.
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
