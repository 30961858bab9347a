//! Numbers and times as a person reads them, the same on the status page,
//! in the CLI's output and in the demo: `12s`, `4m 10s`, `3.4 ms`,
//! `1 success`.

use std::time::Duration;

use jiff::fmt::friendly::{Designator, Spacing, SpanPrinter};

/// A configured duration, exactly and in the syntax the config takes:
/// `10s`, `500ms`, `1m30s`.
#[must_use]
pub(crate) fn exact(duration: Duration) -> String {
    const PRINTER: SpanPrinter = SpanPrinter::new()
        .designator(Designator::Compact)
        .spacing(Spacing::None);
    PRINTER.unsigned_duration_to_string(&duration)
}

/// A span of time, rounded to what a person needs at its size: `850ms`,
/// `12s`, `4m 10s`, `42m`, `3h 5m`, `2d 3h`.
#[must_use]
pub(crate) fn span(duration: Duration) -> String {
    let secs = duration.as_secs();
    match secs {
        0 => format!("{}ms", duration.as_millis()),
        1..60 => format!("{secs}s"),
        60..600 => two(secs / 60, "m", secs % 60, "s"),
        600..3600 => format!("{}m", secs / 60),
        3600..86_400 => two(secs / 3600, "h", secs % 3600 / 60, "m"),
        _ => two(secs / 86_400, "d", secs % 86_400 / 3600, "h"),
    }
}

/// Two units, the second left out when it is zero.
fn two(major: u64, major_unit: &str, minor: u64, minor_unit: &str) -> String {
    if minor == 0 {
        format!("{major}{major_unit}")
    } else {
        format!("{major}{major_unit} {minor}{minor_unit}")
    }
}

/// How long ago: `just now` under a second, else `12s ago`.
#[must_use]
pub(crate) fn ago(duration: Duration) -> String {
    if duration < Duration::from_secs(1) {
        "just now".to_owned()
    } else {
        format!("{} ago", span(duration))
    }
}

/// A latency in milliseconds, to two significant digits below 10 ms and
/// whole milliseconds above: `0.42 ms`, `3.4 ms`, `34 ms`, `1250 ms`.
#[must_use]
pub(crate) fn latency(duration: Duration) -> String {
    let ms = duration.as_secs_f64() * 1000.0;
    if ms < 1.0 {
        format!("{ms:.2} ms")
    } else if ms < 10.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{ms:.0} ms")
    }
}

/// A command as a shell would read it back: `/manager --flag 'two words'`.
#[must_use]
pub(crate) fn command(words: &[String]) -> String {
    // try_join fails only on a NUL byte, which no argument can hold.
    shlex::try_join(words.iter().map(String::as_str)).unwrap_or_else(|_| words.join(" "))
}

/// A whole number with its thousands marked: `10,000`.
#[must_use]
pub(crate) fn number(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

/// `count` and the noun, singular or plural: `1 success`, `3 failures`,
/// `10,000 remotes`.
#[must_use]
pub(crate) fn count(count: u64, one: &str, many: &str) -> String {
    format!("{} {}", number(count), if count == 1 { one } else { many })
}

/// A size in bytes as a person reads it: `812 bytes`, `5.0 KiB`, `1.2 MiB`.
#[must_use]
pub(crate) fn bytes(size: usize) -> String {
    #[allow(clippy::cast_precision_loss)] // a size shown to one decimal
    let size_f = size as f64;
    if size < 1024 {
        count(size as u64, "byte", "bytes")
    } else if size < 1024 * 1024 {
        format!("{:.1} KiB", size_f / 1024.0)
    } else {
        format!("{:.1} MiB", size_f / (1024.0 * 1024.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_in_the_unit_that_fits() {
        assert_eq!(bytes(1), "1 byte");
        assert_eq!(bytes(812), "812 bytes");
        assert_eq!(bytes(5 * 1024), "5.0 KiB");
        assert_eq!(bytes(1_300_000), "1.2 MiB");
    }

    #[test]
    fn an_exact_duration_reads_as_the_config_writes_it() {
        assert_eq!(exact(Duration::from_secs(10)), "10s");
        assert_eq!(exact(Duration::from_millis(500)), "500ms");
        assert_eq!(exact(Duration::from_secs(90)), "1m30s");
        assert_eq!(exact(Duration::from_millis(8800)), "8s800ms");
        for d in [1, 500, 8800, 90_000, 5_400_000] {
            let d = Duration::from_millis(d);
            assert_eq!(crate::config::parse_duration(&exact(d)), Ok(d));
        }
    }

    #[test]
    fn a_span_keeps_the_units_that_matter_at_its_size() {
        let s = Duration::from_secs;
        assert_eq!(span(Duration::from_millis(850)), "850ms");
        assert_eq!(span(s(12)), "12s");
        assert_eq!(span(s(240)), "4m");
        assert_eq!(span(s(250)), "4m 10s");
        assert_eq!(span(s(42 * 60 + 59)), "42m");
        assert_eq!(span(s(3 * 3600 + 5 * 60 + 9)), "3h 5m");
        assert_eq!(span(s(2 * 86_400 + 3 * 3600)), "2d 3h");
        assert_eq!(ago(Duration::from_millis(300)), "just now");
        assert_eq!(ago(s(12)), "12s ago");
    }

    #[test]
    fn latency_is_in_milliseconds_with_sensible_precision() {
        assert_eq!(latency(Duration::from_micros(420)), "0.42 ms");
        assert_eq!(latency(Duration::from_micros(3_440)), "3.4 ms");
        assert_eq!(latency(Duration::from_micros(34_400)), "34 ms");
        assert_eq!(latency(Duration::from_millis(1250)), "1250 ms");
    }

    #[test]
    fn a_command_reads_back_as_the_same_words() {
        let words: Vec<String> = ["/manager", "--name=a b", "it's"]
            .map(str::to_owned)
            .to_vec();
        let shown = command(&words);
        assert_eq!(shown, r#"/manager '--name=a b' "it's""#);
        assert_eq!(shlex::split(&shown), Some(words));
    }

    #[test]
    fn counts_agree_with_their_nouns() {
        assert_eq!(count(1, "success", "successes"), "1 success");
        assert_eq!(count(3, "success", "successes"), "3 successes");
        assert_eq!(count(0, "failure", "failures"), "0 failures");
        assert_eq!(count(10_000, "remote", "remotes"), "10,000 remotes");
        assert_eq!(number(999), "999");
        assert_eq!(number(1000), "1,000");
        assert_eq!(number(1_234_567), "1,234,567");
    }
}
