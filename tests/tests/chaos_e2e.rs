//! Chaos, fast: the watcher, the planner and the gpu-allocator as processes
//! (one test binary that runs any of them) on a real nats-server and the
//! simulated cluster. The planner and the gpu-allocator are killed with
//! SIGKILL while jobs are submitted and run, and malformed envelopes are
//! published among good jobs; the counts are the `chaos` benchmark's own
//! (`trainyard_loadtest::chaos`). Waits are bounded generously for a loaded
//! machine; nothing here times the stack.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use async_nats::jetstream;
use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio_util::sync::CancellationToken;
use trainyard_contracts::Service;
use trainyard_loadtest::chaos::{self, HIGH, LOW, Observer, fuzz, leading_again};
use trainyard_loadtest::stack::{self, Stack};
use trainyard_loadtest::workload;
use trainyard_simulator::runner::Simulator;

const SERVICES: [Service; 3] = [Service::Watcher, Service::Planner, Service::GpuAllocator];
const NODES: u32 = 2;
const GPUS_PER_NODE: u32 = 8;
/// Generous for two debug-built services restarting on a busy 2-core machine.
const LIMIT: Duration = Duration::from_secs(120);

/// NATS, the simulated cluster in this process, and the three services.
struct Chaos {
    stack: Stack,
    simulator: Simulator,
    shutdown: CancellationToken,
    kube: kube::Client,
    js: jetstream::Context,
}

impl Chaos {
    async fn start() -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut stack = Stack::new(Path::new("."), "warn").expect("work dir");
        stack.run_services_with(PathBuf::from(env!("CARGO_BIN_EXE_trainyard-any-service")));
        stack.start_nats(None).await.expect("nats-server starts");
        let nats = stack.connect().await.expect("nats");
        let mut cluster = workload::cluster_config(NODES, GPUS_PER_NODE, 120.0);
        cluster.priority_classes = [HIGH, LOW]
            .into_iter()
            .map(|(name, value)| (name.to_owned(), value))
            .collect();
        let shutdown = CancellationToken::new();
        let simulator =
            Simulator::start(cluster, "127.0.0.1:0", Some(nats.clone()), shutdown.clone())
                .await
                .expect("simulator starts");
        let kubeconfig = stack
            .write_kubeconfig(&simulator.kubeconfig())
            .expect("kubeconfig written");
        let kubeconfig = kubeconfig.to_string_lossy().into_owned();
        let priorities = chaos::allocator_priority_env(&stack).expect("allocator config");
        for service in SERVICES {
            let mut env = stack
                .service_env(service, &kubeconfig, 200)
                .expect("service env");
            if service == Service::GpuAllocator {
                env.push(priorities.clone());
            }
            stack.start_service(service, &env).expect("service starts");
        }
        stack.wait_ready(LIMIT).await.expect("services ready");
        let kube = stack::kube_client(&simulator.kubeconfig())
            .await
            .expect("kube client");
        chaos::apply_queue(&kube, NODES * GPUS_PER_NODE)
            .await
            .expect("queue applied");
        Self {
            stack,
            simulator,
            shutdown,
            kube,
            js: jetstream::new(nats),
        }
    }

    async fn stop(mut self) {
        let exited = self.stack.exited();
        self.stack.stop(Duration::from_secs(10)).await;
        self.shutdown.cancel();
        self.simulator.join().await;
        assert!(
            exited.is_empty(),
            "services exited by themselves: {exited:?}"
        );
    }
}

/// `count` jobs of the chaos workload's shapes, seeded.
fn shapes(count: usize, seed: u64) -> Vec<(workload::JobShape, &'static str)> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..count)
        .map(|_| chaos::job_shape(&mut rng, GPUS_PER_NODE))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_planner_and_the_allocator_loses_and_duplicates_no_job_and_never_over_admits() {
    let mut chaos = Chaos::start().await;
    let observer = Observer::start(&chaos.kube, GPUS_PER_NODE)
        .await
        .expect("watches start");
    let jobs = shapes(20, 3);
    let start = Instant::now();
    let kills = async {
        for round in 0..2 {
            tokio::time::sleep(Duration::from_secs(2 + 3 * round)).await;
            for service in [Service::Planner, Service::GpuAllocator] {
                chaos
                    .stack
                    .kill_and_restart(service.name(), Duration::ZERO, LIMIT)
                    .await
                    .expect("killed and ready again");
            }
            for service in [Service::Planner, Service::GpuAllocator] {
                leading_again(&chaos.stack, service, &[service.name().to_owned()], LIMIT)
                    .await
                    .expect("lease taken again");
            }
        }
    };
    let (_, submitted) = tokio::join!(kills, chaos::submit(&chaos.kube, "kill", &jobs, start, 8.0));
    let submitted = submitted.expect("jobs submitted");
    let timed_out = observer
        .drain(
            &chaos.js,
            &submitted,
            &SERVICES,
            Instant::now() + Duration::from_secs(300),
        )
        .await;
    let counts = observer.counts(&submitted);
    assert!(!timed_out, "jobs still running after 300 s: {counts:?}");
    assert_eq!(counts.lost, 0, "{counts:?}");
    assert_eq!(counts.failed, 0, "{counts:?}");
    assert_eq!(counts.duplicate_jobs, 0, "{counts:?}");
    assert_eq!(counts.over_admissions, 0, "{counts:?}");
    assert_eq!(counts.completed, submitted.len());
    chaos.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_malformed_envelope_is_dead_lettered_once_by_each_consumer_and_good_jobs_complete() {
    let chaos = Chaos::start().await;
    let observer = Observer::start(&chaos.kube, GPUS_PER_NODE)
        .await
        .expect("watches start");
    let mut rng = StdRng::seed_from_u64(5);
    let bad: Vec<fuzz::BadMessage> = fuzz::messages(&mut rng)
        .expect("bad messages")
        .into_iter()
        .filter(|m| m.envelope_level && fuzz::consumed_by(&m.subject, &SERVICES))
        .step_by(7)
        .take(6)
        .collect();
    assert!(bad.len() >= 3, "enough subjects the three services read");
    let jobs = shapes(5, 4);
    let start = Instant::now();
    let (submitted, published) = tokio::join!(
        chaos::submit(&chaos.kube, "fuzz", &jobs, start, 3.0),
        fuzz::publish(&chaos.js, &bad, start, 3.0),
    );
    let submitted = submitted.expect("jobs submitted");
    let published = published.expect("bad messages published");
    let timed_out = observer
        .drain(
            &chaos.js,
            &submitted,
            &SERVICES,
            Instant::now() + Duration::from_secs(300),
        )
        .await;
    let counts = observer.counts(&submitted);
    assert!(!timed_out, "not drained after 300 s: {counts:?}");
    assert_eq!(counts.completed, submitted.len(), "{counts:?}");
    let letters = chaos::dead_letters(&chaos.js).await.expect("dead letters");
    let outcome = fuzz::outcome(&published, &letters, &SERVICES);
    assert!(outcome.expected >= bad.len(), "{outcome:?}");
    assert_eq!(
        outcome.missing, 0,
        "a bad envelope was dropped silently: {outcome:?}"
    );
    assert_eq!(outcome.duplicated, 0, "{outcome:?}");
    assert_eq!(outcome.dead_lettered, outcome.expected, "{outcome:?}");
    assert_eq!(
        letters.len(),
        outcome.expected,
        "nothing but the bad envelopes is dead-lettered"
    );
    chaos.stop().await;
}
