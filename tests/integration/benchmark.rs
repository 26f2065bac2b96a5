//! The throughput gate (issue 14) against the SGLang stand-in on its own host (`THROUGHPUT`,
//! ports 37011-37019, GPUs 10-29): the benchmark stage records a baseline, passes a faster change,
//! rolls back a slower one (failed stage `benchmark`, exit 3), only reports it with `gate: false`,
//! and `reconcile bench` stores a baseline for a running unit without restarting it.
//!
//! The stand-in streams at `FAKE_SGLANG_TOKENS_PER_SECOND` per request (default 200), and
//! `FAKE_SGLANG_SLOW_FLAG="--chunked-prefill-size=0.5"` halves its rates while that flag is on
//! its command line. The benchmarks are tiny (levels 1 and 4, 16 output tokens, 8 requests), so
//! each takes well under a second.

use crate::builder::{yaml, STAND_IN_VERIFY};
use crate::lab::{
    apply_one_unit, assert_field_has, assert_has, lab, stand_in, tokens_at, Manifest, Reconcile,
    BENCHMARK, THROUGHPUT,
};

/// The tiny benchmark's settings.
const TINY: &str = "{ levels: [1, 4], prompt_tokens: 16, output_tokens: 16, requests: 8 }";

/// A service on the throughput host with its own port and two GPUs (its port's, from
/// `lab::BENCHMARK`), and the tiny benchmark.
fn service(name: &str, port: u16) -> Manifest {
    stand_in(name, &[THROUGHPUT], port, BENCHMARK.gpu_pair(port))
        .env("FAKE_SGLANG_GPU_COUNT", "64")
        .env("FAKE_SGLANG_LOAD_SECONDS", "1")
        .verify_all(&STAND_IN_VERIFY)
        .verify("benchmark", yaml(TINY))
}

/// [`service`], with the stand-in told to halve its rates when it sees [`slower`]'s flag.
fn slowed(name: &str, port: u16) -> Manifest {
    service(name, port).env("FAKE_SGLANG_SLOW_FLAG", "--chunked-prefill-size=0.5")
}

/// The change that makes a [`slowed`] service slower: the flag it halves its rates for.
fn slower(base: &Manifest) -> Manifest {
    base.clone().flag("chunked-prefill-size", 4096)
}

fn stop(unit: &str) {
    lab().sh(THROUGHPUT, &format!("systemctl disable --now {unit}"));
}

/// The unit's `current.json` on the host.
fn current(unit: &str) -> serde_json::Value {
    let text = lab().sh(
        THROUGHPUT,
        &format!("cat /var/lib/reconcile/{unit}/current.json"),
    );
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("current.json ({e}): {text}"))
}

