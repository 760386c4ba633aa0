//! Small domain types shared by every module: identifiers, time, taints and
//! tolerations, capacity types and the GPU resource kinds the allocator counts.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// Well-known Kubernetes resource and label names the allocator reads or writes.
pub mod names {
    /// Flavor of a CPU-only job's admission: no GPU, no placement.
    pub const CPU_ONLY_FLAVOR: &str = "cpu";
    /// Separates the Kubernetes uid from the attempt in a job uid
    /// (`JobUid::for_attempt`).
    pub const ATTEMPT_SEPARATOR: &str = "/a";
    /// Whole GPUs advertised by the NVIDIA device plugin.
    pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
    /// Time-sliced GPU replicas when the device plugin runs with `renameByDefault`.
    pub const SHARED_GPU_RESOURCE: &str = "nvidia.com/gpu.shared";
    /// Prefix of MIG slice resources (`nvidia.com/mig-1g.5gb`, ...).
    pub const MIG_RESOURCE_PREFIX: &str = "nvidia.com/mig-";
    /// GPU product label set by GPU feature discovery.
    pub const GPU_PRODUCT_LABEL: &str = "nvidia.com/gpu.product";
    /// Per-GPU memory in MiB, set by GPU feature discovery.
    pub const GPU_MEMORY_LABEL: &str = "nvidia.com/gpu.memory";
    /// Time-slicing replicas per physical GPU, set by GPU feature discovery.
    pub const GPU_REPLICAS_LABEL: &str = "nvidia.com/gpu.replicas";
    /// Standard zone label.
    pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
    /// Node name label used to pin a worker to the node chosen at admission.
    pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
    /// Karpenter capacity type: `spot` / `on-demand`.
    pub const KARPENTER_CAPACITY_LABEL: &str = "karpenter.sh/capacity-type";
    /// GKE spot nodes: `"true"`.
    pub const GKE_SPOT_LABEL: &str = "cloud.google.com/gke-spot";
    /// GKE legacy preemptible nodes: `"true"`.
    pub const GKE_PREEMPTIBLE_LABEL: &str = "cloud.google.com/gke-preemptible";
    /// EKS managed node groups: `SPOT` / `ON_DEMAND`.
    pub const EKS_CAPACITY_LABEL: &str = "eks.amazonaws.com/capacityType";
    /// NVLink domain label written by the NVIDIA GPU operator; the default rack label.
    pub const NVLINK_CLIQUE_LABEL: &str = "nvidia.com/gpu.clique";
}

/// Seconds since the Unix epoch. Kubernetes timestamps have second resolution,
/// so finer units would only pretend to a precision the inputs do not have.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(transparent)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// This time plus `secs`, saturating instead of overflowing on absurd input.
    pub fn plus_secs(self, secs: u64) -> Timestamp {
        Timestamp(self.0.saturating_add(secs))
    }

    /// Seconds from `earlier` to `self`, zero when `earlier` is later.
    pub fn secs_since(self, earlier: Timestamp) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t={}s", self.0)
    }
}

/// The Kubernetes uid of a TrainingJob: the idempotency key of every job event.
/// Shared (`Arc<str>`): a uid is copied into every decision and pending
/// explanation, and at 10,000 pending jobs per cycle a reference count is
/// much cheaper than a string copy.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default)]
#[serde(transparent)]
pub struct JobUid(pub std::sync::Arc<str>);

impl JobUid {
    /// Builds a uid from anything string-like.
    pub fn new(uid: impl Into<String>) -> Self {
        JobUid(std::sync::Arc::from(uid.into()))
    }

    /// The uid as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The uid of one attempt of a TrainingJob: `<k8s uid>/a<attempt>`.
    /// Every restart attempt is a job of its own.
    pub fn for_attempt(k8s_uid: &str, attempt: u32) -> Self {
        JobUid::new(format!("{k8s_uid}{}{attempt}", names::ATTEMPT_SEPARATOR))
    }

    /// The Kubernetes uid and attempt of a uid made by `for_attempt`.
    pub fn attempt(&self) -> Option<(&str, u32)> {
        let (k8s_uid, attempt) = self.as_str().rsplit_once(names::ATTEMPT_SEPARATOR)?;
        Some((k8s_uid, attempt.parse().ok()?))
    }
}

