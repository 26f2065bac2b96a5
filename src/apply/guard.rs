//! The host's guard over a restart (`reconcile_core::guard`): armed before the old server stops,
//! renewed while this process verifies, taken over by its rollback, disarmed when it is done.
//! If this process dies (a cancelled CI job, a laptop that sleeps, a cut link), the guard judges
//! on the host once the lease runs out, and rolls back only a unit that is not healthy.

use std::future::Future;
use std::time::Duration;

use reconcile_core::guard::{self, Arming, GuardState, Settled, Then};

use super::state::{self, unit_dir};
use super::Job;
use crate::manifest::VerifySpec;
use crate::plan::UNIT_DIR;
use crate::remote::{Host, RemoteError};
use crate::verify::Expect;

/// What the guard restores should the new unit fail: the rollback's own facts (`Fallback`).
pub struct GoingBack {
    /// The kept generation of the previous unit; `None` when the unit was new.
    pub kept: Option<String>,
    pub previous_sha256: Option<String>,
    pub beneath: bool,
    pub was_disabled: bool,
    pub was_running: bool,
    /// The record of the files moved aside.
    pub aside: Option<String>,
}

/// A guard armed on a host, for the unit of one apply.
pub struct Armed<'a> {
    host: &'a dyn Host,
    dir: String,
    python: String,
    margin: Duration,
    transient: String,
}

/// Arms the guard for `job`'s unit, whose new file is in place and whose restart comes next:
/// `guard.json` written (0600, nothing secret in it), then the guard started as a transient unit.
/// A guard left by an earlier run is stopped first: this run's record replaces its.
pub async fn arm<'a>(job: &Job<'a>, back: GoingBack) -> Result<Armed<'a>, RemoteError> {
    let (host, t) = (job.host, job.t);
    let unit = &t.desired.unit;
    let spec = &t.verify;
    let margin = spec.guard_margin;
    let endpoint = Expect::from_unit(&t.desired.model).endpoint;
    let address = match endpoint.forward_address() {
        a if a.contains(':') => format!("[{a}]"),
        a => a.to_string(),
    };
    let owner = &job.options.owner;
    let arming = Arming {
        format: 1,
        state: GuardState::Armed,
        unit: unit.clone(),
        unit_path: format!("{UNIT_DIR}/{unit}"),
        new_sha256: state::sha256(&t.desired.text),
        previous: back.kept,
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
        judge_after: guard::judge_after(
            spec.crash_window,
            spec.load_deadline,
            spec.warmup_timeout,
            margin,
        )
        .as_secs_f64(),
        margin: margin.as_secs_f64(),
        armed_by: format!("{}@{} pid {}", owner.user, owner.machine, owner.pid),
        armed_at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
    };
    let armed = Armed {
        host,
        dir: unit_dir(unit),
        python: t.manifest.sglang.python.clone(),
        margin,
        transient: guard::unit_name(unit),
    };
    host.run(&["systemctl", "stop", "--", &armed.transient])
        .await?;
    host.run(&["systemctl", "reset-failed", "--", &armed.transient])
        .await?;
    let json = serde_json::to_string_pretty(&arming).expect("the guard's record serializes");
    host.run_ok(&["mkdir", "-p", "-m", "0700", "--", &armed.dir])
        .await?;
    host.write_file(&format!("{}/guard.json", armed.dir), &(json + "\n"), "0600")
        .await?;
    let description = format!("reconcile guard for {unit}");
    host.run_ok(&[
        "systemd-run",
        "--quiet",
        "--collect",
        &format!("--unit={}", armed.transient),
        &format!("--description={description}"),
        // The guard's restore restarts the managed unit: a job of its own, not the guard's child.
        "--property=KillMode=process",
        "--",
        &armed.python,
        "-c",
        guard::SCRIPT,
        "watch",
        &armed.dir,
    ])
    .await?;
    Ok(armed)
}

impl Armed<'_> {
    async fn call(&self, command: &str) -> Result<Option<GuardState>, RemoteError> {
        let out = self
            .host
            .run_ok(&[&self.python, "-c", guard::SCRIPT, command, &self.dir])
            .await?;
        Ok(GuardState::parse(&out))
    }

    /// Runs `work` while renewing the lease, so the guard stays put as long as this process
    /// works. A renewal that fails (a cut link) is let go: the guard acts once the lease is out.
    pub async fn leased<F: Future>(&self, work: F) -> F::Output {
        let renewing = async {
            loop {
                tokio::time::sleep(guard::renew_every(self.margin)).await;
                let _ = self.call("renew").await;
            }
        };
        tokio::select! {
            out = work => out,
            _ = renewing => unreachable!("the renewal loop never ends"),
        }
    }

    /// This process's rollback begins: the guard finishes it should this process die. Returns the
    /// state found: anything but `armed` means the guard acted first, and this rollback must not.
    pub async fn take(&self) -> Result<Option<GuardState>, RemoteError> {
        self.call("take").await
    }

    /// This process is done with the unit: the guard stands down, unless it acted already (the
    /// state found is returned), and its transient unit is gone before this returns.
    pub async fn disarm(&self) -> Result<Option<GuardState>, RemoteError> {
        let found = self.call("disarm").await?;
        // The watch sees `disarmed` within a second and exits; --collect then unloads it.
        for _ in 0..20 {
            let out = self
                .host
                .run(&["systemctl", "is-active", "--", &self.transient])
                .await?;
            if out.status != 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Ok(found)
    }
}

impl Armed<'_> {
    /// The guard's record once it has settled, waited for as long as its own rollback may take
    /// (the restored unit's load, judged by the same bounds); `None` if it has not by then.
    pub async fn settled(&self, spec: &VerifySpec) -> Option<Settled> {
        let bound = guard::judge_after(
            spec.crash_window,
            spec.load_deadline,
            spec.warmup_timeout,
            spec.guard_margin,
        );
        let until = tokio::time::Instant::now() + bound;
        loop {
            let text = self
                .host
                .read_file(&format!("{}/guard.json", self.dir))
                .await;
            if let Ok(Some(s)) = text.map(|t| t.and_then(|t| Settled::parse(&t).ok())) {
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

/// The guard's record for `unit`, when it has one that reads.
pub async fn read(host: &dyn Host, unit: &str) -> Result<Option<Settled>, RemoteError> {
    let text = host
        .read_file(&format!("{}/guard.json", unit_dir(unit)))
        .await?;
    Ok(text.and_then(|t| Settled::parse(&t).ok()))
}
