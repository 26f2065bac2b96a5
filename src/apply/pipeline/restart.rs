//! `Step::Restart`: every rank stopped and started in SGLang's order, under the guards' lease.
//! The group's stop (`stop_ranks`) is `Step::RollBack`'s too.

use std::sync::Arc;

use futures::future::join_all;
use reconcile_core::group::{start_order, stop_steps, StopStep};
use reconcile_core::transaction::Went;

use super::{Carried, Cause, Rank};
use crate::apply::decide;
use crate::apply::error::{ApplyError, RestartFailure};
use crate::apply::guard::{self, Armed};
use crate::plan::Verdict;
use crate::remote::{error_chain, Host, RemoteError};
use crate::systemd::Systemd as _;
use crate::verify::Stage;

/// `Step::Restart`, under the lease: the old server's stop may take its TimeoutStopSec, longer
/// than the margin, and the guard must not take a dying controller's stop for its own.
pub(super) async fn restart(ranks: &mut [Rank<'_>], c: &mut Carried<'_>) -> Went {
    // Only under guards that still hold: one that acted behind a cut link has put the previous
    // file back and watches no more, and a restart now would cost a load for nothing.
    if let Err((rank, why)) = super::guards_hold(ranks, &c.armed).await {
        let cause = Cause {
            rank,
            stage: Stage::Restart,
            error: ApplyError::RestartFailed(RestartFailure::NotRestarted(why)),
        };
        c.failed = Some((vec![cause], Vec::new()));
        return Went::Failed;
    }
    let guards: Vec<&Armed<'_>> = c.armed.iter().collect();
    match guard::leased_all(&guards, restart_in_order(ranks)).await {
        Ok(()) => Went::Passed,
        Err((rank, e)) => {
            let cause = Cause {
                rank,
                stage: Stage::Restart,
                error: ApplyError::RestartFailed(RestartFailure::Host(Arc::new(e))),
            };
            c.failed = Some((vec![cause], Vec::new()));
            Went::Failed
        }
    }
}

/// Stops every rank as SGLang stops a group (`reconcile_core::group::stop_steps`: rank 0 drains
/// the requests in flight, and its shutdown ends the others), then starts them in the order SGLang
/// needs (`reconcile_core::group::start_order`): rank 0 first, then the others at
/// once, so their starts lie as close together as one `systemctl start` on rank 0 allows (a rank
/// waits at the rendezvous for the others, and loads only when all are there). Each invocation
/// is noted. `Err` names the rank that could not be stopped or started.
async fn restart_in_order(ranks: &mut [Rank<'_>]) -> Result<(), (usize, RemoteError)> {
    if let [r] = ranks {
        // A server of one: one `systemctl restart`, a job systemd runs whole.
        let (host, unit) = (r.job.host, &r.job.t.desired.unit);
        r.invocation = restart_unit(host, unit, r.verdict)
            .await
            .map_err(|e| (0, e))?;
        note_stop(r).await;
        return Ok(());
    }
    let all: Vec<usize> = (0..ranks.len()).collect();
    if let Some(failed) = stop_ranks(ranks, &all).await.into_iter().next() {
        return Err(failed);
    }
    for r in ranks.iter_mut() {
        note_stop(r).await;
    }
    // New units enabled first, so the starts below are one command each.
    let enabled = join_all(ranks.iter().map(|r| async move {
        if r.verdict == Verdict::Install {
            r.job
                .host
                .run_ok(&["systemctl", "enable", "--", &r.job.t.desired.unit])
                .await?;
        }
        Ok::<(), RemoteError>(())
    }))
    .await;
    first_error(enabled)?;
    let start = |i: usize| {
        let (host, unit) = (ranks[i].job.host, ranks[i].job.t.desired.unit.clone());
        async move {
            host.run_ok(&["systemctl", "start", "--", &unit])
                .await
                .map(drop)
        }
    };
    let order = start_order(ranks.len());
    if let Some((&first, rest)) = order.split_first() {
        start(first).await.map_err(|e| (first, e))?;
        let started = join_all(rest.iter().map(|&i| start(i))).await;
        if let Some((j, e)) = started
            .into_iter()
            .enumerate()
            .find_map(|(j, r)| r.err().map(|e| (j, e)))
        {
            return Err((rest[j], e));
        }
    }
    let invocations = join_all(ranks.iter().map(|r| async move {
        Ok::<String, RemoteError>(
            r.job
                .host
                .unit_state(&r.job.t.desired.unit)
                .await?
                .invocation_id,
        )
    }))
    .await;
    for (i, invocation) in invocations.into_iter().enumerate() {
        ranks[i].invocation = invocation.map_err(|e| (i, e))?;
    }
    Ok(())
}

/// Stops ranks `which` of a group in [`stop_steps`]' order, each step on its ranks at once. A step
/// that fails for a rank ends the stop there (the later steps wait on it): the ranks that could
/// not be stopped, with why. A SIGTERM that could not be sent is no failure: the stop after it
/// says whether the rank stopped.
pub(super) async fn stop_ranks(ranks: &[Rank<'_>], which: &[usize]) -> Vec<(usize, RemoteError)> {
    for step in stop_steps(which) {
        let (verb, is, fatal): (&[&str], Vec<usize>, bool) = match step {
            StopStep::Begin(is) => (&["stop", "--no-block"], is, true),
            StopStep::Stop(is) => (&["stop"], is, true),
            StopStep::Terminate(is) => (&["kill", "--kill-who=all", "--signal=SIGTERM"], is, false),
        };
        let results = join_all(is.iter().map(|&i| {
            let (host, unit) = (ranks[i].job.host, &ranks[i].job.t.desired.unit);
            let argv: Vec<&str> = ["systemctl"]
                .iter()
                .chain(verb)
                .chain(&["--", unit.as_str()])
                .copied()
                .collect();
            async move { host.run_ok(&argv).await }
        }))
        .await;
        let failed: Vec<(usize, RemoteError)> = is
            .iter()
            .zip(results)
            .filter_map(|(&i, r)| Some((i, r.err()?)))
            .collect();
        if fatal && !failed.is_empty() {
            return failed;
        }
        for (i, e) in &failed {
            tracing::debug!(
                rank = i,
                "SIGTERM to the rank's processes: {}",
                error_chain(e)
            );
        }
    }
    Vec::new()
}

/// Notes how long a rank's old server took to stop, from systemd's monotonic timestamps of its
/// last stop (leaving `active`, entering `inactive`), read once it stopped. Nothing for a server
/// that was not running, or timestamps that do not read.
async fn note_stop(r: &mut Rank<'_>) {
    if !r.fallback.was_running {
        return;
    }
    let (host, unit) = (r.job.host, &r.job.t.desired.unit);
    if let Some(seconds) = crate::systemd::last_stop_seconds(host, unit).await {
        r.report.report.notes.push(decide::stopped_in(seconds));
    }
}

/// Enables a new unit, restarts it, and returns the new invocation's id (for its journal).
async fn restart_unit(
    host: &dyn Host,
    unit: &str,
    verdict: Verdict,
) -> Result<String, RemoteError> {
    if verdict == Verdict::Install {
        host.run_ok(&["systemctl", "enable", "--", unit]).await?;
    }
    host.run_ok(&["systemctl", "restart", "--", unit]).await?;
    Ok(host.unit_state(unit).await?.invocation_id)
}

/// The first rank whose step failed, with why.
fn first_error(results: Vec<Result<(), RemoteError>>) -> Result<(), (usize, RemoteError)> {
    match results
        .into_iter()
        .enumerate()
        .find_map(|(i, r)| r.err().map(|e| (i, e)))
    {
        Some((i, e)) => Err((i, e)),
        None => Ok(()),
    }
}
