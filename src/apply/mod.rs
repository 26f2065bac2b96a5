//! `reconcile apply`: make each host run what its manifest says, prove the server came up right,
//! or put the host back the way it was.
//!
//! Per unit: plan; nothing to do -> touch nothing. Otherwise run preflight (a unit whose host cannot
//! run it is refused, untouched), take the unit's lock on the host, keep the current unit as a
//! generation, write the new one atomically, daemon-reload, and restart only when the plan says so. A restarted server goes through staged verification (`verify`); when a
//! stage fails, the previous unit is restored, restarted and verified the same way (a unit that
//! was new is removed), and the report carries the failed invocation's journal.

mod rollout;
pub(crate) mod state;

use std::time::Instant;

use indicatif::MultiProgress;
use serde::Serialize;
use tokio::sync::watch;

pub use rollout::Rollout;
pub use state::{LockPolicy, Owner};

use crate::observed::Observed;
use crate::plan::{plan, Verdict, UNIT_DIR};
use crate::plan_file;
use crate::preflight;
use crate::redact::{redact_text, Redactor, Secret, REDACTED};
use crate::remote::{self, error_chain, Host, RemoteError, SshOptions};
use crate::systemd::Systemd;
use crate::targets::Target;
use crate::unit::parse_unit;
use crate::verify::{verify, Expect, Failure, Progress, Verification, POLL_INTERVAL};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Nothing differed; nothing was touched.
    Unchanged,
    /// The unit was replaced and systemd reloaded; the server kept running.
    Reloaded,
    /// The unit was replaced and the server restarted and passed every stage.
    Converged,
    /// Not started: the run was interrupted before this host's turn.
    NotStarted,
    /// Nothing was changed because of an error (unreachable, locked, unreadable).
    Error,
    /// Verification failed; the previous unit runs again and passed verification.
    RolledBack,
    /// Verification failed and so did the rollback: the host needs attention.
    RollbackFailed,
}

