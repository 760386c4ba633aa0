//! The HTTP face of the simulated cluster: the subset of the Kubernetes REST API
//! that kube-rs clients (the watcher, the planner, the `trainyard` CLI) use — get,
//! list, watch with resume and bookmarks, create, replace, merge and apply patches,
//! delete with propagation, and the status subresource — and what `kubectl` needs on
//! top: discovery, server-side `Table` printing (lists, gets and watches), and core
//! `v1` Events that include the `events.k8s.io` Events the planner records, so
//! `kubectl describe` shows them. Plain HTTP on loopback, no authentication: it is a
//! simulator.

use std::collections::{HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use chrono::Utc;
use futures::StreamExt;
use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::broadcast::{self, error::RecvError};
use tokio_util::sync::CancellationToken;

use crate::error::ApiError;
use crate::faults::{ApiFaultConfig, ApiFaults, Fault};
use crate::resources::{self, ResourceType};
use crate::selector::Selector;
use crate::store::{Change, ChangeKind, PatchKind, Propagation, Store, Subresource};
use crate::table::{self, IncludeObject};
use crate::{discovery, events, log_endpoint, openapi};

/// Longest a watch stays open before the client re-watches, as on a real apiserver.
const MAX_WATCH_SECONDS: u64 = 290;

#[derive(Clone)]
struct ApiState {
    store: Arc<Store>,
    shutdown: CancellationToken,
    faults: Arc<ApiFaults>,
}

/// The router serving the API from `store`; open watches end on `shutdown`.
pub fn router(store: Arc<Store>, shutdown: CancellationToken) -> Router {
    router_with_faults(store, shutdown, ApiFaultConfig::default())
}

/// [`router`] whose write requests fail or stall as `faults` says.
pub fn router_with_faults(
    store: Arc<Store>,
    shutdown: CancellationToken,
    faults: ApiFaultConfig,
) -> Router {
    Router::new().fallback(handle).with_state(ApiState {
        store,
        shutdown,
        faults: Arc::new(ApiFaults::new(faults)),
    })
}

/// The reply to a faulted request, as a real API server words it.
async fn fault_reply(fault: Fault, method: &Method, path: &str) -> Response {
    let (status, retry_after) = match fault {
        Fault::Fail(status) => (status, status == 429),
        Fault::Stall(duration) => {
            tokio::time::sleep(duration).await;
            (504, false)
        }
    };
    let err = ApiError::fault(status, &format!("{method} {path}"));
    let mut response = error_reply(&err);
    if retry_after {
        response
            .headers_mut()
            .insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
    }
    response
}

/// A request path, taken apart.
#[derive(Debug, PartialEq, Eq)]
struct Target {
    rt: &'static ResourceType,
    namespace: Option<String>,
    name: Option<String>,
    subresource: Subresource,
}

fn parse_path(path: &str) -> Result<Target, ApiError> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (group, version, rest) = match parts.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return Err(not_served(path)),
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, plural, rest @ ..] if *plural != "status" && *plural != "finalize" => {
            (Some((*ns).to_owned()), [&[*plural][..], rest].concat())
        }
        other => (None, other.to_vec()),
    };
    let (plural, name, sub) = match rest.as_slice() {
        [plural] => (*plural, None, None),
        [plural, name] => (*plural, Some(*name), None),
        [plural, name, sub] => (*plural, Some(*name), Some(*sub)),
        _ => return Err(not_served(path)),
    };
    let rt = resources::lookup(group, version, plural).ok_or_else(|| not_served(path))?;
    let subresource = match sub {
        None => Subresource::Main,
        Some("status") => Subresource::Status,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "subresource {other:?} is not simulated; only /status and a pod's /log are"
            )));
        }
    };
    if rt.namespaced != namespace.is_some() && name.is_some() {
        return Err(ApiError::bad_request(format!(
            "{} is {}namespaced; use the {} path",
            rt.name,
            if rt.namespaced { "" } else { "not " },
            if rt.namespaced {
                "/namespaces/<ns>/..."
            } else {
                "cluster-scoped"
            }
        )));
    }
    Ok(Target {
        rt,
        namespace,
        name: name.map(str::to_owned),
        subresource,
    })
}

