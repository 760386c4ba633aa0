//! Inventory: nodes parsed from node events, the flavor each node belongs to,
//! and per-(flavor, resource kind) free-unit buckets so that "the best-fitting
//! node with at least N free GPUs" is a walk over at most a few buckets
//! instead of a scan of every node.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::Hash;

use serde::{Deserialize, Serialize};

use crate::config::{AllocatorConfig, FlavorSpec};
use crate::error::AllocatorError;
use crate::event::NodeInfo;
use crate::ids::{FlavorIdx, JobIdx, KindIdx, LabelId, NodeIdx, RackIdx, ResourceIdx, ZoneIdx};
use crate::state::jobs::Gang;
use crate::types::{
    CapacityType, CpuMemory, MigProfile, NodeSelectorTerm, ResourceKind, Taint, Toleration, names,
    tolerated_by,
};

/// Zone, rack, flavor and resource names in the order the allocator first
/// met them (each one's index).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InternOrder {
    /// Zone label values.
    pub zones: Vec<String>,
    /// Rack label values, each with its zone's 1-based place in `zones`
    /// (0: no zone label).
    pub racks: Vec<(u32, String)>,
    /// Flavor names.
    pub flavors: Vec<String>,
    /// Resource kinds.
    pub kinds: Vec<ResourceKind>,
    /// Resources: (place in `flavors`, place in `kinds`).
    pub resources: Vec<(u32, u32)>,
}

impl InternOrder {
    pub(crate) fn is_empty(&self) -> bool {
        *self == InternOrder::default()
    }
}

/// Largest count of one GPU resource a node may advertise; larger values are
/// treated as malformed input (no real node has thousands of GPUs).
pub const MAX_NODE_UNITS: u32 = 4096;

/// String interner for zones and racks: ids of type `I`, numbered from 1
/// (`I::ABSENT`, 0, is "label absent"). Values are interned within a scope
/// of type `S`: a rack label value names one rack only within its zone
/// (clusters reuse `rack-1` in every zone), so racks are interned per zone
/// and zones in the one scope `()`.
#[derive(Debug)]
pub(crate) struct Interner<S, I> {
    ids: HashMap<(S, String), I>,
    /// (scope, value) by id - 1.
    names: Vec<(S, String)>,
}

impl<S, I> Default for Interner<S, I> {
    fn default() -> Self {
        Interner {
            ids: HashMap::new(),
            names: Vec::new(),
        }
    }
}

impl<S: Copy + Eq + Hash, I: LabelId> Interner<S, I> {
    pub(crate) fn intern(&mut self, scope: S, value: Option<&str>) -> I {
        let Some(value) = value else {
            return I::ABSENT;
        };
        let key = (scope, value.to_string());
        if let Some(id) = self.ids.get(&key) {
            return *id;
        }
        self.names.push(key.clone());
        let id = I::from_number(u32::try_from(self.names.len()).unwrap_or(u32::MAX));
        self.ids.insert(key, id);
        id
    }

    /// Every interned value with its scope, in id order.
    pub(crate) fn entries(&self) -> &[(S, String)] {
        &self.names
    }

    pub(crate) fn name(&self, id: I) -> Option<&str> {
        let slot = usize::try_from(id.number()).ok()?.checked_sub(1)?;
        self.names.get(slot).map(|(_, name)| name.as_str())
    }
}

/// A flavor: configured, automatic, or only named by a queue so far.
#[derive(Debug)]
pub(crate) struct Flavor {
    pub(crate) name: String,
    /// Labels injected as node selector for workers admitted to this flavor.
    pub(crate) labels: BTreeMap<String, String>,
    /// Tolerations injected for workers admitted to this flavor.
    pub(crate) tolerations: Vec<Toleration>,
    pub(crate) capacity_type: Option<CapacityType>,
}

/// Whether resources `a` and `b` (of any flavors) are of one kind: the same
/// devices of a node, whatever flavor its labels put it in.
fn same_kind(resources: &[ResourceIndex], a: ResourceIdx, b: ResourceIdx) -> bool {
    let kind = |r: ResourceIdx| resources.get(r.slot()).map(|r| r.kind);
    kind(a).is_some() && kind(a) == kind(b)
}

/// Units of one resource kind on one node.
#[derive(Debug, Clone)]
pub(crate) struct Pool {
    pub(crate) res: ResourceIdx,
    /// Allocatable units less those pods the allocator does not manage hold.
    pub(crate) capacity: u32,
    pub(crate) used: u32,
    /// Units pods the allocator does not manage hold (see `NodeInfo`).
    pub(crate) held_by_other_pods: u32,
    /// Resource name the pod must request on this node (time-sliced GPUs are
    /// `nvidia.com/gpu` or `nvidia.com/gpu.shared` depending on the plugin).
    pub(crate) request_name: String,
}

impl Pool {
    pub(crate) fn free(&self) -> u32 {
        self.capacity.saturating_sub(self.used)
    }
}

