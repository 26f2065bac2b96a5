//! `Step::Prepare` (`reconcile_core::transaction`): every rank's pinned weights on its host,
//! verified; preflight on every rank (and the rendezvous port free on rank 0); then every rank's
//! lock.

use futures::future::join_all;
use reconcile_core::transaction::Went;
use std::sync::Arc;

use super::{refused_endings, Carried, Rank};
use crate::apply::decide;
use crate::apply::error::ApplyError;
use crate::pinned;
use crate::plan::Verdict;
use crate::preflight;
use crate::state;

/// `Step::Prepare`. A rank refused stops the group, touching nothing: every rank's ending says
/// which rank it was.
pub(super) async fn prepare(ranks: &mut [Rank<'_>], c: &mut Carried<'_>) -> Went {
    let prepared = match fetch_pinned(ranks).await {
        Ok(()) => preflight_and_lock(ranks).await,
        Err(e) => Err(e),
    };
    match prepared {
        Ok(()) => Went::Passed,
        Err((i, e)) => {
            c.endings = Some(refused_endings(ranks, i, &e));
            Went::Stopped
        }
    }
}

/// Every rank's pinned weights (`sglang.model:`) on its host, verified, before preflight reads
/// them: fetched here where a rollout did not fetch them ahead (`crate::apply::rollout`), else
/// one look. Only where the change starts the server or loads the weights live.
async fn fetch_pinned(ranks: &mut [Rank<'_>]) -> Result<(), (usize, ApplyError)> {
    let fetched = join_all(ranks.iter().map(|r| async move {
        let t = r.job.t;
        let Some(spec) = &t.manifest.sglang.pinned else {
            return Ok(None);
        };
        if !matches!(
            r.verdict,
            Verdict::Restart | Verdict::Install | Verdict::Live
        ) {
            return Ok(None);
        }
        let token = t.desired.model.env.get("HF_TOKEN").map(String::as_str);
        let python = &t.manifest.sglang.python;
        let cancel = &r.job.options.cancel;
        pinned::ensure(r.job.host, python, spec, token, None, cancel).await
    }))
    .await;
    for (i, fetched) in fetched.into_iter().enumerate() {
        match fetched {
            Ok(Some(f)) => {
                ranks[i].report.report.notes.push(pinned::fetched_note(&f));
                ranks[i].report.report.fetch = Some(f);
            }
            Ok(None) => {}
            Err(e) => return Err((i, ApplyError::FetchFailed(Arc::new(e)))),
        }
    }
    Ok(())
}

/// Step 2: preflight on every rank, the rendezvous port on rank 0, then every rank's lock. `Err`
/// names the rank that stopped the group; locks taken are released by the caller.
async fn preflight_and_lock(ranks: &mut [Rank<'_>]) -> Result<(), (usize, ApplyError)> {
    let checked = join_all(ranks.iter_mut().map(|r| async move {
        let Rank {
            job,
            observed,
            verdict,
            survey,
            report,
            ..
        } = r;
        crate::apply::run_preflight(job, observed, *verdict, survey.as_ref(), &mut report.report)
            .await
    }))
    .await;
    for (i, checked) in checked.into_iter().enumerate() {
        ranks[i].weights = checked.map_err(|e| (i, e))?;
    }
    let rank0 = &ranks[0];
    if let Some(port) = rendezvous(&rank0.job.t.desired.model) {
        let unit = &rank0.job.t.desired.unit;
        let found =
            preflight::rendezvous_free(rank0.job.host, unit, port, rank0.observed.state.main_pid)
                .await
                .map_err(|e| (0, ApplyError::PreflightCouldNotRun(Arc::new(e))))?;
        let (notes, refusal) = decide::preflight(found, rank0.job.options.restoring);
        ranks[0].report.report.notes.extend(notes);
        if let Some(e) = refusal {
            return Err((0, e));
        }
    }
    for (i, r) in ranks.iter_mut().enumerate() {
        let (host, t, options) = (r.job.host, r.job.t, r.job.options);
        match state::lock(host, &t.desired.unit, &options.owner, options.lock).await {
            Ok(note) => {
                r.locked = true;
                r.report.report.notes.extend(note);
            }
            Err(e) => return Err((i, e.into())),
        }
        if let Some(expected) = &t.expected {
            crate::apply::still_as_planned(host, t, expected, &r.observed)
                .await
                .map_err(|e| (i, e))?;
        }
    }
    Ok(())
}

/// The rendezvous port rank 0's unit listens on: `--dist-init-addr HOST:PORT`'s (`[v6]:PORT`).
/// Read from the unit, not the manifest: a rollback restores a unit the manifest may have moved
/// on from.
fn rendezvous(model: &crate::unit::UnitModel) -> Option<u16> {
    let (_, flags) = crate::flags::flags(&model.exec_start);
    let addr = flags
        .get("dist-init-addr")
        .or(flags.get("nccl-init-addr"))?;
    addr.rsplit_once(':')?.1.parse().ok()
}
