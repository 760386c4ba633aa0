//! A real `mlflow server` (tracking and model registry) on an ephemeral
//! loopback port, with a temporary SQLite store; `pip install mlflow` provides it.

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::{free_port, http_get};

/// `mlflow server` in its own process group, killed with all its workers on drop.
pub struct MlflowServer {
    child: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

/// The `mlflow` executable on PATH, if any.
pub fn mlflow_executable() -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("mlflow"))
        .find(|candidate| {
            candidate
                .metadata()
                .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

impl MlflowServer {
    /// Starts the server and waits (up to 180 s: its first start is slow)
    /// until it answers `/health`.
    pub fn start(executable: PathBuf) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let log = std::fs::File::create(dir.path().join("mlflow.log")).expect("log file");
        let child = Command::new(executable)
            .args(["server", "--host", "127.0.0.1", "--port", &port.to_string()])
            .arg("--backend-store-uri")
            .arg(format!(
                "sqlite:///{}",
                dir.path().join("mlflow.db").display()
            ))
            .arg("--default-artifact-root")
            .arg(dir.path().join("artifacts"))
            .args(["--workers", "1"])
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .process_group(0)
            .spawn()
            .expect("mlflow server starts");
        let mut server = Self {
            child,
            port,
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            if http_get(port, "/health").is_some_and(|(status, _)| status == 200) {
                return server;
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                let log = std::fs::read_to_string(server._dir.path().join("mlflow.log"))
                    .unwrap_or_default();
                panic!("mlflow server exited with {status}:\n{log}");
            }
            assert!(
                Instant::now() < deadline,
                "mlflow server did not answer /health on port {port} within 180 s"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The tracking URI, e.g. `http://127.0.0.1:5000`.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The URL of a REST endpoint, e.g. `api("runs/get")`.
    pub fn api(&self, path: &str) -> String {
        format!("{}/api/2.0/mlflow/{path}", self.url())
    }
}

impl Drop for MlflowServer {
    fn drop(&mut self) {
        // The server's workers share its process group (its id is the server's pid).
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = Command::new("kill").args(["-KILL", "--", &group]).status();
        let _ = self.child.wait();
    }
}
