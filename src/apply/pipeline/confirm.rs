//! `Step::Confirm`: every rank passed, so every guard is disarmed and every deployment recorded.
//! `guard_acted`, a guard that rolled back before its disarm, is `Step::LiveBack`'s too.

use reconcile_core::guard::GuardState;
use reconcile_core::live::held;
use reconcile_core::record::LiveRecord;
use reconcile_core::transaction::{Kind, Went};

use super::{Carried, Rank};
use crate::apply::decide::{self, Ending};
use crate::apply::error::ApplyErrorKind;
use crate::apply::guard::{self, Armed};
use crate::apply::install;
use crate::apply::Outcome;
use crate::remote::error_chain;
use crate::systemd::Systemd as _;
use crate::unit::parse_unit;
use crate::verify::Verification;

/// `Step::Confirm`: every rank's ending, from its verification. `Failed` when a rank's server
/// was started again since it was verified (its host rebooted): nothing is confirmed, and every
/// guard stays armed to judge what runs now.
pub(super) async fn confirm(ranks: &mut [Rank<'_>], kind: Kind, c: &mut Carried<'_>) -> Went {
    if let Some(ending) = started_again(ranks).await {
        // Started again by the guard's own rollback (its lease ran out behind a cut link after
        // verification passed): reported as that rollback, not as a start to be judged.
        let mut endings = Vec::new();
        for r in ranks.iter() {
            // One read: what the guard did, and its own words for it.
            let guard = guard::read(r.job.host, &r.job.t.desired.unit)
                .await
                .ok()
                .flatten();
            let acted = guard.as_ref().and_then(rolled_back_first);
            endings.push(acted.unwrap_or_else(|| ending.clone()));
        }
        c.endings = Some(endings);
        return Went::Failed;
    }
    let verified = std::mem::take(&mut c.verified);
    c.endings = Some(confirm_all(ranks, &c.armed, verified, c.keep.take(), kind).await);
    Went::Passed
}

/// The ending when a rank runs another invocation than the one verified (or cannot be read):
/// a start nobody verified, which the guard, still armed, judges. `None`: every rank runs what
/// was verified.
async fn started_again(ranks: &[Rank<'_>]) -> Option<Ending> {
    for r in ranks {
        let now = r.job.host.unit_state(&r.job.t.desired.unit).await;
        let why = match now {
            Ok(state) if state.invocation_id == r.invocation => continue,
            Ok(_) => format!(
                "{} started it again after its verification (a reboot?)",
                r.job.t.host
            ),
            Err(e) => format!(
                "{} could not be read before the confirm: {}",
                r.job.t.host,
                error_chain(&e)
            ),
        };
        return Some(Ending::rollback_failed(format!(
            "host needs attention: verification passed, but {why}; nothing was recorded, and the host's guard, still armed, judges what runs now (`status` says what it decided)"
        )));
    }
    None
}

/// Every rank passed: its guard disarmed and its deployment recorded; rank 0 keeps the quality
/// gate's new reference.
async fn confirm_all(
    ranks: &mut [Rank<'_>],
    armed: &[Armed<'_>],
    verified: Vec<Verification>,
    keep: Option<reconcile_core::quality::Reference>,
    kind: Kind,
) -> Vec<Ending> {
    let mut acted = Vec::new();
    for (i, g) in armed.iter().enumerate() {
        acted.push(install::disarm(g, &mut ranks[i].report.report).await);
    }
    let n = ranks.len();
    let mut endings = Vec::new();
    for (i, (r, v)) in ranks.iter_mut().zip(verified).enumerate() {
        // The guard rolled the unit back (its lease ran out while this run could not reach the
        // host, say during the disarm itself): the host runs the previous unit, whatever
        // verification saw. Reported as the guard's rollback, and no deployment recorded.
        if let Some(ending) = guard_acted(r, acted.get(i).copied().flatten()).await {
            endings.push(ending);
            r.report.report.verification = Some(v);
            continue;
        }
        let mut ending = match kind {
            Kind::Live => decide::converged_live(&r.told, &v),
            _ => decide::converged(&v),
        };
        if i == 0 {
            if let Some(b) = &r.report.report.benchmark {
                ending.detail.push_str(&decide::benchmark_passed(&b.detail));
            }
            if let Some(q) = &r.report.report.quality {
                ending.detail.push_str(&format!("; quality: {}", q.detail));
            }
            if let Some(reference) = &keep {
                r.report
                    .report
                    .notes
                    .extend(reconcile_core::quality::oversize_note(reference));
                // The converged server's answers are what the next change is compared with.
                if let Err(e) =
                    crate::quality::keep_reference(r.job.host, &r.job.t.desired.unit, reference)
                        .await
                {
                    r.report.report.notes.push(format!(
                        "quality: the new reference could not be kept: {}",
                        error_chain(&e)
                    ));
                }
            }
        }
        if n > 1 {
            ending
                .detail
                .push_str(&format!(" (rank {i} of {n}; the group restarted together)"));
        }
        let live = match kind {
            Kind::Live => r.told_live.take(),
            Kind::Confirm => stood_live(r).await,
            _ => None,
        };
        install::record(
            &r.job,
            Outcome::Converged,
            Some(&v),
            live,
            &mut r.report.report,
        )
        .await;
        keep_pinned(r).await;
        r.report.report.verification = Some(v);
        endings.push(ending);
    }
    endings
}

/// A confirmed rank's pinned revision marked used, and the revisions `keep` no longer keeps
/// removed (the plan said which). Only now: until the confirm, the previous revision is what a
/// rollback starts. A failure here is a note: the server runs what was verified.
async fn keep_pinned(r: &mut Rank<'_>) {
    let (host, t) = (r.job.host, r.job.t);
    let Some(spec) = &t.manifest.sglang.pinned else {
        return;
    };
    let note = match crate::pinned::confirm(host, &t.manifest.sglang.python, spec).await {
        Ok(removed) if removed.is_empty() => return,
        Ok(removed) => format!(
            "weights: removed {} older revision{} (keep: {}): {}",
            removed.len(),
            if removed.len() == 1 { "" } else { "s" },
            spec.keep,
            removed.join(", ")
        ),
        Err(e) => format!(
            "weights: the older revisions could not be removed: {}",
            error_chain(&e)
        ),
    };
    r.report.report.notes.push(note);
}

/// A unit the host's guard let stand and confirmed as it runs: when its server runs another command
/// line than the unit's (a live change the dead apply told, which its guard heard taken), the
/// record's account of what the server must hold for it, for `status` to read back. `None`: it
/// runs the unit's own command line (a kept restart), or what it runs is not known.
async fn stood_live(r: &mut Rank<'_>) -> Option<LiveRecord> {
    let (host, t) = (r.job.host, r.job.t);
    let pid = host.unit_state(&t.desired.unit).await.ok()?.main_pid;
    let argv = match crate::apply::live::process_argv(host, pid).await {
        Ok(argv) => argv,
        Err(why) => {
            r.report.report.notes.push(format!(
                "the server's command line could not be read ({why}): `status` will take it for a server not restarted"
            ));
            return None;
        }
    };
    let unit = parse_unit(&t.desired.text);
    if held::as_run(&argv, &unit.exec_start) == unit.exec_start.as_slice() {
        return None;
    }
    let version = &t.desired.sglang_version;
    let change = held::must_hold(&argv, &unit, crate::plan::parser(&t.desired), version).ok()?;
    Some(held::record(&change, &argv))
}

/// The ending of a rank whose guard rolled it back before this run could disarm it (`acted`, what
/// the disarm found the guard had done): the host runs the previous unit, whatever verification
/// saw. Reported as the guard's rollback, and no deployment recorded. `None`: the guard did not.
pub(super) async fn guard_acted(r: &Rank<'_>, acted: Option<GuardState>) -> Option<Ending> {
    if !matches!(
        acted,
        Some(GuardState::RolledBack | GuardState::RollbackFailed)
    ) {
        return None;
    }
    let settled = guard::read(r.job.host, &r.job.t.desired.unit)
        .await
        .ok()
        .flatten();
    Some(match settled {
        Some(settled) => acted_first(&settled),
        None => Ending::rollback_failed(format!(
            "host needs attention: {}; its record could not be read",
            decide::CONFIRMED_TOO_LATE
        )),
    })
}

/// The ending of a rank whose guard, as read, rolled it back first; `None` when it did not.
fn rolled_back_first(guard: &reconcile_core::guard::Settled) -> Option<Ending> {
    matches!(
        guard.state,
        GuardState::RolledBack | GuardState::RollbackFailed
    )
    .then(|| acted_first(guard))
}

/// What a confirm says of a rank whose guard acted before it: verified, but the guard's.
fn acted_first(guard: &reconcile_core::guard::Settled) -> Ending {
    decide::guard_acted_first(
        decide::CONFIRMED_TOO_LATE,
        ApplyErrorKind::Unreachable,
        guard,
    )
}
