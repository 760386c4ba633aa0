//! What `get` shows for each kind: columns, cells, and whether an object is finished.

use std::fmt::Debug;

use k8s_openapi::jiff::Timestamp;
use kube::{Api, Client, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use trainyard_api::{
    StopPolicy, Sweep, SweepState, TrainingJob, TrainingJobState, TrainingJobStatus, TrainingQueue,
};

use crate::format::{NONE, age, number};

/// Which objects a command looks at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Scope {
    /// One namespace.
    Namespace(String),
    /// Every namespace (`-A`).
    AllNamespaces,
}

impl Scope {
    /// "in namespace ml" / "in any namespace", for messages.
    pub fn describe(&self) -> String {
        match self {
            Scope::Namespace(namespace) => format!("in namespace {namespace}"),
            Scope::AllNamespaces => "in any namespace".to_owned(),
        }
    }
}

/// How rows are laid out.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct View {
    /// Prefix a NAMESPACE column (`-A`).
    pub namespace_column: bool,
    /// Add the `-o wide` columns after AGE.
    pub wide: bool,
}

/// Cells of one row apart from AGE, which changes by itself as time passes and so is
/// left out when deciding whether a watched object's row changed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowCells {
    /// NAMESPACE (with -A), NAME and the kind's columns before AGE.
    pub before_age: Vec<String>,
    /// The `-o wide` columns.
    pub after_age: Vec<String>,
}

impl RowCells {
    /// The full row with AGE in its place.
    pub fn with_age(&self, age: String) -> Vec<String> {
        let mut row = self.before_age.clone();
        row.push(age);
        row.extend(self.after_age.iter().cloned());
        row
    }
}

/// A kind `get` can list and watch.
pub trait Listed:
    Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Serialize + Send + Sync + 'static
{
    /// Plural resource name, for messages ("trainingjobs").
    const PLURAL: &'static str;
    /// False for cluster-scoped kinds, whose scope flags are ignored.
    const NAMESPACED: bool;

    /// Headers of the columns between NAME and AGE.
    fn headers() -> &'static [&'static str];
    /// Headers of the `-o wide` columns.
    fn wide_headers() -> &'static [&'static str];
    /// Cells under [`Listed::headers`].
    fn cells(&self) -> Vec<String>;
    /// Cells under [`Listed::wide_headers`].
    fn wide_cells(&self) -> Vec<String>;
    /// True for kinds whose objects reach an end state (`--until-done` can wait for them).
    const ENDS: bool;

    /// True once the object reached an end state.
    fn finished(&self) -> bool;
    /// The state as shown in the STATE column, for messages.
    fn state_label(&self) -> String;
    /// The API for `scope`.
    fn api(client: Client, scope: &Scope) -> Api<Self>;
}

/// `<kind>.<group>/<name>`, what `-o name` prints (e.g.
/// `trainingjob.trainyard.dev/bert`).
pub fn qualified_name<K: Listed>(object: &K) -> String {
    format!(
        "{}.{}/{}",
        K::kind(&()).to_lowercase(),
        K::group(&()),
        object.name_any()
    )
}

/// Header row for `view`.
pub fn header_row<K: Listed>(view: View) -> Vec<String> {
    let mut header = Vec::new();
    if view.namespace_column {
        header.push("NAMESPACE".to_owned());
    }
    header.push("NAME".to_owned());
    header.extend(K::headers().iter().map(|h| (*h).to_owned()));
    header.push("AGE".to_owned());
    if view.wide {
        header.extend(K::wide_headers().iter().map(|h| (*h).to_owned()));
    }
    header
}

/// The row of one object without its AGE.
pub fn row_cells<K: Listed>(object: &K, view: View) -> RowCells {
    let mut before_age = Vec::new();
    if view.namespace_column {
        before_age.push(object.namespace().unwrap_or_else(|| NONE.to_owned()));
    }
    before_age.push(object.name_any());
    before_age.extend(object.cells());
    let after_age = if view.wide {
        object.wide_cells()
    } else {
        Vec::new()
    };
    RowCells {
        before_age,
        after_age,
    }
}

/// The full row of one object at time `now`.
pub fn row<K: Listed>(object: &K, view: View, now: Timestamp) -> Vec<String> {
    row_cells(object, view).with_age(age(object.meta().creation_timestamp.as_ref(), now))
}

