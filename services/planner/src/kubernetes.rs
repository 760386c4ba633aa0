//! Every Kubernetes write Trainyard makes happens here: server-side apply under one
//! field manager, status subresource writes, Job deletions, worker pods' placement
//! gates, Events and the finalizer.

use std::sync::Arc;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::{Api, Client, Resource, ResourceExt};
use nkeys::KeyPair;
use planner_core::{DesiredObjects, PLACEMENT_GATE};
use serde_json::json;
use trainyard_api::placement::LABEL_HOSTNAME;
use trainyard_api::{
    Sweep, SweepStatus, TrainingJob, TrainingJobSpec, TrainingJobStatus, TrainingQueue,
    TrainingQueueStatus,
};

use crate::error::PlannerError;
use crate::events::EventRecorder;

/// Label naming the Sweep a trial belongs to.
pub const SWEEP_LABEL: &str = "trainyard.dev/sweep";
/// Label carrying a trial's index in its Sweep.
pub const TRIAL_INDEX_LABEL: &str = "trainyard.dev/trial-index";

/// Finalizer that lets the planner clean up and announce a deletion.
pub const FINALIZER: &str = "trainyard.dev/cleanup";

/// Deleted, or already gone.
fn gone(result: Result<(), kube::Error>, action: String) -> Result<(), PlannerError> {
    match result {
        Ok(()) => Ok(()),
        Err(err) if is_not_found(&err) => Ok(()),
        Err(source) => Err(PlannerError::Kube {
            action,
            source: Box::new(source),
        }),
    }
}

/// A write to the TrainingJob itself: NotFound means it was deleted meanwhile.
fn training_job_write(
    namespace: String,
    name: String,
    action: &'static str,
) -> impl FnOnce(kube::Error) -> PlannerError {
    move |source| {
        if is_not_found(&source) {
            PlannerError::TrainingJobGone { namespace, name }
        } else {
            PlannerError::kube(format!("{action} {namespace}/{name}"))(source)
        }
    }
}

/// A status apply body, encoded straight from the typed status (a `json!`
/// value would copy the whole status into a tree first).
#[derive(Debug, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct StatusApply<'a, S> {
    api_version: &'a str,
    kind: std::borrow::Cow<'static, str>,
    status: &'a S,
}

impl<'a, S> StatusApply<'a, S> {
    /// The body that applies `status` to an object of kind `K`.
    fn of<K: Resource<DynamicType = ()>>(status: &'a S) -> Self {
        Self {
            api_version: trainyard_api::API_GROUP_VERSION,
            kind: K::kind(&()),
            status,
        }
    }
}

/// Which of a job's desired objects differ from what was last applied.
#[derive(Debug, Clone, Copy)]
pub struct ObjectChanges {
    pub checkpoint_claim: bool,
    pub config_map: bool,
    pub service: bool,
    pub job: bool,
    pub worker_credentials: bool,
}

/// The planner's Kubernetes port.
#[derive(Clone)]
pub struct KubeWriter {
    client: Client,
    field_manager: String,
    recorder: Arc<EventRecorder>,
    /// Signs the workers' NATS tokens, when the planner issues them.
    credentials_issuer: Option<Arc<KeyPair>>,
    /// The CA bundle the workers verify NATS with, put beside their token.
    worker_nats_ca: Option<Arc<str>>,
}

pub(crate) fn is_not_found(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.code == 404)
}

impl KubeWriter {
    pub fn new(client: Client, field_manager: &str) -> Self {
        Self {
            recorder: Arc::new(EventRecorder::new(client.clone(), field_manager)),
            client,
            field_manager: field_manager.to_string(),
            credentials_issuer: None,
            worker_nats_ca: None,
        }
    }

    /// Signs the workers' tokens with `issuer` (`planner.worker_credentials_seed_file`).
    pub fn with_credentials_issuer(mut self, issuer: Arc<KeyPair>) -> Self {
        self.credentials_issuer = Some(issuer);
        self
    }

    /// Hands the workers `ca` (`planner.worker_nats_ca_file`) with their token.
    pub fn with_worker_nats_ca(mut self, ca: Arc<str>) -> Self {
        self.worker_nats_ca = Some(ca);
        self
    }

    fn apply_params(&self) -> PatchParams {
        PatchParams::apply(&self.field_manager).force()
    }

    fn jobs(&self, namespace: &str) -> Api<TrainingJob> {
        Api::namespaced(self.client.clone(), namespace)
    }

