//! The simulated controllers, stepped by hand on the virtual clock: binding honours
//! selectors, taints, capacity and scheduling gates; pods start after the delay; gangs train, report,
//! checkpoint and complete; failures and spot reclaims end runs the way Kubernetes
//! reports them.

use std::sync::Arc;

use serde_json::{Value, json};
use trainyard_api::placement::LABEL_WORKER_INDEX;
use trainyard_simulator::clock::SimClock;
use trainyard_simulator::cluster::{Cluster, Report, RunOutcome, WorkerCommand};
use trainyard_simulator::config::ClusterConfig;
use trainyard_simulator::resources;
use trainyard_simulator::selector::Selector;
use trainyard_simulator::store::{PatchKind, Propagation, Store, Subresource};

const NS: &str = "ml";

/// One 8-GPU node; workers start at once and take 10 s an epoch.
const ONE_NODE_TEN_SECOND_EPOCHS: &str =
    "nodes: [{name: n, gpus: 8}]\nworkers: {secondsPerEpoch: 10, startDelaySeconds: 0}";

fn cluster(yaml: &str) -> (Arc<Store>, Cluster) {
    let store = Arc::new(Store::default());
    let config = ClusterConfig::parse(yaml).expect("valid config");
    let clock = SimClock::new(config.speed);
    let cluster = Cluster::new(store.clone(), config, clock);
    (store, cluster)
}

/// A Job as the planner writes it: indexed, a GPU request per worker, the
/// hyperparameters in a mounted ConfigMap, RESUME_FROM from the ConfigMap.
fn job(store: &Store, name: &str, workers: u32, gpus: u32, suspend: bool, selector: Value) {
    store
        .create(
            resources::config_maps(),
            Some(NS),
            json!({
                "metadata": {"name": format!("{name}-config")},
                "data": {
                    "hyperparameters.json": "{\"epochs\": 4}",
                    "training-config.json": "{\"model\": \"cnn\"}",
                    "resume-from": "s3://b/x/checkpoint-epoch-1",
                },
            }),
        )
        .expect("configmap");
    store
        .create(
            resources::jobs(),
            Some(NS),
            json!({
                "metadata": {"name": name, "labels": {"trainyard.dev/job": name}},
                "spec": {
                    "completions": workers,
                    "parallelism": workers,
                    "completionMode": "Indexed",
                    "backoffLimit": 0,
                    "suspend": suspend,
                    "template": {
                        "metadata": {"labels": {"trainyard.dev/job": name, "trainyard.dev/attempt": "0"}},
                        "spec": {
                            "nodeSelector": selector,
                            "restartPolicy": "Never",
                            "containers": [{
                                "name": "worker",
                                "image": "x",
                                "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}},
                                "env": [
                                    {"name": "CHECKPOINT_DIR", "value": "s3://b/x"},
                                    {"name": "CHECKPOINT_FREQUENCY", "value": "1"},
                                    {"name": "RESUME_FROM", "valueFrom": {"configMapKeyRef": {"name": format!("{name}-config"), "key": "resume-from"}}},
                                ],
                            }],
                            "volumes": [{"name": "config", "configMap": {"name": format!("{name}-config")}}],
                        },
                    },
                },
            }),
        )
        .expect("job");
}

fn pods(store: &Store, job: &str) -> Vec<Value> {
    store
        .list(
            resources::pods(),
            Some(NS),
            &Selector::parse(&format!("batch.kubernetes.io/job-name={job}")).expect("selector"),
            &Selector::default(),
        )
        .0
        .iter()
        .map(|p| (**p).clone())
        .collect()
}

/// The name of the first pod of `job`, as another client would look it up.
fn first_pod_name(store: &Store, job: &str) -> String {
    pods(store, job)
        .first()
        .and_then(|pod| pod["metadata"]["name"].as_str())
        .unwrap_or_default()
        .to_string()
}

/// Deletes the first pod of `job`, as another client would.
fn delete_first_pod(store: &Store, job: &str) {
    store
        .delete(
            resources::pods(),
            Some(NS),
            &first_pod_name(store, job),
            Propagation::Background,
        )
        .expect("deleted");
}

