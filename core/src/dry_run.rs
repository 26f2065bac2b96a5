//! What `reconcile --dry-run` comes to for each unit, and the tally behind its closing line and exit
//! code. Reading the hosts is the binary's `dry_run`; this is the pure result it returns.

use serde::Serialize;

use crate::finding::has_errors;
use crate::plan::{UnitPlan, Verdict};
use crate::targets::Target;

/// What planning came to for one unit on one host. Not `apply::Outcome`, which is what an apply
/// did; the JSON tag is `outcome` all the same.
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum PlanOutcome {
    Planned(Box<UnitPlan>),
    Error {
        host: String,
        unit: String,
        source: String,
        error: String,
    },
}

impl PlanOutcome {
    /// The outcome under `--strict` ([`crate::finding::strictly`]).
    pub fn strictly(mut self) -> PlanOutcome {
        if let PlanOutcome::Planned(p) = &mut self {
            crate::finding::strictly(&mut p.preflight);
        }
        self
    }

    /// A unit that could not be planned, with why.
    pub fn failed(t: &Target, error: String) -> PlanOutcome {
        PlanOutcome::Error {
            host: t.host.clone(),
            unit: t.desired.unit.clone(),
            source: t.source.clone(),
            error,
        }
    }
}

/// Counts for the closing line and the exit code.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Tally {
    pub install: usize,
    pub restart: usize,
    /// Taken by the running server without a restart (`apply.live`).
    pub live: usize,
    pub reload_only: usize,
    pub unchanged: usize,
    pub errors: usize,
    /// Planned units whose preflight found an error: the host cannot run them as they are.
    pub preflight_errors: usize,
    /// Planned units whose host fetches pinned weights first, and the bytes still to fetch.
    pub fetching: usize,
    pub fetch_bytes: u64,
}

impl Tally {
    pub fn of(outcomes: &[PlanOutcome]) -> Tally {
        let mut t = Tally::default();
        for o in outcomes {
            match o {
                PlanOutcome::Error { .. } => t.errors += 1,
                PlanOutcome::Planned(p) => {
                    match p.verdict {
                        Verdict::Install => t.install += 1,
                        Verdict::Restart => t.restart += 1,
                        Verdict::Live => t.live += 1,
                        Verdict::ReloadOnly => t.reload_only += 1,
                        Verdict::NoChange => t.unchanged += 1,
                    }
                    if has_errors(&p.preflight) {
                        t.preflight_errors += 1;
                    }
                    if let Some(crate::pinned::Holding::Fetch { bytes, resumed, .. }) =
                        p.pinned.as_ref().map(|c| &c.holding)
                    {
                        t.fetching += 1;
                        t.fetch_bytes += bytes - resumed;
                    }
                }
            }
        }
        t
    }

    pub fn changes(&self) -> usize {
        self.install + self.restart + self.live + self.reload_only
    }

    /// Exit status 1 of `plan`: a unit could not be planned, or its host cannot run it.
    pub fn failed(&self) -> bool {
        self.errors > 0 || self.preflight_errors > 0
    }
}
