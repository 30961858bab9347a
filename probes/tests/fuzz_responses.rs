//! The probe against whatever a peer may send: a time-bounded random search
//! over response bytes (valid heads, odd statuses, many and long headers,
//! truncations, garbage), each served by a real socket on loopback. The
//! probe must never panic, must classify every answer, and must read any
//! well-formed head under its limit as a response with its status.
//!
//! `FUZZ_SECONDS` sets the budget (default 5; scripts/test's fuzz step runs
//! it for 60). The executions are printed.

use std::time::Duration;

use proptest::prelude::*;
use proptest::strategy::ValueTree as _;
use proptest::test_runner::{Config as RunnerConfig, TestRunner};
use tether_probes::{Outcome, ProbeConfig, probe_client, probe_once};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpListener;
use tokio::time::Instant;

/// A response: a status line (right or wrong), headers, a body framing,
/// maybe cut short, maybe garbage.
fn response() -> impl Strategy<Value = (Vec<u8>, Option<u16>)> {
    let status = prop_oneof![
        4 => (100u16..600).prop_map(Some),
        1 => Just(None),
    ];
    let headers = prop::collection::vec(
        ("[A-Za-z-]{1,20}", "[ -~]{0,200}").prop_map(|(k, v)| format!("{k}: {v}\r\n")),
        0..40,
    );
    let body = prop_oneof![Just(String::new()), "[a-z]{0,100}",];
    let garbage = prop::collection::vec(any::<u8>(), 0..300);
    (status, headers, body, garbage, 0u8..6).prop_map(|(status, headers, body, garbage, shape)| {
        let line = match status {
            Some(code) => format!("HTTP/1.1 {code} Whatever\r\n"),
            None => "HTTP/9.9 abc\r\n".to_owned(),
        };
        let headers = headers.concat();
        let valid = |extra: &str| {
            format!(
                "{line}{headers}{extra}content-length: {}\r\n\r\n{body}",
                body.len()
            )
            .into_bytes()
        };
        match shape {
            // A complete, well-formed answer (1xx statuses aside).
            0 | 1 => (valid(""), status.filter(|c| *c >= 200)),
            // Cut short inside the head.
            2 => {
                let bytes = valid("");
                let cut = bytes.len() / 2;
                (bytes[..cut].to_vec(), None)
            }
            // Garbage, then whatever.
            3 => ([garbage.as_slice(), &valid("")].concat(), None),
            // A huge header.
            4 => (valid(&format!("x-big: {}\r\n", "b".repeat(40_000))), None),
            // Chunked framing with a broken chunk.
            _ => (
                format!("{line}transfer-encoding: chunked\r\n\r\nzz\r\n{body}").into_bytes(),
                None,
            ),
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_probe_reads_whatever_a_peer_sends_without_panicking() {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let (answers, mut next) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    // One connection a probe: read the request, send the next answer, close.
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            let Some(answer) = next.recv().await else {
                return;
            };
            let mut request = [0u8; 1024];
            let _ = stream.read(&mut request).await;
            let _ = stream.write_all(&answer).await;
            let _ = stream.shutdown().await;
        }
    });
    let config = kube::Config::new(format!("http://{addr}").parse().expect("a URL"));
    let timeout = Duration::from_millis(500);
    let probe = ProbeConfig::default()
        .with_interval(timeout * 2)
        .with_timeout(timeout);

    let deadline = Instant::now() + tether_testkit::fuzz_budget();
    let mut runner = TestRunner::new(RunnerConfig {
        failure_persistence: None,
        ..RunnerConfig::default()
    });
    let strategy = response();
    let mut executions = 0u64;
    while Instant::now() < deadline {
        let (bytes, expected) = strategy
            .new_tree(&mut runner)
            .expect("a value can be generated")
            .current();
        answers.send(bytes.clone()).expect("the server runs");
        // A fresh client each time: one connection, one answer.
        let mut client = probe_client(&config, &probe).expect("client");
        let outcome = probe_once(&mut client, "/readyz", timeout, &[])
            .await
            .outcome;
        executions += 1;
        if let Some(status) = expected {
            assert_eq!(
                outcome,
                Outcome::Reachable { status },
                "a well-formed answer: {:?}",
                String::from_utf8_lossy(&bytes)
            );
        }
        assert!(
            !matches!(outcome, Outcome::LocalError { .. }),
            "an answer is never a local error: {outcome:?}"
        );
    }
    println!("probe response fuzz: {executions} executions");
    assert!(executions > 50, "the budget allowed too few executions");
}
