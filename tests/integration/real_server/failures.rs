//! Every start failure the real server produces on this machine, each on a host running a good
//! unit of the same service: the failed start is rolled back, the previous unit is verified again
//! and serves, and the report names the cause (its diagnosis, from the real journal). The ones
//! the host's SGLang can name before anything stops are also refused at plan time, host untouched.
//! The good server is installed once per host and shared ([`super::Shared`]): each test leaves
//! it on its good unit, as the rollback it asserts must.
//!
//! Apply's preflight would refuse the first two before the restart (see `refused_at_plan_time`),
//! so their rollback tests skip it with `--no-deep`, as an operator who skipped it would.

use super::{Service, Shared, HOSTS, MODEL_CONTEXT, ROOT};
use crate::lab::{assert_has, lab, Manifest, Reconcile};

/// The good servers the failures are applied to, one a host; each names how many tests take it.
static ON_FIRST: Shared = Shared::new("t-rs-fail-a", HOSTS[0], 38011, 3);
static ON_SECOND: Shared = Shared::new("t-rs-fail-b", HOSTS[1], 38012, 3);

/// Applies `bad` (a manifest of `s`'s service) with `args` to `s`, which runs its good unit:
/// asserts the bad start was rolled back to the good unit, which serves again, and returns the
/// failed unit's report.
fn rolled_back(s: &Service, bad: &Manifest, args: &[&str]) -> serde_json::Value {
    let good = s.unit_file();
    let (code, report) = s.apply_with(bad, args);
    assert_eq!(code, 3, "{report:#}");
    assert_eq!(report["outcome"], "rolled_back", "{report:#}");
    let detail = report["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("the previous unit was restored and passed verification"),
        "the previous unit was verified again: {report:#}"
    );
    assert_eq!(s.unit_file(), good, "the host runs its previous unit");
    assert_eq!(
        s.http("GET", "/health", None, None).0,
        200,
        "the previous unit serves"
    );
    report
}

fn cause(report: &serde_json::Value) -> String {
    report["diagnosis"]["cause"]
        .as_str()
        .unwrap_or_else(|| panic!("no diagnosis: {report:#}"))
        .to_string()
}

/// Takes a turn on `on`'s server and applies its good manifest with `flag` set to `value`: the
/// start fails and is rolled back ([`rolled_back`]). Returns the report and its diagnosis's cause.
fn with_bad_flag(
    on: &'static Shared,
    flag: &str,
    value: impl Into<serde_yaml::Value>,
) -> (serde_json::Value, String) {
    let turn = on.take();
    let bad = on.good().flag(flag, value);
    let report = rolled_back(turn.service(), &bad.manifest(), &["--no-deep"]);
    let cause = cause(&report);
    (report, cause)
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_context_length_past_the_models_is_rolled_back_with_its_cause() {
    let (report, cause) = with_bad_flag(&ON_FIRST, "context-length", 2 * MODEL_CONTEXT);
    assert!(cause.contains("4096") && cause.contains("2048"), "{cause}");
    let advice = report["diagnosis"]["advice"].as_str().unwrap();
    assert_has(advice, "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN");
}

/// A copy of the tiny model on the host, without `config.json`.
fn model_without_config(host: &str) -> &'static str {
    let path = "/models/rs-noconfig";
    lab().sh(
        host,
        &format!("rm -rf {path}; mkdir -p {path}; cp -r {ROOT}/tiny-model/. {path}/; rm {path}/config.json"),
    );
    path
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_model_folder_without_config_json_is_rolled_back_with_its_cause() {
    let turn = ON_SECOND.take();
    let s = turn.service();
    let path = model_without_config(s.host);
    let bad = s.manifest().model_path(path);
    let report = rolled_back(s, &bad, &["--no-deep"]);
    let cause = cause(&report);
    assert_has(&cause, "config");
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_chat_template_file_that_does_not_exist_is_rolled_back_with_its_cause() {
    let (_, cause) = with_bad_flag(&ON_FIRST, "chat-template", "/models/no-such-template.jinja");
    assert_has(&cause, "/models/no-such-template.jinja");
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_kv_cache_dtype_the_cpu_engine_refuses_is_rolled_back_with_its_cause() {
    // `--quantization fp8` is refused only on a CPU without AMX, and `--dtype float16` is served:
    // an fp8 KV cache is what the CPU engine refuses on every machine.
    let (_, cause) = with_bad_flag(&ON_SECOND, "kv-cache-dtype", "fp8_e5m2");
    assert_has(&cause, "fp8_e5m2");
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_killed_scheduler_is_rolled_back_with_its_cause() {
    let turn = ON_FIRST.take();
    let s = turn.service();
    let good = s.unit_file();
    let before = s.invocation();
    // The change's server has its scheduler killed while it loads, as the OOM killer would.
    let changed = ON_FIRST.good().flag("max-running-requests", 9);
    // The run's folder (its manifests) must outlive the child.
    let run = Reconcile::new()
        .manifest("a.yaml", changed.manifest())
        .args(&["apply", "--format", "json"]);
    let child = run.spawn(&[]);
    lab().wait_for_restart_within(s.host, &s.unit(), &before, super::RESTART_WITHIN);
    let scheduler = format!(
        "$({}; for p in $(cat \"$procs\"); do grep -q '^sglang::scheduler' /proc/$p/cmdline 2>/dev/null && echo $p; done)",
        super::procs(&s.unit())
    );
    lab().wait_until(
        s.host,
        &format!("[ -n \"{scheduler}\" ]"),
        std::time::Duration::from_secs(120),
    );
    lab().sh(s.host, &format!("kill -9 {scheduler}"));
    let ran = crate::lab::Ran::from(child.wait_with_output().unwrap());
    let report = &ran.json()["units"][0];
    assert_eq!(ran.code, 3, "{report:#}");
    assert_eq!(report["outcome"], "rolled_back", "{report:#}");
    assert_eq!(s.unit_file(), good);
    assert_eq!(s.http("GET", "/health", None, None).0, 200);
    let cause = cause(report);
    assert_has(&cause, "scheduler");
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn what_the_hosts_sglang_refuses_is_refused_at_plan_time_and_the_server_keeps_serving() {
    let turn = ON_SECOND.take();
    let s = turn.service();
    let before = s.invocation();
    let path = model_without_config(s.host);
    let context = ON_SECOND
        .good()
        .flag("context-length", 2 * MODEL_CONTEXT)
        .manifest();
    let no_config = s.manifest().model_path(path);
    for (what, text, field) in [
        ("context length", &context, "sglang.flags.context-length"),
        ("no config.json", &no_config, "sglang.model_path"),
    ] {
        for command in ["plan", "apply"] {
            let started = std::time::Instant::now();
            let ran = Reconcile::new()
                .manifest("a.yaml", text)
                .args(&[command])
                .run();
            let took = started.elapsed();
            assert_eq!(
                ran.code, 1,
                "{what}, {command}: {}{}",
                ran.stdout, ran.stderr
            );
            let out = format!("{}{}", ran.stdout, ran.stderr);
            assert!(
                out.contains("a.yaml:") && out.contains(field),
                "{what}, {command}: {out}"
            );
            eprintln!("{what}: {command} refused in {:.1}s", took.as_secs_f64());
        }
    }
    assert_eq!(
        s.invocation(),
        before,
        "the running server was not restarted"
    );
    assert_eq!(s.http("GET", "/health", None, None).0, 200);
}
