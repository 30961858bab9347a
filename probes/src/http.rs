//! The probe's HTTP/1.1 exchange, written on the connection itself: a fixed
//! request out, and a response read with `httparse` into a buffer bounded by
//! what a head may take, then a body drained (never kept) up to a small cap.
//!
//! A connection that cannot carry the next request cleanly (a body past its
//! cap or without a length, `Connection: close`, HTTP/1.0, bytes after the
//! answer) is closed; its answer still counts.

use std::mem::MaybeUninit;

use crate::scratch;
use crate::wire::Transport;

/// The largest response head a probe reads: load balancers, proxies and
/// audit IDs add headers, and 32 KiB holds any real head several times
/// over. A larger head still answered: it counts as a response, with status
/// [`HEAD_TOO_LARGE`].
pub(crate) const MAX_HEAD: usize = 32 * 1024;

/// The most headers a head may carry: as many as fit in [`MAX_HEAD`] at 32
/// bytes each.
const MAX_HEADERS: usize = MAX_HEAD / 32;

/// The most of a response body a probe drains to keep its connection;
/// `/readyz` answers a few bytes, and `?verbose` a few hundred. Past it, the
/// connection is closed instead.
pub(crate) const MAX_BODY: u64 = 16 * 1024;

/// What a head's first read asks for: most heads fit in it whole.
const FIRST_READ: usize = 1024;

/// The status recorded for an answer whose head passed 32 KiB: the
/// remote answered (reachable), but what it said could not be read (not
/// ready).
pub const HEAD_TOO_LARGE: u16 = 0;

/// Why an exchange got no status.
#[derive(Debug)]
pub(crate) enum ExchangeError {
    /// Writing or reading failed.
    Io(std::io::Error),
    /// The peer closed the connection before a whole head.
    Closed {
        /// Whether any of the answer had come.
        partial: bool,
    },
    /// The peer's answer is not HTTP/1.x.
    Invalid(httparse::Error),
}

/// An answer: its status, and whether the connection can carry the next
/// request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) reusable: bool,
}

/// How the body after a head is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// No body (204, 304, a length of 0).
    Empty,
    /// `Content-Length`.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Until the connection closes: it cannot be reused.
    UntilClose,
}

/// What a complete head says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Head {
    len: usize,
    status: u16,
    framing: Framing,
    /// HTTP/1.1 without `Connection: close`.
    keep_alive: bool,
}

enum Parsed {
    Head(Head),
    Partial,
    TooLarge,
}

