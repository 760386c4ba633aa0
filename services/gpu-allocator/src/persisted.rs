//! The adapter's state as saved under the `snapshot` key.
//!
//! A job record's template is nearly always the spec the allocator's own
//! snapshot holds for the job's attempt, and saving both kept every job's
//! spec twice: a third of a save. So the encoding leaves a template out when
//! it equals that spec, and decoding takes it back from there. This happens
//! while encoding, which the service does after releasing the state's lock;
//! the copy made under the lock stays a plain clone.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;

use foldhash::fast::FixedState;
use gpu_allocator_core::{AllocatorSnapshot, FlavorSpec, JobSpec, JobUid};
use serde::ser::SerializeMap;
use serde::{Deserialize, Serialize, Serializer};
use trainyard_contracts::EntityRef;

use crate::mapping::QueueInfo;
use crate::pending_status::PendingStatus;
use crate::state::{JobRecord, Outgoing};

/// Version of [`PersistedState`].
pub const STATE_FORMAT_VERSION: u32 = 1;

/// Per pending job (attempt uid), what its last published explanation said.
pub type PendingStatuses = HashMap<String, PendingStatus, FixedState>;

/// Everything saved under the `snapshot` key.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(try_from = "SavedState")]
pub struct PersistedState {
    pub format_version: u32,
    pub allocator: AllocatorSnapshot,
    pub jobs: BTreeMap<String, Arc<JobRecord>>,
    pub queues: BTreeMap<String, QueueInfo>,
    pub learned_flavors: BTreeMap<String, FlavorSpec>,
    pub pending_status: PendingStatuses,
    pub cpu_admitted: BTreeSet<String>,
    pub outbox: VecDeque<Outgoing>,
    /// Per stream, the sequence of the last message applied: at start, the
    /// messages after it are replayed, since they may have been acked after
    /// this snapshot was saved.
    pub applied: BTreeMap<String, u64>,
}

/// A job record as saved: `template` is absent when it is the allocator's
/// spec of the attempt (saves from before 2026-11-26 always have it).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SavedJobRecord {
    entity: EntityRef,
    attempt: u32,
    #[serde(default)]
    template: Option<JobSpec>,
    suspended: bool,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SavedJobRecordRef<'a> {
    entity: &'a EntityRef,
    attempt: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    template: Option<&'a JobSpec>,
    suspended: bool,
}

/// The saved form, as read.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct SavedState {
    format_version: u32,
    allocator: AllocatorSnapshot,
    #[serde(default)]
    jobs: BTreeMap<String, SavedJobRecord>,
    #[serde(default)]
    queues: BTreeMap<String, QueueInfo>,
    #[serde(default)]
    learned_flavors: BTreeMap<String, FlavorSpec>,
    /// Saves of before 2026-11-26 kept a text hash under `explained`
    /// instead; it is ignored, and their pending jobs are explained once more.
    #[serde(default)]
    pending_status: PendingStatuses,
    #[serde(default)]
    cpu_admitted: BTreeSet<String>,
    #[serde(default)]
    outbox: VecDeque<Outgoing>,
    #[serde(default)]
    applied: BTreeMap<String, u64>,
}

/// The saved form, as written: borrows the state, leaves out templates.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SavedStateRef<'a> {
    format_version: u32,
    allocator: &'a AllocatorSnapshot,
    jobs: SavedJobs<'a>,
    queues: &'a BTreeMap<String, QueueInfo>,
    learned_flavors: &'a BTreeMap<String, FlavorSpec>,
    pending_status: &'a PendingStatuses,
    cpu_admitted: &'a BTreeSet<String>,
    outbox: &'a VecDeque<Outgoing>,
    applied: &'a BTreeMap<String, u64>,
}

/// The core's job specs by uid: where a record's left-out template is.
fn specs_by_uid(allocator: &AllocatorSnapshot) -> HashMap<&JobUid, &JobSpec, FixedState> {
    allocator
        .jobs
        .iter()
        .map(|job| (&job.spec.uid, &job.spec))
        .collect()
}

/// The job records, each template left out when `specs` has it.
struct SavedJobs<'a> {
    jobs: &'a BTreeMap<String, Arc<JobRecord>>,
    specs: HashMap<&'a JobUid, &'a JobSpec, FixedState>,
}

impl Serialize for SavedJobs<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(self.jobs.len()))?;
        for (key, rec) in self.jobs {
            let template: &JobSpec = &rec.template;
            let saved = SavedJobRecordRef {
                entity: &rec.entity,
                attempt: rec.attempt,
                template: (self.specs.get(&template.uid) != Some(&template)).then_some(template),
                suspended: rec.suspended,
            };
            map.serialize_entry(key, &saved)?;
        }
        map.end()
    }
}

impl Serialize for PersistedState {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let specs = specs_by_uid(&self.allocator);
        SavedStateRef {
            format_version: self.format_version,
            allocator: &self.allocator,
            jobs: SavedJobs {
                jobs: &self.jobs,
                specs,
            },
            queues: &self.queues,
            learned_flavors: &self.learned_flavors,
            pending_status: &self.pending_status,
            cpu_admitted: &self.cpu_admitted,
            outbox: &self.outbox,
            applied: &self.applied,
        }
        .serialize(serializer)
    }
}

impl TryFrom<SavedState> for PersistedState {
    type Error = String;

    fn try_from(saved: SavedState) -> Result<Self, String> {
        let specs = specs_by_uid(&saved.allocator);
        let mut jobs = BTreeMap::new();
        for (key, rec) in saved.jobs {
            let template = match rec.template {
                Some(template) => template,
                None => {
                    let uid = JobUid::for_attempt(&rec.entity.uid, rec.attempt);
                    let Some(spec) = specs.get(&uid) else {
                        return Err(format!(
                            "jobs[{key}]: no template saved, and allocator.jobs has no job \
                             {uid} to take it from"
                        ));
                    };
                    (*spec).clone()
                }
            };
            jobs.insert(
                key,
                Arc::new(JobRecord {
                    entity: rec.entity,
                    attempt: rec.attempt,
                    template,
                    suspended: rec.suspended,
                }),
            );
        }
        Ok(PersistedState {
            format_version: saved.format_version,
            allocator: saved.allocator,
            jobs,
            queues: saved.queues,
            learned_flavors: saved.learned_flavors,
            pending_status: saved.pending_status,
            cpu_admitted: saved.cpu_admitted,
            outbox: saved.outbox,
            applied: saved.applied,
        })
    }
}
