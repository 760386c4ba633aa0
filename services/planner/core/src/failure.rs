//! Why a worker failed, and whether trying again can help.
//!
//! The classification follows Kubeflow's `ExitCode` restart policy: exit codes 1–127
//! are the program's own verdict (a bug, bad input, a failed assertion) and fail the
//! same way on every retry, so they are permanent. Exit codes 128–255 mean the process
//! was killed by a signal (128 + n: 137 is SIGKILL, e.g. the OOM killer; 143 is
//! SIGTERM), which says more about the environment than the program, so they are
//! retryable — as are disruptions Kubernetes itself reports (preemption, eviction,
//! node drain or loss) whatever the exit code, because an evicted process may well
//! exit 1 on SIGTERM.

use serde::{Deserialize, Serialize};
use std::fmt;

use chrono::{DateTime, Utc};
use trainyard_contracts::events::{ContainerTermination, ObservedCondition, PodObserved};

/// Pod condition Kubernetes adds when it disrupts a pod (preemption, eviction, taint
/// manager, pod GC after node loss).
pub const DISRUPTION_TARGET: &str = "DisruptionTarget";
/// Job condition reason when `activeDeadlineSeconds` ran out.
pub const DEADLINE_EXCEEDED: &str = "DeadlineExceeded";

/// What ended a worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FailureCause {
    /// The container exited with this non-zero code.
    ExitCode {
        code: i32,
        /// Container termination reason, e.g. `Error`, `OOMKilled`.
        reason: Option<String>,
    },
    /// The container was killed by a signal.
    Signal { signal: i32, exit_code: i32 },
    /// Kubernetes disrupted the pod (`DisruptionTarget` condition).
    Disrupted {
        /// e.g. `PreemptionByScheduler`, `EvictionByEvictionAPI`, `DeletionByTaintManager`.
        reason: String,
    },
    /// The pod failed without a container exit status: usually the node went away.
    PodLost,
    /// The Job failed before any pod failure was seen (`reason` from its condition).
    JobFailed { reason: String },
    /// The Job ran past `failurePolicy.activeDeadlineSeconds`.
    DeadlineExceeded,
}

impl FailureCause {
    /// True when a retry may succeed (see the module documentation).
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::ExitCode { code, .. } => !(1..=127).contains(code),
            Self::Signal { .. }
            | Self::Disrupted { .. }
            | Self::PodLost
            | Self::JobFailed { .. } => true,
            Self::DeadlineExceeded => false,
        }
    }

    /// True when the cause says little (the Job's verdict only) and a pod's own
    /// termination, arriving later, should replace it.
    pub fn is_unspecific(&self) -> bool {
        matches!(self, Self::JobFailed { .. })
    }
}

impl fmt::Display for FailureCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ExitCode { code, reason } => {
                write!(f, "exited with code {code}")?;
                if let Some(reason) = reason.as_deref().filter(|r| *r != "Error") {
                    write!(f, " ({reason})")?;
                }
                if (129..=192).contains(code) {
                    write!(f, ", killed by signal {}", code - 128)?;
                }
                Ok(())
            }
            Self::Signal { signal, exit_code } => {
                write!(f, "was killed by signal {signal} (exit code {exit_code})")
            }
            Self::Disrupted { reason } => write!(f, "was disrupted by Kubernetes ({reason})"),
            Self::PodLost => {
                f.write_str("was lost without an exit status (node failure or pod deletion)")
            }
            Self::JobFailed { reason } => write!(f, "failed ({reason})"),
            Self::DeadlineExceeded => f.write_str("ran past failurePolicy.activeDeadlineSeconds"),
        }
    }
}

/// The first failure of an attempt: its root cause, since the Job controller kills the
/// remaining workers right after it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerFailure {
    /// Index (rank) of the failed worker, when a pod failure was seen.
    pub worker_index: Option<u32>,
    /// Name of the failed pod, when known.
    pub pod_name: Option<String>,
    pub cause: FailureCause,
    /// When the planner learned of the failure (the message time).
    pub at: DateTime<Utc>,
}

impl WorkerFailure {
    /// True when a retry may succeed.
    pub fn is_retryable(&self) -> bool {
        self.cause.is_retryable()
    }

