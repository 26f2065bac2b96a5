//! What systemd really runs (issue "What systemd really runs"): a drop-in no manifest owns, a
//! mask, a unit file in `/run` that systemd loads instead of `/etc`, a disabled unit. Each on a
//! real systemd: the plan shows it (exit 2, the file named), apply refuses it by default and
//! touches nothing, `status` names it, and with `systemd.dropins: replace` (or
//! `--replace-dropins`) apply converges, keeps what it moved aside, and a failed apply puts it
//! back.
//!
//! Host rl24; each test its own unit, port (37301-37309) and GPUs (57-63), as `lab::SYSTEMD_UNIT_FILES`
//! leases them: the stand-in's GPU memory is per GPU, and a server of another test leaving a
//! shared GPU reads as a dead rank.

use crate::lab::{
    assert_field_has, assert_has, assert_outcome, classes_of, lab, Manifest, Reconcile,
};

const HOST: &str = "rl24";

/// A crash one second after the start: the crash window fails and apply rolls back.
const CRASHES: [(&str, &str); 2] = [("FAKE_SGLANG_FAIL", "crash"), ("FAKE_SGLANG_FAIL_AT", "1")];

/// The service on `gpus`, with as many ranks (`tp-size`).
fn manifest(service: &str, port: u16, gpus: &str) -> Manifest {
    let tp = gpus.split(',').count();
    crate::lab::manifest(service, &[HOST])
        .without("description")
        .port(port)
        .flag("tp-size", tp)
        .without_env("NCCL_P2P_DISABLE")
        .env("CUDA_VISIBLE_DEVICES", gpus)
        .verify("crash_window", "3s")
        .verify("load_deadline", "60s")
}

/// A hand-written unit running the stand-in, as an operator's own would.
fn hand_unit(port: u16, tp: u32, gpu: u32) -> String {
    format!(
        "[Unit]\nDescription=hand-written\n\n[Service]\nEnvironment=CUDA_VISIBLE_DEVICES={gpu}\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /models/test --served-model-name test-model --context-length 8192 --tp-size {tp} --port {port}\nRestart=on-failure\n\n[Install]\nWantedBy=multi-user.target\n"
    )
}

/// The main process's argv, from `/proc`.
fn argv(unit: &str) -> Vec<String> {
    lab()
        .sh(
            HOST,
            &format!("tr '\\0' '\\n' < /proc/$(systemctl show -p MainPID --value {unit})/cmdline"),
        )
        .lines()
        .map(str::to_string)
        .collect()
}

fn tp_size(unit: &str) -> String {
    let argv = argv(unit);
    let i = argv
        .iter()
        .position(|a| a == "--tp-size")
        .expect("--tp-size in argv");
    argv[i + 1].clone()
}

fn run(r: &Reconcile, args: &[&str]) -> (i32, serde_json::Value, String) {
    let mut all = args.to_vec();
    all.extend(["--format", "json"]);
    let ran = r.run_args(&all);
    (ran.code, ran.json()["units"][0].clone(), ran.stderr)
}

fn plan(r: &Reconcile) -> (i32, serde_json::Value) {
    let (code, unit, _) = run(r, &["plan", "--no-deep"]);
    (code, unit)
}

fn apply(r: &Reconcile, extra: &[&str]) -> (i32, serde_json::Value) {
    let mut args = vec!["apply", "--no-deep"];
    args.extend(extra);
    let (code, unit, _) = run(r, &args);
    (code, unit)
}

fn status_classes(r: &Reconcile) -> (Vec<String>, String) {
    let (_, unit, _) = run(r, &["status"]);
    (classes_of(&unit), unit["details"].to_string())
}

fn clean(unit: &str) {
    lab().sh(
        HOST,
        &format!(
            "systemctl stop {unit} 2>/dev/null; systemctl unmask {unit} 2>/dev/null; systemctl disable {unit} 2>/dev/null; \
             rm -rf /etc/systemd/system/{unit} /etc/systemd/system/{unit}.d /run/systemd/system/{unit} /run/systemd/system/{unit}.d /var/lib/reconcile/{unit}; \
             systemctl daemon-reload; systemctl reset-failed {unit} 2>/dev/null; true"
        ),
    );
}

