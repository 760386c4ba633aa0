//! Splitting multi-document YAML into objects and validating each one before
//! anything is sent to the API server.
//!
//! Trainyard's kinds are checked in full; any other kind (a PersistentVolumeClaim
//! a Sweep's checkpoints need, a ConfigMap, a Secret, a Namespace) only for what
//! apply itself needs, apiVersion, kind and a name, and left to the API server.
//!
//! Validation is trainyard-api's own (`from_json`), the same rules the CRD schema and
//! its CEL expressions enforce, so a bad manifest is refused here with the field and the
//! fix instead of half-applied. Unknown fields are refused too, as kubectl's default
//! strict field validation does, because a misspelt optional field (`gpusPerWrker`)
//! would otherwise silently fall back to its default.

use std::fmt;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};
use trainyard_api::validation::{is_dns_label, is_dns_subdomain};
use trainyard_api::{
    API_GROUP, API_GROUP_VERSION, FieldError, FieldErrorKind, Sweep, SweepSpec, TrainingJob,
    TrainingJobSpec, TrainingQueue, TrainingQueueSpec,
};

/// The Trainyard kinds `apply` accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A training run (namespaced).
    TrainingJob,
    /// A hyperparameter search (namespaced).
    Sweep,
    /// A GPU quota (cluster-scoped).
    TrainingQueue,
}

impl Kind {
    /// Every kind, in the order error messages list them.
    pub const ALL: [Kind; 3] = [Kind::TrainingJob, Kind::Sweep, Kind::TrainingQueue];

    /// The `kind` value in YAML.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::TrainingJob => "TrainingJob",
            Kind::Sweep => "Sweep",
            Kind::TrainingQueue => "TrainingQueue",
        }
    }

    /// Lowercase singular resource name, as kubectl prints it (`trainingjob.trainyard.dev/x`).
    pub fn resource(self) -> &'static str {
        match self {
            Kind::TrainingJob => "trainingjob",
            Kind::Sweep => "sweep",
            Kind::TrainingQueue => "trainingqueue",
        }
    }

    /// False for TrainingQueue, which is cluster-scoped.
    pub fn namespaced(self) -> bool {
        !matches!(self, Kind::TrainingQueue)
    }

    fn parse(kind: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == kind)
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an object is: one of Trainyard's kinds, or any other the cluster may serve.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ObjectKind {
    /// TrainingJob, Sweep or TrainingQueue, validated here.
    Trainyard(Kind),
    /// Another kind; its scope and resource come from the API server's discovery.
    Other {
        /// `apiVersion` as written: `v1`, `apps/v1`, ...
        api_version: String,
        /// `kind` as written.
        kind: String,
    },
}

impl ObjectKind {
    /// The API group ("" for the core group).
    pub fn group(&self) -> &str {
        match self {
            ObjectKind::Trainyard(_) => API_GROUP,
            ObjectKind::Other { api_version, .. } => {
                api_version.split_once('/').map_or("", |(group, _)| group)
            }
        }
    }

    /// The `kind` value.
    pub fn kind(&self) -> &str {
        match self {
            ObjectKind::Trainyard(kind) => kind.as_str(),
            ObjectKind::Other { kind, .. } => kind,
        }
    }
}

/// One validated object, ready for server-side apply.
#[derive(Clone, Debug, PartialEq)]
pub struct Manifest {
    /// File it came from, as given on the command line.
    pub file: String,
    /// 1-based index of its YAML document in the file.
    pub document: usize,
    /// Its kind.
    pub kind: ObjectKind,
    /// metadata.name.
    pub name: String,
    /// metadata.namespace as written; None when the object leaves it to the default
    /// namespace, and always None for Trainyard's cluster-scoped kind.
    pub namespace: Option<String>,
    /// The object as written, status and (for cluster-scoped kinds) namespace removed.
    pub object: Value,
}

