//! Apply's decisions for one unit, as functions of what was found: no host, no clock. The driver
//! (`pipeline`) gathers the facts, asks here what they mean, and does what it is told;
//! each outcome's detail text is written here and only here (reports, JSON and integration tests
//! read it byte for byte).

use std::error::Error;
use std::sync::Arc;

use super::error::{ApplyError, ApplyErrorKind};
use super::restore::{NotRestored, Restored};
use super::Outcome;
use crate::manifest::DropInPolicy;
use crate::observed::Observed;
use crate::plan::Verdict;
use crate::plan_file;
use crate::preflight;
use crate::remote::error_chain;
use crate::state;
use crate::targets::Target;
use crate::unit_files::Drift;
use crate::verify::Verification;
use reconcile_core::guard::{GuardState, Settled};

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
    pub(super) fn rollback_failed(detail: String) -> Ending {
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
    /// The newest saved generation: the unit on disk is already the new one.
    NewestGeneration,
}

/// An install to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Install {
    pub verdict: Verdict,
    pub previous: Previous,
    pub was_running: bool,
    pub note: Option<String>,
    /// The unit runs already, let stand unconfirmed by the host's guard: verify it as it runs and
    /// confirm it, without a restart.
    pub confirm: bool,
}

#[derive(Debug, Clone)]
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
    guard: Option<&Settled>,
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
            confirm: false,
        });
    }
    match unfinished {
        None | Some(Ok(false)) => Start::Unchanged,
        Some(Err(e)) => Start::Refuse(ApplyError::RecordUnreadable(Arc::new(e))),
        // The unit on disk is the desired one but no run recorded it: an apply died after the
        // rename. Finish that apply, with the generation it saved to fall back on.
        // The apply died after its restart took: the host's guard let stand the new unit healthy at
        // its deadline, or still watches its start. Verified as it runs, never restarted for
        // nothing.
        Some(Ok(true)) if confirmable(observed, guard) => Start::Install(Install {
            verdict: Verdict::Restart,
            previous: Previous::NewestGeneration,
            was_running: true,
            note: guard.map(|g| {
                let what = g.summary().unwrap_or_else(|| {
                    format!(
                        "the apply by {} at {} died after its restart; the host's guard still watches the new unit",
                        g.armed_by, g.armed_at
                    )
                });
                format!("{what}; verifying it as it runs, without a restart, to confirm it")
            }),
            confirm: true,
        }),
        Some(Ok(true)) => Start::Install(Install {
            verdict: Verdict::Restart,
            previous: Previous::NewestGeneration,
            was_running: true,
            note: Some(match guard.filter(|g| g.live_unseen()).and_then(Settled::summary) {
                Some(kept) => format!("{kept}; whether the server took the live change is not known: restarting and verifying it"),
                None => "the last apply did not finish (no deployment record for this unit); restarting and verifying it".into(),
            }),
            confirm: false,
        }),
    }
}

/// Whether the unit on disk runs a start of the change the host's guard watches or kept
/// (`Settled::confirmable`), and it still runs.
fn confirmable(observed: &Observed, guard: Option<&Settled>) -> bool {
    let (Some(text), Some(guard)) = (&observed.unit_text, guard) else {
        return false;
    };
    guard.confirmable(&state::sha256(text)) && observed.state.active_state == "active"
}

/// The refusal of a unit that systemd runs with more than its managed file (drop-ins, a mask, a
/// unit file elsewhere) when `policy` does not say to move those aside: each reason, then the fix.
pub fn overridden(unit: &str, drift: &[Drift], policy: DropInPolicy) -> Option<ApplyError> {
    let refused: Vec<&Drift> = drift.iter().filter(|d| d.refused_under(policy)).collect();
    if refused.is_empty() {
        return None;
    }
    let mut reasons: Vec<String> = refused.iter().map(|d| d.describe(unit)).collect();
    let paths: Vec<&str> = refused.iter().filter_map(|d| d.path()).collect();
    let by_hand = if refused.iter().any(|d| matches!(d, Drift::Masked { .. })) {
        format!("`systemctl unmask {unit}` if it is to run again")
    } else {
        format!(
            "fold what {} sets into the manifest, then remove {} and `systemctl daemon-reload`",
            if paths.len() == 1 { "it" } else { "they" },
            paths.join(", ")
        )
    };
    reasons.push(format!(
        "fix: {by_hand}; or set `systemd.dropins: replace` in the manifest (or run `reconcile apply --replace-dropins`) to move {} aside into {} and install the manifest's unit alone; a rollback puts {} back",
        if paths.len() == 1 { "it" } else { "them" },
        super::aside::dir(unit),
        if paths.len() == 1 { "it" } else { "them" },
    ));
    Some(ApplyError::Overridden(reasons))
}

