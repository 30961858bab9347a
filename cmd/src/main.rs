//! `tether`: keeps a multi-cluster controller attached to the remote
//! apiservers it watches. Everything is in the library; see `cli/`.

fn main() -> std::process::ExitCode {
    tether::cli::main()
}
