//! A diagnosis per failed start (`reconcile_core::diagnose`): a start that fails on the host rolls
//! back and its report names the cause and the advice, in JSON (`units[].diagnosis`) and in text
//! (`cause:` / `advice:` under the unit). The failures are the stand-in's, which print the real
//! SGLang lines (fixtures/fake-sglang/README.md). Host `THROUGHPUT` (rl15): ports 37001-37009,
//! GPUs 0-9.

use crate::lab::{
    apply_one_unit, assert_field_has, assert_has, lab, run_on, stand_in, Manifest, Undo, THROUGHPUT,
};

/// A test service on the throughput host: its port, its two GPUs (`gpu`, `gpu + 1`), the
/// stand-in's `env` and short verification windows.
fn service(name: &str, port: u16, gpu: u32, env: &[(&str, &str)]) -> Manifest {
    stand_in(name, &[THROUGHPUT], port, format!("{gpu},{}", gpu + 1))
        .env("FAKE_SGLANG_GPU_COUNT", "64")
        .env_all(env)
        .verify_all(&[
            ("crash_window", "10s"),
            ("sample_interval", "500ms"),
            ("stall_timeout", "8s"),
            ("load_deadline", "30s"),
        ])
}

/// [`service`] whose server runs out of GPU memory (capped at 300 MB) `at` seconds in, through
/// the phases that `phases` set.
fn oom_service(name: &str, port: u16, gpu: u32, phases: &[(&str, &str)], at: &str) -> Manifest {
    let mut env = phases.to_vec();
    env.extend([
        ("FAKE_SGLANG_FAIL", "oom"),
        ("FAKE_SGLANG_FAIL_AT", at),
        ("FAKE_SGLANG_OOM_CAP_MB", "300"),
    ]);
    service(name, port, gpu, &env)
}

/// Applies `text`, whose new server fails to start: the run exits 3. Returns the unit's report.
fn failed_start(text: &Manifest) -> serde_json::Value {
    let (code, report) = apply_one_unit(text);
    assert_eq!(code, 3, "{report:#}");
    report
}

fn unit_gone(unit: &str) -> bool {
    lab()
        .sh(
            THROUGHPUT,
            &format!("test -e /etc/systemd/system/{unit} && echo present || echo gone"),
        )
        .trim()
        == "gone"
}

