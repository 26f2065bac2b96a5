//! `reconcile apply`: make each host run what its manifest says, prove the server came up right,
//! or put the host back the way it was.
//!
//! Per unit: plan; nothing to do -> touch nothing. Otherwise run preflight (a unit whose host cannot
//! run it is refused, untouched), take the unit's lock on the host, keep the current unit as a
//! generation, write the new one atomically, daemon-reload, and restart only when the plan says
//! so. A restarted server goes through staged verification (`verify`); when a stage fails, the
//! previous unit is restored, restarted and verified the same way (a unit that was new is
//! removed), and the report carries the failed invocation's journal.
//!
//! A server is a group of ranks and a single server a group of one: every apply takes one path,
//! `pipeline`, whose steps are `reconcile_core::transaction`'s state machine.
//!
//! The layout: `decide` (what each fact means, and every detail text) is pure, and so are the
//! steps' order (`reconcile_core::transaction`) and the rollout's
//! (`reconcile_core::rollout::schedule`); `pipeline`, `install`, `guard`, `restore` and `rollout`
//! do the remote calls they decide;
//! verification is reached through `verifier`, so the drivers can run against a scripted one.

pub(crate) mod aside;
mod bake;
mod benchmark;
mod decide;
mod error;
mod failpoint;
mod fetch;
pub(crate) mod guard;
mod install;
pub(crate) mod live;
mod pipeline;
mod preload;
mod quality;
mod restore;
mod rollout;
mod routed;
#[cfg(test)]
mod testing;
pub(crate) mod undo;
mod verifier;

use std::sync::Arc;
use std::time::Instant;

use indicatif::MultiProgress;
use reconcile_core::diagnose::Diagnosis;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

pub use crate::state::{LockPolicy, Owner};
pub use error::{ApplyError, ApplyErrorKind};
pub(crate) use pipeline::apply_group;
pub use reconcile_core::outcome::Outcome;
pub use reconcile_core::rollout::Rollout;

use crate::manifest::DropInPolicy;
use crate::observed::Observed;
use crate::plan::{plan, Verdict, UNIT_DIR};
use crate::plan_file;
use crate::preflight::{self, DeepWhen, Survey};
use crate::redact::Redactor;
use crate::remote::{error_chain, Host, RemoteError, SshOptions};
use crate::state;
use crate::systemd::Systemd;
use crate::targets::Target;
use crate::unit_files::{self, Drift};
use crate::verify::Verification;
use decide::Ending;
use install::OtherUnitFiles;
use verifier::{ServerVerifier, Verifier};

#[derive(Debug, Clone, Serialize)]
pub struct UnitReport {
    pub host: String,
    pub unit: String,
    pub source: String,
    pub verdict: Option<Verdict>,
    pub outcome: Outcome,
    /// What happened, or why it failed.
    pub detail: String,
    /// What kind of failure `detail` tells of: set for `error`, `not_started`, `rolled_back` and
    /// `rollback_failed`, absent (not null) otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<ApplyErrorKind>,
    /// The stage that failed, when one did.
    pub failed_stage: Option<crate::verify::Stage>,
    pub notes: Vec<String>,
    /// Stages and memory samples of the new unit's verification.
    pub verification: Option<Verification>,
    /// Stages and samples of the restored unit's verification, after a rollback.
    pub rollback: Option<Verification>,
    /// The failed invocation's last journal lines (secrets redacted).
    pub journal: Option<String>,
    /// A known SGLang failure read from `journal` (`reconcile_core::diagnose`): the cause and what
    /// to change. Absent (not null) when there is no journal or no known signature in it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub diagnosis: Option<Diagnosis>,
    pub seconds: f64,
    /// The benchmark stage's figures and verdict, when the manifest has `verify.benchmark`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub benchmark: Option<crate::benchmark::BenchmarkReport>,
    /// The drain before the restart, when the manifest has `drain:` and the unit was to restart.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub drain: Option<crate::drain::DrainReport>,
    /// The quality stage's figures and verdict, when the manifest has `verify.quality`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub quality: Option<reconcile_core::quality::QualityReport>,
    /// This unit's place in its server group (`nodes:`); absent for a server of its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group: Option<GroupPlace>,
    /// The weights preloaded into the page cache before the old server stopped
    /// (`reconcile_core::preload`); absent when the server did not restart.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[serde(rename = "staging")]
    pub preloading: Option<reconcile_core::preload::Preloading>,
    /// The pinned weights fetched to the host before the stop (`sglang.model:`): bytes, time
    /// and rate; absent when the host had them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fetch: Option<reconcile_core::pinned::Fetched>,
    /// The canary's bake on live traffic against the stable replicas (`verify.bake`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bake: Option<bake::BakeReport>,
}

