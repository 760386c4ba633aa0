//! Server-side printing: the `Table` (meta.k8s.io/v1) that `kubectl get` asks for,
//! with each CRD's printer columns, as a real apiserver answers it.

use axum::http::{HeaderMap, header};
use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use crate::resources::{PrinterColumn, ResourceType};

/// What each row carries besides its cells (`?includeObject=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncludeObject {
    None,
    /// The default: the object's metadata, which kubectl needs for `-A` and `--show-labels`.
    Metadata,
    Object,
}

impl IncludeObject {
    pub fn parse(value: Option<&str>) -> Self {
        match value {
            Some("None") => Self::None,
            Some("Object") => Self::Object,
            _ => Self::Metadata,
        }
    }
}

/// True when the client accepts a Table (kubectl's `Accept` lists it first).
pub fn wanted(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|media| media.split(';').any(|p| p.trim() == "as=Table"))
}

/// The table of `objects`, one row each.
pub fn table<'a>(
    rt: &ResourceType,
    objects: impl IntoIterator<Item = &'a Value>,
    resource_version: Option<String>,
    include: IncludeObject,
    now: DateTime<Utc>,
) -> Value {
    let mut columns = vec![json!({
        "name": "Name",
        "type": "string",
        "format": "name",
        "description": "Name must be unique within a namespace.",
        "priority": 0,
    })];
    columns.extend(rt.columns.iter().map(|c| {
        json!({
            "name": c.name,
            "type": if c.column_type == "date" { "string" } else { c.column_type },
            "format": "",
            "description": c.description,
            "priority": c.priority,
        })
    }));
    let rows: Vec<Value> = objects
        .into_iter()
        .map(|object| {
            let mut cells = vec![object["metadata"]["name"].clone()];
            cells.extend(rt.columns.iter().map(|c| cell(c, object, now)));
            let mut row = json!({ "cells": cells });
            match include {
                IncludeObject::None => {}
                IncludeObject::Metadata => {
                    row["object"] = json!({
                        "kind": "PartialObjectMetadata",
                        "apiVersion": "meta.k8s.io/v1",
                        "metadata": object["metadata"],
                    });
                }
                IncludeObject::Object => row["object"] = object.clone(),
            }
            row
        })
        .collect();
    let mut metadata = json!({});
    if let Some(rv) = resource_version {
        metadata["resourceVersion"] = json!(rv);
    }
    json!({
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": metadata,
        "columnDefinitions": columns,
        "rows": rows,
    })
}

fn cell(column: &PrinterColumn, object: &Value, now: DateTime<Utc>) -> Value {
    let Some(value) = lookup(object, column.json_path) else {
        return Value::Null;
    };
    match (column.column_type, value) {
        ("date", Value::String(text)) => match DateTime::parse_from_rfc3339(text) {
            Ok(time) => json!(human_age(now.signed_duration_since(time).num_seconds())),
            Err(_) => value.clone(),
        },
        _ => value.clone(),
    }
}

/// The value at a simple JSONPath (`.status.state`, `.metadata.labels.a\.b/c`).
fn lookup<'a>(object: &'a Value, path: &str) -> Option<&'a Value> {
    let mut parts = Vec::new();
    let mut current = String::new();
    let mut chars = path.trim_start_matches('.').chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => current.extend(chars.next()),
            '.' => parts.push(std::mem::take(&mut current)),
            other => current.push(other),
        }
    }
    parts.push(current);
    let value = parts
        .iter()
        .try_fold(object, |value, part| value.get(part.as_str()))?;
    (!value.is_null()).then_some(value)
}

/// An age as kubectl prints it (apimachinery's `HumanDuration`): `45s`, `3m20s`, `5h`, `2d3h`.
pub fn human_age(seconds: i64) -> String {
    if seconds < 0 {
        return "0s".to_owned();
    }
    let (minutes, hours, days) = (seconds / 60, seconds / 3600, seconds / 86_400);
    if seconds < 120 {
        format!("{seconds}s")
    } else if minutes < 10 {
        match seconds % 60 {
            0 => format!("{minutes}m"),
            s => format!("{minutes}m{s}s"),
        }
    } else if hours < 3 {
        format!("{minutes}m")
    } else if hours < 8 {
        match minutes % 60 {
            0 => format!("{hours}h"),
            m => format!("{hours}h{m}m"),
        }
    } else if hours < 48 {
        format!("{hours}h")
    } else if hours < 192 {
        match hours % 24 {
            0 => format!("{days}d"),
            h => format!("{days}d{h}h"),
        }
    } else if days < 365 * 2 {
        format!("{days}d")
    } else {
        format!("{}y", days / 365)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources;

    #[test]
    fn ages_read_as_kubectl_prints_them() {
        let cases = [
            (5, "5s"),
            (119, "119s"),
            (200, "3m20s"),
            (600, "10m"),
            (4 * 3600 + 60, "4h1m"),
            (30 * 3600, "30h"),
            (3 * 86_400 + 3600, "3d1h"),
            (40 * 86_400, "40d"),
        ];
        for (seconds, age) in cases {
            assert_eq!(human_age(seconds), age, "{seconds}s");
        }
    }

    #[test]
    fn crd_printer_columns_become_cells_and_missing_values_null() {
        let rt = resources::training_jobs();
        let now = Utc::now();
        let created = (now - chrono::Duration::seconds(90)).to_rfc3339();
        let job = json!({
            "metadata": {"name": "bert", "namespace": "ml", "creationTimestamp": created},
            "status": {"state": "Running", "currentEpoch": 3},
        });
        let table = table(rt, [&job], Some("7".into()), IncludeObject::Metadata, now);
        let names: Vec<&str> = table["columnDefinitions"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["name"].as_str())
            .collect();
        assert_eq!(names[0], "Name");
        let at = |name: &str| names.iter().position(|n| *n == name).expect(name);
        let cells = &table["rows"][0]["cells"];
        assert_eq!(cells[0], "bert");
        assert_eq!(cells[at("State")], "Running");
        assert_eq!(cells[at("Age")], "90s");
        assert_eq!(cells[at("Progress")], Value::Null);
        assert_eq!(table["rows"][0]["object"]["metadata"]["namespace"], "ml");
        assert_eq!(table["metadata"]["resourceVersion"], "7");
    }

    #[test]
    fn escaped_dots_stay_inside_one_key() {
        let node = json!({"metadata": {"labels": {"node.kubernetes.io/instance-type": "p4d"}}});
        assert_eq!(
            lookup(
                &node,
                ".metadata.labels.node\\.kubernetes\\.io/instance-type"
            ),
            Some(&json!("p4d"))
        );
    }

    #[test]
    fn kubectls_accept_header_asks_for_a_table() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::ACCEPT,
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json"
                .parse()
                .expect("header"),
        );
        assert!(wanted(&headers));
        headers.insert(header::ACCEPT, "application/json".parse().expect("header"));
        assert!(!wanted(&headers));
    }
}
