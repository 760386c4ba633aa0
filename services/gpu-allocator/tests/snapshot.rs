//! The snapshot in chunks, against a real nats-server with its default 1 MiB
//! message limit: a state far bigger than one message saves and loads whole, a
//! crash between chunks and manifest keeps the previous save, saves are
//! compressed, snapshots from before chunking or compression still load, and
//! a replica whose lease passed to another cannot replace the snapshot.

use serde_json::json;
use tokio_util::sync::CancellationToken;
use trainyard_contracts::events::NodeObserved;
use trainyard_contracts::{Bucket, EntityRef, Service};
use trainyard_gpu_allocator::{
    AllocatorServiceConfig, AllocatorState, SNAPSHOT_KEY, SnapshotStore,
};
use trainyard_runtime::{Runtime, Settings};
use trainyard_testkit::NatsServer;

/// The lease token the tests' stores write under.
const TOKEN: u64 = 7;

async fn bucket(nats: &NatsServer) -> (Runtime, async_nats::jetstream::kv::Store) {
    let mut settings = Settings::default();
    settings.nats.url = nats.url();
    settings.http.listen = "127.0.0.1:0".to_string();
    let runtime = Runtime::start(Service::GpuAllocator, settings, CancellationToken::new())
        .await
        .expect("runtime");
    let bucket = runtime.bucket(Bucket::Allocator).cloned().expect("bucket");
    (runtime, bucket)
}

/// A state with `nodes` labelled nodes: about 1 KiB of snapshot each, with
/// label values that do not compress (a hash of node and label), so that
/// even compressed it spans chunks.
fn big_state(nodes: usize) -> AllocatorState {
    let mut state = AllocatorState::new(AllocatorServiceConfig::default()).expect("state");
    for i in 0..nodes {
        let labels: serde_json::Map<String, serde_json::Value> = (0..12)
            .map(|l| {
                let mut hasher = std::hash::DefaultHasher::new();
                std::hash::Hash::hash(&(i, l), &mut hasher);
                let noise = std::hash::Hasher::finish(&hasher);
                (
                    format!("example.com/label-{l}"),
                    json!(format!("{noise:016x}{:016x}", noise.rotate_left(17))),
                )
            })
            .chain([("nvidia.com/gpu.product".to_owned(), json!("A100-SXM4-80GB"))])
            .collect();
        let node: NodeObserved = serde_json::from_value(json!({
            "change": "Applied", "allocatableGpus": 8, "labels": labels,
            "unschedulable": false, "ready": true
        }))
        .expect("node");
        state
            .on_node(&EntityRef::new("", format!("node-{i}"), ""), &node)
            .expect("node applies");
    }
    state
}

fn encoded(state: &AllocatorState) -> Vec<u8> {
    serde_json::to_vec(&state.persisted()).expect("encodes")
}

/// Opens the store and checks that it loads exactly `json`.
async fn assert_loads(bucket: &async_nats::jetstream::kv::Store, json: &[u8]) -> SnapshotStore {
    let (store, loaded) = SnapshotStore::open(bucket.clone(), TOKEN)
        .await
        .expect("opens");
    assert_eq!(
        serde_json::to_vec(&loaded.expect("a snapshot")).expect("encodes"),
        json
    );
    store
}

#[tokio::test]
async fn a_snapshot_bigger_than_a_nats_message_saves_and_loads_whole() {
    let nats = NatsServer::start();
    let (_runtime, bucket) = bucket(&nats).await;
    let state = big_state(4000);
    let bytes = encoded(&state);
    assert!(bytes.len() > 2 * 1024 * 1024, "{} bytes", bytes.len());

    let (mut store, nothing) = SnapshotStore::open(bucket.clone(), TOKEN)
        .await
        .expect("opens");
    assert!(nothing.is_none());
    let stored = store.save(&bytes).await.expect("saves in chunks");
    assert!(
        stored > 2 * trainyard_gpu_allocator::CHUNK_BYTES,
        "{stored} bytes stored: the test must span chunks"
    );
    assert!(
        bucket
            .get(format!("{SNAPSHOT_KEY}.7-1.2"))
            .await
            .expect("get")
            .is_some(),
        "a third chunk"
    );
    let smaller = encoded(&big_state(10));
    store.save(&smaller).await.expect("saves again");

    let reopened = assert_loads(&bucket, &smaller).await;
    assert_eq!(
        reopened.purge_orphans().await.expect("purges"),
        0,
        "the first save's chunks are gone"
    );
}

#[tokio::test]
async fn chunks_without_a_manifest_leave_the_previous_save_in_force() {
    let nats = NatsServer::start();
    let (_runtime, bucket) = bucket(&nats).await;
    let first = encoded(&big_state(5));
    let (mut store, _) = SnapshotStore::open(bucket.clone(), TOKEN)
        .await
        .expect("opens");
    store.save(&first).await.expect("saves");
    // A crash mid-save: chunks of the next save exist, its manifest does not.
    bucket
        .put(format!("{SNAPSHOT_KEY}.7-2.0"), "{\"half\":".into())
        .await
        .expect("put");

    let reopened = assert_loads(&bucket, &first).await;
    assert_eq!(reopened.purge_orphans().await.expect("purges"), 1);
    assert!(
        bucket
            .get(format!("{SNAPSHOT_KEY}.7-2.0"))
            .await
            .expect("get")
            .is_none()
    );
}

