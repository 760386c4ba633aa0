#[test]
fn starts_reports_health_and_exits_cleanly_on_sigterm() {
    let dir = tempfile::tempdir().expect("tempdir");
    let catalog = dir.path().join("price-catalog.yaml");
    std::fs::write(
        &catalog,
        "products: [A100]\nprices:\n  - {product: A100, capacityType: on-demand, pricePerGpuHour: 4.0, effectiveFrom: \"2020-01-01T00:00:00Z\"}\n",
    )
    .expect("catalog written");
    let took = trainyard_testkit::assert_service_lifecycle_with_env(
        env!("CARGO_BIN_EXE_trainyard-cost-optimizer"),
        &[(
            "TRAINYARD_COST_OPTIMIZER__CATALOG_PATH",
            catalog.to_str().expect("utf-8 path"),
        )],
    );
    eprintln!("trainyard-cost-optimizer stopped {took:?} after SIGTERM");
}
