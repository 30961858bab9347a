//! Text that came from elsewhere, made safe to print: an apiserver's error
//! message, a Lease's holder, a plugin's complaint. A control character in
//! it could forge a log line (`\n`) or drive a terminal (`ESC`), and its
//! length is the peer's to choose; here neither reaches a log or a screen.

use std::borrow::Cow;

/// The most characters of one rendered error kept: well past any error a
/// library writes, far short of the megabytes a hostile peer may send.
pub const MAX_ERROR_CHARS: usize = 2048;

/// Whether `c` must not be printed as itself: a control character, a line
/// or paragraph separator, or a bidirectional override that reorders what
/// a terminal shows.
fn unprintable(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{2028}' | '\u{2029}' | '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// `text`, with every control character escaped as Rust writes it (`\n`,
/// `\u{1b}`), and cut after `max` characters of the result, the cut marked
/// with `…`. Borrowed when nothing needs changing.
#[must_use]
pub fn printable(text: &str, max: usize) -> Cow<'_, str> {
    if text.chars().take(max + 1).count() <= max && !text.chars().any(unprintable) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len().min(max * 4));
    let mut kept = 0;
    for c in text.chars() {
        let escaped: String = if unprintable(c) {
            c.escape_default().collect()
        } else {
            c.into()
        };
        let len = escaped.chars().count();
        if kept + len > max {
            out.push('…');
            return Cow::Owned(out);
        }
        kept += len;
        out.push_str(&escaped);
    }
    Cow::Owned(out)
}

/// The message of a panic's `payload`: the `&str` or `String` that
/// `panic!` was given, or a note that it was something else.
#[must_use]
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic payload that is not a string".to_owned())
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn plain_short_text_is_borrowed_unchanged() {
        assert!(matches!(
            printable("connection refused", 100),
            Cow::Borrowed("connection refused")
        ));
    }

    #[test]
    fn a_forged_log_line_and_a_terminal_escape_are_escaped() {
        assert_eq!(
            printable("denied\n2026-12-01T00:00:00Z INFO forged", 100),
            "denied\\n2026-12-01T00:00:00Z INFO forged"
        );
        assert_eq!(printable("\u{1b}[2Jhi\r", 100), "\\u{1b}[2Jhi\\r");
        assert_eq!(printable("a\u{202e}b", 100), "a\\u{202e}b");
    }

    #[test]
    fn long_text_is_cut_and_marked() {
        let long = "x".repeat(4 << 20);
        let cut = printable(&long, MAX_ERROR_CHARS);
        assert_eq!(cut.chars().count(), MAX_ERROR_CHARS + 1);
        assert!(cut.ends_with('…'));
        assert_eq!(printable("abc", 3), "abc");
        assert_eq!(printable("abcd", 3), "abc…");
    }

    proptest! {
        #[test]
        fn the_result_is_bounded_and_holds_no_control_character(text in ".*", max in 0usize..64) {
            let out = printable(&text, max);
            prop_assert!(out.chars().count() <= max + 1);
            prop_assert!(!out.chars().any(unprintable));
        }
    }
}
