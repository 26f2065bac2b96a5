//! What real GPU hosts do that no happy path covers: a command that never answers (`nvidia-smi`
//! on a GPU that fell off the bus, a `systemctl` stuck on a busy bus), a deployment record that
//! cannot be read, and a run stopped by a signal. Nothing hangs, nothing healthy is restarted,
//! nothing panics. These break their host on purpose, so they have one of their own and take
//! turns on it; every break is undone by a guard, even when a test fails.

use std::sync::Mutex;
use std::time::Duration;

use crate::lab::{
    assert_field_has, assert_has, lab, run_on, stand_in, Manifest, Ran, Reconcile, HANGS,
};

static TURN: Mutex<()> = Mutex::new(());

fn turn() -> std::sync::MutexGuard<'static, ()> {
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// A test service on the hangs host, loading in one second.
fn service(name: &str, port: u16, gpus: &str) -> Manifest {
    stand_in(name, &[HANGS], port, gpus)
        .env("FAKE_SGLANG_LOAD_SECONDS", "1")
        .verify_all(&[
            ("crash_window", "2s"),
            ("sample_interval", "500ms"),
            ("stall_timeout", "10s"),
            ("load_deadline", "30s"),
        ])
}

fn fresh(unit: &str) {
    lab().sh(HANGS, &format!("systemctl disable --now {unit} 2>/dev/null; rm -rf /etc/systemd/system/{unit} /var/lib/reconcile/{unit}; systemctl daemon-reload"));
}

fn apply(text: &Manifest, extra: &[&str]) -> Ran {
    let mut args = vec!["apply", "--format", "json"];
    args.extend_from_slice(extra);
    Reconcile::new().manifest("a.yaml", text).args(&args).run()
}

fn invocation(unit: &str) -> String {
    lab().sh(
        HANGS,
        &format!("/usr/bin/systemctl show -p InvocationID --value {unit}"),
    )
}

/// A file put on the host for one test and removed when the guard drops.
struct Planted {
    path: &'static str,
}

impl Planted {
    fn script(path: &'static str, body: &str) -> Planted {
        lab().put(HANGS, path, &format!("#!/bin/sh\n{body}\n"));
        lab().sh(HANGS, &format!("chmod 755 {path}"));
        Planted { path }
    }
}

impl Drop for Planted {
    fn drop(&mut self) {
        // Never panics: a panic while a failing test unwinds would abort every test.
        // `[.]` keeps pkill's pattern from matching this command's own shell.
        crate::lab::sh_quietly(
            HANGS,
            &format!(
                "rm -f {} /run/t-hang-show; pkill -f 'sleep 3600[.]123' || true",
                self.path
            ),
        );
    }
}

