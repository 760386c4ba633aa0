//! The hpo-tuner: runs hyperparameter sweeps. It reads Sweep change events,
//! trial progress and trial lifecycle transitions, drives the pure sweep state
//! machine of `hpo-tuner-core`, and publishes trial requests, early stops and
//! sweep progress for the planner to carry out. Sweep state lives in the
//! `trainyard_tuner` KV bucket, so a restarted tuner (or another replica) goes on
//! where the last one stopped. Trials, and standalone TrainingJobs, can be
//! recorded in MLflow.

pub mod error;
pub mod metrics;
pub mod routing;
pub mod spec;
pub mod store;
pub mod tracking;
pub mod tuner;

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use trainyard_contracts::{Bucket, Service};
use trainyard_runtime::{ConfigSources, Runtime};

pub use error::TunerError;
pub use metrics::TunerMetrics;
pub use tuner::{Tuner, TunerHandler};

/// The `hpo_tuner` configuration section (`TRAINYARD_HPO_TUNER__*` variables).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "snake_case")]
pub struct TunerConfig {
    /// MLflow tracking server, e.g. `http://mlflow.mlflow:5000`; tracking is off when unset or empty.
    pub mlflow_tracking_uri: Option<String>,
    /// Other servers the tuner records a Sweep on when its trial template's
    /// `monitoring.mlflowTrackingUri` names one (prefixes of
    /// `scheme://host[:port][/path]`); they receive the tuner's credentials.
    #[serde(deserialize_with = "trainyard_mlflow::deserialize_uri_list")]
    pub mlflow_allowed_tracking_uris: Vec<String>,
    /// Time limit of one MLflow request.
    pub mlflow_timeout_seconds: u64,
    /// Attempts per MLflow request (5xx, 429 and connection errors are retried with backoff).
    pub mlflow_max_attempts: u32,
    /// Tracking commands queued before new ones are dropped (and counted).
    pub mlflow_queue_capacity: usize,
    /// Also record standalone TrainingJobs (not trials of a sweep), one run per job.
    pub mlflow_track_standalone_jobs: bool,
    /// Experiment of standalone jobs' runs; `{namespace}` is replaced by the job's namespace.
    pub mlflow_standalone_experiment: String,
    /// File holding a token sent as `Authorization: Bearer` (a hosted MLflow's
    /// access token, what MLflow's clients take from `MLFLOW_TRACKING_TOKEN`).
    pub mlflow_token_file: Option<String>,
    /// User for HTTP basic auth (`MLFLOW_TRACKING_USERNAME`), with `mlflow_password_file`.
    pub mlflow_username: Option<String>,
    /// File holding the basic-auth password (`MLFLOW_TRACKING_PASSWORD`).
    pub mlflow_password_file: Option<String>,
    /// CA bundle an https tracking server's certificate must chain to; the
    /// system's roots when unset.
    pub mlflow_tls_ca_file: Option<String>,
    /// MLflow's own variables (`MLFLOW_TRACKING_URI`, `..._TOKEN`, ...), taken
    /// where the keys above are unset; [`setup`] reads them from the process.
    #[serde(skip)]
    pub mlflow_env: trainyard_mlflow::MlflowEnv,
}

impl Default for TunerConfig {
    fn default() -> Self {
        Self {
            mlflow_tracking_uri: None,
            mlflow_allowed_tracking_uris: Vec::new(),
            mlflow_timeout_seconds: 10,
            mlflow_max_attempts: 5,
            mlflow_queue_capacity: 10_000,
            mlflow_track_standalone_jobs: true,
            mlflow_standalone_experiment: tracking::DEFAULT_STANDALONE_EXPERIMENT.to_string(),
            mlflow_token_file: None,
            mlflow_username: None,
            mlflow_password_file: None,
            mlflow_tls_ca_file: None,
            mlflow_env: trainyard_mlflow::MlflowEnv::default(),
        }
    }
}

impl TunerConfig {
    /// The tracking URI when tracking is on: `mlflow_tracking_uri`, else
    /// `MLFLOW_TRACKING_URI`.
    pub fn tracking_uri(&self) -> Option<&str> {
        self.mlflow_env
            .tracking_uri_or(self.mlflow_tracking_uri.as_deref())
    }

