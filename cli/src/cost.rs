//! `trainyard cost`: what jobs have cost, by job, queue or namespace, from the
//! TrainingJobs' `status.cost` (written by the planner from the
//! cost-optimizer's records), with each queue's spend in its current budget
//! period from the TrainingQueues' `status.budget`.

use std::collections::BTreeMap;
use std::io::Write;

use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use serde::Serialize;
use trainyard_api::{TrainingJob, TrainingQueue};

use crate::cli::{CostBy, CostFormat};
use crate::error::CliError;
use crate::format::table;
use crate::resources::{Listed, Scope};

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
    /// runtime is known (the others count with what they spent).
    pub estimated: f64,
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
            estimated: 0.0,
            currency: String::new(),
            budget: None,
        });
        row.jobs += 1;
        let Some(cost) = status.and_then(|s| s.cost.as_ref()) else {
            continue;
        };
        row.gpu_hours += cost.gpu_seconds / 3600.0;
        row.accrued += cost.accrued;
        row.estimated += cost.estimated.unwrap_or(cost.accrued);
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
                estimated: 0.0,
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

fn header(by: CostBy) -> Vec<String> {
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
    if by == CostBy::Queue {
        header.extend([
            "BUDGET-PERIOD-START",
            "BUDGET-SPENT",
            "BUDGET",
            "BUDGET-STATE",
        ]);
    }
    header.into_iter().map(str::to_owned).collect()
}

fn cells(row: &CostRow, by: CostBy) -> Vec<String> {
    let mut cells = vec![
        row.group.clone(),
        row.jobs.to_string(),
        format!("{:.2}", row.gpu_hours),
        money(row.accrued),
        money(row.estimated),
        row.currency.clone(),
    ];
    if by == CostBy::Queue {
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

/// The report in `format`.
pub fn render(rows: &[CostRow], by: CostBy, format: CostFormat) -> Result<String, CliError> {
    Ok(match format {
        CostFormat::Table => {
            let mut lines = vec![header(by)];
            lines.extend(rows.iter().map(|row| cells(row, by)));
            table(&lines)
        }
        CostFormat::Json => serde_json::to_string_pretty(rows)? + "\n",
        CostFormat::Csv => std::iter::once(header(by))
            .chain(rows.iter().map(|row| cells(row, by)))
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

/// Lists the jobs in `scope` (and the queues, for `--by queue`) and prints the report.
pub async fn report(
    client: Client,
    scope: &Scope,
    by: CostBy,
    format: CostFormat,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let jobs = TrainingJob::api(client.clone(), scope)
        .list(&ListParams::default())
        .await
        .map_err(CliError::kube(format!(
            "list trainingjobs {}",
            scope.describe()
        )))?
        .items;
    let queues = if by == CostBy::Queue {
        Api::<TrainingQueue>::all(client)
            .list(&ListParams::default())
            .await
            .map_err(CliError::kube("list trainingqueues"))?
            .items
    } else {
        Vec::new()
    };
    out.write_all(render(&rows(&jobs, &queues, by), by, format)?.as_bytes())?;
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
            team_a.estimated, 27.5,
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
        let table = render(&rows, CostBy::Queue, CostFormat::Table).expect("table");
        let first = table.lines().next().unwrap_or_default();
        assert!(first.starts_with("QUEUE"), "{table}");
        assert!(
            table.contains("team-a") && table.contains("950.00"),
            "{table}"
        );
        let parsed: serde_json::Value =
            serde_json::from_str(&render(&rows, CostBy::Queue, CostFormat::Json).expect("json"))
                .expect("valid JSON");
        assert_eq!(parsed[0]["accrued"], json!(20.0));
        assert_eq!(parsed[0]["budget"]["state"], json!("Open"));
        let csv = render(&rows, CostBy::Queue, CostFormat::Csv).expect("csv");
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

    #[test]
    fn csv_fields_with_commas_or_quotes_are_quoted() {
        assert_eq!(csv_field("a,b"), "\"a,b\"");
        assert_eq!(csv_field("say \"hi\""), "\"say \"\"hi\"\"\"");
        assert_eq!(csv_field("plain"), "plain");
    }
}
