//! `trainyard apply`: read manifests, validate all of them, find the resource of
//! every kind that is not Trainyard's through the API server's discovery, then
//! server-side apply.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery::{self, Scope};
use kube::{Api, Client, ResourceExt};
use trainyard_api::{Sweep, TrainingJob, TrainingQueue};

use crate::error::CliError;
use crate::manifest::{Kind, Manifest, ObjectKind, parse_file};

/// Field manager of everything the CLI applies, so `managedFields` tell who wrote what.
pub const FIELD_MANAGER: &str = "trainyard-cli";

/// What happened to one object, in kubectl's words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// It did not exist before.
    Created,
    /// It existed and changed.
    Configured,
    /// It existed and the server kept it as it was.
    Unchanged,
}

impl Outcome {
    /// The word kubectl prints after the object's name.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Created => "created",
            Outcome::Configured => "configured",
            Outcome::Unchanged => "unchanged",
        }
    }
}

/// One manifest source: its label in messages and its text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    /// The path as given (or "-" for standard input).
    pub label: String,
    /// The YAML text.
    pub text: String,
}

/// Reads `-f` arguments: files, directories (their .yaml, .yml and .json files, sorted
/// by name, not recursive, as kubectl does) and "-" for standard input.
pub fn read_sources(paths: &[PathBuf]) -> Result<Vec<Source>, CliError> {
    let mut sources = Vec::new();
    for path in paths {
        if path.as_os_str() == "-" {
            let mut text = String::new();
            std::io::stdin()
                .read_to_string(&mut text)
                .map_err(|source| CliError::Read {
                    path: path.clone(),
                    source,
                })?;
            sources.push(Source {
                label: "-".to_owned(),
                text,
            });
        } else if path.is_dir() {
            for file in manifest_files(path)? {
                sources.push(read_file(&file)?);
            }
        } else {
            sources.push(read_file(path)?);
        }
    }
    Ok(sources)
}

fn read_file(path: &Path) -> Result<Source, CliError> {
    let text = std::fs::read_to_string(path).map_err(|source| CliError::Read {
        path: path.to_owned(),
        source,
    })?;
    Ok(Source {
        label: path.display().to_string(),
        text,
    })
}

