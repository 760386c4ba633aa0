//! TLS to NATS: a client that trusts the installation's CA connects; one that
//! does not is refused.

use trainyard_runtime::nats::authenticate;
use trainyard_runtime::settings::NatsSettings;
use trainyard_testkit::{NatsServer, TestCertificates};

#[tokio::test]
async fn a_client_without_the_ca_is_refused() {
    // The plain client below connects before the runtime has picked a
    // provider, and the workspace links both of rustls's.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let certificates = TestCertificates::generate("trainyard-test-ca");
    let nats = NatsServer::start_with_config(&certificates.nats_tls_block(false), &[]);

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
        tls_ca_file: Some(certificates.ca().display().to_string()),
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
