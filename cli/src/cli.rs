//! Command-line syntax: flags named and shaped like kubectl's.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::jsonpath::Template;

/// Trainyard's command-line client: apply manifests, watch TrainingJobs and Sweeps,
/// summarise a run. Talks to any Kubernetes API (a real cluster or the simulator)
/// found through KUBECONFIG, ~/.kube/config or the in-cluster service account.
#[derive(Debug, Parser)]
#[command(name = "trainyard", version)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,

    /// Which cluster to talk to.
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// kubectl's `--kubeconfig` and `--context`, accepted by every subcommand.
#[derive(Debug, Default, Clone, Args)]
pub struct ClusterArgs {
    /// Kubeconfig file to use instead of KUBECONFIG or ~/.kube/config.
    #[arg(long, global = true, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,

    /// Kubeconfig context to use instead of its current-context.
    #[arg(long, global = true, value_name = "CONTEXT")]
    pub context: Option<String>,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Create or update TrainingJobs, Sweeps, TrainingQueues and any other kind the
    /// cluster serves from YAML files (server-side apply); nothing is applied if any
    /// document is invalid or of a kind the cluster does not serve.
    Apply(ApplyArgs),
    /// List TrainingJobs, Sweeps or TrainingQueues (all, by name or by label) as a
    /// table, JSON, YAML or names, or watch them change.
    Get(GetArgs),
    /// One object in full: spec, status, conditions, checkpoints, cost and its Events.
    Describe(DescribeArgs),
    /// Why a TrainingJob waits: its queue, position and the gpu-allocator's reason.
    Explain(ExplainArgs),
    /// A TrainingJob's worker logs (rank 0 unless told), like `kubectl logs`.
    Logs(LogsArgs),
    /// Print the commands that open a TrainingJob's TensorBoard logs (kept
    /// under its checkpoint directory): a TensorBoard pod on the checkpoint
    /// volume and a port-forward, or a local TensorBoard on the bucket URI.
    Tensorboard(TensorboardArgs),
    /// Outcome counts, queueing delay, durations and GPU utilisation of TrainingJobs.
    Summary(SummaryArgs),
    /// Delete TrainingJobs, Sweeps or TrainingQueues by name.
    Delete(DeleteArgs),
    /// Suspend TrainingJobs (spec.suspend: true): checkpoint, stop the workers and
    /// give their GPUs back.
    Suspend(JobNamesArgs),
    /// Resume suspended TrainingJobs (spec.suspend: false): queue them again; they
    /// continue from their latest checkpoint.
    Resume(JobNamesArgs),
    /// Print a shell completion script, e.g. `source <(trainyard completion bash)`.
    Completion(CompletionArgs),
    /// Recent notifications the notifier delivered (or is retrying, or gave up
    /// on), newest first, from its delivery-status bucket in NATS.
    Notifications(NotificationsArgs),
    /// Messages a consumer gave up on: list them, show one whole, or replay
    /// them (publish the original again, then remove the dead letter) once
    /// their cause is fixed.
    #[command(name = "deadletter", alias = "deadletters", alias = "dl")]
    DeadLetter(DeadLetterArgs),
    /// What jobs have cost, by job, queue or namespace (from the TrainingJobs'
    /// status.cost), with each queue's spend in its current budget period.
    Cost(CostArgs),
}

/// `trainyard deadletter`.
#[derive(Debug, Args)]
pub struct DeadLetterArgs {
    /// What to do.
    #[command(subcommand)]
    pub action: DeadLetterAction,

    /// Where NATS is and who to be there.
    #[command(flatten)]
    pub nats: NatsArgs,
}

