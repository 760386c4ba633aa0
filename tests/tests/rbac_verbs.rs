//! The RBAC roles in `deploy/rbac.yaml` grant exactly the verbs the watcher's
//! and the planner's code uses, per resource: no verb granted and never used,
//! none used and not granted. The uses are read off the sources:
//!
//! - a kube-rs call `.get_opt(`, `.get(`, `.list(`, `.create(`, `.patch(`,
//!   `.patch_status(`, `.delete(` on an `Api<K>` (built in the call's chain,
//!   bound to a variable or parameter, or returned by a helper `fn ... ->
//!   Api<K>`), whose `K` names the resource; `.patch_status(` is a patch of
//!   the status subresource;
//! - a server-side apply (`Patch::Apply`) of an object is a patch, and a
//!   create when the object does not exist yet, which the API server
//!   authorizes as create; a generic `Api::<K>` applies every object of
//!   `planner_core::DesiredObjects`;
//! - a watch (`watcher(`, the watcher's `spawn_watch(`) lists, then watches;
//! - an owner reference with `blockOwnerDeletion` (kube's
//!   `controller_owner_ref`, or `block_owner_deletion: Some(true)` with the
//!   owner's kind) needs update on the owner's `finalizers` subresource.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use yaml_serde::Value;

/// (API group, resource, verb).
type Grant = (String, String, String);

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The API group and resource of a Rust type an `Api<K>` is built over
/// (the watcher's own slim types read Jobs and Pods).
fn resource_of(kind: &str, events_group: &str) -> Option<(String, String)> {
    let (group, resource) = match kind {
        "TrainingJob" => ("trainyard.dev", "trainingjobs"),
        "Sweep" => ("trainyard.dev", "sweeps"),
        "TrainingQueue" => ("trainyard.dev", "trainingqueues"),
        "Job" | "WatchedJob" => ("batch", "jobs"),
        "Pod" | "WatchedPod" | "OtherPod" => ("", "pods"),
        "Node" => ("", "nodes"),
        "Service" => ("", "services"),
        "ConfigMap" => ("", "configmaps"),
        "PersistentVolumeClaim" => ("", "persistentvolumeclaims"),
        // The planner signs the workers' credentials into a Secret when applying them.
        "Secret" | "WorkerCredentials" => ("", "secrets"),
        "Event" => (events_group, "events"),
        _ => return None,
    };
    Some((group.to_owned(), resource.to_owned()))
}

/// The code (before its unit tests) of every `.rs` file under `dir`.
fn sources(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        for entry in entries {
            let path: PathBuf = entry.expect("directory entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let text = std::fs::read_to_string(&path).expect("source readable");
                let code = text.split("#[cfg(test)]").next().unwrap_or_default();
                out.push(code.to_owned());
            }
        }
    }
    out
}

/// The identifier (with `::`, `<>` and `.`) ending at `end` in `text`.
fn path_before(text: &str, end: usize) -> &str {
    let start = text[..end]
        .rfind(|c: char| !(c.is_alphanumeric() || "_:<>.".contains(c)))
        .map_or(0, |i| i + 1);
    &text[start..end]
}

