//! GPUs, CPU and memory that pods the gpu-allocator did not place hold on
//! each node.
//!
//! A node's allocatable resources are not all free for training: inference
//! servers, notebooks and plain Jobs request GPUs, every DaemonSet and
//! system pod CPU and memory, and so do the workers of CPU-only
//! TrainingJobs (admitted without a placement); the gpu-allocator counts
//! only the workers it placed. Placed onto resources another pod holds, a
//! pinned worker could never bind. So the Node watch is joined with a watch
//! of every pod, and each node's event carries what the pods bound to it
//! request, GPU workers of TrainingJobs left out; it is published again
//! when that changes.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;

use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus, Pod, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::runtime::watcher::Event;
use serde::Deserialize;
use trainyard_api::placement::LABEL_JOB;
use trainyard_api::quantity::{bytes, cpu_millis, requested};
use trainyard_contracts::events::Change;

use crate::mapping::{
    ChangeEvent, GPU_RESOURCE, MIG_PREFIX, ObjectName, Watched, node_event, read_quantity, whole,
};

/// Prefix of every NVIDIA device-plugin resource (`nvidia.com/gpu`,
/// `nvidia.com/gpu.shared`, `nvidia.com/mig-*`).
const NVIDIA_PREFIX: &str = "nvidia.com/";

/// Resources requested on one node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    pub gpus: u32,
    /// By profile (`nvidia.com/mig-1g.10gb` → `1g.10gb`).
    pub mig: BTreeMap<String, u32>,
    pub cpu_millis: u64,
    pub memory_bytes: u64,
}

impl Usage {
    pub fn is_empty(&self) -> bool {
        self.gpus == 0 && self.mig.is_empty() && self.cpu_millis == 0 && self.memory_bytes == 0
    }

    fn add(&mut self, other: &Usage) {
        self.gpus = self.gpus.saturating_add(other.gpus);
        for (profile, n) in &other.mig {
            let total = self.mig.entry(profile.clone()).or_insert(0);
            *total = total.saturating_add(*n);
        }
        self.cpu_millis = self.cpu_millis.saturating_add(other.cpu_millis);
        self.memory_bytes = self.memory_bytes.saturating_add(other.memory_bytes);
    }

    /// The larger of `self` and `other`, per resource.
    fn max(mut self, other: &Usage) -> Usage {
        self.gpus = self.gpus.max(other.gpus);
        for (profile, n) in &other.mig {
            let own = self.mig.entry(profile.clone()).or_insert(0);
            *own = (*own).max(*n);
        }
        self.cpu_millis = self.cpu_millis.max(other.cpu_millis);
        self.memory_bytes = self.memory_bytes.max(other.memory_bytes);
        self
    }

    /// What one container (or init container) at `field` of `pod` requests
    /// (`quantity::requested`: a limit alone is the request).
    fn of_container(
        resources: Option<&ResourceRequirements>,
        pod: &dyn fmt::Display,
        field: &dyn fmt::Display,
    ) -> Usage {
        let mut usage = Usage::default();
        for (list, name, quantity) in resources.into_iter().flat_map(requested) {
            usage.count(
                name,
                quantity,
                pod,
                &format_args!("{field}.resources.{list}[{name}]"),
            );
        }
        usage
    }

    /// What `amounts` (resource name → quantity, at `field` of `pod`) ask
    /// for, of the resources counted.
    fn of_amounts<'a>(
        amounts: impl IntoIterator<Item = (&'a String, &'a Quantity)>,
        pod: &dyn fmt::Display,
        field: &dyn fmt::Display,
    ) -> Usage {
        let mut usage = Usage::default();
        for (name, quantity) in amounts {
            usage.count(name, quantity, pod, &format_args!("{field}[{name}]"));
        }
        usage
    }

    /// Counts `quantity` of resource `name` (at `at` of `pod`), if it is one
    /// counted; a quantity that does not parse counts as nothing (logged).
    fn count(
        &mut self,
        name: &str,
        quantity: &Quantity,
        pod: &dyn fmt::Display,
        at: &dyn fmt::Display,
    ) {
        match name {
            "cpu" => self.cpu_millis = read_quantity(cpu_millis, quantity, pod, at).unwrap_or(0),
            "memory" => self.memory_bytes = read_quantity(bytes, quantity, pod, at).unwrap_or(0),
            GPU_RESOURCE => self.gpus = whole(quantity, pod, at),
            _ => {
                if let Some(profile) = name.strip_prefix(MIG_PREFIX) {
                    let slices = whole(quantity, pod, at);
                    if slices > 0 {
                        self.mig.insert(profile.to_owned(), slices);
                    }
                }
            }
        }
    }
}

