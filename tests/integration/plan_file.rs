//! Plan files: `reconcile plan --out plan.json`, then `reconcile apply plan.json` applies exactly
//! what was planned, or refuses a unit whose manifests, unit file or SGLang changed since. Units
//! here are `t-planfile-*` on the apply host, ports and GPUs from `lab::PLAN_FILE`.

use sha2::{Digest, Sha256};

use crate::builder::STAND_IN_VERIFY;
use crate::lab::{
    assert_has, lab, manifest, run_on, venv_script, Manifest, Ran, Reconcile, APPLY, PLAN_FILE,
    SHARED,
};

/// A service that loads in a second and is judged over a three-second crash window, on its own
/// port and its own two of the stand-in's 64 simulated GPUs (the lease's, two a port; the tests
/// past the third port start no server and share the last two).
fn service(name: &str, hosts: &[&str], port: u16) -> Manifest {
    manifest(name, hosts)
        .port(port)
        .without_env("NCCL_P2P_DISABLE")
        .env("CUDA_VISIBLE_DEVICES", PLAN_FILE.gpu_pair(port.min(39103)))
        .env("FAKE_SGLANG_GPU_COUNT", "64")
        .env("FAKE_SGLANG_LOAD_SECONDS", "1")
        .verify_all(&STAND_IN_VERIFY)
}

/// Removes what an earlier run of the same test left on a host.
fn fresh(host: &str, unit: &str) {
    lab().sh(
        host,
        &format!("systemctl disable --now {unit} 2>/dev/null; rm -rf /etc/systemd/system/{unit} /var/lib/reconcile/{unit}; systemctl daemon-reload"),
    );
}

fn unit_file(host: &str, unit: &str) -> Option<String> {
    let text = lab().sh(
        host,
        &format!("cat /etc/systemd/system/{unit} 2>/dev/null || echo MISSING"),
    );
    (text.trim() != "MISSING").then_some(text)
}

fn sha256(text: &str) -> String {
    format!("{:x}", Sha256::digest(text.as_bytes()))
}

fn plan_file(run: &Reconcile) -> (String, serde_json::Value) {
    let text = std::fs::read_to_string(run.dir().join("plan.json")).expect("plan.json written");
    let json = serde_json::from_str(&text).expect("plan.json is JSON");
    (text, json)
}