impl fmt::Display for JobUid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whether a node's capacity can be reclaimed by the cloud provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CapacityType {
    /// Regular capacity.
    OnDemand,
    /// Spot / preemptible capacity.
    Spot,
}

impl CapacityType {
    /// Short name used in auto-generated flavor names.
    pub fn as_str(self) -> &'static str {
        match self {
            CapacityType::OnDemand => "on-demand",
            CapacityType::Spot => "spot",
        }
    }
}

/// Effect of a Kubernetes taint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TaintEffect {
    /// New pods are not scheduled unless they tolerate the taint.
    NoSchedule,
    /// Only a scheduling preference; the allocator ignores it.
    PreferNoSchedule,
    /// Running pods are evicted unless they tolerate the taint.
    NoExecute,
}

/// A node taint, as in `node.spec.taints`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Taint {
    /// Taint key.
    pub key: String,
    /// Taint value (may be empty).
    #[serde(default)]
    pub value: String,
    /// Taint effect.
    pub effect: TaintEffect,
}

impl Taint {
    /// Taints that keep pods off the node; `PreferNoSchedule` is only advice.
    pub fn repels(&self) -> bool {
        self.effect != TaintEffect::PreferNoSchedule
    }
}

/// Toleration operator.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default,
)]
pub enum TolerationOperator {
    /// Key and value must match.
    #[default]
    Equal,
    /// Key must match (any key when the key is absent).
    Exists,
}

/// What a node requirement reads of a node.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum NodeKey {
    /// A label (`matchExpressions[].key`).
    Label(String),
    /// The node's name (`matchFields` on `metadata.name`).
    Name,
}

/// How a node requirement compares, as in `nodeSelectorTerms[].matchExpressions[].operator`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum NodeOperator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
    /// The value, an integer, is greater than the one given.
    Gt,
    /// The value, an integer, is less than the one given.
    Lt,
}

/// One requirement of a node-affinity term.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeRequirement {
    pub key: NodeKey,
    pub operator: NodeOperator,
    #[serde(default)]
    pub values: Vec<String>,
}

impl NodeRequirement {
    pub(crate) fn holds(&self, name: &str, labels: &BTreeMap<String, String>) -> bool {
        let value = match &self.key {
            NodeKey::Label(key) => labels.get(key).map(String::as_str),
            NodeKey::Name => Some(name),
        };
        let number = |v: &str| v.parse::<i64>().ok();
        let given = self.values.first().and_then(|v| number(v));
        match self.operator {
            NodeOperator::In => value.is_some_and(|v| self.values.iter().any(|x| x == v)),
            NodeOperator::NotIn => value.is_none_or(|v| self.values.iter().all(|x| x != v)),
            NodeOperator::Exists => value.is_some(),
            NodeOperator::DoesNotExist => value.is_none(),
            NodeOperator::Gt => {
                matches!((value.and_then(number), given), (Some(v), Some(g)) if v > g)
            }
            NodeOperator::Lt => {
                matches!((value.and_then(number), given), (Some(v), Some(g)) if v < g)
            }
        }
    }
}

/// A required node-affinity term (`nodeSelectorTerms[]`): a node matches
/// when every requirement holds. A term without requirements matches no
/// node, as in Kubernetes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeSelectorTerm {
    pub requirements: Vec<NodeRequirement>,
}

impl NodeSelectorTerm {
    /// Whether the node named `name` with `labels` matches.
    pub fn matches(&self, name: &str, labels: &BTreeMap<String, String>) -> bool {
        !self.requirements.is_empty() && self.requirements.iter().all(|r| r.holds(name, labels))
    }
}

/// A pod toleration, as in `pod.spec.tolerations`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Toleration {
    /// Taint key to tolerate; absent with `Exists` tolerates every taint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// How key and value are compared.
    #[serde(default)]
    pub operator: TolerationOperator,
    /// Value compared with `Equal`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
    /// Effect to tolerate; absent tolerates every effect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<TaintEffect>,
}

