//! The `blackhole` fault: a simulated apiserver in a test host whose packets
//! are dropped. Needs root, `ip` (iproute2) and `nft` (nftables); without
//! them the test fails with the reason and the install command.

// Real processes and sockets, driven from plain threads: std's clock.
#![allow(clippy::disallowed_methods)]

use std::io::{BufRead as _, BufReader, ErrorKind, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Stdio};
use std::time::Duration;

use tether_testkit::TestHost;

/// The client's own deadline; a blackholed server is bounded only by it.
const CLIENT_TIMEOUT: Duration = Duration::from_millis(500);

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn readyz(stream: &mut TcpStream) -> std::io::Result<String> {
    stream.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    stream.write_all(b"GET /readyz HTTP/1.1\r\nHost: fake\r\n\r\n")?;
    let mut buf = [0u8; 256];
    let n = stream.read(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

fn connect(addr: SocketAddr) -> std::io::Result<TcpStream> {
    TcpStream::connect_timeout(&addr, CLIENT_TIMEOUT)
}

#[test]
fn blackhole_drops_packets_so_only_the_clients_timeout_ends_a_request() {
    let host = TestHost::create().unwrap_or_else(|err| {
        panic!("cannot make a test host: {err} (needs root and iproute2: apt-get install iproute2)")
    });
    let mut child = host
        .command(env!("CARGO_BIN_EXE_fake-apiserver"))
        .args(["--listen", &host.addr().to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("fake-apiserver starts in the test host");
    let stdout = child.stdout.take().expect("stdout is piped");
    let server = KillOnDrop(child);
    let mut lines = BufReader::new(stdout);
    let mut first = String::new();
    lines
        .read_line(&mut first)
        .expect("fake-apiserver prints where it listens");
    // Keep draining its output, so it never writes into a closed pipe.
    std::thread::spawn(move || std::io::copy(&mut lines, &mut std::io::sink()));
    let addr: SocketAddr = first
        .trim()
        .strip_prefix("fake-apiserver listening on http://")
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"));

    let mut open = connect(addr).expect("the test host is reachable");
    assert!(
        readyz(&mut open)
            .expect("answered")
            .starts_with("HTTP/1.1 200")
    );

    host.blackhole(addr.port(), true).unwrap_or_else(|err| {
        panic!("cannot drop packets: {err} (needs nftables: apt-get install nftables)")
    });
    let err = connect(addr).expect_err("a blackholed server accepted a connection");
    assert_eq!(err.kind(), ErrorKind::TimedOut, "{err}");
    let err = readyz(&mut open).expect_err("a blackholed server answered");
    assert!(
        matches!(err.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut),
        "{err}"
    );

    host.blackhole(addr.port(), false)
        .expect("packets pass again");
    let mut again = connect(addr).expect("reachable once the blackhole is lifted");
    assert!(
        readyz(&mut again)
            .expect("answered")
            .starts_with("HTTP/1.1 200")
    );
    drop(server);
}
