//! The binary's command line, run as a real process.

use std::process::Command;

fn tether(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tether"))
        .args(args)
        .output()
        .expect("the tether binary runs")
}

#[test]
fn version_prints_the_crate_version() {
    let out = tether(&["--version"]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        format!("tether {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn a_command_that_does_not_exist_yet_exits_2_and_says_so() {
    let out = tether(&["demo"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("`demo` is not yet available"));
}
