//! `Sweep`: a hyperparameter search whose trials are TrainingJobs.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::condition::Condition;
use crate::trainingjob::TrainingJobSpec;
use crate::validation::{FieldError, FieldErrors, decode_at};
use crate::wire_enum::wire_enum;

/// Most parameters one sweep may search over.
pub const MAX_PARAMETERS: usize = 32;
/// Most values of one categorical parameter.
pub const MAX_CATEGORICAL_VALUES: usize = 100;
/// Longest parameter name.
pub const MAX_PARAMETER_NAME_LENGTH: usize = 63;
/// Schema pattern of a parameter name; [`is_parameter_name`] is the same check in Rust.
pub const PARAMETER_NAME_PATTERN: &str = "^[A-Za-z_][A-Za-z0-9_.-]*$";
/// Trials run at once when `parallelTrialCount` is unset.
pub const DEFAULT_PARALLEL_TRIAL_COUNT: u32 = 1;
/// Search algorithm when `algorithm` is unset.
pub const DEFAULT_ALGORITHM: AlgorithmName = AlgorithmName::Random;
/// TPE: random trials before the model is used, when `nStartupTrials` is unset.
pub const DEFAULT_TPE_STARTUP_TRIALS: u32 = 10;
/// TPE: candidates scored per suggestion, when `nEiCandidates` is unset.
pub const DEFAULT_TPE_EI_CANDIDATES: u32 = 24;
/// TPE: fraction of trials counted as good, when `gamma` is unset.
pub const DEFAULT_TPE_GAMMA: f64 = 0.25;
/// ASHA / Hyperband: smallest budget in epochs, when `minResource` is unset.
pub const DEFAULT_MIN_RESOURCE: u32 = 1;
/// ASHA / Hyperband: keep 1 in this many trials per rung, when `reductionFactor` is unset.
pub const DEFAULT_REDUCTION_FACTOR: u32 = 3;
/// Smallest useful reduction factor.
pub const MIN_REDUCTION_FACTOR: u32 = 2;

// Number fields (min, max, step) are wrapped in double(): the apiserver already types them
// as double, but client-side evaluators (kube-cel in our tests) see an integer-valued JSON
// number as int, and not every CEL implementation orders or equates int with double.
const RULE_PARALLEL_WITHIN_MAX: &str =
    "!has(self.parallelTrialCount) || self.parallelTrialCount <= self.maxTrialCount";
const MSG_PARALLEL_WITHIN_MAX: &str = "parallelTrialCount must not exceed maxTrialCount: lower parallelTrialCount or raise maxTrialCount";
const RULE_GRID_NEEDS_STEPS: &str = "!has(self.algorithm) || self.algorithm.name != 'grid' || self.parameters.all(p, p.type != 'float' || has(p.step))";
const MSG_GRID_NEEDS_STEPS: &str = "grid search needs a step on every float parameter: set step, or use the random or tpe algorithm";
const RULE_SETTINGS_NEED_TPE: &str = "!has(self.settings) || self.name == 'tpe'";
const MSG_SETTINGS_NEED_TPE: &str =
    "algorithm.settings only apply to the tpe algorithm: remove settings or set name: tpe";
const RULE_RESOURCE_ORDER: &str =
    "!has(self.minResource) || !has(self.maxResource) || self.minResource < self.maxResource";
const MSG_RESOURCE_ORDER: &str = "earlyStopping.minResource must be less than maxResource";
const RULE_NUMERIC_NEEDS_MIN: &str = "self.type == 'categorical' || has(self.min)";
const MSG_NUMERIC_NEEDS_MIN: &str = "float and int parameters need min";
const RULE_NUMERIC_NEEDS_MAX: &str = "self.type == 'categorical' || has(self.max)";
const MSG_NUMERIC_NEEDS_MAX: &str = "float and int parameters need max";
const RULE_MIN_BELOW_MAX: &str =
    "!has(self.min) || !has(self.max) || double(self.min) < double(self.max)";
