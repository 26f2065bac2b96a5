//! The host's guard over a restart (`reconcile_core::guard`): armed before the old server stops,
//! renewed while this process verifies, taken over by its rollback, disarmed when it is done.
//! If this process dies (a cancelled CI job, a laptop that sleeps, a cut link), the guard judges
//! on the host once the lease runs out, and rolls back only a unit that is not healthy.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use reconcile_core::guard::{self, Change, GuardState, Record, Settled, Then, Watch};

use super::Job;
use crate::manifest::VerifySpec;
use crate::plan::UNIT_DIR;
use crate::remote::{Host, RemoteError};
use crate::state::{self, unit_dir, STATE_DIR};
use crate::verify::Expect;

/// What the guard restores should the new unit fail: the rollback's own facts (`Fallback`).
pub struct GoingBack {
    /// The saved generation of the previous unit; `None` when the unit was new.
    pub saved: Option<String>,
    pub previous_sha256: Option<String>,
    pub beneath: bool,
    pub was_disabled: bool,
    pub was_running: bool,
    /// The record of the files moved aside.
    pub aside: Option<String>,
    /// This apply's write replaces another unit file (`Record::replaces`).
    pub replaces: bool,
    /// This apply confirms a start the host's guard let stand (`Kind::Confirm`).
    pub confirming: bool,
}

/// A guard armed on a host, for the unit of one apply.
pub struct Armed<'a> {
    host: &'a dyn Host,
    unit: String,
    dir: String,
    /// The guard program on the host.
    program: String,
    /// This run's token: the guard refuses another run's commands.
    run: String,
    margin: Duration,
    /// How long the guard's own rollback may take to settle.
    settle_within: Duration,
    guard_unit: String,
}

pub use super::error::ArmError;

/// The guard program this run copies to hosts, read once.
struct Program {
    sha256: String,
    bytes: Vec<u8>,
}

/// The guard program beside this executable (`cargo build` and `cargo install` put both there;
/// a test executable runs from cargo's `deps/`, one folder below).
fn local_program() -> Result<&'static Program, ArmError> {
    static PROGRAM: OnceLock<Program> = OnceLock::new();
    if let Some(program) = PROGRAM.get() {
        return Ok(program);
    }
    let unread = |path: PathBuf| move |source| ArmError::Program { path, source };
    let exe = std::env::current_exe().map_err(unread(PathBuf::from("/proc/self/exe")))?;
    let dir = exe.parent().unwrap_or(Path::new("/"));
    let mut path = dir.join("reconcile-guard");
    if !path.exists() && dir.file_name().is_some_and(|n| n == "deps") {
        path = dir.parent().unwrap_or(dir).join("reconcile-guard");
    }
    let bytes = std::fs::read(&path).map_err(unread(path))?;
    let sha256 = {
        use sha2::{Digest, Sha256};
        format!("{:x}", Sha256::digest(&bytes))
    };
    Ok(PROGRAM.get_or_init(|| Program { sha256, bytes }))
}

/// The guard program on `host`, root's and named by its sha256, copied there when it is not yet:
/// root runs it, so it lives in a folder only root can write (0700) and is checked on arrival.
async fn install_program(host: &dyn Host) -> Result<String, ArmError> {
    let program = local_program()?;
    let dir = format!("{STATE_DIR}/guard");
    let path = format!("{dir}/reconcile-guard-{}", &program.sha256[..16]);
    // One round trip when it is there already. Copied whole, checked, then renamed: a cut copy
    // never runs.
    const INSTALL: &str = r#"umask 077; mkdir -p -- "$2" && chmod 0700 -- "$2" || exit 1
t="$1.tmp.$$"; trap 'rm -f "$t"' EXIT
cat > "$t" || exit 1
[ "$(sha256sum < "$t" | cut -d' ' -f1)" = "$3" ] || { echo "the guard program arrived damaged" >&2; exit 1; }
chmod 0700 -- "$t" && mv -f -- "$t" "$1""#;
    let there = host
        .run(&["sh", "-c", "test -x \"$1\"", "sh", &path])
        .await?;
    if there.status != 0 {
        let argv = ["sh", "-c", INSTALL, "sh", &path, &dir, &program.sha256];
        let out = host.run_with_input(&argv, Some(&program.bytes)).await?;
        if out.status != 0 {
            return Err(RemoteError::failed(host.name(), format!("install {path}"), &out).into());
        }
    }
    Ok(path)
}

