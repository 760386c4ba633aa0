//! The `trainyard` command-line client: apply manifests, watch TrainingJobs and
//! Sweeps, read their workers' logs, and summarise a run, against any Kubernetes API.
//!
//! Parsing, validation, rows, watch logic, the choice of worker pods and the summary
//! are pure functions; `apply::apply_manifests`, `logs::logs` and the `get`,
//! `describe` and `control` modules talk to the cluster.

pub mod apply;
pub mod cli;
pub mod control;
pub mod cost;
pub mod deadletter;
pub mod describe;
pub mod error;
pub mod format;
pub mod get;
pub mod jsonpath;
pub mod logs;
pub mod manifest;
pub mod nats;
pub mod notifications;
pub mod resources;
pub mod summary;
pub mod tensorboard;
pub mod watch;

use std::io::Write;
use std::time::Duration;

use kube::Client;
use trainyard_api::validation::is_dns_label;
use trainyard_api::{Sweep, TrainingJob, TrainingQueue};

use crate::cli::{Cli, ClusterArgs, Command, ResourceKind, ScopeArgs};
use crate::error::CliError;
use crate::get::GetOptions;
use crate::resources::Scope;

/// Connects the way kubectl does: `--kubeconfig`, else KUBECONFIG, then
/// ~/.kube/config, then the in-cluster service account; `--context` picks a
/// context other than the kubeconfig's current one.
pub async fn connect(cluster: &ClusterArgs) -> Result<Client, CliError> {
    if cluster.kubeconfig.is_none() && cluster.context.is_none() {
        return Client::try_default()
            .await
            .map_err(|error| CliError::Connect(Box::new(error)));
    }
    let options = kube::config::KubeConfigOptions {
        context: cluster.context.clone(),
        ..Default::default()
    };
    let config = match &cluster.kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .map_err(|error| CliError::Kubeconfig(Box::new(error)))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &options).await
        }
        None => kube::Config::from_kubeconfig(&options).await,
    }
    .map_err(|error| CliError::Kubeconfig(Box::new(error)))?;
    Client::try_from(config).map_err(|error| CliError::Connect(Box::new(error)))
}

fn checked_namespace(namespace: &str) -> Result<String, CliError> {
    if is_dns_label(namespace) {
        Ok(namespace.to_owned())
    } else {
        Err(CliError::Usage(format!(
            "{namespace:?} is not a valid namespace: use at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit"
        )))
    }
}

/// `-n` / `-A`, falling back to the client's namespace (the kubeconfig context's, or
/// "default"). A bad `-n` is refused before connecting.
async fn connect_in_scope<C>(args: &ScopeArgs, connect: C) -> Result<(Client, Scope), CliError>
where
    C: AsyncFnOnce() -> Result<Client, CliError>,
{
    let flag_namespace = args
        .namespace
        .as_deref()
        .map(checked_namespace)
        .transpose()?;
    let client = connect().await?;
    let scope = match (args.all_namespaces, flag_namespace) {
        (true, _) => Scope::AllNamespaces,
        (false, Some(namespace)) => Scope::Namespace(namespace),
        (false, None) => Scope::Namespace(checked_namespace(client.default_namespace())?),
    };
    Ok((client, scope))
}

/// The program: parse the arguments, run the command, print an error and exit 1 on
/// failure (both binaries, `trainyard` and `kubectl-trainyard`, are this).
pub async fn main() -> std::process::ExitCode {
    let cli = <Cli as clap::Parser>::parse();
    // kube's rustls needs a process-wide crypto provider; an Err only means one is
    // installed already, which is just as good.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    let cluster = cli.cluster.clone();
    let connect = async || connect(&cluster).await;
    match run(cli, connect, &mut stdout.lock(), &mut stderr.lock()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            std::process::ExitCode::from(error.exit_code())
        }
    }
}

