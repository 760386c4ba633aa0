//! Renders the CRD YAML files under `crds/` from the Rust types.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::{Sweep, TrainingJob, TrainingQueue};

/// One generated CRD file: its name under `crds/` and its YAML text.
pub type CrdFile = (&'static str, String);

/// Command that regenerates the files; named in the header and in the drift test's failure.
pub const CRDGEN_COMMAND: &str = "cargo run -p trainyard-api --bin crdgen";

/// The YAML of every Trainyard CRD, as `(file name, YAML)` pairs in a fixed order.
pub fn generate_crd_files() -> Result<Vec<CrdFile>, yaml_serde::Error> {
    Ok(vec![
        ("trainingjob.yaml", render(&TrainingJob::crd())?),
        ("sweep.yaml", render(&Sweep::crd())?),
        ("trainingqueue.yaml", render(&TrainingQueue::crd())?),
    ])
}

/// Every Trainyard CRD object, e.g. to apply them from a test or an installer.
pub fn all_crds() -> Vec<CustomResourceDefinition> {
    vec![TrainingJob::crd(), Sweep::crd(), TrainingQueue::crd()]
}

fn render(crd: &CustomResourceDefinition) -> Result<String, yaml_serde::Error> {
    let body = yaml_serde::to_string(crd)?;
    Ok(format!(
        "# Generated from the Rust types in shared/api by `{CRDGEN_COMMAND}`. Do not edit.\n{body}"
    ))
}