    pub async fn get(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<TrainingJob>, PlannerError> {
        self.jobs(namespace)
            .get_opt(name)
            .await
            .map_err(PlannerError::kube(format!(
                "get trainingjob {namespace}/{name}"
            )))
    }

    pub async fn list_all(&self) -> Result<Vec<TrainingJob>, PlannerError> {
        Api::<TrainingJob>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .map(|list| list.items)
            .map_err(PlannerError::kube("list trainingjobs"))
    }

    /// Applies the changed ones of the ConfigMap and the Service together, then
    /// the Job if it changed: its workers mount the ConfigMap and use the
    /// Service as their subdomain. A suspended Job has no workers yet, so it
    /// goes together with them.
    pub async fn apply(
        &self,
        namespace: &str,
        objects: &DesiredObjects,
        changes: ObjectChanges,
    ) -> Result<(), PlannerError> {
        let params = PatchParams::apply(&objects.field_manager).force();
        // The claim first: the workers mount it, and it outlives every attempt.
        if let Some(claim) = &objects.checkpoint_claim {
            self.apply_if(changes.checkpoint_claim, namespace, &params, claim)
                .await?;
        }
        // The workers' token, signed now: its lifetime counts from admission.
        if let Some(credentials) = objects
            .worker_credentials
            .as_ref()
            .filter(|_| changes.worker_credentials)
        {
            let issuer = self.credentials_issuer.as_ref().ok_or_else(|| {
                PlannerError::Credentials(
                    "worker credentials asked for without planner.worker_credentials_seed_file loaded"
                        .into(),
                )
            })?;
            let secret = credentials
                .secret(issuer, self.worker_nats_ca.as_deref(), chrono::Utc::now())
                .map_err(|err| PlannerError::Credentials(err.to_string()))?;
            self.apply_if(true, namespace, &params, &secret).await?;
        }
        let config_map = self.apply_if(changes.config_map, namespace, &params, &objects.config_map);
        let service = self.apply_if(changes.service, namespace, &params, &objects.service);
        let job = self.apply_if(changes.job, namespace, &params, &objects.job);
        if objects.job_suspended() {
            futures::try_join!(config_map, service, job)?;
        } else {
            futures::try_join!(config_map, service)?;
            job.await?;
        }
        Ok(())
    }

    /// Server-side applies one namespaced object if it `changed`.
    async fn apply_if<K>(
        &self,
        changed: bool,
        namespace: &str,
        params: &PatchParams,
        object: &K,
    ) -> Result<(), PlannerError>
    where
        K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
            + serde::Serialize
            + serde::de::DeserializeOwned
            + Clone
            + std::fmt::Debug,
        K::DynamicType: Default,
    {
        if !changed {
            return Ok(());
        }
        let name = object.name_any();
        Api::<K>::namespaced(self.client.clone(), namespace)
            .patch(&name, params, &Patch::Apply(object))
            .await
            .map(|_| ())
            .map_err(PlannerError::kube(format!(
                "apply {} {namespace}/{name}",
                K::kind(&Default::default()).to_lowercase()
            )))
    }

    /// Deletes a Job and (in the background) its pods. Already gone is fine.
    pub async fn delete_job(&self, namespace: &str, name: &str) -> Result<(), PlannerError> {
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Background),
            ..Default::default()
        };
        gone(
            Api::<Job>::namespaced(self.client.clone(), namespace)
                .delete(name, &params)
                .await
                .map(|_| ()),
            format!("delete job {namespace}/{name}"),
        )
    }

    /// Removes [`PLACEMENT_GATE`] from a worker pod and adds its planned node
    /// to its node selector, in one strategic merge patch: the gate is deleted
    /// by name, so other controllers' gates stay, and the selector is added
    /// while the pod is still gated, the only time Kubernetes allows it. A pod
    /// gone meanwhile needs nothing; one the API server refuses (someone else
    /// removed the gate first) keeps the pin to the planned set and is logged.
    pub async fn ungate_worker(
        &self,
        namespace: &str,
        pod: &str,
        node: Option<&str>,
    ) -> Result<(), PlannerError> {
        let mut spec = json!({"schedulingGates": [{"name": PLACEMENT_GATE, "$patch": "delete"}]});
        if let Some(node) = node {
            spec["nodeSelector"] = json!({ LABEL_HOSTNAME: node });
        }
        let result = Api::<Pod>::namespaced(self.client.clone(), namespace)
            .patch(
                pod,
                &PatchParams::default(),
                &Patch::Strategic(json!({ "spec": spec })),
            )
            .await;
        match result {
            Err(kube::Error::Api(status)) if status.code == 422 => {
                tracing::warn!(%namespace, %pod, reason = %status.message, "worker pod not ungated");
                Ok(())
            }
            other => gone(other.map(|_| ()), format!("ungate pod {namespace}/{pod}")),
        }
    }

    /// Writes the status subresource; returns the object as stored.
    pub async fn write_status(
        &self,
        job: &TrainingJob,
        status: &TrainingJobStatus,
    ) -> Result<TrainingJob, PlannerError> {
        let namespace = job.namespace().unwrap_or_default();
        let name = job.name_any();
        let patch = StatusApply::of::<TrainingJob>(status);
        self.jobs(&namespace)
            .patch_status(&name, &self.apply_params(), &Patch::Apply(&patch))
            .await
            .map_err(training_job_write(namespace, name, "write status"))
    }

    /// Sets `spec.suspend: true` (an idle job, its checkpoint verified);
    /// returns the TrainingJob as stored. A merge patch, so that the user's
    /// `kubectl patch ... suspend:false` takes the field back without a conflict.
    pub async fn suspend(&self, job: &TrainingJob) -> Result<TrainingJob, PlannerError> {
        let namespace = job.namespace().unwrap_or_default();
        let name = job.name_any();
        let patch = json!({"spec": {"suspend": true}});
        self.jobs(&namespace)
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(training_job_write(namespace, name, "suspend"))
    }

    /// Records a Kubernetes Event on the TrainingJob (`kubectl describe` shows
    /// them) in the background, as client-go's recorder does: an Event is for
    /// people, and the job's next message need not wait for it, nor fail
    /// with it.
    pub fn record_event(&self, job: &TrainingJob, warning: bool, reason: String, message: &str) {
        let note: String = message.chars().take(1024).collect();
        let regarding = job.object_ref(&());
        let recorder = Arc::clone(&self.recorder);
        tokio::spawn(async move {
            if let Err(err) = recorder.publish(&regarding, warning, &reason, &note).await {
                let job = regarding.name.unwrap_or_default();
                tracing::warn!(%job, error = %err, "event not recorded");
            }
        });
    }

    /// Adds the cleanup finalizer if missing; returns the TrainingJob as stored
    /// then (the watcher does not republish a change of finalizers alone).
    pub async fn ensure_finalizer(
        &self,
        job: &TrainingJob,
    ) -> Result<Option<TrainingJob>, PlannerError> {
        if job.finalizers().iter().any(|f| f == FINALIZER) {
            return Ok(None);
        }
        let mut finalizers = job.finalizers().to_vec();
        finalizers.push(FINALIZER.to_string());
        let patch = json!({"metadata": {"finalizers": finalizers, "resourceVersion": job.resource_version()}});
        let (namespace, name) = (job.namespace().unwrap_or_default(), job.name_any());
        self.jobs(&namespace)
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(Some)
            .map_err(training_job_write(namespace, name, "add finalizer to"))
    }

    /// Deletes everything the TrainingJob owns, then releases it.
    pub async fn finalize(&self, job: &TrainingJob) -> Result<(), PlannerError> {
        let namespace = job.namespace().unwrap_or_default();
        let name = job.name_any();
        let owned = ListParams::default().labels(&format!("{}={name}", planner_core::LABEL_JOB));
        let jobs = Api::<Job>::namespaced(self.client.clone(), &namespace)
            .list(&owned)
            .await
            .map_err(PlannerError::kube(format!(
                "list jobs of {namespace}/{name}"
            )))?;
        for child in jobs.items {
            self.delete_job(&namespace, &child.name_any()).await?;
        }
        let service = planner_core::service_name(&name);
        gone(
            Api::<Service>::namespaced(self.client.clone(), &namespace)
                .delete(&service, &DeleteParams::default())
                .await
                .map(|_| ()),
            format!("delete service {service}"),
        )?;
        let config = planner_core::config_map_name(&name);
        gone(
            Api::<ConfigMap>::namespaced(self.client.clone(), &namespace)
                .delete(&config, &DeleteParams::default())
                .await
                .map(|_| ()),
            format!("delete configmap {config}"),
        )?;
        let finalizers: Vec<&String> = job
            .finalizers()
            .iter()
            .filter(|f| *f != FINALIZER)
            .collect();
        let patch = json!({"metadata": {"finalizers": finalizers}});
        gone(
            self.jobs(&namespace)
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map(|_| ()),
            format!("remove finalizer from {name}"),
        )
    }

    pub async fn get_sweep(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Sweep>, PlannerError> {
        Api::<Sweep>::namespaced(self.client.clone(), namespace)
            .get_opt(name)
            .await
            .map_err(PlannerError::kube(format!("get sweep {namespace}/{name}")))
    }

    /// Applies a trial: a TrainingJob owned by its Sweep. Its name is the tuner's
    /// deterministic trial id, so a replayed request changes nothing.
    pub async fn apply_trial(
        &self,
        sweep: &Sweep,
        trial_name: &str,
        trial_index: u32,
        spec: TrainingJobSpec,
    ) -> Result<(), PlannerError> {
        let namespace = sweep.namespace().unwrap_or_default();
        let mut trial = TrainingJob::new(trial_name, spec);
        trial.metadata.namespace = Some(namespace.clone());
        trial.metadata.owner_references = sweep.controller_owner_ref(&()).map(|owner| vec![owner]);
        trial.metadata.labels = Some(
            [
                (SWEEP_LABEL.to_string(), sweep.name_any()),
                (TRIAL_INDEX_LABEL.to_string(), trial_index.to_string()),
            ]
            .into(),
        );
        self.jobs(&namespace)
            .patch(trial_name, &self.apply_params(), &Patch::Apply(&trial))
            .await
            .map(|_| ())
            .map_err(PlannerError::kube(format!(
                "apply trial {namespace}/{trial_name}"
            )))
    }

    pub async fn write_sweep_status(
        &self,
        sweep: &Sweep,
        status: &SweepStatus,
    ) -> Result<(), PlannerError> {
        let namespace = sweep.namespace().unwrap_or_default();
        let name = sweep.name_any();
        let patch = StatusApply::of::<Sweep>(status);
        Api::<Sweep>::namespaced(self.client.clone(), &namespace)
            .patch_status(&name, &self.apply_params(), &Patch::Apply(&patch))
            .await
            .map(|_| ())
            .map_err(PlannerError::kube(format!(
                "write sweep status {namespace}/{name}"
            )))
    }

    pub async fn get_queue(&self, name: &str) -> Result<Option<TrainingQueue>, PlannerError> {
        Api::<TrainingQueue>::all(self.client.clone())
            .get_opt(name)
            .await
            .map_err(PlannerError::kube(format!("get trainingqueue {name}")))
    }

    /// Writes a TrainingQueue's status subresource. A queue deleted since it
    /// was read needs no status.
    pub async fn write_queue_status(
        &self,
        name: &str,
        status: &TrainingQueueStatus,
    ) -> Result<(), PlannerError> {
        let patch = StatusApply::of::<TrainingQueue>(status);
        gone(
            Api::<TrainingQueue>::all(self.client.clone())
                .patch_status(name, &self.apply_params(), &Patch::Apply(&patch))
                .await
                .map(|_| ()),
            format!("write trainingqueue status {name}"),
        )
    }

    /// Labels of an existing TrainingJob, or None when there is none.
    pub async fn training_job_labels(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Option<std::collections::BTreeMap<String, String>>, PlannerError> {
        Ok(self
            .jobs(namespace)
            .get_opt(name)
            .await
            .map_err(PlannerError::kube(format!(
                "get trainingjob {namespace}/{name}"
            )))?
            .map(|job| job.metadata.labels.unwrap_or_default()))
    }

    /// Creates (or, when `exists`, updates) a TrainingJob submitted over NATS.
    pub async fn submit(
        &self,
        accepted: &planner_core::Accepted,
        exists: bool,
    ) -> Result<(), PlannerError> {
        let (namespace, name) = (accepted.namespace.as_str(), accepted.name.as_str());
        let mut job = TrainingJob::new(name, accepted.spec.clone());
        job.metadata.namespace = Some(namespace.to_string());
        job.metadata.labels = Some(accepted.labels.clone());
        job.metadata.annotations = Some(accepted.annotations.clone());
        let api = self.jobs(namespace);
        if exists {
            api.patch(name, &self.apply_params(), &Patch::Apply(&job))
                .await
                .map(|_| ())
                .map_err(PlannerError::kube(format!(
                    "apply trainingjob {namespace}/{name}"
                )))
        } else {
            api.create(&PostParams::default(), &job)
                .await
                .map(|_| ())
                .map_err(PlannerError::kube(format!(
                    "create trainingjob {namespace}/{name}"
                )))
        }
    }
}
