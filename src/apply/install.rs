//! Installing a unit whose plan says so, under its lock: keep the current unit as a generation,
//! write the new one, daemon-reload, and restart only when the plan says so; then verification,
//! and the rollback when the restart or a stage fails. What each result means, and its detail
//! text, is `decide`'s; this file does the remote calls in order.

use reconcile_core::diagnose::diagnose;
use reconcile_core::learned::{self, LoadHistory};
use tokio::time::Instant;

use super::aside::{self, Aside};
use super::decide::{self, Ending};
use super::error::ApplyError;
use super::guard::{self, Armed};
use super::restore::{put_back_file, restore_and_verify, NotRestored, Restore, Restored, Then};
use super::verifier::Check;
use super::{state, Job, Outcome, UnitReport};
use crate::layers::Moved;
use crate::observed::Observed;
use crate::plan::{Verdict, UNIT_DIR};
use crate::redact::{redact_text, Secret, REDACTED};
use crate::remote::{error_chain, Host, RemoteError};
use crate::systemd::Systemd;
use crate::unit::{parse_unit, UnitModel};
use crate::verify::{Expect, Failure, Stage, Verification, POLL_INTERVAL};
use reconcile_core::guard::GuardState;

/// What to go back to when the new unit fails.
pub struct Fallback {
    pub previous: Option<String>,
    pub was_running: bool,
    /// Where this run kept the previous unit among the generations, once it has.
    pub kept: Option<String>,
    /// What systemd ran besides the managed file (`reconcile_core::layers`): the files this run
    /// moves aside go back with the unit, and a rollback expects what all of them ran.
    pub layers: Layered,
}

/// The previous unit's other layers, as a rollback needs them.
#[derive(Default)]
pub struct Layered {
    /// To move aside before the new unit goes in (`systemd.dropins: replace`).
    pub to_move: Vec<Moved>,
    /// Where this run kept them, once it has.
    pub aside: Option<Aside>,
    /// systemd has a unit of this name beneath the managed file (in /run, or a vendor one).
    pub beneath: bool,
    /// The unit was disabled: enable it now, disable it again on a rollback.
    pub was_disabled: bool,
    /// What the previous unit ran with its drop-ins, when it had any.
    pub model: Option<UnitModel>,
}

impl Fallback {
    /// What the previous unit serves (port, model, key), drop-ins and all.
    pub(super) fn previous_expect(&self) -> Option<Expect> {
        match (&self.layers.model, &self.previous) {
            (Some(model), _) => Some(Expect::from_unit(model)),
            (None, Some(text)) => Some(Expect::from_unit(&parse_unit(text))),
            (None, None) => None,
        }
    }

    /// What the host's guard restores, should this run not be there to.
    pub(super) fn going_back(&self) -> guard::GoingBack {
        guard::GoingBack {
            kept: self.kept.clone(),
            previous_sha256: self.previous.as_deref().map(state::sha256),
            beneath: self.layers.beneath,
            was_disabled: self.layers.was_disabled,
            was_running: self.was_running,
            aside: self.layers.aside.as_ref().map(|a| a.record.clone()),
        }
    }

    /// The rollback's restore: the previous unit back, and running again only if it ran.
    pub(super) fn restore<'a>(&'a self, job: &Job<'a>) -> Restore<'a> {
        let t = job.t;
        Restore {
            host: job.host,
            unit: &t.desired.unit,
            previous: self.previous.as_deref(),
            then: if self.was_running {
                Then::Restart
            } else {
                Then::Stop
            },
            spec: &t.verify,
            label: format!("{} {} (rollback)", t.host, t.desired.unit),
            aside: self.layers.aside.as_ref(),
            beneath: self.layers.beneath,
            disable: self.layers.was_disabled,
            expect: self.layers.model.as_ref(),
        }
    }
}

