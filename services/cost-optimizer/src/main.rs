use trainyard_contracts::Service;
use trainyard_runtime::RuntimeError;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // Until this service's own consumers land, it provisions the streams, serves
    // its health and metrics endpoints and drains cleanly on SIGTERM.
    trainyard_runtime::serve(
        Service::CostOptimizer,
        std::env::args_os(),
        std::env::vars(),
        async |_, _| Ok::<(), RuntimeError>(()),
    )
    .await?;
    Ok(())
}
