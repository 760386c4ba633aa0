//! The one boundary between the API server and the simulated cluster. The API
//! server stores every kind as JSON, as a real apiserver stores objects it has
//! no type for (CRDs, fields of newer versions), so `Value` is right there; the
//! cluster's controllers (Job controller, scheduler, kubelets, admission) read
//! and write the kinds they know as `k8s_openapi` types, converted here. An
//! object that does not read as its kind is an error naming the field, never a
//! panic: a real API server would have refused it.

use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value};

use crate::error::ApiError;
use crate::resources::ResourceType;
use crate::selector::Selector;
use crate::store::Store;

/// Reads a stored object as `K`; the error names the object and the field.
pub fn read<K: DeserializeOwned>(rt: &ResourceType, object: &Value) -> Result<K, ApiError> {
    // Read again, tracking the path, only to name the field of a failure:
    // tracking it on every read was a noticeable part of a step.
    if let Ok(typed) = K::deserialize(object) {
        return Ok(typed);
    }
    serde_path_to_error::deserialize(object).map_err(|err| {
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        ApiError::invalid(rt, name, &format!("{}: {}", err.path(), err.inner()))
    })
}

/// An object as the store holds it.
pub fn write<K: Serialize>(rt: &ResourceType, object: &K) -> Result<Value, ApiError> {
    serde_json::to_value(object)
        .map_err(|err| ApiError::invalid(rt, "", &format!("cannot be written as JSON: {err}")))
}

/// Makes `stored` what `after` says where it differs from `before`, leaving
/// the fields `K` does not know (and so never read) as they are.
fn apply_changes(stored: &mut Value, before: &Value, after: &Value) {
    let (Some(before), Some(after)) = (before.as_object(), after.as_object()) else {
        *stored = after.clone();
        return;
    };
    if !stored.is_object() {
        *stored = Value::Object(Map::new());
    }
    let Some(stored) = stored.as_object_mut() else {
        return;
    };
    for name in before.keys().filter(|name| !after.contains_key(*name)) {
        stored.remove(name);
    }
    for (name, new) in after {
        let old = before.get(name);
        if old == Some(new) {
            continue;
        }
        match (old, stored.get_mut(name)) {
            (Some(old), Some(field)) if old.is_object() && new.is_object() => {
                apply_changes(field, old, new);
            }
            _ => {
                stored.insert(name.clone(), new.clone());
            }
        }
    }
}

impl Store {
    /// An object read as `K`.
    pub fn get_as<K: DeserializeOwned>(
        &self,
        rt: &ResourceType,
        namespace: Option<&str>,
        name: &str,
    ) -> Result<K, ApiError> {
        read(rt, self.get(rt, namespace, name)?.as_ref())
    }

    /// Every object of a type (in one namespace or all) read as `K`, each with
    /// its own result: one that does not read does not hide the others.
    pub fn list_as<K: DeserializeOwned>(
        &self,
        rt: &ResourceType,
        namespace: Option<&str>,
    ) -> Vec<Result<K, ApiError>> {
        let all = Selector::default();
        let (objects, _) = self.list(rt, namespace, &all, &all);
        objects.iter().map(|object| read(rt, object)).collect()
    }

    /// Creates `object`, with its status when `with_status` (a controller
    /// writing what a client could not), and returns it as stored.
    pub fn create_as<K: Serialize + DeserializeOwned>(
        &self,
        rt: &ResourceType,
        namespace: Option<&str>,
        object: &K,
        with_status: bool,
    ) -> Result<K, ApiError> {
        let object = write(rt, object)?;
        let created = if with_status {
            self.create_with_status(rt, namespace, object)?
        } else {
            self.create(rt, namespace, object)?
        };
        read(rt, &created)
    }

    /// Changes an object read as `K` (see [`Store::update`]). Only what `change`
    /// changes is written: fields `K` does not know stay as stored.
    pub fn update_as<K, F>(
        &self,
        rt: &ResourceType,
        namespace: Option<&str>,
        name: &str,
        change: F,
    ) -> Result<(), ApiError>
    where
        K: Serialize + DeserializeOwned,
        F: FnOnce(&mut K),
    {
        let mut outcome = Ok(());
        self.update(rt, namespace, name, |stored| {
            let typed = read::<K>(rt, stored).and_then(|mut typed| {
                let before = write(rt, &typed)?;
                change(&mut typed);
                Ok((before, write(rt, &typed)?))
            });
            match typed {
                Ok((before, after)) => apply_changes(stored, &before, &after),
                Err(err) => outcome = Err(err),
            }
        })?;
        outcome
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Pod, PodStatus};
    use serde_json::json;

    use super::*;
    use crate::resources;

    #[test]
    fn a_typed_update_writes_only_what_it_changes() {
        let store = Store::default();
        let pod = json!({
            "metadata": {"name": "p", "namespace": "ml", "labels": {"a": "1"}},
            "spec": {"containers": [{"name": "c", "image": "x"}], "futureField": {"k": 1}},
            "status": {"phase": "Pending", "futureStatus": true},
        });
        store
            .create_with_status(resources::pods(), Some("ml"), pod)
            .expect("created");
        store
            .update_as::<Pod, _>(resources::pods(), Some("ml"), "p", |pod| {
                pod.status.get_or_insert_with(PodStatus::default).phase = Some("Running".into());
                pod.metadata.labels = None;
            })
            .expect("updated");
        let stored = store
            .get(resources::pods(), Some("ml"), "p")
            .expect("stored");
        assert_eq!(stored["status"]["phase"], "Running");
        assert_eq!(
            stored["status"]["futureStatus"], true,
            "unknown fields stay"
        );
        assert_eq!(stored["spec"]["futureField"]["k"], 1, "unknown fields stay");
        assert!(
            stored["metadata"]["labels"].is_null(),
            "a field set to None goes"
        );
    }

    #[test]
    fn an_object_that_does_not_read_as_its_kind_names_the_field() {
        let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [], "overhead": {"cpu": true}}});
        let err = read::<Pod>(resources::pods(), &pod).expect_err("a boolean is not a quantity");
        assert_eq!(err.code, 422);
        assert!(
            err.message
                .starts_with("Pod \"p\" is invalid: spec.overhead.cpu: invalid type: boolean"),
            "{err}"
        );
        let store = Store::default();
        store
            .create_with_status(resources::pods(), Some("ml"), json!({"metadata": {"name": "p", "namespace": "ml"}, "spec": {"overhead": {"cpu": true}}}))
            .expect("the store holds any JSON");
        let refused = store.update_as::<Pod, _>(resources::pods(), Some("ml"), "p", |pod| {
            pod.spec = None;
        });
        assert!(refused.is_err());
        let stored = store.get(resources::pods(), Some("ml"), "p").expect("kept");
        assert_eq!(stored["spec"]["overhead"]["cpu"], true, "left as it was");
    }
}
