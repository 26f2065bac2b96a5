//! The one apply pipeline. A server is a group of ranks, one unit on one host each: a single
//! server is a group of one, a server over several hosts (`nodes:`) one SGLang server whose ranks
//! form one torch process group (none serves until all joined the rendezvous on rank 0, and one
//! that dies takes the others down: sglang 0.5.23 `managers/scheduler.py`,
//! `run_scheduler_process`). So a server is applied whole, and its steps are
//! `reconcile_core::transaction`'s state machine; this module carries each step out on every rank:
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
//!
//! `run` drives the transaction; each step is one function in the file of its name, as the
//! transaction names it: `prepare`, `stage` (the preload), `drain`, `arm`, `write` (and `record_reload`),
//! `restart`, `live` (and `live_back`), `verify`, `gates`, `confirm`, `put_back`, `roll_back`.
//! What a step leaves for the later ones travels in `Carried`.

use std::sync::Arc;
use std::time::Instant;

use futures::future::join_all;
use reconcile_core::group::{group_verdict, rank_verdict};
use reconcile_core::learned::LoadHistory;
use reconcile_core::live::LiveChange;
use reconcile_core::record::LiveRecord;
use reconcile_core::transaction::{Kind, Step, Transaction};

use super::decide::{self, Ending, Previous, Start};
use super::error::{ApplyError, GuardLost, GuardNotHeld, RouterFailure};
use super::guard::{self, Armed};
use super::install::Fallback;
use super::verifier::{ServerVerifier, Verifier};
use super::{ApplyOptions, Job, Report, UnitReport};
use crate::manifest::VerifySpec;
use crate::observed::Observed;
use crate::plan::{plan, Verdict};
use crate::preflight::{self, Survey};
use crate::remote::{self, Host, SshOptions};
use crate::state;
use crate::systemd::Systemd as _;
use crate::targets::Target;
use crate::verify::{Stage, Verification};

mod arm;
mod confirm;
mod drain;
mod gates;
mod live;
mod preload;
mod prepare;
mod put_back;
mod restart;
mod roll_back;
mod verify;
mod write;

#[cfg(test)]
mod server_of_one;
#[cfg(test)]
mod tests;

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
                unreachable.get_or_insert((i, ApplyError::Unreachable(Arc::new(e))));
            }
        }
    }
    let reports = match unreachable {
        Some((i, e)) => refuse_all(&targets, started, i, &e),
        None => {
            let verifier = ServerVerifier {
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
                r.fail(&peer_refused(failed, &targets[failed].host, e))
            }
        })
        .collect()
}