const MSG_MIN_BELOW_MAX: &str = "min must be less than max";
const RULE_CATEGORICAL_NEEDS_VALUES: &str =
    "self.type != 'categorical' || (has(self.values) && size(self.values) > 0)";
const MSG_CATEGORICAL_NEEDS_VALUES: &str = "categorical parameters need values: list the choices";
const RULE_VALUES_ONLY_CATEGORICAL: &str = "self.type == 'categorical' || !has(self.values)";
const MSG_VALUES_ONLY_CATEGORICAL: &str =
    "values only apply to categorical parameters: use min and max for float and int parameters";
const RULE_RANGE_NOT_CATEGORICAL: &str =
    "self.type != 'categorical' || (!has(self.min) && !has(self.max))";
const MSG_RANGE_NOT_CATEGORICAL: &str =
    "min and max do not apply to categorical parameters: list the choices in values";
const RULE_STEP_NOT_CATEGORICAL: &str = "self.type != 'categorical' || !has(self.step)";
const MSG_STEP_NOT_CATEGORICAL: &str = "step does not apply to categorical parameters";
const RULE_LOG_ONLY_FLOAT: &str = "!has(self.log) || !self.log || self.type == 'float'";
const MSG_LOG_ONLY_FLOAT: &str = "log only applies to float parameters";
const RULE_LOG_NEEDS_POSITIVE_MIN: &str =
    "!has(self.log) || !self.log || !has(self.min) || double(self.min) > 0.0";
const MSG_LOG_NEEDS_POSITIVE_MIN: &str = "log scale needs min greater than 0";
const RULE_INT_WHOLE_MIN: &str =
    "self.type != 'int' || !has(self.min) || double(self.min) == double(int(self.min))";
const MSG_INT_WHOLE_MIN: &str = "int parameters need a whole-number min";
const RULE_INT_WHOLE_MAX: &str =
    "self.type != 'int' || !has(self.max) || double(self.max) == double(int(self.max))";
const MSG_INT_WHOLE_MAX: &str = "int parameters need a whole-number max";
const RULE_INT_WHOLE_STEP: &str =
    "self.type != 'int' || !has(self.step) || double(self.step) == double(int(self.step))";
const MSG_INT_WHOLE_STEP: &str = "int parameters need a whole-number step";

wire_enum! {
    /// Whether the objective metric should go down (minimize, e.g. loss) or up (maximize, e.g. accuracy).
    pub enum ObjectiveDirection {
        Minimize => "minimize",
        Maximize => "maximize",
    }
}

wire_enum! {
    /// Kind of a searched parameter: float (a real range), int (an integer range) or
    /// categorical (a list of choices).
    pub enum ParameterType {
        Float => "float",
        Int => "int",
        Categorical => "categorical",
    }
}

wire_enum! {
    /// Search algorithm: random sampling, grid (every combination), or tpe
    /// (Tree-structured Parzen Estimator, model-based).
    pub enum AlgorithmName {
        Random => "random",
        Grid => "grid",
        Tpe => "tpe",
    }
}

wire_enum! {
    /// Early stopping of unpromising trials: none, asha (asynchronous successive halving),
    /// hyperband (several successive-halving brackets) or median (stop a trial whose metric
    /// is worse than the median of other trials at the same epoch).
    pub enum EarlyStoppingAlgorithm {
        None => "none",
        Asha => "asha",
        Hyperband => "hyperband",
        Median => "median",
    }
}

wire_enum! {
    /// Lifecycle state of a Sweep: Pending, Running, Completed (maxTrialCount reached or
    /// goal met) or Failed (maxFailedTrialCount exceeded).
    pub enum SweepState {
        Pending => "Pending",
        Running => "Running",
        Completed => "Completed",
        Failed => "Failed",
    }
}