impl Manifest {
    /// `trainingjob.trainyard.dev/<name>`, `persistentvolumeclaim/<name>`,
    /// `deployment.apps/<name>`: the way kubectl names an object.
    pub fn reference(&self) -> String {
        let resource = match &self.kind {
            ObjectKind::Trainyard(kind) => kind.resource().to_owned(),
            ObjectKind::Other { kind, .. } => kind.to_lowercase(),
        };
        match self.kind.group() {
            "" => format!("{resource}/{}", self.name),
            group => format!("{resource}.{group}/{}", self.name),
        }
    }

    /// Where the object goes and what is sent: its own namespace, else
    /// `default_namespace` (written into metadata.namespace so the body matches the
    /// request path); None and the object without a namespace for cluster-scoped
    /// kinds. `namespaced` is the scope discovery found, for kinds not Trainyard's.
    pub fn resolve(&self, namespaced: bool, default_namespace: &str) -> (Option<String>, Value) {
        let namespaced = match &self.kind {
            ObjectKind::Trainyard(kind) => kind.namespaced(),
            ObjectKind::Other { .. } => namespaced,
        };
        if !namespaced {
            let mut object = self.object.clone();
            if let Some(Value::Object(metadata)) = object.get_mut("metadata") {
                metadata.remove("namespace");
            }
            return (None, object);
        }
        let namespace = self
            .namespace
            .clone()
            .unwrap_or_else(|| default_namespace.to_owned());
        let mut object = self.object.clone();
        if let Some(Value::Object(metadata)) = object.get_mut("metadata") {
            metadata.insert("namespace".into(), Value::String(namespace.clone()));
        }
        (Some(namespace), object)
    }
}

/// Why a document was refused.
#[derive(Clone, Debug, PartialEq)]
pub enum Problem {
    /// The text is not YAML (the parser's message carries line and column).
    Yaml(String),
    /// A field breaks a rule: its path, the kind of problem and the fix.
    Field(FieldError),
    /// A field that no Trainyard kind has, at this JSON path.
    UnknownField(String),
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Yaml(message) => write!(f, "invalid YAML: {message}"),
            Problem::Field(error) => write!(f, "{error}"),
            Problem::UnknownField(path) => write!(
                f,
                "{path}: Unknown field: not part of the API; remove it or correct its spelling"
            ),
        }
    }
}

/// Everything wrong with one document of one file.
#[derive(Clone, Debug, PartialEq)]
pub struct DocumentError {
    /// File, as given on the command line.
    pub file: String,
    /// 1-based document index.
    pub document: usize,
    /// `TrainingJob "name"` when the document got that far.
    pub object: Option<String>,
    /// One or more problems.
    pub problems: Vec<Problem>,
}

impl DocumentError {
    /// Number of problems, for the closing line of the error report.
    pub fn problem_count(&self) -> usize {
        self.problems.len()
    }
}

impl fmt::Display for DocumentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: document {}", self.file, self.document)?;
        if let Some(object) = &self.object {
            write!(f, " ({object})")?;
        }
        match self.problems.as_slice() {
            [only] => write!(f, ": {only}"),
            problems => {
                f.write_str(":")?;
                for problem in problems {
                    write!(f, "\n  - {problem}")?;
                }
                Ok(())
            }
        }
    }
}

/// Splits a file into documents and validates every one.
///
/// Empty documents (a stray `---`, a comment-only document) are skipped as kubectl
/// skips them. Needs no cluster: the default namespace is filled in by
/// [`Manifest::resolve`] once one is connected. Returns every problem of every
/// document, so one run shows everything to fix.
pub fn parse_file(file: &str, text: &str) -> Result<Vec<Manifest>, Vec<DocumentError>> {
    let mut manifests = Vec::new();
    let mut errors = Vec::new();
    for (index, document) in yaml_serde::Deserializer::from_str(text).enumerate() {
        let number = index + 1;
        let value = match Value::deserialize(document) {
            Ok(value) => value,
            Err(error) => {
                errors.push(DocumentError {
                    file: file.to_owned(),
                    document: number,
                    object: None,
                    problems: vec![Problem::Yaml(error.to_string())],
                });
                // The parser cannot resynchronise after a syntax error, so later
                // documents of this file would only repeat it.
                break;
            }
        };
        if value.is_null() {
            continue;
        }
        let checked = if is_trainyard(&value) {
            check_document(value)
        } else {
            check_other(value)
        };
        match checked {
            Ok(checked) => manifests.push(Manifest {
                file: file.to_owned(),
                document: number,
                kind: checked.kind,
                name: checked.name,
                namespace: checked.namespace,
                object: checked.object,
            }),
            Err((object, problems)) => errors.push(DocumentError {
                file: file.to_owned(),
                document: number,
                object,
                problems,
            }),
        }
    }
    if errors.is_empty() {
        Ok(manifests)
    } else {
        Err(errors)
    }
}

