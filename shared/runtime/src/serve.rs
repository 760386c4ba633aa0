//! The whole life of a service binary, so each `main` is one call:
//! config → telemetry → HTTP + NATS + streams → the service's own setup → run
//! until SIGTERM/SIGINT → drain → exit.

use std::collections::HashMap;
use std::ffi::OsString;
use std::future::Future;
use std::path::PathBuf;

use trainyard_contracts::Service;

use crate::error::RuntimeError;
use crate::runtime::Runtime;
use crate::settings::ConfigSources;
use crate::{shutdown, telemetry};

/// Where the configuration file is: `--config <path>`, else `TRAINYARD_CONFIG`.
pub fn config_path(
    args: impl IntoIterator<Item = OsString>,
    env: &HashMap<String, String>,
) -> Result<Option<PathBuf>, RuntimeError> {
    let mut args = args.into_iter().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--config" {
            return args
                .next()
                .map(|path| Some(PathBuf::from(path)))
                .ok_or_else(|| {
                    RuntimeError::Usage(
                        "--config needs a file path, e.g. --config /etc/trainyard/planner.toml"
                            .into(),
                    )
                });
        }
        return Err(RuntimeError::Usage(format!(
            "unknown argument {:?}; the only argument is --config <file>, everything else is TRAINYARD_* environment",
            arg
        )));
    }
    Ok(env.get("TRAINYARD_CONFIG").map(PathBuf::from))
}

/// Runs `service`. `setup` registers the service's consumers and tasks on the
/// started runtime; it returns once they are spawned.
pub async fn serve<F, Fut, E>(
    service: Service,
    args: impl IntoIterator<Item = OsString>,
    env: impl IntoIterator<Item = (String, String)>,
    setup: F,
) -> Result<(), RuntimeError>
where
    F: FnOnce(&Runtime, &ConfigSources) -> Fut,
    Fut: Future<Output = Result<(), E>>,
    E: std::error::Error + Send + Sync + 'static,
{
    let env: HashMap<String, String> = env.into_iter().collect();
    let path = config_path(args, &env)?;
    let sources = ConfigSources::load(path.as_deref(), env)?;
    let settings = sources.settings()?;
    let _telemetry = telemetry::init(service.name(), &settings.telemetry)?;
    let runtime = Runtime::start(service, settings, shutdown::on_signals()).await?;
    if let Err(err) = setup(&runtime, &sources).await {
        runtime.shutdown.cancel();
        runtime.run_until_shutdown().await?;
        return Err(RuntimeError::Setup(Box::new(err)));
    }
    runtime.run_until_shutdown().await
}