/// Desired state of a Sweep: what to optimize, which hyperparameters to search, how, and
/// the TrainingJob every trial runs.
// Every printcolumn repeats keys such as `type_`, which clippy mistakes for duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "trainyard.dev",
    version = "v1",
    kind = "Sweep",
    namespaced,
    status = "SweepStatus",
    derive = "PartialEq",
    shortname = "sw",
    category = "trainyard",
    doc = "A hyperparameter search: Trainyard runs trials as TrainingJobs built from the trial template, suggests parameters with the chosen algorithm, stops unpromising trials early and records the best trial.",
    printcolumn(
        name = "State",
        type_ = "string",
        json_path = ".status.state",
        description = "Lifecycle state"
    ),
    printcolumn(
        name = "Trials",
        type_ = "integer",
        json_path = ".status.trials.succeeded",
        description = "Succeeded trials"
    ),
    printcolumn(
        name = "Best",
        type_ = "number",
        json_path = ".status.bestTrial.objectiveValue",
        description = "Best objective value so far"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new(RULE_PARALLEL_WITHIN_MAX).message(MSG_PARALLEL_WITHIN_MAX).field_path(".parallelTrialCount"),
    validation = Rule::new(RULE_GRID_NEEDS_STEPS).message(MSG_GRID_NEEDS_STEPS).field_path(".parameters"),
)]
pub struct SweepSpec {
    /// Metric to optimize and in which direction.
    pub objective: Objective,

    /// Hyperparameters to search, 1 to 32, with unique names. Well-known names (learningRate, batchSize, epochs, optimizer, warmupSteps, gradientAccumulationSteps) set that field of the trial's hyperparameters; any other name goes into hyperparameters.additionalParams.
    #[schemars(length(min = 1, max = MAX_PARAMETERS))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub parameters: Vec<ParameterSpec>,

    /// Search algorithm and its settings. Default random.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub algorithm: Option<SearchAlgorithm>,

    /// Early stopping of unpromising trials. Default none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub early_stopping: Option<EarlyStoppingSpec>,

    /// Trials run at the same time, at least 1 and at most maxTrialCount. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub parallel_trial_count: Option<u32>,

    /// Trials to run in total, at least 1. The sweep completes when this many have finished.
    #[schemars(range(min = 1))]
    pub max_trial_count: u32,

    /// Failed trials tolerated, 0 or more; one more fails the sweep. Default: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub max_failed_trial_count: Option<u32>,

    /// TrainingJob spec every trial runs, with the suggested parameters filled into its hyperparameters.
    pub trial_template: TrainingJobSpec,
}

/// Metric to optimize.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Objective {
    /// Name of the metric the trials report, e.g. validation_loss or accuracy.
    #[schemars(length(min = 1, max = 128))]
    pub metric: String,

    /// minimize or maximize.
    pub direction: ObjectiveDirection,

    /// Stop the sweep once a trial reaches this value. Default: run maxTrialCount trials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goal: Option<f64>,
}

/// One searched hyperparameter.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new(RULE_NUMERIC_NEEDS_MIN).message(MSG_NUMERIC_NEEDS_MIN).field_path(".min").reason(Reason::FieldValueRequired),
    validation = Rule::new(RULE_NUMERIC_NEEDS_MAX).message(MSG_NUMERIC_NEEDS_MAX).field_path(".max").reason(Reason::FieldValueRequired),
    validation = Rule::new(RULE_MIN_BELOW_MAX).message(MSG_MIN_BELOW_MAX).field_path(".max"),
    validation = Rule::new(RULE_CATEGORICAL_NEEDS_VALUES).message(MSG_CATEGORICAL_NEEDS_VALUES).field_path(".values").reason(Reason::FieldValueRequired),
    validation = Rule::new(RULE_VALUES_ONLY_CATEGORICAL).message(MSG_VALUES_ONLY_CATEGORICAL).field_path(".values").reason(Reason::FieldValueForbidden),
    validation = Rule::new(RULE_RANGE_NOT_CATEGORICAL).message(MSG_RANGE_NOT_CATEGORICAL).field_path(".min").reason(Reason::FieldValueForbidden),
    validation = Rule::new(RULE_STEP_NOT_CATEGORICAL).message(MSG_STEP_NOT_CATEGORICAL).field_path(".step").reason(Reason::FieldValueForbidden),
    validation = Rule::new(RULE_LOG_ONLY_FLOAT).message(MSG_LOG_ONLY_FLOAT).field_path(".log").reason(Reason::FieldValueForbidden),
    validation = Rule::new(RULE_LOG_NEEDS_POSITIVE_MIN).message(MSG_LOG_NEEDS_POSITIVE_MIN).field_path(".min"),
    validation = Rule::new(RULE_INT_WHOLE_MIN).message(MSG_INT_WHOLE_MIN).field_path(".min"),
    validation = Rule::new(RULE_INT_WHOLE_MAX).message(MSG_INT_WHOLE_MAX).field_path(".max"),
    validation = Rule::new(RULE_INT_WHOLE_STEP).message(MSG_INT_WHOLE_STEP).field_path(".step"),
)]
pub struct ParameterSpec {
    /// Hyperparameter name, e.g. learningRate or weight_decay; unique within the sweep.
    #[schemars(length(min = 1, max = MAX_PARAMETER_NAME_LENGTH), pattern(PARAMETER_NAME_PATTERN))]
    pub name: String,

