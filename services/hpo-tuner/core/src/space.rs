//! Search space: parameter domains, parameter values, and the internal unit-cube
//! encoding the samplers work in.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::error::SpecError;

/// Largest integer magnitude accepted for `int` parameters: every value must be
/// exactly representable as an `f64` so the kernels can work on it.
pub const MAX_INT_MAGNITUDE: i64 = 1 << 53;

/// One parameter value. JSON form is the bare value: `3`, `0.01`, `"adam"`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ParamValue {
    Int(i64),
    Float(f64),
    Categorical(String),
}

impl std::fmt::Display for ParamValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ParamValue::Int(v) => write!(f, "{v}"),
            ParamValue::Float(v) => write!(f, "{v}"),
            ParamValue::Categorical(v) => f.write_str(v),
        }
    }
}

/// A full assignment of the search space: parameter name to value.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Params(pub BTreeMap<String, ParamValue>);

impl Params {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn get(&self, name: &str) -> Option<&ParamValue> {
        self.0.get(name)
    }

    pub fn insert(&mut self, name: impl Into<String>, value: ParamValue) {
        self.0.insert(name.into(), value);
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&String, &ParamValue)> {
        self.0.iter()
    }

    /// Float view of a numeric parameter (ints are widened), `None` otherwise.
    pub fn f64(&self, name: &str) -> Option<f64> {
        match self.0.get(name)? {
            ParamValue::Float(v) => Some(*v),
            ParamValue::Int(v) => Some(*v as f64),
            ParamValue::Categorical(_) => None,
        }
    }
}

fn default_step() -> i64 {
    1
}

/// The domain of one parameter.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "camelCase")]
pub enum Domain {
    /// Real interval `[low, high]`, uniform or log-uniform (`log` requires `low > 0`).
    Float {
        low: f64,
        high: f64,
        #[serde(default)]
        log: bool,
    },
    /// Integers `low, low+step, ..., high`; `high - low` must be a multiple of `step`.
    /// `log` (requires `low >= 1` and `step == 1`) spreads the prior log-uniformly.
    Int {
        low: i64,
        high: i64,
        #[serde(default = "default_step")]
        step: i64,
        #[serde(default)]
        log: bool,
    },
    /// One of a fixed list of distinct strings.
    Categorical { choices: Vec<String> },
}

/// A named parameter.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ParamSpec {
    pub name: String,
    #[serde(flatten)]
    pub domain: Domain,
}

impl ParamSpec {
    pub fn float(name: impl Into<String>, low: f64, high: f64) -> Self {
        Self {
            name: name.into(),
            domain: Domain::Float {
                low,
                high,
                log: false,
            },
        }
    }

    pub fn log_float(name: impl Into<String>, low: f64, high: f64) -> Self {
        Self {
            name: name.into(),
            domain: Domain::Float {
                low,
                high,
                log: true,
            },
        }
    }

    pub fn int(name: impl Into<String>, low: i64, high: i64, step: i64) -> Self {
        Self {
            name: name.into(),
            domain: Domain::Int {
                low,
                high,
                step,
                log: false,
            },
        }
    }

    pub fn log_int(name: impl Into<String>, low: i64, high: i64) -> Self {
        Self {
            name: name.into(),
            domain: Domain::Int {
                low,
                high,
                step: 1,
                log: true,
            },
        }
    }

    pub fn categorical<S: Into<String>>(
        name: impl Into<String>,
        choices: impl IntoIterator<Item = S>,
    ) -> Self {
        Self {
            name: name.into(),
            domain: Domain::Categorical {
                choices: choices.into_iter().map(Into::into).collect(),
            },
        }
    }
}

/// A validated search space. Construct with [`SearchSpace::new`]; deserializing
/// runs the same validation, so an invalid space never exists.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "Vec<ParamSpec>", into = "Vec<ParamSpec>")]
pub struct SearchSpace {
    params: Vec<ParamSpec>,
}

impl TryFrom<Vec<ParamSpec>> for SearchSpace {
    type Error = SpecError;
    fn try_from(params: Vec<ParamSpec>) -> Result<Self, SpecError> {
        SearchSpace::new(params)
    }
}

