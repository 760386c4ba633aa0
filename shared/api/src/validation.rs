//! Client-side validation shared by all kinds.
//!
//! The apiserver enforces the CRD schema and its CEL rules for objects applied with
//! kubectl. Specs that arrive over NATS never pass the apiserver, so every kind also
//! has a `validate()` that mirrors the same rules in Rust and reports problems the way
//! the apiserver does: a JSON path plus what to change.

use std::fmt;

use serde::de::DeserializeOwned;

/// What kind of problem a [`FieldError`] reports; mirrors the apiserver's field error types.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FieldErrorKind {
    /// A required field is missing or empty.
    Required,
    /// A field has a value outside its allowed range or format.
    Invalid,
    /// A field has a value that is not one of the supported values.
    NotSupported,
    /// A field is set where it is not allowed (it would be ignored or contradicts another field).
    Forbidden,
}

impl FieldErrorKind {
    /// The apiserver's wording for this kind ("Required value", "Invalid value", ...).
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Required => "Required value",
            Self::Invalid => "Invalid value",
            Self::NotSupported => "Unsupported value",
            Self::Forbidden => "Forbidden",
        }
    }
}

impl fmt::Display for FieldErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One problem with a spec: where it is and how to fix it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// JSON path of the offending field, e.g. `spec.numWorkers` or `spec.parameters[1].min`.
    pub path: String,
    /// Kind of problem.
    pub kind: FieldErrorKind,
    /// What is wrong and how to fix it, in plain words.
    pub message: String,
}

impl FieldError {
    /// Creates a field error.
    pub fn new(path: impl Into<String>, kind: FieldErrorKind, message: impl Into<String>) -> Self {
        Self {
            path: path.into(),
            kind,
            message: message.into(),
        }
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}: {}", self.path, self.kind, self.message)
    }
}

impl std::error::Error for FieldError {}

/// Collects field errors while walking a spec, so one pass reports every problem.
#[derive(Debug, Default)]
pub(crate) struct FieldErrors {
    errors: Vec<FieldError>,
}

impl FieldErrors {
    pub(crate) fn push(
        &mut self,
        path: impl Into<String>,
        kind: FieldErrorKind,
        message: impl Into<String>,
    ) {
        self.errors.push(FieldError::new(path, kind, message));
    }

    pub(crate) fn required(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.push(path, FieldErrorKind::Required, message);
    }

    pub(crate) fn invalid(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.push(path, FieldErrorKind::Invalid, message);
    }

    pub(crate) fn forbidden(&mut self, path: impl Into<String>, message: impl Into<String>) {
        self.push(path, FieldErrorKind::Forbidden, message);
    }

    /// Checks `min <= value <= max` for any ordered number; the message names the bounds.
    pub(crate) fn in_range<T>(&mut self, path: &str, value: T, min: T, max: T)
    where
        T: PartialOrd + fmt::Display + Copy,
    {
        if value < min || value > max {
            self.invalid(
                path,
                format!("must be between {min} and {max}, got {value}"),
            );
        }
    }

    /// Checks `value >= min`.
    pub(crate) fn at_least<T>(&mut self, path: &str, value: T, min: T)
    where
        T: PartialOrd + fmt::Display + Copy,
    {
        if value < min {
            self.invalid(path, format!("must be at least {min}, got {value}"));
        }
    }

    /// Checks a string against the schema's minLength/maxLength.
    pub(crate) fn length(&mut self, path: &str, value: &str, min: usize, max: usize) {
        let length = value.chars().count();
        if length < min {
            if min == 1 {
                self.required(path, "must not be empty");
            } else {
                self.invalid(path, format!("must be at least {min} characters long"));
            }
        } else if length > max {
            self.invalid(
                path,
                format!("must be at most {max} characters long, got {length}"),
            );
        }
    }

    /// Checks a list against the schema's minItems/maxItems.
    pub(crate) fn items(&mut self, path: &str, count: usize, min: usize, max: usize) {
        if count < min {
            self.required(path, format!("needs at least {min} item(s)"));
        } else if count > max {
            self.invalid(path, format!("must have at most {max} items, got {count}"));
        }
    }

    /// Checks that `value` is a lowercase DNS-1123 subdomain, the format of
    /// cluster object names (PriorityClass, TrainingQueue, PVC, ...).
    pub(crate) fn dns_subdomain(&mut self, path: &str, value: &str) {
        if !is_dns_subdomain(value) {
            self.invalid(
                path,
                format!(
                    "{value:?} is not a valid object name: use at most {MAX_DNS_SUBDOMAIN_LENGTH} lowercase letters, digits, '-' and '.', starting and ending with a letter or digit"
                ),
            );
        }
    }

    /// Checks that `value` is a lowercase DNS-1123 label (no dots).
    pub(crate) fn dns_label(&mut self, path: &str, value: &str) {
        if !is_dns_label(value) {
            self.invalid(
                path,
                format!(
                    "{value:?} is not a valid name: use at most {MAX_DNS_LABEL_LENGTH} lowercase letters, digits and '-', starting and ending with a letter or digit"
                ),
            );
        }
    }