fn peer_refused(rank: usize, host: &str, e: &ApplyError) -> ApplyError {
    ApplyError::PeerRefused {
        rank,
        host: host.to_string(),
        source: Box::new(e.clone()),
    }
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
    /// Preflight's check of the weights (a rank whose server starts), which preloading reads.
    weights: Option<preflight::WeightsCheck>,
    /// What the running server is told, for a change applied live (`Kind::Live`).
    live: Option<LiveChange>,
    /// What the server did with the live change, once told ("" before).
    told: String,
    /// The deployment record's account of the live change, once told: what, and to which
    /// process (`None` when its command line could not be read).
    told_live: Option<LiveRecord>,
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
    let mut seen: Vec<Seen> = Vec::new();
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
    // Confirmed as it runs only when every rank is a unit its guard let stand: one that restarts
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
    let taken_out = match take_out(kind, routed, targets, options).await {
        Ok(out) => out,
        Err(e) => return refuse_all(targets, started, 0, &e),
    };
    let mut ranks: Vec<Rank<'_>> = Vec::new();
    for (job, seen) in jobs.into_iter().zip(seen) {
        let verdict = rank_verdict(own[ranks.len()], group);
        let live = live.take().filter(|_| kind == Kind::Live);
        ranks.push(planned_rank(job, seen, verdict, started, live).await);
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

/// Behind a router, a group's rank 0 (its only API) leaves it before a restart, like a replica
/// (`rollout::behind_router`); a reload keeps it serving. `Ok(None)`: it stays in.
async fn take_out(
    kind: Kind,
    routed: bool,
    targets: &[Target],
    options: &ApplyOptions,
) -> Result<Option<super::routed::TakenOut>, ApplyError> {
    let router = match kind {
        Kind::Restart | Kind::Confirm if routed => {
            options.routers.as_ref().and_then(|r| r.of(&targets[0]))
        }
        _ => None,
    };
    match router {
        None => Ok(None),
        Some(Ok(router)) => super::routed::TakenOut::take_out(router, &targets[0])
            .await
            .map(Some),
        Some(Err(e)) => Err(ApplyError::Router(RouterFailure::Unreachable(e))),
    }
}

/// What a rank's first look found, less its live change: its unit and systemd's state, the
/// survey, what to do, and what systemd runs besides the managed file.
type Seen = (
    Observed,
    Option<Survey>,
    Look,
    Vec<crate::unit_files::Drift>,
);

/// A rank as its transaction begins: what it does in the server (`verdict`), its report, and the
/// unit to go back to. `live`: the change it takes live, for rank 0 of a live change.
async fn planned_rank<'a>(
    job: Job<'a>,
    seen: Seen,
    verdict: Verdict,
    started: Instant,
    live: Option<LiveChange>,
) -> Rank<'a> {
    let (observed, survey, look, drift) = seen;
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
            note: (verdict != Verdict::NoChange)
                .then(|| "this rank's unit is unchanged; it restarts with its group".to_string()),
            confirm: false,
        },
    };
    report.report.notes.extend(todo.note.clone());
    let previous = match todo.previous {
        // A mask is no unit to go back to: the record of what was moved aside keeps it.
        Previous::Observed if observed.unit_files.managed_is_mask => None,
        Previous::Observed => observed.unit_text.clone(),
        Previous::NewestGeneration => state::newest_generation(job.host, &job.t.desired.unit)
            .await
            .ok()
            .flatten(),
    };
    let other_unit_files = super::other_unit_files(&job.t.desired.unit, &observed, &drift);
    report
        .report
        .notes
        .extend(super::moved_notes(&job.t.desired.unit, &other_unit_files));
    report.report.verdict = Some(verdict);
    Rank {
        job,
        report,
        observed,
        survey,
        verdict,
        fallback: Fallback {
            previous,
            was_running: todo.was_running,
            saved: None,
            unit_files: other_unit_files,
        },
        locked: false,
        invocation: String::new(),
        spec: VerifySpec::default(),
        history: None,
        learned_notes: Vec::new(),
        weights: None,
        live,
        told: String::new(),
        told_live: None,
    }
}

/// What a rank's first look found: its unit and systemd's state, the survey they came from, what
/// to do, what systemd runs besides the managed file, and the change it takes live, if it does.
type Looked = (
    Observed,
    Option<Survey>,
    Look,
    Vec<crate::unit_files::Drift>,
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
        cached_deep: options.deep != preflight::DeepWhen::Never,
        // Preloading reads the memory available now.
        cached_python: false,
    };
    let (observed, survey) = match preflight::survey(host, std::slice::from_ref(t), ask).await {
        Ok(Some(survey)) => survey.observed(unit).map(|o| (o, Some(survey))),
        Ok(None) => host.observe(unit).await.map(|o| (o, None)),
        Err(e) => Err(e),
    }
    .map_err(|e| ApplyError::ObserveFailed(Arc::new(e)))?;
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
    // A unit the host's guard let stand unconfirmed is confirmed without a restart: its record says so.
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

/// What each step leaves for the later ones: `run` holds it, and each step reads and fills its
/// part.
#[derive(Default)]
struct Carried<'a> {
    /// Every rank's ending, once a step settled them: what `Step::Done` returns.
    endings: Option<Vec<Ending>>,
    /// The quality gate's reference and noise floor, read just before the drain.
    quality_before: Option<super::quality::Before>,
    /// The current deployment's record, read at the arm: what the benchmark gate compares with.
    before: Option<crate::record::Record>,
    /// Every rank's guard, once armed.
    armed: Vec<Armed<'a>>,
    /// Why the files go back, for `Step::PutBack`.
    put_back: Option<put_back::PutBack>,
    /// What failed after the restart, for `Step::LiveBack` and `Step::RollBack`.
    failed: Option<Failed>,
    /// Every rank's verification, once it passed: the gates and the confirm read it.
    verified: Vec<Verification>,
    /// Rank 0's new quality reference, kept by the confirm.
    keep: Option<reconcile_core::quality::Reference>,
}