/// How long to wait, beyond the crash window, for a host whose connection broke mid-apply to
/// take connections again: long enough for a server to reboot.
const RECONNECT_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// Installs the new unit and takes it through restart and verification as `verdict` says, rolling
/// back when it fails. The caller holds the unit's lock.
pub async fn install(
    job: &Job<'_>,
    observed: &Observed,
    verdict: Verdict,
    mut fallback: Fallback,
    report: &mut UnitReport,
) -> Ending {
    let (t, options) = (job.t, job.options);
    // The quality gate's reference and noise floor, read from the old server while it serves.
    // Not for `reconcile rollback`: a kept deployment is put back because the newest went wrong,
    // and the newest is what the reference may come from.
    let quality_before = match (&t.verify.quality, verdict) {
        (Some(spec), Verdict::Restart | Verdict::Install) if options.restoring.is_none() => {
            let previous = fallback
                .was_running
                .then(|| fallback.previous_expect())
                .flatten();
            Some(super::quality::before(job, spec, previous.as_ref()).await)
        }
        _ => None,
    };
    // Drained before anything changes: during a long wait the host keeps the old unit, so a
    // server that crashes meanwhile comes back as it was, and a refusal has nothing to undo.
    if let Some(ending) = drain(job, verdict, &fallback, report).await {
        return ending;
    }
    if let Err(e) = write_unit(job, observed, &mut fallback).await {
        let e = ApplyError::InstallFailed(error_chain(&e));
        return decide::install_failed(&e, put_back(job, &fallback).await);
    }
    if verdict == Verdict::ReloadOnly {
        record(job, Outcome::Reloaded, None, report).await;
        return decide::reloaded();
    }
    let begin = Begin::Restart(verdict);
    under_guard(job, &fallback, report, begin, quality_before.as_ref()).await
}

/// Confirms a unit the host's guard kept unconfirmed (its apply died, the guard found it healthy):
/// verified as it runs, under a new guard, without a restart; a failed stage rolls back to the
/// generation that apply kept.
pub async fn confirm(job: &Job<'_>, fallback: Fallback, report: &mut UnitReport) -> Ending {
    under_guard(job, &fallback, report, Begin::AsItRuns, None).await
}

/// How the new unit's invocation begins, once the guard is armed.
#[derive(Clone, Copy)]
enum Begin {
    /// Restarted (or started, for a new unit) as the plan says.
    Restart(Verdict),
    /// Already running, kept by the guard: verified as it runs.
    AsItRuns,
}

/// The part an install and a confirmation share: the unit's past loads and the figures to
/// compare with read, the guard armed, the invocation begun, and verification.
async fn under_guard(
    job: &Job<'_>,
    fallback: &Fallback,
    report: &mut UnitReport,
    begin: Begin,
    quality_before: Option<&super::quality::Before>,
) -> Ending {
    let (host, t, options) = (job.host, job.t, job.options);
    let unit = &t.desired.unit;
    // The unit's last good loads, read before the restart: what this load is compared with, and
    // the load deadline when the manifest leaves it unset.
    let history = load_history(job, report).await;
    let (spec, learned_notes) = learned::learned_spec(&t.verify, history.as_ref());
    // The last moment to stop without a restart: a signal now leaves the server as it was.
    if matches!(begin, Begin::Restart(_)) && options.cancel.is_cancelled() {
        return decide::cancelled_before_restart(
            &crate::signals::interrupted(),
            put_back(job, fallback).await,
        );
    }
    // The current deployment's record, read before the restart: the figures the benchmark stage
    // compares with.
    let before = match &t.verify.benchmark {
        Some(_) => state::read_record(host, unit).await.ok().flatten(),
        None => None,
    };
    // Armed before the old server stops: from here on, a failed change goes back even if this
    // process dies. A host where it cannot be armed is not restarted.
    let armed = match guard::arm(job, fallback.going_back()).await {
        Ok(armed) => armed,
        Err(e) => {
            let e = ApplyError::InstallFailed(format!(
                "the host's guard could not be armed: {}",
                error_chain(&e)
            ));
            let back = match begin {
                Begin::Restart(_) => put_back(job, fallback).await,
                Begin::AsItRuns => Ok(false),
            };
            return decide::install_failed(&e, back);
        }
    };
    let invocation = match begin {
        Begin::Restart(verdict) => match restart(host, unit, verdict).await {
            Ok(id) => id,
            Err(e) => {
                let error = ApplyError::RestartFailed(error_chain(&e));
                let failed = Failed {
                    stage: Stage::Restart,
                    error,
                    invocation: "",
                };
                return roll_back(job, fallback, report, failed, &armed).await;
            }
        },
        // Not a reason to roll back a server that may be healthy: the guard, armed, judges it.
        Begin::AsItRuns => match host.unit_state(unit).await {
            Ok(state) => state.invocation_id,
            Err(e) => return Ending::refused(&ApplyError::ObserveFailed(error_chain(&e))),
        },
    };
    let restarted = Restarted {
        spec: &spec,
        history: history.as_ref(),
        learned_notes: &learned_notes,
        before: before.as_ref(),
        quality: quality_before,
        invocation: &invocation,
    };
    verify_restarted(job, fallback, report, restarted, &armed).await
}

