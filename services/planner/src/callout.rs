//! nats-server's auth callout, answered for training workers.
//!
//! Every planner replica answers (a queue group shares the requests): an
//! answer needs only the issuer key, no job state. The core
//! (`planner_core::callout`) reads the request and decides; this module
//! loads the key, receives the requests and sends the answers back.

use std::sync::Arc;

use futures::StreamExt;
use nkeys::{KeyPair, KeyPairType};
use planner_core::callout;
use prometheus::{IntCounterVec, Opts, Registry};
use tokio_util::sync::CancellationToken;
use trainyard_contracts::permissions::{ACCOUNT, AUTH_CALLOUT_SUBJECT};

use crate::PlannerError;

/// Queue group of the planner replicas answering the callout.
const QUEUE_GROUP: &str = "trainyard-planner-auth";

/// Reads the issuer account nkey seed from `path`.
pub fn load_issuer(path: &str) -> Result<KeyPair, PlannerError> {
    let seed = std::fs::read_to_string(path).map_err(|err| {
        PlannerError::Credentials(format!(
            "cannot read planner.worker_credentials_seed_file {path}: {err}"
        ))
    })?;
    let key = KeyPair::from_seed(seed.trim()).map_err(|err| {
        PlannerError::Credentials(format!(
            "planner.worker_credentials_seed_file {path} holds no nkey seed ({err}); make one with `nats-auth-config --new-callout-issuer FILE`"
        ))
    })?;
    if !matches!(key.key_pair_type(), KeyPairType::Account) {
        return Err(PlannerError::Credentials(format!(
            "planner.worker_credentials_seed_file {path} is not an account seed (SA...): nats-server's auth_callout issuer must be an account key"
        )));
    }
    Ok(key)
}

/// Reads the CA bundle the workers verify NATS with from `path`.
pub fn load_worker_nats_ca(path: &str) -> Result<Arc<str>, PlannerError> {
    let ca = std::fs::read_to_string(path).map_err(|err| {
        PlannerError::Credentials(format!(
            "cannot read planner.worker_nats_ca_file {path}: {err}"
        ))
    })?;
    if !ca.contains("-----BEGIN CERTIFICATE-----") {
        return Err(PlannerError::Credentials(format!(
            "planner.worker_nats_ca_file {path} holds no PEM certificate; give the CA that signed the NATS server's certificate (nats-tls's ca.crt)"
        )));
    }
    Ok(ca.into())
}

/// Answers of the callout by outcome.
#[derive(Clone)]
pub struct CalloutMetrics {
    answers: IntCounterVec,
}

impl CalloutMetrics {
    pub fn register(registry: &Registry) -> Result<Self, PlannerError> {
        let answers = IntCounterVec::new(
            Opts::new(
                "trainyard_planner_worker_auth_total",
                "Auth callout requests by outcome: authorized, refused (bad, expired or missing token), unanswered (unreadable request)",
            ),
            &["outcome"],
        )
        .map_err(|err| PlannerError::Metrics(err.to_string()))?;
        registry
            .register(Box::new(answers.clone()))
            .map_err(|err| PlannerError::Metrics(err.to_string()))?;
        Ok(Self { answers })
    }
}

/// Subscribes to the callout subject; answers until `shutdown`.
pub async fn serve(
    client: async_nats::Client,
    issuer: Arc<KeyPair>,
    metrics: CalloutMetrics,
    shutdown: CancellationToken,
) -> Result<(), PlannerError> {
    let mut requests = client
        .queue_subscribe(AUTH_CALLOUT_SUBJECT, QUEUE_GROUP.to_string())
        .await
        .map_err(|err| {
            PlannerError::Credentials(format!("subscribe to {AUTH_CALLOUT_SUBJECT}: {err}"))
        })?;
    tracing::info!(issuer = %issuer.public_key(), "answering the NATS auth callout for workers");
    loop {
        let request = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            request = requests.next() => match request {
                Some(request) => request,
                None => return Ok(()),
            },
        };
        let outcome = respond(&client, &issuer, &request).await;
        metrics.answers.with_label_values(&[outcome]).inc();
    }
}

/// Answers one request; never fails: what goes wrong is logged with the reason.
async fn respond(
    client: &async_nats::Client,
    issuer: &KeyPair,
    request: &async_nats::Message,
) -> &'static str {
    let Some(reply) = request.reply.clone() else {
        tracing::warn!("auth callout request without a reply subject ignored");
        return "unanswered";
    };
    let now = chrono::Utc::now();
    let answer = std::str::from_utf8(&request.payload)
        .map_err(|_| planner_core::CredentialError::MalformedRequest("not UTF-8".into()))
        .and_then(|jwt| callout::read_request(jwt, now))
        .and_then(|read| {
            let answer = callout::answer(&read, issuer, ACCOUNT, now)?;
            Ok((read, answer))
        });
    let (read, answer) = match answer {
        Ok(answered) => answered,
        Err(reason) => {
            // The server refuses the connection when no answer comes in time.
            tracing::warn!(%reason, "auth callout request not answered");
            return "unanswered";
        }
    };
    let outcome = match &answer.decision {
        Ok(token) => {
            tracing::debug!(namespace = %token.ns, job = %token.job, client = ?read.client_name, "worker authorized");
            "authorized"
        }
        Err(reason) => {
            tracing::warn!(%reason, client = ?read.client_name, "worker connection refused");
            "refused"
        }
    };
    if let Err(err) = client.publish(reply, answer.response.into()).await {
        tracing::warn!(error = %err, "auth callout answer not sent");
        return "unanswered";
    }
    outcome
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_workers_ca_is_read_as_pem_and_a_bad_file_is_named_with_its_setting() {
        let dir = tempfile::tempdir().expect("temp dir");
        let good = dir.path().join("ca.crt");
        let pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        std::fs::write(&good, pem).expect("write");
        let loaded = load_worker_nats_ca(&good.display().to_string()).expect("a PEM bundle");
        assert_eq!(&*loaded, pem);

        let not_pem = dir.path().join("issuer.nk");
        std::fs::write(&not_pem, "SAAB...").expect("write");
        let missing = dir.path().join("absent.crt");
        for path in [not_pem, missing] {
            let error = load_worker_nats_ca(&path.display().to_string())
                .err()
                .map(|err| err.to_string())
                .unwrap_or_default();
            assert!(
                error.contains("planner.worker_nats_ca_file"),
                "{}: {error}",
                path.display()
            );
        }
    }
}