/// The index of the `(` matching the `)` at `close`.
fn matching_open(text: &str, close: usize) -> Option<usize> {
    let mut depth = 0usize;
    for (i, c) in text[..=close].char_indices().rev() {
        match c {
            ')' => depth += 1,
            '(' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
    }
    None
}

/// The `K` of `Api::<K>` in `path`, `K` being `Generic` for a type parameter.
fn turbofish_kind(path: &str) -> Option<String> {
    let rest = path.split("Api::<").nth(1)?;
    let kind = rest.split('>').next()?;
    Some(if kind.len() == 1 {
        "Generic".to_owned()
    } else {
        kind.to_owned()
    })
}

/// What `Api<K>` the expression ending at `end` is: a chain from
/// `Api::<K>::...(..)`, a helper returning `Api<K>`, or a variable bound to
/// one (`let v = ...;` or `v: &Api<K>`) in `code`.
fn receiver_kind(code: &str, end: usize, helpers: &BTreeMap<String, String>) -> Option<String> {
    let before = code[..end].trim_end();
    if before.ends_with(')') {
        let open = matching_open(before, before.len() - 1)?;
        let callee = path_before(before, open);
        if let Some(kind) = turbofish_kind(callee) {
            return Some(kind);
        }
        let helper = callee.rsplit('.').next()?;
        return helpers.get(helper).cloned();
    }
    let variable = path_before(before, before.len());
    if variable.is_empty() || variable.contains(['.', ':']) {
        return None;
    }
    if let Some(at) = code[..end].rfind(&format!("let {variable} = ")) {
        let statement_end = at + code[at..].find(';')?;
        return receiver_kind(code, statement_end, helpers);
    }
    let parameter = format!("{variable}: &Api<");
    let at = code[..end].rfind(&parameter)? + parameter.len();
    Some(code[at..].split('>').next()?.to_owned())
}

/// The text of the call's arguments, from the `(` at `open`.
fn arguments(code: &str, open: usize) -> &str {
    let mut depth = 0usize;
    for (i, c) in code[open..].char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth -= 1;
                if depth == 0 {
                    return &code[open..open + i];
                }
            }
            _ => {}
        }
    }
    &code[open..]
}

/// Types of the objects `planner_core::DesiredObjects` holds.
fn desired_object_kinds() -> Vec<String> {
    let text = std::fs::read_to_string(root().join("services/planner/core/src/objects.rs"))
        .expect("objects.rs readable");
    let body = text
        .split("pub struct DesiredObjects {")
        .nth(1)
        .and_then(|rest| rest.split('}').next())
        .expect("DesiredObjects declared");
    body.lines()
        .filter_map(|line| line.trim().strip_prefix("pub ")?.split_once(": "))
        .map(|(_, ty)| {
            let ty = ty.trim_end_matches(',');
            ty.strip_prefix("Option<")
                .map_or(ty, |inner| inner.trim_end_matches('>'))
                .to_owned()
        })
        .filter(|ty| ty != "String")
        .collect()
}

/// Every (group, resource, verb) the code under `dirs` uses.
fn used_verbs(dirs: &[&str]) -> BTreeSet<Grant> {
    let files: Vec<String> = dirs.iter().flat_map(|d| sources(&root().join(d))).collect();
    let mut helpers = BTreeMap::new();
    for code in &files {
        for (at, _) in code.match_indices("-> Api<") {
            let kind = code[at + 7..].split('>').next().unwrap_or_default();
            if let Some(fn_at) = code[..at].rfind("fn ") {
                let name = code[fn_at + 3..]
                    .split(['(', '<'])
                    .next()
                    .unwrap_or_default();
                helpers.insert(name.to_owned(), kind.to_owned());
            }
        }
    }
    let mut used = BTreeSet::new();
    let mut grant = |kind: &str, subresource: &str, verb: &str, events_group: &str| {
        let Some((group, resource)) = resource_of(kind, events_group) else {
            panic!("no RBAC resource known for Api<{kind}>: add it to resource_of");
        };
        used.insert((group, format!("{resource}{subresource}"), verb.to_owned()));
    };
    for code in &files {
        let events_group = if code.contains("api::events::v1::") {
            "events.k8s.io"
        } else {
            ""
        };
        for method in [
            "get_opt",
            "get",
            "list",
            "create",
            "patch",
            "patch_status",
            "delete",
        ] {
            for (at, _) in code.match_indices(&format!(".{method}(")) {
                let Some(kind) = receiver_kind(code, at, &helpers) else {
                    continue;
                };
                let args = arguments(code, at + method.len() + 1);
                let kinds = if kind == "Generic" {
                    desired_object_kinds()
                } else {
                    vec![kind]
                };
                for kind in &kinds {
                    match method {
                        "get_opt" | "get" => grant(kind, "", "get", events_group),
                        "patch_status" => grant(kind, "/status", "patch", events_group),
                        "patch" if args.contains("Patch::Apply") => {
                            grant(kind, "", "patch", events_group);
                            grant(kind, "", "create", events_group);
                        }
                        other => grant(kind, "", other, events_group),
                    }
                }
            }
        }
        for call in ["watcher(", "spawn_watch(", "spawn_watch::<"] {
            for (at, _) in code.match_indices(call) {
                // Only calls: the function's own declaration names no kind.
                if code[..at].ends_with("fn ") {
                    continue;
                }
                let args = arguments(code, at + call.len() - 1);
                let kind = args
                    .split("scoped::<")
                    .nth(1)
                    .or_else(|| args.split("Api::<").nth(1))
                    .and_then(|rest| rest.split('>').next());
                if let Some(kind) = kind {
                    grant(kind, "", "list", events_group);
                    grant(kind, "", "watch", events_group);
                }
            }
        }
        for (at, _) in code.match_indices(".controller_owner_ref(") {
            let owner = path_before(code, at);
            let mut kind = owner.rsplit('.').next().unwrap_or_default().to_owned();
            if let Some(first) = kind.get(..1) {
                kind = first.to_uppercase() + &kind[1..];
            }
            grant(&kind, "/finalizers", "update", events_group);
        }
        for (at, _) in code.match_indices("block_owner_deletion: Some(true)") {
            let kind_at = code[..at].rfind("kind: \"").expect("the owner's kind") + 7;
            let kind = code[kind_at..].split('"').next().unwrap_or_default();
            grant(kind, "/finalizers", "update", events_group);
        }
    }
    used
}

