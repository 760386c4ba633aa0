//! The simulated API server's object store: every object as JSON, one global
//! resourceVersion counter, watch history, optimistic concurrency, finalizers,
//! owner-reference garbage collection and an approximation of server-side apply.
//!
//! The semantics follow the real apiserver where Trainyard depends on them:
//! unchanged writes do not bump the resourceVersion nor emit an event, the status
//! subresource is the only way to change `status` of types that have one, a
//! deletion of an object with finalizers only sets `deletionTimestamp`, a client
//! changes a pod's spec only as scheduling gates allow (see `pod_update`), and a
//! watch from a resourceVersion the history no longer holds ends with 410 Gone.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use chrono::{SecondsFormat, Utc};
use serde_json::{Map, Value, json};
use tokio::sync::broadcast;

use crate::error::ApiError;
use crate::pod_logs::PodLogs;
use crate::pod_update;
use crate::resources::{self, ResourceType};
use crate::selector::Selector;
use crate::typed;

/// Watch history kept for resuming watches; older resumes get 410 Gone and relist.
pub const HISTORY: usize = 200_000;
/// The labels the API server selects a Job's pods by.
pub(crate) const JOB_CONTROLLER_UID_LABEL: &str = "batch.kubernetes.io/controller-uid";
pub(crate) const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";
/// Events a slow watcher may fall behind before its watch is closed (it then relists).
pub const WATCH_BUFFER: usize = 65_536;

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Added,
    Modified,
    Deleted,
}

impl ChangeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Added => "ADDED",
            Self::Modified => "MODIFIED",
            Self::Deleted => "DELETED",
        }
    }
}

/// One change, as watches see it.
#[derive(Debug, Clone)]
pub struct Change {
    pub resource_version: u64,
    pub resource: &'static str,
    pub kind: ChangeKind,
    pub object: Arc<Value>,
    /// The object before a `Modified` change: a filtered watch reports an object
    /// that starts or stops matching its selectors as added or deleted.
    pub previous: Option<Arc<Value>>,
    /// `object` serialised, as watch events carry it: once for every watch.
    pub json: Arc<[u8]>,
}

/// A change as the history keeps it: serialised, which takes a fraction of the
/// memory of the object's JSON tree (the history held one for every version of
/// every object, and growing the heap for them was a tenth of the simulator's
/// time). Read back only for a watch that resumes.
#[derive(Debug)]
struct Recorded {
    resource_version: u64,
    resource: &'static str,
    kind: ChangeKind,
    json: Arc<[u8]>,
    previous: Option<Arc<[u8]>>,
}

impl Recorded {
    /// The change again; `None` if it does not parse, which cannot happen to what
    /// was serialised from a JSON value.
    fn change(&self) -> Option<Change> {
        let parse = |json: &[u8]| serde_json::from_slice(json).ok().map(Arc::new);
        let previous = match &self.previous {
            Some(json) => Some(parse(json)?),
            None => None,
        };
        Some(Change {
            resource_version: self.resource_version,
            resource: self.resource,
            kind: self.kind,
            object: parse(&self.json)?,
            previous,
            json: self.json.clone(),
        })
    }
}

/// A stored object and its serialised form, which the history keeps as the
/// previous version when the object changes.
struct Stored {
    object: Arc<Value>,
    json: Arc<[u8]>,
}

impl Change {
    pub fn namespace(&self) -> Option<&str> {
        self.object["metadata"]["namespace"].as_str()
    }
}

/// Which part of an object a write targets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Subresource {
    Main,
    Status,
}

/// How a PATCH body is to be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchKind {
    /// RFC 7386 JSON merge patch.
    Merge,
    /// Strategic merge patch: a merge patch, except that a list of objects that
    /// all have a string `name` (the patch merge key of `schedulingGates`,
    /// `containers`, `volumes`, `env`, ...) merges into the stored list by name,
    /// and `{"name": X, "$patch": "delete"}` removes the element named X. Other
    /// lists are replaced whole; `$patch` keys are never stored.
    Strategic,
    /// Server-side apply.
    Apply { force: bool },
}

/// Deletion propagation to dependents (objects whose ownerReferences name this one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Propagation {
    #[default]
    Background,
    Foreground,
    Orphan,
}

/// Objects of one type by namespace (empty if cluster-scoped) and name, in the
/// order lists return them: looked up by borrowed names, without building a key
/// for each lookup.
type Objects = BTreeMap<String, BTreeMap<String, Stored>>;
/// An object's main resource or status, as field managers apply to them.
type AppliedKey = (&'static str, String, String, Subresource);

#[derive(Default)]
struct Inner {
    revision: u64,
    objects: HashMap<&'static str, Objects>,
    history: VecDeque<Recorded>,
    /// What each field manager last applied, per object and subresource: fields it
    /// applied before and leaves out now are removed, as server-side apply does,
    /// unless another manager still applies them.
    applied: HashMap<AppliedKey, BTreeMap<String, Value>>,
    /// Where changes are serialised before being copied out at their size: a
    /// growing buffer per change made several large allocations, each of which
    /// makes the allocator consolidate the small blocks freed since.
    scratch: Vec<u8>,
}

/// The object store behind the simulated API server (and the simulated controllers).
pub struct Store {
    inner: Mutex<Inner>,
    changes: broadcast::Sender<Change>,
    /// Changes kept for resuming watches ([`HISTORY`] unless set).
    history: usize,
    /// What the pods' containers wrote, served by the `log` subresource.
    logs: PodLogs,
}

impl Default for Store {
    fn default() -> Self {
        Self::with_history(HISTORY)
    }
}

/// A watch's starting point: the changes after the requested resourceVersion
/// that the history still holds, then the live feed.
pub struct WatchStart {
    pub backlog: Vec<Change>,
    pub live: broadcast::Receiver<Change>,
}

/// As the API server defaults a Job without `manualSelector`: its pods are
/// selected by the Job's uid, and its template carries that label and the Job's
/// name, so `kubectl logs job/NAME` finds the Job's own pods.
fn default_job_selector(job: &mut Value, name: &str, uid: &str) {
    let Some(spec) = job.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let manual = spec.get("manualSelector") == Some(&json!(true));
    if manual || spec.get("selector").is_some_and(|s| !s.is_null()) {
        return;
    }
    let Some(template) = spec.get_mut("template").and_then(Value::as_object_mut) else {
        return;
    };
    let metadata = template.entry("metadata").or_insert_with(|| json!({}));
    let Some(metadata) = metadata.as_object_mut() else {
        return;
    };
    let labels = metadata.entry("labels").or_insert_with(|| json!({}));
    let Some(labels) = labels.as_object_mut() else {
        return;
    };
    labels.insert(JOB_CONTROLLER_UID_LABEL.into(), json!(uid));
    labels.insert(JOB_NAME_LABEL.into(), json!(name));
    spec.insert(
        "selector".into(),
        json!({"matchLabels": {JOB_CONTROLLER_UID_LABEL: uid}}),
    );
}

fn now() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Secs, true)
}

