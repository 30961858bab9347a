//! The `tether` binary. Until the daemon is wired up, it only answers
//! `--version` and says plainly that nothing else exists yet.

use std::process::ExitCode;

fn main() -> ExitCode {
    let version = env!("CARGO_PKG_VERSION");
    match std::env::args().nth(1).as_deref() {
        Some("--version" | "-V" | "version") => {
            println!("tether {version}");
            ExitCode::SUCCESS
        }
        Some(command) => {
            eprintln!(
                "tether {version}: `{command}` is not yet available; only --version works so far"
            );
            ExitCode::from(2)
        }
        None => {
            eprintln!("usage: tether --version");
            ExitCode::from(2)
        }
    }
}