struct Checked {
    kind: ObjectKind,
    name: String,
    namespace: Option<String>,
    object: Value,
}

type Refusal = (Option<String>, Vec<Problem>);

fn field(path: &str, kind: FieldErrorKind, message: impl Into<String>) -> Problem {
    Problem::Field(FieldError::new(path, kind, message))
}

fn kinds_list() -> String {
    Kind::ALL.map(Kind::as_str).join(", ")
}

/// Whether a document is for Trainyard's own checks: its apiVersion is in Trainyard's
/// group, its kind is one of Trainyard's, or it lacks what would say otherwise.
fn is_trainyard(value: &Value) -> bool {
    let group = format!("{API_GROUP}/");
    match (value.get("apiVersion"), value.get("kind")) {
        (Some(Value::String(version)), Some(Value::String(kind))) => {
            version.starts_with(&group) || Kind::parse(kind).is_some()
        }
        (Some(Value::String(version)), _) => version.starts_with(&group),
        (_, Some(Value::String(kind))) => Kind::parse(kind).is_some(),
        _ => true,
    }
}

/// Checks what apply needs of a kind that is not Trainyard's: apiVersion, kind and
/// a name (and a namespace, when one is written, that could be one). The rest is
/// the API server's to judge.
fn check_other(value: Value) -> Result<Checked, Refusal> {
    let Value::Object(object) = value else {
        return check_document(value);
    };
    let mut problems = Vec::new();
    let kind = match object.get("kind") {
        Some(Value::String(kind)) if !kind.is_empty() => Some(kind.clone()),
        _ => {
            problems.push(field(
                "kind",
                FieldErrorKind::Required,
                "kind is required, e.g. kind: PersistentVolumeClaim",
            ));
            None
        }
    };
    let api_version = match object.get("apiVersion") {
        Some(Value::String(version)) if is_api_version(version) => Some(version.clone()),
        Some(Value::String(version)) => {
            problems.push(field(
                "apiVersion",
                FieldErrorKind::Invalid,
                format!("{version:?} is not an apiVersion: use VERSION (core kinds, e.g. v1) or GROUP/VERSION (e.g. apps/v1)"),
            ));
            None
        }
        _ => {
            problems.push(field(
                "apiVersion",
                FieldErrorKind::Required,
                "apiVersion is required, e.g. apiVersion: v1",
            ));
            None
        }
    };
    let name = match metadata_field(&object, "name") {
        Some(Value::String(name)) if is_path_segment(name) => Some(name.clone()),
        Some(Value::String(name)) => {
            problems.push(field(
                "metadata.name",
                FieldErrorKind::Invalid,
                format!("{name:?} is not a valid object name: it may not be empty, \".\" or \"..\", nor contain '/' or '%'"),
            ));
            None
        }
        _ => {
            problems.push(field(
                "metadata.name",
                FieldErrorKind::Required,
                "metadata.name is required: apply updates objects by name",
            ));
            None
        }
    };
    let namespace = check_namespace(&object, &mut problems);
    let label = match (&kind, &name) {
        (Some(kind), Some(name)) => Some(format!("{kind} {name:?}")),
        (Some(kind), None) => Some(kind.clone()),
        (None, _) => None,
    };
    match (kind, api_version, name) {
        (Some(kind), Some(api_version), Some(name)) if problems.is_empty() => Ok(Checked {
            kind: ObjectKind::Other { api_version, kind },
            name,
            namespace,
            object: Value::Object(object),
        }),
        _ => Err((label, problems)),
    }
}

