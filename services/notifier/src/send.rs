//! One delivery attempt over HTTP: Slack (incoming webhook or
//! `chat.postMessage`) or a signed webhook. Never follows redirects, so a
//! configured URL cannot be bounced elsewhere.

use std::time::Duration;

use chrono::Utc;
use notifier_core::delivery::{self, Verdict};
use notifier_core::render;
use notifier_core::routing::ReceiverSpec;
use notifier_core::{Notification, sign};

use crate::live::Secret;

#[derive(Clone)]
pub struct Sender {
    client: reqwest::Client,
}

impl Sender {
    pub fn new(timeout: Duration) -> Result<Self, reqwest::Error> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(Self { client })
    }

    pub async fn attempt(
        &self,
        receiver: &ReceiverSpec,
        secret: Option<&Secret>,
        notification: &Notification,
    ) -> Verdict {
        let request = match (receiver, secret) {
            (ReceiverSpec { slack: Some(_), .. }, Some(Secret::SlackWebhookUrl(url))) => self
                .client
                .post(url)
                .json(&render::slack_message(notification, None)),
            (
                ReceiverSpec {
                    slack: Some(slack), ..
                },
                Some(Secret::SlackToken(token)),
            ) => {
                let channel = notification
                    .destination
                    .channel
                    .as_deref()
                    .unwrap_or(&slack.channel);
                self.client
                    .post(format!(
                        "{}/chat.postMessage",
                        slack.api_url.trim_end_matches('/')
                    ))
                    .bearer_auth(token)
                    .json(&render::slack_message(notification, Some(channel)))
            }
            (
                ReceiverSpec {
                    webhook: Some(webhook),
                    ..
                },
                Some(Secret::SigningKeys(keys)),
            ) => {
                let body = match serde_json::to_vec(&render::webhook_body(notification)) {
                    Ok(body) => body,
                    Err(err) => {
                        return Verdict::Rejected {
                            why: format!("cannot encode the body: {err}"),
                        };
                    }
                };
                let headers =
                    match sign::headers(keys, &notification.id, Utc::now().timestamp(), &body) {
                        Ok(headers) => headers,
                        Err(err) => {
                            return Verdict::Rejected {
                                why: err.to_string(),
                            };
                        }
                    };
                let mut request = self
                    .client
                    .post(&webhook.url)
                    .header("content-type", "application/json")
                    .body(body);
                for (name, value) in headers {
                    request = request.header(name, value);
                }
                request
            }
            _ => {
                return Verdict::Rejected {
                    why: format!("receiver {} has no usable secret", receiver.name),
                };
            }
        };
        let response = match request.send().await {
            Ok(response) => response,
            Err(err) => {
                let why = if err.is_timeout() {
                    "request timed out".to_string()
                } else if err.is_connect() {
                    "cannot connect".to_string()
                } else {
                    "request failed".to_string()
                };
                return delivery::verdict(None, None, &why);
            }
        };
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| delivery::retry_after(v, Utc::now()));
        let body = response.text().await.unwrap_or_default();
        let verdict = delivery::verdict(Some(status), retry_after, body.trim());
        // chat.postMessage answers 200 with {"ok": false, "error": …} on failure.
        if verdict == Verdict::Delivered && receiver.slack.is_some() && body.contains("\"ok\"") {
            let parsed: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            if parsed["ok"] == serde_json::Value::Bool(false) {
                let error = parsed["error"].as_str().unwrap_or("unknown").to_string();
                return match error.as_str() {
                    "ratelimited" | "service_unavailable" | "request_timeout" | "fatal_error" => {
                        Verdict::Retry {
                            after: retry_after,
                            why: format!("slack: {error}"),
                        }
                    }
                    _ => Verdict::Rejected {
                        why: format!("slack: {error}"),
                    },
                };
            }
        }
        verdict
    }
}