/// A rank's place in its server group, as reports show it.
#[derive(Debug, Clone, Serialize)]
pub struct GroupPlace {
    /// `--node-rank`.
    pub rank: usize,
    /// Every rank's host, in rank order.
    pub nodes: Vec<String>,
}

impl GroupPlace {
    fn of(t: &Target) -> Option<GroupPlace> {
        t.group.as_ref().map(|g| GroupPlace {
            rank: g.rank,
            nodes: g.nodes.clone(),
        })
    }
}

/// The git commit the manifests were read from, for deployment records.
#[derive(Debug, Clone, Default)]
pub struct GitInfo {
    pub commit: Option<String>,
    pub author: Option<String>,
}

#[derive(Clone)]
pub struct ApplyOptions {
    pub owner: Owner,
    pub lock: LockPolicy,
    pub git: GitInfo,
    /// Cancelled on Ctrl-C: verification in progress fails (and rolls back), no new host starts.
    pub cancel: CancellationToken,
    /// Live display on a terminal.
    pub progress: Option<MultiProgress>,
    /// Which units get preflight's deep check (the host's SGLang checks the unit's argv and its
    /// model's config first, 10-30 s a unit): by default those that restart or are new.
    pub deep: DeepWhen,
    pub rollout: Rollout,
    /// Set when this apply puts a unit back rather than moves it forward (`reconcile rollback`,
    /// a bake's or `--rollback-all`'s undo). Its record says from which deployment, and
    /// preflight's SGLang version check (against the manifest, which may have moved on since)
    /// becomes a note: the restored unit ran on this host before.
    pub restoring: Option<Restoring>,
    /// What to hide in plans and journals: the secret names of the run's manifests.
    pub redactor: Redactor,
    /// The routers a rollout's replicas sit behind (set by `rollout::roll_out`); a replica behind
    /// one is taken out of it for its apply (`rollout::behind_router`).
    pub routers: Option<std::sync::Arc<crate::router::Routers>>,
    /// `--replace-dropins`: every unit as if its manifest said `systemd.dropins: replace`.
    pub replace_dropins: bool,
    /// Stage a restarting server's weights into its host's page cache before the stop
    /// (`reconcile_core::preload`); `--no-stage` turns it off.
    pub preload: bool,
    /// `--strict`: preflight's warnings that it refuses (`reconcile_core::finding::strictly`)
    /// block the unit.
    pub strict: bool,
}

impl ApplyOptions {
    /// Applying as `owner` under `lock`, stopping when `cancel` is cancelled, hiding what `redactor`
    /// hides; by default without git info or live display, with the deep check for units that
    /// restart, one host at a time, and restoring nothing. Every command's options start here.
    pub fn new(
        owner: Owner,
        lock: LockPolicy,
        cancel: CancellationToken,
        redactor: Redactor,
    ) -> ApplyOptions {
        ApplyOptions {
            owner,
            lock,
            git: GitInfo::default(),
            cancel,
            progress: None,
            deep: DeepWhen::default(),
            rollout: Rollout {
                canary: 1,
                max_parallel: 1,
                max_failures: 1,
                rollback_all: false,
            },
            restoring: None,
            redactor,
            routers: None,
            replace_dropins: false,
            preload: true,
            strict: false,
        }
    }

    /// `--no-stage`: no weights preloaded before a restart.
    /// `--strict`: preflight's warnings that it refuses block the unit too.
    pub fn strict(self, strict: bool) -> ApplyOptions {
        ApplyOptions { strict, ..self }
    }

