//! NATS identities and what each may publish and subscribe to, derived from the
//! message catalogue, the streams, the durable consumers and the buckets, so the
//! permissions cannot drift from what the services do. The nats-server
//! authorization block in `deploy/nats/auth.conf` is generated from here
//! (`cargo run -p trainyard-contracts --bin nats-auth-config`) and a test fails
//! when it drifts.
//!
//! Every identity gets an allow list; NATS refuses everything else. Services
//! may create, update and read the contract streams and their own buckets, and
//! consume the streams they have consumers on; no identity may delete or purge
//! a stream or another service's bucket.

use std::collections::BTreeSet;

use crate::catalog::{self, CatalogEntry};
use crate::error::ContractError;
use crate::streams::{self, Service};
use crate::subject;

/// The account every Trainyard identity lives in.
pub const ACCOUNT: &str = "TRAINYARD";

/// Where nats-server asks its auth callout (the planner) about a connection
/// that presented no service password: a worker with its job's token.
pub const AUTH_CALLOUT_SUBJECT: &str = "$SYS.REQ.USER.AUTH";
/// Where the callout's answers go: the server's own reply inboxes.
pub const AUTH_CALLOUT_REPLIES: &str = "$SYS._INBOX.>";
/// Environment variable holding the callout issuer's public account nkey on
/// the nats-server.
pub const CALLOUT_ISSUER_VARIABLE: &str = "TRAINYARD_NATS_CALLOUT_ISSUER";

/// Who connects to NATS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    /// One of the seven services.
    Service(Service),
    /// An external system that submits TrainingJobs into `namespaces` and hears
    /// back about them.
    Submitter {
        name: String,
        namespaces: Vec<String>,
    },
    /// The workers of one TrainingJob: they report only for that job.
    Worker { namespace: String, job: String },
    /// A person operating the installation with the `trainyard` or the `nats`
    /// CLI: inspects streams, republishes dead letters. Everything is allowed; its password
    /// is kept apart from the services'.
    Operator,
}

/// The subjects an identity may publish and subscribe to.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Permissions {
    pub publish: BTreeSet<String>,
    pub subscribe: BTreeSet<String>,
}

impl Identity {
    /// The NATS user name.
    pub fn user(&self) -> String {
        match self {
            Identity::Service(service) => service.name().to_string(),
            Identity::Submitter { name, .. } => format!("submitter-{name}"),
            Identity::Worker { namespace, job } => format!("worker-{namespace}-{job}"),
            Identity::Operator => "operator".to_string(),
        }
    }

    /// Prefix of this identity's reply inboxes (set as the client's inbox
    /// prefix), so no identity can read another's replies.
    pub fn inbox_prefix(&self) -> String {
        match self {
            Identity::Service(service) => format!("_INBOX.{}", service.name()),
            Identity::Submitter { name, .. } => {
                format!("_INBOX.submitter.{}", subject::token(name))
            }
            Identity::Worker { namespace, job } => format!(
                "_INBOX.worker.{}.{}",
                subject::token(namespace),
                subject::token(job)
            ),
            Identity::Operator => "_INBOX.operator".to_string(),
        }
    }

