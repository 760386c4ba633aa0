//! The answer to nats-server's auth callout for a worker.
//!
//! nats-server sends an authorization request JWT (signed by the server's
//! nkey) on `$SYS.REQ.USER.AUTH` for every connection not in its `auth_users`.
//! [`answer`] reads it, verifies the worker token the client presented as its
//! `auth_token`, and builds the authorization response JWT: for a valid token
//! a user JWT with exactly `Identity::Worker { namespace, job }`'s permissions
//! placed in the Trainyard account, expiring with the token; otherwise the
//! reason, which the server logs and refuses the connection with. Both are
//! signed by the issuer account key named in the server's `auth_callout`.
//!
//! Claim shapes are nats-io/jwt v2's (`authorization_request`,
//! `authorization_response`, `user`).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chrono::{DateTime, Utc};
use nkeys::{KeyPair, KeyPairType};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha512_256};
use trainyard_contracts::permissions::Identity;

use crate::error::CredentialError;
use crate::worker_token::WorkerToken;

/// JWT header of every NATS JWT.
const JWT_HEADER: &str = r#"{"typ":"JWT","alg":"ed25519-nkey"}"#;
/// Claim format version (nats-io/jwt v2).
const CLAIM_VERSION: u32 = 2;
/// Longest request accepted.
const MAX_REQUEST_LEN: usize = 64 * 1024;

/// The parts of an authorization request the answer needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthorizationRequest {
    /// The server's id (`server_id.id`), the response's audience.
    pub server_id: String,
    /// The user nkey the server made for this connection, the user JWT's subject.
    pub user_nkey: String,
    /// The token the client connected with, if any.
    pub token: Option<String>,
    /// The client's connection name, for the log.
    pub client_name: Option<String>,
}

/// What to send back and what was decided.
#[derive(Debug, Clone, PartialEq)]
pub struct CalloutAnswer {
    /// The authorization response JWT.
    pub response: String,
    /// The worker admitted, or why the connection is refused.
    pub decision: Result<WorkerToken, CredentialError>,
}

#[derive(Deserialize)]
struct RequestClaims {
    iss: String,
    #[serde(default)]
    exp: i64,
    nats: RequestBody,
}

#[derive(Deserialize)]
struct RequestBody {
    #[serde(rename = "type")]
    claim_type: String,
    server_id: ServerId,
    user_nkey: String,
    #[serde(default)]
    connect_opts: ConnectOpts,
    #[serde(default)]
    client_info: ClientInfo,
}

#[derive(Deserialize)]
struct ServerId {
    id: String,
}

#[derive(Deserialize, Default)]
struct ConnectOpts {
    auth_token: Option<String>,
}

#[derive(Deserialize, Default)]
struct ClientInfo {
    name: Option<String>,
}

#[derive(Serialize)]
struct Claims<'a, T> {
    #[serde(skip_serializing_if = "Option::is_none")]
    aud: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    exp: Option<i64>,
    jti: String,
    iat: i64,
    iss: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    sub: &'a str,
    nats: T,
}

#[derive(Serialize)]
struct ResponseBody {
    #[serde(skip_serializing_if = "Option::is_none")]
    jwt: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(rename = "type")]
    claim_type: &'static str,
    version: u32,
}

#[derive(Serialize)]
struct UserBody {
    #[serde(rename = "pub")]
    publish: Allow,
    #[serde(rename = "sub")]
    subscribe: Allow,
    subs: i64,
    data: i64,
    payload: i64,
    #[serde(rename = "type")]
    claim_type: &'static str,
    version: u32,
}

#[derive(Serialize)]
struct Allow {
    allow: Vec<String>,
}