/// `v1` or `group/v1`: what a request path can be built from.
fn is_api_version(version: &str) -> bool {
    let (group, version) = version.split_once('/').unwrap_or(("", version));
    (group.is_empty() || is_dns_subdomain(group))
        && !version.is_empty()
        && version
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
}

/// A name the API server can put in a request path.
fn is_path_segment(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '%'])
}

/// Checks the envelope (apiVersion, kind, metadata), then the spec with trainyard-api's
/// rules, then looks for unknown fields.
fn check_document(value: Value) -> Result<Checked, Refusal> {
    let Value::Object(mut object) = value else {
        return Err((
            None,
            vec![field(
                "(document)",
                FieldErrorKind::Invalid,
                "each document must be a mapping with apiVersion, kind, metadata and spec",
            )],
        ));
    };
    let mut problems = Vec::new();
    let kind = check_kind(&object, &mut problems);
    check_api_version(&object, &mut problems);
    let name = check_name(&object, &mut problems);
    let label = match (kind, &name) {
        (Some(kind), Some(name)) => Some(format!("{kind} {name:?}")),
        (Some(kind), None) => Some(kind.to_string()),
        (None, _) => None,
    };
    let Some(kind) = kind else {
        return Err((label, problems));
    };
    let namespace = if kind.namespaced() {
        check_namespace(&object, &mut problems)
    } else {
        None
    };
    match object.get("spec") {
        None | Some(Value::Null) => problems.push(field(
            "spec",
            FieldErrorKind::Required,
            format!("spec is required: a {kind} needs its spec"),
        )),
        Some(spec) => {
            let spec_errors = match kind {
                Kind::TrainingJob => TrainingJobSpec::from_json(spec.clone()).err(),
                Kind::Sweep => SweepSpec::from_json(spec.clone()).err(),
                Kind::TrainingQueue => TrainingQueueSpec::from_json(spec.clone()).err(),
            };
            problems.extend(spec_errors.into_iter().flatten().map(Problem::Field));
        }
    }
    let whole = Value::Object(object.clone());
    let already_reported = !problems.is_empty();
    problems.extend(match kind {
        Kind::TrainingJob => unknown_fields::<TrainingJob>(&whole, already_reported),
        Kind::Sweep => unknown_fields::<Sweep>(&whole, already_reported),
        Kind::TrainingQueue => unknown_fields::<TrainingQueue>(&whole, already_reported),
    });
    match name {
        Some(name) if problems.is_empty() => {
            if !kind.namespaced()
                && let Some(Value::Object(metadata)) = object.get_mut("metadata")
            {
                // A cluster-scoped object has no namespace; the API server would refuse
                // the request path a namespace implies.
                metadata.remove("namespace");
            }
            // Status belongs to the planner; the API server would ignore it anyway.
            object.remove("status");
            Ok(Checked {
                kind: ObjectKind::Trainyard(kind),
                name,
                namespace,
                object: Value::Object(object),
            })
        }
        _ => Err((label, problems)),
    }
}

fn check_kind(object: &Map<String, Value>, problems: &mut Vec<Problem>) -> Option<Kind> {
    match object.get("kind") {
        Some(Value::String(kind)) => {
            let parsed = Kind::parse(kind);
            if parsed.is_none() {
                problems.push(field(
                    "kind",
                    FieldErrorKind::NotSupported,
                    format!(
                        "{kind:?} is not a Trainyard kind: use one of {}",
                        kinds_list()
                    ),
                ));
            }
            parsed
        }
        _ => {
            problems.push(field(
                "kind",
                FieldErrorKind::Required,
                format!(
                    "kind is required: one of {}, or any kind the cluster serves",
                    kinds_list()
                ),
            ));
            None
        }
    }
}

fn check_api_version(object: &Map<String, Value>, problems: &mut Vec<Problem>) {
    match object.get("apiVersion") {
        Some(Value::String(version)) if version == API_GROUP_VERSION => {}
        Some(Value::String(version)) => problems.push(field(
            "apiVersion",
            FieldErrorKind::NotSupported,
            format!("{version:?} is not served: use apiVersion: {API_GROUP_VERSION}"),
        )),
        _ => problems.push(field(
            "apiVersion",
            FieldErrorKind::Required,
            format!("apiVersion is required: use apiVersion: {API_GROUP_VERSION}"),
        )),
    }
}