/// A pod whose requests the gpu-allocator does not count itself, as the
/// usage watch reads it: any pod but a worker of a GPU TrainingJob (those
/// it placed; a CPU-only job's workers it admits without placing).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct OtherPod {
    #[serde(default)]
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub spec: Option<OtherPodSpec>,
    #[serde(default)]
    pub status: Option<OtherPodStatus>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OtherPodSpec {
    #[serde(default)]
    pub node_name: Option<String>,
    #[serde(default)]
    pub containers: Vec<ContainerResources>,
    #[serde(default)]
    pub init_containers: Vec<ContainerResources>,
    /// What the RuntimeClass adds (sandbox VMs): requested besides the containers.
    #[serde(default)]
    pub overhead: Option<BTreeMap<String, Quantity>>,
    /// Pod-level resources (beta since Kubernetes 1.34): their CPU and
    /// memory requests, when set, replace the containers'.
    #[serde(default)]
    pub resources: Option<ResourceRequirements>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerResources {
    #[serde(default)]
    pub resources: Option<ResourceRequirements>,
    /// `Always` on an init container makes it a sidecar.
    #[serde(default)]
    pub restart_policy: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct OtherPodStatus {
    #[serde(default)]
    pub phase: Option<String>,
}

crate::mapping::resource_as!(OtherPod, Pod);

impl OtherPod {
    /// A TrainingJob's worker asking for NVIDIA devices (whole, shared or
    /// MIG): the allocator placed it and counts what it requests.
    fn is_placed_worker(&self, spec: &OtherPodSpec) -> bool {
        let labelled = self
            .metadata
            .labels
            .as_ref()
            .is_some_and(|labels| labels.contains_key(LABEL_JOB));
        labelled
            && spec
                .containers
                .iter()
                .filter_map(|c| c.resources.as_ref())
                .flat_map(requested)
                .any(|(_, name, _)| name.starts_with(NVIDIA_PREFIX))
    }

    /// The node it is bound to and what it holds there, while it holds
    /// anything: bound, not finished, requesting something counted. Counted
    /// as kube-scheduler counts a pod's request: the larger of the
    /// containers' sum and the largest init container, with sidecars (init
    /// containers that keep running) added to both; pod-level CPU and memory
    /// requests instead, when set; plus the overhead. (During an in-place
    /// resize the scheduler takes the larger of spec and status; this reads
    /// the spec.)
    pub fn held(&self) -> Option<(String, Usage)> {
        let spec = self.spec.as_ref()?;
        let node = spec.node_name.clone().filter(|n| !n.is_empty())?;
        let phase = self.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) || self.is_placed_worker(spec) {
            return None;
        }
        let pod = ObjectName("pod", &self.metadata);
        let mut running = Usage::default();
        for (i, container) in spec.containers.iter().enumerate() {
            let field = format_args!("spec.containers[{i}]");
            running.add(&Usage::of_container(
                container.resources.as_ref(),
                &pod,
                &field,
            ));
        }
        // Sidecars started so far, running beside each later init container.
        let mut sidecars = Usage::default();
        let mut init_peak = Usage::default();
        for (i, init) in spec.init_containers.iter().enumerate() {
            let field = format_args!("spec.initContainers[{i}]");
            let own = Usage::of_container(init.resources.as_ref(), &pod, &field);
            if init.restart_policy.as_deref() == Some("Always") {
                running.add(&own);
                sidecars.add(&own);
                init_peak = init_peak.max(&sidecars);
            } else {
                let mut during = own;
                during.add(&sidecars);
                init_peak = init_peak.max(&during);
            }
        }
        let mut usage = running.max(&init_peak);
        if let Some(requests) = spec.resources.as_ref().and_then(|r| r.requests.as_ref()) {
            let pod_level = Usage::of_amounts(
                requests
                    .iter()
                    .filter(|(name, _)| matches!(name.as_str(), "cpu" | "memory")),
                &pod,
                &"spec.resources.requests",
            );
            if requests.contains_key("cpu") {
                usage.cpu_millis = pod_level.cpu_millis;
            }
            if requests.contains_key("memory") {
                usage.memory_bytes = pod_level.memory_bytes;
            }
        }
        if let Some(overhead) = &spec.overhead {
            usage.add(&Usage::of_amounts(overhead, &pod, &"spec.overhead"));
        }
        (!usage.is_empty()).then_some((node, usage))
    }
}

/// A Node with what other pods hold on it: the object the Node watch publishes.
#[derive(Debug, Clone)]
pub struct GpuNode {
    pub node: Node,
    pub used_by_other_pods: Usage,
    /// The other pod's change (`<uid>:<resourceVersion>`, `<uid>:deleted`,
    /// `relist`) that changed the usage, when that is why it is published.
    pub usage_change: Option<String>,
}

impl GpuNode {
    /// `node` with nothing held by other pods.
    pub fn idle(node: Node) -> Self {
        Self {
            node,
            used_by_other_pods: Usage::default(),
            usage_change: None,
        }
    }
}

impl kube::Resource for GpuNode {
    type DynamicType = ();
    type Scope = k8s_openapi::ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Node::kind(&())
    }
    fn group(_: &()) -> Cow<'_, str> {
        Node::group(&())
    }
    fn version(_: &()) -> Cow<'_, str> {
        Node::version(&())
    }
    fn plural(_: &()) -> Cow<'_, str> {
        Node::plural(&())
    }
    fn meta(&self) -> &ObjectMeta {
        &self.node.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.node.metadata
    }
}

