//! Label and field selectors, as the apiserver parses them.

use serde_json::Value;

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed `labelSelector` or `fieldSelector`; empty matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Selector {
    requirements: Vec<Requirement>,
}

/// Splits on commas that are not inside parentheses.
fn split_top_level(input: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0u32;
    let mut start = 0;
    for (i, c) in input.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&input[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&input[start..]);
    parts
}

fn set_values(rest: &str) -> Option<Vec<String>> {
    let inner = rest.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(
        inner
            .split(',')
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
            .collect(),
    )
}

/// A label name or value part: up to 63 of `[A-Za-z0-9-_.]`, alphanumeric
/// at both ends (a value may also be empty).
fn valid_name(name: &str) -> bool {
    name.len() <= 63
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && name
            .chars()
            .next()
            .is_none_or(|c| c.is_ascii_alphanumeric())
        && name
            .chars()
            .last()
            .is_none_or(|c| c.is_ascii_alphanumeric())
}

/// A label key: an optional DNS-subdomain prefix and `/`, then a name.
fn valid_key(key: &str) -> bool {
    let (prefix, name) = key.rsplit_once('/').unwrap_or(("", key));
    !name.is_empty()
        && valid_name(name)
        && prefix.len() <= 253
        && prefix
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.'))
}

fn valid_value(value: &str) -> bool {
    valid_name(value)
}

impl Selector {
    /// Parses a label selector: `a=b`, `a==b`, `a!=b`, `a`, `!a`,
    /// `a in (x,y)`, `a notin (x,y)`, joined by commas.
    pub(crate) fn parse_labels(input: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        for part in split_top_level(input) {
            let part = part.trim();
            if part.is_empty() {
                continue;
            }
            let requirement = if let Some(key) = part.strip_prefix('!') {
                Requirement::NotExists(key.trim().to_owned())
            } else if let Some((key, value)) = part.split_once("!=") {
                Requirement::NotEquals(key.trim().to_owned(), value.trim().to_owned())
            } else if let Some((key, value)) = part.split_once("==") {
                Requirement::Equals(key.trim().to_owned(), value.trim().to_owned())
            } else if let Some((key, value)) = part.split_once('=') {
                Requirement::Equals(key.trim().to_owned(), value.trim().to_owned())
            } else if let Some((key, rest)) = part.split_once(" notin ") {
                let values = set_values(rest).ok_or_else(|| format!("bad set in {part:?}"))?;
                Requirement::NotIn(key.trim().to_owned(), values)
            } else if let Some((key, rest)) = part.split_once(" in ") {
                let values = set_values(rest).ok_or_else(|| format!("bad set in {part:?}"))?;
                Requirement::In(key.trim().to_owned(), values)
            } else {
                Requirement::Exists(part.to_owned())
            };
            let key = match &requirement {
                Requirement::Equals(k, _)
                | Requirement::NotEquals(k, _)
                | Requirement::In(k, _)
                | Requirement::NotIn(k, _)
                | Requirement::Exists(k)
                | Requirement::NotExists(k) => k,
            };
            if !valid_key(key) {
                return Err(format!("invalid label key {key:?}"));
            }
            let values: &[String] = match &requirement {
                Requirement::Equals(_, v) | Requirement::NotEquals(_, v) => std::slice::from_ref(v),
                Requirement::In(_, vs) | Requirement::NotIn(_, vs) => vs,
                Requirement::Exists(_) | Requirement::NotExists(_) => &[],
            };
            if let Some(bad) = values.iter().find(|v| !valid_value(v)) {
                return Err(format!("invalid label value {bad:?}"));
            }
            requirements.push(requirement);
        }
        Ok(Self { requirements })
    }

    /// Parses a field selector. Only `metadata.name` and
    /// `metadata.namespace` are supported, with `=`, `==` and `!=`, as for
    /// the real apiserver's generic fields.
    pub(crate) fn parse_fields(input: &str) -> Result<Self, String> {
        let labels = Self::parse_labels(input)?;
        for requirement in &labels.requirements {
            match requirement {
                Requirement::Equals(field, _) | Requirement::NotEquals(field, _)
                    if field == "metadata.name" || field == "metadata.namespace" => {}
                other => return Err(format!("field label not supported: {other:?}")),
            }
        }
        Ok(labels)
    }

    /// Whether `object`'s labels satisfy every requirement.
    pub(crate) fn matches_labels(&self, object: &Value) -> bool {
        let labels = &object["metadata"]["labels"];
        self.matches(|key| labels.get(key).and_then(Value::as_str))
    }

    /// Whether `object`'s metadata fields satisfy every requirement.
    pub(crate) fn matches_fields(&self, object: &Value) -> bool {
        let metadata = &object["metadata"];
        self.matches(|field| {
            let key = field.strip_prefix("metadata.")?;
            // A cluster-scoped object's namespace is the empty string.
            Some(metadata.get(key).and_then(Value::as_str).unwrap_or(""))
        })
    }

    fn matches<'a>(&self, lookup: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.requirements
            .iter()
            .all(|requirement| match requirement {
                Requirement::Equals(k, v) => lookup(k) == Some(v.as_str()),
                Requirement::NotEquals(k, v) => lookup(k) != Some(v.as_str()),
                Requirement::In(k, vs) => lookup(k).is_some_and(|x| vs.iter().any(|v| v == x)),
                Requirement::NotIn(k, vs) => lookup(k).is_none_or(|x| vs.iter().all(|v| v != x)),
                Requirement::Exists(k) => lookup(k).is_some(),
                Requirement::NotExists(k) => lookup(k).is_none(),
            })
    }
}

/// Checks a label selector as the apiserver would: `Err` says what is
/// wrong with it.
///
/// # Errors
///
/// A message naming the bad key, value or set.
pub fn check_label_selector(input: &str) -> Result<(), String> {
    Selector::parse_labels(input).map(|_| ())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn object() -> Value {
        json!({"metadata": {"name": "x", "namespace": "default", "labels": {"app": "web", "tier": "front"}}})
    }

    #[test]
    fn equality_and_set_requirements_match_like_the_apiserver() {
        let o = object();
        let yes = [
            "app=web",
            "app==web",
            "app!=db",
            "app",
            "!missing",
            "tier in (front,back)",
            "tier notin (back)",
            "app=web,tier=front",
            "",
        ];
        for s in yes {
            assert!(
                Selector::parse_labels(s).expect(s).matches_labels(&o),
                "{s} should match"
            );
        }
        let no = [
            "app=db",
            "app!=web",
            "missing",
            "!app",
            "tier in (back)",
            "app=web,tier=back",
        ];
        for s in no {
            assert!(
                !Selector::parse_labels(s).expect(s).matches_labels(&o),
                "{s} should not match"
            );
        }
    }

    #[test]
    fn field_selectors_support_name_and_namespace_only() {
        let o = object();
        assert!(
            Selector::parse_fields("metadata.name=x")
                .expect("valid")
                .matches_fields(&o)
        );
        assert!(
            !Selector::parse_fields("metadata.name=y")
                .expect("valid")
                .matches_fields(&o)
        );
        assert!(
            Selector::parse_fields("metadata.namespace!=kube-system")
                .expect("valid")
                .matches_fields(&o)
        );
        assert!(Selector::parse_fields("spec.nodeName=a").is_err());
    }

    #[test]
    fn bad_keys_are_rejected() {
        assert!(Selector::parse_labels("a b=c").is_err());
        assert!(Selector::parse_labels("a in x").is_err());
    }
}