impl Inner {
    fn object(&self, rt: &ResourceType, namespace: Option<&str>, name: &str) -> Option<&Stored> {
        self.objects
            .get(rt.name)?
            .get(namespace.unwrap_or_default())?
            .get(name)
    }

    /// Stores `object` under its namespace and name, replacing what was there.
    fn put(&mut self, rt: &ResourceType, namespace: Option<&str>, name: &str, object: Stored) {
        let namespace = namespace.unwrap_or_default();
        let namespaces = self.objects.entry(rt.name).or_default();
        let Some(names) = namespaces.get_mut(namespace) else {
            let names = BTreeMap::from([(name.to_owned(), object)]);
            namespaces.insert(namespace.to_owned(), names);
            return;
        };
        match names.get_mut(name) {
            Some(stored) => *stored = object,
            None => {
                names.insert(name.to_owned(), object);
            }
        }
    }

    fn take(&mut self, rt: &ResourceType, namespace: Option<&str>, name: &str) -> Option<Stored> {
        self.objects
            .get_mut(rt.name)?
            .get_mut(namespace.unwrap_or_default())?
            .remove(name)
    }
}

fn meta(object: &Value) -> &Value {
    &object["metadata"]
}

fn meta_mut(object: &mut Value) -> &mut Map<String, Value> {
    if !object["metadata"].is_object() {
        object["metadata"] = json!({});
    }
    match object.get_mut("metadata").and_then(Value::as_object_mut) {
        Some(map) => map,
        None => unreachable!("metadata was just made an object"),
    }
}

/// How a patch body merges into an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum MergeRules {
    /// RFC 7386: `null` removes a field, lists are replaced whole.
    JsonMerge,
    /// Server-side apply bodies: `null` is skipped (the absent-field rule removes).
    Apply,
    /// Strategic merge patch, as [`PatchKind::Strategic`] describes it.
    Strategic,
}

impl MergeRules {
    fn null_removes(self) -> bool {
        self != Self::Apply
    }

    /// Whether merging `value` into the field `name` of `map` does nothing: a
    /// strategic `$patch` key is a directive, not a field, and deleting from a
    /// list that is not there leaves it not there.
    fn skips(self, name: &str, value: &Value, map: &Map<String, Value>) -> bool {
        self == Self::Strategic
            && (name == PATCH_DIRECTIVE || (!map.contains_key(name) && only_deletes(value)))
    }
}

/// The strategic merge patch's directive key; `"delete"` on a list element is
/// the one value acted on.
const PATCH_DIRECTIVE: &str = "$patch";

/// RFC 7386: objects merge key by key, `null` removes, anything else replaces.
pub fn merge_patch(target: &mut Value, patch: &Value) {
    merge(target, patch, MergeRules::JsonMerge);
}

/// Merges `patch` into `target` by `rules`.
fn merge(target: &mut Value, patch: &Value, rules: MergeRules) {
    match patch {
        Value::Object(fields) => {
            if !target.is_object() {
                *target = json!({});
            }
            if let Some(map) = target.as_object_mut() {
                for (name, value) in fields {
                    if rules.skips(name, value, map) {
                        continue;
                    }
                    if !value.is_null() {
                        let field = map.entry(name.clone()).or_insert(Value::Null);
                        merge(field, value, rules);
                    } else if rules.null_removes() {
                        map.remove(name);
                    }
                }
            }
        }
        Value::Array(elements) if rules == MergeRules::Strategic => {
            merge_strategic_list(target, elements);
        }
        other => *target = other.clone(),
    }
}

/// The name of a list element that is an object with a string `name`.
fn element_name(element: &Value) -> Option<&str> {
    element.get("name")?.as_str()
}

/// The elements of a strategic patch's list with their names, if it merges by
/// name: not empty (an empty list clears the field, as in a merge patch) and
/// every element named.
fn named_elements(elements: &[Value]) -> Option<Vec<(&str, &Value)>> {
    if elements.is_empty() {
        return None;
    }
    elements
        .iter()
        .map(|element| Some((element_name(element)?, element)))
        .collect()
}

fn deletes(element: &Value) -> bool {
    element[PATCH_DIRECTIVE] == "delete"
}

/// Whether `value` is a strategic list of deletions only.
fn only_deletes(value: &Value) -> bool {
    value
        .as_array()
        .and_then(|elements| named_elements(elements))
        .is_some_and(|named| named.iter().all(|(_, element)| deletes(element)))
}

/// A value from a strategic patch with nothing to merge into: the patch's value
/// less its directives (and, as a merge into nothing goes, its `null` fields).
fn strategic_value(patch: &Value) -> Value {
    let mut value = Value::Null;
    merge(&mut value, patch, MergeRules::Strategic);
    value
}

/// Merges a strategic patch's list into `target`: by name when it is a named
/// list (see [`named_elements`]), else replacing it.
fn merge_strategic_list(target: &mut Value, elements: &[Value]) {
    let Some(named) = named_elements(elements) else {
        *target = Value::Array(elements.iter().map(strategic_value).collect());
        return;
    };
    if !target.is_array() {
        *target = json!([]);
    }
    let Some(list) = target.as_array_mut() else {
        return;
    };
    for (name, element) in named {
        if deletes(element) {
            list.retain(|existing| element_name(existing) != Some(name));
            continue;
        }
        match list.iter_mut().find(|e| element_name(e) == Some(name)) {
            Some(existing) => merge(existing, element, MergeRules::Strategic),
            None => list.push(strategic_value(element)),
        }
    }
}

/// Whether [`merge`] of `patch` into `target` would leave it as it is. Checked
/// before a patch copies the object: most applies repeat what is stored, and the
/// copy was most of their cost.
fn merge_changes_nothing(target: &Value, patch: &Value, rules: MergeRules) -> bool {
    match patch {
        Value::Object(fields) => target.as_object().is_some_and(|map| {
            fields.iter().all(|(name, value)| match map.get(name) {
                _ if rules.skips(name, value, map) => true,
                _ if value.is_null() && !rules.null_removes() => true,
                None => value.is_null(),
                Some(_) if value.is_null() => false,
                Some(field) => merge_changes_nothing(field, value, rules),
            })
        }),
        Value::Array(elements) if rules == MergeRules::Strategic => {
            strategic_list_changes_nothing(target, elements)
        }
        other => target == other,
    }
}

