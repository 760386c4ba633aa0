//! A small client for the MLflow REST API (`/api/2.0/mlflow/...`): experiment
//! tracking (experiments, runs, batched params/metrics/tags, run status) and
//! the model registry (registered models, versions, aliases), with retries and
//! exponential backoff on 5xx, 429 and connection errors. It speaks http and
//! https (rustls, the system's roots or a CA bundle of its own) and can send a
//! bearer token or basic-auth credentials, read from files (again whenever a
//! file changes) or from MLflow's own environment variables, as hosted MLflow
//! servers require ([`MlflowAccess`], [`MlflowEnv`]).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use trainyard_contracts::backoff::capped_doubling;

use reqwest::{Method, StatusCode, Url};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use thiserror::Error;
use tokio_util::sync::CancellationToken;

mod registry;
mod servers;
pub use registry::ModelVersion;
pub use servers::{
    ALLOWED_TRACKING_URIS_KEY, AllowedServers, ClientSettings, MlflowServers, ServerChoice,
    ServerUri, choose_server, deserialize_uri_list,
};

/// MLflow's limits for one `runs/log-batch` request.
pub const MAX_METRICS_PER_BATCH: usize = 1000;
pub const MAX_PARAMS_PER_BATCH: usize = 100;
pub const MAX_TAGS_PER_BATCH: usize = 100;
/// Metrics, params and tags together.
pub const MAX_ENTITIES_PER_BATCH: usize = 1000;

/// A failed MLflow call.
#[derive(Debug, Clone, Error)]
pub enum MlflowError {
    #[error("invalid MLflow tracking URI {uri:?}: {reason}")]
    InvalidUri { uri: String, reason: String },
    /// A credential or CA setting that cannot be used; `key` is its config key.
    #[error("{key}: {reason}")]
    Access { key: &'static str, reason: String },
    /// The server answered with an error.
    #[error("MLflow {operation}: HTTP {status} {error_code}: {message}")]
    Api {
        operation: &'static str,
        status: u16,
        error_code: String,
        message: String,
    },
    /// The server could not be reached or did not answer in time.
    #[error("MLflow {operation}: cannot reach the tracking server: {message}")]
    Transport {
        operation: &'static str,
        message: String,
    },
    /// The server answered something this client does not understand.
    #[error("MLflow {operation}: unexpected response: {message}")]
    Decode {
        operation: &'static str,
        message: String,
    },
}

impl MlflowError {
    /// Worth trying again: the server is down, overloaded or failed internally.
    pub fn is_retryable(&self) -> bool {
        match self {
            MlflowError::Transport { .. } => true,
            MlflowError::Api { status, .. } => *status >= 500 || *status == 429,
            MlflowError::InvalidUri { .. }
            | MlflowError::Access { .. }
            | MlflowError::Decode { .. } => false,
        }
    }

    /// MLflow's `error_code` (`RESOURCE_DOES_NOT_EXIST`, ...), for API errors.
    pub fn error_code(&self) -> Option<&str> {
        match self {
            MlflowError::Api { error_code, .. } => Some(error_code),
            _ => None,
        }
    }

    /// The operation that failed, a bounded label for metrics.
    pub fn operation(&self) -> &'static str {
        match self {
            MlflowError::InvalidUri { .. } | MlflowError::Access { .. } => "configure",
            MlflowError::Api { operation, .. }
            | MlflowError::Transport { operation, .. }
            | MlflowError::Decode { operation, .. } => operation,
        }
    }
}

/// How often and how patiently to retry.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Attempts per request, the first included (at least 1).
    pub max_attempts: u32,
    pub initial_backoff: Duration,
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(5),
        }
    }
}

impl RetryPolicy {
    /// Wait before attempt `attempt + 1` (attempt counts from 1): doubling, capped.
    pub fn backoff(&self, attempt: u32) -> Duration {
        capped_doubling(
            self.initial_backoff,
            attempt.saturating_sub(1),
            self.max_backoff,
        )
    }
}

/// Final status of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    Running,
    Finished,
    Failed,
    Killed,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Running => "RUNNING",
            RunStatus::Finished => "FINISHED",
            RunStatus::Failed => "FAILED",
            RunStatus::Killed => "KILLED",
        }
    }
}

/// One metric point.
#[derive(Debug, Clone, PartialEq)]
pub struct Metric {
    pub key: String,
    pub value: f64,
    /// Milliseconds since the Unix epoch.
    pub timestamp_ms: i64,
    pub step: i64,
}

impl Metric {
    fn to_json(&self) -> Value {
        // JSON has no NaN or infinity; MLflow's protobuf JSON reads them as strings.
        let value = if self.value.is_nan() {
            json!("NaN")
        } else if self.value == f64::INFINITY {
            json!("Infinity")
        } else if self.value == f64::NEG_INFINITY {
            json!("-Infinity")
        } else {
            json!(self.value)
        };
        json!({"key": self.key, "value": value, "timestamp": self.timestamp_ms, "step": self.step})
    }
}

