//! What a probe found, and how a transport error is classified.

use std::error::Error as StdError;
use std::fmt;
use std::io;
use std::time::Duration;

/// Why a remote was unreachable: a closed set, used in logs and status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureCause {
    /// The connection was refused: nothing listens.
    Refused,
    /// The connection was reset or closed mid-request.
    Reset,
    /// No answer within the deadline, at connect or at read.
    Timeout,
    /// The TLS handshake failed (an unknown CA, a wrong name).
    Tls,
    /// The host name did not resolve.
    Dns,
    /// The remote answered with a status listed in `unreachableStatuses`.
    Status,
    /// Any other transport failure.
    Other,
}

impl FailureCause {
    /// The `snake_case` name.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Refused => "refused",
            Self::Reset => "reset",
            Self::Timeout => "timeout",
            Self::Tls => "tls",
            Self::Dns => "dns",
            Self::Status => "status",
            Self::Other => "other",
        }
    }
}

impl fmt::Display for FailureCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What one probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The remote answered with an HTTP status. A rebuild cannot fix an auth
    /// or server error, so every status is reachable unless listed in
    /// `unreachableStatuses`.
    Reachable {
        /// The HTTP status; `0` ([`HEAD_TOO_LARGE`](crate::HEAD_TOO_LARGE))
        /// for an answer whose head was too large to read.
        status: u16,
    },
    /// A transport failure, the deadline, or a listed status.
    Unreachable {
        /// The class of the failure.
        cause: FailureCause,
        /// The root cause, for the log (never contains credentials).
        error: String,
    },
    /// The probe could not be made here: unreadable credentials, a failing
    /// exec plugin, a bad client configuration, no file descriptor left. Not
    /// a reachability result: it never counts toward the failure threshold.
    LocalError {
        /// What kind of local trouble.
        kind: LocalKind,
        /// The root cause, for the log.
        error: String,
    },
}

/// What kept a probe from being made here: a closed set, the `kind` label
/// of `tether_local_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LocalKind {
    /// This process, or the host, has no file descriptor left (`EMFILE`,
    /// `ENFILE`): the remote is not to blame.
    Descriptors,
    /// Credentials: an exec plugin that fails or hangs, a token file that
    /// cannot be read.
    Credentials,
    /// Anything else: a client that cannot be built, a bad request.
    Other,
}

impl LocalKind {
    /// Every kind, so the counter can start at 0 for each.
    pub const ALL: [Self; 3] = [Self::Descriptors, Self::Credentials, Self::Other];

    /// The `snake_case` label value.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Descriptors => "descriptors",
            Self::Credentials => "credentials",
            Self::Other => "other",
        }
    }

    /// The kind of the local trouble behind `error`.
    #[must_use]
    pub fn of(error: &(dyn StdError + 'static)) -> Self {
        if out_of_descriptors(error) {
            return Self::Descriptors;
        }
        let mut current = Some(error);
        while let Some(err) = current {
            if err.is::<kube::client::AuthError>() || err.is::<crate::credentials::BuildError>() {
                return Self::Credentials;
            }
            current = next_cause(err);
        }
        Self::Other
    }
}

impl fmt::Display for LocalKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Whether `error`'s chain holds `EMFILE` or `ENFILE`: no file descriptor
/// left, in this process or on the host. That is never the remote's fault.
#[must_use]
pub fn out_of_descriptors(error: &(dyn StdError + 'static)) -> bool {
    let mut current = Some(error);
    while let Some(err) = current {
        if let Some(io) = err.downcast_ref::<io::Error>()
            && let Some(code) = io.raw_os_error()
            && matches!(
                rustix::io::Errno::from_raw_os_error(code),
                rustix::io::Errno::MFILE | rustix::io::Errno::NFILE
            )
        {
            return true;
        }
        current = next_cause(err);
    }
    false
}

/// One probe's outcome and how long it took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeResult {
    /// What the probe found.
    pub outcome: Outcome,
    /// From the start of the request to its outcome.
    pub latency: Duration,
}

impl ProbeResult {
    /// Whether the remote answered 2xx (`/readyz` says it is ready).
    #[must_use]
    pub fn ready(&self) -> bool {
        matches!(self.outcome, Outcome::Reachable { status } if (200..300).contains(&status))
    }
}

