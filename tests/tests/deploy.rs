//! The deploy manifests and the compose file agree with the code: every service is
//! there, RBAC is least-privilege, every `TRAINYARD_*` key is one the services read,
//! and NATS as deployed admits each service over TLS with its own password only,
//! and a training worker with its job's token, through the planner's auth
//! callout, for its own job's subjects only.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use futures::StreamExt;
use planner_core::PlannerConfig;
use planner_core::WorkerToken;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use trainyard_contracts::Service;
use trainyard_contracts::permissions::Identity;
use trainyard_planner::callout;
use trainyard_runtime::{Runtime, Settings};
use trainyard_testkit::{NatsServer, eventually_within, free_port, http_get, metric};
use yaml_serde::Value;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn documents(path: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    parse_documents(path, &text)
}

fn parse_documents(what: &str, text: &str) -> Vec<Value> {
    yaml_serde::Deserializer::from_str(text)
        .map(|doc| {
            Value::deserialize(doc).unwrap_or_else(|e| panic!("{what} is not valid YAML: {e}"))
        })
        .filter(|doc| !doc.is_null())
        .collect()
}

fn kind_named<'a>(docs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    docs.iter()
        .find(|d| d["kind"].as_str() == Some(kind) && d["metadata"]["name"].as_str() == Some(name))
}

/// Fails unless `key`, `<prefix>A__B`, names the key `a.b` of `defaults`.
fn assert_known_key(defaults: &serde_json::Value, prefix: &str, key: &str) {
    let path = key
        .strip_prefix(prefix)
        .unwrap_or_else(|| panic!("{key} lacks the {prefix} prefix"));
    let mut node = defaults;
    for part in path.split("__") {
        node = node
            .get(part.to_lowercase())
            .unwrap_or_else(|| panic!("{key}: no setting {part:?}; see README Configuration"));
    }
}

/// Fails unless `TRAINYARD_A__B` names the key `a.b` of the shared settings.
fn assert_known_setting(key: &str) {
    let settings = serde_json::to_value(Settings::default()).expect("settings serialise");
    assert_known_key(&settings, "TRAINYARD_", key);
}

/// Fails unless `TRAINYARD_PLANNER__A` names the key `a` of the planner's section.
fn assert_known_planner_setting(key: &str) {
    let config = serde_json::to_value(PlannerConfig::default()).expect("config serialises");
    assert_known_key(&config, "TRAINYARD_PLANNER__", key);
}

#[test]
fn every_service_has_a_deployment_with_probes_and_its_own_account() {
    let docs = documents("deploy/services.yaml");
    for service in Service::ALL {
        let name = format!("trainyard-{}", service.name());
        let deployment = kind_named(&docs, "Deployment", &name)
            .unwrap_or_else(|| panic!("no Deployment {name}"));
        let pod = &deployment["spec"]["template"]["spec"];
        assert_eq!(pod["serviceAccountName"].as_str(), Some(name.as_str()));
        let container = &pod["containers"][0];
        assert_eq!(
            container["livenessProbe"]["httpGet"]["path"].as_str(),
            Some("/healthz")
        );
        assert_eq!(
            container["readinessProbe"]["httpGet"]["path"].as_str(),
            Some("/readyz")
        );
    }
    let config = documents("deploy/config.yaml");
    let data = config[0]["data"].as_mapping().expect("config data");
    for key in data.keys() {
        assert_known_setting(key.as_str().expect("string key"));
    }
    assert_eq!(
        data[&Value::from("TRAINYARD_HTTP__LISTEN")].as_str(),
        Some("0.0.0.0:9090")
    );
}

fn verbs_of(role: &Value) -> BTreeSet<String> {
    role["rules"]
        .as_sequence()
        .into_iter()
        .flatten()
        .flat_map(|rule| rule["verbs"].as_sequence().cloned().unwrap_or_default())
        .filter_map(|v| v.as_str().map(str::to_string))
        .collect()
}

