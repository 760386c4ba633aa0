//! The checked-in CRD YAML under crds/ must equal what the Rust types generate.

mod common;

use trainyard_api::{CRDGEN_COMMAND, generate_crd_files};

#[test]
fn checked_in_crds_match_the_rust_types() {
    let crds_dir = common::workspace_root().join("crds");
    let files = generate_crd_files().expect("CRDs render to YAML");
    assert_eq!(files.len(), 3, "one file per kind");
    let mut stale = Vec::new();
    for (file_name, generated) in &files {
        let path = crds_dir.join(file_name);
        match std::fs::read_to_string(&path) {
            Ok(checked_in) if checked_in == *generated => {}
            Ok(_) => stale.push(format!("crds/{file_name} differs from the Rust types")),
            Err(error) => stale.push(format!("crds/{file_name} cannot be read ({error})")),
        }
    }
    assert!(
        stale.is_empty(),
        "{}\nThe CRD YAML is generated from shared/api; regenerate it with `{CRDGEN_COMMAND}` and commit the result.",
        stale.join("\n")
    );
}

#[test]
fn generated_yaml_parses_back_into_the_same_crds() {
    // Guards the renderer: what we write must be exactly the CRD objects kube derives.
    for ((file_name, yaml), crd) in generate_crd_files()
        .expect("CRDs render to YAML")
        .iter()
        .zip(trainyard_api::all_crds())
    {
        let parsed: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition =
            yaml_serde::from_str(yaml).unwrap_or_else(|e| panic!("{file_name} does not parse: {e}"));
        assert_eq!(parsed, crd, "{file_name}");
    }
}