    pub fn preload(self, preload: bool) -> ApplyOptions {
        ApplyOptions { preload, ..self }
    }

    /// `--replace-dropins`.
    pub fn replace_dropins(self, replace_dropins: bool) -> ApplyOptions {
        ApplyOptions {
            replace_dropins,
            ..self
        }
    }

    /// What apply does with `t`'s drop-ins, mask or shadowing unit file.
    pub fn dropins(&self, t: &Target) -> DropInPolicy {
        if self.replace_dropins {
            DropInPolicy::Replace
        } else {
            t.desired.dropins
        }
    }

    pub fn git(self, git: GitInfo) -> ApplyOptions {
        ApplyOptions { git, ..self }
    }

    pub fn progress(self, progress: Option<MultiProgress>) -> ApplyOptions {
        ApplyOptions { progress, ..self }
    }

    /// `--deep` / `--no-deep` (or the agent's `--deep` alone).
    pub fn deep(self, deep: impl Into<DeepWhen>) -> ApplyOptions {
        ApplyOptions {
            deep: deep.into(),
            ..self
        }
    }

    pub fn rollout(self, rollout: Rollout) -> ApplyOptions {
        ApplyOptions { rollout, ..self }
    }

    /// These options restoring `what`, recorded with `git`.
    pub fn restoring(&self, what: Restoring, git: GitInfo) -> ApplyOptions {
        ApplyOptions {
            restoring: Some(what),
            ..self.clone().git(git)
        }
    }
}

/// What an apply that puts a unit back restores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restoring {
    /// The unit deployment `n` installed, saved on the host.
    Deployment(usize),
    /// A unit no deployment recorded (written by hand, or before reconcile managed it), saved as
    /// the generation the undone apply replaced.
    Unrecorded,
}

impl Restoring {
    /// The deployment restored, for its record.
    pub fn deployment(self) -> Option<usize> {
        match self {
            Restoring::Deployment(n) => Some(n),
            Restoring::Unrecorded => None,
        }
    }
}

/// The exit code of an apply (or a rollback) that reported `reports`: the worst unit's, or 5
/// when the rollout paused on an inconclusive bake (`reconcile_core::outcome::apply_exit_code`).
pub fn exit_code(reports: &[UnitReport]) -> u8 {
    let paused = reports
        .iter()
        .any(|r| r.bake.as_ref().is_some_and(|b| b.paused().is_some()));
    reconcile_core::outcome::apply_exit_code(reports.iter().map(|r| r.outcome), paused)
}

/// Applies every target, host by host, as a rollout (canary, batches, failure budget).
pub async fn apply_targets(
    targets: Vec<Target>,
    ssh: &SshOptions,
    options: &ApplyOptions,
) -> Vec<UnitReport> {
    rollout::roll_out(targets, ssh, options).await
}

/// Applies one target over a connection the caller holds (`reconcile rollback` reads the host's
/// history over the same connection first).
pub(crate) async fn apply_one(host: &dyn Host, t: &Target, options: &ApplyOptions) -> UnitReport {
    let verifier = ServerVerifier {
        progress: options.progress.as_ref(),
    };
    pipeline::apply_single(&Job {
        host,
        t,
        options,
        verifier: &verifier,
    })
    .await
}

/// Applies a host's units in turn over a connection the caller holds. Once `options.cancel` is
/// cancelled, no further unit starts; each is reported `not started: {stopping}`.
pub(crate) async fn apply_units(
    host: &dyn Host,
    targets: &[Target],
    options: &ApplyOptions,
    stopping: &str,
) -> Vec<UnitReport> {
    let mut reports = Vec::new();
    for t in targets {
        if options.cancel.is_cancelled() {
            let e = ApplyError::Interrupted(stopping.to_string());
            reports.push(Report::new(t, Instant::now()).fail(&e));
            continue;
        }
        if let Some(rank) = &t.group {
            // A rank applied alone would restart out of its process group; the group's ranks
            // are applied together, from one run (`pipeline::apply_group`).
            let e = ApplyError::Refused(format!(
                "{} is a server group over {}: its ranks are applied together by `reconcile apply`, never one host alone",
                t.desired.unit,
                rank.nodes.join(", ")
            ));
            reports.push(Report::new(t, Instant::now()).fail(&e));
            continue;
        }
        let report = match options.routers.as_ref().and_then(|r| r.of(t)) {
            Some(router) => rollout::behind_router(host, t, options, router).await,
            None => apply_one(host, t, options).await,
        };
        reports.push(report);
    }
    reports
}