impl From<SearchSpace> for Vec<ParamSpec> {
    fn from(space: SearchSpace) -> Self {
        space.params
    }
}

impl SearchSpace {
    /// Validates every parameter; the error names the offending field.
    pub fn new(params: Vec<ParamSpec>) -> Result<Self, SpecError> {
        if params.is_empty() {
            return Err(SpecError::EmptySearchSpace);
        }
        let mut seen = std::collections::BTreeSet::new();
        for (index, p) in params.iter().enumerate() {
            if p.name.trim().is_empty() {
                return Err(SpecError::EmptyParamName { index });
            }
            if !seen.insert(p.name.as_str()) {
                return Err(SpecError::DuplicateParam {
                    param: p.name.clone(),
                });
            }
            validate_domain(&p.name, &p.domain)?;
        }
        Ok(Self { params })
    }

    pub fn params(&self) -> &[ParamSpec] {
        &self.params
    }

    pub fn len(&self) -> usize {
        self.params.len()
    }

    pub fn is_empty(&self) -> bool {
        self.params.is_empty()
    }

    /// True when `params` has exactly the space's names, each value inside its domain.
    pub fn contains(&self, params: &Params) -> bool {
        params.len() == self.params.len()
            && self
                .params
                .iter()
                .all(|p| params.get(&p.name).is_some_and(|v| p.domain.contains(v)))
    }
}

fn validate_domain(param: &str, domain: &Domain) -> Result<(), SpecError> {
    let p = || param.to_string();
    match domain {
        Domain::Float { low, high, log } => {
            if !low.is_finite() {
                return Err(SpecError::NonFiniteBound {
                    param: p(),
                    field: "low",
                });
            }
            if !high.is_finite() {
                return Err(SpecError::NonFiniteBound {
                    param: p(),
                    field: "high",
                });
            }
            if low >= high {
                return Err(SpecError::EmptyRange {
                    param: p(),
                    low: low.to_string(),
                    high: high.to_string(),
                });
            }
            if *log && *low <= 0.0 {
                return Err(SpecError::LogNeedsPositiveLow {
                    param: p(),
                    low: low.to_string(),
                });
            }
        }
        Domain::Int {
            low,
            high,
            step,
            log,
        } => {
            if low.abs() > MAX_INT_MAGNITUDE {
                return Err(SpecError::IntTooLarge {
                    param: p(),
                    field: "low",
                });
            }
            if high.abs() > MAX_INT_MAGNITUDE {
                return Err(SpecError::IntTooLarge {
                    param: p(),
                    field: "high",
                });
            }
            if low > high {
                return Err(SpecError::EmptyRange {
                    param: p(),
                    low: low.to_string(),
                    high: high.to_string(),
                });
            }
            if *step < 1 {
                return Err(SpecError::InvalidStep {
                    param: p(),
                    step: *step,
                });
            }
            if (high - low) % step != 0 {
                return Err(SpecError::StepDoesNotDivideRange {
                    param: p(),
                    step: *step,
                });
            }
            if *log {
                if *step != 1 {
                    return Err(SpecError::LogWithStep { param: p() });
                }
                if *low < 1 {
                    return Err(SpecError::LogNeedsPositiveLow {
                        param: p(),
                        low: low.to_string(),
                    });
                }
            }
        }
        Domain::Categorical { choices } => {
            if choices.is_empty() {
                return Err(SpecError::EmptyChoices { param: p() });
            }
            let mut seen = std::collections::BTreeSet::new();
            for c in choices {
                if !seen.insert(c.as_str()) {
                    return Err(SpecError::DuplicateChoice {
                        param: p(),
                        choice: c.clone(),
                    });
                }
            }
        }
    }
    Ok(())
}

impl Domain {
    /// True when `value` has the domain's type and lies inside it (on the step grid
    /// for ints, in the list for categoricals).
    pub fn contains(&self, value: &ParamValue) -> bool {
        match (self, value) {
            (Domain::Float { low, high, .. }, ParamValue::Float(v)) => {
                v.is_finite() && *v >= *low && *v <= *high
            }
            (
                Domain::Int {
                    low, high, step, ..
                },
                ParamValue::Int(v),
            ) => *v >= *low && *v <= *high && (v - low) % step == 0,
            (Domain::Categorical { choices }, ParamValue::Categorical(v)) => {
                choices.iter().any(|c| c == v)
            }
            _ => false,
        }
    }