fn kinds(plan: &serde_json::Value) -> Vec<String> {
    plan["drift"]
        .as_array()
        .unwrap_or_else(|| panic!("the plan has drift: {plan}"))
        .iter()
        .map(|d| d["kind"].as_str().unwrap().to_string())
        .collect()
}

fn aside_records(unit: &str) -> String {
    lab().sh(
        HOST,
        &format!("cat /var/lib/reconcile/{unit}/aside/*.json 2>/dev/null; true"),
    )
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_systemctl_edit_drop_in_is_planned_refused_named_then_replaced_and_put_back_by_a_rollback() {
    let lab = lab();
    let (service, port) = ("t-ly-dropin", 37301);
    const GPUS: &str = "60,61";
    let unit = format!("{service}.service");
    clean(&unit);
    let r = Reconcile::new().manifest("m.yaml", manifest(service, port, GPUS));
    let (code, applied) = apply(&r, &[]);
    assert_outcome(code, &applied, 0, "converged");

    // What `systemctl edit` writes: the command line reset to --tp-size 1, one GPU.
    let dropin = format!("/etc/systemd/system/{unit}.d/override.conf");
    let edit = format!(
        "[Service]\nExecStart=\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /models/test --served-model-name test-model --context-length 8192 --tp-size 1 --port {port}\nEnvironment=CUDA_VISIBLE_DEVICES=60\n"
    );
    lab.sh(HOST, &format!("mkdir -p /etc/systemd/system/{unit}.d"));
    lab.put(HOST, &dropin, &edit);
    lab.sh(
        HOST,
        &format!("systemctl daemon-reload && systemctl restart {unit}"),
    );
    // 20 s bounds a start that never happens (the main process is there once forked).
    lab.wait_until(
        HOST,
        &format!("[ -e /proc/$(systemctl show -p MainPID --value {unit})/cmdline ]"),
        std::time::Duration::from_secs(20),
    );
    assert_eq!(tp_size(&unit), "1");
    let edited = lab.invocation(HOST, &unit);

    // The plan is a change, names the drop-in, and says where the running value comes from.
    let (code, p) = plan(&r);
    assert_eq!(code, 2, "{p}");
    assert_eq!(kinds(&p), ["dropin_override"]);
    assert_eq!(p["drift"][0]["path"], dropin.as_str());
    assert_eq!(p["verdict"], "restart");
    let tp = p["summary"]["flags"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "tp-size")
        .unwrap_or_else(|| panic!("tp-size differs: {p}"));
    assert_eq!(
        (tp["old"].as_str(), tp["new"].as_str()),
        (Some("1"), Some("2"))
    );
    assert_eq!(tp["from"], dropin.as_str());
    let text = r.run_args(&["plan", "--no-deep"]);
    assert_eq!(text.code, 2);
    assert!(
        text.stdout.contains(&dropin) && text.stdout.contains("apply refuses"),
        "{}",
        text.stdout
    );

    // status calls it what it is.
    let (classes, details) = status_classes(&r);
    assert!(
        classes.contains(&"dropin_override".to_string()),
        "{classes:?} {details}"
    );
    assert!(
        !classes.contains(&"not_restarted".to_string()),
        "{classes:?} {details}"
    );
    assert_has(&details, "a restart would not fix it");

    // apply refuses by default and touches nothing.
    let (code, refused) = apply(&r, &[]);
    assert_eq!(code, 1, "{refused}");
    assert_eq!(refused["error"], "overridden_on_host", "{refused}");
    assert_field_has(&refused, "detail", "systemd.dropins: replace");
    assert_eq!(lab.invocation(HOST, &unit), edited, "nothing restarted");
    assert_eq!(
        lab.sh(HOST, &format!("cat {dropin}")),
        edit,
        "the drop-in is where it was"
    );

    // Replace, with a manifest whose server crashes: the rollback puts the drop-in back, and the
    // server runs its command line again.
    let failing =
        Reconcile::new().manifest("m.yaml", manifest(service, port, GPUS).env_all(&CRASHES));
    let (code, failed) = apply(&failing, &["--replace-dropins"]);
    assert_ne!(code, 0, "{failed}");
    assert_eq!(failed["outcome"], "rolled_back", "{failed}");
    assert_eq!(
        lab.sh(HOST, &format!("cat {dropin}")),
        edit,
        "the rollback put the drop-in back"
    );
    assert_eq!(
        tp_size(&unit),
        "1",
        "the previous unit, drop-in and all, runs again"
    );
    assert!(
        aside_records(&unit).contains("--tp-size 1"),
        "the move was recorded"
    );
    // ... and history lists it.
    let history = r.run_args(&["history", service, "--format", "json"]);
    assert_eq!(history.code, 0, "{}", history.stderr);
    let moved = &history.json()["hosts"][0]["moved_aside"];
    assert_eq!(moved[0]["paths"][0], dropin.as_str(), "{moved}");

    // Replace, from the manifest: converges with the manifest's unit alone.
    let replacing = Reconcile::new().manifest(
        "m.yaml",
        manifest(service, port, GPUS).systemd("dropins", "replace"),
    );
    let (code, converged) = apply(&replacing, &[]);
    assert_outcome(code, &converged, 0, "converged");
    assert!(
        converged["notes"].to_string().contains("moved aside"),
        "{converged}"
    );
    assert_eq!(
        lab.sh(
            HOST,
            &format!("test -e {dropin} && echo there || echo gone")
        )
        .trim(),
        "gone"
    );
    assert_eq!(tp_size(&unit), "2");
    assert_eq!(
        plan(&replacing).0,
        0,
        "converged: the next plan is no change"
    );
    let (classes, _) = status_classes(&replacing);
    assert_eq!(classes, ["in_sync"]);
    clean(&unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_masked_unit_is_planned_refused_and_with_replace_unmasked_or_masked_again_by_a_rollback() {
    let lab = lab();
    let (service, port) = ("t-ly-masked", 37302);
    const GPUS: &str = "62,63";
    let unit = format!("{service}.service");
    clean(&unit);
    let path = format!("/etc/systemd/system/{unit}");
    lab.sh(HOST, &format!("systemctl mask {unit}"));
    let is_mask = || lab.sh(HOST, &format!("readlink {path} || true")).trim() == "/dev/null";
    assert!(is_mask());

    let r = Reconcile::new().manifest("m.yaml", manifest(service, port, GPUS));
    let (code, p) = plan(&r);
    assert_eq!(code, 2, "{p}");
    assert_eq!(kinds(&p), ["masked"]);
    assert_eq!(p["drift"][0]["path"], path.as_str());

    let (code, refused) = apply(&r, &[]);
    assert_eq!(
        (code, refused["error"].as_str()),
        (1, Some("overridden_on_host")),
        "{refused}"
    );
    assert_field_has(&refused, "detail", "systemctl unmask");
    assert!(is_mask(), "the mask is untouched");
    let (classes, _) = status_classes(&r);
    assert!(classes.contains(&"masked".to_string()), "{classes:?}");

    let failing =
        Reconcile::new().manifest("m.yaml", manifest(service, port, GPUS).env_all(&CRASHES));
    let (code, failed) = apply(&failing, &["--replace-dropins"]);
    assert_ne!(code, 0, "{failed}");
    assert_eq!(failed["outcome"], "rolled_back", "{failed}");
    assert!(is_mask(), "the rollback masked it again");
    assert_ne!(
        lab.sh(HOST, &format!("systemctl is-active {unit} || true"))
            .trim(),
        "active"
    );

    let (code, converged) = apply(&r, &["--replace-dropins"]);
    assert_outcome(code, &converged, 0, "converged");
    assert!(!is_mask());
    assert_eq!(
        lab.sh(HOST, &format!("systemctl is-enabled {unit} || true"))
            .trim(),
        "enabled"
    );
    assert!(
        aside_records(&unit).contains("\"mask\": true"),
        "the mask is kept"
    );
    assert_eq!(plan(&r).0, 0);
    clean(&unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_unit_in_run_that_systemd_loads_instead_is_planned_refused_and_replaced_or_restored() {
    let lab = lab();
    let (service, port) = ("t-ly-shadow", 37303);
    const GPUS: &str = "58,59";
    let unit = format!("{service}.service");
    clean(&unit);
    let shadow = format!("/run/systemd/system/{unit}");
    lab.sh(HOST, "mkdir -p /run/systemd/system");
    lab.put(HOST, &shadow, &hand_unit(port, 1, 58));
    lab.sh(
        HOST,
        &format!("systemctl daemon-reload && systemctl start {unit}"),
    );
    // 20 s bounds a start that never happens (the main process is there once forked).
    lab.wait_until(
        HOST,
        &format!("[ -e /proc/$(systemctl show -p MainPID --value {unit})/cmdline ]"),
        std::time::Duration::from_secs(20),
    );
    let fragment = || {
        lab.sh(
            HOST,
            &format!("systemctl show -p FragmentPath --value {unit}"),
        )
        .trim()
        .to_string()
    };
    assert_eq!(fragment(), shadow);
    let before = lab.invocation(HOST, &unit);

    let r = Reconcile::new().manifest("m.yaml", manifest(service, port, GPUS));
    let (code, p) = plan(&r);
    assert_eq!(code, 2, "{p}");
    assert_eq!(kinds(&p), ["shadowed"]);
    assert_eq!(p["drift"][0]["path"], shadow.as_str());
    assert_eq!(
        p["verdict"], "restart",
        "the server of that name runs: not a new unit"
    );

    let (code, refused) = apply(&r, &[]);
    assert_eq!(
        (code, refused["error"].as_str()),
        (1, Some("overridden_on_host")),
        "{refused}"
    );
    assert_eq!(lab.invocation(HOST, &unit), before, "nothing restarted");
    let (classes, _) = status_classes(&r);
    assert!(classes.contains(&"shadowed".to_string()), "{classes:?}");

    let failing =
        Reconcile::new().manifest("m.yaml", manifest(service, port, GPUS).env_all(&CRASHES));
    let (code, failed) = apply(&failing, &["--replace-dropins"]);
    assert_ne!(code, 0, "{failed}");
    assert_eq!(failed["outcome"], "rolled_back", "{failed}");
    assert_eq!(
        fragment(),
        shadow,
        "the /run unit is back and what systemd runs"
    );
    assert_eq!(tp_size(&unit), "1");
    assert_eq!(
        lab.sh(HOST, &format!("systemctl is-active {unit} || true"))
            .trim(),
        "active"
    );

    let (code, converged) = apply(&r, &["--replace-dropins"]);
    assert_outcome(code, &converged, 0, "converged");
    assert_eq!(fragment(), format!("/etc/systemd/system/{unit}"));
    assert_eq!(
        lab.sh(
            HOST,
            &format!("test -e {shadow} && echo there || echo gone")
        )
        .trim(),
        "gone"
    );
    assert_eq!(tp_size(&unit), "2");
    assert!(
        aside_records(&unit).contains("hand-written"),
        "the /run unit is kept"
    );
    assert_eq!(plan(&r).0, 0);
    clean(&unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_disabled_unit_is_planned_named_and_enabled_without_a_restart() {
    let lab = lab();
    let (service, port) = ("t-ly-disabled", 37304);
    const GPUS: &str = "57";
    let unit = format!("{service}.service");
    clean(&unit);
    let r = Reconcile::new().manifest("m.yaml", manifest(service, port, GPUS));
    let (code, applied) = apply(&r, &[]);
    assert_outcome(code, &applied, 0, "converged");
    lab.sh(HOST, &format!("systemctl disable {unit}"));
    let before = lab.invocation(HOST, &unit);

    let (code, p) = plan(&r);
    assert_eq!(code, 2, "{p}");
    assert_eq!(kinds(&p), ["disabled"]);
    assert_eq!(p["verdict"], "reload_only");
    assert!(p["notes"].to_string().contains("apply enables it"), "{p}");
    let (classes, details) = status_classes(&r);
    assert!(classes.contains(&"disabled".to_string()), "{classes:?}");
    assert_has(&details, "a restart would not fix it");

    let (code, reloaded) = apply(&r, &[]);
    assert_eq!(code, 0, "{reloaded}");
    assert_eq!(
        lab.sh(HOST, &format!("systemctl is-enabled {unit} || true"))
            .trim(),
        "enabled"
    );
    assert_eq!(
        lab.invocation(HOST, &unit),
        before,
        "enabled without a restart"
    );
    assert_eq!(plan(&r).0, 0);
    clean(&unit);
}
