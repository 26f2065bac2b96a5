//! `reconcile apply` against real hosts running the SGLang stand-in.

use crate::lab::{lab, manifest, Reconcile, APPLY};

/// A test service that loads in one second and is judged over a three-second crash window.
/// Each test has its own service and port on the shared apply host.
fn service(name: &str, port: u16, env: &str) -> String {
    format!(
        "{}verify: {{ crash_window: 3s }}\n",
        manifest(name, &[APPLY], "")
            .replace("port: 30000", &format!("port: {port}"))
            .replace(
                "NCCL_P2P_DISABLE: \"1\"",
                &format!("FAKE_SGLANG_LOAD_SECONDS: \"1\"{env}")
            )
    )
}

fn apply(text: &str) -> (i32, serde_json::Value) {
    let ran = Reconcile::new()
        .manifest("a.yaml", text)
        .args(&["apply", "--format", "json"])
        .run();
    let json = ran.json();
    (ran.code, json["units"][0].clone())
}

/// `InvocationID NRestarts ActiveState` of a unit.
fn identity(unit: &str) -> String {
    lab().sh(APPLY, &format!("systemctl show -p InvocationID -p NRestarts -p ActiveState --value {unit} | paste -sd' '"))
}

/// Removes what an earlier run of the same test left, so a rerun on the same hosts starts clean.
fn fresh(unit: &str) {
    lab().sh(
        APPLY,
        &format!("systemctl disable --now {unit} 2>/dev/null; rm -rf /etc/systemd/system/{unit} /var/lib/reconcile/{unit}; systemctl daemon-reload"),
    );
}

fn active(identity: &str) -> bool {
    identity.split_whitespace().any(|w| w == "active")
}

fn unit_file(unit: &str) -> Option<String> {
    let text = lab().sh(
        APPLY,
        &format!("cat /etc/systemd/system/{unit} 2>/dev/null || echo MISSING"),
    );
    (text.trim() != "MISSING").then_some(text)
}

#[test]
fn a_new_unit_starts_and_a_second_apply_restarts_nothing() {
    fresh("t-apply-new.service");
    let text = service("t-apply-new", 32001, "");
    let (code, unit) = apply(&text);
    assert_eq!(code, 0, "{unit}");
    assert_eq!(unit["outcome"], "converged");
    let first = identity("t-apply-new.service");
    assert!(active(&first), "{first}");
    let (code, unit) = apply(&text);
    assert_eq!(code, 0, "{unit}");
    assert_eq!(unit["outcome"], "unchanged");
    assert_eq!(
        identity("t-apply-new.service"),
        first,
        "InvocationID or NRestarts changed on a no-op apply"
    );
    lab().sh(APPLY, "systemctl disable --now t-apply-new.service");
}

#[test]
fn a_description_change_reloads_without_restarting() {
    fresh("t-apply-desc.service");
    let text = service("t-apply-desc", 32002, "");
    assert_eq!(apply(&text).0, 0);
    let before = identity("t-apply-desc.service");
    let (code, unit) =
        apply(&text.replace("description: test service", "description: renamed service"));
    assert_eq!(code, 0, "{unit}");
    assert_eq!(unit["outcome"], "reloaded");
    assert_eq!(identity("t-apply-desc.service"), before);
    assert!(unit_file("t-apply-desc.service")
        .unwrap()
        .contains("Description=renamed service"));
    lab().sh(APPLY, "systemctl disable --now t-apply-desc.service");
}

#[test]
fn a_crash_in_the_window_rolls_back_to_the_previous_unit_which_serves_again() {
    fresh("t-apply-crash.service");
    let good = service("t-apply-crash", 32003, "");
    assert_eq!(apply(&good).0, 0);
    let good_unit = unit_file("t-apply-crash.service").unwrap();
    let crashing = service(
        "t-apply-crash",
        32003,
        ", FAKE_SGLANG_FAIL: crash, FAKE_SGLANG_FAIL_AT: \"1\"",
    );
    let (code, unit) = apply(&crashing);
    assert_eq!(code, 3, "{unit}");
    assert_eq!(unit["outcome"], "rolled_back");
    let detail = unit["detail"].as_str().unwrap();
    assert!(detail.contains("verification failed: crashed"), "{detail}");
    assert!(
        detail.contains("previous unit was restored, restarted and passed the crash window"),
        "{detail}"
    );
    assert!(
        unit["journal"]
            .as_str()
            .unwrap()
            .contains("simulated crash"),
        "{unit}"
    );
    assert_eq!(unit_file("t-apply-crash.service").unwrap(), good_unit);
    assert!(active(&identity("t-apply-crash.service")));
    let generations = lab().sh(
        APPLY,
        "ls /var/lib/reconcile/t-apply-crash.service/generations | wc -l",
    );
    assert_eq!(
        generations.trim(),
        "1",
        "the unit replaced by the failed apply is kept"
    );
    lab().sh(APPLY, "systemctl disable --now t-apply-crash.service");
}

#[test]
fn an_unknown_flag_is_caught_at_once_and_a_failed_new_unit_is_removed() {
    fresh("t-apply-badflag.service");
    let text = service("t-apply-badflag", 32004, "")
        .replace("    tp-size: 2\n", "    tp-size: 2\n    no-such-flag: 1\n");
    let (code, unit) = apply(&text);
    assert_eq!(code, 3, "{unit}");
    assert_eq!(unit["outcome"], "rolled_back");
    assert!(
        unit["detail"]
            .as_str()
            .unwrap()
            .contains("new unit was stopped, disabled and removed"),
        "{unit}"
    );
    assert!(
        unit["journal"]
            .as_str()
            .unwrap()
            .contains("unrecognized arguments: --no-such-flag"),
        "{unit}"
    );
    assert!(
        unit["seconds"].as_f64().unwrap() < 3.0,
        "not caught inside the 3 s crash window: {unit}"
    );
    assert_eq!(unit_file("t-apply-badflag.service"), None);
}

#[test]
fn an_apply_is_refused_while_another_holds_the_lock() {
    fresh("t-apply-lock.service");
    let text = service("t-apply-lock", 32005, "");
    lab().sh(APPLY, "mkdir -p /var/lib/reconcile/t-apply-lock.service/lock && echo 'ci@builder pid 42' > /var/lib/reconcile/t-apply-lock.service/lock/owner");
    let (code, unit) = apply(&text);
    lab().sh(APPLY, "rm -rf /var/lib/reconcile/t-apply-lock.service/lock");
    assert_eq!(code, 1, "{unit}");
    assert_eq!(unit["outcome"], "error");
    assert!(
        unit["detail"]
            .as_str()
            .unwrap()
            .contains("locked by another apply (ci@builder pid 42)"),
        "{unit}"
    );
    assert_eq!(
        unit_file("t-apply-lock.service"),
        None,
        "a locked unit is not touched"
    );
}