impl Watched for GpuNode {
    fn to_event(&self, change: Change) -> Option<ChangeEvent> {
        node_event(
            &self.node,
            &self.used_by_other_pods,
            self.usage_change.as_deref(),
            change,
        )
    }
}

/// What is kept of a node to publish it again when its usage changes: the
/// fields its event reads. A real Node's status lists every image pulled
/// onto it, often most of its bytes.
fn kept(node: &Node) -> Node {
    let status = node.status.as_ref().map(|status| NodeStatus {
        allocatable: status.allocatable.clone(),
        conditions: status.conditions.clone(),
        ..NodeStatus::default()
    });
    Node {
        metadata: ObjectMeta {
            name: node.metadata.name.clone(),
            uid: node.metadata.uid.clone(),
            resource_version: node.metadata.resource_version.clone(),
            labels: node.metadata.labels.clone(),
            ..ObjectMeta::default()
        },
        spec: node.spec.as_ref().map(|spec| NodeSpec {
            taints: spec.taints.clone(),
            unschedulable: spec.unschedulable,
            ..NodeSpec::default()
        }),
        status,
    }
}

/// Joins the Node watch and the other pods' watch into one stream of
/// [`GpuNode`] events: a node's events carry its current usage, and a
/// change of usage is an `Apply` of the node. Node events wait for the other
/// pods' first listing, so no node is published as free of resources it lends.
#[derive(Debug)]
pub struct NodeUsage {
    nodes: HashMap<String, Node>,
    /// Pod uid → (node, usage) of every pod holding anything.
    pods: HashMap<String, (String, Usage)>,
    /// Node → uids of the `pods` bound to it. Nearly every running pod holds
    /// CPU or memory, so a pod's change recounts its node only, not the cluster.
    pods_on_node: HashMap<String, HashSet<String>>,
    /// `pods` summed per node.
    by_node: BTreeMap<String, Usage>,
    /// `by_node`'s GPUs summed, kept as it changes (read on every pod event).
    gpus_used: u64,
    /// The pods of a relist in progress: they replace `pods` at its end.
    listing: Option<HashMap<String, (String, Usage)>>,
    /// Node events that came before the other pods were first listed.
    waiting: Option<Vec<Event<Node>>>,
    /// Names this process's pod relists in message ids: a relist may bring
    /// a node's usage back to a value sent before, which must not be
    /// dropped as a duplicate.
    process: String,
    relists: u64,
}

impl NodeUsage {
    /// `process` tells this process's relists from another's (its start time, say).
    pub fn new(process: String) -> Self {
        Self {
            nodes: HashMap::new(),
            pods: HashMap::new(),
            pods_on_node: HashMap::new(),
            by_node: BTreeMap::new(),
            gpus_used: 0,
            listing: None,
            waiting: Some(Vec::new()),
            process,
            relists: 0,
        }
    }

    /// `nvidia.com/gpu` other pods hold, over all nodes.
    pub fn gpus_used_by_other_pods(&self) -> u64 {
        self.gpus_used
    }

    fn with_usage(&self, node: Node, usage_change: Option<&str>) -> GpuNode {
        let used_by_other_pods = self
            .by_node
            .get(&node.name_any())
            .cloned()
            .unwrap_or_default();
        GpuNode {
            node,
            used_by_other_pods,
            usage_change: usage_change.map(str::to_owned),
        }
    }

    /// The node events for one Node watch event: none until the other pods
    /// were listed, then the waiting ones too.
    pub fn on_node(&mut self, event: Event<Node>) -> Vec<Event<GpuNode>> {
        match &mut self.waiting {
            Some(waiting) => {
                waiting.push(event);
                Vec::new()
            }
            None => vec![self.with_usage_event(event)],
        }
    }

    /// A Node watch event as the event of the node with its usage.
    fn with_usage_event(&mut self, event: Event<Node>) -> Event<GpuNode> {
        match event {
            Event::Apply(node) => {
                self.nodes.insert(node.name_any(), kept(&node));
                Event::Apply(self.with_usage(node, None))
            }
            Event::InitApply(node) => {
                self.nodes.insert(node.name_any(), kept(&node));
                Event::InitApply(self.with_usage(node, None))
            }
            Event::Delete(node) => {
                self.nodes.remove(&node.name_any());
                Event::Delete(self.with_usage(node, None))
            }
            Event::Init => Event::Init,
            Event::InitDone => Event::InitDone,
        }
    }

