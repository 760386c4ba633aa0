//! Leases against a real nats-server: one holder at a time, a standby takes
//! over within 10 s of the holder's death, tokens grow with every holder,
//! and a holder that lost the lease can no longer pass its fence.

use std::time::{Duration, Instant};

use async_nats::jetstream;
use prometheus::Registry;
use tokio_util::sync::CancellationToken;
use trainyard_contracts::{Bucket, Service};
use trainyard_runtime::metrics::RuntimeMetrics;
use trainyard_runtime::{Lease, Runtime, Settings};
use trainyard_testkit::NatsServer;

const KEY: &str = "planner";

/// Provisions the streams and buckets once, the way every service does.
async fn provision(nats: &NatsServer) -> Runtime {
    let mut settings = Settings::default();
    settings.nats.url = nats.url();
    settings.http.listen = "127.0.0.1:0".to_string();
    Runtime::start(Service::Planner, settings, CancellationToken::new())
        .await
        .expect("runtime starts")
}

/// A replica: its own connection, so closing it is the replica dying.
struct Replica {
    client: async_nats::Client,
    lease: Lease,
    lost: CancellationToken,
}

async fn replica(nats: &NatsServer, name: &str) -> Replica {
    let client = async_nats::connect(nats.url()).await.expect("connects");
    let bucket = jetstream::new(client.clone())
        .get_key_value(Bucket::Leases.name())
        .await
        .expect("lease bucket");
    let metrics = RuntimeMetrics::register(&Registry::new()).expect("metrics");
    let lost = CancellationToken::new();
    let lease = Lease::keep(bucket, KEY, name.to_string(), metrics, lost.clone());
    Replica {
        client,
        lease,
        lost,
    }
}

async fn acquired_within(lease: &Lease, limit: Duration) -> Option<u64> {
    tokio::time::timeout(limit, lease.acquired())
        .await
        .ok()
        .flatten()
}

#[tokio::test]
async fn one_holder_at_a_time_and_a_standby_takes_over_when_it_dies() {
    let nats = NatsServer::start();
    let _provisioned = provision(&nats).await;

    let first = replica(&nats, "first").await;
    let first_token = acquired_within(&first.lease, Duration::from_secs(5))
        .await
        .expect("the first replica acquires the free lease");
    assert_eq!(first.lease.fence().expect("holder passes"), first_token);

    let second = replica(&nats, "second").await;
    assert_eq!(
        acquired_within(&second.lease, Duration::from_secs(8)).await,
        None,
        "the standby waits while the holder renews (longer than the TTL)"
    );
    assert!(second.lease.fence().is_err(), "a standby must not write");
    assert!(first.lease.fence().is_ok(), "renewals kept the lease");

    // The holder dies: its connection closes and nothing renews its entry.
    let died = Instant::now();
    first.client.drain().await.expect("drains");
    let second_token = acquired_within(&second.lease, Duration::from_secs(12))
        .await
        .expect("the standby takes over");
    let takeover = died.elapsed();
    assert!(
        takeover < Duration::from_secs(10),
        "took over after {takeover:?}"
    );
    assert!(second_token > first_token, "fencing tokens grow");
    assert!(second.lease.fence().is_ok());
    // The dead holder's fence closed before the standby could take over.
    assert!(first.lease.fence().is_err());
    tokio::time::timeout(Duration::from_secs(5), first.lost.cancelled())
        .await
        .expect("the old holder learns it lost the lease");
    assert!(!second.lost.is_cancelled());
}

#[tokio::test]
async fn a_released_lease_passes_to_the_standby_at_once() {
    let nats = NatsServer::start();
    let _provisioned = provision(&nats).await;
    let first = replica(&nats, "first").await;
    acquired_within(&first.lease, Duration::from_secs(5))
        .await
        .expect("acquired");
    let second = replica(&nats, "second").await;

    let released = Instant::now();
    first.lease.release().await;
    assert!(first.lease.fence().is_err(), "released: no more writes");
    acquired_within(&second.lease, Duration::from_secs(3))
        .await
        .expect("the standby takes the released lease within a poll");
    assert!(released.elapsed() < Duration::from_secs(3));
    assert!(
        !first.lost.is_cancelled(),
        "releasing is not losing: no shutdown"
    );
    // A released replica never competes again.
    assert_eq!(first.lease.acquired().await, None);
}

#[tokio::test]
async fn a_holder_whose_entry_was_taken_loses_at_its_next_renewal() {
    let nats = NatsServer::start();
    let provisioned = provision(&nats).await;
    let holder = replica(&nats, "holder").await;
    acquired_within(&holder.lease, Duration::from_secs(5))
        .await
        .expect("acquired");
    // An operator (or a split brain) overwrites the entry.
    provisioned
        .bucket(Bucket::Leases)
        .expect("bucket")
        .put(KEY, "someone else".into())
        .await
        .expect("put");
    tokio::time::timeout(Duration::from_secs(5), holder.lost.cancelled())
        .await
        .expect("the holder notices at its next renewal");
    assert!(holder.lease.fence().is_err());
}

#[tokio::test]
async fn the_runtime_releases_its_lease_on_shutdown() {
    let nats = NatsServer::start();
    let first = provision(&nats).await;
    let lease = first.lease().expect("the planner leads by lease");
    acquired_within(&lease, Duration::from_secs(5))
        .await
        .expect("acquired");
    let second = provision(&nats).await;
    let standby = second.lease().expect("lease");
    first.shutdown.cancel();
    first.run_until_shutdown().await.expect("stops");
    acquired_within(&standby, Duration::from_secs(3))
        .await
        .expect("the standby takes over once the first stopped");
    let notifier = {
        let mut settings = Settings::default();
        settings.nats.url = nats.url();
        settings.http.listen = "127.0.0.1:0".to_string();
        Runtime::start(Service::Notifier, settings, CancellationToken::new())
            .await
            .expect("runtime")
    };
    assert!(
        notifier.lease().is_err(),
        "replicas of the notifier share the work"
    );
}
