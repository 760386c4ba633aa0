//! The client against an https server that wants a credential on every
//! request, as hosted MLflow does: requests carry the bearer token (or the
//! basic-auth pair) read from its file; a wrong token is refused by the
//! server; a server whose certificate another CA signed is refused by the
//! client before anything is sent.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_util::sync::CancellationToken;
use trainyard_mlflow::{MlflowAccess, MlflowClient, MlflowEnv, MlflowError, RetryPolicy};
use trainyard_testkit::TestCertificates;

/// A one-route MLflow over TLS: `experiments/get-by-name` answers when the
/// request's `Authorization` header is `expected`, else 401. Records the
/// `Authorization` header of every request it reads.
struct HttpsMlflow {
    url: String,
    authorizations: Arc<Mutex<Vec<String>>>,
    expected: Arc<Mutex<String>>,
    stop: CancellationToken,
}

impl Drop for HttpsMlflow {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl HttpsMlflow {
    async fn start(certificates: &TestCertificates, expected: &str) -> Self {
        let chain: Vec<CertificateDer<'static>> =
            CertificateDer::pem_file_iter(certificates.server_cert())
                .expect("server certificate")
                .collect::<Result<_, _>>()
                .expect("PEM");
        let key = PrivateKeyDer::from_pem_file(certificates.server_key()).expect("server key");
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .expect("server TLS config");
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let port = listener.local_addr().expect("address").port();
        let authorizations = Arc::new(Mutex::new(Vec::new()));
        let stop = CancellationToken::new();
        let expected = Arc::new(Mutex::new(expected.to_string()));
        let (seen, wanted, stopped) = (authorizations.clone(), expected.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let (tcp, _) = tokio::select! {
                    _ = stopped.cancelled() => return,
                    accepted = listener.accept() => match accepted {
                        Ok(accepted) => accepted,
                        Err(_) => return,
                    },
                };
                let (acceptor, seen, wanted) = (acceptor.clone(), seen.clone(), wanted.clone());
                tokio::spawn(async move {
                    // A client that does not trust the certificate hangs up here.
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let Some(authorization) = read_head(&mut tls).await else {
                        return;
                    };
                    seen.lock().expect("lock").push(authorization.clone());
                    let accepted = authorization == *wanted.lock().expect("lock");
                    let (status, body) = if accepted {
                        (
                            "200 OK",
                            r#"{"experiment":{"experiment_id":"7","name":"bert","lifecycle_stage":"active"}}"#,
                        )
                    } else {
                        (
                            "401 Unauthorized",
                            r#"{"error_code":"UNAUTHENTICATED","message":"a valid token is required"}"#,
                        )
                    };
                    let response = format!(
                        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = tls.write_all(response.as_bytes()).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        Self {
            url: format!("https://localhost:{port}"),
            authorizations,
            expected,
            stop,
        }
    }

    fn authorizations(&self) -> Vec<String> {
        self.authorizations.lock().expect("lock").clone()
    }

    /// From now on only `authorization` is accepted (the credential rotated).
    fn accept_only(&self, authorization: &str) {
        *self.expected.lock().expect("lock") = authorization.to_string();
    }
}

/// Reads a request head (a GET has no body) and returns its `Authorization`
/// header, empty when there is none.
async fn read_head(stream: &mut (impl AsyncReadExt + Unpin)) -> Option<String> {
    let mut head = Vec::new();
    let mut buffer = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let read = stream.read(&mut buffer).await.ok()?;
        if read == 0 {
            return None;
        }
        head.extend_from_slice(&buffer[..read]);
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    Some(
        text.lines()
            .find_map(|line| {
                let (name, value) = line.split_once(':')?;
                name.eq_ignore_ascii_case("authorization")
                    .then(|| value.trim().to_string())
            })
            .unwrap_or_default(),
    )
}

fn client(url: &str, access: &MlflowAccess) -> MlflowClient {
    MlflowClient::with_access(
        url,
        access,
        Duration::from_secs(5),
        RetryPolicy {
            max_attempts: 1,
            ..RetryPolicy::default()
        },
        CancellationToken::new(),
    )
    .expect("client")
}

fn secret(dir: &Path, name: &str, value: &str) -> std::path::PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, value).expect("write secret");
    path
}

#[tokio::test]
async fn requests_over_https_carry_the_token_from_its_file() {
    let certificates = TestCertificates::generate("mlflow-test-ca");
    let server = HttpsMlflow::start(&certificates, "Bearer t0ken-from-a-secret").await;
    let dir = tempfile::tempdir().expect("temp dir");
    let access = MlflowAccess {
        token_file: Some(secret(dir.path(), "token", "t0ken-from-a-secret\n")),
        tls_ca_file: Some(certificates.ca()),
        ..Default::default()
    };

    let experiment = client(&server.url, &access)
        .experiment_by_name("bert")
        .await
        .expect("the server takes the token")
        .expect("found");
    assert_eq!(experiment.experiment_id, "7");
    assert_eq!(server.authorizations(), ["Bearer t0ken-from-a-secret"]);

    let wrong = MlflowAccess {
        token_file: Some(secret(dir.path(), "old-token", "expired")),
        ..access
    };
    let err = client(&server.url, &wrong)
        .experiment_by_name("bert")
        .await
        .expect_err("a wrong token is refused");
    assert!(
        matches!(&err, MlflowError::Api { status: 401, error_code, .. } if error_code == "UNAUTHENTICATED"),
        "{err}"
    );
    assert!(!err.is_retryable(), "retrying cannot fix a wrong token");
}

#[tokio::test]
async fn requests_over_https_carry_basic_auth_from_the_password_file() {
    let certificates = TestCertificates::generate("mlflow-test-ca");
    let server = HttpsMlflow::start(&certificates, "Basic bWwtdHJhY2tlcjpzM2NyZXQ=").await;
    let dir = tempfile::tempdir().expect("temp dir");
    let access = MlflowAccess {
        username: Some("ml-tracker".into()),
        password_file: Some(secret(dir.path(), "password", "s3cret\n")),
        tls_ca_file: Some(certificates.ca()),
        ..Default::default()
    };
    client(&server.url, &access)
        .experiment_by_name("bert")
        .await
        .expect("the server takes the user and password")
        .expect("found");
    assert_eq!(server.authorizations(), ["Basic bWwtdHJhY2tlcjpzM2NyZXQ="]);
}

#[tokio::test]
async fn a_server_another_ca_signed_is_refused_before_the_token_is_sent() {
    let certificates = TestCertificates::generate("mlflow-test-ca");
    let other = TestCertificates::generate("some-other-ca");
    let server = HttpsMlflow::start(&certificates, "Bearer t0ken").await;
    let dir = tempfile::tempdir().expect("temp dir");
    let token_file = secret(dir.path(), "token", "t0ken");

    for (trusting, access) in [
        (
            "another CA",
            MlflowAccess {
                token_file: Some(token_file.clone()),
                tls_ca_file: Some(other.ca()),
                ..Default::default()
            },
        ),
        (
            "the system's roots",
            MlflowAccess {
                token_file: Some(token_file.clone()),
                ..Default::default()
            },
        ),
    ] {
        let err = client(&server.url, &access)
            .experiment_by_name("bert")
            .await
            .expect_err("refused");
        assert!(
            matches!(&err, MlflowError::Transport { message, .. } if message.contains("certificate")),
            "trusting {trusting}: {err}"
        );
    }
    assert!(
        server.authorizations().is_empty(),
        "no request reached the server"
    );
}

/// Replaces `path` the way the kubelet updates a mounted Secret: a new file
/// renamed over the old.
fn rotate(path: &Path, value: &str) {
    let next = path.with_extension("next");
    std::fs::write(&next, value).expect("write the new secret");
    std::fs::rename(&next, path).expect("swap it in");
}

#[tokio::test]
async fn a_rotated_token_file_is_used_without_a_new_client() {
    let certificates = TestCertificates::generate("mlflow-test-ca");
    let server = HttpsMlflow::start(&certificates, "Bearer first-token").await;
    let dir = tempfile::tempdir().expect("temp dir");
    let token = secret(dir.path(), "token", "first-token\n");
    let client = client(
        &server.url,
        &MlflowAccess {
            token_file: Some(token.clone()),
            tls_ca_file: Some(certificates.ca()),
            ..Default::default()
        },
    );
    client
        .experiment_by_name("bert")
        .await
        .expect("the first token is taken");

    server.accept_only("Bearer second-token-after-rotation");
    rotate(&token, "second-token-after-rotation\n");
    client
        .experiment_by_name("bert")
        .await
        .expect("the same client sends the rotated token");

    // A file caught empty mid-rotation keeps the last token in use.
    rotate(&token, "");
    client
        .experiment_by_name("bert")
        .await
        .expect("an empty file does not replace the token");
    assert_eq!(
        server.authorizations(),
        [
            "Bearer first-token",
            "Bearer second-token-after-rotation",
            "Bearer second-token-after-rotation"
        ]
    );
}

#[tokio::test]
async fn a_rotated_password_file_is_used_without_a_new_client() {
    let certificates = TestCertificates::generate("mlflow-test-ca");
    // ml-tracker:old and ml-tracker:new
    let server = HttpsMlflow::start(&certificates, "Basic bWwtdHJhY2tlcjpvbGQ=").await;
    let dir = tempfile::tempdir().expect("temp dir");
    let password = secret(dir.path(), "password", "old");
    let client = client(
        &server.url,
        &MlflowAccess {
            username: Some("ml-tracker".into()),
            password_file: Some(password.clone()),
            tls_ca_file: Some(certificates.ca()),
            ..Default::default()
        },
    );
    client
        .experiment_by_name("bert")
        .await
        .expect("old password");
    server.accept_only("Basic bWwtdHJhY2tlcjpuZXc=");
    rotate(&password, "new");
    client
        .experiment_by_name("bert")
        .await
        .expect("the rotated password is sent");
}

#[tokio::test]
async fn mlflow_variables_give_the_token_and_the_ca_when_no_key_does() {
    let certificates = TestCertificates::generate("mlflow-test-ca");
    let server = HttpsMlflow::start(&certificates, "Bearer from-the-environment").await;
    let ca = certificates.ca().display().to_string();
    let env = MlflowEnv::from_lookup(|name| match name {
        "MLFLOW_TRACKING_TOKEN" => Some("from-the-environment".into()),
        "MLFLOW_TRACKING_SERVER_CERT_PATH" => Some(ca.clone()),
        _ => None,
    });
    client(
        &server.url,
        &MlflowAccess {
            env,
            ..Default::default()
        },
    )
    .experiment_by_name("bert")
    .await
    .expect("the variables' token and CA work")
    .expect("found");
    assert_eq!(server.authorizations(), ["Bearer from-the-environment"]);
}
