//! Apply's decisions for one unit, as functions of what was found: no host, no clock. The driver
//! (`apply_unit`, `install`) gathers the facts, asks here what they mean, and does what it is told;
//! each outcome's detail text is written here and only here (reports, JSON and integration tests
//! read it byte for byte).

use super::error::{ApplyError, ApplyErrorKind};
use super::restore::{NotRestored, Restored};
use super::{state, Outcome};
use crate::observed::Observed;
use crate::plan::Verdict;
use crate::plan_file;
use crate::preflight;
use crate::targets::Target;
use crate::verify::Verification;

/// How a unit's apply ended: what goes into its report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ending {
    pub outcome: Outcome,
    pub detail: String,
    pub error: Option<ApplyErrorKind>,
}

impl Ending {
    fn ok(outcome: Outcome, detail: impl Into<String>) -> Ending {
        Ending {
            outcome,
            detail: detail.into(),
            error: None,
        }
    }

    fn failed(outcome: Outcome, detail: String, kind: ApplyErrorKind) -> Ending {
        Ending {
            outcome,
            detail,
            error: Some(kind),
        }
    }

    /// The way back failed too: the host needs attention.
    fn rollback_failed(detail: String) -> Ending {
        let e = ApplyError::RollbackFailed(detail);
        Ending::failed(Outcome::RollbackFailed, e.to_string(), e.kind())
    }

    /// A unit stopped by `e` before anything changed on its host.
    pub fn refused(e: &ApplyError) -> Ending {
        let outcome = match e.kind() {
            ApplyErrorKind::Interrupted | ApplyErrorKind::NotStarted => Outcome::NotStarted,
            _ => Outcome::Error,
        };
        Ending::failed(outcome, e.to_string(), e.kind())
    }
}

/// A plan file's unit whose host no longer has the unit the plan was made against.
pub fn stale_plan(t: &Target, observed: &Observed) -> Option<ApplyError> {
    let expected = t.expected.as_ref()?;
    let current = observed.unit_text.as_deref().map(state::sha256);
    plan_file::unit_staleness(&t.host, expected, current.as_deref())
        .map(|stale| ApplyError::PlanStale(stale.to_string()))
}

/// What to go back to if the new unit fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Previous {
    /// The unit on the host now (`None`: there is none, the unit is new).
    Observed,
    /// The newest kept generation: the unit on disk is already the new one.
    NewestGeneration,
}

/// An install to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Install {
    pub verdict: Verdict,
    pub previous: Previous,
    pub was_running: bool,
    pub note: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Start {
    /// Nothing differs and the last apply finished: touch nothing.
    Unchanged,
    Refuse(ApplyError),
    Install(Install),
}

/// What to do first with a unit, from the plan's verdict and, for a unit with no change, whether
/// the last apply of it did not finish (`unfinished`: asked only then, so `None` otherwise).
pub fn start(
    verdict: Verdict,
    observed: &Observed,
    unfinished: Option<Result<bool, state::RecordError>>,
) -> Start {
    let was_running = matches!(
        observed.state.active_state.as_str(),
        "active" | "activating"
    );
    if verdict != Verdict::NoChange {
        return Start::Install(Install {
            verdict,
            previous: Previous::Observed,
            was_running,
            note: None,
        });
    }
    match unfinished {
        None | Some(Ok(false)) => Start::Unchanged,
        Some(Err(e)) => Start::Refuse(ApplyError::RecordUnreadable(e.to_string())),
        // The unit on disk is the desired one but no run recorded it: an apply died after the
        // rename. Finish that apply, with the generation it kept to fall back on.
        Some(Ok(true)) => Start::Install(Install {
            verdict: Verdict::Restart,
            previous: Previous::NewestGeneration,
            was_running: true,
            note: Some("the last apply did not finish (no deployment record for this unit); restarting and verifying it".into()),
        }),
    }
}

/// Whether a preflight finding refuses the unit. When restoring a kept deployment, the manifest's
/// SGLang version and flags say nothing about the unit being restored, so those findings are notes.
pub fn blocks(f: &preflight::Finding, restoring: Option<usize>) -> bool {
    let about_manifest = matches!(f.check, "sglang-version" | "flags");
    f.severity == preflight::Severity::Error && !(restoring.is_some() && about_manifest)
}

/// Preflight's findings as the report's notes (those that do not block) and the refusal, if any
/// finding blocks.
pub fn preflight(
    findings: Vec<preflight::Finding>,
    restoring: Option<usize>,
) -> (Vec<String>, Option<ApplyError>) {
    let (errors, warnings): (Vec<_>, Vec<_>) =
        findings.into_iter().partition(|f| blocks(f, restoring));
    let notes = warnings
        .into_iter()
        .map(|f| format!("preflight: {}", f.message))
        .collect();
    let refusal = (!errors.is_empty())
        .then(|| ApplyError::PreflightFailed(errors.into_iter().map(|f| f.message).collect()));
    (notes, refusal)
}

/// Writing the new unit failed; `put_back`: whether the previous file had to be put back, or why
/// that failed.
pub fn install_failed(e: &ApplyError, put_back: Result<bool, String>) -> Ending {
    match put_back {
        Ok(false) => Ending::failed(
            Outcome::Error,
            format!("{e}; nothing changed on the host"),
            e.kind(),
        ),
        Ok(true) => Ending::failed(
            Outcome::Error,
            format!("{e}; the previous unit is back in place (the server was not restarted)"),
            e.kind(),
        ),
        Err(e2) => Ending::rollback_failed(format!(
            "{e}; putting the previous unit back failed too: {e2}"
        )),
    }
}

