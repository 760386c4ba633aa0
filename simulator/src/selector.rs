//! Label and field selectors, as `labelSelector` and `fieldSelector` query
//! parameters carry them: `a=b`, `a==b`, `a!=b`, `a`, `!a`, `a in (x,y)`,
//! `a notin (x,y)`; field selectors use the equality forms on dotted paths.
//! They filter whatever kind the API server stores, so they read objects as JSON.

use serde_json::Value;

use crate::error::ApiError;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    NotExists(String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
}

/// A parsed selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector(Vec<Requirement>);

/// Splits on commas that are not inside parentheses.
fn terms(text: &str) -> Vec<&str> {
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                terms.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    terms.push(&text[start..]);
    terms
        .into_iter()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .collect()
}

fn set(values: &str, term: &str) -> Result<Vec<String>, ApiError> {
    let inner = values
        .trim()
        .strip_prefix('(')
        .and_then(|v| v.strip_suffix(')'))
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "selector term {term:?}: a set must be written (a,b)"
            ))
        })?;
    Ok(inner.split(',').map(|v| v.trim().to_owned()).collect())
}

/// Label keys (`[prefix/]name`) and field paths are letters, digits, `-`, `_`, `.` and `/`.
fn valid_key(key: &str) -> bool {
    !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

impl Requirement {
    fn key(&self) -> &str {
        match self {
            Self::Equals(k, _)
            | Self::NotEquals(k, _)
            | Self::Exists(k)
            | Self::NotExists(k)
            | Self::In(k, _)
            | Self::NotIn(k, _) => k,
        }
    }
}

impl Selector {
    pub fn parse(text: &str) -> Result<Self, ApiError> {
        let mut requirements = Vec::new();
        for term in terms(text) {
            let requirement = if let Some((key, value)) = term.split_once("!=") {
                Requirement::NotEquals(key.trim().into(), value.trim().into())
            } else if let Some((key, value)) = term.split_once("==") {
                Requirement::Equals(key.trim().into(), value.trim().into())
            } else if let Some((key, value)) = term.split_once('=') {
                Requirement::Equals(key.trim().into(), value.trim().into())
            } else if let Some((key, values)) = term.split_once(" notin ") {
                Requirement::NotIn(key.trim().into(), set(values, term)?)
            } else if let Some((key, values)) = term.split_once(" in ") {
                Requirement::In(key.trim().into(), set(values, term)?)
            } else if let Some(key) = term.strip_prefix('!') {
                Requirement::NotExists(key.trim().into())
            } else if term.contains(char::is_whitespace) {
                return Err(ApiError::bad_request(format!(
                    "selector term {term:?} is not understood; use key=value, key!=value, key, !key, key in (a,b) or key notin (a,b)"
                )));
            } else {
                Requirement::Exists(term.into())
            };
            if !valid_key(requirement.key()) {
                return Err(ApiError::bad_request(format!(
                    "selector term {term:?}: {:?} is not a valid key (letters, digits, '-', '_', '.' and '/')",
                    requirement.key()
                )));
            }
            requirements.push(requirement);
        }
        Ok(Self(requirements))
    }

    fn matches(&self, lookup: impl Fn(&str) -> Option<String>) -> bool {
        self.0.iter().all(|requirement| match requirement {
            Requirement::Equals(k, v) => lookup(k).as_deref() == Some(v),
            Requirement::NotEquals(k, v) => lookup(k).as_deref() != Some(v),
            Requirement::Exists(k) => lookup(k).is_some(),
            Requirement::NotExists(k) => lookup(k).is_none(),
            Requirement::In(k, vs) => lookup(k).is_some_and(|v| vs.contains(&v)),
            Requirement::NotIn(k, vs) => lookup(k).is_none_or(|v| !vs.contains(&v)),
        })
    }

    /// Matches against `metadata.labels`.
    pub fn matches_labels(&self, object: &Value) -> bool {
        // Most lists and watches have no selector: skip even finding the labels.
        if self.0.is_empty() {
            return true;
        }
        let labels = &object["metadata"]["labels"];
        self.matches(|key| labels[key].as_str().map(str::to_owned))
    }

    /// Matches against dotted field paths (`metadata.name`, `spec.nodeName`, ...).
    pub fn matches_fields(&self, object: &Value) -> bool {
        self.matches(|path| {
            let value = path.split('.').fold(object, |v, part| &v[part]);
            match value {
                Value::String(s) => Some(s.clone()),
                Value::Null => Some(String::new()),
                other => Some(other.to_string()),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(labels: Value) -> Value {
        json!({"metadata": {"name": "p", "labels": labels}, "spec": {"nodeName": "n1"}})
    }

    #[test]
    fn equality_existence_and_set_terms() {
        let p = pod(json!({"trainyard.dev/job": "a", "tier": "gpu"}));
        let yes = [
            "trainyard.dev/job",
            "trainyard.dev/job=a",
            "tier==gpu,trainyard.dev/job",
            "tier in (cpu, gpu)",
            "tier notin (cpu)",
            "!missing",
            "tier!=cpu",
        ];
        for s in yes {
            assert!(
                Selector::parse(s).expect(s).matches_labels(&p),
                "{s} should match"
            );
        }
        let no = [
            "missing",
            "trainyard.dev/job=b",
            "tier in (cpu)",
            "tier notin (gpu)",
            "!tier",
            "tier!=gpu",
        ];
        for s in no {
            assert!(
                !Selector::parse(s).expect(s).matches_labels(&p),
                "{s} should not match"
            );
        }
        assert!(
            Selector::parse("")
                .expect("empty")
                .matches_labels(&pod(json!(null)))
        );
    }

    #[test]
    fn field_selectors_follow_dotted_paths() {
        let p = pod(json!({}));
        assert!(
            Selector::parse("spec.nodeName=n1,metadata.name=p")
                .expect("parses")
                .matches_fields(&p)
        );
        assert!(
            !Selector::parse("spec.nodeName=n2")
                .expect("parses")
                .matches_fields(&p)
        );
        assert!(
            Selector::parse("spec.missing=")
                .expect("parses")
                .matches_fields(&p)
        );
    }

    #[test]
    fn malformed_sets_are_rejected_with_the_form_to_use() {
        let err = Selector::parse("tier in cpu").expect_err("needs parentheses");
        assert!(err.to_string().contains("(a,b)"), "{err}");
    }

    #[test]
    fn empty_or_malformed_keys_are_rejected() {
        for bad in ["=a", "!=a", "tier,=gpu", "ti*er=gpu", "!"] {
            let err = Selector::parse(bad).expect_err(bad);
            assert_eq!(err.code, 400, "{bad}");
            assert!(err.message.contains("not a valid key"), "{bad}: {err}");
        }
    }
}
