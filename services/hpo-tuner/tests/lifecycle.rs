#[test]
fn starts_reports_health_and_exits_cleanly_on_sigterm() {
    let took =
        trainyard_testkit::assert_service_lifecycle(env!("CARGO_BIN_EXE_trainyard-hpo-tuner"));
    eprintln!("trainyard-hpo-tuner stopped {took:?} after SIGTERM");
}
