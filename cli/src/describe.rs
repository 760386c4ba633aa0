//! `trainyard describe` and `trainyard explain`: one object read like `kubectl
//! describe` (metadata, a summary of what matters, spec and status, conditions as a
//! table, and the object's Events), and why a TrainingJob waits.
//!
//! Rendering is pure ([`render`], [`explanation`]); [`describe`] and [`explain`]
//! only fetch.

use std::io::Write;

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use serde_json::Value;
use trainyard_api::{TrainingJob, TrainingJobState, TrainingJobStatus};

use crate::error::CliError;
use crate::format::{NONE, age, number, table};
use crate::resources::{Listed, Scope};

/// Width of the label column, as kubectl's describe aligns values.
const LABEL_WIDTH: usize = 14;

/// `trainyard describe <kind> <name>`.
pub async fn describe<K: Listed>(
    client: Client,
    namespace: &str,
    name: &str,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let object = fetch::<K>(client.clone(), namespace, name).await?;
    let events = events_of::<K>(client, name).await?;
    let object = serde_json::to_value(&object)?;
    out.write_all(render(&object, &events, Timestamp::now())?.as_bytes())?;
    Ok(())
}

/// `trainyard explain <name>`: the TrainingJob's queue, position and reason.
pub async fn explain(
    client: Client,
    namespace: &str,
    name: &str,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let job = fetch::<TrainingJob>(client, namespace, name).await?;
    writeln!(out, "{}", explanation(&job))?;
    Ok(())
}

async fn fetch<K: Listed>(client: Client, namespace: &str, name: &str) -> Result<K, CliError> {
    let scope = Scope::Namespace(namespace.to_owned());
    crate::get::named(&K::api(client, &scope), &scope, name).await
}

/// The Events whose involved object is this one; a user who may not list
/// Events still gets the rest.
async fn events_of<K: Listed>(client: Client, name: &str) -> Result<Vec<Event>, CliError> {
    let params = ListParams::default().fields(&format!(
        "involvedObject.kind={},involvedObject.name={name}",
        K::kind(&())
    ));
    match Api::<Event>::all(client).list(&params).await {
        Ok(list) => Ok(list.items),
        Err(kube::Error::Api(status)) if status.code == 403 => Ok(Vec::new()),
        Err(error) => Err(CliError::kube(format!("list events of {name}"))(error)),
    }
}

/// Why a TrainingJob waits, or what it does instead.
pub fn explanation(job: &TrainingJob) -> String {
    let name = job.name_any();
    let status = job.status.clone().unwrap_or_default();
    let state = status.state.unwrap_or(TrainingJobState::Pending);
    let unschedulable = status.unschedulable().map(str::to_owned);
    match (state, status.queue) {
        (TrainingJobState::Queued | TrainingJobState::Pending, Some(queue))
            if let Some(why) = unschedulable =>
        {
            format!(
                "{name} is UNSCHEDULABLE in TrainingQueue {}: {why}",
                queue.name
            )
        }
        (TrainingJobState::Queued | TrainingJobState::Pending, Some(queue)) => {
            let position = queue
                .position
                .map_or_else(String::new, |p| format!(", position {p}"));
            let reason = queue
                .reason
                .unwrap_or_else(|| "the gpu-allocator has not explained it yet".to_owned());
            format!(
                "{name} waits in TrainingQueue {}{position}: {reason}",
                queue.name
            )
        }
        (TrainingJobState::Queued | TrainingJobState::Pending, None) => {
            format!("{name} waits for the gpu-allocator to see it; nothing has been decided yet")
        }
        (state, _) => format!("{name} is not waiting: it is {state}"),
    }
}

/// The describe text of `object` (any Trainyard kind, as JSON) with its `events`.
pub fn render(object: &Value, events: &[Event], now: Timestamp) -> Result<String, CliError> {
    let mut text = String::new();
    let metadata = &object["metadata"];
    line(&mut text, "Name:", text_of(&metadata["name"]));
    if let Some(namespace) = metadata["namespace"].as_str() {
        line(&mut text, "Namespace:", namespace.to_owned());
    }
    line(&mut text, "Kind:", text_of(&object["kind"]));
    line(&mut text, "Labels:", pairs(&metadata["labels"]));
    line(&mut text, "Annotations:", pairs(&metadata["annotations"]));
    line(
        &mut text,
        "Created:",
        text_of(&metadata["creationTimestamp"]),
    );
    if object["kind"] == "TrainingJob" {
        job_summary(&mut text, &object["status"]);
    }
    section(&mut text, "Spec:", &object["spec"])?;
    let mut status = object["status"].clone();
    let conditions = status
        .as_object_mut()
        .and_then(|s| s.remove("conditions"))
        .unwrap_or(Value::Null);
    section(&mut text, "Status:", &status)?;
    text.push_str("Conditions:\n");
    text.push_str(&indented(&conditions_table(&conditions)));
    text.push_str("Events:\n");
    text.push_str(&indented(&events_table(events, now)));
    Ok(text)
}