fn job_condition(store: &Store, job: &str) -> Vec<String> {
    let job = store.get(resources::jobs(), Some(NS), job).expect("job");
    job["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["status"] == "True")
        .map(|c| c["type"].as_str().unwrap_or_default().to_owned())
        .collect()
}

const TWO_NODES: &str = "
nodes:
  - {name: big, count: 1, gpus: 8, gpuProduct: A100, labels: {pool: a}}
  - {name: small, count: 1, gpus: 2, gpuProduct: T4, labels: {pool: b},
     taints: [{key: dedicated, value: t4, effect: NoSchedule}]}
workers: {secondsPerEpoch: 10, startDelaySeconds: 5}
";

#[test]
fn nodes_are_registered_with_gpus_labels_and_taints() {
    let (store, _) = cluster(TWO_NODES);
    let big = store.get(resources::nodes(), None, "big-0").expect("node");
    assert_eq!(big["status"]["allocatable"]["nvidia.com/gpu"], "8");
    assert_eq!(big["metadata"]["labels"]["nvidia.com/gpu.product"], "A100");
    assert_eq!(
        big["metadata"]["labels"]["karpenter.sh/capacity-type"],
        "on-demand"
    );
    let small = store
        .get(resources::nodes(), None, "small-0")
        .expect("node");
    assert_eq!(small["spec"]["taints"][0]["key"], "dedicated");
}

#[test]
fn a_suspended_job_waits_and_an_unsuspended_one_trains_to_completion() {
    let (store, mut cluster) = cluster(TWO_NODES);
    job(&store, "a", 2, 2, true, json!({"pool": "a"}));
    cluster.step_at(1.0);
    assert!(pods(&store, "a").is_empty(), "a suspended Job has no pods");
    store
        .patch(
            resources::jobs(),
            Some(NS),
            "a",
            PatchKind::Merge,
            json!({"spec": {"suspend": false}}),
            None,
            Subresource::Main,
        )
        .expect("unsuspend");
    cluster.step_at(2.0);
    let bound = pods(&store, "a");
    assert_eq!(bound.len(), 2);
    for pod in &bound {
        assert_eq!(pod["spec"]["nodeName"], "big-0", "selector pool=a");
        assert_eq!(
            pod["status"]["phase"], "Pending",
            "not started before the delay"
        );
    }
    let start = cluster.step_at(7.5);
    assert!(
        pods(&store, "a")
            .iter()
            .all(|p| p["status"]["phase"] == "Running")
    );
    assert!(
        matches!(start.first(), Some(Report::Progress { payload, .. }) if payload.epoch == 1),
        "a resumed worker reports its starting epoch: {start:?}"
    );
    // Resumed from epoch 1 of 4: epochs 2..4 at 10 s each.
    let reports = cluster.step_at(7.5 + 30.5);
    let epochs: Vec<u32> = reports
        .iter()
        .filter_map(|r| match r {
            Report::Progress { payload, .. } if payload.worker_index == 0 => Some(payload.epoch),
            _ => None,
        })
        .collect();
    assert_eq!(epochs, vec![2, 3, 4]);
    let checkpoints = reports
        .iter()
        .filter(|r| matches!(r, Report::Checkpoint { .. }))
        .count();
    assert_eq!(checkpoints, 3, "every epoch with CHECKPOINT_FREQUENCY=1");
    assert!(
        pods(&store, "a")
            .iter()
            .all(|p| p["status"]["phase"] == "Running"),
        "the last reports go out before the Job ends"
    );
    cluster.step_at(38.5);
    assert!(
        pods(&store, "a")
            .iter()
            .all(|p| p["status"]["phase"] == "Succeeded")
    );
    assert_eq!(
        job_condition(&store, "a"),
        vec!["SuccessCriteriaMet", "Complete"]
    );
    let history = &cluster.history()["ml/a"];
    assert_eq!(history.gpus, 4);
    assert_eq!(history.ended, vec![(38.5, RunOutcome::Succeeded)]);
}

#[test]
fn scoring_packs_pods_onto_the_fullest_node_or_spreads_them_like_kube_scheduler() {
    let three_nodes = "nodes: [{name: n, count: 3, gpus: 8}]\nworkers: {startDelaySeconds: 0}";
    let node_of = |store: &Store, job: &str| pods(store, job)[0]["spec"]["nodeName"].clone();
    let (store, mut packed) = cluster(three_nodes);
    job(&store, "first", 1, 2, false, json!({}));
    packed.step_at(1.0);
    job(&store, "second", 1, 2, false, json!({}));
    packed.step_at(2.0);
    assert_eq!(node_of(&store, "second"), node_of(&store, "first"));

    let (store, mut spread) = cluster(&format!("{three_nodes}\nscoring: LeastAllocated"));
    job(&store, "first", 1, 2, false, json!({}));
    spread.step_at(1.0);
    job(&store, "second", 1, 2, false, json!({}));
    spread.step_at(2.0);
    assert_ne!(node_of(&store, "second"), node_of(&store, "first"));
    assert!(
        ClusterConfig::parse(&format!("{three_nodes}\nscoring: Spread"))
            .is_err_and(|e| e.contains("MostAllocated")),
        "an unknown strategy is refused with the ones there are"
    );
}

#[test]
fn pods_stay_pending_without_free_gpus_or_toleration() {
    let (store, mut cluster) = cluster(TWO_NODES);
    job(&store, "fits", 1, 6, false, json!({}));
    job(&store, "too-big", 1, 4, false, json!({}));
    cluster.step_at(1.0);
    let fits = pods(&store, "fits");
    assert_eq!(fits[0]["spec"]["nodeName"], "big-0");
    let waiting = pods(&store, "too-big");
    assert!(
        waiting[0]["spec"]["nodeName"].is_null(),
        "2 GPUs left on big-0, small-0 is tainted"
    );
    let condition = &waiting[0]["status"]["conditions"][0];
    assert_eq!(condition["reason"], "Unschedulable");
    let message = condition["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("0/2 nodes are available") && message.contains("untolerated taint"),
        "{message}"
    );
}

/// The first pod of `job`, from the store.
fn first_pod(store: &Store, job: &str) -> Value {
    pods(store, job).first().cloned().unwrap_or_default()
}

#[test]
fn gated_pods_wait_until_a_client_lifts_their_gates_then_go_where_it_placed_them() {
    let (store, mut cluster) = cluster("nodes: [{name: n, count: 3, gpus: 8}]");
    job(&store, "gated", 1, 2, false, json!({}));
    store
        .update(resources::jobs(), Some(NS), "gated", |j| {
            j["spec"]["template"]["spec"]["schedulingGates"] =
                json!([{"name": "trainyard.dev/placement"}, {"name": "example.com/other"}]);
        })
        .expect("gated template");
    cluster.step_at(1.0);
    cluster.step_at(2.0);
    let waiting = first_pod(&store, "gated");
    assert!(
        waiting["spec"]["nodeName"].is_null(),
        "a gated pod is not bound"
    );
    assert_eq!(
        waiting["status"]["conditions"],
        json!([{"type": "PodScheduled", "status": "False", "reason": "SchedulingGated",
                "message": "Scheduling is blocked due to non-empty scheduling gates"}])
    );
    cluster.step_at(3.0);
    assert_eq!(
        first_pod(&store, "gated")["metadata"]["resourceVersion"],
        waiting["metadata"]["resourceVersion"],
        "the condition is written once, not on every step"
    );

    let name = first_pod_name(&store, "gated");
    let place = |gate: &str| {
        json!({"spec": {
            "nodeSelector": {"kubernetes.io/hostname": "n-2"},
            "schedulingGates": [{"name": gate, "$patch": "delete"}],
        }})
    };
    for gate in ["trainyard.dev/placement", "example.com/other"] {
        assert!(
            first_pod(&store, "gated")["spec"]["nodeName"].is_null(),
            "still gated before {gate} goes"
        );
        store
            .patch(
                resources::pods(),
                Some(NS),
                &name,
                PatchKind::Strategic,
                place(gate),
                None,
                Subresource::Main,
            )
            .expect("a gate lifted");
        cluster.step_at(4.0);
    }
    let bound = first_pod(&store, "gated");
    assert_eq!(
        bound["spec"]["nodeName"], "n-2",
        "the node selector added while gated is honoured (n-0 would pack as well)"
    );
    assert_eq!(bound["status"]["conditions"][0]["status"], "True");
}

#[test]
fn pod_anti_affinity_spreads_workers_over_hosts() {
    let (store, mut cluster) = cluster("nodes: [{name: n, count: 2, gpus: 8}]");
    job(&store, "spread", 2, 1, false, json!({}));
    store
        .update(resources::jobs(), Some(NS), "spread", |j| {
            j["spec"]["template"]["spec"]["affinity"] = json!({"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"trainyard.dev/job": "spread"}}, "topologyKey": "kubernetes.io/hostname"}
            ]}});
        })
        .expect("affinity");
    cluster.step_at(1.0);
    let mut nodes: Vec<String> = pods(&store, "spread")
        .iter()
        .map(|p| {
            p["spec"]["nodeName"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect();
    nodes.sort();
    assert_eq!(nodes, vec!["n-0", "n-1"]);
}

/// As kube-scheduler: a required pod affinity needs nodes carrying its
/// topology key; the first worker of a gang that selects itself goes to
/// any such node and the others follow it into its domain; a term that
/// selects no placed pod and not the pod itself leaves it pending.
#[test]
fn pod_affinity_keeps_workers_in_one_labelled_domain() {
    let (store, mut cluster) = cluster(
        "nodes: [{name: bare, count: 2, gpus: 8}, {name: za, count: 2, gpus: 8, zone: a}, {name: zb, count: 2, gpus: 8, zone: b}]",
    );
    let with_affinity = |name: &str, selector: serde_json::Value| {
        job(&store, name, 3, 4, false, json!({}));
        store
            .update(resources::jobs(), Some(NS), name, |j| {
                j["spec"]["template"]["spec"]["affinity"] = json!({"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": selector}, "topologyKey": "topology.kubernetes.io/zone"}
                ]}});
            })
            .expect("affinity");
    };
    with_affinity("together", json!({"trainyard.dev/job": "together"}));
    with_affinity("follower", json!({"trainyard.dev/job": "nobody"}));
    cluster.step_at(1.0);
    let nodes = |name: &str| -> Vec<String> {
        pods(&store, name)
            .iter()
            .filter_map(|p| p["spec"]["nodeName"].as_str().map(str::to_owned))
            .collect()
    };
    let together = nodes("together");
    assert_eq!(together.len(), 3, "{together:?}");
    let zone = &together[0][..2];
    assert!(
        together.iter().all(|n| n.starts_with(zone) && zone != "ba"),
        "one labelled zone: {together:?}"
    );
    assert!(nodes("follower").is_empty(), "no pod it selects is placed");
}

