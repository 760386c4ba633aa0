//! The whole Trainyard stack as separate processes, for the pipeline and
//! trace-replay benchmarks: a `nats-server` with JetStream, optionally the
//! simulated cluster's binary, and the service binaries from a cargo target
//! directory. NATS runs with authentication on, as deployed: the generated
//! users and allow lists with the workers' auth callout, each service under
//! its own user, the simulator and the benchmark itself as the operator. Every process is started in its own process group (so a Ctrl-C
//! in the terminal reaches only the benchmark, which then stops them in
//! order) and is killed when the [`Stack`] is dropped, so none outlives the
//! benchmark.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use async_nats::jetstream;
use futures::StreamExt;
use kube::runtime::{WatchStreamExt, watcher};
use serde::Serialize;
use tokio::process::{Child, Command};
use tokio_util::sync::CancellationToken;
use trainyard_contracts::Service;
use trainyard_contracts::permissions::{self, CALLOUT_ISSUER_VARIABLE, Identity};
use trainyard_contracts::streams;
use trainyard_runtime::settings::NatsSettings;

use crate::procstats::{self, ProcStats};

/// Why the stack could not be started or read.
#[derive(Debug, thiserror::Error)]
pub enum StackError {
    #[error(
        "cannot start {program}: {source}; build it first (cargo build --release) or pass the right --target-dir"
    )]
    Spawn {
        program: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{name} did not become ready within {seconds} s; see {}", log.display())]
    NotReady {
        name: String,
        seconds: u64,
        log: PathBuf,
    },
    #[error("{name} exited ({status}); see {}", log.display())]
    Exited {
        name: String,
        status: String,
        log: PathBuf,
    },
    #[error("NATS: {0}")]
    Nats(String),
    #[error("HTTP client: {0}")]
    Http(String),
    #[error("Kubernetes client: {0}")]
    Kube(String),
}

/// One child process of the stack.
struct Process {
    name: String,
    child: Child,
    log: PathBuf,
    /// The service's `/metrics` `/healthz` `/readyz` listener.
    http: Option<SocketAddr>,
    /// How it was started, so that it can be started again the same way.
    program: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

/// CPU time and peak memory of one process of the stack.
#[derive(Debug, Clone, Serialize)]
pub struct ProcessStats {
    pub name: String,
    pub pid: u32,
    pub cpu_seconds: f64,
    pub peak_rss_bytes: u64,
}

/// A running stack. Logs and the JetStream store live in a temporary work
/// directory, removed on drop unless [`Stack::keep_work_dir`] was called.
pub struct Stack {
    bin_dir: PathBuf,
    work: tempfile::TempDir,
    keep: bool,
    log_level: String,
    nats_url: Option<String>,
    /// Process name and client port of each NATS server.
    nats_nodes: Vec<(String, u16)>,
    /// Users of the NATS servers, made when the first one starts.
    nats_auth: Option<NatsAuth>,
    /// One program that runs any service, named by its first argument,
    /// instead of `trainyard-<service>` in `bin_dir`.
    service_program: Option<PathBuf>,
    processes: Vec<Process>,
    /// Processes killed by [`Stack::kill`] and not started again.
    stopped: Vec<Process>,
}

/// The NATS users of a stack, as `deploy/` has them: the deployment's
/// identities with a password each (files in the work directory), and the
/// account key the planner signs worker tokens with.
struct NatsAuth {
    secrets: PathBuf,
    issuer_seed: PathBuf,
    /// The server configuration: accounts, users, allow lists, auth callout.
    config: String,
    /// The variables the configuration reads the passwords and issuer from.
    server_env: Vec<(String, String)>,
}

impl NatsAuth {
    fn new(work: &Path) -> Result<Self, StackError> {
        let secrets = work.join("secrets");
        let write = |path: &Path, text: &str| {
            std::fs::write(path, text).map_err(|source| StackError::Io {
                path: path.to_path_buf(),
                source,
            })
        };
        std::fs::create_dir_all(&secrets).map_err(|source| StackError::Io {
            path: secrets.clone(),
            source,
        })?;
        let identities = permissions::deployment(&[]);
        let config = permissions::server_config_with(&identities, true)
            .map_err(|err| StackError::Nats(format!("cannot derive the permissions: {err}")))?;
        let mut server_env = Vec::new();
        for identity in &identities {
            // A letter first: nats-server reads a variable's value as a
            // configuration value, and a leading digit would make a number.
            let password = format!("p{:032x}", rand::random::<u128>());
            write(&secrets.join(identity.user()), &password)?;
            server_env.push((permissions::password_variable(identity), password));
        }
        let issuer = nkeys::KeyPair::new_account();
        let seed = issuer
            .seed()
            .map_err(|err| StackError::Nats(format!("cannot make the callout issuer: {err}")))?;
        let issuer_seed = secrets.join("callout-issuer.nk");
        write(&issuer_seed, &seed)?;
        server_env.push((CALLOUT_ISSUER_VARIABLE.to_owned(), issuer.public_key()));
        Ok(Self {
            secrets,
            issuer_seed,
            config,
            server_env,
        })
    }

