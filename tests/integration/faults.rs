//! Faults in the host under an apply: a read-only or full unit folder, a systemd that cannot
//! daemon-reload, and a previous unit that fails on rollback. Each leaves the host running its
//! previous unit (or says it needs attention), and the next apply converges. These break the host
//! they run on, so they have one of their own and take turns on it.

use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::lab::{
    apply_first_unit as apply, assert_has, lab, manifest, run_on, Manifest, Ran, Reconcile, Undo,
    REBOOT,
};

const HOST: &str = "rl11";

static TURN: Mutex<()> = Mutex::new(());

fn service(name: &str, port: u16, release: &str) -> Manifest {
    let m = manifest(name, &[HOST])
        .port(port)
        .without_env("NCCL_P2P_DISABLE")
        .env("FAKE_SGLANG_LOAD_SECONDS", "1")
        .env("RELEASE", release);
    // A long unit, so a full disk runs out while writing it.
    (0..40)
        .fold(m, |m, i| m.env(&format!("PAD_{i}"), "x".repeat(60)))
        .systemd("EnvironmentFile", "-/etc/t-fault.env")
        .verify_all(&[
            ("crash_window", "3s"),
            ("sample_interval", "500ms"),
            ("stall_timeout", "5s"),
            ("load_deadline", "20s"),
        ])
}

fn unit_text(unit: &str) -> String {
    lab().sh(HOST, &format!("cat /etc/systemd/system/{unit}"))
}

fn invocation(unit: &str) -> String {
    lab().sh(
        HOST,
        &format!("systemctl show -p InvocationID --value {unit}"),
    )
}

/// Release 1 converged on a clean host; returns its unit text.
fn start(unit: &str, name: &str, port: u16) -> String {
    lab().sh(HOST, &format!("systemctl disable --now {unit} 2>/dev/null; rm -rf /etc/systemd/system/{unit} /var/lib/reconcile/{unit} /etc/t-fault.env; systemctl daemon-reload"));
    let (code, report) = apply(&service(name, port, "1"));
    assert_eq!(code, 0, "{report:#}");
    unit_text(unit)
}

