//! Writes `docs/messages.md` from the contracts catalogue.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/messages.md");
    let page = match trainyard_contracts::catalog::markdown() {
        Ok(page) => page,
        Err(err) => {
            eprintln!("cannot render the catalogue: {err}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(err) = std::fs::write(&path, page) {
        eprintln!("cannot write {}: {err}", path.display());
        return ExitCode::FAILURE;
    }
    println!("wrote {}", path.display());
    ExitCode::SUCCESS
}
