//! Any of the services the system tests run as processes, named by the
//! first argument (`trainyard-any-service planner [--config FILE]`): the
//! same `serve` and `setup` as each service's own binary, built with the
//! tests so that they can SIGKILL and restart a service without a release
//! build of each.

use std::ffi::OsString;

use anyhow::bail;
use trainyard_contracts::Service;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let mut args: Vec<OsString> = std::env::args_os().collect();
    if args.len() < 2 {
        bail!("usage: trainyard-any-service <watcher|planner|gpu-allocator> [--config FILE]");
    }
    let name = args.remove(1);
    let env = std::env::vars();
    match name.to_str() {
        Some("watcher") => {
            trainyard_runtime::serve(Service::Watcher, args, env, trainyard_watcher::setup).await?
        }
        Some("planner") => {
            trainyard_runtime::serve(Service::Planner, args, env, trainyard_planner::setup).await?
        }
        Some("gpu-allocator") => {
            trainyard_runtime::serve(
                Service::GpuAllocator,
                args,
                env,
                trainyard_gpu_allocator::setup,
            )
            .await?
        }
        _ => bail!(
            "{name:?} is not a service this binary runs; give watcher, planner or gpu-allocator"
        ),
    }
    Ok(())
}