impl Outcome {
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Unchanged | Outcome::Reloaded | Outcome::Converged => 0,
            Outcome::Error | Outcome::NotStarted => 1,
            Outcome::RolledBack => 3,
            Outcome::RollbackFailed => 4,
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct UnitReport {
    pub host: String,
    pub unit: String,
    pub source: String,
    pub verdict: Option<Verdict>,
    pub outcome: Outcome,
    /// What happened, or why it failed.
    pub detail: String,
    /// The stage that failed, when one did.
    pub failed_stage: Option<String>,
    pub notes: Vec<String>,
    /// Stages and memory samples of the new unit's verification.
    pub verification: Option<Verification>,
    /// Stages and samples of the restored unit's verification, after a rollback.
    pub rollback: Option<Verification>,
    /// The failed invocation's last journal lines (secrets redacted).
    pub journal: Option<String>,
    pub seconds: f64,
}

/// The git commit the manifests were read from, for deployment records.
#[derive(Debug, Clone, Default)]
pub struct GitInfo {
    pub commit: Option<String>,
    pub author: Option<String>,
}

pub struct ApplyOptions {
    pub owner: Owner,
    pub lock: LockPolicy,
    pub git: GitInfo,
    /// Turns true on Ctrl-C: verification in progress fails (and rolls back), no new host starts.
    pub cancel: watch::Receiver<bool>,
    /// Live display on a terminal.
    pub progress: Option<MultiProgress>,
    /// Preflight's deep check: the host's SGLang parses each unit's argv first (~10 s a unit).
    pub deep: bool,
    pub rollout: Rollout,
    /// Set by `reconcile rollback`: the deployment whose kept unit is being restored. Its record
    /// says so, and preflight's SGLang version check (against the manifest, which may have moved on
    /// since) becomes a note: the restored unit ran on this host before.
    pub restoring: Option<usize>,
    /// What to hide in plans and journals: the secret names of the run's manifests.
    pub redactor: Redactor,
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
    apply_unit(host, t, options).await
}

/// A unit refused before anything was done on its host.
pub(crate) fn refused(
    host: &str,
    unit: &str,
    source: &str,
    outcome: Outcome,
    detail: String,
) -> UnitReport {
    UnitReport {
        host: host.to_string(),
        unit: unit.to_string(),
        source: source.to_string(),
        verdict: None,
        outcome,
        detail,
        failed_stage: None,
        notes: Vec::new(),
        verification: None,
        rollback: None,
        journal: None,
        seconds: 0.0,
    }
}

fn not_started(t: &Target, why: &str) -> UnitReport {
    Report::new(t, Instant::now()).end(Outcome::NotStarted, &format!("not started: {why}"))
}

pub(super) async fn apply_host(
    name: String,
    targets: Vec<Target>,
    ssh: &SshOptions,
    options: &ApplyOptions,
) -> Vec<UnitReport> {
    let started = Instant::now();
    if *options.cancel.borrow() {
        return targets
            .iter()
            .map(|t| {
                Report::new(t, started)
                    .end(Outcome::NotStarted, "interrupted before this host's turn")
            })
            .collect();
    }
    let host = match remote::connect(&name, ssh).await {
        Ok(host) => host,
        Err(e) => return unreachable(&targets, &e, started),
    };
    let mut reports = Vec::new();
    for t in &targets {
        if *options.cancel.borrow() {
            reports.push(not_started(t, "interrupted before this unit's turn"));
            continue;
        }
        reports.push(apply_unit(&*host, t, options).await);
    }
    host.close().await;
    reports
}

/// Whether applying `t` would do anything: its unit differs from the manifest, or the last apply of
/// it did not finish. A plan file's unit, and a unit or record that cannot be read, count as work:
/// apply's own path checks and reports them.
pub(super) async fn has_work(host: &dyn Host, t: &Target, options: &ApplyOptions) -> bool {
    if t.expected.is_some() {
        return true;
    }
    match host.observe(&t.desired.unit).await {
        Ok(observed) => {
            plan(&t.host, &t.source, &t.desired, &observed, &options.redactor).verdict
                != Verdict::NoChange
                || unfinished(host, t, &observed).await.unwrap_or(true)
        }
        Err(_) => true,
    }
}

/// The report of a unit found up to date, untouched.
pub(super) fn unchanged(t: &Target, started: Instant) -> UnitReport {
    let mut r = Report::new(t, started);
    r.report.verdict = Some(Verdict::NoChange);
    r.end(Outcome::Unchanged, "already up to date; nothing touched")
}

/// The reports of a host that could not be reached: nothing was changed.
pub(super) fn unreachable(
    targets: &[Target],
    e: &RemoteError,
    started: Instant,
) -> Vec<UnitReport> {
    let detail = error_chain(e);
    targets
        .iter()
        .map(|t| Report::new(t, started).end(Outcome::Error, &detail))
        .collect()
}

/// A report being filled in as a unit is applied.
struct Report {
    report: UnitReport,
    started: Instant,
}

impl Report {
    fn new(t: &Target, started: Instant) -> Report {
        let report = UnitReport {
            host: t.host.clone(),
            unit: t.desired.unit.clone(),
            source: t.source.clone(),
            verdict: None,
            outcome: Outcome::Error,
            detail: String::new(),
            failed_stage: None,
            notes: Vec::new(),
            verification: None,
            rollback: None,
            journal: None,
            seconds: 0.0,
        };
        Report { report, started }
    }

