//! The whole life of a service binary, so each `main` is one call:
//! config → telemetry → HTTP + NATS + streams → the service's own setup → run
//! until SIGTERM/SIGINT → drain → exit.

use std::collections::HashMap;
use std::ffi::OsString;
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
    match args.next() {
        None => Ok(env.get("TRAINYARD_CONFIG").map(PathBuf::from)),
        Some(flag) if flag == "--config" => match (args.next(), args.next()) {
            (Some(path), None) => Ok(Some(PathBuf::from(path))),
            _ => Err(RuntimeError::Usage(
                "--config needs exactly one file path, e.g. --config /etc/trainyard/planner.toml"
                    .into(),
            )),
        },
        Some(other) => Err(RuntimeError::Usage(format!(
            "unknown argument {other:?}; the only argument is --config <file>, everything else is TRAINYARD_* environment"
        ))),
    }
}

/// Runs `service`. `setup` registers the service's consumers and tasks on the
/// started runtime; it returns once they are spawned.
pub async fn serve<F, E>(
    service: Service,
    args: impl IntoIterator<Item = OsString>,
    env: impl IntoIterator<Item = (String, String)>,
    setup: F,
) -> Result<(), RuntimeError>
where
    F: AsyncFnOnce(&Runtime, &ConfigSources) -> Result<(), E>,
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

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<OsString> {
        std::iter::once("service")
            .chain(list.iter().copied())
            .map(OsString::from)
            .collect()
    }

    #[test]
    fn config_path_from_flag_or_environment() {
        let env: HashMap<String, String> =
            [("TRAINYARD_CONFIG".to_string(), "/env.toml".to_string())].into();
        assert_eq!(config_path(args(&[]), &HashMap::new()).expect("ok"), None);
        assert_eq!(
            config_path(args(&[]), &env).expect("ok"),
            Some(PathBuf::from("/env.toml"))
        );
        assert_eq!(
            config_path(args(&["--config", "/flag.toml"]), &env).expect("ok"),
            Some(PathBuf::from("/flag.toml"))
        );
        assert!(config_path(args(&["--config"]), &env).is_err());
        let err = config_path(args(&["--verbose"]), &env)
            .expect_err("unknown flag")
            .to_string();
        assert!(
            err.contains("--verbose") && err.contains("--config"),
            "{err}"
        );
    }
}