/// Reads an authorization request JWT and checks the server's signature on it.
pub fn read_request(
    jwt: &str,
    now: DateTime<Utc>,
) -> Result<AuthorizationRequest, CredentialError> {
    if jwt.len() > MAX_REQUEST_LEN {
        return Err(CredentialError::MalformedRequest(
            "larger than any request".into(),
        ));
    }
    let mut parts = jwt.split('.');
    let (Some(header_part), Some(payload), Some(signature), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(CredentialError::MalformedRequest(
            "not a JWT (three parts)".into(),
        ));
    };
    let header: serde_json::Value = decode_json(header_part, "header")?;
    if header["alg"] != "ed25519-nkey" {
        return Err(CredentialError::MalformedRequest(format!(
            "algorithm {} is not ed25519-nkey",
            header["alg"]
        )));
    }
    let claims: RequestClaims = decode_json(payload, "claims")?;
    let server = KeyPair::from_public_key(&claims.iss)
        .ok()
        .filter(|key| matches!(key.key_pair_type(), KeyPairType::Server))
        .ok_or_else(|| {
            CredentialError::MalformedRequest(format!("issuer {} is not a server key", claims.iss))
        })?;
    let signature = URL_SAFE_NO_PAD
        .decode(signature)
        .map_err(|_| CredentialError::MalformedRequest("signature is not base64url".into()))?;
    let signed = &jwt[..header_part.len() + 1 + payload.len()];
    server.verify(signed.as_bytes(), &signature).map_err(|_| {
        CredentialError::MalformedRequest("the server's signature does not verify".into())
    })?;
    if claims.nats.claim_type != "authorization_request" {
        return Err(CredentialError::MalformedRequest(format!(
            "claim type {} is not authorization_request",
            claims.nats.claim_type
        )));
    }
    if claims.exp > 0 && claims.exp < now.timestamp() {
        return Err(CredentialError::MalformedRequest(
            "the request expired".into(),
        ));
    }
    let user = KeyPair::from_public_key(&claims.nats.user_nkey).ok();
    if !user.is_some_and(|key| matches!(key.key_pair_type(), KeyPairType::User)) {
        return Err(CredentialError::MalformedRequest(format!(
            "user_nkey {} is not a user key",
            claims.nats.user_nkey
        )));
    }
    Ok(AuthorizationRequest {
        server_id: claims.nats.server_id.id,
        user_nkey: claims.nats.user_nkey,
        token: claims.nats.connect_opts.auth_token,
        client_name: claims.nats.client_info.name,
    })
}

fn decode_json<T: serde::de::DeserializeOwned>(
    part: &str,
    what: &str,
) -> Result<T, CredentialError> {
    let bytes = URL_SAFE_NO_PAD
        .decode(part)
        .map_err(|_| CredentialError::MalformedRequest(format!("{what} is not base64url")))?;
    serde_json::from_slice(&bytes)
        .map_err(|err| CredentialError::MalformedRequest(format!("{what}: {err}")))
}

/// Answers `request`: a worker whose token `issuer` signed and that has not
/// expired becomes a user of `account` with the worker's permissions.
pub fn answer(
    request: &AuthorizationRequest,
    issuer: &KeyPair,
    account: &str,
    now: DateTime<Utc>,
) -> Result<CalloutAnswer, CredentialError> {
    let decision = match &request.token {
        Some(token) => WorkerToken::verify(token, issuer, now),
        None => Err(CredentialError::MalformedToken(
            "no token given (workers connect with TRAINYARD_NATS_TOKEN)",
        )),
    };
    let body = match &decision {
        Ok(token) => ResponseBody {
            jwt: Some(user_jwt(request, token, issuer, account, now)?),
            error: None,
            claim_type: "authorization_response",
            version: CLAIM_VERSION,
        },
        Err(reason) => ResponseBody {
            jwt: None,
            error: Some(reason.to_string()),
            claim_type: "authorization_response",
            version: CLAIM_VERSION,
        },
    };
    let response = encode(
        Claims {
            aud: Some(&request.server_id),
            exp: None,
            jti: String::new(),
            iat: now.timestamp(),
            iss: issuer.public_key(),
            name: None,
            sub: &request.user_nkey,
            nats: body,
        },
        issuer,
    )?;
    Ok(CalloutAnswer { response, decision })
}

