//! `Step::RollBack`: every rank's guard taken over, its previous unit put back, the ranks restarted
//! in order and verified, through hosts that may go away and come back; then whom to blame.

use std::time::Duration;

use reconcile_core::group::start_order;
use reconcile_core::guard::GuardState;
use reconcile_core::transaction::Went;
use tokio_util::sync::CancellationToken;

use super::restart::stop_ranks;
use super::verify::together;
use super::{Carried, Cause, Rank};
use crate::apply::decide::{self, Ending};
use crate::apply::error::ApplyError;
use crate::apply::guard::{self, Armed};
use crate::apply::install;
use crate::apply::restore::{restore, restored_check, NotRestored, Restored};
use crate::remote::{self, error_chain, Host, RemoteError};
use crate::verify::Stage;

/// `Step::RollBack`: every rank's ending, from what failed and how its way back went.
pub(super) async fn roll_back(ranks: &mut [Rank<'_>], c: &mut Carried<'_>) -> Went {
    let (causes, cut_short) = c.failed.take().expect("a step said what failed");
    let guards: Vec<&Armed<'_>> = c.armed.iter().collect();
    c.endings = Some(roll_back_ranks(ranks, causes, &cut_short, &guards).await);
    Went::Passed
}

/// How long to wait, beyond the crash window, for a host whose connection broke mid-apply to
/// take connections again: long enough for a server to reboot.
const RECONNECT_GRACE: Duration = Duration::from_secs(60);

/// One rank's way back, as its rollback goes on.
#[derive(Default)]
struct Back {
    /// What happened to its host on the way (shutting down, reconnected), for its detail.
    path: String,
    /// Settled without this run's restore: its host was lost, or its guard acted first.
    settled: Option<Ending>,
    /// This run's restore and its verification.
    restored: Option<Result<Restored, NotRestored>>,
    /// Stopping it before the restore failed.
    stop_failed: Option<RemoteError>,
    reached: bool,
    /// Its guard restored it, and this run does not again; a group's restore starts it with the
    /// other ranks (a rank 0 stopped gracefully ends its followers, and systemd does not start a
    /// process that exited 0).
    left_to_guard: bool,
}

/// Step 6: every rank's guard taken over, every previous unit put back and started in order,
/// and the server verified again, through hosts that may go away (a reboot, a cut network) and
/// come back. Each rank's ending says what failed (its own stage, or the rank that failed first)
/// and how its rollback went. `cut_short`: the ranks a peer's failure cut short, each with the
/// stage it was cut at.
async fn roll_back_ranks(
    ranks: &mut [Rank<'_>],
    causes: Vec<Cause>,
    cut_short: &[(usize, Stage)],
    guards: &[&Armed<'_>],
) -> Vec<Ending> {
    for c in &causes {
        ranks[c.rank].report.report.failed_stage = Some(c.stage);
    }
    let mut backs: Vec<Back> = (0..ranks.len()).map(|_| Back::default()).collect();
    guard::leased_all(guards, return_all(ranks, &causes, guards, &mut backs)).await;
    // A host that did not come back keeps its guard, which finishes the rollback there.
    for (i, g) in guards.iter().enumerate() {
        if !backs[i].reached {
            continue;
        }
        if let Err(e) = g.disarm().await {
            ranks[i].report.report.notes.push(format!(
                "the host's guard could not be disarmed after the rollback: {}",
                error_chain(&e)
            ));
        }
    }
    // Read after the rollback, which gives journald time to take in the failed processes' last
    // lines; they also say which rank to blame (`reconcile_core::group::root_cause`).
    for r in ranks.iter_mut() {
        r.report.report.journal =
            install::redacted_journal(&r.job, &r.fallback, &r.invocation).await;
        r.report.report.diagnosis = r
            .report
            .report
            .journal
            .as_deref()
            .and_then(reconcile_core::diagnose::diagnose);
    }
    let cause = blame(ranks, causes, cut_short);
    let kind = cause.error.kind();
    let failed_host = ranks[cause.rank].job.t.host.clone();
    ranks[cause.rank].report.report.failed_stage = Some(cause.stage);
    let cut_text = format!(
        "cut short: the group's rank {} ({failed_host}) failed its {}",
        cause.rank, cause.stage
    );
    let mut endings = Vec::new();
    for (i, (r, back)) in ranks.iter_mut().zip(backs).enumerate() {
        let report = &mut r.report.report;
        report.failed_stage.get_or_insert(Stage::Group);
        // A rank stopped because a peer failed says so, not that someone pressed Ctrl-C.
        if cut_short.iter().any(|&(cut, _)| cut == i) {
            // Blamed after all (its process failed too), it says how; else that a peer stopped it.
            let detail = match &cause.error {
                ApplyError::VerificationFailed { reason, .. } if i == cause.rank => reason.clone(),
                _ => cut_text.clone(),
            };
            if let Some(v) = report.verification.as_mut() {
                for stage in v.stages.iter_mut().filter(|s| !s.passed) {
                    stage.detail = detail.clone();
                }
            }
        }
        if let Some(ending) = back.settled {
            endings.push(ending);
            continue;
        }
        let mut text = failure_text(i, &cause, &failed_host);
        text.push_str(&back.path);
        if let Some(e) = &back.stop_failed {
            text.push_str(&format!("; stopping it failed: {}", error_chain(e)));
        }
        let result = back.restored.unwrap_or(Err(NotRestored::NotDone));
        let ending = decide::rolled_back(&text, kind, &result);
        match result {
            Ok(Restored::Verified(v)) => report.rollback = Some(*v),
            Err(NotRestored::Verify(f)) => report.rollback = Some(*f.verification),
            _ => {}
        }
        endings.push(ending);
    }
    endings
}

/// What rank `i` says failed: its own error when it is the blamed rank, else the blamed rank's.
fn failure_text(i: usize, cause: &Cause, failed_host: &str) -> String {
    if i == cause.rank {
        cause.error.to_string()
    } else {
        format!(
            "the server group failed: rank {} ({failed_host}) {}",
            cause.rank, cause.error
        )
    }
}

/// Every rank back on its previous unit, or settled otherwise (its host lost, its guard acted
/// first). A rank whose rollback failed while its host was going away is tried again once the
/// host is back, within the crash window and the reconnect grace.
async fn return_all(
    ranks: &[Rank<'_>],
    causes: &[Cause],
    guards: &[&Armed<'_>],
    backs: &mut [Back],
) {
    let n = ranks.len();
    let window = ranks
        .iter()
        .map(|r| r.job.t.verify.crash_window)
        .max()
        .unwrap_or_default()
        + RECONNECT_GRACE;
    // tokio's clock: the one its sleeps (and a paused test clock) keep.
    let until = tokio::time::Instant::now() + window;
    // What each rank would say failed, before the journals tell whom to blame: for a rank
    // settled before its restore.
    let first = &causes[0];
    let early = |i: usize| failure_text(i, first, &ranks[first.rank].job.t.host);
    let kind = first.error.kind();
    let mut tried = vec![false; n];
    loop {
        let pending: Vec<usize> = (0..n)
            .filter(|&i| backs[i].settled.is_none() && backs[i].restored.is_none())
            .collect();
        if pending.is_empty() {
            return;
        }
        let mut go = Vec::new();
        for i in pending {
            let host = ranks[i].job.host;
            if let Err(e) = reach(host, until, &mut backs[i].path).await {
                let unit = &ranks[i].job.t.desired.unit;
                let fallback = &ranks[i].fallback;
                let left = decide::left_behind(
                    unit,
                    fallback.previous.is_none(),
                    fallback.saved.as_deref(),
                    tried[i],
                );
                let text = early(i) + &backs[i].path;
                backs[i].settled = Some(decide::host_lost(
                    &text,
                    window.as_secs(),
                    &error_chain(&e),
                    &left,
                ));
                backs[i].reached = false;
                continue;
            }
            backs[i].reached = true;
            // One of this run and the host's guard rolls back, never both: taking the guard
            // over tells which (the guard acted first if its lease ran out while the host was
            // out of reach), and leaves the guard to finish this rollback should this process
            // die in it. A take-over the guard refuses or cannot answer leaves the rollback to
            // the guard, never to both: this run neither restores nor disarms it. One cut short
            // by the connection (the host going down for a reboot) is tried again once the host
            // is back, as the restore is.
            if !tried[i] {
                let text = early(i) + &backs[i].path;
                let found = match guards[i].take().await {
                    Ok(Some(found)) => found,
                    Err(
                        remote::RemoteError::Transport { .. }
                        | remote::RemoteError::TimedOut { .. },
                    ) if tokio::time::Instant::now() < until => {
                        tokio::time::sleep(crate::verify::POLL_INTERVAL).await;
                        continue;
                    }
                    failed => {
                        let why = match failed {
                            Err(e) => error_chain(&e),
                            _ => "it answered no state".to_string(),
                        };
                        backs[i].settled = Some(Ending::rollback_failed(format!(
                            "host needs attention: {text}; the host's guard could not be taken over ({why}): it finishes the rollback once this run's lease runs out"
                        )));
                        backs[i].reached = false;
                        continue;
                    }
                };
                if found != GuardState::Armed {
                    backs[i].settled = Some(match guards[i].settled().await {
                        Some(settled) => {
                            backs[i].left_to_guard = settled.acted_itself();
                            decide::guard_acted_first(&text, kind, &settled)
                        }
                        None => Ending::rollback_failed(format!(
                            "host needs attention: {text}; the host's guard is rolling back ({})",
                            found.name()
                        )),
                    });
                    continue;
                }
            }
            tried[i] = true;
            go.push(i);
        }
        // A rank taken over (here, or tried before while its host went away) may have waited
        // while another host was reached: its guard's lease may have run out meanwhile, and the
        // guard restored the rank itself. Restoring it again would cost a second load (the
        // models and the crash matrix found it): the rank is left to its guard.
        let mut taken = Vec::new();
        for i in go {
            let text = early(i) + &backs[i].path;
            match acted_meanwhile(&ranks[i], guards[i], &text, kind).await {
                Some(ending) => {
                    backs[i].settled = Some(ending);
                    backs[i].left_to_guard = true;
                }
                None => taken.push(i),
            }
        }
        let go = taken;
        if go.is_empty() {
            continue;
        }
        for (i, result) in restore_ranks(ranks, &go, backs).await {
            backs[i].restored = Some(result);
        }
        // A rollback that failed while its host went away starts over once it is back.
        let mut again = false;
        for &i in &go {
            if matches!(backs[i].restored, Some(Err(_)))
                && tokio::time::Instant::now() < until
                && presence(ranks[i].job.host).await != Presence::Here
            {
                backs[i].restored = None;
                again = true;
            }
        }
        if !again {
            return;
        }
    }
}

/// Rank `r`'s ending when its guard restored it itself since this run took it over (its lease ran
/// out while this run could not renew it): this run restores it not again, a second load.
/// `None`: the guard still leaves the rollback to this run (the renewal keeps it so).
async fn acted_meanwhile(
    r: &Rank<'_>,
    guard: &Armed<'_>,
    text: &str,
    kind: crate::apply::error::ApplyErrorKind,
) -> Option<Ending> {
    let _renewed = guard.holds().await;
    let read = guard::read(r.job.host, &r.job.t.desired.unit)
        .await
        .ok()
        .flatten()?;
    if !read.acted_itself() {
        return None;
    }
    if !read.state.active() {
        return Some(decide::guard_acted_first(text, kind, &read));
    }
    Some(match guard.settled().await {
        Some(settled) => decide::guard_acted_first(text, kind, &settled),
        None => Ending::rollback_failed(format!(
            "host needs attention: {text}; the host's guard restored it and has not settled"
        )),
    })
}

/// Waits for `host` to be reachable and not shutting down, within `until`; notes on `path`
/// what it went through. A host shutting down still answers for a moment: its sshd goes soon,
/// and reconnecting before would reach the host on its way down.
async fn reach(
    host: &dyn Host,
    until: tokio::time::Instant,
    path: &mut String,
) -> Result<(), remote::RemoteError> {
    loop {
        let now = presence(host).await;
        if now == Presence::ShuttingDown && !path.contains(decide::SHUTTING_DOWN) {
            path.push_str(decide::SHUTTING_DOWN);
        }
        if now == Presence::ShuttingDown && tokio::time::Instant::now() < until {
            tokio::time::sleep(crate::verify::POLL_INTERVAL).await;
            continue;
        }
        if now != Presence::Here {
            let took = host
                .reconnect(until.saturating_duration_since(tokio::time::Instant::now()))
                .await?;
            path.push_str(&decide::reconnected(took.as_secs_f64()));
        }
        return Ok(());
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Presence {
    Here,
    /// Its systemd is stopping (a reboot or power-off under way).
    ShuttingDown,
    /// The connection broke.
    Gone,
}

async fn presence(host: &dyn Host) -> Presence {
    if !host.connected().await {
        return Presence::Gone;
    }
    match host.run(&["systemctl", "is-system-running"]).await {
        Ok(out) if out.stdout.trim() == "stopping" => Presence::ShuttingDown,
        // Past "stopping", PID 1 no longer answers on its bus while sshd still does.
        Ok(out)
            if out.stdout.trim() == "offline"
                || out.stderr.contains("Failed to connect to bus") =>
        {
            Presence::ShuttingDown
        }
        Ok(_) => Presence::Here,
        Err(_) => Presence::Gone,
    }
}

/// The rollback proper for ranks `which`: stopped first (a rank on its old unit must not dial
/// into a new rank 0), restored and started in order, and verified together, as the new ones
/// were, under a token of their own, no child of the run's: a second Ctrl-C does not cut this
/// short, for it is the way back. Each rank's result.
async fn restore_ranks(
    ranks: &[Rank<'_>],
    which: &[usize],
    backs: &mut [Back],
) -> Vec<(usize, Result<Restored, NotRestored>)> {
    let n = ranks.len();
    // The ranks whose guards restored them (reached, settled): a group meets only when every
    // rank starts with it, so they stop and start with the ranks restored here, their files as
    // their guards left them. Not restored again.
    let with_group: Vec<usize> = (0..n)
        .filter(|i| !which.contains(i) && backs[*i].left_to_guard && backs[*i].reached)
        .collect();
    if n > 1 {
        let stopping: Vec<usize> = which.iter().chain(&with_group).copied().collect();
        for (i, e) in stop_ranks(ranks, &stopping).await {
            backs[i].stop_failed = Some(e);
        }
    }
    let restores: Vec<_> = ranks.iter().map(|r| r.fallback.restore(&r.job)).collect();
    let mut results: Vec<Option<Result<Restored, NotRestored>>> = (0..n).map(|_| None).collect();
    for i in start_order(n) {
        if which.contains(&i) {
            if let Err(e) = restore(&restores[i]).await {
                results[i] = Some(Err(NotRestored::Restore(e)));
            }
        } else if with_group.contains(&i) {
            let (host, unit) = (ranks[i].job.host, &ranks[i].job.t.desired.unit);
            // One that does not start leaves its group unmet: the verification below says so.
            if let Err(e) = host.run_ok(&["systemctl", "start", "--", unit]).await {
                tracing::warn!(
                    rank = i,
                    "starting the rank with its group: {}",
                    error_chain(&e)
                );
            }
        }
    }
    let never = CancellationToken::new();
    let mut to_verify = Vec::new();
    let mut checks = Vec::new();
    for &i in which {
        if results[i].is_some() {
            continue;
        }
        match restored_check(&restores[i], &never) {
            Ok(check) => {
                to_verify.push(i);
                checks.push(check);
            }
            Err(restored) => results[i] = Some(Ok(restored)),
        }
    }
    let hosts: Vec<&dyn Host> = to_verify.iter().map(|&i| ranks[i].job.host).collect();
    let (verified, _) = together(&hosts, ranks[0].job.verifier, checks, &never).await;
    for (i, result) in to_verify.into_iter().zip(verified) {
        results[i] = Some(
            result
                .map(|v| Restored::Verified(Box::new(v)))
                .map_err(NotRestored::Verify),
        );
    }
    which
        .iter()
        .map(|&i| (i, results[i].take().expect("every rank restored or not")))
        .collect()
}

/// The rank to blame among `causes`. A rank cut short by a peer's failure may have crashed as
/// well (when rank 1 crashes, rank 0 dies of it, and either death may be seen first): one whose
/// process failed is a candidate too, after those that failed in their own right. Journals say
/// which died of a peer (`reconcile_core::group::root_cause`).
fn blame(ranks: &[Rank<'_>], causes: Vec<Cause>, cut_short: &[(usize, Stage)]) -> Cause {
    let mut causes = causes;
    for &(i, stage) in cut_short {
        let journal = ranks[i].report.report.journal.as_deref().unwrap_or("");
        if let Some(line) = reconcile_core::group::process_failure(journal) {
            causes.push(Cause {
                rank: i,
                stage,
                error: ApplyError::VerificationFailed {
                    stage,
                    reason: format!("its process failed ({})", line.trim()),
                },
            });
        }
    }
    let seen: Vec<(usize, bool)> = causes
        .iter()
        .map(|c| {
            let journal = ranks[c.rank].report.report.journal.as_deref().unwrap_or("");
            (c.rank, reconcile_core::group::died_of_a_peer(journal))
        })
        .collect();
    let blamed = reconcile_core::group::root_cause(&seen).unwrap_or(0);
    causes
        .into_iter()
        .find(|c| c.rank == blamed)
        .expect("the blamed rank is one of the causes")
}