/// The previous unit's file back after a failed write, an unarmed guard or a cancel: nothing was
/// restarted, so the server is left alone. `Ok(whether anything had to be put back)`.
async fn put_back(job: &Job<'_>, fallback: &Fallback) -> Result<bool, String> {
    put_back_file(
        job.host,
        &job.t.desired.unit,
        fallback.previous.as_deref(),
        fallback.layers.aside.as_ref(),
    )
    .await
    .map_err(|e| error_chain(&e))
}

/// The drain before a restart, when the manifest asks for one (`drain:`) and the change restarts a
/// unit the host has: `Some` ending when the restart must not happen (the drain timed out or
/// could not see the server, with `on_timeout: refuse`, or a signal came). Nothing has changed on
/// the host yet then.
pub(super) async fn drain(
    job: &Job<'_>,
    verdict: Verdict,
    fallback: &Fallback,
    report: &mut UnitReport,
) -> Option<Ending> {
    let (t, options) = (job.t, job.options);
    let spec = t.manifest.drain.as_ref()?;
    let previous = fallback
        .previous
        .as_deref()
        .filter(|_| verdict == Verdict::Restart)?;
    let running = crate::drain::Running {
        unit_text: previous,
        running: fallback.was_running,
        url: t.verify.url.as_deref(),
    };
    let label = format!("{} {}", t.host, t.desired.unit);
    let shown = (options.progress.as_ref(), &options.cancel);
    let d = crate::drain::before_restart(job.host, &running, spec, &label, shown).await;
    let ending = match (d.restarted, d.outcome) {
        (true, _) => {
            report.notes.push(d.detail.clone());
            None
        }
        (false, crate::drain::Ended::Interrupted) => Some(decide::drain_interrupted(
            &crate::signals::interrupted(),
            &d.detail,
        )),
        (false, _) => Some(decide::drain_refused(&ApplyError::DrainRefused(
            d.detail.clone(),
        ))),
    };
    report.drain = Some(d);
    ending
}

/// What a restarted unit is verified with: the settings (learned from history where the manifest
/// left them), the last good loads, the figures to compare with, and its invocation.
struct Restarted<'a> {
    spec: &'a crate::manifest::VerifySpec,
    history: Option<&'a LoadHistory>,
    learned_notes: &'a [String],
    before: Option<&'a crate::record::Record>,
    /// What the quality gate read before the restart (`verify.quality`).
    quality: Option<&'a super::quality::Before>,
    invocation: &'a str,
}

