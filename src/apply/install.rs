//! Installing a unit, the steps of the apply pipeline (`pipeline`) that touch one host: keep the
//! current unit as a generation, write the new one, daemon-reload; the drain before a restart,
//! the gates after verification, the deployment record, and the failed invocation's journal.

use reconcile_core::learned::{self, LoadHistory};

use super::aside::{self, Aside};
use super::decide::{self, Ending};
use super::error::ApplyError;
use super::guard::{self, Armed};
use super::restore::{Restore, Then};
use super::{Job, Outcome, UnitReport};
use crate::observed::Observed;
use crate::plan::{Verdict, UNIT_DIR};
use crate::record::LiveRecord;
use crate::redact::{redact_text, Secret, REDACTED};
use crate::remote::{error_chain, Host, RemoteError};
use crate::state;
use crate::unit::{parse_unit, SecretsFile, UnitModel, SECRETS_DIR};
use crate::unit_files::Moved;
use crate::verify::{Expect, Verification};

/// What to go back to when the new unit fails.
pub struct Fallback {
    pub previous: Option<String>,
    pub was_running: bool,
    /// Where this run saved the previous unit among the generations, once it has.
    pub saved: Option<String>,
    /// What systemd ran besides the managed file (`reconcile_core::unit_files`): the files this run
    /// moves aside go back with the unit, and a rollback expects what all of them ran.
    pub unit_files: OtherUnitFiles,
}

/// The previous unit's other unit files, as a rollback needs them.
#[derive(Default)]
pub struct OtherUnitFiles {
    /// To move aside before the new unit goes in (`systemd.dropins: replace`).
    pub to_move: Vec<Moved>,
    /// The record they are kept in, named before the guard is armed ([`save_previous`]).
    pub aside_record: Option<String>,
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
        match (&self.unit_files.model, &self.previous) {
            (Some(model), _) => Some(Expect::from_unit(model)),
            (None, Some(text)) => Some(Expect::from_unit(&parse_unit(text))),
            (None, None) => None,
        }
    }

    /// What the host's guard restores, should this run not be there to. `replaces`: this run's
    /// write replaces another unit file; `confirming`: this run confirms a start a guard let stand.
    pub(super) fn going_back(&self, replaces: bool, confirming: bool) -> guard::GoingBack {
        guard::GoingBack {
            replaces,
            confirming,
            saved: self.saved.clone(),
            previous_sha256: self.previous.as_deref().map(state::sha256),
            beneath: self.unit_files.beneath,
            was_disabled: self.unit_files.was_disabled,
            was_running: self.was_running,
            aside: self.unit_files.aside_record.clone(),
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
            aside: self.unit_files.aside.as_ref(),
            beneath: self.unit_files.beneath,
            disable: self.unit_files.was_disabled,
            expect: self.unit_files.model.as_ref(),
        }
    }
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

/// Stands the guard down; one that cannot be reached is a note: it finds the unit healthy at
/// its deadline and keeps it, marked unconfirmed, and the next apply confirms it. Returns what
/// the guard had done already, if it acted.
pub(super) async fn disarm(
    armed: &Armed<'_>,
    report: &mut UnitReport,
) -> Option<reconcile_core::guard::GuardState> {
    match armed.disarm().await {
        Ok(Some(found)) if found.acted() => {
            report.notes.push(format!(
                "the host's guard had settled the unit already ({})",
                found.name()
            ));
            Some(found)
        }
        Ok(_) => None,
        Err(e) => {
            report.notes.push(format!(
                "the host's guard could not be disarmed ({}); it will keep the unit at its deadline, unconfirmed",
                error_chain(&e)
            ));
            None
        }
    }
}

/// The quality gate failed: the stage's reason is its report's detail (the judge's words).
#[derive(Debug, thiserror::Error)]
#[error("{detail}")]
pub(super) struct QualityFailed {
    pub detail: String,
}

