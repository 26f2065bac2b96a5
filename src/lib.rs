//! `reconcile`: GitOps for SGLang inference servers run as systemd services.
//!
//! The core is pure (manifest -> unit -> plan) and is its own crate, `reconcile-core`; its modules
//! are re-exported here under their own names, so `crate::plan::...` reads the same in the binary's
//! modules as in the core's. `remote` is the only layer that reaches hosts (`systemd` and `probe` say what to ask of
//! them through it); the modules here add
//! what touches hosts, files, the clock and the terminal. `main` only parses the command line,
//! runs it (`run`), and turns the result into an exit code.

pub use reconcile_core::{
    benchmark, digest, finding, flags, manifest, observed, plan, record, redact, rollout, sglang,
    targets, unit, unit_files,
};

pub mod agent;
pub mod apply;
pub mod bench;
pub mod cli;
pub mod coordinator;
pub mod drain;
pub mod dry_run;
pub mod experiment;
pub mod history;
pub mod import;
pub mod load;
pub mod pinned;
pub mod plan_file;
pub mod preflight;
pub mod probe;
pub mod quality;
pub mod remote;
pub mod report;
pub mod router;
pub mod run;
pub mod signals;
pub mod state;
pub mod status;
pub mod systemd;
pub mod verify;
pub mod visit;
