//! `trainyard`: see the crate README for the subcommands.

use std::process::ExitCode;

use clap::Parser;
use trainyard_cli::cli::Cli;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    // kube's rustls needs a process-wide crypto provider; an Err only means one is
    // installed already, which is just as good.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let stdout = std::io::stdout();
    let stderr = std::io::stderr();
    trainyard_cli::run(
        cli,
        trainyard_cli::connect,
        &mut stdout.lock(),
        &mut stderr.lock(),
    )
    .await?;
    Ok(())
}
