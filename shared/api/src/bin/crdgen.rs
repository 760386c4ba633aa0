//! Writes the Trainyard CRDs to `crds/` (or to the directory given as the first argument).

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    // Default to the workspace's crds/ so the command works from any directory.
    let out_dir = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../crds"));
    let files = match trainyard_api::generate_crd_files() {
        Ok(files) => files,
        Err(error) => {
            eprintln!("crdgen: rendering CRDs failed: {error}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(error) = std::fs::create_dir_all(&out_dir) {
        eprintln!("crdgen: creating {}: {error}", out_dir.display());
        return ExitCode::FAILURE;
    }
    // Print clean paths; the default contains `../..`.
    let out_dir = std::fs::canonicalize(&out_dir).unwrap_or(out_dir);
    for (file_name, yaml) in files {
        let path = out_dir.join(file_name);
        if let Err(error) = std::fs::write(&path, yaml) {
            eprintln!("crdgen: writing {}: {error}", path.display());
            return ExitCode::FAILURE;
        }
        println!("wrote {}", path.display());
    }
    ExitCode::SUCCESS
}
