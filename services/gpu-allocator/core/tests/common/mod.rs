//! Builders shared by the policy tests.
#![allow(dead_code)]

use gpu_allocator_core::*;

/// Flavor name the allocator derives for `product` on-demand nodes.
pub const A100: &str = "A100.on-demand";

pub fn node(name: &str, gpus: u32) -> NodeInfo {
    let mut info = NodeInfo {
        name: name.into(),
        ready: true,
        ..NodeInfo::default()
    };
    info.allocatable
        .insert(names::GPU_RESOURCE.into(), gpus.to_string());
    info.labels
        .insert(names::GPU_PRODUCT_LABEL.into(), "A100".into());
    info.labels
        .insert(names::HOSTNAME_LABEL.into(), name.into());
    info
}

pub fn node_in(name: &str, gpus: u32, zone: &str, rack: &str) -> NodeInfo {
    let mut info = node(name, gpus);
    info.labels.insert(names::ZONE_LABEL.into(), zone.into());
    info.labels
        .insert(names::NVLINK_CLIQUE_LABEL.into(), rack.into());
    info
}

pub fn gpu_quota(nominal: u64) -> ResourceQuota {
    ResourceQuota {
        resource: names::GPU_RESOURCE.into(),
        nominal,
        ..ResourceQuota::default()
    }
}

pub fn queue(name: &str, cohort: Option<&str>, nominal: u64) -> QueueSpec {
    QueueSpec {
        name: name.into(),
        cohort: cohort.map(str::to_string),
        quotas: vec![FlavorQuota {
            flavor: A100.into(),
            resources: vec![gpu_quota(nominal)],
        }],
        ..QueueSpec::default()
    }
}

pub fn job(uid: &str, queue: &str, workers: u32, gpus: u32) -> JobSpec {
    JobSpec {
        uid: JobUid::new(uid),
        namespace: "ml".into(),
        name: uid.into(),
        queue: Some(queue.into()),
        num_workers: workers,
        gpus_per_worker: gpus,
        ..JobSpec::default()
    }
}

/// `j` with its workers pinned to node `host`.
pub fn pinned(mut j: JobSpec, host: &str) -> JobSpec {
    j.node_selector
        .insert(names::HOSTNAME_LABEL.into(), host.into());
    j
}

/// The victims of the cycle's one preemption, by uid, sorted.
pub fn only_victims(out: &CycleOutcome) -> Vec<String> {
    assert_eq!(out.preemptions.len(), 1, "one preemption");
    let mut victims: Vec<String> = out.preemptions[0]
        .victims
        .iter()
        .map(|v| v.uid.as_str().to_string())
        .collect();
    victims.sort_unstable();
    victims
}

pub fn uid(s: &str) -> JobUid {
    JobUid::new(s)
}

pub fn no_preemption() -> PreemptionPolicy {
    PreemptionPolicy {
        enabled: false,
        ..PreemptionPolicy::default()
    }
}

pub struct Harness {
    pub alloc: Allocator,
    pub log: Vec<Event>,
}

impl Harness {
    pub fn new(config: AllocatorConfig) -> Self {
        Harness {
            alloc: Allocator::new(config).expect("valid config"),
            log: Vec::new(),
        }
    }

    pub fn default_config() -> Self {
        Self::new(AllocatorConfig::default())
    }

    /// Defaults with preemption off: what the queue does by waiting alone.
    pub fn without_preemption() -> Self {
        Self::new(AllocatorConfig {
            preemption: no_preemption(),
            ..AllocatorConfig::default()
        })
    }

    pub fn apply(&mut self, event: Event) {
        self.log.push(event.clone());
        self.alloc.apply(event).expect("event accepted");
    }

    pub fn nodes(&mut self, nodes: impl IntoIterator<Item = NodeInfo>) {
        for n in nodes {
            self.apply(Event::NodeUpserted(n));
        }
    }

    pub fn queue(&mut self, q: QueueSpec) {
        self.apply(Event::QueueUpserted(q));
    }

    pub fn submit(&mut self, j: JobSpec) {
        self.apply(Event::JobSubmitted(j));
    }

    /// Submits `j` as submitted at `at` (its place in line).
    pub fn submit_at(&mut self, mut j: JobSpec, at: u64) {
        j.submitted_at = Timestamp(at);
        self.submit(j);
    }

    pub fn finish(&mut self, u: &str) {
        self.apply(Event::JobFinished { uid: uid(u) });
    }

    /// Runs a cycle and records its decisions in the log, as the adapter would.
    pub fn cycle(&mut self, now: u64) -> CycleOutcome {
        let out = self.alloc.cycle(Timestamp(now));
        for e in &out.evictions {
            self.log.push(Event::Evicted(e.clone()));
        }
        for a in &out.admissions {
            self.log.push(Event::Admitted(a.clone()));
        }
        for p in &out.preemptions {
            self.log.push(Event::PreemptionStarted(p.clone()));
        }
        for d in &out.drains {
            self.log.push(Event::DrainStarted(d.clone()));
        }
        out
    }

    /// The explanation of `u`'s wait in `out`.
    pub fn reason_of(&self, out: &CycleOutcome, u: &str) -> PendingExplanation {
        let explained: Vec<PendingExplanation> = out
            .pending
            .iter()
            .filter_map(|p| self.alloc.explain(out, p))
            .collect();
        explained
            .iter()
            .find(|p| p.uid.as_str() == u)
            .cloned()
            .unwrap_or_else(|| {
                panic!("{u} should be pending with a reason; pending: {explained:?}")
            })
    }

    /// Asserts that `u` waits because quota is kept for `holder`, ahead in line.
    pub fn assert_held_for(&self, out: &CycleOutcome, u: &str, holder: &str) {
        let why = self.reason_of(out, u).reason;
        assert!(
            matches!(&*why, PendingReason::QuotaExceeded { held_for: Some(h), .. } if h.as_str() == holder),
            "{u} should wait for {holder}: {why:?}"
        );
    }

    pub fn admitted(&self, u: &str) -> Option<&Admission> {
        self.alloc.admission(&uid(u))
    }

    pub fn nodes_of(&self, u: &str) -> Vec<String> {
        self.admitted(u)
            .map(|a| a.workers.iter().map(|w| w.node.clone()).collect())
            .unwrap_or_default()
    }
}

pub fn admitted_uids(out: &CycleOutcome) -> Vec<String> {
    out.admissions.iter().map(|a| a.uid.to_string()).collect()
}

pub const GIB: u64 = 1 << 30;

pub fn cpu_memory(cores: u64, memory_gib: u64) -> CpuMemory {
    CpuMemory {
        cpu_millis: cores * 1000,
        memory_bytes: memory_gib * GIB,
    }
}

/// An 8-GPU node with 64 cores and 512 GiB, of which other pods request `other`.
pub fn host(name: &str, other: CpuMemory) -> NodeInfo {
    NodeInfo {
        cpu_memory: Some(cpu_memory(64, 512)),
        cpu_memory_used_by_other_pods: other,
        ..node(name, 8)
    }
}

pub fn asking(mut j: JobSpec, per_worker: CpuMemory) -> JobSpec {
    j.cpu_memory_per_worker = per_worker;
    j
}