/// Every (group, resource, verb) the ClusterRole `name` grants.
fn granted_verbs(name: &str) -> BTreeSet<Grant> {
    let text = std::fs::read_to_string(root().join("deploy/rbac.yaml")).expect("rbac.yaml");
    let role = yaml_serde::Deserializer::from_str(&text)
        .map(|doc| Value::deserialize(doc).expect("valid YAML"))
        .find(|d| {
            d["kind"].as_str() == Some("ClusterRole")
                && d["metadata"]["name"].as_str() == Some(name)
        })
        .unwrap_or_else(|| panic!("no ClusterRole {name}"));
    let strings = |value: &Value| -> Vec<String> {
        value
            .as_sequence()
            .into_iter()
            .flatten()
            .filter_map(|v| v.as_str().map(str::to_owned))
            .collect()
    };
    let mut granted = BTreeSet::new();
    for rule in role["rules"].as_sequence().into_iter().flatten() {
        for group in strings(&rule["apiGroups"]) {
            for resource in strings(&rule["resources"]) {
                for verb in strings(&rule["verbs"]) {
                    granted.insert((group.clone(), resource.clone(), verb));
                }
            }
        }
    }
    granted
}

fn assert_role_matches_code(role: &str, dirs: &[&str]) {
    let used = used_verbs(dirs);
    let granted = granted_verbs(role);
    let unused: Vec<&Grant> = granted.difference(&used).collect();
    let missing: Vec<&Grant> = used.difference(&granted).collect();
    assert!(
        unused.is_empty() && missing.is_empty(),
        "{role}: granted but unused {unused:?}; used but not granted {missing:?}"
    );
}

#[test]
fn the_watcher_role_grants_exactly_the_verbs_its_watches_use() {
    let used = used_verbs(&["services/watcher/src"]);
    assert!(
        used.iter()
            .all(|(_, _, verb)| verb == "list" || verb == "watch"),
        "the watcher only reads: {used:?}"
    );
    assert_role_matches_code("trainyard-watcher", &["services/watcher/src"]);
}

#[test]
fn the_planner_role_grants_exactly_the_verbs_its_code_uses() {
    assert_role_matches_code(
        "trainyard-planner",
        &["services/planner/src", "services/planner/core/src"],
    );
}

#[test]
fn the_scan_finds_each_kind_of_use() {
    let used = used_verbs(&["services/planner/src", "services/planner/core/src"]);
    let has = |group: &str, resource: &str, verb: &str| {
        used.contains(&(group.to_owned(), resource.to_owned(), verb.to_owned()))
    };
    // A helper's Api, a status write, a generic apply, an owner reference,
    // a parameter's Api (the events' group from their import).
    assert!(has("trainyard.dev", "trainingjobs", "get"));
    assert!(has("trainyard.dev", "trainingqueues/status", "patch"));
    assert!(has("", "configmaps", "create") && has("batch", "jobs", "patch"));
    assert!(has("trainyard.dev", "sweeps/finalizers", "update"));
    assert!(has("events.k8s.io", "events", "create"));
}
