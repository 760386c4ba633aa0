//! `TrainingQueue`: cluster-scoped GPU quotas, cohorts and fair sharing.

use std::cmp::Ordering;
use std::collections::BTreeMap;

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::condition::Condition;
use crate::pod_policy::{MAX_POD_POLICY_ENTRIES, PodPolicy};
use crate::validation::{
    DNS_LABEL_PATTERN, FieldError, FieldErrors, MAX_DNS_LABEL_LENGTH, decode_at,
};
use crate::wire_enum::wire_enum;

/// Most flavors one queue may list.
pub const MAX_FLAVORS: usize = 16;
/// Most MIG profiles one flavor may list.
pub const MAX_MIG_PROFILES: usize = 8;
/// Most namespaces one queue may list.
pub const MAX_QUEUE_NAMESPACES: usize = 64;
/// Longest MIG profile name, e.g. `1g.10gb+me`.
pub const MAX_MIG_PROFILE_LENGTH: usize = 32;
/// A MIG profile as the device plugin names it: `<compute>g.<memory>gb`, optionally `+me`.
pub const MIG_PROFILE_PATTERN: &str = r"^[0-9]+g\.[0-9]+gb(\+me)?$";
/// Fair-share weight when `fairShare.weight` is unset.
pub const DEFAULT_FAIR_SHARE_WEIGHT: f64 = 1.0;
/// Priority of jobs without a PriorityClass when `priority.defaultPriority` is unset.
pub const DEFAULT_PRIORITY: i32 = 0;
/// Priority gained per aging period when `priority.agingStep` is unset.
pub const DEFAULT_AGING_STEP: i32 = 1;

const RULE_BORROWING_NEEDS_COHORT: &str = "has(self.cohort) || self.flavors.all(f, !has(f.borrowingLimit) && (!has(f.migQuotas) || f.migQuotas.all(m, !has(m.borrowingLimit))))";
const MSG_BORROWING_NEEDS_COHORT: &str = "flavors[].borrowingLimit and flavors[].migQuotas[].borrowingLimit need a cohort: queues borrow only from other queues in their cohort";
const RULE_LENDING_NEEDS_COHORT: &str = "has(self.cohort) || self.flavors.all(f, !has(f.lendingLimit) && (!has(f.migQuotas) || f.migQuotas.all(m, !has(m.lendingLimit))))";
const MSG_LENDING_NEEDS_COHORT: &str = "flavors[].lendingLimit and flavors[].migQuotas[].lendingLimit need a cohort: queues lend only to other queues in their cohort";
const RULE_LENDING_WITHIN_QUOTA: &str =
    "!has(self.lendingLimit) || self.lendingLimit <= self.nominalQuota";
const MSG_LENDING_WITHIN_QUOTA: &str =
    "lendingLimit cannot exceed nominalQuota: a queue can only lend GPUs it has";
const MSG_MIG_LENDING_WITHIN_QUOTA: &str =
    "lendingLimit cannot exceed nominalQuota: a queue can only lend MIG slices it has";

wire_enum! {
    /// Preemption inside the queue: Never, or LowerPriority (a pending job may evict
    /// admitted jobs of lower priority in the same queue).
    pub enum WithinQueuePreemption {
        Never => "Never",
        LowerPriority => "LowerPriority",
    }
}

wire_enum! {
    /// Whether the queue admits jobs: None (it does), Hold (it admits none;
    /// admitted jobs run on, waiting jobs keep their place in line) or
    /// HoldAndDrain (as Hold, and its admitted jobs are told to checkpoint
    /// and stopped after the grace period, then wait in line).
    pub enum StopPolicy {
        None => "None",
        Hold => "Hold",
        HoldAndDrain => "HoldAndDrain",
    }
}

wire_enum! {
    /// Reclaiming lent GPUs from other queues of the cohort: Never, LowerPriority (only
    /// from borrowing jobs of lower priority) or Any (from any borrowing job; and while
    /// the queue borrows itself, from queues whose weighted share stays above its own).
    pub enum ReclaimWithinCohort {
        Never => "Never",
        LowerPriority => "LowerPriority",
        Any => "Any",
    }
}

