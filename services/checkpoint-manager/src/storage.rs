//! Reading and deleting checkpoints where they are stored, through the
//! `object_store` crate: S3 (and S3-compatible servers), GCS, Azure, and
//! volume paths the manager can read. Credentials come from the environment of
//! the manager's pod (its service account, or a Secret mapped into
//! environment variables) or the `checkpoint_manager.s3_*` settings, never
//! from a TrainingJob's spec.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use checkpoint_manager_core::verify::{self, Expected, Listing};
use checkpoint_manager_core::{MANIFEST_FILE, Manifest, Verification};
use futures::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::client::HttpErrorKind;
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ClientConfigKey, ObjectStore, ObjectStoreScheme, RetryConfig};
use sha2::{Digest, Sha256};
use url::Url;

use crate::StorageSettings;
use crate::error::CheckpointError;

/// A checkpoint's directory or object prefix, opened.
pub struct Location {
    store: Arc<dyn ObjectStore>,
    prefix: Path,
    /// The checkpoint's last path segment.
    pub name: String,
}

/// A client's identity: `<scheme>://<bucket>` and the S3 endpoint.
type ClientKey = (String, Option<String>);

/// Opens checkpoint URIs, reusing one client per bucket and endpoint.
pub struct Storage {
    settings: StorageSettings,
    clients: Mutex<HashMap<ClientKey, Arc<dyn ObjectStore>>>,
}

fn storage_error(uri: &str, err: impl std::fmt::Display) -> CheckpointError {
    CheckpointError::Storage(format!("{uri}: {err}"))
}

/// The error of a failed storage request: an outage (`what` waits until the
/// storage answers) or a refusal (it is retried, then dead-lettered).
fn request_error(what: impl std::fmt::Display, err: &object_store::Error) -> CheckpointError {
    if is_outage(err) {
        CheckpointError::StorageUnavailable(format!("{what}: {err}"))
    } else {
        CheckpointError::Storage(format!("{what}: {err}"))
    }
}

/// True when the storage could not be reached or could not answer: the
/// connection was refused, reset or timed out, or the server answered 5xx,
/// 429 or 408 (object_store's own retries gave up on those). Refusals (403,
/// 404, other 4xx) and unusable paths are not outages.
pub fn is_outage(err: &object_store::Error) -> bool {
    let object_store::Error::Generic { source, .. } = err else {
        return false;
    };
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(source.as_ref());
    while let Some(current) = cause {
        if let Some(http) = current.downcast_ref::<object_store::client::HttpError>()
            && matches!(
                http.kind(),
                HttpErrorKind::Connect
                    | HttpErrorKind::Request
                    | HttpErrorKind::Timeout
                    | HttpErrorKind::Interrupted
            )
        {
            return true;
        }
        if let Some(http) = current.downcast_ref::<reqwest::Error>()
            && (http.is_connect()
                || http.is_timeout()
                || http.is_request()
                || http.status().is_some_and(|s| s.is_server_error()))
        {
            return true;
        }
        if let Some(io) = current.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused
                    | std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::NotConnected
                    | std::io::ErrorKind::TimedOut
                    | std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::UnexpectedEof
            )
        {
            return true;
        }
        cause = current.source();
    }
    // object_store keeps the status of an answered request in a type it does
    // not export; its message is "... status code: <code> ..." (or an error
    // body in a 200 answer, which it treats as a 5xx).
    let message = source.to_string();
    let status = message
        .split_once("status code: ")
        .and_then(|(_, rest)| rest.get(..3))
        .and_then(|code| code.parse::<u16>().ok());
    match status {
        Some(code) => code >= 500 || code == 429 || code == 408,
        None => message.contains("Server returned error response"),
    }
}

impl Storage {
    pub fn new(settings: StorageSettings) -> Self {
        Self {
            settings,
            clients: Mutex::default(),
        }
    }

    /// True when the manager reads this URI itself: object stores always,
    /// volume paths when `read_volumes` is set.
    pub fn readable(&self, uri: &str) -> bool {
        !is_volume_path(uri) || self.settings.read_volumes
    }

