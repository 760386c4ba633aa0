//! `trainyard cost`: what jobs have cost, by job, queue or namespace, from the
//! TrainingJobs' `status.cost` (written by the planner from the
//! cost-optimizer's records), with each queue's spend in its current budget
//! period from the TrainingQueues' `status.budget`; or, with `--since`, what
//! was spent in a period, from the cost-optimizer's `cost.recorded` messages.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures::StreamExt;
use trainyard_contracts::cost::CostRecorded;
use trainyard_contracts::subject::{Family, kind_filter};
use trainyard_contracts::{EntityRef, Incoming, Payload, streams};

use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde::Serialize;
use trainyard_api::{TrainingJob, TrainingQueue};

use crate::cli::{CostBy, CostFormat, NatsArgs};
use crate::error::CliError;
use crate::format::table;
use crate::resources::Scope;

/// One group's cost.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CostRow {
    /// `namespace/name`, the queue or the namespace.
    pub group: String,
    pub jobs: u32,
    pub gpu_hours: f64,
    /// Spent so far, over the jobs' lives.
    pub accrued: f64,
    /// Accrued plus the expected cost of the work left, for the jobs whose
    /// runtime is known (the others count with what they spent); None for
    /// a period (`--since`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub estimated: Option<f64>,
    pub currency: String,
    /// For a queue with a budget: spend in the current period.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub budget: Option<BudgetRow>,
}

/// A queue's spend in its current budget period.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct BudgetRow {
    pub period_start: String,
    pub spent: f64,
    pub amount: f64,
    pub state: String,
}

/// The rows, one per group, sorted by group. Jobs without a cost yet count
/// in their group with nothing spent; several currencies in one group show
/// as `mixed`.
pub fn rows(jobs: &[TrainingJob], queues: &[TrainingQueue], by: CostBy) -> Vec<CostRow> {
    let mut groups: BTreeMap<String, CostRow> = BTreeMap::new();
    for job in jobs {
        let namespace = job.namespace().unwrap_or_default();
        let status = job.status.as_ref();
        let queue = status
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.queue.clone())
            .unwrap_or_else(|| job.spec.queue_name().to_owned());
        let group = match by {
            CostBy::Job => format!("{namespace}/{}", job.name_any()),
            CostBy::Queue => queue,
            CostBy::Namespace => namespace,
        };
        let row = groups.entry(group.clone()).or_insert_with(|| CostRow {
            group,
            jobs: 0,
            gpu_hours: 0.0,
            accrued: 0.0,
            estimated: None,
            currency: String::new(),
            budget: None,
        });
        row.jobs += 1;
        let Some(cost) = status.and_then(|s| s.cost.as_ref()) else {
            continue;
        };
        row.gpu_hours += cost.gpu_seconds / 3600.0;
        row.accrued += cost.accrued;
        row.estimated = Some(row.estimated.unwrap_or(0.0) + cost.estimated.unwrap_or(cost.accrued));
        if row.currency.is_empty() {
            row.currency = cost.currency.clone();
        } else if !cost.currency.is_empty() && row.currency != cost.currency {
            row.currency = "mixed".to_owned();
        }
    }
    if by == CostBy::Queue {
        for queue in queues {
            let Some(budget) = queue.status.as_ref().and_then(|s| s.budget.as_ref()) else {
                continue;
            };
            let name = queue.name_any();
            let row = groups.entry(name.clone()).or_insert_with(|| CostRow {
                group: name,
                jobs: 0,
                gpu_hours: 0.0,
                accrued: 0.0,
                estimated: None,
                currency: budget.currency.clone(),
                budget: None,
            });
            row.budget = Some(BudgetRow {
                period_start: budget.period_start.clone(),
                spent: budget.spent,
                amount: budget.amount,
                state: budget.state.clone(),
            });
        }
    }
    groups.into_values().collect()
}

fn money(value: f64) -> String {
    format!("{value:.2}")
}

fn header(by: CostBy, budget_columns: bool) -> Vec<String> {
    let group = match by {
        CostBy::Job => "JOB",
        CostBy::Queue => "QUEUE",
        CostBy::Namespace => "NAMESPACE",
    };
    let mut header = vec![
        group,
        "JOBS",
        "GPU-HOURS",
        "ACCRUED",
        "ESTIMATED",
        "CURRENCY",
    ];
    if budget_columns {
        header.extend([
            "BUDGET-PERIOD-START",
            "BUDGET-SPENT",
            "BUDGET",
            "BUDGET-STATE",
        ]);
    }
    header.into_iter().map(str::to_owned).collect()
}

