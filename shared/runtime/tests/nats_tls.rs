//! TLS to NATS: a client that trusts the installation's CA connects; one that
//! does not is refused. Certificates are made here with the `openssl` command.

use std::path::Path;
use std::process::Command;

use trainyard_runtime::nats::authenticate;
use trainyard_runtime::settings::NatsSettings;
use trainyard_testkit::NatsServer;

fn openssl(dir: &Path, args: &[&str]) {
    let status = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl on PATH (scripts/lib/deps.sh ensure_openssl)");
    assert!(
        status.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&status.stderr)
    );
}

/// A CA and a server certificate for 127.0.0.1 signed by it.
fn certificates(dir: &Path) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=trainyard-test-ca",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ],
    );
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=nats",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ],
    );
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .expect("write extensions");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            "san.ext",
            "-out",
            "server.pem",
        ],
    );
}

#[tokio::test]
async fn a_client_without_the_ca_is_refused() {
    // The plain client below connects before the runtime has picked a
    // provider, and the workspace links both of rustls's.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().expect("temp dir");
    certificates(dir.path());
    let path = |name: &str| dir.path().join(name).display().to_string();
    let nats = NatsServer::start_with_config(
        &format!(
            "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n}}\n",
            path("server.pem"),
            path("server.key")
        ),
        &[],
    );

    let without_ca = async_nats::ConnectOptions::new()
        .require_tls(true)
        .connect(nats.url())
        .await;
    assert!(
        without_ca.is_err(),
        "a client that does not trust the CA is refused"
    );

    let settings = NatsSettings {
        url: nats.url(),
        tls_ca_file: Some(path("ca.pem")),
        ..Default::default()
    };
    let client = authenticate(async_nats::ConnectOptions::new(), &settings)
        .await
        .expect("options")
        .connect(nats.url())
        .await
        .expect("a client with the CA connects");
    client
        .publish("trainyard.probe", "tls".into())
        .await
        .expect("publishes");
    client.flush().await.expect("flushes over TLS");
}
