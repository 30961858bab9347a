//! A simulated Kubernetes apiserver for tether's tests and `tether demo`.
//!
//! It will speak the real protocol over real sockets (list and watch,
//! bookmarks, `resourceVersion`, `/readyz`, TLS, bearer tokens) and inject
//! socket-level faults. It depends on no tether crate, so every crate can use
//! it as a dev-dependency. It has no code yet: that is the work of its own
//! issue.
#![deny(missing_docs)]