fn or_none(value: Option<String>) -> String {
    value.unwrap_or_else(|| NONE.to_owned())
}

impl Listed for TrainingJob {
    const PLURAL: &'static str = "trainingjobs";
    const NAMESPACED: bool = true;
    const ENDS: bool = true;

    fn headers() -> &'static [&'static str] {
        &["STATE", "PROGRESS", "EPOCH", "GPUS", "QUEUE", "RESTARTS"]
    }

    fn wide_headers() -> &'static [&'static str] {
        &["MODEL", "FLAVOR", "NODES", "REASON"]
    }

    fn cells(&self) -> Vec<String> {
        let status = self.status.as_ref();
        let state = status.and_then(|s| s.state);
        let current = status.and_then(|s| s.current_epoch).unwrap_or(0);
        let total = status
            .and_then(|s| s.total_epochs)
            .unwrap_or_else(|| self.spec.epochs());
        vec![
            or_none(state.map(|s| s.to_string())),
            or_none(status.and_then(|s| s.progress.clone())),
            format!("{current}/{total}"),
            format!(
                "{} ({}x{})",
                self.spec.total_gpus(),
                self.spec.num_workers,
                self.spec.gpus_per_worker()
            ),
            queue_cell(self, state),
            status
                .and_then(|s| s.restart_count)
                .unwrap_or(0)
                .to_string(),
        ]
    }

    fn wide_cells(&self) -> Vec<String> {
        let status = self.status.as_ref();
        let resources = status.and_then(|s| s.resources.as_ref());
        let nodes = resources
            .map(|r| r.nodes.join(","))
            .filter(|nodes| !nodes.is_empty());
        let reason = status.and_then(|s| {
            s.failure_reason.clone().or_else(|| {
                trainyard_api::find_condition(&s.conditions, "Running")
                    .and_then(|c| c.reason.clone())
            })
        });
        vec![
            self.spec.model.clone(),
            or_none(resources.and_then(|r| r.flavor.clone())),
            or_none(nodes),
            or_none(reason),
        ]
    }

    /// Ended, or suspended: a suspended job goes on only when someone
    /// resumes it, so there is nothing to wait for.
    fn finished(&self) -> bool {
        self.status
            .as_ref()
            .and_then(|s| s.state)
            .is_some_and(|s| s.is_terminal() || s == TrainingJobState::Suspended)
    }

    fn state_label(&self) -> String {
        or_none(
            self.status
                .as_ref()
                .and_then(|s| s.state)
                .map(|s| s.to_string()),
        )
    }

    fn api(client: Client, scope: &Scope) -> Api<Self> {
        match scope {
            Scope::Namespace(namespace) => Api::namespaced(client, namespace),
            Scope::AllNamespaces => Api::all(client),
        }
    }
}

/// QUEUE: `<queue> #<position>` while the job waits and the planner told its place
/// (`status.queue`), `<queue> UNSCHEDULABLE` while no node could ever hold it (its
/// place in line would suggest waiting helps), the queue name alone while it waits
/// without a place, `-` once it is past the queue.
fn queue_cell(job: &TrainingJob, state: Option<TrainingJobState>) -> String {
    let waiting = matches!(
        state,
        Some(TrainingJobState::Pending | TrainingJobState::Queued)
    );
    if !waiting {
        return NONE.to_owned();
    }
    let status = job.status.as_ref();
    if status.and_then(TrainingJobStatus::unschedulable).is_some() {
        let queue = status
            .and_then(|s| s.queue.as_ref())
            .map_or_else(|| job.spec.queue_name(), |q| q.name.as_str());
        return format!("{queue} UNSCHEDULABLE");
    }
    match status.and_then(|s| s.queue.as_ref()) {
        Some(queue) => match queue.position {
            Some(position) => format!("{} #{position}", queue.name),
            None => queue.name.clone(),
        },
        None => job.spec.queue_name().to_owned(),
    }
}

impl Listed for Sweep {
    const PLURAL: &'static str = "sweeps";
    const NAMESPACED: bool = true;
    const ENDS: bool = true;

