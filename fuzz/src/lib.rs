//! The parts of `reconcile` the fuzz targets drive, under the names the targets use.
//!
//! Both crates are linked as libraries: the pure core (`reconcile-core`: manifests, units,
//! `systemctl show`, preflight's parsers, deployment records) and the binary's library for the
//! host-output parsers that live beside the code that reads hosts (`remote` for GPUs and HTTP,
//! `probe` for the liveness reading).

pub use reconcile::{manifest, observed, preflight, probe, remote, unit};

/// SGLang's `/metrics` as a drain reads it.
pub use reconcile_core::drain;

/// Deployment records and history lines.
pub use reconcile_core::record;

/// What the one command per host (the survey) printed.
pub use reconcile_core::survey;
