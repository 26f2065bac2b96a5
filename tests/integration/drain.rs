//! Drain before a restart (issue 16) against the SGLang stand-in on its own host (`DRAIN`, ports
//! 37101-37109, GPUs 0-17): a restart waits for a slow request to finish; a drain that times out
//! refuses the unit (the old server keeps serving, exit 1) or restarts anyway, as
//! `drain.on_timeout` says; a reload-only change never drains; and a server without
//! `--enable-metrics` is never restarted blind.
//!
//! The slow request is made from the host itself (python3, the test hosts have no curl) to the
//! server's loopback port, in the background; it writes its HTTP status and the moment it ended
//! (CLOCK_MONOTONIC, the clock of systemd's `*TimestampMonotonic`) to a file. The stand-in makes
//! every chat completion take `FAKE_SGLANG_REQUEST_SECONDS` and counts it in
//! `sglang:num_running_reqs` meanwhile.

use crate::builder::yaml;
use crate::lab::{apply_one_unit, lab, run_on, stand_in, Manifest, DRAIN, DRAIN_LEASE};

/// A service on the drain host with its own port and two GPUs (its port's, from
/// `lab::DRAIN_LEASE`), each chat request taking `request_seconds`; `drain` is the manifest's
/// `drain:` value, as YAML (`None`: no drain).
fn service(name: &str, port: u16, request_seconds: u32, drain: Option<&str>) -> Manifest {
    let m = stand_in(name, &[DRAIN], port, DRAIN_LEASE.gpu_pair(port))
        .env("FAKE_SGLANG_GPU_COUNT", "64")
        .env("FAKE_SGLANG_LOAD_SECONDS", "1")
        .env("FAKE_SGLANG_REQUEST_SECONDS", request_seconds.to_string())
        .verify_all(&[
            ("crash_window", "3s"),
            ("sample_interval", "500ms"),
            ("stall_timeout", "10s"),
            ("load_deadline", "30s"),
        ]);
    match drain {
        Some(d) => m.section("drain", yaml(d)),
        None => m,
    }
}

/// [`service`] with metrics on, which a drain reads.
fn with_metrics(name: &str, port: u16, request_seconds: u32, drain: Option<&str>) -> Manifest {
    service(name, port, request_seconds, drain).flag("enable-metrics", true)
}

/// The change that restarts the server.
fn change(base: &Manifest) -> Manifest {
    base.clone().flag("mem-fraction-static", 0.8)
}

/// A slow chat completion on the drain host ([`crate::lab::Lab::slow_request`]).
fn slow_request(port: u16, result: &str) {
    lab().slow_request(DRAIN, port, result);
}

/// Its status and when it ended ([`crate::lab::Lab::request_result`]).
fn request_result(result: &str) -> (String, f64) {
    lab().request_result(DRAIN, result)
}

/// When the unit's current main process started, in CLOCK_MONOTONIC seconds.
fn started_at(unit: &str) -> f64 {
    let us = lab().sh(
        DRAIN,
        &format!("systemctl show -p ExecMainStartTimestampMonotonic --value {unit}"),
    );
    us.trim().parse::<f64>().expect("a monotonic timestamp") / 1e6
}

