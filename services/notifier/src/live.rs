//! The routing file and the secrets it names, loaded together and reloaded
//! when any of them changes. A bad reload keeps the last good config.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, RwLock};

use notifier_core::Routing;
use notifier_core::sign::SigningKey;

use crate::error::NotifierError;

/// The secret of one receiver.
#[derive(Clone)]
pub enum Secret {
    SlackWebhookUrl(String),
    SlackToken(String),
    SigningKeys(Vec<SigningKey>),
}

/// A loaded config: routing plus the receivers' secrets.
pub struct Live {
    pub routing: Routing,
    pub secrets: BTreeMap<String, Secret>,
    /// The bytes it was built from, to notice a change.
    fingerprint: Vec<u8>,
}

fn read(file: &str) -> Result<String, NotifierError> {
    std::fs::read_to_string(file).map_err(|err| NotifierError::Secret {
        file: file.to_string(),
        message: err.kind().to_string(),
    })
}

impl Live {
    /// Reads the routing file and every secret file it names.
    pub fn load(routes_file: &Path) -> Result<Self, NotifierError> {
        let name = routes_file.display().to_string();
        let text = std::fs::read_to_string(routes_file)
            .map_err(|err| NotifierError::Config(format!("notifier.routes_file {name}: {err}")))?;
        let routing = Routing::from_yaml(&text)
            .map_err(|source| NotifierError::Routing { file: name, source })?;
        let mut fingerprint = text.into_bytes();
        let mut secrets = BTreeMap::new();
        for receiver in routing.receivers() {
            let (file, secret) = if let Some(slack) = &receiver.slack {
                match (&slack.webhook_url_file, &slack.token_file) {
                    (Some(file), _) => {
                        let url = read(file)?.trim().to_string();
                        (file, Secret::SlackWebhookUrl(url))
                    }
                    (None, Some(file)) => {
                        (file, Secret::SlackToken(read(file)?.trim().to_string()))
                    }
                    (None, None) => continue,
                }
            } else if let Some(webhook) = &receiver.webhook {
                let text = read(&webhook.secret_file)?;
                let keys = SigningKey::parse_file(&receiver.name, &text).map_err(|err| {
                    NotifierError::Secret {
                        file: webhook.secret_file.clone(),
                        message: err.to_string(),
                    }
                })?;
                (&webhook.secret_file, Secret::SigningKeys(keys))
            } else {
                continue;
            };
            fingerprint.extend(read(file)?.into_bytes());
            secrets.insert(receiver.name.clone(), secret);
        }
        Ok(Self {
            routing,
            secrets,
            fingerprint,
        })
    }
}

/// The current config, shared by every task.
#[derive(Clone)]
pub struct LiveConfig {
    current: Arc<RwLock<Arc<Live>>>,
}

impl LiveConfig {
    pub fn new(live: Live) -> Self {
        Self {
            current: Arc::new(RwLock::new(Arc::new(live))),
        }
    }

    pub fn get(&self) -> Arc<Live> {
        match self.current.read() {
            Ok(guard) => guard.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Loads again; Ok(true) when something changed and the new config is in
    /// use, Err when it is invalid (the last good one stays).
    pub fn reload(&self, routes_file: &Path) -> Result<bool, NotifierError> {
        let fresh = Live::load(routes_file)?;
        if fresh.fingerprint == self.get().fingerprint {
            return Ok(false);
        }
        let mut guard = match self.current.write() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        *guard = Arc::new(fresh);
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROUTES: &str = "route: {receiver: slack}\nreceivers:\n  - name: slack\n    slack: {channel: \"#training\", webhook_url_file: URL}\n";

    #[test]
    fn a_bad_reload_keeps_the_last_good_config() {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = dir.path().join("url");
        std::fs::write(&url, "https://hooks.example/T000/B000/secret-part\n").expect("secret");
        let routes = dir.path().join("routes.yaml");
        let good = ROUTES.replace("URL", &url.display().to_string());
        std::fs::write(&routes, &good).expect("routes");
        let live = LiveConfig::new(Live::load(&routes).expect("valid"));
        assert!(!live.reload(&routes).expect("unchanged"), "nothing changed");

        std::fs::write(&routes, good.replace("receiver: slack}", "receiver: slak}"))
            .expect("routes");
        let err = live
            .reload(&routes)
            .expect_err("unknown receiver")
            .to_string();
        assert!(
            err.contains("route.receiver") && err.contains("slak"),
            "{err}"
        );
        assert!(
            live.get().routing.receiver("slack").is_some(),
            "the last good config stays"
        );

        std::fs::write(&routes, &good).expect("routes");
        std::fs::write(&url, "https://hooks.example/T000/B000/rotated\n").expect("rotated");
        assert!(
            live.reload(&routes).expect("valid"),
            "a rotated secret is a change"
        );
        assert!(matches!(
            live.get().secrets.get("slack"),
            Some(Secret::SlackWebhookUrl(u)) if u.ends_with("rotated")
        ));

        std::fs::remove_file(&url).expect("remove");
        let err = live
            .reload(&routes)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            err.contains(&url.display().to_string()) && !err.contains("rotated"),
            "{err}"
        );
    }
}