/// One `runs/log-batch` request's worth of data.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Batch {
    pub metrics: Vec<Metric>,
    pub params: Vec<(String, String)>,
    pub tags: Vec<(String, String)>,
}

impl Batch {
    pub fn is_empty(&self) -> bool {
        self.metrics.is_empty() && self.params.is_empty() && self.tags.is_empty()
    }

    pub fn len(&self) -> usize {
        self.metrics.len() + self.params.len() + self.tags.len()
    }
}

/// Splits data into requests within MLflow's limits, keeping the order of each
/// kind (params and tags go first: they are few and a run should have them early).
pub fn split_batch(batch: Batch) -> Vec<Batch> {
    let Batch {
        metrics,
        params,
        tags,
    } = batch;
    let mut metrics = metrics.into_iter().peekable();
    let mut params = params.into_iter().peekable();
    let mut tags = tags.into_iter().peekable();
    let mut out = Vec::new();
    while metrics.peek().is_some() || params.peek().is_some() || tags.peek().is_some() {
        let params: Vec<_> = params.by_ref().take(MAX_PARAMS_PER_BATCH).collect();
        let tags: Vec<_> = tags.by_ref().take(MAX_TAGS_PER_BATCH).collect();
        let room = MAX_METRICS_PER_BATCH.min(MAX_ENTITIES_PER_BATCH - params.len() - tags.len());
        let metrics: Vec<_> = metrics.by_ref().take(room).collect();
        out.push(Batch {
            metrics,
            params,
            tags,
        });
    }
    out
}

/// An error and its causes, joined with ": ".
fn error_chain(err: &dyn std::error::Error) -> String {
    let mut message = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !message.contains(&text) {
            message.push_str(": ");
            message.push_str(&text);
        }
        source = cause.source();
    }
    message
}

fn pairs(items: &[(String, String)]) -> Value {
    Value::Array(
        items
            .iter()
            .map(|(key, value)| json!({"key": key, "value": value}))
            .collect(),
    )
}

/// An experiment as `experiments/get-by-name` returns it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Experiment {
    pub experiment_id: String,
    pub name: String,
    #[serde(default)]
    pub lifecycle_stage: String,
}

/// A run's info.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct RunInfo {
    pub run_id: String,
    #[serde(default)]
    pub run_name: String,
    #[serde(default)]
    pub status: String,
    #[serde(default)]
    pub lifecycle_stage: String,
}

#[derive(Deserialize)]
struct ExperimentResponse {
    experiment: Experiment,
}

#[derive(Deserialize)]
struct CreateExperimentResponse {
    experiment_id: String,
}

#[derive(Deserialize)]
struct RunResponse {
    run: RunEnvelope,
}

#[derive(Deserialize)]
struct RunEnvelope {
    info: RunInfo,
}

#[derive(Deserialize)]
struct SearchRunsResponse {
    #[serde(default)]
    runs: Vec<RunEnvelope>,
}

#[derive(Deserialize)]
struct ErrorBody {
    #[serde(default)]
    error_code: String,
    #[serde(default)]
    message: String,
}

/// Who the client is to the server and which servers it trusts: the services'
/// `mlflow_token_file`, `mlflow_username`, `mlflow_password_file` and
/// `mlflow_tls_ca_file` keys, and where those are unset, MLflow's own
/// variables ([`MlflowEnv`]). Secret files (mounted Secrets) are read when the
/// client is made and again whenever they change, so a rotated token or
/// password is used without a restart.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MlflowAccess {
    /// File holding a token sent as `Authorization: Bearer <token>`.
    pub token_file: Option<PathBuf>,
    /// User for HTTP basic auth, with `password_file`.
    pub username: Option<String>,
    pub password_file: Option<PathBuf>,
    /// CA bundle (PEM) an https server's certificate must chain to, instead of
    /// the system's roots.
    pub tls_ca_file: Option<PathBuf>,
    /// MLflow's variables: credentials when none of the three credential keys
    /// is set, the CA when `tls_ca_file` is unset.
    pub env: MlflowEnv,
}

/// MLflow's own environment variables, as its clients read them. The services
/// take them where their `mlflow_*` keys are unset.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct MlflowEnv {
    /// `MLFLOW_TRACKING_URI`.
    pub tracking_uri: Option<String>,
    /// `MLFLOW_TRACKING_TOKEN`.
    pub token: Option<String>,
    /// `MLFLOW_TRACKING_USERNAME`.
    pub username: Option<String>,
    /// `MLFLOW_TRACKING_PASSWORD`.
    pub password: Option<String>,
    /// `MLFLOW_TRACKING_SERVER_CERT_PATH`.
    pub server_cert_path: Option<PathBuf>,
    /// `MLFLOW_TRACKING_INSECURE_TLS` as given; a true value is refused.
    pub insecure_tls: Option<String>,
}