fn assert_untouched_then_recovers(unit: &str, name: &str, port: u16, v1: &str, running: &str) {
    assert_eq!(unit_text(unit), v1, "the previous unit is on disk");
    assert_eq!(
        invocation(unit),
        running,
        "the previous server was not restarted"
    );
    assert!(
        lab()
            .sh(
                HOST,
                "ls /etc/systemd/system | grep -c reconcile-tmp || true"
            )
            .trim()
            == "0"
    );
    let (code, report) = apply(&service(name, port, "2"));
    assert_eq!(code, 0, "the next apply converges: {report:#}");
    lab().sh(HOST, &format!("systemctl disable --now {unit}"));
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_read_only_unit_folder_changes_nothing() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let unit = "t-fault-ro.service";
    let v1 = start(unit, "t-fault-ro", 37001);
    let running = invocation(unit);
    let undo = Undo::new(HOST, "umount /etc/systemd/system");
    lab().sh(HOST, "mount --bind /etc/systemd/system /etc/systemd/system && mount -o remount,bind,ro /etc/systemd/system");
    let (code, report) = apply(&service("t-fault-ro", 37001, "2"));
    undo.undo();
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(report["outcome"], "error");
    let detail = report["detail"].as_str().unwrap();
    assert!(
        detail.contains("installing failed") && detail.contains("Read-only file system"),
        "{detail}"
    );
    assert_has(detail, "nothing changed on the host");
    assert_untouched_then_recovers(unit, "t-fault-ro", 37001, &v1, &running);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_full_unit_folder_changes_nothing() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let unit = "t-fault-full.service";
    let v1 = start(unit, "t-fault-full", 37002);
    let running = invocation(unit);
    // A small tmpfs holding a copy of the folder, filled up, over the folder.
    let undo = Undo::new(
        HOST,
        "umount /etc/systemd/system && systemctl daemon-reload",
    );
    lab().sh(HOST, "rm -rf /run/unit-copy && cp -a /etc/systemd/system /run/unit-copy && mount -t tmpfs -o size=1m tmpfs /etc/systemd/system && cp -a /run/unit-copy/. /etc/systemd/system/ && (head -c 2m /dev/zero > /etc/systemd/system/.filler 2>/dev/null; true)");
    let (code, report) = apply(&service("t-fault-full", 37002, "2"));
    let on_full_disk = unit_text(unit);
    undo.undo();
    assert_eq!(code, 1, "{report:#}");
    let detail = report["detail"].as_str().unwrap();
    assert_has(detail, "No space left on device");
    assert_eq!(
        on_full_disk, v1,
        "the full folder kept the previous unit whole"
    );
    assert_untouched_then_recovers(unit, "t-fault-full", 37002, &v1, &running);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_systemd_that_cannot_reload_gets_its_previous_unit_back_and_asks_for_attention() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let unit = "t-fault-reload.service";
    let v1 = start(unit, "t-fault-reload", 37003);
    let running = invocation(unit);
    // systemctl refuses daemon-reload while /run/fail-daemon-reload exists.
    let undo = Undo::new(
        HOST,
        "rm -f /run/fail-daemon-reload && mv /bin/systemctl.real /bin/systemctl",
    );
    lab().sh(HOST, "[ -e /bin/systemctl.real ] || cp -a /bin/systemctl /bin/systemctl.real; printf '#!/bin/sh\\nif [ \"$1\" = daemon-reload ] && [ -e /run/fail-daemon-reload ]; then echo \"Failed to reload daemon: Access denied\" >&2; exit 1; fi\\nexec /bin/systemctl.real \"$@\"\\n' > /bin/systemctl.wrap && chmod 755 /bin/systemctl.wrap && mv /bin/systemctl.wrap /bin/systemctl && touch /run/fail-daemon-reload");
    let (code, report) = apply(&service("t-fault-reload", 37003, "2"));
    let after = unit_text(unit);
    undo.undo();
    assert_eq!(code, 4, "{report:#}");
    assert_eq!(report["outcome"], "rollback_failed");
    let detail = report["detail"].as_str().unwrap();
    assert!(
        detail.contains("daemon-reload") && detail.contains("Access denied"),
        "{detail}"
    );
    assert_eq!(after, v1, "the previous unit file was put back");
    assert_untouched_then_recovers(unit, "t-fault-reload", 37003, &v1, &running);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_previous_unit_that_fails_on_rollback_is_reported_as_needing_attention() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let unit = "t-fault-both.service";
    start(unit, "t-fault-both", 37004);
    // From now on every start of this service crashes, the previous release's too.
    let undo = Undo::new(HOST, "rm -f /etc/t-fault.env");
    lab().sh(
        HOST,
        "printf 'FAKE_SGLANG_FAIL=crash\\nFAKE_SGLANG_FAIL_AT=1\\n' > /etc/t-fault.env",
    );
    let (code, report) = apply(&service("t-fault-both", 37004, "2"));
    undo.undo();
    assert_eq!(code, 4, "{report:#}");
    assert_eq!(report["outcome"], "rollback_failed");
    let detail = report["detail"].as_str().unwrap();
    assert_has(detail, "the restored previous unit failed too");
    assert_eq!(
        report["rollback"]["stages"]
            .as_array()
            .unwrap()
            .last()
            .unwrap()["passed"],
        false
    );
    let (code, report) = apply(&service("t-fault-both", 37004, "2"));
    assert_eq!(
        code, 0,
        "with the fault gone, the next apply converges: {report:#}"
    );
    lab().sh(HOST, &format!("systemctl disable --now {unit}"));
}

/// The reboot tests take turns on their host.
static REBOOT_TURN: Mutex<()> = Mutex::new(());

/// Release `n` of the reboot tests' service `name`, whose server takes `load` seconds to load.
fn reboot_release(name: &str, port: u16, n: &str, load: &str) -> Manifest {
    manifest(name, &[REBOOT])
        .port(port)
        .without_env("NCCL_P2P_DISABLE")
        .env("FAKE_SGLANG_LOAD_SECONDS", load)
        .env("RELEASE", n)
        .verify_all(&[
            ("crash_window", "3s"),
            ("sample_interval", "500ms"),
            ("stall_timeout", "10s"),
            ("load_deadline", "40s"),
        ])
}

/// The RELEASE the unit's running server was started with, or "" when none runs.
fn running_release(unit: &str) -> String {
    lab().sh(REBOOT, &format!("p=$(systemctl show -p MainPID --value {unit}); [ \"$p\" != 0 ] && [ \"$(systemctl is-active {unit})\" = active ] && tr '\\0' '\\n' < /proc/$p/environ | sed -n 's/^RELEASE=//p' || true")).trim().to_string()
}

/// The saved generations of a unit on the reboot host: `name sha256` lines, oldest first.
fn saved(unit: &str) -> Vec<String> {
    lab().sh(REBOOT, &format!("cd /var/lib/reconcile/{unit}/generations && for f in $(ls -1 | sort -n); do echo \"$f $(sha256sum < $f | cut -d' ' -f1)\"; done"))
        .lines()
        .map(str::to_string)
        .collect()
}