fn has_token(value: &[u8], token: &str) -> bool {
    value
        .split(|b| *b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

/// Whether a header's `name` is `lower` (lowercase letters and `-`), in
/// any case, eight bytes at a time: a byte at a time cost about 140
/// instructions a probe (issue 43, part 16). Right for tokens, as httparse
/// has checked every name to be: of the bytes a token may hold, `| 0x20`
/// takes only a letter in either case to that letter, and only `-` to `-`.
fn name_is(name: &str, lower: &str) -> bool {
    const CASE: u64 = 0x2020_2020_2020_2020;
    let (name, lower) = (name.as_bytes(), lower.as_bytes());
    let word = |bytes: &[u8]| u64::from_ne_bytes(bytes.try_into().expect("eight bytes")) | CASE;
    match name.len() {
        len if len != lower.len() => false,
        // Eight bytes from every eighth, and the last eight, which may
        // overlap the others.
        len if len >= 8 => (0..len - 8)
            .step_by(8)
            .chain([len - 8])
            .all(|at| word(&name[at..at + 8]) == word(&lower[at..at + 8])),
        _ => name.iter().zip(lower).all(|(n, l)| n | 0x20 == *l),
    }
}

/// Headers parsed without a heap allocation; a head with more is parsed
/// again with room for [`MAX_HEADERS`].
const USUAL_HEADERS: usize = 64;

/// Parses the head at the start of `buf`.
fn parse_head(buf: &[u8]) -> Result<Parsed, httparse::Error> {
    // Uninitialised: httparse writes what it parses, and nothing else is read.
    let mut headers = [const { MaybeUninit::uninit() }; USUAL_HEADERS];
    match parse_with(buf, &mut headers) {
        Err(httparse::Error::TooManyHeaders) => {
            let mut headers = vec![MaybeUninit::uninit(); MAX_HEADERS];
            match parse_with(buf, &mut headers) {
                Err(httparse::Error::TooManyHeaders) => Ok(Parsed::TooLarge),
                parsed => parsed,
            }
        }
        parsed => parsed,
    }
}

fn parse_with<'b>(
    buf: &'b [u8],
    headers: &mut [MaybeUninit<httparse::Header<'b>>],
) -> Result<Parsed, httparse::Error> {
    let mut response = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut response,
        buf,
        headers,
    )?;
    let len = match parsed {
        httparse::Status::Complete(len) => len,
        httparse::Status::Partial => return Ok(Parsed::Partial),
    };
    let status = response.code.unwrap_or_default();
    let mut keep_alive = response.version == Some(1);
    let mut length: Option<u64> = None;
    let mut conflicting = false;
    let mut framing = None;
    for header in response.headers.iter() {
        if name_is(header.name, "connection") && has_token(header.value, "close") {
            keep_alive = false;
        } else if name_is(header.name, "transfer-encoding") {
            // Only a final `chunked` frames the body; any other coding runs
            // until the connection closes.
            let chunked = header
                .value
                .rsplit(|b| *b == b',')
                .next()
                .is_some_and(|last| last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
            framing = Some(if chunked {
                Framing::Chunked
            } else {
                Framing::UntilClose
            });
        } else if name_is(header.name, "content-length") {
            let parsed = std::str::from_utf8(header.value)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok());
            match (parsed, length) {
                (Some(n), None) => length = Some(n),
                (Some(n), Some(m)) if n == m => {}
                _ => conflicting = true,
            }
        }
    }
    let framing = if matches!(status, 100..=199 | 204 | 304) {
        Framing::Empty
    } else if let Some(framing) = framing {
        framing
    } else if conflicting {
        // An answer whose length cannot be trusted ends the connection.
        keep_alive = false;
        Framing::Empty
    } else {
        match length {
            Some(0) => Framing::Empty,
            Some(n) => Framing::Length(n),
            None => Framing::UntilClose,
        }
    };
    Ok(Parsed::Head(Head {
        len,
        status,
        framing,
        keep_alive,
    }))
}

/// Writes `request` and reads the answer.
///
/// # Cancellation safety
///
/// Not cancel safe: a dropped exchange leaves the connection mid-answer,
/// and it must not be reused.
pub(crate) async fn exchange<S: Transport>(
    stream: &mut S,
    request: &[u8],
) -> Result<Answer, ExchangeError> {
    stream.send(request).await.map_err(ExchangeError::Io)?;
    // A probe waiting on its answer holds no buffer: at a start, thousands
    // wait at once.
    stream.ready().await.map_err(ExchangeError::Io)?;
    let mut buf = scratch::take();
    buf.reserve(FIRST_READ);
    let answer = answer(stream, &mut buf).await;
    scratch::give(buf);
    answer
}

/// Reads the answer into `buf`.
async fn answer<S: Transport>(stream: &mut S, buf: &mut Vec<u8>) -> Result<Answer, ExchangeError> {
    loop {
        // Nothing read yet is nothing to parse.
        let parsed = if buf.is_empty() {
            Parsed::Partial
        } else {
            parse_head(buf).map_err(ExchangeError::Invalid)?
        };
        let head = match parsed {
            Parsed::Head(head) => head,
            Parsed::TooLarge => return Ok(too_large()),
            Parsed::Partial if buf.len() >= MAX_HEAD => return Ok(too_large()),
            Parsed::Partial => {
                if read(stream, buf).await? == 0 {
                    return Err(ExchangeError::Closed {
                        partial: !buf.is_empty(),
                    });
                }
                continue;
            }
        };
        buf.drain(..head.len);
        // An interim answer (100 Continue, 103 Early Hints): the final one
        // follows on the same connection.
        if (100..200).contains(&head.status) && head.status != 101 {
            continue;
        }
        let drained = drain_body(stream, head.framing, buf).await;
        return Ok(Answer {
            status: head.status,
            reusable: head.keep_alive && head.status != 101 && drained,
        });
    }
}

fn too_large() -> Answer {
    Answer {
        status: HEAD_TOO_LARGE,
        reusable: false,
    }
}

async fn read<S: Transport>(stream: &mut S, buf: &mut Vec<u8>) -> Result<usize, ExchangeError> {
    stream.recv(buf).await.map_err(ExchangeError::Io)
}

/// Reads the body off the connection, given what of it is already in
/// `buf`; whether the connection ends clean, ready for the next request.
/// Nothing of it is kept, and never more than [`MAX_BODY`] is read.
async fn drain_body<S: Transport>(stream: &mut S, framing: Framing, buf: &mut Vec<u8>) -> bool {
    let mut left = match framing {
        Framing::Empty => return buf.is_empty(),
        Framing::Length(n) if n > MAX_BODY => return false,
        Framing::Length(n) => n,
        Framing::Chunked | Framing::UntilClose => 0,
    };
    let mut chunked = Chunked::default();
    // Bytes read past the head, counted against the cap.
    let mut read_so_far = buf.len() as u64;
    loop {
        match framing {
            Framing::Length(_) => {
                let take = left.min(buf.len() as u64);
                left -= take;
                // Bytes past the length: a peer out of step.
                if buf.len() as u64 > take {
                    return false;
                }
                buf.clear();
                if left == 0 {
                    return true;
                }
            }
            Framing::Chunked => match chunked.feed(buf) {
                Err(()) => return false,
                Ok((consumed, done)) => {
                    buf.drain(..consumed);
                    if done {
                        return buf.is_empty();
                    }
                }
            },
            Framing::UntilClose | Framing::Empty => buf.clear(),
        }
        if read_so_far > MAX_BODY {
            return false;
        }
        match read(stream, buf).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => read_so_far += n as u64,
        }
    }
}