impl std::fmt::Debug for MlflowEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let redacted = |value: &Option<String>| value.as_ref().map(|_| "<redacted>");
        f.debug_struct("MlflowEnv")
            .field("tracking_uri", &self.tracking_uri)
            .field("token", &redacted(&self.token))
            .field("username", &self.username)
            .field("password", &redacted(&self.password))
            .field("server_cert_path", &self.server_cert_path)
            .field("insecure_tls", &self.insecure_tls)
            .finish()
    }
}

impl MlflowEnv {
    /// The tracking server: `configured` (a service's `mlflow_tracking_uri`)
    /// when it is set, else `MLFLOW_TRACKING_URI`.
    pub fn tracking_uri_or<'a>(&'a self, configured: Option<&'a str>) -> Option<&'a str> {
        configured
            .map(str::trim)
            .filter(|uri| !uri.is_empty())
            .or(self.tracking_uri.as_deref())
    }

    /// The variables `lookup` gives; empty ones count as unset.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Self {
        let get = |name: &str| lookup(name).filter(|value| !value.trim().is_empty());
        Self {
            tracking_uri: get("MLFLOW_TRACKING_URI").map(|uri| uri.trim().to_string()),
            token: get("MLFLOW_TRACKING_TOKEN"),
            username: get("MLFLOW_TRACKING_USERNAME"),
            password: get("MLFLOW_TRACKING_PASSWORD"),
            server_cert_path: get("MLFLOW_TRACKING_SERVER_CERT_PATH").map(PathBuf::from),
            insecure_tls: get("MLFLOW_TRACKING_INSECURE_TLS"),
        }
    }

    /// The process's variables.
    pub fn from_process() -> Self {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Refuses `MLFLOW_TRACKING_INSECURE_TLS=true`: the services always verify
    /// the tracking server, since its credentials would otherwise go to
    /// whoever answers.
    fn check_insecure_tls(&self) -> Result<(), MlflowError> {
        const KEY: &str = "MLFLOW_TRACKING_INSECURE_TLS";
        match self.insecure_tls.as_deref().map(|v| v.trim().to_ascii_lowercase()) {
            None => Ok(()),
            Some(value) if value == "false" || value == "0" => Ok(()),
            Some(value) if value == "true" || value == "1" => Err(MlflowError::Access {
                key: KEY,
                reason: "is not supported: the tracking server's certificate is always verified; unset it and give the server's CA in MLFLOW_TRACKING_SERVER_CERT_PATH (or the service's mlflow_tls_ca_file)".into(),
            }),
            Some(value) => Err(MlflowError::Access {
                key: KEY,
                reason: format!("{value:?} is not true or false; unset it"),
            }),
        }
    }
}

/// A credential: a value given once, or a file read again whenever its
/// modification time or length changes.
#[derive(Clone)]
enum Secret {
    Value(String),
    File {
        key: &'static str,
        path: PathBuf,
        cached: Arc<Mutex<CachedSecret>>,
    },
}

struct CachedSecret {
    stamp: Option<(SystemTime, u64)>,
    value: String,
}

fn file_stamp(path: &PathBuf) -> Option<(SystemTime, u64)> {
    let metadata = std::fs::metadata(path).ok()?;
    Some((metadata.modified().ok()?, metadata.len()))
}

fn read_secret(key: &'static str, path: &PathBuf) -> Result<String, MlflowError> {
    let text = std::fs::read_to_string(path).map_err(|err| MlflowError::Access {
        key,
        reason: format!("cannot read {}: {err}", path.display()),
    })?;
    let secret = text.trim().to_string();
    if secret.is_empty() {
        return Err(MlflowError::Access {
            key,
            reason: format!("{} is empty", path.display()),
        });
    }
    Ok(secret)
}

impl Secret {
    /// Reads `path` now: a file that cannot work is an error naming `key`.
    fn file(key: &'static str, path: &PathBuf) -> Result<Self, MlflowError> {
        let stamp = file_stamp(path);
        let value = read_secret(key, path)?;
        Ok(Secret::File {
            key,
            path: path.clone(),
            cached: Arc::new(Mutex::new(CachedSecret { stamp, value })),
        })
    }

    /// The current value. A file that changed is read again; one that became
    /// unreadable or empty (mid-rotation) keeps the last good value.
    fn current(&self) -> String {
        let (key, path, cached) = match self {
            Secret::Value(value) => return value.clone(),
            Secret::File { key, path, cached } => (*key, path, cached),
        };
        let mut cached = cached
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let stamp = file_stamp(path);
        if stamp.is_some() && stamp != cached.stamp {
            match read_secret(key, path) {
                Ok(value) => {
                    if value != cached.value {
                        tracing::info!(key, path = %path.display(), "MLflow credential file changed; using the new value");
                    }
                    *cached = CachedSecret { stamp, value };
                }
                Err(err) => {
                    tracing::warn!(error = %err, "keeping the last MLflow credential read");
                }
            }
        }
        cached.value.clone()
    }
}

