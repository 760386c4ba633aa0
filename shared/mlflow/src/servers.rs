//! Which MLflow server a service logs to on a job's behalf.
//!
//! A job (or a Sweep's trial template) may name its own tracking server in
//! `spec.monitoring.mlflowTrackingUri`. A service follows it only when the
//! operator listed that server in the service's
//! `mlflow_allowed_tracking_uris`: the service sends its own MLflow
//! credentials to whatever server it logs to, so following any URL a user
//! writes would hand them (and a request from inside the cluster) to that
//! user. Servers are compared in a normalised form, scheme, host, port and
//! path segments ([`ServerUri`]); an allowed entry admits its own path and
//! every path below it.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::Url;
use serde::{Deserialize, Deserializer};
use tokio_util::sync::CancellationToken;

use crate::{MlflowAccess, MlflowClient, MlflowError, RetryPolicy};

/// The config key of the allow-list, as services name it (after their section).
pub const ALLOWED_TRACKING_URIS_KEY: &str = "mlflow_allowed_tracking_uris";

/// A tracking server in the form servers are compared in: lower-case scheme
/// (`http` or `https`) and host, the port (the scheme's default when none is
/// written), and the path's non-empty segments with `.` and `..` resolved.
/// URIs carrying a user or password, a query or a fragment have no such
/// form: they are never matched (a `http://allowed@evil` names the host
/// `evil`, and MLflow URIs carry none of these).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServerUri {
    scheme: String,
    host: String,
    port: u16,
    segments: Vec<String>,
}

impl ServerUri {
    /// The normalised form of `uri`, or why it cannot be a tracking server.
    pub fn parse(uri: &str) -> Result<Self, String> {
        let url = Url::parse(uri.trim()).map_err(|err| format!("not a URL: {err}"))?;
        let scheme = url.scheme();
        if scheme != "http" && scheme != "https" {
            return Err(format!("scheme {scheme:?} is not http or https"));
        }
        if !url.username().is_empty() || url.password().is_some() {
            return Err("a user or password in the URL is not accepted".into());
        }
        if url.query().is_some() || url.fragment().is_some() {
            return Err("a query or fragment is not accepted".into());
        }
        let host = url
            .host_str()
            .filter(|host| !host.is_empty())
            .ok_or_else(|| "no host".to_string())?;
        let port = url
            .port_or_known_default()
            .ok_or_else(|| "no port".to_string())?;
        let segments = url
            .path_segments()
            .map(|segments| {
                segments
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        Ok(Self {
            scheme: scheme.to_string(),
            // A fully qualified name's trailing dot names the same host.
            host: host.trim_end_matches('.').to_ascii_lowercase(),
            port,
            segments,
        })
    }

    /// Whether `other` is this server or a path below it.
    pub fn contains(&self, other: &ServerUri) -> bool {
        self.scheme == other.scheme
            && self.host == other.host
            && self.port == other.port
            && other.segments.starts_with(&self.segments)
    }
}

impl fmt::Display for ServerUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://{}:{}", self.scheme, self.host, self.port)?;
        for segment in &self.segments {
            write!(f, "/{segment}")?;
        }
        Ok(())
    }
}

/// The servers a service may log to on a job's behalf, besides its own.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowedServers(Vec<ServerUri>);