/// A unit refused before anything was done on its host.
pub(crate) fn refused(
    host: &str,
    unit: &str,
    source: &str,
    outcome: Outcome,
    detail: String,
) -> UnitReport {
    let error = match outcome {
        Outcome::NotStarted => Some(ApplyErrorKind::NotStarted),
        Outcome::Error => Some(ApplyErrorKind::Refused),
        _ => None,
    };
    UnitReport {
        host: host.to_string(),
        unit: unit.to_string(),
        source: source.to_string(),
        verdict: None,
        outcome,
        detail,
        error,
        failed_stage: None,
        notes: Vec::new(),
        verification: None,
        rollback: None,
        journal: None,
        diagnosis: None,
        seconds: 0.0,
        benchmark: None,
        drain: None,
        quality: None,
        group: None,
        preloading: None,
        fetch: None,
        bake: None,
    }
}

/// A unit refused for `e` before anything was done on its host.
pub(crate) fn refused_for(host: &str, unit: &str, source: &str, e: &ApplyError) -> UnitReport {
    let ending = Ending::refused(e);
    UnitReport {
        error: ending.error,
        ..refused(host, unit, source, ending.outcome, ending.detail)
    }
}

/// A unit whose host's turn never came.
fn not_started(t: &Target, e: &ApplyError) -> UnitReport {
    Report::new(t, Instant::now()).fail(e)
}

/// A batch of the rollout's turns, all at once: per host connect, apply its units, close. Once
/// `options.cancel` is cancelled, no host of the batch is contacted.
pub(super) async fn apply_hosts(
    hosts: Vec<(String, Vec<Target>)>,
    ssh: &SshOptions,
    options: &ApplyOptions,
) -> Vec<Vec<UnitReport>> {
    if options.cancel.is_cancelled() {
        let e = ApplyError::InterruptedBeforeHost;
        let started = Instant::now();
        return hosts
            .iter()
            .map(|(_, targets)| {
                targets
                    .iter()
                    .map(|t| Report::new(t, started).fail(&e))
                    .collect()
            })
            .collect();
    }
    let at_once = hosts.len();
    crate::visit::each_host(
        hosts,
        ssh,
        at_once,
        crate::visit::no_span,
        async |host: &dyn Host, _: &crate::visit::Visit<'_>, targets: Vec<Target>| {
            apply_units(
                host,
                &targets,
                options,
                "interrupted before this unit's turn",
            )
            .await
        },
        |visit, targets, e| unreachable(&targets, e, visit.started),
    )
    .await
}

/// Whether applying `t` would do anything: its unit differs from the manifest, or the last apply of
/// it did not finish. A plan file's unit, and a unit or record that cannot be read, count as work:
/// apply's own path checks and reports them.
pub(super) async fn has_work(host: &dyn Host, t: &Target, options: &ApplyOptions) -> bool {
    if t.expected.is_some() {
        return true;
    }
    match host.observe(&t.desired.unit).await {
        Ok(observed) => observed_work(host, t, options, &observed).await,
        Err(_) => true,
    }
}

/// [`has_work`] for a unit observed already (a plan file's unit is not asked about here).
pub(super) async fn observed_work(
    host: &dyn Host,
    t: &Target,
    options: &ApplyOptions,
    observed: &Observed,
) -> bool {
    plan(&t.host, &t.source, &t.desired, observed, &options.redactor).verdict != Verdict::NoChange
        || unfinished(host, t, observed).await.unwrap_or(true)
}

/// What applying a unit would do to its server, asked before an agent coordinates: a restart
/// (or a new server) needs a turn, a reload or nothing does not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    Nothing,
    /// `daemon-reload` only: the server keeps serving.
    Reload,
    /// The server starts or restarts (and loads its model). An unfinished earlier apply, or a
    /// unit that cannot be read, counts here: apply would restart and verify it.
    Restart,
}