/// State, progress, restarts, queue, checkpoints and cost on one screen.
fn job_summary(text: &mut String, status: &Value) {
    line(text, "State:", text_of(&status["state"]));
    line(text, "Progress:", text_of(&status["progress"]));
    line(text, "Restarts:", text_of(&status["restartCount"]));
    let queue = &status["queue"];
    if queue.is_object() {
        let mut said = text_of(&queue["name"]);
        let unschedulable = serde_json::from_value::<TrainingJobStatus>(status.clone())
            .ok()
            .and_then(|s| s.unschedulable().map(str::to_owned));
        if let Some(why) = unschedulable {
            // A place in line would suggest that waiting helps.
            said.push_str(&format!(", UNSCHEDULABLE: {why}"));
        } else {
            if let Some(position) = queue["position"].as_u64() {
                said.push_str(&format!(", position {position}"));
            }
            if let Some(reason) = queue["reason"].as_str() {
                said.push_str(&format!(": {reason}"));
            }
        }
        line(text, "Queue:", said);
    }
    let checkpoint = &status["checkpoint"];
    if checkpoint.is_object() {
        line(
            text,
            "Checkpoints:",
            format!(
                "{} saved; latest verified {} (step {}); best {}",
                checkpoint["count"].as_u64().unwrap_or(0),
                text_of(&checkpoint["latestVerifiedPath"]),
                text_of(&checkpoint["latestVerifiedStep"]),
                text_of(&checkpoint["bestPath"]),
            ),
        );
        if let Some(model) = checkpoint["modelName"].as_str() {
            line(
                text,
                "Model:",
                format!("{model} version {}", text_of(&checkpoint["modelVersion"])),
            );
        }
    }
    let cost = &status["cost"];
    if cost.is_object() {
        let currency = cost["currency"].as_str().unwrap_or("USD");
        let mut said = format!(
            "{} {currency} so far",
            cost["accrued"].as_f64().map_or(NONE.to_owned(), number)
        );
        if let Some(estimated) = cost["estimated"].as_f64() {
            said.push_str(&format!(", {} {currency} estimated", number(estimated)));
        }
        if let Some(capacity) = capacity(cost) {
            said.push_str(&capacity);
        }
        line(text, "Cost:", said);
    }
}