/// [`merge_changes_nothing`] for a strategic patch's list. Each element is
/// checked against `target` as it is; a patch naming an element twice may be
/// seen to change something when it does not, which only costs the copy.
fn strategic_list_changes_nothing(target: &Value, elements: &[Value]) -> bool {
    let Some(named) = named_elements(elements) else {
        return target.as_array().is_some_and(|list| {
            list.len() == elements.len()
                && list
                    .iter()
                    .zip(elements)
                    .all(|(existing, element)| *existing == strategic_value(element))
        });
    };
    let Some(list) = target.as_array() else {
        return false;
    };
    named.iter().all(|(name, element)| {
        let existing = list.iter().find(|e| element_name(e) == Some(name));
        match existing {
            _ if deletes(element) => existing.is_none(),
            Some(existing) => merge_changes_nothing(existing, element, MergeRules::Strategic),
            None => false,
        }
    })
}

/// Removes from `live` the fields `before` had and `after` lacks (map keys only;
/// lists and scalars are owned whole), except those one of `others` (what the
/// other managers last applied) still has: a field with several owners stays. A
/// dropped map loses only the fields this manager applied in it, and goes itself
/// once nothing else is left in it.
fn remove_dropped_fields(live: &mut Value, before: &Value, after: &Value, others: &[&Value]) {
    let (Some(live), Some(before)) = (live.as_object_mut(), before.as_object()) else {
        return;
    };
    for (name, old) in before {
        let shared: Vec<&Value> = others.iter().filter_map(|o| o.get(name)).collect();
        let new = after.get(name);
        let Some(child) = live.get_mut(name) else {
            continue;
        };
        let dropped = new.is_none() && shared.is_empty();
        if dropped && !(old.is_object() && child.is_object()) {
            live.remove(name);
            continue;
        }
        remove_dropped_fields(child, old, new.unwrap_or(&Value::Null), &shared);
        if dropped && child.as_object().is_some_and(Map::is_empty) {
            live.remove(name);
        }
    }
}

/// Whether two JSON objects are equal but for the fields in `skip`.
fn equal_except(a: &Value, b: &Value, skip: &[&str]) -> bool {
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return a == b;
    };
    let kept =
        |map: &Map<String, Value>| map.keys().filter(|k| !skip.contains(&k.as_str())).count();
    kept(a) == kept(b)
        && a.iter()
            .filter(|(k, _)| !skip.contains(&k.as_str()))
            .all(|(k, v)| b.get(k) == Some(v))
}

/// What a write changes of an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Changed {
    /// Anything but `resourceVersion` and `managedFields`; if not, the write
    /// changes nothing.
    anything: bool,
    /// The spec part (everything but metadata and status): bumps `generation`.
    spec: bool,
}

/// Compared in place (copying both objects to strip those fields was most of a
/// write's cost), and the spec part, often the largest, only once.
fn changed(next: &Value, current: &Value) -> Changed {
    let spec = !equal_except(next, current, &["metadata", "status"]);
    let anything = spec
        || next.get("status") != current.get("status")
        || !equal_except(
            &next["metadata"],
            &current["metadata"],
            &["resourceVersion", "managedFields"],
        );
    Changed { anything, spec }
}

impl Store {
    /// A store whose watch history keeps the last `changes` changes (at least one):
    /// a watch resuming from before them gets 410 Gone and its client relists.
    pub fn with_history(changes: usize) -> Self {
        Self {
            // Revision 0 is never issued: a list of an empty store must not report
            // "0", which a watch reads as "from now" and which would skip changes
            // made between that list and the watch.
            inner: Mutex::new(Inner {
                revision: 1,
                ..Inner::default()
            }),
            changes: broadcast::channel(WATCH_BUFFER).0,
            history: changes.max(1),
            logs: PodLogs::default(),
        }
    }

