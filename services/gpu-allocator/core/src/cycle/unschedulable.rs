//! Jobs no node could ever hold: whether some node of a flavor the job may
//! use could hold one of its workers, and some set of them the whole gang,
//! with every pod gone (each node at its allocatable units, CPU and
//! memory, cordoned or not); if none could, which field of the job asks for
//! more than the nodes offer ([`PendingReason::Unschedulable`]). That wins
//! over every quota or capacity reason: waiting does not help.
//!
//! The verdict depends on the job, its queue's flavors and the nodes alone,
//! so the speed layer keeps it per job until a node or a queue changes, and
//! jobs alike (resources, worker shape, node filter) share one judgement.

use std::sync::Arc;

use crate::cycle::CycleCtx;
use crate::cycle::Policy;
use crate::cycle::placement;
use crate::ids::{JobIdx, ReasonIdx, ResourceIdx};
use crate::memo::{CycleMemo, FITS, FitKey};
use crate::pending::{PendingReason, UnschedulableCause};
use crate::state::inventory::{Node, NodeFilter};
use crate::state::jobs::Gang;
use crate::types::{CpuMemory, NodeKey, NodeOperator, TopologyRequirement, names, tolerated_by};

/// Why one resource's nodes cannot hold a gang, and how far they got: the
/// reason of the resource that got furthest is the one told.
struct Never {
    /// Checks passed before the one that failed.
    stage: u8,
    reason: PendingReason,
}

/// What one resource's nodes could do for a gang.
enum Judged {
    /// The resource has no node.
    NoNodes,
    /// Some of its nodes could hold the gang.
    Fits,
    Never(Never),
}

/// Reads CPU or memory out of a request or an allocatable amount.
type PartOf = fn(&CpuMemory) -> u64;

/// `units` of `resource` as a user reads them: `8 GPUs`, `7 nvidia.com/mig-1g.10gb`.
fn units_of(units: u64, resource: &str) -> String {
    if resource == names::GPU_RESOURCE {
        format!("{units} GPU{}", if units == 1 { "" } else { "s" })
    } else {
        format!("{units} {resource}")
    }
}

/// A node of a resource, as it would be with every pod gone.
#[derive(Clone, Copy)]
struct EmptyNode<'a> {
    node: &'a Node,
    /// Allocatable units, those pods the allocator does not manage hold included.
    units: u32,
}

impl EmptyNode<'_> {
    fn name(&self) -> &str {
        &self.node.info.name
    }

    /// Workers of `gang` the node's allocatable CPU and memory take
    /// (`u32::MAX` when it reports neither or the gang asks for neither).
    fn cpu_memory_workers(&self, gang: Gang) -> u32 {
        match self.node.info.cpu_memory {
            Some(allocatable) if !gang.cpu_memory.is_zero() => {
                gang.cpu_memory.workers_in(allocatable)
            }
            _ => u32::MAX,
        }
    }

    /// Units the gang could use here: whole workers, as CPU and memory allow.
    fn usable(&self, gang: Gang) -> u32 {
        let by_units = self.units / gang.per_worker.max(1);
        by_units
            .min(self.cpu_memory_workers(gang))
            .saturating_mul(gang.per_worker)
    }
}

/// The one of `nodes` with the most of `key`, the first by name among equals.
fn most<'a, K: Ord>(
    nodes: &[EmptyNode<'a>],
    key: impl Fn(&EmptyNode<'a>) -> K,
) -> Option<EmptyNode<'a>> {
    nodes
        .iter()
        .copied()
        .max_by(|a, b| key(a).cmp(&key(b)).then_with(|| b.name().cmp(a.name())))
}