impl Toleration {
    /// `key=value:effect` tolerated with the `Equal` operator.
    pub fn equal(key: &str, value: &str, effect: TaintEffect) -> Self {
        Toleration {
            key: Some(key.to_string()),
            operator: TolerationOperator::Equal,
            value: Some(value.to_string()),
            effect: Some(effect),
        }
    }

    /// Any value of `key` with the given effect.
    pub fn exists(key: &str, effect: TaintEffect) -> Self {
        Toleration {
            key: Some(key.to_string()),
            operator: TolerationOperator::Exists,
            value: None,
            effect: Some(effect),
        }
    }

    /// The Kubernetes matching rule (`ToleratesTaint` in the scheduler).
    pub fn tolerates(&self, taint: &Taint) -> bool {
        if let Some(effect) = self.effect
            && effect != taint.effect
        {
            return false;
        }
        match (&self.key, self.operator) {
            (None, TolerationOperator::Exists) => true,
            (None, TolerationOperator::Equal) => false,
            (Some(key), TolerationOperator::Exists) => *key == taint.key,
            (Some(key), TolerationOperator::Equal) => {
                *key == taint.key && self.value.as_deref().unwrap_or("") == taint.value
            }
        }
    }
}

/// True when some toleration in `tolerations` matches `taint`.
pub fn tolerated_by(taint: &Taint, tolerations: &[Toleration]) -> bool {
    tolerations.iter().any(|t| t.tolerates(taint))
}

/// A resource the allocator counts on nodes and in quotas.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ResourceKind {
    /// Exclusive whole GPUs (`nvidia.com/gpu` on a node without time-slicing).
    Gpu,
    /// Time-sliced GPU replicas; only jobs that opt in land on them.
    SharedGpu,
    /// A MIG slice of the named profile, e.g. `1g.5gb`.
    Mig(MigProfile),
}

impl ResourceKind {
    /// The name quotas use for this kind (a Kubernetes resource name).
    pub fn quota_name(&self) -> String {
        match self {
            ResourceKind::Gpu => names::GPU_RESOURCE.to_string(),
            ResourceKind::SharedGpu => names::SHARED_GPU_RESOURCE.to_string(),
            ResourceKind::Mig(p) => format!("{}{}", names::MIG_RESOURCE_PREFIX, p.name),
        }
    }

    /// Parses a quota resource name; `None` for names the allocator does not count.
    pub fn from_quota_name(name: &str) -> Option<ResourceKind> {
        if name == names::GPU_RESOURCE {
            Some(ResourceKind::Gpu)
        } else if name == names::SHARED_GPU_RESOURCE {
            Some(ResourceKind::SharedGpu)
        } else {
            name.strip_prefix(names::MIG_RESOURCE_PREFIX)
                .filter(|p| !p.is_empty())
                .map(|p| ResourceKind::Mig(MigProfile::parse(p)))
        }
    }
}

impl fmt::Display for ResourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.quota_name())
    }
}

/// A MIG profile such as `3g.20gb`, with its compute and memory sizes when the
/// name follows NVIDIA's `<compute>g.<memory>gb` pattern.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MigProfile {
    /// Profile name as in the resource name, e.g. `1g.5gb` or `1g.10gb+me`.
    pub name: String,
    /// Compute slices (the `1` in `1g.5gb`), when parseable.
    pub compute_slices: Option<u32>,
    /// Memory in GB (the `5` in `1g.5gb`), when parseable.
    pub memory_gb: Option<u32>,
}

impl MigProfile {
    /// Parses a profile name; sizes stay `None` when the name is non-standard,
    /// so such a profile only matches requests that name it exactly.
    pub fn parse(name: &str) -> MigProfile {
        let base = name.split('+').next().unwrap_or(name);
        let mut parts = base.splitn(2, '.');
        let compute = parts
            .next()
            .and_then(|c| c.strip_suffix('g'))
            .and_then(|c| c.parse::<u32>().ok());
        let memory = parts
            .next()
            .and_then(|m| m.strip_suffix("gb"))
            .and_then(|m| m.parse::<u32>().ok());
        MigProfile {
            name: name.to_string(),
            compute_slices: compute,
            memory_gb: memory,
        }
    }
}

