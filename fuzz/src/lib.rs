//! The parts of `reconcile` the fuzz targets drive, compiled from the main crate's own sources.
//!
//! `reconcile` is a binary crate (no `lib.rs`), so its modules are included here by path under
//! the same names they have there: `unit::render` refers to `crate::manifest`, which resolves to
//! the module below. Only `manifest` and `unit` are needed; neither reaches any other module.
#![allow(dead_code, unused_imports)]

#[path = "../../src/manifest/mod.rs"]
pub mod manifest;
#[path = "../../src/unit/mod.rs"]
pub mod unit;
