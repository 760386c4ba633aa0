//! Error types. Every spec error's message starts with the path of the offending
//! field (`searchSpace[lr].low`, `parallelTrialCount`, ...) so it can be shown to
//! the user as is.

use thiserror::Error;

/// An invalid sweep specification or search space.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum SpecError {
    #[error("searchSpace: must contain at least one parameter")]
    EmptySearchSpace,
    #[error("searchSpace[{index}].name: must not be empty")]
    EmptyParamName { index: usize },
    #[error("searchSpace[{param}]: duplicate parameter name")]
    DuplicateParam { param: String },
    #[error("searchSpace[{param}].{field}: must be a finite number")]
    NonFiniteBound { param: String, field: &'static str },
    #[error("searchSpace[{param}].{field}: magnitude must not exceed 2^53")]
    IntTooLarge { param: String, field: &'static str },
    #[error("searchSpace[{param}]: low ({low}) must be below high ({high})")]
    EmptyRange {
        param: String,
        low: String,
        high: String,
    },
    #[error("searchSpace[{param}].low: log scale needs low > 0 (>= 1 for ints), got {low}")]
    LogNeedsPositiveLow { param: String, low: String },
    #[error("searchSpace[{param}].step: must be at least 1, got {step}")]
    InvalidStep { param: String, step: i64 },
    #[error("searchSpace[{param}].step: high - low must be a multiple of step {step}")]
    StepDoesNotDivideRange { param: String, step: i64 },
    #[error("searchSpace[{param}].log: log scale is only supported with step 1")]
    LogWithStep { param: String },
    #[error("searchSpace[{param}].choices: must not be empty")]
    EmptyChoices { param: String },
    #[error("searchSpace[{param}].choices: duplicate choice {choice:?}")]
    DuplicateChoice { param: String, choice: String },
    /// Any other field of the sweep spec or of an algorithm setting.
    #[error("{field}: {reason}")]
    InvalidField { field: String, reason: String },
}

impl SpecError {
    pub(crate) fn field(field: impl Into<String>, reason: impl Into<String>) -> Self {
        SpecError::InvalidField {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// A sampler could not produce a new point.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SampleError {
    /// Every point of a finite (grid) search space has been tried or is running.
    #[error("the search space is exhausted: every grid point has been suggested")]
    Exhausted,
}

/// An event the sweep could not apply. The sweep state is unchanged when one is
/// returned; the adapter should log it and acknowledge the message.
#[derive(Debug, Clone, PartialEq, Error)]
pub enum SweepError {
    #[error("trial {trial_id:?} does not belong to sweep {sweep:?} or was never requested")]
    UnknownTrial { sweep: String, trial_id: String },
    #[error("snapshot is inconsistent: {0}")]
    CorruptSnapshot(String),
    #[error(transparent)]
    Spec(#[from] SpecError),
}