#[test]
fn rbac_is_least_privilege_and_only_the_planner_writes() {
    let docs = documents("deploy/rbac.yaml");
    let read_only: BTreeSet<String> = ["list", "watch"].map(String::from).into();
    let watcher = kind_named(&docs, "ClusterRole", "trainyard-watcher").expect("watcher role");
    assert_eq!(verbs_of(watcher), read_only, "the watcher never writes");
    let planner = kind_named(&docs, "ClusterRole", "trainyard-planner").expect("planner role");
    assert!(verbs_of(planner).contains("patch"));
    let roles: Vec<&str> = docs
        .iter()
        .filter(|d| matches!(d["kind"].as_str(), Some("ClusterRole" | "Role")))
        .filter_map(|d| d["metadata"]["name"].as_str())
        .collect();
    assert_eq!(
        roles,
        ["trainyard-watcher", "trainyard-planner"],
        "no other service has a role"
    );
    for service in Service::ALL {
        let name = format!("trainyard-{}", service.name());
        let account = kind_named(&docs, "ServiceAccount", &name)
            .unwrap_or_else(|| panic!("no account {name}"));
        let needs_api = matches!(service, Service::Watcher | Service::Planner);
        assert_eq!(
            account["automountServiceAccountToken"]
                .as_bool()
                .unwrap_or(true),
            needs_api,
            "{name}: only the watcher and planner mount a token"
        );
    }
}

#[test]
fn compose_runs_every_service_with_known_settings() {
    let compose = &documents("compose/docker-compose.yaml")[0];
    let services = compose["services"].as_mapping().expect("services");
    assert!(services.contains_key("nats"));
    for service in Service::ALL {
        let entry = &compose["services"][service.name()];
        assert!(entry.is_mapping(), "compose lacks {}", service.name());
        assert_eq!(
            entry["build"]["args"]["SERVICE"].as_str(),
            Some(service.name())
        );
        // A service's own section (TRAINYARD_HPO_TUNER__...) is its crate's
        // config; the watcher and planner reach the simulator through KUBECONFIG.
        let own_section = format!(
            "TRAINYARD_{}__",
            service.name().replace('-', "_").to_uppercase()
        );
        for key in entry["environment"]
            .as_mapping()
            .expect("environment")
            .keys()
        {
            let key = key.as_str().expect("string key");
            if key == "KUBECONFIG" || key.starts_with(&own_section) {
                continue;
            }
            assert_known_setting(key);
        }
    }
}

/// The literal `env` values of a container.
fn env_values(container: &Value) -> BTreeMap<String, String> {
    container["env"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|entry| {
            Some((
                entry["name"].as_str()?.into(),
                entry["value"].as_str()?.into(),
            ))
        })
        .collect()
}

/// Every (Secret, key) whose file a pod's volumes bring in; key `*` when the
/// whole Secret is.
fn mounted_secret_keys(pod: &Value) -> BTreeSet<(String, String)> {
    let mut keys = BTreeSet::new();
    for volume in pod["volumes"].as_sequence().into_iter().flatten() {
        let sources: Vec<(&Value, &str)> = if volume["secret"].is_mapping() {
            vec![(&volume["secret"], "secretName")]
        } else {
            volume["projected"]["sources"]
                .as_sequence()
                .into_iter()
                .flatten()
                .filter(|source| source["secret"].is_mapping())
                .map(|source| (&source["secret"], "name"))
                .collect()
        };
        for (secret, name_key) in sources {
            let name = secret[name_key].as_str().expect("secret name").to_string();
            match secret["items"].as_sequence() {
                Some(items) => keys.extend(
                    items
                        .iter()
                        .map(|item| (name.clone(), item["key"].as_str().expect("key").into())),
                ),
                None => {
                    keys.insert((name, "*".into()));
                }
            }
        }
    }
    keys
}

