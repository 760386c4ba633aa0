//! Mapping the `Sweep` resource to the core's [`SweepSpec`], and the core's
//! parameter values back to the contract's [`ParameterValue`]s.
//!
//! Pure functions: no I/O. Every rejection names the offending field with the
//! path a user sees in `kubectl` (`spec.parameters[1].step`, `metadata.name`).

use std::collections::BTreeMap;
use std::fmt;

use hpo_tuner_core::space::MAX_INT_MAGNITUDE;
use hpo_tuner_core::sweep::MAX_SWEEP_NAME_LEN;
use hpo_tuner_core::{
    AlgorithmSpec, AshaConfig, Direction, Domain, EarlyStoppingSpec, GridConfig, MedianStopConfig,
    Objective, ParamSpec, ParamValue, Params, SearchSpace, SpecError, SweepCore, SweepSpec,
    TpeConfig,
};
use serde::{Deserialize, Serialize};
use trainyard_api::sweep::{
    AlgorithmName, EarlyStoppingAlgorithm, ObjectiveDirection, ParameterSpec, ParameterType,
};
use trainyard_api::{FieldError, Sweep};
use trainyard_contracts::EntityRef;
use trainyard_contracts::decisions::ParameterValue;
use trainyard_contracts::hash::fnv1a_of;

/// Trials the median rule waits for before it stops anything (the core's default,
/// Optuna's `n_startup_trials`); the CRD does not expose it.
pub const MEDIAN_STARTUP_TRIALS: u32 = 5;

/// One problem with a Sweep's spec: the field and what to change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecProblem {
    /// Path as `kubectl explain` shows it, e.g. `spec.parameters[0].max`.
    pub path: String,
    pub message: String,
}

impl fmt::Display for SpecProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.message)
    }
}

/// Why a Sweep cannot be run. The display names every offending field on one line
/// (dead-letter reasons travel in a header, which cannot hold line breaks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpecRejection {
    /// `namespace/name` of the Sweep.
    pub sweep: String,
    pub problems: Vec<SpecProblem>,
}

impl SpecRejection {
    fn one(sweep: &EntityRef, path: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            sweep: sweep.key(),
            problems: vec![SpecProblem {
                path: path.into(),
                message: message.into(),
            }],
        }
    }

    /// True when some problem is at `path`.
    pub fn names(&self, path: &str) -> bool {
        self.problems.iter().any(|p| p.path == path)
    }
}

impl fmt::Display for SpecRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sweep {} cannot run: ", self.sweep)?;
        for (i, problem) in self.problems.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{problem}")?;
        }
        Ok(())
    }
}

impl std::error::Error for SpecRejection {}

/// A float parameter searched on a grid of `min + k * step` (`k = 0..=steps`).
/// The core sees it as the integer `k`; [`ParamCodec`] turns `k` back into the value.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SteppedFloat {
    pub min: f64,
    pub step: f64,
    pub steps: i64,
}

impl SteppedFloat {
    pub fn value(&self, k: i64) -> f64 {
        let k = k.clamp(0, self.steps);
        round_noise(self.min + k as f64 * self.step)
    }
}

/// Removes the binary noise of `min + k * step` (`0.30000000000000004` → `0.3`) by
/// keeping 13 significant digits, far more than any hyperparameter needs.
fn round_noise(value: f64) -> f64 {
    format!("{value:.12e}").parse().unwrap_or(value)
}

/// How the core's parameter values map to what trials receive.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParamCodec {
    /// Float parameters with a `step`, by name.
    #[serde(default)]
    pub stepped: BTreeMap<String, SteppedFloat>,
}