/// The next error down the chain.
///
/// `io::Error::source()` skips the error it wraps and returns *that* error's
/// source, so a wrapped `rustls::Error` would never be seen; look inside the
/// `io::Error` instead.
fn next_cause<'a>(error: &'a (dyn StdError + 'static)) -> Option<&'a (dyn StdError + 'static)> {
    match error
        .downcast_ref::<io::Error>()
        .and_then(io::Error::get_ref)
    {
        Some(inner) => Some(inner),
        None => error.source(),
    }
}

/// The innermost cause's message: what actually went wrong.
///
/// An exec credential plugin's failure is told by its exit status and a
/// fixed message, never by kube's text for it, which carries the plugin's
/// command line and everything it printed: a token, possibly. The message
/// may be a peer's (an apiserver's `Status` message): it comes out fit to
/// print, control characters escaped and cut at
/// [`MAX_ERROR_CHARS`](tether_supervisor::MAX_ERROR_CHARS).
#[must_use]
pub fn root_cause(error: &(dyn StdError + 'static)) -> String {
    let mut current = error;
    let told = loop {
        if let Some(told) = plugin_failure(current) {
            break told;
        }
        match next_cause(current) {
            Some(next) => current = next,
            None => break current.to_string(),
        }
    };
    tether_supervisor::printable(&told, tether_supervisor::MAX_ERROR_CHARS).into_owned()
}

/// What went wrong with an exec credential plugin, without its output.
fn plugin_failure(error: &(dyn StdError + 'static)) -> Option<String> {
    use kube::client::AuthError;

    let told = match error.downcast_ref::<AuthError>()? {
        AuthError::AuthExecRun { out, .. } => {
            format!(
                "the exec credential plugin failed ({}); its output is not shown, as it may hold a token",
                out.status
            )
        }
        AuthError::AuthExecStart(err) => {
            format!("the exec credential plugin could not start: {err}")
        }
        AuthError::AuthExecParse(_) => {
            "the exec credential plugin's output is not an ExecCredential".to_owned()
        }
        AuthError::ExecPluginFailed => {
            "the exec credential plugin's ExecCredential has no status".to_owned()
        }
        AuthError::MalformedTokenExpirationDate(_) => {
            "the exec credential plugin's token has a malformed expiration date".to_owned()
        }
        AuthError::MissingCommand => "the exec credential plugin has no command".to_owned(),
        AuthError::ExecMissingClusterInfo => {
            "the exec credential plugin wants cluster info (provideClusterInfo) and the kubeconfig has none".to_owned()
        }
        AuthError::AuthExecSerialize(_) | AuthError::AuthExec(_) => {
            "the exec credential plugin could not be run".to_owned()
        }
        _ => return None,
    };
    Some(told)
}

fn classify_io(err: &io::Error) -> Option<FailureCause> {
    match err.kind() {
        io::ErrorKind::ConnectionRefused => Some(FailureCause::Refused),
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::UnexpectedEof => Some(FailureCause::Reset),
        io::ErrorKind::TimedOut => Some(FailureCause::Timeout),
        _ => None,
    }
}

/// Classifies one error of the chain, if it is decisive.
fn classify_one(error: &(dyn StdError + 'static)) -> Option<FailureCause> {
    if let Some(io) = error.downcast_ref::<io::Error>() {
        return classify_io(io);
    }
    if error.downcast_ref::<rustls::Error>().is_some() {
        return Some(FailureCause::Tls);
    }
    if error
        .downcast_ref::<hyper_util::client::legacy::Error>()
        .is_some()
    {
        // hyper-util's client error only says "client error (Connect)"; its
        // sources say what happened.
        return None;
    }
    // hyper-util's connector names a resolver failure only in its message,
    // and hyper an early close only in its.
    let text = error.to_string();
    if text.starts_with("dns error") {
        return Some(FailureCause::Dns);
    }
    if text.contains("connection closed before message completed") {
        return Some(FailureCause::Reset);
    }
    None
}

/// Classifies the error of a probe request.
///
/// Transport failures arrive as `kube::Error::Service` wrapping hyper-util's
/// error, or as `kube::Error::HyperError`; the cause is found by walking
/// `source()`. Errors that happen before anything reaches the network
/// (credentials, request building) are local.
#[must_use]
pub fn classify(error: &kube::Error) -> Outcome {
    let local = match error {
        kube::Error::Auth(_) | kube::Error::BuildRequest(_) | kube::Error::HttpError(_) => true,
        kube::Error::Service(inner) => inner.is::<kube::client::AuthError>(),
        _ => false,
    };
    if local || out_of_descriptors(error) {
        return Outcome::LocalError {
            kind: LocalKind::of(error),
            error: root_cause(error),
        };
    }
    Outcome::Unreachable {
        cause: cause_in(error, FailureCause::Other),
        error: root_cause(error),
    }
}

/// The class of the transport failure behind `error`, from a request a
/// manager made (a list, a watch): `None` when the remote answered (an API
/// error is a status) or the request failed before the network
/// (credentials).
///
/// A manager that sees one asks the probes to check the remote on a fresh
/// connection ([`ProbeSetHandle::suspect`](crate::ProbeSetHandle::suspect)).
#[must_use]
pub fn transport_failure(error: &kube::Error) -> Option<FailureCause> {
    // No descriptor left is this process's trouble, not the remote's.
    if out_of_descriptors(error) {
        return None;
    }
    // A response cut for its size came over a working connection.
    let mut current: Option<&(dyn StdError + 'static)> = Some(error);
    while let Some(err) = current {
        if err.is::<crate::bounded::ResponseTooLarge>() {
            return None;
        }
        current = next_cause(err);
    }
    match error {
        kube::Error::HyperError(_) | kube::Error::Service(_) | kube::Error::ReadEvents(_) => {
            match classify(error) {
                Outcome::Unreachable { cause, .. } => Some(cause),
                Outcome::Reachable { .. } | Outcome::LocalError { .. } => None,
            }
        }
        _ => None,
    }
}

/// The first decisive cause down `error`'s chain, else `fallback`.
pub(crate) fn cause_in(error: &(dyn StdError + 'static), fallback: FailureCause) -> FailureCause {
    let mut current = Some(error);
    while let Some(err) = current {
        if let Some(found) = classify_one(err) {
            return found;
        }
        current = next_cause(err);
    }
    fallback
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] io::Error);

    #[test]
    fn io_kinds_map_to_causes() {
        for (kind, cause) in [
            (io::ErrorKind::ConnectionRefused, FailureCause::Refused),
            (io::ErrorKind::ConnectionReset, FailureCause::Reset),
            (io::ErrorKind::TimedOut, FailureCause::Timeout),
        ] {
            let err = kube::Error::Service(Box::new(Outer(io::Error::from(kind))));
            match classify(&err) {
                Outcome::Unreachable { cause: got, .. } => assert_eq!(got, cause, "{kind:?}"),
                other => panic!("{kind:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn a_rustls_error_inside_io_is_tls() {
        let io = io::Error::new(io::ErrorKind::InvalidData, rustls::Error::DecryptError);
        let err = kube::Error::Service(Box::new(Outer(io)));
        assert!(matches!(
            classify(&err),
            Outcome::Unreachable {
                cause: FailureCause::Tls,
                ..
            }
        ));
    }

    #[test]
    fn only_a_transport_failure_is_one() {
        let refused = kube::Error::Service(Box::new(Outer(io::Error::from(
            io::ErrorKind::ConnectionRefused,
        ))));
        assert_eq!(transport_failure(&refused), Some(FailureCause::Refused));
        let status = kube::Error::Api(Box::new(kube::core::Status::failure(
            "forbidden",
            "Forbidden",
        )));
        assert_eq!(
            transport_failure(&status),
            None,
            "an API error is an answer"
        );
        let auth = kube::Error::Auth(kube::client::AuthError::InvalidBasicAuth(
            http::HeaderValue::from_bytes(b"\n").expect_err("a newline is invalid"),
        ));
        assert_eq!(transport_failure(&auth), None, "credentials fail here");
    }

    #[test]
    fn a_failed_plugin_is_told_by_its_status_never_its_output() {
        use std::os::unix::process::ExitStatusExt as _;

        let out = std::process::Output {
            status: std::process::ExitStatus::from_raw(3 << 8),
            stdout: b"token-s3cret".to_vec(),
            stderr: b"printed s3cret".to_vec(),
        };
        let err = kube::Error::Auth(kube::client::AuthError::AuthExecRun {
            cmd: "\"get-token\" \"--secret=s3cret\"".to_owned(),
            out: Box::new(out),
        });
        let told = root_cause(&err);
        assert!(told.contains("exit status: 3"), "{told}");
        assert!(!told.contains("s3cret"), "{told}");
        let wrapped = kube::Error::Service(Box::new(kube::client::AuthError::AuthExecStart(
            io::Error::from(io::ErrorKind::NotFound),
        )));
        assert!(root_cause(&wrapped).starts_with("the exec credential plugin could not start"));
    }

    #[test]
    fn no_descriptor_left_is_a_local_error_never_a_lost_remote() {
        for errno in [rustix::io::Errno::MFILE, rustix::io::Errno::NFILE] {
            let err = kube::Error::Service(Box::new(Outer(io::Error::from_raw_os_error(
                errno.raw_os_error(),
            ))));
            assert!(
                matches!(
                    classify(&err),
                    Outcome::LocalError {
                        kind: LocalKind::Descriptors,
                        ..
                    }
                ),
                "{errno:?}"
            );
            assert_eq!(transport_failure(&err), None);
        }
        let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
        assert!(!out_of_descriptors(&refused));
        assert_eq!(LocalKind::of(&refused), LocalKind::Other);
    }

    #[test]
    fn the_root_cause_is_the_innermost_message() {
        let err = Outer(io::Error::other("connection refused by 10.0.0.7"));
        assert_eq!(root_cause(&err), "connection refused by 10.0.0.7");
    }

    #[test]
    fn ready_means_a_2xx() {
        let result = |status| ProbeResult {
            outcome: Outcome::Reachable { status },
            latency: Duration::ZERO,
        };
        assert!(result(200).ready());
        assert!(!result(403).ready());
        assert!(!result(503).ready());
    }
}