    fn headers() -> &'static [&'static str] {
        &["STATE", "TRIALS", "RUNNING", "FAILED", "OBJECTIVE", "BEST"]
    }

    fn wide_headers() -> &'static [&'static str] {
        &["ALGORITHM", "EARLY-STOPPING", "BEST-TRIAL"]
    }

    fn cells(&self) -> Vec<String> {
        let status = self.status.as_ref();
        let trials = status.and_then(|s| s.trials.clone()).unwrap_or_default();
        // Early-stopped trials are finished too: they count toward maxTrialCount.
        let finished = trials.succeeded + trials.failed + trials.early_stopped;
        vec![
            or_none(status.and_then(|s| s.state).map(|s| s.to_string())),
            format!("{finished}/{}", self.spec.max_trial_count),
            trials.running.to_string(),
            trials.failed.to_string(),
            format!(
                "{} {}",
                self.spec.objective.direction, self.spec.objective.metric
            ),
            or_none(
                status
                    .and_then(|s| s.best_trial.as_ref())
                    .map(|best| number(best.objective_value)),
            ),
        ]
    }

    fn wide_cells(&self) -> Vec<String> {
        vec![
            self.spec.algorithm_name().to_string(),
            self.spec.early_stopping_algorithm().to_string(),
            or_none(
                self.status
                    .as_ref()
                    .and_then(|s| s.best_trial.as_ref())
                    .map(|best| best.name.clone()),
            ),
        ]
    }

    fn finished(&self) -> bool {
        matches!(
            self.status.as_ref().and_then(|s| s.state),
            Some(SweepState::Completed | SweepState::Failed)
        )
    }

    fn state_label(&self) -> String {
        or_none(
            self.status
                .as_ref()
                .and_then(|s| s.state)
                .map(|s| s.to_string()),
        )
    }

    fn api(client: Client, scope: &Scope) -> Api<Self> {
        match scope {
            Scope::Namespace(namespace) => Api::namespaced(client, namespace),
            Scope::AllNamespaces => Api::all(client),
        }
    }
}

impl Listed for TrainingQueue {
    const PLURAL: &'static str = "trainingqueues";
    const NAMESPACED: bool = false;
    // Queues are standing configuration: they have no end state.
    const ENDS: bool = false;

