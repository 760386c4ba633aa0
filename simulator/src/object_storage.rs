//! The `s3/` part of the checkpoint root served as an S3-compatible endpoint
//! at `/s3` on the API server's address, so the checkpoint-manager reads and
//! deletes the simulated workers' object-store checkpoints through its real S3
//! client (`checkpoint_manager.s3_endpoint = http://<address>/s3`, path-style).
//!
//! Only what reading and deleting checkpoints takes: `ListObjectsV2` (by
//! prefix, one page), `GetObject`, `HeadObject` and `DeleteObject`. Requests
//! are not authenticated (any signature is accepted), and nothing is written
//! through it: the simulated workers write the files.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path as UrlPath, Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use chrono::{DateTime, SecondsFormat, Utc};
use serde::Deserialize;

use crate::checkpoints::CheckpointStorage;

#[derive(Clone)]
struct Buckets {
    /// `<checkpoint root>/s3`: one directory per bucket.
    root: Arc<PathBuf>,
}

/// The routes under `/s3`.
pub fn router(storage: &CheckpointStorage) -> Router {
    Router::new()
        .route("/s3/{bucket}", get(list))
        .route(
            "/s3/{bucket}/{*key}",
            get(get_object).head(get_object).delete(delete_object),
        )
        .with_state(Buckets {
            root: Arc::new(storage.root().join("s3")),
        })
}

#[derive(Deserialize)]
struct ListQuery {
    #[serde(default)]
    prefix: String,
}

fn plain(segment: &str) -> bool {
    !segment.is_empty() && segment != "." && segment != ".."
}

impl Buckets {
    /// The file of `bucket`/`key`; None for names that would leave the bucket.
    fn object_path(&self, bucket: &str, key: &str) -> Option<PathBuf> {
        if !plain(bucket) || !key.split('/').all(plain) {
            return None;
        }
        Some(
            key.split('/')
                .fold(self.root.join(bucket), |p, s| p.join(s)),
        )
    }
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{code}</Code><Message>{}</Message></Error>",
        xml_escape(message)
    );
    (status, [(header::CONTENT_TYPE, "application/xml")], body).into_response()
}

fn xml_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Every file under `dir`, as `/`-separated keys relative to `base`.
fn walk(base: &Path, dir: &Path, out: &mut Vec<(String, fs::Metadata)>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(meta) = entry.metadata() else {
            continue;
        };
        if meta.is_dir() {
            walk(base, &path, out);
        } else if let Ok(relative) = path.strip_prefix(base) {
            let key: Vec<String> = relative
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            out.push((key.join("/"), meta));
        }
    }
}

fn modified(meta: &fs::Metadata) -> DateTime<Utc> {
    meta.modified()
        .map(DateTime::<Utc>::from)
        .unwrap_or_default()
}

fn etag(meta: &fs::Metadata) -> String {
    format!(
        "\"{:x}-{:x}\"",
        meta.len(),
        modified(meta).timestamp_nanos_opt().unwrap_or_default()
    )
}

async fn list(
    State(buckets): State<Buckets>,
    UrlPath(bucket): UrlPath<String>,
    Query(query): Query<ListQuery>,
) -> Response {
    if !plain(&bucket) {
        return error(StatusCode::BAD_REQUEST, "InvalidBucketName", &bucket);
    }
    let base = buckets.root.join(&bucket);
    let mut objects = Vec::new();
    walk(&base, &base, &mut objects);
    objects.retain(|(key, _)| key.starts_with(&query.prefix));
    objects.sort_by(|a, b| a.0.cmp(&b.0));
    let contents: String = objects
        .iter()
        .map(|(key, meta)| {
            format!(
                "<Contents><Key>{}</Key><LastModified>{}</LastModified><ETag>{}</ETag><Size>{}</Size><StorageClass>STANDARD</StorageClass></Contents>",
                xml_escape(key),
                modified(meta).to_rfc3339_opts(SecondsFormat::Millis, true),
                xml_escape(&etag(meta)),
                meta.len()
            )
        })
        .collect();
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>{}</Name><Prefix>{}</Prefix><KeyCount>{}</KeyCount><MaxKeys>1000</MaxKeys><IsTruncated>false</IsTruncated>{contents}</ListBucketResult>",
        xml_escape(&bucket),
        xml_escape(&query.prefix),
        objects.len()
    );
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/xml")],
        body,
    )
        .into_response()
}

async fn get_object(
    method: Method,
    State(buckets): State<Buckets>,
    UrlPath((bucket, key)): UrlPath<(String, String)>,
) -> Response {
    let Some(path) = buckets.object_path(&bucket, &key) else {
        return error(StatusCode::BAD_REQUEST, "InvalidArgument", &key);
    };
    let (meta, data) = match (fs::metadata(&path), fs::read(&path)) {
        (Ok(meta), Ok(data)) if meta.is_file() => (meta, data),
        _ => return error(StatusCode::NOT_FOUND, "NoSuchKey", &key),
    };
    let mut headers = HeaderMap::new();
    let values = [
        (header::CONTENT_LENGTH, data.len().to_string()),
        (
            header::LAST_MODIFIED,
            modified(&meta)
                .format("%a, %d %b %Y %H:%M:%S GMT")
                .to_string(),
        ),
        (header::ETAG, etag(&meta)),
        (header::CONTENT_TYPE, "application/octet-stream".to_owned()),
    ];
    for (name, value) in values {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(name, value);
        }
    }
    let body = if method == Method::HEAD {
        Body::empty()
    } else {
        Body::from(data)
    };
    (StatusCode::OK, headers, body).into_response()
}

async fn delete_object(
    State(buckets): State<Buckets>,
    UrlPath((bucket, key)): UrlPath<(String, String)>,
) -> Response {
    let Some(path) = buckets.object_path(&bucket, &key) else {
        return error(StatusCode::BAD_REQUEST, "InvalidArgument", &key);
    };
    match fs::remove_file(&path) {
        Ok(()) => {
            // Object stores have no directories: the ones a deletion empties go too.
            let bucket_dir = buckets.root.join(&bucket);
            let mut dir = path.parent();
            while let Some(d) = dir {
                if d == bucket_dir || fs::remove_dir(d).is_err() {
                    break;
                }
                dir = d.parent();
            }
            StatusCode::NO_CONTENT.into_response()
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            StatusCode::NO_CONTENT.into_response()
        }
        Err(err) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "InternalError",
            &err.to_string(),
        ),
    }
}
