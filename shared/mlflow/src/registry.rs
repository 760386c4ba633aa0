//! The model registry: registered models, their versions and aliases.

use reqwest::Method;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::{MlflowClient, MlflowError, filter_literal};

/// Versions asked for per `model-versions/search` page.
const VERSIONS_PER_PAGE: u32 = 1000;

/// A registered model's version, as the registry returns it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct ModelVersion {
    pub name: String,
    pub version: String,
    #[serde(default)]
    pub source: String,
    #[serde(default)]
    pub run_id: String,
    /// `READY`, `PENDING_REGISTRATION` or `FAILED_REGISTRATION`.
    #[serde(default)]
    pub status: String,
}

#[derive(Deserialize)]
struct ModelVersionResponse {
    model_version: ModelVersion,
}

#[derive(Deserialize)]
struct SearchModelVersionsResponse {
    #[serde(default)]
    model_versions: Vec<ModelVersion>,
    #[serde(default)]
    next_page_token: Option<String>,
}

impl MlflowClient {
    /// Creates the registered model `name` unless it exists. Safe against
    /// concurrent creators.
    pub async fn ensure_registered_model(&self, name: &str) -> Result<(), MlflowError> {
        let created = self
            .call::<Value>(
                "create_registered_model",
                Method::POST,
                "registered-models/create",
                &[],
                Some(&json!({"name": name})),
            )
            .await;
        match created {
            Ok(_) => Ok(()),
            Err(err) if err.error_code() == Some("RESOURCE_ALREADY_EXISTS") => Ok(()),
            Err(err) => Err(err),
        }
    }

    /// Every version of the registered model `name`, all pages.
    pub async fn model_versions(&self, name: &str) -> Result<Vec<ModelVersion>, MlflowError> {
        let filter = format!("name = {}", filter_literal(name));
        let per_page = VERSIONS_PER_PAGE.to_string();
        let mut versions = Vec::new();
        let mut page_token: Option<String> = None;
        loop {
            let mut query = vec![
                ("filter", filter.as_str()),
                ("max_results", per_page.as_str()),
            ];
            if let Some(token) = page_token.as_deref() {
                query.push(("page_token", token));
            }
            let page = self
                .call::<SearchModelVersionsResponse>(
                    "search_model_versions",
                    Method::GET,
                    "model-versions/search",
                    &query,
                    None,
                )
                .await?;
            versions.extend(page.model_versions);
            match page.next_page_token.filter(|t| !t.is_empty()) {
                Some(token) => page_token = Some(token),
                None => return Ok(versions),
            }
        }
    }

    /// Creates a version of the registered model `name` from `source`, tied to
    /// the run `run_id` when given.
    pub async fn create_model_version(
        &self,
        name: &str,
        source: &str,
        run_id: Option<&str>,
    ) -> Result<ModelVersion, MlflowError> {
        let mut body = json!({"name": name, "source": source});
        if let Some(run_id) = run_id {
            body["run_id"] = json!(run_id);
        }
        let response = self
            .call::<ModelVersionResponse>(
                "create_model_version",
                Method::POST,
                "model-versions/create",
                &[],
                Some(&body),
            )
            .await?;
        Ok(response.model_version)
    }

    /// Points `alias` of the registered model `name` at `version` (moving it
    /// from any other version).
    pub async fn set_model_alias(
        &self,
        name: &str,
        alias: &str,
        version: &str,
    ) -> Result<(), MlflowError> {
        self.call::<Value>(
            "set_model_alias",
            Method::POST,
            "registered-models/alias",
            &[],
            Some(&json!({"name": name, "alias": alias, "version": version})),
        )
        .await
        .map(|_| ())
    }
}
