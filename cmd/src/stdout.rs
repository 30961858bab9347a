//! Writing to standard output when nobody may be reading any more.

use std::io::Write as _;

/// Writes `text` to stdout. A reader that went away (`tether validate |
/// head -1`) is not an error: the rest is dropped quietly, and the command
/// still exits with what it found. Any other failure is reported on stderr.
pub(crate) fn write(text: &str) {
    let mut out = std::io::stdout().lock();
    if let Err(err) = out.write_all(text.as_bytes()).and_then(|()| out.flush())
        && err.kind() != std::io::ErrorKind::BrokenPipe
    {
        eprintln!("tether: cannot write to stdout: {err}");
    }
}
