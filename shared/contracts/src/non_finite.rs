//! NaN and Infinity in worker metrics. JSON has no such numbers, but Python's
//! `json.dumps` (and many other encoders) writes the bare literals `NaN`,
//! `Infinity` and `-Infinity`, and a diverging run reports exactly those. A
//! report carrying one is not thrown away: the literals are read as the
//! strings `"NaN"`, `"Infinity"` and `"-Infinity"`, and metric maps read those
//! strings back as non-finite numbers (and write non-finite numbers the same
//! way), so the rest of the report is kept and the consumer decides what a
//! non-finite metric means (the hpo-tuner stops the trial as diverged).

use std::collections::BTreeMap;

use serde::de::{self, Deserializer};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};

/// `bytes` with every bare `NaN`, `Infinity` and `-Infinity` outside strings
/// quoted, or `None` when there is none.
pub fn quote_literals(bytes: &[u8]) -> Option<Vec<u8>> {
    const LITERALS: [&[u8]; 3] = [b"-Infinity", b"Infinity", b"NaN"];
    let mut out = Vec::with_capacity(bytes.len() + 8);
    let mut in_string = false;
    let mut escaped = false;
    let mut changed = false;
    let mut i = 0;
    while i < bytes.len() {
        let byte = bytes[i];
        if in_string {
            out.push(byte);
            match (escaped, byte) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            i += 1;
            continue;
        }
        if byte == b'"' {
            in_string = true;
            out.push(byte);
            i += 1;
            continue;
        }
        if let Some(literal) = LITERALS.iter().find(|l| bytes[i..].starts_with(l)) {
            out.push(b'"');
            out.extend_from_slice(literal);
            out.push(b'"');
            i += literal.len();
            changed = true;
            continue;
        }
        out.push(byte);
        i += 1;
    }
    changed.then_some(out)
}

#[derive(Deserialize)]
#[serde(untagged)]
enum MetricValue {
    Number(f64),
    Text(String),
}

/// Deserializes a metric map whose values are numbers or the strings `"NaN"`,
/// `"Infinity"` and `"-Infinity"`.
pub fn deserialize_metrics<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<BTreeMap<String, f64>, D::Error> {
    let raw = BTreeMap::<String, MetricValue>::deserialize(deserializer)?;
    raw.into_iter()
        .map(|(name, value)| {
            let number = match value {
                MetricValue::Number(number) => number,
                MetricValue::Text(text) => match text.as_str() {
                    "NaN" => f64::NAN,
                    "Infinity" => f64::INFINITY,
                    "-Infinity" => f64::NEG_INFINITY,
                    other => {
                        return Err(de::Error::custom(format!(
                            "metric {name:?} is {other:?}: a metric is a number (or NaN, Infinity, -Infinity)"
                        )));
                    }
                },
            };
            Ok((name, number))
        })
        .collect()
}

/// Serializes a metric map, writing non-finite values as the strings
/// [`deserialize_metrics`] reads.
pub fn serialize_metrics<S: Serializer>(
    metrics: &BTreeMap<String, f64>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    let mut map = serializer.serialize_map(Some(metrics.len()))?;
    for (name, value) in metrics {
        if value.is_finite() {
            map.serialize_entry(name, value)?;
        } else {
            map.serialize_entry(name, &non_finite_text(*value))?;
        }
    }
    map.end()
}

fn non_finite_text(value: f64) -> impl Serialize {
    if value.is_nan() {
        "NaN"
    } else if value > 0.0 {
        "Infinity"
    } else {
        "-Infinity"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_literals_are_quoted_and_strings_left_alone() {
        let text = br#"{"a": NaN, "b": -Infinity, "c": [Infinity], "d": "NaN \" Infinity"}"#;
        let quoted = quote_literals(text).expect("changed");
        assert_eq!(
            String::from_utf8(quoted).expect("utf-8"),
            r#"{"a": "NaN", "b": "-Infinity", "c": ["Infinity"], "d": "NaN \" Infinity"}"#
        );
        assert_eq!(quote_literals(br#"{"a": 1, "b": "NaN"}"#), None);
    }

    #[derive(Debug, Serialize, Deserialize)]
    struct Report {
        #[serde(
            deserialize_with = "deserialize_metrics",
            serialize_with = "serialize_metrics"
        )]
        metrics: BTreeMap<String, f64>,
    }

    #[test]
    fn metrics_read_and_write_non_finite_values_as_strings() {
        let report: Report = serde_json::from_str(
            r#"{"metrics": {"loss": "NaN", "grad": "Infinity", "low": "-Infinity", "acc": 0.5}}"#,
        )
        .expect("reads");
        assert!(report.metrics["loss"].is_nan());
        assert_eq!(report.metrics["grad"], f64::INFINITY);
        assert_eq!(report.metrics["low"], f64::NEG_INFINITY);
        assert_eq!(report.metrics["acc"], 0.5);
        let written = serde_json::to_string(&report).expect("writes");
        assert_eq!(
            written,
            r#"{"metrics":{"acc":0.5,"grad":"Infinity","loss":"NaN","low":"-Infinity"}}"#
        );
    }

    #[test]
    fn another_string_names_the_metric_and_what_a_metric_may_be() {
        let error = serde_json::from_str::<Report>(r#"{"metrics": {"loss": "high"}}"#)
            .expect_err("refused");
        assert!(
            error.to_string().contains("metric \"loss\" is \"high\""),
            "{error}"
        );
    }
}