#[test]
fn a_failing_run_ends_with_its_exit_code_and_a_failed_job() {
    let (store, mut cluster) = cluster(
        "nodes: [{name: n, gpus: 8}]\nfailures: {rate: 1.0, exitCodes: [137]}\nworkers: {secondsPerEpoch: 10, startDelaySeconds: 0}",
    );
    job(&store, "f", 2, 1, false, json!({}));
    for t in 0..100 {
        cluster.step_at(f64::from(t));
    }
    let pods = pods(&store, "f");
    assert_eq!(pods.len(), 1, "the rest of the gang is terminated");
    assert_eq!(pods[0]["status"]["phase"], "Failed");
    assert_eq!(
        pods[0]["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"],
        137
    );
    assert_eq!(job_condition(&store, "f"), vec!["FailureTarget", "Failed"]);
    assert_eq!(cluster.history()["ml/f"].ended[0].1, RunOutcome::Failed);
}

#[test]
fn spot_reclaims_fire_fail_pods_as_disruptions_and_nodes_come_back() {
    let (store, mut cluster) = cluster(
        "nodes: [{name: s, count: 3, gpus: 8, capacityType: spot}]\nworkers: {secondsPerEpoch: 1000, startDelaySeconds: 0}\ndisruptions: {spotReclaimsPerNodeHour: 1000, recoverySeconds: 60}",
    );
    job(&store, "victim", 1, 8, false, json!({}));
    cluster.step_at(0.0);
    cluster.step_at(0.0);
    cluster.step_at(36.0);
    let (nodes, _) = store.list(
        resources::nodes(),
        None,
        &Selector::default(),
        &Selector::default(),
    );
    assert!(
        nodes.is_empty(),
        "a reclaim rate of 1000/hour takes every node within 36 s"
    );
    let pod = &pods(&store, "victim")[0];
    assert_eq!(pod["status"]["phase"], "Failed");
    assert_eq!(pod["status"]["conditions"][1]["type"], "DisruptionTarget");
    cluster.step_at(37.0);
    assert_eq!(
        cluster.history()["ml/victim"].ended[0].1,
        RunOutcome::Disrupted
    );
    cluster.step_at(100.0);
    let (nodes, _) = store.list(
        resources::nodes(),
        None,
        &Selector::default(),
        &Selector::default(),
    );
    assert_eq!(nodes.len(), 3, "replacements arrive after recoverySeconds");
    assert!(nodes.iter().all(|n| {
        n["metadata"]["name"]
            .as_str()
            .is_some_and(|name| name.ends_with("-r1"))
    }));
}