    /// The node events one other pods' watch event implies: an `Apply` of
    /// each known node whose usage it changed.
    pub fn on_pod(&mut self, event: Event<OtherPod>) -> Vec<Event<GpuNode>> {
        let (cause, touched) = match event {
            Event::Apply(pod) => {
                let Some(uid) = pod.uid() else {
                    return Vec::new();
                };
                let held = pod.held();
                // Most changes leave what a pod holds.
                if self.pods.get(&uid) == held.as_ref() {
                    return Vec::new();
                }
                let cause = format!("{uid}:{}", pod.resource_version().unwrap_or_default());
                (cause, self.hold(uid, held))
            }
            Event::Delete(pod) => {
                let Some(uid) = pod.uid() else {
                    return Vec::new();
                };
                if !self.pods.contains_key(&uid) {
                    return Vec::new();
                }
                (format!("{uid}:deleted"), self.hold(uid, None))
            }
            Event::Init => {
                self.listing = Some(HashMap::new());
                return Vec::new();
            }
            Event::InitApply(pod) => {
                if let (Some(listing), Some(uid), Some(held)) =
                    (self.listing.as_mut(), pod.uid(), pod.held())
                {
                    listing.insert(uid, held);
                }
                return Vec::new();
            }
            Event::InitDone => {
                if let Some(listed) = self.listing.take() {
                    self.pods = listed;
                }
                self.relists += 1;
                let cause = format!("relist-{}-{}", self.process, self.relists);
                (cause, self.recount_all())
            }
        };
        if let Some(waiting) = self.waiting.take() {
            return waiting
                .into_iter()
                .map(|event| self.with_usage_event(event))
                .collect();
        }
        touched
            .iter()
            .filter_map(|node| self.nodes.get(node))
            .map(|node| Event::Apply(self.with_usage(node.clone(), Some(&cause))))
            .collect()
    }

    /// Records what pod `uid` holds now (`None`: nothing); returns the nodes
    /// whose usage that changed.
    fn hold(&mut self, uid: String, held: Option<(String, Usage)>) -> Vec<String> {
        let mut nodes = Vec::new();
        if let Some((node, _)) = self.pods.remove(&uid) {
            if let Some(uids) = self.pods_on_node.get_mut(&node) {
                uids.remove(&uid);
                if uids.is_empty() {
                    self.pods_on_node.remove(&node);
                }
            }
            nodes.push(node);
        }
        if let Some((node, usage)) = held {
            self.pods_on_node
                .entry(node.clone())
                .or_default()
                .insert(uid.clone());
            self.pods.insert(uid, (node.clone(), usage));
            if !nodes.contains(&node) {
                nodes.push(node);
            }
        }
        nodes.retain(|node| self.recount(node));
        nodes
    }

    /// Sums what the pods bound to `node` hold; returns whether that changed.
    fn recount(&mut self, node: &str) -> bool {
        let mut total = Usage::default();
        for uid in self.pods_on_node.get(node).into_iter().flatten() {
            if let Some((_, usage)) = self.pods.get(uid) {
                total.add(usage);
            }
        }
        let gpus = u64::from(total.gpus);
        let before = if total.is_empty() {
            self.by_node.remove(node)
        } else {
            self.by_node.insert(node.to_owned(), total.clone())
        }
        .unwrap_or_default();
        self.gpus_used = self
            .gpus_used
            .saturating_sub(u64::from(before.gpus))
            .saturating_add(gpus);
        before != total
    }

    /// Counts `pods` afresh (after a relist); returns the nodes whose usage changed.
    fn recount_all(&mut self) -> Vec<String> {
        self.pods_on_node.clear();
        let mut by_node: BTreeMap<String, Usage> = BTreeMap::new();
        for (uid, (node, usage)) in &self.pods {
            self.pods_on_node
                .entry(node.clone())
                .or_default()
                .insert(uid.clone());
            by_node.entry(node.clone()).or_default().add(usage);
        }
        let before = std::mem::replace(&mut self.by_node, by_node);
        self.gpus_used = self.by_node.values().fold(0, |total: u64, usage| {
            total.saturating_add(u64::from(usage.gpus))
        });
        let mut touched: Vec<String> = before
            .keys()
            .chain(self.by_node.keys())
            .filter(|node| before.get(*node) != self.by_node.get(*node))
            .cloned()
            .collect();
        touched.sort_unstable();
        touched.dedup();
        touched
    }
}
