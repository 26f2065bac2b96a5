//! Faults in the host under an apply: a read-only or full unit folder, a systemd that cannot
//! daemon-reload, and a previous unit that fails on rollback. Each leaves the host running its
//! previous unit (or says it needs attention), and the next apply converges. These break the host
//! they run on, so they have one of their own and take turns on it.

use std::sync::Mutex;

use crate::lab::{lab, manifest, Reconcile};

const HOST: &str = "rl11";

static TURN: Mutex<()> = Mutex::new(());

fn service(name: &str, port: u16, release: &str) -> String {
    // A long unit, so a full disk runs out while writing it.
    let padding: String = (0..40)
        .map(|i| format!(", PAD_{i}: \"{}\"", "x".repeat(60)))
        .collect();
    format!(
        "{}verify: {{ crash_window: 3s, sample_interval: 500ms, stall_timeout: 5s, load_deadline: 20s }}\n",
        manifest(name, &[HOST], "")
            .replace("port: 30000", &format!("port: {port}"))
            .replace("NCCL_P2P_DISABLE: \"1\"", &format!("FAKE_SGLANG_LOAD_SECONDS: \"1\", RELEASE: \"{release}\"{padding}"))
            .replace("systemd: { Restart: on-failure, RestartSec: 1 }", "systemd: { Restart: on-failure, RestartSec: 1, EnvironmentFile: -/etc/t-fault.env }")
    )
}

fn apply(text: &str) -> (i32, serde_json::Value) {
    let ran = Reconcile::new()
        .manifest("a.yaml", text)
        .args(&["apply", "--format", "json"])
        .run();
    (ran.code, ran.json()["units"][0].clone())
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
fn a_read_only_unit_folder_changes_nothing() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let unit = "t-fault-ro.service";
    let v1 = start(unit, "t-fault-ro", 37001);
    let running = invocation(unit);
    lab().sh(HOST, "mount --bind /etc/systemd/system /etc/systemd/system && mount -o remount,bind,ro /etc/systemd/system");
    let (code, report) = apply(&service("t-fault-ro", 37001, "2"));
    lab().sh(HOST, "umount /etc/systemd/system");
    assert_eq!(code, 1, "{report:#}");
    assert_eq!(report["outcome"], "error");
    let detail = report["detail"].as_str().unwrap();
    assert!(
        detail.contains("installing failed") && detail.contains("Read-only file system"),
        "{detail}"
    );
    assert!(detail.contains("nothing changed on the host"), "{detail}");
    assert_untouched_then_recovers(unit, "t-fault-ro", 37001, &v1, &running);
}

#[test]
fn a_full_unit_folder_changes_nothing() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let unit = "t-fault-full.service";
    let v1 = start(unit, "t-fault-full", 37002);
    let running = invocation(unit);
    // A small tmpfs holding a copy of the folder, filled up, over the folder.
    lab().sh(HOST, "rm -rf /run/unit-copy && cp -a /etc/systemd/system /run/unit-copy && mount -t tmpfs -o size=1m tmpfs /etc/systemd/system && cp -a /run/unit-copy/. /etc/systemd/system/ && (head -c 2m /dev/zero > /etc/systemd/system/.filler 2>/dev/null; true)");
    let (code, report) = apply(&service("t-fault-full", 37002, "2"));
    let on_full_disk = unit_text(unit);
    lab().sh(
        HOST,
        "umount /etc/systemd/system && systemctl daemon-reload",
    );
    assert_eq!(code, 1, "{report:#}");
    let detail = report["detail"].as_str().unwrap();
    assert!(detail.contains("No space left on device"), "{detail}");
    assert_eq!(
        on_full_disk, v1,
        "the full folder kept the previous unit whole"
    );
    assert_untouched_then_recovers(unit, "t-fault-full", 37002, &v1, &running);
}

#[test]
fn a_systemd_that_cannot_reload_gets_its_previous_unit_back_and_asks_for_attention() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let unit = "t-fault-reload.service";
    let v1 = start(unit, "t-fault-reload", 37003);
    let running = invocation(unit);
    // systemctl refuses daemon-reload while /run/fail-daemon-reload exists.
    lab().sh(HOST, "[ -e /bin/systemctl.real ] || cp -a /bin/systemctl /bin/systemctl.real; printf '#!/bin/sh\\nif [ \"$1\" = daemon-reload ] && [ -e /run/fail-daemon-reload ]; then echo \"Failed to reload daemon: Access denied\" >&2; exit 1; fi\\nexec /bin/systemctl.real \"$@\"\\n' > /bin/systemctl.wrap && chmod 755 /bin/systemctl.wrap && mv /bin/systemctl.wrap /bin/systemctl && touch /run/fail-daemon-reload");
    let (code, report) = apply(&service("t-fault-reload", 37003, "2"));
    let after = unit_text(unit);
    lab().sh(
        HOST,
        "rm -f /run/fail-daemon-reload && mv /bin/systemctl.real /bin/systemctl",
    );
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
fn a_previous_unit_that_fails_on_rollback_is_reported_as_needing_attention() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let unit = "t-fault-both.service";
    start(unit, "t-fault-both", 37004);
    // From now on every start of this service crashes, the previous release's too.
    lab().sh(
        HOST,
        "printf 'FAKE_SGLANG_FAIL=crash\\nFAKE_SGLANG_FAIL_AT=1\\n' > /etc/t-fault.env",
    );
    let (code, report) = apply(&service("t-fault-both", 37004, "2"));
    lab().sh(HOST, "rm -f /etc/t-fault.env");
    assert_eq!(code, 4, "{report:#}");
    assert_eq!(report["outcome"], "rollback_failed");
    let detail = report["detail"].as_str().unwrap();
    assert!(
        detail.contains("the restored previous unit failed too"),
        "{detail}"
    );
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