#[test]
fn stop_and_checkpoint_commands_reach_the_workers() {
    let (store, mut cluster) = cluster(ONE_NODE_TEN_SECOND_EPOCHS);
    job(&store, "c", 1, 1, false, json!({}));
    cluster.step_at(0.0);
    cluster.step_at(1.0);
    cluster.step_at(2.0);
    cluster.step_at(15.0);
    let reports = cluster.command(WorkerCommand::CheckpointNow {
        namespace: NS.into(),
        training_job: "c".into(),
    });
    match reports.as_slice() {
        [Report::Checkpoint { payload, .. }] => {
            assert_eq!(payload.epoch, 2, "resumed at 1, one epoch done");
            assert_eq!(payload.uri, "s3://b/x/checkpoint-epoch-2");
        }
        other => panic!("expected one checkpoint, got {other:?}"),
    }
    cluster.command(WorkerCommand::Stop {
        namespace: NS.into(),
        training_job: "c".into(),
    });
    cluster.step_at(16.0);
    assert_eq!(
        job_condition(&store, "c"),
        vec!["SuccessCriteriaMet", "Complete"]
    );
}

#[test]
fn a_recreated_job_runs_only_its_own_pods_not_those_orphaned_by_its_namesake() {
    let (store, mut cluster) = cluster(ONE_NODE_TEN_SECOND_EPOCHS);
    job(&store, "r", 2, 1, false, json!({}));
    cluster.step_at(0.0);
    cluster.step_at(1.0);
    let orphans: Vec<Value> = pods(&store, "r");
    assert_eq!(orphans.len(), 2);
    store
        .delete(resources::jobs(), Some(NS), "r", Propagation::Orphan)
        .expect("deleted");
    store
        .delete(
            resources::config_maps(),
            Some(NS),
            "r-config",
            Propagation::Background,
        )
        .expect("deleted");
    job(&store, "r", 2, 1, false, json!({}));
    cluster.step_at(2.0);
    cluster.step_at(3.0);
    let status = &store.get(resources::jobs(), Some(NS), "r").expect("job")["status"];
    assert_eq!(status["active"], 2, "the orphans are not the new Job's");
    assert_eq!(status["ready"], 2);
    // Resumed from epoch 1 of 4: three epochs of 10 s, then one more step to end.
    cluster.step_at(33.0);
    cluster.step_at(34.0);
    assert_eq!(
        job_condition(&store, "r"),
        vec!["SuccessCriteriaMet", "Complete"]
    );
    let all = pods(&store, "r");
    assert_eq!(all.len(), 4);
    for pod in all {
        let orphan = orphans
            .iter()
            .any(|o| o["metadata"]["name"] == pod["metadata"]["name"]);
        let expected = if orphan { "Running" } else { "Succeeded" };
        assert_eq!(
            pod["status"]["phase"], expected,
            "{}",
            pod["metadata"]["name"]
        );
    }
    assert_eq!(cluster.history()["ml/r"].started, vec![0.0, 2.0]);
}

#[test]
fn the_virtual_clock_scales_simulated_time() {
    let config = ClusterConfig::parse("speed: 3600\nnodes: [{name: n}]").expect("valid");
    let clock = SimClock::new(config.speed);
    assert_eq!(clock.real(3600.0), std::time::Duration::from_secs(1));
}

#[test]
fn pods_other_clients_delete_or_send_back_to_pending_are_seen_at_the_next_step() {
    let (store, mut cluster) = cluster(ONE_NODE_TEN_SECOND_EPOCHS);
    job(&store, "done", 1, 1, false, json!({}));
    job(&store, "too-big", 1, 16, false, json!({}));
    // Resumed from epoch 1 of 4: three epochs of 10 s, then one more step to end.
    for t in [0.0, 1.0, 31.0, 32.0] {
        cluster.step_at(t);
    }
    assert_eq!(pods(&store, "done")[0]["status"]["phase"], "Succeeded");
    assert_eq!(cluster.usage().last().map(|u| u.pending_pods), Some(1));

    delete_first_pod(&store, "too-big");
    let finished = first_pod_name(&store, "done");
    let finished = finished.as_str();
    store
        .patch(
            resources::pods(),
            Some(NS),
            finished,
            PatchKind::Merge,
            json!({"status": {"phase": "Pending"}}),
            None,
            Subresource::Status,
        )
        .expect("pending again");
    // A client may not change a pod's nodeName (the API server refuses it), so
    // unbind it as the simulator's own controllers write.
    store
        .update(resources::pods(), Some(NS), finished, |pod| {
            pod["spec"]
                .as_object_mut()
                .map(|spec| spec.remove("nodeName"));
        })
        .expect("unbound");
    cluster.step_at(33.0);
    let pod = &pods(&store, "done")[0];
    assert_eq!(pod["spec"]["nodeName"], "n-0", "scheduled again");
    assert_eq!(pod["status"]["phase"], "Running");
    assert_eq!(
        cluster
            .usage()
            .last()
            .map(|u| (u.pending_pods, u.busy_gpus)),
        Some((0, 1)),
        "the deleted pod no longer waits"
    );
}

