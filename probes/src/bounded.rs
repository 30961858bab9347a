//! kube clients whose responses cannot exhaust tether's memory.
//!
//! kube reads a list's whole body before it parses it, and splits a watch
//! stream into lines of any length. A remote that answers a list with a body
//! that never ends, or a watch event that never ends, would have tether buffer
//! it until the process dies. A client from [`bounded_client`] cuts such a
//! response with [`ResponseTooLarge`]: a list (any response but a watch)
//! beyond [`MAX_RESPONSE`] (a Lease client's beyond [`MAX_LEASE_RESPONSE`]),
//! a watch event (a line of the stream) beyond [`MAX_WATCH_EVENT`].

use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use futures_util::FutureExt as _;
use http::{Request, Response};
use hyper::body::{Body, Frame, SizeHint};
use tower::{BoxError, Layer, Service};

/// The most a response other than a watch may carry: 64 MiB. The manager's
/// lists are paged (500 objects a page), and etcd caps an object at 1.5 MiB.
pub const MAX_RESPONSE: u64 = 64 * 1024 * 1024;

/// The most one watch event (one line of a watch stream) may carry: 4 MiB,
/// well above the 1.5 MiB etcd allows an object.
pub const MAX_WATCH_EVENT: u64 = 4 * 1024 * 1024;

/// The most a response about Leases (or an Event the home cluster echoes
/// back) may carry: 1 MiB. A Lease is a few hundred bytes (its holder is a
/// name of at most 253 characters), so a list of every member of a shard
/// group fits many times over.
pub const MAX_LEASE_RESPONSE: u64 = 1024 * 1024;

/// A response cut because it passed its bound.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ResponseTooLarge {
    /// A list (or any response but a watch) passed its bound, in bytes
    /// ([`MAX_RESPONSE`] for a remote).
    #[error("the response passed {} MiB, the most tether reads", *.0 as f64 / f64::from(1 << 20))]
    Response(u64),
    /// A watch event passed [`MAX_WATCH_EVENT`].
    #[error("a watch event from the remote passed {} MiB, the most tether reads", MAX_WATCH_EVENT >> 20)]
    WatchEvent,
}

/// A kube client from `config`, with every response bounded.
///
/// Building it runs the kubeconfig's exec credential plugin, if any: build
/// it off the async workers ([`off_workers`](crate::client::off_workers)).
///
/// # Errors
///
/// As `kube::Client::try_from`.
pub fn bounded_client(config: kube::Config) -> Result<kube::Client, kube::Error> {
    bounded_client_within(config, MAX_RESPONSE)
}

/// As [`bounded_client`], with responses other than watches bounded by
/// `max` bytes instead of [`MAX_RESPONSE`] (for example
/// [`MAX_LEASE_RESPONSE`]).
///
/// # Errors
///
/// As `kube::Client::try_from`.
pub fn bounded_client_within(config: kube::Config, max: u64) -> Result<kube::Client, kube::Error> {
    Ok(kube::client::ClientBuilder::try_from(config)?
        .with_layer(&BoundLayer { max })
        .build())
}

/// What a response is bounded by.
#[derive(Debug, Clone, Copy)]
enum Bound {
    /// Its whole body, to this many bytes.
    Total(u64),
    /// Each line of its body.
    Line,
}

#[derive(Debug, Clone, Copy)]
struct BoundLayer {
    max: u64,
}

impl<S> Layer<S> for BoundLayer {
    type Service = BoundService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        BoundService {
            inner,
            max: self.max,
        }
    }
}

#[derive(Debug, Clone)]
struct BoundService<S> {
    inner: S,
    max: u64,
}

fn is_watch(request: &Request<kube::client::Body>) -> bool {
    request.uri().query().is_some_and(|query| {
        query
            .split('&')
            .any(|pair| matches!(pair, "watch=true" | "watch=1"))
    })
}

impl<S, B> Service<Request<kube::client::Body>> for BoundService<S>
where
    S: Service<Request<kube::client::Body>, Response = Response<B>>,
    S::Future: Send + 'static,
{
    type Response = Response<Bounded<B>>;
    type Error = S::Error;
    type Future = futures_util::future::BoxFuture<'static, Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: Request<kube::client::Body>) -> Self::Future {
        let bound = if is_watch(&request) {
            Bound::Line
        } else {
            Bound::Total(self.max)
        };
        self.inner
            .call(request)
            .map(move |response| {
                response.map(|response| response.map(|body| Bounded::new(body, bound)))
            })
            .boxed()
    }
}

/// A response body that fails once it passes its bound.
#[derive(Debug)]
pub struct Bounded<B> {
    inner: B,
    bound: Bound,
    /// Bytes counted toward the bound: all of them, or those since the
    /// last line break.
    counted: u64,
}

impl<B> Bounded<B> {
    fn new(inner: B, bound: Bound) -> Self {
        Self {
            inner,
            bound,
            counted: 0,
        }
    }

    /// Counts `data`; the error if it passes the bound.
    fn count(&mut self, data: &[u8]) -> Result<(), ResponseTooLarge> {
        let len = data.len() as u64;
        match self.bound {
            Bound::Total(max) => {
                self.counted += len;
                if self.counted > max {
                    return Err(ResponseTooLarge::Response(max));
                }
            }
            Bound::Line => {
                self.counted = match data.iter().rposition(|b| *b == b'\n') {
                    Some(at) => (data.len() - at - 1) as u64,
                    None => self.counted + len,
                };
                if self.counted > MAX_WATCH_EVENT {
                    return Err(ResponseTooLarge::WatchEvent);
                }
            }
        }
        Ok(())
    }
}

impl<B> Body for Bounded<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let frame = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        let Some(frame) = frame else {
            return Poll::Ready(None);
        };
        let frame = frame.map_err(Into::into)?;
        if let Some(data) = frame.data_ref() {
            self.count(data)?;
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counted(bound: Bound, frames: &[&[u8]]) -> Result<u64, ResponseTooLarge> {
        let mut body = Bounded::new((), bound);
        for frame in frames {
            body.count(frame)?;
        }
        Ok(body.counted)
    }

    #[test]
    fn a_watch_counts_from_the_last_line_break() {
        let mb = vec![b'x'; 1024 * 1024];
        let line_end = [&mb[..], b"\n", b"{}"].concat();
        assert_eq!(counted(Bound::Line, &[&mb, &mb, &line_end]), Ok(2));
        assert_eq!(
            counted(Bound::Line, &[&mb, &mb, &mb, &mb, b"x"]),
            Err(ResponseTooLarge::WatchEvent)
        );
        assert_eq!(
            counted(Bound::Total(MAX_RESPONSE), &[&mb[..]; 64]),
            Ok(MAX_RESPONSE),
            "exactly the bound is allowed"
        );
        let mut past = vec![&mb[..]; 64];
        past.push(b"x");
        assert_eq!(
            counted(Bound::Total(MAX_RESPONSE), &past),
            Err(ResponseTooLarge::Response(MAX_RESPONSE))
        );
    }
}