/// A rolled-back new unit whose report has a diagnosis; returns (cause, advice).
fn rolled_back_with_diagnosis(unit: &serde_json::Value) -> (String, String) {
    assert_eq!(unit["outcome"], "rolled_back", "{unit:#}");
    let d = &unit["diagnosis"];
    assert!(d.is_object(), "no diagnosis in {unit:#}");
    (
        d["cause"].as_str().unwrap().to_string(),
        d["advice"].as_str().unwrap().to_string(),
    )
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn an_oom_while_loading_rolls_back_with_the_oom_diagnosis_in_json_and_text() {
    let unit = "t-diag-oom.service";
    lab().remove_unit(THROUGHPUT, unit);
    // The OOM 2 s into a 5-s weights phase: SGLang's traceback from `load_model`, then SIGKILL.
    let text = oom_service(
        "t-diag-oom",
        37001,
        0,
        &[("FAKE_SGLANG_LOAD_SECONDS", "5")],
        "2",
    );
    let report = failed_start(&text);
    let journal = report["journal"].as_str().unwrap_or_default();
    assert!(
        journal.contains("torch.OutOfMemoryError: CUDA out of memory"),
        "{report:#}"
    );
    let (cause, advice) = rolled_back_with_diagnosis(&report);
    assert_eq!(
        cause,
        "CUDA out of memory while loading the weights: the model does not fit the GPUs"
    );
    assert_has(&advice, "--tp-size");
    assert!(unit_gone(unit), "the new unit was not removed");

    // The same failure in text: the cause and the advice under the failed unit.
    let ran = run_on(&text, &["apply"]);
    ran.assert_code(3);
    let lines: Vec<&str> = ran.stdout.lines().collect();
    let head = lines
        .iter()
        .position(|l| l.starts_with(&format!("{THROUGHPUT} {unit}: rolled back")))
        .unwrap_or_else(|| panic!("no rolled-back unit in:\n{}", ran.stdout));
    assert_eq!(
        lines.get(head + 1).copied(),
        Some(format!("  cause: {cause}").as_str()),
        "{}",
        ran.stdout
    );
    assert_eq!(
        lines.get(head + 2).copied(),
        Some(format!("  advice: {advice}").as_str()),
        "{}",
        ran.stdout
    );
    lab().remove_unit(THROUGHPUT, unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn an_oom_during_cuda_graph_capture_names_the_capture_and_its_flags() {
    let unit = "t-diag-graph.service";
    lab().remove_unit(THROUGHPUT, unit);
    // Weights in 1 s, then a 6-s capture; the OOM comes 3 s in, inside the capture.
    let text = oom_service(
        "t-diag-graph",
        37002,
        2,
        &[
            ("FAKE_SGLANG_LOAD_SECONDS", "1"),
            ("FAKE_SGLANG_GRAPH_SECONDS", "6"),
        ],
        "3",
    );
    let report = failed_start(&text);
    assert_field_has(
        &report,
        "journal",
        "Capture cuda graph failed: CUDA out of memory",
    );
    let (cause, advice) = rolled_back_with_diagnosis(&report);
    assert_eq!(cause, "CUDA out of memory during CUDA graph capture");
    assert!(
        advice.contains("--cuda-graph-max-bs-decode") && advice.contains("--mem-fraction-static"),
        "{advice}"
    );
    assert!(unit_gone(unit), "the new unit was not removed");
    lab().remove_unit(THROUGHPUT, unit);
}

/// Waits until the unit is active, then holds the port: a listening socket that never accepts,
/// so the verifier's probes hang (they time out after 10 s and more) and never see an answer from
/// it, while systemd's polling sees the stand-in exit when its own bind fails.
const SQUATTER: &str = r#"import socket, subprocess, sys, time
unit, port = sys.argv[1], int(sys.argv[2])
while subprocess.run(["systemctl", "is-active", "-q", unit]).returncode != 0:
    time.sleep(0.05)
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", port))
s.listen(16)
time.sleep(3600)
"#;

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_port_taken_after_preflight_rolls_back_with_the_port_diagnosis() {
    let unit = "t-diag-port.service";
    let port = 37003;
    lab().remove_unit(THROUGHPUT, unit);
    // Preflight refuses a port that is taken, so the squatter takes it only once the new unit is
    // active, while the stand-in loads (3 s); the stand-in's bind then fails as uvicorn's does,
    // and it exits 1 inside the crash window.
    lab().put(THROUGHPUT, "/tmp/t-diag-squatter.py", SQUATTER);
    lab().sh(
        THROUGHPUT,
        &format!(
            "systemctl stop t-diag-squatter 2>/dev/null; systemctl reset-failed t-diag-squatter 2>/dev/null; \
             systemd-run --unit=t-diag-squatter /usr/bin/python3 /tmp/t-diag-squatter.py {unit} {port}"
        ),
    );
    let _squatter = Undo::new(
        THROUGHPUT,
        "systemctl stop t-diag-squatter 2>/dev/null; systemctl reset-failed t-diag-squatter 2>/dev/null; true",
    );
    let text = service("t-diag-port", port, 4, &[("FAKE_SGLANG_LOAD_SECONDS", "3")]);
    let report = failed_start(&text);
    assert_eq!(report["failed_stage"], "crash window", "{report:#}");
    assert_field_has(
        &report,
        "journal",
        "error while attempting to bind on address",
    );
    let (cause, advice) = rolled_back_with_diagnosis(&report);
    assert_eq!(
        cause,
        format!("the HTTP port is already in use: ('127.0.0.1', {port})")
    );
    assert_has(&advice, "--port");
    assert!(unit_gone(unit), "the new unit was not removed");
    lab().remove_unit(THROUGHPUT, unit);
}