/// `trainyard deadletter list|show|replay`.
#[derive(Debug, Subcommand)]
pub enum DeadLetterAction {
    /// Dead letters, oldest first: sequence, time, original subject, consumer,
    /// category and reason.
    List {
        #[command(flatten)]
        filter: DeadLetterFilter,
        /// Output format.
        #[arg(short = 'o', long, value_enum, value_name = "FORMAT")]
        output: Option<JsonOutput>,
    },
    /// One dead letter whole: where it came from, the reason, the original
    /// headers and payload.
    Show {
        /// Sequence in the dead-letter stream (the SEQ column of `list`).
        sequence: u64,
        /// Output format.
        #[arg(short = 'o', long, value_enum, value_name = "FORMAT")]
        output: Option<JsonOutput>,
    },
    /// Publishes originals again on their own subjects with their own headers
    /// (the envelope, and its id, unchanged), then deletes their dead letters.
    Replay {
        /// Sequences in the dead-letter stream.
        #[arg(
            value_name = "SEQ",
            required_unless_present = "all",
            conflicts_with = "all"
        )]
        sequences: Vec<u64>,
        /// Every dead letter matching the filters.
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        filter: DeadLetterFilter,
        /// Output format.
        #[arg(short = 'o', long, value_enum, value_name = "FORMAT")]
        output: Option<JsonOutput>,
    },
}

/// Which dead letters.
#[derive(Debug, Clone, Default, Args)]
pub struct DeadLetterFilter {
    /// Only those of this durable consumer, e.g. planner-events.
    #[arg(long, value_name = "CONSUMER")]
    pub consumer: Option<String>,
    /// Only those from this stream, e.g. TRAINYARD_EVENTS.
    #[arg(long, value_name = "STREAM")]
    pub stream: Option<String>,
    /// Only those of this category, e.g. retries_exhausted.
    #[arg(long, value_name = "CATEGORY")]
    pub category: Option<String>,
}

/// `-o json`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum JsonOutput {
    /// JSON.
    Json,
}

/// How to reach NATS, as the operator identity of deploy/nats/auth.conf. Each
/// flag can also be set in the environment (`TRAINYARD_NATS_URL`, ...).
#[derive(Debug, Clone, Args)]
pub struct NatsArgs {
    /// The NATS server the services use (tls:// or nats://).
    #[arg(
        long,
        value_name = "URL",
        env = "TRAINYARD_NATS_URL",
        default_value = "nats://127.0.0.1:4222",
        global = true
    )]
    pub nats_url: String,
    /// NATS credentials file (JWT and seed), for servers run with accounts.
    #[arg(long, value_name = "FILE", env = "TRAINYARD_NATS_CREDS", global = true)]
    pub nats_creds: Option<PathBuf>,
    /// NATS user: `operator` in deploy/nats/auth.conf.
    #[arg(long, value_name = "USER", env = "TRAINYARD_NATS_USER", global = true)]
    pub nats_user: Option<String>,
    /// File holding the NATS user's password.
    #[arg(
        long,
        value_name = "FILE",
        env = "TRAINYARD_NATS_PASSWORD_FILE",
        global = true
    )]
    pub nats_password_file: Option<PathBuf>,
    /// CA bundle the server's certificate must chain to; giving it requires TLS.
    #[arg(
        long,
        value_name = "FILE",
        env = "TRAINYARD_NATS_TLS_CA",
        global = true
    )]
    pub nats_tls_ca: Option<PathBuf>,
    /// Client certificate, for servers that verify clients (with --nats-tls-key).
    #[arg(
        long,
        value_name = "FILE",
        env = "TRAINYARD_NATS_TLS_CERT",
        global = true
    )]
    pub nats_tls_cert: Option<PathBuf>,
    /// The client certificate's private key.
    #[arg(
        long,
        value_name = "FILE",
        env = "TRAINYARD_NATS_TLS_KEY",
        global = true
    )]
    pub nats_tls_key: Option<PathBuf>,
}

/// `trainyard cost`.
#[derive(Debug, Args)]
pub struct CostArgs {
    /// Group by job, queue or namespace.
    #[arg(long, value_enum, default_value = "job")]
    pub by: CostBy,

    #[command(flatten)]
    pub scope: ScopeArgs,

    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: CostFormat,

    /// Only what was spent in this period before now, e.g. 30m, 24h or 7d,
    /// read from the cost-optimizer's cost.recorded messages in NATS (as far
    /// back as the stream keeps them) instead of the jobs' status.
    #[arg(long, value_name = "DURATION", value_parser = parse_period)]
    pub since: Option<std::time::Duration>,