    fn end(mut self, outcome: Outcome, detail: &str) -> UnitReport {
        self.report.outcome = outcome;
        self.report.detail = detail.to_string();
        self.report.seconds = self.started.elapsed().as_secs_f64();
        self.report
    }
}

async fn apply_unit(host: &dyn Host, t: &Target, options: &ApplyOptions) -> UnitReport {
    let mut r = Report::new(t, Instant::now());
    let span = tracing::info_span!("unit", host = %t.host, unit = %t.desired.unit);
    let _guard = span.enter();
    let observed = match host.observe(&t.desired.unit).await {
        Ok(o) => o,
        Err(e) => return r.end(Outcome::Error, &error_chain(&e)),
    };
    // A plan file's unit: the host must still have what the plan was made against. Checked here
    // for an early refusal (and for a unit with nothing to do, which takes no lock), and again
    // under the lock below, where nothing else can change it before the install.
    if let Some(expected) = &t.expected {
        let current = observed.unit_text.as_deref().map(state::sha256);
        if let Some(stale) = plan_file::unit_staleness(&t.host, expected, current.as_deref()) {
            return r.end(Outcome::Error, &format!("nothing was changed: {stale}"));
        }
    }
    let mut verdict = plan(&t.host, &t.source, &t.desired, &observed, &options.redactor).verdict;
    let mut previous = observed.unit_text.clone();
    let mut was_running = matches!(
        observed.state.active_state.as_str(),
        "active" | "activating"
    );
    if verdict == Verdict::NoChange {
        match unfinished(host, t, &observed).await {
            Ok(false) => return unchanged(t, r.started),
            Ok(true) => {}
            Err(e) => return r.end(Outcome::Error, &format!("nothing was changed: {e}")),
        }
        // The unit on disk is the desired one but no run recorded it: an apply died after the
        // rename. Finish that apply, with the generation it kept to fall back on.
        r.report.notes.push("the last apply did not finish (no deployment record for this unit); restarting and verifying it".into());
        verdict = Verdict::Restart;
        previous = state::newest_generation(host, &t.desired.unit)
            .await
            .ok()
            .flatten();
        was_running = true;
    }
    r.report.verdict = Some(verdict);
    // Preflight before the lock and any change: a unit its host cannot run is refused while the
    // old server still serves. A unit with nothing to do was left above, untouched, whatever
    // preflight would say (`plan` checks only its SGLang version).
    match preflight::check(host, t, &observed.state, options.deep).await {
        Ok(findings) => {
            let (errors, warnings): (Vec<_>, Vec<_>) = findings
                .into_iter()
                .partition(|f| blocks(f, options.restoring));
            r.report.notes.extend(
                warnings
                    .into_iter()
                    .map(|f| format!("preflight: {}", f.message)),
            );
            if !errors.is_empty() {
                let errors: Vec<String> = errors.into_iter().map(|f| f.message).collect();
                let detail = format!(
                    "preflight failed, nothing was changed: {}",
                    errors.join("; ")
                );
                return r.end(Outcome::Error, &detail);
            }
        }
        Err(e) => {
            let detail = format!("preflight could not run: {}", error_chain(&e));
            return r.end(Outcome::Error, &detail);
        }
    }
    match state::lock(host, &t.desired.unit, &options.owner, options.lock).await {
        Ok(note) => r.report.notes.extend(note),
        Err(e) => return r.end(Outcome::Error, &e),
    }
    if let Some(expected) = &t.expected {
        if let Err(why) = still_as_planned(host, t, expected, &observed).await {
            if let Err(e) = state::unlock(host, &t.desired.unit).await {
                r.report.notes.push(format!(
                    "the lock could not be released: {}",
                    error_chain(&e)
                ));
            }
            return r.end(Outcome::Error, &format!("nothing was changed: {why}"));
        }
    }
    let (outcome, detail) = install(
        host,
        t,
        &observed,
        verdict,
        Fallback {
            previous,
            was_running,
            kept: None,
        },
        options,
        &mut r.report,
    )
    .await;
    if let Err(e) = state::unlock(host, &t.desired.unit).await {
        r.report.notes.push(format!(
            "the lock could not be released: {}",
            error_chain(&e)
        ));
    }
    r.end(outcome, &detail)
}

/// Under the unit's lock: the unit file, the installed SGLang and the rendered unit are still what
/// the plan file recorded. The unit file is read again, since another run may have changed it
/// between the first look and the lock.
async fn still_as_planned(
    host: &dyn Host,
    t: &Target,
    expected: &plan_file::PlannedState,
    observed: &Observed,
) -> Result<(), String> {
    let path = format!("{UNIT_DIR}/{}", t.desired.unit);
    let read =
        async { tokio::try_join!(host.read_file(&path), preflight::installed_sglang(host, t)) };
    let (text, sglang) = read
        .await
        .map_err(|e| format!("the plan could not be checked: {}", error_chain(&e)))?;
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
        Err(stale.join("; "))
    }
}

/// Whether a preflight finding refuses the unit. When restoring a kept deployment, the manifest's
/// SGLang version and flags say nothing about the unit being restored, so those findings are notes.
fn blocks(f: &preflight::Finding, restoring: Option<usize>) -> bool {
    let about_manifest = matches!(f.check, "sglang-version" | "flags");
    f.severity == preflight::Severity::Error && !(restoring.is_some() && about_manifest)
}

