//! Buffers a probe borrows while it exchanges: kept by the process and lent
//! to the next probe, so that a probe allocates none, and an idle
//! connection still holds none.
//!
//! One pool for the process, not one for each worker thread: a probe often
//! takes its buffers on the worker its timer woke it on and gives them back
//! on the one its socket woke it on, so per-thread pools filled on one
//! worker and allocated anew on the other (two probes in three allocated:
//! about 430 instructions a probe, issue 43, part 9).

use std::sync::{Mutex, PoisonError};

/// How many free buffers are kept: one exchange uses three at most, and
/// this is room for several workers exchanging at once.
const KEEP: usize = 16;

/// A buffer grown past this (a long head, a large body drained) is freed
/// rather than kept.
const MAX_KEPT: usize = 64 * 1024;

/// Free buffers, at most [`KEEP`] of them.
struct Pool(Mutex<Vec<Vec<u8>>>);

static POOL: Pool = Pool(Mutex::new(Vec::new()));

impl Pool {
    fn take(&self) -> Vec<u8> {
        let kept = self.0.lock().unwrap_or_else(PoisonError::into_inner).pop();
        kept.unwrap_or_default()
    }

    fn give(&self, mut buf: Vec<u8>) {
        if buf.capacity() == 0 || buf.capacity() > MAX_KEPT {
            return;
        }
        buf.clear();
        let mut free = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if free.len() < KEEP {
            free.push(buf);
        }
    }
}

#[cfg(test)]
thread_local! {
    /// Buffers taken on this thread, for tests that count what a wait takes.
    static TAKEN: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many buffers this thread has taken.
#[cfg(test)]
pub(crate) fn taken() -> usize {
    TAKEN.with(std::cell::Cell::get)
}

/// An empty buffer: one kept, or a new one.
pub(crate) fn take() -> Vec<u8> {
    #[cfg(test)]
    TAKEN.with(|taken| taken.set(taken.get() + 1));
    POOL.take()
}

/// Hands `buf` back, to be lent again.
pub(crate) fn give(buf: Vec<u8>) {
    POOL.give(buf);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_given_back_is_lent_again_empty_and_a_large_one_is_freed() {
        let pool = Pool(Mutex::new(Vec::new()));
        let mut buf = pool.take();
        buf.extend_from_slice(b"answer");
        let at = buf.as_ptr();
        pool.give(buf);
        let again = pool.take();
        assert!(again.is_empty());
        assert_eq!(again.as_ptr(), at, "the same allocation");
        pool.give(vec![0; MAX_KEPT + 1]);
        assert_eq!(pool.take().capacity(), 0, "too large to keep");
        let kept: Vec<_> = (0..KEEP + 2).map(|_| Vec::with_capacity(16)).collect();
        for buf in kept {
            pool.give(buf);
        }
        assert_eq!(pool.0.lock().expect("not poisoned").len(), KEEP);
    }

    /// A probe's buffers often go back on another worker than the one
    /// that lent them: they are lent again all the same.
    #[test]
    fn a_buffer_given_back_on_another_thread_is_lent_again() {
        let pool = Pool(Mutex::new(Vec::new()));
        let mut buf = pool.take();
        buf.reserve(1024);
        let at = buf.as_ptr();
        std::thread::scope(|scope| {
            scope.spawn(|| pool.give(buf));
        });
        let again = pool.take();
        assert_eq!(again.as_ptr(), at, "the same allocation");
    }
}