    /// Number of categories for a categorical domain, `None` for numeric ones.
    pub fn n_choices(&self) -> Option<usize> {
        match self {
            Domain::Categorical { choices } => Some(choices.len()),
            _ => None,
        }
    }

    /// Interval `[a, b]` of the numeric domain in the internal (log, half-step
    /// widened) coordinate. `None` for categoricals.
    fn internal_bounds(&self) -> Option<(f64, f64)> {
        match *self {
            Domain::Float { low, high, log } => Some(if log {
                (low.ln(), high.ln())
            } else {
                (low, high)
            }),
            Domain::Int {
                low,
                high,
                step,
                log,
            } => {
                let half = step as f64 / 2.0;
                Some(if log {
                    ((low as f64 - half).ln(), (high as f64 + half).ln())
                } else {
                    (low as f64 - half, high as f64 + half)
                })
            }
            Domain::Categorical { .. } => None,
        }
    }

    /// Encodes a value as a coordinate in `[0, 1]` (numeric) or a category index
    /// (categorical, as `f64`). `None` when the value is not in the domain.
    pub fn encode(&self, value: &ParamValue) -> Option<f64> {
        if !self.contains(value) {
            return None;
        }
        match (self, value) {
            (Domain::Categorical { choices }, ParamValue::Categorical(v)) => {
                choices.iter().position(|c| c == v).map(|i| i as f64)
            }
            (Domain::Float { log, .. }, ParamValue::Float(v)) => {
                let (a, b) = self.internal_bounds()?;
                let x = if *log { v.ln() } else { *v };
                Some(((x - a) / (b - a)).clamp(0.0, 1.0))
            }
            (Domain::Int { log, .. }, ParamValue::Int(v)) => {
                let (a, b) = self.internal_bounds()?;
                let x = if *log { (*v as f64).ln() } else { *v as f64 };
                Some(((x - a) / (b - a)).clamp(0.0, 1.0))
            }
            _ => None,
        }
    }

    /// Decodes a unit coordinate (numeric) or category index (categorical) into
    /// a value inside the domain. Out-of-range input is clamped, never rejected.
    pub fn decode(&self, u: f64) -> ParamValue {
        if let Domain::Categorical { choices } = self {
            let last = choices.len().saturating_sub(1);
            let i = if u.is_finite() {
                (u.round().max(0.0) as usize).min(last)
            } else {
                0
            };
            return ParamValue::Categorical(choices.get(i).cloned().unwrap_or_default());
        }
        let u = if u.is_finite() {
            u.clamp(0.0, 1.0)
        } else {
            0.5
        };
        match self {
            Domain::Categorical { .. } => ParamValue::Categorical(String::new()),
            Domain::Float { low, high, log } => {
                let v = if *log {
                    (low.ln() + u * (high.ln() - low.ln())).exp()
                } else {
                    low + u * (high - low)
                };
                ParamValue::Float(v.clamp(*low, *high))
            }
            Domain::Int {
                low,
                high,
                step,
                log,
            } => {
                let Some((a, b)) = self.internal_bounds() else {
                    return ParamValue::Int(*low);
                };
                let x = a + u * (b - a);
                let x = if *log { x.exp() } else { x };
                let k = ((x - *low as f64) / *step as f64).round();
                let max_k = ((high - low) / step) as f64;
                let k = k.clamp(0.0, max_k) as i64;
                ParamValue::Int(low + k * step)
            }
        }
    }