/// Desired state of a TrainingQueue: the GPUs it guarantees per flavor, whom it shares
/// them with, and how jobs in it are ordered and preempted.
// Every printcolumn repeats keys such as `type_`, which clippy mistakes for duplicated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[kube(
    group = "trainyard.dev",
    version = "v1",
    kind = "TrainingQueue",
    status = "TrainingQueueStatus",
    derive = "PartialEq",
    derive = "Default",
    shortname = "tq",
    category = "trainyard",
    doc = "A cluster-wide GPU quota that admits TrainingJobs: nominal GPUs per flavor, borrowing and lending within a cohort, fair-share weight, preemption and priority aging.",
    printcolumn(
        name = "Cohort",
        type_ = "string",
        json_path = ".spec.cohort",
        description = "Cohort the queue shares GPUs with"
    ),
    printcolumn(
        name = "Pending",
        type_ = "integer",
        json_path = ".status.pending",
        description = "Jobs waiting for admission"
    ),
    printcolumn(
        name = "Admitted",
        type_ = "integer",
        json_path = ".status.admitted",
        description = "Jobs admitted"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new(RULE_BORROWING_NEEDS_COHORT).message(MSG_BORROWING_NEEDS_COHORT).field_path(".flavors").reason(Reason::FieldValueForbidden),
    validation = Rule::new(RULE_LENDING_NEEDS_COHORT).message(MSG_LENDING_NEEDS_COHORT).field_path(".flavors").reason(Reason::FieldValueForbidden),
)]
pub struct TrainingQueueSpec {
    /// Cohort name: queues in the same cohort lend unused GPUs to each other. Unset means the queue only uses its own quota.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = MAX_DNS_LABEL_LENGTH), pattern(DNS_LABEL_PATTERN))]
    pub cohort: Option<String>,

    /// GPU quota per flavor (a kind of GPU node), 1 to 16 with unique names. A job is admitted from the first flavor with room for all of its GPUs.
    #[schemars(length(min = 1, max = MAX_FLAVORS))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub flavors: Vec<FlavorQuota>,

    /// Share of the cohort's idle GPUs this queue gets when several queues want to borrow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fair_share: Option<FairShare>,

    /// Who may preempt whom. Default: no preemption.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemption: Option<PreemptionPolicy>,

    /// Priority of jobs without a PriorityClass and aging of pending jobs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<QueuePriorityPolicy>,

    /// Namespaces whose TrainingJobs the queue admits, at most 64 unique names, so one team cannot spend another's quota. Unset or empty means every namespace. A job from another namespace waits, its Admitted condition naming the queue and the namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_QUEUE_NAMESPACES), inner(length(min = 1, max = MAX_DNS_LABEL_LENGTH), pattern(DNS_LABEL_PATTERN)))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub namespaces: Vec<String>,

    /// None admits jobs; Hold admits none until it is set back, e.g. during maintenance: admitted jobs run on, waiting jobs keep their place in line and say the queue is on hold, and its unused quota is still lent to its cohort. HoldAndDrain holds the queue and also stops its admitted jobs: each is told to checkpoint, stopped after the gpu-allocator's grace period (or once its checkpoint is reported), and waits in line to resume from it. Default None.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_policy: Option<StopPolicy>,

    /// Spending limit of the queue's jobs per period. Unset: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<QueueBudget>,

    /// What happens to jobs whose GPUs sit idle. Unset: idle jobs are alerted on, never suspended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_policy: Option<IdlePolicy>,

    /// What the queue's jobs may put into their worker pods beyond the safe defaults: volume types that reach the node or its network (hostPath, nfs, ...), PriorityClasses, extended resources, pod security settings beyond the Pod Security Standards' baseline. A job asking for more waits unadmitted, its Admitted condition (reason PodPolicyRefused) naming the field and the fix, and no Job is created for it. Unset: only configMap, csi, downwardAPI, emptyDir, ephemeral, persistentVolumeClaim, projected and secret volumes, any PriorityClass, no extended resource besides the job's GPUs, baseline pod security.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_policy: Option<PodPolicy>,
}

wire_enum! {
    /// Calendar period of a budget, in UTC: Daily, Weekly (from Monday) or Monthly (from the 1st).
    pub enum BudgetPeriod {
        Daily => "Daily",
        Weekly => "Weekly",
        Monthly => "Monthly",
    }
}

