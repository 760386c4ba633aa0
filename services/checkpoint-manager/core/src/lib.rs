//! The checkpoint-manager's decisions, without I/O: whether a checkpoint is
//! complete ([`verify`]), which checkpoints a retention policy deletes
//! ([`retention`]), where the next attempt resumes ([`catalog`]), how often a
//! job should save ([`interval`]), which checkpoint of a completed job
//! becomes a model version ([`registration`]), and which checkpoint problems
//! a person is told about ([`problems`]). The service crate feeds these
//! functions what it read from storage and NATS, and carries out what they
//! decide.

pub mod catalog;
pub mod error;
pub mod interval;
pub mod manifest;
pub mod problems;
pub mod registration;
pub mod retention;
pub mod verify;

pub use catalog::{Checkpoint, JobCheckpoints, Recorded, ResumeChoice, Skipped, Summary};
pub use error::CoreError;
pub use interval::{Advice, InterruptionStats, SaveStats};
pub use manifest::{MANIFEST_FILE, MANIFEST_FORMAT, Manifest, ManifestFile};
pub use problems::{Problem, ProblemKind, ProblemSeverity, Raised};
pub use retention::{
    KeepBest, KeepReason, MetricMode, Protected, RetentionDecision, RetentionPolicy,
};
pub use verify::{Expected, Listing, Method, Verification, Verifier};
