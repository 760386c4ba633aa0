//! `trainyard cost --since`: what was spent in a period, read from the
//! cost-optimizer's `cost.recorded` messages in a real NATS server.

use async_nats::jetstream;
use chrono::{TimeDelta, Utc};
use clap::Parser;
use trainyard_cli::cli::Cli;
use trainyard_contracts::cost::{CostLine, CostRecorded};
use trainyard_contracts::{EntityRef, Envelope, streams};
use trainyard_testkit::NatsServer;

fn record(queue: &str, minutes_ago: i64, cost: f64) -> CostRecorded {
    let end = Utc::now() - TimeDelta::minutes(minutes_ago);
    CostRecorded {
        queue: queue.into(),
        period_start: end - TimeDelta::minutes(1),
        period_end: end,
        currency: "USD".into(),
        lines: vec![CostLine {
            node: "gpu-node-1".into(),
            capacity_type: "on-demand".into(),
            gpu_hours: 1.0 / 60.0,
            price_per_gpu_hour: cost * 60.0,
            cost,
        }],
        accrued_cost: cost,
        estimated_cost: None,
    }
}

#[tokio::test]
async fn cost_since_adds_up_the_records_of_the_period_only() {
    let nats = NatsServer::start();
    let client = async_nats::connect(nats.url()).await.expect("connect");
    let js = jetstream::new(client);
    js.create_stream(jetstream::stream::Config {
        name: streams::DECISIONS.name.to_string(),
        subjects: streams::DECISIONS.subjects(),
        ..Default::default()
    })
    .await
    .expect("decisions stream");
    for (namespace, name, queue, minutes_ago, cost) in [
        ("ml", "bert", "team-a", 90, 100.0),
        ("ml", "bert", "team-a", 20, 1.5),
        ("ml", "gpt", "team-a", 10, 2.5),
        ("vision", "resnet", "team-b", 5, 4.0),
    ] {
        let envelope = Envelope::new(
            "cost-optimizer",
            EntityRef::new(namespace, name, ""),
            record(queue, minutes_ago, cost),
        );
        let subject = envelope.subject();
        let body = serde_json::to_vec(&envelope).expect("encode");
        js.publish(subject, body.into())
            .await
            .expect("publish")
            .await
            .expect("stored");
    }

    let args = [
        "trainyard",
        "cost",
        "--since",
        "1h",
        "--by",
        "queue",
        "-o",
        "csv",
        "--nats-url",
        &nats.url(),
    ];
    let cli = Cli::try_parse_from(args).expect("arguments parse");
    let mut out = Vec::new();
    let mut err = Vec::new();
    trainyard_cli::run(
        cli,
        async || {
            Err(trainyard_cli::error::CliError::Usage(
                "no cluster needed".into(),
            ))
        },
        &mut out,
        &mut err,
    )
    .await
    .expect("cost --since");
    let text = String::from_utf8_lossy(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines,
        [
            "QUEUE,JOBS,GPU-HOURS,ACCRUED,ESTIMATED,CURRENCY",
            "team-a,2,0.03,4.00,,USD",
            "team-b,1,0.02,4.00,,USD",
        ],
        "the record from 90 minutes ago is outside the hour"
    );
}
