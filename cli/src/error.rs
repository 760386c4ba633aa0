//! The one error type of the crate; `main` turns it into a message and exit code 1.

use std::path::PathBuf;

use crate::manifest::DocumentError;

/// Everything that can go wrong in a `trainyard` command.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A manifest file (or standard input) could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file or directory as given with `-f`.
        path: PathBuf,
        /// What the operating system said.
        source: std::io::Error,
    },

    /// `-f` named files that hold no objects at all.
    #[error(
        "no objects to apply in {files}: each file needs at least one document with apiVersion, kind and metadata.name"
    )]
    NoObjects {
        /// The files, comma-separated.
        files: String,
    },

    /// At least one document failed validation; nothing was applied.
    #[error("{}\nnothing was applied: fix the {} problem(s) above and apply again", render_document_errors(.0), .0.iter().map(DocumentError::problem_count).sum::<usize>())]
    InvalidManifests(Vec<DocumentError>),

    /// Documents of kinds the cluster does not serve; nothing was applied.
    #[error("{}\nnothing was applied: the cluster does not serve the kind of the {} document(s) above", .0.join("\n"), .0.len())]
    UnknownKinds(Vec<String>),

    /// Some objects were applied but others were refused by the API server.
    #[error("{} of {total} object(s) could not be applied:\n{}", .failures.len(), .failures.join("\n"))]
    ApplyFailed {
        /// One line per refused object: which object, and the server's answer.
        failures: Vec<String>,
        /// Objects that were attempted.
        total: usize,
    },

    /// The Kubernetes client could not be configured (no kubeconfig, not in a cluster).
    #[error(
        "cannot find a Kubernetes API: set KUBECONFIG (or ~/.kube/config) or run inside a cluster: {0}"
    )]
    Connect(#[source] Box<kube::Error>),

    /// A call to the Kubernetes API failed.
    #[error("{action}: {source}")]
    Kube {
        /// What the command was doing, e.g. "list trainingjobs in namespace ml".
        action: String,
        /// The client's or the API server's error.
        source: Box<kube::Error>,
    },

    /// The watch failed before its first list arrived.
    #[error("{action}: {source}")]
    Watch {
        /// What the command was doing, e.g. "watch trainingjobs in namespace ml".
        action: String,
        /// The watcher's error.
        source: Box<kube::runtime::watcher::Error>,
    },

    /// The watch stream ended, which the watcher never does on its own.
    #[error("the watch on {resource} ended unexpectedly")]
    WatchEnded {
        /// The resource being watched, e.g. "trainingjobs".
        resource: String,
    },

    /// `--timeout` ran out.
    #[error("timed out after {seconds}s: {detail}")]
    Timeout {
        /// The `--timeout` value.
        seconds: u64,
        /// What was still awaited.
        detail: String,
    },

    /// NATS could not be reached or read, or what it holds is not what
    /// Trainyard wrote.
    #[error("{0}")]
    Nats(String),

    /// A flag combination that cannot work, e.g. `--until-done` on queues.
    #[error("{0}")]
    Usage(String),

    /// A Node reports its allocatable GPUs in a form that is not a whole number.
    #[error(
        "node {node} reports allocatable nvidia.com/gpu {value:?}, which is not a whole number of GPUs"
    )]
    GpuQuantity {
        /// Node name.
        node: String,
        /// The quantity as the Node reports it.
        value: String,
    },

    /// Writing the output failed (e.g. a closed pipe).
    #[error("cannot write output: {0}")]
    Output(#[from] std::io::Error),

    /// An object could not be rendered as JSON.
    #[error("cannot render JSON: {0}")]
    Json(#[from] serde_json::Error),

    /// An object could not be written as YAML.
    #[error("cannot write YAML: {0}")]
    Yaml(#[from] yaml_serde::Error),

    /// A named object does not exist.
    #[error("{resource} {name:?} not found{scope}")]
    NotFound {
        /// e.g. "trainingjobs".
        resource: String,
        /// The name asked for.
        name: String,
        /// " in namespace ml", or empty for cluster-scoped kinds.
        scope: String,
    },

    /// `logs` of a TrainingJob that has no worker pods (yet, or any more).
    #[error("trainingjob {job:?} in namespace {namespace}: no worker pods: {reason}")]
    NoWorkerPods {
        /// The TrainingJob.
        job: String,
        /// Its namespace.
        namespace: String,
        /// Its state and what to do, e.g. "job is Queued; ...".
        reason: String,
    },

    /// The kubeconfig named by `--kubeconfig` or `--context` cannot be used.
    #[error("cannot use the kubeconfig: {0}")]
    Kubeconfig(#[source] Box<kube::config::KubeconfigError>),
}

impl CliError {
    /// The process exit code: 2 for a command used wrongly (as clap exits for
    /// bad flags), 3 when a named object does not exist, 4 when `--timeout`
    /// ran out, 1 for everything else.
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) => 2,
            CliError::NotFound { .. } => 3,
            CliError::Timeout { .. } => 4,
            _ => 1,
        }
    }

    /// Wraps a kube error with what the command was doing; for `map_err`.
    pub fn kube(action: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let action = action.into();
        move |source| Self::Kube {
            action,
            source: Box::new(source),
        }
    }
}

fn render_document_errors(errors: &[DocumentError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("\n")
}