impl ParamCodec {
    /// The trial's parameters as published in `TrialRequested`.
    pub fn decode(&self, params: &Params) -> BTreeMap<String, ParameterValue> {
        params
            .iter()
            .map(|(name, value)| {
                let value = match (self.stepped.get(name), value) {
                    (Some(grid), ParamValue::Int(k)) => ParameterValue::Float(grid.value(*k)),
                    (_, ParamValue::Int(v)) => ParameterValue::Int(*v),
                    (_, ParamValue::Float(v)) => ParameterValue::Float(*v),
                    (_, ParamValue::Categorical(v)) => ParameterValue::Text(v.clone()),
                };
                (name.clone(), value)
            })
            .collect()
    }
}

/// A parameter value as text (MLflow params, status fields).
pub fn parameter_text(value: &ParameterValue) -> String {
    match value {
        ParameterValue::Int(v) => v.to_string(),
        ParameterValue::Float(v) => v.to_string(),
        ParameterValue::Text(v) => v.clone(),
    }
}

/// A Sweep ready to run: its state machine (nothing requested yet) and how to
/// decode its parameters.
#[derive(Debug, Clone)]
pub struct MappedSweep {
    pub core: SweepCore,
    pub codec: ParamCodec,
}

/// The sweep's seed: `spec.algorithm.seed` when set, else derived from the
/// Sweep's uid (or namespace/name), so a sweep's suggestions never change after
/// it was created, whichever replica builds it.
pub fn seed_of(sweep: &Sweep, entity: &EntityRef) -> u64 {
    if let Some(seed) = sweep.spec.algorithm.as_ref().and_then(|a| a.seed) {
        return u64::from(seed);
    }
    let basis = if entity.uid.is_empty() {
        entity.key()
    } else {
        entity.uid.clone()
    };
    fnv1a_of(basis.as_bytes())
}

/// Validates the Sweep (every CRD rule, then what the tuner needs on top) and
/// builds the core spec. `entity` is the Sweep's namespace/name/uid.
pub fn map_sweep(entity: &EntityRef, sweep: &Sweep) -> Result<MappedSweep, SpecRejection> {
    let spec = &sweep.spec;
    if let Err(errors) = spec.validate() {
        return Err(SpecRejection {
            sweep: entity.key(),
            problems: errors.iter().map(problem_of).collect(),
        });
    }
    if !is_sweep_name(&entity.name) {
        return Err(SpecRejection::one(
            entity,
            "metadata.name",
            format!(
                "{:?} cannot name a sweep: trial TrainingJobs are named <sweep>-tNNNN, so a sweep name must be 1-{MAX_SWEEP_NAME_LEN} lowercase letters, digits or '-', starting and ending with a letter or digit",
                entity.name
            ),
        ));
    }
    let mut codec = ParamCodec::default();
    let mut params = Vec::with_capacity(spec.parameters.len());
    for (index, parameter) in spec.parameters.iter().enumerate() {
        let path = format!("spec.parameters[{index}]");
        let domain = domain_of(entity, &path, parameter, &mut codec)?;
        params.push(ParamSpec {
            name: parameter.name.clone(),
            domain,
        });
    }
    let search_space =
        SearchSpace::new(params).map_err(|err| core_rejection(entity, &spec.parameters, &err))?;
    let objective = Objective {
        metric: spec.objective.metric.clone(),
        direction: match spec.objective.direction {
            ObjectiveDirection::Minimize => Direction::Minimize,
            ObjectiveDirection::Maximize => Direction::Maximize,
        },
        goal: spec.objective.goal,
    };
    let algorithm = match spec.algorithm_name() {
        AlgorithmName::Random => AlgorithmSpec::Random,
        AlgorithmName::Grid => AlgorithmSpec::Grid(GridConfig::default()),
        AlgorithmName::Tpe => {
            let settings = spec.tpe_settings();
            AlgorithmSpec::Tpe(TpeConfig {
                n_startup_trials: settings.n_startup_trials,
                n_ei_candidates: settings.n_ei_candidates,
                gamma: settings.gamma,
                multivariate: settings.multivariate,
                ..TpeConfig::default()
            })
        }
    };
    let early_stopping = early_stopping_of(entity, sweep)?;
    let core_spec = SweepSpec {
        name: entity.name.clone(),
        objective,
        search_space,
        algorithm,
        early_stopping,
        parallel_trial_count: spec.parallel_trial_count(),
        max_trial_count: Some(spec.max_trial_count),
        max_failed_trial_count: spec.max_failed_trial_count,
        seed: seed_of(sweep, entity),
    };
    // Building the sampler and scheduler checks every setting they take.
    let core =
        SweepCore::new(core_spec).map_err(|err| core_rejection(entity, &spec.parameters, &err))?;
    Ok(MappedSweep { core, codec })
}

