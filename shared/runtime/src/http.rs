//! `/metrics`, `/healthz` and `/readyz`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus::{Encoder, Registry, TextEncoder};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::RuntimeError;

/// Whether the service is ready: NATS connected and streams provisioned.
#[derive(Clone, Default)]
pub struct Readiness {
    provisioned: Arc<AtomicBool>,
    client: Arc<OnceLock<async_nats::Client>>,
}

impl Readiness {
    /// Records the NATS client whose connection state `/readyz` reports.
    pub fn connected(&self, client: async_nats::Client) {
        // Set once per process; a second call keeps the first client, which is the same connection.
        let _ = self.client.set(client);
    }
    pub fn set_provisioned(&self, provisioned: bool) {
        self.provisioned.store(provisioned, Ordering::SeqCst);
    }
    /// `Ok` when ready, else why not.
    pub fn check(&self) -> Result<(), &'static str> {
        let connected = self
            .client
            .get()
            .is_some_and(|c| c.connection_state() == async_nats::connection::State::Connected);
        if !connected {
            Err("not connected to NATS")
        } else if !self.provisioned.load(Ordering::SeqCst) {
            Err("streams not provisioned")
        } else {
            Ok(())
        }
    }
}

#[derive(Clone)]
struct HttpState {
    registry: Registry,
    readiness: Readiness,
}

/// Binds `listen` and serves until `shutdown`. Returns the bound address (useful with port 0).
pub async fn serve(
    listen: &str,
    registry: Registry,
    readiness: Readiness,
    shutdown: CancellationToken,
    tracker: &TaskTracker,
) -> Result<SocketAddr, RuntimeError> {
    let listener = TcpListener::bind(listen)
        .await
        .map_err(|source| RuntimeError::Listen {
            addr: listen.to_string(),
            source,
        })?;
    let addr = listener
        .local_addr()
        .map_err(|source| RuntimeError::Listen {
            addr: listen.to_string(),
            source,
        })?;
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(HttpState {
            registry,
            readiness,
        });
    tracker.spawn(async move {
        if let Err(err) = axum::serve(listener, app)
            .with_graceful_shutdown(shutdown.cancelled_owned())
            .await
        {
            tracing::error!(error = %err, "http server stopped");
        }
    });
    Ok(addr)
}

async fn metrics(State(state): State<HttpState>) -> impl IntoResponse {
    let mut body = Vec::new();
    match TextEncoder::new().encode(&state.registry.gather(), &mut body) {
        Ok(()) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, prometheus::TEXT_FORMAT)],
            body,
        ),
        Err(err) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            err.to_string().into_bytes(),
        ),
    }
}

async fn readyz(State(state): State<HttpState>) -> impl IntoResponse {
    match state.readiness.check() {
        Ok(()) => (StatusCode::OK, "ready"),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, why),
    }
}
