//! The crate's one error type. Every variant says where the problem is and,
//! where the caller can do something about it, how to fix it.

use std::path::PathBuf;

/// Errors from parsing traces, generating them, building reports and reading
/// process statistics.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },

    /// The trace has no header line (the file is empty or only blank lines).
    #[error("trace has no header line; the first line must name the columns, e.g. {example}")]
    MissingHeader { example: &'static str },

    /// A required column is not in the header.
    #[error("trace header lacks column `{column}`; add it (columns may be in any order)")]
    MissingColumn { column: &'static str },

    /// A column name appears twice in the header.
    #[error("trace header names column `{column}` twice; keep one")]
    DuplicateColumn { column: String },

    /// A row has a different number of fields from the header.
    #[error(
        "line {line}: {found} fields but the header has {expected}; quoted fields and commas inside values are not supported"
    )]
    FieldCount {
        line: usize,
        expected: usize,
        found: usize,
    },

    /// A field holds a value the column does not accept.
    #[error("line {line}, column `{column}`: `{value}` is not valid; {fix}")]
    BadValue {
        line: usize,
        column: &'static str,
        value: String,
        fix: &'static str,
    },

    /// A job id is used by two rows.
    #[error(
        "line {line}, column `job_id`: `{id}` is already used on line {first_line}; job ids must be unique"
    )]
    DuplicateJobId {
        line: usize,
        id: String,
        first_line: usize,
    },

    /// Rows are not in submission order.
    #[error(
        "line {line}, column `submit_time`: {submit} is earlier than the previous row's {previous}; sort the rows by submit_time"
    )]
    Unsorted {
        line: usize,
        submit: f64,
        previous: f64,
    },

    /// A value cannot be written to the trace CSV without quoting, which the
    /// format here does not use.
    #[error(
        "job `{job}`, column `{column}`: `{value}` cannot be written; values must be non-empty without commas, quotes, line breaks or surrounding spaces"
    )]
    Unwritable {
        job: String,
        column: &'static str,
        value: String,
    },

    /// A job's GPUs cannot be laid out as a gang on the cluster's nodes.
    #[error("job `{job}`: {gpus} GPUs as {workers} workers on {gpus_per_node}-GPU nodes: {fix}")]
    GangLayout {
        job: String,
        gpus: u32,
        workers: u32,
        gpus_per_node: u32,
        fix: &'static str,
    },

    /// A parameter (command-line flag, generator setting, report setting) is
    /// out of range.
    #[error("`{name}` = `{value}` is not valid; {fix}")]
    InvalidArgument {
        name: &'static str,
        value: String,
        fix: &'static str,
    },

    /// A job record handed to the report contradicts itself.
    #[error("job `{job}`: {problem}; fix the record before building the report")]
    InvalidRecord { job: String, problem: &'static str },

    /// A benchmark manifest does not fit the API types (a bug in the
    /// benchmark, or the API changed under it).
    #[error("the benchmark's {kind} manifest does not match the API: {source}")]
    Manifest {
        kind: &'static str,
        source: serde_json::Error,
    },

    /// The process does not exist any more (or has exited and is a zombie).
    #[error("process {pid} is gone")]
    ProcessGone { pid: u32 },

    /// A `/proc` file did not have the expected layout.
    #[error("cannot parse /proc/{pid}/{file}: {problem}")]
    ProcFormat {
        pid: u32,
        file: &'static str,
        problem: &'static str,
    },
}
