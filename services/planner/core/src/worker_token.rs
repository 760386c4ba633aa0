//! Per-job NATS credentials for training workers.
//!
//! The planner signs, for each admitted attempt, a token naming the job's
//! namespace, the TrainingJob and an expiry with its issuer key (an NATS
//! account nkey, Ed25519). The token goes into a Secret beside the Job and into
//! the workers' environment as [`TOKEN_ENV`]; a worker presents it as its NATS
//! token and the planner's auth callout ([`crate::callout`]) turns it into a
//! NATS user allowed exactly what `Identity::Worker` allows.
//!
//! Format: `<payload>.<signature>`, both unpadded base64url; the payload is the
//! JSON `{"ns":"...","job":"...","exp":<unix seconds>}` and the signature is
//! Ed25519 over [`SIGNING_CONTEXT`] followed by the payload's bytes, so no
//! signature the same key makes over a JWT can pass as a token.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use nkeys::KeyPair;
use serde::{Deserialize, Serialize};

use crate::error::CredentialError;

/// Environment variable holding the worker's NATS token.
pub const TOKEN_ENV: &str = trainyard_contracts::worker::NATS_TOKEN_ENV;
/// Key of the token in the job's credentials Secret.
pub const TOKEN_SECRET_KEY: &str = "token";
/// Key of the NATS CA bundle in the job's credentials Secret
/// (`planner.worker_nats_ca_file`).
pub const NATS_CA_SECRET_KEY: &str = "ca.crt";
/// Prefixed to the payload before signing: tokens and JWTs share the key.
pub const SIGNING_CONTEXT: &[u8] = b"trainyard-worker-token.v1.";
/// Longest token accepted; a real one is under 300 bytes.
const MAX_TOKEN_LEN: usize = 2048;

/// What a worker token grants: reporting for TrainingJob `job` in `ns` until `exp`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerToken {
    /// The TrainingJob's namespace.
    pub ns: String,
    /// The TrainingJob's name.
    pub job: String,
    /// Expiry, Unix seconds.
    pub exp: i64,
}

impl WorkerToken {
    /// The signed token text.
    pub fn sign(&self, key: &KeyPair) -> Result<String, CredentialError> {
        let payload = serde_json::to_vec(self)
            .map_err(|err| CredentialError::Signing(format!("encode the token: {err}")))?;
        let signature = key
            .sign(&signed_bytes(&payload))
            .map_err(|err| CredentialError::Signing(err.to_string()))?;
        Ok(format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(&payload),
            URL_SAFE_NO_PAD.encode(signature)
        ))
    }

    /// Reads `token`, checks it was signed by `issuer` and is not expired at `now`.
    pub fn verify(
        token: &str,
        issuer: &KeyPair,
        now: DateTime<Utc>,
    ) -> Result<Self, CredentialError> {
        if token.is_empty() {
            return Err(CredentialError::MalformedToken("no token given"));
        }
        if token.len() > MAX_TOKEN_LEN {
            return Err(CredentialError::MalformedToken(
                "longer than any token issued",
            ));
        }
        let (payload, signature) = token
            .split_once('.')
            .ok_or(CredentialError::MalformedToken("not <payload>.<signature>"))?;
        let payload = URL_SAFE_NO_PAD
            .decode(payload)
            .map_err(|_| CredentialError::MalformedToken("payload is not base64url"))?;
        let signature = URL_SAFE_NO_PAD
            .decode(signature)
            .map_err(|_| CredentialError::MalformedToken("signature is not base64url"))?;
        issuer
            .verify(&signed_bytes(&payload), &signature)
            .map_err(|_| CredentialError::BadSignature)?;
        let token: WorkerToken = serde_json::from_slice(&payload)
            .map_err(|_| CredentialError::MalformedToken("payload is not {ns, job, exp}"))?;
        if token.ns.is_empty() || token.job.is_empty() {
            return Err(CredentialError::MalformedToken("namespace or job is empty"));
        }
        if token.exp <= now.timestamp() {
            return Err(CredentialError::Expired {
                namespace: token.ns,
                job: token.job,
                expired_at: token.exp,
            });
        }
        Ok(token)
    }
}

fn signed_bytes(payload: &[u8]) -> Vec<u8> {
    [SIGNING_CONTEXT, payload].concat()
}

/// The Secret one attempt's workers read their token from; built by the core
/// without the token, which the planner signs when it applies the Secret.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct WorkerCredentials {
    /// The Secret's name, namespace, labels and owner (the TrainingJob).
    pub metadata: ObjectMeta,
    /// The TrainingJob's namespace.
    pub namespace: String,
    /// The TrainingJob's name.
    pub job: String,
    /// Seconds the token is valid from signing.
    pub lifetime_seconds: u64,
}