    /// What this identity may do, derived from the catalogue.
    pub fn permissions(&self) -> Result<Permissions, ContractError> {
        let entries = catalog::all()?;
        let mut permissions = Permissions::default();
        if *self == Identity::Operator {
            permissions.publish.insert(">".to_string());
            permissions.subscribe.insert(">".to_string());
            return Ok(permissions);
        }
        permissions
            .subscribe
            .insert(format!("{}.>", self.inbox_prefix()));
        for entry in &entries {
            let publishers = publishers(entry)?;
            match self {
                Identity::Service(service) => {
                    if publishers.contains(&Publisher::Service(*service))
                        || publishers.contains(&Publisher::AnyService)
                    {
                        permissions.publish.insert(any_kind_if_alert(scoped(
                            &entry.subject_pattern,
                            "*",
                            "*",
                        )));
                    }
                }
                Identity::Submitter { namespaces, .. } => {
                    for namespace in namespaces {
                        let ns = subject::token(namespace);
                        if publishers.contains(&Publisher::Submitter) {
                            permissions
                                .publish
                                .insert(scoped(&entry.subject_pattern, &ns, "*"));
                        }
                        if entry.consumers.contains("submitter")
                            || entry.consumers.contains("external subscribers")
                        {
                            permissions
                                .subscribe
                                .insert(scoped(&entry.subject_pattern, &ns, "*"));
                        }
                    }
                }
                Identity::Operator => {}
                Identity::Worker { namespace, job } => {
                    let (ns, name) = (subject::token(namespace), subject::token(job));
                    if publishers.contains(&Publisher::Worker) {
                        permissions
                            .publish
                            .insert(scoped(&entry.subject_pattern, &ns, &name));
                    }
                    if entry.consumers.contains("training workers") {
                        // One subscription hears every command to the job.
                        permissions.subscribe.insert(any_kind(&scoped(
                            &entry.subject_pattern,
                            &ns,
                            &name,
                        )));
                    }
                }
            }
        }
        if let Identity::Service(service) = self {
            add_jetstream(*service, &mut permissions);
            if *service == Service::Planner {
                // The planner answers the auth callout for workers.
                permissions
                    .subscribe
                    .insert(AUTH_CALLOUT_SUBJECT.to_string());
                permissions.publish.insert(AUTH_CALLOUT_REPLIES.to_string());
            }
        }
        Ok(permissions)
    }
}

/// Who the catalogue says publishes a message type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Publisher {
    Service(Service),
    AnyService,
    Submitter,
    Worker,
}

/// Reads an entry's `publisher` text. An unknown publisher is an error, so a new
/// catalogue entry cannot leave its publisher without a permission.
fn publishers(entry: &CatalogEntry) -> Result<Vec<Publisher>, ContractError> {
    let text = entry.publisher;
    if text == "any service" {
        return Ok(vec![Publisher::AnyService]);
    }
    if text.starts_with("external systems") {
        return Ok(vec![Publisher::Submitter]);
    }
    if text.starts_with("training workers") {
        return Ok(vec![Publisher::Worker]);
    }
    text.split(", ")
        .map(|name| {
            Service::ALL
                .iter()
                .find(|service| service.name() == name)
                .map(|service| Publisher::Service(*service))
                .ok_or(ContractError::UnknownPublisher {
                    message_type: entry.message_type,
                    publisher: text,
                })
        })
        .collect()
}

/// The subject pattern with its `<namespace>` and `<name>` placeholders filled.
fn scoped(pattern: &str, namespace: &str, name: &str) -> String {
    pattern
        .replace("<namespace>", namespace)
        .replace("<name>", name)
}

/// An alert's kind token is its severity, so an alert publisher may use any.
fn any_kind_if_alert(subject: String) -> String {
    let alerts = format!("{}.{}.", subject::ROOT, subject::Family::Alerts.as_str());
    match subject.strip_prefix(&alerts) {
        Some(rest) => match rest.split_once('.') {
            Some((_severity, entity)) => format!("{alerts}*.{entity}"),
            None => subject,
        },
        None => subject,
    }
}

/// `trainyard.<family>.<kind>.<rest>` with any kind.
fn any_kind(subject: &str) -> String {
    let tokens: Vec<&str> = subject.splitn(4, '.').collect();
    match tokens.as_slice() {
        [root, family, _kind, rest] => format!("{root}.{family}.*.{rest}"),
        _ => subject.to_string(),
    }
}

