//! `Step::Verify`: every rank verified at once, under the guards' lease. `together`, the checks
//! run as a group, is `Step::RollBack`'s too.

use std::sync::Mutex;

use futures::future::join_all;
use reconcile_core::transaction::{Kind, Went};
use tokio_util::sync::CancellationToken;

use super::{Carried, Cause, Failed, Rank};
use crate::apply::guard::{self, Armed};
use crate::apply::verifier::{Check, Verifier};
use crate::remote::Host;
use crate::verify::{Expect, Failure, Reason, Stage, Verification};

/// `Step::Verify`: every rank's verification kept for the gates and the confirm, or what failed.
pub(super) async fn verify(ranks: &mut [Rank<'_>], kind: Kind, c: &mut Carried<'_>) -> Went {
    let guards: Vec<&Armed<'_>> = c.armed.iter().collect();
    match guard::leased_all(&guards, verify_all(ranks)).await {
        Ok(mut v) => {
            if kind == Kind::Live {
                // Verified as it runs: no load to time, none for the learned deadlines to learn
                // from.
                for v in &mut v {
                    v.load_seconds = None;
                }
            }
            c.verified = v;
            Went::Passed
        }
        Err(f) => {
            c.failed = Some(f);
            Went::Failed
        }
    }
}

/// Every rank verified at once, under a child of the run's token: Ctrl-C cancels it with the
/// run, and the first rank to fail cancels it alone. `Err`: what failed, and the ranks a peer's
/// failure cut short.
async fn verify_all(ranks: &mut [Rank<'_>]) -> Result<Vec<Verification>, Failed> {
    let options = ranks[0].job.options;
    let n = ranks.len();
    let group_cancel = options.cancel.child_token();
    let checks: Vec<Check<'_>> = ranks
        .iter()
        .map(|r| Check {
            unit: &r.job.t.desired.unit,
            spec: &r.spec,
            expect: Expect::from_unit(&r.job.t.desired.model),
            label: if n == 1 {
                format!("{} {}", r.job.t.host, r.job.t.desired.unit)
            } else {
                format!(
                    "{} {} (rank {})",
                    r.job.t.host,
                    r.job.t.desired.unit,
                    rank_of(r)
                )
            },
            cancel: &group_cancel,
            history: r.history.as_ref(),
        })
        .collect();
    let hosts: Vec<&dyn Host> = ranks.iter().map(|r| r.job.host).collect();
    let (results, first) = together(&hosts, ranks[0].job.verifier, checks, &group_cancel).await;
    let mut verified = Vec::new();
    let mut failures = Vec::new();
    for (i, (r, result)) in ranks.iter_mut().zip(results).enumerate() {
        match result {
            Ok(mut v) => {
                v.notes.splice(0..0, r.learned_notes.iter().cloned());
                v.previous_loads = r.history.clone();
                verified.push(v);
            }
            Err(mut f) => {
                f.verification
                    .notes
                    .splice(0..0, r.learned_notes.iter().cloned());
                f.verification.previous_loads = r.history.clone();
                r.report.report.verification = Some(Verification::clone(&f.verification));
                failures.push((i, f));
                verified.push(Verification::default());
            }
        }
    }
    if failures.is_empty() {
        return Ok(verified);
    }
    // A rank whose verification ended on the group's cancel was cut short by a peer; the others
    // failed in their own right, in the order seen (the first to fail first).
    let ctrl_c = options.cancel.is_cancelled();
    let (own, cut): (Vec<_>, Vec<_>) = failures
        .iter()
        .partition(|(_, f)| ctrl_c || !matches!(f.reason, Reason::Cancelled(_)));
    let mut own: Vec<&(usize, Failure)> = if own.is_empty() {
        failures.iter().collect()
    } else {
        own
    };
    if let Some(i) = first {
        own.sort_by_key(|(j, _)| *j != i);
    }
    let causes = own
        .iter()
        .map(|(i, f)| Cause::stage(*i, f.stage, f.reason.to_string()))
        .collect();
    for (i, f) in &failures {
        ranks[*i].report.report.failed_stage = Some(f.stage);
    }
    let cut: Vec<(usize, Stage)> = cut.iter().map(|(i, f)| (*i, f.stage)).collect();
    Err((causes, cut))
}

/// Runs every rank's check at once, each under `group` (the token the checks carry). The first to
/// fail cancels it, cutting the others short: without that, they would wait for a peer that is
/// gone until their own deadlines. Whoever cancels `group`'s parent (Ctrl-C) cuts them all short
/// too. Returns each rank's result and the rank that failed first, if one did.
pub(super) async fn together(
    hosts: &[&dyn Host],
    verifier: &dyn Verifier,
    checks: Vec<Check<'_>>,
    group: &CancellationToken,
) -> (Vec<Result<Verification, Failure>>, Option<usize>) {
    let first = Mutex::new(None);
    let results = join_all(checks.into_iter().enumerate().map(|(i, check)| {
        let first = &first;
        async move {
            let result = verifier.verify(hosts[i], check).await;
            if result.is_err() {
                let mut first = first.lock().unwrap_or_else(|p| p.into_inner());
                // A rank that fails once the group is cancelled was cut short: not the first.
                if first.is_none() && !group.is_cancelled() {
                    *first = Some(i);
                }
                group.cancel();
            }
            result
        }
    }))
    .await;
    let first = first.into_inner().unwrap_or_else(|p| p.into_inner());
    (results, first)
}

fn rank_of(r: &Rank<'_>) -> usize {
    r.job.t.group.as_ref().map_or(0, |g| g.rank)
}
