//! `trainyard-simulator`: a simulated Kubernetes cluster with virtual GPU nodes, for
//! the demo, load tests and trace replay. Not for production.
//!
//! ```text
//! trainyard-simulator --config simulator/clusters/demo.yaml [--listen 127.0.0.1:0]
//!     [--kubeconfig-out FILE] [--nats-url nats://127.0.0.1:4222] [--speed N]
//! ```

use anyhow::{Context, bail};
use tokio_util::sync::CancellationToken;
use trainyard_simulator::config::ClusterConfig;
use trainyard_simulator::runner::Simulator;

struct Args {
    config: String,
    listen: String,
    kubeconfig_out: Option<String>,
    nats_url: Option<String>,
    speed: Option<f64>,
}

const USAGE: &str = "usage: trainyard-simulator --config FILE [--listen ADDR] [--kubeconfig-out FILE] [--nats-url URL] [--speed N]";

fn parse_args() -> anyhow::Result<Args> {
    let mut args = Args {
        config: String::new(),
        listen: "127.0.0.1:0".into(),
        kubeconfig_out: None,
        nats_url: None,
        speed: None,
    };
    let mut argv = std::env::args().skip(1);
    while let Some(flag) = argv.next() {
        let mut value = || {
            argv.next()
                .with_context(|| format!("{flag} needs a value\n{USAGE}"))
        };
        match flag.as_str() {
            "--config" => args.config = value()?,
            "--listen" => args.listen = value()?,
            "--kubeconfig-out" => args.kubeconfig_out = Some(value()?),
            "--nats-url" => args.nats_url = Some(value()?),
            "--speed" => {
                let text = value()?;
                args.speed = Some(
                    text.parse()
                        .with_context(|| format!("--speed {text:?} is not a number"))?,
                );
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown argument {other:?}\n{USAGE}"),
        }
    }
    if args.config.is_empty() {
        bail!("--config is required\n{USAGE}");
    }
    Ok(args)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = parse_args()?;
    let mut config = ClusterConfig::load(&args.config)?;
    if let Some(speed) = args.speed {
        if !(speed.is_finite() && speed > 0.0) {
            bail!("--speed {speed} must be a positive number");
        }
        config.speed = speed;
    }
    let nats = match &args.nats_url {
        Some(url) => Some(
            async_nats::connect(url)
                .await
                .with_context(|| format!("cannot connect to NATS at {url}"))?,
        ),
        None => None,
    };
    let shutdown = CancellationToken::new();
    let simulator = Simulator::start(config, &args.listen, nats, shutdown.clone()).await?;
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