    /// The storage endpoint `uri` is read from (`endpoint` is the job's
    /// `storage.s3Endpoint`): the S3 endpoint in use, else `<scheme>://<bucket>`.
    /// Reports whose storage does not answer wait per endpoint.
    pub fn endpoint(&self, uri: &str, endpoint: Option<&str>) -> String {
        if is_volume_path(uri) {
            return "volume".to_string();
        }
        let Ok(url) = Url::parse(uri) else {
            return uri.to_string();
        };
        let bucket = format!("{}://{}", url.scheme(), url.host_str().unwrap_or_default());
        match ObjectStoreScheme::parse(&url) {
            Ok((ObjectStoreScheme::AmazonS3, _)) => endpoint
                .or(self.settings.s3_endpoint.as_deref())
                .map_or(bucket, str::to_string),
            _ => bucket,
        }
    }

    /// Opens `uri`; `endpoint` is the job's `storage.s3Endpoint`.
    pub fn open(&self, uri: &str, endpoint: Option<&str>) -> Result<Location, CheckpointError> {
        let name = uri
            .trim_end_matches('/')
            .rsplit('/')
            .next()
            .unwrap_or_default()
            .to_string();
        if is_volume_path(uri) {
            let dir = uri.strip_prefix("file://").unwrap_or(uri);
            let store = LocalFileSystem::new_with_prefix(dir).map_err(|e| storage_error(uri, e))?;
            return Ok(Location {
                store: Arc::new(store),
                prefix: Path::default(),
                name,
            });
        }
        let url = Url::parse(uri).map_err(|e| storage_error(uri, e))?;
        let (scheme, path) = ObjectStoreScheme::parse(&url).map_err(|e| storage_error(uri, e))?;
        let bucket = url.host_str().unwrap_or_default().to_string();
        let key = (
            format!("{}://{bucket}", url.scheme()),
            endpoint.map(str::to_string),
        );
        let store = {
            let mut clients = self
                .clients
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            match clients.get(&key) {
                Some(store) => store.clone(),
                None => {
                    let store = self.client(scheme, &bucket, endpoint, uri)?;
                    clients.insert(key, store.clone());
                    store
                }
            }
        };
        Ok(Location {
            store,
            prefix: path,
            name,
        })
    }

    fn client(
        &self,
        scheme: ObjectStoreScheme,
        bucket: &str,
        endpoint: Option<&str>,
        uri: &str,
    ) -> Result<Arc<dyn ObjectStore>, CheckpointError> {
        let timeout = format!("{}s", self.settings.storage_timeout_seconds.max(1));
        let connect_timeout = format!("{}s", self.settings.storage_timeout_seconds.clamp(1, 5));
        // A few quick retries, no more: a longer outage is waited out by
        // handling the message again, not inside one request.
        let retry = RetryConfig {
            max_retries: 2,
            retry_timeout: std::time::Duration::from_secs(
                self.settings.storage_timeout_seconds.max(1),
            ),
            ..RetryConfig::default()
        };
        Ok(match scheme {
            ObjectStoreScheme::AmazonS3 => {
                let mut builder = AmazonS3Builder::from_env()
                    .with_bucket_name(bucket)
                    .with_retry(retry)
                    .with_config(
                        AmazonS3ConfigKey::Client(ClientConfigKey::Timeout),
                        &timeout,
                    )
                    .with_config(
                        AmazonS3ConfigKey::Client(ClientConfigKey::ConnectTimeout),
                        &connect_timeout,
                    );
                if let Some(endpoint) = endpoint.or(self.settings.s3_endpoint.as_deref()) {
                    builder = builder
                        .with_endpoint(endpoint)
                        .with_allow_http(endpoint.starts_with("http://"));
                }
                if let Some(region) = &self.settings.s3_region {
                    builder = builder.with_region(region);
                }
                if let (Some(id), Some(secret)) = (
                    &self.settings.s3_access_key_id,
                    &self.settings.s3_secret_access_key,
                ) {
                    builder = builder
                        .with_access_key_id(id)
                        .with_secret_access_key(secret);
                }
                Arc::new(builder.build().map_err(|e| storage_error(uri, e))?)
            }
            ObjectStoreScheme::GoogleCloudStorage => Arc::new(
                GoogleCloudStorageBuilder::from_env()
                    .with_bucket_name(bucket)
                    .with_retry(retry)
                    .with_config(GoogleConfigKey::Client(ClientConfigKey::Timeout), &timeout)
                    .with_config(
                        GoogleConfigKey::Client(ClientConfigKey::ConnectTimeout),
                        &connect_timeout,
                    )
                    .build()
                    .map_err(|e| storage_error(uri, e))?,
            ),
            ObjectStoreScheme::MicrosoftAzure => Arc::new(
                MicrosoftAzureBuilder::from_env()
                    .with_container_name(bucket)
                    .with_retry(retry)
                    .with_config(AzureConfigKey::Client(ClientConfigKey::Timeout), &timeout)
                    .with_config(
                        AzureConfigKey::Client(ClientConfigKey::ConnectTimeout),
                        &connect_timeout,
                    )
                    .build()
                    .map_err(|e| storage_error(uri, e))?,
            ),
            other => {
                return Err(storage_error(
                    uri,
                    format!(
                        "{other:?} storage is not supported; use s3://, gs://, az:// or a volume path"
                    ),
                ));
            }
        })
    }
}

