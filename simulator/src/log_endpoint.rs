//! `GET /api/v1/namespaces/{namespace}/pods/{name}/log`: a pod's log as the real API
//! server relays it from the kubelet, plain text with the `container`, `follow`,
//! `tailLines`, `timestamps`, `sinceSeconds`, `sinceTime` and `limitBytes`
//! parameters, and the kubelet's refusals for a container that has not started.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use futures::StreamExt;
use serde_json::Value;
use tokio::sync::broadcast::error::RecvError;
use tokio::sync::{broadcast, watch};
use tokio_util::sync::CancellationToken;

use crate::error::ApiError;
use crate::pod_logs::LogLine;
use crate::resources;
use crate::store::{Change, Store};

/// The namespace and pod name of a log request path.
pub fn target(path: &str) -> Option<(String, String)> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match parts.as_slice() {
        ["api", "v1", "namespaces", namespace, "pods", name, "log"] => {
            Some(((*namespace).to_owned(), (*name).to_owned()))
        }
        _ => None,
    }
}

/// What a log request asks for.
#[derive(Debug, Default, PartialEq)]
struct Options {
    container: Option<String>,
    follow: bool,
    timestamps: bool,
    tail_lines: Option<usize>,
    since: Option<DateTime<Utc>>,
    limit_bytes: Option<usize>,
    previous: bool,
}

fn flag(query: &HashMap<String, String>, name: &str) -> Result<bool, ApiError> {
    match query.get(name).map(String::as_str) {
        None | Some("false") | Some("0") => Ok(false),
        Some("" | "true" | "1") => Ok(true),
        Some(other) => Err(ApiError::bad_request(format!(
            "{name}: Invalid value: {other:?}: must be true or false"
        ))),
    }
}

fn count(query: &HashMap<String, String>, name: &str, least: i64) -> Result<Option<i64>, ApiError> {
    query
        .get(name)
        .map(|value| match value.parse::<i64>() {
            Ok(n) if n >= least => Ok(n),
            Ok(n) => Err(ApiError::bad_request(format!(
                "{name}: Invalid value: {n}: must be greater than or equal to {least}"
            ))),
            Err(_) => Err(ApiError::bad_request(format!(
                "{name}: Invalid value: {value:?}: must be a whole number"
            ))),
        })
        .transpose()
}

impl Options {
    fn parse(query: &HashMap<String, String>, now: DateTime<Utc>) -> Result<Self, ApiError> {
        let since_seconds = count(query, "sinceSeconds", 1)?;
        let since_time = query
            .get("sinceTime")
            .map(|time| {
                DateTime::parse_from_rfc3339(time)
                    .map(|t| t.with_timezone(&Utc))
                    .map_err(|_| {
                        ApiError::bad_request(format!(
                            "sinceTime: Invalid value: {time:?}: must be an RFC 3339 time"
                        ))
                    })
            })
            .transpose()?;
        let since = match (since_seconds, since_time) {
            (Some(_), Some(_)) => {
                return Err(ApiError::bad_request(
                    "sinceSeconds, sinceTime: Forbidden: at most one of sinceSeconds or sinceTime may be specified",
                ));
            }
            (Some(seconds), None) => Some(now - chrono::Duration::seconds(seconds)),
            (None, time) => time,
        };
        Ok(Self {
            container: query.get("container").filter(|c| !c.is_empty()).cloned(),
            follow: flag(query, "follow")?,
            timestamps: flag(query, "timestamps")?,
            tail_lines: count(query, "tailLines", 0)?.map(|n| n as usize),
            since,
            limit_bytes: count(query, "limitBytes", 1)?.map(|n| n as usize),
            previous: flag(query, "previous")?,
        })
    }
}

/// The container whose log is asked for, as the API server picks it: the one
/// named, else the pod's only one.
fn container(pod: &Value, name: &str, asked: Option<&str>) -> Result<String, ApiError> {
    let names: Vec<&str> = ["initContainers", "containers"]
        .iter()
        .flat_map(|list| pod["spec"][list].as_array().into_iter().flatten())
        .filter_map(|c| c["name"].as_str())
        .collect();
    match asked {
        Some(asked) if names.contains(&asked) => Ok(asked.to_owned()),
        Some(asked) => Err(ApiError::bad_request(format!(
            "container {asked} is not valid for pod {name}"
        ))),
        None => match pod["spec"]["containers"].as_array().map(Vec::as_slice) {
            Some([only]) => Ok(only["name"].as_str().unwrap_or_default().to_owned()),
            _ => Err(ApiError::bad_request(format!(
                "a container name must be specified for pod {name}, choose one of: [{}]",
                names.join(" ")
            ))),
        },
    }
}

fn finished(pod: &Value) -> bool {
    matches!(
        pod["status"]["phase"].as_str(),
        Some("Succeeded" | "Failed")
    )
}