    /// Where NATS is, to read the cost records from with --since.
    #[command(flatten)]
    pub nats: NatsArgs,
}

/// A period such as `90s`, `30m`, `24h` or `7d`.
pub fn parse_period(text: &str) -> Result<std::time::Duration, String> {
    let unit_at = text
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{text:?} has no unit: use s, m, h or d, e.g. 24h"))?;
    let (number, unit) = text.split_at(unit_at);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} does not start with a whole number, e.g. 24h"))?;
    let seconds = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {text:?}: use s, m, h or d"
            ));
        }
    };
    Ok(std::time::Duration::from_secs(
        number.saturating_mul(seconds),
    ))
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CostBy {
    Job,
    Queue,
    Namespace,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum CostFormat {
    Table,
    Json,
    Csv,
}

/// `trainyard delete`.
#[derive(Debug, Args)]
pub struct DeleteArgs {
    /// What to delete.
    #[arg(value_enum)]
    pub resource: ResourceKind,

    /// Names of the objects.
    #[arg(required = true, value_name = "NAME")]
    pub names: Vec<String>,

    /// Namespace (default: the kubeconfig context's, else "default"; ignored for
    /// trainingqueues).
    #[arg(short = 'n', long, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
}

/// `trainyard describe`.
#[derive(Debug, Args)]
pub struct DescribeArgs {
    /// What to describe.
    #[arg(value_enum)]
    pub resource: ResourceKind,

    /// Name of the object.
    #[arg(value_name = "NAME")]
    pub name: String,

    /// Namespace (default: the kubeconfig context's, else "default"; ignored for
    /// trainingqueues).
    #[arg(short = 'n', long, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
}

/// `trainyard explain`.
#[derive(Debug, Args)]
pub struct ExplainArgs {
    /// Name of the TrainingJob.
    #[arg(value_name = "NAME")]
    pub name: String,

    /// Namespace (default: the kubeconfig context's, else "default").
    #[arg(short = 'n', long, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
}

/// `trainyard tensorboard`.
#[derive(Debug, Args)]
pub struct TensorboardArgs {
    /// Name of the TrainingJob.
    #[arg(value_name = "NAME")]
    pub name: String,

    /// Namespace (default: the kubeconfig context's, else "default").
    #[arg(short = 'n', long, value_name = "NAMESPACE")]
    pub namespace: Option<String>,

    /// Local port forwarded to TensorBoard.
    #[arg(long, value_name = "PORT", default_value_t = 6006)]
    pub port: u16,

    /// Image with the tensorboard command, for the pod on the checkpoint volume.
    #[arg(
        long,
        value_name = "IMAGE",
        default_value = "tensorflow/tensorflow:2.16.1"
    )]
    pub image: String,
}

/// `trainyard suspend` / `resume`.
#[derive(Debug, Args)]
pub struct JobNamesArgs {
    /// Names of the TrainingJobs.
    #[arg(required = true, value_name = "NAME")]
    pub names: Vec<String>,

    /// Namespace (default: the kubeconfig context's, else "default").
    #[arg(short = 'n', long, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
}

/// `trainyard logs`.
#[derive(Debug, Args)]
pub struct LogsArgs {
    /// Name of the TrainingJob.
    #[arg(value_name = "NAME")]
    pub name: String,

    /// The worker whose log to print (its rank, the Indexed Job's completion index).
    #[arg(long, value_name = "N", default_value_t = 0, conflicts_with = "all")]
    pub rank: u32,

    /// Every worker's log, each line prefixed with `[rank N]`.
    #[arg(long)]
    pub all: bool,

    /// Keep printing new lines until the workers exit.
    #[arg(short = 'f', long)]
    pub follow: bool,

    /// Only the last N lines of each log.
    #[arg(long, value_name = "N")]
    pub tail: Option<u32>,

