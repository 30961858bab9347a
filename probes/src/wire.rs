//! The connection a probe keeps: plain TCP, or TLS through rustls's
//! unbuffered API.
//!
//! rustls's buffered connection (what `tokio-rustls` wraps) keeps a 4 KiB
//! read buffer for the life of the connection; at 10,000 kept connections
//! that is 40 MiB holding nothing between probes. Here the probe owns the
//! buffers: TLS bytes are read into one that exists only while records are
//! being taken apart, and nothing is buffered while the connection idles or
//! waits on its peer. At a start, thousands of handshakes and first
//! exchanges wait at once (6,330 read buffers held at once at 10,000
//! remotes, issue 43, part 13).

use std::io;
use std::sync::Arc;
use std::task::ready;

use rustls::client::UnbufferedClientConnection;
use rustls::pki_types::ServerName;
use rustls::unbuffered::{
    ConnectionState, EncodeError, EncodeTlsData, EncryptError, InsufficientSizeError,
    UnbufferedStatus,
};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::scratch;

/// The room first given to a handshake message: a client hello fits.
const HANDSHAKE_ROOM: usize = 1024;

/// How much is read from the socket at a time.
const READ_SIZE: usize = 4096;

/// What a probe exchanges requests and answers over.
pub(crate) trait Transport {
    /// Sends all of `bytes`.
    fn send(&mut self, bytes: &[u8]) -> impl Future<Output = io::Result<()>> + Send;
    /// Resolves once the peer has sent something to read (or its end, or an
    /// error): the caller can wait before it takes a buffer.
    fn ready(&mut self) -> impl Future<Output = io::Result<()>> + Send;
    /// Appends what the peer sends next to `buf`: how much, 0 at its end.
    fn recv(&mut self, buf: &mut Vec<u8>) -> impl Future<Output = io::Result<usize>> + Send;
}

/// Resolves once `tcp` has something to read (or its end, or an error),
/// on the socket's own read waker, not `readable()`'s waiter, which would
/// add 150 bytes to the future of whoever waits.
async fn readable(tcp: &TcpStream) -> io::Result<()> {
    std::future::poll_fn(|cx| tcp.poll_read_ready(cx)).await
}

/// Writes all of `bytes` to `tcp`: at once if the socket takes them, as a
/// request on a kept connection nearly always is, without a future's
/// polling and a task budget's check (about 90 instructions a probe,
/// issue 43, part 17); else what is left, once the socket is writable.
async fn write(tcp: &mut TcpStream, bytes: &[u8]) -> io::Result<()> {
    let written = match tcp.try_write(bytes) {
        Ok(written) => written,
        Err(err) if err.kind() == io::ErrorKind::WouldBlock => 0,
        Err(err) => return Err(err),
    };
    match &bytes[written..] {
        [] => Ok(()),
        rest => tcp.write_all(rest).await,
    }
}

/// A kept connection.
pub(crate) enum Wire {
    Plain(TcpStream),
    Tls(Box<TlsWire>),
}

pub(crate) struct TlsWire {
    tcp: TcpStream,
    conn: UnbufferedClientConnection,
    /// TLS bytes read and not yet taken apart; unallocated while idle.
    incoming: Vec<u8>,
}

/// What taking apart the records read so far gave.
enum Pumped {
    /// Plaintext, this many bytes of it.
    Data(usize),
    /// TLS bytes rustls wants sent (a handshake message, an alert).
    Send(Vec<u8>),
    /// Nothing yet: more bytes are needed.
    More,
    /// The peer closed the connection.
    End,
}

fn tls_error(error: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, error)
}

/// Why rustls wrote nothing into the room it was given.
enum Short {
    /// It needs this much room.
    Need(usize),
    Failed(String),
}

impl From<EncodeError> for Short {
    fn from(err: EncodeError) -> Self {
        match err {
            EncodeError::InsufficientSize(InsufficientSizeError { required_size }) => {
                Self::Need(required_size)
            }
            other @ EncodeError::AlreadyEncoded => Self::Failed(other.to_string()),
        }
    }
}

impl From<EncryptError> for Short {
    fn from(err: EncryptError) -> Self {
        match err {
            EncryptError::InsufficientSize(InsufficientSizeError { required_size }) => {
                Self::Need(required_size)
            }
            other @ EncryptError::EncryptExhausted => Self::Failed(other.to_string()),
        }
    }
}

/// Appends to `out` what `write` puts in the room after it: `first`
/// bytes of it, then as much as it asks for.
fn append(
    out: &mut Vec<u8>,
    first: usize,
    mut write: impl FnMut(&mut [u8]) -> Result<usize, Short>,
) -> io::Result<()> {
    let used = out.len();
    let mut size = first;
    loop {
        out.resize(used + size, 0);
        match write(&mut out[used..]) {
            Ok(written) => {
                out.truncate(used + written);
                return Ok(());
            }
            Err(Short::Need(required)) => size = required,
            Err(Short::Failed(err)) => return Err(io::Error::other(err)),
        }
    }
}

