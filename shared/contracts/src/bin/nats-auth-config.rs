//! Writes `deploy/nats/auth.conf`, the nats-server users and permissions, from the
//! contracts. `--submitter NAME=ns1,ns2` (repeatable) adds an external submitter
//! allowed to submit into those namespaces; `--out PATH` writes elsewhere;
//! `--no-auth-callout` leaves out the auth callout that authorizes workers
//! with their job's token (docs/security.md).
//!
//! `--new-callout-issuer SEED_FILE` instead writes a new issuer account nkey
//! seed to SEED_FILE (the planner's `worker_credentials_seed_file`) and prints
//! its public key (the server's `TRAINYARD_NATS_CALLOUT_ISSUER`).

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::process::ExitCode;

use trainyard_contracts::permissions::{self, Identity};

const USAGE: &str = "usage: nats-auth-config [--out PATH] [--submitter NAME=ns1,ns2]... [--no-auth-callout]\n       nats-auth-config --new-callout-issuer SEED_FILE";

fn main() -> ExitCode {
    let mut out = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/nats/auth.conf");
    let mut submitters = Vec::new();
    let mut auth_callout = true;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        if arg == "--no-auth-callout" {
            auth_callout = false;
            continue;
        }
        match (arg.as_str(), args.next()) {
            ("--out", Some(path)) => out = PathBuf::from(path),
            ("--new-callout-issuer", Some(path)) => return new_issuer(&PathBuf::from(path)),
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
                eprintln!("{USAGE}");
                return ExitCode::FAILURE;
            }
        }
    }
    let identities = permissions::deployment(&submitters);
    let config = match permissions::server_config_with(&identities, auth_callout) {
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

/// Writes a new account seed to `path` (readable by its owner only, never
/// overwriting) and prints the public key.
fn new_issuer(path: &PathBuf) -> ExitCode {
    let key = nkeys::KeyPair::new_account();
    let seed = match key.seed() {
        Ok(seed) => seed,
        Err(err) => {
            eprintln!("cannot make a seed: {err}");
            return ExitCode::FAILURE;
        }
    };
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut file| file.write_all(seed.as_bytes()));
    if let Err(err) = written {
        eprintln!("cannot write {}: {err}", path.display());
        return ExitCode::FAILURE;
    }
    println!("{}", key.public_key());
    ExitCode::SUCCESS
}