    /// The pods' logs: the simulated workers write them, the API server reads them.
    pub fn logs(&self) -> &PodLogs {
        &self.logs
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave a half-written object: every
        // write replaces a whole Arc, so the data is usable after poisoning.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `object` serialised as it was when stored, if it is what the store holds
    /// under its namespace and name: a reply sends those bytes instead of
    /// serialising the object again.
    pub fn serialised(&self, rt: &ResourceType, object: &Arc<Value>) -> Option<Arc<[u8]>> {
        let metadata = meta(object);
        let name = metadata["name"].as_str()?;
        let inner = self.lock();
        let stored = inner.object(rt, metadata["namespace"].as_str(), name)?;
        Arc::ptr_eq(&stored.object, object).then(|| stored.json.clone())
    }

    /// The current resourceVersion.
    pub fn revision(&self) -> u64 {
        self.lock().revision
    }

    pub fn get(
        &self,
        rt: &ResourceType,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Arc<Value>, ApiError> {
        self.lock()
            .object(rt, namespace, name)
            .map(|stored| stored.object.clone())
            .ok_or_else(|| ApiError::not_found(rt, name))
    }

    /// Objects of a type, in one namespace or all, matching the selectors, with the
    /// resourceVersion the list is consistent at.
    pub fn list(
        &self,
        rt: &ResourceType,
        namespace: Option<&str>,
        labels: &Selector,
        fields: &Selector,
    ) -> (Vec<Arc<Value>>, u64) {
        let inner = self.lock();
        let items = inner
            .objects
            .get(rt.name)
            .map(|objects| {
                objects
                    .iter()
                    .filter(|(ns, _)| namespace.is_none_or(|want| want == *ns))
                    .flat_map(|(_, names)| names.values().map(|stored| &stored.object))
                    .filter(|object| labels.matches_labels(object) && fields.matches_fields(object))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        (items, inner.revision)
    }

    /// Starts a watch after `from` (exclusive). `None` when the history no longer
    /// reaches back that far: the client must relist (410 Gone).
    pub fn watch(&self, rt: &ResourceType, from: u64) -> Option<WatchStart> {
        let inner = self.lock();
        // Subscribing under the lock means no change falls between backlog and feed.
        let live = self.changes.subscribe();
        let oldest = inner.history.front().map(|c| c.resource_version);
        if let Some(oldest) = oldest
            && from + 1 < oldest
        {
            return None;
        }
        let backlog = inner
            .history
            .iter()
            .filter(|c| c.resource_version > from && c.resource == rt.name)
            .filter_map(Recorded::change)
            .collect();
        Some(WatchStart { backlog, live })
    }

    /// Subscribes to every change from now on (the simulated controllers use this).
    pub fn subscribe(&self) -> broadcast::Receiver<Change> {
        self.changes.subscribe()
    }

    /// Records a change in the history and sends it to the watches; `previous` is
    /// the object before it, and its serialised form. Returns `object` serialised.
    fn record(
        &self,
        inner: &mut Inner,
        rt: &ResourceType,
        kind: ChangeKind,
        object: Arc<Value>,
        previous: Option<(Arc<Value>, Arc<[u8]>)>,
    ) -> Arc<[u8]> {
        inner.scratch.clear();
        let json: Arc<[u8]> = match serde_json::to_writer(&mut inner.scratch, object.as_ref()) {
            Ok(()) => Arc::from(inner.scratch.as_slice()),
            Err(_) => Arc::from(&[][..]),
        };
        let (previous, previous_json) = previous.unzip();
        while inner.history.len() >= self.history {
            inner.history.pop_front();
        }
        inner.history.push_back(Recorded {
            resource_version: inner.revision,
            resource: rt.name,
            kind,
            json: json.clone(),
            previous: previous_json,
        });
        if kind == ChangeKind::Deleted && rt.name == resources::pods().name {
            let metadata = meta(&object);
            if let (Some(namespace), Some(name)) =
                (metadata["namespace"].as_str(), metadata["name"].as_str())
            {
                self.logs.remove(namespace, name);
            }
        }
        // No receiver is fine: nobody is watching.
        let _ = self.changes.send(Change {
            resource_version: inner.revision,
            resource: rt.name,
            kind,
            object,
            previous,
            json: json.clone(),
        });
        json
    }

    fn next_revision(inner: &mut Inner) -> u64 {
        inner.revision += 1;
        inner.revision
    }

    /// POST: creates the object; `generateName` is honoured. Types with a status
    /// subresource start without status, as on a real apiserver.
    pub fn create(
        &self,
        rt: &ResourceType,
        namespace: Option<&str>,
        object: Value,
    ) -> Result<Arc<Value>, ApiError> {
        let mut inner = self.lock();
        self.create_locked(&mut inner, rt, namespace, object, rt.status_subresource)
    }

    /// Creates an object with its status (the simulated kubelet registering a Node,
    /// the simulated Job controller creating a Pod).
    pub fn create_with_status(
        &self,
        rt: &ResourceType,
        namespace: Option<&str>,
        object: Value,
    ) -> Result<Arc<Value>, ApiError> {
        let mut inner = self.lock();
        self.create_locked(&mut inner, rt, namespace, object, false)
    }

    fn create_locked(
        &self,
        inner: &mut Inner,
        rt: &ResourceType,
        namespace: Option<&str>,
        mut object: Value,
        drop_status: bool,
    ) -> Result<Arc<Value>, ApiError> {
        if !object.is_object() {
            return Err(ApiError::bad_request("the body must be a JSON object"));
        }
        let name = match (
            meta(&object)["name"].as_str(),
            meta(&object)["generateName"].as_str(),
        ) {
            (Some(name), _) if !name.is_empty() => name.to_owned(),
            (_, Some(prefix)) => format!("{prefix}{}", random_suffix()),
            _ => {
                return Err(ApiError::invalid(
                    rt,
                    "",
                    "metadata.name: Required value: name or generateName is required",
                ));
            }
        };
        let namespace = if rt.namespaced {
            match namespace.or(meta(&object)["namespace"].as_str()) {
                Some(ns) if !ns.is_empty() => Some(ns.to_owned()),
                _ => {
                    return Err(ApiError::bad_request(
                        "metadata.namespace: a namespaced object needs a namespace",
                    ));
                }
            }
        } else {
            None
        };
        if inner.object(rt, namespace.as_deref(), &name).is_some() {
            return Err(ApiError::already_exists(rt, &name));
        }
        object["apiVersion"] = json!(rt.api_version());
        object["kind"] = json!(rt.kind);
        if drop_status {
            object.as_object_mut().map(|o| o.remove("status"));
        }
        let revision = Self::next_revision(inner);
        let metadata = meta_mut(&mut object);
        metadata.insert("name".into(), json!(name));
        match &namespace {
            Some(ns) => metadata.insert("namespace".into(), json!(ns)),
            None => metadata.remove("namespace"),
        };
        let uid = uuid::Uuid::now_v7().to_string();
        metadata.insert("uid".into(), json!(uid));
        metadata.insert("creationTimestamp".into(), json!(now()));
        metadata.insert("resourceVersion".into(), json!(revision.to_string()));
        metadata.insert("generation".into(), json!(1));
        metadata.remove("deletionTimestamp");
        if rt.name == resources::jobs().name {
            default_job_selector(&mut object, &name, &uid);
        }
        let stored = Arc::new(object);
        let json = self.record(inner, rt, ChangeKind::Added, stored.clone(), None);
        let object = Stored {
            object: stored.clone(),
            json,
        };
        inner.put(rt, namespace.as_deref(), &name, object);
        Ok(stored)
    }

    /// PUT: replaces the object (or its status), checking `resourceVersion` when given.
    pub fn replace(
        &self,
        rt: &ResourceType,
        namespace: Option<&str>,
        name: &str,
        object: Value,
        subresource: Subresource,
    ) -> Result<Arc<Value>, ApiError> {
        if !object.is_object() {
            return Err(ApiError::bad_request("the body must be a JSON object"));
        }
        let mut inner = self.lock();
        let current = Self::current(&inner, rt, namespace, name)?;
        Self::check_revision(rt, name, &current, &object)?;
        let next = Self::combine(rt, &current, object, subresource);
        Self::validate(rt, name, &current, &next, subresource)?;
        self.commit(&mut inner, rt, namespace, name, &current, next)
    }

    /// PATCH: merge, strategic or server-side apply. Apply creates the object
    /// when it does not exist.
    // One argument per part of the request, as the HTTP layer has them.
    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &self,
        rt: &ResourceType,
        namespace: Option<&str>,
        name: &str,
        kind: PatchKind,
        body: Value,
        field_manager: Option<&str>,
        subresource: Subresource,
    ) -> Result<Arc<Value>, ApiError> {
        if !body.is_object() {
            return Err(ApiError::bad_request(
                "the patch must be a JSON object (a JSON Patch list is not simulated)",
            ));
        }
        let mut inner = self.lock();
        if let PatchKind::Apply { .. } = kind {
            let Some(manager) = field_manager.filter(|m| !m.is_empty()) else {
                return Err(ApiError::bad_request(
                    "fieldManager is required for apply patch (set ?fieldManager=<name>)",
                ));
            };
            let applied_key = (
                rt.name,
                namespace.unwrap_or_default().to_owned(),
                name.to_owned(),
                subresource,
            );
            // Every successful apply records what this manager applied.
            let stored = 'apply: {
                let current = match Self::current(&inner, rt, namespace, name) {
                    Ok(current) => current,
                    Err(_) if subresource == Subresource::Main => {
                        let mut object = body.clone();
                        meta_mut(&mut object).insert("name".into(), json!(name));
                        break 'apply self.create_locked(
                            &mut inner,
                            rt,
                            namespace,
                            object,
                            rt.status_subresource,
                        )?;
                    }
                    Err(err) => return Err(err),
                };
                let managers = inner.applied.get(&applied_key);
                let before = managers.and_then(|managers| managers.get(manager));
                // Nothing to drop and nothing to merge: the object stays as it is.
                if before.is_none_or(|before| *before == body)
                    && merge_changes_nothing(&current, &body, MergeRules::Apply)
                {
                    break 'apply current;
                }
                let mut next = Self::patch_base(&current, subresource);
                if let (Some(managers), Some(before)) = (managers, before) {
                    let others: Vec<&Value> = managers
                        .iter()
                        .filter(|(other, _)| *other != manager)
                        .map(|(_, applied)| applied)
                        .collect();
                    remove_dropped_fields(&mut next, before, &body, &others);
                }
                merge(&mut next, &body, MergeRules::Apply);
                let next = Self::combine(rt, &current, next, subresource);
                Self::validate(rt, name, &current, &next, subresource)?;
                self.commit(&mut inner, rt, namespace, name, &current, next)?
            };
            inner
                .applied
                .entry(applied_key)
                .or_default()
                .insert(manager.to_owned(), body);
            return Ok(stored);
        }
        let current = Self::current(&inner, rt, namespace, name)?;
        Self::check_revision(rt, name, &current, &body)?;
        let rules = if kind == PatchKind::Strategic {
            MergeRules::Strategic
        } else {
            MergeRules::JsonMerge
        };
        if merge_changes_nothing(&current, &body, rules) {
            return Ok(current);
        }
        let mut next = Self::patch_base(&current, subresource);
        merge(&mut next, &body, rules);
        let next = Self::combine(rt, &current, next, subresource);
        Self::validate(rt, name, &current, &next, subresource)?;
        self.commit(&mut inner, rt, namespace, name, &current, next)
    }

    /// DELETE: with finalizers the object only gets a `deletionTimestamp`; without,
    /// it goes, and (unless orphaned) so do its dependents.
    pub fn delete(
        &self,
        rt: &ResourceType,
        namespace: Option<&str>,
        name: &str,
        propagation: Propagation,
    ) -> Result<Arc<Value>, ApiError> {
        let mut inner = self.lock();
        let current = Self::current(&inner, rt, namespace, name)?;
        let has_finalizers = meta(&current)["finalizers"]
            .as_array()
            .is_some_and(|f| !f.is_empty());
        if has_finalizers {
            if meta(&current)["deletionTimestamp"].is_string() {
                return Ok(current);
            }
            let mut next = (*current).clone();
            meta_mut(&mut next).insert("deletionTimestamp".into(), json!(now()));
            return self.commit(&mut inner, rt, namespace, name, &current, next);
        }
        Ok(self.remove_locked(&mut inner, rt, namespace, name, propagation))
    }

    fn remove_locked(
        &self,
        inner: &mut Inner,
        rt: &ResourceType,
        namespace: Option<&str>,
        name: &str,
        propagation: Propagation,
    ) -> Arc<Value> {
        let Some(removed) = inner.take(rt, namespace, name) else {
            return Arc::new(Value::Null);
        };
        for subresource in [Subresource::Main, Subresource::Status] {
            let applied_key = (
                rt.name,
                namespace.unwrap_or_default().to_owned(),
                name.to_owned(),
                subresource,
            );
            inner.applied.remove(&applied_key);
        }
        let revision = Self::next_revision(inner);
        let mut gone = (*removed.object).clone();
        meta_mut(&mut gone).insert("resourceVersion".into(), json!(revision.to_string()));
        let gone = Arc::new(gone);
        self.record(inner, rt, ChangeKind::Deleted, gone.clone(), None);
        if propagation != Propagation::Orphan
            && let Some(uid) = meta(&removed.object)["uid"].as_str()
        {
            self.collect_dependents(inner, uid, namespace);
        }
        gone
    }

    /// Garbage collection: deletes (through the normal path) what `owner_uid` owns.
    fn collect_dependents(&self, inner: &mut Inner, owner_uid: &str, namespace: Option<&str>) {
        let mut dependents = Vec::new();
        for (plural, objects) in &inner.objects {
            for (ns, names) in objects {
                if namespace.is_some_and(|owner_ns| owner_ns != ns) {
                    continue;
                }
                for (name, stored) in names {
                    let owned = meta(&stored.object)["ownerReferences"]
                        .as_array()
                        .is_some_and(|owners| owners.iter().any(|o| o["uid"] == owner_uid));
                    if owned {
                        dependents.push((*plural, ns.clone(), name.clone()));
                    }
                }
            }
        }
        for (plural, ns, name) in dependents {
            let Some(rt) = resources::by_name(plural) else {
                continue;
            };
            let ns = (!ns.is_empty()).then_some(ns);
            let Ok(current) = Self::current(inner, rt, ns.as_deref(), &name) else {
                continue;
            };
            let has_finalizers = meta(&current)["finalizers"]
                .as_array()
                .is_some_and(|f| !f.is_empty());
            if has_finalizers {
                if !meta(&current)["deletionTimestamp"].is_string() {
                    let mut next = (*current).clone();
                    meta_mut(&mut next).insert("deletionTimestamp".into(), json!(now()));
                    let _ = self.commit(inner, rt, ns.as_deref(), &name, &current, next);
                }
            } else {
                self.remove_locked(inner, rt, ns.as_deref(), &name, Propagation::Background);
            }
        }
    }

    /// Changes an object in place (the simulated controllers and kubelet use this;
    /// they write status directly, as the real ones do through the status subresource).
    pub fn update<F>(
        &self,
        rt: &ResourceType,
        namespace: Option<&str>,
        name: &str,
        change: F,
    ) -> Result<Arc<Value>, ApiError>
    where
        F: FnOnce(&mut Value),
    {
        let mut inner = self.lock();
        let current = Self::current(&inner, rt, namespace, name)?;
        let mut next = (*current).clone();
        change(&mut next);
        self.commit(&mut inner, rt, namespace, name, &current, next)
    }

    fn current(
        inner: &Inner,
        rt: &ResourceType,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<Arc<Value>, ApiError> {
        inner
            .object(rt, namespace, name)
            .map(|stored| stored.object.clone())
            .ok_or_else(|| ApiError::not_found(rt, name))
    }

    /// The apiserver's checks of a client's write that the simulator makes: which
    /// changes a pod's spec may take. The simulated controllers write through
    /// [`Self::update`], which binds pods as the real scheduler does through its
    /// binding subresource.
    fn validate(
        rt: &ResourceType,
        name: &str,
        current: &Value,
        next: &Value,
        subresource: Subresource,
    ) -> Result<(), ApiError> {
        // Most writes leave the spec alone: no need to read the pods then.
        if subresource != Subresource::Main
            || rt.name != resources::pods().name
            || current.get("spec") == next.get("spec")
        {
            return Ok(());
        }
        let (current, next) = (typed::read(rt, current)?, typed::read(rt, next)?);
        pod_update::check(&current, &next)
            .map_err(|forbidden| ApiError::invalid(rt, name, &forbidden.to_string()))
    }

    fn check_revision(
        rt: &ResourceType,
        name: &str,
        current: &Value,
        body: &Value,
    ) -> Result<(), ApiError> {
        match meta(body)["resourceVersion"].as_str() {
            Some(wanted) if Some(wanted) != meta(current)["resourceVersion"].as_str() => {
                Err(ApiError::conflict(rt, name))
            }
            _ => Ok(()),
        }
    }

    /// What a patch applies to: the whole object, or for the status subresource
    /// only its status, the one part of the patched object [`Self::combine`]
    /// keeps (copying the rest twice was most of a status write's cost).
    fn patch_base(current: &Value, subresource: Subresource) -> Value {
        match subresource {
            Subresource::Main => current.clone(),
            Subresource::Status => {
                let mut base = Map::new();
                if let Some(status) = current.get("status") {
                    base.insert("status".into(), status.clone());
                }
                Value::Object(base)
            }
        }
    }

    /// The next object from a full proposed object: identity fields stay, and the
    /// status subresource rule decides whether `status` or everything else changes.
    fn combine(
        rt: &ResourceType,
        current: &Value,
        mut proposed: Value,
        subresource: Subresource,
    ) -> Value {
        let mut next = match subresource {
            Subresource::Status => {
                let status = proposed
                    .as_object_mut()
                    .and_then(|o| o.remove("status"))
                    .filter(|s| !s.is_null());
                let mut next: Map<String, Value> = current
                    .as_object()
                    .into_iter()
                    .flatten()
                    .filter(|(field, _)| *field != "status")
                    .map(|(field, value)| (field.clone(), value.clone()))
                    .collect();
                if let Some(status) = status {
                    next.insert("status".into(), status);
                }
                Value::Object(next)
            }
            Subresource::Main => {
                let mut next = proposed;
                if rt.status_subresource {
                    match current.get("status") {
                        // Compared first: most writes leave it as it is, and a
                        // comparison allocates nothing.
                        Some(status) if next.get("status") != Some(status) => {
                            next["status"] = status.clone();
                        }
                        Some(_) => {}
                        None => {
                            next.as_object_mut().map(|o| o.remove("status"));
                        }
                    }
                }
                next
            }
        };
        next["apiVersion"] = json!(rt.api_version());
        next["kind"] = json!(rt.kind);
        let keep = [
            "name",
            "namespace",
            "uid",
            "creationTimestamp",
            "generation",
            "deletionTimestamp",
        ];
        let current_meta = meta(current);
        let metadata = meta_mut(&mut next);
        for field in keep {
            match current_meta.get(field) {
                Some(value) => metadata.insert(field.into(), value.clone()),
                None => metadata.remove(field),
            };
        }
        next
    }

    /// Stores `next` unless nothing changed; bumps generation on spec changes and
    /// completes a deletion once the last finalizer is gone.
    fn commit(
        &self,
        inner: &mut Inner,
        rt: &ResourceType,
        namespace: Option<&str>,
        name: &str,
        current: &Arc<Value>,
        mut next: Value,
    ) -> Result<Arc<Value>, ApiError> {
        let changed = changed(&next, current);
        if !changed.anything {
            return Ok(current.clone());
        }
        if changed.spec {
            let generation = meta(current)["generation"].as_i64().unwrap_or(1) + 1;
            meta_mut(&mut next).insert("generation".into(), json!(generation));
        }
        let deleting = meta(&next)["deletionTimestamp"].is_string();
        let finalized = meta(&next)["finalizers"]
            .as_array()
            .is_none_or(|f| f.is_empty());
        if deleting && finalized {
            return Ok(self.remove_locked(inner, rt, namespace, name, Propagation::Background));
        }
        let revision = Self::next_revision(inner);
        meta_mut(&mut next).insert("resourceVersion".into(), json!(revision.to_string()));
        let stored = Arc::new(next);
        let previous = inner
            .object(rt, namespace, name)
            .map(|stored| (current.clone(), stored.json.clone()));
        let json = self.record(inner, rt, ChangeKind::Modified, stored.clone(), previous);
        let object = Stored {
            object: stored.clone(),
            json,
        };
        inner.put(rt, namespace, name, object);
        Ok(stored)
    }
}

/// Five lowercase alphanumerics, as the apiserver appends for `generateName`.
pub fn random_suffix() -> String {
    use rand::Rng;
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut rng = rand::rng();
    (0..5)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_differing_only_in_revision_or_managed_fields_change_nothing() {
        let stored = json!({
            "metadata": {"name": "a", "resourceVersion": "7", "managedFields": [{"manager": "x"}], "labels": {"l": "1"}},
            "spec": {"replicas": 1},
            "status": {"ready": 0},
        });
        let mut next = stored.clone();
        next["metadata"]["resourceVersion"] = json!("9");
        next["metadata"]["managedFields"] = json!([]);
        assert_eq!(
            changed(&next, &stored),
            Changed {
                anything: false,
                spec: false
            }
        );

        let mut relabelled = stored.clone();
        relabelled["metadata"]["labels"]["l"] = json!("2");
        assert!(changed(&relabelled, &stored).anything);
        assert!(!changed(&relabelled, &stored).spec, "metadata is not spec");

        let mut status = stored.clone();
        status["status"]["ready"] = json!(1);
        assert!(changed(&status, &stored).anything);
        assert!(!changed(&status, &stored).spec, "status is not spec");

        let mut scaled = stored.clone();
        scaled["spec"]["replicas"] = json!(2);
        assert!(changed(&scaled, &stored).spec);

        let mut extra = stored.clone();
        extra["data"] = json!({"k": "v"});
        assert!(
            changed(&extra, &stored).anything,
            "a new top-level field is a change"
        );
        assert!(changed(&extra, &stored).spec);

        let mut unnamed = stored.clone();
        unnamed["metadata"]
            .as_object_mut()
            .map(|m| m.remove("name"));
        assert!(
            changed(&unnamed, &stored).anything,
            "a removed field is a change"
        );
    }

    #[test]
    fn merge_patch_follows_rfc_7386() {
        // The examples of RFC 7386, appendix A.
        let cases = [
            (json!({"a": "b"}), json!({"a": "c"}), json!({"a": "c"})),
            (
                json!({"a": "b"}),
                json!({"b": "c"}),
                json!({"a": "b", "b": "c"}),
            ),
            (json!({"a": "b"}), json!({"a": null}), json!({})),
            (
                json!({"a": "b", "b": "c"}),
                json!({"a": null}),
                json!({"b": "c"}),
            ),
            (json!({"a": ["b"]}), json!({"a": "c"}), json!({"a": "c"})),
            (json!({"a": "c"}), json!({"a": ["b"]}), json!({"a": ["b"]})),
            (
                json!({"a": {"b": "c"}}),
                json!({"a": {"b": "d", "c": null}}),
                json!({"a": {"b": "d"}}),
            ),
            (
                json!({"a": [{"b": "c"}]}),
                json!({"a": [1]}),
                json!({"a": [1]}),
            ),
            (json!(["a", "b"]), json!(["c", "d"]), json!(["c", "d"])),
            (json!({"a": "b"}), json!(["c"]), json!(["c"])),
            (json!({"a": "foo"}), json!(null), json!(null)),
            (json!({"a": "foo"}), json!("bar"), json!("bar")),
            (
                json!({"e": null}),
                json!({"a": 1}),
                json!({"e": null, "a": 1}),
            ),
            (
                json!([1, 2]),
                json!({"a": "b", "c": null}),
                json!({"a": "b"}),
            ),
            (
                json!({}),
                json!({"a": {"bb": {"ccc": null}}}),
                json!({"a": {"bb": {}}}),
            ),
        ];
        for (target, patch, expected) in cases {
            let mut merged = target.clone();
            merge_patch(&mut merged, &patch);
            assert_eq!(merged, expected, "{target} + {patch}");
        }
    }

    #[test]
    fn a_patch_is_seen_to_change_nothing_exactly_when_merging_it_changes_nothing() {
        let target = json!({
            "a": "b", "n": null, "o": {"x": 1, "e": {}}, "l": [1, 2],
            "g": [{"name": "p", "v": 1}, {"name": "q"}], "e": [],
        });
        let patches = [
            json!({}),
            json!({"a": "b"}),
            json!({"a": "c"}),
            json!({"a": null}),
            json!({"z": null}),
            json!({"n": null}),
            json!({"o": {"x": 1}}),
            json!({"o": {"x": 2}}),
            json!({"o": {"e": {}}}),
            json!({"o": {"f": {}}}),
            json!({"o": {"x": null}}),
            json!({"o": "text"}),
            json!({"a": {"deep": 1}}),
            json!({"l": [1, 2]}),
            json!({"l": [2, 1]}),
            json!({"a": "b", "o": {"x": 1, "e": {"k": null}}}),
            json!({"g": [{"name": "p", "v": 1}, {"name": "q"}]}),
            json!({"g": [{"name": "q"}]}),
            json!({"g": [{"name": "q", "v": 2}]}),
            json!({"g": [{"name": "p", "v": null}]}),
            json!({"g": [{"name": "p", "w": null}]}),
            json!({"g": [{"name": "r"}]}),
            json!({"g": [{"name": "r", "$patch": "delete"}]}),
            json!({"g": [{"name": "q", "$patch": "delete"}]}),
            json!({"g": [{"name": "q", "$patch": "merge"}]}),
            json!({"g": [{"name": "q"}, {"v": 1}]}),
            json!({"g": []}),
            json!({"e": []}),
            json!({"e": [{"name": "r", "$patch": "delete"}]}),
            json!({"z": [{"name": "r", "$patch": "delete"}]}),
            json!({"z": [{"name": "r", "$patch": "delete"}, {"name": "s"}]}),
            json!({"a": [{"name": "r", "$patch": "delete"}]}),
            json!({"l": [{"name": "r", "$patch": "delete"}]}),
            json!({"$patch": "replace"}),
            json!({"o": {"$patch": "replace", "x": 1}}),
        ];
        let all_rules = [
            MergeRules::JsonMerge,
            MergeRules::Apply,
            MergeRules::Strategic,
        ];
        for patch in patches {
            for rules in all_rules {
                let mut merged = target.clone();
                merge(&mut merged, &patch, rules);
                assert_eq!(
                    merge_changes_nothing(&target, &patch, rules),
                    merged == target,
                    "{patch} ({rules:?})"
                );
            }
        }
    }

    fn strategic(target: Value, patch: Value) -> Value {
        let mut merged = target;
        merge(&mut merged, &patch, MergeRules::Strategic);
        merged
    }

    #[test]
    fn a_strategic_patch_merges_named_lists_by_name() {
        let pod = json!({"spec": {
            "schedulingGates": [{"name": "a"}, {"name": "b"}, {"name": "c"}],
            "containers": [{"name": "w", "image": "x", "args": ["1"]}, {"name": "s", "image": "y"}],
            "tolerations": [{"key": "k"}],
        }});
        let patch = json!({"spec": {
            "schedulingGates": [{"name": "b", "$patch": "delete"}, {"name": "absent", "$patch": "delete"}, {"name": "d"}],
            "containers": [{"name": "s", "image": "z", "args": ["2"], "$patch": "merge"}, {"name": "w", "args": null}],
            "tolerations": [{"key": "other"}],
        }});
        assert_eq!(
            strategic(pod, patch),
            json!({"spec": {
                "schedulingGates": [{"name": "a"}, {"name": "c"}, {"name": "d"}],
                "containers": [{"name": "w", "image": "x"}, {"name": "s", "image": "z", "args": ["2"]}],
                "tolerations": [{"key": "other"}],
            }}),
            "named lists merge in place and append; other lists are replaced"
        );
    }

    #[test]
    fn a_strategic_patch_never_stores_its_directives() {
        let patch = json!({"spec": {
            "$patch": "merge",
            "volumes": [{"name": "v", "$patch": "delete"}, {"name": "u", "configMap": {"$patch": "merge", "name": "c"}}],
            "list": [{"$patch": "delete", "k": 1}, 2],
        }});
        let merged = strategic(json!({}), patch);
        assert_eq!(
            merged,
            json!({"spec": {"volumes": [{"name": "u", "configMap": {"name": "c"}}], "list": [{"k": 1}, 2]}})
        );
        let emptied = strategic(
            json!({"spec": {"schedulingGates": [{"name": "g"}]}}),
            json!({"spec": {"schedulingGates": [{"name": "g", "$patch": "delete"}]}}),
        );
        assert_eq!(emptied, json!({"spec": {"schedulingGates": []}}));
        let ungated = json!({"spec": {"nodeName": "n"}});
        assert_eq!(
            strategic(
                ungated.clone(),
                json!({"spec": {"schedulingGates": [{"name": "g", "$patch": "delete"}]}})
            ),
            ungated,
            "deleting from a list that is not there adds no list"
        );
    }

    #[test]
    fn a_strategic_patch_reads_null_and_plain_lists_as_a_merge_patch_does() {
        let target = json!({"a": "b", "o": {"x": 1}, "l": [{"name": "p"}], "s": [1, 2]});
        for patch in [
            json!({"a": null, "o": {"x": null, "y": 2}}),
            json!({"s": [3], "l": []}),
            json!({"l": [1, {"name": "q"}]}),
            json!({"l": [{"k": "no name"}]}),
        ] {
            let mut merged = target.clone();
            merge_patch(&mut merged, &patch);
            assert_eq!(strategic(target.clone(), patch.clone()), merged, "{patch}");
        }
    }

    #[test]
    fn a_manager_loses_only_the_fields_it_stopped_applying() {
        let before = json!({"spec": {"image": "a", "args": ["x"], "env": {"A": "1", "B": "2"}}, "metadata": {"labels": {"l": "1"}}});
        let after = json!({"spec": {"args": ["y"], "env": {"A": "1"}}});
        let mut live = json!({
            "metadata": {"name": "n", "labels": {"l": "1", "other": "2"}},
            "spec": {"image": "a", "args": ["x"], "env": {"A": "1", "B": "2", "C": "3"}, "replicas": 2},
            "status": {"phase": "Running"},
        });
        remove_dropped_fields(&mut live, &before, &after, &[]);
        assert_eq!(
            live,
            json!({
                "metadata": {"name": "n", "labels": {"other": "2"}},
                "spec": {"args": ["x"], "env": {"A": "1", "C": "3"}, "replicas": 2},
                "status": {"phase": "Running"},
            }),
            "dropped image, env.B and its label; kept what it still applies and what others set"
        );
    }

    #[test]
    fn a_field_another_manager_still_applies_stays() {
        let before =
            json!({"metadata": {"labels": {"shared": "1", "mine": "1"}}, "spec": {"image": "a"}});
        let after = json!({});
        let other = json!({"metadata": {"labels": {"shared": "1"}}});
        let mut live =
            json!({"metadata": {"labels": {"shared": "1", "mine": "1"}}, "spec": {"image": "a"}});
        remove_dropped_fields(&mut live, &before, &after, &[&other]);
        assert_eq!(live, json!({"metadata": {"labels": {"shared": "1"}}}));
        // A map the manager alone applied goes when it is left empty, not before.
        let mut live = json!({"spec": {"env": {"A": "1"}}, "status": {"x": {"A": "1", "B": "2"}}});
        let before = json!({"spec": {"env": {"A": "1"}}, "status": {"x": {"A": "1"}}});
        remove_dropped_fields(&mut live, &before, &json!({}), &[]);
        assert_eq!(live, json!({"status": {"x": {"B": "2"}}}));
    }

    fn config_map(name: &str, data: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data})
    }

