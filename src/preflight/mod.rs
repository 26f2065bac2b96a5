//! Preflight: what a host must have before a unit can start there, checked over the host's one SSH
//! connection by `plan` (shown per unit) and by `apply` (a unit with an error is refused before
//! its lock is taken or anything is changed).
//!
//! The judging is pure, in `reconcile_core::preflight` (re-exported here: the findings, [`judge`],
//! the parsers of the commands' output, the fleet's [`gpu_conflicts`]). [`survey`] reads every
//! fact of a host's units in one command (one round trip); [`gather`] is the edge for what the
//! survey lacks and for hosts that cannot run it: a few commands over the connection, never more
//! than two at once per unit (with `dry_run`'s four units at once, eight sessions, under sshd's
//! default of ten per connection).

mod cache;
mod gather;
pub(crate) mod scripts;
pub mod survey;

#[cfg(test)]
pub(crate) use gather::deep_command;
pub use gather::{check, check_surveyed, check_with, installed_sglang, rendezvous_free, Checked};
pub use reconcile_core::preflight::*;
pub use survey::{survey, Ask, Survey};
