//! `reconcile-core`: the pure part of `reconcile`, manifest -> unit -> plan, and the judgements
//! over what hosts report (preflight's facts, verification's samples, `systemctl show`, deployment
//! records).
//!
//! Nothing here reads a file, the environment or the clock, and nothing reaches a host: the
//! `reconcile` binary does that and passes the values in, so every decision can be tested (and
//! fuzzed) without a host or root. The modules import each other without cycles; the leaves are
//! `finding`, `digest`, `flags`, `observed`, `outcome` and `manifest`.

pub mod bake;
pub mod benchmark;
pub mod diagnose;
pub mod digest;
pub mod drain;
pub mod dry_run;
pub mod experiment;
pub mod finding;
pub mod flags;
pub mod gpu_claims;
pub mod group;
pub mod guard;
pub mod import;
pub mod journal;
pub mod learned;
pub mod live;
pub mod live_change;
pub mod manifest;
pub mod metrics;
pub mod observed;
pub mod outcome;
pub mod pinned;
pub mod plan;
pub mod plan_file;
pub mod preflight;
pub mod preload;
pub mod prometheus;
pub mod quality;
pub mod record;
pub mod redact;
pub mod rollout;
pub mod router;
pub mod sglang;
pub mod shared_change;
pub mod survey;
pub mod targets;
pub mod terminal;
#[cfg(test)]
mod testing;
pub mod transaction;
pub mod unit;
pub mod unit_files;
pub mod verify;

/// `[A-Za-z_][A-Za-z0-9_]*`: a C identifier, which both an environment variable's name (POSIX's
/// portable set, what systemd's `Environment=` takes) and a Prometheus label's name must be.
pub fn is_identifier(name: &str) -> bool {
    name.chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}