/// In this order (`repr(C)`): what placement and the victim searches'
/// node views read of each of the hundreds of nodes they walk (zone, rack,
/// whether any taint needs tolerating) in the first cache line; the
/// compiler's order spread it over three.
#[derive(Debug)]
#[repr(C)]
pub(crate) struct Node {
    pub(crate) zone: ZoneIdx,
    pub(crate) rack: RackIdx,
    pub(crate) flavor: Option<FlavorIdx>,
    pub(crate) schedulable: bool,
    /// In the first line too: rustc keeps `Option<Node>`'s `None` in this
    /// field's tag (read off the machine code), so every lookup reads it.
    pub(crate) gpu_memory_mib: Option<u64>,
    /// Repelling taints the flavor's tolerations do not cover; a job must
    /// tolerate these itself to land here.
    pub(crate) extra_taints: Vec<Taint>,
    pub(crate) pools: Vec<Pool>,
    /// Jobs with workers on this node.
    pub(crate) running: BTreeSet<JobIdx>,
    pub(crate) info: NodeInfo,
    /// CPU and memory the workers of `running` request.
    pub(crate) cpu_memory_used: CpuMemory,
}

impl Node {
    pub(crate) fn pool(&self, res: ResourceIdx) -> Option<&Pool> {
        self.pools.iter().find(|p| p.res == res)
    }

    /// CPU and memory free for workers, once `freed` is given back; `None`
    /// when the node reports neither.
    fn cpu_memory_free(&self, freed: CpuMemory) -> Option<CpuMemory> {
        let allocatable = self.info.cpu_memory?;
        Some(
            allocatable
                .minus(self.info.cpu_memory_used_by_other_pods)
                .minus(self.cpu_memory_used.minus(freed)),
        )
    }

    /// Of `units` free GPU units, those `gang` can use here: no more than
    /// its workers' CPU and memory requests leave room for.
    pub(crate) fn usable_units(&self, units: u32, gang: Gang) -> u32 {
        self.usable_units_after(units, gang, CpuMemory::default())
    }

    /// `usable_units` once workers requesting `freed` CPU and memory have
    /// left (a preemption's victims).
    pub(crate) fn usable_units_after(&self, units: u32, gang: Gang, freed: CpuMemory) -> u32 {
        if gang.cpu_memory.is_zero() {
            return units;
        }
        let Some(free) = self.cpu_memory_free(freed) else {
            return units;
        };
        // Units left as they are while CPU and memory take no worker away:
        // best fit orders nodes by them.
        let workers = gang.cpu_memory.workers_in(free);
        if workers >= units / gang.per_worker.max(1) {
            units
        } else {
            workers.saturating_mul(gang.per_worker)
        }
    }

    /// Whether the resource indexes count it: only schedulable nodes of a
    /// flavor take new work.
    fn indexed(&self) -> bool {
        self.schedulable && self.flavor.is_some()
    }

    /// What the resource indexes count of each pool: (resource, free units,
    /// units other pods hold). Collected, so the indexes can be borrowed.
    fn index_entries(&self) -> Vec<(ResourceIdx, u32, u32)> {
        self.pools
            .iter()
            .map(|p| (p.res, p.free(), p.held_by_other_pods))
            .collect()
    }
}

/// Free-unit index of one (flavor, kind) pair.
#[derive(Debug)]
pub(crate) struct ResourceIndex {
    pub(crate) flavor: FlavorIdx,
    pub(crate) kind: KindIdx,
    /// `buckets[f]` holds the schedulable nodes with exactly `f` free units,
    /// ordered by node index for deterministic tie-breaking.
    pub(crate) buckets: Vec<BTreeSet<NodeIdx>>,
    /// Units pods the allocator does not manage hold on the schedulable
    /// nodes, for explanations.
    pub(crate) held_by_other_pods: u64,
}

impl ResourceIndex {
    fn insert(&mut self, node: NodeIdx, free: u32) {
        let slot = free as usize;
        if self.buckets.len() <= slot {
            self.buckets.resize_with(slot + 1, BTreeSet::new);
        }
        if let Some(bucket) = self.buckets.get_mut(slot) {
            bucket.insert(node);
        }
    }

    fn remove(&mut self, node: NodeIdx, free: u32) {
        if let Some(bucket) = self.buckets.get_mut(free as usize) {
            bucket.remove(&node);
        }
    }

    /// Schedulable nodes with at least `min_free` free units, best fit first.
    pub(crate) fn nodes_with_free(
        &self,
        min_free: u32,
    ) -> impl Iterator<Item = (NodeIdx, u32)> + '_ {
        self.buckets
            .iter()
            .enumerate()
            .skip(min_free as usize)
            .flat_map(|(free, nodes)| nodes.iter().map(move |n| (*n, free as u32)))
    }
}

/// The node pools parsed from a node's allocatable map, before flavor assignment.
struct ParsedPool {
    kind: ResourceKind,
    capacity: u32,
    held_by_other_pods: u32,
    request_name: String,
}

pub(crate) struct Inventory {
    pub(crate) nodes: Vec<Option<Node>>,
    node_by_name: HashMap<String, NodeIdx>,
    free_node_slots: Vec<NodeIdx>,
    pub(crate) flavors: Vec<Flavor>,
    flavor_by_name: HashMap<String, FlavorIdx>,
    configured_flavors: Vec<(FlavorSpec, FlavorIdx)>,
    pub(crate) kinds: Vec<ResourceKind>,
    kind_by_value: HashMap<ResourceKind, KindIdx>,
    pub(crate) resources: Vec<ResourceIndex>,
    res_by_pair: HashMap<(FlavorIdx, KindIdx), ResourceIdx>,
    pub(crate) zones: Interner<(), ZoneIdx>,
    pub(crate) racks: Interner<ZoneIdx, RackIdx>,
    rack_label: String,
    auto_flavors: bool,
    auto_tolerations: Vec<Toleration>,
    spot_tolerations: Vec<Toleration>,
    /// Bumped by every node added, changed or removed: what is worked out
    /// from the nodes alone, whatever runs on them, holds while it stays.
    pub(crate) node_changes: u64,
}