    /// Rounds a unit coordinate to the coordinate of the nearest representable
    /// value (identity for floats, grid snap for ints).
    pub fn snap(&self, u: f64) -> f64 {
        match self {
            Domain::Int { .. } => {
                let v = self.decode(u);
                self.encode(&v).unwrap_or(u)
            }
            _ => u,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_spaces_naming_the_field() {
        let cases: Vec<(Vec<ParamSpec>, &str)> = vec![
            (vec![], "searchSpace"),
            (vec![ParamSpec::float("", 0.0, 1.0)], "searchSpace[0].name"),
            (
                vec![
                    ParamSpec::float("a", 0.0, 1.0),
                    ParamSpec::float("a", 0.0, 1.0),
                ],
                "searchSpace[a]",
            ),
            (vec![ParamSpec::float("lr", 1.0, 1.0)], "searchSpace[lr]"),
            (
                vec![ParamSpec::float("lr", f64::NAN, 1.0)],
                "searchSpace[lr].low",
            ),
            (
                vec![ParamSpec::float("lr", 0.0, f64::INFINITY)],
                "searchSpace[lr].high",
            ),
            (
                vec![ParamSpec::log_float("lr", 0.0, 1.0)],
                "searchSpace[lr].low",
            ),
            (vec![ParamSpec::int("n", 0, 10, 0)], "searchSpace[n].step"),
            (vec![ParamSpec::int("n", 0, 10, 3)], "searchSpace[n].step"),
            (vec![ParamSpec::int("n", 5, 1, 1)], "searchSpace[n]"),
            (vec![ParamSpec::log_int("n", 0, 10)], "searchSpace[n].low"),
            (
                vec![ParamSpec {
                    name: "n".into(),
                    domain: Domain::Int {
                        low: 1,
                        high: 9,
                        step: 2,
                        log: true,
                    },
                }],
                "searchSpace[n].log",
            ),
            (
                vec![ParamSpec::categorical("opt", Vec::<String>::new())],
                "searchSpace[opt].choices",
            ),
            (
                vec![ParamSpec::categorical("opt", ["a", "a"])],
                "searchSpace[opt].choices",
            ),
            (
                vec![ParamSpec::int("n", 0, i64::MAX, 1)],
                "searchSpace[n].high",
            ),
        ];
        for (params, field) in cases {
            let err = SearchSpace::new(params.clone()).expect_err("space must be rejected");
            assert!(
                err.to_string().starts_with(field),
                "error `{err}` for {params:?} should name {field}"
            );
        }
    }

    #[test]
    fn deserializing_validates() {
        let ok: SearchSpace = serde_json::from_str(
            r#"[{"name":"lr","type":"float","low":0.0001,"high":0.1,"log":true},
                {"name":"layers","type":"int","low":1,"high":9,"step":2},
                {"name":"opt","type":"categorical","choices":["sgd","adam"]}]"#,
        )
        .expect("valid space");
        assert_eq!(ok.len(), 3);
        let bad = serde_json::from_str::<SearchSpace>(
            r#"[{"name":"lr","type":"float","low":1.0,"high":0.1}]"#,
        );
        let msg = bad.expect_err("invalid space").to_string();
        assert!(msg.contains("searchSpace[lr]"), "{msg}");
    }

    #[test]
    fn encode_decode_round_trip() {
        let d = Domain::Int {
            low: 2,
            high: 20,
            step: 3,
            log: false,
        };
        for v in (2..=20).step_by(3) {
            let u = d.encode(&ParamValue::Int(v)).expect("on grid");
            assert_eq!(d.decode(u), ParamValue::Int(v));
        }
        assert_eq!(d.encode(&ParamValue::Int(3)), None, "off-grid value");
        assert_eq!(d.decode(0.0), ParamValue::Int(2));
        assert_eq!(d.decode(1.0), ParamValue::Int(20));
        let l = Domain::Float {
            low: 1e-4,
            high: 1.0,
            log: true,
        };
        let u = l.encode(&ParamValue::Float(1e-2)).expect("in range");
        assert!((u - 0.5).abs() < 1e-12, "log midpoint is 1e-2, got {u}");
        let c = Domain::Categorical {
            choices: vec!["a".into(), "b".into()],
        };
        assert_eq!(c.decode(1.0), ParamValue::Categorical("b".into()));
        let c3 = Domain::Categorical {
            choices: vec!["a".into(), "b".into(), "c".into()],
        };
        assert_eq!(c3.decode(2.0), ParamValue::Categorical("c".into()));
        assert_eq!(c3.decode(7.0), ParamValue::Categorical("c".into()));
        assert_eq!(c3.decode(f64::NAN), ParamValue::Categorical("a".into()));
        assert_eq!(c.encode(&ParamValue::Categorical("z".into())), None);
    }
}
