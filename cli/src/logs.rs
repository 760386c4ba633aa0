//! `trainyard logs`: a TrainingJob's worker logs, read through the pods' `log`
//! subresource as `kubectl logs` reads them.
//!
//! Which pods: those labelled with the job's name ([`LABEL_JOB`]) of the latest
//! attempt ([`LABEL_ATTEMPT`]), one per rank ([`LABEL_WORKER_INDEX`], the newest
//! pod when a rank was replaced). Choosing them is pure; reading them is not.

use std::collections::BTreeMap;
use std::io::Write;

use futures::{AsyncBufReadExt, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, LogParams};
use kube::{Api, Client, ResourceExt};
use trainyard_api::placement::{LABEL_ATTEMPT, LABEL_JOB, LABEL_WORKER_INDEX};
use trainyard_api::{TrainingJob, TrainingJobState};

use crate::error::CliError;

/// Which workers' logs, and how.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogOptions {
    /// The worker whose log to print, unless `all`.
    pub rank: u32,
    /// Every worker's log, each line prefixed with `[rank N]`.
    pub all: bool,
    /// Keep streaming until the workers exit.
    pub follow: bool,
    /// Last N lines of each log.
    pub tail: Option<u32>,
    /// Lines written in the last this many seconds.
    pub since_seconds: Option<u64>,
    /// Each line with the time it was written in front.
    pub timestamps: bool,
}

/// One worker pod: its rank and name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Worker {
    pub rank: u32,
    pub pod: String,
    /// The container to read: the pod's first (the worker's).
    pub container: Option<String>,
}

fn label_number(pod: &Pod, label: &str) -> Option<u32> {
    pod.labels().get(label).and_then(|v| v.parse().ok())
}

/// The workers of the job's latest attempt, one per rank (the newest pod of a
/// rank that was replaced), by rank.
pub fn workers(pods: &[Pod]) -> Vec<Worker> {
    let latest = pods
        .iter()
        .map(|pod| label_number(pod, LABEL_ATTEMPT).unwrap_or(0))
        .max();
    let mut by_rank: BTreeMap<u32, &Pod> = BTreeMap::new();
    for pod in pods {
        if Some(label_number(pod, LABEL_ATTEMPT).unwrap_or(0)) != latest {
            continue;
        }
        let rank = label_number(pod, LABEL_WORKER_INDEX).unwrap_or(0);
        let newer = by_rank
            .get(&rank)
            .is_none_or(|kept| pod.creation_timestamp() > kept.creation_timestamp());
        if newer {
            by_rank.insert(rank, pod);
        }
    }
    by_rank
        .into_iter()
        .map(|(rank, pod)| Worker {
            rank,
            pod: pod.name_any(),
            container: pod
                .spec
                .as_ref()
                .and_then(|spec| spec.containers.first())
                .map(|c| c.name.clone()),
        })
        .collect()
}

/// Why a job has no worker pods, from its state, and what to do.
pub fn no_pods_reason(state: Option<&TrainingJobState>, name: &str) -> String {
    match state {
        None => {
            "job has no state yet; the planner has not seen it (is the planner running?)".to_owned()
        }
        Some(state @ (TrainingJobState::Pending | TrainingJobState::Queued)) => format!(
            "job is {}; its workers start once the gpu-allocator admits it (`trainyard explain {name}` says why it waits)",
            state.as_str()
        ),
        Some(TrainingJobState::Suspended) => {
            format!("job is Suspended; `trainyard resume {name}` queues it again")
        }
        Some(state @ (TrainingJobState::Completed | TrainingJobState::Failed)) => format!(
            "job is {}; its worker pods have been removed (`trainyard describe tj {name}` shows how it ended)",
            state.as_str()
        ),
        Some(state) => format!(
            "job is {}; its worker pods are being created, try again in a moment",
            state.as_str()
        ),
    }
}

/// The workers to read: all of them, or the one of the asked rank.
pub fn chosen(
    workers: Vec<Worker>,
    options: &LogOptions,
    name: &str,
) -> Result<Vec<Worker>, CliError> {
    if options.all {
        return Ok(workers);
    }
    let ranks: Vec<String> = workers.iter().map(|w| w.rank.to_string()).collect();
    match workers.into_iter().find(|w| w.rank == options.rank) {
        Some(worker) => Ok(vec![worker]),
        None => Err(CliError::Usage(format!(
            "trainingjob {name:?} has no worker of rank {}: its workers have ranks {}",
            options.rank,
            ranks.join(", ")
        ))),
    }
}

fn log_params(worker: &Worker, options: &LogOptions) -> LogParams {
    LogParams {
        container: worker.container.clone(),
        follow: options.follow,
        tail_lines: options.tail.map(i64::from),
        since_seconds: options
            .since_seconds
            .map(|s| i64::try_from(s).unwrap_or(i64::MAX)),
        timestamps: options.timestamps,
        ..LogParams::default()
    }
}

