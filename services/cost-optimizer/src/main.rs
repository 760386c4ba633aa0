use trainyard_contracts::Service;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    trainyard_runtime::serve(
        Service::CostOptimizer,
        std::env::args_os(),
        std::env::vars(),
        trainyard_cost_optimizer::setup,
    )
    .await?;
    Ok(())
}