fn deploy(manifest: &Manifest) {
    let (code, report) = apply_one_unit(manifest);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["outcome"], "converged", "{report}");
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn drain_waits_for_a_slow_request_before_restarting() {
    let unit = "t-drain-wait.service";
    lab().remove_unit(DRAIN, unit);
    let drain = Some("{ timeout: 60s }");
    let base = with_metrics("t-drain-wait", 37101, 12, drain);
    deploy(&base);
    let before = lab().invocation(DRAIN, unit);
    let result = "/tmp/t-drain-wait.result";
    slow_request(37101, result);
    let (code, report) = apply_one_unit(&change(&base));
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["outcome"], "converged", "{report}");
    assert_ne!(lab().invocation(DRAIN, unit), before, "restarted");
    let d = &report["drain"];
    assert_eq!(
        (&d["outcome"], &d["restarted"]),
        (&serde_json::json!("idle"), &serde_json::json!(true)),
        "{report}"
    );
    // The request had most of its 12 s left when apply began.
    let waited = d["seconds"].as_f64().unwrap();
    assert!(waited >= 1.0, "drained after {waited}s: {report}");
    let (status, ended) = request_result(result);
    assert_eq!(status, "200", "the request in flight completed");
    let restarted = started_at(unit);
    assert!(
        ended <= restarted,
        "the restart (at {restarted}) came after the request ended (at {ended})"
    );
    let notes = report["notes"].to_string();
    assert!(notes.contains("drained in "), "{report}");
    lab().remove_unit(DRAIN, unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_drain_that_times_out_refuses_and_the_old_server_keeps_serving() {
    let unit = "t-drain-refuse.service";
    lab().remove_unit(DRAIN, unit);
    let drain = Some("{ timeout: 3s, on_timeout: refuse }");
    let base = with_metrics("t-drain-refuse", 37102, 30, drain);
    deploy(&base);
    let before = lab().invocation(DRAIN, unit);
    let unit_file = lab().sh(DRAIN, &format!("cat /etc/systemd/system/{unit}"));
    let result = "/tmp/t-drain-refuse.result";
    slow_request(37102, result);
    let (code, report) = apply_one_unit(&change(&base));
    // A refused unit: exit 1, nothing changed on the host.
    assert_eq!(code, 1, "{report}");
    assert_eq!(report["outcome"], "error", "{report}");
    assert_eq!(report["error"], "drain_refused", "{report}");
    assert_eq!(
        report["detail"],
        "drain timed out after 3s with 1 running, 0 queued; the server was not restarted (drain.on_timeout: refuse); nothing was changed on the host",
        "{report}"
    );
    assert_eq!(report["drain"]["outcome"], "timed_out", "{report}");
    assert_eq!(lab().invocation(DRAIN, unit), before, "not restarted");
    assert_eq!(
        lab().sh(DRAIN, &format!("cat /etc/systemd/system/{unit}")),
        unit_file,
        "the old unit is in place"
    );
    lab().sh(DRAIN, &format!("systemctl is-active {unit}"));
    lab().remove_unit(DRAIN, unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_drain_that_times_out_restarts_anyway_when_told_to() {
    let unit = "t-drain-anyway.service";
    lab().remove_unit(DRAIN, unit);
    let drain = Some("{ timeout: 3s, on_timeout: restart }");
    // Its requests in flight get 5 s to finish once the stop begins, then SIGKILL.
    let base = with_metrics("t-drain-anyway", 37103, 30, drain).systemd("TimeoutStopSec", "5s");
    deploy(&base);
    let before = lab().invocation(DRAIN, unit);
    let result = "/tmp/t-drain-anyway.result";
    slow_request(37103, result);
    let (code, report) = apply_one_unit(&change(&base));
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["outcome"], "converged", "{report}");
    assert_ne!(lab().invocation(DRAIN, unit), before, "restarted");
    let d = &report["drain"];
    assert_eq!(
        (&d["outcome"], &d["restarted"], &d["last"]["running"]),
        (
            &serde_json::json!("timed_out"),
            &serde_json::json!(true),
            &serde_json::json!(1)
        ),
        "{report}"
    );
    assert!(
        report["notes"]
            .to_string()
            .contains("drain timed out after 3s with 1 running, 0 queued; restarted anyway (drain.on_timeout: restart)"),
        "{report}"
    );
    // The stop is graceful (KillMode=mixed): SGLang stops taking requests and keeps answering
    // the one in flight, which needs 30 s; at the unit's TimeoutStopSec (5 s) systemd kills what
    // is left, and the request is cut off.
    let (status, _) = request_result(result);
    assert_ne!(status, "200", "{status}");
    lab().remove_unit(DRAIN, unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_reload_only_change_does_not_drain() {
    let unit = "t-drain-reload.service";
    lab().remove_unit(DRAIN, unit);
    let drain = Some("{ timeout: 60s }");
    let text = with_metrics("t-drain-reload", 37104, 20, drain);
    deploy(&text);
    let before = lab().invocation(DRAIN, unit);
    let result = "/tmp/t-drain-reload.result";
    slow_request(37104, result);
    let changed = text
        .clone()
        .description("test service t-drain-reload, renamed");
    let (code, report) = apply_one_unit(&changed);
    // It did not wait for the 20 s request: that request is still running once the apply is over
    // (it writes its result file when it ends). No bound on the apply's own time: it measured
    // 0.4-0.9 s under full load, against the request's 20 s.
    let request = lab().sh(
        DRAIN,
        &format!("[ -e {result} ] && cat {result} || echo running"),
    );
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["outcome"], "reloaded", "{report}");
    assert!(report.get("drain").is_none(), "{report}");
    eprintln!("the reload took {}s", report["seconds"]);
    assert_eq!(
        request.trim(),
        "running",
        "the request ended before the reload did: it waited for it: {report}"
    );
    assert_eq!(lab().invocation(DRAIN, unit), before);
    let (status, _) = request_result(result);
    assert_eq!(status, "200");
    lab().remove_unit(DRAIN, unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_server_without_enable_metrics_is_not_restarted_blind() {
    let unit = "t-drain-blind.service";
    lab().remove_unit(DRAIN, unit);
    // Offline: `drain:` without --enable-metrics is a manifest error naming file, line and field
    // (the plan stops before connecting; `validate` takes no --ssh-config, which the runner adds).
    let bad = service("t-drain-blind", 37105, 1, Some("{ timeout: 60s }"));
    let ran = run_on(&bad, &["plan"]);
    assert_eq!(ran.code, 1, "{}\n{}", ran.stdout, ran.stderr);
    let said = format!("{}{}", ran.stdout, ran.stderr);
    assert!(
        said.contains("a.yaml:") && said.contains(": drain: drain reads the server's /metrics, which SGLang serves only with --enable-metrics"),
        "{said}"
    );
    // Running without metrics, then a change that turns drain and metrics on: the old server
    // cannot be seen, so it is not restarted.
    deploy(&service("t-drain-blind", 37105, 1, None));
    let before = lab().invocation(DRAIN, unit);
    let drain = Some("{ timeout: 60s, on_timeout: refuse }");
    let (code, report) = apply_one_unit(&with_metrics("t-drain-blind", 37105, 1, drain));
    assert_eq!(code, 1, "{report}");
    assert_eq!(report["error"], "drain_refused", "{report}");
    assert_eq!(
        report["detail"],
        "drain cannot see the server's requests: the running unit has no --enable-metrics, so its server has no /metrics; the server was not restarted (drain.on_timeout: refuse); nothing was changed on the host",
        "{report}"
    );
    assert_eq!(report["drain"]["outcome"], "blind", "{report}");
    assert_eq!(lab().invocation(DRAIN, unit), before, "not restarted");
    lab().remove_unit(DRAIN, unit);
}