    /// The clients of the tracking server at `uri` and of the allowed
    /// servers, with the configured credentials and CA; an error names the
    /// key to fix.
    pub fn mlflow_servers(
        &self,
        uri: &str,
        shutdown: tokio_util::sync::CancellationToken,
    ) -> Result<trainyard_mlflow::MlflowServers, TunerError> {
        let settings = trainyard_mlflow::ClientSettings {
            access: trainyard_mlflow::MlflowAccess {
                token_file: self.mlflow_token_file.as_ref().map(Into::into),
                username: self.mlflow_username.clone(),
                password_file: self.mlflow_password_file.as_ref().map(Into::into),
                tls_ca_file: self.mlflow_tls_ca_file.as_ref().map(Into::into),
                env: self.mlflow_env.clone(),
            },
            timeout: Duration::from_secs(self.mlflow_timeout_seconds.max(1)),
            retry: trainyard_mlflow::RetryPolicy {
                max_attempts: self.mlflow_max_attempts.max(1),
                ..trainyard_mlflow::RetryPolicy::default()
            },
            shutdown,
        };
        trainyard_mlflow::MlflowServers::new(
            uri,
            &self.mlflow_allowed_tracking_uris,
            format!("hpo_tuner.{}", trainyard_mlflow::ALLOWED_TRACKING_URIS_KEY),
            settings,
        )
        .map_err(|err| match err {
            // Its message starts with the key: an MLflow variable, or one of ours.
            trainyard_mlflow::MlflowError::Access { key, .. } if key.starts_with("MLFLOW_") => {
                TunerError::Config(err.to_string())
            }
            trainyard_mlflow::MlflowError::Access { .. } => {
                TunerError::Config(format!("hpo_tuner.{err}"))
            }
            err => TunerError::Config(format!("hpo_tuner.mlflow_tracking_uri: {err}")),
        })
    }

    /// The experiment template for standalone jobs when they are tracked:
    /// tracking on, `mlflow_track_standalone_jobs` set.
    pub fn standalone_experiment(&self) -> Result<Option<&str>, TunerError> {
        if self.tracking_uri().is_none() || !self.mlflow_track_standalone_jobs {
            return Ok(None);
        }
        let template = self.mlflow_standalone_experiment.trim();
        if tracking::standalone_experiment_name(template, "x").is_empty() {
            return Err(TunerError::Config(
                "hpo_tuner.mlflow_standalone_experiment must name an experiment (e.g. \"{namespace}\")".into(),
            ));
        }
        Ok(Some(template))
    }
}

/// Service setup: reads the `hpo_tuner` section and starts the tuner.
pub async fn setup(runtime: &Runtime, sources: &ConfigSources) -> Result<(), TunerError> {
    let mut config: TunerConfig = sources.section("hpo_tuner")?;
    config.mlflow_env = trainyard_mlflow::MlflowEnv::from_process();
    start(runtime, config).await?;
    Ok(())
}

