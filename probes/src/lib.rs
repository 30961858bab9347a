//! Reachability probes for the remote apiservers tether watches.
//!
//! This crate will own remote identity and dedupe, the classification of a
//! probe result, the sustained-failure state machine, and the process-lifetime
//! probe set with its metrics (see `DESIGN.md`, "Probe semantics"). It has no
//! code yet: that is the work of its own issue.
#![deny(missing_docs)]