/// The quality gate, when the manifest asks for one (`verify.quality`): its figures go into the
/// report; `Err` is why the stage failed, `Ok` the reference to keep once the unit converges.
pub(super) async fn quality_gate(
    job: &Job<'_>,
    v: &mut Verification,
    before: Option<&super::quality::Before>,
    report: &mut UnitReport,
) -> Result<Option<reconcile_core::quality::Reference>, QualityFailed> {
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
        Some(detail) => Err(QualityFailed { detail }),
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

/// What the write replaces, saved before anything of systemd's changes (and before the guard is
/// armed, which restores from it): the current unit as a generation, and the name of the record
/// of the files to move aside. Both noted in `fallback`.
pub(super) async fn save_previous(
    job: &Job<'_>,
    observed: &Observed,
    fallback: &mut Fallback,
) -> Result<(), RemoteError> {
    let (host, t) = (job.host, job.t);
    let unit = &t.desired.unit;
    // A temporary file left by a run cut off mid-write; we hold the lock, so it is not in use.
    host.run_ok(&[
        "rm",
        "-f",
        "--",
        &format!("{UNIT_DIR}/{unit}.reconcile-tmp"),
    ])
    .await?;
    if let Some(current) = observed
        .unit_text
        .as_deref()
        .filter(|c| *c != t.desired.text)
    {
        fallback.saved = Some(state::keep_generation(host, unit, current).await?);
    }
    if !fallback.unit_files.to_move.is_empty() {
        fallback.unit_files.aside_record = Some(aside::new_record(unit));
    }
    Ok(())
}

/// The new unit in place: the files in systemd's way moved aside (kept in the record named by
/// [`save_previous`] first), the file written, systemd reloaded, and the unit enabled where it
/// has to be.
pub(super) async fn write_unit(job: &Job<'_>, fallback: &mut Fallback) -> Result<(), RemoteError> {
    let (host, t) = (job.host, job.t);
    let unit = &t.desired.unit;
    let path = format!("{UNIT_DIR}/{unit}");
    // Out of systemd's way before the new unit goes in: each kept in a record first.
    let to_move = std::mem::take(&mut fallback.unit_files.to_move);
    if let (false, Some(record)) = (to_move.is_empty(), &fallback.unit_files.aside_record) {
        fallback.unit_files.aside = aside::move_aside(host, unit, record, to_move).await?;
    }
    // Its secrets first, in a file of their own the unit names: never a unit naming a file
    // that is not there.
    if let Some(file) = &t.desired.secrets {
        write_secrets(host, file).await?;
    }
    // A file already the desired one (a run after a dead one that wrote it) is not written
    // again: its mtime tells the guard which starts ran it (the model found a rewrite after a
    // reboot's start make that start look older than the file).
    if fallback.previous.as_deref() != Some(t.desired.text.as_str()) {
        host.write_file(&path, &t.desired.text, "0644").await?;
    }
    host.run_ok(&["systemctl", "daemon-reload"]).await?;
    if fallback.unit_files.was_disabled
        || fallback.unit_files.aside.is_some()
        || fallback.unit_files.beneath
    {
        // Installed but disabled, or the unit systemd ran came from elsewhere: the managed unit
        // is to start at boot too.
        host.run_ok(&["systemctl", "enable", "--", unit]).await?;
    }
    Ok(())
}

/// A unit's secrets file, root's alone in a folder root's alone (every folder of the state path
/// 0700, whatever made it before). Named by what it holds, a file already there holds the same.
async fn write_secrets(host: &dyn Host, file: &SecretsFile) -> Result<(), RemoteError> {
    state::private_dir(host, SECRETS_DIR).await?;
    host.write_file(&file.path, &file.text(), "0600").await
}

/// Writes the deployment record; a failure to record is a note, not a failed deployment. `live`:
/// what the running server was told instead of a restart, when it was (`status` reads it back).
pub(super) async fn record(
    job: &Job<'_>,
    outcome: Outcome,
    v: Option<&Verification>,
    live: Option<LiveRecord>,
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
        restored_from: options.restoring.and_then(super::Restoring::deployment),
        benchmark: report.benchmark.as_ref().and_then(|b| b.record()),
        quality: report.quality.as_ref().map(|q| q.figures()),
        live,
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
        .secret_values_of(&job.t.desired)
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
                .unit_files
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

/// The last lines the failed invocation logged, and systemd's lines about it: the lines journald
/// tagged with the invocation, and every line of their stdout streams
/// (`reconcile_core::journal`), which holds those journald took in after their process died.
async fn journal(host: &dyn Host, invocation: &str) -> Option<String> {
    if invocation.is_empty() {
        return None;
    }
    // journald reads a service's stdout stream on its own time: a crash's last lines may still
    // sit in the stream's socket when systemd has already logged the exit. `--sync` is handled
    // after the stream reads already pending (journald handles its sync request from an event
    // source of lower priority than theirs; systemd 258 also counts the queued bytes), so those
    // lines are in the journal when it returns. Only root may ask; elsewhere it fails harmlessly.
    let _ = host.run(&["journalctl", "--sync"]).await;
    let process = format!("_SYSTEMD_INVOCATION_ID={invocation}");
    let manager = format!("INVOCATION_ID={invocation}");
    let tagged = read_entries(host, &[&process, "+", &manager]).await?;
    // The streams the invocation's processes wrote to: one per started process.
    let mut streams: Vec<String> = tagged.iter().filter_map(|e| e.stream.clone()).collect();
    streams.sort();
    streams.dedup();
    let entries = if streams.is_empty() {
        tagged
    } else {
        let by_stream: Vec<String> = streams.iter().map(|s| format!("_STREAM_ID={s}")).collect();
        let mut matches: Vec<&str> = vec![&process, "+", &manager];
        for m in &by_stream {
            matches.extend(["+", m.as_str()]);
        }
        read_entries(host, &matches).await.unwrap_or(tagged)
    };
    Some(reconcile_core::journal::of_invocation(
        &entries,
        invocation,
        JOURNAL_LINES,
    ))
}

/// The lines a failed invocation's journal report shows: its last ones.
const JOURNAL_LINES: usize = 50;

/// The last entries of the journal that `matches` selects (journalctl's match words, `+` between
/// alternatives), with the fields that place them.
async fn read_entries(
    host: &dyn Host,
    matches: &[&str],
) -> Option<Vec<reconcile_core::journal::Entry>> {
    let lines = JOURNAL_LINES.to_string();
    let mut argv: Vec<&str> = vec!["journalctl"];
    argv.extend_from_slice(matches);
    argv.extend([
        "-n",
        &lines,
        "--no-pager",
        "--all",
        "-o",
        "json",
        "--output-fields=MESSAGE,_STREAM_ID,INVOCATION_ID,_SYSTEMD_INVOCATION_ID",
    ]);
    let out = host.run(&argv).await.ok()?;
    (out.status == 0).then(|| reconcile_core::journal::parse(&out.stdout))
}