fn problem_of(error: &FieldError) -> SpecProblem {
    SpecProblem {
        path: error.path.clone(),
        message: format!("{}: {}", error.kind, error.message),
    }
}

/// The core's rule for sweep names (trial names must stay valid object names).
pub fn is_sweep_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= MAX_SWEEP_NAME_LEN
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// Largest step count of a stepped float, and largest int bound: the core keeps
/// every value exactly representable as an `f64`.
const MAX_MAGNITUDE: f64 = MAX_INT_MAGNITUDE as f64;

fn domain_of(
    entity: &EntityRef,
    path: &str,
    parameter: &ParameterSpec,
    codec: &mut ParamCodec,
) -> Result<Domain, SpecRejection> {
    let reject = |field: &str, message: String| {
        SpecRejection::one(entity, format!("{path}.{field}"), message)
    };
    // `validate()` guarantees min and max on numeric parameters and values on
    // categorical ones; a missing one here is still rejected, never unwrapped.
    let bounds = || match (parameter.min, parameter.max) {
        (Some(min), Some(max)) => Ok((min, max)),
        (None, _) => Err(reject("min", "float and int parameters need min".into())),
        (_, None) => Err(reject("max", "float and int parameters need max".into())),
    };
    match parameter.parameter_type {
        ParameterType::Categorical => Ok(Domain::Categorical {
            choices: parameter.values.clone().unwrap_or_default(),
        }),
        ParameterType::Float => {
            let (min, max) = bounds()?;
            let log = parameter.log.unwrap_or(false);
            let Some(step) = parameter.step else {
                return Ok(Domain::Float {
                    low: min,
                    high: max,
                    log,
                });
            };
            if log {
                return Err(reject(
                    "step",
                    "step cannot be combined with log: remove step to sample log-uniformly, or remove log to search min, min+step, ..., max".into(),
                ));
            }
            // Tolerate binary noise: 0.1 / 0.01 is 9.999999999999998.
            let steps = ((max - min) / step * (1.0 + 1e-9)).floor();
            if steps.is_nan() || steps < 1.0 {
                return Err(reject(
                    "step",
                    format!(
                        "step {step} is larger than max - min ({}): lower step",
                        max - min
                    ),
                ));
            }
            if steps > MAX_MAGNITUDE {
                return Err(reject(
                    "step",
                    format!("(max - min) / step must not exceed 2^53, got {steps:e}: raise step"),
                ));
            }
            let steps = steps as i64;
            codec
                .stepped
                .insert(parameter.name.clone(), SteppedFloat { min, step, steps });
            Ok(Domain::Int {
                low: 0,
                high: steps,
                step: 1,
                log: false,
            })
        }
        ParameterType::Int => {
            let (min, max) = bounds()?;
            for (field, value) in [("min", min), ("max", max)] {
                if value.abs() > MAX_MAGNITUDE {
                    return Err(reject(
                        field,
                        format!("int bounds must not exceed 2^53 in magnitude, got {value:e}"),
                    ));
                }
            }
            let step = parameter.step.unwrap_or(1.0);
            if step > MAX_MAGNITUDE {
                return Err(reject(
                    "step",
                    format!("must not exceed 2^53, got {step:e}"),
                ));
            }
            let (low, high, step) = (min as i64, max as i64, step as i64);
            if step < 1 {
                return Err(reject("step", format!("must be at least 1, got {step}")));
            }
            // As Optuna does, a range that is not a multiple of step ends at the
            // last step value below max.
            let high = low + (high - low) / step * step;
            if high <= low {
                return Err(reject(
                    "step",
                    format!(
                        "step {step} is larger than max - min ({}): lower step",
                        max - min
                    ),
                ));
            }
            Ok(Domain::Int {
                low,
                high,
                step,
                log: false,
            })
        }
    }
}

