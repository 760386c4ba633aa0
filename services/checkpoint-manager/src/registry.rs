//! The MLflow model registry: a completed job's chosen checkpoint becomes a
//! version of its registered model, and the configured alias moves to it.
//! Registering the same checkpoint again reuses the version whose `source` it
//! is, so restarts and redeliveries never make a second one.

use std::time::Duration;

use checkpoint_manager_core::registration;
use tokio_util::sync::CancellationToken;
use trainyard_mlflow::{
    ALLOWED_TRACKING_URIS_KEY, ClientSettings, MlflowAccess, MlflowError, MlflowServers,
    RetryPolicy, ServerChoice,
};

use crate::ManagerConfig;
use crate::error::CheckpointError;

/// A version of a registered model holding a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Version {
    pub version: String,
    /// False when an existing version with the same source was reused.
    pub created: bool,
}

/// The model registries of the manager's own MLflow server and of the
/// allowed servers jobs name, with the manager's naming settings.
pub struct Registry {
    servers: MlflowServers,
    model_name_template: String,
    alias: Option<String>,
}

impl Registry {
    /// The registry `config` names; None (registration off) without a tracking URI.
    pub fn from_config(
        config: &ManagerConfig,
        shutdown: CancellationToken,
    ) -> Result<Option<Self>, CheckpointError> {
        let Some(uri) = config.tracking_uri() else {
            return Ok(None);
        };
        if config.model_name_template.trim().is_empty() {
            return Err(CheckpointError::Config(
                "checkpoint_manager.model_name_template is empty; set it, e.g. \"{namespace}-{name}\"".into(),
            ));
        }
        let settings = ClientSettings {
            access: MlflowAccess {
                token_file: config.mlflow_token_file.as_ref().map(Into::into),
                username: config.mlflow_username.clone(),
                password_file: config.mlflow_password_file.as_ref().map(Into::into),
                tls_ca_file: config.mlflow_tls_ca_file.as_ref().map(Into::into),
                env: config.mlflow_env.clone(),
            },
            timeout: Duration::from_secs(config.mlflow_timeout_seconds.max(1)),
            retry: RetryPolicy {
                max_attempts: config.mlflow_max_attempts.max(1),
                ..RetryPolicy::default()
            },
            shutdown,
        };
        let servers = MlflowServers::new(
            uri,
            &config.mlflow_allowed_tracking_uris,
            format!("checkpoint_manager.{ALLOWED_TRACKING_URIS_KEY}"),
            settings,
        )
        .map_err(|err| match err {
            // Its message starts with the key: an MLflow variable, or one of ours.
            MlflowError::Access { key, .. } if key.starts_with("MLFLOW_") => {
                CheckpointError::Config(err.to_string())
            }
            MlflowError::Access { .. } => {
                CheckpointError::Config(format!("checkpoint_manager.{err}"))
            }
            err => {
                CheckpointError::Config(format!("checkpoint_manager.mlflow_tracking_uri: {err}"))
            }
        })?;
        let alias = Some(config.model_alias.trim().to_string()).filter(|a| !a.is_empty());
        Ok(Some(Self {
            servers,
            model_name_template: config.model_name_template.clone(),
            alias,
        }))
    }

    /// Where a job naming `requested` (its `monitoring.mlflowTrackingUri`)
    /// is registered.
    pub fn server(&self, requested: Option<&str>) -> ServerChoice {
        self.servers.choose(requested)
    }

    /// The manager's own server.
    pub fn default_uri(&self) -> &str {
        self.servers.default_uri()
    }

    /// The alias moved to each registered version, if any.
    pub fn alias(&self) -> Option<&str> {
        self.alias.as_deref()
    }

    /// The job's model name: its `trainyard.dev/model-name` annotation, else the template's.
    pub fn model_name(&self, namespace: &str, name: &str, annotated: Option<&str>) -> String {
        match annotated.map(str::trim).filter(|a| !a.is_empty()) {
            Some(annotated) => annotated.to_string(),
            None => registration::model_name(&self.model_name_template, namespace, name),
        }
    }

    /// The version of `model` whose source is `source` on `server`'s
    /// registry: found among the model's versions, else created (the model
    /// too, when it is new).
    pub async fn version(
        &self,
        server: &ServerChoice,
        model: &str,
        source: &str,
        run_id: Option<&str>,
    ) -> Result<Version, MlflowError> {
        let client = self.servers.client(server)?;
        client.ensure_registered_model(model).await?;
        let versions = client.model_versions(model).await?;
        let existing = registration::existing_version(
            versions
                .iter()
                .map(|v| (v.version.as_str(), v.source.as_str())),
            source,
        );
        if let Some(version) = existing {
            return Ok(Version {
                version: version.to_string(),
                created: false,
            });
        }
        let created = client.create_model_version(model, source, run_id).await?;
        Ok(Version {
            version: created.version,
            created: true,
        })
    }

    /// Points the configured alias of `model` at `version` on `server`'s
    /// registry; nothing without an alias.
    pub async fn move_alias(
        &self,
        server: &ServerChoice,
        model: &str,
        version: &str,
    ) -> Result<(), MlflowError> {
        match &self.alias {
            Some(alias) => {
                self.servers
                    .client(server)?
                    .set_model_alias(model, alias, version)
                    .await
            }
            None => Ok(()),
        }
    }
}

/// Why the registry refused for good, with the fix for the failing step.
pub fn refusal(err: &MlflowError, model: &str, source: &str) -> String {
    let fix = match err.operation() {
        "create_model_version" => format!(
            "the registry does not take {source} as a model version source; MLflow takes object storage URIs and pvc:// or nfs:// addresses, and a local path only inside the run's artifacts"
        ),
        "set_model_alias" => "set checkpoint_manager.model_alias to a valid alias (letters, digits, _ and -; not latest or v<number>), or empty for none".to_string(),
        _ => format!(
            "model name {model:?} is not valid in the registry; set annotation {} on the TrainingJob or checkpoint_manager.model_name_template",
            trainyard_api::ANNOTATION_MODEL_NAME
        ),
    };
    format!("{err}; {fix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(allowed: &[&str]) -> ManagerConfig {
        ManagerConfig {
            mlflow_tracking_uri: Some("http://mlflow.mlflow:5000".into()),
            mlflow_allowed_tracking_uris: allowed.iter().map(|uri| uri.to_string()).collect(),
            ..ManagerConfig::default()
        }
    }

    #[test]
    fn jobs_register_on_an_allowed_server_they_name_else_on_the_managers_own() {
        let registry = Registry::from_config(
            &config(&["https://mlflow.team-a.example/registry"]),
            CancellationToken::new(),
        )
        .expect("valid")
        .expect("registration on");
        assert_eq!(registry.server(None), ServerChoice::Default);
        assert_eq!(
            registry.server(Some("https://mlflow.team-a.example/registry/")),
            ServerChoice::Requested("https://mlflow.team-a.example/registry/".into())
        );
        assert!(matches!(
            registry.server(Some("https://mlflow.team-a.example@evil.example/registry")),
            ServerChoice::Refused { .. }
        ));
    }

    #[test]
    fn an_unusable_allow_list_entry_stops_the_start_naming_the_key() {
        let err = Registry::from_config(&config(&["ftp://mlflow"]), CancellationToken::new())
            .err()
            .expect("refused")
            .to_string();
        assert!(
            err.contains(
                "checkpoint_manager.mlflow_allowed_tracking_uris: entry 0 (\"ftp://mlflow\"): scheme \"ftp\" is not http or https"
            ),
            "{err}"
        );
    }
}
