//! How a change goes over a service's hosts, decided once for both ways of applying it:
//!
//! - `policy`: the settings (a manifest's `rollout:`, apply's flags) resolved into one [`Rollout`],
//!   and the order of a service's hosts with its canary first;
//! - `schedule`: push mode (`reconcile apply`), where one process holds every host: which turns go
//!   next, which are skipped once the rollout stopped;
//! - `turn`: pull mode (`reconcile agent --coordinator`), where each host's agent decides for
//!   itself from what every agent wrote to the coordinator: go, wait or stop;
//! - `ledger`: what the agents write there (each host's outcome, the restart slots) and under which
//!   keys, and the revision that names one change of a service.
//!
//! The same numbers mean the same in both: the canary goes alone and must pass before any other
//! host restarts, at most `max_parallel` hosts restart at once, and `max_failures` failed hosts
//! stop every host that has not started.

pub mod ledger;
pub mod overview;
pub mod policy;
pub mod schedule;
pub mod turn;

pub use policy::{order, Asked, Rollout};