fn early_stopping_of(
    entity: &EntityRef,
    sweep: &Sweep,
) -> Result<Option<EarlyStoppingSpec>, SpecRejection> {
    let spec = &sweep.spec;
    let algorithm = spec.early_stopping_algorithm();
    let (min, max, eta) = (
        spec.min_resource(),
        spec.max_resource(),
        spec.reduction_factor(),
    );
    let asha = || {
        if max <= min {
            let explicit = spec
                .early_stopping
                .as_ref()
                .is_some_and(|e| e.max_resource.is_some());
            let message = if explicit {
                format!("must be greater than minResource ({min}), got {max}")
            } else {
                format!(
                    "unset, so it is the trial template's epochs ({max}), which must be greater than minResource ({min}): set maxResource or raise spec.trialTemplate.hyperparameters.epochs"
                )
            };
            return Err(SpecRejection::one(
                entity,
                "spec.earlyStopping.maxResource",
                message,
            ));
        }
        Ok(AshaConfig::new(min, max, eta))
    };
    Ok(match algorithm {
        EarlyStoppingAlgorithm::None => None,
        EarlyStoppingAlgorithm::Asha => Some(EarlyStoppingSpec::Asha(asha()?)),
        EarlyStoppingAlgorithm::Hyperband => Some(EarlyStoppingSpec::Hyperband(asha()?)),
        EarlyStoppingAlgorithm::Median => Some(EarlyStoppingSpec::Median(MedianStopConfig {
            startup_trials: MEDIAN_STARTUP_TRIALS,
            warmup_epochs: min,
        })),
    })
}

/// Translates a core spec error (whose paths are the core's: `searchSpace[lr].low`)
/// into the Sweep's field paths.
fn core_rejection(
    entity: &EntityRef,
    parameters: &[ParameterSpec],
    error: &SpecError,
) -> SpecRejection {
    let param = |name: &str, field: &str| {
        let index = parameters.iter().position(|p| p.name == name).map_or_else(
            || "spec.parameters".to_string(),
            |i| format!("spec.parameters[{i}]"),
        );
        if field.is_empty() {
            index
        } else {
            format!("{index}.{field}")
        }
    };
    let bound = |field: &str| {
        match field {
            "low" => "min",
            "high" => "max",
            other => other,
        }
        .to_string()
    };
    let path = match error {
        SpecError::EmptySearchSpace => "spec.parameters".to_string(),
        SpecError::EmptyParamName { index } => format!("spec.parameters[{index}].name"),
        SpecError::DuplicateParam { param: name } => param(name, "name"),
        SpecError::NonFiniteBound { param: name, field }
        | SpecError::IntTooLarge { param: name, field } => param(name, &bound(field)),
        SpecError::EmptyRange { param: name, .. } => param(name, "max"),
        SpecError::LogNeedsPositiveLow { param: name, .. } => param(name, "min"),
        SpecError::InvalidStep { param: name, .. }
        | SpecError::StepDoesNotDivideRange { param: name, .. } => param(name, "step"),
        SpecError::LogWithStep { param: name } => param(name, "log"),
        SpecError::EmptyChoices { param: name }
        | SpecError::DuplicateChoice { param: name, .. } => param(name, "values"),
        SpecError::InvalidField { field, .. } => crd_path(field),
    };
    let text = error.to_string();
    let message = match error {
        SpecError::InvalidField { reason, .. } => reason.clone(),
        _ => text
            .split_once(": ")
            .map_or(text.clone(), |(_, rest)| rest.to_string()),
    };
    SpecRejection::one(entity, path, message)
}