wire_enum! {
    /// What happens when a budget is spent: Hold (no new admissions; running jobs go on) or
    /// SuspendWithCheckpoint (running jobs are also checkpointed and suspended).
    pub enum BudgetAction {
        Hold => "Hold",
        SuspendWithCheckpoint => "SuspendWithCheckpoint",
    }
}

wire_enum! {
    /// What happens to an idle job: Alert (its owner is told) or AlertThenSuspend (also
    /// checkpointed and suspended after suspendAfterSeconds; never killed).
    pub enum IdleAction {
        Alert => "Alert",
        AlertThenSuspend => "AlertThenSuspend",
    }
}

/// Idle threshold when `idlePolicy.thresholdPercent` is unset.
pub const DEFAULT_IDLE_THRESHOLD_PERCENT: u32 = 5;
/// Resume threshold when `idlePolicy.resumeThresholdPercent` is unset.
pub const DEFAULT_IDLE_RESUME_PERCENT: u32 = 15;
/// Idle window when `idlePolicy.windowSeconds` is unset.
pub const DEFAULT_IDLE_WINDOW_SECONDS: u64 = 1800;
/// Grace from alert to suspension when `idlePolicy.suspendAfterSeconds` is unset.
pub const DEFAULT_IDLE_SUSPEND_AFTER_SECONDS: u64 = 600;

/// Default warning thresholds of a budget, in percent.
pub const DEFAULT_BUDGET_THRESHOLDS: [u32; 3] = [50, 80, 100];

/// A spending limit per period.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueBudget {
    /// Amount per period in the price catalog's currency, at least 0.01.
    #[schemars(range(min = 0.01))]
    pub amount: f64,

    /// Daily, Weekly or Monthly (UTC). Required.
    pub period: BudgetPeriod,

    /// Percentages of the amount that raise an alert, 1 to 1000 each. Default 50, 80, 100.
    #[serde(default = "default_budget_thresholds")]
    #[schemars(length(max = 10), inner(range(min = 1, max = 1000)))]
    pub thresholds_percent: Vec<u32>,

    /// Hold or SuspendWithCheckpoint. Default Hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<BudgetAction>,
}

fn default_budget_thresholds() -> Vec<u32> {
    DEFAULT_BUDGET_THRESHOLDS.to_vec()
}

/// Idle GPU detection for the queue's jobs.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct IdlePolicy {
    /// GPU utilisation below which a job is idle, 0 to 99 percent. Default 5.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 99))]
    pub threshold_percent: Option<u32>,

    /// Utilisation above which an idle job is busy again, at least thresholdPercent. Default 15.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 100))]
    pub resume_threshold_percent: Option<u32>,

    /// Seconds below the threshold before a job is idle, at least 60. Default 1800.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 60))]
    pub window_seconds: Option<u64>,

    /// Alert or AlertThenSuspend. Default Alert.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<IdleAction>,

    /// Seconds from the alert to the checkpoint and suspension (AlertThenSuspend). Default 600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suspend_after_seconds: Option<u64>,
}

/// GPU quota of one flavor.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new(RULE_LENDING_WITHIN_QUOTA).message(MSG_LENDING_WITHIN_QUOTA).field_path(".lendingLimit")
)]
pub struct FlavorQuota {
    /// Flavor name, e.g. a100-80gb or t4-spot.
    #[schemars(length(min = 1, max = MAX_DNS_LABEL_LENGTH), pattern(DNS_LABEL_PATTERN))]
    pub name: String,

    /// GPUs of this flavor guaranteed to the queue.
    #[schemars(range(min = 0))]
    pub nominal_quota: u32,

    /// Most GPUs the queue may borrow from its cohort beyond nominalQuota; needs a cohort. Default: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub borrowing_limit: Option<u32>,

    /// Most of its nominalQuota GPUs the queue lends to its cohort, at most nominalQuota; needs a cohort. Default: all unused GPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub lending_limit: Option<u32>,

    /// Node labels that identify nodes of this flavor, e.g. nvidia.com/gpu.product: A100-SXM4-80GB. Workers admitted from this flavor get them as node selector.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_labels: BTreeMap<String, String>,

    /// MIG slices of this flavor guaranteed to the queue, per profile (nvidia.com/mig-<profile>), at most 8 with unique profiles. nominalQuota counts whole GPUs only; a job with a migProfile is admitted against the quota of its profile. Default: none, so MIG jobs cannot use this flavor.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = MAX_MIG_PROFILES))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["profile"]))]
    pub mig_quotas: Vec<MigQuota>,
}

