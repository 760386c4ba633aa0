//! The commands that read NATS, against a real nats-server that wants TLS
//! (and a password, or a client certificate): with the installation's CA they
//! connect; without it, or with another CA, they are refused with an error that
//! names the server and the flag to give.

use clap::Parser;
use trainyard_cli::cli::Cli;
use trainyard_cli::error::CliError;
use trainyard_contracts::streams;
use trainyard_runtime::nats::{authenticate, provision_streams};
use trainyard_runtime::settings::NatsSettings;
use trainyard_testkit::{NatsServer, TestCertificates};

async fn trainyard(args: &[String]) -> (String, Result<(), CliError>) {
    let cli = Cli::try_parse_from(std::iter::once("trainyard".to_string()).chain(args.to_vec()))
        .expect("arguments parse");
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let no_cluster = async || -> Result<kube::Client, CliError> {
        panic!("reading NATS needs no Kubernetes API")
    };
    let result = trainyard_cli::run(cli, no_cluster, &mut out, &mut err).await;
    (String::from_utf8(out).expect("utf-8"), result)
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_string()).collect()
}

fn path(path: std::path::PathBuf) -> String {
    path.display().to_string()
}

/// Creates the dead-letter stream as a service would, over TLS.
async fn provision_dead_letters(settings: &NatsSettings) {
    let client = authenticate(async_nats::ConnectOptions::new(), settings)
        .await
        .expect("options")
        .connect(settings.url.as_str())
        .await
        .expect("the test connects with the CA");
    provision_streams(
        &async_nats::jetstream::new(client),
        &[streams::DEAD_LETTER],
        settings,
    )
    .await
    .expect("dead-letter stream");
}

#[tokio::test]
async fn deadletter_over_tls_connects_with_the_ca_and_is_refused_without_it() {
    let certificates = TestCertificates::generate("trainyard-test-ca");
    let other = TestCertificates::generate("some-other-ca");
    let secrets = tempfile::tempdir().expect("temp dir");
    let password_file = secrets.path().join("operator-password");
    std::fs::write(&password_file, "operator-secret\n").expect("write password");
    let nats = NatsServer::start_with_config(
        &format!(
            "{}authorization {{\n  users: [ {{ user: operator, password: operator-secret }} ]\n}}\n",
            certificates.nats_tls_block(false)
        ),
        &[],
    );
    let url = nats.url();
    provision_dead_letters(&NatsSettings {
        url: url.clone(),
        user: Some("operator".into()),
        password_file: Some(path(password_file.clone())),
        tls_ca_file: Some(path(certificates.ca())),
        ..Default::default()
    })
    .await;
    let operator = [
        "--nats-url",
        &url,
        "--nats-user",
        "operator",
        "--nats-password-file",
    ];
    let password_file = path(password_file);

    let (out, result) = trainyard(&args(
        &[
            &["deadletter", "list"][..],
            &operator,
            &[&password_file, "--nats-tls-ca", &path(certificates.ca())],
        ]
        .concat(),
    ))
    .await;
    result.expect("with the CA, the listing is read over TLS");
    assert!(out.is_empty(), "no dead letters yet: {out}");

    let (_, result) = trainyard(&args(
        &[&["deadletter", "list"][..], &operator, &[&password_file]].concat(),
    ))
    .await;
    match result {
        Err(CliError::Nats(message)) => {
            assert!(
                message.starts_with(&format!("cannot connect to NATS on {url}: ")),
                "{message}"
            );
            assert!(message.contains("--nats-tls-ca"), "{message}");
        }
        other => panic!("without the CA the server is not trusted: {other:?}"),
    }

    let (_, result) = trainyard(&args(
        &[
            &["deadletter", "list"][..],
            &operator,
            &[&password_file, "--nats-tls-ca", &path(other.ca())],
        ]
        .concat(),
    ))
    .await;
    assert!(
        matches!(&result, Err(CliError::Nats(m))
            if m.contains(&url) && m.contains("not signed by --nats-tls-ca")),
        "a server whose certificate another CA signed is refused: {result:?}"
    );
}

#[tokio::test]
async fn a_server_that_verifies_clients_takes_the_cli_certificate() {
    let certificates = TestCertificates::generate("trainyard-test-ca");
    let nats = NatsServer::start_with_config(&certificates.nats_tls_block(true), &[]);
    let url = nats.url();
    provision_dead_letters(&NatsSettings {
        url: url.clone(),
        tls_ca_file: Some(path(certificates.ca())),
        tls_cert_file: Some(path(certificates.client_cert())),
        tls_key_file: Some(path(certificates.client_key())),
        ..Default::default()
    })
    .await;
    let ca = path(certificates.ca());
    let (cert, key) = (
        path(certificates.client_cert()),
        path(certificates.client_key()),
    );

    let (_, result) = trainyard(&args(&[
        "notifications",
        "--nats-url",
        &url,
        "--nats-tls-ca",
        &ca,
    ]))
    .await;
    assert!(
        matches!(&result, Err(CliError::Nats(m))
            if m.starts_with(&format!("cannot connect to NATS on {url}: "))),
        "without a client certificate the server hangs up: {result:?}"
    );

    let (_, result) = trainyard(&args(&[
        "deadletter",
        "list",
        "--nats-url",
        &url,
        "--nats-tls-ca",
        &ca,
        "--nats-tls-cert",
        &cert,
        "--nats-tls-key",
        &key,
    ]))
    .await;
    result.expect("with the client certificate the listing is read");

    let (_, result) = trainyard(&args(&[
        "deadletter",
        "list",
        "--nats-url",
        &url,
        "--nats-tls-ca",
        &ca,
        "--nats-tls-cert",
        &cert,
    ]))
    .await;
    assert!(
        matches!(&result, Err(CliError::Usage(m))
            if m == "--nats-tls-cert and --nats-tls-key go together: give both or neither"),
        "{result:?}"
    );
}