/// What every request carries to prove who the client is.
#[derive(Clone)]
enum Credentials {
    Bearer(Secret),
    Basic { username: String, password: Secret },
}

impl MlflowAccess {
    fn credentials(&self) -> Result<Option<Credentials>, MlflowError> {
        match (&self.token_file, &self.username, &self.password_file) {
            (None, None, None) => self.env_credentials(),
            (Some(token), None, None) => Ok(Some(Credentials::Bearer(Secret::file(
                "mlflow_token_file",
                token,
            )?))),
            (None, Some(username), Some(password)) if !username.trim().is_empty() => {
                Ok(Some(Credentials::Basic {
                    username: username.trim().to_string(),
                    password: Secret::file("mlflow_password_file", password)?,
                }))
            }
            (Some(_), _, _) => Err(MlflowError::Access {
                key: "mlflow_token_file",
                reason: "set a token or a user name and password, not both: unset mlflow_token_file or mlflow_username and mlflow_password_file".into(),
            }),
            (None, _, Some(_)) => Err(MlflowError::Access {
                key: "mlflow_username",
                reason: "mlflow_password_file is set without a user: set mlflow_username too".into(),
            }),
            (None, Some(_), None) => Err(MlflowError::Access {
                key: "mlflow_password_file",
                reason: "mlflow_username is set without a password: set mlflow_password_file to the file holding it".into(),
            }),
        }
    }

    /// Credentials from MLflow's variables, used when no key names any.
    fn env_credentials(&self) -> Result<Option<Credentials>, MlflowError> {
        let env = &self.env;
        match (&env.token, &env.username, &env.password) {
            (None, None, None) => Ok(None),
            (Some(token), None, None) => Ok(Some(Credentials::Bearer(Secret::Value(
                token.trim().to_string(),
            )))),
            (None, Some(username), Some(password)) => Ok(Some(Credentials::Basic {
                username: username.trim().to_string(),
                password: Secret::Value(password.clone()),
            })),
            (Some(_), _, _) => Err(MlflowError::Access {
                key: "MLFLOW_TRACKING_TOKEN",
                reason: "set a token or a user name and password, not both: unset MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD".into(),
            }),
            (None, None, Some(_)) => Err(MlflowError::Access {
                key: "MLFLOW_TRACKING_USERNAME",
                reason: "MLFLOW_TRACKING_PASSWORD is set without a user: set MLFLOW_TRACKING_USERNAME too".into(),
            }),
            (None, Some(_), None) => Err(MlflowError::Access {
                key: "MLFLOW_TRACKING_PASSWORD",
                reason: "MLFLOW_TRACKING_USERNAME is set without a password: set MLFLOW_TRACKING_PASSWORD too".into(),
            }),
        }
    }

    fn roots(&self) -> Result<Option<Vec<reqwest::Certificate>>, MlflowError> {
        let (key, path) = match (&self.tls_ca_file, &self.env.server_cert_path) {
            (Some(path), _) => ("mlflow_tls_ca_file", path),
            (None, Some(path)) => ("MLFLOW_TRACKING_SERVER_CERT_PATH", path),
            (None, None) => return Ok(None),
        };
        let invalid = |reason: String| MlflowError::Access { key, reason };
        let pem = std::fs::read(path)
            .map_err(|err| invalid(format!("cannot read {}: {err}", path.display())))?;
        let certificates = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|err| invalid(format!("{} is not a PEM bundle: {err}", path.display())))?;
        if certificates.is_empty() {
            return Err(invalid(format!(
                "{} holds no PEM certificate",
                path.display()
            )));
        }
        Ok(Some(certificates))
    }
}

/// Client of one MLflow tracking server.
#[derive(Clone)]
pub struct MlflowClient {
    http: reqwest::Client,
    api: Url,
    credentials: Option<Credentials>,
    retry: RetryPolicy,
    shutdown: CancellationToken,
}

impl MlflowClient {
    /// `tracking_uri` is the server's base URL, e.g. `http://mlflow.mlflow:5000`;
    /// no credentials, the system's roots for https. `shutdown` cuts retry
    /// waits short.
    pub fn new(
        tracking_uri: &str,
        timeout: Duration,
        retry: RetryPolicy,
        shutdown: CancellationToken,
    ) -> Result<Self, MlflowError> {
        Self::with_access(
            tracking_uri,
            &MlflowAccess::default(),
            timeout,
            retry,
            shutdown,
        )
    }