/// What a job asks for when it wants a GPU-memory slice rather than whole GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum GpuSliceRequest {
    /// Exactly this MIG profile (e.g. `2g.10gb`).
    Profile(String),
    /// The smallest MIG profile with at least this much GPU memory.
    MemoryGb(u32),
}

/// Whether a count is zero: what serde leaves out of the JSON.
pub(crate) fn is_zero<N: Default + PartialEq>(count: &N) -> bool {
    *count == N::default()
}

/// CPU and memory, as a worker requests them or a node has them free.
/// Counted in whole millicores and bytes (quantities rounded up).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct CpuMemory {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
}

impl CpuMemory {
    /// Neither CPU nor memory: the request of a worker that states none.
    pub fn is_zero(&self) -> bool {
        self.cpu_millis == 0 && self.memory_bytes == 0
    }

    /// Workers requesting `self` that `free` can host (`u32::MAX` when
    /// `self` asks for nothing).
    pub fn workers_in(&self, free: CpuMemory) -> u32 {
        let fitting = |request: u64, free: u64| free.checked_div(request).unwrap_or(u64::MAX);
        let workers = fitting(self.cpu_millis, free.cpu_millis)
            .min(fitting(self.memory_bytes, free.memory_bytes));
        u32::try_from(workers).unwrap_or(u32::MAX)
    }

    /// `self` times `workers`, saturating.
    pub fn times(self, workers: u32) -> CpuMemory {
        CpuMemory {
            cpu_millis: self.cpu_millis.saturating_mul(u64::from(workers)),
            memory_bytes: self.memory_bytes.saturating_mul(u64::from(workers)),
        }
    }

    /// `self + other`, saturating.
    pub fn plus(self, other: CpuMemory) -> CpuMemory {
        CpuMemory {
            cpu_millis: self.cpu_millis.saturating_add(other.cpu_millis),
            memory_bytes: self.memory_bytes.saturating_add(other.memory_bytes),
        }
    }

    /// `self - other`, zero where `other` is larger.
    pub fn minus(self, other: CpuMemory) -> CpuMemory {
        CpuMemory {
            cpu_millis: self.cpu_millis.saturating_sub(other.cpu_millis),
            memory_bytes: self.memory_bytes.saturating_sub(other.memory_bytes),
        }
    }
}

impl fmt::Display for CpuMemory {
    /// `cpu 8, memory 64Gi`: whole cores and binary units where exact; a
    /// part that is zero left out.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let millis = self.cpu_millis;
        let cpu = match millis {
            0 => None,
            m if m.is_multiple_of(1000) => Some(format!("cpu {}", m / 1000)),
            m => Some(format!("cpu {m}m")),
        };
        let bytes = self.memory_bytes;
        let memory = (bytes != 0).then(|| {
            let unit = [("Ti", 40), ("Gi", 30), ("Mi", 20), ("Ki", 10)]
                .into_iter()
                .find(|(_, shift)| bytes.is_multiple_of(1u64 << shift));
            match unit {
                Some((suffix, shift)) => format!("memory {}{suffix}", bytes >> shift),
                None => format!("memory {bytes}"),
            }
        });
        let parts: Vec<String> = cpu.into_iter().chain(memory).collect();
        if parts.is_empty() {
            f.write_str("no cpu or memory")
        } else {
            f.write_str(&parts.join(", "))
        }
    }
}