fn metadata_field<'a>(object: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    object.get("metadata").and_then(|m| m.get(key))
}

fn check_name(object: &Map<String, Value>, problems: &mut Vec<Problem>) -> Option<String> {
    match metadata_field(object, "name") {
        Some(Value::String(name)) if is_dns_subdomain(name) => Some(name.clone()),
        Some(Value::String(name)) => {
            problems.push(field(
                "metadata.name",
                FieldErrorKind::Invalid,
                format!(
                    "{name:?} is not a valid object name: use lowercase letters, digits, '-' and '.', starting and ending with a letter or digit, at most 253 characters"
                ),
            ));
            None
        }
        _ => {
            let message = if metadata_field(object, "generateName").is_some() {
                "metadata.name is required: apply updates objects by name, so generateName cannot be used"
            } else {
                "metadata.name is required: give the object a name"
            };
            problems.push(field("metadata.name", FieldErrorKind::Required, message));
            None
        }
    }
}

fn check_namespace(object: &Map<String, Value>, problems: &mut Vec<Problem>) -> Option<String> {
    match metadata_field(object, "namespace") {
        Some(Value::String(namespace)) => {
            if !is_dns_label(namespace) {
                problems.push(field(
                    "metadata.namespace",
                    FieldErrorKind::Invalid,
                    format!(
                        "{namespace:?} is not a valid namespace: use at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit"
                    ),
                ));
            }
            Some(namespace.clone())
        }
        None | Some(Value::Null) => None,
        Some(_) => {
            problems.push(field(
                "metadata.namespace",
                FieldErrorKind::Invalid,
                "must be a string naming a namespace",
            ));
            None
        }
    }
}

/// Fields the typed object does not have, as JSON paths (`spec.gpusPerWrker`).
///
/// A misspelt required field shows up twice on purpose: as the missing field the spec
/// check reported and as the unknown one here, which together point at the typo.
fn unknown_fields<T: DeserializeOwned>(value: &Value, already_reported: bool) -> Vec<Problem> {
    let mut unknown = Vec::new();
    let decoded: Result<T, _> = serde_ignored::deserialize(value, |path| {
        let path = json_path(&path);
        // kube's derived types skip the type fields, which check_document already checked.
        if path != "apiVersion" && path != "kind" {
            unknown.push(path);
        }
    });
    let mut problems: Vec<Problem> = unknown.into_iter().map(Problem::UnknownField).collect();
    // A missing or undecodable spec fails here too and is reported already; otherwise
    // the failure is in metadata (e.g. a label value that is not a string). serde does
    // not say where, so name the section.
    if let Err(error) = decoded
        && !already_reported
    {
        problems.push(field(
            "metadata",
            FieldErrorKind::Invalid,
            error.to_string(),
        ));
    }
    problems
}