fn node_error(node: &str, field: impl Into<String>, reason: impl Into<String>) -> AllocatorError {
    AllocatorError::InvalidNode {
        node: node.to_string(),
        field: field.into(),
        reason: reason.into(),
    }
}

/// Extended resources are integers; anything else in a GPU field is malformed.
fn parse_units(node: &str, resource: &str, value: &str) -> Result<u32, AllocatorError> {
    let field = format!("allocatable[{resource}]");
    let n: u64 = value
        .trim()
        .parse()
        .map_err(|_| node_error(node, &field, format!("{value:?} is not a whole number")))?;
    if n > u64::from(MAX_NODE_UNITS) {
        return Err(node_error(
            node,
            &field,
            format!("{n} exceeds {MAX_NODE_UNITS}"),
        ));
    }
    u32::try_from(n).map_err(|_| node_error(node, &field, "out of range"))
}

/// Capacity type from the Karpenter, GKE or EKS labels; on-demand otherwise.
pub(crate) fn capacity_type_of(labels: &BTreeMap<String, String>) -> CapacityType {
    let spot = labels
        .get(names::KARPENTER_CAPACITY_LABEL)
        .is_some_and(|v| v.eq_ignore_ascii_case("spot"))
        || labels
            .get(names::GKE_SPOT_LABEL)
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || labels
            .get(names::GKE_PREEMPTIBLE_LABEL)
            .is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || labels
            .get(names::EKS_CAPACITY_LABEL)
            .is_some_and(|v| v.eq_ignore_ascii_case("spot"));
    if spot {
        CapacityType::Spot
    } else {
        CapacityType::OnDemand
    }
}

fn flavor_matches(spec: &FlavorSpec, labels: &BTreeMap<String, String>, ct: CapacityType) -> bool {
    if let Some(product) = &spec.gpu_product
        && labels.get(names::GPU_PRODUCT_LABEL) != Some(product)
    {
        return false;
    }
    if let Some(want) = spec.capacity_type
        && want != ct
    {
        return false;
    }
    spec.node_labels
        .iter()
        .all(|(k, v)| labels.get(k) == Some(v))
}

impl Inventory {
    pub(crate) fn new(config: &AllocatorConfig) -> Self {
        let mut inv = Inventory {
            nodes: Vec::new(),
            node_by_name: HashMap::new(),
            free_node_slots: Vec::new(),
            flavors: Vec::new(),
            flavor_by_name: HashMap::new(),
            configured_flavors: Vec::new(),
            kinds: Vec::new(),
            kind_by_value: HashMap::new(),
            resources: Vec::new(),
            res_by_pair: HashMap::new(),
            zones: Interner::default(),
            racks: Interner::default(),
            rack_label: config.rack_label.clone(),
            auto_flavors: config.auto_flavors,
            auto_tolerations: config.auto_flavor_tolerations.clone(),
            spot_tolerations: config.spot_tolerations.clone(),
            node_changes: 0,
        };
        for spec in &config.flavors {
            let idx = inv.intern_flavor(&spec.name);
            let mut labels = spec.node_labels.clone();
            if let Some(product) = &spec.gpu_product {
                labels.insert(names::GPU_PRODUCT_LABEL.to_string(), product.clone());
            }
            if let Some(flavor) = inv.flavors.get_mut(idx.slot()) {
                flavor.labels = labels;
                flavor.tolerations = spec.tolerations.clone();
                flavor.capacity_type = spec.capacity_type;
            }
            inv.configured_flavors.push((spec.clone(), idx));
        }
        inv
    }

    pub(crate) fn intern_flavor(&mut self, name: &str) -> FlavorIdx {
        if let Some(idx) = self.flavor_by_name.get(name) {
            return *idx;
        }
        let idx = FlavorIdx::from_slot(self.flavors.len());
        self.flavors.push(Flavor {
            name: name.to_string(),
            labels: BTreeMap::new(),
            tolerations: Vec::new(),
            capacity_type: None,
        });
        self.flavor_by_name.insert(name.to_string(), idx);
        idx
    }

    pub(crate) fn intern_kind(&mut self, kind: &ResourceKind) -> KindIdx {
        if let Some(idx) = self.kind_by_value.get(kind) {
            return *idx;
        }
        let idx = KindIdx::from_slot(self.kinds.len());
        self.kinds.push(kind.clone());
        self.kind_by_value.insert(kind.clone(), idx);
        idx
    }

    pub(crate) fn intern_res(&mut self, flavor: FlavorIdx, kind: KindIdx) -> ResourceIdx {
        if let Some(idx) = self.res_by_pair.get(&(flavor, kind)) {
            return *idx;
        }
        let idx = ResourceIdx::from_slot(self.resources.len());
        self.resources.push(ResourceIndex {
            flavor,
            kind,
            buckets: Vec::new(),
            held_by_other_pods: 0,
        });
        self.res_by_pair.insert((flavor, kind), idx);
        idx
    }

