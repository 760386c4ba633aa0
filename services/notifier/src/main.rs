use trainyard_contracts::Service;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    trainyard_runtime::serve(
        Service::Notifier,
        std::env::args_os(),
        std::env::vars(),
        trainyard_notifier::setup,
    )
    .await?;
    Ok(())
}