    /// A client of `tracking_uri` (http or https, e.g.
    /// `https://mlflow.example.com`) that sends `access`'s credentials and
    /// trusts its CA.
    pub fn with_access(
        tracking_uri: &str,
        access: &MlflowAccess,
        timeout: Duration,
        retry: RetryPolicy,
        shutdown: CancellationToken,
    ) -> Result<Self, MlflowError> {
        let invalid = |reason: String| MlflowError::InvalidUri {
            uri: tracking_uri.to_string(),
            reason,
        };
        let mut base = Url::parse(tracking_uri).map_err(|err| invalid(err.to_string()))?;
        match base.scheme() {
            "http" | "https" => {}
            other => return Err(invalid(format!("scheme {other:?} is not http or https"))),
        }
        let path = format!("{}/api/2.0/mlflow/", base.path().trim_end_matches('/'));
        base.set_path(&path);
        base.set_query(None);
        access.env.check_insecure_tls()?;
        let credentials = access.credentials()?;
        if credentials.is_some() && base.scheme() == "http" {
            tracing::warn!(
                uri = tracking_uri,
                "MLflow credentials are sent over plain http; use an https tracking URI outside a trusted network"
            );
        }
        let mut builder = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(5)));
        if let Some(roots) = access.roots()? {
            // Only the given CA: a server it did not sign is refused.
            builder = roots
                .into_iter()
                .fold(builder.tls_built_in_root_certs(false), |builder, root| {
                    builder.add_root_certificate(root)
                });
        }
        let http = builder.build().map_err(|err| invalid(err.to_string()))?;
        Ok(Self {
            http,
            api: base,
            credentials,
            retry: RetryPolicy {
                max_attempts: retry.max_attempts.max(1),
                ..retry
            },
            shutdown,
        })
    }

    /// The API root, e.g. `http://127.0.0.1:5000/api/2.0/mlflow/`.
    pub fn api_url(&self) -> &Url {
        &self.api
    }

    async fn call<T: DeserializeOwned>(
        &self,
        operation: &'static str,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<&Value>,
    ) -> Result<T, MlflowError> {
        let mut attempt = 1;
        loop {
            let result = self
                .once(operation, method.clone(), path, query, body)
                .await;
            match result {
                Err(err) if err.is_retryable() && attempt < self.retry.max_attempts => {
                    let wait = self.retry.backoff(attempt);
                    tracing::debug!(operation, attempt, ?wait, error = %err, "MLflow call failed; retrying");
                    tokio::select! {
                        _ = self.shutdown.cancelled() => return Err(err),
                        _ = tokio::time::sleep(wait) => {}
                    }
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn once<T: DeserializeOwned>(
        &self,
        operation: &'static str,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<&Value>,
    ) -> Result<T, MlflowError> {
        let url = self.api.join(path).map_err(|err| MlflowError::Decode {
            operation,
            message: format!("bad path {path}: {err}"),
        })?;
        let mut request = self.http.request(method, url).query(query);
        request = match &self.credentials {
            None => request,
            Some(Credentials::Bearer(token)) => request.bearer_auth(token.current()),
            Some(Credentials::Basic { username, password }) => {
                request.basic_auth(username, Some(password.current()))
            }
        };
        if let Some(body) = body {
            request = request.json(body);
        }
        // reqwest's own message stops at "error sending request"; the cause
        // (refused connection, untrusted certificate) is further down.
        let transport = |err: reqwest::Error| MlflowError::Transport {
            operation,
            message: error_chain(&err),
        };
        let response = request.send().await.map_err(transport)?;
        let status = response.status();
        let bytes = response.bytes().await.map_err(transport)?;
        if status.is_success() {
            return serde_json::from_slice(&bytes).map_err(|err| MlflowError::Decode {
                operation,
                message: err.to_string(),
            });
        }
        let (error_code, message) = match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(body) if !body.error_code.is_empty() => (body.error_code, body.message),
            _ => (
                status
                    .canonical_reason()
                    .unwrap_or("error")
                    .to_uppercase()
                    .replace(' ', "_"),
                String::from_utf8_lossy(&bytes).chars().take(500).collect(),
            ),
        };
        Err(MlflowError::Api {
            operation,
            status: status.as_u16(),
            error_code,
            message,
        })
    }

    /// The experiment named `name`, if any (deleted ones included).
    pub async fn experiment_by_name(&self, name: &str) -> Result<Option<Experiment>, MlflowError> {
        let found = self
            .call::<ExperimentResponse>(
                "get_experiment",
                Method::GET,
                "experiments/get-by-name",
                &[("experiment_name", name)],
                None,
            )
            .await;
        match found {
            Ok(response) => Ok(Some(response.experiment)),
            Err(err) if is_missing(&err) => Ok(None),
            Err(err) => Err(err),
        }
    }

    /// The id of the experiment named `name`, creating it (with `tags`) or
    /// restoring it from the trash when needed. Safe against concurrent creators.
    pub async fn get_or_create_experiment(
        &self,
        name: &str,
        tags: &[(String, String)],
    ) -> Result<String, MlflowError> {
        if let Some(experiment) = self.experiment_by_name(name).await? {
            if experiment.lifecycle_stage == "deleted" {
                self.call::<Value>(
                    "restore_experiment",
                    Method::POST,
                    "experiments/restore",
                    &[],
                    Some(&json!({"experiment_id": experiment.experiment_id})),
                )
                .await?;
            }
            return Ok(experiment.experiment_id);
        }
        let created = self
            .call::<CreateExperimentResponse>(
                "create_experiment",
                Method::POST,
                "experiments/create",
                &[],
                Some(&json!({"name": name, "tags": pairs(tags)})),
            )
            .await;
        match created {
            Ok(response) => Ok(response.experiment_id),
            Err(err) if err.error_code() == Some("RESOURCE_ALREADY_EXISTS") => self
                .experiment_by_name(name)
                .await?
                .map(|e| e.experiment_id)
                .ok_or(err),
            Err(err) => Err(err),
        }
    }

    /// Active runs of an experiment matching an MLflow search `filter`.
    pub async fn search_runs(
        &self,
        experiment_id: &str,
        filter: &str,
    ) -> Result<Vec<RunInfo>, MlflowError> {
        let response = self
            .call::<SearchRunsResponse>(
                "search_runs",
                Method::POST,
                "runs/search",
                &[],
                Some(&json!({
                    "experiment_ids": [experiment_id],
                    "filter": filter,
                    "run_view_type": "ACTIVE_ONLY",
                    "max_results": 10,
                })),
            )
            .await?;
        Ok(response.runs.into_iter().map(|r| r.info).collect())
    }

    /// Creates a run; returns its id.
    pub async fn create_run(
        &self,
        experiment_id: &str,
        run_name: &str,
        start_time_ms: i64,
        tags: &[(String, String)],
    ) -> Result<String, MlflowError> {
        let response = self
            .call::<RunResponse>(
                "create_run",
                Method::POST,
                "runs/create",
                &[],
                Some(&json!({
                    "experiment_id": experiment_id,
                    "run_name": run_name,
                    "start_time": start_time_ms,
                    "tags": pairs(tags),
                })),
            )
            .await?;
        Ok(response.run.info.run_id)
    }

    /// Logs metrics, params and tags, in as many requests as MLflow's limits need.
    pub async fn log_batch(&self, run_id: &str, batch: Batch) -> Result<(), MlflowError> {
        for part in split_batch(batch) {
            let metrics: Vec<Value> = part.metrics.iter().map(Metric::to_json).collect();
            self.call::<Value>(
                "log_batch",
                Method::POST,
                "runs/log-batch",
                &[],
                Some(&json!({
                    "run_id": run_id,
                    "metrics": metrics,
                    "params": pairs(&part.params),
                    "tags": pairs(&part.tags),
                })),
            )
            .await?;
        }
        Ok(())
    }

    /// Sets a run's status (and end time, for a final status).
    pub async fn update_run(
        &self,
        run_id: &str,
        status: RunStatus,
        end_time_ms: Option<i64>,
    ) -> Result<(), MlflowError> {
        let mut body = json!({"run_id": run_id, "status": status.as_str()});
        if let Some(end) = end_time_ms {
            body["end_time"] = json!(end);
        }
        self.call::<Value>("update_run", Method::POST, "runs/update", &[], Some(&body))
            .await
            .map(|_| ())
    }
}

fn is_missing(err: &MlflowError) -> bool {
    matches!(err, MlflowError::Api { status, error_code, .. }
        if *status == StatusCode::NOT_FOUND.as_u16() || error_code == "RESOURCE_DOES_NOT_EXIST")
}

/// Quotes a value for an MLflow search filter (`'it''s'`).
pub fn filter_literal(value: &str) -> String {
    format!("'{}'", value.replace('\'', "''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn metric(i: usize) -> Metric {
        Metric {
            key: format!("m{i}"),
            value: i as f64,
            timestamp_ms: 0,
            step: 0,
        }
    }

    fn pair(prefix: &str, i: usize) -> (String, String) {
        (format!("{prefix}{i}"), i.to_string())
    }

    fn check_limits(parts: &[Batch]) {
        for part in parts {
            assert!(part.metrics.len() <= MAX_METRICS_PER_BATCH);
            assert!(part.params.len() <= MAX_PARAMS_PER_BATCH);
            assert!(part.tags.len() <= MAX_TAGS_PER_BATCH);
            assert!(part.len() <= MAX_ENTITIES_PER_BATCH);
            assert!(!part.is_empty());
        }
    }

    #[test]
    fn batches_respect_every_limit_and_keep_order() {
        let batch = Batch {
            metrics: (0..2500).map(metric).collect(),
            params: (0..250).map(|i| pair("p", i)).collect(),
            tags: (0..120).map(|i| pair("t", i)).collect(),
        };
        let parts = split_batch(batch.clone());
        check_limits(&parts);
        let metrics: Vec<Metric> = parts.iter().flat_map(|p| p.metrics.clone()).collect();
        let params: Vec<_> = parts.iter().flat_map(|p| p.params.clone()).collect();
        let tags: Vec<_> = parts.iter().flat_map(|p| p.tags.clone()).collect();
        assert_eq!(metrics, batch.metrics);
        assert_eq!(params, batch.params);
        assert_eq!(tags, batch.tags);
        assert_eq!(
            parts[0].len(),
            MAX_ENTITIES_PER_BATCH,
            "first request is full"
        );
        assert_eq!(parts.len(), 3, "800 + 880 + 820 metrics");
    }

    #[test]
    fn small_and_empty_batches() {
        assert!(split_batch(Batch::default()).is_empty());
        let parts = split_batch(Batch {
            metrics: vec![metric(1)],
            params: vec![],
            tags: vec![pair("t", 1)],
        });
        assert_eq!(parts.len(), 1);
        let parts = split_batch(Batch {
            metrics: (0..1000).map(metric).collect(),
            params: vec![],
            tags: vec![],
        });
        assert_eq!(parts.len(), 1);
        check_limits(&parts);
    }

    #[test]
    fn non_finite_metrics_are_written_as_protobuf_strings() {
        let mut m = metric(1);
        m.value = f64::NAN;
        assert_eq!(m.to_json()["value"], json!("NaN"));
        m.value = f64::NEG_INFINITY;
        assert_eq!(m.to_json()["value"], json!("-Infinity"));
        m.value = 0.5;
        assert_eq!(m.to_json()["value"], json!(0.5));
    }

    #[test]
    fn retries_only_what_can_succeed_later() {
        let api = |status| MlflowError::Api {
            operation: "x",
            status,
            error_code: "E".into(),
            message: String::new(),
        };
        assert!(api(500).is_retryable());
        assert!(api(503).is_retryable());
        assert!(api(429).is_retryable());
        assert!(!api(400).is_retryable());
        assert!(!api(404).is_retryable());
        assert!(
            MlflowError::Transport {
                operation: "x",
                message: "refused".into()
            }
            .is_retryable()
        );
        let policy = RetryPolicy::default();
        assert_eq!(policy.backoff(1), Duration::from_millis(200));
        assert_eq!(policy.backoff(3), Duration::from_millis(800));
        assert_eq!(policy.backoff(40), Duration::from_secs(5));
    }

    #[test]
    fn tracking_uris_are_checked() {
        let token = CancellationToken::new();
        let client = MlflowClient::new(
            "http://mlflow:5000/prefix/",
            Duration::from_secs(1),
            RetryPolicy::default(),
            token.clone(),
        )
        .expect("valid");
        assert_eq!(
            client.api_url().as_str(),
            "http://mlflow:5000/prefix/api/2.0/mlflow/"
        );
        let secure = MlflowClient::new(
            "https://mlflow.example.com",
            Duration::from_secs(1),
            RetryPolicy::default(),
            token.clone(),
        )
        .expect("https is taken");
        assert_eq!(
            secure.api_url().as_str(),
            "https://mlflow.example.com/api/2.0/mlflow/"
        );
        for bad in ["ftp://mlflow:5000", "file:///tmp/mlruns", "not a uri"] {
            let err = MlflowClient::new(
                bad,
                Duration::from_secs(1),
                RetryPolicy::default(),
                token.clone(),
            )
            .err()
            .expect("rejected");
            assert!(
                matches!(err, MlflowError::InvalidUri { .. }),
                "{bad}: {err}"
            );
        }
        assert_eq!(filter_literal("it's"), "'it''s'");
    }

    fn access_error(access: &MlflowAccess) -> String {
        MlflowClient::with_access(
            "https://mlflow.example.com",
            access,
            Duration::from_secs(1),
            RetryPolicy::default(),
            CancellationToken::new(),
        )
        .err()
        .expect("refused")
        .to_string()
    }

    #[test]
    fn credentials_that_cannot_work_name_the_key_to_fix() {
        let dir = tempfile::tempdir().expect("temp dir");
        let token = dir.path().join("token");
        std::fs::write(&token, "t0ken\n").expect("write");
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "\n").expect("write");
        let missing = dir.path().join("missing");

        assert!(
            access_error(&MlflowAccess {
                token_file: Some(missing.clone()),
                ..Default::default()
            })
            .starts_with("mlflow_token_file: cannot read ")
        );
        assert!(
            access_error(&MlflowAccess {
                token_file: Some(empty.clone()),
                ..Default::default()
            })
            .ends_with("empty is empty")
        );
        assert_eq!(
            access_error(&MlflowAccess {
                token_file: Some(token.clone()),
                username: Some("ml".into()),
                password_file: Some(token.clone()),
                ..Default::default()
            }),
            "mlflow_token_file: set a token or a user name and password, not both: unset mlflow_token_file or mlflow_username and mlflow_password_file"
        );
        assert_eq!(
            access_error(&MlflowAccess {
                username: Some("ml".into()),
                ..Default::default()
            }),
            "mlflow_password_file: mlflow_username is set without a password: set mlflow_password_file to the file holding it"
        );
        assert_eq!(
            access_error(&MlflowAccess {
                password_file: Some(token.clone()),
                ..Default::default()
            }),
            "mlflow_username: mlflow_password_file is set without a user: set mlflow_username too"
        );
        let not_pem = access_error(&MlflowAccess {
            tls_ca_file: Some(token.clone()),
            ..Default::default()
        });
        assert!(
            not_pem.starts_with("mlflow_tls_ca_file: ") && not_pem.contains("token"),
            "{not_pem}"
        );
        let err = MlflowClient::with_access(
            "https://mlflow.example.com",
            &MlflowAccess {
                tls_ca_file: Some(missing),
                ..Default::default()
            },
            Duration::from_secs(1),
            RetryPolicy::default(),
            CancellationToken::new(),
        )
        .err()
        .expect("refused");
        assert!(matches!(
            err,
            MlflowError::Access {
                key: "mlflow_tls_ca_file",
                ..
            }
        ));
        assert!(!err.is_retryable());
    }

    #[test]
    fn mlflow_variables_fill_in_unset_keys_and_insecure_tls_is_refused() {
        let env = |pairs: &[(&str, &str)]| {
            let pairs: Vec<(String, String)> = pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
            MlflowEnv::from_lookup(|name| {
                pairs
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.clone())
            })
        };
        let read = env(&[
            ("MLFLOW_TRACKING_URI", " https://mlflow.example.com "),
            ("MLFLOW_TRACKING_TOKEN", "t0ken"),
            ("MLFLOW_TRACKING_PASSWORD", ""),
        ]);
        assert_eq!(
            read.tracking_uri.as_deref(),
            Some("https://mlflow.example.com")
        );
        assert_eq!(read.password, None, "an empty variable is unset");
        assert!(
            !format!("{read:?}").contains("t0ken"),
            "Debug hides the token"
        );
        let with_env = |pairs: &[(&str, &str)]| MlflowAccess {
            env: env(pairs),
            ..Default::default()
        };
        assert_eq!(
            access_error(&with_env(&[("MLFLOW_TRACKING_INSECURE_TLS", "True")])),
            "MLFLOW_TRACKING_INSECURE_TLS: is not supported: the tracking server's certificate is always verified; unset it and give the server's CA in MLFLOW_TRACKING_SERVER_CERT_PATH (or the service's mlflow_tls_ca_file)"
        );
        assert_eq!(
            access_error(&with_env(&[("MLFLOW_TRACKING_USERNAME", "ml")])),
            "MLFLOW_TRACKING_PASSWORD: MLFLOW_TRACKING_USERNAME is set without a password: set MLFLOW_TRACKING_PASSWORD too"
        );
        assert!(
            access_error(&with_env(&[
                ("MLFLOW_TRACKING_TOKEN", "t"),
                ("MLFLOW_TRACKING_USERNAME", "ml"),
                ("MLFLOW_TRACKING_PASSWORD", "p"),
            ]))
            .starts_with(
                "MLFLOW_TRACKING_TOKEN: set a token or a user name and password, not both"
            )
        );
        assert!(
            access_error(&with_env(&[(
                "MLFLOW_TRACKING_SERVER_CERT_PATH",
                "/nonexistent/ca.pem"
            )]))
            .starts_with("MLFLOW_TRACKING_SERVER_CERT_PATH: cannot read /nonexistent/ca.pem")
        );
        // The service's own keys win: a token file set means the variables'
        // user and password are not looked at.
        let dir = tempfile::tempdir().expect("temp dir");
        let token = dir.path().join("token");
        std::fs::write(&token, "from-file").expect("write");
        let access = MlflowAccess {
            token_file: Some(token),
            env: env(&[("MLFLOW_TRACKING_USERNAME", "ml")]),
            ..Default::default()
        };
        assert!(matches!(
            access.credentials(),
            Ok(Some(Credentials::Bearer(secret))) if secret.current() == "from-file"
        ));
        assert!(
            MlflowClient::with_access(
                "https://mlflow.example.com",
                &with_env(&[("MLFLOW_TRACKING_INSECURE_TLS", "false")]),
                Duration::from_secs(1),
                RetryPolicy::default(),
                CancellationToken::new(),
            )
            .is_ok()
        );
    }
}