    /// float, int or categorical.
    #[serde(rename = "type")]
    pub parameter_type: ParameterType,

    /// Lower bound, inclusive (float and int; a whole number for int; greater than 0 with log).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min: Option<f64>,

    /// Upper bound, inclusive, greater than min (float and int; a whole number for int).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max: Option<f64>,

    /// Sample on a log scale, for ranges spanning orders of magnitude such as learning rates (float only; needs min > 0). Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub log: Option<bool>,

    /// Spacing between searched values, greater than 0: a whole number for int (default 1); required on float parameters for grid search.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0), extend("exclusiveMinimum" = true))]
    pub step: Option<f64>,

    /// Choices of a categorical parameter, 1 to 100 distinct strings, e.g. [adam, sgd] or ["32", "64"].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_CATEGORICAL_VALUES), inner(length(min = 1, max = 253)))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub values: Option<Vec<String>>,
}

/// Search algorithm.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new(RULE_SETTINGS_NEED_TPE).message(MSG_SETTINGS_NEED_TPE).field_path(".settings").reason(Reason::FieldValueForbidden)
)]
pub struct SearchAlgorithm {
    /// random, grid or tpe.
    pub name: AlgorithmName,

    /// Random seed, for reproducible suggestions. Default: a new seed per sweep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u32>,

    /// Settings of the tpe algorithm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<TpeSettings>,
}

/// Tree-structured Parzen Estimator settings.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TpeSettings {
    /// Random trials before the model starts suggesting, at least 1. Default 10.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub n_startup_trials: Option<u32>,

    /// Candidates sampled and scored by expected improvement per suggestion, at least 1. Default 24.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub n_ei_candidates: Option<u32>,

    /// Model parameters jointly instead of independently. Default false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub multivariate: Option<bool>,

    /// Fraction of finished trials treated as good, strictly between 0 and 1. Default 0.25.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0.0, max = 1.0), extend("exclusiveMinimum" = true, "exclusiveMaximum" = true))]
    pub gamma: Option<f64>,
}

/// Early stopping of unpromising trials. Budgets (resources) are counted in epochs.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(RULE_RESOURCE_ORDER).message(MSG_RESOURCE_ORDER).field_path(".maxResource"))]
pub struct EarlyStoppingSpec {
    /// none, asha, hyperband or median.
    pub algorithm: EarlyStoppingAlgorithm,

    /// Epochs every trial runs before it can be stopped (the first rung), at least 1. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub min_resource: Option<u32>,

    /// Epochs of a trial that is never stopped (the last rung), greater than minResource. Default: the trial template's epochs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_resource: Option<u32>,

    /// asha and hyperband keep 1 in this many trials at each rung, at least 2. Default 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = MIN_REDUCTION_FACTOR))]
    pub reduction_factor: Option<u32>,
}