impl WorkerCredentials {
    /// The token these credentials stand for, valid `lifetime_seconds` from `now`.
    pub fn token(&self, now: DateTime<Utc>) -> WorkerToken {
        let lifetime = i64::try_from(self.lifetime_seconds).unwrap_or(i64::MAX);
        WorkerToken {
            ns: self.namespace.clone(),
            job: self.job.clone(),
            exp: now.timestamp().saturating_add(lifetime),
        }
    }

    /// The Secret holding the token signed by `key` at `now`, and the CA
    /// bundle the workers verify the NATS server with, when there is one.
    pub fn secret(
        &self,
        key: &KeyPair,
        nats_ca: Option<&str>,
        now: DateTime<Utc>,
    ) -> Result<Secret, CredentialError> {
        let token = self.token(now).sign(key)?;
        let mut data =
            BTreeMap::from([(TOKEN_SECRET_KEY.to_owned(), ByteString(token.into_bytes()))]);
        if let Some(ca) = nats_ca {
            data.insert(
                NATS_CA_SECRET_KEY.to_owned(),
                ByteString(ca.as_bytes().to_vec()),
            );
        }
        Ok(Secret {
            metadata: self.metadata.clone(),
            type_: Some("Opaque".to_owned()),
            data: Some(data),
            ..Secret::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000, 0).expect("valid time")
    }

    fn token() -> WorkerToken {
        WorkerToken {
            ns: "ml".into(),
            job: "bert".into(),
            exp: now().timestamp() + 60,
        }
    }

    #[test]
    fn a_signed_token_verifies_with_its_key_until_it_expires() {
        let key = KeyPair::new_account();
        let signed = token().sign(&key).expect("signs");
        assert_eq!(WorkerToken::verify(&signed, &key, now()), Ok(token()));
        let later = now() + chrono::Duration::seconds(60);
        assert!(matches!(
            WorkerToken::verify(&signed, &key, later),
            Err(CredentialError::Expired { expired_at, .. }) if expired_at == token().exp
        ));
    }

    #[test]
    fn signing_is_deterministic_and_small() {
        let key = KeyPair::new_account();
        let signed = token().sign(&key).expect("signs");
        assert_eq!(signed, token().sign(&key).expect("signs"));
        assert!(signed.len() < 200, "{} bytes", signed.len());
    }

    #[test]
    fn a_token_from_another_key_is_refused() {
        let signed = token().sign(&KeyPair::new_account()).expect("signs");
        assert_eq!(
            WorkerToken::verify(&signed, &KeyPair::new_account(), now()),
            Err(CredentialError::BadSignature)
        );
    }

    #[test]
    fn a_changed_payload_is_refused() {
        let key = KeyPair::new_account();
        let signed = token().sign(&key).expect("signs");
        let (_, signature) = signed.split_once('.').expect("two parts");
        let forged = WorkerToken {
            job: "other".into(),
            ..token()
        };
        let payload = URL_SAFE_NO_PAD.encode(serde_json::to_vec(&forged).expect("encodes"));
        assert_eq!(
            WorkerToken::verify(&format!("{payload}.{signature}"), &key, now()),
            Err(CredentialError::BadSignature)
        );
    }

    #[test]
    fn garbage_is_refused_as_malformed() {
        let key = KeyPair::new_account();
        for garbage in ["", "nodot", "!!.!!", "e30.e30", &"a.".repeat(2000)] {
            assert!(
                matches!(
                    WorkerToken::verify(garbage, &key, now()),
                    Err(CredentialError::MalformedToken(_) | CredentialError::BadSignature)
                ),
                "{garbage:?}"
            );
        }
    }

    #[test]
    fn the_secret_carries_a_token_for_its_job_and_the_nats_ca_when_given() {
        let key = KeyPair::new_account();
        let credentials = WorkerCredentials {
            metadata: ObjectMeta {
                name: Some("bert-a0-nats".into()),
                ..ObjectMeta::default()
            },
            namespace: "ml".into(),
            job: "bert".into(),
            lifetime_seconds: 3600,
        };
        let without_ca = credentials.secret(&key, None, now()).expect("signs");
        assert!(
            !without_ca
                .data
                .expect("data")
                .contains_key(NATS_CA_SECRET_KEY)
        );
        let ca = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let secret = credentials.secret(&key, Some(ca), now()).expect("signs");
        let data = secret.data.expect("data");
        assert_eq!(data[NATS_CA_SECRET_KEY].0, ca.as_bytes());
        let text = String::from_utf8(data[TOKEN_SECRET_KEY].0.clone()).expect("utf-8");
        let verified = WorkerToken::verify(&text, &key, now()).expect("verifies");
        assert_eq!(
            (verified.ns.as_str(), verified.job.as_str()),
            ("ml", "bert")
        );
        assert_eq!(verified.exp, now().timestamp() + 3600);
    }
}
