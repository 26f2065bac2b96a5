//! Applying a server group (`nodes:`): one SGLang server over several hosts, a unit per rank,
//! applied as one unit of work. The ranks form one torch process group: none serves until all
//! have joined the rendezvous on rank 0, and one that dies takes the others down (sglang 0.5.23
//! `managers/scheduler.py`, `run_scheduler_process`: a scheduler's exception SIGQUITs its parent).
//! So, where a replica is applied alone, a group is applied whole:
//!
//! 1. every rank is looked at and planned; one unreachable, refused or overridden rank leaves the
//!    whole group untouched. The group's verdict is `reconcile_core::group`'s: any rank that
//!    restarts restarts them all;
//! 2. preflight on every rank (and the rendezvous port free on rank 0), then every rank's lock;
//! 3. rank 0 drained, every rank's unit installed (a failure puts every file back);
//! 4. every rank stopped (highest first), then started in the order SGLang needs (rank 0 first:
//!    it hosts the rendezvous, `reconcile_core::group::start_order`);
//! 5. every rank verified at once: rank 0 through HTTP (warmup, readiness, identity, smoke), the
//!    others through their process, memory, journal and SGLang's dummy health port
//!    (`verify::Expect::follower`). The first rank to fail cuts the others short. Then rank 0's
//!    benchmark and quality gate;
//! 6. any failure stops every rank, puts every previous unit back, starts them in order and
//!    verifies the group again. Success records every rank's deployment.
//!
//! Each rank keeps its report; the ranks' reports say what the group did and which rank failed.

use std::sync::Mutex;
use std::time::Instant;

use futures::future::join_all;
use reconcile_core::group::{group_verdict, rank_verdict, start_order, stop_order};
use reconcile_core::learned::LoadHistory;
use tokio_util::sync::CancellationToken;

use super::decide::{self, Ending, Previous, Start};
use super::error::ApplyError;
use super::guard::{self, Armed};
use super::install::{self, Fallback};
use super::restore::{put_back_file, restore, restored_check, NotRestored, Restored};
use super::verifier::{Check, Live, Verifier};
use super::{state, ApplyOptions, Job, Outcome, Report, UnitReport};
use crate::manifest::VerifySpec;
use crate::observed::Observed;
use crate::plan::{plan, Verdict};
use crate::preflight::{self, Survey};
use crate::remote::{self, error_chain, Host, SshOptions};
use crate::systemd::Systemd as _;
use crate::targets::Target;
use crate::verify::{Expect, Failure, Stage, Verification};

/// Applies one server group: `targets` are its ranks (any order). Connects to every rank first;
/// one that cannot be reached leaves the group untouched.
pub(crate) async fn apply_group(
    mut targets: Vec<Target>,
    ssh: &SshOptions,
    options: &ApplyOptions,
) -> Vec<UnitReport> {
    targets.sort_by_key(|t| t.group.as_ref().map_or(0, |g| g.rank));
    // Behind a router, rank 0 is drained as a replica out of it is (`routed::draining`).
    let routed = options.routers.as_ref().and_then(|r| r.of(&targets[0]));
    if let (Some(_), Some(spec)) = (routed, targets[0].manifest.router.clone()) {
        targets[0] = super::routed::draining(&targets[0], &spec);
    }
    let started = Instant::now();
    if options.cancel.is_cancelled() {
        let e = ApplyError::InterruptedBeforeHost;
        return targets
            .iter()
            .map(|t| Report::new(t, started).fail(&e))
            .collect();
    }
    let connected = join_all(targets.iter().map(|t| remote::connect(&t.host, ssh))).await;
    let mut hosts = Vec::new();
    let mut unreachable = None;
    for (i, c) in connected.into_iter().enumerate() {
        match c {
            Ok(h) => hosts.push(h),
            Err(e) => {
                unreachable.get_or_insert((i, ApplyError::Unreachable(error_chain(&e))));
            }
        }
    }
    let reports = match unreachable {
        Some((i, e)) => refuse_all(&targets, started, i, &e),
        None => {
            let verifier = Live {
                progress: options.progress.as_ref(),
            };
            let hosts: Vec<&dyn Host> = hosts.iter().map(|h| &**h).collect();
            apply_on(&hosts, &targets, options, &verifier).await
        }
    };
    for h in hosts {
        h.close().await;
    }
    reports
}

