//! `delete`, `suspend` and `resume`: the writes kubectl users make by hand, by name.

use std::io::Write;

use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, Client, Resource};
use serde_json::json;
use trainyard_api::TrainingJob;

use crate::error::CliError;
use crate::resources::{Listed, Scope};

/// `<plural>.<group>/<name>`, as kubectl names what it changed.
fn reference<K: Resource<DynamicType = ()>>(name: &str) -> String {
    format!("{}.{}/{name}", K::kind(&()).to_lowercase(), K::group(&()))
}

/// Deletes each named object (its Jobs, pods and Service go with it: the planner's
/// finalizer cleans up).
pub async fn delete<K: Listed>(
    client: Client,
    namespace: &str,
    names: &[String],
    out: &mut dyn Write,
) -> Result<(), CliError> {
    // A cluster-scoped kind's `api` ignores the namespace.
    let api = K::api(client, &Scope::Namespace(namespace.to_owned()));
    for name in names {
        api.delete(name, &DeleteParams::background())
            .await
            .map_err(CliError::kube(format!("delete {}", reference::<K>(name))))?;
        writeln!(out, "{} deleted", reference::<K>(name))?;
    }
    Ok(())
}

/// Sets `spec.suspend` on each named TrainingJob: the planner checkpoints and stops a
/// suspended job and gives its GPUs back; resuming queues it again from its checkpoint.
pub async fn set_suspended(
    client: Client,
    namespace: &str,
    names: &[String],
    suspend: bool,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let api: Api<TrainingJob> = Api::namespaced(client, namespace);
    let patch = json!({"spec": {"suspend": suspend}});
    let verb = if suspend { "suspended" } else { "resumed" };
    for name in names {
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(CliError::kube(format!(
                "set spec.suspend={suspend} on {}",
                reference::<TrainingJob>(name)
            )))?;
        writeln!(out, "{} {verb}", reference::<TrainingJob>(name))?;
    }
    Ok(())
}