/// JetStream API access: create, update and read every contract stream (each
/// service provisions them all at start-up), its own buckets whole, and the
/// streams it consumes; publish its dead letters.
fn add_jetstream(service: Service, permissions: &mut Permissions) {
    let publish = &mut permissions.publish;
    // Account limits, read before a bucket is created.
    publish.insert("$JS.API.INFO".to_string());
    for stream in streams::ALL {
        for verb in ["CREATE", "UPDATE", "INFO"] {
            publish.insert(format!("$JS.API.STREAM.{verb}.{}", stream.name));
        }
    }
    for consumer in service.consumers() {
        let stream = consumer.stream.name;
        publish.insert(format!("$JS.API.CONSUMER.CREATE.{stream}"));
        publish.insert(format!("$JS.API.CONSUMER.CREATE.{stream}.>"));
        publish.insert(format!("$JS.API.CONSUMER.INFO.{stream}.>"));
        publish.insert(format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.>"));
        publish.insert(format!("$JS.ACK.{stream}.>"));
        publish.insert(subject::dead_letter(stream, &consumer.durable));
    }
    for bucket in service.buckets() {
        let stream = format!("KV_{}", bucket.name());
        for verb in [
            "STREAM.CREATE",
            "STREAM.UPDATE",
            "STREAM.INFO",
            "STREAM.MSG.GET",
        ] {
            publish.insert(format!("$JS.API.{verb}.{stream}"));
        }
        publish.insert(format!("$JS.API.DIRECT.GET.{stream}"));
        publish.insert(format!("$JS.API.DIRECT.GET.{stream}.>"));
        publish.insert(format!("$JS.API.CONSUMER.CREATE.{stream}"));
        publish.insert(format!("$JS.API.CONSUMER.CREATE.{stream}.>"));
        publish.insert(format!("$JS.API.CONSUMER.INFO.{stream}.>"));
        publish.insert(format!("$JS.API.CONSUMER.DELETE.{stream}.>"));
        publish.insert(format!("$JS.API.CONSUMER.MSG.NEXT.{stream}.>"));
        publish.insert(format!("$JS.ACK.{stream}.>"));
        publish.insert(format!("$KV.{}.>", bucket.name()));
    }
}

/// Every identity the deployment has: the seven services, the operator and the
/// given submitters. Worker identities are per job (docs/security.md).
pub fn deployment(submitters: &[Identity]) -> Vec<Identity> {
    Service::ALL
        .iter()
        .map(|service| Identity::Service(*service))
        .chain([Identity::Operator])
        .chain(submitters.iter().cloned())
        .collect()
}

/// Environment variable holding an identity's password on the nats-server.
pub fn password_variable(identity: &Identity) -> String {
    let user: String = identity
        .user()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_uppercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("TRAINYARD_NATS_PASSWORD_{user}")
}

/// The nats-server `accounts` block for `identities`: one user each, password
/// from the environment variable [`password_variable`] names, and its allow lists.
/// The server's main configuration includes it (`include auth.conf`).
pub fn server_config(identities: &[Identity]) -> Result<String, ContractError> {
    server_config_with(identities, false)
}

/// [`server_config`], and with `auth_callout` the `authorization { auth_callout }`
/// block: every other connection (a worker with its job's token) is handed
/// to the planner, which answers as the account nkey whose public key is in
/// [`CALLOUT_ISSUER_VARIABLE`]; `identities` are its `auth_users` and keep
/// their passwords.
pub fn server_config_with(
    identities: &[Identity],
    auth_callout: bool,
) -> Result<String, ContractError> {
    let mut out = String::from(
        "# NATS users and permissions of Trainyard, generated from shared/contracts by\n\
         # `cargo run -p trainyard-contracts --bin nats-auth-config`; do not edit.\n\
         # Each password comes from the environment variable named beside it.\n",
    );
    out.push_str(&format!(
        "accounts {{\n  {ACCOUNT} {{\n    jetstream: enabled\n    users: [\n"
    ));
    for identity in identities {
        let permissions = identity.permissions()?;
        out.push_str(&format!(
            "      {{\n        user: \"{}\"\n        password: ${}\n        permissions: {{\n",
            identity.user(),
            password_variable(identity)
        ));
        out.push_str(&format!(
            "          publish: {{ allow: {} }}\n          subscribe: {{ allow: {} }}\n        }}\n      }}\n",
            list(&permissions.publish),
            list(&permissions.subscribe)
        ));
    }
    out.push_str("    ]\n  }\n}\n");
    if auth_callout {
        let users: Vec<String> = identities
            .iter()
            .map(|identity| format!("      \"{}\"\n", identity.user()))
            .collect();
        out.push_str(&format!(
            "# Connections of no user above (workers, with their job's token) are\n\
             # authorized by the planner; see docs/security.md.\n\
             authorization {{\n  auth_callout {{\n    issuer: ${CALLOUT_ISSUER_VARIABLE}\n    \
             account: \"{ACCOUNT}\"\n    auth_users: [\n{}    ]\n  }}\n}}\n",
            users.concat()
        ));
    }
    Ok(out)
}

fn list(subjects: &BTreeSet<String>) -> String {
    let quoted: Vec<String> = subjects
        .iter()
        .map(|s| format!("            \"{s}\"\n"))
        .collect();
    format!("[\n{}          ]", quoted.concat())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn worker() -> Identity {
        Identity::Worker {
            namespace: "ml".into(),
            job: "bert.v2".into(),
        }
    }

    #[test]
    fn a_worker_reports_only_for_its_own_job() {
        let permissions = worker().permissions().expect("permissions");
        assert_eq!(
            permissions.publish,
            BTreeSet::from([
                "trainyard.worker.checkpoint.ml.bert_v2".to_string(),
                "trainyard.worker.progress.ml.bert_v2".to_string(),
                "trainyard.worker.utilization.ml.bert_v2".to_string(),
            ])
        );
        assert_eq!(
            permissions.subscribe,
            BTreeSet::from([
                "_INBOX.worker.ml.bert_v2.>".to_string(),
                "trainyard.commands.*.ml.bert_v2".to_string(),
            ])
        );
        assert!(
            permissions
                .subscribe
                .iter()
                .all(|s| s.contains("ml.bert_v2"))
        );
    }

    #[test]
    fn a_submitter_publishes_only_into_its_namespaces() {
        let permissions = Identity::Submitter {
            name: "ci".into(),
            namespaces: vec!["team-a".into()],
        }
        .permissions()
        .expect("permissions");
        assert_eq!(
            permissions.publish,
            BTreeSet::from(["trainyard.submit.trainingjob.team-a.*".to_string()])
        );
        assert!(
            permissions
                .subscribe
                .contains("trainyard.submit.result.team-a.*")
        );
        assert!(
            permissions
                .subscribe
                .contains("trainyard.lifecycle.trainingjob.team-a.*")
        );
    }

    #[test]
    fn services_publish_what_the_catalogue_says_and_never_delete_streams() {
        let allocator = Identity::Service(Service::GpuAllocator)
            .permissions()
            .expect("permissions");
        assert!(
            allocator
                .publish
                .contains("trainyard.decisions.admission.*.*")
        );
        assert!(!allocator.publish.contains("trainyard.decisions.trial.*.*"));
        for service in Service::ALL {
            let permissions = Identity::Service(service)
                .permissions()
                .expect("permissions");
            assert!(
                permissions
                    .publish
                    .iter()
                    .all(|s| !s.contains("DELETE.TRAINYARD") && !s.contains("PURGE")),
                "{} may delete or purge a stream",
                service.name()
            );
            assert!(
                permissions
                    .publish
                    .iter()
                    .all(|s| !s.contains('>') || s.starts_with('$')),
                "{} has a wildcard publish on a Trainyard subject",
                service.name()
            );
        }
    }

    #[test]
    fn alerts_may_carry_any_severity() {
        let notifier = Identity::Service(Service::Notifier)
            .permissions()
            .expect("permissions");
        assert!(notifier.publish.contains("trainyard.alerts.*.*.*"));
    }

    #[test]
    fn every_catalogue_publisher_is_known() {
        for entry in catalog::all().expect("catalogue") {
            publishers(&entry).expect("known publisher");
        }
    }
}