/// The kubelet's refusal for a container that has not started (or whose
/// earlier run is asked for), in its words.
fn refusal(pod: &Value, name: &str, container: &str, previous: bool) -> Option<ApiError> {
    if previous {
        return Some(ApiError::bad_request(format!(
            "previous terminated container \"{container}\" in pod \"{name}\" not found"
        )));
    }
    let status = pod["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|s| s["name"] == container);
    let state = status.map(|s| &s["state"]);
    let started = state.is_some_and(|s| s["running"].is_object() || s["terminated"].is_object());
    if started || finished(pod) {
        return None;
    }
    let reason = match state.and_then(|s| s["waiting"]["reason"].as_str()) {
        Some("ErrImagePull") => "image can't be pulled",
        Some("ImagePullBackOff") => "trying and failing to pull image",
        Some(reason) => reason,
        None => "ContainerCreating",
    };
    Some(ApiError::bad_request(format!(
        "container \"{container}\" in pod \"{name}\" is waiting to start: {reason}"
    )))
}

/// The lines a request gets first: after `since`, then the last `tail_lines`.
fn first_lines(lines: Vec<LogLine>, options: &Options) -> Vec<LogLine> {
    let mut lines: Vec<LogLine> = lines
        .into_iter()
        .filter(|line| options.since.is_none_or(|since| line.time >= since))
        .collect();
    if let Some(tail) = options.tail_lines {
        let skip = lines.len().saturating_sub(tail);
        lines.drain(..skip);
    }
    lines
}

fn render(lines: &[LogLine], timestamps: bool) -> String {
    lines.iter().map(|line| line.render(timestamps)).collect()
}

/// At most `limit` bytes of `text`, cut at a character boundary.
fn limited(mut text: String, limit: Option<usize>) -> String {
    if let Some(limit) = limit
        && text.len() > limit
    {
        let mut end = limit;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

fn text_reply(body: Body) -> Response {
    (StatusCode::OK, [(header::CONTENT_TYPE, "text/plain")], body).into_response()
}

/// Serves one log request.
pub fn serve(
    store: &Arc<Store>,
    shutdown: &CancellationToken,
    namespace: &str,
    name: &str,
    query: &HashMap<String, String>,
) -> Result<Response, ApiError> {
    let options = Options::parse(query, Utc::now())?;
    let pod = store.get(resources::pods(), Some(namespace), name)?;
    let container = container(&pod, name, options.container.as_deref())?;
    if let Some(err) = refusal(&pod, name, &container, options.previous) {
        return Err(err);
    }
    // Subscribed before the first read, so nothing written in between is missed.
    let written = store.logs().changes();
    let changes = store.subscribe();
    let lines = first_lines(store.logs().lines_after(namespace, name, 0), &options);
    let first = limited(render(&lines, options.timestamps), options.limit_bytes);
    if !options.follow {
        return Ok(text_reply(Body::from(first)));
    }
    let follow = Follow {
        store: store.clone(),
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        last: lines.last().map_or_else(
            || latest_sequence(store, namespace, name),
            |line| line.sequence,
        ),
        timestamps: options.timestamps,
        written,
        changes,
        shutdown: shutdown.clone(),
        ended: options.limit_bytes == Some(first.len()),
        budget: options.limit_bytes.map(|limit| limit - first.len()),
    };
    let rest = futures::stream::unfold(follow, |mut follow| async move {
        follow.next().await.map(|chunk| (chunk, follow))
    });
    let stream = futures::stream::once(std::future::ready(Bytes::from(first))).chain(rest);
    Ok(text_reply(Body::from_stream(
        stream.map(Ok::<_, Infallible>),
    )))
}

/// The sequence number of the pod's last line, so a follower whose first lines
/// were all filtered out starts after them rather than sending them again.
fn latest_sequence(store: &Store, namespace: &str, name: &str) -> u64 {
    store
        .logs()
        .lines_after(namespace, name, 0)
        .last()
        .map_or(0, |line| line.sequence)
}

/// A followed log: new lines as they are written, until the pod finishes or
/// is deleted (or the server shuts down; a client that goes away drops it).
struct Follow {
    store: Arc<Store>,
    namespace: String,
    name: String,
    last: u64,
    timestamps: bool,
    written: watch::Receiver<u64>,
    changes: broadcast::Receiver<Change>,
    shutdown: CancellationToken,
    ended: bool,
    /// Bytes still allowed by `limitBytes`.
    budget: Option<usize>,
}

impl Follow {
    fn take(&mut self, lines: &[LogLine]) -> Option<Bytes> {
        self.last = lines.last()?.sequence;
        let text = render(lines, self.timestamps);
        let text = limited(text, self.budget);
        if let Some(budget) = &mut self.budget {
            *budget -= text.len();
            if *budget == 0 {
                self.ended = true;
            }
        }
        Some(Bytes::from(text))
    }

    /// The next chunk to send, or None when the log ends.
    async fn next(&mut self) -> Option<Bytes> {
        loop {
            if self.ended {
                return None;
            }
            self.written.borrow_and_update();
            let lines = self
                .store
                .logs()
                .lines_after(&self.namespace, &self.name, self.last);
            if let Some(chunk) = self.take(&lines) {
                return Some(chunk);
            }
            // A worker's last line is written before its pod finishes, so once the
            // pod has finished (or is gone) nothing more is coming.
            match self
                .store
                .get(resources::pods(), Some(&self.namespace), &self.name)
            {
                Ok(pod) if !finished(&pod) => {}
                _ => return None,
            }
            tokio::select! {
                _ = self.shutdown.cancelled() => return None,
                changed = self.written.changed() => {
                    if changed.is_err() {
                        return None;
                    }
                }
                received = self.changes.recv() => {
                    if let Err(RecvError::Closed) = received {
                        return None;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn query(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn only_pod_log_paths_are_log_requests() {
        assert_eq!(
            target("/api/v1/namespaces/ml/pods/w-0/log"),
            Some(("ml".into(), "w-0".into()))
        );
        assert_eq!(target("/api/v1/namespaces/ml/pods/w-0"), None);
        assert_eq!(target("/api/v1/namespaces/ml/services/w-0/log"), None);
    }

    #[test]
    fn parameters_are_read_and_bad_ones_named() {
        let now = Utc::now();
        let options = Options::parse(
            &query(&[
                ("follow", "true"),
                ("tailLines", "5"),
                ("timestamps", "1"),
                ("container", "worker"),
            ]),
            now,
        )
        .expect("parses");
        assert!(options.follow && options.timestamps);
        assert_eq!(options.tail_lines, Some(5));
        assert_eq!(options.container.as_deref(), Some("worker"));
        let since = Options::parse(&query(&[("sinceSeconds", "10")]), now).expect("parses");
        assert_eq!(since.since, Some(now - chrono::Duration::seconds(10)));
        let error = Options::parse(&query(&[("tailLines", "-1")]), now).expect_err("negative");
        assert_eq!(error.code, 400);
        assert!(
            error.message.starts_with("tailLines: Invalid value: -1"),
            "{}",
            error.message
        );
        assert!(Options::parse(&query(&[("follow", "maybe")]), now).is_err());
        assert!(Options::parse(&query(&[("sinceTime", "yesterday")]), now).is_err());
    }

    #[test]
    fn the_container_is_the_named_or_the_only_one() {
        let pod = json!({"spec": {"containers": [{"name": "worker"}]}});
        assert_eq!(container(&pod, "p", None).expect("only"), "worker");
        assert_eq!(
            container(&pod, "p", Some("worker")).expect("named"),
            "worker"
        );
        let error = container(&pod, "p", Some("sidecar")).expect_err("unknown");
        assert_eq!(error.message, "container sidecar is not valid for pod p");
        let two = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}]}});
        let error = container(&two, "p", None).expect_err("ambiguous");
        assert_eq!(
            error.message,
            "a container name must be specified for pod p, choose one of: [a b]"
        );
    }

    #[test]
    fn a_container_that_has_not_started_is_refused_in_the_kubelets_words() {
        let pending = json!({"status": {"phase": "Pending"}});
        let error = refusal(&pending, "p", "worker", false).expect("refused");
        assert_eq!(error.code, 400);
        assert_eq!(
            error.message,
            "container \"worker\" in pod \"p\" is waiting to start: ContainerCreating"
        );
        let pulling = json!({"status": {"phase": "Pending", "containerStatuses": [
            {"name": "worker", "state": {"waiting": {"reason": "ImagePullBackOff"}}}]}});
        assert!(
            refusal(&pulling, "p", "worker", false)
                .expect("refused")
                .message
                .ends_with("is waiting to start: trying and failing to pull image")
        );
        let running = json!({"status": {"phase": "Running", "containerStatuses": [
            {"name": "worker", "state": {"running": {}}}]}});
        assert_eq!(refusal(&running, "p", "worker", false), None);
        let lost = json!({"status": {"phase": "Failed", "containerStatuses": []}});
        assert_eq!(refusal(&lost, "p", "worker", false), None);
        assert!(refusal(&running, "p", "worker", true).is_some());
    }

    #[test]
    fn tail_keeps_the_last_lines_and_a_limit_cuts_the_bytes() {
        let lines: Vec<LogLine> = (1..=4)
            .map(|i| LogLine {
                sequence: i,
                time: Utc::now(),
                text: format!("line {i}"),
            })
            .collect();
        let options = Options {
            tail_lines: Some(2),
            ..Options::default()
        };
        let tail = first_lines(lines, &options);
        assert_eq!(render(&tail, false), "line 3\nline 4\n");
        assert_eq!(limited("line 3\nline 4\n".into(), Some(8)), "line 3\nl");
        assert_eq!(limited("é".into(), Some(1)), "");
    }
}