fn unit_report(ran: &Ran) -> serde_json::Value {
    let json = ran.json();
    assert_eq!(json["units"].as_array().unwrap().len(), 1, "{json}");
    json["units"][0].clone()
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_plan_file_is_applied_exactly_and_leaves_unplanned_hosts_alone() {
    let unit = "t-planfile-exact.service";
    fresh(APPLY, unit);
    fresh(SHARED, unit);
    let run = Reconcile::new().manifest(
        "a.yaml",
        service("t-planfile-exact", &[APPLY, SHARED], 39101),
    );
    let planned = run.run_args(&["plan", "--host", APPLY, "--out", "plan.json"]);
    planned.assert_code(2);
    let (_, plan) = plan_file(&run);
    assert_eq!(plan["format"], "reconcile-plan");
    assert_eq!(plan["manifests"], serde_json::json!(["manifests"]));
    let targets = plan["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 1, "{plan}");
    let target = &targets[0];
    assert_eq!(
        (&target["host"], &target["unit"], &target["source"]),
        (
            &serde_json::json!(APPLY),
            &serde_json::json!(unit),
            &serde_json::json!("manifests/a.yaml")
        )
    );
    assert_eq!(target["status"], "planned");
    assert_eq!(target["verdict"], "install");
    assert!(target["current_sha256"].is_null(), "{target}");
    assert_eq!(target["sglang_version"], "0.5.23");

    let applied = run.run_args(&["apply", "plan.json", "--format", "json"]);
    applied.assert_code(0);
    let report = unit_report(&applied);
    assert_eq!(
        (&report["host"], &report["outcome"]),
        (&serde_json::json!(APPLY), &serde_json::json!("converged")),
        "{report}"
    );
    let desired = target["desired_sha256"].as_str().unwrap();
    let on_host = unit_file(APPLY, unit).expect("the planned unit is installed");
    assert_eq!(sha256(&on_host), desired);
    let record: serde_json::Value = serde_json::from_str(&lab().sh(
        APPLY,
        &format!("cat /var/lib/reconcile/{unit}/current.json"),
    ))
    .unwrap();
    assert_eq!(record["unit_sha256"], desired, "{record}");
    assert_eq!(
        unit_file(SHARED, unit),
        None,
        "a host in the manifests but not in the plan was touched"
    );
    lab().sh(APPLY, &format!("systemctl disable --now {unit}"));
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_plan_made_stale_by_a_hand_edit_on_the_host_is_refused() {
    let unit = "t-planfile-edited.service";
    fresh(APPLY, unit);
    let text = service("t-planfile-edited", &[APPLY], 39102);
    let installed = run_on(&text, &["apply"]);
    installed.assert_code(0);
    let run = Reconcile::new().manifest("a.yaml", text.clone().flag("context-length", 4096));
    let planned = run.run_args(&["plan", "--out", "plan.json"]);
    planned.assert_code(2);
    let (_, plan) = plan_file(&run);
    assert_eq!(plan["targets"][0]["verdict"], "restart");
    let before = unit_file(APPLY, unit).unwrap();
    assert_eq!(plan["targets"][0]["current_sha256"], sha256(&before));

    lab().sh(
        APPLY,
        &format!(
            "sed -i 's/^Description=.*/Description=edited by hand/' /etc/systemd/system/{unit}"
        ),
    );
    let edited = unit_file(APPLY, unit).unwrap();
    let applied = run.run_args(&["apply", "plan.json", "--format", "json"]);
    applied.assert_code(1);
    let report = unit_report(&applied);
    assert_eq!(report["outcome"], "error", "{report}");
    let expected = format!(
        "stale plan: the unit on {APPLY} changed since the plan ({} -> {}); plan again",
        &sha256(&before)[..8],
        &sha256(&edited)[..8]
    );
    let detail = report["detail"].as_str().unwrap();
    assert_has(detail, &expected);
    assert_eq!(
        unit_file(APPLY, unit).unwrap(),
        edited,
        "the edited unit was replaced"
    );
    let lock = lab().sh(APPLY, &format!("ls /var/lib/reconcile/{unit}/"));
    // The apply lock is the folder `lock`; the guard's `guard.lock` is another file.
    assert!(
        !lock.lines().any(|l| l == "lock"),
        "the refusal left the lock: {lock}"
    );
    lab().sh(APPLY, &format!("systemctl disable --now {unit}"));
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn manifests_edited_after_the_plan_are_refused() {
    let unit = "t-planfile-moved.service";
    fresh(APPLY, unit);
    let text = service("t-planfile-moved", &[APPLY], 39103);
    let run = Reconcile::new().manifest("a.yaml", &text);
    let planned = run.run_args(&["plan", "--out", "plan.json"]);
    planned.assert_code(2);
    std::fs::write(
        run.dir().join("manifests/a.yaml"),
        text.clone().flag("context-length", 4096).to_yaml(),
    )
    .unwrap();
    let applied = run.run_args(&["apply", "plan.json", "--format", "json"]);
    applied.assert_code(1);
    let report = unit_report(&applied);
    assert_eq!(report["outcome"], "error", "{report}");
    let detail = report["detail"].as_str().unwrap();
    assert_has(detail, "the manifests changed since the plan was made");
    assert_eq!(unit_file(APPLY, unit), None, "the host was touched");
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn another_sglang_since_the_plan_is_refused() {
    let unit = "t-planfile-sglang.service";
    fresh(APPLY, unit);
    // A Python of its own whose SGLang version the test changes, as an upgrade by hand would.
    let python = "/opt/t-planfile-py/bin/python3";
    let install =
        |version: &str| lab().sh(APPLY, &venv_script("/opt/t-planfile-py", Some(version)));
    // Planned while the host lags the manifest (preflight says so, exit 1); the host is upgraded
    // after the review, so preflight would pass now, but what runs is not what was reviewed.
    install("0.5.23");
    let text = service("t-planfile-sglang", &[APPLY], 39104)
        .python(python)
        .version("0.5.9");
    let run = Reconcile::new().manifest("a.yaml", &text);
    let planned = run.run_args(&["plan", "--out", "plan.json"]);
    planned.assert_code(1);
    let (_, plan) = plan_file(&run);
    assert_eq!(plan["targets"][0]["status"], "planned", "{plan}");
    assert_eq!(plan["targets"][0]["sglang_version"], "0.5.23");
    install("0.5.9");
    let applied = run.run_args(&["apply", "plan.json", "--format", "json"]);
    applied.assert_code(1);
    let report = unit_report(&applied);
    assert_eq!(report["outcome"], "error", "{report}");
    let detail = report["detail"].as_str().unwrap();
    assert_has(
        detail,
        &format!("stale plan: SGLang on {APPLY} was 0.5.23 when planned, is 0.5.9 now; plan again"),
    );
    assert_eq!(unit_file(APPLY, unit), None, "the host was touched");
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_plan_file_holds_no_secret() {
    let canaries = ["hf_planfile_canary_3b7e", "creds-planfile-canary-91d2"];
    let unit = "t-planfile-secret.service";
    fresh(APPLY, unit);
    let text = service("t-planfile-secret", &[APPLY], 39105)
        .env("HF_TOKEN", canaries[0])
        .env("PLAN_CREDS", canaries[1])
        .section("secret_env", vec!["PLAN_CREDS"]);
    let run = Reconcile::new().manifest("a.yaml", &text);
    let planned = run.run_args(&["plan", "--out", "plan.json"]);
    planned.assert_code(2);
    let (text, plan) = plan_file(&run);
    // The secrets are in a file of their own, which the diff names.
    assert!(
        plan["targets"][0]["diff"]
            .as_str()
            .unwrap()
            .contains("+EnvironmentFile=/var/lib/reconcile/secrets/t-planfile-secret.service-"),
        "{plan}"
    );
    for canary in canaries {
        assert!(!text.contains(canary), "plan.json holds {canary}:\n{text}");
        assert!(!planned.stdout.contains(canary) && !planned.stderr.contains(canary));
    }
}
