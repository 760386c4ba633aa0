//! Standard Webhooks signatures: `webhook-signature: v1,<base64 HMAC-SHA256 of
//! "<webhook-id>.<webhook-timestamp>.<body>">`, one per secret during a rotation.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::error::CoreError;

/// A signing secret, from its `whsec_<base64>` text.
#[derive(Clone)]
pub struct SigningKey(Vec<u8>);

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SigningKey(redacted)")
    }
}

impl SigningKey {
    /// Parses `whsec_<base64>`; `name` names the secret in errors (never its value).
    pub fn parse(name: &str, text: &str) -> Result<Self, CoreError> {
        let encoded = text
            .trim()
            .strip_prefix("whsec_")
            .ok_or_else(|| CoreError::Secret {
                name: name.to_string(),
                message: "must start with whsec_ followed by base64".into(),
            })?;
        let bytes = STANDARD.decode(encoded).map_err(|err| CoreError::Secret {
            name: name.to_string(),
            message: format!("not base64 after whsec_: {err}"),
        })?;
        if bytes.len() < 24 {
            return Err(CoreError::Secret {
                name: name.to_string(),
                message: format!("{} bytes; use at least 24 random bytes", bytes.len()),
            });
        }
        Ok(Self(bytes))
    }

    /// Every line of a secret file is one key.
    pub fn parse_file(name: &str, text: &str) -> Result<Vec<Self>, CoreError> {
        let keys: Vec<Self> = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| Self::parse(name, l))
            .collect::<Result<_, _>>()?;
        if keys.is_empty() {
            return Err(CoreError::Secret {
                name: name.to_string(),
                message: "is empty; write one whsec_… secret per line".into(),
            });
        }
        Ok(keys)
    }

    fn sign(&self, id: &str, timestamp: i64, body: &[u8]) -> Result<String, CoreError> {
        let mut mac = Hmac::<Sha256>::new_from_slice(&self.0).map_err(|err| CoreError::Secret {
            name: "signing key".into(),
            message: err.to_string(),
        })?;
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        Ok(format!(
            "v1,{}",
            STANDARD.encode(mac.finalize().into_bytes())
        ))
    }
}

/// The three Standard Webhooks headers for one delivery.
pub fn headers(
    keys: &[SigningKey],
    id: &str,
    timestamp: i64,
    body: &[u8],
) -> Result<[(&'static str, String); 3], CoreError> {
    let signatures = keys
        .iter()
        .map(|k| k.sign(id, timestamp, body))
        .collect::<Result<Vec<_>, _>>()?;
    Ok([
        ("webhook-id", id.to_string()),
        ("webhook-timestamp", timestamp.to_string()),
        ("webhook-signature", signatures.join(" ")),
    ])
}