    /// The order zones, racks, flavors, kinds and resources were first met.
    pub(crate) fn intern_order(&self) -> InternOrder {
        InternOrder {
            zones: self
                .zones
                .entries()
                .iter()
                .map(|(_, z)| z.clone())
                .collect(),
            racks: self
                .racks
                .entries()
                .iter()
                .map(|(zone, rack)| (zone.number(), rack.clone()))
                .collect(),
            flavors: self.flavors.iter().map(|f| f.name.clone()).collect(),
            kinds: self.kinds.clone(),
            resources: self
                .resources
                .iter()
                .map(|r| (r.flavor.number(), r.kind.number()))
                .collect(),
        }
    }

    /// Meets everything in `order` again, in that order, before a restore
    /// applies nodes and queues (restore only). Configured flavors come
    /// first in both, so they keep their indices; an index out of range is
    /// skipped, as a tampered snapshot must not panic.
    pub(crate) fn restore_intern_order(&mut self, order: &InternOrder) {
        for zone in &order.zones {
            self.zones.intern((), Some(zone));
        }
        for (zone, rack) in &order.racks {
            self.racks.intern(ZoneIdx::from_number(*zone), Some(rack));
        }
        let flavors: Vec<FlavorIdx> = order
            .flavors
            .iter()
            .map(|f| self.intern_flavor(f))
            .collect();
        let kinds: Vec<KindIdx> = order.kinds.iter().map(|k| self.intern_kind(k)).collect();
        for (flavor, kind) in &order.resources {
            if let (Some(flavor), Some(kind)) =
                (flavors.get(*flavor as usize), kinds.get(*kind as usize))
            {
                self.intern_res(*flavor, *kind);
            }
        }
    }

    pub(crate) fn flavor_by_name(&self, name: &str) -> Option<FlavorIdx> {
        self.flavor_by_name.get(name).copied()
    }

    pub(crate) fn kind_idx(&self, kind: &ResourceKind) -> Option<KindIdx> {
        self.kind_by_value.get(kind).copied()
    }

    pub(crate) fn res_of(&self, flavor: FlavorIdx, kind: KindIdx) -> Option<ResourceIdx> {
        self.res_by_pair.get(&(flavor, kind)).copied()
    }

    pub(crate) fn node_by_name(&self, name: &str) -> Option<NodeIdx> {
        self.node_by_name.get(name).copied()
    }

    pub(crate) fn node(&self, idx: NodeIdx) -> Option<&Node> {
        self.nodes.get(idx.slot()).and_then(Option::as_ref)
    }

    /// Free units of `res` on a node its index counts (one that
    /// `nodes_with_free` walks).
    pub(crate) fn indexed_free(&self, idx: NodeIdx, res: ResourceIdx) -> Option<u32> {
        let node = self.node(idx).filter(|n| n.indexed())?;
        node.pool(res).map(Pool::free)
    }

    pub(crate) fn node_mut(&mut self, idx: NodeIdx) -> Option<&mut Node> {
        self.nodes.get_mut(idx.slot()).and_then(Option::as_mut)
    }

    pub(crate) fn res(&self, res: ResourceIdx) -> Option<&ResourceIndex> {
        self.resources.get(res.slot())
    }

    pub(crate) fn kind_of_res(&self, res: ResourceIdx) -> Option<&ResourceKind> {
        self.res(res).and_then(|r| self.kinds.get(r.kind.slot()))
    }

    pub(crate) fn flavor_name(&self, flavor: FlavorIdx) -> &str {
        self.flavors
            .get(flavor.slot())
            .map_or("", |f| f.name.as_str())
    }

    pub(crate) fn res_flavor_name(&self, res: ResourceIdx) -> &str {
        self.res(res).map_or("", |r| self.flavor_name(r.flavor))
    }

    pub(crate) fn res_quota_name(&self, res: ResourceIdx) -> String {
        self.kind_of_res(res)
            .map_or_else(String::new, ResourceKind::quota_name)
    }

    fn parse_pools(info: &NodeInfo) -> Result<Vec<ParsedPool>, AllocatorError> {
        let replicas = match info.labels.get(names::GPU_REPLICAS_LABEL) {
            Some(v) => v.trim().parse::<u32>().map_err(|_| {
                node_error(
                    &info.name,
                    format!("labels[{}]", names::GPU_REPLICAS_LABEL),
                    format!("{v:?} is not a whole number"),
                )
            })?,
            None => 1,
        };
        let mut pools = Vec::new();
        let mut shared_seen = false;
        for (resource, value) in &info.allocatable {
            let (kind, request_name) = if resource == names::GPU_RESOURCE {
                if replicas > 1 {
                    (ResourceKind::SharedGpu, resource.clone())
                } else {
                    (ResourceKind::Gpu, resource.clone())
                }
            } else if resource == names::SHARED_GPU_RESOURCE {
                (ResourceKind::SharedGpu, resource.clone())
            } else if let Some(profile) = resource.strip_prefix(names::MIG_RESOURCE_PREFIX) {
                if profile.is_empty() {
                    return Err(node_error(
                        &info.name,
                        format!("allocatable[{resource}]"),
                        "MIG resource without a profile name",
                    ));
                }
                (
                    ResourceKind::Mig(MigProfile::parse(profile)),
                    resource.clone(),
                )
            } else {
                continue;
            };
            let allocatable = parse_units(&info.name, resource, value)?;
            if allocatable == 0 {
                continue;
            }
            let held_by_other_pods = info.used_by_other_pods.get(resource).copied().unwrap_or(0);
            let capacity = allocatable.saturating_sub(held_by_other_pods);
            if kind == ResourceKind::SharedGpu {
                if shared_seen {
                    return Err(node_error(
                        &info.name,
                        format!("allocatable[{resource}]"),
                        "time-sliced GPUs advertised under two resource names",
                    ));
                }
                shared_seen = true;
            }
            pools.push(ParsedPool {
                kind,
                capacity,
                held_by_other_pods: held_by_other_pods.min(allocatable),
                request_name,
            });
        }
        Ok(pools)
    }