/// Appends the TLS message rustls has ready (a handshake message, an
/// alert) to `out`.
fn encode_into<Data>(out: &mut Vec<u8>, mut encode: EncodeTlsData<'_, Data>) -> io::Result<()> {
    append(out, HANDSHAKE_ROOM, |room| {
        encode.encode(room).map_err(Short::from)
    })
}

impl TlsWire {
    /// The TLS handshake on `tcp`.
    pub(crate) async fn connect(
        tcp: TcpStream,
        config: Arc<rustls::ClientConfig>,
        name: ServerName<'static>,
    ) -> io::Result<Self> {
        let conn = UnbufferedClientConnection::new(config, name).map_err(tls_error)?;
        let mut wire = Self {
            tcp,
            conn,
            incoming: Vec::new(),
        };
        loop {
            match wire.pump(None)? {
                Pumped::Send(bytes) => wire.tcp.write_all(&bytes).await?,
                Pumped::More if wire.conn.is_handshaking() => wire.read_more().await?,
                Pumped::More | Pumped::Data(_) => break,
                Pumped::End => return Err(io::ErrorKind::UnexpectedEof.into()),
            }
        }
        wire.shrink();
        Ok(wire)
    }

    /// Makes room in `incoming` for a read, with a buffer borrowed while
    /// records are being taken apart.
    fn room(&mut self) {
        if self.incoming.capacity() == 0 {
            self.incoming = scratch::take();
        }
        self.incoming.reserve(READ_SIZE);
    }

    /// Reads what the peer sent into `incoming`, made room for only once
    /// the socket is readable: how much, 0 at its end.
    ///
    /// # Cancellation safety
    ///
    /// Cancel safe: it reads only once the socket is readable, without
    /// waiting.
    async fn read_some(&mut self) -> io::Result<usize> {
        // A poll function, not an async loop: this is what every idle probe
        // task holds (see `closed`), and each state of an async loop, or
        // `readable()`'s waiter (150 bytes), would make every task larger.
        std::future::poll_fn(|cx| {
            ready!(self.tcp.poll_read_ready(cx))?;
            self.room();
            // tokio's own read, not `try_read_buf`: a read shorter than the
            // room drained the socket, and tokio then forgets the readiness,
            // so the next wait does not take a buffer for nothing.
            let read = std::pin::pin!(self.tcp.read_buf(&mut self.incoming)).poll(cx);
            if read.is_pending() {
                self.shrink();
            }
            read
        })
        .await
    }

    /// Reads more TLS bytes; the peer's end is an error here, as records
    /// are still expected.
    async fn read_more(&mut self) -> io::Result<()> {
        match self.read_some().await? {
            0 => Err(io::ErrorKind::UnexpectedEof.into()),
            _ => Ok(()),
        }
    }

    /// Gives the read buffer back once it holds nothing.
    fn shrink(&mut self) {
        if self.incoming.is_empty() {
            scratch::give(std::mem::take(&mut self.incoming));
        }
    }

    /// Takes apart the records read so far, appending any plaintext to
    /// `plain` (or, with `None`, refusing plaintext as out of place).
    fn pump(&mut self, mut plain: Option<&mut Vec<u8>>) -> io::Result<Pumped> {
        let mut out = Vec::new();
        loop {
            let UnbufferedStatus { mut discard, state } =
                self.conn.process_tls_records(&mut self.incoming);
            let pumped = match state.map_err(tls_error)? {
                ConnectionState::ReadTraffic(mut traffic) => {
                    let mut got = 0;
                    while let Some(record) = traffic.next_record() {
                        let record = record.map_err(tls_error)?;
                        discard += record.discard;
                        got += record.payload.len();
                        match plain.as_deref_mut() {
                            Some(plain) => plain.extend_from_slice(record.payload),
                            None => {
                                return Err(io::Error::new(
                                    io::ErrorKind::InvalidData,
                                    "the peer sent data nobody asked for",
                                ));
                            }
                        }
                    }
                    Some(Pumped::Data(got))
                }
                ConnectionState::EncodeTlsData(encode) => {
                    encode_into(&mut out, encode)?;
                    None
                }
                ConnectionState::TransmitTlsData(transmit) => {
                    // Sent by the caller before it reads or writes again.
                    transmit.done();
                    Some(Pumped::Send(std::mem::take(&mut out)))
                }
                ConnectionState::PeerClosed | ConnectionState::Closed => Some(Pumped::End),
                // Done with what was read: the handshake waits for more, or
                // the connection is open for traffic.
                _ => Some(Pumped::More),
            };
            self.incoming.drain(..discard);
            match pumped {
                Some(Pumped::Data(0)) | None => {}
                Some(pumped) => return Ok(pumped),
            }
        }
    }

    /// Resolves when the idle connection can carry no next request: the
    /// peer closed it, failed, or sent anything but TLS housekeeping (a
    /// session ticket).
    ///
    /// # Cancellation safety
    ///
    /// Cancel safe: it reads only once the socket is readable, without
    /// waiting.
    async fn closed(&mut self) {
        loop {
            if !matches!(self.read_some().await, Ok(1..)) {
                return;
            }
            match self.pump(None) {
                Ok(Pumped::More) => self.shrink(),
                _ => return,
            }
        }
    }
}