/// Quota of one MIG profile in one flavor, counted in slices.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(
    validation = Rule::new(RULE_LENDING_WITHIN_QUOTA).message(MSG_MIG_LENDING_WITHIN_QUOTA).field_path(".lendingLimit")
)]
pub struct MigQuota {
    /// MIG profile as in the resource name nvidia.com/mig-<profile>, e.g. 1g.10gb or 3g.40gb.
    #[schemars(length(min = 1, max = MAX_MIG_PROFILE_LENGTH), pattern(MIG_PROFILE_PATTERN))]
    pub profile: String,

    /// Slices of this profile guaranteed to the queue.
    #[schemars(range(min = 0))]
    pub nominal_quota: u32,

    /// Most slices the queue may borrow from its cohort beyond nominalQuota; needs a cohort. Default: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub borrowing_limit: Option<u32>,

    /// Most of its nominalQuota slices the queue lends to its cohort, at most nominalQuota; needs a cohort. Default: all unused slices.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub lending_limit: Option<u32>,
}

/// Whether `value` is a MIG profile name (`MIG_PROFILE_PATTERN`): `<digits>g.<digits>gb`,
/// optionally followed by `+me`.
fn is_mig_profile(value: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let base = value.strip_suffix("+me").unwrap_or(value);
    base.split_once("g.")
        .and_then(|(compute, rest)| Some((compute, rest.strip_suffix("gb")?)))
        .is_some_and(|(compute, memory)| digits(compute) && digits(memory))
}

/// Fair sharing of borrowed GPUs.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FairShare {
    /// Relative weight, 0 or more: a queue with weight 2 gets twice the borrowed GPUs of a queue with weight 1. Default 1.
    #[serde(
        default = "default_fair_share_weight",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 0.0))]
    pub weight: Option<f64>,
}

fn default_fair_share_weight() -> Option<f64> {
    Some(DEFAULT_FAIR_SHARE_WEIGHT)
}

/// Preemption policy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PreemptionPolicy {
    /// Never or LowerPriority. Default Never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub within_queue: Option<WithinQueuePreemption>,

    /// Never, LowerPriority (reclaim lent GPUs only from borrowing jobs of lower
    /// priority) or Any (from any borrowing job; and while this queue borrows itself,
    /// preempt borrowers whose queues keep a larger weighted share: fair share).
    /// Default Never.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reclaim_within_cohort: Option<ReclaimWithinCohort>,
}

/// Priority settings of a queue.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueuePriorityPolicy {
    /// Priority of jobs without scheduling.priority. Default 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_priority: Option<i32>,

    /// Seconds a job waits in the queue before its effective priority rises by agingStep, at least 1; it keeps rising every agingSeconds (up to the gpu-allocator's configured ceiling) so no job starves. Default: the gpu-allocator's cluster-wide aging (one step per 600 s unless configured otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub aging_seconds: Option<u32>,

    /// Priority gained per agingSeconds waited, at least 1. Default 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub aging_step: Option<i32>,
}

/// Observed state of a TrainingQueue, written by the planner from the gpu-allocator's reports.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TrainingQueueStatus {
    /// Jobs waiting for admission.
    #[serde(default)]
    pub pending: u32,

    /// Jobs admitted and holding GPUs.
    #[serde(default)]
    pub admitted: u32,

    /// GPUs in use per flavor.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub usage: Vec<FlavorUsage>,

    /// The queue's weighted share of its cohort, as fair sharing orders queues.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fair_sharing: Option<FairSharingStatus>,

    /// Spend in the current budget period, written from the cost-optimizer's reports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetStatus>,

    /// Conditions: Active is True while the queue admits jobs, False with reason Stopped while its stopPolicy is Hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// metadata.generation this status was computed from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// Spend of a queue in its current budget period.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BudgetStatus {
    /// Start of the current period, RFC 3339.
    pub period_start: String,
    /// Spent so far in the period.
    pub spent: f64,
    /// The budget's amount.
    pub amount: f64,
    /// Currency of the price catalog, e.g. USD.
    pub currency: String,
    /// Open, Held or Suspended.
    pub state: String,
    /// Warning thresholds (percent of the amount) the spend has reached this period.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub thresholds_crossed: Vec<u32>,
    /// What the state means for the queue's jobs, and how to lift a hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// GPUs in use of one flavor.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FlavorUsage {
    /// Flavor name.
    pub name: String,
    /// GPUs used by admitted jobs, including borrowed ones.
    #[serde(default)]
    pub used: u32,
    /// GPUs of those borrowed from the cohort.
    #[serde(default)]
    pub borrowed: u32,
    /// MIG slices in use per profile.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["profile"]))]
    pub mig_slices: Vec<MigUsage>,
}

