//! `Step::Write` and `Step::RecordReload`: every rank's new unit written and loaded, under its
//! guard; a reload-only change recorded. Also `save_previous`, what the write replaces saved
//! aside: `Step::Arm` calls it before it arms the guards, and a reload-only change, which arms
//! none, calls it here.

use std::sync::Arc;

use futures::future::join_all;
use reconcile_core::transaction::{Kind, Went};

use super::put_back::PutBack;
use super::{Carried, Rank};
use crate::apply::decide::{self, Ending};
use crate::apply::error::{ApplyError, InstallFailure};
use crate::apply::install;
use crate::apply::Outcome;
use crate::plan::Verdict;
use crate::record::LiveRecord;
use crate::remote::RemoteError;
use crate::state;

/// `Step::Write`: the last moment to stop without a restart. A signal before the write, or during
/// it, leaves the servers as they were.
pub(super) async fn write(ranks: &mut [Rank<'_>], kind: Kind, c: &mut Carried<'_>) -> Went {
    let options = ranks[0].job.options;
    if kind != Kind::ReloadOnly && options.cancel.is_cancelled() {
        c.put_back = Some(PutBack::Cancelled);
        return Went::Stopped;
    }
    // A reload-only change arms no guard: what it replaces is saved here. Any other writes under
    // its guards, once they are known to hold.
    let ready = match kind {
        Kind::ReloadOnly => save_previous(ranks).await,
        _ => super::guards_hold(ranks, &c.armed)
            .await
            .map_err(|(i, why)| {
                (
                    i,
                    ApplyError::InstallFailed(InstallFailure::NotWritten(why)),
                )
            }),
    };
    let written = match ready {
        Ok(()) => write_units(ranks).await,
        not_ready => not_ready,
    };
    match written {
        Err((rank, error)) => {
            c.put_back = Some(PutBack::Write { rank, error });
            Went::Failed
        }
        Ok(()) if kind != Kind::ReloadOnly && options.cancel.is_cancelled() => {
            c.put_back = Some(PutBack::Cancelled);
            Went::Stopped
        }
        Ok(()) => Went::Passed,
    }
}

/// What every rank's write replaces, saved (`install::save_previous`), or `Err` naming the first
/// rank where it could not be.
pub(super) async fn save_previous(ranks: &mut [Rank<'_>]) -> Result<(), (usize, ApplyError)> {
    let kept = join_all(ranks.iter_mut().map(|r| async move {
        let Rank {
            job,
            observed,
            fallback,
            verdict,
            ..
        } = r;
        if *verdict == Verdict::NoChange {
            return Ok(());
        }
        install::save_previous(job, observed, fallback).await
    }))
    .await;
    first_failed(kept)
}

/// Every rank's unit in place, or `Err` naming the first rank that could not be.
async fn write_units(ranks: &mut [Rank<'_>]) -> Result<(), (usize, ApplyError)> {
    let written = join_all(ranks.iter_mut().map(|r| async move {
        let Rank {
            job,
            fallback,
            verdict,
            ..
        } = r;
        if *verdict == Verdict::NoChange {
            return Ok(());
        }
        install::write_unit(job, fallback).await
    }))
    .await;
    first_failed(written)
}

fn first_failed(done: Vec<Result<(), RemoteError>>) -> Result<(), (usize, ApplyError)> {
    match done
        .into_iter()
        .enumerate()
        .find_map(|(i, w)| w.err().map(|e| (i, e)))
    {
        Some((i, e)) => Err((
            i,
            ApplyError::InstallFailed(InstallFailure::Host(Arc::new(e))),
        )),
        None => Ok(()),
    }
}

/// `Step::RecordReload`: a reload-only change, each changed rank recorded, the server serving on.
pub(super) async fn record_reload(ranks: &mut [Rank<'_>], c: &mut Carried<'_>) -> Went {
    let mut endings = Vec::new();
    for r in ranks.iter_mut() {
        if r.verdict == Verdict::ReloadOnly {
            let live = still_live(r).await;
            install::record(&r.job, Outcome::Reloaded, None, live, &mut r.report.report).await;
            endings.push(decide::reloaded());
        } else {
            endings.push(Ending {
                outcome: Outcome::Unchanged,
                detail: "already up to date; nothing touched (the group only reloaded)".into(),
                error: None,
            });
        }
    }
    c.endings = Some(endings);
    Went::Passed
}

/// What the last deployment told the running server live, kept in the record of a reload-only
/// change: a reload restarts nothing, so the server still runs the command line that was told
/// (`status` checks that it is the same process before it believes it).
async fn still_live(r: &Rank<'_>) -> Option<LiveRecord> {
    let unit = &r.job.t.desired.unit;
    let previous = match r.survey.as_ref().and_then(|s| s.record(unit)) {
        Some(read) => read,
        None => state::read_record(r.job.host, unit).await,
    };
    previous.ok().flatten().and_then(|p| p.live)
}
