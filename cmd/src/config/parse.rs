//! The file read into its raw shape, with every unknown key named.
//!
//! serde stops at the first mistake. An operator with three misspelt keys
//! should see all three, so after a failed parse the file is read again as
//! an untyped tree, and each unknown key is found, named and cut out in turn
//! until the shape parses. The first mistake is serde-saphyr's own, with its
//! line and column; a wrong type after it is cut out too, but not named,
//! since the tree knows no YAML (a bare `2024` is a number there, and a name
//! in the file). The checks of the values run once the file parses.

use std::fmt;

use serde::de;
use serde_path_to_error::{Path as KeyPath, Segment};
use serde_value::{Value, ValueDeserializer};

use super::ConfigError;
use super::raw::RawConfig;

/// Unknown keys looked for after the first mistake; each look parses the
/// whole tree again. Past these, a last line says more may follow.
const MAX_MORE: usize = 32;

/// What parsing `text` may cost. serde-saphyr's default budget (250,000
/// nodes, a million events) is passed by a file that lists 50,000 remotes,
/// and fleets list more. A file without aliases holds fewer nodes and
/// events than bytes, so its own size is allowed too: an alias bomb stays
/// bounded by the file it is in, and the aliases by serde-saphyr's caps.
fn options(text: &str) -> serde_saphyr::Options {
    let mut budget = serde_saphyr::Budget::default();
    budget.max_nodes = budget.max_nodes.max(text.len());
    budget.max_events = budget.max_events.max(text.len());
    let mut options = serde_saphyr::Options::default();
    options.budget = Some(budget);
    options
}

/// `text` in its raw shape, or every unknown key in it beside its first
/// mistake, each named by its path (`probe.jitter`, `remotes[1].sever`).
pub(super) fn raw(text: &str, file: &str) -> Result<RawConfig, ConfigError> {
    if text.trim().is_empty() {
        return Ok(RawConfig::default());
    }
    // serde_path_to_error follows the keys and indices down to the error,
    // which serde-saphyr's own message does not name.
    let mut path = None;
    serde_saphyr::with_deserializer_from_str_with_options(text, options(text), |deserializer| {
        serde_path_to_error::deserialize(deserializer).map_err(|err| {
            path = Some(err.path().clone());
            err.into_inner()
        })
    })
    .map_err(|err| {
        let mut first = parse_error(file, path.as_ref(), &err);
        if let Some(path) = &path {
            first.more = unknown_keys(text, file, path);
        }
        first
    })
}

/// The unknown keys of `text` other than at `first`, where its parse
/// failed: none when the tree cannot be read or `first` is not a key.
fn unknown_keys(text: &str, file: &str, first: &KeyPath) -> Vec<ConfigError> {
    let Ok(mut tree) = serde_saphyr::from_str_with_options::<Value>(text, options(text)) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    let mut cut_at = first.clone();
    for _ in 0..MAX_MORE {
        if !cut(&mut tree, &cut_at) {
            return found;
        }
        let parsed: Result<RawConfig, _> =
            serde_path_to_error::deserialize(ValueDeserializer::<TreeError>::new(tree.clone()));
        let Err(err) = parsed else { return found };
        if let TreeError::UnknownField { field, expected } = err.inner() {
            let message = unknown_field(field, expected);
            found.push(ConfigError::new(file, err.path().to_string(), message));
        }
        cut_at = err.path().clone();
    }
    found.push(ConfigError::new(
        file,
        "(document)",
        format!(
            "more mistakes may follow; these are the first {}",
            found.len() + 1
        ),
    ));
    found
}

/// Removes the key at `path` from `tree`; false when `path` does not end
/// in a key of a mapping there.
fn cut(tree: &mut Value, path: &KeyPath) -> bool {
    let segments: Vec<&Segment> = path.iter().collect();
    let Some((Segment::Map { key }, parents)) = segments.split_last() else {
        return false;
    };
    let mut node = tree;
    for segment in parents {
        let child = match (segment, node) {
            (Segment::Map { key }, Value::Map(map)) => map.get_mut(&Value::String(key.clone())),
            (Segment::Seq { index }, Value::Seq(items)) => items.get_mut(*index),
            _ => None,
        };
        match child {
            Some(child) => node = child,
            None => return false,
        }
    }
    match node {
        Value::Map(map) => map.remove(&Value::String(key.clone())).is_some(),
        _ => false,
    }
}

/// A parse error at `path` as a [`ConfigError`]: an unknown key gets the
/// closest known one as a suggestion, anything else serde-saphyr's message
/// and where it is.
fn parse_error(file: &str, path: Option<&KeyPath>, err: &serde_saphyr::Error) -> ConfigError {
    let message = match err.without_snippet() {
        serde_saphyr::Error::SerdeUnknownField {
            field, expected, ..
        } => unknown_field(field, expected),
        other => other
            .to_string()
            .lines()
            .next()
            .unwrap_or("invalid YAML")
            .to_owned(),
    };
    let path = path.map(ToString::to_string).unwrap_or_default();
    let field = if path.is_empty() || path == "." {
        "(document)"
    } else {
        &path
    };
    ConfigError::new(file, field, message)
}

/// What is said of the unknown key `field` where `expected` are known.
fn unknown_field(field: &str, expected: &[&str]) -> String {
    let closest = expected
        .iter()
        .map(|known| (strsim::jaro_winkler(field, known), *known))
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .filter(|(score, _)| *score > 0.8);
    match closest {
        Some((_, known)) => format!("unknown field; did you mean {known}?"),
        None => format!("unknown field; known fields: {}", expected.join(", ")),
    }
}

/// Why the tree did not parse: only an unknown key is told apart.
#[derive(Debug)]
enum TreeError {
    UnknownField {
        field: String,
        expected: &'static [&'static str],
    },
    Other,
}

impl fmt::Display for TreeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::UnknownField { field, .. } => write!(f, "unknown field {field}"),
            Self::Other => f.write_str("not the config's shape"),
        }
    }
}

impl std::error::Error for TreeError {}

impl de::Error for TreeError {
    fn custom<T: fmt::Display>(_: T) -> Self {
        Self::Other
    }

    fn unknown_field(field: &str, expected: &'static [&'static str]) -> Self {
        Self::UnknownField {
            field: field.to_owned(),
            expected,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::fmt::Write as _;

    use super::*;

    #[test]
    fn an_alias_bomb_is_refused_within_the_files_own_size() {
        // Nine levels of ten aliases each: a few hundred bytes, a billion
        // nodes once expanded.
        let mut text = String::from("x0: &x0 [a]\n");
        for level in 1..=9 {
            let refs = vec![format!("*x{}", level - 1); 10].join(", ");
            let _ = writeln!(text, "x{level}: &x{level} [{refs}]");
        }
        let err = serde_saphyr::from_str_with_options::<Value>(&text, options(&text))
            .expect_err("a bomb");
        assert!(err.to_string().contains("budget breached"), "{err}");
    }
}