/// Whether a managed unit on disk matches the manifest but was never recorded as deployed. A record
/// that exists but cannot be read or parsed is an error, never "no record": that would restart a
/// healthy server to finish an apply that did finish.
async fn unfinished(
    host: &dyn Host,
    t: &Target,
    observed: &Observed,
) -> Result<bool, state::RecordError> {
    let Some(text) = &observed.unit_text else {
        return Ok(false);
    };
    let record = state::read_record(host, &t.desired.unit).await?;
    Ok(record.is_none_or(|r| r.unit_sha256 != state::sha256(text)))
}

/// What to go back to when the new unit fails.
pub(super) struct Fallback {
    pub previous: Option<String>,
    pub was_running: bool,
    /// Where this run kept the previous unit among the generations, once it has.
    pub kept: Option<String>,
}

/// How long to wait, beyond the crash window, for a host whose connection broke mid-apply to
/// take connections again: long enough for a server to reboot.
const RECONNECT_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

async fn install(
    host: &dyn Host,
    t: &Target,
    observed: &Observed,
    verdict: Verdict,
    mut fallback: Fallback,
    options: &ApplyOptions,
    report: &mut UnitReport,
) -> (Outcome, String) {
    let unit = &t.desired.unit;
    let path = format!("{UNIT_DIR}/{unit}");
    let prepared = async {
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
        host.write_file(&path, &t.desired.text, "0644").await?;
        host.run_ok(&["systemctl", "daemon-reload"]).await?;
        Ok::<(), RemoteError>(())
    };
    if let Err(e) = prepared.await {
        let detail = format!("installing failed: {}", error_chain(&e));
        return match put_back(host, unit, &fallback).await {
            Ok(false) => (
                Outcome::Error,
                format!("{detail}; nothing changed on the host"),
            ),
            Ok(true) => (
                Outcome::Error,
                format!(
                    "{detail}; the previous unit is back in place (the server was not restarted)"
                ),
            ),
            Err(e2) => (
                Outcome::RollbackFailed,
                format!(
                    "{detail}; putting the previous unit back failed too: {}",
                    error_chain(&e2)
                ),
            ),
        };
    }
    if verdict == Verdict::ReloadOnly {
        record(host, t, options, "reloaded", None, report).await;
        return (
            Outcome::Reloaded,
            "unit replaced and daemon-reloaded; the server kept running".into(),
        );
    }
    // The last moment to stop without a restart: a signal now leaves the server as it was.
    if *options.cancel.borrow() {
        let detail = format!(
            "not started: {} before the restart",
            crate::signals::interrupted()
        );
        return match put_back(host, unit, &fallback).await {
            Ok(_) => (
                Outcome::NotStarted,
                format!(
                    "{detail}; the previous unit is back in place and the server was not restarted"
                ),
            ),
            Err(e) => (
                Outcome::RollbackFailed,
                format!(
                    "{detail}; putting the previous unit back failed: {}",
                    error_chain(&e)
                ),
            ),
        };
    }
    let restarted = async {
        if verdict == Verdict::Install {
            host.run_ok(&["systemctl", "enable", "--", unit]).await?;
        }
        host.run_ok(&["systemctl", "restart", "--", unit]).await?;
        Ok::<String, RemoteError>(host.unit_state(unit).await?.invocation_id)
    };
    let invocation = match restarted.await {
        Ok(id) => id,
        Err(e) => {
            return rollback(
                host,
                t,
                &fallback,
                options,
                report,
                "restart",
                error_chain(&e),
                "",
            )
            .await
        }
    };
    let progress = Progress::new(format!("{} {unit}", t.host), options.progress.as_ref());
    let expect = Expect::from_unit(&t.desired.model);
    match verify(host, unit, &t.verify, &expect, &progress, &options.cancel).await {
        Ok(v) => {
            let detail = format!("restarted and verified: {}", summary(&v));
            record(host, t, options, "converged", Some(&v), report).await;
            report.verification = Some(v);
            (Outcome::Converged, detail)
        }
        Err(Failure {
            stage,
            reason,
            verification,
        }) => {
            report.verification = Some(verification);
            rollback(
                host,
                t,
                &fallback,
                options,
                report,
                stage,
                reason,
                &invocation,
            )
            .await
        }
    }
}