pub async fn need(host: &dyn Host, t: &Target, options: &ApplyOptions) -> Need {
    let observed = match host.observe(&t.desired.unit).await {
        Ok(o) => o,
        Err(_) => return Need::Restart,
    };
    match plan(&t.host, &t.source, &t.desired, &observed, &options.redactor).verdict {
        Verdict::ReloadOnly => Need::Reload,
        // `plan` alone never says live (the checkpoints are read by apply's own look).
        Verdict::Restart | Verdict::Install | Verdict::Live => Need::Restart,
        Verdict::NoChange => match unfinished(host, t, &observed).await {
            Ok(false) => Need::Nothing,
            _ => Need::Restart,
        },
    }
}

/// Whether any of a host's targets has work ([`has_work`]), from one survey of the host: their
/// unit files, systemd's states and deployment records in one command. A host that cannot run
/// the survey is asked unit by unit.
pub(super) async fn host_has_work(
    host: &dyn Host,
    targets: &[Target],
    options: &ApplyOptions,
) -> bool {
    if targets.iter().any(|t| t.expected.is_some()) {
        return true;
    }
    let ask = preflight::Ask {
        preflight: false,
        records: Some(state::STATE_DIR),
        cached_deep: false,
        cached_python: false,
    };
    match preflight::survey(host, targets, ask).await {
        Ok(Some(survey)) => targets.iter().any(|t| surveyed_work(&survey, t, options)),
        Ok(None) => {
            for t in targets {
                if has_work(host, t, options).await {
                    return true;
                }
            }
            false
        }
        Err(_) => true,
    }
}

/// [`has_work`], read from a survey.
fn surveyed_work(survey: &Survey, t: &Target, options: &ApplyOptions) -> bool {
    match survey.observed(&t.desired.unit) {
        Ok(observed) => {
            plan(&t.host, &t.source, &t.desired, &observed, &options.redactor).verdict
                != Verdict::NoChange
                || recorded(&observed, survey.record(&t.desired.unit)).unwrap_or(true)
        }
        Err(_) => true,
    }
}

/// The report of a unit found up to date, untouched.
pub(crate) fn unchanged(t: &Target, started: Instant) -> UnitReport {
    let mut r = Report::new(t, started);
    r.report.verdict = Some(Verdict::NoChange);
    r.end(Outcome::Unchanged, "already up to date; nothing touched")
}

/// The reports of a host that could not be reached: nothing was changed.
pub(super) fn unreachable(targets: &[Target], e: RemoteError, started: Instant) -> Vec<UnitReport> {
    let e = ApplyError::Unreachable(Arc::new(e));
    targets
        .iter()
        .map(|t| Report::new(t, started).fail(&e))
        .collect()
}

/// A report being filled in as a unit is applied.
struct Report {
    report: UnitReport,
    started: Instant,
}

impl Report {
    fn new(t: &Target, started: Instant) -> Report {
        // The blank report a refusal starts from, with no error (yet) and the unit's place in
        // its group.
        let report = UnitReport {
            error: None,
            group: GroupPlace::of(t),
            ..refused(
                &t.host,
                &t.desired.unit,
                &t.source,
                Outcome::Error,
                String::new(),
            )
        };
        Report { report, started }
    }

    fn end(self, outcome: Outcome, detail: &str) -> UnitReport {
        self.finish(Ending {
            outcome,
            detail: detail.to_string(),
            error: None,
        })
    }

    fn fail(self, e: &ApplyError) -> UnitReport {
        self.finish(Ending::refused(e))
    }

    fn finish(mut self, ending: Ending) -> UnitReport {
        self.report.outcome = ending.outcome;
        self.report.detail = ending.detail;
        self.report.error = ending.error;
        self.report.seconds = self.started.elapsed().as_secs_f64();
        self.report
    }
}

/// One unit's apply: its host, its target, the run's options, and how to verify.
struct Job<'a> {
    host: &'a dyn Host,
    t: &'a Target,
    options: &'a ApplyOptions,
    verifier: &'a dyn Verifier,
}