/// `spec.env[0].nam` rather than serde_ignored's `spec.env.0.nam` or `spec.?.x`.
fn json_path(path: &serde_ignored::Path<'_>) -> String {
    use serde_ignored::Path;
    match path {
        Path::Root => String::new(),
        Path::Seq { parent, index } => format!("{}[{index}]", json_path(parent)),
        Path::Map { parent, key } => {
            let parent = json_path(parent);
            if parent.is_empty() {
                key.clone()
            } else {
                format!("{parent}.{key}")
            }
        }
        Path::Some { parent }
        | Path::NewtypeStruct { parent }
        | Path::NewtypeVariant { parent } => json_path(parent),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const JOB: &str = "apiVersion: trainyard.dev/v1
kind: TrainingJob
metadata:
  name: mnist
spec:
  model: cnn
  dataset: mnist
  numWorkers: 2
";

    fn one_error(text: &str) -> DocumentError {
        match parse_file("bad.yaml", text) {
            Ok(manifests) => panic!("expected a refusal, got {manifests:?}"),
            Err(mut errors) => {
                assert_eq!(errors.len(), 1, "{errors:?}");
                errors.remove(0)
            }
        }
    }

    fn paths(error: &DocumentError) -> Vec<String> {
        error
            .problems
            .iter()
            .map(|p| match p {
                Problem::Field(f) => f.path.clone(),
                Problem::UnknownField(path) => path.clone(),
                Problem::Yaml(_) => "(yaml)".into(),
            })
            .collect()
    }

    #[test]
    fn a_valid_job_gets_the_fallback_namespace_and_keeps_what_was_written() {
        let manifests = parse_file("job.yaml", JOB).expect("valid");
        assert_eq!(manifests.len(), 1);
        let job = &manifests[0];
        assert_eq!(job.kind, ObjectKind::Trainyard(Kind::TrainingJob));
        assert_eq!(job.name, "mnist");
        assert_eq!(job.namespace, None);
        assert_eq!(job.document, 1);
        assert_eq!(job.reference(), "trainingjob.trainyard.dev/mnist");
        let (namespace, object) = job.resolve(true, "team-a");
        assert_eq!(namespace.as_deref(), Some("team-a"));
        assert_eq!(object["metadata"]["namespace"], "team-a");
        // Defaults are the server's business: gpusPerWorker is not filled in.
        assert!(job.object["spec"].get("gpusPerWorker").is_none());
    }

    #[test]
    fn the_objects_own_namespace_wins_over_the_fallback() {
        let text = JOB.replace("  name: mnist\n", "  name: mnist\n  namespace: ml\n");
        let manifests = parse_file("job.yaml", &text).expect("valid");
        assert_eq!(manifests[0].namespace.as_deref(), Some("ml"));
        let (namespace, object) = manifests[0].resolve(true, "team-a");
        assert_eq!(namespace.as_deref(), Some("ml"));
        assert_eq!(object["metadata"]["namespace"], "ml");
    }

    #[test]
    fn documents_are_split_and_empty_ones_skipped() {
        let text = format!(
            "---\n# only a comment\n---\n{JOB}---\n{}",
            JOB.replace("mnist\nspec", "second\nspec")
        );
        let manifests = parse_file("jobs.yaml", &text).expect("valid");
        let names: Vec<_> = manifests.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["mnist", "second"]);
        assert!(manifests[1].document > manifests[0].document);
    }

    #[test]
    fn an_empty_file_has_no_objects() {
        assert_eq!(parse_file("empty.yaml", ""), Ok(vec![]));
        assert_eq!(parse_file("empty.yaml", "# nothing\n"), Ok(vec![]));
    }

    #[test]
    fn queues_are_cluster_scoped_and_lose_a_namespace() {
        let text = "apiVersion: trainyard.dev/v1
kind: TrainingQueue
metadata:
  name: default
  namespace: ignored
spec:
  flavors:
    - name: a100
      nominalQuota: 8
";
        let manifests = parse_file("queue.yaml", text).expect("valid");
        assert_eq!(
            manifests[0].kind,
            ObjectKind::Trainyard(Kind::TrainingQueue)
        );
        assert_eq!(manifests[0].namespace, None);
        let (namespace, object) = manifests[0].resolve(true, "team-a");
        assert_eq!(namespace, None);
        assert!(object["metadata"].get("namespace").is_none());
        assert_eq!(
            manifests[0].reference(),
            "trainingqueue.trainyard.dev/default"
        );
    }

    #[test]
    fn status_is_dropped() {
        let text = format!("{JOB}status:\n  state: Completed\n");
        let manifests = parse_file("job.yaml", &text).expect("valid");
        assert!(manifests[0].object.get("status").is_none());
    }

    #[test]
    fn a_rule_violation_names_file_document_object_field_and_fix() {
        let text = format!(
            "{JOB}---\n{}",
            JOB.replace("numWorkers: 2", "numWorkers: 0")
        );
        let error = one_error(&text);
        assert_eq!(error.document, 2);
        assert_eq!(paths(&error), ["spec.numWorkers"]);
        let message = error.to_string();
        assert!(
            message.starts_with("bad.yaml: document 2 (TrainingJob \"mnist\"): "),
            "{message}"
        );
        assert!(
            message.contains("spec.numWorkers: Invalid value: must be between 1 and 100, got 0"),
            "{message}"
        );
    }

    #[test]
    fn a_cross_field_rule_reports_the_fix() {
        let text = format!("{JOB}  checkpoint:\n    resumeFrom: s3://b/c\n");
        let error = one_error(&text);
        assert_eq!(paths(&error), ["spec.checkpoint.resumeFrom"]);
        assert!(
            error.to_string().contains("checkpoint.enabled: true"),
            "{error}"
        );
    }

    #[test]
    fn an_unsupported_enum_value_is_named() {
        let text = format!("{JOB}  framework: caffe\n");
        let error = one_error(&text);
        assert_eq!(paths(&error), ["spec.framework"]);
        assert!(error.to_string().contains("Unsupported value"), "{error}");
    }

    #[test]
    fn a_missing_required_field_is_named() {
        let error = one_error(&JOB.replace("  dataset: mnist\n", ""));
        assert_eq!(paths(&error), ["spec.dataset"]);
        assert!(error.to_string().contains("Required value"), "{error}");
    }

    #[test]
    fn misspelt_fields_are_refused_with_their_path() {
        let text = format!("{JOB}  gpusPerWrker: 4\n  env:\n    - name: A\n      valu: b\n");
        let error = one_error(&text);
        let mut found = paths(&error);
        found.sort();
        assert_eq!(found, ["spec.env[0].valu", "spec.gpusPerWrker"]);
        assert!(error.to_string().contains("Unknown field"), "{error}");
    }

    #[test]
    fn a_misspelt_required_field_is_reported_missing_and_unknown() {
        let error = one_error(&JOB.replace("numWorkers: 2", "numWorker: 2"));
        assert_eq!(paths(&error), ["spec.numWorkers", "spec.numWorker"]);
    }

    #[test]
    fn unknown_fields_are_reported_with_rule_violations() {
        let error =
            one_error(&JOB.replace("numWorkers: 2", "numWorkers: 0\n  imagePullPolicy: Always"));
        assert_eq!(paths(&error), ["spec.numWorkers", "spec.imagePullPolicy"]);
    }

    #[test]
    fn a_misspelt_section_is_reported_missing_and_unknown() {
        let error = one_error(&JOB.replace("spec:", "specs:"));
        assert_eq!(paths(&error), ["spec", "specs"]);
    }

    #[test]
    fn envelope_problems_are_all_reported() {
        let text = "apiVersion: trainyard.dev/v2\nkind: TrainingJob\nmetadata:\n  name: Bad_Name\n  namespace: Team\n";
        let error = one_error(text);
        let mut found = paths(&error);
        found.sort();
        assert_eq!(
            found,
            ["apiVersion", "metadata.name", "metadata.namespace", "spec"]
        );
        assert_eq!(error.object.as_deref(), Some("TrainingJob"));
    }

    #[test]
    fn unknown_kinds_in_trainyards_group_are_refused_with_the_list_of_kinds() {
        let error =
            one_error("apiVersion: trainyard.dev/v1\nkind: Experiment\nmetadata:\n  name: x\n");
        let message = error.to_string();
        assert!(message.contains("kind: Unsupported value: \"Experiment\" is not a Trainyard kind: use one of TrainingJob, Sweep, TrainingQueue"), "{message}");
        let error = one_error("metadata:\n  name: x\n");
        assert_eq!(paths(&error), ["kind", "apiVersion"]);
    }

    #[test]
    fn other_kinds_pass_through_with_their_envelope_checked() {
        let text = "apiVersion: v1
kind: PersistentVolumeClaim
metadata:
  name: sweep-checkpoints
spec:
  accessModes: [ReadWriteMany]
  resources: {requests: {storage: 100Gi}}
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: ml}
spec: {anything: goes}
---
apiVersion: v1
kind: Namespace
metadata: {name: ml}
";
        let manifests = parse_file("mixed.yaml", text).expect("valid");
        let references: Vec<String> = manifests.iter().map(Manifest::reference).collect();
        assert_eq!(
            references,
            [
                "persistentvolumeclaim/sweep-checkpoints",
                "deployment.apps/web",
                "namespace/ml"
            ]
        );
        assert_eq!(
            manifests[1].kind,
            ObjectKind::Other {
                api_version: "apps/v1".into(),
                kind: "Deployment".into()
            }
        );
        assert_eq!(manifests[1].kind.group(), "apps");
        let (namespace, object) = manifests[0].resolve(true, "team-a");
        assert_eq!(namespace.as_deref(), Some("team-a"));
        assert_eq!(object["metadata"]["namespace"], "team-a");
        assert_eq!(object["spec"]["accessModes"][0], "ReadWriteMany");
        assert_eq!(
            manifests[1].resolve(true, "team-a").0.as_deref(),
            Some("ml")
        );
        let (namespace, object) = manifests[2].resolve(false, "team-a");
        assert_eq!(namespace, None);
        assert!(object["metadata"].get("namespace").is_none());
    }

    #[test]
    fn other_kinds_need_api_version_kind_and_name() {
        let error = one_error("apiVersion: v1\nkind: ConfigMap\nmetadata: {labels: {a: b}}\n");
        assert_eq!(paths(&error), ["metadata.name"]);
        assert_eq!(error.object.as_deref(), Some("ConfigMap"));
        let error = one_error("apiVersion: a/b/c\nkind: ConfigMap\nmetadata: {name: x}\n");
        assert_eq!(paths(&error), ["apiVersion"]);
        let error = one_error("apiVersion: v1\nmetadata: {name: x, namespace: Bad}\n");
        assert_eq!(paths(&error), ["kind", "metadata.namespace"]);
        let error = one_error("kind: ConfigMap\nmetadata: {name: a/b}\n");
        assert_eq!(paths(&error), ["apiVersion", "metadata.name"]);
    }

    #[test]
    fn generate_name_is_explained() {
        let error = one_error(&JOB.replace("name: mnist", "generateName: mnist-"));
        assert!(
            error.to_string().contains("generateName cannot be used"),
            "{error}"
        );
    }

    #[test]
    fn a_scalar_document_is_refused() {
        let error = one_error("just text\n");
        assert!(error.to_string().contains("must be a mapping"), "{error}");
    }

    #[test]
    fn yaml_syntax_errors_carry_the_position() {
        let error = one_error(&format!("{JOB}---\nkind: [unclosed\n"));
        assert_eq!(error.document, 2);
        assert!(
            matches!(&error.problems[..], [Problem::Yaml(m)] if m.contains("line")),
            "{error}"
        );
    }

    #[test]
    fn a_bad_label_value_is_refused() {
        let error = one_error(&JOB.replace(
            "  name: mnist\n",
            "  name: mnist\n  labels:\n    team: [a]\n",
        ));
        assert_eq!(paths(&error), ["metadata"]);
    }

    #[test]
    fn several_problems_are_listed_one_per_line() {
        let error = one_error(&JOB.replace("numWorkers: 2", "numWorkers: 0\n  gpusPerWorker: 100"));
        let message = error.to_string();
        assert_eq!(message.lines().count(), 3, "{message}");
        assert!(message.contains("\n  - spec.gpusPerWorker"), "{message}");
        assert_eq!(error.problem_count(), 2);
    }

    #[test]
    fn sweeps_validate_their_trial_template() {
        let text = "apiVersion: trainyard.dev/v1
kind: Sweep
metadata:
  name: s
spec:
  objective: {metric: loss, direction: minimize}
  parameters:
    - {name: learningRate, type: float, min: 0.1, max: 0.01}
  maxTrialCount: 4
  trialTemplate: {model: m, dataset: d, numWorkers: 200}
";
        let error = one_error(text);
        let mut found = paths(&error);
        found.sort();
        assert_eq!(
            found,
            ["spec.parameters[0].max", "spec.trialTemplate.numWorkers"]
        );
    }
}