/// Verifies the restarted unit, then its throughput when asked: converged and recorded, or rolled
/// back through the same path for any failed stage.
async fn verify_restarted(
    job: &Job<'_>,
    fallback: &Fallback,
    report: &mut UnitReport,
    r: Restarted<'_>,
    armed: &Armed<'_>,
) -> Ending {
    let (host, t, options) = (job.host, job.t, job.options);
    let unit = &t.desired.unit;
    let check = Check {
        unit,
        spec: r.spec,
        expect: Expect::from_unit(&t.desired.model),
        label: format!("{} {unit}", t.host),
        cancel: &options.cancel,
        history: r.history,
    };
    let learned = |v: &mut Verification| {
        v.notes.splice(0..0, r.learned_notes.iter().cloned());
        v.previous_loads = r.history.cloned();
    };
    // Every stage under the guard's lease: it stays put while this process judges.
    let judged = armed
        .leased(async {
            match job.verifier.verify(host, check).await {
                Ok(mut v) => {
                    learned(&mut v);
                    if let Some(reason) = throughput_gate(job, &mut v, r.before, report).await {
                        report.verification = Some(v);
                        return Err(Failed::stage(Stage::Benchmark, reason, r.invocation));
                    }
                    match quality_gate(job, &mut v, r.quality, report).await {
                        Err(reason) => {
                            report.verification = Some(v);
                            Err(Failed::stage(Stage::Quality, reason, r.invocation))
                        }
                        Ok(keep) => Ok((v, keep)),
                    }
                }
                Err(Failure {
                    stage,
                    reason,
                    mut verification,
                }) => {
                    learned(&mut verification);
                    report.verification = Some(*verification);
                    Err(Failed::stage(stage, reason, r.invocation))
                }
            }
        })
        .await;
    let (v, keep) = match judged {
        Ok(passed) => passed,
        Err(failed) => return roll_back(job, fallback, report, failed, armed).await,
    };
    disarm(armed, report).await;
    let mut ending = decide::converged(&v);
    if let Some(b) = &report.benchmark {
        ending.detail.push_str(&decide::benchmark_passed(&b.detail));
    }
    if let Some(q) = &report.quality {
        ending.detail.push_str(&format!("; quality: {}", q.detail));
    }
    if let Some(reference) = keep {
        report
            .notes
            .extend(reconcile_core::quality::oversize_note(&reference));
        // The converged server's answers are what the next change is compared with.
        if let Err(e) = crate::quality::keep_reference(host, unit, &reference).await {
            report.notes.push(format!(
                "quality: the new reference could not be kept: {}",
                error_chain(&e)
            ));
        }
    }
    record(job, Outcome::Converged, Some(&v), report).await;
    report.verification = Some(v);
    ending
}

/// Stands the guard down; one that cannot be reached is a note: it finds the unit healthy at
/// its deadline and keeps it, marked unconfirmed, and the next apply confirms it.
pub(super) async fn disarm(armed: &Armed<'_>, report: &mut UnitReport) {
    match armed.disarm().await {
        Ok(Some(found)) if found.acted() => report.notes.push(format!(
            "the host's guard had settled the unit already ({})",
            found.name()
        )),
        Ok(_) => {}
        Err(e) => report.notes.push(format!(
            "the host's guard could not be disarmed ({}); it will keep the unit at its deadline, unconfirmed",
            error_chain(&e)
        )),
    }
}

/// The quality gate, when the manifest asks for one (`verify.quality`): its figures go into the
/// report; `Err` is why the stage failed, `Ok` the reference to keep once the unit converges.
pub(super) async fn quality_gate(
    job: &Job<'_>,
    v: &mut Verification,
    before: Option<&super::quality::Before>,
    report: &mut UnitReport,
) -> Result<Option<reconcile_core::quality::Reference>, String> {
    let Some(spec) = job.t.verify.quality.as_ref() else {
        return Ok(None);
    };
    if job.options.restoring.is_some() {
        return Ok(None);
    }
    let nothing = super::quality::Before::default();
    let (q, keep) = super::quality::stage(job, spec, v, before.unwrap_or(&nothing)).await;
    let failed = q.fails().then(|| q.detail.clone());
    report.quality = Some(q);
    match failed {
        Some(reason) => Err(reason),
        None => Ok(keep),
    }
}