/// Observed state of a Sweep, written by the planner from the hpo-tuner's decisions.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SweepStatus {
    /// Lifecycle state: Pending, Running, Completed or Failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<SweepState>,

    /// Trials by outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub trials: Option<TrialCounts>,

    /// Best finished trial so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_trial: Option<BestTrial>,

    /// Occupancy of each successive-halving rung (asha and hyperband).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rungs: Vec<RungStatus>,

    /// Conditions such as Running, Succeeded, Failed, GoalReached.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// metadata.generation this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Trials by outcome.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrialCounts {
    /// Trials created but not yet running.
    #[serde(default)]
    pub pending: u32,
    /// Trials running.
    #[serde(default)]
    pub running: u32,
    /// Trials that completed and reported the objective.
    #[serde(default)]
    pub succeeded: u32,
    /// Trials that failed.
    #[serde(default)]
    pub failed: u32,
    /// Trials stopped early as unpromising.
    #[serde(default)]
    pub early_stopped: u32,
}

/// Best finished trial.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BestTrial {
    /// Name of the trial's TrainingJob.
    pub name: String,
    /// Parameter values of the trial, as strings.
    #[serde(default)]
    pub parameters: BTreeMap<String, String>,
    /// Objective metric value the trial reached.
    pub objective_value: f64,
}

/// Occupancy of one successive-halving rung.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RungStatus {
    /// Rung index, 0 for the first.
    pub rung: u32,
    /// Epochs a trial has run when it reaches this rung.
    pub resource: u32,
    /// Trials that reached this rung.
    #[serde(default)]
    pub trials: u32,
    /// Trials promoted from this rung to the next.
    #[serde(default)]
    pub promoted: u32,
}

impl SweepSpec {
    /// Decodes a spec from JSON (e.g. a NATS submission) and validates it.
    pub fn from_json(value: serde_json::Value) -> Result<Self, Vec<FieldError>> {
        let spec: Self = decode_at(value, "spec")?;
        spec.validate()?;
        Ok(spec)
    }

    /// Checks every schema and CEL rule of the CRD, including the trial template's.
    pub fn validate(&self) -> Result<(), Vec<FieldError>> {
        let mut errors = FieldErrors::default();
        errors.length("spec.objective.metric", &self.objective.metric, 1, 128);
        errors.items("spec.parameters", self.parameters.len(), 1, MAX_PARAMETERS);
        for (index, parameter) in self.parameters.iter().enumerate() {
            parameter.check(&format!("spec.parameters[{index}]"), &mut errors);
            if self.parameters[..index]
                .iter()
                .any(|earlier| earlier.name == parameter.name)
            {
                errors.push(
                    format!("spec.parameters[{index}].name"),
                    crate::validation::FieldErrorKind::Invalid,
                    format!(
                        "duplicate parameter name {:?}: every parameter needs its own name",
                        parameter.name
                    ),
                );
            }
        }
        if let Some(algorithm) = &self.algorithm {
            algorithm.check("spec.algorithm", &mut errors);
            let grid_without_step = algorithm.name == AlgorithmName::Grid
                && self
                    .parameters
                    .iter()
                    .any(|p| p.parameter_type == ParameterType::Float && p.step.is_none());
            if grid_without_step {
                errors.invalid("spec.parameters", MSG_GRID_NEEDS_STEPS);
            }
        }
        if let Some(early_stopping) = &self.early_stopping {
            early_stopping.check("spec.earlyStopping", &mut errors);
        }
        errors.at_least("spec.maxTrialCount", self.max_trial_count, 1);
        if let Some(parallel) = self.parallel_trial_count {
            errors.at_least("spec.parallelTrialCount", parallel, 1);
            if parallel > self.max_trial_count {
                errors.invalid("spec.parallelTrialCount", MSG_PARALLEL_WITHIN_MAX);
            }
        }
        errors.extend(self.trial_template.field_errors("spec.trialTemplate"));
        errors.into_result()
    }

    /// Trials run at once, defaulting to 1.
    pub fn parallel_trial_count(&self) -> u32 {
        self.parallel_trial_count
            .unwrap_or(DEFAULT_PARALLEL_TRIAL_COUNT)
    }