    fn assign_flavor(&mut self, info: &NodeInfo, ct: CapacityType) -> Option<FlavorIdx> {
        if let Some((_, idx)) = self
            .configured_flavors
            .iter()
            .find(|(spec, _)| flavor_matches(spec, &info.labels, ct))
        {
            return Some(*idx);
        }
        if !self.auto_flavors {
            return None;
        }
        let product = info.labels.get(names::GPU_PRODUCT_LABEL);
        let name = format!(
            "{}.{}",
            product.map_or("unknown-gpu", String::as_str),
            ct.as_str()
        );
        let existed = self.flavor_by_name.contains_key(&name);
        let idx = self.intern_flavor(&name);
        let configured = self.configured_flavors.iter().any(|(_, i)| *i == idx);
        if !existed
            || (!configured
                && self
                    .flavors
                    .get(idx.slot())
                    .is_some_and(|f| f.capacity_type.is_none()))
        {
            let mut tolerations = self.auto_tolerations.clone();
            if ct == CapacityType::Spot {
                tolerations.extend(self.spot_tolerations.iter().cloned());
            }
            let mut labels = BTreeMap::new();
            if let Some(product) = product {
                labels.insert(names::GPU_PRODUCT_LABEL.to_string(), product.clone());
            }
            if let Some(flavor) = self.flavors.get_mut(idx.slot()) {
                flavor.labels = labels;
                flavor.tolerations = tolerations;
                flavor.capacity_type = Some(ct);
            }
        }
        Some(idx)
    }

    fn index_node(&mut self, idx: NodeIdx) {
        let Some(node) = self.nodes.get(idx.slot()).and_then(Option::as_ref) else {
            return;
        };
        if !node.indexed() {
            return;
        }
        for (res, free, held) in node.index_entries() {
            if let Some(r) = self.resources.get_mut(res.slot()) {
                r.insert(idx, free);
                r.held_by_other_pods += u64::from(held);
            }
        }
    }

    fn unindex_node(&mut self, idx: NodeIdx) {
        let Some(node) = self.nodes.get(idx.slot()).and_then(Option::as_ref) else {
            return;
        };
        if !node.indexed() {
            return;
        }
        for (res, free, held) in node.index_entries() {
            if let Some(r) = self.resources.get_mut(res.slot()) {
                r.remove(idx, free);
                r.held_by_other_pods = r.held_by_other_pods.saturating_sub(u64::from(held));
            }
        }
    }