    /// Only lines written in this past period: a whole number and s, m, h or d
    /// (e.g. 10m).
    #[arg(long, value_name = "PERIOD", value_parser = parse_period)]
    pub since: Option<std::time::Duration>,

    /// Prefix each line with the time it was written (RFC 3339).
    #[arg(long)]
    pub timestamps: bool,

    /// Namespace (default: the kubeconfig context's, else "default").
    #[arg(short = 'n', long, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
}

/// `trainyard completion`.
#[derive(Debug, Args)]
pub struct CompletionArgs {
    /// The shell.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
}

/// `trainyard notifications`.
#[derive(Debug, Args)]
pub struct NotificationsArgs {
    /// Where NATS is: the server the notifier uses.
    #[command(flatten)]
    pub nats: NatsArgs,

    /// Only notifications in this state.
    #[arg(long, value_enum)]
    pub state: Option<DeliveryStateArg>,

    /// At most this many.
    #[arg(long, default_value_t = 50)]
    pub limit: usize,

    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `--state` values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DeliveryStateArg {
    Pending,
    Sent,
    Retrying,
    Failed,
}

impl DeliveryStateArg {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Sent => "sent",
            Self::Retrying => "retrying",
            Self::Failed => "failed",
        }
    }
}

/// `trainyard apply`.
#[derive(Debug, Args)]
pub struct ApplyArgs {
    /// Manifest file, directory of .yaml/.yml/.json files, or - for standard input;
    /// repeat for more.
    #[arg(short = 'f', long = "filename", value_name = "FILE", required = true)]
    pub files: Vec<PathBuf>,

    /// Namespace for objects that do not name one (default: the kubeconfig context's,
    /// else "default").
    #[arg(short = 'n', long, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
}

/// `-n` / `-A`, shared by `get` and `summary`.
#[derive(Debug, Args)]
pub struct ScopeArgs {
    /// Namespace to look in (default: the kubeconfig context's, else "default").
    #[arg(
        short = 'n',
        long,
        value_name = "NAMESPACE",
        conflicts_with = "all_namespaces"
    )]
    pub namespace: Option<String>,

    /// Look in every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
}

/// `trainyard get`.
#[derive(Debug, Args)]
pub struct GetArgs {
    /// What to list.
    #[arg(value_enum)]
    pub resource: ResourceKind,

    /// Only these objects (by name); all when none is given.
    #[arg(value_name = "NAME")]
    pub names: Vec<String>,

    /// Only objects whose labels match this selector, e.g. `team=nlp,tier!=dev`.
    #[arg(short = 'l', long, value_name = "SELECTOR")]
    pub selector: Option<String>,

    /// Which namespaces (ignored for cluster-scoped trainingqueues).
    #[command(flatten)]
    pub scope: ScopeArgs,

    /// After listing, print a row again each time one changes.
    #[arg(short = 'w', long)]
    pub watch: bool,

    /// Watch until every object in scope is Completed or Failed (at least one must
    /// exist), then exit 0. Implies --watch.
    #[arg(long)]
    pub until_done: bool,

    /// Give up after this many seconds and exit non-zero.
    #[arg(long, value_name = "SECONDS")]
    pub timeout: Option<u64>,

    /// Output format: wide (extra columns), json, yaml, name, or jsonpath=TEMPLATE
    /// (kubectl's JSONPath template, e.g. 'jsonpath={range .items[*]}{.metadata.name}{"\n"}{end}').
    #[arg(short = 'o', long, value_name = "FORMAT", value_parser = parse_output)]
    pub output: Option<OutputFormat>,
}

/// The kinds `get` lists, with kubectl's plural, singular and short names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum ResourceKind {
    /// TrainingJobs.
    #[value(
        name = "trainingjobs",
        alias = "trainingjob",
        alias = "tj",
        alias = "tjob"
    )]
    TrainingJobs,
    /// Sweeps.
    #[value(name = "sweeps", alias = "sweep", alias = "sw")]
    Sweeps,
    /// TrainingQueues.
    #[value(name = "trainingqueues", alias = "trainingqueue", alias = "tq")]
    TrainingQueues,
}

