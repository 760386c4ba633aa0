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
use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::local::LocalFileSystem;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreScheme};
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
        Ok(match scheme {
            ObjectStoreScheme::AmazonS3 => {
                let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
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
                    .build()
                    .map_err(|e| storage_error(uri, e))?,
            ),
            ObjectStoreScheme::MicrosoftAzure => Arc::new(
                MicrosoftAzureBuilder::from_env()
                    .with_container_name(bucket)
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
                Err(err) => return Err(CheckpointError::Storage(format!("list {prefix}: {err}"))),
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
            .map_err(|e| CheckpointError::Storage(format!("read {path}: {e}")))?;
        got.bytes()
            .await
            .map_err(|e| CheckpointError::Storage(format!("read {path}: {e}")))
    }

    async fn sha256(&self, relative: &str) -> Result<String, CheckpointError> {
        let path = self.path(relative);
        let got = self
            .store
            .get(&path)
            .await
            .map_err(|e| CheckpointError::Storage(format!("read {path}: {e}")))?;
        let mut stream = got.into_stream();
        let mut hasher = Sha256::new();
        while let Some(chunk) = stream
            .try_next()
            .await
            .map_err(|e| CheckpointError::Storage(format!("read {path}: {e}")))?
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
                Err(err) => return Err(CheckpointError::Storage(format!("delete {path}: {err}"))),
            }
        }
        Ok(listing.len())
    }
}