/// How strictly a multi-worker job must stay inside one topology domain.
/// Preferences are always applied; a requirement turns a spread placement
/// into a refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum TopologyRequirement {
    /// Prefer one rack, then one zone, but spread if that is the only way.
    #[default]
    Preferred,
    /// All workers in one zone.
    SameZone,
    /// All workers in one rack / NVLink domain.
    SameRack,
    /// All workers on one node (required pod affinity among the job's own
    /// workers on `kubernetes.io/hostname`).
    SameNode,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_requirements_compare_labels_and_the_name_as_kubernetes_does() {
        let labels: BTreeMap<String, String> = [
            ("gpus".to_string(), "8".to_string()),
            ("pool".to_string(), "a".to_string()),
        ]
        .into();
        let term = |key: NodeKey, operator, values: &[&str]| NodeSelectorTerm {
            requirements: vec![NodeRequirement {
                key,
                operator,
                values: values.iter().map(|v| v.to_string()).collect(),
            }],
        };
        let label = |k: &str| NodeKey::Label(k.into());
        let matches = |t: NodeSelectorTerm| t.matches("n1", &labels);
        assert!(matches(term(label("pool"), NodeOperator::In, &["b", "a"])));
        assert!(!matches(term(label("pool"), NodeOperator::NotIn, &["a"])));
        assert!(
            matches(term(label("zone"), NodeOperator::NotIn, &["a"])),
            "absent is not in"
        );
        assert!(matches(term(label("pool"), NodeOperator::Exists, &[])));
        assert!(matches(term(
            label("zone"),
            NodeOperator::DoesNotExist,
            &[]
        )));
        assert!(matches(term(label("gpus"), NodeOperator::Gt, &["4"])));
        assert!(!matches(term(label("gpus"), NodeOperator::Lt, &["8"])));
        assert!(
            !matches(term(label("pool"), NodeOperator::Gt, &["1"])),
            "not a number"
        );
        assert!(matches(term(NodeKey::Name, NodeOperator::In, &["n1"])));
        assert!(
            !matches(NodeSelectorTerm::default()),
            "an empty term matches nothing"
        );
    }

    fn taint(key: &str, value: &str, effect: TaintEffect) -> Taint {
        Taint {
            key: key.into(),
            value: value.into(),
            effect,
        }
    }

    #[test]
    fn toleration_matching_follows_kubernetes_rules() {
        let spot = taint("spot", "true", TaintEffect::NoSchedule);
        assert!(Toleration::equal("spot", "true", TaintEffect::NoSchedule).tolerates(&spot));
        assert!(!Toleration::equal("spot", "false", TaintEffect::NoSchedule).tolerates(&spot));
        assert!(!Toleration::equal("spot", "true", TaintEffect::NoExecute).tolerates(&spot));
        assert!(Toleration::exists("spot", TaintEffect::NoSchedule).tolerates(&spot));
        let wildcard = Toleration {
            key: None,
            operator: TolerationOperator::Exists,
            value: None,
            effect: None,
        };
        assert!(wildcard.tolerates(&spot));
        let no_effect = Toleration {
            key: Some("spot".into()),
            operator: TolerationOperator::Exists,
            value: None,
            effect: None,
        };
        assert!(no_effect.tolerates(&taint("spot", "x", TaintEffect::NoExecute)));
    }

    #[test]
    fn cpu_and_memory_read_as_a_user_writes_them() {
        let both = CpuMemory {
            cpu_millis: 1500,
            memory_bytes: 64 << 30,
        };
        assert_eq!(both.to_string(), "cpu 1500m, memory 64Gi");
        let cpu = CpuMemory {
            cpu_millis: 16_000,
            memory_bytes: 0,
        };
        assert_eq!(cpu.to_string(), "cpu 16");
        let odd = CpuMemory {
            cpu_millis: 0,
            memory_bytes: 1_000_000_000,
        };
        assert_eq!(odd.to_string(), "memory 1000000000");
        assert_eq!(CpuMemory::default().to_string(), "no cpu or memory");
        assert_eq!(cpu.workers_in(both), 0);
        assert_eq!(both.workers_in(cpu.times(2)), 0, "no memory free");
        assert_eq!(cpu.workers_in(cpu.times(3)), 3);
        assert_eq!(CpuMemory::default().workers_in(cpu), u32::MAX);
    }

    #[test]
    fn mig_profile_names_parse_into_sizes() {
        let p = MigProfile::parse("3g.20gb");
        assert_eq!(p.compute_slices, Some(3));
        assert_eq!(p.memory_gb, Some(20));
        let me = MigProfile::parse("1g.10gb+me");
        assert_eq!(me.memory_gb, Some(10));
        let odd = MigProfile::parse("custom");
        assert_eq!(odd.memory_gb, None);
        assert_eq!(
            ResourceKind::from_quota_name("nvidia.com/mig-1g.5gb"),
            Some(ResourceKind::Mig(MigProfile::parse("1g.5gb")))
        );
        assert_eq!(ResourceKind::from_quota_name("cpu"), None);
        assert_eq!(ResourceKind::from_quota_name("nvidia.com/mig-"), None);
    }
}