fn not_served(path: &str) -> ApiError {
    let mut err = ApiError::bad_request(format!(
        "the simulated cluster does not serve {path}; it serves {}",
        resources::all()
            .iter()
            .map(|rt| rt.name)
            .collect::<Vec<_>>()
            .join(", ")
    ));
    err.code = 404;
    err.reason = "NotFound";
    err
}

fn reply(status: StatusCode, body: &impl Serialize) -> Response {
    json_reply(
        status,
        Bytes::from(serde_json::to_vec(body).unwrap_or_default()),
    )
}

/// A reply of JSON already serialised.
fn json_reply(status: StatusCode, json: Bytes) -> Response {
    (status, [(header::CONTENT_TYPE, "application/json")], json).into_response()
}

/// A list response, serialised from the stored objects without copying them.
/// Fields in `json!`'s (sorted) order.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct List<'a> {
    api_version: String,
    items: Vec<&'a Value>,
    kind: String,
    metadata: ListMeta,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ListMeta {
    resource_version: String,
}

fn error_reply(err: &ApiError) -> Response {
    let status = StatusCode::from_u16(err.code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    reply(status, &err.status())
}

/// The object a request read or wrote, in the bytes the store serialised it to
/// when it has them (the same bytes [`reply`] would make).
fn object_reply(
    store: &Store,
    rt: &ResourceType,
    result: Result<Arc<Value>, ApiError>,
    success: StatusCode,
) -> Response {
    match result {
        Ok(object) => match store.serialised(rt, &object) {
            Some(json) => json_reply(success, Bytes::from_owner(json)),
            None => reply(success, object.as_ref()),
        },
        Err(err) => error_reply(&err),
    }
}

fn flag(query: &HashMap<String, String>, name: &str) -> bool {
    query
        .get(name)
        .is_some_and(|v| v.is_empty() || v == "true" || v == "1")
}

/// The request body as JSON; YAML too when the content type says so (apply patches).
fn parse_body(body: &Bytes, headers: &HeaderMap) -> Result<Value, ApiError> {
    if body.is_empty() {
        return Ok(Value::Null);
    }
    let media = content_type(headers);
    if media.contains("protobuf") || media.contains("cbor") {
        // 415 is what makes clients that tried a binary encoding retry in JSON.
        return Err(ApiError::unsupported_media_type(format!(
            "{media} is not simulated; send JSON or YAML"
        )));
    }
    let yaml = media.contains("yaml");
    match serde_json::from_slice(body) {
        Ok(value) => Ok(value),
        Err(json) if !yaml => Err(ApiError::bad_request(format!(
            "the request body is not valid JSON: {json}"
        ))),
        Err(json) => yaml_serde::from_slice(body).map_err(|yaml| {
            ApiError::bad_request(format!(
                "the request body is neither valid JSON ({json}) nor valid YAML ({yaml})"
            ))
        }),
    }
}

fn content_type(headers: &HeaderMap) -> &str {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
}

async fn handle(
    State(state): State<ApiState>,
    method: Method,
    uri: Uri,
    Query(query): Query<HashMap<String, String>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    if uri.path() == "/version" {
        return reply(
            StatusCode::OK,
            &json!({"major": "1", "minor": "36", "gitVersion": "v1.36.0-trainyard-simulator", "platform": "simulated"}),
        );
    }
    if method == Method::GET
        && let Some(document) =
            discovery::document(uri.path()).or_else(|| openapi::document(uri.path()))
    {
        return reply(StatusCode::OK, &document);
    }
    if let Some((namespace, name)) = log_endpoint::target(uri.path()) {
        if method != Method::GET {
            return error_reply(&ApiError::method_not_allowed(format!(
                "{method} is not allowed on a pod's log; use GET"
            )));
        }
        return log_endpoint::serve(&state.store, &state.shutdown, &namespace, &name, &query)
            .unwrap_or_else(|err| error_reply(&err));
    }
    let target = match parse_path(uri.path()) {
        Ok(target) => target,
        Err(err) => return error_reply(&err),
    };
    if let Some(fault) = state.faults.draw(&method, flag(&query, "watch")) {
        tracing::info!(%method, path = uri.path(), ?fault, "simulated API fault");
        return fault_reply(fault, &method, uri.path()).await;
    }
    match serve(&state, &method, target, &query, &headers, &body) {
        Ok(response) => response,
        Err(err) => error_reply(&err),
    }
}

fn serve(
    state: &ApiState,
    method: &Method,
    target: Target,
    query: &HashMap<String, String>,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let store = &state.store;
    let Target {
        rt,
        namespace,
        name,
        subresource,
    } = target;
    let ns = namespace.as_deref();
    if method != Method::GET && query.contains_key("dryRun") {
        return Err(ApiError::bad_request(
            "dryRun is not simulated; the simulated cluster would perform the write",
        ));
    }
    let as_table = table::wanted(headers)
        .then(|| IncludeObject::parse(query.get("includeObject").map(String::as_str)));
    match (method, name) {
        (&Method::GET, Some(name)) => match as_table {
            Some(include) => {
                let object = store.get(rt, ns, &name)?;
                let table = table::table(rt, [object.as_ref()], None, include, Utc::now());
                Ok(reply(StatusCode::OK, &table))
            }
            None => Ok(object_reply(
                store,
                rt,
                store.get(rt, ns, &name),
                StatusCode::OK,
            )),
        },
        (&Method::GET, None) => {
            let labels = Selector::parse(query.get("labelSelector").map_or("", String::as_str))?;
            let fields = Selector::parse(query.get("fieldSelector").map_or("", String::as_str))?;
            if flag(query, "watch") {
                return watch(state, rt, namespace, labels, fields, query, as_table);
            }
            let (mut items, revision) = store.list(rt, ns, &labels, &fields);
            if rt.name == "events" {
                items.extend(events::recorded_as_core(store, ns, &labels, &fields));
            }
            if let Some(include) = as_table {
                let table = table::table(
                    rt,
                    items.iter().map(AsRef::as_ref),
                    Some(revision.to_string()),
                    include,
                    Utc::now(),
                );
                return Ok(reply(StatusCode::OK, &table));
            }
            Ok(reply(
                StatusCode::OK,
                &List {
                    api_version: rt.api_version(),
                    items: items.iter().map(AsRef::as_ref).collect(),
                    kind: format!("{}List", rt.kind),
                    metadata: ListMeta {
                        resource_version: revision.to_string(),
                    },
                },
            ))
        }
        (&Method::POST, None) => Ok(object_reply(
            store,
            rt,
            store.create(rt, ns, parse_body(body, headers)?),
            StatusCode::CREATED,
        )),
        (&Method::PUT, Some(name)) => Ok(object_reply(
            store,
            rt,
            store.replace(rt, ns, &name, parse_body(body, headers)?, subresource),
            StatusCode::OK,
        )),
        (&Method::PATCH, Some(name)) => {
            let kind = match content_type(headers) {
                "application/apply-patch+yaml" => PatchKind::Apply {
                    force: flag(query, "force"),
                },
                "application/merge-patch+json" => PatchKind::Merge,
                "application/strategic-merge-patch+json" => PatchKind::Strategic,
                other => {
                    return Err(ApiError::unsupported_media_type(format!(
                        "patch type {other:?} is not simulated; use server-side apply, a merge patch or a strategic merge patch"
                    )));
                }
            };
            Ok(object_reply(
                store,
                rt,
                store.patch(
                    rt,
                    ns,
                    &name,
                    kind,
                    parse_body(body, headers)?,
                    query.get("fieldManager").map(String::as_str),
                    subresource,
                ),
                StatusCode::OK,
            ))
        }
        (&Method::DELETE, Some(name)) => {
            let options = parse_body(body, headers)?;
            let policy = query
                .get("propagationPolicy")
                .map(String::as_str)
                .or(options["propagationPolicy"].as_str());
            let propagation = match policy {
                None | Some("Background") => Propagation::Background,
                Some("Foreground") => Propagation::Foreground,
                Some("Orphan") => Propagation::Orphan,
                Some(other) => {
                    return Err(ApiError::bad_request(format!(
                        "propagationPolicy {other:?}: use Background, Foreground or Orphan"
                    )));
                }
            };
            Ok(object_reply(
                store,
                rt,
                store.delete(rt, ns, &name, propagation),
                StatusCode::OK,
            ))
        }
        (method, _) => Err(ApiError::method_not_allowed(format!(
            "{method} is not allowed on this path"
        ))),
    }
}

/// What a watch stream is doing.
enum Phase {
    Backlog(VecDeque<Change>, broadcast::Receiver<Change>),
    Live(broadcast::Receiver<Change>),
    Closing,
    Done,
}

/// One line of a watch stream, `{"type":...,"object":...}` around the object as
/// the store serialised it for every watch. `type` comes first, as the API
/// server sends it: a client's adjacently tagged `WatchEvent` that meets the
/// object before its type buffers the whole object and parses it twice.
fn event_line(kind: ChangeKind, object: &[u8]) -> Bytes {
    const TYPE: &[u8] = b"{\"type\":\"";
    const OBJECT: &[u8] = b"\",\"object\":";
    let kind = kind.as_str().as_bytes();
    let mut line = Vec::with_capacity(TYPE.len() + kind.len() + OBJECT.len() + object.len() + 2);
    line.extend_from_slice(TYPE);
    line.extend_from_slice(kind);
    line.extend_from_slice(OBJECT);
    line.extend_from_slice(object);
    line.extend_from_slice(b"}\n");
    Bytes::from(line)
}

struct Watch {
    phase: Phase,
    rt: &'static ResourceType,
    namespace: Option<String>,
    labels: Selector,
    fields: Selector,
    deadline: tokio::time::Instant,
    shutdown: CancellationToken,
    bookmarks: bool,
    /// Send each object as a one-row `Table` (`kubectl get -w`).
    table: Option<IncludeObject>,
    /// The resourceVersion of the last change this watch has passed (sent or not):
    /// a bookmark must not point past changes still queued for it.
    last: u64,
}

impl Watch {
    fn matches(&self, object: &Value) -> bool {
        self.labels.matches_labels(object) && self.fields.matches_fields(object)
    }

    /// The event this watch sends for `change`, if any: as on a real apiserver, a
    /// modification that makes an object match the selectors is ADDED, one that
    /// makes it stop matching is DELETED.
    fn event_for(&self, change: &Change) -> Option<Bytes> {
        let watched = change.resource == self.rt.name
            && self
                .namespace
                .as_deref()
                .is_none_or(|ns| change.namespace() == Some(ns));
        if !watched {
            return None;
        }
        let matched_before = change.previous.as_deref().map(|p| self.matches(p));
        let kind = match (self.matches(&change.object), matched_before) {
            (true, Some(false)) => ChangeKind::Added,
            (true, _) => change.kind,
            (false, Some(true)) => ChangeKind::Deleted,
            (false, _) => return None,
        };
        match self.table {
            Some(include) => {
                let table =
                    table::table(self.rt, [change.object.as_ref()], None, include, Utc::now());
                Some(event_line(
                    kind,
                    &serde_json::to_vec(&table).unwrap_or_default(),
                ))
            }
            None => Some(event_line(kind, &change.json)),
        }
    }

    fn line(value: &impl Serialize) -> Bytes {
        let mut line = serde_json::to_vec(value).unwrap_or_default();
        line.push(b'\n');
        Bytes::from(line)
    }

    fn bookmark(&self) -> Bytes {
        Self::line(&json!({
            "type": "BOOKMARK",
            "object": {
                "apiVersion": self.rt.api_version(),
                "kind": self.rt.kind,
                "metadata": {"resourceVersion": self.last.to_string()},
            },
        }))
    }

    fn expired() -> Bytes {
        Self::line(&json!({
            "type": "ERROR",
            "object": ApiError::gone("the watch fell behind; relist").status(),
        }))
    }

    /// The next line to send, or `None` when the stream ends.
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            match std::mem::replace(&mut self.phase, Phase::Done) {
                Phase::Done => return None,
                Phase::Closing => {
                    return self.bookmarks.then(|| self.bookmark());
                }
                Phase::Backlog(mut backlog, live) => match backlog.pop_front() {
                    Some(change) => {
                        self.phase = Phase::Backlog(backlog, live);
                        self.last = change.resource_version;
                        if let Some(event) = self.event_for(&change) {
                            return Some(event);
                        }
                    }
                    None => self.phase = Phase::Live(live),
                },
                Phase::Live(mut live) => {
                    let received = tokio::select! {
                        _ = self.shutdown.cancelled() => { self.phase = Phase::Done; return None; }
                        _ = tokio::time::sleep_until(self.deadline) => { self.phase = Phase::Closing; continue; }
                        received = live.recv() => received,
                    };
                    match received {
                        Ok(change) => {
                            self.phase = Phase::Live(live);
                            self.last = change.resource_version;
                            if let Some(event) = self.event_for(&change) {
                                return Some(event);
                            }
                        }
                        Err(RecvError::Lagged(_)) => return Some(Self::expired()),
                        Err(RecvError::Closed) => return None,
                    }
                }
            }
        }
    }
}

