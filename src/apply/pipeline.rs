//! The one apply pipeline. A server is a group of ranks, one unit on one host each: a single
//! server is a group of one, a server over several hosts (`nodes:`) one SGLang server whose ranks
//! form one torch process group (none serves until all joined the rendezvous on rank 0, and one
//! that dies takes the others down: sglang 0.5.23 `managers/scheduler.py`,
//! `run_scheduler_process`). So a server is applied whole, and its steps are
//! `reconcile_core::transaction`'s state machine; this file carries each step out on every rank:
//!
//! 1. every rank is looked at and planned; one unreachable, refused or overridden rank leaves the
//!    whole server untouched. The server's verdict is `reconcile_core::group`'s: any rank that
//!    restarts restarts them all;
//! 2. preflight on every rank (and the rendezvous port free on rank 0), then every rank's lock;
//! 3. rank 0 drained, every rank's unit installed (a failure puts every file back);
//! 4. every rank's guard armed on its host, then every rank stopped as SGLang stops a group (rank
//!    0 drains the requests in flight, and its shutdown ends the others:
//!    `reconcile_core::group::stop_steps`) and started in the order SGLang needs (rank 0 first: it
//!    hosts the rendezvous, `reconcile_core::group::start_order`);
//! 5. every rank verified at once: rank 0 through HTTP (warmup, readiness, identity, smoke), the
//!    others through their process, memory, journal and SGLang's dummy health port
//!    (`verify::Expect::follower`). The first rank to fail cuts the others short. Then rank 0's
//!    benchmark and quality gate;
//! 6. any failure takes every guard over, puts every previous unit back, starts them in order and
//!    verifies the server again, through hosts that may go away and come back. Success disarms
//!    the guards and records every rank's deployment.
//!
//! Each rank keeps its report; a group's reports say what the group did and which rank failed.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use futures::future::join_all;
use reconcile_core::group::{group_verdict, rank_verdict, start_order, stop_steps, StopStep};
use reconcile_core::guard::{Change, GuardState};
use reconcile_core::learned::LoadHistory;
use reconcile_core::live::LiveChange;
use reconcile_core::transaction::{Kind, Step, Transaction, Went};
use tokio_util::sync::CancellationToken;

use super::decide::{self, Ending, Previous, Start};
use super::error::{ApplyError, ApplyErrorKind};
use super::guard::{self, Armed};
use super::install::{self, Fallback};
use super::restore::{put_back_file, restore, restored_check, NotRestored, Restored};
use super::verifier::{Check, Live, Verifier};
use super::{state, ApplyOptions, Job, Outcome, Report, UnitReport};
use crate::manifest::VerifySpec;
use crate::observed::Observed;
use crate::plan::{plan, Verdict};
use crate::preflight::{self, Survey};
use crate::remote::{self, error_chain, Host, RemoteError, SshOptions};
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
            apply_on(&hosts, &targets, options, &verifier, true).await
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

/// A rank of the server as its apply goes on.
struct Rank<'a> {
    job: Job<'a>,
    report: Report,
    observed: Observed,
    survey: Option<Survey>,
    /// What this rank does in the server (`reconcile_core::group::rank_verdict`).
    verdict: Verdict,
    fallback: Fallback,
    locked: bool,
    /// The new unit's invocation, once started ("" before).
    invocation: String,
    /// Verification settings, learned from the rank's past loads where the manifest left them.
    spec: VerifySpec,
    history: Option<LoadHistory>,
    learned_notes: Vec<String>,
    /// Preflight's check of the weights (a rank whose server starts), which staging reads.
    weights: Option<preflight::WeightsCheck>,
    /// What the running server is told, for a change applied live (`Kind::Live`).
    live: Option<LiveChange>,
    /// What the server did with the live change, once told ("" before).
    told: String,
}

/// How a rank stands after its first look.
enum Look {
    Unchanged,
    Install(decide::Install),
}

/// Applies one single server over a connection the caller holds: a group of one.
pub(super) async fn apply_single(job: &Job<'_>) -> UnitReport {
    let (host, t) = (job.host, job.t);
    let span = tracing::info_span!("unit", host = %t.host, unit = %t.desired.unit);
    let _entered = span.enter();
    let mut reports = apply_on(
        &[host],
        std::slice::from_ref(t),
        job.options,
        job.verifier,
        false,
    )
    .await;
    reports.pop().expect("one report per rank")
}

