//! `trainyard-simulator`: a simulated Kubernetes cluster with virtual GPU nodes, for
//! the demo, load tests and trace replay. Not for production.
//!
//! ```text
//! trainyard-simulator --config simulator/clusters/demo.yaml [--listen 127.0.0.1:0]
//!     [--kubeconfig-out FILE] [--nats-url nats://127.0.0.1:4222] [--speed N]
//!     [--checkpoint-root DIR] [--nats-user USER --nats-password-file FILE]
//! ```
//!
//! Workers whose pods carry a NATS token (`TRAINYARD_NATS_TOKEN`, from the
//! planner's Secret) report over their own connection with it; the
//! simulator's own connection (commands, retention, reports of workers
//! without a token) uses `--nats-user`.

use anyhow::{Context, bail};
use clap::Parser;
use tokio_util::sync::CancellationToken;
use trainyard_simulator::config::ClusterConfig;
use trainyard_simulator::runner::Simulator;

/// A simulated Kubernetes cluster with virtual GPU nodes (not for production).
#[derive(Parser)]
#[command(name = "trainyard-simulator", version)]
struct Args {
    /// Cluster file: nodes, speed, failure and reclaim rates.
    #[arg(long)]
    config: String,
    /// Address of the simulated API server.
    #[arg(long, default_value = "127.0.0.1:0")]
    listen: String,
    /// Write a kubeconfig for the simulated API server to this file.
    #[arg(long)]
    kubeconfig_out: Option<String>,
    /// Publish worker reports to NATS at this URL.
    #[arg(long)]
    nats_url: Option<String>,
    /// NATS user of the simulator's own connection (e.g. `operator`).
    #[arg(long, requires = "nats_password_file")]
    nats_user: Option<String>,
    /// File holding that user's password.
    #[arg(long, requires = "nats_user")]
    nats_password_file: Option<String>,
    /// Simulated seconds per real second, overriding the cluster file.
    #[arg(long)]
    speed: Option<f64>,
    /// Directory the simulated workers write their checkpoints under, overriding
    /// the cluster file's `checkpoints.root`.
    #[arg(long)]
    checkpoint_root: Option<std::path::PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let mut config = ClusterConfig::load(&args.config)?;
    if let Some(speed) = args.speed {
        if !(speed.is_finite() && speed > 0.0) {
            bail!("--speed {speed} must be a positive number");
        }
        config.speed = speed;
    }
    if let Some(root) = args.checkpoint_root {
        config.checkpoints.root = Some(root);
    }
    let nats = match &args.nats_url {
        Some(url) => {
            let options = match (&args.nats_user, &args.nats_password_file) {
                (Some(user), Some(file)) => {
                    let password = std::fs::read_to_string(file)
                        .with_context(|| format!("cannot read --nats-password-file {file}"))?;
                    async_nats::ConnectOptions::with_user_and_password(
                        user.clone(),
                        password.trim().to_owned(),
                    )
                    .custom_inbox_prefix(format!("_INBOX.{user}"))
                }
                _ => async_nats::ConnectOptions::new(),
            };
            Some(
                options
                    .connect(trainyard_runtime::nats::servers(url))
                    .await
                    .with_context(|| format!("cannot connect to NATS at {url}"))?,
            )
        }
        None => None,
    };
    let shutdown = CancellationToken::new();
    let simulator = Simulator::start_with_worker_nats(
        config,
        &args.listen,
        nats,
        args.nats_url.clone(),
        shutdown.clone(),
    )
    .await?;
    if let Some(path) = &args.kubeconfig_out {
        std::fs::write(path, simulator.kubeconfig())
            .with_context(|| format!("cannot write {path}"))?;
    }
    println!("simulated cluster API at http://{}", simulator.address);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    shutdown.cancel();
    simulator.join().await;
    Ok(())
}
