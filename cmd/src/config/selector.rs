//! Label selectors, checked as the apiserver parses `labelSelector`:
//! `a=b`, `a==b`, `a!=b`, `a`, `!a`, `a in (x,y)`, `a notin (x,y)`, joined
//! by commas.

/// What is wrong with a label selector.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum SelectorError {
    /// A key is not `[prefix/]name`.
    #[error("invalid label key {0:?}")]
    Key(String),
    /// A value is not a label value.
    #[error("invalid label value {0:?}")]
    Value(String),
    /// An `in` or `notin` without a parenthesised set.
    #[error("bad set in {0:?}")]
    Set(String),
}

/// Checks `selector`.
///
/// # Errors
///
/// The first bad key, value or set.
pub(super) fn check(selector: &str) -> Result<(), SelectorError> {
    let mut depth = 0_u32;
    selector
        .split(|c: char| {
            match c {
                '(' => depth += 1,
                ')' => depth = depth.saturating_sub(1),
                _ => {}
            }
            c == ',' && depth == 0
        })
        .map(str::trim)
        .filter(|requirement| !requirement.is_empty())
        .try_for_each(requirement)
}

/// One requirement: its key and values, each checked.
fn requirement(text: &str) -> Result<(), SelectorError> {
    let (key, values): (&str, Vec<&str>) = if let Some(key) = text.strip_prefix('!') {
        (key, Vec::new())
    } else if let Some(at) = ["!=", "==", "="]
        .iter()
        .find_map(|op| text.find(op).map(|i| (i, op.len())))
    {
        (&text[..at.0], vec![&text[at.0 + at.1..]])
    } else if let Some((key, set)) = text
        .split_once(" notin ")
        .or_else(|| text.split_once(" in "))
    {
        let inner = set
            .trim()
            .strip_prefix('(')
            .and_then(|s| s.strip_suffix(')'))
            .ok_or_else(|| SelectorError::Set(text.to_owned()))?;
        (
            key,
            inner.split(',').filter(|v| !v.trim().is_empty()).collect(),
        )
    } else {
        (text, Vec::new())
    };
    let key = key.trim();
    if !is_key(key) {
        return Err(SelectorError::Key(key.to_owned()));
    }
    match values.into_iter().map(str::trim).find(|v| !is_name(v)) {
        Some(bad) => Err(SelectorError::Value(bad.to_owned())),
        None => Ok(()),
    }
}

/// `[prefix/]name`: a lower-case DNS subdomain prefix of at most 253
/// characters, and a non-empty name.
fn is_key(key: &str) -> bool {
    let (prefix, name) = key.rsplit_once('/').unwrap_or(("", key));
    !name.is_empty()
        && is_name(name)
        && prefix.len() <= 253
        && prefix
            .bytes()
            .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.'))
}

/// A label name or value: at most 63 of `[A-Za-z0-9-_.]`, alphanumeric at
/// both ends; a value may be empty.
fn is_name(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && bytes.first().is_none_or(u8::is_ascii_alphanumeric)
        && bytes.last().is_none_or(u8::is_ascii_alphanumeric)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn each_form_is_taken_and_each_mistake_named() {
        for good in [
            "",
            "app=web",
            "app==web",
            "app!=web",
            "app",
            "!app",
            "tier in (front, back)",
            "tier notin (x)",
            "example.com/app=web,env",
            "app=",
        ] {
            assert_eq!(check(good), Ok(()), "{good:?}");
        }
        for (bad, error) in [
            ("app in x", SelectorError::Set("app in x".to_owned())),
            (
                "Example.com/app=web",
                SelectorError::Key("Example.com/app".to_owned()),
            ),
            ("-app", SelectorError::Key("-app".to_owned())),
            ("app=web-", SelectorError::Value("web-".to_owned())),
            ("app in (a, b c)", SelectorError::Value("b c".to_owned())),
        ] {
            assert_eq!(check(bad), Err(error), "{bad:?}");
        }
    }

    proptest! {
        /// The simulated apiserver parses selectors with code of its own:
        /// the two agree on every selector made of the grammar's pieces.
        #[test]
        fn agrees_with_the_simulated_apiserver(
            parts in proptest::collection::vec(
                "(!?[a-z./-]{0,5}|[a-zA-Z0-9./_-]{0,5} ?(=|==|!=|in|notin) ?\\(?[a-zA-Z0-9 ,._-]{0,6}\\)?)",
                0..4,
            )
        ) {
            let selector = parts.join(",");
            prop_assert_eq!(
                check(&selector).is_ok(),
                tether_testkit::check_label_selector(&selector).is_ok(),
                "{:?}", selector
            );
        }
    }
}
