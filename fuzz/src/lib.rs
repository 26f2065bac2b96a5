//! The parts of `reconcile` the fuzz targets drive, compiled from the main crate's own sources.
//!
//! `reconcile` is a binary crate (no `lib.rs`), so its modules are included here by path under
//! the same names `src/main.rs` gives them, which is what lets `crate::...` paths inside them
//! resolve: `unit::render` refers to `crate::manifest`, `preflight` to `crate::targets`, and so on.
//! The host-output parsers sit in modules that reach the rest of the crate (`preflight`, `remote`,
//! `apply`), so the whole module tree is here, not just the pure core: keep this list in step with
//! the `mod` lines of `src/main.rs`, and `[dependencies]` in `Cargo.toml` with the main crate's.
#![allow(dead_code, unused_imports, unused_variables)]

#[path = "../../src/agent.rs"]
pub mod agent;
#[path = "../../src/apply/mod.rs"]
pub mod apply;
#[path = "../../src/cli.rs"]
pub mod cli;
#[path = "../../src/dry_run.rs"]
pub mod dry_run;
#[path = "../../src/history/mod.rs"]
pub mod history;
#[path = "../../src/load.rs"]
pub mod load;
#[path = "../../src/manifest/mod.rs"]
pub mod manifest;
#[path = "../../src/observed.rs"]
pub mod observed;
#[path = "../../src/plan.rs"]
pub mod plan;
#[path = "../../src/plan_file.rs"]
pub mod plan_file;
#[path = "../../src/preflight/mod.rs"]
pub mod preflight;
#[path = "../../src/redact.rs"]
pub mod redact;
#[path = "../../src/remote/mod.rs"]
pub mod remote;
#[path = "../../src/report/mod.rs"]
pub mod report;
#[path = "../../src/signals.rs"]
pub mod signals;
#[path = "../../src/sglang/mod.rs"]
pub mod sglang;
#[path = "../../src/status/mod.rs"]
pub mod status;
#[path = "../../src/targets.rs"]
pub mod targets;
#[path = "../../src/unit/mod.rs"]
pub mod unit;
#[path = "../../src/verify/mod.rs"]
pub mod verify;

/// Deployment records and history lines (`apply::state`, which `apply` keeps to the crate).
pub mod record {
    pub use crate::apply::state::{
        parse_history, parse_record, record_json, Record, RecordProblem, RECORD_FORMAT,
    };
}
