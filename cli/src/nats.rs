//! Connecting to NATS as the operator: the commands that read streams and
//! buckets (`deadletter`, `cost --since`, `notifications`) share these flags
//! and the services' rules for credentials and TLS.

use crate::cli::NatsArgs;
use crate::error::CliError;
use trainyard_contracts::permissions::Identity;

/// Connects with the credentials and TLS settings of `args`, failing at once
/// (no retries) with an error that names the server and what went wrong.
pub async fn connect(args: &NatsArgs) -> Result<async_nats::Client, CliError> {
    let url = args.nats_url.as_str();
    let options = options(args).await?;
    options
        .connect(trainyard_runtime::nats::servers(url))
        .await
        .map_err(|err| {
        let text = err.to_string();
        let untrusted = text.contains("UnknownIssuer");
        let hint = match &args.nats_tls_ca {
            None if untrusted || text.contains("tls") => {
                " (the server wants TLS with a certificate of its own CA: give the CA with --nats-tls-ca)".to_string()
            }
            Some(ca) if untrusted => format!(
                " (the server's certificate is not signed by --nats-tls-ca {})",
                ca.display()
            ),
            _ => String::new(),
        };
        CliError::Nats(format!("cannot connect to NATS on {url}: {text}{hint}"))
    })
}

/// The connect options `args` ask for.
async fn options(args: &NatsArgs) -> Result<async_nats::ConnectOptions, CliError> {
    let read = |path: &std::path::Path, source| CliError::Read {
        path: path.to_path_buf(),
        source,
    };
    // The operator may subscribe anywhere, but its replies still come under its
    // own prefix, as deploy/nats/auth.conf expects of every identity.
    let mut options = async_nats::ConnectOptions::new()
        .name("trainyard-cli")
        .custom_inbox_prefix(Identity::Operator.inbox_prefix());
    if let Some(path) = &args.nats_creds {
        options = options
            .credentials_file(path)
            .await
            .map_err(|source| read(path, source))?;
    }
    match (&args.nats_user, &args.nats_password_file) {
        (Some(user), Some(path)) => {
            let password = std::fs::read_to_string(path).map_err(|source| read(path, source))?;
            options = options.user_and_password(user.clone(), password.trim_end().to_string());
        }
        (None, None) => {}
        _ => {
            return Err(CliError::Usage(
                "--nats-user and --nats-password-file go together: give both or neither".into(),
            ));
        }
    }
    if args.nats_tls_ca.is_some() || args.nats_tls_cert.is_some() {
        // kube links aws-lc-rs and async-nats ring; rustls needs a process
        // default to choose. An error only means one is installed already.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    if let Some(ca) = &args.nats_tls_ca {
        if !ca.is_file() {
            return Err(read(
                ca,
                std::io::Error::new(std::io::ErrorKind::NotFound, "no such CA file"),
            ));
        }
        options = options.require_tls(true).add_root_certificates(ca.clone());
    }
    match (&args.nats_tls_cert, &args.nats_tls_key) {
        (Some(cert), Some(key)) => {
            options = options.add_client_certificate(cert.clone(), key.clone());
        }
        (None, None) => {}
        _ => {
            return Err(CliError::Usage(
                "--nats-tls-cert and --nats-tls-key go together: give both or neither".into(),
            ));
        }
    }
    Ok(options)
}