/// A volume path (absolute, or `file://`) rather than an object-store URI.
pub fn is_volume_path(uri: &str) -> bool {
    uri.starts_with('/') || uri.starts_with("file://")
}

impl Location {
    fn path(&self, relative: &str) -> Path {
        let mut path = self.prefix.clone();
        for part in relative.split('/') {
            path = path.child(part);
        }
        path
    }

    /// Relative path → size of everything under the checkpoint.
    pub async fn list(&self) -> Result<Listing, CheckpointError> {
        let prefix = self.prefix.as_ref().to_string();
        let prefix_ref = (!prefix.is_empty()).then_some(&self.prefix);
        let mut listing = BTreeMap::new();
        let mut objects = self.store.list(prefix_ref);
        while let Some(object) = objects.next().await {
            let object = match object {
                Ok(object) => object,
                Err(object_store::Error::NotFound { .. }) => break,
                Err(err) => return Err(request_error(format_args!("list {prefix}"), &err)),
            };
            let location = object.location.as_ref();
            let relative = location
                .strip_prefix(prefix.as_str())
                .unwrap_or(location)
                .trim_start_matches('/');
            listing.insert(relative.to_string(), object.size);
        }
        Ok(listing)
    }

    async fn read(&self, relative: &str) -> Result<bytes::Bytes, CheckpointError> {
        let path = self.path(relative);
        let got = self
            .store
            .get(&path)
            .await
            .map_err(|e| request_error(format_args!("read {path}"), &e))?;
        got.bytes()
            .await
            .map_err(|e| request_error(format_args!("read {path}"), &e))
    }

    async fn sha256(&self, relative: &str) -> Result<String, CheckpointError> {
        let path = self.path(relative);
        let got = self
            .store
            .get(&path)
            .await
            .map_err(|e| request_error(format_args!("read {path}"), &e))?;
        let mut stream = got.into_stream();
        let mut hasher = Sha256::new();
        while let Some(chunk) = stream
            .try_next()
            .await
            .map_err(|e| request_error(format_args!("read {path}"), &e))?
        {
            hasher.update(&chunk);
        }
        Ok(format!("{:x}", hasher.finalize()))
    }

    /// Checks the checkpoint against its completion marker (and checksums).
    pub async fn verify(
        &self,
        expected: Expected,
        checksums: bool,
    ) -> Result<Verification, CheckpointError> {
        let listing = self.list().await?;
        let manifest = if listing.contains_key(MANIFEST_FILE) {
            match Manifest::parse(&self.read(MANIFEST_FILE).await?) {
                Ok(manifest) => Some(manifest),
                Err(err) => {
                    return Ok(Verification::Incomplete {
                        reason: err.to_string(),
                    });
                }
            }
        } else {
            None
        };
        let digests = match (&manifest, checksums) {
            (Some(manifest), true) => {
                let mut digests = BTreeMap::new();
                for file in verify::files_to_hash(manifest, &listing) {
                    digests.insert(file.to_string(), self.sha256(file).await?);
                }
                Some(digests)
            }
            _ => None,
        };
        Ok(verify::judge(
            &self.name,
            &listing,
            manifest.as_ref(),
            digests.as_ref(),
            expected,
        ))
    }

    /// Deletes every object under the checkpoint.
    pub async fn delete_all(&self) -> Result<usize, CheckpointError> {
        let listing = self.list().await?;
        for relative in listing.keys() {
            let path = self.path(relative);
            match self.store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(err) => return Err(request_error(format_args!("delete {path}"), &err)),
            }
        }
        Ok(listing.len())
    }
}
