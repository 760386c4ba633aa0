use trainyard_contracts::Service;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    trainyard_runtime::serve(
        Service::GpuAllocator,
        std::env::args_os(),
        std::env::vars(),
        trainyard_gpu_allocator::setup,
    )
    .await?;
    Ok(())
}