/// The capacity type, as far as `status.cost` tells it: the cost-optimizer's
/// choice, whether the gpu-allocator set it aside because no node of that
/// type can hold the job, and the types of the nodes the job was charged on.
fn capacity(cost: &Value) -> Option<String> {
    let nodes: Vec<&str> = cost["nodeCapacityTypes"]
        .as_array()
        .map(|types| types.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let on_nodes = (!nodes.is_empty()).then(|| format!("on {} nodes", nodes.join(" and ")));
    let Some(chosen) = cost["capacityType"].as_str() else {
        return on_nodes.map(|on| format!(", {on}"));
    };
    if cost["eitherCapacityType"].as_bool() == Some(true) {
        let mut said = format!(
            "; {chosen} chosen, but no {chosen} node can ever hold the job, so it is admitted on either type"
        );
        if let Some(on) = on_nodes {
            said.push_str(&format!("; {on}"));
        }
        return Some(said);
    }
    Some(match (nodes.as_slice(), on_nodes) {
        ([only], _) if *only == chosen => format!(", on {chosen}"),
        (_, Some(on)) => format!(", {chosen} chosen, {on}"),
        (_, None) => format!(", on {chosen}"),
    })
}

fn line(text: &mut String, label: &str, value: String) {
    text.push_str(&format!("{label:<LABEL_WIDTH$}{value}\n"));
}

fn text_of(value: &Value) -> String {
    match value {
        Value::Null => NONE.to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// `k=v` pairs, comma-separated, or `-`.
fn pairs(map: &Value) -> String {
    match map.as_object() {
        Some(map) if !map.is_empty() => map
            .iter()
            .map(|(k, v)| format!("{k}={}", text_of(v)))
            .collect::<Vec<_>>()
            .join(", "),
        _ => NONE.to_owned(),
    }
}

/// A titled block of YAML, indented under its title; nothing for an empty value.
fn section(text: &mut String, title: &str, value: &Value) -> Result<(), CliError> {
    let empty = value.is_null() || value.as_object().is_some_and(|o| o.is_empty());
    if empty {
        return Ok(());
    }
    text.push_str(title);
    text.push('\n');
    text.push_str(&indented(&yaml_serde::to_string(value)?));
    Ok(())
}

fn indented(block: &str) -> String {
    block.lines().map(|l| format!("  {l}\n")).collect()
}

fn conditions_table(conditions: &Value) -> String {
    let Some(conditions) = conditions.as_array().filter(|c| !c.is_empty()) else {
        return "<none>\n".to_owned();
    };
    let mut rows = vec![
        ["TYPE", "STATUS", "REASON", "MESSAGE"]
            .map(str::to_owned)
            .to_vec(),
    ];
    rows.extend(conditions.iter().map(|c| {
        vec![
            text_of(&c["type"]),
            text_of(&c["status"]),
            text_of(&c["reason"]),
            text_of(&c["message"]),
        ]
    }));
    table(&rows)
}

fn events_table(events: &[Event], now: Timestamp) -> String {
    if events.is_empty() {
        return "<none>\n".to_owned();
    }
    let mut events: Vec<&Event> = events.iter().collect();
    events.sort_by_key(|e| event_time(e));
    let mut rows = vec![
        ["TYPE", "REASON", "AGE", "FROM", "MESSAGE"]
            .map(str::to_owned)
            .to_vec(),
    ];
    rows.extend(events.iter().map(|e| {
        vec![
            e.type_.clone().unwrap_or_else(|| NONE.to_owned()),
            e.reason.clone().unwrap_or_else(|| NONE.to_owned()),
            age(event_time(e).as_ref(), now),
            e.reporting_component
                .clone()
                .or_else(|| e.source.as_ref().and_then(|s| s.component.clone()))
                .unwrap_or_else(|| NONE.to_owned()),
            e.message.clone().unwrap_or_else(|| NONE.to_owned()),
        ]
    }));
    table(&rows)
}

/// When an Event last happened: its last timestamp, else its event time, else
/// when it was created.
fn event_time(event: &Event) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time> {
    event
        .last_timestamp
        .clone()
        .or_else(|| {
            event
                .event_time
                .as_ref()
                .map(|t| k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(t.0))
        })
        .or_else(|| event.metadata.creation_timestamp.clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job(status: Value) -> TrainingJob {
        serde_json::from_value(json!({
            "apiVersion": "trainyard.dev/v1", "kind": "TrainingJob",
            "metadata": {"name": "bert", "namespace": "ml", "labels": {"team": "nlp"}},
            "spec": {"model": "bert", "dataset": "wiki", "framework": "pytorch",
                     "numWorkers": 2, "gpusPerWorker": 4},
            "status": status,
        }))
        .expect("job")
    }

    #[test]
    fn a_waiting_job_is_explained_by_its_queue_position_and_reason() {
        let waiting = job(json!({"state": "Queued", "queue": {"name": "default",
            "position": 3, "reason": "quota: flavor a100 nvidia.com/gpu: 8 short"}}));
        assert_eq!(
            explanation(&waiting),
            "bert waits in TrainingQueue default, position 3: quota: flavor a100 \
             nvidia.com/gpu: 8 short"
        );
        let unseen = job(json!({"state": "Queued"}));
        assert!(explanation(&unseen).contains("nothing has been decided yet"));
        let running = job(json!({"state": "Running"}));
        assert_eq!(explanation(&running), "bert is not waiting: it is Running");
    }

    #[test]
    fn a_job_no_node_could_hold_is_explained_as_unschedulable_not_by_its_position() {
        let why = "no node can hold a worker: spec.gpusPerWorker is 16 but the largest node \
                   (gpu-node-3) has 8 GPUs; lower gpusPerWorker to at most 8 and raise numWorkers";
        let stuck = job(json!({"state": "Queued",
            "queue": {"name": "default", "position": 3, "reason": why},
            "conditions": [{"type": "Schedulable", "status": "False",
                            "reason": "Unschedulable", "message": why}]}));
        assert_eq!(
            explanation(&stuck),
            format!("bert is UNSCHEDULABLE in TrainingQueue default: {why}")
        );
        let text = render(
            &serde_json::to_value(&stuck).expect("json"),
            &[],
            Timestamp::now(),
        )
        .expect("renders");
        assert!(
            text.contains(&format!("Queue:        default, UNSCHEDULABLE: {why}\n")),
            "{text}"
        );
        // Once a node fits, the condition is True and the place in line shows again.
        let fits = job(json!({"state": "Queued",
            "queue": {"name": "default", "position": 3, "reason": "8 short"},
            "conditions": [{"type": "Schedulable", "status": "True", "reason": "NodesFit"}]}));
        assert_eq!(
            explanation(&fits),
            "bert waits in TrainingQueue default, position 3: 8 short"
        );
    }

    #[test]
    fn describe_shows_the_summary_spec_status_conditions_and_events() {
        let object = serde_json::to_value(job(json!({
            "state": "Running", "progress": "3/10", "restartCount": 1,
            "checkpoint": {"count": 2, "latestVerifiedPath": "s3://b/ckpt-2",
                           "latestVerifiedStep": 200, "bestPath": "s3://b/ckpt-1",
                           "modelName": "ml-bert", "modelVersion": "4"},
            "cost": {"accrued": 12.5, "estimated": 40.0, "currency": "USD",
                     "capacityType": "spot"},
            "conditions": [{"type": "Admitted", "status": "True", "reason": "Admitted",
                            "message": "admitted to default"}],
        })))
        .expect("json");
        let event: Event = serde_json::from_value(json!({
            "metadata": {"name": "bert.1", "namespace": "ml"},
            "involvedObject": {"kind": "TrainingJob", "name": "bert"},
            "type": "Warning", "reason": "Restarted", "message": "worker 1 exited 137",
            "reportingComponent": "trainyard-planner",
        }))
        .expect("event");
        let text = render(&object, &[event], Timestamp::now()).expect("renders");
        for expected in [
            "Name:         bert\n",
            "Namespace:    ml\n",
            "Labels:       team=nlp\n",
            "State:        Running\n",
            "Restarts:     1\n",
            "Checkpoints:  2 saved; latest verified s3://b/ckpt-2 (step 200); best s3://b/ckpt-1\n",
            "Model:        ml-bert version 4\n",
            "Cost:         12.5 USD so far, 40 USD estimated, on spot\n",
            "Spec:\n",
            "  model: bert\n",
            "Conditions:\n  TYPE",
            "admitted to default",
            "Warning",
            "trainyard-planner",
            "worker 1 exited 137",
        ] {
            assert!(
                text.contains(expected),
                "{expected:?} missing from:\n{text}"
            );
        }
        assert!(
            !text.contains("Status:\n  conditions"),
            "conditions are a table, not YAML:\n{text}"
        );
    }

    #[test]
    fn the_cost_line_says_when_the_chosen_capacity_type_gave_way() {
        let cost_line = |cost: Value| {
            let object =
                serde_json::to_value(job(json!({"state": "Running", "cost": cost}))).expect("json");
            let text = render(&object, &[], Timestamp::now()).expect("renders");
            text.lines()
                .find(|l| l.starts_with("Cost:"))
                .map(|l| l["Cost:".len()..].trim().to_owned())
                .expect("a cost line")
        };
        assert_eq!(
            cost_line(
                json!({"accrued": 3.0, "currency": "USD", "capacityType": "spot",
                             "eitherCapacityType": true, "nodeCapacityTypes": ["on-demand"]})
            ),
            "3 USD so far; spot chosen, but no spot node can ever hold the job, so it is admitted on either type; on on-demand nodes"
        );
        assert_eq!(
            cost_line(
                json!({"accrued": 3.0, "currency": "USD", "capacityType": "spot",
                             "nodeCapacityTypes": ["spot"]})
            ),
            "3 USD so far, on spot"
        );
        // Admitted before the choice: it stays on its nodes until its next attempt.
        assert_eq!(
            cost_line(
                json!({"accrued": 3.0, "currency": "USD", "capacityType": "spot",
                             "nodeCapacityTypes": ["on-demand", "spot"]})
            ),
            "3 USD so far, spot chosen, on on-demand and spot nodes"
        );
        assert_eq!(
            cost_line(json!({"accrued": 3.0, "currency": "USD",
                             "nodeCapacityTypes": ["on-demand"]})),
            "3 USD so far, on on-demand nodes"
        );
    }

    #[test]
    fn an_object_without_status_or_events_says_none() {
        let object = serde_json::to_value(job(Value::Null)).expect("json");
        let text = render(&object, &[], Timestamp::now()).expect("renders");
        assert!(text.contains("Conditions:\n  <none>\n"), "{text}");
        assert!(text.ends_with("Events:\n  <none>\n"), "{text}");
        assert!(!text.contains("Status:"), "{text}");
    }
}