pub fn reloaded() -> Ending {
    Ending::ok(
        Outcome::Reloaded,
        "unit replaced and daemon-reloaded; the server kept running",
    )
}

/// A signal (`interrupted`: the signals module's words for it) came after the install and before
/// the restart, and the previous file was put back (or not).
pub fn cancelled_before_restart(interrupted: &str, put_back: Result<bool, String>) -> Ending {
    let detail = format!("not started: {interrupted} before the restart");
    match put_back {
        Ok(_) => Ending::failed(
            Outcome::NotStarted,
            format!(
                "{detail}; the previous unit is back in place and the server was not restarted"
            ),
            ApplyErrorKind::Interrupted,
        ),
        Err(e) => Ending::rollback_failed(format!(
            "{detail}; putting the previous unit back failed: {e}"
        )),
    }
}

pub fn converged(v: &Verification) -> Ending {
    Ending::ok(
        Outcome::Converged,
        format!("restarted and verified: {}", summary(v)),
    )
}

fn summary(v: &Verification) -> String {
    let load = v
        .load_seconds
        .map_or(String::new(), |s| format!("ready after {s:.1}s"));
    let stages: Vec<&str> = v.stages.iter().map(|s| s.name).collect();
    format!(
        "{load} ({} passed) memory {}",
        stages.join(", "),
        v.sparkline()
    )
}

/// Appended to what failed when the host was seen shutting down during the rollback.
pub const SHUTTING_DOWN: &str = "; the host was shutting down";
const LOST: &str = "the connection to the host was lost";

/// Appended to what failed when the connection broke and came back after `seconds`.
pub fn reconnected(seconds: f64) -> String {
    format!("; {LOST}, reconnected after {seconds:.1}s")
}

/// The new unit failed (`failed`: what failed, with what was seen of the host since) and the
/// previous one was put back, or not. `cause`: the kind of the first failure.
pub fn rolled_back(
    failed: &str,
    cause: ApplyErrorKind,
    result: &Result<Restored, NotRestored>,
) -> Ending {
    let back = |detail: String| Ending::failed(Outcome::RolledBack, detail, cause);
    let failed_too = Ending::rollback_failed;
    match result {
        Err(NotRestored::Restore(e)) => failed_too(format!("{failed}; rollback failed: {e}")),
        Err(NotRestored::Verify(f)) => failed_too(format!(
            "{failed}; the restored previous unit failed too: {}: {}",
            f.stage, f.reason
        )),
        Ok(Restored::Removed) => back(format!(
            "{failed}; the new unit was stopped, disabled and removed"
        )),
        // A rollback restarts or stops; only --rollback-all reloads without either.
        Ok(Restored::LeftStopped | Restored::Reloaded) => back(format!(
            "{failed}; the previous unit was restored and left stopped, as it was"
        )),
        Ok(Restored::Verified(v)) => {
            let load = v
                .load_seconds
                .map_or(String::new(), |s| format!(" (ready after {s:.1}s)"));
            back(format!(
                "{failed}; the previous unit was restored and passed verification{load}"
            ))
        }
    }
}

/// The host went away during the rollback and did not come back within `window_secs`.
pub fn host_lost(failed: &str, window_secs: u64, error: &str, left_behind: &str) -> Ending {
    Ending::rollback_failed(format!(
        "host needs attention: {failed}; {LOST} and it did not come back within {window_secs}s ({error}); {left_behind}"
    ))
}

/// What a run that lost its host mid-apply leaves there, and what the next apply does about it.
/// `new`: there was no previous unit; `kept`: where this run kept the previous one, once it had;
/// `tried`: a rollback had begun, so the previous unit may be back on disk already.
pub fn left_behind(unit: &str, new: bool, kept: Option<&str>, tried: bool) -> String {
    let dir = state::unit_dir(unit);
    let installed = if tried {
        "the new unit is installed, or the previous one if the rollback got that far"
    } else {
        "the new unit is installed"
    };
    let next = match (new, kept) {
        (true, _) => "it was new; the next apply will finish it or remove it".to_string(),
        (false, Some(kept)) => {
            format!("the previous is kept as generation {kept}; the next apply will finish or roll back")
        }
        (false, None) => format!(
            "the previous is kept as the newest generation in {dir}/generations; the next apply will finish or roll back"
        ),
    };
    format!("{installed}; {next}; the lock {dir}/lock stays (an apply from this machine breaks it; from elsewhere, use --break-stale-lock)")
}

/// Why `--rollback-all` could not put a unit back, as its detail says it.
pub fn not_restored(e: &NotRestored) -> String {
    match e {
        NotRestored::Restore(e) => e.clone(),
        NotRestored::Verify(f) => format!("the restored unit failed {}: {}", f.stage, f.reason),
    }
}

/// A unit this rollout had changed (`before`: its detail then), after `--rollback-all` put it
/// back or failed to (`result`) because the rollout stopped (`why`).
pub fn rolled_back_with_rollout(
    before: &str,
    why: &str,
    result: Result<&Restored, String>,
) -> Ending {
    match result {
        Ok(restored) => {
            let done = match restored {
                Restored::Removed => "removed the new unit",
                Restored::Verified(_) => "restored the previous unit, which passed verification",
                Restored::Reloaded | Restored::LeftStopped => {
                    "restored the previous unit (daemon-reload only)"
                }
            };
            Ending::failed(
                Outcome::RolledBack,
                format!("{before}; {why}, and --rollback-all {done}"),
                ApplyErrorKind::RolloutStopped,
            )
        }
        Err(e) => {
            Ending::rollback_failed(format!("{before}; {why}, and --rollback-all failed: {e}"))
        }
    }
}