fn identity(unit: &str) -> String {
    lab().sh(
        THROUGHPUT,
        &format!("systemctl show -p InvocationID -p NRestarts --value {unit} | paste -sd' '"),
    )
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_first_deployment_records_a_baseline() {
    let unit = "t-bench-baseline.service";
    lab().remove_unit(THROUGHPUT, unit);
    let (code, report) = apply_one_unit(&service("t-bench-baseline", 37011));
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["outcome"], "converged");
    let b = &report["benchmark"];
    assert_eq!(b["verdict"], "baseline", "{report}");
    let detail = report["detail"].as_str().unwrap();
    assert!(
        detail.contains("benchmark passed)") || detail.contains(", benchmark passed"),
        "{detail}"
    );
    assert_has(detail, "; benchmark: baseline recorded: 1: ");
    assert_eq!(b["levels"].as_array().unwrap().len(), 2);
    assert!(
        b["levels"]
            .as_array()
            .unwrap()
            .iter()
            .all(|l| l["errors"] == 0),
        "{b}"
    );
    // Four in flight stream about four times as much as one (the stand-in's total cap is far off):
    // measured 3.8-4.1x under full load. Asserted is a third of that, still well clear of the 1x of
    // requests served one at a time.
    eprintln!(
        "tok/s at 4 over at 1: {:.2}",
        tokens_at(b, 4) / tokens_at(b, 1)
    );
    assert!(tokens_at(b, 4) > 1.25 * tokens_at(b, 1), "{b}");

    let record = current(unit);
    assert_eq!(
        record["benchmark"]["settings_key"],
        "v1 levels 1,4 prompt 16 output 16 requests 8,8"
    );
    assert_eq!(tokens_at(&record["benchmark"], 4), tokens_at(b, 4));

    let ran = Reconcile::new()
        .args(&["history", "t-bench-baseline", "--host", THROUGHPUT])
        .run();
    assert_eq!(ran.code, 0, "{}", ran.stderr);
    assert!(
        ran.stdout.contains("converged  4: ") && ran.stdout.contains(" tok/s"),
        "{}",
        ran.stdout
    );
    let ran = Reconcile::new()
        .args(&[
            "history",
            "t-bench-baseline",
            "--host",
            THROUGHPUT,
            "--format",
            "json",
        ])
        .run();
    let deployments = &ran.json()["hosts"][0]["deployments"];
    assert!(
        deployments[0]["record"]["benchmark"]["levels"].is_array(),
        "{deployments}"
    );
    stop(unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_faster_change_converges_and_records_its_figures() {
    let unit = "t-bench-faster.service";
    lab().remove_unit(THROUGHPUT, unit);
    // Each request's rate is the stand-in's sleeps (50 tok/s: 320 ms for 16 tokens), so a CPU
    // stall under full load only lengthens the faster run's far shorter requests a little.
    let at =
        |rate: &str| service("t-bench-faster", 37012).env("FAKE_SGLANG_TOKENS_PER_SECOND", rate);
    let (code, first) = apply_one_unit(&at("50"));
    assert_eq!(
        (code, &first["benchmark"]["verdict"]),
        (0, &"baseline".into()),
        "{first}"
    );
    let faster = at("400");
    let (code, report) = apply_one_unit(&faster);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["outcome"], "converged");
    let b = &report["benchmark"];
    assert_eq!(b["verdict"], "passed", "{report}");
    let changes = b["comparison"]["levels"].as_array().unwrap();
    assert_eq!(changes.len(), 2);
    eprintln!(
        "eight times the rate measured: {:?} %",
        changes
            .iter()
            .map(|c| c["change_percent"].as_f64().unwrap_or(f64::NAN))
            .collect::<Vec<_>>()
    );
    // Twice the rate (200 then 400 tok/s) measured +51 % to +85 % under full load, and one CI
    // run lower still; eight times it measured +352 % and +409 % under full load (the stand-in
    // tier, six at a time): +100 % is under a third of that.
    assert!(
        changes
            .iter()
            .all(|c| c["change_percent"].as_f64().unwrap() > 100.0),
        "{b}"
    );
    assert_field_has(
        &report,
        "detail",
        "; benchmark: throughput within 10% of the previous deployment: +",
    );
    // The new figures are the record's now: the next apply compares with them.
    assert_eq!(tokens_at(&current(unit)["benchmark"], 4), tokens_at(b, 4));
    assert!(tokens_at(b, 4) > tokens_at(&first["benchmark"], 4));
    stop(unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_slower_change_beyond_the_threshold_rolls_back() {
    let unit = "t-bench-slower.service";
    lab().remove_unit(THROUGHPUT, unit);
    let base = slowed("t-bench-slower", 37013);
    let (code, first) = apply_one_unit(&base);
    assert_eq!(code, 0, "{first}");
    let baseline = current(unit);
    let (code, report) = apply_one_unit(&slower(&base));
    assert_eq!(code, 3, "{report}");
    assert_eq!(report["outcome"], "rolled_back");
    assert_eq!(report["failed_stage"], "benchmark");
    assert_eq!(report["error"], "verification_failed");
    let detail = report["detail"].as_str().unwrap();
    // Half the rate measured -36 % to -46 % under full load, against the gate's 10 %: 3.6 times it
    // at the least.
    eprintln!("half the rate: {detail}");
    assert!(
        detail.starts_with("benchmark failed: throughput regressed: -"),
        "{detail}"
    );
    assert_has(detail, "(over the 10% allowed)");
    assert_has(
        detail,
        "the previous unit was restored and passed verification",
    );
    assert_eq!(report["benchmark"]["verdict"], "regressed");
    let stages = report["verification"]["stages"].as_array().unwrap();
    let last = stages.last().unwrap();
    assert_eq!(
        (&last["name"], &last["passed"]),
        (&"benchmark".into(), &false.into())
    );
    // The previous unit runs again, and its record (with its figures) is still the current one.
    let on_disk = lab().sh(THROUGHPUT, &format!("cat /etc/systemd/system/{unit}"));
    // The flag is gone from ExecStart (the stand-in's env still names it, as before).
    assert!(!on_disk.contains("\t--chunked-prefill-size"), "{on_disk}");
    assert_eq!(current(unit), baseline);
    stop(unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn with_the_gate_off_a_slower_change_converges_and_reports_the_drop() {
    let unit = "t-bench-gate-off.service";
    lab().remove_unit(THROUGHPUT, unit);
    let mut off = yaml(TINY);
    off["gate"] = false.into();
    let base = slowed("t-bench-gate-off", 37014).verify("benchmark", off);
    let (code, first) = apply_one_unit(&base);
    assert_eq!(code, 0, "{first}");
    let (code, report) = apply_one_unit(&slower(&base));
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["outcome"], "converged");
    assert_eq!(report["benchmark"]["verdict"], "regressed");
    let detail = report["detail"].as_str().unwrap();
    assert_has(
        detail,
        "; benchmark: throughput regressed (gate off: not rolled back): -",
    );
    let on_disk = lab().sh(THROUGHPUT, &format!("cat /etc/systemd/system/{unit}"));
    assert_has(&on_disk, "\t--chunked-prefill-size");
    // The slower figures are recorded: they are what runs now.
    let slower = tokens_at(&current(unit)["benchmark"], 4);
    assert!(slower < tokens_at(&first["benchmark"], 4), "{slower}");
    stop(unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn reconcile_bench_on_a_running_unit_records_a_baseline() {
    let unit = "t-bench-cli.service";
    lab().remove_unit(THROUGHPUT, unit);
    let text = slowed("t-bench-cli", 37015);
    let (code, report) = apply_one_unit(&text.clone().without_verify("benchmark"));
    assert_eq!(code, 0, "{report}");
    assert!(report.get("benchmark").is_none(), "{report}");
    assert!(current(unit).get("benchmark").is_none());
    let before = identity(unit);

    let run = Reconcile::new().manifest("a.yaml", &text);
    let ran = run.run_args(&["bench", "t-bench-cli", "--format", "json"]);
    assert_eq!(ran.code, 0, "{}\n{}", ran.stdout, ran.stderr);
    let host = &ran.json()["hosts"][0];
    assert_eq!(host["host"], THROUGHPUT);
    assert_eq!(host["stored"], true, "{host}");
    assert_eq!(host["benchmark"]["verdict"], "baseline");
    assert_has(&ran.stderr, "benchmark at 4: ");
    // No restart, and the figures are in the current record.
    assert_eq!(identity(unit), before);
    let record = current(unit);
    assert_eq!(
        tokens_at(&record["benchmark"], 4),
        tokens_at(&host["benchmark"], 4)
    );
    let text_run = run.run_args(&["bench", "t-bench-cli"]);
    assert_eq!(text_run.code, 0, "{}", text_run.stderr);
    assert_has(&text_run.stdout, ": baseline stored in ");
    // A second run compares with the first (within 10% or not: the stand-in's timing varies).
    assert_has(&text_run.stdout, "throughput ");

    // The manifest's benchmark changes nothing in the unit: apply has nothing to do...
    let (code, report) = apply_one_unit(&text);
    assert_eq!(
        (code, &report["outcome"]),
        (0, &"unchanged".into()),
        "{report}"
    );
    // ... and the next change is judged against the stored figures.
    let (code, report) = apply_one_unit(&slower(&text));
    assert_eq!(code, 3, "{report}");
    assert_eq!(report["failed_stage"], "benchmark");
    stop(unit);
}