    /// Creates the test ConfigMap `ns/c` with `data`.
    fn create_config_map(store: &Store, data: Value) -> Arc<Value> {
        store
            .create(resources::config_maps(), Some("ns"), config_map("c", data))
            .expect("created")
    }

    /// Merge-patches `data.k` of the ConfigMap `ns/c`.
    fn patch_data(store: &Store, value: &str) -> Arc<Value> {
        store
            .patch(
                resources::config_maps(),
                Some("ns"),
                "c",
                PatchKind::Merge,
                json!({"data": {"k": value}}),
                None,
                Subresource::Main,
            )
            .expect("patched")
    }

    #[test]
    fn writes_that_change_nothing_keep_the_resource_version() {
        let store = Store::default();
        let created = create_config_map(&store, json!({"k": "v"}));
        let revision = store.revision();
        let same = patch_data(&store, "v");
        assert_eq!(same, created);
        assert_eq!(store.revision(), revision);
    }

    #[test]
    fn non_object_bodies_are_rejected_not_applied() {
        let store = Store::default();
        let rt = resources::config_maps();
        create_config_map(&store, json!({}));
        for body in [
            json!(null),
            json!("text"),
            json!([{"op": "remove", "path": "/data"}]),
        ] {
            let err = store
                .patch(
                    rt,
                    Some("ns"),
                    "c",
                    PatchKind::Merge,
                    body.clone(),
                    None,
                    Subresource::Main,
                )
                .expect_err("not an object");
            assert_eq!(err.code, 400, "{body}");
            let err = store
                .replace(rt, Some("ns"), "c", body.clone(), Subresource::Main)
                .expect_err("not an object");
            assert_eq!(err.code, 400, "{body}");
        }
        assert_eq!(
            store.get(rt, Some("ns"), "c").expect("still there")["kind"],
            "ConfigMap"
        );
    }