/// MIG slices in use of one profile.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct MigUsage {
    /// MIG profile, e.g. 1g.10gb.
    pub profile: String,
    /// Slices used by admitted jobs, including borrowed ones.
    #[serde(default)]
    pub used: u32,
    /// Slices of those borrowed from the cohort.
    #[serde(default)]
    pub borrowed: u32,
}

/// Where the queue stands in its cohort's fair sharing.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FairSharingStatus {
    /// Thousandths of the largest fraction of a cohort's lendable GPUs the queue borrows, divided by its weight: 0 while it stays within its nominal quota. When several queues want idle GPUs, the one with the smallest share gets them first.
    pub weighted_share: u64,
}

/// Condition type of a TrainingQueue: whether it admits jobs.
pub const QUEUE_ACTIVE: &str = "Active";

impl TrainingQueueSpec {
    /// Decodes a spec from JSON and validates it.
    pub fn from_json(value: serde_json::Value) -> Result<Self, Vec<FieldError>> {
        let spec: Self = decode_at(value, "spec")?;
        spec.validate()?;
        Ok(spec)
    }

    /// Checks every schema and CEL rule of the CRD.
    pub fn validate(&self) -> Result<(), Vec<FieldError>> {
        let mut errors = FieldErrors::default();
        if let Some(cohort) = &self.cohort {
            errors.dns_label("spec.cohort", cohort);
        }
        errors.items(
            "spec.namespaces",
            self.namespaces.len(),
            0,
            MAX_QUEUE_NAMESPACES,
        );
        for (index, namespace) in self.namespaces.iter().enumerate() {
            let path = format!("spec.namespaces[{index}]");
            errors.dns_label(&path, namespace);
            if self.namespaces[..index].contains(namespace) {
                errors.invalid(
                    path,
                    format!("duplicate namespace {namespace:?}: list every namespace once"),
                );
            }
        }
        errors.items("spec.flavors", self.flavors.len(), 1, MAX_FLAVORS);
        for (index, flavor) in self.flavors.iter().enumerate() {
            let path = format!("spec.flavors[{index}]");
            errors.dns_label(&format!("{path}.name"), &flavor.name);
            if self.flavors[..index]
                .iter()
                .any(|earlier| earlier.name == flavor.name)
            {
                errors.invalid(
                    format!("{path}.name"),
                    format!("duplicate flavor {:?}: list every flavor once", flavor.name),
                );
            }
            if let Some(lending) = flavor.lending_limit
                && lending > flavor.nominal_quota
            {
                errors.invalid(format!("{path}.lendingLimit"), MSG_LENDING_WITHIN_QUOTA);
            }
            if self.cohort.is_none() && flavor.borrowing_limit.is_some() {
                errors.forbidden(format!("{path}.borrowingLimit"), MSG_BORROWING_NEEDS_COHORT);
            }
            if self.cohort.is_none() && flavor.lending_limit.is_some() {
                errors.forbidden(format!("{path}.lendingLimit"), MSG_LENDING_NEEDS_COHORT);
            }
            errors.items(
                &format!("{path}.migQuotas"),
                flavor.mig_quotas.len(),
                0,
                MAX_MIG_PROFILES,
            );
            for (slot, mig) in flavor.mig_quotas.iter().enumerate() {
                let mig_path = format!("{path}.migQuotas[{slot}]");
                errors.length(
                    &format!("{mig_path}.profile"),
                    &mig.profile,
                    1,
                    MAX_MIG_PROFILE_LENGTH,
                );
                if !is_mig_profile(&mig.profile) {
                    errors.invalid(
                        format!("{mig_path}.profile"),
                        format!(
                            "{:?} is not a MIG profile such as 1g.10gb (pattern {MIG_PROFILE_PATTERN})",
                            mig.profile
                        ),
                    );
                }
                if flavor.mig_quotas[..slot]
                    .iter()
                    .any(|earlier| earlier.profile == mig.profile)
                {
                    errors.invalid(
                        format!("{mig_path}.profile"),
                        format!(
                            "duplicate MIG profile {:?}: list every profile once",
                            mig.profile
                        ),
                    );
                }
                if let Some(lending) = mig.lending_limit
                    && lending > mig.nominal_quota
                {
                    errors.invalid(
                        format!("{mig_path}.lendingLimit"),
                        MSG_MIG_LENDING_WITHIN_QUOTA,
                    );
                }
                if self.cohort.is_none() && mig.borrowing_limit.is_some() {
                    errors.forbidden(
                        format!("{mig_path}.borrowingLimit"),
                        MSG_BORROWING_NEEDS_COHORT,
                    );
                }
                if self.cohort.is_none() && mig.lending_limit.is_some() {
                    errors.forbidden(format!("{mig_path}.lendingLimit"), MSG_LENDING_NEEDS_COHORT);
                }
            }
        }
        if let Some(weight) = self.fair_share.as_ref().and_then(|f| f.weight) {
            // NaN compares as None and is rejected too.
            if matches!(weight.partial_cmp(&0.0), None | Some(Ordering::Less)) {
                errors.invalid(
                    "spec.fairShare.weight",
                    format!("must be 0 or more, got {weight}"),
                );
            }
        }
        if let Some(budget) = &self.budget {
            if !(budget.amount.is_finite() && budget.amount >= 0.01) {
                errors.invalid(
                    "spec.budget.amount",
                    format!("must be at least 0.01, got {}", budget.amount),
                );
            }
            for (i, percent) in budget.thresholds_percent.iter().enumerate() {
                errors.in_range(
                    &format!("spec.budget.thresholdsPercent[{i}]"),
                    *percent,
                    1,
                    1000,
                );
            }
        }
        if let Some(idle) = &self.idle_policy {
            let threshold = idle
                .threshold_percent
                .unwrap_or(DEFAULT_IDLE_THRESHOLD_PERCENT);
            errors.in_range("spec.idlePolicy.thresholdPercent", threshold, 0, 99);
            if let Some(resume) = idle.resume_threshold_percent {
                errors.in_range(
                    "spec.idlePolicy.resumeThresholdPercent",
                    resume,
                    threshold,
                    100,
                );
            }
            if let Some(window) = idle.window_seconds {
                errors.at_least("spec.idlePolicy.windowSeconds", window, 60);
            }
        }
        if let Some(priority) = &self.priority {
            if let Some(seconds) = priority.aging_seconds {
                errors.at_least("spec.priority.agingSeconds", seconds, 1);
            }
            if let Some(step) = priority.aging_step {
                errors.at_least("spec.priority.agingStep", step, 1);
            }
        }
        if let Some(policy) = &self.pod_policy {
            policy_errors(policy, &mut errors);
        }
        errors.into_result()
    }