impl AllowedServers {
    /// The allow-list from its config entries; an entry that is not a usable
    /// server is an [`MlflowError::Access`] naming the key and the entry.
    pub fn parse(entries: &[String]) -> Result<Self, MlflowError> {
        entries
            .iter()
            .enumerate()
            .map(|(index, entry)| {
                ServerUri::parse(entry).map_err(|reason| MlflowError::Access {
                    key: ALLOWED_TRACKING_URIS_KEY,
                    reason: format!(
                        "entry {index} ({entry:?}): {reason}; list servers as scheme://host[:port][/path]"
                    ),
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Self)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether some entry admits `uri`.
    pub fn admits(&self, uri: &ServerUri) -> bool {
        self.0.iter().any(|allowed| allowed.contains(uri))
    }
}

/// Where a service logs for one job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerChoice {
    /// The service's own server: the job names none.
    Default,
    /// The service's own server, named by the job as it writes it.
    Own(String),
    /// The allowed server the job names, as the job writes it.
    Requested(String),
    /// The job names a server the service may not log to: the service logs
    /// to its own, and the job's owner should be told why.
    Refused { uri: String, reason: String },
}

impl ServerChoice {
    /// The job's server when it is honoured, else `default_uri`: the server
    /// the service's records for the job are on, as the job names it (so the
    /// planner can tell it is the job's own).
    pub fn uri<'a>(&'a self, default_uri: &'a str) -> &'a str {
        match self {
            ServerChoice::Own(uri) | ServerChoice::Requested(uri) => uri,
            ServerChoice::Default | ServerChoice::Refused { .. } => default_uri,
        }
    }
}

/// Chooses where to log for a job naming `requested` (its
/// `monitoring.mlflowTrackingUri`): `default` is the service's own server
/// (unset when its URI has no normalised form), `allowed` the allow-list,
/// `key` the allow-list's full config key for the refusal's text.
pub fn choose_server(
    default: Option<&ServerUri>,
    allowed: &AllowedServers,
    requested: Option<&str>,
    key: &str,
) -> ServerChoice {
    let Some(requested) = requested.map(str::trim).filter(|uri| !uri.is_empty()) else {
        return ServerChoice::Default;
    };
    let refused = |reason: String| ServerChoice::Refused {
        uri: requested.to_string(),
        reason,
    };
    match ServerUri::parse(requested) {
        Ok(server) if default == Some(&server) => ServerChoice::Own(requested.to_string()),
        Ok(server) if allowed.admits(&server) => ServerChoice::Requested(requested.to_string()),
        Ok(server) => refused(format!("{server} is not in {key}")),
        Err(reason) => refused(format!(
            "{requested:?} is not a tracking server the service can use: {reason}"
        )),
    }
}

/// A service's MLflow clients: its own server's, made at start, and one per
/// allowed server a job names, made on first use with the same credentials
/// and CA (so every allowed server receives the service's credentials).
#[derive(Clone)]
pub struct MlflowServers {
    default_uri: String,
    default_server: Option<ServerUri>,
    default: MlflowClient,
    allowed: AllowedServers,
    /// The allow-list's full config key, e.g. `hpo_tuner.mlflow_allowed_tracking_uris`.
    key: String,
    settings: ClientSettings,
    clients: Arc<Mutex<HashMap<ServerUri, MlflowClient>>>,
}

/// How a service's clients are made, whatever the server.
#[derive(Debug, Clone)]
pub struct ClientSettings {
    pub access: MlflowAccess,
    pub timeout: Duration,
    pub retry: RetryPolicy,
    pub shutdown: CancellationToken,
}

impl ClientSettings {
    fn client(&self, uri: &str) -> Result<MlflowClient, MlflowError> {
        MlflowClient::with_access(
            uri,
            &self.access,
            self.timeout,
            self.retry.clone(),
            self.shutdown.clone(),
        )
    }
}

impl MlflowServers {
    /// The client of `default_uri` and the allow-list from `allowed`'s
    /// entries; `key` is the allow-list's full config key, for messages.
    pub fn new(
        default_uri: &str,
        allowed: &[String],
        key: impl Into<String>,
        settings: ClientSettings,
    ) -> Result<Self, MlflowError> {
        let allowed = AllowedServers::parse(allowed)?;
        let default = settings.client(default_uri)?;
        Ok(Self {
            default_uri: default_uri.trim().to_string(),
            default_server: ServerUri::parse(default_uri).ok(),
            default,
            allowed,
            key: key.into(),
            settings,
            clients: Arc::default(),
        })
    }

    /// The service's own server, as configured.
    pub fn default_uri(&self) -> &str {
        &self.default_uri
    }

    /// The client of the service's own server.
    pub fn default_client(&self) -> &MlflowClient {
        &self.default
    }

    /// Where to log for a job naming `requested` (see [`choose_server`]).
    pub fn choose(&self, requested: Option<&str>) -> ServerChoice {
        choose_server(
            self.default_server.as_ref(),
            &self.allowed,
            requested,
            &self.key,
        )
    }

    /// The client for `choice`: the default one unless an allowed server was
    /// requested, whose client is made once and kept. It speaks to the
    /// normalised form the allow-list admitted, not the job's text.
    pub fn client(&self, choice: &ServerChoice) -> Result<MlflowClient, MlflowError> {
        let ServerChoice::Requested(uri) = choice else {
            return Ok(self.default.clone());
        };
        let server = ServerUri::parse(uri).map_err(|reason| MlflowError::InvalidUri {
            uri: uri.clone(),
            reason,
        })?;
        let mut clients = self
            .clients
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(client) = clients.get(&server) {
            return Ok(client.clone());
        }
        let client = self.settings.client(&server.to_string())?;
        tracing::info!(server = %server, "made an MLflow client for a server a job names");
        clients.insert(server, client.clone());
        Ok(client)
    }
}

/// Reads a list of URIs given either as a list (a config file) or as one
/// string separated by commas or blanks (an environment variable).
pub fn deserialize_uri_list<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrMany {
        One(String),
        Many(Vec<String>),
    }
    Ok(match OneOrMany::deserialize(deserializer)? {
        OneOrMany::One(text) => text
            .split(|c: char| c == ',' || c.is_whitespace())
            .filter(|uri| !uri.is_empty())
            .map(str::to_string)
            .collect(),
        OneOrMany::Many(uris) => uris
            .into_iter()
            .map(|uri| uri.trim().to_string())
            .filter(|uri| !uri.is_empty())
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "svc.mlflow_allowed_tracking_uris";

    fn allowed(entries: &[&str]) -> AllowedServers {
        AllowedServers::parse(&entries.iter().map(|e| e.to_string()).collect::<Vec<_>>())
            .expect("valid allow-list")
    }

    fn choose(list: &AllowedServers, requested: &str) -> ServerChoice {
        let default = ServerUri::parse("http://mlflow.mlflow:5000").expect("default");
        choose_server(Some(&default), list, Some(requested), KEY)
    }

    fn admitted(list: &AllowedServers, requested: &str) -> bool {
        matches!(choose(list, requested), ServerChoice::Requested(_))
    }

    #[test]
    fn servers_are_normalised_before_they_are_compared() {
        let uri = |text: &str| ServerUri::parse(text).expect(text).to_string();
        assert_eq!(
            uri("http://MLflow.Example.COM"),
            "http://mlflow.example.com:80"
        );
        assert_eq!(
            uri("https://mlflow.example.com/"),
            "https://mlflow.example.com:443"
        );
        assert_eq!(
            uri("HTTPS://mlflow.example.com:443//team//"),
            "https://mlflow.example.com:443/team"
        );
        assert_eq!(
            uri("http://mlflow.example.com./a/./b/../c"),
            "http://mlflow.example.com:80/a/c"
        );
        assert_eq!(uri(" http://[::1]:5000 "), "http://[::1]:5000");
    }

    #[test]
    fn an_allowed_server_admits_itself_and_the_paths_below_it() {
        let list = allowed(&["https://mlflow.example.com/team-a/", "http://10.0.0.7:5000"]);
        for ok in [
            "https://mlflow.example.com/team-a",
            "https://mlflow.example.com/team-a/",
            "https://MLFLOW.example.com:443/team-a/sub",
            "https://mlflow.example.com./team-a",
            "http://10.0.0.7:5000/",
        ] {
            assert!(admitted(&list, ok), "{ok}");
        }
        for refused in [
            // Another path, or a name that only starts like the allowed one.
            "https://mlflow.example.com/team-b",
            "https://mlflow.example.com/team-a-evil",
            "https://mlflow.example.com/",
            "https://mlflow.example.com/team-a/../team-b",
            // Another scheme, port or host.
            "http://mlflow.example.com/team-a",
            "https://mlflow.example.com:8443/team-a",
            "https://mlflow.example.com.evil.io/team-a",
            "https://evil.io/mlflow.example.com/team-a",
            "http://10.0.0.7:5001",
            "http://10.0.0.70:5000",
        ] {
            assert!(
                matches!(choose(&list, refused), ServerChoice::Refused { ref reason, .. } if reason.ends_with(&format!("is not in {KEY}"))),
                "{refused}"
            );
        }
    }

    #[test]
    fn user_info_queries_and_other_schemes_are_never_admitted() {
        let list = allowed(&["https://mlflow.example.com"]);
        for trick in [
            // The host of these is evil.io: what precedes `@` is a user name.
            "https://mlflow.example.com@evil.io",
            "https://mlflow.example.com:443@evil.io/",
            "https://mlflow.example.com%2F@evil.io",
            // A user on the allowed host is refused too: credentials come from config.
            "https://someone:secret@mlflow.example.com",
            "https://mlflow.example.com/?next=http://evil.io",
            "https://mlflow.example.com/#frag",
            "file:///etc/passwd",
            "ftp://mlflow.example.com",
            "mlflow.example.com",
            "databricks",
        ] {
            assert!(
                matches!(choose(&list, trick), ServerChoice::Refused { .. }),
                "{trick}"
            );
        }
    }

    #[test]
    fn the_default_server_needs_no_entry_and_no_request_means_default() {
        let empty = AllowedServers::default();
        let own = choose(&empty, "http://MLFLOW.mlflow:5000/");
        assert_eq!(own, ServerChoice::Own("http://MLFLOW.mlflow:5000/".into()));
        assert_eq!(
            own.uri("http://mlflow.mlflow:5000"),
            "http://MLFLOW.mlflow:5000/",
            "the job's own writing of the service's server"
        );
        let default = ServerUri::parse("http://mlflow.mlflow:5000").ok();
        assert_eq!(
            choose_server(default.as_ref(), &empty, None, KEY),
            ServerChoice::Default
        );
        assert_eq!(
            choose_server(default.as_ref(), &empty, Some("  "), KEY),
            ServerChoice::Default
        );
        let refused = choose(&empty, "http://other:5000");
        assert_eq!(
            refused.uri("http://mlflow.mlflow:5000"),
            "http://mlflow.mlflow:5000"
        );
        let list = allowed(&["http://other:5000"]);
        let requested = choose(&list, "http://other:5000/");
        assert_eq!(
            requested,
            ServerChoice::Requested("http://other:5000/".into())
        );
        assert_eq!(
            requested.uri("http://mlflow.mlflow:5000"),
            "http://other:5000/",
            "as the job writes it"
        );
    }

    #[test]
    fn an_unusable_allow_list_entry_names_the_key_and_the_entry() {
        for (entry, says) in [
            ("mlflow.example.com", "not a URL"),
            ("s3://bucket", "scheme \"s3\""),
            ("https://user:pw@mlflow.example.com", "user or password"),
            ("https://mlflow.example.com/?x=1", "query"),
        ] {
            let err = AllowedServers::parse(&["http://ok:5000".into(), entry.into()])
                .expect_err(entry)
                .to_string();
            assert!(
                err.starts_with(&format!(
                    "mlflow_allowed_tracking_uris: entry 1 ({entry:?}): "
                )) && err.contains(says),
                "{err}"
            );
        }
    }

    #[test]
    fn uri_lists_come_as_lists_or_as_one_separated_string() {
        let read = |json: &str| {
            deserialize_uri_list(&mut serde_json::Deserializer::from_str(json)).expect(json)
        };
        assert_eq!(
            read(r#"["http://a:1", " ", "http://b:2 "]"#),
            ["http://a:1", "http://b:2"]
        );
        assert_eq!(
            read(r#""http://a:1, http://b:2""#),
            ["http://a:1", "http://b:2"]
        );
        assert!(read(r#""""#).is_empty());
    }

    #[test]
    fn allowed_servers_get_one_client_each_made_when_first_used() {
        let servers = MlflowServers::new(
            "http://mlflow.mlflow:5000",
            &["http://other:5000".into()],
            KEY,
            ClientSettings {
                access: MlflowAccess::default(),
                timeout: Duration::from_secs(1),
                retry: RetryPolicy::default(),
                shutdown: CancellationToken::new(),
            },
        )
        .expect("servers");
        let default = servers.client(&servers.choose(None)).expect("default");
        assert_eq!(
            default.api_url().as_str(),
            "http://mlflow.mlflow:5000/api/2.0/mlflow/"
        );
        let other = servers
            .client(&servers.choose(Some("http://OTHER.:5000/team/./x/..//")))
            .expect("other");
        assert_eq!(
            other.api_url().as_str(),
            "http://other:5000/team/api/2.0/mlflow/",
            "the normalised server"
        );
        let refused = servers
            .client(&servers.choose(Some("http://evil:5000")))
            .expect("default");
        assert_eq!(refused.api_url(), default.api_url());
        servers
            .client(&servers.choose(Some("http://other:5000/team/")))
            .expect("same server");
        assert_eq!(servers.clients.lock().expect("lock").len(), 1);
    }
}
