//! Writes `deploy/nats/auth.conf`, the nats-server users and permissions, from the
//! contracts. `--submitter NAME=ns1,ns2` (repeatable) adds an external submitter
//! allowed to submit into those namespaces; `--out PATH` writes elsewhere.

use std::path::PathBuf;
use std::process::ExitCode;

use trainyard_contracts::permissions::{self, Identity};

fn main() -> ExitCode {
    let mut out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/nats/auth.conf");
    let mut submitters = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match (arg.as_str(), args.next()) {
            ("--out", Some(path)) => out = PathBuf::from(path),
            ("--submitter", Some(value)) => match value.split_once('=') {
                Some((name, namespaces)) => submitters.push(Identity::Submitter {
                    name: name.to_string(),
                    namespaces: namespaces.split(',').map(str::to_string).collect(),
                }),
                None => {
                    eprintln!("--submitter takes NAME=namespace1,namespace2, got {value:?}");
                    return ExitCode::FAILURE;
                }
            },
            _ => {
                eprintln!("usage: nats-auth-config [--out PATH] [--submitter NAME=ns1,ns2]...");
                return ExitCode::FAILURE;
            }
        }
    }
    let config = match permissions::server_config(&permissions::deployment(&submitters)) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("cannot derive the permissions: {err}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(err) = std::fs::write(&out, config) {
        eprintln!("cannot write {}: {err}", out.display());
        return ExitCode::FAILURE;
    }
    println!("wrote {}", out.display());
    ExitCode::SUCCESS
}
