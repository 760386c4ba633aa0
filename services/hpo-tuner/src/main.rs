use trainyard_contracts::Service;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    trainyard_runtime::serve(
        Service::HpoTuner,
        std::env::args_os(),
        std::env::vars(),
        trainyard_hpo_tuner::setup,
    )
    .await?;
    Ok(())
}
