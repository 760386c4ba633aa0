//! Black-box check of a service binary: start, health, readiness, metrics, SIGTERM.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::{NatsServer, free_port};

/// `GET path` on a loopback port; returns (status, body), or None if nothing answers.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((status, body))
}

fn wait_for(what: &str, deadline: Duration, mut check: impl FnMut() -> bool) {
    let until = Instant::now() + deadline;
    while !check() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts `binary` against a fresh NATS, checks `/healthz`, `/readyz` (ready only
/// once NATS is up and streams exist) and `/metrics`, then sends SIGTERM and
/// checks it exits 0. Returns how long the exit took.
pub fn assert_service_lifecycle(binary: &str) -> Duration {
    assert_service_lifecycle_with_env(binary, &[])
}

/// [`assert_service_lifecycle`] with extra environment for the service.
pub fn assert_service_lifecycle_with_env(binary: &str, env: &[(&str, &str)]) -> Duration {
    let mut nats = NatsServer::start();
    // Stop NATS first so readiness is seen to depend on it.
    nats.stop();
    let port = free_port();
    let mut child = Command::new(binary)
        .env("TRAINYARD_NATS__URL", nats.url())
        .env("TRAINYARD_HTTP__LISTEN", format!("127.0.0.1:{port}"))
        .env("TRAINYARD_TELEMETRY__LOG_LEVEL", "error")
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|err| panic!("cannot start {binary}: {err}"));

    wait_for("/healthz", Duration::from_secs(20), || {
        http_get(port, "/healthz").is_some_and(|(status, _)| status == 200)
    });
    let (status, body) = http_get(port, "/readyz").expect("/readyz answers");
    assert_eq!(status, 503, "not ready without NATS: {body}");

    nats.restart();
    wait_for("/readyz", Duration::from_secs(20), || {
        http_get(port, "/readyz").is_some_and(|(status, _)| status == 200)
    });
    let (status, metrics) = http_get(port, "/metrics").expect("/metrics answers");
    assert_eq!(status, 200);
    assert!(
        metrics.contains("trainyard_nats_connected 1"),
        "metrics expose the connection: {metrics}"
    );

    let stopping = Instant::now();
    let killed = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(killed.success());
    let until = stopping + Duration::from_secs(10);
    loop {
        if let Some(status) = child.try_wait().expect("wait on child") {
            assert!(
                status.success(),
                "{binary} exited with {status} after SIGTERM"
            );
            return stopping.elapsed();
        }
        if Instant::now() > until {
            let _ = child.kill();
            panic!("{binary} did not exit within 10 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