fn summary(v: &Verification) -> String {
    let load = v
        .load_seconds
        .map_or(String::new(), |s| format!("ready after {s:.1}s"));
    let stages: Vec<&str> = v.stages.iter().map(|s| s.name).collect();
    format!(
        "{load} ({} passed) memory {}",
        stages.join(", "),
        v.sparkline()
    )
}

#[allow(clippy::too_many_arguments)]
async fn rollback(
    host: &dyn Host,
    t: &Target,
    fallback: &Fallback,
    options: &ApplyOptions,
    report: &mut UnitReport,
    stage: &str,
    reason: String,
    invocation: &str,
) -> (Outcome, String) {
    let unit = &t.desired.unit;
    report.failed_stage = Some(stage.to_string());
    let mut failed = format!("{stage} failed: {reason}");
    // The host may go away under us (a reboot, a cut network): then wait for it and roll back as
    // for any other failure. The new unit never passed verification and may be what brought the
    // host down; enabled, it may be running again after a reboot, unverified. A host shutting
    // down still answers for a moment, so a rollback that fails while it does starts over.
    let until = Instant::now() + t.verify.crash_window + RECONNECT_GRACE;
    let mut tried = false;
    let (outcome, detail) = loop {
        let now = presence(host).await;
        if now == Presence::ShuttingDown && !failed.contains(SHUTTING_DOWN) {
            failed.push_str(SHUTTING_DOWN);
        }
        if now == Presence::ShuttingDown && Instant::now() < until {
            // Its sshd goes soon; reconnecting before would reach the host on its way down.
            tokio::time::sleep(POLL_INTERVAL).await;
            continue;
        }
        if now != Presence::Here {
            const LOST: &str = "the connection to the host was lost";
            match host
                .reconnect(until.saturating_duration_since(Instant::now()))
                .await
            {
                Ok(took) => failed.push_str(&format!(
                    "; {LOST}, reconnected after {:.1}s",
                    took.as_secs_f64()
                )),
                Err(e) => {
                    let detail = format!(
                        "host needs attention: {failed}; {LOST} and it did not come back within {}s ({}); {}",
                        (t.verify.crash_window + RECONNECT_GRACE).as_secs(),
                        error_chain(&e),
                        left_behind(unit, fallback, tried)
                    );
                    return (Outcome::RollbackFailed, detail);
                }
            }
        }
        tried = true;
        let done = put_previous_back(host, t, fallback, options, report, &failed).await;
        if done.0 != Outcome::RollbackFailed
            || Instant::now() >= until
            || presence(host).await == Presence::Here
        {
            break done;
        }
    };
    // Read after the rollback, which gives journald time to take in the failed process's last
    // lines. SGLang logs its resolved arguments, secrets included.
    let secrets: Vec<Secret> = options
        .redactor
        .secret_values(&t.desired.model)
        .into_iter()
        .chain(
            fallback
                .previous
                .as_deref()
                .map(|p| options.redactor.secret_values(&parse_unit(p)))
                .unwrap_or_default(),
        )
        .map(|(name, value)| Secret {
            name,
            value,
            placeholder: REDACTED,
        })
        .collect();
    report.journal = journal(host, invocation)
        .await
        .map(|j| redact_text(&j, &secrets));
    (outcome, detail)
}

const SHUTTING_DOWN: &str = "; the host was shutting down";

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

/// Restores the previous unit (or removes a unit that was new) and verifies it when it ran.
async fn put_previous_back(
    host: &dyn Host,
    t: &Target,
    fallback: &Fallback,
    options: &ApplyOptions,
    report: &mut UnitReport,
    failed: &str,
) -> (Outcome, String) {
    let unit = &t.desired.unit;
    match restore(host, unit, fallback, fallback.was_running).await {
        Err(e) => (
            Outcome::RollbackFailed,
            format!("{failed}; rollback failed: {}", error_chain(&e)),
        ),
        Ok(()) => match (&fallback.previous, fallback.was_running) {
            (None, _) => (
                Outcome::RolledBack,
                format!("{failed}; the new unit was stopped, disabled and removed"),
            ),
            (Some(_), false) => (
                Outcome::RolledBack,
                format!("{failed}; the previous unit was restored and left stopped, as it was"),
            ),
            (Some(previous), true) => {
                let progress = Progress::new(
                    format!("{} {unit} (rollback)", t.host),
                    options.progress.as_ref(),
                );
                let expect = Expect::from_unit(&parse_unit(previous));
                // A second Ctrl-C must not abort the rollback itself.
                let (_keep, never) = watch::channel(false);
                match verify(host, unit, &t.verify, &expect, &progress, &never).await {
                    Ok(v) => {
                        let load = v
                            .load_seconds
                            .map_or(String::new(), |s| format!(" (ready after {s:.1}s)"));
                        report.rollback = Some(v);
                        (Outcome::RolledBack, format!("{failed}; the previous unit was restored and passed verification{load}"))
                    }
                    Err(f) => {
                        report.rollback = Some(f.verification);
                        (
                            Outcome::RollbackFailed,
                            format!(
                                "{failed}; the restored previous unit failed too: {}: {}",
                                f.stage, f.reason
                            ),
                        )
                    }
                }
            }
        },
    }
}

