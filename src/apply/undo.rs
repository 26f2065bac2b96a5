//! A unit this rollout converged, put back on the unit it had before: by `--rollback-all` when
//! the rollout stopped, or by the canary's bake when live traffic found it worse. Apart from the
//! rollout, which calls the bake, so that both reach it.

use super::decide::{self, UndoneBy};
use super::restore::{restore_and_verify, Restore, Restored, Then};
use super::verifier::Live;
use super::{state, ApplyOptions, Outcome, UnitReport};
use crate::manifest::VerifySpec;
use crate::remote::{error_chain, Host};

/// Says in `r`, a unit's report, what `by` undoing it for `why` came to (`restored`): its ending,
/// and the restored unit's verification.
pub(super) fn report(
    r: &mut UnitReport,
    why: &str,
    by: UndoneBy,
    restored: Result<Restored, String>,
) {
    let ending = decide::undone(&r.detail, why, by, restored.as_ref().map_err(Clone::clone));
    if let Ok(Restored::Verified(v)) = restored {
        r.rollback = Some(*v);
    }
    r.outcome = ending.outcome;
    r.detail = ending.detail;
    r.error = ending.error;
}

/// Under the unit's lock, restores what the unit was before this rollout (`by` undoes it): the
/// generation the install kept, or nothing for a unit that was new. A converged unit is restarted
/// and verified; a reload-only change is undone with a reload.
pub(super) async fn undo(
    host: &dyn Host,
    r: &UnitReport,
    spec: &VerifySpec,
    options: &ApplyOptions,
    by: UndoneBy,
) -> Result<Restored, String> {
    let unit = r.unit.clone();
    let was_new = r.verdict == Some(crate::plan::Verdict::Install);
    let previous = if was_new {
        None
    } else {
        state::newest_generation(host, &unit)
            .await
            .map_err(|e| error_chain(&e))?
    };
    let then = if r.outcome == Outcome::Converged {
        Then::Restart
    } else {
        Then::Reload
    };
    state::lock(host, &unit, &options.owner, options.lock)
        .await
        .map_err(|e| e.to_string())?;
    let restore = Restore {
        host,
        unit: &unit,
        previous: previous.as_deref(),
        then,
        spec,
        label: format!("{} {unit} ({})", r.host, by.name()),
        // What this run moved aside went with the apply that converged; the deployment before
        // it is what is restored.
        aside: None,
        beneath: false,
        disable: false,
        expect: None,
    };
    let verifier = Live {
        progress: options.progress.as_ref(),
    };
    let restored = restore_and_verify(restore, &verifier).await;
    let _ = state::unlock(host, &unit).await;
    restored.map_err(|e| decide::not_restored(&e))
}