#[test]
fn a_cluster_that_falls_behind_the_stores_changes_relists() {
    let (store, mut cluster) = cluster(ONE_NODE_TEN_SECOND_EPOCHS);
    job(&store, "orphaned", 1, 1, false, json!({}));
    job(&store, "too-big", 1, 16, false, json!({}));
    cluster.step_at(0.0);
    cluster.step_at(1.0);
    assert_eq!(cluster.usage().last().map(|u| u.pending_pods), Some(1));

    delete_first_pod(&store, "too-big");
    store
        .delete(resources::jobs(), Some(NS), "orphaned", Propagation::Orphan)
        .expect("deleted");
    // More changes than the store buffers for a subscriber that has not read them.
    for n in 0..=trainyard_simulator::store::WATCH_BUFFER {
        store
            .update(resources::config_maps(), Some(NS), "too-big-config", |c| {
                c["data"]["n"] = json!(n.to_string());
            })
            .expect("updated");
    }
    cluster.step_at(2.0);
    assert_eq!(
        cluster.usage().last().map(|u| u.pending_pods),
        Some(0),
        "the deleted pod no longer waits"
    );
    let reports = [cluster.step_at(40.0), cluster.step_at(41.0)].concat();
    assert!(reports.is_empty(), "the deleted Job's run is forgotten");
    assert_eq!(pods(&store, "orphaned")[0]["status"]["phase"], "Running");
}

/// Adds resources to the worker container's `requests` or `limits` in `job`'s
/// template (the GPU limit stays), before the first step creates its pods.
fn add_worker_resources(store: &Store, job: &str, section: &str, added: Value) {
    store
        .update(resources::jobs(), Some(NS), job, |j| {
            let list = &mut j["spec"]["template"]["spec"]["containers"][0]["resources"][section];
            for (resource, quantity) in added.as_object().into_iter().flatten() {
                list[resource] = quantity.clone();
            }
        })
        .expect("resources");
}

/// The `Unschedulable` message of the first pod of `job`, which must be unbound.
fn unschedulable_message(store: &Store, job: &str) -> String {
    let pod = first_pod(store, job);
    assert!(pod["spec"]["nodeName"].is_null(), "{job} is bound: {pod}");
    let condition = &pod["status"]["conditions"][0];
    assert_eq!(condition["reason"], "Unschedulable", "{pod}");
    condition["message"].as_str().unwrap_or_default().to_owned()
}

#[test]
fn nodes_offer_the_cpu_and_memory_of_their_group_or_the_defaults() {
    let (store, _) = cluster(
        "nodes:\n  - {name: small, gpus: 8, cpu: 32, memory: 256Gi}\n  - {name: plain, gpus: 8}",
    );
    let resources_of = |node: &str| {
        let node = store.get(resources::nodes(), None, node).expect("node");
        ["allocatable", "capacity"].map(|field| {
            let list = &node["status"][field];
            (list["cpu"].clone(), list["memory"].clone())
        })
    };
    assert_eq!(
        resources_of("small-0"),
        [(json!("32"), json!("256Gi")), (json!("32"), json!("256Gi"))]
    );
    assert_eq!(
        resources_of("plain-0"),
        [(json!("128"), json!("2Ti")), (json!("128"), json!("2Ti"))],
        "today's defaults"
    );
}

/// One node with 8 GPUs, 32 CPUs and 64Gi of memory; workers start at once and
/// take 10 s an epoch.
const ONE_NODE_32_CPUS_64GI: &str = "nodes: [{name: n, gpus: 8, cpu: 32, memory: 64Gi}]\nworkers: {secondsPerEpoch: 10, startDelaySeconds: 0}";

#[test]
fn a_pod_that_fits_by_gpus_but_not_by_cpu_waits_until_the_pod_holding_it_finishes() {
    let (store, mut cluster) = cluster(ONE_NODE_32_CPUS_64GI);
    job(&store, "holder", 1, 1, false, json!({}));
    add_worker_resources(&store, "holder", "requests", json!({"cpu": "24"}));
    job(&store, "waiter", 1, 1, false, json!({}));
    add_worker_resources(&store, "waiter", "requests", json!({"cpu": "16000m"}));
    cluster.step_at(0.0);
    assert_eq!(first_pod(&store, "holder")["spec"]["nodeName"], "n-0");
    assert_eq!(
        unschedulable_message(&store, "waiter"),
        "0/1 nodes are available: 1 Insufficient cpu.",
        "6 GPUs are free, 8 of 32 CPUs"
    );
    // Resumed from epoch 1 of 4: three epochs of 10 s, then one more step to end.
    for t in [1.0, 31.0, 32.0] {
        cluster.step_at(t);
    }
    assert_eq!(first_pod(&store, "holder")["status"]["phase"], "Succeeded");
    cluster.step_at(33.0);
    assert_eq!(
        first_pod(&store, "waiter")["spec"]["nodeName"],
        "n-0",
        "the finished pod's CPUs are free again"
    );
}

#[test]
fn a_pod_that_fits_by_gpus_but_not_by_memory_waits_until_the_pod_holding_it_is_deleted() {
    let (store, mut cluster) = cluster(ONE_NODE_32_CPUS_64GI);
    job(&store, "holder", 1, 1, false, json!({}));
    // A limit without a request is the request, as the API server defaults it.
    add_worker_resources(&store, "holder", "limits", json!({"memory": "48Gi"}));
    job(&store, "waiter", 1, 1, false, json!({}));
    add_worker_resources(
        &store,
        "waiter",
        "requests",
        json!({"memory": "17179869185"}),
    );
    cluster.step_at(0.0);
    cluster.step_at(1.0);
    assert_eq!(first_pod(&store, "holder")["spec"]["nodeName"], "n-0");
    assert_eq!(
        unschedulable_message(&store, "waiter"),
        "0/1 nodes are available: 1 Insufficient memory.",
        "16Gi left of 64Gi, 16Gi and a byte wanted"
    );
    delete_first_pod(&store, "holder");
    cluster.step_at(2.0);
    assert_eq!(
        first_pod(&store, "waiter")["spec"]["nodeName"],
        "n-0",
        "the deleted pod's memory is free again"
    );
}

