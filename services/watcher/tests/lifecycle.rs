#[test]
fn starts_reports_health_and_exits_cleanly_on_sigterm() {
    // A cluster whose API server is down: the watches back off and retry while the
    // service stays healthy and ready (NATS is what readiness means).
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = dir.path().join("kubeconfig");
    let port = trainyard_testkit::free_port();
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: down\n\
             clusters: [{{name: down, cluster: {{server: \"http://127.0.0.1:{port}\"}}}}]\n\
             users: [{{name: nobody, user: {{}}}}]\n\
             contexts: [{{name: down, context: {{cluster: down, user: nobody}}}}]\n"
        ),
    )
    .expect("write kubeconfig");
    let took = trainyard_testkit::assert_service_lifecycle_with_env(
        env!("CARGO_BIN_EXE_trainyard-watcher"),
        &[("KUBECONFIG", kubeconfig.to_str().expect("utf-8 path"))],
    );
    eprintln!("trainyard-watcher stopped {took:?} after SIGTERM");
}
