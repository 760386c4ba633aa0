#[test]
fn starts_reports_health_and_exits_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("url"), "http://127.0.0.1:9/hook").expect("secret");
    let routes = dir.path().join("routes.yaml");
    std::fs::write(
        &routes,
        format!(
            "route: {{receiver: slack}}\nreceivers:\n  - name: slack\n    slack: {{channel: \"#training\", webhook_url_file: {}}}\n",
            dir.path().join("url").display()
        ),
    )
    .expect("routes");
    let routes = routes.display().to_string();
    let took = trainyard_testkit::assert_service_lifecycle_with_env(
        env!("CARGO_BIN_EXE_trainyard-notifier"),
        &[("TRAINYARD_NOTIFIER__ROUTES_FILE", routes.as_str())],
    );
    eprintln!("trainyard-notifier stopped {took:?} after SIGTERM");
}
