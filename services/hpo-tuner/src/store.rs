//! Sweep state in the `trainyard_tuner` KV bucket, one key per Sweep
//! (`<namespace>/<name>`), written with compare-and-set on the key's revision so
//! two replicas can never overwrite each other's decisions.

use async_nats::jetstream::kv::{self, Operation, UpdateErrorKind};
use bytes::Bytes;
use futures::TryStreamExt;
use std::collections::BTreeMap;

use hpo_tuner_core::{ParamValue, SweepCore};
use serde::{Deserialize, Serialize};
use trainyard_api::{ANNOTATION_MODEL_NAME, ANNOTATION_NOTIFY_PREFIX, Sweep};
use trainyard_contracts::EntityRef;
use trainyard_contracts::decisions::SweepProgressed;

use crate::error::TunerError;
use crate::routing::Outgoing;
use crate::spec::ParamCodec;

/// The well-known parameter that sets a trial's epochs.
pub const EPOCHS_PARAMETER: &str = "epochs";

/// Version of [`SweepState`]'s stored form.
pub const STATE_VERSION: u32 = 1;

/// Everything the tuner keeps about one Sweep.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SweepState {
    pub version: u32,
    /// Namespace, name and uid of the Sweep this state belongs to.
    pub sweep: EntityRef,
    /// The sweep state machine (stored as its snapshot).
    pub core: SweepCore,
    pub codec: ParamCodec,
    /// Epochs a trial trains (the trial template's), unless `epochs` is searched.
    #[serde(default)]
    pub epochs: u32,
    /// Sequence of the last `SweepProgressed` published (part of its message id).
    #[serde(default)]
    pub progress_seq: u64,
    /// The last `SweepProgressed` published; a new one goes out only when it differs.
    #[serde(default)]
    pub last_progress: Option<SweepProgressed>,
    /// Decided messages not yet acknowledged by JetStream.
    #[serde(default)]
    pub outbox: Vec<Outgoing>,
    /// The Sweep's labels and notification annotations, as last applied.
    #[serde(default)]
    pub metadata: SweepMetadata,
    /// The trial template's `monitoring.mlflowTrackingUri`, as created.
    #[serde(default)]
    pub tracking_uri: Option<String>,
    /// Why the Sweep is recorded on the tuner's own MLflow server instead.
    #[serde(default)]
    pub tracking_warning: Option<String>,
}

/// What subscribers of the sweep's progress route on (the notifier): the
/// Sweep's labels and its `trainyard.dev/notify*` annotations (no others).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SweepMetadata {
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

impl SweepMetadata {
    pub fn of(sweep: &Sweep) -> Self {
        let meta = &sweep.metadata;
        Self {
            labels: meta.labels.clone().unwrap_or_default(),
            annotations: meta
                .annotations
                .iter()
                .flatten()
                .filter(|(key, _)| {
                    key.starts_with(ANNOTATION_NOTIFY_PREFIX) || *key == ANNOTATION_MODEL_NAME
                })
                .map(|(key, value)| (key.clone(), value.clone()))
                .collect(),
        }
    }
}

impl SweepState {
    pub fn new(sweep: EntityRef, core: SweepCore, codec: ParamCodec, epochs: u32) -> Self {
        Self {
            version: STATE_VERSION,
            sweep,
            core,
            codec,
            epochs,
            progress_seq: 0,
            last_progress: None,
            outbox: Vec::new(),
            metadata: SweepMetadata::default(),
            tracking_uri: None,
            tracking_warning: None,
        }
    }

    /// Epochs trial `trial_id` trains: its `epochs` parameter when that is
    /// searched, else the trial template's.
    pub fn trial_epochs(&self, trial_id: &str) -> u32 {
        self.core
            .trial(trial_id)
            .and_then(|t| match t.params.get(EPOCHS_PARAMETER) {
                Some(ParamValue::Int(n)) => u32::try_from(*n).ok(),
                _ => None,
            })
            .unwrap_or(self.epochs)
    }

    pub fn encode(&self) -> Result<Bytes, TunerError> {
        serde_json::to_vec(self)
            .map(Bytes::from)
            .map_err(|err| TunerError::Store(format!("encode {}: {err}", self.sweep.key())))
    }

    pub fn decode(key: &str, bytes: &[u8]) -> Result<Self, TunerError> {
        let corrupt = |message: String| TunerError::CorruptState {
            key: key.to_string(),
            message,
        };
        let state: SweepState =
            serde_json::from_slice(bytes).map_err(|err| corrupt(err.to_string()))?;
        if state.version != STATE_VERSION {
            return Err(corrupt(format!(
                "state version {} is not {STATE_VERSION}",
                state.version
            )));
        }
        Ok(state)
    }
}

/// A key as last read: its revision (0 when it never existed; a delete marker's
/// revision when deleted) and its value, if it holds one.
#[derive(Debug, Clone, Default)]
pub struct Stored {
    pub revision: u64,
    pub value: Option<Bytes>,
}

#[derive(Clone)]
pub struct StateStore {
    bucket: kv::Store,
}

impl StateStore {
    pub fn new(bucket: kv::Store) -> Self {
        Self { bucket }
    }

    pub async fn read(&self, key: &str) -> Result<Stored, TunerError> {
        let entry = self
            .bucket
            .entry(key)
            .await
            .map_err(|err| TunerError::Store(format!("get {key}: {err}")))?;
        Ok(match entry {
            None => Stored::default(),
            Some(entry) => Stored {
                revision: entry.revision,
                value: (entry.operation == Operation::Put).then_some(entry.value),
            },
        })
    }

    /// Writes `value` if the key is still at `revision`; returns the new revision.
    pub async fn write(&self, key: &str, value: Bytes, revision: u64) -> Result<u64, TunerError> {
        self.bucket
            .update(key, value, revision)
            .await
            .map_err(|err| match err.kind() {
                UpdateErrorKind::WrongLastRevision => TunerError::Conflict(key.to_string()),
                _ => TunerError::Store(format!("put {key}: {err}")),
            })
    }

    /// Removes the key and its history.
    pub async fn remove(&self, key: &str) -> Result<(), TunerError> {
        self.bucket
            .purge(key)
            .await
            .map_err(|err| TunerError::Store(format!("purge {key}: {err}")))
    }

    /// Every key that holds a sweep.
    pub async fn keys(&self) -> Result<Vec<String>, TunerError> {
        let keys = self
            .bucket
            .keys()
            .await
            .map_err(|err| TunerError::Store(format!("list keys: {err}")))?;
        keys.try_collect()
            .await
            .map_err(|err| TunerError::Store(format!("list keys: {err}")))
    }
}