    fn password_file(&self, identity: &Identity) -> PathBuf {
        self.secrets.join(identity.user())
    }

    /// The environment that makes a service connect as itself (and the
    /// planner issue worker tokens).
    fn service_env(&self, service: Service) -> Vec<(String, String)> {
        let identity = Identity::Service(service);
        let mut env = vec![
            ("TRAINYARD_NATS__USER".to_owned(), identity.user()),
            (
                "TRAINYARD_NATS__PASSWORD_FILE".to_owned(),
                self.password_file(&identity).to_string_lossy().into_owned(),
            ),
        ];
        if service == Service::Planner {
            env.push((
                "TRAINYARD_PLANNER__WORKER_CREDENTIALS_SEED_FILE".to_owned(),
                self.issuer_seed.to_string_lossy().into_owned(),
            ));
        }
        env
    }
}

/// The most any stream of a benchmark's stack may hold.
const BENCHMARK_STREAM_MAX_BYTES: i64 = 256 << 20;

/// A loopback TCP port that was free a moment ago.
pub fn free_port() -> Result<u16, StackError> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(|source| StackError::Io {
        path: "127.0.0.1:0".into(),
        source,
    })?;
    listener
        .local_addr()
        .map(|a| a.port())
        .map_err(|source| StackError::Io {
            path: "127.0.0.1:0".into(),
            source,
        })
}

impl Stack {
    /// A stack whose binaries are in `bin_dir` (e.g. `target/release`);
    /// services log at `log_level` (a `tracing` filter).
    pub fn new(bin_dir: &Path, log_level: &str) -> Result<Self, StackError> {
        let work = tempfile::Builder::new()
            .prefix("trainyard-loadtest.")
            .tempdir()
            .map_err(|source| StackError::Io {
                path: std::env::temp_dir(),
                source,
            })?;
        Ok(Self {
            bin_dir: bin_dir.to_path_buf(),
            work,
            keep: false,
            log_level: log_level.to_owned(),
            nats_url: None,
            nats_nodes: Vec::new(),
            nats_auth: None,
            service_program: None,
            processes: Vec::new(),
            stopped: Vec::new(),
        })
    }

    /// Starts every service as `program <service>` (e.g. a test's own
    /// binary that runs any service) rather than `trainyard-<service>`.
    pub fn run_services_with(&mut self, program: PathBuf) {
        self.service_program = Some(program);
    }

    pub fn work_dir(&self) -> &Path {
        self.work.path()
    }

    /// Keeps the work directory (logs) after the stack stops, e.g. after a failure.
    pub fn keep_work_dir(&mut self) {
        self.keep = true;
    }