/// The guard's own unit: enabled, so that it starts again at boot and acts on the record it
/// left (a host rebooted mid-change is judged as one whose controller died).
fn guard_unit_text(unit: &str, program: &str, dir: &str) -> String {
    format!(
        "# Written by reconcile: the host's guard over an apply of {unit}.\n\
         [Unit]\nDescription=reconcile guard for {unit}\n\n\
         [Service]\nType=simple\nExecStart={program} watch {dir}\n\
         # Its restore restarts the managed unit: a job of its own, not the guard's child.\n\
         KillMode=process\nRestart=on-failure\nRestartSec=1\n\n\
         [Install]\nWantedBy=multi-user.target\n"
    )
}

/// Arms the guard for `job`'s unit, whose new file is in place and whose restart (or live
/// change) comes next: the guard program in place, `guard.json` written (0600, nothing secret in
/// it), then the guard's unit started. `spec` is verification's own (learned) bounds: the guard
/// judges by the same deadline. A guard left by an earlier run is stopped first: this run's
/// record replaces its.
pub(super) async fn arm<'a>(
    job: &Job<'a>,
    back: GoingBack,
    spec: &VerifySpec,
    change: Change,
) -> Result<Armed<'a>, ArmError> {
    let (host, t) = (job.host, job.t);
    let unit = &t.desired.unit;
    let margin = spec.guard_margin;
    let endpoint = Expect::from_unit(&t.desired.model).endpoint;
    let address = match endpoint.forward_address() {
        a if a.contains(':') => format!("[{a}]"),
        a => a.to_string(),
    };
    let owner = &job.options.owner;
    let confirming = change == Change::InPlace && back.confirming;
    let now = std::time::SystemTime::now();
    let nanos = now
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    let armed_by = format!("{}@{} pid {}", owner.user, owner.machine, owner.pid);
    let settle_within = guard::judge_after(
        spec.crash_window,
        spec.load_deadline,
        spec.warmup_timeout,
        margin,
    );
    let record = Record {
        format: 2,
        state: GuardState::Armed,
        unit: unit.clone(),
        unit_path: format!("{UNIT_DIR}/{unit}"),
        new_sha256: state::sha256(&t.desired.text),
        previous: back.saved,
        previous_sha256: back.previous_sha256,
        beneath: back.beneath,
        disable: back.was_disabled,
        then: if back.was_running {
            Then::Restart
        } else {
            Then::Stop
        },
        aside: back.aside,
        health_url: format!("http://{address}:{}/health", endpoint.port),
        crash_loop_restarts: if t.group.is_some() { 1 } else { 2 },
        judge_after: settle_within.as_secs_f64(),
        margin: margin.as_secs_f64(),
        run: format!("{armed_by} at {nanos}"),
        armed_by,
        armed_at: humantime::format_rfc3339_seconds(now).to_string(),
        change,
        replaces: back.replaces,
        watch: Watch {
            // A unit being confirmed runs a start of this change already (kept by a guard): a
            // run after this one, should it die, confirms it too.
            new_started: confirming,
            ..Watch::default()
        },
    };
    let program = install_program(host).await?;
    let armed = Armed {
        host,
        unit: unit.clone(),
        dir: unit_dir(unit),
        program,
        run: record.run.clone(),
        margin,
        settle_within,
        guard_unit: guard::unit_name(unit),
    };
    if !confirming {
        // A dead run's guard still at work (its lease, its judgement, its restore) is not
        // stopped and overwritten: it may owe the host a restore. Nothing has changed yet, so
        // this run stops here; once that guard settles, an apply goes ahead.
        if let Some(prior) = read(host, unit).await?.filter(|g| g.state.active()) {
            return Err(ArmError::Busy {
                armed_by: prior.armed_by,
                armed_at: prior.armed_at,
                state: prior.state.name(),
            });
        }
    }
    let unit_text = guard_unit_text(unit, &armed.program, &armed.dir);
    // One round trip before the record: an earlier guard of this unit stopped, its folder there,
    // the guard's unit written and wanted at boot. No daemon-reload: systemd loads the unit when
    // it is started and lets it go once it is done, so a settled guard leaves nothing loaded;
    // only a definition systemd still holds from before is reloaded.
    const CLEAR: &str = r#"systemctl stop -- "$1" 2>/dev/null; systemctl reset-failed -- "$1" 2>/dev/null