/// Where a chunked body's decoding stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Chunked {
    /// Before a chunk's size line.
    #[default]
    Size,
    /// Inside a chunk's data, with this much left.
    Data(u64),
    /// After a chunk's data: its CRLF.
    DataEnd,
    /// After the last chunk: trailer lines, then an empty line.
    Trailers,
}

impl Chunked {
    /// Consumes what it can of `data`: how much, and whether the body ended.
    fn feed(&mut self, data: &[u8]) -> Result<(usize, bool), ()> {
        let mut at = 0;
        loop {
            let rest = &data[at..];
            match *self {
                Self::Size => match httparse::parse_chunk_size(rest).map_err(|_| ())? {
                    httparse::Status::Partial => return Ok((at, false)),
                    httparse::Status::Complete((used, 0)) => {
                        at += used;
                        *self = Self::Trailers;
                    }
                    httparse::Status::Complete((used, size)) => {
                        at += used;
                        *self = Self::Data(size);
                    }
                },
                Self::Data(left) => {
                    let take = usize::try_from(left).map_or(rest.len(), |l| l.min(rest.len()));
                    let take_u64 = u64::try_from(take).unwrap_or(u64::MAX);
                    at += take;
                    if take_u64 == left {
                        *self = Self::DataEnd;
                    } else {
                        *self = Self::Data(left - take_u64);
                        return Ok((at, false));
                    }
                }
                Self::DataEnd => match rest {
                    [b'\r', b'\n', ..] => {
                        at += 2;
                        *self = Self::Size;
                    }
                    [] | [b'\r'] => return Ok((at, false)),
                    _ => return Err(()),
                },
                Self::Trailers => {
                    let Some(end) = rest.windows(2).position(|w| w == b"\r\n") else {
                        return Ok((at, false));
                    };
                    at += end + 2;
                    if end == 0 {
                        return Ok((at, true));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _, DuplexStream};

    use super::*;

    #[test]
    fn a_name_matches_as_a_case_blind_comparison_does_for_every_token_byte() {
        let token: Vec<u8> = (0..=255u8)
            .filter(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(b))
            .collect();
        for lower in [
            "connection",
            "transfer-encoding",
            "content-length",
            "te",
            "x-y",
        ] {
            let upper = lower.to_ascii_uppercase();
            for base in [lower.as_bytes(), upper.as_bytes()] {
                for at in 0..base.len() {
                    for byte in &token {
                        let mut name = base.to_vec();
                        name[at] = *byte;
                        let name = std::str::from_utf8(&name).expect("ASCII");
                        assert_eq!(
                            name_is(name, lower),
                            name.eq_ignore_ascii_case(lower),
                            "{name:?} against {lower:?}"
                        );
                    }
                }
            }
            assert!(!name_is(&lower[1..], lower));
            assert!(!name_is(&format!("{lower}s"), lower));
        }
        assert!(name_is("Content-Length", "content-length"));
        assert!(!name_is("Content-Type", "content-length"));
    }

    impl Transport for DuplexStream {
        async fn send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
            self.write_all(bytes).await
        }

        /// A duplex stream cannot say it is readable: `recv` waits.
        async fn ready(&mut self) -> std::io::Result<()> {
            Ok(())
        }

        async fn recv(&mut self, buf: &mut Vec<u8>) -> std::io::Result<usize> {
            buf.reserve(FIRST_READ);
            self.read_buf(buf).await
        }
    }

    fn head(text: &str) -> Head {
        match parse_head(text.as_bytes()).expect("valid") {
            Parsed::Head(head) => head,
            Parsed::Partial => panic!("partial"),
            Parsed::TooLarge => panic!("too large"),
        }
    }

    #[test]
    fn heads_say_their_framing_and_whether_the_connection_stays() {
        let h = head("HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok");
        assert_eq!(
            (h.status, h.framing, h.keep_alive),
            (200, Framing::Length(2), true)
        );
        assert_eq!(h.len, 38);
        let h = head(
            "HTTP/1.1 500 x\r\nTransfer-Encoding: gzip, chunked\r\nConnection: keep-alive, Close\r\n\r\n",
        );
        assert_eq!((h.framing, h.keep_alive), (Framing::Chunked, false));
        let h = head("HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n");
        assert_eq!((h.framing, h.keep_alive), (Framing::Empty, false));
        let h = head("HTTP/1.1 200 OK\r\n\r\n");
        assert_eq!(h.framing, Framing::UntilClose);
        let h = head("HTTP/1.1 204 No Content\r\n\r\n");
        assert_eq!((h.framing, h.keep_alive), (Framing::Empty, true));
        let h = head("HTTP/1.1 200 OK\r\ncontent-length: 2\r\ncontent-length: 3\r\n\r\n");
        assert!(!h.keep_alive, "conflicting lengths end the connection");
        assert!(matches!(
            parse_head(b"HTTP/1.1 200 OK\r\ncontent-"),
            Ok(Parsed::Partial)
        ));
        assert!(parse_head(b"HTTP/9.9 abc\r\n\r\n").is_err());
        let many = format!(
            "HTTP/1.1 200 OK\r\n{}\r\n",
            "a: b\r\n".repeat(MAX_HEADERS + 1)
        );
        assert!(matches!(parse_head(many.as_bytes()), Ok(Parsed::TooLarge)));
    }

    /// Feeds `body` to a decoder in pieces of `step` bytes, as reads would
    /// bring it: whether it ended, and what was left unconsumed.
    fn decode(body: &[u8], step: usize) -> Result<(bool, usize), ()> {
        let mut chunked = Chunked::default();
        let mut buf = Vec::new();
        for piece in body.chunks(step) {
            buf.extend_from_slice(piece);
            let (consumed, done) = chunked.feed(&buf)?;
            buf.drain(..consumed);
            if done {
                return Ok((true, buf.len()));
            }
        }
        Ok((false, buf.len()))
    }

    #[test]
    fn chunked_bodies_end_where_their_last_chunk_and_trailers_do() {
        let body = b"5;ext=1\r\nhello\r\n0\r\nx-trailer: y\r\n\r\n";
        for step in 1..body.len() {
            assert_eq!(decode(body, step), Ok((true, 0)), "step {step}");
        }
        assert_eq!(decode(b"0\r\n\r\nextra", 64), Ok((true, 5)));
        assert_eq!(decode(b"3\r\nabc\r\n", 64), Ok((false, 0)));
        assert_eq!(decode(b"3\r\nabcX\r\n", 64), Err(()));
        assert_eq!(decode(b"zz\r\n", 64), Err(()));
    }

    /// Serves `answer` on one end of a pipe and runs an exchange on the
    /// other.
    async fn answered(answer: &[u8]) -> Result<Answer, ExchangeError> {
        let (mut ours, mut theirs) = tokio::io::duplex(256 * 1024);
        let answer = answer.to_vec();
        let peer = tokio::spawn(async move {
            let mut request = [0u8; 64];
            let _ = theirs.read(&mut request).await;
            theirs.write_all(&answer).await.expect("write");
            // Keep the pipe open: only the answer's framing ends it.
            theirs
        });
        let result = exchange(&mut ours, b"GET /readyz HTTP/1.1\r\nhost: h\r\n\r\n").await;
        drop(peer.await);
        result
    }

    #[tokio::test]
    async fn answers_are_read_to_their_end_and_only_clean_ones_reused() {
        let cases: [(&[u8], u16, bool); 6] = [
            (b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok", 200, true),
            (
                b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 503 x\r\ncontent-length: 0\r\n\r\n",
                503,
                true,
            ),
            (
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n",
                200,
                true,
            ),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nokEXTRA",
                200,
                false,
            ),
            (
                b"HTTP/1.1 401 x\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
                401,
                false,
            ),
            (
                b"HTTP/1.1 200 OK\r\ncontent-length: 999999\r\n\r\n",
                200,
                false,
            ),
        ];
        for (answer, status, reusable) in cases {
            let got = answered(answer).await.expect("an answer");
            assert_eq!(
                got,
                Answer { status, reusable },
                "{}",
                String::from_utf8_lossy(answer)
            );
        }
        let big = format!("HTTP/1.1 200 OK\r\nx: {}\r\n\r\n", "a".repeat(MAX_HEAD));
        assert_eq!(
            answered(big.as_bytes()).await.expect("an answer"),
            too_large()
        );
        let chunks = format!(
            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n{}",
            "1\r\na\r\n".repeat(4096)
        );
        let got = answered(chunks.as_bytes()).await.expect("an answer");
        assert!(!got.reusable, "a body past the cap closes the connection");
    }
}
