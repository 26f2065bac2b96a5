//! `reconcile status`, `history` and `rollback` against a real host: each drift is produced for real
//! (hand edits, missing reloads and restarts, a stopped service, a unit reconcile never applied),
//! and a rollback goes through apply's verification.
//!
//! The shared host runs other tests' `t-*` units, so these use `t-st-*` names, ports from 35000 and
//! GPU pairs of their own among the stand-in's 64.

use crate::builder::STAND_IN_VERIFY;
use crate::lab::{
    assert_has, classes_of, lab, manifest, stand_in, Manifest, Ran, Reconcile, SHARED,
};

const HOST: &str = SHARED;

/// A service that loads in one second and is verified in seconds (as in `apply.rs`).
fn service(name: &str, port: u16, gpus: &str) -> Manifest {
    stand_in(name, &[HOST], port, gpus)
        .env("FAKE_SGLANG_GPU_COUNT", "64")
        .env("FAKE_SGLANG_LOAD_SECONDS", "1")
        .verify_all(&STAND_IN_VERIFY)
}

/// Removes what an earlier run of the same test left.
fn fresh(unit: &str) {
    lab().sh(
        HOST,
        &format!("systemctl disable --now {unit} 2>/dev/null; rm -rf /etc/systemd/system/{unit} /var/lib/reconcile/{unit}; systemctl daemon-reload; systemctl reset-failed {unit} 2>/dev/null; true"),
    );
}

fn run(text: &Manifest, args: &[&str]) -> Ran {
    Reconcile::new().manifest("a.yaml", text).args(args).run()
}

fn apply(text: &Manifest) {
    let ran = run(text, &["apply", "--format", "json"]);
    ran.assert_code(0);
}

/// The classes `status` gives the only unit of `text`, and its exit code.
fn classes(text: &Manifest) -> (Vec<String>, i32, serde_json::Value) {
    let ran = run(text, &["status", "--format", "json"]);
    let json = ran.json();
    let unit = json["units"][0].clone();
    (classes_of(&unit), ran.code, unit)
}