/// The (Secret, key) the file at `path` in `container` comes from.
fn secret_key_of_file(pod: &Value, container: &Value, path: &str) -> Option<(String, String)> {
    let (dir, file) = path.rsplit_once('/')?;
    let mount = container["volumeMounts"]
        .as_sequence()?
        .iter()
        .find(|mount| mount["mountPath"].as_str() == Some(dir))?;
    let volume = pod["volumes"]
        .as_sequence()?
        .iter()
        .find(|volume| volume["name"] == mount["name"])?;
    let sources: Vec<(&Value, &str)> = if volume["secret"].is_mapping() {
        vec![(&volume["secret"], "secretName")]
    } else {
        volume["projected"]["sources"]
            .as_sequence()?
            .iter()
            .map(|source| (&source["secret"], "name"))
            .collect()
    };
    sources.into_iter().find_map(|(secret, name_key)| {
        let key = match secret["items"].as_sequence() {
            Some(items) => items
                .iter()
                .find(|item| item["path"].as_str() == Some(file))?["key"]
                .as_str()?,
            None => file,
        };
        Some((secret[name_key].as_str()?.to_string(), key.to_string()))
    })
}

#[test]
fn every_service_connects_to_nats_as_itself_over_tls_and_mounts_only_its_own_password() {
    let docs = documents("deploy/services.yaml");
    let config = documents("deploy/config.yaml");
    assert!(
        config[0]["data"]["TRAINYARD_NATS__URL"]
            .as_str()
            .is_some_and(|url| url.starts_with("tls://")),
        "the services' NATS URL asks for TLS"
    );
    for service in Service::ALL {
        let name = format!("trainyard-{}", service.name());
        let deployment = kind_named(&docs, "Deployment", &name)
            .unwrap_or_else(|| panic!("no Deployment {name}"));
        let pod = &deployment["spec"]["template"]["spec"];
        let container = &pod["containers"][0];
        let env = env_values(container);
        for key in env.keys() {
            if service == Service::Planner && key.starts_with("TRAINYARD_PLANNER__") {
                assert_known_planner_setting(key);
            } else {
                assert_known_setting(key);
            }
        }
        assert_eq!(
            env.get("TRAINYARD_NATS__USER"),
            Some(&Identity::Service(service).user()),
            "{name} connects as its own NATS user"
        );
        let own_password = (
            format!("trainyard-nats-{}", service.name()),
            "password".into(),
        );
        let ca = ("nats-tls".to_string(), "ca.crt".to_string());
        let password_file = env
            .get("TRAINYARD_NATS__PASSWORD_FILE")
            .unwrap_or_else(|| panic!("{name} sets TRAINYARD_NATS__PASSWORD_FILE"));
        assert_eq!(
            secret_key_of_file(pod, container, password_file),
            Some(own_password.clone()),
            "{name}'s password file is its own Secret's"
        );
        let ca_file = env
            .get("TRAINYARD_NATS__TLS_CA_FILE")
            .unwrap_or_else(|| panic!("{name} sets TRAINYARD_NATS__TLS_CA_FILE"));
        assert_eq!(
            secret_key_of_file(pod, container, ca_file),
            Some(ca.clone()),
            "{name}'s CA file is nats-tls's ca.crt"
        );
        let nats_secrets: BTreeSet<(String, String)> = mounted_secret_keys(pod)
            .into_iter()
            .filter(|(secret, _)| {
                secret.starts_with("nats-") || secret.starts_with("trainyard-nats-")
            })
            .collect();
        let mut expected = BTreeSet::from([own_password, ca.clone()]);
        if service == Service::Planner {
            let issuer = (
                "trainyard-nats-callout".to_string(),
                "issuer.nk".to_string(),
            );
            let seed_file = &env["TRAINYARD_PLANNER__WORKER_CREDENTIALS_SEED_FILE"];
            assert_eq!(
                secret_key_of_file(pod, container, seed_file),
                Some(issuer.clone()),
                "the planner signs worker tokens with the callout's issuer key"
            );
            let worker_ca_file = &env["TRAINYARD_PLANNER__WORKER_NATS_CA_FILE"];
            assert_eq!(
                secret_key_of_file(pod, container, worker_ca_file),
                Some(ca.clone()),
                "the workers get nats-tls's ca.crt"
            );
            assert!(
                env["TRAINYARD_PLANNER__WORKER_NATS_URL"].starts_with("tls://"),
                "the workers' NATS URL asks for TLS"
            );
            expected.insert(issuer);
        }
        assert_eq!(
            nats_secrets, expected,
            "{name} mounts no other password, no issuer key but the planner, and not the server's key"
        );
        assert!(
            container["envFrom"]
                .as_sequence()
                .into_iter()
                .flatten()
                .all(|source| source["secretRef"].is_null()),
            "{name} takes no Secret into its environment"
        );
    }
}