    /// Adds or replaces a node. Units held by running jobs carry over, also
    /// when the node no longer advertises them (a pool with capacity 0 keeps
    /// the accounting right until those jobs end).
    pub(crate) fn upsert_node(&mut self, info: NodeInfo) -> Result<NodeIdx, AllocatorError> {
        if info.name.trim().is_empty() {
            return Err(node_error(&info.name, "name", "must not be empty"));
        }
        self.node_changes += 1;
        let gpu_memory_mib = match info.labels.get(names::GPU_MEMORY_LABEL) {
            Some(v) => Some(v.trim().parse::<u64>().map_err(|_| {
                node_error(
                    &info.name,
                    format!("labels[{}]", names::GPU_MEMORY_LABEL),
                    format!("{v:?} is not a whole number of MiB"),
                )
            })?),
            None => None,
        };
        let parsed = Self::parse_pools(&info)?;
        let ct = capacity_type_of(&info.labels);
        let flavor = if parsed.is_empty() {
            None
        } else {
            self.assign_flavor(&info, ct)
        };
        let zone = self
            .zones
            .intern((), info.labels.get(names::ZONE_LABEL).map(String::as_str));
        let rack = self
            .racks
            .intern(zone, info.labels.get(&self.rack_label).map(String::as_str));
        let existing = self.node_by_name.get(&info.name).copied();
        let (old_pools, running, cpu_memory_used) = match existing {
            Some(idx) => {
                self.unindex_node(idx);
                let old = self.nodes.get_mut(idx.slot()).and_then(Option::take);
                old.map_or_else(Default::default, |n| {
                    (n.pools, n.running, n.cpu_memory_used)
                })
            }
            None => Default::default(),
        };
        let mut pools = Vec::new();
        if let Some(flavor) = flavor {
            for p in parsed {
                let kind = self.intern_kind(&p.kind);
                let res = self.intern_res(flavor, kind);
                pools.push(Pool {
                    res,
                    capacity: p.capacity,
                    used: 0,
                    held_by_other_pods: p.held_by_other_pods,
                    request_name: p.request_name,
                });
            }
        }
        for old in old_pools.into_iter().filter(|p| p.used > 0) {
            // Relabeled into another flavor (another product, say), the
            // node's devices are the same: its running jobs hold units of
            // the pool of their kind that replaced theirs (see `adjust`),
            // or new jobs would be placed on them too.
            if let Some(p) = pools.iter_mut().find(|p| p.res == old.res) {
                p.used = old.used;
            } else if let Some(p) = pools
                .iter_mut()
                .find(|p| same_kind(&self.resources, p.res, old.res))
            {
                p.used = p.used.saturating_add(old.used);
            } else {
                pools.push(Pool {
                    capacity: 0,
                    held_by_other_pods: 0,
                    ..old
                });
            }
        }
        let flavor_tolerations = flavor
            .and_then(|f| self.flavors.get(f.slot()))
            .map(|f| f.tolerations.clone())
            .unwrap_or_default();
        let extra_taints = info
            .taints
            .iter()
            .filter(|t| t.repels() && !tolerated_by(t, &flavor_tolerations))
            .cloned()
            .collect();
        let node = Node {
            schedulable: info.ready && !info.unschedulable,
            flavor,
            zone,
            rack,
            gpu_memory_mib,
            pools,
            extra_taints,
            running,
            info,
            cpu_memory_used,
        };
        let idx = match existing {
            Some(idx) => idx,
            None => match self.free_node_slots.pop() {
                Some(idx) => idx,
                None => {
                    self.nodes.push(None);
                    NodeIdx::from_slot(self.nodes.len() - 1)
                }
            },
        };
        self.node_by_name.insert(node.info.name.clone(), idx);
        if let Some(slot) = self.nodes.get_mut(idx.slot()) {
            *slot = Some(node);
        }
        self.index_node(idx);
        Ok(idx)
    }

    /// Arena slots: `Some(name)` for a live node, `None` for a free slot,
    /// plus the free-slot stack. Restore uses these so that node indices (and
    /// so tie-breaking between equally good nodes) survive a snapshot.
    pub(crate) fn arena_layout(&self) -> (Vec<Option<NodeInfo>>, Vec<NodeIdx>) {
        let nodes = self
            .nodes
            .iter()
            .map(|n| n.as_ref().map(|n| n.info.clone()))
            .collect();
        (nodes, self.free_node_slots.clone())
    }

    /// Appends an empty arena slot (restore only).
    pub(crate) fn push_gap(&mut self) {
        self.nodes.push(None);
    }

    /// Replaces the free-slot stack (restore only); slots that are not empty
    /// are dropped so a tampered snapshot cannot make two nodes share a slot.
    pub(crate) fn set_free_slots(&mut self, slots: Vec<NodeIdx>) {
        let nodes = &self.nodes;
        self.free_node_slots = slots
            .into_iter()
            .filter(|s| nodes.get(s.slot()).is_some_and(Option::is_none))
            .collect();
        let listed: BTreeSet<NodeIdx> = self.free_node_slots.iter().copied().collect();
        for (i, slot) in self.nodes.iter().enumerate() {
            let i = NodeIdx::from_slot(i);
            if slot.is_none() && !listed.contains(&i) {
                self.free_node_slots.insert(0, i);
            }
        }
    }

    /// Removes a node and returns the jobs that had workers on it.
    pub(crate) fn remove_node(&mut self, name: &str) -> Option<BTreeSet<JobIdx>> {
        let idx = self.node_by_name.get(name).copied()?;
        self.node_changes += 1;
        self.unindex_node(idx);
        self.node_by_name.remove(name);
        let node = self.nodes.get_mut(idx.slot()).and_then(Option::take)?;
        self.free_node_slots.push(idx);
        Some(node.running)
    }

    /// Changes a node's used units for `res` by `delta` and moves it between
    /// buckets. Units are clamped at zero rather than trusting the caller.
    pub(crate) fn adjust(&mut self, idx: NodeIdx, res: ResourceIdx, delta: i64) {
        let Some(node) = self.nodes.get_mut(idx.slot()).and_then(Option::as_mut) else {
            return;
        };
        let indexed = node.indexed();
        // A job placed before its node moved to another flavor takes and
        // gives back units of the pool of its kind there (see `upsert_node`).
        let at = node.pools.iter().position(|p| p.res == res).or_else(|| {
            node.pools
                .iter()
                .position(|p| same_kind(&self.resources, p.res, res))
        });
        let pool = match at.and_then(|at| node.pools.get_mut(at)) {
            Some(p) => p,
            None => {
                if delta <= 0 {
                    return;
                }
                // A replayed admission onto a node that no longer advertises
                // the resource: account for it with a zero-capacity pool.
                node.pools.push(Pool {
                    res,
                    capacity: 0,
                    used: 0,
                    held_by_other_pods: 0,
                    request_name: String::new(),
                });
                match node.pools.last_mut() {
                    Some(p) => p,
                    None => return,
                }
            }
        };
        let old_free = pool.free();
        let new_used = (i64::from(pool.used) + delta).clamp(0, i64::from(u32::MAX));
        pool.used = u32::try_from(new_used).unwrap_or(u32::MAX);
        let new_free = pool.free();
        let res = pool.res;
        if indexed
            && old_free != new_free
            && let Some(r) = self.resources.get_mut(res.slot())
        {
            r.remove(idx, old_free);
            r.insert(idx, new_free);
        }
    }

