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
    unit: String,
    dir: String,
    python: String,
    margin: Duration,
    transient: String,
}

/// Arms the guard for `job`'s unit, whose new file is in place and whose restart comes next:
/// `guard.json` written (0600, nothing secret in it), then the guard started as a transient unit.
/// A guard left by an earlier run is stopped first: this run's record replaces its.
pub(super) async fn arm<'a>(job: &Job<'a>, back: GoingBack) -> Result<Armed<'a>, RemoteError> {
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
        crash_loop_restarts: if t.group.is_some() { 1 } else { 2 },
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
        unit: unit.clone(),
        dir: unit_dir(unit),
        python: t.manifest.sglang.python.clone(),
        margin,
        transient: guard::unit_name(unit),
    };
    // One round trip before the record: an earlier guard of this unit gone, its folder there.
    const CLEAR: &str = "systemctl stop -- \"$1\" 2>/dev/null; systemctl reset-failed -- \"$1\" 2>/dev/null; mkdir -p -m 0700 -- \"$2\"";
    host.run_ok(&["sh", "-c", CLEAR, "sh", &armed.transient, &armed.dir])
        .await?;
    let json = serde_json::to_string_pretty(&arming).expect("the guard's record serializes");
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
/// guard acts once its lease is out.
pub async fn leased_all<F: Future>(guards: &[&Armed<'_>], work: F) -> F::Output {
    let Some(margin) = guards.iter().map(|g| g.margin).min() else {
        return work.await;
    };
    let renewing = async {
        loop {
            tokio::time::sleep(guard::renew_every(margin)).await;
            futures::future::join_all(guards.iter().map(|g| g.call("renew"))).await;
        }
    };
    tokio::select! {
        out = work => out,
        _ = renewing => unreachable!("the renewal loop never ends"),
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
    use serde_json::{json, Value};

    /// `guard.py`'s `judge` over `cases` (guard record, facts, now, /health's answer), run by the
    /// Python the tests need anyway, as the host's would run it: each case's verdict and reason.
    /// A case whose `/health` is `"unasked"` fails if the guard asks for it.
    fn judged(cases: &Value) -> Vec<(String, String)> {
        const RUN: &str = r#"
import json, sys
guard = {"__name__": "guard"}
exec(sys.argv[1], guard)
out = []
for i, case in enumerate(json.load(sys.stdin)):
    def healthy(code=case["health"], i=i):
        assert code != "unasked", "case %d: the guard asked /health where it must not" % i
        return code
    out.append(guard["judge"](case["guard"], case["facts"], case["now"], healthy))
print(json.dumps(out))
"#;
        use std::io::Write;
        let mut child = std::process::Command::new("python3")
            .args(["-c", RUN, reconcile_core::guard::SCRIPT])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("python3 runs (the tests need it, as the hosts do)");
        let input = cases.to_string();
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// Each case's verdict and reason are `expected`'s, in order.
    fn assert_judged(cases: &Value, expected: &[(&str, &str)]) {
        let verdicts = judged(cases);
        for (i, (got, want)) in verdicts.iter().zip(expected).enumerate() {
            assert_eq!((got.0.as_str(), got.1.as_str()), *want, "case {i}");
        }
        assert_eq!(verdicts.len(), expected.len());
    }

    /// A guard armed at 100 s on the host's clock, judging at 200 s, its lease out at 110 s.
    fn armed() -> Value {
        json!({
            "state": "armed", "new_sha256": "new", "previous": "/gen/1.service",
            "previous_sha256": "old", "beneath": false, "then": "restart",
            "armed_mono": 100.0, "judge_at": 200.0, "lease_until": 110.0
        })
    }

    fn facts(sha: &str, active: &str, sub: &str, restarts: u32, entered: f64) -> Value {
        json!({"sha256": sha, "active": active, "sub": sub, "restarts": restarts, "entered": entered, "stale": false})
    }

    fn case(guard: Value, facts: Value, now: f64, health: Value) -> Value {
        json!({"guard": guard, "facts": facts, "now": now, "health": health})
    }

    fn with(mut guard: Value, fields: Value) -> Value {
        for (k, v) in fields.as_object().unwrap() {
            guard[k] = v.clone();
        }
        guard
    }

    #[test]
    fn the_guard_restores_only_what_is_broken_and_keeps_a_healthy_unit() {
        let unasked = json!("unasked");
        let cases = json!([
            // The controller's lease holds: nothing, whatever the unit does.
            case(
                armed(),
                facts("new", "failed", "failed", 0, 101.0),
                105.0,
                unasked.clone()
            ),
            // Another change replaced the unit file: left alone.
            case(
                armed(),
                facts("other", "failed", "failed", 0, 101.0),
                150.0,
                unasked.clone()
            ),
            // The new invocation failed, or systemd restarted it twice: restored before the deadline.
            case(
                armed(),
                facts("new", "failed", "failed", 0, 101.0),
                150.0,
                unasked.clone()
            ),
            case(
                armed(),
                facts("new", "activating", "auto-restart", 2, 130.0),
                150.0,
                unasked.clone()
            ),
            // A group's rank is broken at its first restart: it cannot rejoin its process group.
            case(
                with(armed(), json!({"crash_loop_restarts": 1})),
                facts("new", "activating", "auto-restart", 1, 130.0),
                150.0,
                unasked.clone()
            ),
            case(
                armed(),
                facts("new", "activating", "auto-restart", 1, 130.0),
                150.0,
                unasked.clone()
            ),
            // The old invocation's state says nothing of the new one (not started yet).
            case(
                armed(),
                facts("new", "failed", "failed", 5, 90.0),
                150.0,
                unasked.clone()
            ),
            // Loading, before the deadline: /health is not even asked.
            case(
                armed(),
                facts("new", "activating", "start", 0, 101.0),
                150.0,
                unasked.clone()
            ),
            // At the deadline: healthy is kept, anything else restored.
            case(
                armed(),
                facts("new", "active", "running", 0, 101.0),
                200.0,
                json!(200)
            ),
            case(
                armed(),
                facts("new", "active", "running", 0, 101.0),
                200.0,
                json!(503)
            ),
            case(
                armed(),
                facts("new", "activating", "start", 0, 101.0),
                200.0,
                Value::Null
            ),
        ]);
        let expected = [
            ("wait", "the controller renewed its lease"),
            (
                "leave",
                "the unit file changed since the guard was armed; left as it is",
            ),
            ("restore", "the new unit failed"),
            ("restore", "the new unit is crash-looping (2 restarts)"),
            ("restore", "the new unit is crash-looping (1 restart)"),
            ("wait", "before the deadline"),
            ("wait", "before the deadline"),
            ("wait", "before the deadline"),
            (
                "keep",
                "active and /health 200 at the deadline, but no apply confirmed it",
            ),
            (
                "restore",
                "not healthy by the deadline (active/running, /health 503)",
            ),
            (
                "restore",
                "not healthy by the deadline (activating/start, /health no answer)",
            ),
        ];
        assert_judged(&cases, &expected);
    }

    #[test]
    fn a_rollback_under_way_is_finished_without_restarting_what_came_back() {
        let unasked = json!("unasked");
        // The controller took the guard over at 150 s and died; the guard judges from 160 s.
        let taken = with(
            armed(),
            json!({"state": "rolling_back", "taken_at": 150.0, "lease_until": 160.0, "judge_at": 400.0}),
        );
        let by_guard = with(
            taken.clone(),
            json!({"restored": true, "restored_at": 170.0}),
        );
        // A group's rank the guard restored, systemd's count of 1 restart kept across it.
        let rank = with(
            by_guard.clone(),
            json!({"crash_loop_restarts": 1, "restored_entered": 171.0, "restored_restarts": 1}),
        );
        let new_unit = with(
            taken.clone(),
            json!({"previous": null, "previous_sha256": null}),
        );
        let cases = json!([
            // The previous unit back and restarted since: waited for, then done.
            case(
                taken.clone(),
                facts("old", "active", "running", 0, 151.0),
                165.0,
                json!(200)
            ),
            case(
                taken.clone(),
                facts("old", "activating", "start", 0, 151.0),
                165.0,
                json!(503)
            ),
            case(
                taken.clone(),
                facts("old", "activating", "start", 0, 151.0),
                400.0,
                json!(503)
            ),
            // Its file back, but the new server still runs (not restarted since): restored.
            case(
                taken.clone(),
                facts("old", "active", "running", 0, 120.0),
                165.0,
                unasked.clone()
            ),
            case(
                taken.clone(),
                facts("new", "active", "running", 0, 120.0),
                165.0,
                unasked.clone()
            ),
            // The previous file back but not loaded (apply died before daemon-reload): the new
            // definition still runs, crash-looping. Restored, not waited for.
            case(
                taken.clone(),
                with(
                    facts("old", "activating", "auto-restart", 9, 155.0),
                    json!({"stale": true})
                ),
                165.0,
                unasked.clone()
            ),
            case(
                taken.clone(),
                facts("old", "activating", "auto-restart", 9, 155.0),
                165.0,
                unasked.clone()
            ),
            // The guard's own restore did not start the previous unit: not restored again.
            case(
                by_guard.clone(),
                facts("old", "failed", "failed", 0, 171.0),
                180.0,
                unasked.clone()
            ),
            // Its restart joined a start the dead controller had begun (at 168 s, before the
            // guard's restore at 170 s): that start is the restored unit's.
            case(
                with(
                    by_guard.clone(),
                    json!({"restored_entered": 168.0, "restored_restarts": 0})
                ),
                facts("old", "active", "running", 0, 168.0),
                180.0,
                json!(200)
            ),
            // A group's rank: systemd kept its one restart across the guard's restart, and the
            // restored rank restarts again while its peers come back. Judged by /health by its
            // deadline, not by its restarts.
            case(
                rank.clone(),
                facts("old", "active", "running", 1, 171.0),
                180.0,
                json!(200)
            ),
            case(
                rank.clone(),
                facts("old", "activating", "auto-restart", 2, 185.0),
                190.0,
                json!(503)
            ),
            case(
                rank,
                facts("old", "activating", "auto-restart", 7, 395.0),
                400.0,
                json!(503)
            ),
            // The controller took over a unit systemd had restarted once: its rollback's start
            // counts from there.
            case(
                with(
                    taken.clone(),
                    json!({"crash_loop_restarts": 1, "taken_restarts": 1})
                ),
                facts("old", "active", "running", 1, 155.0),
                165.0,
                json!(200)
            ),
            // A unit that was new: removed, once.
            case(
                new_unit.clone(),
                facts("new", "active", "running", 0, 120.0),
                165.0,
                unasked.clone()
            ),
            case(
                with(new_unit, json!({"restored": true})),
                facts("gone", "inactive", "dead", 0, 120.0),
                165.0,
                unasked.clone()
            ),
            // Settled already: nothing more.
            case(
                with(armed(), json!({"state": "disarmed"})),
                facts("new", "failed", "failed", 0, 101.0),
                300.0,
                unasked
            ),
        ]);
        let expected = [
            (
                "done",
                "the previous unit runs again and answers /health 200",
            ),
            ("wait", "the restored unit is loading"),
            (
                "failed",
                "the restored unit was not healthy by its deadline (activating/start)",
            ),
            ("restore", "the controller's rollback did not finish"),
            ("restore", "the controller's rollback did not finish"),
            ("restore", "the controller's rollback did not finish"),
            ("restore", "the controller's rollback did not finish"),
            (
                "failed",
                "the restored unit did not start or did not stay up (failed/failed)",
            ),
            (
                "done",
                "the previous unit runs again and answers /health 200",
            ),
            (
                "done",
                "the previous unit runs again and answers /health 200",
            ),
            ("wait", "the restored unit is loading"),
            (
                "failed",
                "the restored unit was not healthy by its deadline (activating/auto-restart)",
            ),
            (
                "done",
                "the previous unit runs again and answers /health 200",
            ),
            ("restore", "the controller's rollback did not finish"),
            ("done", "the rollback finished"),
            ("leave", "the guard is disarmed"),
        ];
        assert_judged(&cases, &expected);
    }
}