fn cells(row: &CostRow, budget_columns: bool) -> Vec<String> {
    let mut cells = vec![
        row.group.clone(),
        row.jobs.to_string(),
        format!("{:.2}", row.gpu_hours),
        money(row.accrued),
        row.estimated.map_or_else(|| "-".to_owned(), money),
        row.currency.clone(),
    ];
    if budget_columns {
        match &row.budget {
            Some(b) => cells.extend([
                b.period_start.clone(),
                money(b.spent),
                money(b.amount),
                b.state.clone(),
            ]),
            None => cells.extend(["-", "-", "-", "-"].map(str::to_owned)),
        }
    }
    cells
}

/// A CSV field, quoted when it holds a comma, quote or line break (RFC 4180).
fn csv_field(value: &str) -> String {
    if value.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", value.replace('"', "\"\""))
    } else {
        value.to_owned()
    }
}

/// The report in `format`; `budget_columns`: each queue's budget spend
/// (with `--by queue` from the statuses; a period has none).
pub fn render(
    rows: &[CostRow],
    by: CostBy,
    budget_columns: bool,
    format: CostFormat,
) -> Result<String, CliError> {
    Ok(match format {
        CostFormat::Table => {
            let mut lines = vec![header(by, budget_columns)];
            lines.extend(rows.iter().map(|row| cells(row, budget_columns)));
            table(&lines)
        }
        CostFormat::Json => serde_json::to_string_pretty(rows)? + "\n",
        CostFormat::Csv => std::iter::once(header(by, budget_columns))
            .chain(rows.iter().map(|row| cells(row, budget_columns)))
            .map(|line| {
                line.iter()
                    .map(|cell| csv_field(if cell == "-" { "" } else { cell }))
                    .collect::<Vec<_>>()
                    .join(",")
                    + "\n"
            })
            .collect(),
    })
}

/// The rows of what was spent in the accounting intervals that end after
/// `from`, from the cost records of jobs (`entity`) in `scope`, one per group.
pub fn period_rows(
    records: &[(EntityRef, CostRecorded)],
    by: CostBy,
    scope: &Scope,
    from: DateTime<Utc>,
) -> Vec<CostRow> {
    let mut groups: BTreeMap<String, (CostRow, BTreeSet<String>)> = BTreeMap::new();
    for (job, record) in records {
        if record.period_end <= from {
            continue;
        }
        if let Scope::Namespace(namespace) = scope
            && *namespace != job.namespace
        {
            continue;
        }
        let group = match by {
            CostBy::Job => job.key(),
            CostBy::Queue => record.queue.clone(),
            CostBy::Namespace => job.namespace.clone(),
        };
        let (row, jobs) = groups.entry(group.clone()).or_insert_with(|| {
            (
                CostRow {
                    group,
                    jobs: 0,
                    gpu_hours: 0.0,
                    accrued: 0.0,
                    estimated: None,
                    currency: record.currency.clone(),
                    budget: None,
                },
                BTreeSet::new(),
            )
        });
        jobs.insert(job.key());
        row.jobs = u32::try_from(jobs.len()).unwrap_or(u32::MAX);
        for line in &record.lines {
            row.gpu_hours += line.gpu_hours;
            row.accrued += line.cost;
        }
        if row.currency != record.currency {
            row.currency = "mixed".to_owned();
        }
    }
    groups.into_values().map(|(row, _)| row).collect()
}

/// Every `cost.recorded` message the decisions stream keeps, read with an
/// ephemeral consumer that acknowledges nothing.
async fn cost_records(nats_args: &NatsArgs) -> Result<Vec<(EntityRef, CostRecorded)>, CliError> {
    let nats_url = &nats_args.nats_url;
    let nats = |what: &str, err: &dyn std::fmt::Display| {
        CliError::Nats(format!("{what} on {nats_url}: {err}"))
    };
    let client = crate::nats::connect(nats_args).await?;
    let jetstream = async_nats::jetstream::new(client);
    let stream = jetstream
        .get_stream(streams::DECISIONS.name)
        .await
        .map_err(|e| nats("no decisions stream (is Trainyard running?)", &e))?;
    let consumer = stream
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            ack_policy: async_nats::jetstream::consumer::AckPolicy::None,
            filter_subject: kind_filter(Family::Decisions, "cost"),
            inactive_threshold: Duration::from_secs(60),
            ..Default::default()
        })
        .await
        .map_err(|e| nats("cannot read the decisions stream", &e))?;
    let mut records = Vec::new();
    loop {
        let mut batch = consumer
            .fetch()
            .max_messages(1000)
            .expires(Duration::from_millis(500))
            .messages()
            .await
            .map_err(|e| nats("cannot read cost records", &e))?;
        let mut read = 0usize;
        let mut pending = 1u64;
        while let Some(message) = batch.next().await {
            let message = message.map_err(|e| nats("cannot read cost records", &e))?;
            read += 1;
            if let Ok(info) = message.info() {
                pending = info.pending;
            }
            let Ok(incoming) = Incoming::decode(&message.payload) else {
                continue;
            };
            if incoming.header.message_type == CostRecorded::TYPE
                && let Ok(record) = incoming.payload::<CostRecorded>()
            {
                records.push((incoming.header.entity.clone(), record));
            }
        }
        if read == 0 || pending == 0 {
            return Ok(records);
        }
    }
}