/// Whether a preflight finding refuses the unit. When restoring a saved deployment, the manifest's
/// SGLang version and flags say nothing about the unit being restored, so those findings are notes.
pub fn blocks(f: &preflight::Finding, restoring: Option<super::Restoring>) -> bool {
    let about_manifest = matches!(f.check, "sglang-version" | "flags");
    f.severity == preflight::Severity::Error && !(restoring.is_some() && about_manifest)
}

/// Preflight's findings as the report's notes (those that do not block) and the refusal, if any
/// finding blocks.
pub fn preflight(
    findings: Vec<preflight::Finding>,
    restoring: Option<super::Restoring>,
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
pub fn install_failed(e: &ApplyError, put_back: Result<bool, &(dyn Error + 'static)>) -> Ending {
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
            "{e}; putting the previous unit back failed too: {}",
            error_chain(e2)
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
pub fn cancelled_before_restart(
    interrupted: &str,
    put_back: Result<bool, &(dyn Error + 'static)>,
) -> Ending {
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
            "{detail}; putting the previous unit back failed: {}",
            error_chain(e)
        )),
    }
}

/// A drain that did not see the server idle, with `drain.on_timeout: refuse` (`e`: what the
/// drain saw). It ran before the install, so nothing changed.
pub fn drain_refused(e: &ApplyError) -> Ending {
    Ending::failed(
        Outcome::Error,
        format!("{e}; nothing was changed on the host"),
        e.kind(),
    )
}

/// A signal (`interrupted`) stopped the drain (`drained`: its summary); nothing changed.
pub fn drain_interrupted(interrupted: &str, drained: &str) -> Ending {
    Ending::failed(
        Outcome::NotStarted,
        format!("not started: {interrupted} during the drain ({drained}); nothing was changed on the host"),
        ApplyErrorKind::Interrupted,
    )
}

pub fn converged(v: &Verification) -> Ending {
    Ending::ok(
        Outcome::Converged,
        format!("restarted and verified: {}", summary(v)),
    )
}

/// A live change the server took and passed verification: never restarted.
pub fn converged_live(told: &str, v: &Verification) -> Ending {
    Ending::ok(
        Outcome::Converged,
        format!(
            "applied live, no restart ({told}) and verified: {}",
            summary(v)
        ),
    )
}

/// A live change failed (`failed`) and the previous weights or values went back live: the
/// server was never restarted, and the previous unit file is back.
pub fn lived_back(failed: &str, cause: ApplyErrorKind, told: &str, v: &Verification) -> Ending {
    Ending::failed(
        Outcome::RolledBack,
        format!(
            "{failed}; put back live, no restart ({told}); the previous unit file is back, and the server passed verification: {}",
            summary(v)
        ),
        cause,
    )
}

/// What a converged unit's detail adds for its benchmark stage.
pub fn benchmark_passed(detail: &str) -> String {
    format!("; benchmark: {detail}")
}

fn summary(v: &Verification) -> String {
    // A server verified as it runs (a live change) had no load to time.
    let load = v
        .load_seconds
        .map_or(String::new(), |s| format!("ready after {s:.1}s "));
    let stages: Vec<&str> = v.stages.iter().map(|s| s.name.name()).collect();
    format!(
        "{load}({} passed) memory {}",
        stages.join(", "),
        v.sparkline()
    )
}

/// Appended to what failed when the host was seen shutting down during the rollback.
pub const SHUTTING_DOWN: &str = "; the host was shutting down";
const LOST: &str = "the connection to the host was lost";

/// A note on how long the old server took to stop (systemd's own timestamps: from leaving
/// `active` to `inactive`): with `KillMode=mixed` that is SGLang finishing its requests in flight.
pub fn stopped_in(seconds: f64) -> String {
    format!("the old server stopped in {seconds:.1}s (SGLang finished the requests in flight)")
}

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
        Err(e @ (NotRestored::Restore(_) | NotRestored::NotDone)) => {
            failed_too(format!("{failed}; rollback failed: {e}"))
        }
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

/// The host's guard settled the unit before this run could roll it back (its lease ran out while
/// the link was cut): what it did is the ending.
/// What failed when verification passed but the host's guard had acted before this run could
/// disarm it: its lease ran out while the host was out of reach.
pub const CONFIRMED_TOO_LATE: &str = "verification passed, but this run lost the host before it could confirm the unit, and the host's guard acted first";

pub fn guard_acted_first(failed: &str, cause: ApplyErrorKind, guard: &Settled) -> Ending {
    let did = guard.summary().unwrap_or_else(|| guard.detail.clone());
    match guard.state {
        GuardState::RolledBack => {
            Ending::failed(Outcome::RolledBack, format!("{failed}; {did}"), cause)
        }
        _ => Ending::rollback_failed(format!("host needs attention: {failed}; {did}")),
    }
}

/// The host went away during the rollback and did not come back within `window_secs`.
pub fn host_lost(failed: &str, window_secs: u64, error: &str, left_behind: &str) -> Ending {
    Ending::rollback_failed(format!(
        "host needs attention: {failed}; {LOST} and it did not come back within {window_secs}s ({error}); {left_behind}"
    ))
}

/// What a run that lost its host mid-apply leaves there, and what the next apply does about it.
/// `new`: there was no previous unit; `saved`: where this run saved the previous one, once it had;
/// `tried`: a rollback had begun, so the previous unit may be back on disk already.
pub fn left_behind(unit: &str, new: bool, saved: Option<&str>, tried: bool) -> String {
    let dir = state::unit_dir(unit);
    let installed = if tried {
        "the new unit is installed, or the previous one if the rollback got that far"
    } else {
        "the new unit is installed"
    };
    let next = match (new, saved) {
        (true, _) => "it was new; the next apply will finish it or remove it".to_string(),
        (false, Some(saved)) => {
            format!("the previous is kept as generation {saved}; the next apply will finish or roll back")
        }
        (false, None) => format!(
            "the previous is kept as the newest generation in {dir}/generations; the next apply will finish or roll back"
        ),
    };
    format!("{installed}; {next}; the lock {dir}/lock stays (an apply from this machine breaks it; from elsewhere, use --break-stale-lock)")
}

/// What undid a unit after it converged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UndoneBy {
    /// `--rollback-all`, because the rollout stopped elsewhere.
    RollbackAll,
    /// The canary's bake on live traffic (`verify.bake`), which found it worse.
    Bake,
}

