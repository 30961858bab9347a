//! Cross-crate integration and end-to-end tests of tether live in this
//! crate's `tests/` folder. The library itself is empty.
#![deny(missing_docs)]