impl Job<'_> {
    /// What a measuring stage (benchmark, quality) starts from: what the unit serves, and the
    /// stage's progress lines, labelled with its name.
    fn measuring(&self, stage: &str) -> (crate::verify::Expect, crate::verify::Progress) {
        let t = self.t;
        let progress = crate::verify::Progress::new(
            format!("{} {} ({stage})", t.host, t.desired.unit),
            self.options.progress.as_ref(),
        );
        (crate::verify::Expect::from_unit(&t.desired.model), progress)
    }

    /// The new server, as a measuring stage reaches it: at the manifest's `verify.url`, or
    /// forwarded over the connection.
    async fn server(
        &self,
        expect: &crate::verify::Expect,
    ) -> Result<crate::remote::Server, RemoteError> {
        self.host
            .server(&expect.endpoint, self.t.verify.url.as_deref())
            .await
    }
}

/// What systemd ran besides the managed file, as the install and a rollback need it: what to
/// move aside (`systemd.dropins: replace`), whether a unit of the name lies beneath, whether it was
/// disabled, and what the previous unit ran with its drop-ins.
fn other_unit_files(unit: &str, observed: &Observed, drift: &[Drift]) -> OtherUnitFiles {
    let to_move = unit_files::to_move(unit, &observed.unit_files, drift);
    OtherUnitFiles {
        beneath: unit_files::has_unit_beneath(unit, &observed.unit_files, &to_move),
        was_disabled: drift.contains(&Drift::Disabled),
        // With drop-ins or a unit file elsewhere, the previous unit runs more than its file.
        model: drift
            .iter()
            .any(|d| *d != Drift::Disabled)
            .then(|| {
                observed
                    .unit_files
                    .effective_model(unit, observed.unit_text.as_deref())
            })
            .flatten(),
        to_move,
        aside_record: None,
        aside: None,
    }
}

/// The report's notes for the files an install moves aside.
fn moved_notes(unit: &str, other_unit_files: &OtherUnitFiles) -> Vec<String> {
    other_unit_files
        .to_move
        .iter()
        .map(|moved| {
            format!(
                "{} is moved aside into {} (systemd.dropins: replace); a rollback puts it back",
                moved.path,
                aside::dir(unit)
            )
        })
        .collect()
}

/// Preflight's findings: those that do not block become notes; any that blocks refuses the unit.
/// What it found of the weights, preloading reads.
async fn run_preflight(
    job: &Job<'_>,
    observed: &Observed,
    verdict: Verdict,
    survey: Option<&Survey>,
    report: &mut UnitReport,
) -> Result<Option<preflight::WeightsCheck>, ApplyError> {
    let (host, t, options) = (job.host, job.t, job.options);
    let state = &observed.state;
    let checked = match survey {
        Some(s) => preflight::check_surveyed(host, t, s, state, verdict, options.deep).await,
        None => preflight::check(host, t, state, verdict, options.deep).await,
    }
    .map_err(|e| ApplyError::PreflightCouldNotRun(Arc::new(e)))?;
    let mut findings = checked.findings;
    if options.strict {
        preflight::strictly(&mut findings);
    }
    let (notes, refusal) = decide::preflight(findings, options.restoring);
    report.notes.extend(notes);
    refusal.map_or(Ok(checked.weights), Err)
}

/// Releases the unit's lock; a failure to is a note (the next apply from here breaks the lock).
async fn unlock(host: &dyn Host, unit: &str, report: &mut UnitReport) {
    if let Err(e) = state::unlock(host, unit).await {
        report.notes.push(format!(
            "the lock could not be released: {}",
            error_chain(&e)
        ));
    }
}

