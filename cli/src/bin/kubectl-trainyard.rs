//! `kubectl-trainyard`: the `trainyard` command as a kubectl plugin
//! (`kubectl trainyard get tj`) once it is on PATH.

#[tokio::main]
async fn main() -> std::process::ExitCode {
    trainyard_cli::main().await
}
