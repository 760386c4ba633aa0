//! How storage failures are told apart, against real sockets: a refused
//! connection and a server answering 503 are outages (waited out); a server
//! answering 403 is a refusal (retried, then dead-lettered with its answer).

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use trainyard_checkpoint_manager::storage::Storage;
use trainyard_checkpoint_manager::{CheckpointError, StorageSettings};

/// An HTTP server on loopback answering every request with `status`.
async fn answering(status: &'static str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = listener.local_addr().expect("address");
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = Vec::new();
                let mut buffer = [0u8; 4096];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buffer).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buffer[..n]),
                    }
                }
                let response =
                    format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n");
                let _ = socket.write_all(response.as_bytes()).await;
            });
        }
    });
    format!("http://{address}")
}

async fn list_through(endpoint: &str) -> Result<(), CheckpointError> {
    let storage = Storage::new(StorageSettings {
        s3_region: Some("us-east-1".into()),
        s3_access_key_id: Some("test".into()),
        s3_secret_access_key: Some("test".into()),
        storage_timeout_seconds: 2,
        ..StorageSettings::default()
    });
    let location = storage.open("s3://bucket/ml/bert/step-100", Some(endpoint))?;
    location.list().await.map(|_| ())
}

#[tokio::test]
async fn a_refused_connection_is_an_outage() {
    let port = trainyard_testkit::free_port();
    let err = list_through(&format!("http://127.0.0.1:{port}"))
        .await
        .expect_err("nothing listens");
    assert!(
        matches!(err, CheckpointError::StorageUnavailable(_)),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_server_error_is_an_outage() {
    let endpoint = answering("503 Service Unavailable").await;
    let err = list_through(&endpoint).await.expect_err("503");
    assert!(
        matches!(err, CheckpointError::StorageUnavailable(_)),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_forbidden_answer_is_a_refusal_not_an_outage() {
    let endpoint = answering("403 Forbidden").await;
    let err = list_through(&endpoint).await.expect_err("403");
    assert!(matches!(err, CheckpointError::Storage(_)), "{err:?}");
}