/// Runs one parsed command, writing results to `out` and notices (such as "No
/// trainingjobs found") to `err`.
///
/// `connect` is called only once the command's own input is known to be good, so a
/// bad manifest or flag is reported even where no cluster is reachable.
pub async fn run<C>(
    cli: Cli,
    connect: C,
    out: &mut dyn Write,
    err: &mut dyn Write,
) -> Result<(), CliError>
where
    C: AsyncFnOnce() -> Result<Client, CliError>,
{
    match cli.command {
        Command::Apply(args) => {
            let flag_namespace = args
                .namespace
                .as_deref()
                .map(checked_namespace)
                .transpose()?;
            let sources = apply::read_sources(&args.files)?;
            let manifests = apply::validate_sources(&sources)?;
            let client = connect().await?;
            let namespace = match flag_namespace {
                Some(namespace) => namespace,
                None => checked_namespace(client.default_namespace())?,
            };
            apply::apply_manifests(&client, &manifests, &namespace, out).await
        }
        Command::Get(args) => {
            let (client, scope) = connect_in_scope(&args.scope, connect).await?;
            let options = GetOptions {
                scope,
                names: args.names,
                selector: args.selector,
                output: args.output,
                watch: args.watch,
                until_done: args.until_done,
                timeout: args.timeout.map(Duration::from_secs),
            };
            match args.resource {
                ResourceKind::TrainingJobs => {
                    get::get::<TrainingJob>(client, &options, out, err).await
                }
                ResourceKind::Sweeps => get::get::<Sweep>(client, &options, out, err).await,
                ResourceKind::TrainingQueues => {
                    get::get::<TrainingQueue>(client, &options, out, err).await
                }
            }
        }
        Command::Summary(args) => {
            let (client, scope) = connect_in_scope(&args.scope, connect).await?;
            get::summary(client, &scope, args.json, out).await
        }
        Command::Cost(args) => match args.since {
            Some(since) => {
                let scope = match (args.scope.all_namespaces, &args.scope.namespace) {
                    (false, Some(namespace)) => {
                        resources::Scope::Namespace(checked_namespace(namespace)?)
                    }
                    _ => resources::Scope::AllNamespaces,
                };
                cost::report_since(&args.nats, since, &scope, args.by, args.output, out).await
            }
            None => {
                let (client, scope) = connect_in_scope(&args.scope, connect).await?;
                cost::report(client, &scope, args.by, args.output, out).await
            }
        },
        Command::Notifications(args) => {
            notifications::list(
                &args.nats,
                args.state.map(|s| s.as_str()),
                args.limit,
                args.json,
                out,
            )
            .await
        }
        Command::DeadLetter(args) => {
            use crate::cli::{DeadLetterAction, JsonOutput};
            let json = |output: Option<JsonOutput>| output == Some(JsonOutput::Json);
            match args.action {
                DeadLetterAction::List { filter, output } => {
                    deadletter::list(&args.nats, &filter, json(output), out, err).await
                }
                DeadLetterAction::Show { sequence, output } => {
                    deadletter::show(&args.nats, sequence, json(output), out).await
                }
                DeadLetterAction::Replay {
                    sequences,
                    filter,
                    output,
                    ..
                } => {
                    deadletter::replay(&args.nats, &filter, &sequences, json(output), out, err)
                        .await
                }
            }
        }
        Command::Delete(args) => {
            let (client, namespace) =
                connect_in_namespace(args.namespace.as_deref(), connect).await?;
            match args.resource {
                ResourceKind::TrainingJobs => {
                    control::delete::<TrainingJob>(client, &namespace, &args.names, out).await
                }
                ResourceKind::Sweeps => {
                    control::delete::<Sweep>(client, &namespace, &args.names, out).await
                }
                ResourceKind::TrainingQueues => {
                    control::delete::<TrainingQueue>(client, &namespace, &args.names, out).await
                }
            }
        }
        Command::Suspend(args) => {
            let (client, namespace) =
                connect_in_namespace(args.namespace.as_deref(), connect).await?;
            control::set_suspended(client, &namespace, &args.names, true, out).await
        }
        Command::Resume(args) => {
            let (client, namespace) =
                connect_in_namespace(args.namespace.as_deref(), connect).await?;
            control::set_suspended(client, &namespace, &args.names, false, out).await
        }
        Command::Describe(args) => {
            let (client, namespace) =
                connect_in_namespace(args.namespace.as_deref(), connect).await?;
            match args.resource {
                ResourceKind::TrainingJobs => {
                    describe::describe::<TrainingJob>(client, &namespace, &args.name, out).await
                }
                ResourceKind::Sweeps => {
                    describe::describe::<Sweep>(client, &namespace, &args.name, out).await
                }
                ResourceKind::TrainingQueues => {
                    describe::describe::<TrainingQueue>(client, &namespace, &args.name, out).await
                }
            }
        }
        Command::Explain(args) => {
            let (client, namespace) =
                connect_in_namespace(args.namespace.as_deref(), connect).await?;
            describe::explain(client, &namespace, &args.name, out).await
        }
        Command::Tensorboard(args) => {
            let (client, namespace) =
                connect_in_namespace(args.namespace.as_deref(), connect).await?;
            let options = tensorboard::TensorboardOptions {
                port: args.port,
                image: args.image,
            };
            tensorboard::tensorboard(client, &namespace, &args.name, &options, out).await
        }
        Command::Logs(args) => {
            let (client, namespace) =
                connect_in_namespace(args.namespace.as_deref(), connect).await?;
            let options = logs::LogOptions {
                rank: args.rank,
                all: args.all,
                follow: args.follow,
                tail: args.tail,
                since_seconds: args.since.map(|since| since.as_secs()),
                timestamps: args.timestamps,
            };
            logs::logs(client, &namespace, &args.name, &options, out).await
        }
        Command::Completion(args) => {
            let mut command = <Cli as clap::CommandFactory>::command();
            clap_complete::generate(args.shell, &mut command, "trainyard", out);
            Ok(())
        }
    }
}

/// `-n`, else the client's namespace; a bad `-n` is refused before connecting.
async fn connect_in_namespace<C>(
    namespace: Option<&str>,
    connect: C,
) -> Result<(Client, String), CliError>
where
    C: AsyncFnOnce() -> Result<Client, CliError>,
{
    let flag_namespace = namespace.map(checked_namespace).transpose()?;
    let client = connect().await?;
    let namespace = match flag_namespace {
        Some(namespace) => namespace,
        None => checked_namespace(client.default_namespace())?,
    };
    Ok((client, namespace))
}