#[test]
fn training_workers_of_every_namespace_may_reach_the_nats_client_port() {
    let docs = documents("deploy/networkpolicies.yaml");
    let policy = kind_named(&docs, "NetworkPolicy", "nats-clients").expect("nats-clients");
    let rule = &policy["spec"]["ingress"][0];
    assert_eq!(rule["ports"][0]["port"].as_u64(), Some(4222));
    // The labels the planner gives every worker pod, whatever the job.
    let worker_labels = BTreeMap::from([
        (
            planner_core::LABEL_MANAGED_BY.to_string(),
            planner_core::MANAGED_BY.to_string(),
        ),
        (
            planner_core::LABEL_ROLE.to_string(),
            planner_core::Role::Worker.as_str().to_string(),
        ),
    ]);
    let admits_workers = rule["from"]
        .as_sequence()
        .into_iter()
        .flatten()
        .any(|peer| {
            let labels: Option<BTreeMap<String, String>> =
                yaml_serde::from_value(peer["podSelector"]["matchLabels"].clone()).ok();
            peer["namespaceSelector"]
                .as_mapping()
                .is_some_and(|selector| selector.is_empty())
                && labels.as_ref() == Some(&worker_labels)
        });
    assert!(
        admits_workers,
        "nats-clients admits pods labelled {worker_labels:?} from any namespace"
    );
}

/// `kubectl kustomize deploy/`, parsed.
fn rendered_deploy() -> Vec<Value> {
    let output = Command::new("kubectl")
        .arg("kustomize")
        .arg(root().join("deploy"))
        .output()
        .expect("kubectl on PATH (scripts/lib/deps.sh ensure_kubectl)");
    assert!(
        output.status.success(),
        "kubectl kustomize deploy/: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    parse_documents(
        "kubectl kustomize deploy/",
        &String::from_utf8_lossy(&output.stdout),
    )
}

#[test]
fn nats_runs_the_committed_config_with_generated_users_tls_and_password_secrets() {
    let docs = rendered_deploy();
    let config_map = docs
        .iter()
        .find(|d| {
            d["kind"].as_str() == Some("ConfigMap")
                && d["metadata"]["name"]
                    .as_str()
                    .is_some_and(|name| name.starts_with("nats-config-"))
        })
        .expect("kustomize generates the ConfigMap nats-config");
    for file in ["nats.conf", "auth.conf"] {
        let committed = std::fs::read_to_string(root().join("deploy/nats").join(file))
            .expect("read the committed file");
        assert_eq!(
            config_map["data"][file].as_str(),
            Some(committed.as_str()),
            "the ConfigMap carries deploy/nats/{file} as committed"
        );
    }
    let server_config = config_map["data"]["nats.conf"].as_str().expect("nats.conf");
    assert!(server_config.contains("\ninclude auth.conf\n"));
    assert!(server_config.contains("\ntls {\n"));

    let nats = kind_named(&docs, "StatefulSet", "nats").expect("the NATS StatefulSet");
    let pod = &nats["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    assert_eq!(
        container["args"][0].as_str(),
        Some("--config=/etc/nats/config/nats.conf")
    );
    let volume = |name: &str| {
        pod["volumes"]
            .as_sequence()
            .expect("volumes")
            .iter()
            .find(|volume| volume["name"].as_str() == Some(name))
            .unwrap_or_else(|| panic!("no volume {name}"))
    };
    assert_eq!(
        volume("config")["configMap"]["name"],
        config_map["metadata"]["name"],
        "the pods mount the generated ConfigMap"
    );
    assert_eq!(
        volume("tls")["secret"]["secretName"].as_str(),
        Some("nats-tls")
    );
    assert_eq!(
        container["envFrom"][0]["secretRef"]["name"].as_str(),
        Some("nats-passwords")
    );
    assert_eq!(
        container["readinessProbe"]["httpGet"]["port"].as_u64(),
        Some(8222),
        "the probe reads the plain monitoring port"
    );
}