/// What the host held before the fault, and how the apply it hit ended.
struct Rebooted {
    /// The unit file the apply replaced.
    previous: String,
    /// Its generations before the apply.
    saved_before: Vec<String>,
    /// The release the apply installed.
    new: Manifest,
    ran: Ran,
    report: serde_json::Value,
}

/// Converges releases 0 and 1 of `name`, then applies release 2, whose server loads for 10 s,
/// and reboots the host for real one second into its verification; the host stays down `hold`
/// seconds. Returns once both the apply and the reboot are over.
fn reboot_during_verification(name: &str, port: u16, hold: u64) -> Rebooted {
    let unit = format!("{name}.service");
    lab().sh(REBOOT, &format!("systemctl disable --now {unit} 2>/dev/null; rm -rf /etc/systemd/system/{unit} /etc/systemd/system/{unit}.reconcile-tmp /var/lib/reconcile/{unit}; systemctl daemon-reload"));
    // Two releases, so there is a saved generation to find intact afterwards.
    for n in ["0", "1"] {
        let ran = Reconcile::new()
            .manifest("a.yaml", reboot_release(name, port, n, "1"))
            .args(&["apply", "--format", "json"])
            .run();
        assert_eq!(ran.code, 0, "{}", ran.stdout);
    }
    let previous = lab().sh(REBOOT, &format!("cat /etc/systemd/system/{unit}"));
    let saved_before = saved(&unit);
    let new = reboot_release(name, port, "2", "10");
    // Held until the run ends: its folder holds the manifest.
    let run = Reconcile::new()
        .manifest("a.yaml", &new)
        .args(&["apply", "--format", "json"]);
    let mut child = run.spawn(&[]);
    let waiting = Instant::now();
    // Polled; 30 s bounds an apply that never starts the new server (it does in a few seconds).
    while running_release(&unit) != "2" {
        if child.try_wait().unwrap().is_some() || waiting.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            let ran = Ran::from(child.wait_with_output().unwrap());
            panic!(
                "the new server never started:\n{}{}",
                ran.stdout, ran.stderr
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // Inside the crash window of the new server's verification. An input of the fault, not a wait:
    // the reboot comes a second into a verification that lasts the 10 s load at least.
    std::thread::sleep(Duration::from_secs(1));
    let reboot = std::thread::spawn(move || {
        Command::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/hostlab/reboot.sh"
        ))
        .arg(REBOOT)
        .env("STATE", lab().file(""))
        .env("HOLD", hold.to_string())
        .output()
        .expect("reboot.sh runs")
    });
    let ran = Ran::from(child.wait_with_output().expect("reconcile finishes"));
    let rebooted = reboot.join().unwrap();
    assert!(
        rebooted.status.success(),
        "reboot.sh: {}",
        String::from_utf8_lossy(&rebooted.stderr)
    );
    eprintln!("{}", String::from_utf8_lossy(&rebooted.stdout).trim());
    let report = ran.json()["units"][0].clone();
    eprintln!(
        "apply during the reboot: exit {} after {:.1}s: {}",
        ran.code,
        report["seconds"].as_f64().unwrap_or(0.0),
        report["detail"]
    );
    Rebooted {
        previous,
        saved_before,
        new,
        ran,
        report,
    }
}

/// After the fault: the generations kept before are untouched, and the one the apply kept is the
/// previous unit, whole; no temporary file is left; the next apply converges on the new release.
/// Returns that apply's report.
fn assert_intact_then_converges(unit: &str, r: &Rebooted) -> serde_json::Value {
    let saved_after = saved(unit);
    assert_eq!(
        saved_after.len(),
        r.saved_before.len() + 1,
        "{saved_after:?}"
    );
    assert_eq!(saved_after[..r.saved_before.len()], r.saved_before[..]);
    let newest = lab().sh(
        REBOOT,
        &format!("cd /var/lib/reconcile/{unit}/generations && cat $(ls -1 | sort -n | tail -1)"),
    );
    assert_eq!(
        newest, r.previous,
        "the generation this apply kept is the previous unit, whole"
    );
    // The host's guard may be writing the previous unit back as the host answers after its
    // boot (its temporary file lives for the moment of a write): one left stays.
    lab().wait_until(
        REBOOT,
        &format!("[ \"$(ls -a /etc/systemd/system /var/lib/reconcile/{unit}/generations | grep -c reconcile-tmp)\" = 0 ]"),
        Duration::from_secs(30),
    );
    // A host back from its reboot may have its guard restoring the previous unit (it judged the
    // new one failed at boot); the next apply refuses to overwrite a guard at that work until it
    // is done, as it must (a guard still armed by the dead run, it takes over). The restore is
    // bounded by the manifest's verification (crash window 3 s, load deadline 40 s) and a
    // margin: 3x that.
    crate::guard::until(
        Duration::from_secs(3 * 50),
        "the host's guard done restoring after the reboot",
        || crate::guard::guard_state_on(REBOOT, unit) != "rolling_back",
    );
    let ran = run_on(&r.new, &["apply", "--format", "json"]);
    assert_eq!(ran.code, 0, "the next apply converges: {}", ran.stdout);
    let report = ran.json()["units"][0].clone();
    eprintln!("the next apply: {} {}", report["detail"], report["notes"]);
    assert_eq!(running_release(unit), "2");
    lab().sh(REBOOT, &format!("systemctl disable --now {unit}"));
    report
}