#[test]
fn an_unschedulable_pod_counts_the_nodes_under_each_reason_like_kube_scheduler() {
    let (store, mut cluster) = cluster(
        "nodes:\n  - {name: lean, gpus: 8, cpu: 4, memory: 8Gi}\n  - {name: one-gpu, count: 2, gpus: 1}",
    );
    job(&store, "big", 1, 2, false, json!({}));
    add_worker_resources(
        &store,
        "big",
        "requests",
        json!({"cpu": 8, "memory": "16Gi"}),
    );
    cluster.step_at(0.0);
    assert_eq!(
        unschedulable_message(&store, "big"),
        "0/3 nodes are available: 1 Insufficient cpu, 1 Insufficient memory, 2 insufficient GPUs.",
        "a node short of CPU and memory counts under both"
    );
}

#[test]
fn a_pod_whose_cpu_quantity_does_not_parse_stays_pending_with_the_field_named() {
    let (store, mut cluster) = cluster(ONE_NODE_32_CPUS_64GI);
    job(&store, "bad", 1, 1, false, json!({}));
    add_worker_resources(&store, "bad", "requests", json!({"cpu": "4 cores"}));
    cluster.step_at(0.0);
    cluster.step_at(1.0);
    let message = unschedulable_message(&store, "bad");
    assert!(
        message.starts_with(
            "spec.containers[0].resources.requests.cpu: \"4 cores\" is not a Kubernetes quantity"
        ),
        "{message}"
    );
}