impl UndoneBy {
    pub fn name(self) -> &'static str {
        match self {
            UndoneBy::RollbackAll => "--rollback-all",
            UndoneBy::Bake => "the bake",
        }
    }

    fn kind(self) -> ApplyErrorKind {
        match self {
            UndoneBy::RollbackAll => ApplyErrorKind::RolloutStopped,
            UndoneBy::Bake => ApplyErrorKind::BakeFailed,
        }
    }
}

/// A unit this rollout had changed (`before`: its detail then), after `by` put it back or failed
/// to (`result`), for `why`.
pub fn undone(
    before: &str,
    why: &str,
    by: UndoneBy,
    result: Result<&Restored, &(dyn Error + 'static)>,
) -> Ending {
    let by_name = by.name();
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
                format!("{before}; {why}, and {by_name} {done}"),
                by.kind(),
            )
        }
        Err(e) => Ending::rollback_failed(format!(
            "{before}; {why}, and {by_name} failed: {}",
            error_chain(e)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::error::InstallFailure;
    use crate::apply::testing::{observed, target};
    use crate::preflight::{Finding, Severity};
    use crate::verify::{Failure, Stage, StageResult};

    fn record_error() -> state::RecordError {
        state::RecordError {
            host: "gpu-a".into(),
            path: "/var/lib/reconcile/s.service/current.json".into(),
            problem: state::RecordProblem::Unparsable("EOF".into()),
        }
    }

    /// A command on gpu-a that failed, saying `stderr`.
    fn host_failed(stderr: &str) -> Arc<crate::remote::RemoteError> {
        Arc::new(crate::remote::RemoteError::Failed {
            host: "gpu-a".into(),
            command: "mv".into(),
            status: 1,
            stderr: stderr.into(),
        })
    }

    /// The install `s` says to do.
    fn installs(s: Start) -> Install {
        match s {
            Start::Install(i) => i,
            other => panic!("not an install: {other:?}"),
        }
    }

    #[test]
    fn a_changed_unit_is_installed_against_what_the_host_has() {
        let running = observed(Some("old"), "activating");
        assert_eq!(
            installs(start(Verdict::Restart, &running, None, None)),
            (Install {
                verdict: Verdict::Restart,
                previous: Previous::Observed,
                was_running: true,
                note: None,
                confirm: false,
            })
        );
        let Start::Install(i) = start(Verdict::Install, &observed(None, "inactive"), None, None)
        else {
            panic!("installs");
        };
        assert_eq!((i.verdict, i.was_running), (Verdict::Install, false));
    }

    #[test]
    fn no_change_is_unchanged_unless_the_last_apply_did_not_finish() {
        let o = observed(Some("u"), "failed");
        assert!(matches!(
            start(Verdict::NoChange, &o, Some(Ok(false)), None),
            Start::Unchanged
        ));
        assert_eq!(
            installs(start(Verdict::NoChange, &o, Some(Ok(true)), None)),
            (Install {
                verdict: Verdict::Restart,
                previous: Previous::NewestGeneration,
                was_running: true,
                note: Some("the last apply did not finish (no deployment record for this unit); restarting and verifying it".into()),
                confirm: false,
            })
        );
        // The host's guard kept this very unit, healthy: it is confirmed as it runs.
        let running = observed(Some("u"), "active");
        let kept = Settled::parse(&format!(
            r#"{{"state":"unconfirmed","new_sha256":"{}","detail":"healthy","settled_at":"t1","armed_by":"me","armed_at":"t0"}}"#,
            state::sha256("u")
        ))
        .unwrap();
        let Start::Install(i) = start(Verdict::NoChange, &running, Some(Ok(true)), Some(&kept))
        else {
            panic!("confirmed");
        };
        assert!(
            i.confirm && i.previous == Previous::NewestGeneration,
            "{i:?}"
        );
        // Not once it stopped running, nor for another unit than the one it kept.
        let stopped = observed(Some("u"), "failed");
        let other = observed(Some("v"), "active");
        for o in [&stopped, &other] {
            let Start::Install(i) = start(Verdict::NoChange, o, Some(Ok(true)), Some(&kept)) else {
                panic!("restarted");
            };
            assert!(!i.confirm, "{i:?}");
        }
        // A dead run's guard still armed: its start seen, confirmed as it runs; not seen (the
        // run may have died before its restart), restarted.
        let armed = |started: bool| {
            Settled::parse(&format!(
                r#"{{"state":"armed","new_sha256":"{}","armed_by":"ci@box pid 7","armed_at":"t0","new_started":{started}}}"#,
                state::sha256("u")
            ))
            .unwrap()
        };
        let Start::Install(i) = start(
            Verdict::NoChange,
            &running,
            Some(Ok(true)),
            Some(&armed(true)),
        ) else {
            panic!("confirmed");
        };
        assert!(i.confirm, "{i:?}");
        assert_eq!(
            i.note.as_deref(),
            Some("the apply by ci@box pid 7 at t0 died after its restart; the host's guard still watches the new unit; verifying it as it runs, without a restart, to confirm it")
        );
        let Start::Install(i) = start(
            Verdict::NoChange,
            &running,
            Some(Ok(true)),
            Some(&armed(false)),
        ) else {
            panic!("restarted");
        };
        assert!(!i.confirm, "{i:?}");
        // A live change its guard let stand healthy: whether the server took it is not known (the run
        // may have died before telling it), so it is restarted, saying why.
        let live = Settled::parse(&format!(
            r#"{{"state":"unconfirmed","new_sha256":"{}","change":"in_place","detail":"healthy","settled_at":"t1","armed_by":"me","armed_at":"t0"}}"#,
            state::sha256("u")
        ))
        .unwrap();
        let Start::Install(i) = start(Verdict::NoChange, &running, Some(Ok(true)), Some(&live))
        else {
            panic!("restarted");
        };
        assert!(!i.confirm, "{i:?}");
        assert!(
            i.note.as_deref().is_some_and(|n| n.ends_with(
                "; whether the server took the live change is not known: restarting and verifying it"
            )),
            "{i:?}"
        );
        let Start::Refuse(e) = start(Verdict::NoChange, &o, Some(Err(record_error())), None) else {
            panic!("refused");
        };
        assert_eq!(e.kind(), ApplyErrorKind::RecordUnreadable);
        assert_eq!(e.to_string(), "nothing was changed: the deployment record /var/lib/reconcile/s.service/current.json on gpu-a does not parse: EOF");
    }

    #[test]
    fn a_plan_file_unit_is_stale_when_the_host_changed() {
        let mut t = target();
        t.expected = Some(plan_file::PlannedState {
            desired_sha256: state::sha256(&t.desired.text),
            current_sha256: Some(state::sha256("old")),
            sglang_version: None,
        });
        assert!(stale_plan(&t, &observed(Some("old"), "active")).is_none());
        let e = stale_plan(&t, &observed(None, "inactive")).expect("stale");
        assert_eq!(e.kind(), ApplyErrorKind::PlanStale);
        assert!(
            e.to_string().starts_with(
                "nothing was changed: stale plan: the unit on gpu-a changed since the plan ("
            ),
            "{e}"
        );
        t.expected = None;
        assert!(stale_plan(&t, &observed(None, "inactive")).is_none());
    }

    fn finding(severity: Severity, check: &'static str, message: &str) -> Finding {
        Finding {
            severity,
            check,
            message: message.into(),
        }
    }

    #[test]
    fn errors_block_and_warnings_are_notes_except_manifest_checks_when_restoring() {
        let findings = || {
            vec![
                finding(Severity::Error, "port", "port 30000 is taken"),
                finding(Severity::Error, "sglang-version", "0.5.1 installed"),
                finding(Severity::Warning, "gpus", "no nvidia-smi"),
            ]
        };
        let (notes, refusal) = preflight(findings(), None);
        assert_eq!(notes, ["preflight: no nvidia-smi"]);
        assert_eq!(
            refusal.unwrap().to_string(),
            "preflight failed, nothing was changed: port 30000 is taken; 0.5.1 installed"
        );
        let (notes, refusal) = preflight(findings(), Some(crate::apply::Restoring::Deployment(3)));
        assert_eq!(
            notes,
            ["preflight: 0.5.1 installed", "preflight: no nvidia-smi"]
        );
        let refusal = refusal.unwrap();
        assert_eq!(refusal.kind(), ApplyErrorKind::PreflightFailed);
        assert_eq!(
            refusal.to_string(),
            "preflight failed, nothing was changed: port 30000 is taken"
        );
        assert!(!blocks(
            &finding(Severity::Error, "flags", "x"),
            Some(crate::apply::Restoring::Unrecorded)
        ));
        assert!(blocks(&finding(Severity::Error, "flags", "x"), None));
        let (notes, refusal) = preflight(Vec::new(), None);
        assert!(notes.is_empty() && refusal.is_none());
    }

    #[test]
    fn a_failed_install_says_what_was_put_back() {
        let e = ApplyError::InstallFailed(InstallFailure::Host(host_failed("disk full")));
        let end = install_failed(&e, Ok(false));
        assert_eq!(
            (end.outcome, end.detail.as_str(), end.error),
            (
                Outcome::Error,
                "installing failed: gpu-a: `mv` exited with 1: disk full; nothing changed on the host",
                Some(ApplyErrorKind::InstallFailed)
            )
        );
        assert_eq!(
            install_failed(&e, Ok(true)).detail,
            "installing failed: gpu-a: `mv` exited with 1: disk full; the previous unit is back in place (the server was not restarted)"
        );
        let gone = std::io::Error::other("gone");
        let end = install_failed(&e, Err(&gone));
        assert_eq!(
            (end.outcome, end.detail.as_str(), end.error),
            (
                Outcome::RollbackFailed,
                "installing failed: gpu-a: `mv` exited with 1: disk full; putting the previous unit back failed too: gone",
                Some(ApplyErrorKind::RollbackFailed)
            )
        );
    }

    #[test]
    fn reload_only_and_a_cancel_before_the_restart() {
        assert_eq!(
            reloaded(),
            Ending {
                outcome: Outcome::Reloaded,
                detail: "unit replaced and daemon-reloaded; the server kept running".into(),
                error: None
            }
        );
        let i = "interrupted (SIGINT)";
        for put_back in [Ok(true), Ok(false)] {
            let end = cancelled_before_restart(i, put_back);
            assert_eq!(
                (end.outcome, end.detail.as_str(), end.error),
                (
                    Outcome::NotStarted,
                    "not started: interrupted (SIGINT) before the restart; the previous unit is back in place and the server was not restarted",
                    Some(ApplyErrorKind::Interrupted)
                )
            );
        }
        let gone = std::io::Error::other("gone");
        let end = cancelled_before_restart(i, Err(&gone));
        assert_eq!(
            (end.outcome, end.detail.as_str()),
            (
                Outcome::RollbackFailed,
                "not started: interrupted (SIGINT) before the restart; putting the previous unit back failed: gone"
            )
        );
    }

    fn verification(load: Option<f64>) -> Verification {
        let stage = |name| StageResult {
            name,
            passed: true,
            seconds: 1.0,
            at_unix: 0.0,
            detail: String::new(),
        };
        Verification {
            stages: vec![stage(Stage::Readiness), stage(Stage::Smoke)],
            load_seconds: load,
            ..Verification::default()
        }
    }

    #[test]
    fn a_verified_restart_sums_up_its_stages() {
        let end = converged(&verification(Some(12.34)));
        assert_eq!(end.outcome, Outcome::Converged);
        assert_eq!(end.error, None);
        assert!(
            end.detail.starts_with(
                "restarted and verified: ready after 12.3s (readiness, smoke passed) memory "
            ),
            "{}",
            end.detail
        );
        assert!(converged(&verification(None))
            .detail
            .starts_with("restarted and verified: (readiness, smoke passed) memory "));
    }

    #[test]
    fn a_live_change_says_it_did_not_restart_whichever_way_it_went() {
        let v = verification(None);
        let told = "weights loaded from /models/b in 0.80s";
        let end = converged_live(told, &v);
        assert_eq!((end.outcome, end.error), (Outcome::Converged, None));
        assert!(end.detail.starts_with(
            "applied live, no restart (weights loaded from /models/b in 0.80s) and verified: (readiness, smoke passed)"
        ));
        let back = lived_back(
            "quality failed: KL 0.07",
            ApplyErrorKind::VerificationFailed,
            "weights loaded from /models/a in 0.70s",
            &v,
        );
        assert_eq!(back.outcome, Outcome::RolledBack);
        assert_eq!(back.error, Some(ApplyErrorKind::VerificationFailed));
        assert!(back.detail.starts_with("quality failed: KL 0.07; put back live, no restart (weights loaded from /models/a in 0.70s); the previous unit file is back"));
    }

    #[test]
    fn each_rollback_result_has_its_detail() {
        let f = "health failed: 503";
        let cause = ApplyErrorKind::VerificationFailed;
        let back = |r: Result<Restored, NotRestored>| rolled_back(f, cause, &r);
        let end = back(Ok(Restored::Verified(Box::new(verification(Some(3.0))))));
        assert_eq!(
            (end.outcome, end.detail.as_str(), end.error),
            (
                Outcome::RolledBack,
                "health failed: 503; the previous unit was restored and passed verification (ready after 3.0s)",
                Some(cause)
            )
        );
        assert_eq!(
            back(Ok(Restored::Verified(Box::new(verification(None))))).detail,
            "health failed: 503; the previous unit was restored and passed verification"
        );
        assert_eq!(
            back(Ok(Restored::Removed)).detail,
            "health failed: 503; the new unit was stopped, disabled and removed"
        );
        assert_eq!(
            back(Ok(Restored::LeftStopped)).detail,
            "health failed: 503; the previous unit was restored and left stopped, as it was"
        );
        let end = back(Err(NotRestored::NotDone));
        assert_eq!(
            (end.outcome, end.detail.as_str(), end.error),
            (
                Outcome::RollbackFailed,
                "health failed: 503; rollback failed: not restored",
                Some(ApplyErrorKind::RollbackFailed)
            )
        );
        let failure = Failure {
            stage: Stage::Smoke,
            reason: crate::verify::Reason::Judged("timed out".into()),
            verification: Box::default(),
        };
        assert_eq!(
            back(Err(NotRestored::Verify(failure))).detail,
            "health failed: 503; the restored previous unit failed too: smoke: timed out"
        );
        assert_eq!(
            format!("restart failed: x{SHUTTING_DOWN}{}", reconnected(4.25)),
            "restart failed: x; the host was shutting down; the connection to the host was lost, reconnected after 4.2s"
        );
    }

    #[test]
    fn a_lost_host_says_what_it_left_behind() {
        let dir = "/var/lib/reconcile/s.service";
        let lock = format!("the lock {dir}/lock stays (an apply from this machine breaks it; from elsewhere, use --break-stale-lock)");
        assert_eq!(
            left_behind("s.service", true, None, false),
            format!("the new unit is installed; it was new; the next apply will finish it or remove it; {lock}")
        );
        assert_eq!(
            left_behind("s.service", false, Some("/g/1.service"), true),
            format!("the new unit is installed, or the previous one if the rollback got that far; the previous is kept as generation /g/1.service; the next apply will finish or roll back; {lock}")
        );
        assert_eq!(
            left_behind("s.service", false, None, false),
            format!("the new unit is installed; the previous is kept as the newest generation in {dir}/generations; the next apply will finish or roll back; {lock}")
        );
        let end = host_lost("health failed: 503", 90, "cannot connect to gpu-a", "LEFT");
        assert_eq!(
            (end.outcome, end.detail.as_str(), end.error),
            (
                Outcome::RollbackFailed,
                "host needs attention: health failed: 503; the connection to the host was lost and it did not come back within 90s (cannot connect to gpu-a); LEFT",
                Some(ApplyErrorKind::RollbackFailed)
            )
        );
    }

    #[test]
    fn rollback_all_details() {
        let why = "the canary failed, so the rollout stopped";
        let done = |r: Restored| {
            undone(
                "restarted and verified: x",
                why,
                UndoneBy::RollbackAll,
                Ok(&r),
            )
        };
        let end = done(Restored::Verified(Box::default()));
        assert_eq!(
            (end.outcome, end.detail.as_str(), end.error),
            (
                Outcome::RolledBack,
                "restarted and verified: x; the canary failed, so the rollout stopped, and --rollback-all restored the previous unit, which passed verification",
                Some(ApplyErrorKind::RolloutStopped)
            )
        );
        assert!(done(Restored::Removed)
            .detail
            .ends_with("--rollback-all removed the new unit"));
        assert!(done(Restored::Reloaded)
            .detail
            .ends_with("--rollback-all restored the previous unit (daemon-reload only)"));
        let locked = std::io::Error::other("locked");
        let end = undone("d", why, UndoneBy::RollbackAll, Err(&locked));
        assert_eq!(
            (end.outcome, end.detail.as_str(), end.error),
            (
                Outcome::RollbackFailed,
                "d; the canary failed, so the rollout stopped, and --rollback-all failed: locked",
                Some(ApplyErrorKind::RollbackFailed)
            )
        );
        let failure = Failure {
            stage: Stage::Readiness,
            reason: crate::verify::Reason::Judged("503".into()),
            verification: Box::default(),
        };
        assert_eq!(
            NotRestored::Verify(failure).to_string(),
            "the restored unit failed readiness: 503"
        );
        let e = crate::remote::RemoteError::Failed {
            host: "gpu-a".into(),
            command: "mv".into(),
            status: 1,
            stderr: "e".into(),
        };
        assert_eq!(
            NotRestored::Restore(e).to_string(),
            "gpu-a: `mv` exited with 1: e"
        );
    }

    #[test]
    fn refusals_are_errors_and_interruptions_not_started() {
        let end = Ending::refused(&ApplyError::Unreachable(host_failed("cannot connect")));
        assert_eq!(
            (end.outcome, end.detail.as_str(), end.error),
            (
                Outcome::Error,
                "gpu-a: `mv` exited with 1: cannot connect",
                Some(ApplyErrorKind::Unreachable)
            )
        );
        let end = Ending::refused(&ApplyError::InterruptedBeforeHost);
        assert_eq!(
            (end.outcome, end.detail.as_str(), end.error),
            (
                Outcome::NotStarted,
                "interrupted before this host's turn",
                Some(ApplyErrorKind::Interrupted)
            )
        );
        let end = Ending::refused(&ApplyError::NotStarted("the canary failed".into()));
        assert_eq!(
            (end.outcome, end.detail.as_str()),
            (Outcome::NotStarted, "not started: the canary failed")
        );
    }
}
