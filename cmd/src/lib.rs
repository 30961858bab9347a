//! The tether daemon as a library: configuration and the wiring of remotes
//! to kube clients. The `tether` binary is a thin layer over it.
#![deny(missing_docs)]

pub mod admin;
pub mod config;
pub mod daemon;
pub mod demo;
pub mod events;
pub mod exec;
pub mod human;
pub mod lease;
pub mod limits;
pub mod manager;
pub mod reaper;
pub mod remote;
pub mod sources;
pub mod stdout;

/// Locks `mutex`. Every critical section in tether only assigns whole
/// values, so a poisoned lock still guards a consistent value.
pub(crate) fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