/// Every rank refused, touching nothing, because rank `failed` was refused for `e`: that rank
/// reports `e`, the others that the group was not applied for it.
fn refuse_all(
    targets: &[Target],
    started: Instant,
    failed: usize,
    e: &ApplyError,
) -> Vec<UnitReport> {
    targets
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let mut r = Report::new(t, started);
            if i == failed {
                r.fail(e)
            } else {
                r.report.error = None;
                r.fail(&ApplyError::Refused(peer_refused(
                    failed,
                    &targets[failed].host,
                    e,
                )))
            }
        })
        .collect()
}

fn peer_refused(rank: usize, host: &str, e: &ApplyError) -> String {
    format!("the server group is applied whole, and its rank {rank} ({host}) was refused: {e}")
}

/// A rank of the group as its apply goes on.
struct Rank<'a> {
    job: Job<'a>,
    report: Report,
    observed: Observed,
    survey: Option<Survey>,
    /// What this rank does in the group (`reconcile_core::group::rank_verdict`).
    verdict: Verdict,
    fallback: Fallback,
    locked: bool,
    /// The new unit's invocation, once started ("" before).
    invocation: String,
    /// Verification settings, learned from the rank's past loads where the manifest left them.
    spec: VerifySpec,
    history: Option<LoadHistory>,
    learned_notes: Vec<String>,
}

/// How a rank stands after its first look.
enum Look {
    Unchanged,
    Install(decide::Install),
}

/// The group's apply over connections the caller holds, one host per rank, in rank order.
async fn apply_on(
    hosts: &[&dyn Host],
    targets: &[Target],
    options: &ApplyOptions,
    verifier: &dyn Verifier,
) -> Vec<UnitReport> {
    let started = Instant::now();
    let jobs: Vec<Job<'_>> = hosts
        .iter()
        .zip(targets)
        .map(|(host, t)| Job {
            host: *host,
            t,
            options,
            verifier,
        })
        .collect();
    // 1. Every rank looked at and planned; nothing is touched unless all can go on.
    let looked = join_all(jobs.iter().map(look)).await;
    let mut seen = Vec::new();
    for (i, l) in looked.into_iter().enumerate() {
        match l {
            Ok(l) => seen.push(l),
            Err(e) => return refuse_all(targets, started, i, &e),
        }
    }
    let own: Vec<Verdict> = seen
        .iter()
        .map(|(_, _, look, _)| match look {
            Look::Unchanged => Verdict::NoChange,
            Look::Install(todo) => todo.verdict,
        })
        .collect();
    let group = group_verdict(&own);
    if group == Verdict::NoChange {
        return targets
            .iter()
            .map(|t| super::unchanged(t, started))
            .collect();
    }
    // Behind a router, rank 0 (the group's only API) leaves it before a restart, like a replica
    // (`rollout::behind_router`); a reload keeps it serving.
    let router = match group {
        Verdict::Restart | Verdict::Install => {
            options.routers.as_ref().and_then(|r| r.of(&targets[0]))
        }
        _ => None,
    };
    let taken_out = match router {
        None => None,
        Some(router) => {
            let out = match router {
                Ok(router) => super::routed::TakenOut::take_out(router, &targets[0]).await,
                Err(e) => Err(ApplyError::Router(e)),
            };
            match out {
                Ok(out) => Some(out),
                Err(e) => return refuse_all(targets, started, 0, &e),
            }
        }
    };
    let mut ranks: Vec<Rank<'_>> = Vec::new();
    for (job, (observed, survey, look, drift)) in jobs.into_iter().zip(seen) {
        let verdict = rank_verdict(own[ranks.len()], group);
        let mut report = Report::new(job.t, started);
        let todo = match look {
            Look::Install(todo) => todo,
            // Unchanged itself, restarted with its group: its running process belongs to the
            // old process group.
            Look::Unchanged => decide::Install {
                verdict,
                previous: Previous::Observed,
                was_running: matches!(
                    observed.state.active_state.as_str(),
                    "active" | "activating"
                ),
                note: (verdict != Verdict::NoChange).then(|| {
                    "this rank's unit is unchanged; it restarts with its group".to_string()
                }),
                confirm: false,
            },
        };
        report.report.notes.extend(todo.note.clone());
        let previous = match todo.previous {
            Previous::Observed if observed.layers.managed_is_mask => None,
            Previous::Observed => observed.unit_text.clone(),
            Previous::NewestGeneration => state::newest_generation(job.host, &job.t.desired.unit)
                .await
                .ok()
                .flatten(),
        };
        let layered = super::layered(&job.t.desired.unit, &observed, &drift);
        report
            .report
            .notes
            .extend(super::moved_notes(&job.t.desired.unit, &layered));
        report.report.verdict = Some(verdict);
        ranks.push(Rank {
            job,
            report,
            observed,
            survey,
            verdict,
            fallback: Fallback {
                previous,
                was_running: todo.was_running,
                kept: None,
                layers: layered,
            },
            locked: false,
            invocation: String::new(),
            spec: VerifySpec::default(),
            history: None,
            learned_notes: Vec::new(),
        });
    }
    let endings = run(&mut ranks).await;
    let mut reports = Vec::new();
    for (mut rank, ending) in ranks.into_iter().zip(endings) {
        if rank.locked {
            super::unlock(
                rank.job.host,
                &rank.job.t.desired.unit,
                &mut rank.report.report,
            )
            .await;
        }
        reports.push(rank.report.finish(ending));
    }
    if let Some(out) = taken_out {
        out.put_back(&mut reports[0]).await;
    }
    reports
}

