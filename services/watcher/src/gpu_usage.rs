//! GPUs that pods Trainyard does not manage hold on each node.
//!
//! A node's allocatable GPUs are not all free for training: inference
//! servers, notebooks and plain Jobs request them too, and the gpu-allocator
//! sees only the jobs it admitted. Placed onto GPUs another pod holds, a
//! pinned worker could never bind. So the Node watch is joined with a watch
//! of the other pods (those without `trainyard.dev/job`): each node's event
//! carries what such pods bound to it request, and is published again when
//! that changes.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus, Pod, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::runtime::watcher::Event;
use serde::Deserialize;
use trainyard_contracts::events::Change;

use crate::mapping::{ChangeEvent, GPU_RESOURCE, MIG_PREFIX, Watched, node_event, whole};

/// GPUs and MIG slices requested on one node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Usage {
    pub gpus: u32,
    /// By profile (`nvidia.com/mig-1g.10gb` → `1g.10gb`).
    pub mig: BTreeMap<String, u32>,
}

impl Usage {
    pub fn is_empty(&self) -> bool {
        self.gpus == 0 && self.mig.is_empty()
    }

    fn add(&mut self, other: &Usage) {
        self.gpus = self.gpus.saturating_add(other.gpus);
        for (profile, n) in &other.mig {
            let total = self.mig.entry(profile.clone()).or_insert(0);
            *total = total.saturating_add(*n);
        }
    }

    /// What one container (or init container) requests; for extended
    /// resources a limit alone is the request.
    fn of_container(resources: Option<&ResourceRequirements>) -> Usage {
        let mut usage = Usage::default();
        let Some(resources) = resources else {
            return usage;
        };
        let requested = resources.requests.iter().flatten();
        let limited = resources.limits.iter().flatten();
        let mut amounts: BTreeMap<&str, &Quantity> =
            limited.map(|(name, q)| (name.as_str(), q)).collect();
        amounts.extend(requested.map(|(name, q)| (name.as_str(), q)));
        for (name, units) in amounts.into_iter().map(|(name, q)| (name, whole(q))) {
            if name == GPU_RESOURCE {
                usage.gpus = units;
            } else if let Some(profile) = name.strip_prefix(MIG_PREFIX)
                && units > 0
            {
                usage.mig.insert(profile.to_owned(), units);
            }
        }
        usage
    }

    /// The larger of `self` and `other`, per resource.
    fn max(mut self, other: &Usage) -> Usage {
        self.gpus = self.gpus.max(other.gpus);
        for (profile, n) in &other.mig {
            let own = self.mig.entry(profile.clone()).or_insert(0);
            *own = (*own).max(*n);
        }
        self
    }
}

/// A pod Trainyard does not manage, as the usage watch reads it.
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
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct ContainerResources {
    #[serde(default)]
    pub resources: Option<ResourceRequirements>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct OtherPodStatus {
    #[serde(default)]
    pub phase: Option<String>,
}

crate::mapping::resource_as!(OtherPod, Pod);

impl OtherPod {
    /// The node it is bound to and what it holds there, while it holds
    /// anything: bound, not finished, requesting GPUs or MIG slices. As the
    /// scheduler counts, the containers' sum or the largest init container.
    pub fn held(&self) -> Option<(String, Usage)> {
        let spec = self.spec.as_ref()?;
        let node = spec.node_name.clone().filter(|n| !n.is_empty())?;
        let phase = self.status.as_ref().and_then(|s| s.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            return None;
        }
        let mut running = Usage::default();
        for container in &spec.containers {
            running.add(&Usage::of_container(container.resources.as_ref()));
        }
        let usage = spec
            .init_containers
            .iter()
            .map(|c| Usage::of_container(c.resources.as_ref()))
            .fold(running, |total, init| total.max(&init));
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
/// pods' first listing, so no node is published as free of GPUs it lends.
#[derive(Debug)]
pub struct NodeUsage {
    nodes: HashMap<String, Node>,
    /// Pod uid → (node, usage) of every pod holding GPUs.
    pods: HashMap<String, (String, Usage)>,
    /// `pods` summed per node.
    by_node: BTreeMap<String, Usage>,
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
            by_node: BTreeMap::new(),
            listing: None,
            waiting: Some(Vec::new()),
            process,
            relists: 0,
        }
    }

    /// `nvidia.com/gpu` other pods hold, over all nodes.
    pub fn gpus_used_by_other_pods(&self) -> u32 {
        self.by_node
            .values()
            .fold(0, |total, usage| total.saturating_add(usage.gpus))
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
        let cause = match event {
            Event::Apply(pod) => {
                let Some(uid) = pod.uid() else {
                    return Vec::new();
                };
                let held = pod.held();
                // Most pods hold no GPUs, and most changes leave what one holds.
                if self.pods.get(&uid) == held.as_ref() {
                    return Vec::new();
                }
                let cause = format!("{uid}:{}", pod.resource_version().unwrap_or_default());
                match held {
                    Some(held) => self.pods.insert(uid, held),
                    None => self.pods.remove(&uid),
                };
                cause
            }
            Event::Delete(pod) => {
                let Some(uid) = pod.uid() else {
                    return Vec::new();
                };
                if self.pods.remove(&uid).is_none() {
                    return Vec::new();
                }
                format!("{uid}:deleted")
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
                format!("relist-{}-{}", self.process, self.relists)
            }
        };
        let mut by_node: BTreeMap<String, Usage> = BTreeMap::new();
        for (node, usage) in self.pods.values() {
            by_node.entry(node.clone()).or_default().add(usage);
        }
        let before = std::mem::replace(&mut self.by_node, by_node);
        if let Some(waiting) = self.waiting.take() {
            return waiting
                .into_iter()
                .map(|event| self.with_usage_event(event))
                .collect();
        }
        let mut touched: Vec<&String> = before.keys().chain(self.by_node.keys()).collect();
        touched.sort_unstable();
        touched.dedup();
        touched
            .into_iter()
            .filter(|node| before.get(*node) != self.by_node.get(*node))
            .filter_map(|node| self.nodes.get(node))
            .map(|node| Event::Apply(self.with_usage(node.clone(), Some(&cause))))
            .collect()
    }
}