umask 077; mkdir -p -m 0700 -- "$2" || exit 1
umask 022; f="/etc/systemd/system/$1"; w=/etc/systemd/system/multi-user.target.wants
if [ "$(cat -- "$f" 2>/dev/null)" != "$3" ]; then
  printf '%s\n' "$3" > "$f.tmp" && mv -f -- "$f.tmp" "$f" || exit 1
fi
mkdir -p -- "$w" && ln -sfn -- "$f" "$w/$1" || exit 1
[ "$(systemctl show -p NeedDaemonReload --value -- "$1")" = yes ] && systemctl daemon-reload
exit 0"#;
    host.run_ok(&[
        "sh",
        "-c",
        CLEAR,
        "sh",
        &armed.guard_unit,
        &armed.dir,
        unit_text.trim_end(),
    ])
    .await?;
    if confirming {
        // Confirmed only while the dead run's record still shows what this run planned from:
        // that guard, stopped just now, may have restored or put the file back since the plan.
        // If so it starts again to finish what it began, and this run confirms nothing.
        let prior = read(host, unit).await?;
        if !prior
            .as_ref()
            .is_some_and(|g| g.confirmable(&record.new_sha256))
        {
            host.run_ok(&["systemctl", "start", "--", &armed.guard_unit])
                .await?;
            let state = prior.map_or("gone", |g| g.state.name());
            return Err(ArmError::Moved { state });
        }
    }
    let json = serde_json::to_string_pretty(&record).expect("the guard's record serializes");
    host.write_file(&format!("{}/guard.json", armed.dir), &(json + "\n"), "0600")
        .await?;
    host.run_ok(&["systemctl", "start", "--", &armed.guard_unit])
        .await?;
    Ok(armed)
}

impl Armed<'_> {
    async fn call(&self, command: &str) -> Result<Option<GuardState>, RemoteError> {
        let out = self
            .host
            .run_ok(&[&self.program, command, &self.dir, &self.run])
            .await?;
        Ok(GuardState::parse(&out))
    }

    /// Whether the guard still holds for this run: its lease renewed, and found armed. A guard
    /// that acted while the link was cut put the previous file back and watches no more, so
    /// nothing new is written under it.
    pub async fn holds(&self) -> Result<bool, RemoteError> {
        Ok(self.call("renew").await? == Some(GuardState::Armed))
    }

    /// The running server is about to be told a live change (or told it back): until `told`, the
    /// guard restarts the previous unit should this process die.
    pub async fn telling(&self) -> Result<Option<GuardState>, RemoteError> {
        self.call("telling").await
    }

    /// The running server took the live change: the guard counts it the server's from now.
    pub async fn told(&self) -> Result<Option<GuardState>, RemoteError> {
        self.call("told").await
    }

    /// This process's rollback begins: the guard finishes it should this process die. Returns the
    /// state found: anything but `armed` means the guard acted first, and this rollback must not.
    pub async fn take(&self) -> Result<Option<GuardState>, RemoteError> {
        self.call("take").await
    }

    /// This process is done with the unit: the guard stands down, unless it acted already (the
    /// state found is returned), and its watch has ended before this returns. A guard in the
    /// middle of its own restore finishes it: what it settled on is returned.
    pub async fn disarm(&self) -> Result<Option<GuardState>, RemoteError> {
        let found = self.call("disarm").await?;
        if let Some(GuardState::RollingBack) = found {
            if let Ok(Some(s)) = read(self.host, &self.unit).await {
                if s.state.active() {
                    return Ok(self.settled().await.map(|s| s.state));
                }
            }
        }
        // The watch sees `disarmed` within a second and exits.
        for _ in 0..20 {
            let out = self
                .host
                .run(&["systemctl", "is-active", "--", &self.guard_unit])
                .await?;
            if out.status != 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Ok(found)
    }

    /// The guard's record once it has settled, waited for as long as its own rollback may take
    /// (the restored unit's load, judged by the same bounds); `None` if it has not by then.
    pub async fn settled(&self) -> Option<Settled> {
        let until = tokio::time::Instant::now() + self.settle_within;
        loop {
            if let Ok(Some(s)) = read(self.host, &self.unit).await {
                if !s.state.active() {
                    return Some(s);
                }
            }
            if tokio::time::Instant::now() >= until {
                return None;
            }
            tokio::time::sleep(crate::verify::POLL_INTERVAL).await;
        }
    }
}