/// A rank's first look: its unit, systemd's state and record from one survey, its plan, and
/// whether it can go on.
async fn look(
    job: &Job<'_>,
) -> Result<(Observed, Option<Survey>, Look, Vec<crate::layers::Drift>), ApplyError> {
    let (host, t, options) = (job.host, job.t, job.options);
    let unit = &t.desired.unit;
    let ask = preflight::Ask {
        preflight: true,
        records: Some(state::STATE_DIR),
    };
    let (observed, survey) = match preflight::survey(host, std::slice::from_ref(t), ask).await {
        Ok(Some(survey)) => survey.observed(unit).map(|o| (o, Some(survey))),
        Ok(None) => host.observe(unit).await.map(|o| (o, None)),
        Err(e) => Err(e),
    }
    .map_err(|e| ApplyError::ObserveFailed(error_chain(&e)))?;
    if let Some(e) = decide::stale_plan(t, &observed) {
        return Err(e);
    }
    let planned = plan(&t.host, &t.source, &t.desired, &observed, &options.redactor);
    if let Some(e) = decide::overridden(unit, &planned.drift, options.dropins(t)) {
        return Err(e);
    }
    let unfinished = match planned.verdict {
        Verdict::NoChange => Some(match survey.as_ref().and_then(|s| s.record(unit)) {
            Some(record) => super::recorded(&observed, Some(record)),
            None => super::unfinished(host, t, &observed).await,
        }),
        _ => None,
    };
    let look = match decide::start(planned.verdict, &observed, unfinished, None) {
        Start::Unchanged => Look::Unchanged,
        Start::Refuse(e) => return Err(e),
        Start::Install(todo) => Look::Install(todo),
    };
    Ok((observed, survey, look, planned.drift))
}

