//! `reconcile status`: what each host really runs, against the manifest, the unit on disk and the
//! last deployment record.
//!
//! A plan compares two things (manifest and unit file). Drift hides between the others: a unit
//! edited by hand after the last apply, a file written without `daemon-reload`, a reload without
//! the restart that would make the server run the new command line, a server that is down. Each
//! unit is therefore classified from four sources: the manifest, the file on disk, the record of
//! the last apply, and the running process (systemd's view and `/proc/<pid>/cmdline`).
//!
//! The classification is pure (this file); `gather` reads the facts over the host's one
//! connection; the face's `report::status` prints them.

mod gather;

use std::collections::BTreeMap;

use serde::Serialize;

pub use crate::observed::split_nul;
pub use gather::{status_host, status_targets, WeightsCheck};

use crate::apply::Outcome;
use crate::flags::flags;
use crate::record::argv_sha256;
use crate::redact::Redactor;
use crate::remote::http::GetError;
use crate::sglang::Catalog;
use crate::state::{sha256, Record};
use crate::unit::parse_unit;
use crate::unit_files::{Drift, UnitFiles};
use reconcile_core::guard::{GuardState, Settled};
use reconcile_core::live::held::{self, as_run, Held, HeldError, NotLive};
use reconcile_core::live::LiveChange;

/// One way a unit can stand. A unit has one or more; `InSync` only alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Class {
    /// Manifest, last deployment, unit on disk and running process all agree.
    InSync,
    /// The manifest renders a unit other than the last one applied (an apply would change it).
    PendingChange,
    /// The unit on disk is not the one the last apply installed.
    EditedOnHost,
    /// systemd has not loaded the unit file on disk (`NeedDaemonReload=yes`).
    NotReloaded,
    /// The server runs a command line or environment other than the unit on disk's.
    NotRestarted,
    /// A drop-in no manifest owns changes what the unit runs (`systemctl edit`).
    DropinOverride,
    /// The unit is masked (linked to `/dev/null`).
    Masked,
    /// systemd loads the unit from another file than the managed one (`/run`, a vendor unit).
    Shadowed,
    /// Installed but not enabled: it will not start after a reboot.
    Disabled,
    /// The service is not active.
    Down,
    /// The host's guard kept this unit (its apply died, the server was healthy at the guard's
    /// deadline); no apply has confirmed it yet. The next apply verifies it without a restart.
    Unconfirmed,
    /// The host's guard rolled back the change the manifest still asks for (its apply died and
    /// the new unit failed); the next apply tries it again.
    RolledBackByGuard,
    /// A unit file reconcile has no deployment record of.
    Unmanaged,
    /// The unit's deployment record exists but cannot be read or parsed (or a newer reconcile
    /// wrote it): what was last applied is unknown.
    RecordUnreadable,
    /// No unit file on the host.
    Absent,
    /// The pinned weights the unit runs (`sglang.model:`) are not as the lock file says: a
    /// file missing or of another size (every status), or another sha256 (`--verify-weights`).
    /// The next restart (a crash, a reboot) would load them.
    WeightsDrift,
}

impl Class {
    pub fn name(self) -> &'static str {
        match self {
            Class::InSync => "in_sync",
            Class::PendingChange => "pending_change",
            Class::EditedOnHost => "edited_on_host",
            Class::NotReloaded => "not_reloaded",
            Class::NotRestarted => "not_restarted",
            Class::DropinOverride => "dropin_override",
            Class::Masked => "masked",
            Class::Shadowed => "shadowed",
            Class::Disabled => "disabled",
            Class::Down => "down",
            Class::Unconfirmed => "unconfirmed",
            Class::RolledBackByGuard => "rolled_back_by_guard",
            Class::Unmanaged => "unmanaged",
            Class::RecordUnreadable => "record_unreadable",
            Class::Absent => "absent",
            Class::WeightsDrift => "weights_drift",
        }
    }
}

/// systemd's view of the unit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Systemd {
    pub load_state: String,
    pub active_state: String,
    pub sub_state: String,
    pub need_daemon_reload: bool,
    pub main_pid: u32,
    /// `ExecMainStartTimestamp`, as systemd prints it; empty when it never started.
    pub started_at: String,
}

/// The main process as the kernel sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Running {
    /// `/proc/<pid>/cmdline`, split on NUL.
    pub argv: Vec<String>,
    /// `/proc/<pid>/environ`.
    pub env: BTreeMap<String, String>,
}

/// Everything known about one unit on one host, as read.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// `<service>.service`.
    pub unit: String,
    /// What systemd runs besides the unit file: drop-ins, a mask, a unit file elsewhere.
    pub unit_files: UnitFiles,
    /// The unit the manifest renders.
    pub desired_text: String,
    /// The unit file on the host.
    pub disk_text: Option<String>,
    /// The last deployment record (`current.json`).
    pub record: Option<Record>,
    /// Why the record could not be used, when it exists but cannot be read or parsed (`record`
    /// is then `None`).
    pub record_error: Option<String>,
    /// The host's guard's record (`guard.json`), when it has one that reads.
    pub guard: Option<Settled>,
    pub systemd: Systemd,
    /// The main process, when there is one and it could be read.
    pub running: Option<Running>,
    /// The manifest's SGLang version: its catalog reads the flags of a command line that a live
    /// apply left running.
    pub sglang_version: String,
    /// What the server said it holds of what live applies told it: asked only when one explains
    /// why it runs another command line than the unit's ([`live_standing`]).
    pub held: Option<Result<Held, AskError>>,
}