impl Transport for TlsWire {
    async fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        let mut out = scratch::take();
        loop {
            let UnbufferedStatus { discard, state } =
                self.conn.process_tls_records(&mut self.incoming);
            let done = match state.map_err(tls_error)? {
                ConnectionState::WriteTraffic(mut traffic) => {
                    // A record adds a header, a content type and a tag.
                    append(&mut out, bytes.len() + 64, |room| {
                        traffic.encrypt(bytes, room).map_err(Short::from)
                    })?;
                    true
                }
                ConnectionState::EncodeTlsData(encode) => {
                    encode_into(&mut out, encode)?;
                    false
                }
                ConnectionState::TransmitTlsData(transmit) => {
                    transmit.done();
                    false
                }
                ConnectionState::PeerClosed | ConnectionState::Closed => {
                    return Err(io::ErrorKind::BrokenPipe.into());
                }
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "the connection is not ready for a request",
                    ));
                }
            };
            self.incoming.drain(..discard);
            if done {
                break;
            }
        }
        let sent = write(&mut self.tcp, &out).await;
        scratch::give(out);
        sent
    }

    /// Reads what came once it came: rustls asked before a read would find
    /// nothing to take apart, a run of its state machine (and a readiness
    /// check) for nothing on every probe (issue 43, part 16).
    async fn ready(&mut self) -> io::Result<()> {
        self.read_some().await.map(drop)
    }

    async fn recv(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        loop {
            let pumped = self.pump(Some(buf))?;
            match pumped {
                Pumped::Data(n) => return Ok(n),
                Pumped::End => return Ok(0),
                Pumped::Send(bytes) => self.tcp.write_all(&bytes).await?,
                Pumped::More => {
                    if self.read_some().await? == 0 {
                        return Ok(0);
                    }
                }
            }
        }
    }
}

impl Wire {
    /// See [`TlsWire::closed`]; for plain TCP, the first byte or end read.
    ///
    /// # Cancellation safety
    ///
    /// Cancel safe.
    pub(crate) async fn closed(&mut self) {
        match self {
            Self::Plain(tcp) => {
                let mut byte = [0_u8; 1];
                let _ = tcp.read(&mut byte).await;
            }
            Self::Tls(tls) => tls.closed().await,
        }
    }

    /// Whether it holds a read buffer.
    #[cfg(test)]
    pub(crate) fn holds_a_buffer(&self) -> bool {
        matches!(self, Self::Tls(tls) if tls.incoming.capacity() > 0)
    }

    /// Lets go of buffers once an exchange is over.
    pub(crate) fn idle(&mut self) {
        if let Self::Tls(tls) = self {
            tls.shrink();
        }
    }
}

impl Transport for Wire {
    async fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Self::Plain(tcp) => write(tcp, bytes).await,
            Self::Tls(tls) => tls.send(bytes).await,
        }
    }

    async fn ready(&mut self) -> io::Result<()> {
        match self {
            Self::Plain(tcp) => readable(tcp).await,
            Self::Tls(tls) => tls.ready().await,
        }
    }

    async fn recv(&mut self, buf: &mut Vec<u8>) -> io::Result<usize> {
        match self {
            Self::Plain(tcp) => {
                buf.reserve(READ_SIZE);
                tcp.read_buf(buf).await
            }
            Self::Tls(tls) => tls.recv(buf).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt as _;
    use tokio::net::{TcpListener, TcpStream};

    use super::write;

    /// A connected pair on loopback.
    async fn pair() -> (TcpStream, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("an address");
        let (ours, theirs) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (ours.expect("connect"), theirs.expect("accept").0)
    }

    /// Bytes whose order shows: a prime period, not a power of two's.
    fn pattern(len: usize) -> Vec<u8> {
        (0..=250_u8).cycle().take(len).collect()
    }

    /// What the socket takes at once is written at once, and the rest once
    /// it is writable, in order: whether it takes part (a payload larger
    /// than any socket's buffer) or none (a socket already full).
    #[tokio::test]
    async fn a_write_sends_everything_in_order_whatever_the_socket_takes_at_once() {
        for full in [false, true] {
            let (mut ours, mut theirs) = pair().await;
            let mut filler = 0;
            if full {
                let chunk = vec![0_u8; 64 * 1024];
                loop {
                    match ours.try_write(&chunk) {
                        Ok(n) => filler += n,
                        Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => break,
                        Err(err) => panic!("filling the socket: {err}"),
                    }
                }
                assert!(filler > 0, "the socket took nothing");
            }
            let payload = pattern(32 * 1024 * 1024);
            let reader = tokio::spawn(async move {
                let mut got = Vec::new();
                theirs.read_to_end(&mut got).await.expect("read");
                got
            });
            write(&mut ours, &payload).await.expect("written");
            drop(ours);
            let got = reader.await.expect("the reader");
            assert_eq!(got.len(), filler + payload.len(), "full: {full}");
            assert!(got[filler..] == payload[..], "full: {full}: out of order");
        }
    }
}
