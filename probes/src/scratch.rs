//! Buffers a probe borrows while it exchanges: kept by each worker thread
//! and lent to the next probe that runs on it, so that a probe allocates
//! none, and an idle connection still holds none.

use std::cell::RefCell;

/// How many free buffers a thread keeps: one exchange uses three at most.
const KEEP: usize = 4;

/// A buffer grown past this (a long head, a large body drained) is freed
/// rather than kept.
const MAX_KEPT: usize = 64 * 1024;

thread_local! {
    static FREE: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// An empty buffer: one this thread kept, or a new one.
pub(crate) fn take() -> Vec<u8> {
    FREE.with_borrow_mut(Vec::pop).unwrap_or_default()
}

/// Hands `buf` back, to be lent again.
pub(crate) fn give(mut buf: Vec<u8>) {
    if buf.capacity() == 0 || buf.capacity() > MAX_KEPT {
        return;
    }
    buf.clear();
    FREE.with_borrow_mut(|free| {
        if free.len() < KEEP {
            free.push(buf);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_given_back_is_lent_again_empty_and_a_large_one_is_freed() {
        let mut buf = take();
        buf.extend_from_slice(b"answer");
        let at = buf.as_ptr();
        give(buf);
        let again = take();
        assert!(again.is_empty());
        assert_eq!(again.as_ptr(), at, "the same allocation");
        give(vec![0; MAX_KEPT + 1]);
        assert_eq!(take().capacity(), 0, "too large to keep");
        let kept: Vec<_> = (0..KEEP + 2).map(|_| Vec::with_capacity(16)).collect();
        kept.into_iter().for_each(give);
        assert_eq!(FREE.with_borrow(Vec::len), KEEP);
    }
}
