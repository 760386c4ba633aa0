//! The deploy manifests and the compose file agree with the code: every service is
//! there, RBAC is least-privilege, and every `TRAINYARD_*` key is one the services read.

use std::collections::BTreeSet;
use std::path::Path;

use serde::Deserialize;
use trainyard_contracts::Service;
use trainyard_runtime::Settings;
use yaml_serde::Value;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn documents(path: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    yaml_serde::Deserializer::from_str(&text)
        .map(|doc| {
            Value::deserialize(doc).unwrap_or_else(|e| panic!("{path} is not valid YAML: {e}"))
        })
        .collect()
}

fn kind_named<'a>(docs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    docs.iter()
        .find(|d| d["kind"].as_str() == Some(kind) && d["metadata"]["name"].as_str() == Some(name))
}

/// Fails unless `TRAINYARD_A__B` names the key `a.b` of the shared settings.
fn assert_known_setting(key: &str) {
    let settings = serde_json::to_value(Settings::default()).expect("settings serialise");
    let path = key
        .strip_prefix("TRAINYARD_")
        .unwrap_or_else(|| panic!("{key} lacks the TRAINYARD_ prefix"));
    let mut node = &settings;
    for part in path.split("__") {
        node = node
            .get(part.to_lowercase())
            .unwrap_or_else(|| panic!("{key}: no setting {part:?}; see README Configuration"));
    }
}

#[test]
fn every_service_has_a_deployment_with_probes_and_its_own_account() {
    let docs = documents("deploy/services.yaml");
    for service in Service::ALL {
        let name = format!("trainyard-{}", service.name());
        let deployment = kind_named(&docs, "Deployment", &name)
            .unwrap_or_else(|| panic!("no Deployment {name}"));
        let pod = &deployment["spec"]["template"]["spec"];
        assert_eq!(pod["serviceAccountName"].as_str(), Some(name.as_str()));
        let container = &pod["containers"][0];
        assert_eq!(
            container["livenessProbe"]["httpGet"]["path"].as_str(),
            Some("/healthz")
        );
        assert_eq!(
            container["readinessProbe"]["httpGet"]["path"].as_str(),
            Some("/readyz")
        );
    }
    let config = documents("deploy/config.yaml");
    let data = config[0]["data"].as_mapping().expect("config data");
    for key in data.keys() {
        assert_known_setting(key.as_str().expect("string key"));
    }
    assert_eq!(
        data[&Value::from("TRAINYARD_HTTP__LISTEN")].as_str(),
        Some("0.0.0.0:9090")
    );
}

fn verbs_of(role: &Value) -> BTreeSet<String> {
    role["rules"]
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|rule| rule["verbs"].as_sequence().cloned().unwrap_or_default())
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect()
}

#[test]
fn rbac_is_least_privilege_and_only_the_planner_writes() {
    let docs = documents("deploy/rbac.yaml");
    let read_only: BTreeSet<String> = ["list", "watch"].map(String::from).into();
    let watcher = kind_named(&docs, "ClusterRole", "trainyard-watcher").expect("watcher role");
    assert_eq!(verbs_of(watcher), read_only, "the watcher never writes");
    let planner = kind_named(&docs, "ClusterRole", "trainyard-planner").expect("planner role");
    assert!(verbs_of(planner).contains("patch"));
    let roles: Vec<&str> = docs
        .iter()
        .filter(|d| matches!(d["kind"].as_str(), Some("ClusterRole" | "Role")))
        .filter_map(|d| d["metadata"]["name"].as_str())
        .collect();
    assert_eq!(
        roles,
        ["trainyard-watcher", "trainyard-planner"],
        "no other service has a role"
    );
    for service in Service::ALL {
        let name = format!("trainyard-{}", service.name());
        let account = kind_named(&docs, "ServiceAccount", &name)
            .unwrap_or_else(|| panic!("no account {name}"));
        let needs_api = matches!(service, Service::Watcher | Service::Planner);
        assert_eq!(
            account["automountServiceAccountToken"]
                .as_bool()
                .unwrap_or(true),
            needs_api,
            "{name}: only the watcher and planner mount a token"
        );
    }
}

#[test]
fn compose_runs_every_service_with_known_settings() {
    let compose = &documents("compose/docker-compose.yaml")[0];
    let services = compose["services"].as_mapping().expect("services");
    assert!(services.contains_key("nats"));
    for service in Service::ALL {
        let entry = &compose["services"][service.name()];
        assert!(entry.is_mapping(), "compose lacks {}", service.name());
        assert_eq!(
            entry["build"]["args"]["SERVICE"].as_str(),
            Some(service.name())
        );
        // A service's own section (TRAINYARD_HPO_TUNER__...) is its crate's
        // config; the watcher and planner reach the simulator through KUBECONFIG.
        let own_section = format!(
            "TRAINYARD_{}__",
            service.name().replace('-', "_").to_uppercase()
        );
        for key in entry["environment"]
            .as_mapping()
            .expect("environment")
            .keys()
        {
            let key = key.as_str().expect("string key");
            if key == "KUBECONFIG" || key.starts_with(&own_section) {
                continue;
            }
            assert_known_setting(key);
        }
    }
}
