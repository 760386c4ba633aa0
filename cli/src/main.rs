//! `trainyard`: see the crate README for the subcommands.

#[tokio::main]
async fn main() -> std::process::ExitCode {
    trainyard_cli::main().await
}