fn unit_file(unit: &str) -> String {
    lab().sh(HOST, &format!("cat /etc/systemd/system/{unit}"))
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn status_follows_a_hand_edit_through_reload_and_restart() {
    let unit = "t-st-edit.service";
    fresh(unit);
    let text = service("t-st-edit", 35001, "10,11");
    apply(&text);
    let (c, code, json) = classes(&text);
    assert_eq!((c, code), (vec!["in_sync".to_string()], 0), "{json:#}");
    assert_eq!(json["systemd"]["active_state"], "active");
    assert_eq!(json["served_models"], serde_json::json!(["test-model"]));
    assert!(json["applied_at"].is_string());

    // The manifest moved on; the host did not.
    let changed = text.clone().description("renamed t-st-edit");
    let (c, code, _) = classes(&changed);
    assert_eq!((c, code), (vec!["pending_change".to_string()], 2));

    // A hand edit of the command line, written without daemon-reload. Other tests share the host
    // and any daemon-reload of theirs loads this file too, so the edit is redone (a comment line
    // more, a newer mtime) until a status sees it unloaded.
    lab().sh(
        HOST,
        &format!(
            "sed -i 's/--context-length 8192/--context-length 4096/' /etc/systemd/system/{unit}"
        ),
    );
    let mut seen = None;
    for attempt in 0..5 {
        lab().sh(
            HOST,
            &format!("echo '# hand edit {attempt}' >> /etc/systemd/system/{unit}"),
        );
        let (c, code, json) = classes(&text);
        if c.iter().any(|c| c == "not_reloaded") {
            seen = Some((c, code, json));
            break;
        }
        assert_eq!(c, ["edited_on_host", "not_restarted"], "{json:#}");
    }
    let (c, code, json) = seen.expect("a status between the edit and someone's daemon-reload");
    assert_eq!(
        c,
        ["edited_on_host", "not_reloaded", "not_restarted"],
        "{json:#}"
    );
    assert_eq!(code, 2);
    let details = json["details"].to_string();
    assert_has(&details, "~ context-length 8192 -> 4096");

    // Reloaded, but the server still runs the old command line.
    lab().sh(HOST, "systemctl daemon-reload");
    let (c, _, json) = classes(&text);
    assert_eq!(c, ["edited_on_host", "not_restarted"], "{json:#}");

    // Restarted: it runs the edited unit, which is still not the one applied.
    lab().sh(HOST, &format!("systemctl restart {unit}"));
    let (c, _, json) = classes(&text);
    assert_eq!(c, ["edited_on_host"], "{json:#}");

    // An apply puts the manifest's unit back: in sync again.
    apply(&text);
    let (c, code, _) = classes(&text);
    assert_eq!((c, code), (vec!["in_sync".to_string()], 0));
    lab().sh(HOST, &format!("systemctl disable --now {unit}"));
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_reload_without_restart_is_not_restarted_and_a_stopped_service_is_down() {
    let unit = "t-st-down.service";
    fresh(unit);
    let text = service("t-st-down", 35002, "12,13");
    apply(&text);
    // An env change, loaded by systemd but never restarted into.
    lab().sh(
        HOST,
        &format!("sed -i 's/FAKE_SGLANG_LOAD_SECONDS=1/FAKE_SGLANG_LOAD_SECONDS=2/' /etc/systemd/system/{unit} && systemctl daemon-reload"),
    );
    let (c, _, json) = classes(&text);
    assert_eq!(c, ["edited_on_host", "not_restarted"], "{json:#}");
    assert!(
        json["details"]
            .to_string()
            .contains("env FAKE_SGLANG_LOAD_SECONDS differs"),
        "{json:#}"
    );
    apply(&text);
    lab().sh(HOST, &format!("systemctl stop {unit}"));
    let (c, code, json) = classes(&text);
    assert_eq!((c, code), (vec!["down".to_string()], 2), "{json:#}");
    assert!(
        // The rendered unit's stop is graceful (KillMode=mixed): SIGTERM to SGLang's main
        // process alone, which exits 0 once idle, so a stopped server's unit ends inactive.
        json["details"].to_string().contains("inactive (dead)"),
        "{json:#}\n{}",
        lab().sh(HOST, &format!("journalctl -u {unit} -n 40 --no-pager"))
    );
    lab().sh(HOST, &format!("systemctl disable {unit}"));
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_unit_reconcile_never_applied_is_unmanaged_and_a_missing_one_absent() {
    let managed_by_hand = "t-st-hand.service";
    let missing = "t-st-absent.service";
    fresh(managed_by_hand);
    fresh(missing);
    let hand = service("t-st-hand", 35003, "14,15");
    let absent = service("t-st-absent", 35004, "16,17");
    // Installed by hand, the very unit the manifest renders, but never applied.
    let rendered = Reconcile::new().manifest("hand.yaml", &hand).rendered(HOST);
    lab().put(
        HOST,
        &format!("/etc/systemd/system/{managed_by_hand}"),
        &rendered,
    );
    lab().sh(
        HOST,
        // Enabled, as an operator's unit is: a disabled one is a finding of its own.
        &format!("systemctl daemon-reload && systemctl enable --now {managed_by_hand}"),
    );
    let ran = Reconcile::new()
        .manifest("hand.yaml", &hand)
        .manifest("absent.yaml", &absent)
        .args(&["status", "--format", "json"])
        .run();
    ran.assert_code(2);
    let json = ran.json();
    let of = |unit: &str| -> serde_json::Value {
        json["units"]
            .as_array()
            .unwrap()
            .iter()
            .find(|u| u["unit"] == unit)
            .unwrap()["classes"]
            .clone()
    };
    assert_eq!(
        of(managed_by_hand),
        serde_json::json!(["unmanaged"]),
        "{json:#}"
    );
    assert_eq!(
        of(missing),
        serde_json::json!(["pending_change", "absent"]),
        "{json:#}"
    );
    assert_eq!(json["tally"]["unmanaged"], 1);
    lab().sh(
        HOST,
        &format!("systemctl disable --now {managed_by_hand}; rm -f /etc/systemd/system/{managed_by_hand}; systemctl daemon-reload"),
    );
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn status_of_an_unreachable_host_is_an_error() {
    let text = manifest("t-st-unreach", &[crate::lab::UNREACHABLE]);
    let ran = run(&text, &["status"]);
    ran.assert_code(1);
    assert_has(&ran.stdout, "error: cannot connect");
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn history_numbers_three_applies_and_rollback_restores_the_first_verified() {
    let unit = "t-st-hist.service";
    fresh(unit);
    let v1 = service("t-st-hist", 35005, "18,19");
    let v2 = v1.clone().flag("context-length", 4096);
    let v3 = v2.clone().description("renamed service t-st-hist");
    apply(&v1);
    let first = unit_file(unit);
    apply(&v2);
    apply(&v3);

    let ran = run(&v3, &["history", "t-st-hist", "--format", "json"]);
    ran.assert_code(0);
    let json = ran.json();
    let host = &json["hosts"][0];
    let deployments = host["deployments"].as_array().unwrap();
    assert_eq!(deployments.len(), 3, "{host:#}");
    let current: Vec<bool> = deployments
        .iter()
        .map(|d| d["current"].as_bool().unwrap())
        .collect();
    assert_eq!(current, [false, false, true]);
    let outcomes: Vec<&str> = deployments
        .iter()
        .map(|d| d["record"]["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(outcomes, ["converged", "converged", "reloaded"]);
    assert!(deployments.iter().all(|d| d["kept"] == true));
    // The generations are the units apply 2 and 3 replaced: deployments 1 and 2.
    let generations: Vec<serde_json::Value> = host["generations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["deployment"].clone())
        .collect();
    assert_eq!(generations, [serde_json::json!(1), serde_json::json!(2)]);
    assert_eq!(
        lab().sh(
            HOST,
            &format!("cat /var/lib/reconcile/{unit}/deployed/1.service")
        ),
        first
    );
    let modes = lab().sh(
        HOST,
        &format!("stat -c '%a' /var/lib/reconcile/{unit}/deployed /var/lib/reconcile/{unit}/deployed/1.service"),
    );
    assert_eq!(modes, "700\n600\n");
    let text = run(&v3, &["history", "t-st-hist"]).stdout;
    assert_has(&text, "3 deployments, current: 3");
    assert!(text.lines().any(|l| l.starts_with("   *   3 ")), "{text}");

    // A deployment that does not exist is refused, naming those that do.
    let ran = run(&v3, &["rollback", "t-st-hist", "--to", "9"]);
    ran.assert_code(1);
    assert_has(
        &ran.stdout,
        "there is no deployment 9 (3 recorded; kept: 1, 2, 3)",
    );

    let ran = run(
        &v3,
        &["rollback", "t-st-hist", "--to", "1", "--format", "json"],
    );
    ran.assert_code(0);
    let report = &ran.json()["units"][0];
    assert_eq!(report["outcome"], "converged", "{report:#}");
    assert_eq!(report["verdict"], "restart");
    let stages: Vec<&str> = report["verification"]["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert!(
        stages.contains(&"crash window") && stages.contains(&"identity"),
        "{stages:?}"
    );
    assert_eq!(unit_file(unit), first);
    assert_eq!(
        lab()
            .sh(HOST, &format!("systemctl is-active {unit}"))
            .trim(),
        "active"
    );
    // The rollback is a deployment of its own, pointing at the one it restored.
    let json = run(&v3, &["history", "t-st-hist", "--format", "json"]).json();
    let deployments = json["hosts"][0]["deployments"].as_array().unwrap().clone();
    assert_eq!(deployments.len(), 4);
    assert_eq!(deployments[3]["record"]["restored_from"], 1);
    assert_eq!(deployments[3]["current"], true);
    // Status against the first manifest: in sync again.
    let (c, _, json) = classes(&v1);
    assert_eq!(c, ["in_sync"], "{json:#}");
    lab().sh(HOST, &format!("systemctl disable --now {unit}"));
}
