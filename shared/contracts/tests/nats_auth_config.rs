//! The committed nats-server permissions are exactly what the contracts derive.

use trainyard_contracts::permissions;

#[test]
fn nats_auth_config_is_current() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../deploy/nats/auth.conf");
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    let generated = permissions::server_config_with(&permissions::deployment(&[]), true)
        .expect("derives permissions");
    assert!(
        committed == generated,
        "deploy/nats/auth.conf is out of date: run `cargo run -p trainyard-contracts --bin nats-auth-config`"
    );
}