/// The Job controller's `FailedCreate` Event messages about `job`.
fn failed_create(store: &Store, job: &str) -> Vec<String> {
    let fields = Selector::parse(&format!(
        "involvedObject.kind=Job,involvedObject.name={job},reason=FailedCreate"
    ))
    .expect("selector");
    store
        .list(resources::events(), Some(NS), &Selector::default(), &fields)
        .0
        .iter()
        .filter(|e| e["type"] == "Warning")
        .map(|e| e["message"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[test]
fn a_job_naming_a_missing_priority_class_gets_no_pods_and_a_failed_create_event() {
    let (store, mut cluster) = cluster(ONE_NODE_TEN_SECOND_EPOCHS);
    job(&store, "gold", 2, 1, false, json!({}));
    store
        .update(resources::jobs(), Some(NS), "gold", |j| {
            j["spec"]["template"]["spec"]["priorityClassName"] = json!("gold");
        })
        .expect("updated");
    cluster.step_at(1.0);
    cluster.step_at(2.0);
    assert!(pods(&store, "gold").is_empty());
    assert_eq!(
        failed_create(&store, "gold"),
        [
            "Error creating: pods \"gold-0-\" is forbidden: no PriorityClass with name gold was found"
        ],
        "one Event however often the controller retries"
    );
    let started = store.get(resources::jobs(), Some(NS), "gold").expect("job");
    assert_eq!(started["status"]["active"], 0);
    assert!(started["status"]["startTime"].is_string());

    store
        .create(
            resources::priority_classes(),
            None,
            json!({"metadata": {"name": "gold"}, "value": 1000}),
        )
        .expect("priority class");
    cluster.step_at(3.0);
    assert_eq!(
        pods(&store, "gold").len(),
        2,
        "admitted once the class exists"
    );
}

#[test]
fn a_job_over_its_namespaces_gpu_quota_gets_no_pods_and_a_failed_create_event() {
    let (store, mut cluster) = cluster(ONE_NODE_TEN_SECOND_EPOCHS);
    store
        .create(
            resources::resource_quotas(),
            Some(NS),
            json!({"metadata": {"name": "gpu-quota"}, "spec": {"hard": {"requests.nvidia.com/gpu": "2", "pods": "10"}}}),
        )
        .expect("quota");
    job(&store, "big", 2, 2, false, json!({}));
    cluster.step_at(1.0);
    assert!(pods(&store, "big").is_empty());
    assert_eq!(
        failed_create(&store, "big"),
        [
            "Error creating: pods \"big-1-\" is forbidden: exceeded quota: gpu-quota, requested: requests.nvidia.com/gpu=2, used: requests.nvidia.com/gpu=2, limited: requests.nvidia.com/gpu=2"
        ]
    );

    job(&store, "small", 1, 2, false, json!({}));
    cluster.step_at(2.0);
    assert_eq!(
        pods(&store, "small").len(),
        1,
        "a job within the quota runs"
    );
    assert!(failed_create(&store, "small").is_empty());
}

#[test]
fn the_demo_cluster_has_the_priority_classes_an_installation_creates() {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/..");
    let installed: std::collections::BTreeMap<String, i32> =
        std::fs::read_to_string(format!("{root}/deploy/priorityclasses.yaml"))
            .expect("deploy/priorityclasses.yaml")
            .split("\n---\n")
            .map(|doc| {
                let field = |prefix: &str| {
                    doc.lines()
                        .find_map(|l| l.strip_prefix(prefix))
                        .expect("field")
                        .trim()
                        .to_owned()
                };
                (field("  name:"), field("value:").parse().expect("a value"))
            })
            .collect();
    let demo = ClusterConfig::load(&format!("{root}/simulator/clusters/demo.yaml")).expect("demo");
    assert_eq!(demo.priority_classes, installed);

    let store = Arc::new(Store::default());
    let _cluster = Cluster::new(store.clone(), demo, SimClock::new(1.0));
    let class = store
        .get(resources::priority_classes(), None, "high-priority")
        .expect("created at start");
    assert_eq!(class["value"], 10000);
}

#[test]
fn workers_whose_image_cannot_be_pulled_wait_in_image_pull_back_off() {
    let (store, mut cluster) = cluster(
        "nodes: [{name: n, gpus: 8}]\nworkers: {startDelaySeconds: 0, unpullableImages: [x]}",
    );
    job(&store, "nope", 2, 1, false, json!({}));
    for second in 1..4 {
        cluster.step_at(f64::from(second));
    }
    let stuck = pods(&store, "nope");
    assert_eq!(stuck.len(), 2);
    for pod in &stuck {
        assert_eq!(pod["status"]["phase"], "Pending");
        assert!(pod["spec"]["nodeName"].is_string(), "bound: the pull fails");
        let waiting = &pod["status"]["containerStatuses"][0]["state"]["waiting"];
        assert_eq!(waiting["reason"], "ImagePullBackOff");
        assert_eq!(waiting["message"], "Back-off pulling image \"x\"");
    }
}

/// The kept log lines of a pod.
fn log(store: &Store, pod: &Value) -> Vec<String> {
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    store
        .logs()
        .lines_after(NS, name, 0)
        .into_iter()
        .map(|line| line.text)
        .collect()
}

/// The pod of `job` with completion index `rank`.
fn pod_of_rank(store: &Store, job: &str, rank: u32) -> Value {
    pods(store, job)
        .into_iter()
        .find(|p| {
            p["metadata"]["labels"][LABEL_WORKER_INDEX].as_str() == Some(rank.to_string().as_str())
        })
        .expect("a pod of that rank")
}

#[test]
fn workers_log_their_start_epochs_checkpoints_and_exit() {
    let (store, mut cluster) = cluster(ONE_NODE_TEN_SECOND_EPOCHS);
    job(&store, "l", 2, 1, false, json!({}));
    cluster.step_at(0.0);
    cluster.step_at(1.0);
    cluster.step_at(2.0);
    let rank_zero = pod_of_rank(&store, "l", 0);
    let rank_one = pod_of_rank(&store, "l", 1);
    // Resumed from epoch 1 of 4: epochs 2..4 at 10 s each, then the exit.
    cluster.step_at(2.0 + 30.5);
    cluster.step_at(33.0);
    let zero = log(&store, &rank_zero);
    assert_eq!(
        zero.first().map(String::as_str),
        Some(
            "rank 0/2: training cnn for 4 epochs, resuming from s3://b/x/checkpoint-epoch-1 at epoch 1"
        )
    );
    let epochs: Vec<&String> = zero.iter().filter(|l| l.starts_with("epoch ")).collect();
    assert_eq!(epochs.len(), 3, "{zero:?}");
    assert!(
        epochs[0].starts_with("epoch 2/4 step 200 accuracy="),
        "{}",
        epochs[0]
    );
    assert!(epochs[0].contains(" loss="), "{}", epochs[0]);
    assert!(zero.contains(&"checkpoint saved: s3://b/x/checkpoint-epoch-4 (epoch 4)".to_owned()));
    assert_eq!(
        zero.last().map(String::as_str),
        Some("training finished at epoch 4/4: exiting with code 0")
    );
    let one = log(&store, &rank_one);
    assert!(one[0].starts_with("rank 1/2: "), "{one:?}");
    assert!(
        !one.iter().any(|l| l.starts_with("checkpoint")),
        "only rank 0 saves checkpoints: {one:?}"
    );
    assert_eq!(one.len(), zero.len() - 3);
}

#[test]
fn a_failed_worker_logs_its_exit_code_and_a_deleted_pod_takes_its_log_along() {
    let (store, mut cluster) = cluster(
        "nodes: [{name: n, gpus: 8}]\nfailures: {rate: 1.0, exitCodes: [137]}\nworkers: {secondsPerEpoch: 10, startDelaySeconds: 0}",
    );
    job(&store, "f", 1, 1, false, json!({}));
    for t in 0..100 {
        cluster.step_at(f64::from(t));
    }
    let pod = &pods(&store, "f")[0];
    assert_eq!(
        log(&store, pod).last().map(String::as_str),
        Some("killed: out of memory; exiting with code 137")
    );
    let name = pod["metadata"]["name"].as_str().unwrap_or_default();
    store
        .delete(resources::pods(), Some(NS), name, Propagation::Background)
        .expect("deleted");
    assert!(store.logs().lines_after(NS, name, 0).is_empty());
}

/// The utilisation reports of worker 0 in `reports`: (phase, utilisation).
fn utilization_of_rank_zero(reports: &[Report]) -> Vec<(String, f64)> {
    reports
        .iter()
        .filter_map(|r| match r {
            Report::Utilization { payload, .. } if payload.worker_index == 0 => {
                Some((format!("{:?}", payload.phase), payload.gpu_utilization))
            }
            _ => None,
        })
        .collect()
}

fn unsuspend_with_env(store: &Store, job: &str, env: Value) {
    store
        .patch(
            resources::jobs(),
            Some(NS),
            job,
            PatchKind::Strategic,
            json!({"spec": {"suspend": false, "template": {"spec": {"containers": [{"name": "worker", "env": env}]}}}}),
            None,
            Subresource::Main,
        )
        .expect("unsuspend");
}

#[test]
fn nodes_carry_the_labels_a_price_catalog_is_keyed_on() {
    let (store, _) = cluster(
        "nodes: [{name: s, gpus: 8, gpuProduct: A100-SXM4-80GB, capacityType: spot, zone: zone-b, region: us-east-1}]",
    );
    let labels = &store.get(resources::nodes(), None, "s-0").expect("node")["metadata"]["labels"];
    assert_eq!(labels["nvidia.com/gpu.product"], "A100-SXM4-80GB");
    assert_eq!(labels["karpenter.sh/capacity-type"], "spot");
    assert_eq!(labels["topology.kubernetes.io/zone"], "zone-b");
    assert_eq!(labels["topology.kubernetes.io/region"], "us-east-1");
}

#[test]
fn workers_report_utilization_through_start_up_data_loading_training_and_checkpoints() {
    let (store, mut cluster) = cluster(
        "nodes: [{name: n, gpus: 8}]\nworkers: {secondsPerEpoch: 10, startDelaySeconds: 0, utilizationReportSeconds: 4, dataLoadingSeconds: 3}",
    );
    job(&store, "u", 2, 2, false, json!({}));
    // Bound, then Running: the first step after start-up starts training.
    let mut seen = Vec::new();
    for t in [1.0, 2.0, 3.0, 4.5, 6.0, 8.0, 10.5, 12.0, 13.0, 14.0, 15.0] {
        seen.extend(utilization_of_rank_zero(&cluster.step_at(t)));
    }
    let phases: Vec<&str> = seen.iter().map(|(p, _)| p.as_str()).collect();
    let loading = phases
        .iter()
        .position(|p| *p == "LoadingData")
        .expect("loading reported");
    let training = phases
        .iter()
        .position(|p| *p == "Training")
        .expect("training reported");
    assert!(loading < training, "{phases:?}");
    assert!(
        phases.contains(&"Checkpointing"),
        "a save at epoch 2 (10 s after the start): {phases:?}"
    );
    for (phase, utilization) in &seen {
        match phase.as_str() {
            "Training" => assert!((0.8..=0.96).contains(utilization), "{phase} {utilization}"),
            _ => assert!(*utilization < 0.05, "{phase} {utilization}"),
        }
    }
    // Between phase changes, one report per worker per interval.
    let before = seen.len();
    let quiet: Vec<_> = [15.5, 16.0, 16.5]
        .into_iter()
        .flat_map(|t| utilization_of_rank_zero(&cluster.step_at(t)))
        .collect();
    assert!(quiet.len() <= 1, "{quiet:?} after {before}");
}

#[test]
fn a_worker_waiting_for_its_gang_reports_starting_up() {
    let (store, mut cluster) = cluster(
        "nodes: [{name: n, gpus: 8}]\nworkers: {startDelaySeconds: 0, utilizationReportSeconds: 5}",
    );
    // Two 8-GPU workers on one 8-GPU node: one runs, the other cannot bind.
    job(&store, "gang", 2, 8, false, json!({}));
    let mut reports = Vec::new();
    for t in [1.0, 2.0, 3.0] {
        reports.extend(cluster.step_at(t));
    }
    assert_eq!(
        utilization_of_rank_zero(&reports)
            .into_iter()
            .chain(reports.iter().filter_map(|r| match r {
                Report::Utilization { payload, .. } if payload.worker_index == 1 => {
                    Some((format!("{:?}", payload.phase), payload.gpu_utilization))
                }
                _ => None,
            }))
            .collect::<Vec<_>>(),
        [("Starting".to_owned(), 0.0)],
        "the running worker waits at the rendezvous; the pending one says nothing"
    );
}

#[test]
fn a_job_told_to_idle_holds_its_gpus_at_its_epoch_until_stopped() {
    let (store, mut cluster) = cluster(
        "nodes: [{name: n, gpus: 8}]\nworkers: {secondsPerEpoch: 10, startDelaySeconds: 0, utilizationReportSeconds: 5}",
    );
    job(&store, "idle", 1, 4, true, json!({}));
    // Resumed at epoch 1 of 4; idle once epoch 2 is done.
    unsuspend_with_env(
        &store,
        "idle",
        json!([{"name": "TRAINYARD_SIM_IDLE_AFTER_EPOCH", "value": "2"}]),
    );
    let mut reports = Vec::new();
    for t in (1..=200).map(f64::from) {
        reports.extend(cluster.step_at(t));
    }
    let last_epoch = reports
        .iter()
        .filter_map(|r| match r {
            Report::Progress { payload, .. } => Some(payload.epoch),
            _ => None,
        })
        .max();
    assert_eq!(last_epoch, Some(2), "training stops at the idle epoch");
    let utilization = utilization_of_rank_zero(&reports);
    let (phase, level) = utilization.last().expect("reports");
    assert_eq!(
        (phase.as_str(), *level),
        ("Training", 0.01),
        "idle: GPUs held, unused"
    );
    assert!(
        utilization.len() > 30,
        "still reporting every 5 s while idle: {}",
        utilization.len()
    );
    let pod = &pods(&store, "idle")[0];
    assert_eq!(pod["status"]["phase"], "Running");
    assert!(
        log(&store, pod)
            .iter()
            .any(|l| l.contains("idle from here on")),
        "the worker's log says it went idle"
    );
    // A requested checkpoint is saved at the idle epoch; a stop ends the run.
    let saved = cluster.command(WorkerCommand::CheckpointNow {
        namespace: NS.into(),
        training_job: "idle".into(),
    });
    assert!(
        saved
            .iter()
            .any(|r| matches!(r, Report::Checkpoint { payload, .. } if payload.epoch == 2))
    );
    cluster.command(WorkerCommand::Stop {
        namespace: NS.into(),
        training_job: "idle".into(),
    });
    cluster.step_at(201.0);
    assert_eq!(pods(&store, "idle")[0]["status"]["phase"], "Succeeded");
}