#[tokio::test]
async fn a_whole_snapshot_from_before_chunking_still_loads() {
    let nats = NatsServer::start();
    let (_runtime, bucket) = bucket(&nats).await;
    let whole = encoded(&big_state(3));
    bucket
        .put(SNAPSHOT_KEY, whole.clone().into())
        .await
        .expect("put");
    assert_loads(&bucket, &whole).await;
}

#[tokio::test]
async fn a_missing_chunk_is_refused_with_what_to_do() {
    let nats = NatsServer::start();
    let (_runtime, bucket) = bucket(&nats).await;
    let (mut store, _) = SnapshotStore::open(bucket.clone(), TOKEN)
        .await
        .expect("opens");
    store.save(&encoded(&big_state(3))).await.expect("saves");
    bucket
        .purge(format!("{SNAPSHOT_KEY}.7-1.0"))
        .await
        .expect("purge");
    let err = match SnapshotStore::open(bucket, TOKEN).await {
        Err(err) => err.to_string(),
        Ok(_) => panic!("a snapshot with a missing chunk must not load"),
    };
    assert!(
        err.contains("snapshot.7-1.0 is missing") && err.contains("refusing to start"),
        "{err}"
    );
}

#[tokio::test]
async fn a_save_stores_compressed_json() {
    let nats = NatsServer::start();
    let (_runtime, bucket) = bucket(&nats).await;
    // Nodes as a cluster has them: the same labels on many nodes.
    let mut state = AllocatorState::new(AllocatorServiceConfig::default()).expect("state");
    for i in 0..500 {
        let node: NodeObserved = serde_json::from_value(json!({
            "change": "Applied", "allocatableGpus": 8, "unschedulable": false, "ready": true,
            "labels": {"nvidia.com/gpu.product": "H100-SXM5-80GB", "topology.kubernetes.io/zone": "zone-a"}
        }))
        .expect("node");
        state
            .on_node(&EntityRef::new("", format!("node-{i}"), ""), &node)
            .expect("node applies");
    }
    let json = encoded(&state);
    let (mut store, _) = SnapshotStore::open(bucket.clone(), TOKEN)
        .await
        .expect("opens");
    let stored = store.save(&json).await.expect("saves");
    assert!(
        stored * 4 < json.len(),
        "{stored} bytes stored for {} of JSON",
        json.len()
    );
    assert_loads(&bucket, &json).await;
}

#[tokio::test]
async fn a_chunked_snapshot_from_before_compression_still_loads() {
    let nats = NatsServer::start();
    let (_runtime, bucket) = bucket(&nats).await;
    let json = encoded(&big_state(3));
    bucket
        .put(format!("{SNAPSHOT_KEY}.1.0"), json.clone().into())
        .await
        .expect("put chunk");
    let manifest = json!({"chunkedSave": 1, "parts": 1, "size": json.len()});
    bucket
        .put(
            SNAPSHOT_KEY,
            serde_json::to_vec(&manifest).expect("encodes").into(),
        )
        .await
        .expect("put manifest");
    assert_loads(&bucket, &json).await;
}

#[tokio::test]
async fn a_new_lease_holder_fences_out_the_previous_one() {
    let nats = NatsServer::start();
    let (_runtime, bucket) = bucket(&nats).await;
    let (mut old, _) = SnapshotStore::open(bucket.clone(), TOKEN)
        .await
        .expect("opens");
    let before = encoded(&big_state(2));
    old.save(&before).await.expect("the holder saves");

    // A standby takes the lease over (a larger token) and claims the snapshot.
    let (mut new, loaded) = SnapshotStore::open(bucket.clone(), TOKEN + 3)
        .await
        .expect("the new holder opens");
    assert_eq!(
        serde_json::to_vec(&loaded.expect("the old holder's save")).expect("encodes"),
        before
    );
    let err = old
        .save(&encoded(&big_state(4)))
        .await
        .expect_err("the old holder is fenced out");
    assert!(err.to_string().contains("fenced"), "{err}");
    let after = encoded(&big_state(3));
    new.save(&after).await.expect("the new holder saves");
    let reopened = assert_loads_with(&bucket, TOKEN + 3, &after).await;
    assert_eq!(
        reopened.purge_orphans().await.expect("purges"),
        1,
        "the old holder's fenced chunk"
    );
    assert!(
        SnapshotStore::open(bucket, TOKEN).await.is_err(),
        "an older token never opens a newer holder's snapshot"
    );
}

async fn assert_loads_with(
    bucket: &async_nats::jetstream::kv::Store,
    token: u64,
    json: &[u8],
) -> SnapshotStore {
    let (store, loaded) = SnapshotStore::open(bucket.clone(), token)
        .await
        .expect("opens");
    assert_eq!(
        serde_json::to_vec(&loaded.expect("a snapshot")).expect("encodes"),
        json
    );
    store
}