/// The host reboots for real (its container goes down and boots again, tests/hostlab/reboot.sh)
/// while the new unit is being verified: reconcile waits for it to come back, puts the previous
/// unit back and verifies it. The generations are whole, nothing temporary or locked is left,
/// and the next apply converges.
#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_host_rebooted_during_verification_gets_its_previous_unit_back() {
    let _turn = REBOOT_TURN.lock().unwrap_or_else(|e| e.into_inner());
    let unit = "t-reboot-verify.service";
    let r = reboot_during_verification("t-reboot-verify", 37101, 0);
    // Verification never finished, so the host runs the previous unit again, verified.
    assert_eq!(r.ran.code, 3, "{:#}\n{}", r.report, r.ran.stderr);
    assert_eq!(r.report["outcome"], "rolled_back");
    let detail = r.report["detail"].as_str().unwrap();
    // Who puts it back is a race the guard exists for: reconcile, once the host answers again,
    // or the host's guard, which saw the controller's verification fail first (one CI run under
    // load); either way the previous unit is verified serving.
    assert!(
        detail.contains("the connection to the host was lost, reconnected after")
            && (detail.contains("the previous unit was restored and passed verification")
                || detail.contains("the host's guard rolled back to the previous unit")
                    && detail.contains("the previous unit runs again and answers /health 200")),
        "{detail}"
    );
    assert_eq!(
        lab().sh(REBOOT, &format!("cat /etc/systemd/system/{unit}")),
        r.previous
    );
    assert_eq!(running_release(unit), "1", "the previous server runs");
    let lock = lab().sh(
        REBOOT,
        &format!("ls -a /var/lib/reconcile/{unit} | grep -c '^lock$' || true"),
    );
    assert_eq!(lock.trim(), "0", "the lock was released");
    assert_intact_then_converges(unit, &r);
}

/// The host goes down during verification and stays down longer than reconcile waits for it:
/// the apply ends saying the host needs attention, what is on it and what the next apply does;
/// once the host is back, that next apply converges.
#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_host_down_past_the_wait_during_verification_is_reported_as_needing_attention() {
    let _turn = REBOOT_TURN.lock().unwrap_or_else(|e| e.into_inner());
    let unit = "t-reboot-down.service";
    // reconcile waits the crash window (3 s) and another 60 s.
    let r = reboot_during_verification("t-reboot-down", 37102, 75);
    assert_eq!(r.ran.code, 4, "{:#}\n{}", r.report, r.ran.stderr);
    assert_eq!(r.report["outcome"], "rollback_failed");
    let detail = r.report["detail"].as_str().unwrap();
    let generation = format!("/var/lib/reconcile/{unit}/generations/");
    assert!(
        detail.starts_with("host needs attention: ")
            && detail.contains(
                "the connection to the host was lost and it did not come back within 63s"
            )
            && detail.contains(&format!("the previous is kept as generation {generation}"))
            && detail.contains("the next apply will finish or roll back"),
        "{detail}"
    );
    let seconds = r.report["seconds"].as_f64().unwrap();
    assert!((60.0..75.0).contains(&seconds), "gave up after {seconds}s");
    // The generation the message names holds the previous unit.
    let named = detail.split(&generation).nth(1).unwrap();
    let named = &named[..named.find(';').unwrap()];
    assert_eq!(
        lab().sh(REBOOT, &format!("cat {generation}{named}")),
        r.previous
    );
    let on_disk = lab().sh(REBOOT, &format!("cat /etc/systemd/system/{unit}"));
    let new = Reconcile::new().manifest("a.yaml", &r.new).rendered(REBOOT);
    assert!(
        on_disk == new || on_disk == r.previous,
        "a whole unit is on disk"
    );
    let lock = lab().sh(
        REBOOT,
        &format!("ls -a /var/lib/reconcile/{unit} | grep -c '^lock$' || true"),
    );
    assert_eq!(lock.trim(), "1", "the lock stays, as the message says");
    let next = assert_intact_then_converges(unit, &r);
    let notes = next["notes"].to_string();
    assert_has(&notes, "broke a stale lock");
}