/// The Secrets `scripts/nats-secrets.sh --output` writes: name to key to value.
fn script_secrets(dir: &Path) -> BTreeMap<String, BTreeMap<String, String>> {
    let file = dir.join("secrets.yaml");
    // The script makes the callout's issuer with `nats-auth-config
    // --new-callout-issuer FILE` (write the seed, print the public key); a
    // nested `cargo run` would wait on this test's own build lock, so the test
    // hands it a program with that interface.
    let issuer = nkeys::KeyPair::new_account();
    let generator = dir.join("nats-auth-config");
    std::fs::write(
        &generator,
        format!(
            "#!/bin/sh\n[ \"$1\" = --new-callout-issuer ] || exit 2\nprintf '%s' '{}' > \"$2\"\necho {}\n",
            issuer.seed().expect("seed"),
            issuer.public_key()
        ),
    )
    .expect("write the generator");
    std::fs::set_permissions(
        &generator,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("make the generator executable");
    let output = Command::new("bash")
        .arg(root().join("scripts/nats-secrets.sh"))
        .args([
            "--san",
            "IP:127.0.0.1",
            "--san",
            "DNS:localhost",
            "--output",
        ])
        .arg(&file)
        // --output never reads the cluster; no kubeconfig proves it.
        .env("KUBECONFIG", dir.join("no-cluster"))
        .env("NATS_AUTH_CONFIG", &generator)
        .output()
        .expect("run scripts/nats-secrets.sh");
    assert!(
        output.status.success(),
        "scripts/nats-secrets.sh: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = std::fs::read_to_string(&file).expect("the Secrets file");
    parse_documents("the Secrets", &text)
        .iter()
        .map(|secret| {
            let data = secret["data"]
                .as_mapping()
                .expect("data")
                .iter()
                .map(|(key, value)| {
                    let bytes = base64::engine::general_purpose::STANDARD
                        .decode(value.as_str().expect("base64 text"))
                        .expect("base64");
                    (
                        key.as_str().expect("key").to_string(),
                        String::from_utf8(bytes).expect("text"),
                    )
                })
                .collect();
            (
                secret["metadata"]["name"]
                    .as_str()
                    .expect("name")
                    .to_string(),
                data,
            )
        })
        .collect()
}

/// Writes the deploy's nats-server configuration for server `index` of a
/// cluster on loopback into `dir`: nats.conf and auth.conf as the ConfigMap
/// carries them, with the certificate directory, the monitoring and route
/// addresses, and the routes' host names replaced.
fn loopback_server_config(
    dir: &Path,
    certificates: &Path,
    index: usize,
    route_ports: &[u16],
    monitor_port: u16,
) -> PathBuf {
    let mut config =
        std::fs::read_to_string(root().join("deploy/nats/nats.conf")).expect("nats.conf");
    let mut replace = |from: String, to: String| {
        assert!(config.contains(&from), "nats.conf no longer has {from:?}");
        config = config.replace(&from, &to);
    };
    replace("/etc/nats/tls".into(), certificates.display().to_string());
    replace(
        "http: 0.0.0.0:8222".into(),
        format!("http: 127.0.0.1:{monitor_port}"),
    );
    replace(
        "listen: 0.0.0.0:6222".into(),
        format!("listen: 127.0.0.1:{}", route_ports[index]),
    );
    for (peer, port) in route_ports.iter().enumerate() {
        replace(
            format!("nats-{peer}.nats-cluster:6222"),
            format!("127.0.0.1:{port}"),
        );
    }
    let server_dir = dir.join(format!("nats-{index}"));
    std::fs::create_dir_all(&server_dir).expect("server dir");
    std::fs::write(server_dir.join("nats.conf"), config).expect("write nats.conf");
    std::fs::copy(
        root().join("deploy/nats/auth.conf"),
        server_dir.join("auth.conf"),
    )
    .expect("copy auth.conf");
    server_dir.join("nats.conf")
}

/// Whether the server at `url` admits a client built from `options`: a
/// JetStream request (`$JS.API.INFO`, answered on `identity`'s inbox)
/// completes. A `connect` that returns proves nothing: the auth callout holds
/// a client no user matches until the auth timeout (three seconds with TLS),
/// the server's first PING to it goes out after two, and async-nats takes
/// any reply to its CONNECT, that PING included, as acceptance; the -ERR
/// comes a second later.
async fn admitted(options: async_nats::ConnectOptions, url: &str, identity: &Identity) -> bool {
    let options = options
        .custom_inbox_prefix(identity.inbox_prefix())
        .connection_timeout(Duration::from_secs(5));
    let round_trip = async {
        let client = options.connect(url).await.ok()?;
        client.request("$JS.API.INFO", "".into()).await.ok()
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(10), round_trip).await,
        Ok(Some(_))
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn deployed_nats_admits_a_service_and_a_jobs_worker_over_tls_and_refuses_the_rest() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = tempfile::tempdir().expect("temp dir");
    let secrets = script_secrets(dir.path());
    let certificates = dir.path().join("tls");
    std::fs::create_dir(&certificates).expect("certificate dir");
    for (key, value) in &secrets["nats-tls"] {
        std::fs::write(certificates.join(key), value).expect("write a certificate file");
    }

    // The three servers of the StatefulSet, with the passwords of nats-passwords.
    let route_ports = [free_port(), free_port(), free_port()];
    let monitor_port = free_port();
    let servers: Vec<NatsServer> = (0..route_ports.len())
        .map(|index| {
            let config = loopback_server_config(
                dir.path(),
                &certificates,
                index,
                &route_ports,
                if index == 0 {
                    monitor_port
                } else {
                    free_port()
                },
            );
            let mut env: Vec<(String, String)> = secrets["nats-passwords"]
                .iter()
                .map(|(key, value)| (key.clone(), value.clone()))
                .collect();
            env.push(("POD_NAME".into(), format!("nats-{index}")));
            NatsServer::start_with_config_file(&config, &env)
        })
        .collect();
    // The readiness probe's request, on plain HTTP, answers once the routes
    // (TLS, verified both ways) have formed the JetStream cluster.
    eventually_within(
        "the NATS cluster ready",
        Duration::from_secs(30),
        || async {
            http_get(monitor_port, "/healthz?js-enabled-only=true")
                .filter(|(status, _)| *status == 200)
                .map(|_| ())
        },
    )
    .await;
    let url = format!("tls://localhost:{}", servers[0].port());

    // A service as its Deployment configures it: user, password file, CA file.
    let service = Service::HpoTuner;
    let password = &secrets[&format!("trainyard-nats-{}", service.name())]["password"];
    let password_file = dir.path().join("password");
    std::fs::write(&password_file, password).expect("write the password file");
    let mut settings = Settings::default();
    settings.nats.url = url.clone();
    settings.nats.replicas = 3;
    settings.nats.user = Some(Identity::Service(service).user());
    settings.nats.password_file = Some(password_file.display().to_string());
    settings.nats.tls_ca_file = Some(certificates.join("ca.crt").display().to_string());
    settings.http.listen = "127.0.0.1:0".into();
    let shutdown = CancellationToken::new();
    let runtime = tokio::time::timeout(
        Duration::from_secs(60),
        Runtime::start(service, settings, shutdown.clone()),
    )
    .await
    .expect("the service provisions its streams in time")
    .expect("the service connects over TLS as itself and provisions three-replica streams");
    shutdown.cancel();
    drop(runtime);

    let user = Identity::Service(service).user();
    let with_ca = |options: async_nats::ConnectOptions| {
        options
            .require_tls(true)
            .add_root_certificates(certificates.join("ca.crt"))
    };
    let identity = Identity::Service(service);
    assert!(
        admitted(
            with_ca(async_nats::ConnectOptions::with_user_and_password(
                user.clone(),
                password.clone()
            )),
            &url,
            &identity
        )
        .await,
        "the service's identity is admitted"
    );
    assert!(
        !admitted(
            async_nats::ConnectOptions::with_user_and_password(user.clone(), password.clone())
                .require_tls(true),
            &url,
            &identity
        )
        .await,
        "a client that does not trust the installation's CA is refused"
    );
    assert!(
        !admitted(with_ca(async_nats::ConnectOptions::new()), &url, &identity).await,
        "an anonymous client is refused"
    );
    let planner_password = &secrets["trainyard-nats-planner"]["password"];
    assert!(
        !admitted(
            with_ca(async_nats::ConnectOptions::with_user_and_password(
                user,
                planner_password.clone()
            )),
            &url,
            &identity
        )
        .await,
        "another service's password does not open this identity"
    );

    // The planner answers the auth callout with the issuer key the script
    // made; a worker, with its job's token and the CA its Secret carries,
    // reports for that job only, through another server of the cluster.
    let issuer = Arc::new(
        nkeys::KeyPair::from_seed(secrets["trainyard-nats-callout"]["issuer.nk"].trim())
            .expect("the script's issuer is an nkey seed"),
    );
    let planner = Identity::Service(Service::Planner);
    let planner_client = with_ca(async_nats::ConnectOptions::with_user_and_password(
        planner.user(),
        secrets["trainyard-nats-planner"]["password"].clone(),
    ))
    .custom_inbox_prefix(planner.inbox_prefix())
    .connect(&url)
    .await
    .expect("the planner connects as itself");
    let registry = prometheus::Registry::new();
    let callout_metrics = callout::CalloutMetrics::register(&registry).expect("metrics");
    let responder = CancellationToken::new();
    let serving = callout::serve(
        planner_client.clone(),
        issuer.clone(),
        callout_metrics,
        responder.clone(),
    );
    tokio::spawn(async move { serving.await.expect("the responder runs") });
    planner_client.flush().await.expect("flushed");

    let operator = with_ca(async_nats::ConnectOptions::with_user_and_password(
        Identity::Operator.user(),
        secrets["trainyard-nats-operator"]["password"].clone(),
    ))
    .connect(&url)
    .await
    .expect("the operator connects");
    let mut reports = operator
        .subscribe("trainyard.worker.>")
        .await
        .expect("the operator subscribes");
    operator.flush().await.expect("flushed");

    let (namespace, job) = ("ml", "bert");
    let token = WorkerToken {
        ns: namespace.into(),
        job: job.into(),
        exp: chrono::Utc::now().timestamp() + 600,
    }
    .sign(&issuer)
    .expect("signs");
    let (errors, mut refusals) = tokio::sync::mpsc::unbounded_channel();
    let worker_url = format!("tls://localhost:{}", servers[1].port());
    let worker_options = || {
        let errors = errors.clone();
        with_ca(async_nats::ConnectOptions::with_token(token.clone()))
            .custom_inbox_prefix(
                Identity::Worker {
                    namespace: namespace.into(),
                    job: job.into(),
                }
                .inbox_prefix(),
            )
            .event_callback(move |event| {
                let errors = errors.clone();
                async move {
                    if let async_nats::Event::ServerError(async_nats::ServerError::Other(message)) =
                        event
                    {
                        let _ = errors.send(message);
                    }
                }
            })
    };
    // Admitted means its report arrives: the callout's subscription reaches
    // the worker's server over the routes a moment after it is made.
    let own = format!("trainyard.worker.progress.{namespace}.{job}");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let worker = loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the worker with its job's token is admitted within 30 s"
        );
        let Ok(worker) = worker_options().connect(&worker_url).await else {
            continue;
        };
        worker
            .publish(own.clone(), "{}".into())
            .await
            .expect("handed to the connection");
        if let Ok(Some(received)) =
            tokio::time::timeout(Duration::from_secs(5), reports.next()).await
        {
            assert_eq!(received.subject.as_str(), own);
            break worker;
        }
    };

    let other = format!("trainyard.worker.progress.{namespace}.other-job");
    worker
        .publish(other.clone(), "{}".into())
        .await
        .expect("handed to the connection");
    let refusal = tokio::time::timeout(Duration::from_secs(10), refusals.recv())
        .await
        .expect("the server refuses another job's subject")
        .expect("error stream open");
    assert!(
        refusal.contains("Permissions Violation") && refusal.contains(&other),
        "{refusal}"
    );
    // The refused report never arrives; the next of its own does.
    worker
        .publish(own.clone(), "{}".into())
        .await
        .expect("handed to the connection");
    let received = tokio::time::timeout(Duration::from_secs(10), reports.next())
        .await
        .expect("the worker's next progress arrives")
        .expect("subscription open");
    assert_eq!(received.subject.as_str(), own);
    assert!(
        !admitted(with_ca(async_nats::ConnectOptions::new()), &url, &identity).await,
        "an anonymous client is refused by the planner's callout too"
    );
    let answers = |outcome: &str| {
        metric(
            &registry,
            "trainyard_planner_worker_auth_total",
            &[("outcome", outcome)],
        )
    };
    assert!(answers("authorized") >= 1.0);
    assert!(answers("refused") >= 1.0, "the anonymous client's answer");
    responder.cancel();

    // What the server tells every client before anything else: plain text
    // goes no further.
    let plain = std::net::TcpStream::connect(("127.0.0.1", servers[0].port())).expect("tcp");
    plain
        .set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let mut info = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(plain), &mut info).expect("INFO");
    assert!(
        info.starts_with("INFO ") && info.contains(r#""tls_required":true"#),
        "{info}"
    );
}