/// `-o` values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    /// The table with extra columns after AGE.
    Wide,
    /// JSON: the object, a kubectl-style List, or one object per line while watching.
    Json,
    /// YAML: the object, a kubectl-style List, or one document per change while watching.
    Yaml,
    /// `<kind>.<group>/<name>`, one per line, as kubectl prints for scripts.
    Name,
    /// `jsonpath=<template>`: the template filled in from the object or the List
    /// (from each changed object while watching).
    JsonPath(Template),
}

/// Parses `-o`; a template that does not parse is refused here, naming where.
fn parse_output(value: &str) -> Result<OutputFormat, String> {
    match value {
        "wide" => Ok(OutputFormat::Wide),
        "json" => Ok(OutputFormat::Json),
        "yaml" => Ok(OutputFormat::Yaml),
        "name" => Ok(OutputFormat::Name),
        _ => match value.split_once('=') {
            Some(("jsonpath", template)) => Template::parse(template)
                .map(OutputFormat::JsonPath)
                .map_err(|e| e.to_string()),
            _ => Err(format!(
                "unknown output format {value:?}: use wide, json, yaml, name or jsonpath=TEMPLATE"
            )),
        },
    }
}

/// `trainyard summary`.
#[derive(Debug, Args)]
pub struct SummaryArgs {
    /// Which namespaces.
    #[command(flatten)]
    pub scope: ScopeArgs,