fn manifest_files(directory: &Path) -> Result<Vec<PathBuf>, CliError> {
    let read_error = |source| CliError::Read {
        path: directory.to_owned(),
        source,
    };
    let mut files = Vec::new();
    for entry in std::fs::read_dir(directory).map_err(read_error)? {
        let path = entry.map_err(read_error)?.path();
        let manifest = path
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"));
        if manifest && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// Validates every document of every source; any problem anywhere refuses them all,
/// so a run never leaves half of a set of manifests applied.
pub fn validate_sources(sources: &[Source]) -> Result<Vec<Manifest>, CliError> {
    let mut manifests = Vec::new();
    let mut errors = Vec::new();
    for source in sources {
        match parse_file(&source.label, &source.text) {
            Ok(found) => manifests.extend(found),
            Err(found) => errors.extend(found),
        }
    }
    if !errors.is_empty() {
        return Err(CliError::InvalidManifests(errors));
    }
    if manifests.is_empty() {
        let files: Vec<&str> = sources.iter().map(|s| s.label.as_str()).collect();
        return Err(CliError::NoObjects {
            files: files.join(", "),
        });
    }
    Ok(manifests)
}

/// A kind's resource and whether it is namespaced, or why the cluster has none.
type Discovered = Result<(ApiResource, bool), String>;

/// Asks the API server about each kind that is not Trainyard's, once per
/// apiVersion and kind.
async fn discover(
    client: &Client,
    manifests: &[Manifest],
) -> Result<HashMap<(String, String), Discovered>, CliError> {
    let mut found: HashMap<(String, String), Discovered> = HashMap::new();
    for manifest in manifests {
        let ObjectKind::Other { api_version, kind } = &manifest.kind else {
            continue;
        };
        let key = (api_version.clone(), kind.clone());
        if found.contains_key(&key) {
            continue;
        }
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let discovered = match discovery::pinned_kind(client, &gvk).await {
            Ok((resource, capabilities)) => {
                Ok((resource, matches!(capabilities.scope, Scope::Namespaced)))
            }
            Err(kube::Error::Discovery(_)) => Err(format!(
                "the cluster serves no kind {kind} in apiVersion {api_version}: check the spelling, or install the CustomResourceDefinition that defines it first"
            )),
            Err(kube::Error::Api(status)) if status.code == 404 => Err(format!(
                "the cluster does not serve apiVersion {api_version} (kind {kind}): check the spelling, or install the CustomResourceDefinition that defines it first"
            )),
            Err(error) => {
                return Err(CliError::Kube {
                    action: format!(
                        "discover the resource of kind {kind} in apiVersion {api_version}"
                    ),
                    source: Box::new(error),
                });
            }
        };
        found.insert(key, discovered);
    }
    Ok(found)
}

/// Applies `manifests` in order, printing `<kind>.<group>/<name> <outcome>` for
/// each; objects that name no namespace go to `default_namespace`. Kinds that are
/// not Trainyard's are looked up first, and if the cluster serves any of them not
/// at all, nothing is applied. Like kubectl, a refusal by the server does not stop
/// the others; the refusals come back together as one error.
pub async fn apply_manifests(
    client: &Client,
    manifests: &[Manifest],
    default_namespace: &str,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let discovered = discover(client, manifests).await?;
    let mut resolved = Vec::with_capacity(manifests.len());
    let mut unknown = Vec::new();
    for manifest in manifests {
        let found = match &manifest.kind {
            ObjectKind::Trainyard(Kind::TrainingJob) => {
                Ok((ApiResource::erase::<TrainingJob>(&()), true))
            }
            ObjectKind::Trainyard(Kind::Sweep) => Ok((ApiResource::erase::<Sweep>(&()), true)),
            ObjectKind::Trainyard(Kind::TrainingQueue) => {
                Ok((ApiResource::erase::<TrainingQueue>(&()), false))
            }
            ObjectKind::Other { api_version, kind } => discovered
                .get(&(api_version.clone(), kind.clone()))
                .cloned()
                .unwrap_or_else(|| Err(format!("kind {kind} was not looked up"))),
        };
        match found {
            Ok(found) => resolved.push((manifest, found)),
            Err(why) => unknown.push(format!(
                "{}: document {} ({} {:?}): {why}",
                manifest.file,
                manifest.document,
                manifest.kind.kind(),
                manifest.name
            )),
        }
    }
    if !unknown.is_empty() {
        return Err(CliError::UnknownKinds(unknown));
    }
    let mut failures = Vec::new();
    for (manifest, (resource, namespaced)) in resolved {
        let (namespace, object) = manifest.resolve(namespaced, default_namespace);
        let api = match namespace.as_deref() {
            Some(namespace) => Api::namespaced_with(client.clone(), namespace, &resource),
            None => Api::all_with(client.clone(), &resource),
        };
        let result = server_side_apply(api, &manifest.name, &object).await;
        match result {
            Ok(outcome) => {
                writeln!(out, "{} {}", manifest.reference(), outcome.as_str())?;
                out.flush()?;
            }
            Err(error) => failures.push(format!(
                "{} ({}: document {}{}): {error}",
                manifest.reference(),
                manifest.file,
                manifest.document,
                namespace
                    .map(|ns| format!(", namespace {ns}"))
                    .unwrap_or_default(),
            )),
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(CliError::ApplyFailed {
            failures,
            total: manifests.len(),
        })
    }
}

/// One server-side apply, forced so the CLI takes over fields another manager set
/// (the user's manifest is the intent), with strict field validation as kubectl does.
async fn server_side_apply(
    api: Api<DynamicObject>,
    name: &str,
    object: &serde_json::Value,
) -> Result<Outcome, kube::Error> {
    let before = api.get_opt(name).await?;
    let params = PatchParams::apply(FIELD_MANAGER)
        .force()
        .validation_strict();
    let after = api.patch(name, &params, &Patch::Apply(object)).await?;
    Ok(match before {
        None => Outcome::Created,
        Some(before) if before.resource_version() == after.resource_version() => Outcome::Unchanged,
        Some(_) => Outcome::Configured,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_expand_to_their_manifests_in_name_order() {
        let dir = tempfile::tempdir().expect("temp dir");
        for name in ["b.yaml", "a.yml", "c.json", "notes.txt"] {
            std::fs::write(dir.path().join(name), "").expect("write");
        }
        std::fs::create_dir(dir.path().join("nested.yaml")).expect("mkdir");
        let sources = read_sources(&[dir.path().to_owned()]).expect("reads");
        let names: Vec<_> = sources
            .iter()
            .map(|s| {
                Path::new(&s.label)
                    .file_name()
                    .and_then(|n| n.to_str())
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect();
        assert_eq!(names, ["a.yml", "b.yaml", "c.json"]);
    }

    #[test]
    fn a_missing_file_is_named() {
        let error = read_sources(&[PathBuf::from("/nonexistent/jobs.yaml")]).expect_err("missing");
        assert!(
            error
                .to_string()
                .starts_with("cannot read /nonexistent/jobs.yaml: "),
            "{error}"
        );
    }

    #[test]
    fn files_without_objects_are_refused() {
        let sources = [Source {
            label: "empty.yaml".into(),
            text: "---\n".into(),
        }];
        let error = validate_sources(&sources).expect_err("nothing to apply");
        assert!(
            error
                .to_string()
                .contains("no objects to apply in empty.yaml"),
            "{error}"
        );
    }

    #[test]
    fn one_bad_document_refuses_every_file() {
        let good = Source {
            label: "good.yaml".into(),
            text: "apiVersion: trainyard.dev/v1\nkind: TrainingJob\nmetadata: {name: ok}\nspec: {model: m, dataset: d, numWorkers: 1}\n".into(),
        };
        let bad = Source {
            label: "bad.yaml".into(),
            text: "apiVersion: trainyard.dev/v1\nkind: TrainingJob\nmetadata: {name: no}\nspec: {model: m, dataset: d, numWorkers: 1, gpusPerWorker: 65}\n".into(),
        };
        let error = validate_sources(&[good, bad]).expect_err("refused");
        let message = error.to_string();
        assert!(message.contains("bad.yaml: document 1 (TrainingJob \"no\"): spec.gpusPerWorker: Invalid value: must be between 0 and 64, got 65"), "{message}");
        assert!(
            message.ends_with("nothing was applied: fix the 1 problem(s) above and apply again"),
            "{message}"
        );
    }

    #[test]
    fn outcomes_read_like_kubectl() {
        assert_eq!(Outcome::Created.as_str(), "created");
        assert_eq!(Outcome::Configured.as_str(), "configured");
        assert_eq!(Outcome::Unchanged.as_str(), "unchanged");
    }
}