/// Steps 2 to 6 for ranks that have work: each rank's ending, in rank order.
async fn run(ranks: &mut [Rank<'_>]) -> Vec<Ending> {
    if let Err((i, e)) = prepare(ranks).await {
        return refused_endings(ranks, i, &e);
    }
    let options = ranks[0].job.options;
    // The quality gate's reference and noise floor, read from rank 0 while the old group serves.
    let quality_before = match (&ranks[0].job.t.verify.quality, ranks[0].verdict) {
        (Some(spec), Verdict::Restart | Verdict::Install) if options.restoring.is_none() => {
            let previous = ranks[0]
                .fallback
                .was_running
                .then(|| ranks[0].fallback.previous_expect())
                .flatten();
            Some(super::quality::before(&ranks[0].job, spec, previous.as_ref()).await)
        }
        _ => None,
    };
    // Rank 0 serves the group's API: it alone is drained.
    {
        let Rank {
            job,
            verdict,
            fallback,
            report,
            ..
        } = &mut ranks[0];
        if let Some(ending) = install::drain(job, *verdict, fallback, &mut report.report).await {
            let e = ApplyError::Refused(format!(
                "rank 0's drain stopped the group's restart: {}",
                ending.detail
            ));
            let mut endings = refused_endings(ranks, 0, &e);
            endings[0] = ending;
            return endings;
        }
    }
    // 3. Every rank's unit in place, or every file put back.
    let written = join_all(ranks.iter_mut().map(|r| async move {
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
        install::write_unit(job, observed, fallback).await
    }))
    .await;
    if let Some((i, e)) = written
        .iter()
        .enumerate()
        .find_map(|(i, w)| w.as_ref().err().map(|e| (i, e)))
    {
        let e = ApplyError::InstallFailed(error_chain(e));
        let put_back = put_back_all(ranks).await;
        return ranks
            .iter()
            .enumerate()
            .map(|(j, r)| {
                let back = put_back[j].clone();
                if j == i {
                    decide::install_failed(&e, back)
                } else {
                    let peer = ApplyError::InstallFailed(format!(
                        "rank {i} ({}) of the server group could not be installed: {e}",
                        r.job.t.host
                    ));
                    decide::install_failed(&peer, back)
                }
            })
            .collect();
    }
    if ranks
        .iter()
        .all(|r| r.verdict != Verdict::Restart && r.verdict != Verdict::Install)
    {
        // A reload-only change: the group keeps serving.
        let mut endings = Vec::new();
        for r in ranks.iter_mut() {
            if r.verdict == Verdict::ReloadOnly {
                install::record(&r.job, Outcome::Reloaded, None, &mut r.report.report).await;
                endings.push(decide::reloaded());
            } else {
                endings.push(Ending {
                    outcome: Outcome::Unchanged,
                    detail: "already up to date; nothing touched (the group only reloaded)".into(),
                    error: None,
                });
            }
        }
        return endings;
    }
    for r in ranks.iter_mut() {
        r.history = install::load_history(&r.job, &mut r.report.report).await;
        let (spec, notes) =
            reconcile_core::learned::learned_spec(&r.job.t.verify, r.history.as_ref());
        r.spec = spec;
        r.learned_notes = notes;
    }
    // The last moment to stop without a restart.
    if options.cancel.is_cancelled() {
        let put_back = put_back_all(ranks).await;
        let interrupted = crate::signals::interrupted();
        return put_back
            .into_iter()
            .map(|back| decide::cancelled_before_restart(&interrupted, back))
            .collect();
    }
    let before = match &ranks[0].job.t.verify.benchmark {
        Some(_) => state::read_record(ranks[0].job.host, &ranks[0].job.t.desired.unit)
            .await
            .ok()
            .flatten(),
        None => None,
    };
    // Every rank's guard armed before any stops: should this process die, each rank's guard
    // judges its own rank (a follower answers `/health` on its dummy port once its group loaded).
    let armed = join_all(
        ranks
            .iter()
            .map(|r| guard::arm(&r.job, r.fallback.going_back())),
    )
    .await;
    if let Some((i, e)) = armed
        .iter()
        .enumerate()
        .find_map(|(i, a)| a.as_ref().err().map(|e| (i, error_chain(e))))
    {
        for a in armed.iter().flatten() {
            let _ = a.disarm().await;
        }
        let put_back = put_back_all(ranks).await;
        let e = ApplyError::InstallFailed(format!(
            "the host's guard could not be armed on rank {i} ({}): {e}",
            ranks[i].job.t.host
        ));
        return put_back
            .into_iter()
            .map(|back| decide::install_failed(&e, back))
            .collect();
    }
    let armed: Vec<Armed<'_>> = armed.into_iter().flatten().collect();
    let guards: Vec<&Armed<'_>> = armed.iter().collect();
    // 4. Stopped together, started in SGLang's order.
    if let Err((i, e)) = restart_in_order(ranks).await {
        let failed = Cause {
            rank: i,
            stage: Stage::Restart,
            error: ApplyError::RestartFailed(e),
        };
        return roll_back(ranks, vec![failed], &[], &guards).await;
    }
    // 5. Every rank verified at once, under a child of the run's token: Ctrl-C cancels it with
    // the run, and the first rank to fail cancels it alone.
    let group_cancel = options.cancel.child_token();
    let checks: Vec<Check<'_>> = ranks
        .iter()
        .map(|r| Check {
            unit: &r.job.t.desired.unit,
            spec: &r.spec,
            expect: Expect::from_unit(&r.job.t.desired.model),
            label: format!(
                "{} {} (rank {})",
                r.job.t.host,
                r.job.t.desired.unit,
                rank_of(r)
            ),
            cancel: &group_cancel,
            history: r.history.as_ref(),
        })
        .collect();
    let hosts: Vec<&dyn Host> = ranks.iter().map(|r| r.job.host).collect();
    let verifying = together(&hosts, ranks[0].job.verifier, checks, &group_cancel);
    let (results, first) = guard::leased_all(&guards, verifying).await;
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
    if !failures.is_empty() {
        // A rank whose verification ended on the group's cancel was cut short by a peer; the
        // others failed in their own right, in the order seen (the first to fail first).
        let interrupted = crate::signals::interrupted();
        let ctrl_c = options.cancel.is_cancelled();
        let (own, cut): (Vec<_>, Vec<_>) = failures
            .iter()
            .partition(|(_, f)| ctrl_c || f.reason != interrupted);
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
            .map(|(i, f)| Cause::stage(*i, f.stage, f.reason.clone()))
            .collect();
        for (i, f) in &failures {
            ranks[*i].report.report.failed_stage = Some(f.stage);
        }
        let cut: Vec<(usize, Stage)> = cut.iter().map(|(i, f)| (*i, f.stage)).collect();
        return roll_back(ranks, causes, &cut, &guards).await;
    }
    // Rank 0's benchmark and quality gate: the group's API is rank 0's.
    let keep;
    {
        let Rank { job, report, .. } = &mut ranks[0];
        let v = &mut verified[0];
        let benchmark = install::throughput_gate(job, v, before.as_ref(), &mut report.report);
        if let Some(reason) = guard::leased_all(&guards, benchmark).await {
            report.report.verification = Some(v.clone());
            let failed = Cause::stage(0, Stage::Benchmark, reason);
            return roll_back(ranks, vec![failed], &[], &guards).await;
        }
        let quality = install::quality_gate(job, v, quality_before.as_ref(), &mut report.report);
        match guard::leased_all(&guards, quality).await {
            Err(reason) => {
                report.report.verification = Some(v.clone());
                let failed = Cause::stage(0, Stage::Quality, reason);
                return roll_back(ranks, vec![failed], &[], &guards).await;
            }
            Ok(k) => keep = k,
        }
    }
    for (i, g) in guards.iter().enumerate() {
        install::disarm(g, &mut ranks[i].report.report).await;
    }
    // Every rank passed: each deployment recorded.
    let n = ranks.len();
    let mut endings = Vec::new();
    for (i, (r, v)) in ranks.iter_mut().zip(verified).enumerate() {
        let mut ending = decide::converged(&v);
        if i == 0 {
            if let Some(b) = &r.report.report.benchmark {
                ending.detail.push_str(&decide::benchmark_passed(&b.detail));
            }
            if let Some(q) = &r.report.report.quality {
                ending.detail.push_str(&format!("; quality: {}", q.detail));
            }
            if let Some(reference) = &keep {
                r.report
                    .report
                    .notes
                    .extend(reconcile_core::quality::oversize_note(reference));
                if let Err(e) =
                    crate::quality::keep_reference(r.job.host, &r.job.t.desired.unit, reference)
                        .await
                {
                    r.report.report.notes.push(format!(
                        "quality: the new reference could not be kept: {}",
                        error_chain(&e)
                    ));
                }
            }
        }
        ending
            .detail
            .push_str(&format!(" (rank {i} of {n}; the group restarted together)"));
        install::record(&r.job, Outcome::Converged, Some(&v), &mut r.report.report).await;
        r.report.report.verification = Some(v);
        endings.push(ending);
    }
    endings
}

/// Step 2: preflight on every rank, the rendezvous port on rank 0, then every rank's lock. `Err`
/// names the rank that stopped the group; locks taken are released by the caller.
async fn prepare(ranks: &mut [Rank<'_>]) -> Result<(), (usize, ApplyError)> {
    let checked = join_all(ranks.iter_mut().map(|r| async move {
        let Rank {
            job,
            observed,
            verdict,
            survey,
            report,
            ..
        } = r;
        super::run_preflight(job, observed, *verdict, survey.as_ref(), &mut report.report).await
    }))
    .await;
    if let Some((i, e)) = checked
        .into_iter()
        .enumerate()
        .find_map(|(i, c)| c.err().map(|e| (i, e)))
    {
        return Err((i, e));
    }
    let rank0 = &ranks[0];
    if let Some(port) = rendezvous(&rank0.job.t.desired.model) {
        let unit = &rank0.job.t.desired.unit;
        let found =
            preflight::rendezvous_free(rank0.job.host, unit, port, rank0.observed.state.main_pid)
                .await
                .map_err(|e| (0, ApplyError::PreflightCouldNotRun(error_chain(&e))))?;
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
            Err(e) => return Err((i, e)),
        }
        if let Some(expected) = &t.expected {
            super::still_as_planned(host, t, expected, &r.observed)
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

/// Endings for a group stopped before anything changed, by rank `failed`'s refusal `e`.
fn refused_endings(ranks: &[Rank<'_>], failed: usize, e: &ApplyError) -> Vec<Ending> {
    (0..ranks.len())
        .map(|i| {
            if i == failed {
                Ending::refused(e)
            } else {
                let host = &ranks[failed].job.t.host;
                Ending::refused(&ApplyError::Refused(peer_refused(failed, host, e)))
            }
        })
        .collect()
}

/// Every rank's file put back after a failed install or a cancel before the restart: each
/// rank's `Ok(whether anything was put back)`, or why it could not be.
async fn put_back_all(ranks: &[Rank<'_>]) -> Vec<Result<bool, String>> {
    join_all(ranks.iter().map(|r| async move {
        put_back_file(
            r.job.host,
            &r.job.t.desired.unit,
            r.fallback.previous.as_deref(),
            r.fallback.layers.aside.as_ref(),
        )
        .await
        .map_err(|e| error_chain(&e))
    }))
    .await
}

fn rank_of(r: &Rank<'_>) -> usize {
    r.job.t.group.as_ref().map_or(0, |g| g.rank)
}

/// Stops every rank (the highest first, rank 0 and its rendezvous last), then starts them in the
/// order SGLang needs (`reconcile_core::group::start_order`): rank 0 first, then the others at
/// once, so their starts lie as close together as one `systemctl start` on rank 0 allows (a rank
/// waits at the rendezvous for the others, and loads only when all are there). Each invocation
/// is noted. `Err` names the rank that could not be stopped or started.
async fn restart_in_order(ranks: &mut [Rank<'_>]) -> Result<(), (usize, String)> {
    for i in stop_order(ranks.len()) {
        let (host, unit) = (ranks[i].job.host, &ranks[i].job.t.desired.unit);
        host.run_ok(&["systemctl", "stop", "--", unit])
            .await
            .map_err(|e| (i, error_chain(&e)))?;
    }
    // New units enabled first, so the starts below are one command each.
    let enabled = join_all(ranks.iter().map(|r| async move {
        if r.verdict == Verdict::Install {
            r.job
                .host
                .run_ok(&["systemctl", "enable", "--", &r.job.t.desired.unit])
                .await?;
        }
        Ok::<(), remote::RemoteError>(())
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
        start(first).await.map_err(|e| (first, error_chain(&e)))?;
        let started = join_all(rest.iter().map(|&i| start(i))).await;
        if let Some((j, e)) = started
            .into_iter()
            .enumerate()
            .find_map(|(j, r)| r.err().map(|e| (j, e)))
        {
            return Err((rest[j], error_chain(&e)));
        }
    }
    let invocations = join_all(ranks.iter().map(|r| async move {
        Ok::<String, remote::RemoteError>(
            r.job
                .host
                .unit_state(&r.job.t.desired.unit)
                .await?
                .invocation_id,
        )
    }))
    .await;
    for (i, invocation) in invocations.into_iter().enumerate() {
        ranks[i].invocation = invocation.map_err(|e| (i, error_chain(&e)))?;
    }
    Ok(())
}

/// The first rank whose step failed, with why.
fn first_error(results: Vec<Result<(), remote::RemoteError>>) -> Result<(), (usize, String)> {
    match results
        .into_iter()
        .enumerate()
        .find_map(|(i, r)| r.err().map(|e| (i, e)))
    {
        Some((i, e)) => Err((i, error_chain(&e))),
        None => Ok(()),
    }
}

/// What failed the group: the rank, the stage and the error.
struct Cause {
    rank: usize,
    stage: Stage,
    error: ApplyError,
}

impl Cause {
    fn stage(rank: usize, stage: Stage, reason: String) -> Cause {
        Cause {
            rank,
            stage,
            error: ApplyError::VerificationFailed { stage, reason },
        }
    }
}

/// Runs every rank's check at once, each under `group` (the token the checks carry). The first to
/// fail cancels it, cutting the others short: without that, they would wait for a peer that is
/// gone until their own deadlines. Whoever cancels `group`'s parent (Ctrl-C) cuts them all short
/// too. Returns each rank's result and the rank that failed first, if one did.
async fn together(
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

/// Step 6: every rank stopped, every previous unit put back and started in order, and the group
/// verified again. Each rank's ending says what failed (its own stage, or the rank that failed
/// first) and how its rollback went. `cut_short`: the ranks a peer's failure cut short, each with
/// the stage it was cut at.
async fn roll_back(
    ranks: &mut [Rank<'_>],
    causes: Vec<Cause>,
    cut_short: &[(usize, Stage)],
    guards: &[&Armed<'_>],
) -> Vec<Ending> {
    // Taken over first, so each rank's guard finishes this rollback should this process die in
    // it; renewed while it runs; disarmed once it is done.
    for g in guards {
        let _ = g.take().await;
    }
    let endings = guard::leased_all(guards, restore_group(ranks, causes, cut_short)).await;
    for (i, g) in guards.iter().enumerate() {
        if let Err(e) = g.disarm().await {
            ranks[i].report.report.notes.push(format!(
                "the host's guard could not be disarmed after the rollback: {}",
                error_chain(&e)
            ));
        }
    }
    endings
}

/// The group's rollback proper: every rank stopped, restored, started in order and verified.
async fn restore_group(
    ranks: &mut [Rank<'_>],
    causes: Vec<Cause>,
    cut_short: &[(usize, Stage)],
) -> Vec<Ending> {
    // Stopped first, all of them: a rank on its old unit must not dial into a new rank 0.
    let mut stopped: Vec<Option<String>> = vec![None; ranks.len()];
    for i in stop_order(ranks.len()) {
        let (host, unit) = (ranks[i].job.host, &ranks[i].job.t.desired.unit);
        if let Err(e) = host.run_ok(&["systemctl", "stop", "--", unit]).await {
            stopped[i] = Some(error_chain(&e));
        }
    }
    let restores: Vec<_> = ranks.iter().map(|r| r.fallback.restore(&r.job)).collect();
    let mut put_back: Vec<Option<Result<Restored, NotRestored>>> =
        (0..ranks.len()).map(|_| None).collect();
    for i in start_order(ranks.len()) {
        if let Err(e) = restore(&restores[i]).await {
            put_back[i] = Some(Err(NotRestored::Restore(error_chain(&e))));
        }
    }
    // The restored ranks verified together, as the new ones were, under a token of their own, no
    // child of the run's: a second Ctrl-C does not cut this short, for it is the way back.
    let group_cancel = CancellationToken::new();
    let mut to_verify = Vec::new();
    let mut checks = Vec::new();
    for (i, r) in restores.iter().enumerate() {
        if put_back[i].is_some() {
            continue;
        }
        match restored_check(r, &group_cancel) {
            Ok(check) => {
                to_verify.push(i);
                checks.push(check);
            }
            Err(restored) => put_back[i] = Some(Ok(restored)),
        }
    }
    let hosts: Vec<&dyn Host> = to_verify.iter().map(|&i| ranks[i].job.host).collect();
    let (results, _) = together(&hosts, ranks[0].job.verifier, checks, &group_cancel).await;
    for (i, result) in to_verify.into_iter().zip(results) {
        put_back[i] = Some(
            result
                .map(|v| Restored::Verified(Box::new(v)))
                .map_err(NotRestored::Verify),
        );
    }
    drop(restores);
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
    // A rank cut short by a peer's failure may have crashed as well (when rank 1 crashes, rank 0
    // dies of it, and either death may be seen first): one whose process failed is a candidate
    // too, after those that failed in their own right.
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
    let cause = causes
        .into_iter()
        .find(|c| c.rank == blamed)
        .expect("the blamed rank is one of the causes");
    let kind = cause.error.kind();
    let failed_host = ranks[cause.rank].job.t.host.clone();
    ranks[cause.rank].report.report.failed_stage = Some(cause.stage);
    let cut_text = format!(
        "cut short: the group's rank {} ({failed_host}) failed its {}",
        cause.rank, cause.stage
    );
    let mut endings = Vec::new();
    for (i, r) in ranks.iter_mut().enumerate() {
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
        let result = put_back[i]
            .take()
            .unwrap_or(Err(NotRestored::Restore("not restored".into())));
        let mut text = if i == cause.rank {
            cause.error.to_string()
        } else {
            format!(
                "the server group failed: rank {} ({failed_host}) {}",
                cause.rank, cause.error
            )
        };
        if let Some(e) = &stopped[i] {
            text.push_str(&format!("; stopping it failed: {e}"));
        }
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

#[cfg(test)]
mod tests {
    use futures::future::BoxFuture;

    use super::*;
    use crate::remote::fake::FakeHost;
    use crate::unit::UnitModel;

    /// Rank `fails` fails its loading at once; every other rank verifies until its token is
    /// cancelled, then fails as a cancelled verification does.
    struct OneFails {
        fails: Option<usize>,
    }

    impl Verifier for OneFails {
        fn verify<'a>(
            &'a self,
            _host: &'a dyn Host,
            check: Check<'a>,
        ) -> BoxFuture<'a, Result<Verification, Failure>> {
            let failure = |reason: String| Failure {
                stage: Stage::Loading,
                reason,
                verification: Box::default(),
            };
            Box::pin(async move {
                if self
                    .fails
                    .is_some_and(|i| check.label == format!("rank {i}"))
                {
                    return Err(failure("a worker process died".into()));
                }
                check.cancel.cancelled().await;
                Err(failure(crate::signals::interrupted()))
            })
        }
    }

    async fn verify_three(verifier: &OneFails, group: &CancellationToken) -> Option<usize> {
        let hosts = [
            FakeHost::new("gpu-a"),
            FakeHost::new("gpu-b"),
            FakeHost::new("gpu-c"),
        ];
        let hosts: Vec<&dyn Host> = hosts.iter().map(|h| h as &dyn Host).collect();
        let spec = VerifySpec::default();
        let checks = (0..3)
            .map(|i| Check {
                unit: "s.service",
                spec: &spec,
                expect: Expect::from_unit(&UnitModel::default()),
                label: format!("rank {i}"),
                cancel: group,
                history: None,
            })
            .collect();
        let (results, first) = together(&hosts, verifier, checks, group).await;
        assert!(results.iter().all(Result::is_err), "every rank failed");
        first
    }

    #[tokio::test]
    async fn the_first_rank_to_fail_cuts_its_group_short_but_not_the_run() {
        let run = CancellationToken::new();
        let group = run.child_token();
        let first = verify_three(&OneFails { fails: Some(1) }, &group).await;
        assert_eq!(first, Some(1));
        assert!(group.is_cancelled());
        assert!(
            !run.is_cancelled(),
            "the run goes on to roll the group back"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_signal_cuts_the_group_short_and_no_rank_failed_first() {
        let run = CancellationToken::new();
        let group = run.child_token();
        let signal = run.clone();
        tokio::spawn(async move {
            tokio::time::sleep(std::time::Duration::from_secs(5)).await;
            signal.cancel();
        });
        let first = verify_three(&OneFails { fails: None }, &group).await;
        assert_eq!(first, None);
        assert!(group.is_cancelled());
    }
}
