//! The process's limit on open file descriptors.

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

/// Raises the soft limit on open descriptors to the hard limit, as far as
/// the process may. Every remote costs a probe connection and a watch
/// connection or more, and the soft limit a container starts with (often
/// 1,024) runs out long before the hard one. Returns the soft limit before
/// and after, when it changed.
#[must_use]
pub(crate) fn raise_descriptor_limit() -> Option<(u64, u64)> {
    let Rlimit { current, maximum } = getrlimit(Resource::Nofile);
    let (Some(soft), Some(hard)) = (current, maximum) else {
        // Unlimited already, or no hard limit to reach.
        return None;
    };
    if soft >= hard {
        return None;
    }
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(hard),
            maximum: Some(hard),
        },
    )
    .ok()?;
    Some((soft, hard))
}