/// Runs `work` while renewing the lease of every guard (a server's ranks, each with its own), so
/// they stay put as long as this process works. A renewal that fails (a cut link) is let go: that
/// guard acts once its lease is out. Each guard is renewed on its own: a renewal that hangs on
/// one host's cut link never delays another's (the crash matrix found a group's rank 0 restored
/// by its guard, its lease run out while the renewals waited on rank 1's cut link, and then
/// restored again by this run).
pub async fn leased_all<F: Future>(guards: &[&Armed<'_>], work: F) -> F::Output {
    if guards.is_empty() {
        return work.await;
    }
    let renewing = futures::future::join_all(guards.iter().map(|g| async move {
        loop {
            tokio::time::sleep(guard::renew_every(g.margin)).await;
            let _ = g.call("renew").await;
        }
    }));
    tokio::select! {
        out = work => out,
        _ = renewing => unreachable!("the renewal loops never end"),
    }
}

/// The guard's record for `unit`, when it has one that reads.
pub async fn read(host: &dyn Host, unit: &str) -> Result<Option<Settled>, RemoteError> {
    let text = host
        .read_file(&format!("{}/guard.json", unit_dir(unit)))
        .await?;
    Ok(text.and_then(|t| Settled::parse(&t).ok()))
}

#[cfg(test)]
mod tests {
    use tokio_util::sync::CancellationToken;

    use super::*;
    use crate::apply::testing::{options, target};
    use crate::apply::verifier::fake::Scripted;
    use crate::remote::fake::{FakeHost, Reply};

    fn confirming() -> GoingBack {
        GoingBack {
            saved: Some("/var/lib/reconcile/s.service/generations/1.service".into()),
            previous_sha256: Some("old".into()),
            beneath: false,
            was_disabled: false,
            was_running: true,
            aside: None,
            replaces: false,
            confirming: true,
        }
    }

    /// `back` armed for `change` over `prior`, the dead run's record as the host has it now.
    async fn arm_over(
        prior: &str,
        back: GoingBack,
        change: Change,
    ) -> (Result<(), ArmError>, FakeHost) {
        let t = target();
        let options = options(CancellationToken::new());
        let verifier = Scripted::default();
        let record = format!("{}/guard.json", unit_dir(&t.desired.unit));
        let host = FakeHost::new("gpu-a")
            .on(&[], Reply::ok(""))
            .with_file(&record, prior);
        let job = Job {
            host: &host,
            t: &t,
            options: &options,
            verifier: &verifier,
        };
        let armed = arm(&job, back, &t.verify, change).await;
        (armed.map(|_| ()), host)
    }

    /// A guard on `host` with a four-second margin, as the crash matrix arms them.
    fn armed_on(host: &FakeHost) -> Armed<'_> {
        Armed {
            host,
            unit: "s.service".into(),
            dir: unit_dir("s.service"),
            program: "/usr/local/lib/reconcile/reconcile-guard".into(),
            run: "ci@box pid 7 at 1".into(),
            margin: Duration::from_secs(4),
            settle_within: Duration::from_secs(30),
            guard_unit: "reconcile-guard-s.service".into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn each_guard_is_renewed_on_its_own_while_another_hosts_renewal_hangs() {
        let here = FakeHost::new("gpu-a").on(&[], Reply::ok("rolling_back\n"));
        let cut = FakeHost::new("gpu-b").on(&[], Reply::Stall);
        let (kept, lost) = (armed_on(&here), armed_on(&cut));
        let work = tokio::time::sleep(Duration::from_secs(60));
        leased_all(&[&kept, &lost], work).await;
        let renewals = |host: &FakeHost| {
            host.commands()
                .iter()
                .filter(|c| c.get(1).map(String::as_str) == Some("renew"))
                .count()
        };
        // Every second (a quarter of the margin) for a minute on the host that answers, though
        // each renewal on the cut host waits its whole limit out.
        assert!(renewals(&here) >= 59, "{}", renewals(&here));
        assert!(renewals(&cut) < renewals(&here), "{}", renewals(&cut));
    }

    /// A confirm armed over `prior`.
    async fn confirm_over(prior: &str) -> (Result<(), ArmError>, FakeHost) {
        arm_over(prior, confirming(), Change::InPlace).await
    }

    #[tokio::test]
    async fn a_restart_never_arms_over_a_dead_runs_guard_still_at_work() {
        let record = format!("{}/guard.json", unit_dir(&target().desired.unit));
        let prior =
            r#"{"state":"armed","new_sha256":"x","armed_by":"ci@box pid 7","armed_at":"t0"}"#;
        let back = GoingBack {
            confirming: false,
            replaces: true,
            ..confirming()
        };
        let (armed, host) = arm_over(prior, back, Change::Restart).await;
        let Err(e) = armed else {
            panic!("armed over a guard at work")
        };
        assert_eq!(
            e.to_string(),
            "the host's guard of the apply by ci@box pid 7 at t0 is still at work (armed): nothing was changed; apply again once it settles (within its deadline)"
        );
        // Left as it was: not stopped, its record not overwritten.
        assert_eq!(host.file(&record).as_deref(), Some(prior));
        assert!(!host
            .commands()
            .iter()
            .any(|c| c.iter().any(|a| a.contains("systemctl stop"))));
    }

    #[tokio::test]
    async fn a_confirm_arms_only_over_the_record_it_planned_from() {
        let sha = state::sha256(&target().desired.text);
        let kept = format!(r#"{{"state":"unconfirmed","new_sha256":"{sha}","new_started":true}}"#);
        let (armed, host) = confirm_over(&kept).await;
        assert!(armed.is_ok(), "{armed:?}");
        let record = host
            .file("/var/lib/reconcile/s.service/guard.json")
            .unwrap();
        assert!(record.contains("\"state\": \"armed\""), "{record}");
        // The dead run's guard restored the previous unit after the plan: nothing to confirm,
        // and that guard is started again to finish what it began.
        let restored =
            format!(r#"{{"state":"rolling_back","new_sha256":"{sha}","new_started":true}}"#);
        let (armed, host) = confirm_over(&restored).await;
        let Err(e) = armed else {
            panic!("armed over a guard that acted")
        };
        assert_eq!(
            e.to_string(),
            "the host's guard acted since this run planned (its record is rolling_back now): nothing to confirm; plan again"
        );
        assert!(host
            .file("/var/lib/reconcile/s.service/guard.json")
            .unwrap()
            .contains("rolling_back"));
        let commands = host.commands();
        let last = commands.last().unwrap();
        assert_eq!(
            last,
            &["systemctl", "start", "--", "reconcile-guard-s.service"]
        );
    }
}