/// The Sweep path of a core field path (`algorithm.gamma` → `spec.algorithm.settings.gamma`).
fn crd_path(field: &str) -> String {
    if field == "name" {
        return "metadata.name".to_string();
    }
    if let Some(setting) = field.strip_prefix("algorithm.") {
        return format!("spec.algorithm.settings.{setting}");
    }
    format!("spec.{field}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn sweep(spec: serde_json::Value) -> Sweep {
        serde_json::from_value(json!({
            "apiVersion": "trainyard.dev/v1", "kind": "Sweep",
            "metadata": {"name": "s", "namespace": "ml", "uid": "u-1"},
            "spec": spec,
        }))
        .expect("sweep parses")
    }

    fn base(parameters: serde_json::Value) -> serde_json::Value {
        json!({
            "objective": {"metric": "accuracy", "direction": "maximize"},
            "parameters": parameters,
            "maxTrialCount": 4,
            "trialTemplate": {"model": "m", "dataset": "d", "numWorkers": 1, "gpusPerWorker": 1, "framework": "pytorch"},
        })
    }

    fn entity() -> EntityRef {
        EntityRef::new("ml", "s", "u-1")
    }

    fn rejection(spec: serde_json::Value) -> SpecRejection {
        map_sweep(&entity(), &sweep(spec)).expect_err("rejected")
    }

    #[test]
    fn the_example_sweep_maps_with_its_settings() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../examples/sweep.yaml"
        ))
        .expect("example");
        let sweep: Sweep = yaml_serde::from_str(&text).expect("example parses");
        let entity = EntityRef::new("ml-training", "bert-finetune-sweep", "uid");
        let mapped = map_sweep(&entity, &sweep).expect("example is valid");
        let spec = mapped.core.spec();
        assert_eq!(spec.name, "bert-finetune-sweep");
        assert_eq!(spec.objective.direction, Direction::Minimize);
        assert_eq!(spec.objective.goal, Some(0.25));
        assert_eq!(spec.parallel_trial_count, 4);
        assert_eq!(spec.max_trial_count, Some(32));
        assert_eq!(spec.max_failed_trial_count, Some(3));
        assert_eq!(spec.seed, 42);
        match &spec.algorithm {
            AlgorithmSpec::Tpe(tpe) => {
                assert_eq!(tpe.n_startup_trials, 8);
                assert_eq!(tpe.n_ei_candidates, 24);
                assert!(tpe.multivariate);
                assert_eq!(tpe.gamma, 0.25, "CRD default");
            }
            other => panic!("expected tpe, got {other:?}"),
        }
        assert_eq!(
            spec.early_stopping,
            Some(EarlyStoppingSpec::Asha(AshaConfig::new(1, 9, 3)))
        );
        let domains: Vec<_> = spec
            .search_space
            .params()
            .iter()
            .map(|p| (p.name.as_str(), p.domain.clone()))
            .collect();
        assert_eq!(
            domains,
            vec![
                (
                    "learningRate",
                    Domain::Float {
                        low: 0.00001,
                        high: 0.001,
                        log: true
                    }
                ),
                (
                    "batchSize",
                    Domain::Int {
                        low: 16,
                        high: 128,
                        step: 16,
                        log: false
                    }
                ),
                (
                    "optimizer",
                    Domain::Categorical {
                        choices: vec!["adam".into(), "adamw".into()]
                    }
                ),
                (
                    "weight_decay",
                    Domain::Float {
                        low: 0.0,
                        high: 0.1,
                        log: false
                    }
                ),
            ]
        );
        assert!(mapped.codec.stepped.is_empty());
    }

    #[test]
    fn defaults_follow_the_crd() {
        let mapped = map_sweep(
            &entity(),
            &sweep(base(
                json!([{"name": "lr", "type": "float", "min": 0.1, "max": 1.0}]),
            )),
        )
        .expect("valid");
        let spec = mapped.core.spec();
        assert_eq!(spec.algorithm, AlgorithmSpec::Random);
        assert_eq!(spec.parallel_trial_count, 1);
        assert_eq!(spec.early_stopping, None);
        assert_eq!(spec.max_failed_trial_count, None);
        assert_eq!(spec.seed, fnv1a_of(b"u-1"), "seed from the uid");
    }

    #[test]
    fn stepped_floats_search_a_grid_and_decode_to_values() {
        let mut spec = base(json!([
            {"name": "dropout", "type": "float", "min": 0.0, "max": 0.3, "step": 0.1},
            {"name": "layers", "type": "int", "min": 1, "max": 10, "step": 4},
        ]));
        spec["algorithm"] = json!({"name": "grid"});
        let mapped = map_sweep(&entity(), &sweep(spec)).expect("valid");
        let domains: Vec<_> = mapped
            .core
            .search_space()
            .params()
            .iter()
            .map(|p| p.domain.clone())
            .collect();
        assert_eq!(
            domains[0],
            Domain::Int {
                low: 0,
                high: 3,
                step: 1,
                log: false
            }
        );
        assert_eq!(
            domains[1],
            Domain::Int {
                low: 1,
                high: 9,
                step: 4,
                log: false
            },
            "range cut to the last step value below max"
        );
        let mut params = Params::new();
        params.insert("dropout", ParamValue::Int(3));
        params.insert("layers", ParamValue::Int(5));
        let decoded = mapped.codec.decode(&params);
        assert_eq!(decoded["dropout"], ParameterValue::Float(0.3));
        assert_eq!(decoded["layers"], ParameterValue::Int(5));
        params.insert("dropout", ParamValue::Int(1));
        assert_eq!(
            mapped.codec.decode(&params)["dropout"],
            ParameterValue::Float(0.1)
        );
    }

    #[test]
    fn categorical_values_decode_as_text() {
        let mut params = Params::new();
        params.insert("opt", ParamValue::Categorical("adam".into()));
        params.insert("lr", ParamValue::Float(0.01));
        let decoded = ParamCodec::default().decode(&params);
        assert_eq!(decoded["opt"], ParameterValue::Text("adam".into()));
        assert_eq!(decoded["lr"], ParameterValue::Float(0.01));
        assert_eq!(parameter_text(&decoded["lr"]), "0.01");
        assert_eq!(parameter_text(&ParameterValue::Int(64)), "64");
    }

    #[test]
    fn crd_rule_violations_name_the_field() {
        let err = rejection(base(
            json!([{"name": "lr", "type": "float", "min": 1.0, "max": 0.5}]),
        ));
        assert!(err.names("spec.parameters[0].max"), "{err}");
        let text = err.to_string();
        assert!(
            text.starts_with("Sweep ml/s cannot run: spec.parameters[0].max"),
            "{text}"
        );
        assert!(!text.contains('\n'));

        let mut spec = base(json!([{"name": "lr", "type": "float", "min": 0.1, "max": 0.5}]));
        spec["parallelTrialCount"] = json!(5);
        assert!(rejection(spec).names("spec.parallelTrialCount"));
    }

    #[test]
    fn tuner_rules_name_the_field() {
        let err = rejection(base(json!([
            {"name": "lr", "type": "float", "min": 0.001, "max": 0.1, "log": true, "step": 0.01}
        ])));
        assert!(err.names("spec.parameters[0].step"), "{err}");

        let err = rejection(base(
            json!([{"name": "n", "type": "int", "min": 1, "max": 3, "step": 5}]),
        ));
        assert!(err.names("spec.parameters[0].step"), "{err}");

        let err = rejection(base(
            json!([{"name": "d", "type": "float", "min": 0.0, "max": 0.1, "step": 0.5}]),
        ));
        assert!(err.names("spec.parameters[0].step"), "{err}");

        let err = rejection(base(
            json!([{"name": "n", "type": "int", "min": 0, "max": 1e17}]),
        ));
        assert!(err.names("spec.parameters[0].max"), "{err}");

        let mut spec = base(json!([{"name": "lr", "type": "float", "min": 0.1, "max": 0.5}]));
        spec["earlyStopping"] = json!({"algorithm": "asha", "minResource": 10});
        let err = rejection(spec);
        assert!(err.names("spec.earlyStopping.maxResource"), "{err}");
        assert!(
            err.to_string().contains("trial template's epochs (10)"),
            "{err}"
        );
    }

    #[test]
    fn long_sweep_names_are_rejected_by_name() {
        let long = "s".repeat(MAX_SWEEP_NAME_LEN + 1);
        let sweep = sweep(base(
            json!([{"name": "lr", "type": "float", "min": 0.1, "max": 0.5}]),
        ));
        let err = map_sweep(&EntityRef::new("ml", long, ""), &sweep).expect_err("too long");
        assert!(err.names("metadata.name"), "{err}");
        assert!(is_sweep_name(&"s".repeat(MAX_SWEEP_NAME_LEN)));
        assert!(!is_sweep_name("a.b"));
        assert!(!is_sweep_name("-a"));
    }

    #[test]
    fn core_errors_are_translated_to_sweep_paths() {
        let parameters = vec![ParameterSpec {
            name: "lr".into(),
            parameter_type: ParameterType::Float,
            min: Some(0.0),
            max: Some(1.0),
            log: None,
            step: None,
            values: None,
        }];
        let cases = [
            (
                SpecError::LogNeedsPositiveLow {
                    param: "lr".into(),
                    low: "0".into(),
                },
                "spec.parameters[0].min",
            ),
            (
                SpecError::NonFiniteBound {
                    param: "lr".into(),
                    field: "high",
                },
                "spec.parameters[0].max",
            ),
            (
                SpecError::InvalidField {
                    field: "algorithm.gamma".into(),
                    reason: "must be in (0, 1]".into(),
                },
                "spec.algorithm.settings.gamma",
            ),
            (
                SpecError::InvalidField {
                    field: "parallelTrialCount".into(),
                    reason: "must be at least 1".into(),
                },
                "spec.parallelTrialCount",
            ),
            (
                SpecError::InvalidField {
                    field: "name".into(),
                    reason: "bad".into(),
                },
                "metadata.name",
            ),
        ];
        for (error, path) in cases {
            let rejection = core_rejection(&entity(), &parameters, &error);
            assert!(rejection.names(path), "{error} -> {rejection}");
            assert!(
                !rejection.problems[0].message.contains("searchSpace"),
                "{rejection}"
            );
        }
    }

    #[test]
    fn the_seed_is_stable_per_sweep() {
        let s = sweep(base(
            json!([{"name": "lr", "type": "float", "min": 0.1, "max": 0.5}]),
        ));
        assert_eq!(seed_of(&s, &entity()), seed_of(&s, &entity()));
        assert_ne!(
            seed_of(&s, &entity()),
            seed_of(&s, &EntityRef::new("ml", "s", "u-2"))
        );
        let mut seeded = s.clone();
        seeded.spec.algorithm = Some(trainyard_api::SearchAlgorithm {
            name: AlgorithmName::Random,
            seed: Some(7),
            settings: None,
        });
        assert_eq!(seed_of(&seeded, &entity()), 7);
    }

    #[test]
    fn stepped_values_lose_binary_noise() {
        let grid = SteppedFloat {
            min: 0.0,
            step: 0.1,
            steps: 10,
        };
        assert_eq!(grid.value(3), 0.3);
        assert_eq!(grid.value(99), 1.0, "clamped");
        assert_eq!(grid.value(-1), 0.0, "clamped");
    }
}
