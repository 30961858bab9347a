//! Whole-process capacity of the simulated apiserver: idle watches held,
//! `/readyz` answered per second, and memory per idle server.
//!
//! `cargo bench -p tether-testkit --bench capacity`. Client and server share
//! one process and the machine's cores, so the throughput is a floor.

// A benchmark measures wall-clock time; there is no paused clock here.
#![allow(clippy::disallowed_methods)]

use std::time::{Duration, Instant};

use tether_testkit::{ApiServer, Options};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

const WATCHES: usize = 1_000;
const READYZ_CONNECTIONS: usize = 32;
const READYZ_SECONDS: u64 = 5;
const IDLE_SERVERS: usize = 1_000;

fn rss_kib() -> u64 {
    tether_testkit::procfs::status_kib(None, "VmRSS").expect("/proc/self/status has VmRSS")
}

/// Opens a watch and reads its response head, so it is established.
async fn open_watch(server: &ApiServer) -> TcpStream {
    let mut stream = TcpStream::connect(server.addr()).await.expect("connect");
    stream
        .write_all(b"GET /api/v1/namespaces/default/configmaps?watch=true&allowWatchBookmarks=true HTTP/1.1\r\nHost: fake\r\n\r\n")
        .await
        .expect("write");
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).await.expect("response head");
        head.push(byte[0]);
    }
    assert!(head.starts_with(b"HTTP/1.1 200"));
    stream
}

async fn readyz_loop(server: &ApiServer, until: Instant) -> u64 {
    let mut stream = TcpStream::connect(server.addr()).await.expect("connect");
    let mut buf = vec![0u8; 4096];
    let mut done = 0;
    while Instant::now() < until {
        stream
            .write_all(b"GET /readyz HTTP/1.1\r\nHost: fake\r\n\r\n")
            .await
            .expect("write");
        // The answer is small; it ends with the body `ok`.
        let mut got = Vec::new();
        while !got.ends_with(b"\r\n\r\nok") {
            let n = stream.read(&mut buf).await.expect("read");
            assert!(n > 0, "server closed the connection");
            got.extend_from_slice(&buf[..n]);
        }
        done += 1;
    }
    done
}

/// Each part runs in a process of its own, so memory freed by one part and
/// kept by the allocator does not flatter the next one's figure.
const PARTS: [&str; 3] = ["watches", "idle-http", "idle-https"];

fn main() {
    let part = std::env::args().skip_while(|a| a != "--part").nth(1);
    let Some(part) = part else {
        println!(
            "machine: {} cores",
            std::thread::available_parallelism().map_or(0, usize::from)
        );
        for part in PARTS {
            let status = std::process::Command::new(std::env::current_exe().expect("own path"))
                .args(["--part", part])
                .status()
                .expect("the benchmark can run itself");
            assert!(status.success(), "part {part} failed");
        }
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        match part.as_str() {
            "watches" => watches_and_readyz().await,
            "idle-http" => idle_servers(false).await,
            "idle-https" => idle_servers(true).await,
            other => panic!("unknown part {other}; parts: {PARTS:?}"),
        }
    });
}

async fn watches_and_readyz() {
    let server = ApiServer::start(Options::default()).await.expect("server");
    let before = rss_kib();
    let started = Instant::now();
    let mut watches = Vec::with_capacity(WATCHES);
    for _ in 0..WATCHES {
        watches.push(open_watch(&server).await);
    }
    let opened_in = started.elapsed();
    assert_eq!(server.stats().open_watches, WATCHES);
    let per_watch = (rss_kib() - before) as f64 / WATCHES as f64;
    println!(
        "idle watches: {WATCHES} open on one server (opened in {opened_in:?}; {per_watch:.1} KiB each, client side included)"
    );

    // /readyz throughput, with the watches still open.
    let until = Instant::now() + Duration::from_secs(READYZ_SECONDS);
    let loops: Vec<_> = (0..READYZ_CONNECTIONS)
        .map(|_| {
            let server = server.clone();
            tokio::spawn(async move { readyz_loop(&server, until).await })
        })
        .collect();
    let mut total = 0;
    for task in loops {
        total += task.await.expect("loop");
    }
    println!(
        "/readyz: {:.0} requests/s over {READYZ_CONNECTIONS} keep-alive connections for {READYZ_SECONDS}s ({total} in all), with the {WATCHES} watches open",
        total as f64 / READYZ_SECONDS as f64
    );
    assert_eq!(
        server.stats().open_watches,
        WATCHES,
        "a watch died under load"
    );
}

async fn idle_servers(tls: bool) {
    let before = rss_kib();
    let mut servers = Vec::with_capacity(IDLE_SERVERS);
    for _ in 0..IDLE_SERVERS {
        servers.push(
            ApiServer::start(Options::default().tls(tls))
                .await
                .expect("server"),
        );
    }
    let per_server = (rss_kib() - before) as f64 / IDLE_SERVERS as f64;
    println!(
        "idle servers ({}): {IDLE_SERVERS} in one process, {per_server:.1} KiB each",
        if tls { "https" } else { "http" }
    );
}
