use trainyard_contracts::Service;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    trainyard_runtime::serve(
        Service::CheckpointManager,
        std::env::args_os(),
        std::env::vars(),
        trainyard_checkpoint_manager::setup,
    )
    .await?;
    Ok(())
}