/// The throughput gate, when the manifest asks for one (`verify.benchmark`): its figures go into
/// the report; a regression beyond the allowance with the gate on is the reason the stage failed.
pub(super) async fn throughput_gate(
    job: &Job<'_>,
    v: &mut Verification,
    before: Option<&crate::record::Record>,
    report: &mut UnitReport,
) -> Option<String> {
    let spec = job.t.verify.benchmark.as_ref()?;
    let b = super::benchmark::stage(job, spec, v, before).await;
    let failed = b.fails().then(|| b.detail.clone());
    report.benchmark = Some(b);
    failed
}

/// The unit's last good loads from its history on the host; none when it has none, or when the
/// history cannot be read (a note then: the load is judged on the manifest's values alone).
pub(super) async fn load_history(job: &Job<'_>, report: &mut UnitReport) -> Option<LoadHistory> {
    match state::read_history(job.host, &job.t.desired.unit).await {
        Ok(lines) => LoadHistory::from_records(lines.iter().filter_map(|l| l.as_ref().ok())),
        Err(e) => {
            report.notes.push(format!(
                "the unit's history could not be read ({}); verified without its past loads",
                error_chain(&e)
            ));
            None
        }
    }
}

/// Keeps the current unit as a generation (noting where in `fallback`), writes the new one and
/// has systemd reload.
pub(super) async fn write_unit(
    job: &Job<'_>,
    observed: &Observed,
    fallback: &mut Fallback,
) -> Result<(), RemoteError> {
    let (host, t) = (job.host, job.t);
    let unit = &t.desired.unit;
    let path = format!("{UNIT_DIR}/{unit}");
    // A temporary file left by a run cut off mid-write; we hold the lock, so it is not in use.
    host.run_ok(&["rm", "-f", "--", &format!("{path}.reconcile-tmp")])
        .await?;
    if let Some(current) = observed
        .unit_text
        .as_deref()
        .filter(|c| *c != t.desired.text)
    {
        fallback.kept = Some(state::keep_generation(host, unit, current).await?);
    }
    // Out of systemd's way before the new unit goes in: each kept in a record first.
    let to_move = std::mem::take(&mut fallback.layers.to_move);
    if !to_move.is_empty() {
        fallback.layers.aside = aside::move_aside(host, unit, to_move).await?;
    }
    host.write_file(&path, &t.desired.text, "0644").await?;
    host.run_ok(&["systemctl", "daemon-reload"]).await?;
    if fallback.layers.was_disabled || fallback.layers.aside.is_some() || fallback.layers.beneath {
        // Installed but disabled, or the unit systemd ran came from elsewhere: the managed unit
        // is to start at boot too.
        host.run_ok(&["systemctl", "enable", "--", unit]).await?;
    }
    Ok(())
}

/// Enables a new unit, restarts it, and returns the new invocation's id (for its journal).
async fn restart(host: &dyn Host, unit: &str, verdict: Verdict) -> Result<String, RemoteError> {
    if verdict == Verdict::Install {
        host.run_ok(&["systemctl", "enable", "--", unit]).await?;
    }
    host.run_ok(&["systemctl", "restart", "--", unit]).await?;
    Ok(host.unit_state(unit).await?.invocation_id)
}

/// What failed in the new unit, for the rollback.
struct Failed<'a> {
    stage: Stage,
    error: ApplyError,
    /// The failed invocation, whose journal goes into the report ("" when it never started).
    invocation: &'a str,
}