fn user_jwt(
    request: &AuthorizationRequest,
    token: &WorkerToken,
    issuer: &KeyPair,
    account: &str,
    now: DateTime<Utc>,
) -> Result<String, CredentialError> {
    let identity = Identity::Worker {
        namespace: token.ns.clone(),
        job: token.job.clone(),
    };
    let permissions = identity
        .permissions()
        .map_err(|err| CredentialError::Signing(format!("worker permissions: {err}")))?;
    encode(
        Claims {
            // Outside operator mode the audience places the user in an account.
            aud: Some(account),
            exp: Some(token.exp),
            jti: String::new(),
            iat: now.timestamp(),
            iss: issuer.public_key(),
            name: Some(identity.user()),
            sub: &request.user_nkey,
            nats: UserBody {
                publish: Allow {
                    allow: permissions.publish.into_iter().collect(),
                },
                subscribe: Allow {
                    allow: permissions.subscribe.into_iter().collect(),
                },
                subs: -1,
                data: -1,
                payload: -1,
                claim_type: "user",
                version: CLAIM_VERSION,
            },
        },
        issuer,
    )
}

/// Signs `claims` as nats-io/jwt does: the id is the base32 SHA-512/256 of
/// the claims without it, the signature Ed25519 over `header.claims`.
fn encode<T: Serialize>(
    mut claims: Claims<'_, T>,
    key: &KeyPair,
) -> Result<String, CredentialError> {
    let encode_error =
        |err: serde_json::Error| CredentialError::Signing(format!("encode claims: {err}"));
    claims.jti = String::new();
    let unsigned = serde_json::to_vec(&claims).map_err(encode_error)?;
    claims.jti = data_encoding::BASE32_NOPAD.encode(&Sha512_256::digest(&unsigned));
    let payload = serde_json::to_vec(&claims).map_err(encode_error)?;
    let signed = format!(
        "{}.{}",
        URL_SAFE_NO_PAD.encode(JWT_HEADER),
        URL_SAFE_NO_PAD.encode(payload)
    );
    let signature = key
        .sign(signed.as_bytes())
        .map_err(|err| CredentialError::Signing(err.to_string()))?;
    Ok(format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> DateTime<Utc> {
        DateTime::from_timestamp(1_800_000_000, 0).expect("valid time")
    }

    fn claims_of(jwt: &str) -> serde_json::Value {
        let payload = jwt.split('.').nth(1).expect("claims part");
        decode_json(payload, "claims").expect("decodes")
    }

    /// A request as nats-server signs it.
    fn request_jwt(server: &KeyPair, user: &KeyPair, token: Option<&str>) -> String {
        let mut connect = serde_json::json!({"protocol": 1});
        if let Some(token) = token {
            connect["auth_token"] = token.into();
        }
        encode(
            Claims {
                aud: Some("nats-authorization-request"),
                exp: Some(now().timestamp() + 2),
                jti: String::new(),
                iat: now().timestamp(),
                iss: server.public_key(),
                name: None,
                sub: "ISSUER",
                nats: serde_json::json!({
                    "server_id": {"name": "n", "host": "127.0.0.1", "id": server.public_key()},
                    "user_nkey": user.public_key(),
                    "client_info": {"host": "127.0.0.1", "id": 7, "name": "worker-0"},
                    "connect_opts": connect,
                    "type": "authorization_request",
                    "version": 2
                }),
            },
            server,
        )
        .expect("encodes")
    }

    fn worker_token(issuer: &KeyPair, exp: i64) -> String {
        WorkerToken {
            ns: "ml".into(),
            job: "bert".into(),
            exp,
        }
        .sign(issuer)
        .expect("signs")
    }

    #[test]
    fn a_valid_token_gets_a_user_with_exactly_the_workers_permissions() {
        let (server, user, issuer) = (
            KeyPair::new_server(),
            KeyPair::new_user(),
            KeyPair::new_account(),
        );
        let token = worker_token(&issuer, now().timestamp() + 600);
        let request =
            read_request(&request_jwt(&server, &user, Some(&token)), now()).expect("reads");
        assert_eq!(request.client_name.as_deref(), Some("worker-0"));
        let answer = answer(&request, &issuer, "TRAINYARD", now()).expect("answers");
        assert!(answer.decision.is_ok());

        let response = claims_of(&answer.response);
        assert_eq!(response["iss"], issuer.public_key());
        assert_eq!(response["sub"], user.public_key());
        assert_eq!(response["aud"], server.public_key());
        assert_eq!(response["nats"]["type"], "authorization_response");
        let user_jwt = response["nats"]["jwt"].as_str().expect("user jwt");
        let claims = claims_of(user_jwt);
        assert_eq!(claims["sub"], user.public_key());
        assert_eq!(claims["aud"], "TRAINYARD");
        assert_eq!(claims["exp"], now().timestamp() + 600);
        let expected = Identity::Worker {
            namespace: "ml".into(),
            job: "bert".into(),
        }
        .permissions()
        .expect("permissions");
        let allowed = |side: &str| -> Vec<String> {
            serde_json::from_value(claims["nats"][side]["allow"].clone()).expect("list")
        };
        assert_eq!(
            allowed("pub"),
            expected.publish.into_iter().collect::<Vec<_>>()
        );
        assert_eq!(
            allowed("sub"),
            expected.subscribe.into_iter().collect::<Vec<_>>()
        );
        // Both JWTs verify with the issuer's public key.
        for jwt in [answer.response.as_str(), user_jwt] {
            let (signed, signature) = jwt.rsplit_once('.').expect("signature");
            let signature = URL_SAFE_NO_PAD.decode(signature).expect("base64url");
            KeyPair::from_public_key(&issuer.public_key())
                .expect("public key")
                .verify(signed.as_bytes(), &signature)
                .expect("verifies");
        }
    }

    #[test]
    fn an_expired_or_foreign_or_missing_token_gets_an_error_response() {
        let (server, user, issuer) = (
            KeyPair::new_server(),
            KeyPair::new_user(),
            KeyPair::new_account(),
        );
        let expired = worker_token(&issuer, now().timestamp() - 1);
        let foreign = worker_token(&KeyPair::new_account(), now().timestamp() + 600);
        for (token, reason) in [
            (Some(expired.as_str()), "expired"),
            (Some(foreign.as_str()), "signed by another key"),
            (Some("garbage"), "malformed"),
            (None, "no token given"),
        ] {
            let request = read_request(&request_jwt(&server, &user, token), now()).expect("reads");
            let answer = answer(&request, &issuer, "TRAINYARD", now()).expect("answers");
            assert!(answer.decision.is_err(), "{reason}");
            let response = claims_of(&answer.response);
            assert!(response["nats"]["jwt"].is_null(), "{reason}");
            let error = response["nats"]["error"].as_str().expect("error");
            assert!(error.contains(reason), "{error} should say {reason}");
            assert_eq!(response["sub"], user.public_key());
        }
    }

    #[test]
    fn a_request_not_signed_by_its_server_is_not_answered() {
        let (server, user) = (KeyPair::new_server(), KeyPair::new_user());
        let jwt = request_jwt(&server, &user, Some("t"));
        let (claims, _) = jwt.rsplit_once('.').expect("parts");
        let resigned = format!(
            "{claims}.{}",
            URL_SAFE_NO_PAD.encode(
                KeyPair::new_server()
                    .sign(claims.as_bytes())
                    .expect("signs")
            )
        );
        assert!(matches!(
            read_request(&resigned, now()),
            Err(CredentialError::MalformedRequest(_))
        ));
        for garbage in ["", "a.b", "a.b.c", "a.b.c.d"] {
            assert!(read_request(garbage, now()).is_err(), "{garbage:?}");
        }
    }
}