/// Under the unit's lock: the unit file, the installed SGLang and the rendered unit are still what
/// the plan file recorded. The unit file is read again, since another run may have changed it
/// between the first look and the lock.
async fn still_as_planned(
    host: &dyn Host,
    t: &Target,
    expected: &plan_file::PlannedState,
    observed: &Observed,
) -> Result<(), ApplyError> {
    let path = format!("{UNIT_DIR}/{}", t.desired.unit);
    let read =
        async { tokio::try_join!(host.read_file(&path), preflight::installed_sglang(host, t)) };
    let (text, sglang) = read
        .await
        .map_err(|e| ApplyError::PlanCheckFailed(Arc::new(e)))?;
    let now = plan_file::PlannedState {
        desired_sha256: state::sha256(&t.desired.text),
        current_sha256: text.as_deref().map(state::sha256),
        sglang_version: sglang,
    };
    let mut stale: Vec<String> = plan_file::staleness(&t.host, &t.desired.unit, expected, &now)
        .iter()
        .map(ToString::to_string)
        .collect();
    // Changed and changed back since the first look: what install would keep as the previous
    // unit is not what is there.
    if stale.is_empty() && text != observed.unit_text {
        stale.push(format!(
            "the unit on {} changed while this apply ran; plan again",
            t.host
        ));
    }
    if stale.is_empty() {
        Ok(())
    } else {
        Err(ApplyError::PlanStale(stale.join("; ")))
    }
}

/// Whether a managed unit on disk matches the manifest but was never recorded as deployed. A record
/// that exists but cannot be read or parsed is an error, never "no record": that would restart a
/// healthy server to finish an apply that did finish.
async fn unfinished(
    host: &dyn Host,
    t: &Target,
    observed: &Observed,
) -> Result<bool, state::RecordError> {
    if observed.unit_text.is_none() {
        return Ok(false);
    }
    let record = state::read_record(host, &t.desired.unit).await;
    recorded(observed, Some(record))
}

/// [`unfinished`] with the record read already (`None`: not read, which counts as unfinished).
fn recorded(
    observed: &Observed,
    record: Option<Result<Option<state::Record>, state::RecordError>>,
) -> Result<bool, state::RecordError> {
    let Some(text) = &observed.unit_text else {
        return Ok(false);
    };
    let Some(record) = record.transpose()? else {
        return Ok(true);
    };
    Ok(record.is_none_or(|r| r.unit_sha256 != state::sha256(text)))
}

#[cfg(test)]
mod tests {
    use super::testing::{options, target};
    use super::*;
    use crate::remote::fake::FakeHost;

    #[tokio::test]
    async fn once_cancelled_no_unit_starts_and_the_host_is_not_touched() {
        let cancel = CancellationToken::new();
        cancel.cancel();
        let host = FakeHost::new("gpu-a");
        let reports = apply_units(
            &host,
            &[target(), target()],
            &options(cancel),
            "the agent is stopping",
        )
        .await;
        assert_eq!(reports.len(), 2);
        for r in &reports {
            assert_eq!(
                (r.outcome, r.detail.as_str(), r.error),
                (
                    Outcome::NotStarted,
                    "not started: the agent is stopping",
                    Some(ApplyErrorKind::Interrupted)
                )
            );
        }
        assert!(host.commands().is_empty());
    }

    fn record_of(t: &Target) -> String {
        state::record_json(&state::Record {
            unit: t.desired.unit.clone(),
            manifest: t.source.clone(),
            manifest_sha256: t.manifest_digest.clone(),
            unit_sha256: state::sha256(&t.desired.text),
            applied_at: "2026-01-01T00:00:00Z".into(),
            applied_by: "me@box pid 1".into(),
            outcome: "converged".into(),
            ..Default::default()
        })
        .unwrap()
    }