    #[test]
    fn a_resumed_watch_gets_each_change_as_it_was_made() {
        let store = Store::default();
        let rt = resources::config_maps();
        let start = store.revision();
        let created = create_config_map(&store, json!({"k": "1"}));
        let patched = patch_data(&store, "2");
        let gone = store
            .delete(rt, Some("ns"), "c", Propagation::Background)
            .expect("deleted");
        let backlog = store.watch(rt, start).expect("in the history").backlog;
        let seen: Vec<_> = backlog
            .iter()
            .map(|c| (c.kind, c.object.clone(), c.previous.clone()))
            .collect();
        assert_eq!(
            seen,
            [
                (ChangeKind::Added, created.clone(), None),
                (ChangeKind::Modified, patched, Some(created)),
                (ChangeKind::Deleted, gone, None),
            ]
        );
        for change in &backlog {
            let json = serde_json::to_vec(change.object.as_ref()).expect("serialises");
            assert_eq!(*change.json, *json);
        }
    }

    #[test]
    fn only_the_stored_version_comes_serialised() {
        let store = Store::default();
        let rt = resources::config_maps();
        let created = create_config_map(&store, json!({"k": "1"}));
        let json = store.serialised(rt, &created).expect("stored");
        assert_eq!(
            *json,
            *serde_json::to_vec(created.as_ref()).expect("serialises")
        );
        patch_data(&store, "2");
        assert!(store.serialised(rt, &created).is_none(), "no longer stored");
        assert!(
            store
                .serialised(rt, &Arc::new((*created).clone()))
                .is_none()
        );
    }

    #[test]
    fn watches_from_before_the_kept_history_expire() {
        let store = Store::with_history(3);
        let rt = resources::config_maps();
        let start = store.revision();
        assert_ne!(
            start, 0,
            "0 means \"from now\" to a watch; a list never reports it"
        );
        for i in 0..5 {
            store
                .create(rt, Some("ns"), config_map(&format!("c{i}"), json!({})))
                .expect("created");
        }
        // Five changes; the history holds the last three, so a watch may resume
        // after the second.
        assert!(store.watch(rt, start + 1).is_none(), "change 2 is gone");
        let from_two = store.watch(rt, start + 2).expect("nothing missing after 2");
        let revisions: Vec<u64> = from_two
            .backlog
            .iter()
            .map(|c| c.resource_version - start)
            .collect();
        assert_eq!(revisions, [3, 4, 5]);
        assert!(
            store
                .watch(rt, start + 5)
                .expect("current")
                .backlog
                .is_empty()
        );
    }
}
