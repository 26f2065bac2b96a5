//! `Step::Drain`: rank 0, the server's API, drained when the manifest asks (`drain:`).

use reconcile_core::transaction::Went;

use super::{refused_endings, Carried, Rank};
use crate::apply::error::ApplyError;
use crate::apply::install;

/// `Step::Drain`: rank 0, the server's API, drained before anything changes: during a long wait
/// the hosts keep the old units, so a server that crashes meanwhile comes back as it was, and a
/// refusal has nothing to undo. Stopped, with every rank's ending, when the restart must not
/// happen.
pub(super) async fn drain(ranks: &mut [Rank<'_>], c: &mut Carried<'_>) -> Went {
    let Rank {
        job,
        verdict,
        fallback,
        report,
        ..
    } = &mut ranks[0];
    let Some(ending) = install::drain(job, *verdict, fallback, &mut report.report).await else {
        return Went::Passed;
    };
    let e = ApplyError::Refused(format!(
        "rank 0's drain stopped the group's restart: {}",
        ending.detail
    ));
    let mut endings = refused_endings(ranks, 0, &e);
    endings[0] = ending;
    c.endings = Some(endings);
    Went::Stopped
}