    /// Classifies a failed pod.
    pub fn from_pod(pod: &PodObserved, at: DateTime<Utc>) -> Self {
        Self {
            worker_index: Some(pod.index),
            pod_name: Some(pod.pod_name.clone()),
            cause: classify_pod(pod.termination.as_ref(), &pod.conditions),
            at,
        }
    }

    /// A failure known only from the Job's `Failed` condition.
    pub fn from_job_condition(reason: Option<&str>, at: DateTime<Utc>) -> Self {
        let cause = match reason {
            Some(DEADLINE_EXCEEDED) => FailureCause::DeadlineExceeded,
            other => FailureCause::JobFailed {
                reason: other.unwrap_or("Failed").to_owned(),
            },
        };
        Self {
            worker_index: None,
            pod_name: None,
            cause,
            at,
        }
    }
}

impl fmt::Display for WorkerFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.worker_index, &self.pod_name) {
            (Some(index), Some(pod)) => write!(f, "worker {index} (pod {pod}) {}", self.cause),
            (Some(index), None) => write!(f, "worker {index} {}", self.cause),
            _ => write!(f, "the workers' Job {}", self.cause),
        }
    }
}

/// Classifies how a pod's container ended. A disruption reported by Kubernetes wins
/// over the exit code, which then only reflects how the process reacted to SIGTERM.
pub fn classify_pod(
    termination: Option<&ContainerTermination>,
    conditions: &[ObservedCondition],
) -> FailureCause {
    if let Some(disruption) = conditions
        .iter()
        .find(|c| c.condition_type == DISRUPTION_TARGET && c.status == "True")
    {
        return FailureCause::Disrupted {
            reason: disruption
                .reason
                .clone()
                .unwrap_or_else(|| DISRUPTION_TARGET.to_owned()),
        };
    }
    match termination {
        None => FailureCause::PodLost,
        Some(termination) => match termination.signal {
            Some(signal) => FailureCause::Signal {
                signal,
                exit_code: termination.exit_code,
            },
            None => FailureCause::ExitCode {
                code: termination.exit_code,
                reason: termination.reason.clone(),
            },
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(code: i32) -> ContainerTermination {
        ContainerTermination {
            exit_code: code,
            signal: None,
            reason: Some("Error".into()),
            message: None,
        }
    }

    #[test]
    fn program_errors_are_permanent_and_signals_retryable() {
        for code in [1, 2, 42, 127] {
            assert!(
                !classify_pod(Some(&exit(code)), &[]).is_retryable(),
                "{code}"
            );
        }
        for code in [128, 130, 137, 143, 255] {
            assert!(
                classify_pod(Some(&exit(code)), &[]).is_retryable(),
                "{code}"
            );
        }
        let signalled = ContainerTermination {
            signal: Some(9),
            ..exit(1)
        };
        assert!(classify_pod(Some(&signalled), &[]).is_retryable());
        assert!(classify_pod(None, &[]).is_retryable());
        assert!(!FailureCause::DeadlineExceeded.is_retryable());
    }

    #[test]
    fn a_disruption_beats_the_exit_code() {
        let evicted = ObservedCondition {
            condition_type: DISRUPTION_TARGET.into(),
            status: "True".into(),
            reason: Some("EvictionByEvictionAPI".into()),
            message: None,
        };
        let cause = classify_pod(Some(&exit(1)), &[evicted]);
        assert!(cause.is_retryable());
        assert_eq!(
            cause.to_string(),
            "was disrupted by Kubernetes (EvictionByEvictionAPI)"
        );
    }

    #[test]
    fn messages_name_the_worker_and_exit_code() {
        let failure = WorkerFailure {
            worker_index: Some(1),
            pod_name: Some("bert-a0-1-x2v9q".into()),
            cause: FailureCause::ExitCode {
                code: 137,
                reason: Some("OOMKilled".into()),
            },
            at: DateTime::<Utc>::UNIX_EPOCH,
        };
        assert_eq!(
            failure.to_string(),
            "worker 1 (pod bert-a0-1-x2v9q) exited with code 137 (OOMKilled), killed by signal 9"
        );
    }
}