    #[tokio::test]
    async fn a_host_up_to_date_is_told_from_one_command() {
        use crate::preflight::survey::tests::fake_answer;
        use crate::remote::fake::Reply;
        let manifests: Vec<_> = (1..=3)
            .map(|i| {
                let text = super::testing::MANIFEST
                    .replace("service: s", &format!("service: s{i}"))
                    .replace("30000", &format!("3000{i}"));
                crate::manifest::parse(&format!("manifests/s{i}.yaml"), &text).unwrap()
            })
            .collect();
        let targets = crate::targets::targets(&manifests, &Default::default()).unwrap();
        let mut files: Vec<(String, String)> = Vec::new();
        for t in &targets {
            let unit = &t.desired.unit;
            files.push((format!("{UNIT_DIR}/{unit}"), t.desired.text.clone()));
            files.push((
                format!("{}/current.json", state::unit_dir(unit)),
                record_of(t),
            ));
        }
        let host = |files: Vec<(String, String)>| {
            FakeHost::new("gpu-a").on_with(&["sh", "-c"], move |argv, _| {
                let files: Vec<(&str, &str)> = files
                    .iter()
                    .map(|(p, t)| (p.as_str(), t.as_str()))
                    .collect();
                Reply::ok(&fake_answer(argv, "0.5.23", &files))
            })
        };
        let options = options(CancellationToken::new());
        let fake = host(files.clone());
        assert!(!host_has_work(&fake, &targets, &options).await);
        assert_eq!(fake.commands().len(), 1, "{:?}", fake.commands());
        // The last unit's record is gone: its apply did not finish, so there is work.
        files.pop();
        let fake = host(files);
        assert!(host_has_work(&fake, &targets, &options).await);
        assert_eq!(fake.commands().len(), 1);
    }

    #[tokio::test]
    async fn a_unit_sglang_refuses_is_refused_before_its_host_is_touched() {
        use crate::preflight::survey::tests::fake_answer;
        use crate::remote::fake::Reply;
        let text = format!(
            "{}  flags:\n    context-length: 1000000\n",
            super::testing::MANIFEST
        );
        let m = crate::manifest::parse("manifests/s.yaml", &text).unwrap();
        let t = crate::targets::targets(&[m], &Default::default())
            .unwrap()
            .remove(0);
        let (deep, _) = crate::preflight::deep_command();
        let deep: Vec<&str> = deep.iter().map(String::as_str).collect();
        let reason = "ValueError: Warning: User-specified context_length (1000000) is greater than the derived context_length (2048).";
        let answer = format!(
            "{}{{\"verdict\": \"refused\", \"stage\": \"model-config\", \"flag\": \"context-length\", \"reason\": \"{reason}\", \"unchecked\": []}}\n",
            preflight::ANSWER_PREFIX
        );
        let fake = FakeHost::new("gpu-a")
            .on_with(&["sh", "-c"], |argv, _| {
                Reply::ok(&fake_answer(argv, "0.5.23", &[]))
            })
            .on(&deep, Reply::exit(1, &answer, "Traceback ...\n"));
        let reports =
            apply_units(&fake, &[t], &options(CancellationToken::new()), "stopping").await;
        assert_eq!(reports[0].outcome, Outcome::Error, "{:?}", reports[0]);
        assert_eq!(
            reports[0].detail,
            format!("preflight failed, nothing was changed: manifests/s.yaml:9:5: sglang.flags.context-length: the host's SGLang refuses s.service's arguments: {reason}")
        );
        // The survey and the deep check, and nothing else: no lock, no unit file, no systemctl.
        let commands = fake.commands();
        assert_eq!(commands.len(), 2, "{commands:?}");
        assert!(commands[1].starts_with(&deep.iter().map(|a| a.to_string()).collect::<Vec<_>>()));
    }

    #[test]
    fn the_error_kind_is_only_in_the_json_of_failed_units() {
        let ok = refused(
            "gpu-a",
            "s.service",
            "m.yaml",
            Outcome::Unchanged,
            "fine".into(),
        );
        let json = serde_json::to_string(&ok).unwrap();
        assert!(!json.contains("\"error\""), "{json}");
        // A unit without a benchmark has no `benchmark` field: its JSON is as before.
        assert!(!json.contains("benchmark"), "{json}");
        let e = ApplyError::Unreachable(Arc::new(RemoteError::Failed {
            host: "gpu-a".into(),
            command: "ssh".into(),
            status: 255,
            stderr: "cannot connect".into(),
        }));
        let failed = refused_for("gpu-a", "s.service", "m.yaml", &e);
        let json = serde_json::to_value(&failed).unwrap();
        assert_eq!(json["error"], "unreachable");
        assert_eq!(json["outcome"], "error");
        assert_eq!(
            json["detail"],
            "gpu-a: `ssh` exited with 255: cannot connect"
        );
    }
}
