//! `fake-apiserver`: a simulated Kubernetes apiserver a person can point
//! kubectl at, with a control port for fault injection.

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use serde_json::json;
use tether_testkit::{ApiServer, Fault, Options, Resource, parse_duration, serve_control};

/// A simulated Kubernetes apiserver, for tests and demos.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Address to listen on.
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    listen: IpAddr,
    /// Port of the API; 0 picks a free one.
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Port of the control endpoint; 0 picks a free one.
    #[arg(long, default_value_t = 0)]
    control_port: u16,
    /// Serve HTTPS with a CA of the server's own.
    #[arg(long)]
    tls: bool,
    /// Require this bearer token.
    #[arg(long)]
    token: Option<String>,
    /// Write a kubeconfig for the server to this file.
    #[arg(long)]
    kubeconfig_out: Option<PathBuf>,
    /// Seed this many ConfigMaps in `default`.
    #[arg(long, default_value_t = 0)]
    objects: usize,
    /// Cluster name in the kubeconfig.
    #[arg(long, default_value = "fake")]
    name: String,
    /// How often watches that allow bookmarks get one (e.g. `60s`).
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    bookmark_interval: Duration,
    /// Extra certificate name or address (repeatable).
    #[arg(long = "cert-name")]
    cert_names: Vec<String>,
    /// The fault to start with (e.g. `status=503`).
    #[arg(long, default_value = "up")]
    fault: Fault,
    /// Keep the CA, the serving certificate and the port here: killed and
    /// started again with the same flags, the server comes back as itself
    /// and its kubeconfig stays good (its objects do not: seed them again
    /// with --objects). Without it, each start is a new cluster.
    #[arg(long)]
    state_dir: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("fake-apiserver: {err}");
            let mut source = std::error::Error::source(&err);
            while let Some(cause) = source {
                eprintln!("  caused by: {cause}");
                source = cause.source();
            }
            ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> tether_testkit::Result<()> {
    // The port kept from the last start, unless one is given.
    if let Some(dir) = &args.state_dir {
        std::fs::create_dir_all(dir)?;
    }
    let port_file = args.state_dir.as_ref().map(|dir| dir.join("port"));
    let port = match (&port_file, args.port) {
        (Some(file), 0) => std::fs::read_to_string(file)
            .ok()
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or(0),
        _ => args.port,
    };
    let mut options = Options::default()
        .addr(SocketAddr::new(args.listen, port))
        .tls(args.tls)
        .name(args.name)
        .bookmark_interval(args.bookmark_interval);
    options.extra_names = args.cert_names;
    if !args.listen.is_loopback() {
        options = options.extra_name(args.listen.to_string());
    }
    if let Some(token) = args.token {
        options = options.token(token);
    }
    options.state_dir.clone_from(&args.state_dir);
    let server = ApiServer::start(options).await?;
    if let Some(file) = &port_file {
        std::fs::write(file, server.addr().port().to_string())?;
    }
    for i in 0..args.objects {
        server.put(
            Resource::ConfigMap,
            "default",
            json!({"metadata": {"name": format!("seed-{i:05}"), "labels": {"app": "seed"}}, "data": {"index": i.to_string()}}),
        )?;
    }
    server.set_fault(args.fault).await?;
    let (control, _task) = serve_control(
        server.clone(),
        SocketAddr::new(args.listen, args.control_port),
    )
    .await?;

    let mut banner = format!(
        "fake-apiserver listening on {}\ncontrol endpoint: http://{control} (GET/PUT /fault, POST /restart, POST /recreate, GET /kubeconfig, GET /stats)\n",
        server.url()
    );
    if let Some(path) = &args.kubeconfig_out {
        server.kubeconfig().write(path)?;
        let _ = writeln!(
            banner,
            "kubeconfig: {}  (try: kubectl --kubeconfig {} get namespaces)",
            path.display(),
            path.display()
        );
    }
    // A reader that went away must not take the server down with it.
    let mut stdout = std::io::stdout().lock();
    let _ = stdout
        .write_all(banner.as_bytes())
        .and_then(|()| stdout.flush());
    drop(stdout);

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    Ok(())
}