    /// Search algorithm, defaulting to random.
    pub fn algorithm_name(&self) -> AlgorithmName {
        self.algorithm
            .as_ref()
            .map_or(DEFAULT_ALGORITHM, |a| a.name)
    }

    /// Early-stopping algorithm, defaulting to none.
    pub fn early_stopping_algorithm(&self) -> EarlyStoppingAlgorithm {
        self.early_stopping
            .as_ref()
            .map_or(EarlyStoppingAlgorithm::None, |e| e.algorithm)
    }

    /// Smallest budget in epochs (first rung), defaulting to 1.
    pub fn min_resource(&self) -> u32 {
        self.early_stopping
            .as_ref()
            .and_then(|e| e.min_resource)
            .unwrap_or(DEFAULT_MIN_RESOURCE)
    }

    /// Largest budget in epochs (last rung), defaulting to the trial template's epochs.
    pub fn max_resource(&self) -> u32 {
        self.early_stopping
            .as_ref()
            .and_then(|e| e.max_resource)
            .unwrap_or_else(|| self.trial_template.epochs())
    }

    /// Reduction factor of asha and hyperband, defaulting to 3.
    pub fn reduction_factor(&self) -> u32 {
        self.early_stopping
            .as_ref()
            .and_then(|e| e.reduction_factor)
            .unwrap_or(DEFAULT_REDUCTION_FACTOR)
    }

    /// TPE settings with every default filled in.
    pub fn tpe_settings(&self) -> ResolvedTpeSettings {
        let settings = self.algorithm.as_ref().and_then(|a| a.settings.as_ref());
        ResolvedTpeSettings {
            n_startup_trials: settings
                .and_then(|s| s.n_startup_trials)
                .unwrap_or(DEFAULT_TPE_STARTUP_TRIALS),
            n_ei_candidates: settings
                .and_then(|s| s.n_ei_candidates)
                .unwrap_or(DEFAULT_TPE_EI_CANDIDATES),
            multivariate: settings.and_then(|s| s.multivariate).unwrap_or(false),
            gamma: settings.and_then(|s| s.gamma).unwrap_or(DEFAULT_TPE_GAMMA),
        }
    }
}

/// TPE settings after defaults.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ResolvedTpeSettings {
    /// Random trials before the model is used.
    pub n_startup_trials: u32,
    /// Candidates scored per suggestion.
    pub n_ei_candidates: u32,
    /// Joint modelling of parameters.
    pub multivariate: bool,
    /// Fraction of trials counted as good.
    pub gamma: f64,
}