/// A server's apply over connections the caller holds, one host per rank, in rank order.
/// `routed`: a group behind a router takes rank 0 out of it for a restart here (a replica is
/// taken out by the rollout, `rollout::behind_router`).
async fn apply_on(
    hosts: &[&dyn Host],
    targets: &[Target],
    options: &ApplyOptions,
    verifier: &dyn Verifier,
    routed: bool,
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
    let mut live = None;
    for (i, l) in looked.into_iter().enumerate() {
        match l {
            Ok((observed, survey, look, drift, change)) => {
                // Only a server of one changes live (`reconcile_core::live`).
                live = live.or(change);
                seen.push((observed, survey, look, drift));
            }
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
    // Confirmed as it runs only when every rank is a unit its guard kept: one that restarts
    // restarts them all.
    let confirm = seen
        .iter()
        .all(|(_, _, look, _)| matches!(look, Look::Install(todo) if todo.confirm));
    let Some(kind) = Kind::of(group, confirm) else {
        return targets
            .iter()
            .map(|t| super::unchanged(t, started))
            .collect();
    };
    // Behind a router, a group's rank 0 (its only API) leaves it before a restart, like a
    // replica (`rollout::behind_router`); a reload keeps it serving.
    let router = match kind {
        Kind::Restart | Kind::Confirm if routed => {
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
            // A mask is no unit to go back to: the record of what was moved aside keeps it.
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
            weights: None,
            live: live.take().filter(|_| kind == Kind::Live),
            told: String::new(),
        });
    }
    let endings = run(&mut ranks, Transaction::new(kind)).await;
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

/// What a rank's first look found: its unit and systemd's state, the survey they came from, what
/// to do, what systemd runs besides the managed file, and the change it takes live, if it does.
type Looked = (
    Observed,
    Option<Survey>,
    Look,
    Vec<crate::layers::Drift>,
    Option<LiveChange>,
);

/// A rank's first look: its unit, systemd's state and record from one survey, its plan, and
/// whether it can go on.
async fn look(job: &Job<'_>) -> Result<Looked, ApplyError> {
    let (host, t, options) = (job.host, job.t, job.options);
    let unit = &t.desired.unit;
    // Everything read before a decision (the unit, systemd's state, the record, preflight's
    // facts) comes from one survey of the host.
    let ask = preflight::Ask {
        preflight: true,
        records: Some(state::STATE_DIR),
        kept_deep: options.deep != preflight::DeepWhen::Never,
        // Staging reads the memory available now.
        kept_python: false,
    };
    let (observed, survey) = match preflight::survey(host, std::slice::from_ref(t), ask).await {
        Ok(Some(survey)) => survey.observed(unit).map(|o| (o, Some(survey))),
        Ok(None) => host.observe(unit).await.map(|o| (o, None)),
        Err(e) => Err(e),
    }
    .map_err(|e| ApplyError::ObserveFailed(error_chain(&e)))?;
    // A plan file's unit: the host must still have what the plan was made against. Checked here
    // for an early refusal (and for a unit with nothing to do, which takes no lock), and again
    // under the lock (`prepare`), where nothing else can change it before the install.
    if let Some(e) = decide::stale_plan(t, &observed) {
        return Err(e);
    }
    let mut planned = plan(&t.host, &t.source, &t.desired, &observed, &options.redactor);
    super::live::plan(host, t, &observed, &mut planned).await;
    // What systemd runs besides the managed file: refused, touching nothing, unless the manifest
    // (or --replace-dropins) says to move it aside.
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
    // A unit the host's guard kept unconfirmed is confirmed without a restart: its record says so.
    let kept = match &unfinished {
        Some(Ok(true)) => guard::read(host, unit).await.ok().flatten(),
        _ => None,
    };
    let look = match decide::start(planned.verdict, &observed, unfinished, kept.as_ref()) {
        Start::Unchanged => Look::Unchanged,
        Start::Refuse(e) => return Err(e),
        Start::Install(todo) => Look::Install(todo),
    };
    Ok((observed, survey, look, planned.drift, planned.live))
}

/// What failed after the restart: the causes, and the ranks a peer's failure cut short, each
/// with the stage it was cut at.
type Failed = (Vec<Cause>, Vec<(usize, Stage)>);

/// Why files were put back before any restart.
enum PutBack {
    /// Rank `rank`'s unit could not be written.
    Write { rank: usize, error: ApplyError },
    /// A rank's guard could not be armed.
    Arm { error: ApplyError },
    /// A signal came before the restart.
    Cancelled,
}

/// Steps 2 to 6 (`reconcile_core::transaction`) for a server with work: each rank's ending, in
/// rank order.
async fn run(ranks: &mut [Rank<'_>], mut tx: Transaction) -> Vec<Ending> {
    let options = ranks[0].job.options;
    let kind = tx.kind();
    // What each step leaves for the later ones.
    let mut endings: Option<Vec<Ending>> = None;
    let mut quality_before = None;
    let mut before = None;
    let mut armed: Vec<Armed<'_>> = Vec::new();
    let mut put_back = None;
    let mut failed: Option<Failed> = None;
    let mut verified = Vec::new();
    let mut keep = None;
    loop {
        super::failpoint::before(tx.step()).await;
        let went = match tx.step() {
            Step::Done(_) => return endings.expect("every end leaves its endings"),
            Step::Prepare => match prepare(ranks).await {
                Ok(()) => Went::Passed,
                Err((i, e)) => {
                    endings = Some(refused_endings(ranks, i, &e));
                    Went::Stopped
                }
            },
            Step::Stage => {
                stage(ranks).await;
                Went::Passed
            }
            Step::Drain => {
                // The quality gate's reference and noise floor, read from rank 0 while the old
                // server serves. Not for `reconcile rollback`: a kept deployment is put back
                // because the newest went wrong, and the newest is what the reference may come
                // from.
                quality_before = match (&ranks[0].job.t.verify.quality, ranks[0].verdict) {
                    (Some(spec), Verdict::Restart | Verdict::Install | Verdict::Live)
                        if options.restoring.is_none() =>
                    {
                        let previous = ranks[0]
                            .fallback
                            .was_running
                            .then(|| ranks[0].fallback.previous_expect())
                            .flatten();
                        let live = ranks[0].verdict == Verdict::Live;
                        let job = &ranks[0].job;
                        Some(super::quality::before(job, spec, previous.as_ref(), live).await)
                    }
                    _ => None,
                };
                match drain(ranks).await {
                    Some(e) => {
                        endings = Some(e);
                        Went::Stopped
                    }
                    None => Went::Passed,
                }
            }
            // The last moment to stop without a restart: a signal before the write, or during
            // it, leaves the servers as they were.
            Step::Write if kind != Kind::ReloadOnly && options.cancel.is_cancelled() => {
                put_back = Some(PutBack::Cancelled);
                Went::Stopped
            }
            Step::Write => {
                // A reload-only change arms no guard: what it replaces is kept here. Any other
                // writes under its guards, once they are known to hold.
                let ready = match kind {
                    Kind::ReloadOnly => keep_previous(ranks).await,
                    _ => guards_hold(ranks, &armed).await,
                };
                let written = match ready {
                    Ok(()) => write(ranks).await,
                    not_ready => not_ready,
                };
                match written {
                    Err((rank, error)) => {
                        put_back = Some(PutBack::Write { rank, error });
                        Went::Failed
                    }
                    Ok(()) if kind != Kind::ReloadOnly && options.cancel.is_cancelled() => {
                        put_back = Some(PutBack::Cancelled);
                        Went::Stopped
                    }
                    Ok(()) => Went::Passed,
                }
            }
            Step::RecordReload => {
                endings = Some(record_reload(ranks).await);
                Went::Passed
            }
            Step::Arm => {
                for r in ranks.iter_mut() {
                    r.history = install::load_history(&r.job, &mut r.report.report).await;
                    let (spec, notes) =
                        reconcile_core::learned::learned_spec(&r.job.t.verify, r.history.as_ref());
                    r.spec = spec;
                    r.learned_notes = notes;
                }
                // What the write replaces is kept before the guard that restores it is armed.
                let kept = match kind {
                    Kind::Confirm => Ok(()),
                    _ => keep_previous(ranks).await,
                };
                if let Err((rank, error)) = kept {
                    put_back = Some(PutBack::Write { rank, error });
                    Went::Failed
                } else if kind != Kind::Confirm && options.cancel.is_cancelled() {
                    // Nothing written yet: the servers are left as they were.
                    put_back = Some(PutBack::Cancelled);
                    Went::Stopped
                } else {
                    // The current deployment's record, read before the restart: the figures the
                    // benchmark stage compares with.
                    before = match &ranks[0].job.t.verify.benchmark {
                        Some(_) => {
                            state::read_record(ranks[0].job.host, &ranks[0].job.t.desired.unit)
                                .await
                                .ok()
                                .flatten()
                        }
                        None => None,
                    };
                    match arm(ranks, kind).await {
                        Ok(a) => {
                            armed = a;
                            Went::Passed
                        }
                        // A unit kept unconfirmed was not touched: it keeps running.
                        Err((_, error)) if kind == Kind::Confirm => {
                            let ending = |_: &Rank<'_>| match &error {
                                ApplyError::ObserveFailed(_) => Ending::refused(&error),
                                _ => decide::install_failed(&error, Ok(false)),
                            };
                            endings = Some(ranks.iter().map(ending).collect());
                            Went::Failed
                        }
                        Err((_, error)) => {
                            put_back = Some(PutBack::Arm { error });
                            Went::Failed
                        }
                    }
                }
            }
            // Under the lease: the old server's stop may take its TimeoutStopSec, longer than
            // the margin, and the guard must not take a dying controller's stop for its own.
            Step::Restart => {
                let guards: Vec<&Armed<'_>> = armed.iter().collect();
                match guard::leased_all(&guards, restart_in_order(ranks)).await {
                    Ok(()) => Went::Passed,
                    Err((rank, e)) => {
                        let cause = Cause {
                            rank,
                            stage: Stage::Restart,
                            error: ApplyError::RestartFailed(e),
                        };
                        failed = Some((vec![cause], Vec::new()));
                        Went::Failed
                    }
                }
            }
            Step::Live => {
                let guards: Vec<&Armed<'_>> = armed.iter().collect();
                match guard::leased_all(&guards, tell_live(&mut ranks[0])).await {
                    Ok(()) => Went::Passed,
                    Err(e) => {
                        let cause = Cause {
                            rank: 0,
                            stage: Stage::Live,
                            error: ApplyError::LiveFailed(e),
                        };
                        failed = Some((vec![cause], Vec::new()));
                        Went::Failed
                    }
                }
            }
            Step::Verify => {
                let guards: Vec<&Armed<'_>> = armed.iter().collect();
                match guard::leased_all(&guards, verify(ranks)).await {
                    Ok(mut v) => {
                        if kind == Kind::Live {
                            // Verified as it runs: no load to time, none for the learned
                            // deadlines to learn from.
                            for v in &mut v {
                                v.load_seconds = None;
                            }
                        }
                        verified = v;
                        Went::Passed
                    }
                    Err(f) => {
                        failed = Some(f);
                        Went::Failed
                    }
                }
            }
            Step::Gates => {
                let guards: Vec<&Armed<'_>> = armed.iter().collect();
                let gates = gates(
                    &mut ranks[0],
                    &mut verified[0],
                    before.as_ref(),
                    quality_before.as_ref(),
                );
                match guard::leased_all(&guards, gates).await {
                    Ok(k) => {
                        keep = k;
                        Went::Passed
                    }
                    Err(cause) => {
                        failed = Some((vec![cause], Vec::new()));
                        Went::Failed
                    }
                }
            }
            Step::Confirm => {
                let verified = std::mem::take(&mut verified);
                endings = Some(confirm(ranks, &armed, verified, keep.take(), kind).await);
                Went::Passed
            }
            Step::PutBack => {
                let why = put_back.take().expect("a step said why the files go back");
                endings = Some(put_back_endings(ranks, why).await);
                // The files are back: the guards stand down. One that does not hear it finds
                // the previous file in place once the lease is out, and puts back nothing new.
                for a in &armed {
                    let _ = a.disarm().await;
                }
                Went::Passed
            }
            Step::LiveBack => {
                let (causes, _) = failed.as_ref().expect("a step said what failed");
                let guards: Vec<&Armed<'_>> = armed.iter().collect();
                match guard::leased_all(&guards, live_back(&mut ranks[0])).await {
                    Ok((told, v)) => {
                        endings = Some(vec![
                            lived_back(&mut ranks[0], &armed, &causes[0], &told, v).await,
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
            Step::RollBack => {
                let (causes, cut_short) = failed.take().expect("a step said what failed");
                let guards: Vec<&Armed<'_>> = armed.iter().collect();
                endings = Some(roll_back(ranks, causes, &cut_short, &guards).await);
                Went::Passed
            }
        };
        tx.went(went);
    }
}

/// Rank 0, the server's API, drained before anything changes: during a long wait the hosts keep
/// the old units, so a server that crashes meanwhile comes back as it was, and a refusal has
/// nothing to undo. `Some` endings when the restart must not happen.
async fn drain(ranks: &mut [Rank<'_>]) -> Option<Vec<Ending>> {
    let Rank {
        job,
        verdict,
        fallback,
        report,
        ..
    } = &mut ranks[0];
    let ending = install::drain(job, *verdict, fallback, &mut report.report).await?;
    let e = ApplyError::Refused(format!(
        "rank 0's drain stopped the group's restart: {}",
        ending.detail
    ));
    let mut endings = refused_endings(ranks, 0, &e);
    endings[0] = ending;
    Some(endings)
}

/// Every rank's guard still holds for this run (`Armed::holds`), or `Err` naming the first that
/// does not: the write goes ahead only under guards that watch it.
async fn guards_hold(ranks: &[Rank<'_>], armed: &[Armed<'_>]) -> Result<(), (usize, ApplyError)> {
    let held = join_all(armed.iter().map(|a| a.holds())).await;
    for (i, held) in held.into_iter().enumerate() {
        let why = match held {
            Ok(true) => continue,
            Ok(false) => {
                "it acted already (its lease ran out while this run could not reach the host)"
                    .to_string()
            }
            Err(e) => format!("it could not be reached: {}", error_chain(&e)),
        };
        let host = &ranks[i].job.t.host;
        return Err((
            i,
            ApplyError::InstallFailed(format!(
                "nothing was written: the guard on {host} does not hold for this run, {why}"
            )),
        ));
    }
    Ok(())
}

/// What every rank's write replaces, kept (`install::keep_previous`), or `Err` naming the first
/// rank where it could not be.
async fn keep_previous(ranks: &mut [Rank<'_>]) -> Result<(), (usize, ApplyError)> {
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
        install::keep_previous(job, observed, fallback).await
    }))
    .await;
    first_failed(kept)
}

/// Every rank's unit in place, or `Err` naming the first rank that could not be.
async fn write(ranks: &mut [Rank<'_>]) -> Result<(), (usize, ApplyError)> {
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
        Some((i, e)) => Err((i, ApplyError::InstallFailed(error_chain(&e)))),
        None => Ok(()),
    }
}

/// A reload-only change: each changed rank recorded, the server serving on.
async fn record_reload(ranks: &mut [Rank<'_>]) -> Vec<Ending> {
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
    endings
}

/// Every rank's guard armed before any server stops: should this process die, each rank's guard
/// judges its own rank (a follower answers `/health` on its dummy port once its group loaded).
/// A unit kept unconfirmed is then read as it runs. `Err` names the rank that failed; guards
/// armed by then are stood down.
async fn arm<'a>(
    ranks: &mut [Rank<'a>],
    kind: Kind,
) -> Result<Vec<Armed<'a>>, (usize, ApplyError)> {
    let n = ranks.len();
    // A live change and a unit being confirmed are judged as they run: no start follows.
    let change = match kind {
        Kind::Restart => Change::Restart,
        _ => Change::InPlace,
    };
    let armed = join_all(ranks.iter().map(|r| {
        let replaces = r.observed.unit_text.as_deref() != Some(&r.job.t.desired.text);
        let back = r.fallback.going_back(replaces, kind == Kind::Confirm);
        guard::arm(&r.job, back, &r.spec, change)
    }))
    .await;
    let failed = armed
        .iter()
        .enumerate()
        .find_map(|(i, a)| a.as_ref().err().map(|e| (i, error_chain(e))));
    let armed: Vec<Armed<'a>> = armed.into_iter().flatten().collect();
    if let Some((i, e)) = failed {
        for a in &armed {
            let _ = a.disarm().await;
        }
        let e = if n == 1 {
            format!("the host's guard could not be armed: {e}")
        } else {
            format!(
                "the host's guard could not be armed on rank {i} ({}): {e}",
                ranks[i].job.t.host
            )
        };
        return Err((i, ApplyError::InstallFailed(e)));
    }
    if kind == Kind::Confirm {
        // Already running, kept by the guard: verified as it runs. A unit that cannot be read is
        // no reason to roll back a server that may be healthy: the guard, armed, judges it.
        for (i, r) in ranks.iter_mut().enumerate() {
            match r.job.host.unit_state(&r.job.t.desired.unit).await {
                Ok(state) => r.invocation = state.invocation_id,
                Err(e) => {
                    for a in &armed {
                        let _ = a.disarm().await;
                    }
                    return Err((i, ApplyError::ObserveFailed(error_chain(&e))));
                }
            }
        }
    }
    Ok(armed)
}

/// Every rank verified at once, under a child of the run's token: Ctrl-C cancels it with the
/// run, and the first rank to fail cancels it alone. `Err`: what failed, and the ranks a peer's
/// failure cut short.
async fn verify(ranks: &mut [Rank<'_>]) -> Result<Vec<Verification>, Failed> {
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
    Err((causes, cut))
}

/// Rank 0's throughput and quality gates (the server's API is rank 0's): the reference to keep,
/// or the gate that failed.
async fn gates(
    rank0: &mut Rank<'_>,
    v: &mut Verification,
    before: Option<&crate::record::Record>,
    quality_before: Option<&super::quality::Before>,
) -> Result<Option<reconcile_core::quality::Reference>, Cause> {
    let Rank { job, report, .. } = rank0;
    if let Some(reason) = install::throughput_gate(job, v, before, &mut report.report).await {
        report.report.verification = Some(v.clone());
        return Err(Cause::stage(0, Stage::Benchmark, reason));
    }
    match install::quality_gate(job, v, quality_before, &mut report.report).await {
        Err(reason) => {
            report.report.verification = Some(v.clone());
            Err(Cause::stage(0, Stage::Quality, reason))
        }
        Ok(keep) => Ok(keep),
    }
}

/// Every rank passed: its guard disarmed and its deployment recorded; rank 0 keeps the quality
/// gate's new reference.
async fn confirm(
    ranks: &mut [Rank<'_>],
    armed: &[Armed<'_>],
    verified: Vec<Verification>,
    keep: Option<reconcile_core::quality::Reference>,
    kind: Kind,
) -> Vec<Ending> {
    let mut acted = Vec::new();
    for (i, g) in armed.iter().enumerate() {
        acted.push(install::disarm(g, &mut ranks[i].report.report).await);
    }
    let n = ranks.len();
    let mut endings = Vec::new();
    for (i, (r, v)) in ranks.iter_mut().zip(verified).enumerate() {
        // The guard rolled the unit back (its lease ran out while this run could not reach the
        // host, say during the disarm itself): the host runs the previous unit, whatever
        // verification saw. Reported as the guard's rollback, and no deployment recorded.
        if let Some(ending) = guard_acted(r, acted.get(i).copied().flatten()).await {
            endings.push(ending);
            r.report.report.verification = Some(v);
            continue;
        }
        let mut ending = match kind {
            Kind::Live => decide::converged_live(&r.told, &v),
            _ => decide::converged(&v),
        };
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
                // The converged server's answers are what the next change is compared with.
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
        if n > 1 {
            ending
                .detail
                .push_str(&format!(" (rank {i} of {n}; the group restarted together)"));
        }
        install::record(&r.job, Outcome::Converged, Some(&v), &mut r.report.report).await;
        r.report.report.verification = Some(v);
        endings.push(ending);
    }
    endings
}

/// The ending of a rank whose guard rolled it back before this run could disarm it (`acted`, what
/// the disarm found the guard had done): the host runs the previous unit, whatever verification
/// saw. Reported as the guard's rollback, and no deployment recorded. `None`: the guard did not.
async fn guard_acted(r: &Rank<'_>, acted: Option<GuardState>) -> Option<Ending> {
    if !matches!(
        acted,
        Some(GuardState::RolledBack | GuardState::RollbackFailed)
    ) {
        return None;
    }
    let settled = guard::read(r.job.host, &r.job.t.desired.unit)
        .await
        .ok()
        .flatten();
    let cause = ApplyErrorKind::Unreachable;
    Some(match settled {
        Some(settled) => decide::guard_acted_first(decide::CONFIRMED_TOO_LATE, cause, &settled),
        None => Ending::rollback_failed(format!(
            "host needs attention: {}; its record could not be read",
            decide::CONFIRMED_TOO_LATE
        )),
    })
}

/// Rank 0, a server of one, told its live change; its invocation (unchanged: no restart) kept
/// for verification and the journal. `Err`: why the server did not take it.
async fn tell_live(r: &mut Rank<'_>) -> Result<(), String> {
    let (host, t) = (r.job.host, r.job.t);
    let change = r.live.as_ref().ok_or("no live change was planned")?;
    let endpoint = Expect::from_unit(&t.desired.model).endpoint;
    let limit = t.verify.load_deadline;
    r.told = super::live::tell(host, &endpoint, t.verify.url.as_deref(), change, limit).await?;
    r.report
        .report
        .notes
        .push(format!("applied live, no restart: {}", r.told));
    r.invocation = host
        .unit_state(&t.desired.unit)
        .await
        .map_err(|e| error_chain(&e))?
        .invocation_id;
    Ok(())
}

/// A live change that failed, undone live on rank 0: the previous weights and values told back by
/// name (a failed weight update is no proof the old weights serve: SGLang's own rollback reads
/// the new path), the previous unit file put back, and the server verified as it runs against
/// the previous unit. What the server did, and what verification saw; `Err`: why not, and the
/// previous unit is restarted instead.
async fn live_back(r: &mut Rank<'_>) -> Result<(String, Verification), String> {
    let (host, t) = (r.job.host, r.job.t);
    let back = r
        .live
        .as_ref()
        .ok_or("no live change was planned")?
        .reverse();
    let expect = r
        .fallback
        .previous_expect()
        .ok_or("the previous unit is not known")?;
    let limit = t.verify.load_deadline;
    let url = t.verify.url.as_deref();
    let told = super::live::tell(host, &expect.endpoint, url, &back, limit).await?;
    let (previous, aside) = (
        r.fallback.previous.as_deref(),
        r.fallback.layers.aside.as_ref(),
    );
    put_back_file(host, &t.desired.unit, previous, aside)
        .await
        .map_err(|e| error_chain(&e))?;
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
        .map_err(|f| format!("the server failed its {} after: {}", f.stage, f.reason))?;
    v.load_seconds = None;
    Ok((told, v))
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

/// Every rank's previous file back after a failed write, an unarmed guard or a signal before the
/// restart: nothing was restarted, so the servers are left alone.
async fn put_back_endings(ranks: &[Rank<'_>], why: PutBack) -> Vec<Ending> {
    let put_back = put_back_all(ranks).await;
    let interrupted = crate::signals::interrupted();
    put_back
        .into_iter()
        .enumerate()
        .map(|(j, back)| match &why {
            PutBack::Cancelled => decide::cancelled_before_restart(&interrupted, back),
            PutBack::Arm { error, .. } => decide::install_failed(error, back),
            PutBack::Write { rank, error } if j == *rank => decide::install_failed(error, back),
            PutBack::Write { rank, error } => {
                let peer = ApplyError::InstallFailed(format!(
                    "rank {rank} ({}) of the server group could not be installed: {error}",
                    ranks[*rank].job.t.host
                ));
                decide::install_failed(&peer, back)
            }
        })
        .collect()
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
    for (i, checked) in checked.into_iter().enumerate() {
        ranks[i].weights = checked.map_err(|e| (i, e))?;
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

/// Step 2b, for a restart: every rank's weights read into its host's page cache at once, while
/// the old servers serve (`reconcile_core::stage`). Only where a server runs: a new or stopped
/// one has no downtime to shorten. Each rank's report says what staging did.
async fn stage(ranks: &mut [Rank<'_>]) {
    let staged = join_all(ranks.iter().map(|r| async move {
        let (job, options) = (&r.job, r.job.options);
        // A live weight move loads from the page cache as a restart does.
        let loads = match r.verdict {
            Verdict::Restart => true,
            Verdict::Live => r.live.as_ref().is_some_and(|l| l.weights.is_some()),
            _ => false,
        };
        if !options.stage || !r.fallback.was_running || !loads {
            return None;
        }
        let plan = r
            .weights
            .as_ref()
            .ok_or_else(|| "the weights were not checked".to_string())
            .and_then(|w| reconcile_core::stage::plan(w, job.t.verify.load_deadline));
        Some(match plan {
            Ok(plan) => {
                let model = &job.t.manifest.sglang.model_path;
                super::stage::stage(job.host, model, &plan, &options.cancel).await
            }
            Err(why) => reconcile_core::stage::Staging::skipped(why),
        })
    }))
    .await;
    for (r, staging) in ranks.iter_mut().zip(staged) {
        if let Some(staging) = staging {
            r.report.report.notes.push(staging.note());
            r.report.report.staging = Some(staging);
        }
    }
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

/// Stops every rank as SGLang stops a group (`reconcile_core::group::stop_steps`: rank 0 drains
/// the requests in flight, and its shutdown ends the others), then starts them in the order SGLang
/// needs (`reconcile_core::group::start_order`): rank 0 first, then the others at
/// once, so their starts lie as close together as one `systemctl start` on rank 0 allows (a rank
/// waits at the rendezvous for the others, and loads only when all are there). Each invocation
/// is noted. `Err` names the rank that could not be stopped or started.
async fn restart_in_order(ranks: &mut [Rank<'_>]) -> Result<(), (usize, String)> {
    if let [r] = ranks {
        // A server of one: one `systemctl restart`, a job systemd runs whole.
        let (host, unit) = (r.job.host, &r.job.t.desired.unit);
        r.invocation = restart(host, unit, r.verdict)
            .await
            .map_err(|e| (0, error_chain(&e)))?;
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

/// Stops ranks `which` of a group in [`stop_steps`]' order, each step on its ranks at once. A step
/// that fails for a rank ends the stop there (the later steps wait on it): the ranks that could
/// not be stopped, with why. A SIGTERM that could not be sent is no failure: the stop after it
/// says whether the rank stopped.
async fn stop_ranks(ranks: &[Rank<'_>], which: &[usize]) -> Vec<(usize, String)> {
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
        let failed: Vec<(usize, String)> = is
            .iter()
            .zip(results)
            .filter_map(|(&i, r)| Some((i, error_chain(&r.err()?))))
            .collect();
        if fatal && !failed.is_empty() {
            return failed;
        }
        for (i, e) in &failed {
            tracing::debug!(rank = i, "SIGTERM to the rank's processes: {e}");
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
async fn restart(
    host: &dyn Host,
    unit: &str,
    verdict: Verdict,
) -> Result<String, remote::RemoteError> {
    if verdict == Verdict::Install {
        host.run_ok(&["systemctl", "enable", "--", unit]).await?;
    }
    host.run_ok(&["systemctl", "restart", "--", unit]).await?;
    Ok(host.unit_state(unit).await?.invocation_id)
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
    stop_failed: Option<String>,
    reached: bool,
}

/// Step 6: every rank's guard taken over, every previous unit put back and started in order,
/// and the server verified again, through hosts that may go away (a reboot, a cut network) and
/// come back. Each rank's ending says what failed (its own stage, or the rank that failed first)
/// and how its rollback went. `cut_short`: the ranks a peer's failure cut short, each with the
/// stage it was cut at.
async fn roll_back(
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
            text.push_str(&format!("; stopping it failed: {e}"));
        }
        let result = back
            .restored
            .unwrap_or(Err(NotRestored::Restore("not restored".into())));
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
                    fallback.kept.as_deref(),
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
                        Some(settled) => decide::guard_acted_first(&text, kind, &settled),
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
    if n > 1 {
        for (i, e) in stop_ranks(ranks, which).await {
            backs[i].stop_failed = Some(e);
        }
    }
    let restores: Vec<_> = ranks.iter().map(|r| r.fallback.restore(&r.job)).collect();
    let mut results: Vec<Option<Result<Restored, NotRestored>>> = (0..n).map(|_| None).collect();
    for i in start_order(n).into_iter().filter(|i| which.contains(i)) {
        if let Err(e) = restore(&restores[i]).await {
            results[i] = Some(Err(NotRestored::Restore(error_chain(&e))));
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

/// A server of one whose unit was looked at, planned as `verdict`, and is locked: the steps from
/// the drain on, as the unit tests drive them on a fake host.
#[cfg(test)]
async fn prepared(
    job: Job<'_>,
    observed: Observed,
    verdict: Verdict,
    fallback: Fallback,
) -> (Ending, UnitReport) {
    let report = Report::new(job.t, Instant::now());
    let mut ranks = vec![Rank {
        job,
        report,
        observed,
        survey: None,
        verdict,
        fallback,
        locked: true,
        invocation: String::new(),
        spec: VerifySpec::default(),
        history: None,
        learned_notes: Vec::new(),
        weights: None,
        live: None,
        told: String::new(),
    }];
    let kind = Kind::of(verdict, false).expect("a verdict with work");
    let mut tx = Transaction::new(kind);
    tx.went(Went::Passed);
    let ending = run(&mut ranks, tx).await.pop().expect("one ending");
    let rank = ranks.pop().expect("one rank");
    (ending.clone(), rank.report.report)
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

#[cfg(test)]
mod server_of_one {
    use tokio::time::Instant;

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::apply::error::ApplyErrorKind;
    use crate::apply::testing::{observed, options, target};
    use crate::apply::verifier::fake::Scripted;
    use crate::remote::fake::{FakeHost, Reply};
    use crate::verify::Sample;

    const PATH: &str = "/etc/systemd/system/s.service";

    /// A host where every command succeeds, and systemd reports a running invocation `inv-1`.
    fn host(unit: Option<&str>) -> FakeHost {
        let fake = FakeHost::new("gpu-a")
            .on(&[], Reply::ok(""))
            // The guard program (its path names its build): found armed when renewed or taken
            // over.
            .on_with(&[], |argv, _| match argv {
                [program, command, ..]
                    if program.contains("reconcile-guard")
                        && ["take", "renew"].contains(command) =>
                {
                    Reply::ok("armed\n")
                }
                _ => Reply::ok(""),
            })
            .on(
                &["systemctl", "show"],
                Reply::ok("InvocationID=inv-1\nActiveState=active\n"),
            )
            .on(&["systemctl", "is-system-running"], Reply::ok("running\n"));
        match unit {
            Some(text) => fake.with_file(PATH, text),
            None => fake,
        }
    }

    fn passed() -> Result<Verification, Failure> {
        Ok(Verification {
            load_seconds: Some(2.0),
            ..Verification::default()
        })
    }

    fn failed(stage: Stage) -> Result<Verification, Failure> {
        Err(Failure {
            stage,
            reason: "503".into(),
            verification: Box::default(),
        })
    }

    /// Installs `s.service` over what `host` has (`before`, `active_state`), as `verdict` says.
    async fn install_on(
        host: &FakeHost,
        verifier: &Scripted,
        before: &Observed,
        verdict: Verdict,
        cancel: bool,
    ) -> (Ending, UnitReport) {
        install_as(target(), host, verifier, before, verdict, cancel).await
    }

    async fn install_as(
        t: crate::targets::Target,
        host: &FakeHost,
        verifier: &Scripted,
        before: &Observed,
        verdict: Verdict,
        cancel: bool,
    ) -> (Ending, UnitReport) {
        let token = CancellationToken::new();
        if cancel {
            token.cancel();
        }
        let options = options(token);
        let job = Job {
            host,
            t: &t,
            options: &options,
            verifier,
        };
        let fallback = Fallback {
            previous: before.unit_text.clone(),
            was_running: before.state.active_state == "active",
            kept: None,
            layers: Default::default(),
        };
        prepared(job, before.clone(), verdict, fallback).await
    }

    fn ran(host: &FakeHost, argv: &[&str]) -> bool {
        host.commands().iter().any(|c| c == argv)
    }

    fn draining(on_timeout: crate::manifest::OnTimeout) -> crate::targets::Target {
        let mut t = target();
        std::sync::Arc::make_mut(&mut t.manifest).drain = Some(crate::manifest::DrainSpec {
            timeout: std::time::Duration::from_secs(60),
            on_timeout,
        });
        t
    }

    #[tokio::test(start_paused = true)]
    async fn a_drain_that_cannot_see_the_server_refuses_before_anything_changes() {
        // "old" has no --enable-metrics: its server has no /metrics to read.
        let host = host(Some("old"));
        let verifier = Scripted::new(vec![passed()]);
        let before = observed(Some("old"), "active");
        let t = draining(crate::manifest::OnTimeout::Refuse);
        let (end, report) = install_as(t, &host, &verifier, &before, Verdict::Restart, false).await;
        assert_eq!(
            (end.outcome, end.detail.as_str(), end.error),
            (
                Outcome::Error,
                "drain cannot see the server's requests: the running unit has no --enable-metrics, so its server has no /metrics; the server was not restarted (drain.on_timeout: refuse); nothing was changed on the host",
                Some(ApplyErrorKind::DrainRefused)
            )
        );
        assert_eq!(host.file(PATH).as_deref(), Some("old"));
        assert!(host.commands().is_empty(), "{:?}", host.commands());
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(
            (&json["drain"]["outcome"], &json["drain"]["restarted"]),
            (&serde_json::json!("blind"), &serde_json::json!(false))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn with_on_timeout_restart_a_blind_drain_restarts_and_says_so() {
        let host = host(Some("old"));
        let verifier = Scripted::new(vec![passed()]);
        let before = observed(Some("old"), "active");
        let t = draining(crate::manifest::OnTimeout::Restart);
        let (end, report) = install_as(t, &host, &verifier, &before, Verdict::Restart, false).await;
        assert_eq!(end.outcome, Outcome::Converged, "{}", end.detail);
        assert!(ran(&host, &["systemctl", "restart", "--", "s.service"]));
        assert!(
            report
                .notes
                .iter()
                .any(|n| n.starts_with("drain cannot see")
                    && n.ends_with("restarted anyway (drain.on_timeout: restart)")),
            "{:?}",
            report.notes
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_reload_only_change_and_a_new_unit_never_drain() {
        let t = || draining(crate::manifest::OnTimeout::Refuse);
        let host = host(Some("old"));
        let verifier = Scripted::new(vec![passed()]);
        let before = observed(Some("old"), "active");
        let (end, report) =
            install_as(t(), &host, &verifier, &before, Verdict::ReloadOnly, false).await;
        assert_eq!(end.outcome, Outcome::Reloaded, "{}", end.detail);
        assert!(report.drain.is_none());
        let fresh = super::super::testing::observed(None, "inactive");
        let host = self::host(None);
        let (end, report) =
            install_as(t(), &host, &verifier, &fresh, Verdict::Install, false).await;
        assert_eq!(end.outcome, Outcome::Converged, "{}", end.detail);
        assert!(report.drain.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_verified_restart_converges_and_is_recorded() {
        let host = host(Some("old"));
        let verifier = Scripted::new(vec![passed()]);
        let before = observed(Some("old"), "active");
        let (end, report) = install_on(&host, &verifier, &before, Verdict::Restart, false).await;
        assert_eq!(end.outcome, Outcome::Converged, "{}", end.detail);
        assert_eq!(end.error, None);
        assert_eq!(host.file(PATH), Some(target().desired.text));
        assert!(ran(&host, &["systemctl", "restart", "--", "s.service"]));
        assert!(!ran(&host, &["systemctl", "enable", "--", "s.service"]));
        assert!(host
            .file("/var/lib/reconcile/s.service/current.json")
            .is_some_and(|r| r.contains(r#""outcome":"converged""#)));
        assert!(report.verification.is_some() && report.journal.is_none());
        assert_eq!(*verifier.asked.lock().unwrap(), ["gpu-a s.service"]);
    }

    #[tokio::test(start_paused = true)]
    async fn past_loads_are_noted_and_the_trajectory_is_recorded() {
        const HISTORY: &str = "/var/lib/reconcile/s.service/history.jsonl";
        let line = |load: f64| {
            format!(
                r#"{{"format":1,"unit":"s.service","manifest":"m","manifest_sha256":"m","unit_sha256":"u","git_commit":null,"git_author":null,"applied_at":"t","applied_by":"me","outcome":"converged","load_seconds":{load},"plateau_service_bytes":null,"plateau_gpu_mib":[],"trajectory":[{{"seconds":0.0,"gpu_mib":10}},{{"seconds":{load},"gpu_mib":100}}]}}"#
            )
        };
        let host = host(Some("old")).with_file(
            HISTORY,
            &format!("{}\n{}\nnot a record\n", line(4.0), line(6.5)),
        );
        let sample = |seconds: f64, gpu: u64| Sample {
            seconds,
            gpu_mib: vec![gpu / 2, gpu / 2],
            ..Sample::default()
        };
        let verifier = Scripted::new(vec![Ok(Verification {
            load_seconds: Some(5.0),
            samples: vec![sample(0.0, 20), sample(2.0, 60), sample(5.0, 100)],
            ..Verification::default()
        })]);
        let before = observed(Some("old"), "active");
        let (end, report) = install_on(&host, &verifier, &before, Verdict::Restart, false).await;
        assert_eq!(end.outcome, Outcome::Converged, "{}", end.detail);
        let v = report.verification.unwrap();
        assert_eq!(
            v.notes,
            [
                "last good load 6.5s (2 converged loads in history)",
                "load deadline 30m, the default: more than learned from history (2 × 6.5s, the slowest of the last 2 loads)"
            ]
        );
        let h = v.previous_loads.unwrap();
        assert_eq!(
            (h.load_seconds.as_slice(), h.trajectory.len()),
            (&[6.5, 4.0][..], 2)
        );
        let record = host
            .file("/var/lib/reconcile/s.service/current.json")
            .unwrap();
        assert!(
            record.contains(r#""trajectory":[{"seconds":0.0,"gpu_mib":20},{"seconds":2.0,"gpu_mib":60},{"seconds":5.0,"gpu_mib":100}]"#),
            "{record}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_guard_that_cannot_be_taken_over_is_left_the_rollback_alone() {
        // The host answers, but its guard does not take the rollback over: restoring now could
        // race the guard's own restore, so this run restores nothing and does not disarm it.
        let host = host(Some("old")).on_with(&[], |argv, _| match argv {
            [program, renew, ..] if program.contains("reconcile-guard") && *renew == "renew" => {
                Reply::ok("armed\n")
            }
            [program, ..] if program.contains("reconcile-guard") => {
                Reply::exit(1, "", "guard.json: unreadable")
            }
            _ => Reply::ok(""),
        });
        let verifier = Scripted::new(vec![failed(Stage::Readiness)]);
        let before = observed(Some("old"), "active");
        let (end, _) = install_on(&host, &verifier, &before, Verdict::Restart, false).await;
        assert_eq!(end.outcome, Outcome::RollbackFailed, "{}", end.detail);
        assert!(
            end.detail
                .contains("the host's guard could not be taken over")
                && end.detail.contains("guard.json: unreadable"),
            "{}",
            end.detail
        );
        // The new unit stays for the guard to judge; no restore, no disarm.
        assert_ne!(host.file(PATH).as_deref(), Some("old"));
        let guard_calls: Vec<String> = host
            .commands()
            .iter()
            .filter(|c| c[0].contains("reconcile-guard"))
            .map(|c| c[1].clone())
            .collect();
        assert!(guard_calls.contains(&"take".to_string()), "{guard_calls:?}");
        assert!(
            !guard_calls.contains(&"disarm".to_string()),
            "{guard_calls:?}"
        );
        assert_eq!(*verifier.asked.lock().unwrap(), ["gpu-a s.service"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_guard_that_acted_before_the_write_has_nothing_written_under_it() {
        // Armed, then the link was cut past the lease: the guard put the previous file back and
        // watches no more. The new file is not written and the server is not restarted.
        let host = host(Some("old")).on_with(&[], |argv, _| match argv {
            [program, renew, ..] if program.contains("reconcile-guard") && *renew == "renew" => {
                Reply::ok("rolled_back\n")
            }
            _ => Reply::ok(""),
        });
        let verifier = Scripted::new(vec![passed()]);
        let before = observed(Some("old"), "active");
        let (end, _) = install_on(&host, &verifier, &before, Verdict::Restart, false).await;
        assert_eq!(end.outcome, Outcome::Error, "{}", end.detail);
        assert!(
            end.detail.contains("nothing was written")
                && end.detail.contains("does not hold for this run"),
            "{}",
            end.detail
        );
        assert_eq!(host.file(PATH).as_deref(), Some("old"));
        assert!(!host
            .commands()
            .iter()
            .any(|c| c.starts_with(&["systemctl".into(), "restart".into()])));
        assert!(verifier.asked.lock().unwrap().is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_take_over_cut_short_by_the_connection_is_tried_again_once_the_host_is_back() {
        // The host goes down for a reboot as the rollback begins: the take-over is lost with the
        // connection, not refused, so it is tried again over the new one and the rollback goes on.
        let takes = std::sync::atomic::AtomicUsize::new(0);
        let host = host(Some("old")).on_with(&[], move |argv, _| match argv {
            [program, take, ..] if program.contains("reconcile-guard") && *take == "take" => {
                match takes.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
                    0 => Reply::Disconnect,
                    _ => Reply::ok("armed\n"),
                }
            }
            [program, renew, ..] if program.contains("reconcile-guard") && *renew == "renew" => {
                Reply::ok("armed\n")
            }
            _ => Reply::ok(""),
        });
        let verifier = Scripted::new(vec![failed(Stage::Readiness), passed()]);
        let before = observed(Some("old"), "active");
        let (end, _) = install_on(&host, &verifier, &before, Verdict::Restart, false).await;
        assert_eq!(end.outcome, Outcome::RolledBack, "{}", end.detail);
        assert!(
            end.detail
                .contains("the previous unit was restored and passed verification"),
            "{}",
            end.detail
        );
        assert_eq!(host.file(PATH).as_deref(), Some("old"));
        let takes = host
            .commands()
            .iter()
            .filter(|c| c[0].contains("reconcile-guard") && c[1] == "take")
            .count();
        assert_eq!(takes, 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_stage_restores_restarts_and_verifies_the_previous_unit() {
        let host = host(Some("old"));
        let verifier = Scripted::new(vec![failed(Stage::Readiness), passed()]);
        let before = observed(Some("old"), "active");
        let (end, report) = install_on(&host, &verifier, &before, Verdict::Restart, false).await;
        assert_eq!(
            (end.outcome, end.detail.as_str(), end.error),
            (
                Outcome::RolledBack,
                "readiness failed: 503; the previous unit was restored and passed verification (ready after 2.0s)",
                Some(ApplyErrorKind::VerificationFailed)
            )
        );
        assert_eq!(host.file(PATH).as_deref(), Some("old"));
        assert_eq!(report.failed_stage.map(Stage::name), Some("readiness"));
        assert!(report.rollback.is_some() && report.journal.is_some());
        assert!(host
            .commands()
            .iter()
            .any(|c| c[0] == "journalctl" && c[1] == "_SYSTEMD_INVOCATION_ID=inv-1"));
        assert_eq!(
            *verifier.asked.lock().unwrap(),
            ["gpu-a s.service", "gpu-a s.service (rollback)"]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_unit_that_fails_is_removed_and_a_failing_restore_says_so() {
        let host = host(None);
        let verifier = Scripted::new(vec![failed(Stage::Smoke)]);
        let before = observed(None, "inactive");
        let (end, _) = install_on(&host, &verifier, &before, Verdict::Install, false).await;
        assert_eq!(
            (end.outcome, end.detail.as_str()),
            (
                Outcome::RolledBack,
                "smoke failed: 503; the new unit was stopped, disabled and removed"
            )
        );
        assert!(ran(&host, &["systemctl", "enable", "--", "s.service"]));
        assert!(ran(
            &host,
            &["systemctl", "disable", "--now", "--", "s.service"]
        ));
        assert!(ran(&host, &["rm", "-f", "--", PATH]));

        // The restored unit fails its own verification: the host needs attention.
        let host = self::host(Some("old"));
        let verifier = Scripted::new(vec![failed(Stage::Readiness), failed(Stage::Smoke)]);
        let before = observed(Some("old"), "active");
        let (end, report) = install_on(&host, &verifier, &before, Verdict::Restart, false).await;
        assert_eq!(
            (end.outcome, end.detail.as_str(), end.error),
            (
                Outcome::RollbackFailed,
                "readiness failed: 503; the restored previous unit failed too: smoke: 503",
                Some(ApplyErrorKind::RollbackFailed)
            )
        );
        assert!(report.rollback.is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_install_puts_the_file_back_without_a_restart() {
        let host = host(Some("old")).once(
            &["systemctl", "daemon-reload"],
            Reply::exit(1, "", "no bus"),
        );
        let verifier = Scripted::new(Vec::new());
        let before = observed(Some("old"), "active");
        let (end, _) = install_on(&host, &verifier, &before, Verdict::Restart, false).await;
        assert_eq!(end.outcome, Outcome::Error);
        assert_eq!(end.error, Some(ApplyErrorKind::InstallFailed));
        assert!(
            end.detail.starts_with("installing failed: ")
                && end.detail.ends_with(
                    "no bus; the previous unit is back in place (the server was not restarted)"
                ),
            "{}",
            end.detail
        );
        assert_eq!(host.file(PATH).as_deref(), Some("old"));
        assert!(!ran(&host, &["systemctl", "restart", "--", "s.service"]));
    }

    #[tokio::test(start_paused = true)]
    async fn reload_only_keeps_the_server_and_a_cancel_stops_before_the_restart() {
        let host = host(Some("old"));
        let verifier = Scripted::new(Vec::new());
        let before = observed(Some("old"), "active");
        let (end, _) = install_on(&host, &verifier, &before, Verdict::ReloadOnly, false).await;
        assert_eq!(end, decide::reloaded());
        assert!(!ran(&host, &["systemctl", "restart", "--", "s.service"]));
        assert!(host
            .file("/var/lib/reconcile/s.service/current.json")
            .is_some_and(|r| r.contains(r#""outcome":"reloaded""#)));

        let host = self::host(Some("old"));
        let (end, _) = install_on(&host, &verifier, &before, Verdict::Restart, true).await;
        assert_eq!(end.outcome, Outcome::NotStarted);
        assert_eq!(end.error, Some(ApplyErrorKind::Interrupted));
        assert!(end.detail.ends_with(
            "before the restart; the previous unit is back in place and the server was not restarted"
        ));
        assert_eq!(host.file(PATH).as_deref(), Some("old"));
        assert!(!ran(&host, &["systemctl", "restart", "--", "s.service"]));
    }

    #[tokio::test(start_paused = true)]
    async fn a_restart_that_breaks_the_connection_reconnects_and_rolls_back() {
        let host = host(Some("old")).once(&["systemctl", "restart"], Reply::Disconnect);
        let verifier = Scripted::new(vec![passed()]);
        let before = observed(Some("old"), "active");
        let (end, report) = install_on(&host, &verifier, &before, Verdict::Restart, false).await;
        assert_eq!(end.outcome, Outcome::RolledBack, "{}", end.detail);
        assert_eq!(end.error, Some(ApplyErrorKind::RestartFailed));
        assert!(end.detail.starts_with("restart failed: "), "{}", end.detail);
        assert!(
            end.detail.contains("; the connection to the host was lost, reconnected after 0.0s; the previous unit was restored and passed verification"),
            "{}",
            end.detail
        );
        assert_eq!(report.failed_stage.map(Stage::name), Some("restart"));
        // No invocation started, so there is no journal to read.
        assert!(report.journal.is_none());
        assert_eq!(host.file(PATH).as_deref(), Some("old"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_rollback_that_fails_while_the_host_shuts_down_starts_over() {
        let running = Reply::ok("running\n");
        let stopping = Reply::ok("stopping\n");
        let host = host(Some("old"))
            // The new unit's restart, then the rollback's first restart, which fails.
            .once(&["systemctl", "restart"], Reply::ok(""))
            .once(
                &["systemctl", "restart"],
                Reply::exit(1, "", "shutting down"),
            )
            .once(&["systemctl", "is-system-running"], running)
            .once(&["systemctl", "is-system-running"], stopping.clone())
            .once(&["systemctl", "is-system-running"], stopping);
        let verifier = Scripted::new(vec![failed(Stage::Readiness), passed()]);
        let before = observed(Some("old"), "active");
        let started = Instant::now();
        let (end, _) = install_on(&host, &verifier, &before, Verdict::Restart, false).await;
        assert_eq!(
            (end.outcome, end.detail.as_str()),
            (
                Outcome::RolledBack,
                "readiness failed: 503; the host was shutting down; the previous unit was restored and passed verification (ready after 2.0s)"
            )
        );
        // It waited (on the paused clock) for the shutdown to pass before trying again.
        assert!(started.elapsed() >= crate::verify::POLL_INTERVAL);
        let restarts = host
            .commands()
            .iter()
            .filter(|c| c[..] == ["systemctl", "restart", "--", "s.service"])
            .count();
        assert_eq!(restarts, 3);
    }

    /// Installs `t` over a host that had `old` and ran it, the verifier passing every stage.
    async fn install_target(
        host: &FakeHost,
        t: &crate::targets::Target,
        answers: usize,
    ) -> (Ending, UnitReport) {
        let verifier = Scripted::new((0..answers).map(|_| passed()).collect());
        let before = observed(Some("old"), "active");
        let options = options(CancellationToken::new());
        let job = Job {
            host,
            t,
            options: &options,
            verifier: &verifier,
        };
        let fallback = Fallback {
            previous: Some("old".into()),
            was_running: true,
            kept: None,
            layers: Default::default(),
        };
        prepared(job, before, Verdict::Restart, fallback).await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_benchmark_stage_records_a_baseline_then_rolls_back_a_regression() {
        let (base, _) = crate::bench::tests::serve(4).await;
        let mut t = target();
        t.verify.url = Some(base);
        t.verify.benchmark = Some(crate::manifest::BenchmarkSpec {
            levels: vec![1, 2],
            prompt_tokens: 4,
            output_tokens: 4,
            requests: Some(2),
            ..Default::default()
        });
        let current = "/var/lib/reconcile/s.service/current.json";
        let first = host(Some("old"));
        let (end, report) = install_target(&first, &t, 1).await;
        assert_eq!(end.outcome, Outcome::Converged, "{}", end.detail);
        assert!(
            end.detail.contains("benchmark passed) memory"),
            "{}",
            end.detail
        );
        assert!(
            end.detail.contains("; benchmark: baseline recorded: 1: "),
            "{}",
            end.detail
        );
        let b = report.benchmark.as_ref().unwrap();
        assert_eq!(b.verdict, crate::benchmark::Verdict::Baseline);
        let written = first.file(current).unwrap();
        let mut record = state::parse_record(written.trim()).unwrap();
        assert_eq!(record.benchmark, b.record());

        // The deployment before was ten times as fast: the gate fails the stage and rolls back.
        for level in &mut record.benchmark.as_mut().unwrap().levels {
            level.output_tokens_per_s *= 10.0;
        }
        let faster = state::record_json(&record).unwrap();
        let second = host(Some("old")).with_file(current, &faster);
        let (end, report) = install_target(&second, &t, 2).await;
        assert_eq!(end.outcome, Outcome::RolledBack, "{}", end.detail);
        assert_eq!(end.error, Some(ApplyErrorKind::VerificationFailed));
        assert!(
            end.detail
                .starts_with("benchmark failed: throughput regressed: -"),
            "{}",
            end.detail
        );
        assert!(
            end.detail.contains("(over the 10% allowed)"),
            "{}",
            end.detail
        );
        assert_eq!(report.failed_stage.map(Stage::name), Some("benchmark"));
        let stages = &report.verification.as_ref().unwrap().stages;
        assert_eq!(
            (stages[0].name.name(), stages[0].passed),
            ("benchmark", false)
        );
        // The record of the deployment that still runs is left as it was.
        assert_eq!(second.file(current).as_deref(), Some(faster.as_str()));
        assert_eq!(second.file(PATH).as_deref(), Some("old"));

        // With the gate off the same drop converges, and says so.
        t.verify.benchmark.as_mut().unwrap().gate = false;
        let third = host(Some("old")).with_file(current, &faster);
        let (end, _) = install_target(&third, &t, 1).await;
        assert_eq!(end.outcome, Outcome::Converged, "{}", end.detail);
        assert!(
            end.detail
                .contains("; benchmark: throughput regressed (gate off: not rolled back): -"),
            "{}",
            end.detail
        );
    }
}
