//! `Step::Arm`: what the write replaces saved, the benchmark's reference read, then every rank's
//! guard armed on its host, before the new file is written and before any server stops. Also
//! `learn_deadlines`, which the driver calls as the step begins.

use std::sync::Arc;

use futures::future::join_all;
use reconcile_core::guard::Change;
use reconcile_core::transaction::{Kind, Went};

use super::gates::benchmark_before;
use super::put_back::PutBack;
use super::write::save_previous;
use super::{Carried, Rank};
use crate::apply::decide::{self, Ending};
use crate::apply::error::{ApplyError, InstallFailure};
use crate::apply::guard::{self, Armed};
use crate::apply::install;
use crate::systemd::Systemd as _;

/// Every rank's verification settings, learned from its past loads where the manifest left them
/// (`reconcile_core::learned`): the deadlines its guard and its verification judge by, so read
/// before the guard is armed.
pub(super) async fn learn_deadlines(ranks: &mut [Rank<'_>]) {
    for r in ranks.iter_mut() {
        r.history = install::load_history(&r.job, &mut r.report.report).await;
        let (spec, notes) =
            reconcile_core::learned::learned_spec(&r.job.t.verify, r.history.as_ref());
        r.spec = spec;
        r.learned_notes = notes;
    }
}

/// `Step::Arm`, once the deadlines are learned. A write that cannot keep what it replaces, or a
/// signal, stops here with nothing written; a unit let stand unconfirmed whose guard cannot be armed
/// keeps running untouched.
pub(super) async fn arm<'a>(ranks: &mut [Rank<'a>], kind: Kind, c: &mut Carried<'a>) -> Went {
    let options = ranks[0].job.options;
    // What the write replaces is saved before the guard that restores it is armed.
    let kept = match kind {
        Kind::Confirm => Ok(()),
        _ => save_previous(ranks).await,
    };
    if let Err((rank, error)) = kept {
        c.put_back = Some(PutBack::Write { rank, error });
        return Went::Failed;
    }
    if kind != Kind::Confirm && options.cancel.is_cancelled() {
        // Nothing written yet: the servers are left as they were.
        c.put_back = Some(PutBack::Cancelled);
        return Went::Stopped;
    }
    c.before = benchmark_before(&ranks[0]).await;
    match arm_guards(ranks, kind).await {
        Ok(armed) => {
            c.armed = armed;
            Went::Passed
        }
        // A unit let stand unconfirmed was not touched: it keeps running.
        Err((_, error)) if kind == Kind::Confirm => {
            let ending = |_: &Rank<'_>| match &error {
                ApplyError::ObserveFailed(_) => Ending::refused(&error),
                _ => decide::install_failed(&error, Ok(false)),
            };
            c.endings = Some(ranks.iter().map(ending).collect());
            Went::Failed
        }
        Err((_, error)) => {
            c.put_back = Some(PutBack::Arm { error });
            Went::Failed
        }
    }
}

/// Every rank's guard armed before any server stops: should this process die, each rank's guard
/// judges its own rank (a follower answers `/health` on its dummy port once its group loaded).
/// A unit let stand unconfirmed is then read as it runs. `Err` names the rank that failed; guards
/// armed by then are stood down.
async fn arm_guards<'a>(
    ranks: &mut [Rank<'a>],
    kind: Kind,
) -> Result<Vec<Armed<'a>>, (usize, ApplyError)> {
    let n = ranks.len();
    // A live change and a unit being confirmed are judged as they run: no start follows.
    let change = match kind {
        Kind::Restart => Change::Restart,
        _ => Change::InPlace,
    };
    let armed = join_all(ranks.iter().map(|r| {
        let replaces = r.observed.unit_text.as_deref() != Some(&r.job.t.desired.text);
        let back = r.fallback.going_back(replaces, kind == Kind::Confirm);
        guard::arm(&r.job, back, &r.spec, change)
    }))
    .await;
    let mut failed = None;
    let mut held = Vec::new();
    for (i, a) in armed.into_iter().enumerate() {
        match a {
            Ok(a) => held.push(a),
            Err(e) => {
                failed.get_or_insert((i, Arc::new(e)));
            }
        }
    }
    let armed = held;
    if let Some((i, source)) = failed {
        for a in &armed {
            let _ = a.disarm().await;
        }
        let e = if n == 1 {
            InstallFailure::NotArmed(source)
        } else {
            InstallFailure::RankNotArmed {
                rank: i,
                host: ranks[i].job.t.host.clone(),
                source,
            }
        };
        return Err((i, ApplyError::InstallFailed(e)));
    }
    if kind == Kind::Confirm {
        // Already running, let stand by the guard: verified as it runs. A unit that cannot be read is
        // no reason to roll back a server that may be healthy: the guard, armed, judges it.
        for (i, r) in ranks.iter_mut().enumerate() {
            match r.job.host.unit_state(&r.job.t.desired.unit).await {
                Ok(state) => r.invocation = state.invocation_id,
                Err(e) => {
                    for a in &armed {
                        let _ = a.disarm().await;
                    }
                    return Err((i, ApplyError::ObserveFailed(Arc::new(e))));
                }
            }
        }
    }
    Ok(armed)
}