/// Why the server could not say what it holds.
#[derive(Debug, Clone, thiserror::Error)]
pub enum AskError {
    /// No forward to the server's port (shared: `Facts` are cloned).
    #[error("it could not be reached: {}", crate::remote::error_chain(.0))]
    Unreachable(#[source] std::sync::Arc<crate::remote::RemoteError>),
    #[error("it did not answer within {}s", .0.as_secs())]
    TimedOut(std::time::Duration),
    #[error(transparent)]
    Get(#[from] GetError),
    #[error(transparent)]
    Answer(#[from] HeldError),
}

/// How a live apply stands to a server that runs another command line than its unit on disk.
#[derive(Debug, Clone, PartialEq)]
pub enum LiveStanding {
    /// No live apply explains it: none of the unit on disk is recorded, or something besides the
    /// command line differs (the environment, a drop-in), which no live change applies.
    Unexplained,
    /// The unit on disk was applied live, to another process than the one running now.
    Restarted,
    /// The unit on disk was applied live to this very process, which must hold this (from its
    /// own command line to the unit's, every live apply since it started) to serve as a restart
    /// with the unit would.
    Holds(LiveChange),
    /// Applied live to this process, yet its command line differs from the unit's in more than a
    /// live change applies.
    Beyond(NotLive),
}

/// Whether a live apply explains why the server runs another command line than the unit on disk:
/// the last deployment record says the unit on disk was applied live, to the process that runs
/// now (its argv's digest), and only the command line differs. `Unexplained` too when nothing
/// differs at all.
pub(crate) fn live_standing(f: &Facts) -> LiveStanding {
    let (Some(disk), Some(running), Some(record)) = (&f.disk_text, &f.running, &f.record) else {
        return LiveStanding::Unexplained;
    };
    let Some(told) = &record.live else {
        return LiveStanding::Unexplained;
    };
    let other_unit_files = f
        .unit_files
        .drifts(&f.unit, Some(disk))
        .iter()
        .any(|d| *d != Drift::Disabled);
    if record.unit_sha256 != sha256(disk) || f.systemd.active_state != "active" || other_unit_files
    {
        return LiveStanding::Unexplained;
    }
    let unit = parse_unit(disk);
    if !env_differences(&running.env, &unit.env).is_empty() {
        return LiveStanding::Unexplained;
    }
    let argv = as_run(&running.argv, &unit.exec_start);
    if argv == unit.exec_start.as_slice() {
        return LiveStanding::Unexplained;
    }
    if argv_sha256(&running.argv) != told.argv_sha256 {
        return LiveStanding::Restarted;
    }
    let parser = Catalog::for_version(&f.sglang_version);
    match held::must_hold(argv, &unit, parser, &f.sglang_version) {
        Ok(change) => LiveStanding::Holds(change),
        Err(e) => LiveStanding::Beyond(e),
    }
}

/// The classes of a unit, and a line per finding saying why.
/// `redactor` hides the secret values of the running server's argv.
pub fn classify(f: &Facts, redactor: &Redactor) -> (Vec<Class>, Vec<String>) {
    let mut found = Found::default();
    let desired_sha = sha256(&f.desired_text);
    let disk_sha = f.disk_text.as_deref().map(sha256);
    let applied = f.record.as_ref().map(|r| r.unit_sha256.as_str());
    if let Some(e) = &f.record_error {
        // Compared below as if there were no record, except that the unit is not called unmanaged.
        found.add(Class::RecordUnreadable, e.clone());
    }
    against_manifest(&mut found, &desired_sha, applied, disk_sha.as_deref());
    // Before the file's own checks: a unit that systemd loads from /run, or masks, may have no
    // managed file at all.
    let other_unit_files = against_unit_files(&mut found, f);
    let Some(disk_text) = &f.disk_text else {
        found.classes.push(Class::Absent);
        if applied.is_some() {
            found
                .details
                .push("the unit file was removed after the last apply".into());
        }
        return found.sorted();
    };
    let disk_sha = disk_sha.unwrap_or_default();
    match f.guard.as_ref().filter(|g| g.unconfirmed(&disk_sha)) {
        // Not a hand edit: the unit a dead apply installed, let stand by the guard.
        Some(kept) => found.add(Class::Unconfirmed, kept.summary().unwrap_or_default()),
        None => against_record(&mut found, applied, &disk_sha, f.record_error.is_some()),
    }
    if let Some(g) = f.guard.as_ref().filter(|g| {
        matches!(g.state, GuardState::RolledBack | GuardState::RollbackFailed)
            && g.new_sha256 == desired_sha
    }) {
        found.add(Class::RolledBackByGuard, g.summary().unwrap_or_default());
    }
    // What systemd would start now: the file with its drop-ins, or the file that shadows it.
    let effective = if other_unit_files {
        f.unit_files.effective_model(&f.unit, Some(disk_text))
    } else {
        None
    };
    against_process(&mut found, f, disk_text, effective.as_ref(), redactor);
    if found.classes.is_empty() {
        found.classes.push(Class::InSync);
    }
    found.sorted()
}

/// The classes found so far, and their details.
#[derive(Default)]
struct Found {
    classes: Vec<Class>,
    details: Vec<String>,
}

impl Found {
    fn add(&mut self, class: Class, detail: String) {
        self.classes.push(class);
        self.details.push(detail);
    }

    fn sorted(mut self) -> (Vec<Class>, Vec<String>) {
        self.classes.sort();
        (self.classes, self.details)
    }
}

/// What the manifest is compared with: the last applied unit, or the file when none was applied.
fn against_manifest(
    found: &mut Found,
    desired_sha: &str,
    applied: Option<&str>,
    disk_sha: Option<&str>,
) {
    match (applied, disk_sha) {
        (Some(applied), _) if applied != desired_sha => found.add(
            Class::PendingChange,
            format!(
                "the manifest renders a unit ({}) other than the one last applied ({})",
                short(desired_sha),
                short(applied)
            ),
        ),
        (None, Some(disk)) if disk != desired_sha => found.add(
            Class::PendingChange,
            format!(
                "the manifest renders a unit ({}) other than the one on the host ({})",
                short(desired_sha),
                short(disk)
            ),
        ),
        (None, None) => found.add(
            Class::PendingChange,
            "not installed: an apply would install it".into(),
        ),
        _ => {}
    }
}

/// The unit on disk against the last deployment record (none, when it is unreadable).
fn against_record(found: &mut Found, applied: Option<&str>, disk_sha: &str, unreadable: bool) {
    match applied {
        None if unreadable => {}
        None => found.add(
            Class::Unmanaged,
            "no deployment record: reconcile never applied this unit here".into(),
        ),
        Some(applied) if applied != disk_sha => found.add(
            Class::EditedOnHost,
            format!(
                "the unit on disk ({}) is not the one last applied ({})",
                short(disk_sha),
                short(applied)
            ),
        ),
        Some(_) => {}
    }
}

/// What systemd runs besides the unit file, each named for what it is: a restart starts the
/// drop-in's or the shadowing file's command line again, so none of these is `not_restarted`.
/// Returns whether any changes what runs (the process is then compared with all of it).
fn against_unit_files(found: &mut Found, f: &Facts) -> bool {
    let drift = f.unit_files.drifts(&f.unit, f.disk_text.as_deref());
    for d in &drift {
        let class = match d {
            Drift::DropinOverride { .. } => Class::DropinOverride,
            Drift::Masked { .. } => Class::Masked,
            Drift::Shadowed { .. } => Class::Shadowed,
            Drift::Disabled => Class::Disabled,
        };
        let fix = match d {
            Drift::Disabled => "a restart would not fix it; an apply enables it".to_string(),
            _ => format!(
                "a restart would not fix it ({}); an apply refuses it unless the manifest says `systemd.dropins: replace`",
                if matches!(d, Drift::Masked { .. }) {
                    "a masked unit does not start"
                } else {
                    "it starts what systemd has in force again"
                }
            ),
        };
        debug_assert!(!d.restart_fixes());
        found.add(class, format!("{}; {fix}", d.describe(&f.unit)));
    }
    drift.iter().any(|d| *d != Drift::Disabled)
}

/// systemd's view and the running process against the unit on disk (with its other unit files, when
/// `effective` has them).
fn against_process(
    found: &mut Found,
    f: &Facts,
    disk_text: &str,
    effective: Option<&crate::unit::UnitModel>,
    redactor: &Redactor,
) {
    let s = &f.systemd;
    if s.need_daemon_reload {
        found.add(
            Class::NotReloaded,
            "systemd has not loaded the unit file on disk (daemon-reload pending)".into(),
        );
    }
    if s.active_state != "active" {
        let state = if s.active_state.is_empty() {
            "unknown".to_string()
        } else {
            format!("{} ({})", s.active_state, s.sub_state)
        };
        found.add(Class::Down, format!("the service is {state}"));
    } else if let Some(running) = &f.running {
        let unit = effective.cloned().unwrap_or_else(|| parse_unit(disk_text));
        let mut differences = argv_differences(&running.argv, &unit.exec_start, redactor);
        differences.extend(env_differences(&running.env, &unit.env));
        if !differences.is_empty() {
            // What systemd runs besides the file is never applied live.
            let live = match effective {
                None => live_standing(f),
                Some(_) => LiveStanding::Unexplained,
            };
            against_live(found, f, live, &differences.join(", "));
        }
    }
}

/// A server that runs another command line than its unit, judged by what live applies told it:
/// in sync when it was applied live to this process and the server holds what it was told.
fn against_live(found: &mut Found, f: &Facts, live: LiveStanding, differences: &str) {
    let pid = f.systemd.main_pid;
    let restart = "a restart would start what the unit has";
    let detail = match live {
        LiveStanding::Unexplained => format!(
            "the running server (pid {pid}) was started from another unit than the one systemd has now: {differences}; {restart}"
        ),
        LiveStanding::Restarted => format!(
            "the server restarted since the live apply: pid {pid} is not the process it told, and runs another command line than the unit's: {differences}; {restart}"
        ),
        LiveStanding::Beyond(why) => format!(
            "the running server (pid {pid}) was started from another unit than the one systemd has now: {differences}; the live apply of the unit does not explain it ({why}); {restart}"
        ),
        LiveStanding::Holds(change) => match &f.held {
            None => format!(
                "the unit was applied live to the running server (pid {pid}), which was not asked what it holds: it runs {differences}; {restart}"
            ),
            Some(Err(e)) => format!(
                "the unit was applied live to the running server (pid {pid}), which could not say what it holds ({e}): it runs {differences}; {restart}"
            ),
            Some(Ok(server)) => {
                let wrong = held::differences(&change, server);
                if wrong.is_empty() {
                    found.details.push(format!(
                        "applied live: {}; the server (pid {pid}) runs its earlier command line ({differences}), which a restart replaces with the unit's",
                        held::summary(&change)
                    ));
                    return;
                }
                format!(
                    "the server (pid {pid}) does not hold what the live apply told it: {}; {restart}",
                    wrong.join("; ")
                )
            }
        },
    };
    found.add(Class::NotRestarted, detail);
}

/// How the running argv differs from the unit's, in flags where it can (`~ tp-size 2 -> 4`).
/// systemd executes the unit's argv as it is, so any difference at all means another unit started
/// the process. Secret values are never shown.
fn argv_differences(running: &[String], unit: &[String], redactor: &Redactor) -> Vec<String> {
    let running = as_run(running, unit);
    if running == unit {
        return Vec::new();
    }
    let (run_cmd, run_flags) = flags(running);
    let (unit_cmd, unit_flags) = flags(unit);
    let shown = |name: &str, v: &str| {
        if redactor.is_secret(name) {
            "<redacted>".to_string()
        } else if v.is_empty() {
            "(on)".to_string()
        } else {
            v.to_string()
        }
    };
    let mut out = Vec::new();
    if run_cmd != unit_cmd {
        out.push(format!(
            "command `{}` -> `{}`",
            run_cmd.join(" "),
            unit_cmd.join(" ")
        ));
    }
    let names: std::collections::BTreeSet<&String> =
        run_flags.keys().chain(unit_flags.keys()).collect();
    for name in names {
        match (run_flags.get(name), unit_flags.get(name)) {
            (Some(a), Some(b)) if a != b => {
                out.push(format!("~ {name} {} -> {}", shown(name, a), shown(name, b)))
            }
            (Some(a), None) => out.push(format!("- {name} {}", shown(name, a))),
            (None, Some(b)) => out.push(format!("+ {name} {}", shown(name, b))),
            _ => {}
        }
    }
    if out.is_empty() {
        out.push("the same flags in another order or form".into());
    }
    out
}

/// The unit's environment variables the process does not have with the same value. Only the
/// unit's own variables are compared: systemd adds others (`INVOCATION_ID`, `PATH`, ...). Names
/// only, since values may be secrets.
fn env_differences(
    running: &BTreeMap<String, String>,
    unit: &BTreeMap<String, String>,
) -> Vec<String> {
    unit.iter()
        .filter(|(k, v)| running.get(*k) != Some(*v))
        .map(|(k, _)| format!("env {k} differs"))
        .collect()
}

/// The first 12 hex digits of a sha256, as shown. Records come from hosts: any text may be there.
fn short(sha: &str) -> &str {
    crate::digest::short(sha, crate::digest::SHA_SHOWN)
}

/// One unit's status, as shown.
#[derive(Debug, Clone, Default, Serialize)]
pub struct UnitStatus {
    pub host: String,
    pub unit: String,
    pub source: String,
    pub classes: Vec<Class>,
    pub details: Vec<String>,
    /// From the last deployment record.
    pub git_commit: Option<String>,
    pub applied_at: Option<String>,
    pub applied_by: Option<String>,
    pub systemd: Systemd,
    /// What `/v1/models` lists, when the server is active and answered.
    pub served_models: Option<Vec<String>>,
    /// Set when the host or unit could not be read; `classes` is then empty.
    pub error: Option<String>,
    /// The last deployment record, whole: its figures are the metrics' (`metrics`), its manifest
    /// digest what a server group's ranks share.
    #[serde(skip)]
    pub record: Option<Record>,
}

/// The Prometheus text of `statuses` (`reconcile_core::metrics`). `outcomes` are what this
/// process just did to units, `(host, unit, outcome)` (an agent's round): they stand for the
/// recorded outcome, which only says how the last deployment that succeeded went.
pub fn metrics(statuses: &[UnitStatus], outcomes: &[(String, String, Outcome)]) -> String {
    let units: Vec<reconcile_core::metrics::UnitMetrics> = statuses
        .iter()
        .map(|s| {
            let record = s.record.as_ref().filter(|_| s.error.is_none());
            let just = outcomes
                .iter()
                .find(|(host, unit, _)| *host == s.host && *unit == s.unit)
                .map(|(_, _, outcome)| *outcome);
            reconcile_core::metrics::UnitMetrics {
                service: s
                    .unit
                    .strip_suffix(".service")
                    .unwrap_or(&s.unit)
                    .to_string(),
                unit: s.unit.clone(),
                host: s.host.clone(),
                in_sync: s.error.is_none().then(|| s.in_sync()),
                last_apply_unix: record.and_then(|r| unix_seconds(&r.applied_at)),
                // A record's outcome is text on the host; one that names no outcome (no
                // reconcile writes such) has no state set.
                outcome: just.or_else(|| record.and_then(|r| Outcome::from_name(&r.outcome))),
                verification_seconds: record.and_then(|r| r.load_seconds),
                benchmark: record
                    .and_then(|r| r.benchmark.as_ref())
                    .map(|b| {
                        b.levels
                            .iter()
                            .map(|l| (l.concurrency, l.output_tokens_per_s))
                            .collect()
                    })
                    .unwrap_or_default(),
            }
        })
        .collect();
    reconcile_core::metrics::render(&units)
}

/// An RFC 3339 time (a record's `applied_at`) in seconds since the Unix epoch.
fn unix_seconds(at: &str) -> Option<f64> {
    let t = humantime::parse_rfc3339_weak(at).ok()?;
    Some(t.duration_since(std::time::UNIX_EPOCH).ok()?.as_secs_f64())
}

impl UnitStatus {
    pub fn in_sync(&self) -> bool {
        self.error.is_none() && self.classes == [Class::InSync]
    }
}

/// Exit status of `status`: 1 when something could not be read (a host, a unit, or a unit's
/// deployment record), 2 when any unit is not in sync.
pub fn exit_code(statuses: &[UnitStatus]) -> u8 {
    let unreadable =
        |s: &UnitStatus| s.error.is_some() || s.classes.contains(&Class::RecordUnreadable);
    if statuses.iter().any(unreadable) {
        1
    } else if statuses.iter().all(UnitStatus::in_sync) {
        0
    } else {
        2
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UNIT: &str = "[Unit]\nDescription=t\n\n[Service]\nEnvironment=\"CUDA_VISIBLE_DEVICES=0,1\"\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /m --tp-size 2 --port 30000\n";

    fn record(text: &str) -> Record {
        Record {
            unit: "s.service".into(),
            manifest: "manifests/s.yaml".into(),
            manifest_sha256: "m".into(),
            unit_sha256: sha256(text),
            git_commit: Some("0123456789abcdef".into()),
            applied_at: "2026-01-01T00:00:00Z".into(),
            applied_by: "me".into(),
            outcome: "converged".into(),
            load_seconds: Some(1.0),
            ..Default::default()
        }
    }

    fn running(text: &str) -> Running {
        let unit = parse_unit(text);
        let mut env: BTreeMap<String, String> = unit.env.clone();
        env.insert("INVOCATION_ID".into(), "abc".into());
        Running {
            argv: unit.exec_start,
            env,
        }
    }

    /// Everything agrees: applied, on disk, loaded and running.
    fn synced() -> Facts {
        Facts {
            unit: "s.service".into(),
            unit_files: UnitFiles {
                fragment: "/etc/systemd/system/s.service".into(),
                load_state: "loaded".into(),
                unit_file_state: "enabled".into(),
                ..UnitFiles::default()
            },
            desired_text: UNIT.into(),
            disk_text: Some(UNIT.into()),
            record: Some(record(UNIT)),
            record_error: None,
            guard: None,
            systemd: Systemd {
                load_state: "loaded".into(),
                active_state: "active".into(),
                sub_state: "running".into(),
                need_daemon_reload: false,
                main_pid: 42,
                started_at: "Thu 2026-01-01 00:00:01 UTC".into(),
            },
            running: Some(running(UNIT)),
            sglang_version: "0.5.23".into(),
            held: None,
        }
    }

    fn classes(f: &Facts) -> Vec<Class> {
        classify(f, &Redactor::default()).0
    }

    #[test]
    fn a_console_script_runs_under_its_interpreter_which_is_no_difference() {
        let unit = UNIT.replace(
            "/usr/bin/python3 -m sglang.launch_server",
            "/venv/bin/sglang serve",
        );
        let mut f = synced();
        f.desired_text = unit.clone();
        f.disk_text = Some(unit.clone());
        f.record = Some(record(&unit));
        let mut proc = running(&unit);
        proc.argv.insert(0, "/venv/bin/python3".into());
        f.running = Some(proc);
        assert_eq!(classes(&f), [Class::InSync]);
        // Another script, or the same one under `-m`, is still a difference.
        let mut other = running(&unit);
        other.argv[0] = "/venv/bin/other".into();
        f.running = Some(other);
        assert!(
            classes(&f).contains(&Class::NotRestarted),
            "{:?}",
            classes(&f)
        );
    }

    #[test]
    fn a_drop_in_that_changes_the_command_is_an_override_not_a_missing_restart() {
        let mut f = synced();
        let (argv, flag) = (running(UNIT).argv, "--tp-size");
        let edited: Vec<String> = argv
            .iter()
            .map(|a| if a == "2" { "1".to_string() } else { a.clone() })
            .collect();
        assert!(argv.iter().any(|a| a == flag) && edited != argv, "{argv:?}");
        f.unit_files.drop_ins.push(crate::unit_files::DropIn {
            path: "/etc/systemd/system/s.service.d/override.conf".into(),
            text: format!("[Service]\nExecStart=\nExecStart={}\n", edited.join(" ")),
        });
        // The server runs the drop-in's command line: what a restart would start again.
        f.running.as_mut().unwrap().argv = edited;
        let (c, details) = classify(&f, &Redactor::default());
        assert_eq!(c, [Class::DropinOverride], "{details:?}");
        assert!(
            details[0].contains("override.conf")
                && details[0].contains("a restart would not fix it")
        );

        // Running the unit file's command instead: now a restart would change what runs.
        f.running = Some(running(UNIT));
        assert_eq!(classes(&f), [Class::NotRestarted, Class::DropinOverride]);

        let mut d = synced();
        d.unit_files.unit_file_state = "disabled".into();
        assert_eq!(classes(&d), [Class::Disabled]);
        let mut m = synced();
        m.unit_files.load_state = "masked".into();
        assert!(classes(&m).contains(&Class::Masked));
        let mut s = synced();
        s.unit_files.fragment = "/run/systemd/system/s.service".into();
        s.unit_files.fragment_text = Some(UNIT.into());
        assert_eq!(classes(&s), [Class::Shadowed]);
    }

    fn guard(state: &str, new: &str) -> Settled {
        Settled::parse(&format!(
            r#"{{"state":"{state}","new_sha256":"{}","detail":"why","settled_at":"t1","armed_by":"ci@box pid 7","armed_at":"t0"}}"#,
            sha256(new)
        ))
        .unwrap()
    }

    #[test]
    fn what_the_hosts_guard_did_is_said_and_not_taken_for_a_hand_edit() {
        // A dead apply installed `new`; the guard found it healthy and kept it.
        let mut f = synced();
        let new = UNIT.replace("--port 30000", "--port 30000 --mem-fraction-static 0.8");
        f.desired_text = new.clone();
        f.disk_text = Some(new.clone());
        f.running = Some(running(&new));
        f.guard = Some(guard("unconfirmed", &new));
        // Pending too: the next apply has its confirmation to do.
        let (classes, details) = classify(&f, &Redactor::default());
        assert_eq!(
            classes,
            [Class::PendingChange, Class::Unconfirmed],
            "{details:?}"
        );
        assert!(
            details[1].starts_with("the host's guard kept the new unit, unconfirmed at t1"),
            "{details:?}"
        );
        // Without the guard's record, the same unit is an edit on the host.
        f.guard = None;
        assert_eq!(
            classify(&f, &Redactor::default()).0,
            [Class::PendingChange, Class::EditedOnHost]
        );

        // The guard rolled `new` back: the previous unit runs, the manifest still asks for new.
        let mut f = synced();
        f.desired_text = new.clone();
        f.guard = Some(guard("rolled_back", &new));
        let (classes, details) = classify(&f, &Redactor::default());
        assert_eq!(
            classes,
            [Class::PendingChange, Class::RolledBackByGuard],
            "{details:?}"
        );
        assert!(
            details[1].starts_with("the host's guard rolled back to the previous unit at t1"),
            "{details:?}"
        );
        // Once the manifest moved on, that rollback is history, not status.
        f.desired_text = UNIT.into();
        assert_eq!(classify(&f, &Redactor::default()).0, [Class::InSync]);
    }

    #[test]
    fn everything_agreeing_is_in_sync() {
        assert_eq!(classes(&synced()), [Class::InSync]);
    }

    #[test]
    fn a_manifest_change_not_yet_applied_is_pending() {
        let f = Facts {
            desired_text: UNIT.replace("--tp-size 2", "--tp-size 4"),
            ..synced()
        };
        assert_eq!(classes(&f), [Class::PendingChange]);
    }

    #[test]
    fn a_hand_edit_of_the_command_is_edited_not_reloaded_and_not_restarted() {
        let edited = UNIT.replace("--tp-size 2", "--tp-size 4");
        let mut f = Facts {
            disk_text: Some(edited.clone()),
            ..synced()
        };
        f.systemd.need_daemon_reload = true;
        let (c, details) = classify(&f, &Redactor::default());
        assert_eq!(
            c,
            [Class::EditedOnHost, Class::NotReloaded, Class::NotRestarted]
        );
        assert!(
            details.iter().any(|d| d.contains("~ tp-size 2 -> 4")),
            "{details:?}"
        );
        // Reloaded, still the old process.
        f.systemd.need_daemon_reload = false;
        assert_eq!(classes(&f), [Class::EditedOnHost, Class::NotRestarted]);
        // Restarted: the process runs the edited unit, which is still not the applied one.
        f.running = Some(running(&edited));
        assert_eq!(classes(&f), [Class::EditedOnHost]);
    }

    #[test]
    fn an_env_change_not_restarted_names_the_variable_not_its_value() {
        let f = Facts {
            running: Some(Running {
                env: BTreeMap::from([("CUDA_VISIBLE_DEVICES".into(), "4,5".into())]),
                ..running(UNIT)
            }),
            ..synced()
        };
        let (c, details) = classify(&f, &Redactor::default());
        assert_eq!(c, [Class::NotRestarted]);
        assert!(details[0].contains("env CUDA_VISIBLE_DEVICES differs"));
        assert!(!details[0].contains("4,5"));
    }

    #[test]
    fn secret_flags_are_not_shown() {
        let with = |key: &str| UNIT.replace("--port", &format!("--api-key {key} --port"));
        let f = Facts {
            running: Some(running(&with("old-secret-value"))),
            disk_text: Some(with("new-secret-value")),
            record: Some(record(&with("new-secret-value"))),
            desired_text: with("new-secret-value"),
            ..synced()
        };
        let (c, details) = classify(&f, &Redactor::default());
        assert_eq!(c, [Class::NotRestarted]);
        assert!(details[0].contains("~ api-key <redacted> -> <redacted>"));
        assert!(!details.join(" ").contains("secret-value"));
    }

    #[test]
    fn a_stopped_service_is_down_and_its_process_is_not_judged() {
        let mut f = synced();
        f.systemd.active_state = "inactive".into();
        f.systemd.sub_state = "dead".into();
        f.running = None;
        let (c, details) = classify(&f, &Redactor::default());
        assert_eq!(c, [Class::Down]);
        assert_eq!(details, ["the service is inactive (dead)"]);
    }

    #[test]
    fn a_unit_without_a_record_is_unmanaged_and_pending_only_when_it_differs() {
        let f = Facts {
            record: None,
            ..synced()
        };
        assert_eq!(classes(&f), [Class::Unmanaged]);
        let f = Facts {
            record: None,
            desired_text: UNIT.replace("Description=t", "Description=u"),
            ..synced()
        };
        assert_eq!(classes(&f), [Class::PendingChange, Class::Unmanaged]);
    }

    #[test]
    fn no_unit_file_is_absent_and_pending() {
        let f = Facts {
            disk_text: None,
            record: None,
            systemd: Systemd::default(),
            running: None,
            ..synced()
        };
        assert_eq!(classes(&f), [Class::PendingChange, Class::Absent]);
        // Removed by hand after an apply of what the manifest still says.
        let f = Facts {
            disk_text: None,
            systemd: Systemd::default(),
            running: None,
            ..synced()
        };
        let (c, details) = classify(&f, &Redactor::default());
        assert_eq!(c, [Class::Absent]);
        assert!(details[0].contains("removed after the last apply"));
    }

    #[test]
    fn the_same_flags_in_another_order_still_count_as_another_command_line() {
        let f = Facts {
            running: Some(Running {
                argv: parse_unit(
                    &UNIT.replace("--tp-size 2 --port 30000", "--port 30000 --tp-size 2"),
                )
                .exec_start,
                ..running(UNIT)
            }),
            ..synced()
        };
        let (c, details) = classify(&f, &Redactor::default());
        assert_eq!(c, [Class::NotRestarted]);
        assert!(details[0].contains("another order"), "{details:?}");
    }

    /// A unit applied live: the server was started from `OLD` (checkpoint /m, micro-batch size
    /// 4), told checkpoint /n and size 8, and the unit on disk says so.
    const OLD: &str = "[Unit]\nDescription=t\n\n[Service]\nEnvironment=\"CUDA_VISIBLE_DEVICES=0,1\"\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /m --tp-size 2 --port 30000 --pp-max-micro-batch-size 4\n";
    const NEW: &str = "[Unit]\nDescription=t\n\n[Service]\nEnvironment=\"CUDA_VISIBLE_DEVICES=0,1\"\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /n --tp-size 2 --port 30000 --pp-max-micro-batch-size 8\n";

    fn applied_live() -> Facts {
        let told = running(OLD);
        let mut r = record(NEW);
        r.live = Some(crate::record::LiveRecord {
            argv_sha256: argv_sha256(&told.argv),
            weights: Some("/n".into()),
            values: [("pp-max-micro-batch-size".to_string(), 8.into())].into(),
        });
        Facts {
            desired_text: NEW.into(),
            disk_text: Some(NEW.into()),
            record: Some(r),
            running: Some(told),
            ..synced()
        }
    }

    /// What the server says it holds: its checkpoint, and one data-parallel rank's size.
    fn holding(model: &str, size: u32) -> Option<Result<Held, AskError>> {
        let ranks = held::internal_states(
            &serde_json::json!({"internal_states": [{"pp_max_micro_batch_size": size}]})
                .to_string(),
        )
        .unwrap();
        Some(Ok(Held {
            model_path: Some(model.into()),
            ranks,
        }))
    }

    #[test]
    fn a_live_apply_is_in_sync_while_the_server_holds_what_it_was_told() {
        let mut f = applied_live();
        // What gather asks the server: the change from the running command line to the unit's.
        let LiveStanding::Holds(change) = live_standing(&f) else {
            panic!("{:?}", live_standing(&f));
        };
        assert_eq!(change.weights.as_ref().unwrap().to, "/n");
        assert_eq!(change.settings[0].to, 8);

        f.held = holding("/n", 8);
        let (c, details) = classify(&f, &Redactor::default());
        assert_eq!(c, [Class::InSync], "{details:?}");
        assert_eq!(
            details,
            ["applied live: weights from /n, --pp-max-micro-batch-size 8 set; the server (pid 42) runs its earlier command line (~ model-path /m -> /n, ~ pp-max-micro-batch-size 4 -> 8), which a restart replaces with the unit's"]
        );
        assert_eq!(exit_code(&[status(c, None)]), 0);

        // A value set back by hand, or other weights loaded: named, with what was told.
        f.held = holding("/n", 4);
        let (c, details) = classify(&f, &Redactor::default());
        assert_eq!(c, [Class::NotRestarted]);
        assert!(
            details[0].contains("does not hold what the live apply told it: --pp-max-micro-batch-size is 4 on the server, the live apply set 8"),
            "{details:?}"
        );
        f.held = holding("/m", 8);
        let (_, details) = classify(&f, &Redactor::default());
        assert!(
            details[0].contains("the server's weights are /m, the live apply told it /n"),
            "{details:?}"
        );
        // A server that cannot say is not taken at its word.
        f.held = Some(Err(AskError::TimedOut(std::time::Duration::from_secs(15))));
        let (c, details) = classify(&f, &Redactor::default());
        assert_eq!(c, [Class::NotRestarted]);
        assert!(
            details[0].contains("could not say what it holds (it did not answer within 15s)"),
            "{details:?}"
        );
        f.held = None;
        assert_eq!(classes(&f), [Class::NotRestarted]);
    }

    #[test]
    fn a_live_apply_explains_nothing_of_another_process_or_another_unit() {
        // Started again since, from the old unit by hand: not the process that was told.
        let mut f = applied_live();
        f.record
            .as_mut()
            .unwrap()
            .live
            .as_mut()
            .unwrap()
            .argv_sha256 = "another".into();
        f.held = holding("/n", 8);
        assert_eq!(live_standing(&f), LiveStanding::Restarted);
        let (c, details) = classify(&f, &Redactor::default());
        assert_eq!(c, [Class::NotRestarted]);
        assert!(
            details[0].starts_with("the server restarted since the live apply: pid 42 is not the process it told, and runs another command line than the unit's: ~ model-path /m -> /n"),
            "{details:?}"
        );
        // Restarted with the unit on disk: it runs what the unit says, in sync as any.
        f.running = Some(running(NEW));
        assert_eq!(classes(&f), [Class::InSync]);

        // No live apply recorded: the server was not restarted, as before.
        let mut f = applied_live();
        f.record.as_mut().unwrap().live = None;
        assert_eq!(live_standing(&f), LiveStanding::Unexplained);
        let (c, details) = classify(&f, &Redactor::default());
        assert_eq!(c, [Class::NotRestarted]);
        assert!(
            details[0].starts_with("the running server (pid 42) was started from another unit"),
            "{details:?}"
        );

        // The unit edited on the host since: the record's live apply was of another unit.
        let mut f = applied_live();
        f.disk_text = Some(NEW.replace("Description=t", "Description=u"));
        assert_eq!(live_standing(&f), LiveStanding::Unexplained);

        // Another environment: no live change sets one.
        let mut f = applied_live();
        f.running
            .as_mut()
            .unwrap()
            .env
            .insert("CUDA_VISIBLE_DEVICES".into(), "2,3".into());
        assert_eq!(live_standing(&f), LiveStanding::Unexplained);

        // The process told, but its command line differs in what no live change applies.
        let mut f = applied_live();
        let other = running(&OLD.replace("--tp-size 2", "--tp-size 1"));
        f.record
            .as_mut()
            .unwrap()
            .live
            .as_mut()
            .unwrap()
            .argv_sha256 = argv_sha256(&other.argv);
        f.running = Some(other);
        let (c, details) = classify(&f, &Redactor::default());
        assert_eq!(c, [Class::NotRestarted]);
        assert!(
            details[0].contains("the live apply of the unit does not explain it (the flag --tp-size changes, which only a restart applies)"),
            "{details:?}"
        );
    }

    fn status(classes: Vec<Class>, error: Option<String>) -> UnitStatus {
        UnitStatus {
            host: "h".into(),
            unit: "u".into(),
            source: "s".into(),
            classes,
            error,
            ..UnitStatus::default()
        }
    }

    #[test]
    fn exit_codes() {
        assert_eq!(exit_code(&[status(vec![Class::InSync], None)]), 0);
        assert_eq!(
            exit_code(&[
                status(vec![Class::InSync], None),
                status(vec![Class::Down], None)
            ]),
            2
        );
        assert_eq!(
            exit_code(&[
                status(vec![Class::Down], None),
                status(vec![], Some("unreachable".into()))
            ]),
            1
        );
    }

    #[test]
    fn an_unreadable_record_is_its_own_class_not_unmanaged() {
        let why = "the deployment record /var/lib/reconcile/s.service/current.json on gpu-a was written by a newer reconcile (format 2); upgrade reconcile";
        let f = Facts {
            record: None,
            record_error: Some(why.into()),
            ..synced()
        };
        let (c, details) = classify(&f, &Redactor::default());
        assert_eq!(c, [Class::RecordUnreadable]);
        assert_eq!(details, [why]);
        // The other sources are still judged, against the file on disk.
        let mut f = Facts {
            desired_text: UNIT.replace("--tp-size 2", "--tp-size 4"),
            ..f
        };
        f.systemd.active_state = "failed".into();
        assert_eq!(
            classes(&f),
            [Class::PendingChange, Class::Down, Class::RecordUnreadable]
        );
        // Something could not be read: exit 1, as for an unreadable host.
        assert_eq!(exit_code(&[status(vec![Class::RecordUnreadable], None)]), 1);
    }

    #[test]
    fn shas_that_are_not_ascii_are_shown_short_without_panicking() {
        let mut r = record(UNIT);
        r.unit_sha256 = "é".repeat(64);
        let f = Facts {
            record: Some(r),
            ..synced()
        };
        let (c, details) = classify(&f, &Redactor::default());
        assert_eq!(c, [Class::PendingChange, Class::EditedOnHost]);
        assert!(
            details[0].ends_with(&format!(
                "other than the one last applied ({})",
                "é".repeat(12)
            )),
            "{details:?}"
        );
    }
}