    /// Fair-share weight, defaulting to 1.
    pub fn fair_share_weight(&self) -> f64 {
        self.fair_share
            .as_ref()
            .and_then(|f| f.weight)
            .unwrap_or(DEFAULT_FAIR_SHARE_WEIGHT)
    }

    /// Preemption inside the queue, defaulting to Never.
    pub fn within_queue_preemption(&self) -> WithinQueuePreemption {
        self.preemption
            .as_ref()
            .and_then(|p| p.within_queue)
            .unwrap_or(WithinQueuePreemption::Never)
    }

    /// Whether the queue is on hold (`stopPolicy: Hold`).
    pub fn on_hold(&self) -> bool {
        matches!(
            self.stop_policy,
            Some(StopPolicy::Hold | StopPolicy::HoldAndDrain)
        )
    }

    /// Whether the queue also stops its admitted jobs (`stopPolicy: HoldAndDrain`).
    pub fn drains(&self) -> bool {
        self.stop_policy == Some(StopPolicy::HoldAndDrain)
    }

    /// Reclaiming from the cohort, defaulting to Never.
    pub fn reclaim_within_cohort(&self) -> ReclaimWithinCohort {
        self.preemption
            .as_ref()
            .and_then(|p| p.reclaim_within_cohort)
            .unwrap_or(ReclaimWithinCohort::Never)
    }

