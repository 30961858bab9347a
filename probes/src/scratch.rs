//! Buffers a probe borrows while it exchanges: kept by the process and lent
//! to the next probe, so that a probe allocates none, and an idle
//! connection still holds none.
//!
//! One pool for the process, not one for each worker thread: a probe often
//! takes its buffers on the worker its timer woke it on and gives them back
//! on the one its socket woke it on, so per-thread pools filled on one
//! worker and allocated anew on the other (two probes in three allocated:
//! about 430 instructions a probe, issue 43, part 9).
//!
//! In front of it, each thread keeps the few it was given back last. Since
//! a probe takes its buffers only once its answer has come (part 13), it
//! takes and gives them back in one poll, on one thread: the thread's own
//! serve it without the pool's lock, six times a probe (about 90
//! instructions a probe less, part 17). What one thread gives back past
//! what it may keep goes to the pool, for the others.

use std::cell::RefCell;
use std::sync::{Mutex, PoisonError};

/// How many free buffers are kept: one exchange uses three at most, and
/// this is room for several workers exchanging at once.
const KEEP: usize = 16;

/// How many free buffers a thread keeps for itself: one exchange holds
/// two at once.
const KEEP_LOCAL: usize = 4;

/// A buffer grown past this (a long head, a large body drained) is freed
/// rather than kept.
const MAX_KEPT: usize = 64 * 1024;

/// Free buffers, at most [`KEEP`] of them.
struct Pool(Mutex<Vec<Vec<u8>>>);

static POOL: Pool = Pool(Mutex::new(Vec::new()));

thread_local! {
    /// Free buffers this thread was given back, at most [`KEEP_LOCAL`].
    static LOCAL: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

// Cold: a thread's own buffers serve nearly every probe, and the pool's
// lock inlined would cost every take and give its registers.
impl Pool {
    #[cold]
    #[inline(never)]
    fn take(&self) -> Vec<u8> {
        let kept = self.0.lock().unwrap_or_else(PoisonError::into_inner).pop();
        kept.unwrap_or_default()
    }

    #[cold]
    #[inline(never)]
    fn keep(&self, buf: Vec<u8>) {
        let mut free = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if free.len() < KEEP {
            free.push(buf);
        }
    }
}

/// A buffer from `local` (a thread's own), else from `pool`, else new.
fn take_from(local: &mut Vec<Vec<u8>>, pool: &Pool) -> Vec<u8> {
    local.pop().unwrap_or_else(|| pool.take())
}

/// Keeps `buf`, emptied, in `local` while it has room, else in `pool`; a
/// buffer never grown or grown too large is freed.
fn give_to(local: &mut Vec<Vec<u8>>, pool: &Pool, mut buf: Vec<u8>) {
    if buf.capacity() == 0 || buf.capacity() > MAX_KEPT {
        return;
    }
    buf.clear();
    if local.len() < KEEP_LOCAL {
        local.push(buf);
    } else {
        pool.keep(buf);
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

/// An empty buffer: one this thread kept, one the pool kept, or a new one.
pub(crate) fn take() -> Vec<u8> {
    #[cfg(test)]
    TAKEN.with(|taken| taken.set(taken.get() + 1));
    LOCAL.with_borrow_mut(|local| take_from(local, &POOL))
}

/// Hands `buf` back, to be lent again.
pub(crate) fn give(buf: Vec<u8>) {
    LOCAL.with_borrow_mut(|local| give_to(local, &POOL, buf));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool() -> Pool {
        Pool(Mutex::new(Vec::new()))
    }

    #[test]
    fn a_buffer_given_back_is_lent_again_empty_and_a_large_one_is_freed() {
        let (pool, mut local) = (pool(), Vec::new());
        let mut buf = take_from(&mut local, &pool);
        buf.extend_from_slice(b"answer");
        let at = buf.as_ptr();
        give_to(&mut local, &pool, buf);
        let again = take_from(&mut local, &pool);
        assert!(again.is_empty());
        assert_eq!(again.as_ptr(), at, "the same allocation");
        give_to(&mut local, &pool, vec![0; MAX_KEPT + 1]);
        give_to(&mut local, &pool, Vec::new());
        assert!(local.is_empty(), "too large, or never grown, to keep");
        assert!(pool.0.lock().expect("not poisoned").is_empty());
    }

    /// A thread keeps a few for itself, the pool a few more for every
    /// thread, and the rest are freed.
    #[test]
    fn a_thread_keeps_a_few_and_the_pool_a_few_more() {
        let (pool, mut local) = (pool(), Vec::new());
        for _ in 0..KEEP_LOCAL + KEEP + 2 {
            give_to(&mut local, &pool, Vec::with_capacity(16));
        }
        assert_eq!(local.len(), KEEP_LOCAL);
        assert_eq!(pool.0.lock().expect("not poisoned").len(), KEEP);
    }

    /// A probe's buffers often go back on another worker than the one
    /// that lent them: once that worker keeps all it may, they reach the
    /// pool, and are lent again on the first.
    #[test]
    fn a_buffer_given_back_on_another_thread_is_lent_again() {
        let pool = pool();
        let mut lent = Vec::new();
        let mut buf = take_from(&mut lent, &pool);
        buf.reserve(1024);
        let at = buf.as_ptr();
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let mut full: Vec<_> = (0..KEEP_LOCAL).map(|_| Vec::with_capacity(16)).collect();
                give_to(&mut full, &pool, buf);
            });
        });
        let again = take_from(&mut lent, &pool);
        assert_eq!(again.as_ptr(), at, "the same allocation");
    }

    /// What a thread keeps is its own, and lent again before the pool's.
    #[test]
    fn a_thread_lends_its_own_first() {
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let mut buf = take();
                buf.reserve(1024);
                let at = buf.as_ptr();
                give(buf);
                assert_eq!(LOCAL.with_borrow(Vec::len), 1);
                let again = take();
                assert_eq!(again.as_ptr(), at, "the same allocation");
                assert_eq!(LOCAL.with_borrow(Vec::len), 0);
            });
        });
    }
}