    /// Takes (`take`) or gives back `amount` of a node's CPU and memory.
    pub(crate) fn adjust_cpu_memory(&mut self, idx: NodeIdx, amount: CpuMemory, take: bool) {
        if let Some(node) = self.node_mut(idx) {
            node.cpu_memory_used = if take {
                node.cpu_memory_used.plus(amount)
            } else {
                node.cpu_memory_used.minus(amount)
            };
        }
    }

    /// Whether a node passes a job's filters (selector, taints, GPU memory).
    pub(crate) fn node_admits(node: &Node, filter: &NodeFilter) -> bool {
        if !filter.node_selector.is_empty()
            && !filter
                .node_selector
                .iter()
                .all(|(k, v)| node.info.labels.get(k) == Some(v))
        {
            return false;
        }
        if !node
            .extra_taints
            .iter()
            .all(|t| tolerated_by(t, &filter.tolerations))
        {
            return false;
        }
        if let Some(min) = filter.min_gpu_memory_mib {
            match node.gpu_memory_mib {
                Some(mem) if mem >= min => {}
                _ => return false,
            }
        }
        filter.node_affinity.is_empty()
            || filter
                .node_affinity
                .iter()
                .any(|term| term.matches(&node.info.name, &node.info.labels))
    }
}

/// The per-job node constraints, interned so that jobs with identical
/// constraints share placement-failure memos within a cycle.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub(crate) struct NodeFilter {
    pub(crate) node_selector: BTreeMap<String, String>,
    pub(crate) tolerations: Vec<Toleration>,
    pub(crate) min_gpu_memory_mib: Option<u64>,
    /// Required node-affinity terms, one of which a node must match.
    pub(crate) node_affinity: Vec<NodeSelectorTerm>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::TaintEffect;

    fn node(name: &str, gpus: &str) -> NodeInfo {
        let mut info = NodeInfo {
            name: name.into(),
            ready: true,
            ..NodeInfo::default()
        };
        info.allocatable
            .insert("nvidia.com/gpu".into(), gpus.into());
        info.labels
            .insert(names::GPU_PRODUCT_LABEL.into(), "A100".into());
        info
    }

    #[test]
    fn cpu_and_memory_cap_a_nodes_units_only_where_they_take_a_worker_away() {
        let mut inv = Inventory::new(&AllocatorConfig::default());
        let info = NodeInfo {
            cpu_memory: Some(CpuMemory {
                cpu_millis: 12_000,
                memory_bytes: u64::MAX,
            }),
            ..node("n1", "8")
        };
        let idx = inv.upsert_node(info).expect("valid node");
        let n = inv.node(idx).expect("node");
        let gang = Gang {
            per_worker: 4,
            workers: 2,
            topology: crate::types::TopologyRequirement::Preferred,
            one_per_node: false,
            cpu_memory: CpuMemory {
                cpu_millis: 8_000,
                memory_bytes: 0,
            },
        };
        assert_eq!(n.usable_units(8, gang), 4, "12 cores take one worker");
        assert_eq!(
            n.usable_units(5, gang),
            5,
            "one worker either way: best fit still sees 5 free"
        );
        let freed = CpuMemory {
            cpu_millis: 4_000,
            memory_bytes: 0,
        };
        inv.adjust_cpu_memory(idx, freed, true);
        let n = inv.node(idx).expect("node");
        assert_eq!(n.usable_units(8, gang), 4);
        assert_eq!(n.usable_units(4, gang), 4);
        assert_eq!(n.usable_units_after(8, gang, freed), 4);
        let lighter = Gang {
            cpu_memory: CpuMemory::default(),
            ..gang
        };
        assert_eq!(n.usable_units(8, lighter), 8, "asks for none");
    }

    #[test]
    fn what_placement_reads_of_a_node_is_in_its_first_64_bytes() {
        use std::mem::{offset_of, size_of};
        let ends = [
            offset_of!(Node, zone) + size_of::<ZoneIdx>(),
            offset_of!(Node, rack) + size_of::<RackIdx>(),
            offset_of!(Node, schedulable) + size_of::<bool>(),
            offset_of!(Node, gpu_memory_mib) + size_of::<Option<u64>>(),
            offset_of!(Node, extra_taints) + size_of::<Vec<Taint>>(),
        ];
        assert!(ends.iter().all(|end| *end <= 64), "{ends:?}");
        assert!(offset_of!(Node, info) >= 64);
    }

    #[test]
    fn capacity_type_reads_all_three_label_conventions() {
        let mut labels = BTreeMap::new();
        assert_eq!(capacity_type_of(&labels), CapacityType::OnDemand);
        labels.insert(names::KARPENTER_CAPACITY_LABEL.into(), "spot".into());
        assert_eq!(capacity_type_of(&labels), CapacityType::Spot);
        let mut gke = BTreeMap::new();
        gke.insert(names::GKE_SPOT_LABEL.into(), "true".into());
        assert_eq!(capacity_type_of(&gke), CapacityType::Spot);
        let mut eks = BTreeMap::new();
        eks.insert(names::EKS_CAPACITY_LABEL.into(), "SPOT".into());
        assert_eq!(capacity_type_of(&eks), CapacityType::Spot);
        eks.insert(names::EKS_CAPACITY_LABEL.into(), "ON_DEMAND".into());
        assert_eq!(capacity_type_of(&eks), CapacityType::OnDemand);
    }

    #[test]
    fn malformed_gpu_quantity_is_a_typed_error() {
        let mut inv = Inventory::new(&AllocatorConfig::default());
        match inv.upsert_node(node("n1", "eight")) {
            Err(AllocatorError::InvalidNode { field, .. }) => {
                assert_eq!(field, "allocatable[nvidia.com/gpu]")
            }
            other => panic!("expected InvalidNode, got {other:?}"),
        }
        assert!(inv.node_by_name("n1").is_none());
    }

    #[test]
    fn buckets_follow_usage_and_readiness() {
        let mut inv = Inventory::new(&AllocatorConfig::default());
        let idx = inv.upsert_node(node("n1", "8")).expect("node accepted");
        let res = inv.node(idx).expect("node").pools[0].res;
        let r = inv.res(res).expect("res");
        assert_eq!(r.nodes_with_free(8).collect::<Vec<_>>(), vec![(idx, 8)]);
        inv.adjust(idx, res, 3);
        let r = inv.res(res).expect("res");
        assert_eq!(r.nodes_with_free(1).collect::<Vec<_>>(), vec![(idx, 5)]);
        let mut cordoned = node("n1", "8");
        cordoned.unschedulable = true;
        inv.upsert_node(cordoned).expect("node accepted");
        let r = inv.res(res).expect("res");
        assert_eq!(r.nodes_with_free(0).count(), 0);
        assert_eq!(
            inv.node(idx).expect("node").pools[0].used,
            3,
            "usage carried over"
        );
    }

    #[test]
    fn time_sliced_and_mig_nodes_get_their_own_kinds() {
        let mut inv = Inventory::new(&AllocatorConfig::default());
        let mut shared = node("ts", "16");
        shared
            .labels
            .insert(names::GPU_REPLICAS_LABEL.into(), "4".into());
        let idx = inv.upsert_node(shared).expect("node accepted");
        let pool = &inv.node(idx).expect("node").pools[0];
        assert_eq!(inv.kind_of_res(pool.res), Some(&ResourceKind::SharedGpu));
        assert_eq!(pool.request_name, "nvidia.com/gpu");

        let mut mig = node("mig", "0");
        mig.allocatable
            .insert("nvidia.com/mig-1g.5gb".into(), "7".into());
        let idx = inv.upsert_node(mig).expect("node accepted");
        let pools = &inv.node(idx).expect("node").pools;
        assert_eq!(pools.len(), 1, "zero whole GPUs make no pool");
        assert!(
            matches!(inv.kind_of_res(pools[0].res), Some(ResourceKind::Mig(p)) if p.name == "1g.5gb")
        );
    }

    #[test]
    fn gpu_memory_and_selector_filters_use_node_labels() {
        let mut inv = Inventory::new(&AllocatorConfig::default());
        let mut info = node("n1", "8");
        info.labels
            .insert(names::GPU_MEMORY_LABEL.into(), "40960".into());
        info.labels.insert("pool".into(), "a".into());
        let idx = inv.upsert_node(info).expect("node accepted");
        let n = inv.node(idx).expect("node");
        let wants_80g = NodeFilter {
            min_gpu_memory_mib: Some(81_920),
            ..NodeFilter::default()
        };
        assert!(!Inventory::node_admits(n, &wants_80g));
        let wants_40g = NodeFilter {
            min_gpu_memory_mib: Some(40_960),
            ..NodeFilter::default()
        };
        assert!(Inventory::node_admits(n, &wants_40g));
        let other_pool = NodeFilter {
            node_selector: BTreeMap::from([("pool".to_string(), "b".to_string())]),
            ..NodeFilter::default()
        };
        assert!(!Inventory::node_admits(n, &other_pool));
    }

    #[test]
    fn taints_not_covered_by_the_flavor_are_kept_per_node() {
        let mut inv = Inventory::new(&AllocatorConfig::default());
        let mut info = node("n1", "8");
        info.taints.push(Taint {
            key: "nvidia.com/gpu".into(),
            value: String::new(),
            effect: TaintEffect::NoSchedule,
        });
        info.taints.push(Taint {
            key: "dedicated".into(),
            value: "research".into(),
            effect: TaintEffect::NoSchedule,
        });
        let idx = inv.upsert_node(info).expect("node accepted");
        let n = inv.node(idx).expect("node");
        assert_eq!(n.extra_taints.len(), 1);
        assert!(!Inventory::node_admits(n, &NodeFilter::default()));
        let filter = NodeFilter {
            tolerations: vec![Toleration::equal(
                "dedicated",
                "research",
                TaintEffect::NoSchedule,
            )],
            ..NodeFilter::default()
        };
        assert!(Inventory::node_admits(n, &filter));
    }
}