impl Policy<'_> {
    /// Why job `idx` can never be placed, if so: a reason in this cycle's
    /// table, shared by every job of the same verdict.
    pub(crate) fn unschedulable(&self, idx: JobIdx, ctx: &mut CycleCtx) -> Option<ReasonIdx> {
        let verdict = match ctx.memo.lookup_fit(idx) {
            Some(verdict) => verdict,
            None => {
                let verdict = self.judge_fit(idx, &mut ctx.memo);
                ctx.memo.record_fit(idx, verdict);
                verdict
            }
        };
        let (known, reason) = ctx.memo.never_reason(verdict)?;
        if let Some(known) = known {
            return Some(known);
        }
        let reason = Arc::clone(reason);
        let at = ctx.add_shared_reason(reason);
        ctx.memo.record_never_reason(verdict, at);
        Some(at)
    }

    /// Judges job `idx`: [`FITS`], or the verdict of the reason no node
    /// could hold it.
    fn judge_fit(&self, idx: JobIdx, memo: &mut CycleMemo) -> u32 {
        let Some(job) = self.state.job(idx) else {
            return FITS;
        };
        // A queue that does not exist, or is closed to the job's namespace,
        // says so first: the job is to go to another queue, with other
        // flavors.
        let open = self
            .state
            .queues
            .get(job.queue)
            .and_then(|q| q.spec.as_ref())
            .is_some_and(|spec| {
                spec.admits_namespace(&job.spec.namespace)
                    && spec.pod_policy.refusal(&job.spec.pod_requests).is_none()
            });
        if !open {
            return FITS;
        }
        let key = FitKey {
            queue: job.queue,
            sharing: job.spec.allow_gpu_sharing,
            slice: job.spec.gpu_slice.clone(),
            gang: Gang::of(&job.spec),
            filter: job.filter,
        };
        if let Some(verdict) = memo.lookup_fit_shape(&key) {
            return verdict;
        }
        let mut options = Vec::new();
        self.options_for(job, &mut options);
        let never = self.never_fits(&options, &key);
        memo.record_fit_shape(key, never)
    }

    /// Why no node of any resource in `options` could hold a gang of `key`,
    /// from the resource whose nodes got furthest; none when one could, or
    /// when no resource has a node at all (nodes not seen yet are no
    /// verdict, nor is a queue without quota for the job).
    fn never_fits(&self, options: &[ResourceIdx], key: &FitKey) -> Option<PendingReason> {
        let empty = NodeFilter::default();
        let filter = self.state.filters.get(key.filter.slot()).unwrap_or(&empty);
        let mut closest: Option<Never> = None;
        for &res in options {
            match self.never_fits_in(res, key.gang, filter) {
                Judged::Fits => return None,
                Judged::NoNodes => {}
                Judged::Never(never) => {
                    if closest.as_ref().is_none_or(|c| never.stage > c.stage) {
                        closest = Some(never);
                    }
                }
            }
        }
        closest.map(|c| c.reason)
    }

    /// Whether the nodes of `res` could hold the gang, or why not.
    fn never_fits_in(&self, res: ResourceIdx, gang: Gang, filter: &NodeFilter) -> Judged {
        let nodes: Vec<EmptyNode> = self
            .state
            .inv
            .nodes
            .iter()
            .flatten()
            .filter_map(|node| {
                let pool = node.pool(res)?;
                let units = pool.capacity.saturating_add(pool.held_by_other_pods);
                (units > 0).then_some(EmptyNode { node, units })
            })
            .collect();
        let Some(largest) = most(&nodes, |n| n.units) else {
            return Judged::NoNodes;
        };
        let resource = self.state.inv.res_quota_name(res);
        let never = |stage: u8, cause: UnschedulableCause, detail: String, fix: String| Never {
            stage,
            reason: PendingReason::Unschedulable {
                cause,
                flavor: self.state.inv.res_flavor_name(res).to_string(),
                resource: resource.clone(),
                largest_node: largest.name().to_string(),
                largest_node_units: largest.units,
                detail,
                fix,
            },
        };
        let per_worker = gang.per_worker;
        let mut fitting: Vec<EmptyNode> = nodes
            .iter()
            .copied()
            .filter(|n| n.units >= per_worker)
            .collect();
        if fitting.is_empty() {
            return Judged::Never(never(
                0,
                UnschedulableCause::UnitsPerWorker,
                format!(
                    "{} is {per_worker} but the largest node ({}) has {}",
                    UnschedulableCause::UnitsPerWorker.field(),
                    largest.name(),
                    units_of(u64::from(largest.units), &resource)
                ),
                format!(
                    "lower gpusPerWorker to at most {} and raise numWorkers",
                    largest.units
                ),
            ));
        }
        let with_units = format!(
            "the nodes with {} or more",
            units_of(u64::from(per_worker), &resource)
        );
        // CPU, then memory: each against the nodes left by the check before.
        let request = gang.cpu_memory;
        let checks: [(UnschedulableCause, u64, PartOf, &str); 2] = [
            (
                UnschedulableCause::CpuPerWorker,
                request.cpu_millis,
                |c| c.cpu_millis,
                "CPU",
            ),
            (
                UnschedulableCause::MemoryPerWorker,
                request.memory_bytes,
                |c| c.memory_bytes,
                "memory",
            ),
        ];
        for (stage, (cause, asked, part, what)) in (1..).zip(checks) {
            if asked == 0 {
                continue;
            }
            let allocatable = |n: &EmptyNode| n.node.info.cpu_memory.as_ref().map(part);
            let left: Vec<EmptyNode> = fitting
                .iter()
                .copied()
                .filter(|n| allocatable(n).is_none_or(|a| a >= asked))
                .collect();
            if left.is_empty() {
                let show = |amount: u64| {
                    let mut shown = CpuMemory::default();
                    if cause == UnschedulableCause::CpuPerWorker {
                        shown.cpu_millis = amount;
                    } else {
                        shown.memory_bytes = amount;
                    }
                    let shown = shown.to_string();
                    shown
                        .split_once(' ')
                        .map_or(shown.clone(), |(_, amount)| amount.to_string())
                };
                let roomiest = most(&fitting, |n| allocatable(n).unwrap_or(0));
                let (most_name, most_amount) = roomiest
                    .map(|n| (n.name().to_string(), allocatable(&n).unwrap_or(0)))
                    .unwrap_or_default();
                return Judged::Never(never(
                    stage,
                    cause,
                    format!(
                        "{} is {} per worker but the node with the most {what} among {with_units} \
                         ({most_name}) has {} allocatable",
                        cause.field(),
                        show(asked),
                        show(most_amount)
                    ),
                    format!("lower {} to at most {}", cause.field(), show(most_amount)),
                ));
            }
            fitting = left;
        }
        let could_hold = |count: usize| {
            format!("the {count} node(s) that could otherwise hold a worker ({with_units})")
        };
        // The job's node filter, part by part.
        if !filter.node_selector.is_empty() {
            let left: Vec<EmptyNode> = fitting
                .iter()
                .copied()
                .filter(|n| {
                    filter
                        .node_selector
                        .iter()
                        .all(|(k, v)| n.node.info.labels.get(k) == Some(v))
                })
                .collect();
            if left.is_empty() {
                let missing = filter.node_selector.iter().find(|(k, v)| {
                    !fitting
                        .iter()
                        .any(|n| n.node.info.labels.get(*k) == Some(*v))
                });
                let selects = match missing {
                    Some((k, v)) => format!("{k}={v}"),
                    None => filter
                        .node_selector
                        .iter()
                        .map(|(k, v)| format!("{k}={v}"))
                        .collect::<Vec<_>>()
                        .join(","),
                };
                return Judged::Never(never(
                    3,
                    UnschedulableCause::NodeSelector,
                    format!(
                        "{} {selects} matches none of {}",
                        UnschedulableCause::NodeSelector.field(),
                        could_hold(fitting.len())
                    ),
                    "select labels one of them carries, or label a node that can hold a worker"
                        .to_string(),
                ));
            }
            fitting = left;
        }
        if !filter.node_affinity.is_empty() {
            let left: Vec<EmptyNode> = fitting
                .iter()
                .copied()
                .filter(|n| {
                    filter
                        .node_affinity
                        .iter()
                        .any(|term| term.matches(&n.node.info.name, &n.node.info.labels))
                })
                .collect();
            if left.is_empty() {
                // The first requirement of the first term none of them meets.
                let unmet = filter
                    .node_affinity
                    .first()
                    .and_then(|term| {
                        term.requirements.iter().find(|r| {
                            !fitting
                                .iter()
                                .any(|n| r.holds(&n.node.info.name, &n.node.info.labels))
                        })
                    })
                    .map(|r| {
                        let key = match &r.key {
                            NodeKey::Label(key) => key.as_str(),
                            NodeKey::Name => "metadata.name",
                        };
                        match r.operator {
                            // Also what a required pod affinity's topologyKey asks of a node.
                            NodeOperator::Exists => {
                                format!(" (none has the label {key}, which a pod affinity's topologyKey needs too)")
                            }
                            op => format!(" (none meets {key} {op:?} {})", r.values.join(",")),
                        }
                    })
                    .unwrap_or_default();
                return Judged::Never(never(
                    4,
                    UnschedulableCause::NodeAffinity,
                    format!(
                        "{} matches none of {}{unmet}",
                        UnschedulableCause::NodeAffinity.field(),
                        could_hold(fitting.len())
                    ),
                    "widen its required terms to take one of them".to_string(),
                ));
            }
            fitting = left;
        }
        let untolerated = |n: &EmptyNode| {
            n.node
                .extra_taints
                .iter()
                .find(|t| !tolerated_by(t, &filter.tolerations))
                .cloned()
        };
        let left: Vec<EmptyNode> = fitting
            .iter()
            .copied()
            .filter(|n| untolerated(n).is_none())
            .collect();
        if left.is_empty() {
            let example = fitting
                .iter()
                .find_map(|n| {
                    untolerated(n)
                        .map(|t| format!("{}={}:{:?} on {}", t.key, t.value, t.effect, n.name()))
                })
                .unwrap_or_default();
            return Judged::Never(never(
                5,
                UnschedulableCause::Tolerations,
                format!(
                    "each of {} has a taint {} does not tolerate, e.g. {example}",
                    could_hold(fitting.len()),
                    UnschedulableCause::Tolerations.field(),
                ),
                "add a toleration for it".to_string(),
            ));
        }
        fitting = left;
        if let Some(min) = filter.min_gpu_memory_mib {
            let left: Vec<EmptyNode> = fitting
                .iter()
                .copied()
                .filter(|n| n.node.gpu_memory_mib.is_some_and(|m| m >= min))
                .collect();
            if left.is_empty() {
                let most_memory = fitting
                    .iter()
                    .filter_map(|n| n.node.gpu_memory_mib)
                    .max()
                    .unwrap_or(0);
                return Judged::Never(never(
                    6,
                    UnschedulableCause::GpuMemoryFloor,
                    format!(
                        "{} is {min} but {} have at most {most_memory} MiB a GPU",
                        UnschedulableCause::GpuMemoryFloor.field(),
                        could_hold(fitting.len())
                    ),
                    format!("lower it to at most {most_memory}"),
                ));
            }
            fitting = left;
        }
        // The gang: every worker at once, within one domain if it must.
        let placeable = |gang: Gang| {
            placement::most_placeable(
                gang,
                fitting
                    .iter()
                    .map(|n| (n.usable(gang), n.node.zone, n.node.rack)),
            )
        };
        let workers = u64::from(gang.workers);
        let spread = placeable(Gang {
            topology: TopologyRequirement::Preferred,
            ..gang
        });
        if spread < workers {
            let (cause, detail, fix) = if gang.one_per_node {
                let cause = UnschedulableCause::OneWorkerPerNode;
                (
                    cause,
                    format!(
                        "{} puts each of the {workers} workers on a node of its own, but {spread} \
                         node(s) can hold one",
                        cause.field()
                    ),
                    format!(
                        "lower numWorkers to at most {spread} (with more GPUs each), or drop the \
                         anti-affinity"
                    ),
                )
            } else {
                let cause = UnschedulableCause::NumWorkers;
                (
                    cause,
                    format!(
                        "{} is {workers} but the nodes the job may use hold {spread} worker(s) of {} \
                         at most, even empty",
                        cause.field(),
                        units_of(u64::from(per_worker), &resource)
                    ),
                    format!("lower numWorkers to at most {spread}"),
                )
            };
            return Judged::Never(never(7, cause, detail, fix));
        }
        let within = placeable(gang);
        if within >= workers {
            return Judged::Fits;
        }
        let cause = UnschedulableCause::Topology;
        let domain = match gang.topology {
            TopologyRequirement::SameZone => "zone",
            TopologyRequirement::SameRack => "rack",
            TopologyRequirement::SameNode | TopologyRequirement::Preferred => "node",
        };
        let detail = if gang.topology == TopologyRequirement::SameNode {
            let roomiest = most(&fitting, |n| n.usable(gang));
            format!(
                "{} keeps all {workers} workers ({}) on one node, but the roomiest node ({}) holds \
                 {within} of them",
                cause.field(),
                units_of(workers * u64::from(per_worker), &resource),
                roomiest.map_or_else(String::new, |n| n.name().to_string())
            )
        } else {
            format!(
                "{} keeps all {workers} workers in one {domain}, but the roomiest {domain} holds \
                 {within} of them",
                cause.field()
            )
        };
        let fix = if gang.topology == TopologyRequirement::SameNode {
            format!(
                "make numWorkers x gpusPerWorker at most {} so the gang fits one node, or drop \
                 the pod affinity",
                most(&fitting, |n| n.usable(gang)).map_or(0, |n| n.usable(gang))
            )
        } else {
            format!(
                "lower numWorkers to at most {within} (with more GPUs each) so the gang fits one \
                 {domain}, or drop the pod affinity"
            )
        };
        Judged::Never(never(8, cause, detail, fix))
    }
}