/// Stands in for a wedged program: sleeps far longer than any test (found by its odd length).
const HANG: &str = "exec sleep 3600.123";

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_hung_nvidia_smi_ends_the_plan_naming_it_and_apply_goes_on_without_gpu_figures() {
    let _turn = turn();
    let unit = "t-hang-smi.service";
    fresh(unit);
    let text = service("t-hang-smi", 36001, "0,1");
    {
        // /usr/local/sbin comes before the stand-in's /usr/local/bin on root's PATH.
        let _smi = Planted::script("/usr/local/sbin/nvidia-smi", HANG);
        let started = std::time::Instant::now();
        let ran = run_on(&text, &["plan", "--command-timeout", "2s"]);
        ran.assert_code(1);
        let said = format!("{}{}", ran.stdout, ran.stderr);
        assert_has(&said, "`nvidia-smi` on rl14 did not answer in 2s");
        // The plan ended rather than wait out the hang (an hour): it measured 2.3-2.5 s under
        // full load, and 60 s is far more than three times that.
        eprintln!("the plan ended after {:.1?}", started.elapsed());
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the plan took {:?}: it waited for the hung nvidia-smi",
            started.elapsed()
        );
    }
    // Only the memory query hangs: preflight passes, and verification goes on without GPUs.
    let _smi = Planted::script(
        "/usr/local/sbin/nvidia-smi",
        &format!(
            "case \"$*\" in *memory.used*) {HANG};; esac\nexec /usr/local/bin/nvidia-smi \"$@\""
        ),
    );
    let ran = apply(&text, &["--command-timeout", "2s"]);
    ran.assert_code(0);
    let report = &ran.json()["units"][0];
    let notes = report["verification"]["notes"].to_string();
    assert!(
        notes.contains("`nvidia-smi` on rl14 did not answer in 2s")
            && notes.contains("GPU memory is not judged"),
        "{report:#}"
    );
    fresh(unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_systemctl_that_hangs_during_verification_fails_the_stage_and_rolls_back() {
    let _turn = turn();
    let unit = "t-hang-systemctl.service";
    fresh(unit);
    let good = service("t-hang-systemctl", 36002, "2,3");
    assert_eq!(apply(&good, &[]).code, 0);
    let running = invocation(unit);
    // The next `systemctl show` over SSH (reconcile's) after the marker appears hangs, once. Not
    // the host guard's (a transient unit, no SSH_CONNECTION): it polls `systemctl show` every
    // second too, and one CI run's guard took the marker, so verification never hung. Nor the
    // read of the old server's stop time (`-p ActiveExitTimestampMonotonic`): a note, let go when
    // it does not answer, and one run's took the marker so.
    let _systemctl = Planted::script(
        "/usr/local/sbin/systemctl",
        &format!("if [ \"$1\" = show ] && [ \"$3\" != ActiveExitTimestampMonotonic ] && [ -n \"$SSH_CONNECTION\" ] && rm /run/t-hang-show 2>/dev/null; then {HANG}; fi\nexec /usr/bin/systemctl \"$@\""),
    );
    // A 30 s load keeps verification polling long after the marker is planted, however late a
    // loaded machine plants it (with 6 s, one run's apply converged first); the hang ends the
    // stage 3 s after it, so the load is never waited out.
    let slow = good.clone().env("FAKE_SGLANG_LOAD_SECONDS", "30");
    let run = Reconcile::new().manifest("a.yaml", &slow).args(&[
        "apply",
        "--format",
        "json",
        "--command-timeout",
        "3s",
    ]);
    let child = run.spawn(&[]);
    // Armed, on the host in the same command, once the new server has started: its verification
    // is under way, so the next `systemctl show` is verification's, never the plan's. Read
    // through /usr/bin/systemctl, past the planted one; 60 s bounds an apply that never restarts.
    lab().wait_until(
        HANGS,
        &format!(
            "[ \"$(/usr/bin/systemctl show -p InvocationID --value {unit})\" != '{}' ] && touch /run/t-hang-show",
            running.trim()
        ),
        Duration::from_secs(60),
    );
    let ran = Ran::from(child.wait_with_output().unwrap());
    ran.assert_code(3);
    let report = &ran.json()["units"][0];
    let detail = report["detail"].as_str().unwrap();
    // The first `systemctl show` after the marker hangs: the crash poll's, or the one in the
    // liveness reading; either way the stage fails at the timeout, naming what hung.
    assert!(
        detail.contains("`systemctl show` on rl14 did not answer in 3s")
            || detail.contains("`the liveness reading (systemctl show, cgroup files, ss, journalctl)` on rl14 did not answer in 3s"),
        "{detail}"
    );
    assert_has(
        detail,
        "the previous unit was restored and passed verification",
    );
    assert_ne!(
        invocation(unit),
        running,
        "the previous unit runs again, restarted"
    );
    fresh(unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn an_unreadable_deployment_record_refuses_the_unit_and_restarts_nothing() {
    let _turn = turn();
    let unit = "t-hang-record.service";
    fresh(unit);
    let text = service("t-hang-record", 36003, "4,5");
    assert_eq!(apply(&text, &[]).code, 0);
    let running = invocation(unit);
    let record = format!("/var/lib/reconcile/{unit}/current.json");
    let good_record = lab().sh(HANGS, &format!("cat {record}"));
    for (what, bad) in [
        ("garbage", "}{ not json at all".to_string()),
        ("non-ASCII", "ünïcødé ✓ 記録 \u{1F600}".to_string()),
        (
            "a newer format",
            good_record.replacen("\"format\":1", "\"format\":99", 1),
        ),
    ] {
        lab().put(HANGS, &record, &bad);
        let ran = apply(&text, &[]);
        assert_eq!(ran.code, 1, "{what}: {}{}", ran.stdout, ran.stderr);
        let report = &ran.json()["units"][0];
        let detail = report["detail"].as_str().unwrap();
        assert!(
            detail.contains(&record),
            "{what}: the message names the file: {detail}"
        );
        if what == "a newer format" {
            assert_has(detail, "newer reconcile");
        }
        assert_eq!(
            invocation(unit),
            running,
            "{what}: the healthy server was not restarted"
        );
        let status = run_on(&text, &["status", "--format", "json"]);
        assert!(
            status.stdout.contains("record_unreadable"),
            "{what}: {}{}",
            status.stdout,
            status.stderr
        );
        assert!(!status.stderr.contains("panicked"), "{}", status.stderr);
    }
    fresh(unit);
}

/// Starts `run` (a slow apply of `unit`), sends `signal` once it is verifying, and returns its
/// report.
fn signalled(run: &Reconcile, unit: &str, signal: &str) -> (Ran, serde_json::Value) {
    crate::lab::signalled(
        run,
        (HANGS, unit),
        signal,
        Duration::from_secs(60),
        Duration::from_millis(500),
    )
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn sigterm_during_verification_rolls_back() {
    let _turn = turn();
    let unit = "t-hang-sigterm.service";
    fresh(unit);
    let good = service("t-hang-sigterm", 36004, "6,7");
    assert_eq!(apply(&good, &[]).code, 0);
    let good_text = lab().sh(HANGS, &format!("cat /etc/systemd/system/{unit}"));
    let slow = good.clone().env("FAKE_SGLANG_LOAD_SECONDS", "8");
    let run = Reconcile::new()
        .manifest("a.yaml", &slow)
        .args(&["apply", "--format", "json"]);
    let (ran, json) = signalled(&run, unit, "-TERM");
    ran.assert_code(3);
    let report = &json["units"][0];
    assert_eq!(report["outcome"], "rolled_back", "{report:#}");
    assert_field_has(report, "detail", "interrupted (SIGTERM)");
    assert_eq!(
        lab().sh(HANGS, &format!("cat /etc/systemd/system/{unit}")),
        good_text
    );
    fresh(unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn ctrl_c_with_two_units_on_one_host_leaves_the_second_untouched() {
    let _turn = turn();
    let (first, second) = ("t-hang-two-a.service", "t-hang-two-b.service");
    fresh(first);
    fresh(second);
    let a = service("t-hang-two-a", 36005, "8,9").env("FAKE_SGLANG_LOAD_SECONDS", "8");
    let b = service("t-hang-two-b", 36006, "10,11");
    let run = Reconcile::new()
        .manifest("a.yaml", &a)
        .manifest("b.yaml", &b)
        .args(&["apply", "--format", "json"]);
    let (_, json) = signalled(&run, first, "-INT");
    let outcome = |unit: &str| {
        json["units"]
            .as_array()
            .unwrap()
            .iter()
            .find(|u| u["unit"] == unit)
            .map(|u| (u["outcome"].clone(), u["detail"].clone()))
            .unwrap_or_else(|| panic!("no {unit} in {json:#}"))
    };
    assert_eq!(outcome(first).0, "rolled_back", "{json:#}");
    let (second_outcome, why) = outcome(second);
    assert_eq!(second_outcome, "not_started", "{json:#}");
    assert!(why.as_str().unwrap().contains("interrupted"), "{why}");
    let absent = lab().sh(
        HANGS,
        &format!("test -e /etc/systemd/system/{second} && echo present || echo absent"),
    );
    assert_eq!(
        absent.trim(),
        "absent",
        "the second unit was never installed"
    );
    fresh(first);
    fresh(second);
}