/// Prints what was spent in the last `since`, from the cost records in NATS.
pub async fn report_since(
    nats: &NatsArgs,
    since: Duration,
    scope: &Scope,
    by: CostBy,
    format: CostFormat,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let since = chrono::Duration::from_std(since)
        .map_err(|_| CliError::Usage("--since is too long".to_owned()))?;
    let from = Utc::now() - since;
    let records = cost_records(nats).await?;
    out.write_all(render(&period_rows(&records, by, scope, from), by, false, format)?.as_bytes())?;
    Ok(())
}

/// Lists the jobs in `scope` (and the queues, for `--by queue`) and prints the report.
pub async fn report(
    client: Client,
    scope: &Scope,
    by: CostBy,
    format: CostFormat,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let jobs = crate::get::list_jobs(client.clone(), scope).await?;
    let queues = if by == CostBy::Queue {
        Api::<TrainingQueue>::all(client)
            .list(&ListParams::default())
            .await
            .map_err(CliError::kube("list trainingqueues"))?
            .items
    } else {
        Vec::new()
    };
    out.write_all(render(&rows(&jobs, &queues, by), by, by == CostBy::Queue, format)?.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn job(namespace: &str, name: &str, queue: &str, cost: serde_json::Value) -> TrainingJob {
        serde_json::from_value(json!({
            "apiVersion": "trainyard.dev/v1", "kind": "TrainingJob",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"model": "m", "dataset": "d", "numWorkers": 1, "scheduling": {"queue": queue}},
            "status": {"cost": cost}
        }))
        .expect("a TrainingJob")
    }

    fn fixture() -> (Vec<TrainingJob>, Vec<TrainingQueue>) {
        let jobs = vec![
            job(
                "ml",
                "bert",
                "team-a",
                json!({"accrued": 12.5, "estimated": 20.0, "currency": "USD", "gpuSeconds": 36000.0}),
            ),
            job(
                "ml",
                "gpt",
                "team-a",
                json!({"accrued": 7.5, "currency": "USD", "gpuSeconds": 7200.0}),
            ),
            job(
                "vision",
                "resnet",
                "team-b",
                json!({"accrued": 1.0, "currency": "USD", "gpuSeconds": 3600.0}),
            ),
        ];
        let queue: TrainingQueue = serde_json::from_value(json!({
            "apiVersion": "trainyard.dev/v1", "kind": "TrainingQueue",
            "metadata": {"name": "team-a"},
            "spec": {"flavors": [{"name": "a100", "nominalQuota": 8}]},
            "status": {"budget": {"periodStart": "2026-12-01T00:00:00+00:00", "spent": 950.0,
                                   "amount": 1000.0, "currency": "USD", "state": "Open"}}
        }))
        .expect("a TrainingQueue");
        (jobs, vec![queue])
    }

    #[test]
    fn costs_add_up_per_queue_with_the_budget_of_the_period() {
        let (jobs, queues) = fixture();
        let rows = rows(&jobs, &queues, CostBy::Queue);
        assert_eq!(rows.len(), 2);
        let team_a = &rows[0];
        assert_eq!((team_a.group.as_str(), team_a.jobs), ("team-a", 2));
        assert_eq!(team_a.gpu_hours, 12.0);
        assert_eq!(team_a.accrued, 20.0);
        assert_eq!(
            team_a.estimated,
            Some(27.5),
            "a job without an estimate counts what it spent"
        );
        assert_eq!(team_a.budget.as_ref().map(|b| b.spent), Some(950.0));
        assert_eq!(rows[1].budget, None);
    }

    #[test]
    fn costs_group_by_namespace_and_by_job() {
        let (jobs, queues) = fixture();
        let by_namespace = rows(&jobs, &queues, CostBy::Namespace);
        let groups: Vec<(&str, f64)> = by_namespace
            .iter()
            .map(|r| (r.group.as_str(), r.accrued))
            .collect();
        assert_eq!(groups, [("ml", 20.0), ("vision", 1.0)]);
        let by_job = rows(&jobs, &queues, CostBy::Job);
        assert_eq!(by_job[0].group, "ml/bert");
        assert!(by_job.iter().all(|r| r.budget.is_none()));
    }

    #[test]
    fn the_report_renders_as_a_table_json_and_csv() {
        let (jobs, queues) = fixture();
        let rows = rows(&jobs, &queues, CostBy::Queue);
        let table = render(&rows, CostBy::Queue, true, CostFormat::Table).expect("table");
        let first = table.lines().next().unwrap_or_default();
        assert!(first.starts_with("QUEUE"), "{table}");
        assert!(
            table.contains("team-a") && table.contains("950.00"),
            "{table}"
        );
        let parsed: serde_json::Value = serde_json::from_str(
            &render(&rows, CostBy::Queue, true, CostFormat::Json).expect("json"),
        )
        .expect("valid JSON");
        assert_eq!(parsed[0]["accrued"], json!(20.0));
        assert_eq!(parsed[0]["budget"]["state"], json!("Open"));
        let csv = render(&rows, CostBy::Queue, true, CostFormat::Csv).expect("csv");
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(
            lines[0],
            "QUEUE,JOBS,GPU-HOURS,ACCRUED,ESTIMATED,CURRENCY,BUDGET-PERIOD-START,BUDGET-SPENT,BUDGET,BUDGET-STATE"
        );
        assert_eq!(
            lines[1],
            "team-a,2,12.00,20.00,27.50,USD,2026-12-01T00:00:00+00:00,950.00,1000.00,Open"
        );
        assert_eq!(lines[2], "team-b,1,1.00,1.00,1.00,USD,,,,");
    }

    fn record(
        namespace: &str,
        name: &str,
        queue: &str,
        end_minute: i64,
        cost: f64,
    ) -> (EntityRef, CostRecorded) {
        let end = DateTime::from_timestamp(1_795_000_000 + end_minute * 60, 0).unwrap_or_default();
        (
            EntityRef::new(namespace, name, ""),
            CostRecorded {
                queue: queue.into(),
                period_start: end - chrono::Duration::minutes(1),
                period_end: end,
                currency: "USD".into(),
                lines: vec![trainyard_contracts::cost::CostLine {
                    node: "n1".into(),
                    capacity_type: "spot".into(),
                    gpu_hours: 0.5,
                    price_per_gpu_hour: cost * 2.0,
                    cost,
                }],
                accrued_cost: cost,
                estimated_cost: None,
            },
        )
    }

    #[test]
    fn a_period_counts_only_the_intervals_that_end_in_it() {
        let records = vec![
            record("ml", "bert", "team-a", 1, 1.0),
            record("ml", "bert", "team-a", 10, 2.0),
            record("ml", "gpt", "team-a", 11, 4.0),
            record("vision", "resnet", "team-b", 12, 8.0),
        ];
        let from = DateTime::from_timestamp(1_795_000_000 + 5 * 60, 0).unwrap_or_default();
        let rows = period_rows(&records, CostBy::Queue, &Scope::AllNamespaces, from);
        let groups: Vec<(&str, u32, f64, f64)> = rows
            .iter()
            .map(|r| (r.group.as_str(), r.jobs, r.accrued, r.gpu_hours))
            .collect();
        assert_eq!(groups, [("team-a", 2, 6.0, 1.0), ("team-b", 1, 8.0, 0.5)]);
        assert!(rows.iter().all(|r| r.estimated.is_none()));
        let in_ml = period_rows(&records, CostBy::Job, &Scope::Namespace("ml".into()), from);
        let jobs: Vec<&str> = in_ml.iter().map(|r| r.group.as_str()).collect();
        assert_eq!(jobs, ["ml/bert", "ml/gpt"]);
        let csv = render(&rows, CostBy::Queue, false, CostFormat::Csv).expect("csv");
        assert!(csv.contains("team-a,2,1.00,6.00,,USD"), "{csv}");
    }

    #[test]
    fn csv_fields_with_commas_or_quotes_are_quoted() {
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_field("plain"), "plain");
    }
}
