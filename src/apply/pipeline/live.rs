//! `Step::Live` and `Step::LiveBack`: a server of one told its change as it runs, and told the
//! previous one back should the change fail. What the server is told is `crate::apply::live`'s.

use std::sync::Arc;

use reconcile_core::live::held;
use reconcile_core::transaction::Went;
use tokio_util::sync::CancellationToken;

use super::confirm::guard_acted;
use super::{Carried, Cause, Rank};
use crate::apply::decide::{self, Ending};
use crate::apply::error::{ApplyError, LiveFailure};
use crate::apply::guard::{self, Armed};
use crate::apply::install;
use crate::apply::live::TellError;
use crate::apply::restore::put_back_file;
use crate::apply::verifier::Check;
use crate::remote::{error_chain, RemoteError};
use crate::systemd::Systemd as _;
use crate::verify::{Expect, Failure, Stage, Verification};

/// `Step::Live`: rank 0 told its change, under the guards' lease.
pub(super) async fn live(ranks: &mut [Rank<'_>], c: &mut Carried<'_>) -> Went {
    // Only under guards that still hold: one that kept the old server behind a cut link has
    // settled and would not see the change told after it (the model's live change found this).
    if let Err((_, why)) = super::guards_hold(ranks, &c.armed).await {
        let cause = Cause {
            rank: 0,
            stage: Stage::Live,
            error: ApplyError::LiveFailed(LiveFailure::NotTold(why)),
        };
        c.failed = Some((vec![cause], Vec::new()));
        return Went::Failed;
    }
    // The guard first hears that the server is being told: should this process die before the
    // server took the change whole, it restarts the previous unit rather than keep a server
    // that may serve part of it.
    for a in &c.armed {
        let _ = a.telling().await;
    }
    let guards: Vec<&Armed<'_>> = c.armed.iter().collect();
    match guard::leased_all(&guards, tell_live(&mut ranks[0])).await {
        Ok(()) => {
            // The guard hears it at once: a kept change it heard of is the server's (the next
            // apply confirms it as it runs); one it did not goes back around the server.
            for a in &c.armed {
                let _ = a.told().await;
            }
            Went::Passed
        }
        Err(e) => {
            let cause = Cause {
                rank: 0,
                stage: Stage::Live,
                error: ApplyError::LiveFailed(e),
            };
            c.failed = Some((vec![cause], Vec::new()));
            Went::Failed
        }
    }
}

/// `Step::LiveBack`: the failed live change undone live. `Failed` when it cannot be: the
/// previous unit is then restarted (`Step::RollBack`).
pub(super) async fn live_back(ranks: &mut [Rank<'_>], c: &mut Carried<'_>) -> Went {
    let (causes, _) = c.failed.as_ref().expect("a step said what failed");
    // A renewal first, whatever it answers: after a reboot it brings the guard's record into the
    // new boot before the previous file goes back (see `put_back`).
    let _ = super::guards_hold(ranks, &c.armed).await;
    // Told back from here: should this process die before it is done, the guard restarts the
    // previous unit.
    for a in &c.armed {
        let _ = a.telling().await;
    }
    let guards: Vec<&Armed<'_>> = c.armed.iter().collect();
    match guard::leased_all(&guards, undo_live(&mut ranks[0])).await {
        Ok((told, v)) => {
            c.endings = Some(vec![
                lived_back(&mut ranks[0], &c.armed, &causes[0], &told, v).await,
            ]);
            Went::Passed
        }
        Err(e) => {
            ranks[0].report.report.notes.push(format!(
                "the live change could not be put back live ({e}): the previous unit is restarted"
            ));
            Went::Failed
        }
    }
}

/// Rank 0, a server of one, told its live change; its invocation (unchanged: no restart) kept
/// for verification and the journal. `Err`: why the server did not take it.
async fn tell_live(r: &mut Rank<'_>) -> Result<(), LiveFailure> {
    let (host, t) = (r.job.host, r.job.t);
    let change = r.live.as_ref().ok_or(LiveFailure::NotPlanned)?;
    let endpoint = Expect::from_unit(&t.desired.model).endpoint;
    let limit = t.verify.load_deadline;
    r.told = crate::apply::live::tell(host, &endpoint, t.verify.url.as_deref(), change, limit)
        .await
        .map_err(|e| LiveFailure::Tell(Arc::new(e)))?;
    r.report
        .report
        .notes
        .push(format!("applied live, no restart: {}", r.told));
    let state = host
        .unit_state(&t.desired.unit)
        .await
        .map_err(|e| LiveFailure::Host(Arc::new(e)))?;
    r.invocation = state.invocation_id;
    // The process told, for the record: `status` believes the change only of that process.
    match crate::apply::live::process_argv(host, state.main_pid).await {
        Ok(argv) => r.told_live = Some(held::record(change, &argv)),
        Err(why) => r.report.report.notes.push(format!(
            "the command line of the server told could not be read ({why}): `status` will take it for a server not restarted"
        )),
    }
    Ok(())
}

/// A live change that failed, undone live on rank 0: the previous weights and values told back by
/// name (a failed weight update is no proof the old weights serve: SGLang's own rollback reads
/// the new path), the previous unit file put back, and the server verified as it runs against
/// the previous unit. What the server did, and what verification saw; `Err`: why not, and the
/// previous unit is restarted instead.
async fn undo_live(r: &mut Rank<'_>) -> Result<(String, Verification), LiveBackError> {
    let (host, t) = (r.job.host, r.job.t);
    let back = r.live.as_ref().ok_or(LiveBackError::NotPlanned)?.reverse();
    let expect = r
        .fallback
        .previous_expect()
        .ok_or(LiveBackError::PreviousUnknown)?;
    let limit = t.verify.load_deadline;
    let url = t.verify.url.as_deref();
    let told = crate::apply::live::tell(host, &expect.endpoint, url, &back, limit).await?;
    let (previous, aside) = (
        r.fallback.previous.as_deref(),
        r.fallback.unit_files.aside.as_ref(),
    );
    put_back_file(host, &t.desired.unit, previous, aside)
        .await
        .map_err(LiveBackError::File)?;
    let never = CancellationToken::new();
    let check = Check {
        unit: &t.desired.unit,
        spec: &r.spec,
        expect,
        label: format!("{} {} (put back live)", t.host, t.desired.unit),
        cancel: &never,
        history: None,
    };
    let mut v = r
        .job
        .verifier
        .verify(host, check)
        .await
        .map_err(|f| LiveBackError::Unverified(Box::new(f)))?;
    v.load_seconds = None;
    Ok((told, v))
}

/// Why a failed live change could not be undone live (the previous unit is restarted instead).
#[derive(Debug, thiserror::Error)]
enum LiveBackError {
    /// No live change was planned to undo.
    #[error("no live change was planned")]
    NotPlanned,
    /// What the server ran before is not known, so there is nothing to tell it back.
    #[error("the previous unit is not known")]
    PreviousUnknown,
    /// The server did not take the previous weights and values back.
    #[error(transparent)]
    Tell(#[from] TellError),
    /// The previous unit file could not be put back.
    #[error("{}", error_chain(.0))]
    File(#[source] RemoteError),
    /// The server, told back, failed a stage of its verification against the previous unit.
    #[error("the server failed its {} after: {}", .0.stage, .0.reason)]
    Unverified(Box<Failure>),
}

/// The ending of a live change undone live: the guard disarmed (or its own rollback reported, had
/// it acted first), the failed stage and the verification after it in the report.
async fn lived_back(
    r: &mut Rank<'_>,
    armed: &[Armed<'_>],
    cause: &Cause,
    told: &str,
    v: Verification,
) -> Ending {
    let acted = match armed.first() {
        Some(g) => install::disarm(g, &mut r.report.report).await,
        None => None,
    };
    r.report.report.failed_stage = Some(cause.stage);
    if let Some(ending) = guard_acted(r, acted).await {
        return ending;
    }
    let ending = decide::lived_back(&cause.error.to_string(), cause.error.kind(), told, &v);
    r.report.report.rollback = Some(v);
    ending
}