    pub(crate) fn extend(&mut self, other: FieldErrors) {
        self.errors.extend(other.errors);
    }

    pub(crate) fn into_result(self) -> Result<(), Vec<FieldError>> {
        if self.errors.is_empty() {
            Ok(())
        } else {
            Err(self.errors)
        }
    }
}

/// Longest DNS-1123 subdomain (object names).
pub const MAX_DNS_SUBDOMAIN_LENGTH: usize = 253;
/// Longest DNS-1123 label.
pub const MAX_DNS_LABEL_LENGTH: usize = 63;
/// Schema pattern of a DNS-1123 subdomain; [`is_dns_subdomain`] is the same check in Rust.
pub const DNS_SUBDOMAIN_PATTERN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// Schema pattern of a DNS-1123 label; [`is_dns_label`] is the same check in Rust.
pub const DNS_LABEL_PATTERN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

/// True for a lowercase RFC 1123 label: 1-63 of `[a-z0-9-]`, alphanumeric at both ends.
pub fn is_dns_label(value: &str) -> bool {
    let bytes = value.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            bytes.len() <= MAX_DNS_LABEL_LENGTH
                && is_lower_alphanumeric(*first)
                && is_lower_alphanumeric(*last)
                && bytes
                    .iter()
                    .all(|b| is_lower_alphanumeric(*b) || *b == b'-')
        }
        _ => false,
    }
}

/// True for a lowercase RFC 1123 subdomain: dot-separated labels, at most 253 characters.
pub fn is_dns_subdomain(value: &str) -> bool {
    value.len() <= MAX_DNS_SUBDOMAIN_LENGTH
        && value.split('.').all(|label| {
            // Subdomain labels are not limited to 63 characters individually by the pattern.
            let bytes = label.as_bytes();
            match (bytes.first(), bytes.last()) {
                (Some(first), Some(last)) => {
                    is_lower_alphanumeric(*first)
                        && is_lower_alphanumeric(*last)
                        && bytes
                            .iter()
                            .all(|b| is_lower_alphanumeric(*b) || *b == b'-')
                }
                _ => false,
            }
        })
}

fn is_lower_alphanumeric(byte: u8) -> bool {
    byte.is_ascii_lowercase() || byte.is_ascii_digit()
}

/// Decodes a spec from JSON, reporting a decode failure as a [`FieldError`] with its path.
///
/// serde's own errors do not say where in the document they happened; specs that come
/// over NATS deserve the same "spec.framework: Unsupported value" answer kubectl gives.
pub(crate) fn decode_at<T: DeserializeOwned>(
    value: serde_json::Value,
    root: &str,
) -> Result<T, Vec<FieldError>> {
    serde_path_to_error::deserialize(value).map_err(|error| {
        let parent = join_json_path(root, &error.path().to_string());
        let message = error.inner().to_string();
        // serde reports a missing field at its parent with the text "missing field `name`".
        let field_error = match message
            .strip_prefix("missing field `")
            .and_then(|rest| rest.split('`').next())
        {
            Some(field) => FieldError::new(
                format!("{parent}.{field}"),
                FieldErrorKind::Required,
                format!("{field} is required"),
            ),
            None if message.starts_with("unknown variant") => {
                FieldError::new(parent, FieldErrorKind::NotSupported, message)
            }
            None => FieldError::new(parent, FieldErrorKind::Invalid, message),
        };
        vec![field_error]
    })
}

/// Joins a root path with serde_path_to_error's path (`.` for the root, `a.b[0].c` otherwise).
fn join_json_path(root: &str, relative: &str) -> String {
    if relative == "." || relative.is_empty() {
        root.to_owned()
    } else if relative.starts_with('[') {
        format!("{root}{relative}")
    } else {
        format!("{root}.{relative}")
    }
}

/// Renders errors one per line, for logs and Kubernetes Event messages.
pub fn format_field_errors(errors: &[FieldError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_names() {
        assert!(is_dns_label("default"));
        assert!(is_dns_label("a100-80gb"));
        assert!(!is_dns_label("A100"));
        assert!(!is_dns_label("-a"));
        assert!(!is_dns_label(""));
        assert!(!is_dns_label("a.b"));
        assert!(is_dns_subdomain("high-priority"));
        assert!(is_dns_subdomain("system.node-critical"));
        assert!(!is_dns_subdomain("a..b"));
        assert!(!is_dns_subdomain("High"));
    }

    #[test]
    fn json_paths_join() {
        assert_eq!(join_json_path("spec", "."), "spec");
        assert_eq!(join_json_path("spec", "framework"), "spec.framework");
        assert_eq!(
            join_json_path("spec", "parameters[1].type"),
            "spec.parameters[1].type"
        );
    }
}
