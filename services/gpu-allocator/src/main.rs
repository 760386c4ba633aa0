use trainyard_contracts::Service;

/// An admission cycle makes and drops many small buffers: with the system
/// allocator, malloc and free took about a tenth of the admission
/// benchmark's time.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