/// Steps 2 to 6 (`reconcile_core::transaction`) for a server with work: each rank's ending, in
/// rank order. The transaction says which step comes next; each step is carried out by the
/// function of its name.
async fn run(ranks: &mut [Rank<'_>], mut tx: Transaction) -> Vec<Ending> {
    let kind = tx.kind();
    let mut c = Carried::default();
    loop {
        super::failpoint::before(tx.step()).await;
        let went = match tx.step() {
            Step::Done(_) => return c.endings.expect("every end leaves its endings"),
            Step::Prepare => prepare::prepare(ranks, &mut c).await,
            Step::Preload => preload::preload(ranks).await,
            Step::Drain => {
                // The quality gate's reference, read from the old server while it serves:
                // before the drain empties it.
                c.quality_before = gates::quality_reference(ranks).await;
                drain::drain(ranks, &mut c).await
            }
            Step::Write => write::write(ranks, kind, &mut c).await,
            Step::RecordReload => write::record_reload(ranks, &mut c).await,
            Step::Arm => {
                // The deadlines the guards and verification judge by, from each rank's past
                // loads.
                arm::learn_deadlines(ranks).await;
                arm::arm(ranks, kind, &mut c).await
            }
            Step::Restart => restart::restart(ranks, &mut c).await,
            Step::Live => live::live(ranks, &mut c).await,
            Step::Verify => verify::verify(ranks, kind, &mut c).await,
            Step::Gates => gates::gates(ranks, &mut c).await,
            Step::Confirm => confirm::confirm(ranks, kind, &mut c).await,
            Step::PutBack => put_back::put_back(ranks, &mut c).await,
            Step::LiveBack => live::live_back(ranks, &mut c).await,
            Step::RollBack => roll_back::roll_back(ranks, &mut c).await,
        };
        tx.went(went);
    }
}

/// What failed after the restart: the causes, and the ranks a peer's failure cut short, each
/// with the stage it was cut at.
type Failed = (Vec<Cause>, Vec<(usize, Stage)>);

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

/// Endings for a group stopped before anything changed, by rank `failed`'s refusal `e`.
fn refused_endings(ranks: &[Rank<'_>], failed: usize, e: &ApplyError) -> Vec<Ending> {
    (0..ranks.len())
        .map(|i| {
            if i == failed {
                Ending::refused(e)
            } else {
                let host = &ranks[failed].job.t.host;
                Ending::refused(&peer_refused(failed, host, e))
            }
        })
        .collect()
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
        told_live: None,
    }];
    let kind = Kind::of(verdict, false).expect("a verdict with work");
    let mut tx = Transaction::new(kind);
    tx.went(reconcile_core::transaction::Went::Passed);
    let ending = run(&mut ranks, tx).await.pop().expect("one ending");
    let rank = ranks.pop().expect("one rank");
    (ending.clone(), rank.report.report)
}

/// Every rank's guard still holds for this run (`Armed::holds`), or `Err` naming the first rank
/// whose guard does not and why: a step that changes the host (the write, the restart, a live
/// change) goes ahead only under guards that watch it.
async fn guards_hold(ranks: &[Rank<'_>], armed: &[Armed<'_>]) -> Result<(), (usize, GuardNotHeld)> {
    let held = join_all(armed.iter().map(|a| a.holds())).await;
    for (i, held) in held.into_iter().enumerate() {
        let why = match held {
            Ok(true) => continue,
            Ok(false) => GuardLost::Acted,
            Err(e) => GuardLost::Unreachable(Arc::new(e)),
        };
        let host = ranks[i].job.t.host.clone();
        return Err((i, GuardNotHeld { host, why }));
    }
    Ok(())
}
