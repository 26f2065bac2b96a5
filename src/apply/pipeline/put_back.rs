//! `Step::PutBack`: nothing restarted yet, so every previous file is put back, the servers left as
//! they run, and the guards stood down.

use futures::future::join_all;
use reconcile_core::transaction::Went;

use super::{Carried, Rank};
use crate::apply::decide::{self, Ending};
use crate::apply::error::{ApplyError, InstallFailure};
use crate::apply::restore::put_back_file;
use crate::remote::RemoteError;

/// Why files were put back before any restart.
pub(super) enum PutBack {
    /// Rank `rank`'s unit could not be written.
    Write { rank: usize, error: ApplyError },
    /// A rank's guard could not be armed.
    Arm { error: ApplyError },
    /// A signal came before the restart.
    Cancelled,
}

/// `Step::PutBack`: every rank's ending says why its file went back.
pub(super) async fn put_back(ranks: &mut [Rank<'_>], c: &mut Carried<'_>) -> Went {
    let why = c
        .put_back
        .take()
        .expect("a step said why the files go back");
    // A renewal first, whatever it answers: after a reboot it brings the guard's record into the
    // new boot while the file is still the one the boot started, so the guard tells that start
    // from one after the put-back (the model found a reboot's start taken for the previous unit's).
    let _ = super::guards_hold(ranks, &c.armed).await;
    c.endings = Some(put_back_endings(ranks, why).await);
    // The files are back: the guards stand down. One that does not hear it finds the previous
    // file in place once the lease is out, and puts back nothing new. A rank whose server started
    // the new file since the arming (a reboot, a peer's restart: the renewal above saw it) runs
    // what its file no longer says: its guard, left armed, restores the previous unit (the group
    // model found such a rank left on the new unit, unwatched).
    for (i, a) in c.armed.iter().enumerate() {
        let unit = &ranks[i].job.t.desired.unit;
        let started = crate::apply::guard::read(ranks[i].job.host, unit)
            .await
            .ok()
            .flatten()
            .is_some_and(|g| g.new_started);
        if started {
            ranks[i].report.report.notes.push(
                "its server had started the new unit since the guard was armed (a reboot?): the host's guard, left armed, restores the previous unit once this run's lease runs out".into(),
            );
            continue;
        }
        let _ = a.disarm().await;
    }
    Went::Passed
}

/// Every rank's previous file back after a failed write, an unarmed guard or a signal before the
/// restart: nothing was restarted, so the servers are left alone.
async fn put_back_endings(ranks: &[Rank<'_>], why: PutBack) -> Vec<Ending> {
    let put_back = put_back_all(ranks).await;
    let interrupted = crate::signals::interrupted();
    put_back
        .into_iter()
        .enumerate()
        .map(|(j, back)| {
            let back = back
                .as_ref()
                .copied()
                .map_err(|e| e as &(dyn std::error::Error + 'static));
            match &why {
                PutBack::Cancelled => decide::cancelled_before_restart(&interrupted, back),
                PutBack::Arm { error, .. } => decide::install_failed(error, back),
                PutBack::Write { rank, error } if j == *rank => decide::install_failed(error, back),
                PutBack::Write { rank, error } => {
                    let peer = ApplyError::InstallFailed(InstallFailure::Peer {
                        rank: *rank,
                        host: ranks[*rank].job.t.host.clone(),
                        source: Box::new(error.clone()),
                    });
                    decide::install_failed(&peer, back)
                }
            }
        })
        .collect()
}

/// Every rank's file put back after a failed install or a cancel before the restart: each
/// rank's `Ok(whether anything was put back)`, or why it could not be.
async fn put_back_all(ranks: &[Rank<'_>]) -> Vec<Result<bool, RemoteError>> {
    join_all(ranks.iter().map(|r| async move {
        put_back_file(
            r.job.host,
            &r.job.t.desired.unit,
            r.fallback.previous.as_deref(),
            r.fallback.unit_files.aside.as_ref(),
        )
        .await
    }))
    .await
}