impl ParameterSpec {
    fn check(&self, path: &str, errors: &mut FieldErrors) {
        if !is_parameter_name(&self.name) {
            errors.invalid(
                format!("{path}.name"),
                format!(
                    "{:?} is not a valid parameter name: use up to {MAX_PARAMETER_NAME_LENGTH} letters, digits, '_', '.' or '-', starting with a letter or '_'",
                    self.name
                ),
            );
        }
        let categorical = self.parameter_type == ParameterType::Categorical;
        if !categorical && self.min.is_none() {
            errors.required(format!("{path}.min"), MSG_NUMERIC_NEEDS_MIN);
        }
        if !categorical && self.max.is_none() {
            errors.required(format!("{path}.max"), MSG_NUMERIC_NEEDS_MAX);
        }
        if let (Some(min), Some(max)) = (self.min, self.max) {
            // NaN bounds compare as None and fail too.
            if min.partial_cmp(&max) != Some(Ordering::Less) {
                errors.invalid(format!("{path}.max"), MSG_MIN_BELOW_MAX);
            }
        }
        if categorical && self.values.as_ref().is_none_or(Vec::is_empty) {
            errors.required(format!("{path}.values"), MSG_CATEGORICAL_NEEDS_VALUES);
        }
        if !categorical && self.values.is_some() {
            errors.forbidden(format!("{path}.values"), MSG_VALUES_ONLY_CATEGORICAL);
        }
        if categorical && (self.min.is_some() || self.max.is_some()) {
            errors.forbidden(format!("{path}.min"), MSG_RANGE_NOT_CATEGORICAL);
        }
        if categorical && self.step.is_some() {
            errors.forbidden(format!("{path}.step"), MSG_STEP_NOT_CATEGORICAL);
        }
        let log = self.log.unwrap_or(false);
        if log && self.parameter_type != ParameterType::Float {
            errors.forbidden(format!("{path}.log"), MSG_LOG_ONLY_FLOAT);
        }
        if log
            && self
                .min
                .is_some_and(|min| min.partial_cmp(&0.0) != Some(Ordering::Greater))
        {
            errors.invalid(format!("{path}.min"), MSG_LOG_NEEDS_POSITIVE_MIN);
        }
        if let Some(step) = self.step
            && step.partial_cmp(&0.0) != Some(Ordering::Greater)
        {
            errors.invalid(
                format!("{path}.step"),
                format!("must be greater than 0, got {step}"),
            );
        }
        if self.parameter_type == ParameterType::Int {
            for (field, value, message) in [
                ("min", self.min, MSG_INT_WHOLE_MIN),
                ("max", self.max, MSG_INT_WHOLE_MAX),
                ("step", self.step, MSG_INT_WHOLE_STEP),
            ] {
                if value.is_some_and(|v| v.fract() != 0.0) {
                    errors.invalid(format!("{path}.{field}"), message);
                }
            }
        }
        if let Some(values) = &self.values {
            errors.items(
                &format!("{path}.values"),
                values.len(),
                0,
                MAX_CATEGORICAL_VALUES,
            );
            for (index, value) in values.iter().enumerate() {
                errors.length(&format!("{path}.values[{index}]"), value, 1, 253);
                if values[..index].contains(value) {
                    errors.invalid(
                        format!("{path}.values[{index}]"),
                        format!("duplicate value {value:?}: list every choice once"),
                    );
                }
            }
        }
    }
}

impl SearchAlgorithm {
    fn check(&self, path: &str, errors: &mut FieldErrors) {
        if let Some(settings) = &self.settings {
            if self.name != AlgorithmName::Tpe {
                errors.forbidden(format!("{path}.settings"), MSG_SETTINGS_NEED_TPE);
            }
            if let Some(trials) = settings.n_startup_trials {
                errors.at_least(&format!("{path}.settings.nStartupTrials"), trials, 1);
            }
            if let Some(candidates) = settings.n_ei_candidates {
                errors.at_least(&format!("{path}.settings.nEiCandidates"), candidates, 1);
            }
            if let Some(gamma) = settings.gamma
                && !(gamma > 0.0 && gamma < 1.0)
            {
                errors.invalid(
                    format!("{path}.settings.gamma"),
                    format!("must be between 0 and 1 (exclusive), got {gamma}"),
                );
            }
        }
    }
}

impl EarlyStoppingSpec {
    fn check(&self, path: &str, errors: &mut FieldErrors) {
        if let Some(min) = self.min_resource {
            errors.at_least(&format!("{path}.minResource"), min, 1);
        }
        if let Some(max) = self.max_resource {
            errors.at_least(&format!("{path}.maxResource"), max, 1);
        }
        if let (Some(min), Some(max)) = (self.min_resource, self.max_resource)
            && min >= max
        {
            errors.invalid(format!("{path}.maxResource"), MSG_RESOURCE_ORDER);
        }
        if let Some(factor) = self.reduction_factor {
            errors.at_least(
                &format!("{path}.reductionFactor"),
                factor,
                MIN_REDUCTION_FACTOR,
            );
        }
    }
}

/// True for a parameter name in the language of [`PARAMETER_NAME_PATTERN`], at most 63 characters.
pub fn is_parameter_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    let starts_well = bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_');
    starts_well
        && name.len() <= MAX_PARAMETER_NAME_LENGTH
        && bytes.all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameter_names() {
        for good in ["learningRate", "weight_decay", "_x", "layer.dropout", "a-b"] {
            assert!(is_parameter_name(good), "{good}");
        }
        for bad in ["", "1x", "-a", "a b", "a/b"] {
            assert!(!is_parameter_name(bad), "{bad}");
        }
    }
}