    fn headers() -> &'static [&'static str] {
        &["COHORT", "PENDING", "ADMITTED", "GPUS-USED"]
    }

    fn wide_headers() -> &'static [&'static str] {
        &["FLAVORS", "NAMESPACES", "STOP", "BORROWED", "SHARE"]
    }

    fn cells(&self) -> Vec<String> {
        let status = self.status.clone().unwrap_or_default();
        let used: u32 = status.usage.iter().map(|u| u.used).sum();
        vec![
            or_none(self.spec.cohort.clone()),
            status.pending.to_string(),
            status.admitted.to_string(),
            format!("{used}/{}", self.spec.nominal_gpus()),
        ]
    }

    fn wide_cells(&self) -> Vec<String> {
        let flavors: Vec<String> = self
            .spec
            .flavors
            .iter()
            .map(|f| format!("{}:{}", f.name, f.nominal_quota))
            .collect();
        // No list admits every namespace.
        let namespaces = if self.spec.namespaces.is_empty() {
            "*".to_owned()
        } else {
            self.spec.namespaces.join(",")
        };
        let stop = self.spec.stop_policy.unwrap_or(StopPolicy::None);
        let status = self.status.clone().unwrap_or_default();
        let borrowed: u32 = status.usage.iter().map(|u| u.borrowed).sum();
        // Thousandths, as the status carries it: 0 while within nominal quota.
        let share = status.fair_sharing.map(|f| f.weighted_share.to_string());
        vec![
            flavors.join(","),
            namespaces,
            stop.to_string(),
            borrowed.to_string(),
            or_none(share),
        ]
    }

    fn finished(&self) -> bool {
        false
    }

    fn state_label(&self) -> String {
        NONE.to_owned()
    }

    fn api(client: Client, _scope: &Scope) -> Api<Self> {
        Api::all(client)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use trainyard_api::{
        AllocatedResources, BestTrial, Condition, ConditionStatus, QueueStatus, SweepStatus,
        TrainingJobSpec, TrainingJobStatus, TrialCounts,
    };

    pub(crate) fn job(name: &str, workers: u32, gpus: u32) -> TrainingJob {
        let mut job = TrainingJob::new(
            name,
            TrainingJobSpec {
                model: "resnet".into(),
                dataset: "imagenet".into(),
                num_workers: workers,
                gpus_per_worker: Some(gpus),
                ..TrainingJobSpec::default()
            },
        );
        job.metadata.namespace = Some("ml".into());
        job.metadata.creation_timestamp = Some(Time(Timestamp::from_second(1_000).expect("valid")));
        job
    }

    fn now() -> Timestamp {
        Timestamp::from_second(1_045).expect("valid")
    }

    #[test]
    fn a_queue_shows_whose_jobs_it_admits_and_whether_it_is_on_hold_when_wide() {
        let spec: trainyard_api::TrainingQueueSpec = serde_json::from_value(serde_json::json!({
            "cohort": "research",
            "flavors": [{"name": "a100", "nominalQuota": 8}],
        }))
        .expect("spec");
        let mut queue = TrainingQueue::new("team-a", spec);
        queue.metadata.creation_timestamp =
            Some(Time(Timestamp::from_second(1_000).expect("valid")));
        let wide = View {
            namespace_column: false,
            wide: true,
        };
        assert_eq!(
            row(&queue, wide, now()),
            [
                "team-a", "research", "0", "0", "0/8", "45s", "a100:8", "*", "None", "0", "-"
            ]
        );
        queue.spec.namespaces = vec!["research".into(), "research-dev".into()];
        queue.spec.stop_policy = Some(StopPolicy::Hold);
        assert_eq!(
            row(&queue, wide, now())[6..9],
            ["a100:8", "research,research-dev", "Hold"]
        );
        assert_eq!(
            header_row::<TrainingQueue>(wide)[6..],
            ["FLAVORS", "NAMESPACES", "STOP", "BORROWED", "SHARE"]
        );
    }

    #[test]
    fn a_new_job_shows_its_spec_and_dashes() {
        let row = row(&job("fresh", 2, 4), View::default(), now());
        assert_eq!(row, ["fresh", "-", "-", "0/10", "8 (2x4)", "-", "0", "45s"]);
        assert_eq!(row.len(), header_row::<TrainingJob>(View::default()).len());
    }

    #[test]
    fn a_waiting_job_shows_its_queue_position() {
        let mut waiting = job("w", 1, 1);
        waiting.status = Some(TrainingJobStatus {
            state: Some(TrainingJobState::Queued),
            queue: Some(QueueStatus {
                name: "team-a".into(),
                position: Some(4),
                reason: Some("8 of 8 GPUs in use".into()),
            }),
            ..TrainingJobStatus::default()
        });
        assert_eq!(waiting.cells()[4], "team-a #4");

        // No node could ever hold it: that, not a place in line.
        let mut stuck = waiting.clone();
        if let Some(status) = stuck.status.as_mut() {
            status.conditions.push(trainyard_api::Condition::new(
                trainyard_api::CONDITION_SCHEDULABLE,
                trainyard_api::ConditionStatus::False,
                "Unschedulable",
                "no node can hold a worker: spec.gpusPerWorker is 16 but the largest node \
                 (gpu-node-3) has 8 GPUs; lower gpusPerWorker to at most 8 and raise numWorkers",
            ));
        }
        assert_eq!(stuck.cells()[4], "team-a UNSCHEDULABLE");

        // Still queued but the planner has not ranked it: the queue it waits in.
        let mut unranked = waiting.clone();
        if let Some(queue) = unranked.status.as_mut().and_then(|s| s.queue.as_mut()) {
            queue.position = None;
        }
        assert_eq!(unranked.cells()[4], "team-a");
        let mut untold = waiting.clone();
        if let Some(status) = untold.status.as_mut() {
            status.queue = None;
        }
        assert_eq!(untold.cells()[4], "default");

        // Running: the stale waiting message is not shown.
        if let Some(status) = waiting.status.as_mut() {
            status.state = Some(TrainingJobState::Running);
        }
        assert_eq!(waiting.cells()[4], "-");
    }

    #[test]
    fn a_running_job_shows_progress_epochs_restarts_and_wide_columns() {
        let mut running = job("r", 2, 2);
        running.status = Some(TrainingJobStatus {
            state: Some(TrainingJobState::Running),
            progress: Some("40%".into()),
            current_epoch: Some(4),
            total_epochs: Some(10),
            restart_count: Some(1),
            resources: Some(AllocatedResources {
                gpus: 4,
                nodes: vec!["n1".into(), "n2".into()],
                flavor: Some("a100".into()),
                queue: Some("default".into()),
            }),
            conditions: vec![Condition::new(
                "Running",
                ConditionStatus::True,
                "Training",
                "epoch 4",
            )],
            ..TrainingJobStatus::default()
        });
        let view = View {
            namespace_column: true,
            wide: true,
        };
        assert_eq!(
            row(&running, view, now()),
            [
                "ml", "r", "Running", "40%", "4/10", "4 (2x2)", "-", "1", "45s", "resnet", "a100",
                "n1,n2", "Training"
            ]
        );
        assert_eq!(
            header_row::<TrainingJob>(view),
            [
                "NAMESPACE",
                "NAME",
                "STATE",
                "PROGRESS",
                "EPOCH",
                "GPUS",
                "QUEUE",
                "RESTARTS",
                "AGE",
                "MODEL",
                "FLAVOR",
                "NODES",
                "REASON"
            ]
        );
        assert!(!running.finished());
        assert_eq!(running.state_label(), "Running");
    }

    #[test]
    fn terminal_and_suspended_states_finish_a_job() {
        for (state, done) in [
            (TrainingJobState::Completed, true),
            (TrainingJobState::Failed, true),
            (TrainingJobState::Suspended, true),
            (TrainingJobState::Queued, false),
        ] {
            let mut j = job("j", 1, 1);
            j.status = Some(TrainingJobStatus {
                state: Some(state),
                failure_reason: done.then(|| "BackoffLimitExceeded".to_owned()),
                ..TrainingJobStatus::default()
            });
            assert_eq!(j.finished(), done, "{state}");
        }
        assert!(!job("j", 1, 1).finished());
        assert_eq!(job("j", 1, 1).state_label(), "-");
    }

    fn sweep() -> Sweep {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/sweep.yaml"
        ))
        .expect("example exists");
        yaml_serde::from_str(&text).expect("example parses")
    }

    #[test]
    fn sweeps_show_trials_and_the_best_value() {
        let mut sweep = sweep();
        assert_eq!(
            sweep.cells(),
            ["-", "0/32", "0", "0", "minimize validation_loss", "-"]
        );
        sweep.status = Some(SweepStatus {
            state: Some(SweepState::Running),
            trials: Some(TrialCounts {
                pending: 1,
                running: 4,
                succeeded: 10,
                failed: 1,
                early_stopped: 6,
            }),
            best_trial: Some(BestTrial {
                name: "bert-finetune-sweep-7".into(),
                parameters: Default::default(),
                objective_value: 0.23100001,
            }),
            ..SweepStatus::default()
        });
        assert_eq!(
            sweep.cells(),
            [
                "Running",
                "17/32",
                "4",
                "1",
                "minimize validation_loss",
                "0.231"
            ]
        );
        assert_eq!(sweep.wide_cells(), ["tpe", "asha", "bert-finetune-sweep-7"]);
        assert!(!sweep.finished());
        if let Some(status) = sweep.status.as_mut() {
            status.state = Some(SweepState::Completed);
        }
        assert!(sweep.finished());
        assert_eq!(sweep.state_label(), "Completed");
    }

    #[test]
    fn queues_show_usage_against_quota_and_never_finish() {
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../examples/trainingqueue-default.yaml"
        ))
        .expect("example exists");
        let mut queue: TrainingQueue = yaml_serde::from_str(&text).expect("example parses");
        assert_eq!(queue.cells(), ["research", "0", "0", "0/24"]);
        queue.status = Some(trainyard_api::TrainingQueueStatus {
            pending: 2,
            admitted: 3,
            usage: vec![trainyard_api::FlavorUsage {
                name: "a100-80gb".into(),
                used: 12,
                borrowed: 2,
                ..Default::default()
            }],
            fair_sharing: Some(trainyard_api::FairSharingStatus {
                weighted_share: 125,
            }),
            ..Default::default()
        });
        assert_eq!(queue.cells(), ["research", "2", "3", "12/24"]);
        assert_eq!(
            queue.wide_cells(),
            ["a100-80gb:16,t4-spot:8", "*", "None", "2", "125"]
        );
        assert!(!queue.finished());
        const { assert!(!TrainingQueue::ENDS && TrainingJob::ENDS && Sweep::ENDS) };
        assert_eq!(queue.state_label(), "-");
    }

    #[test]
    fn scopes_describe_themselves() {
        assert_eq!(Scope::Namespace("ml".into()).describe(), "in namespace ml");
        assert_eq!(Scope::AllNamespaces.describe(), "in any namespace");
    }
}
