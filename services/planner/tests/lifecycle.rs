#[test]
fn starts_reports_health_and_exits_cleanly_on_sigterm() {
    // A cluster whose API server is down: Kubernetes calls back off and retry while
    // the service stays healthy and ready (NATS is what readiness means).
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = trainyard_testkit::unreachable_kubeconfig(dir.path());
    let took = trainyard_testkit::assert_service_lifecycle_with_env(
        env!("CARGO_BIN_EXE_trainyard-planner"),
        &[("KUBECONFIG", kubeconfig.to_str().expect("utf-8 path"))],
    );
    eprintln!("trainyard-planner stopped {took:?} after SIGTERM");
}