/// What a run that lost its host mid-apply leaves there, and what the next apply does about it.
/// `tried`: a rollback had begun, so the previous unit may be back on disk already.
fn left_behind(unit: &str, fallback: &Fallback, tried: bool) -> String {
    let dir = state::unit_dir(unit);
    let installed = if tried {
        "the new unit is installed, or the previous one if the rollback got that far"
    } else {
        "the new unit is installed"
    };
    let next = match (&fallback.previous, &fallback.kept) {
        (None, _) => "it was new; the next apply will finish it or remove it".to_string(),
        (Some(_), Some(kept)) => {
            format!("the previous is kept as generation {kept}; the next apply will finish or roll back")
        }
        (Some(_), None) => format!(
            "the previous is kept as the newest generation in {dir}/generations; the next apply will finish or roll back"
        ),
    };
    format!("{installed}; {next}; the lock {dir}/lock stays (an apply from this machine breaks it; from elsewhere, use --break-stale-lock)")
}

/// After a failed install (nothing was restarted): puts the previous unit file back if the new one
/// got in place, and has systemd reload it. Returns whether anything had to be put back.
async fn put_back(host: &dyn Host, unit: &str, fallback: &Fallback) -> Result<bool, RemoteError> {
    let path = format!("{UNIT_DIR}/{unit}");
    if host.read_file(&path).await? == fallback.previous {
        return Ok(false);
    }
    match &fallback.previous {
        Some(previous) => host.write_file(&path, previous, "0644").await?,
        None => {
            host.run_ok(&["rm", "-f", "--", &path]).await?;
        }
    }
    host.run_ok(&["systemctl", "daemon-reload"]).await?;
    Ok(true)
}

/// Puts the previous unit back (or removes a unit that was new), restarting it when asked.
pub(super) async fn restore(
    host: &dyn Host,
    unit: &str,
    fallback: &Fallback,
    restart: bool,
) -> Result<(), RemoteError> {
    let path = format!("{UNIT_DIR}/{unit}");
    match &fallback.previous {
        Some(previous) => {
            host.write_file(&path, previous, "0644").await?;
            host.run_ok(&["systemctl", "daemon-reload"]).await?;
            let action = if restart { "restart" } else { "stop" };
            host.run_ok(&["systemctl", action, "--", unit]).await?;
        }
        None => {
            host.run(&["systemctl", "disable", "--now", "--", unit])
                .await?;
            host.run_ok(&["rm", "-f", "--", &path]).await?;
            host.run_ok(&["systemctl", "daemon-reload"]).await?;
            host.run(&["systemctl", "reset-failed", "--", unit]).await?;
        }
    }
    Ok(())
}

/// Writes the deployment record; a failure to record is a note, not a failed deployment.
async fn record(
    host: &dyn Host,
    t: &Target,
    options: &ApplyOptions,
    outcome: &str,
    v: Option<&Verification>,
    report: &mut UnitReport,
) {
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
        outcome: outcome.to_string(),
        load_seconds: v.and_then(|v| v.load_seconds),
        plateau_service_bytes: plateau.and_then(|p| p.service_bytes),
        plateau_gpu_mib: plateau.map(|p| p.gpu_mib.clone()).unwrap_or_default(),
        restored_from: options.restoring,
    };
    if let Err(e) = state::write_record(host, &record, &t.desired.text).await {
        report.notes.push(format!(
            "the deployment record could not be written: {}",
            error_chain(&e)
        ));
    }
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