    /// Priority of jobs without a PriorityClass, defaulting to 0.
    pub fn default_priority(&self) -> i32 {
        self.priority
            .as_ref()
            .and_then(|p| p.default_priority)
            .unwrap_or(DEFAULT_PRIORITY)
    }

    /// Effective priority of a job with `base_priority` after waiting `waited_seconds`
    /// under this queue's own aging: one agingStep per full agingSeconds, saturating
    /// instead of overflowing (without agingSeconds the queue sets no aging of its own).
    pub fn aged_priority(&self, base_priority: i32, waited_seconds: u64) -> i32 {
        let Some(policy) = &self.priority else {
            return base_priority;
        };
        let Some(aging_seconds) = policy.aging_seconds.filter(|s| *s > 0) else {
            return base_priority;
        };
        let steps = waited_seconds / u64::from(aging_seconds);
        let step = i64::from(policy.aging_step.unwrap_or(DEFAULT_AGING_STEP));
        let boost = i64::try_from(steps)
            .unwrap_or(i64::MAX)
            .saturating_mul(step);
        let aged = i64::from(base_priority).saturating_add(boost);
        i32::try_from(aged).unwrap_or(if aged > 0 { i32::MAX } else { i32::MIN })
    }

    /// GPUs of all flavors guaranteed to the queue.
    pub fn nominal_gpus(&self) -> u32 {
        self.flavors.iter().fold(0u32, |total, flavor| {
            total.saturating_add(flavor.nominal_quota)
        })
    }
}