fn watch(
    state: &ApiState,
    rt: &'static ResourceType,
    namespace: Option<String>,
    labels: Selector,
    fields: Selector,
    query: &HashMap<String, String>,
    table: Option<IncludeObject>,
) -> Result<Response, ApiError> {
    let from = match query.get("resourceVersion").map(String::as_str) {
        None | Some("") | Some("0") => state.store.revision(),
        Some(rv) => rv.parse::<u64>().map_err(|_| {
            ApiError::bad_request(format!(
                "resourceVersion {rv:?} is not one this server issued"
            ))
        })?,
    };
    let seconds = query
        .get("timeoutSeconds")
        .and_then(|s| s.parse::<u64>().ok())
        .unwrap_or(MAX_WATCH_SECONDS)
        .min(MAX_WATCH_SECONDS);
    let phase = match state.store.watch(rt, from) {
        Some(start) => Phase::Backlog(start.backlog.into(), start.live),
        None => Phase::Done,
    };
    let expired = matches!(phase, Phase::Done);
    let watch = Watch {
        phase,
        rt,
        namespace,
        labels,
        fields,
        deadline: tokio::time::Instant::now() + Duration::from_secs(seconds),
        shutdown: state.shutdown.clone(),
        bookmarks: flag(query, "allowWatchBookmarks"),
        table,
        last: from,
    };
    let stream = futures::stream::unfold(watch, |mut watch| async move {
        watch.next().await.map(|line| (line, watch))
    });
    let body = if expired {
        Body::from(Watch::expired())
    } else {
        Body::from_stream(stream.map(Ok::<_, Infallible>))
    };
    Ok((
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_event_names_its_type_before_the_object() {
        let object = json!({"kind": "Pod", "metadata": {"name": "a\"b", "labels": {"x": "ü"}}});
        let json = serde_json::to_vec(&object).expect("serialises");
        let line = event_line(ChangeKind::Modified, &json);
        assert_eq!(
            std::str::from_utf8(&line).expect("UTF-8"),
            format!("{{\"type\":\"MODIFIED\",\"object\":{object}}}\n")
        );
        let parsed: Value = serde_json::from_slice(&line).expect("one JSON line");
        assert_eq!(parsed, json!({"type": "MODIFIED", "object": object}));
    }

    #[test]
    fn paths_name_type_scope_and_subresource() {
        let t = parse_path("/apis/batch/v1/namespaces/ml/jobs/a/status").expect("parses");
        assert_eq!(t.rt.name, "jobs.batch");
        assert_eq!(t.namespace.as_deref(), Some("ml"));
        assert_eq!(t.name.as_deref(), Some("a"));
        assert_eq!(t.subresource, Subresource::Status);
        let t = parse_path("/api/v1/nodes").expect("parses");
        assert_eq!((t.rt.name, t.namespace, t.name), ("nodes", None, None));
        let t = parse_path("/api/v1/namespaces/ml").expect("parses");
        assert_eq!((t.rt.name, t.name.as_deref()), ("namespaces", Some("ml")));
        let t = parse_path("/apis/trainyard.dev/v1/trainingjobs").expect("parses");
        assert_eq!(t.rt.kind, "TrainingJob");
        assert_eq!(
            parse_path("/apis/apps/v1/deployments")
                .expect_err("not served")
                .code,
            404
        );
        assert_eq!(
            parse_path("/api/v1/namespaces/ml/pods/a/exec")
                .expect_err("no exec")
                .code,
            400
        );
    }
}