/// Starts the tuner's consumers (and the MLflow tracker when configured) on
/// `runtime`, after loading the stored sweeps.
pub async fn start(runtime: &Runtime, config: TunerConfig) -> Result<Arc<Tuner>, TunerError> {
    let bucket = runtime
        .bucket(Bucket::Tuner)
        .cloned()
        .ok_or_else(|| TunerError::Store("bucket trainyard_tuner was not provisioned".into()))?;
    let metrics = TunerMetrics::register(&runtime.registry)?;
    let standalone = config.standalone_experiment()?.map(str::to_string);
    let mut trial_runs = None;
    let tracker = match config.tracking_uri() {
        None => None,
        Some(uri) => {
            let servers = config.mlflow_servers(uri, runtime.shutdown.clone())?;
            trial_runs = Some(tracking::TrialRuns::new(servers.clone()));
            let (handle, tracker, receiver) =
                tracking::tracker(servers, metrics.clone(), config.mlflow_queue_capacity);
            runtime.spawn(tracker.run(receiver, runtime.shutdown.clone()));
            match standalone {
                Some(template) => {
                    tracing::info!(%uri, experiment = %template, "recording trials and standalone TrainingJobs in MLflow");
                    Some(handle.with_standalone_jobs(template))
                }
                None => {
                    tracing::info!(%uri, "recording trials in MLflow");
                    Some(handle)
                }
            }
        }
    };
    let mut tuner = Tuner::new(
        runtime.publisher.clone(),
        store::StateStore::new(bucket),
        metrics,
        tracker,
    );
    if let Some(runs) = trial_runs {
        tuner = tuner.with_trial_runs(runs);
    }
    let tuner = Arc::new(tuner);
    match tuner.warm_up().await {
        Ok(count) => tracing::info!(count, "loaded stored sweeps"),
        Err(err) => {
            tracing::warn!(error = %err, "cannot list stored sweeps; each loads on its next message")
        }
    }
    let handler = Arc::new(TunerHandler(tuner.clone()));
    for consumer in Service::HpoTuner.consumers() {
        runtime.spawn_consumer(consumer, handler.clone());
    }
    Ok(tuner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(pairs: &[(&str, &str)]) -> TunerConfig {
        let env = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        ConfigSources::load(None, env)
            .expect("loads")
            .section("hpo_tuner")
            .expect("section")
    }

    #[test]
    fn tracking_is_off_unless_a_uri_is_configured() {
        assert_eq!(section(&[]), TunerConfig::default());
        assert_eq!(section(&[]).tracking_uri(), None);
        assert_eq!(
            section(&[("TRAINYARD_HPO_TUNER__MLFLOW_TRACKING_URI", "  ")]).tracking_uri(),
            None
        );
        let config = section(&[
            (
                "TRAINYARD_HPO_TUNER__MLFLOW_TRACKING_URI",
                "http://mlflow.mlflow:5000",
            ),
            ("TRAINYARD_HPO_TUNER__MLFLOW_MAX_ATTEMPTS", "3"),
        ]);
        assert_eq!(config.tracking_uri(), Some("http://mlflow.mlflow:5000"));
        assert_eq!(config.mlflow_max_attempts, 3);
        assert_eq!(config.mlflow_timeout_seconds, 10, "defaults fill the rest");
    }

    #[test]
    fn mlflow_tracking_uri_is_the_fallback_of_the_key_and_insecure_tls_is_refused() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            trainyard_mlflow::MlflowEnv::from_lookup(move |name| {
                pairs
                    .iter()
                    .find(|(key, _)| *key == name)
                    .map(|(_, value)| value.to_string())
            })
        };
        let mut config = section(&[]);
        config.mlflow_env = env(&[("MLFLOW_TRACKING_URI", "http://from-env:5000")]);
        assert_eq!(config.tracking_uri(), Some("http://from-env:5000"));
        config.mlflow_tracking_uri = Some("http://from-key:5000".into());
        assert_eq!(
            config.tracking_uri(),
            Some("http://from-key:5000"),
            "the key wins"
        );

        config.mlflow_env = env(&[("MLFLOW_TRACKING_INSECURE_TLS", "true")]);
        let err = config
            .mlflow_servers("https://mlflow.example.com", Default::default())
            .err()
            .expect("refused");
        assert!(
            err.to_string()
                .contains("MLFLOW_TRACKING_INSECURE_TLS: is not supported")
                && !err.to_string().contains("hpo_tuner.MLFLOW"),
            "{err}"
        );
    }

    #[test]
    fn allowed_tracking_servers_are_a_list_or_one_string_and_checked_at_start() {
        let config = section(&[(
            "TRAINYARD_HPO_TUNER__MLFLOW_ALLOWED_TRACKING_URIS",
            "https://mlflow.team-a.example, http://10.0.0.7:5000/mlflow",
        )]);
        assert_eq!(
            config.mlflow_allowed_tracking_uris,
            [
                "https://mlflow.team-a.example",
                "http://10.0.0.7:5000/mlflow"
            ]
        );
        let servers = config
            .mlflow_servers("http://mlflow.mlflow:5000", Default::default())
            .expect("valid");
        assert_eq!(
            servers.choose(Some("https://MLFLOW.team-a.example/")),
            trainyard_mlflow::ServerChoice::Requested("https://MLFLOW.team-a.example/".into())
        );
        assert_eq!(
            section(&[]).mlflow_allowed_tracking_uris,
            Vec::<String>::new()
        );

        let bad = section(&[(
            "TRAINYARD_HPO_TUNER__MLFLOW_ALLOWED_TRACKING_URIS",
            "http://ok:5000,mlflow.team.example",
        )]);
        let err = bad
            .mlflow_servers("http://mlflow.mlflow:5000", Default::default())
            .err()
            .expect("refused")
            .to_string();
        assert!(
            err.contains(
                "hpo_tuner.mlflow_allowed_tracking_uris: entry 1 (\"mlflow.team.example\"): not a URL"
            ),
            "{err}"
        );
    }

    #[test]
    fn standalone_jobs_are_tracked_by_default_once_tracking_is_on() {
        assert_eq!(section(&[]).standalone_experiment().ok(), Some(None));
        let uri = (
            "TRAINYARD_HPO_TUNER__MLFLOW_TRACKING_URI",
            "http://mlflow.mlflow:5000",
        );
        assert_eq!(
            section(&[uri]).standalone_experiment().ok(),
            Some(Some("{namespace}"))
        );
        let config = section(&[
            uri,
            (
                "TRAINYARD_HPO_TUNER__MLFLOW_STANDALONE_EXPERIMENT",
                "jobs/{namespace}",
            ),
        ]);
        assert_eq!(
            config.standalone_experiment().ok(),
            Some(Some("jobs/{namespace}"))
        );
        let off = section(&[
            uri,
            ("TRAINYARD_HPO_TUNER__MLFLOW_TRACK_STANDALONE_JOBS", "false"),
        ]);
        assert!(!off.mlflow_track_standalone_jobs);
        assert_eq!(off.standalone_experiment().ok(), Some(None));
        let empty = section(&[
            uri,
            ("TRAINYARD_HPO_TUNER__MLFLOW_STANDALONE_EXPERIMENT", " "),
        ]);
        assert!(matches!(
            empty.standalone_experiment(),
            Err(TunerError::Config(_))
        ));
    }

    #[test]
    fn mlflow_credentials_and_ca_come_from_their_keys() {
        let dir = tempfile::tempdir().expect("temp dir");
        let token = dir.path().join("token");
        std::fs::write(&token, "t0ken\n").expect("write");
        let token = token.display().to_string();
        let uri = "https://mlflow.example.com";
        let config = section(&[
            ("TRAINYARD_HPO_TUNER__MLFLOW_TRACKING_URI", uri),
            ("TRAINYARD_HPO_TUNER__MLFLOW_TOKEN_FILE", &token),
        ]);
        assert_eq!(config.mlflow_token_file.as_deref(), Some(token.as_str()));
        assert!(
            config
                .mlflow_servers(uri, Default::default())
                .is_ok_and(|s| s.default_client().api_url().as_str()
                    == "https://mlflow.example.com/api/2.0/mlflow/")
        );

        let missing = section(&[
            ("TRAINYARD_HPO_TUNER__MLFLOW_TRACKING_URI", uri),
            ("TRAINYARD_HPO_TUNER__MLFLOW_USERNAME", "tuner"),
            (
                "TRAINYARD_HPO_TUNER__MLFLOW_PASSWORD_FILE",
                "/run/secrets/absent",
            ),
        ]);
        let err = missing
            .mlflow_servers(uri, Default::default())
            .err()
            .expect("refused");
        assert!(
            err.to_string()
                .contains("hpo_tuner.mlflow_password_file: cannot read /run/secrets/absent"),
            "{err}"
        );

        let ca = section(&[(
            "TRAINYARD_HPO_TUNER__MLFLOW_TLS_CA_FILE",
            "/run/secrets/no-ca.pem",
        )]);
        let err = ca
            .mlflow_servers(uri, Default::default())
            .err()
            .expect("refused");
        assert!(
            err.to_string()
                .contains("hpo_tuner.mlflow_tls_ca_file: cannot read /run/secrets/no-ca.pem"),
            "{err}"
        );
    }
}
