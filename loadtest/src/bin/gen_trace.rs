//! Writes a seeded sample GPU trace in the Tiresias columns; the model is
//! documented in `trainyard_loadtest::generate`.
//!
//! Usage: `gen_trace [--seed N] [--jobs N] [--mean-interval SECONDS]
//! [--median-duration SECONDS] [--sigma S] [--out PATH]` (standard output
//! without `--out`). The shipped sample was made with the command in
//! `loadtest/traces/README.md`.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use trainyard_loadtest::Error;
use trainyard_loadtest::generate::{GenArgs, generate};
use trainyard_loadtest::trace::to_csv;

fn run() -> Result<(), Error> {
    let args = GenArgs::parse();
    args.config.validate()?;
    let csv = to_csv(&generate(&args.config)?)?;
    match &args.out {
        Some(path) => std::fs::write(path, csv).map_err(|source| Error::Io {
            path: path.clone(),
            source,
        }),
        None => std::io::stdout()
            .write_all(csv.as_bytes())
            .map_err(|source| Error::Io {
                path: "<stdout>".into(),
                source,
            }),
    }
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gen_trace: {e}");
            ExitCode::FAILURE
        }
    }
}