impl<'a> Failed<'a> {
    /// A verification stage (or the throughput gate) that failed for `reason`.
    fn stage(stage: Stage, reason: String, invocation: &'a str) -> Failed<'a> {
        let error = ApplyError::VerificationFailed { stage, reason };
        Failed {
            stage,
            error,
            invocation,
        }
    }
}

/// Puts the previous unit back after the new one failed, through a host that may be going away.
async fn roll_back(
    job: &Job<'_>,
    fallback: &Fallback,
    report: &mut UnitReport,
    failed: Failed<'_>,
    armed: &Armed<'_>,
) -> Ending {
    report.failed_stage = Some(failed.stage);
    let cause = failed.error.kind();
    let text = failed.error.to_string();
    let (ending, reached) = armed
        .leased(restore_through(job, fallback, report, text, cause, armed))
        .await;
    // A host that did not come back keeps its guard, which finishes the rollback there.
    if reached {
        if let Err(e) = armed.disarm().await {
            report.notes.push(format!(
                "the host's guard could not be disarmed after the rollback: {}",
                error_chain(&e)
            ));
        }
    }
    // Read after the rollback, which gives journald time to take in the failed process's last
    // lines.
    report.journal = redacted_journal(job, fallback, failed.invocation).await;
    report.diagnosis = report.journal.as_deref().and_then(diagnose);
    ending
}

/// The rollback's restore and verification, through a host that may go away and come back.
async fn restore_through(
    job: &Job<'_>,
    fallback: &Fallback,
    report: &mut UnitReport,
    mut text: String,
    cause: super::error::ApplyErrorKind,
    armed: &Armed<'_>,
) -> (Ending, bool) {
    let (host, t) = (job.host, job.t);
    let unit = &t.desired.unit;
    // The host may go away under us (a reboot, a cut network): then wait for it and roll back as
    // for any other failure. The new unit never passed verification and may be what brought the
    // host down; enabled, it may be running again after a reboot, unverified. A host shutting
    // down still answers for a moment, so a rollback that fails while it does starts over.
    let window = t.verify.crash_window + RECONNECT_GRACE;
    let until = Instant::now() + window;
    let mut tried = false;
    let ending = loop {
        let now = presence(host).await;
        if now == Presence::ShuttingDown && !text.contains(decide::SHUTTING_DOWN) {
            text.push_str(decide::SHUTTING_DOWN);
        }
        if now == Presence::ShuttingDown && Instant::now() < until {
            // Its sshd goes soon; reconnecting before would reach the host on its way down.
            tokio::time::sleep(POLL_INTERVAL).await;
            continue;
        }
        if now != Presence::Here {
            match host
                .reconnect(until.saturating_duration_since(Instant::now()))
                .await
            {
                Ok(took) => text.push_str(&decide::reconnected(took.as_secs_f64())),
                Err(e) => {
                    let left = decide::left_behind(
                        unit,
                        fallback.previous.is_none(),
                        fallback.kept.as_deref(),
                        tried,
                    );
                    let lost = decide::host_lost(&text, window.as_secs(), &error_chain(&e), &left);
                    return (lost, false);
                }
            }
        }
        // One of this run and the host's guard rolls back, never both: taking the guard over
        // tells which (the guard acted first if its lease ran out while the host was out of
        // reach), and leaves the guard to finish this rollback should this process die in it.
        if !tried {
            match armed.take().await {
                Ok(Some(found)) if found != GuardState::Armed => {
                    return match armed.settled(&t.verify).await {
                        Some(settled) => (decide::guard_acted_first(&text, cause, &settled), true),
                        None => (Ending::rollback_failed(format!("host needs attention: {text}; the host's guard is rolling back ({})", found.name())), true),
                    };
                }
                _ => {}
            }
        }
        tried = true;
        let result = restore_and_verify(fallback.restore(job), job.verifier).await;
        let ending = decide::rolled_back(&text, cause, &result);
        match result {
            Ok(Restored::Verified(v)) => report.rollback = Some(*v),
            Err(NotRestored::Verify(f)) => report.rollback = Some(*f.verification),
            _ => {}
        }
        if ending.outcome != super::Outcome::RollbackFailed
            || Instant::now() >= until
            || presence(host).await == Presence::Here
        {
            break ending;
        }
    };
    (ending, true)
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

/// Writes the deployment record; a failure to record is a note, not a failed deployment.
pub(super) async fn record(
    job: &Job<'_>,
    outcome: Outcome,
    v: Option<&Verification>,
    report: &mut UnitReport,
) {
    let (host, t, options) = (job.host, job.t, job.options);
    let owner = &options.owner;
    let plateau = v.and_then(|v| v.plateau.as_ref());
    let record = state::Record {
        unit: t.desired.unit.clone(),
        manifest: t.source.clone(),
        manifest_sha256: t.manifest_digest.clone(),
        unit_sha256: state::sha256(&t.desired.text),
        git_commit: options.git.commit.clone(),
        git_author: options.git.author.clone(),
        applied_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
        applied_by: format!("{}@{} pid {}", owner.user, owner.machine, owner.pid),
        outcome: outcome.name().to_string(),
        load_seconds: v.and_then(|v| v.load_seconds),
        plateau_service_bytes: plateau.and_then(|p| p.service_bytes),
        plateau_gpu_mib: plateau.map(|p| p.gpu_mib.clone()).unwrap_or_default(),
        trajectory: v
            .map(|v| learned::trajectory(&v.samples))
            .unwrap_or_default(),
        restored_from: options.restoring,
        benchmark: report.benchmark.as_ref().and_then(|b| b.record()),
        quality: report.quality.as_ref().map(|q| q.figures()),
    };
    if let Err(e) = state::write_record(host, &record, &t.desired.text).await {
        report.notes.push(format!(
            "the deployment record could not be written: {}",
            error_chain(&e)
        ));
    }
}

/// The failed invocation's journal with the secrets of both units redacted: SGLang logs its
/// resolved arguments, secrets included.
pub(super) async fn redacted_journal(
    job: &Job<'_>,
    fallback: &Fallback,
    invocation: &str,
) -> Option<String> {
    let secrets: Vec<Secret> = job
        .options
        .redactor
        .secret_values(&job.t.desired.model)
        .into_iter()
        .chain(
            fallback
                .previous
                .as_deref()
                .map(|p| job.options.redactor.secret_values(&parse_unit(p)))
                .unwrap_or_default(),
        )
        .chain(
            fallback
                .layers
                .model
                .as_ref()
                .map(|m| job.options.redactor.secret_values(m))
                .unwrap_or_default(),
        )
        .map(|(name, value)| Secret {
            name,
            value,
            placeholder: REDACTED,
        })
        .collect();
    journal(job.host, invocation)
        .await
        .map(|j| redact_text(&j, &secrets))
}

/// The last lines the failed invocation logged, and systemd's lines about it.
async fn journal(host: &dyn Host, invocation: &str) -> Option<String> {
    if invocation.is_empty() {
        return None;
    }
    let process = format!("_SYSTEMD_INVOCATION_ID={invocation}");
    let manager = format!("INVOCATION_ID={invocation}");
    let argv = [
        "journalctl",
        &process,
        "+",
        &manager,
        "-n",
        "50",
        "--no-pager",
        "-o",
        "cat",
    ];
    Some(host.run(&argv).await.ok()?.stdout)
}

#[cfg(test)]
mod tests {
    use std::time::Instant as StdInstant;

    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::apply::error::ApplyErrorKind;
    use crate::apply::testing::{observed, options, target};
    use crate::apply::verifier::fake::Scripted;
    use crate::apply::Report;
    use crate::remote::fake::{FakeHost, Reply};
    use crate::verify::Sample;

    const PATH: &str = "/etc/systemd/system/s.service";

    /// A host where every command succeeds, and systemd reports a running invocation `inv-1`.
    fn host(unit: Option<&str>) -> FakeHost {
        let fake = FakeHost::new("gpu-a")
            .on(&[], Reply::ok(""))
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
        let mut report = Report::new(&t, StdInstant::now()).report;
        let fallback = Fallback {
            previous: before.unit_text.clone(),
            was_running: before.state.active_state == "active",
            kept: None,
            layers: Default::default(),
        };
        let ending = install(&job, before, verdict, fallback, &mut report).await;
        (ending, report)
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
        assert!(started.elapsed() >= POLL_INTERVAL);
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
        let mut report = Report::new(t, StdInstant::now()).report;
        let fallback = Fallback {
            previous: Some("old".into()),
            was_running: true,
            kept: None,
            layers: Default::default(),
        };
        let ending = install(&job, &before, Verdict::Restart, fallback, &mut report).await;
        (ending, report)
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