    /// Print JSON instead of tables.
    #[arg(long)]
    pub json: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(std::iter::once("trainyard").chain(args.iter().copied()))
    }

    #[test]
    fn the_command_definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn cost_takes_a_grouping_a_format_and_a_period() {
        let cli =
            parse(&["cost", "--by", "queue", "-A", "-o", "csv", "--since", "7d"]).expect("parses");
        let Command::Cost(args) = cli.command else {
            panic!("not cost: {cli:?}");
        };
        assert_eq!((args.by, args.output), (CostBy::Queue, CostFormat::Csv));
        assert_eq!(args.since, Some(std::time::Duration::from_secs(7 * 86_400)));
        assert!(args.scope.all_namespaces);
        assert_eq!(parse_period("90s"), Ok(std::time::Duration::from_secs(90)));
        assert_eq!(
            parse_period("30m"),
            Ok(std::time::Duration::from_secs(1800))
        );
        assert!(parse_period("24").is_err(), "a unit is required");
        assert!(parse_period("2w").is_err());
        assert!(parse(&["cost", "--by", "team"]).is_err());
    }

    #[test]
    fn apply_takes_several_files_and_a_namespace() {
        let cli =
            parse(&["apply", "-f", "a.yaml", "--filename", "b.yaml", "-n", "ml"]).expect("parses");
        let Command::Apply(args) = cli.command else {
            panic!("not apply: {cli:?}");
        };
        assert_eq!(
            args.files,
            [PathBuf::from("a.yaml"), PathBuf::from("b.yaml")]
        );
        assert_eq!(args.namespace.as_deref(), Some("ml"));
        assert!(parse(&["apply"]).is_err(), "-f is required");
    }

    #[test]
    fn get_understands_kubectl_names_and_flags() {
        let cli = parse(&[
            "get",
            "tj",
            "-A",
            "-w",
            "--until-done",
            "--timeout",
            "30",
            "-o",
            "wide",
        ])
        .expect("parses");
        let Command::Get(args) = cli.command else {
            panic!("not get: {cli:?}");
        };
        assert_eq!(args.resource, ResourceKind::TrainingJobs);
        assert!(args.scope.all_namespaces && args.watch && args.until_done);
        assert_eq!(args.timeout, Some(30));
        assert_eq!(args.output, Some(OutputFormat::Wide));
        for (name, kind) in [
            ("sweeps", ResourceKind::Sweeps),
            ("sw", ResourceKind::Sweeps),
            ("trainingjob", ResourceKind::TrainingJobs),
            ("tq", ResourceKind::TrainingQueues),
        ] {
            let Command::Get(args) = parse(&["get", name]).expect("parses").command else {
                panic!("not get");
            };
            assert_eq!(args.resource, kind, "{name}");
        }
        assert!(parse(&["get", "pods"]).is_err());
        assert!(
            parse(&["get", "tj", "-n", "ml", "-A"]).is_err(),
            "-n and -A conflict"
        );
        assert!(parse(&["get", "tj", "-o", "yaml"]).is_ok());
        assert!(parse(&["get", "tj", "-o", "xml"]).is_err());
        let Command::Get(args) = parse(&["get", "tj", "-o", "jsonpath={.items[*].metadata.name}"])
            .expect("parses")
            .command
        else {
            panic!("not get");
        };
        assert!(matches!(args.output, Some(OutputFormat::JsonPath(t))
            if t.source() == "{.items[*].metadata.name}"));
        let error = parse(&["get", "tj", "-o", "jsonpath={.items[0"]).expect_err("refused");
        assert_eq!(error.exit_code(), 2);
        assert!(
            error
                .to_string()
                .contains("jsonpath template: [ is never closed at position 8"),
            "{error}"
        );
        assert!(parse(&["get", "tj", "--timeout", "soon"]).is_err());
    }

    #[test]
    fn deadletter_replay_takes_sequences_or_all_with_filters() {
        let Command::DeadLetter(args) = parse(&["deadletter", "replay", "3", "9"])
            .expect("parses")
            .command
        else {
            panic!("not deadletter");
        };
        let DeadLetterAction::Replay { sequences, all, .. } = args.action else {
            panic!("not replay");
        };
        assert_eq!(sequences, [3, 9]);
        assert!(!all);
        let Command::DeadLetter(args) = parse(&[
            "deadletter",
            "replay",
            "--all",
            "--consumer",
            "planner-events",
            "--nats-url",
            "nats://nats:4222",
        ])
        .expect("parses")
        .command
        else {
            panic!("not deadletter");
        };
        assert_eq!(args.nats.nats_url, "nats://nats:4222");
        let DeadLetterAction::Replay { filter, all, .. } = args.action else {
            panic!("not replay");
        };
        assert!(all);
        assert_eq!(filter.consumer.as_deref(), Some("planner-events"));
        assert!(
            parse(&["deadletter", "replay"]).is_err(),
            "sequences or --all"
        );
        assert!(parse(&["deadletter", "replay", "3", "--all"]).is_err());
        assert!(parse(&["deadletter", "show"]).is_err(), "a sequence");
        assert!(parse(&["deadletter", "list", "-o", "json"]).is_ok());
    }

    #[test]
    fn logs_takes_a_rank_or_all_and_kubectls_log_flags() {
        let Command::Logs(args) = parse(&["logs", "mnist", "-f", "--tail", "20", "-n", "ml"])
            .expect("parses")
            .command
        else {
            panic!("not logs");
        };
        assert_eq!(
            (args.name.as_str(), args.rank, args.all),
            ("mnist", 0, false)
        );
        assert!(args.follow);
        assert_eq!(args.tail, Some(20));
        assert_eq!(args.namespace.as_deref(), Some("ml"));
        let Command::Logs(args) = parse(&["logs", "mnist", "--rank", "3", "--since", "10m"])
            .expect("parses")
            .command
        else {
            panic!("not logs");
        };
        assert_eq!(args.rank, 3);
        assert_eq!(args.since, Some(std::time::Duration::from_secs(600)));
        assert!(parse(&["logs", "mnist", "--rank", "1", "--all"]).is_err());
        assert!(parse(&["logs", "mnist", "--rank", "-1"]).is_err());
        assert!(parse(&["logs"]).is_err(), "a job name is required");
    }

    #[test]
    fn summary_takes_scope_and_json() {
        let Command::Summary(args) = parse(&["summary", "-n", "ml", "--json"])
            .expect("parses")
            .command
        else {
            panic!("not summary");
        };
        assert_eq!(args.scope.namespace.as_deref(), Some("ml"));
        assert!(args.json);
    }
}
