//! Durations, files and names, as every section takes them.

use std::path::{Path, PathBuf};
use std::time::Duration;

/// The longest duration the configuration takes. No setting sensibly needs
/// more, and far larger values would overflow the timers' arithmetic.
const MAX_DURATION: Duration = Duration::from_secs(24 * 3600);

/// Why a duration was not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// It does not parse.
    #[error(
        "invalid duration {text:?}: write a number and a unit, like 500ms, 10s, 2m or 1h30m ({reason})"
    )]
    Invalid {
        /// What was given.
        text: String,
        /// The parser's reason.
        reason: String,
    },
    /// It is longer than 24h.
    #[error("{text:?} is longer than 24h, the most tether takes")]
    TooLong {
        /// What was given.
        text: String,
    },
}

/// Parses a duration: `500ms`, `10s`, `2m`, `1h30m`, `1.5s`. The grammar is
/// jiff's "friendly" format, the same the test kit's faults take. At most
/// 24h.
///
/// # Errors
///
/// [`DurationError`]: what a duration looks like, or that it is too long.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let duration = jiff::fmt::friendly::SpanParser::new()
        .parse_unsigned_duration(text.trim())
        .map_err(|err| DurationError::Invalid {
            text: text.to_owned(),
            reason: err.to_string(),
        })?;
    if duration > MAX_DURATION {
        return Err(DurationError::TooLong {
            text: text.to_owned(),
        });
    }
    Ok(duration)
}

/// Why a file cannot be read, naming it.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// Nothing is there.
    #[error("file {} does not exist", .0.display())]
    Missing(PathBuf),
    /// A directory is there.
    #[error("{} is a directory, not a file", .0.display())]
    Directory(PathBuf),
    /// It cannot be opened: permissions, a symlink loop, ...
    #[error("cannot read {}", .path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Whether `path` is a file tether can read, or why not, naming it: a
/// directory, a symlink loop and a missing file each say so.
///
/// # Errors
///
/// [`FileError`], with the path.
pub fn readable_file(path: &Path) -> Result<(), FileError> {
    let unreadable = |source| FileError::Unreadable {
        path: path.to_owned(),
        source,
    };
    match std::fs::metadata(path) {
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            Err(FileError::Missing(path.to_owned()))
        }
        Err(err) => Err(unreadable(err)),
        Ok(meta) if meta.is_dir() => Err(FileError::Directory(path.to_owned())),
        Ok(_) => std::fs::File::open(path).map(drop).map_err(unreadable),
    }
}

/// A remote name is a Prometheus label value and a log field: keep it to
/// DNS-label characters.
#[must_use]
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name.chars().all(|c| {
            c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.' || c == '_'
        })
}