/// Checks `spec.podPolicy` as the schema does: list sizes, entry lengths,
/// volume types spelled as a pod's volume field, no entry twice.
fn policy_errors(policy: &PodPolicy, errors: &mut FieldErrors) {
    let lists: [(&str, &[String], usize); 3] = [
        ("allowedVolumeTypes", &policy.allowed_volume_types, 63),
        (
            "allowedPriorityClasses",
            policy
                .allowed_priority_classes
                .as_deref()
                .unwrap_or_default(),
            253,
        ),
        (
            "allowedExtendedResources",
            &policy.allowed_extended_resources,
            253,
        ),
    ];
    for (name, entries, max_length) in lists {
        let path = format!("spec.podPolicy.{name}");
        errors.items(&path, entries.len(), 0, MAX_POD_POLICY_ENTRIES);
        for (index, entry) in entries.iter().enumerate() {
            let entry_path = format!("{path}[{index}]");
            errors.length(&entry_path, entry, 1, max_length);
            if entries[..index].contains(entry) {
                errors.invalid(&entry_path, format!("duplicate {entry:?}: list it once"));
            }
        }
    }
    for (index, volume_type) in policy.allowed_volume_types.iter().enumerate() {
        let well_formed = volume_type.starts_with(|c: char| c.is_ascii_lowercase())
            && volume_type.chars().all(|c| c.is_ascii_alphabetic());
        if !well_formed {
            errors.invalid(
                format!("spec.podPolicy.allowedVolumeTypes[{index}]"),
                format!(
                    "{volume_type:?} is not a volume type: name it as its field in a pod's volumes, e.g. hostPath or nfs"
                ),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn queue_with_aging(aging_seconds: Option<u32>, aging_step: Option<i32>) -> TrainingQueueSpec {
        TrainingQueueSpec {
            cohort: None,
            flavors: vec![FlavorQuota {
                name: "a100".into(),
                nominal_quota: 8,
                borrowing_limit: None,
                lending_limit: None,
                node_labels: BTreeMap::new(),
                mig_quotas: Vec::new(),
            }],
            fair_share: None,
            preemption: None,
            priority: Some(QueuePriorityPolicy {
                default_priority: None,
                aging_seconds,
                aging_step,
            }),
            namespaces: Vec::new(),
            stop_policy: None,
            budget: None,
            idle_policy: None,
            pod_policy: None,
        }
    }

    #[test]
    fn namespaces_are_dns_labels_listed_once() {
        let mut queue = queue_with_aging(None, None);
        queue.namespaces = vec!["team-a".into(), "team-a-dev".into()];
        assert!(queue.validate().is_ok());
        queue.namespaces = vec![
            "team-a".into(),
            "Team_B".into(),
            "team-a".into(),
            String::new(),
        ];
        let errors = queue.validate().expect_err("bad names");
        let paths: Vec<&str> = errors.iter().map(|e| e.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "spec.namespaces[1]",
                "spec.namespaces[2]",
                "spec.namespaces[3]"
            ]
        );
        assert!(
            errors[1].to_string().contains("list every namespace once"),
            "{}",
            errors[1]
        );
        queue.namespaces = (0..=MAX_QUEUE_NAMESPACES)
            .map(|i| format!("ns-{i}"))
            .collect();
        let errors = queue.validate().expect_err("too many");
        assert_eq!(errors[0].path, "spec.namespaces");
    }

    #[test]
    fn aging_adds_one_step_per_full_period() {
        let queue = queue_with_aging(Some(600), None);
        assert_eq!(queue.aged_priority(100, 0), 100);
        assert_eq!(queue.aged_priority(100, 599), 100);
        assert_eq!(queue.aged_priority(100, 600), 101);
        assert_eq!(queue.aged_priority(100, 1800), 103);
        let stepped = queue_with_aging(Some(60), Some(1000));
        assert_eq!(stepped.aged_priority(0, 120), 2000);
        assert_eq!(stepped.aged_priority(i32::MAX - 1, u64::MAX), i32::MAX);
        assert_eq!(queue_with_aging(None, Some(5)).aged_priority(7, 10_000), 7);
    }

    #[test]
    fn mig_quotas_are_checked_per_profile() {
        let mig = |profile: &str, lending: Option<u32>| MigQuota {
            profile: profile.into(),
            nominal_quota: 14,
            borrowing_limit: None,
            lending_limit: lending,
        };
        let mut queue = queue_with_aging(None, None);
        queue.flavors[0].mig_quotas = vec![mig("1g.10gb", None), mig("3g.40gb+me", None)];
        assert!(queue.validate().is_ok());
        assert!(is_mig_profile("7g.80gb"));
        assert!(!is_mig_profile("1g.10"));
        assert!(!is_mig_profile("g.10gb"));

        queue.flavors[0].mig_quotas = vec![mig("1g.10gb", None), mig("1g.10gb", None)];
        let paths: Vec<String> = queue
            .validate()
            .expect_err("duplicate profile")
            .into_iter()
            .map(|e| e.path)
            .collect();
        assert_eq!(paths, ["spec.flavors[0].migQuotas[1].profile"]);

        queue.flavors[0].mig_quotas = vec![mig("mig-1g.10gb", None), mig("2g.20gb", Some(15))];
        let paths: Vec<String> = queue
            .validate()
            .expect_err("bad profile, lending above quota, lending without cohort")
            .into_iter()
            .map(|e| e.path)
            .collect();
        assert_eq!(
            paths,
            [
                "spec.flavors[0].migQuotas[0].profile",
                "spec.flavors[0].migQuotas[1].lendingLimit",
                "spec.flavors[0].migQuotas[1].lendingLimit",
            ]
        );
    }

    #[test]
    fn pod_policy_lists_volume_types_by_field_name_once() {
        let mut queue = queue_with_aging(None, None);
        queue.pod_policy = Some(PodPolicy {
            allowed_volume_types: vec!["hostPath".into(), "host-path".into(), "hostPath".into()],
            allowed_priority_classes: Some(vec![String::new()]),
            ..PodPolicy::default()
        });
        let paths: Vec<String> = queue
            .validate()
            .expect_err("bad entries")
            .into_iter()
            .map(|e| e.path)
            .collect();
        assert_eq!(
            paths,
            [
                "spec.podPolicy.allowedVolumeTypes[2]",
                "spec.podPolicy.allowedPriorityClasses[0]",
                "spec.podPolicy.allowedVolumeTypes[1]",
            ]
        );
    }

    #[test]
    fn defaults() {
        let queue = queue_with_aging(None, None);
        assert_eq!(queue.fair_share_weight(), 1.0);
        assert_eq!(
            queue.within_queue_preemption(),
            WithinQueuePreemption::Never
        );
        assert_eq!(queue.reclaim_within_cohort(), ReclaimWithinCohort::Never);
        assert_eq!(queue.default_priority(), 0);
        assert_eq!(queue.nominal_gpus(), 8);
        assert!(queue.validate().is_ok());
    }
}