    fn spawn(
        &mut self,
        name: &str,
        program: PathBuf,
        args: &[String],
        env: &[(String, String)],
        http: Option<SocketAddr>,
    ) -> Result<(), StackError> {
        let log = self.work.path().join(format!("{name}.log"));
        // Appended to: a restarted process's log follows its predecessor's.
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|source| StackError::Io {
                path: log.clone(),
                source,
            })?;
        let err_file = file.try_clone().map_err(|source| StackError::Io {
            path: log.clone(),
            source,
        })?;
        let child = Command::new(&program)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err_file)
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| StackError::Spawn {
                program: program.clone(),
                source,
            })?;
        self.processes.push(Process {
            name: name.to_owned(),
            child,
            log,
            http,
            program,
            args: args.to_vec(),
            env: env.to_vec(),
        });
        Ok(())
    }

    /// Kills `name` with SIGKILL (no drain, no goodbye: a crash or an OOM
    /// kill), waits `pause`, then starts it again as it was started, with its
    /// HTTP listener on a fresh port. Returns when the new process answers
    /// `/readyz`, with the time from its start until then.
    pub async fn kill_and_restart(
        &mut self,
        name: &str,
        pause: Duration,
        ready_limit: Duration,
    ) -> Result<Duration, StackError> {
        self.restart(name, Stop::Kill, pause, ready_limit).await
    }

    /// Stops `name` as `stop` says, waits `pause`, then starts it again as
    /// [`Stack::kill_and_restart`] does.
    pub async fn restart(
        &mut self,
        name: &str,
        stop: Stop,
        pause: Duration,
        ready_limit: Duration,
    ) -> Result<Duration, StackError> {
        let index = self.index_of(name)?;
        let mut stopped = self.processes.remove(index);
        let (program, args, env, had_http) = (
            stopped.program.clone(),
            stopped.args.clone(),
            stopped.env.clone(),
            stopped.http.is_some(),
        );
        match stop {
            Stop::Kill => {
                let _ = stopped.child.start_kill();
                let _ = stopped.child.wait().await;
            }
            Stop::Terminate { grace } => terminate(vec![stopped], grace).await,
        }
        tokio::time::sleep(pause).await;
        let mut env = env;
        let http = if had_http {
            let http = SocketAddr::from(([127, 0, 0, 1], free_port()?));
            for (key, value) in &mut env {
                if key == "TRAINYARD_HTTP__LISTEN" {
                    *value = http.to_string();
                }
            }
            Some(http)
        } else {
            None
        };
        let started = Instant::now();
        self.spawn(name, program, &args, &env, http)?;
        self.wait_process_ready(self.processes.len() - 1, started + ready_limit, ready_limit)
            .await?;
        Ok(started.elapsed())
    }

    /// Kills `name` with SIGKILL and starts it again armed to crash at
    /// `point` (`TRAINYARD_CRASH_AT`, e.g. `gpu-allocator.after-save:3`);
    /// waits up to `limit` for it to get there. Returns whether it aborted
    /// at the point; if it did not get there in time it is killed. Either
    /// way it is left stopped, to be started again (unarmed) with
    /// [`Stack::restart`].
    pub async fn crash_at(
        &mut self,
        name: &str,
        point: &str,
        limit: Duration,
    ) -> Result<bool, StackError> {
        use std::os::unix::process::ExitStatusExt;

        let index = self.index_of(name)?;
        let mut process = self.processes.remove(index);
        let _ = process.child.start_kill();
        let _ = process.child.wait().await;
        let mut env = process.env.clone();
        env.push((
            trainyard_runtime::crash_point::CRASH_AT_ENV.to_owned(),
            point.to_owned(),
        ));
        self.spawn(
            name,
            process.program.clone(),
            &process.args,
            &env,
            process.http,
        )?;
        let armed = self.processes.len() - 1;
        // Restarted later as it was first started: unarmed.
        self.processes[armed].env = process.env;
        let deadline = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.processes[armed].child.try_wait() {
                // SIGABRT: the crash point's abort.
                return Ok(status.signal() == Some(6));
            }
            if Instant::now() > deadline {
                let child = &mut self.processes[armed].child;
                let _ = child.start_kill();
                let _ = child.wait().await;
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Fails if the last started process has already exited.
    fn check_alive(&mut self) -> Result<(), StackError> {
        let Some(process) = self.processes.last_mut() else {
            return Ok(());
        };
        match process.child.try_wait() {
            Ok(Some(status)) => Err(StackError::Exited {
                name: process.name.clone(),
                status: status.to_string(),
                log: process.log.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// Starts `nats-server` (from PATH) with JetStream and the stack's users
    /// on a free loopback port and waits until it accepts connections;
    /// returns its URL. `max_payload` raises the server's message size limit
    /// (1 MiB by default).
    pub async fn start_nats(&mut self, max_payload: Option<u64>) -> Result<String, StackError> {
        let port = free_port()?;
        let store = self.work.path().join("jetstream");
        let mut text = String::new();
        if let Some(bytes) = max_payload {
            text.push_str(&format!("max_payload: {bytes}\n"));
        }
        let config = self.write_nats_config("nats.conf", text)?;
        let args = [
            "-c".to_owned(),
            config.to_string_lossy().into_owned(),
            "-js".to_owned(),
            "-a".to_owned(),
            "127.0.0.1".to_owned(),
            "-p".to_owned(),
            port.to_string(),
            "-sd".to_owned(),
            store.to_string_lossy().into_owned(),
        ];
        let env = self.nats_server_env();
        self.spawn("nats-server", "nats-server".into(), &args, &env, None)?;
        self.wait_listening("nats-server", port, Duration::from_secs(10))
            .await?;
        let url = format!("nats://127.0.0.1:{port}");
        self.nats_url = Some(url.clone());
        self.nats_nodes = vec![("nats-server".to_owned(), port)];
        Ok(url)
    }

    /// Writes a server configuration file `name` of `text` followed by the
    /// stack's users.
    fn write_nats_config(&mut self, name: &str, mut text: String) -> Result<PathBuf, StackError> {
        if self.nats_auth.is_none() {
            self.nats_auth = Some(NatsAuth::new(self.work.path())?);
        }
        if let Some(auth) = &self.nats_auth {
            text.push_str(&auth.config);
        }
        let path = self.work.path().join(name);
        std::fs::write(&path, text).map_err(|source| StackError::Io {
            path: path.clone(),
            source,
        })?;
        Ok(path)
    }

    fn nats_server_env(&self) -> Vec<(String, String)> {
        self.nats_auth
            .as_ref()
            .map(|auth| auth.server_env.clone())
            .unwrap_or_default()
    }

    /// A client of the stack's NATS as the operator (who may do anything), for
    /// the benchmark's own submissions and reads.
    pub async fn connect(&self) -> Result<async_nats::Client, StackError> {
        let settings = self.nats_settings(&Identity::Operator)?;
        let options = async_nats::ConnectOptions::new()
            .custom_inbox_prefix(Identity::Operator.inbox_prefix());
        trainyard_runtime::nats::authenticate(options, &settings)
            .await
            .map_err(|err| StackError::Nats(err.to_string()))?
            .connect(trainyard_runtime::nats::servers(&settings.url))
            .await
            .map_err(|err| StackError::Nats(format!("cannot connect to {}: {err}", settings.url)))
    }

    /// How `identity` connects to the stack's NATS: the URL, its user and
    /// its password file (for a service run in the benchmark's own process).
    pub fn nats_settings(&self, identity: &Identity) -> Result<NatsSettings, StackError> {
        let (url, auth) = self
            .nats_url
            .as_ref()
            .zip(self.nats_auth.as_ref())
            .ok_or_else(|| StackError::Nats("start NATS first".into()))?;
        Ok(NatsSettings {
            url: url.clone(),
            user: Some(identity.user()),
            password_file: Some(auth.password_file(identity).to_string_lossy().into_owned()),
            ..NatsSettings::default()
        })
    }

    /// Starts `nodes` `nats-server`s (processes and server names `nats-0`,
    /// `nats-1`, ...) with JetStream, each with `jetstream_options` (e.g.
    /// `max_file_store: 1MB`) in its `jetstream {}` block; more than one
    /// form a cluster over loopback routes. Returns the URLs of all, comma
    /// separated, as the services take them.
    pub async fn start_nats_cluster(
        &mut self,
        nodes: usize,
        jetstream_options: &str,
    ) -> Result<String, StackError> {
        let ports: Vec<(u16, u16)> = (0..nodes)
            .map(|_| Ok((free_port()?, free_port()?)))
            .collect::<Result<_, StackError>>()?;
        let routes: Vec<String> = ports
            .iter()
            .map(|(_, route)| format!("\"nats-route://127.0.0.1:{route}\""))
            .collect();
        for (i, (client, route)) in ports.iter().enumerate() {
            let name = format!("nats-{i}");
            let store = self.work.path().join(format!("jetstream-{i}"));
            let cluster = if nodes > 1 {
                format!(
                    "cluster {{\n  name: trainyard\n  listen: 127.0.0.1:{route}\n  routes: [{}]\n}}\n",
                    routes.join(", ")
                )
            } else {
                String::new()
            };
            let text = format!(
                "server_name: {name}\nlisten: 127.0.0.1:{client}\njetstream {{\n  store_dir: \"{}\"\n  {jetstream_options}\n}}\n{cluster}",
                store.display()
            );
            let config = self.write_nats_config(&format!("{name}.conf"), text)?;
            let args = ["-c".to_owned(), config.to_string_lossy().into_owned()];
            let env = self.nats_server_env();
            self.spawn(&name, "nats-server".into(), &args, &env, None)?;
            self.nats_nodes.push((name, *client));
        }
        for (name, port) in self.nats_nodes.clone() {
            self.wait_listening(&name, port, Duration::from_secs(10))
                .await?;
        }
        let url = ports
            .iter()
            .map(|(client, _)| format!("nats://127.0.0.1:{client}"))
            .collect::<Vec<_>>()
            .join(",");
        self.nats_url = Some(url.clone());
        Ok(url)
    }

    /// Process names and client ports of the NATS servers.
    pub fn nats_nodes(&self) -> &[(String, u16)] {
        &self.nats_nodes
    }

    /// The URL (comma-separated URLs for a cluster) the services connect to.
    pub fn nats_url(&self) -> Option<&str> {
        self.nats_url.as_deref()
    }

    /// Waits until process `name` accepts connections on loopback `port`.
    pub async fn wait_listening(
        &mut self,
        name: &str,
        port: u16,
        limit: Duration,
    ) -> Result<(), StackError> {
        let deadline = Instant::now() + limit;
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(process) = self.processes.iter_mut().find(|p| p.name == name)
                && let Ok(Some(status)) = process.child.try_wait()
            {
                return Err(StackError::Exited {
                    name: name.to_owned(),
                    status: status.to_string(),
                    log: process.log.clone(),
                });
            }
            if Instant::now() > deadline {
                return Err(self.not_ready(name, limit.as_secs()));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(())
    }

    /// Kills `name` with SIGKILL and leaves it stopped; [`Stack::start_again`]
    /// starts it as it was.
    pub async fn kill(&mut self, name: &str) -> Result<(), StackError> {
        let index = self.index_of(name)?;
        let mut killed = self.processes.remove(index);
        let _ = killed.child.start_kill();
        let _ = killed.child.wait().await;
        self.stopped.push(killed);
        Ok(())
    }

    /// Starts a process stopped by [`Stack::kill`] again, with the same
    /// program, arguments and environment (NATS servers keep their ports).
    pub fn start_again(&mut self, name: &str) -> Result<(), StackError> {
        let index = self
            .stopped
            .iter()
            .position(|p| p.name == name)
            .ok_or_else(|| StackError::Http(format!("{name} was not stopped")))?;
        let stopped = self.stopped.remove(index);
        self.spawn(
            name,
            stopped.program,
            &stopped.args,
            &stopped.env,
            stopped.http,
        )
    }

    fn index_of(&self, name: &str) -> Result<usize, StackError> {
        self.processes
            .iter()
            .position(|p| p.name == name)
            .ok_or_else(|| StackError::Http(format!("{name} is not running")))
    }

    fn not_ready(&self, name: &str, seconds: u64) -> StackError {
        StackError::NotReady {
            name: name.to_owned(),
            seconds,
            log: self.work.path().join(format!("{name}.log")),
        }
    }

    /// Starts the simulated cluster's binary with `config_yaml` (a
    /// `ClusterConfig`), reporting to this stack's NATS; returns the path of
    /// the kubeconfig it writes once the API is serving.
    pub async fn start_simulator(&mut self, config_yaml: &str) -> Result<PathBuf, StackError> {
        let config = self.work.path().join("cluster.yaml");
        std::fs::write(&config, config_yaml).map_err(|source| StackError::Io {
            path: config.clone(),
            source,
        })?;
        let kubeconfig = self.work.path().join("kubeconfig");
        let mut args = vec![
            "--config".to_owned(),
            config.to_string_lossy().into_owned(),
            "--kubeconfig-out".to_owned(),
            kubeconfig.to_string_lossy().into_owned(),
        ];
        if let Some(url) = &self.nats_url {
            args.extend(["--nats-url".to_owned(), url.clone()]);
        }
        if let Some(auth) = &self.nats_auth {
            args.extend([
                "--nats-user".to_owned(),
                Identity::Operator.user(),
                "--nats-password-file".to_owned(),
                auth.password_file(&Identity::Operator)
                    .to_string_lossy()
                    .into_owned(),
            ]);
        }
        let env = [("RUST_LOG".to_owned(), self.log_level.clone())];
        let program = self.bin_dir.join("trainyard-simulator");
        self.spawn("simulator", program, &args, &env, None)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        while !kubeconfig.exists() {
            self.check_alive()?;
            if Instant::now() > deadline {
                return Err(self.not_ready("simulator", 30));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(kubeconfig)
    }

    /// Writes a kubeconfig (e.g. of an in-process simulator) into the work
    /// directory for the services.
    pub fn write_kubeconfig(&self, yaml: &str) -> Result<PathBuf, StackError> {
        let path = self.work.path().join("kubeconfig");
        std::fs::write(&path, yaml).map_err(|source| StackError::Io {
            path: path.clone(),
            source,
        })?;
        Ok(path)
    }

    /// Starts one service binary (`trainyard-<name>`) against this stack's
    /// NATS, with its HTTP listener on a free port, plus `env`.
    pub fn start_service(
        &mut self,
        service: Service,
        env: &[(String, String)],
    ) -> Result<(), StackError> {
        self.start_service_as(service.name(), service, env)
    }

    /// Starts one more process of `service` under the process name `name`
    /// (e.g. a second replica, `planner-1`).
    pub fn start_service_as(
        &mut self,
        name: &str,
        service: Service,
        env: &[(String, String)],
    ) -> Result<(), StackError> {
        let nats = self
            .nats_url
            .clone()
            .ok_or_else(|| StackError::Nats("start NATS before the services".into()))?;
        let http = SocketAddr::from(([127, 0, 0, 1], free_port()?));
        let mut all = vec![
            ("TRAINYARD_NATS__URL".to_owned(), nats),
            ("TRAINYARD_HTTP__LISTEN".to_owned(), http.to_string()),
            (
                "TRAINYARD_TELEMETRY__LOG_LEVEL".to_owned(),
                self.log_level.clone(),
            ),
        ];
        if let Some(auth) = &self.nats_auth {
            all.extend(auth.service_env(service));
        }
        // JetStream reserves every stream's byte limit on disk up front (7.5
        // GiB with the contract's defaults) and refuses streams beyond the
        // free space; no run here stores more than a fraction of this.
        for stream in streams::ALL {
            all.push((
                format!(
                    "TRAINYARD_NATS__STREAM_MAX_BYTES__{}",
                    stream.family.as_str().to_uppercase()
                ),
                stream
                    .default_max_bytes
                    .min(BENCHMARK_STREAM_MAX_BYTES)
                    .to_string(),
            ));
        }
        all.extend(env.iter().cloned());
        let (program, args) = match &self.service_program {
            Some(program) => (program.clone(), vec![service.name().to_owned()]),
            None => (
                self.bin_dir.join(format!("trainyard-{}", service.name())),
                Vec::new(),
            ),
        };
        self.spawn(name, program, &args, &all, Some(http))
    }

    /// Starts all seven services, each with [`Stack::service_env`].
    pub fn start_services(
        &mut self,
        kubeconfig: &str,
        allocator_cycle_ms: u64,
    ) -> Result<(), StackError> {
        for service in Service::ALL {
            let env = self.service_env(service, kubeconfig, allocator_cycle_ms)?;
            self.start_service(service, &env)?;
        }
        Ok(())
    }

    /// What a service of this stack is started with beyond NATS and its
    /// listener: the watcher and planner get `kubeconfig`, workers are told to
    /// report to this stack's NATS, the allocator cycles every
    /// `allocator_cycle_ms`.
    pub fn service_env(
        &self,
        service: Service,
        kubeconfig: &str,
        allocator_cycle_ms: u64,
    ) -> Result<Vec<(String, String)>, StackError> {
        let nats = self
            .nats_url
            .clone()
            .ok_or_else(|| StackError::Nats("start NATS before the services".into()))?;
        let mut env = Vec::new();
        if matches!(service, Service::Watcher | Service::Planner) {
            env.push(("KUBECONFIG".to_owned(), kubeconfig.to_owned()));
        }
        if service == Service::Planner {
            env.push(("TRAINYARD_PLANNER__WORKER_NATS_URL".to_owned(), nats));
        }
        if service == Service::GpuAllocator {
            env.push((
                "TRAINYARD_GPU_ALLOCATOR__CYCLE_INTERVAL_MS".to_owned(),
                allocator_cycle_ms.to_string(),
            ));
        }
        if service == Service::Notifier {
            env.push((
                "TRAINYARD_NOTIFIER__ROUTES_FILE".to_owned(),
                self.notifier_routes()?.to_string_lossy().into_owned(),
            ));
        }
        Ok(env)
    }

    /// A routing file under which the notifier routes every event and mutes
    /// it: the benchmarks measure the routing, and nothing is sent.
    fn notifier_routes(&self) -> Result<PathBuf, StackError> {
        let write = |name: &str, text: &str| {
            let path = self.work.path().join(name);
            std::fs::write(&path, text).map_err(|source| StackError::Io {
                path: path.clone(),
                source,
            })?;
            Ok::<_, StackError>(path)
        };
        let url = write("slack-webhook-url", "http://127.0.0.1:9/muted\n")?;
        write(
            "notifier-routes.yaml",
            &format!(
                "route:\n  receiver: slack\n  mute_time_intervals: [always]\n\
                 receivers:\n  - name: slack\n    slack: {{channel: \"#loadtest\", webhook_url_file: {}}}\n\
                 time_intervals:\n  - name: always\n",
                url.display()
            ),
        )
    }

    /// Whether every process with an HTTP listener answers `/readyz` with 200 now.
    pub async fn all_ready(&self) -> bool {
        let Ok(client) = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
        else {
            return false;
        };
        for http in self.processes.iter().filter_map(|p| p.http) {
            let ready = client
                .get(format!("http://{http}/readyz"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if !ready {
                return false;
            }
        }
        true
    }

    /// Waits until every service answers `/readyz` with 200, at most `limit`.
    pub async fn wait_ready(&mut self, limit: Duration) -> Result<(), StackError> {
        let deadline = Instant::now() + limit;
        for i in 0..self.processes.len() {
            self.wait_process_ready(i, deadline, limit).await?;
        }
        Ok(())
    }

    /// Waits until process `i` answers `/readyz` with 200 (at once if it
    /// has no HTTP listener); an error once `deadline` passes.
    async fn wait_process_ready(
        &mut self,
        i: usize,
        deadline: Instant,
        limit: Duration,
    ) -> Result<(), StackError> {
        let Some(http) = self.processes[i].http else {
            return Ok(());
        };
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .map_err(|e| StackError::Http(e.to_string()))?;
        let url = format!("http://{http}/readyz");
        loop {
            let process = &mut self.processes[i];
            if let Ok(Some(status)) = process.child.try_wait() {
                return Err(StackError::Exited {
                    name: process.name.clone(),
                    status: status.to_string(),
                    log: process.log.clone(),
                });
            }
            let ready = client
                .get(&url)
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ready {
                return Ok(());
            }
            if Instant::now() > deadline {
                let name = process.name.clone();
                return Err(self.not_ready(&name, limit.as_secs()));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The Prometheus text a service serves on `/metrics`.
    pub async fn metrics(&self, service: Service) -> Result<String, StackError> {
        self.process_metrics(service.name()).await
    }

    /// The Prometheus text the process named `name` serves on `/metrics`.
    pub async fn process_metrics(&self, name: &str) -> Result<String, StackError> {
        let http = self
            .processes
            .iter()
            .find(|p| p.name == name)
            .and_then(|p| p.http)
            .ok_or_else(|| StackError::Http(format!("{name} is not running")))?;
        let response = reqwest::get(format!("http://{http}/metrics"))
            .await
            .map_err(|e| StackError::Http(e.to_string()))?;
        response
            .text()
            .await
            .map_err(|e| StackError::Http(e.to_string()))
    }

    /// The processes that have exited by themselves (crashed), by name.
    pub fn exited(&mut self) -> Vec<String> {
        self.processes
            .iter_mut()
            .filter_map(|p| matches!(p.child.try_wait(), Ok(Some(_))).then(|| p.name.clone()))
            .collect()
    }

    /// CPU seconds and peak RSS of every process still running.
    pub fn stats(&self) -> Vec<ProcessStats> {
        self.processes
            .iter()
            .filter_map(|p| {
                let pid = p.child.id()?;
                let ProcStats {
                    cpu_seconds,
                    peak_rss_bytes,
                } = procstats::sample(pid).ok()?;
                Some(ProcessStats {
                    name: p.name.clone(),
                    pid,
                    cpu_seconds,
                    peak_rss_bytes,
                })
            })
            .collect()
    }

    /// Stops everything: SIGTERM to the services and the simulator (they
    /// drain and exit), then to NATS, which they need while draining; a
    /// process still running after `grace` is killed.
    pub async fn stop(self, grace: Duration) {
        let Self {
            work,
            keep,
            processes,
            ..
        } = self;
        let (nats, rest): (Vec<Process>, Vec<Process>) = processes
            .into_iter()
            .partition(|p| p.name.starts_with("nats-"));
        terminate(rest, grace).await;
        terminate(nats, grace).await;
        if keep {
            eprintln!("logs kept in {}", work.keep().display());
        }
    }
}

/// How [`Stack::restart`] stops a process.
#[derive(Debug, Clone, Copy)]
pub enum Stop {
    /// SIGKILL: a crash or an OOM kill.
    Kill,
    /// SIGTERM, as Kubernetes stops a pod in a rolling update; SIGKILL after
    /// `grace`.
    Terminate { grace: Duration },
}

/// SIGTERM to each process (through `kill`, as the standard library only
/// sends SIGKILL), then waits up to `grace` for all, then kills the rest.
async fn terminate(processes: Vec<Process>, grace: Duration) {
    for process in &processes {
        if let Some(pid) = process.child.id() {
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .await;
        }
    }
    let deadline = tokio::time::Instant::now() + grace;
    for mut process in processes {
        if tokio::time::timeout_at(deadline, process.child.wait())
            .await
            .is_err()
        {
            let _ = process.child.start_kill();
            let _ = process.child.wait().await;
        }
    }
}

/// The last sequence number of every Trainyard stream: how many messages
/// were ever published to it (unaffected by limits or acks).
pub async fn stream_sequences(
    js: &jetstream::Context,
) -> Result<BTreeMap<&'static str, u64>, StackError> {
    let mut out = BTreeMap::new();
    for spec in streams::ALL {
        let mut stream = js
            .get_stream(spec.name)
            .await
            .map_err(|e| StackError::Nats(format!("stream {}: {e}", spec.name)))?;
        let info = stream
            .info()
            .await
            .map_err(|e| StackError::Nats(format!("stream {}: {e}", spec.name)))?;
        out.insert(spec.name, info.state.last_sequence);
    }
    Ok(out)
}

/// Where a durable consumer stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumerProgress {
    /// Deliveries acknowledged (the ack floor's consumer sequence).
    pub acked: u64,
    /// Messages in the stream not yet delivered, plus delivered ones not yet acked.
    pub backlog: u64,
}

/// The progress of `service`'s consumers on `stream`, summed: a service may
/// keep several there (the planner reads TrainingJob changes apart from Job
/// and Pod observations).
pub async fn consumer_progress(
    js: &jetstream::Context,
    service: Service,
    stream: streams::StreamSpec,
) -> Result<ConsumerProgress, StackError> {
    let durables: Vec<String> = service
        .consumers()
        .into_iter()
        .filter(|c| c.stream.name == stream.name)
        .map(|c| c.durable)
        .collect();
    if durables.is_empty() {
        return Err(StackError::Nats(format!(
            "{} reads no {}",
            service.name(),
            stream.name
        )));
    }
    let mut total = ConsumerProgress {
        acked: 0,
        backlog: 0,
    };
    for durable in durables {
        let progress = durable_progress(js, stream.name, &durable).await?;
        total.acked += progress.acked;
        total.backlog += progress.backlog;
    }
    Ok(total)
}

async fn durable_progress(
    js: &jetstream::Context,
    stream: &str,
    durable: &str,
) -> Result<ConsumerProgress, StackError> {
    let handle = js
        .get_stream(stream)
        .await
        .map_err(|e| StackError::Nats(format!("stream {stream}: {e}")))?;
    let info = handle
        .consumer_info(durable)
        .await
        .map_err(|e| StackError::Nats(format!("consumer {durable}: {e}")))?;
    Ok(ConsumerProgress {
        acked: info.ack_floor.consumer_sequence,
        backlog: info.num_pending + info.num_ack_pending as u64,
    })
}

/// Whether no durable consumer of `services` has anything left to handle:
/// those services have caught up with what was published. Consumers that
/// cannot be read are skipped: services that do not consume yet (some are
/// still stubs) never create theirs.
pub async fn consumers_idle(js: &jetstream::Context, services: &[Service]) -> bool {
    for service in services {
        for spec in service.consumers() {
            if let Ok(progress) = durable_progress(js, spec.stream.name, &spec.durable).await
                && progress.backlog > 0
            {
                return false;
            }
        }
    }
    true
}

/// Waits (at most `limit`) until every service has handled what the start-up
/// published (node events, the queue), so a measurement starts idle.
pub async fn settle(js: &jetstream::Context, limit: Duration) {
    let deadline = Instant::now() + limit;
    let mut idle_since: Option<Instant> = None;
    while Instant::now() < deadline {
        if consumers_idle(js, &Service::ALL).await {
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= Duration::from_secs(1) {
                return;
            }
        } else {
            idle_since = None;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    eprintln!("warning: the stack was still busy after {limit:?}; measuring anyway");
}

/// Watches `api` and calls `on_change` with each object seen, whether it was
/// deleted, and when; resolves the returned receiver once the initial list
/// is done.
pub fn watch_objects<K>(
    api: kube::Api<K>,
    config: watcher::Config,
    stop: CancellationToken,
    mut on_change: impl FnMut(K, bool, Instant) + Send + 'static,
) -> tokio::sync::oneshot::Receiver<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let (ready, ready_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let kind = std::any::type_name::<K>();
        let stream = watcher(api, config).default_backoff();
        futures::pin_mut!(stream);
        let mut ready = Some(ready);
        loop {
            let event = tokio::select! {
                _ = stop.cancelled() => return,
                event = stream.next() => event,
            };
            let now = Instant::now();
            match event {
                None => return,
                Some(Ok(watcher::Event::InitDone)) => {
                    if let Some(ready) = ready.take() {
                        let _ = ready.send(());
                    }
                }
                Some(Ok(watcher::Event::Apply(object) | watcher::Event::InitApply(object))) => {
                    on_change(object, false, now)
                }
                Some(Ok(watcher::Event::Delete(object))) => on_change(object, true, now),
                Some(Ok(watcher::Event::Init)) => {}
                Some(Err(err)) => eprintln!("{kind} watch: {err}"),
            }
        }
    });
    ready_rx
}

/// The value of the first sample of Prometheus text `metrics` whose series
/// (name and labels, as written) starts with `series`.
pub fn metric_value(metrics: &str, series: &str) -> Option<f64> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| l.starts_with(series))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// The release binaries of the default cargo target directory
/// (`$CARGO_TARGET_DIR`, else the workspace's `target/`).
pub fn default_bin_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("release")
}

/// A Kubernetes client for the API a kubeconfig (YAML text) points at.
pub async fn kube_client(kubeconfig: &str) -> Result<kube::Client, StackError> {
    let kube_err = |e: &dyn std::fmt::Display| StackError::Kube(e.to_string());
    let parsed = kube::config::Kubeconfig::from_yaml(kubeconfig).map_err(|e| kube_err(&e))?;
    let config = kube::Config::from_custom_kubeconfig(parsed, &Default::default())
        .await
        .map_err(|e| kube_err(&e))?;
    kube::Client::try_from(config).map_err(|e| kube_err(&e))
}

/// Resolves on Ctrl-C or SIGTERM; an error if they cannot be listened for
/// (a benchmark should then not start: an interrupt would leave its
/// processes behind).
pub async fn interrupted() -> std::io::Result<()> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        result = tokio::signal::ctrl_c() => result,
        _ = term.recv() => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metric_values_are_found_by_series_prefix() {
        let text = "# HELP x_seconds help\n# TYPE x_seconds histogram\nx_seconds_sum{outcome=\"ok\"} 1.5\nx_seconds_count{outcome=\"ok\"} 3\nx_seconds_count{outcome=\"error\"} 1\n";
        assert_eq!(
            metric_value(text, "x_seconds_sum{outcome=\"ok\"}"),
            Some(1.5)
        );
        assert_eq!(
            metric_value(text, "x_seconds_count{outcome=\"error\"}"),
            Some(1.0)
        );
        assert_eq!(metric_value(text, "y_total"), None);
    }
}