#[test]
fn cert_manager_issues_the_server_names_and_usages_the_script_does() {
    let dir = tempfile::tempdir().expect("temp dir");
    let secrets = script_secrets(dir.path());
    let certificate = dir.path().join("tls.crt");
    std::fs::write(&certificate, &secrets["nats-tls"]["tls.crt"]).expect("write tls.crt");
    let output = Command::new("openssl")
        .args([
            "x509",
            "-noout",
            "-ext",
            "subjectAltName,extendedKeyUsage",
            "-in",
        ])
        .arg(&certificate)
        .output()
        .expect("openssl on PATH");
    let text = String::from_utf8_lossy(&output.stdout);
    let script_names: BTreeSet<String> = text
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter_map(|part| part.strip_prefix("DNS:"))
        .map(str::to_string)
        .collect();
    assert!(
        text.contains("TLS Web Server Authentication")
            && text.contains("TLS Web Client Authentication")
    );

    let docs = documents("deploy/cert-manager/certificates.yaml");
    let server = kind_named(&docs, "Certificate", "nats-tls").expect("Certificate nats-tls");
    assert_eq!(server["spec"]["secretName"].as_str(), Some("nats-tls"));
    let manager_names: BTreeSet<String> = server["spec"]["dnsNames"]
        .as_sequence()
        .expect("dnsNames")
        .iter()
        .map(|name| name.as_str().expect("name").to_string())
        .collect();
    assert_eq!(manager_names, script_names);
    let usages: BTreeSet<&str> = server["spec"]["usages"]
        .as_sequence()
        .expect("usages")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(usages.contains("server auth") && usages.contains("client auth"));
}