/// Prints the logs of TrainingJob `name`'s workers to `out`.
pub async fn logs(
    client: Client,
    namespace: &str,
    name: &str,
    options: &LogOptions,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let jobs: Api<TrainingJob> = Api::namespaced(client.clone(), namespace);
    let job = jobs
        .get_opt(name)
        .await
        .map_err(CliError::kube(format!(
            "get trainingjob {name} in namespace {namespace}"
        )))?
        .ok_or_else(|| CliError::NotFound {
            resource: "trainingjobs".into(),
            name: name.to_owned(),
            scope: format!(" in namespace {namespace}"),
        })?;
    let pods: Api<Pod> = Api::namespaced(client, namespace);
    let selector = format!("{LABEL_JOB}={name}");
    let listed = pods
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(CliError::kube(format!(
            "list the worker pods of trainingjob {name} in namespace {namespace}"
        )))?;
    let workers = workers(&listed.items);
    if workers.is_empty() {
        let state = job.status.as_ref().and_then(|s| s.state.as_ref());
        return Err(CliError::NoWorkerPods {
            job: name.to_owned(),
            namespace: namespace.to_owned(),
            reason: no_pods_reason(state, name),
        });
    }
    let workers = chosen(workers, options, name)?;
    let action = |worker: &Worker| {
        format!(
            "read the log of pod {} (rank {} of trainingjob {name}) in namespace {namespace}",
            worker.pod, worker.rank
        )
    };
    let prefix = |worker: &Worker| {
        if options.all {
            format!("[rank {}] ", worker.rank)
        } else {
            String::new()
        }
    };
    if !options.follow {
        for worker in &workers {
            let text = pods
                .logs(&worker.pod, &log_params(worker, options))
                .await
                .map_err(CliError::kube(action(worker)))?;
            let prefix = prefix(worker);
            for line in text.lines() {
                writeln!(out, "{prefix}{line}")?;
            }
        }
        out.flush()?;
        return Ok(());
    }
    // Followed, the workers' lines interleave as they are written, each one whole.
    let mut streams = Vec::with_capacity(workers.len());
    for worker in &workers {
        let stream = pods
            .log_stream(&worker.pod, &log_params(worker, options))
            .await
            .map_err(CliError::kube(action(worker)))?;
        let prefix = prefix(worker);
        let failed = action(worker);
        streams.push(
            stream
                .lines()
                .map(move |line| match line {
                    Ok(line) => Ok(format!("{prefix}{line}")),
                    Err(error) => Err(CliError::Kube {
                        action: failed.clone(),
                        source: Box::new(kube::Error::ReadEvents(error)),
                    }),
                })
                .boxed(),
        );
    }
    let mut lines = futures::stream::select_all(streams);
    while let Some(line) = lines.try_next().await? {
        writeln!(out, "{line}")?;
        out.flush()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use k8s_openapi::jiff::Timestamp;

    fn pod(name: &str, rank: u32, attempt: u32, created: i64) -> Pod {
        let mut pod = Pod::default();
        pod.metadata.name = Some(name.into());
        pod.metadata.labels = Some(
            [
                (LABEL_JOB.to_owned(), "mnist".to_owned()),
                (LABEL_ATTEMPT.to_owned(), attempt.to_string()),
                (LABEL_WORKER_INDEX.to_owned(), rank.to_string()),
            ]
            .into(),
        );
        pod.metadata.creation_timestamp =
            Some(Time(Timestamp::from_second(created).expect("a time")));
        pod
    }

    fn names(workers: &[Worker]) -> Vec<(u32, &str)> {
        workers.iter().map(|w| (w.rank, w.pod.as_str())).collect()
    }

    #[test]
    fn the_latest_attempts_newest_pod_of_each_rank_is_read() {
        let pods = [
            pod("mnist-a0-1-x", 1, 0, 10),
            pod("mnist-a1-1-y", 1, 1, 20),
            pod("mnist-a1-0-z", 0, 1, 20),
            pod("mnist-a1-0-w", 0, 1, 30),
            pod("mnist-a0-0-v", 0, 0, 10),
        ];
        assert_eq!(
            names(&workers(&pods)),
            [(0, "mnist-a1-0-w"), (1, "mnist-a1-1-y")]
        );
        assert!(workers(&[]).is_empty());
    }

    #[test]
    fn a_rank_is_chosen_or_all_of_them() {
        let pods = [pod("w0", 0, 0, 1), pod("w1", 1, 0, 1)];
        let all = LogOptions {
            all: true,
            ..LogOptions::default()
        };
        assert_eq!(
            names(&chosen(workers(&pods), &all, "mnist").expect("all")),
            [(0, "w0"), (1, "w1")]
        );
        let one = LogOptions {
            rank: 1,
            ..LogOptions::default()
        };
        assert_eq!(
            names(&chosen(workers(&pods), &one, "mnist").expect("rank 1")),
            [(1, "w1")]
        );
        let missing = LogOptions {
            rank: 4,
            ..LogOptions::default()
        };
        let error = chosen(workers(&pods), &missing, "mnist").expect_err("no rank 4");
        assert_eq!(
            error.to_string(),
            "trainingjob \"mnist\" has no worker of rank 4: its workers have ranks 0, 1"
        );
        assert_eq!(error.exit_code(), 2);
    }

    #[test]
    fn no_pods_says_the_jobs_state_and_what_to_do() {
        let queued = no_pods_reason(Some(&TrainingJobState::Queued), "mnist");
        assert!(queued.starts_with("job is Queued; "), "{queued}");
        assert!(queued.contains("trainyard explain mnist"), "{queued}");
        let suspended = no_pods_reason(Some(&TrainingJobState::Suspended), "mnist");
        assert!(suspended.contains("trainyard resume mnist"), "{suspended}");
        let done = no_pods_reason(Some(&TrainingJobState::Completed), "mnist");
        assert!(done.starts_with("job is Completed; "), "{done}");
        assert!(no_pods_reason(None, "mnist").contains("planner"));
    }
}
