//! The quality gate (issue "Answers, not only uptime") against the SGLang stand-in's toy model
//! (fixtures/fake-sglang: `/generate` with logprobs, and knobs that degrade it on demand): a first
//! deployment records a reference, a neutral change passes at the noise floor, and each injected
//! degradation (logits perturbed by a flag, on the greedy path and at every position of the fixed
//! texts; retrieval broken past 4k tokens, for the needle and the long-context tasks; wrong
//! answers) is caught at stage `quality` and rolled back, or only reported with `gate: false`. The real
//! server's figures are in real_server/quality.rs.
//!
//! Host rl24 (with systemd_unit_files.rs); ports 37311-37319, GPUs 52-56 (`lab::QUALITY`).

use crate::builder::yaml;
use crate::lab::{assert_field_has, assert_has, assert_outcome, lab, Manifest, Reconcile};

const HOST: &str = "rl24";

/// The stand-in's logits move by up to 0.5 when the server runs this flag: a kernel that is
/// subtly wrong, switched on by a flag change.
const NOISY: [(&str, &str); 2] = [
    ("FAKE_SGLANG_LOGIT_NOISE", "0.5"),
    (
        "FAKE_SGLANG_NOISE_FLAG",
        "--enable-fused-moe-sum-all-reduce",
    ),
];

const CASES: &str = "{\"prompt\": \"What is 17 + 25?\", \"expect\": \"42\"}\n{\"prompt\": \"What is 9 * 8?\", \"regex\": \"\\\\b72\\\\b\"}\n{\"prompt\": \"What is 100 - 1?\", \"expect\": \"99\"}\n{\"prompt\": \"What is the capital of France?\", \"expect\": \"Paris\"}\n";

/// A service on one GPU with the quality gate's settings `quality` (YAML).
fn manifest(service: &str, port: u16, gpu: u16, quality: &str) -> Manifest {
    crate::lab::manifest(service, &[HOST])
        .without("description")
        .port(port)
        .flag("tp-size", 1)
        .flag("context-length", 16384)
        .without_env("NCCL_P2P_DISABLE")
        .env("CUDA_VISIBLE_DEVICES", gpu.to_string())
        .verify("crash_window", "2s")
        .verify("load_deadline", "60s")
        .verify("quality", yaml(quality))
}

fn apply(r: &Reconcile) -> (i32, serde_json::Value) {
    let ran = r.run_args(&["apply", "--no-deep", "--format", "json"]);
    (ran.code, ran.json()["units"][0].clone())
}

fn clean(unit: &str) {
    lab().sh(
        HOST,
        &format!(
            "systemctl disable --now {unit} 2>/dev/null; rm -rf /etc/systemd/system/{unit} /var/lib/reconcile/{unit}; systemctl daemon-reload; systemctl reset-failed {unit} 2>/dev/null; true"
        ),
    );
}

fn verdict(unit: &serde_json::Value) -> String {
    unit["quality"]["verdict"]
        .as_str()
        .unwrap_or_else(|| panic!("the report has the quality stage: {unit}"))
        .to_string()
}

fn argv(unit: &str) -> String {
    lab().sh(
        HOST,
        &format!("tr '\\0' ' ' < /proc/$(systemctl show -p MainPID --value {unit})/cmdline"),
    )
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_first_deployment_records_a_reference_and_a_neutral_change_passes_at_the_noise_floor() {
    let lab = lab();
    let (service, port, gpu) = ("t-q-neutral", 37311, 52);
    let unit = format!("{service}.service");
    clean(&unit);
    let q = "{ needle: { lengths: [1024, 8192] }, cases: cases.jsonl }";
    let first = Reconcile::new()
        .manifest("m.yaml", manifest(service, port, gpu, q))
        .manifest("cases.jsonl", CASES);
    let (code, u) = apply(&first);
    assert_outcome(code, &u, 0, "converged");
    assert_eq!(verdict(&u), "recorded", "{u}");
    let kept = lab.sh(
        HOST,
        &format!("stat -c '%a %s' /var/lib/reconcile/{unit}/quality/*.json"),
    );
    let (mode, size) = kept.trim().split_once(' ').unwrap();
    assert_eq!(mode, "600", "the reference is the host's alone");
    assert!(
        size.parse::<u64>().unwrap() > 1000,
        "tokens and logprobs are kept: {kept}"
    );

    // A change that restarts the server and changes nothing it computes.
    let neutral = Reconcile::new()
        .manifest(
            "m.yaml",
            manifest(service, port, gpu, q).flag("enable-metrics", true),
        )
        .manifest("cases.jsonl", CASES);
    // The pull request comment says the change will be judged on quality.
    let comment = neutral.run_args(&["plan", "--no-deep", "--format", "markdown"]);
    assert_eq!(comment.code, 2, "{}", comment.stderr);
    assert_has(&comment.stdout, "judged on quality");
    let (code, u) = apply(&neutral);
    assert_outcome(code, &u, 0, "converged");
    assert_eq!(verdict(&u), "passed", "{u}");
    assert!(
        u["quality"]["cost"]["wall_seconds"].as_f64().unwrap() > 0.0,
        "{u}"
    );
    let c = &u["quality"]["comparison"];
    assert_eq!(
        c["mean_kl"].as_f64(),
        Some(0.0),
        "the toy model is deterministic: {u}"
    );
    assert_eq!(c["identical_share"].as_f64(), Some(1.0), "{u}");
    assert_field_has(&u, "detail", "quality:");

    // history shows the quality figures per deployment.
    let history = neutral.run_args(&["history", service, "--format", "json"]);
    let deployments = &history.json()["hosts"][0]["deployments"];
    assert_eq!(
        deployments[1]["record"]["quality"]["verdict"], "passed",
        "{deployments}"
    );
    assert_eq!(
        deployments[1]["record"]["quality"]["kl_mean"].as_f64(),
        Some(0.0)
    );

    // `reconcile quality` measures the running server and keeps the reference.
    let measured = neutral.run_args(&["quality", service, "--format", "json"]);
    measured.assert_code(0);
    let host = &measured.json()["hosts"][0];
    assert!(
        host["stored"]
            .as_str()
            .unwrap()
            .starts_with(&format!("/var/lib/reconcile/{unit}/quality/")),
        "{host}"
    );
    assert_eq!(host["quality"]["verdict"], "passed", "{host}");
    clean(&unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn logits_perturbed_by_a_flag_change_are_rolled_back_at_stage_quality() {
    let (service, port, gpu) = ("t-q-noise", 37312, 53);
    let unit = format!("{service}.service");
    clean(&unit);
    let base =
        Reconcile::new().manifest("m.yaml", manifest(service, port, gpu, "{}").env_all(&NOISY));
    let (code, u) = apply(&base);
    assert_eq!((code, verdict(&u).as_str()), (0, "recorded"), "{u}");

    let noisy = Reconcile::new().manifest(
        "m.yaml",
        manifest(service, port, gpu, "{}")
            .env_all(&NOISY)
            .flag("enable-fused-moe-sum-all-reduce", true),
    );
    let (code, u) = apply(&noisy);
    assert_eq!(code, 3, "{u}");
    assert_eq!(u["outcome"], "rolled_back", "{u}");
    assert_eq!(u["failed_stage"], "quality", "{u}");
    assert_eq!(u["error"], "verification_failed", "{u}");
    assert_eq!(verdict(&u), "failed");
    let mean = u["quality"]["comparison"]["mean_kl"].as_f64().unwrap();
    let threshold = u["quality"]["threshold"].as_f64().unwrap();
    assert!(mean > threshold, "{mean} > {threshold}: {u}");
    // Every position of the fixed texts moved too, and the report names where most.
    let texts = &u["quality"]["texts"];
    let text_kl = texts["mean_kl"].as_f64().unwrap();
    let text_threshold = u["quality"]["text_threshold"].as_f64().unwrap();
    assert!(
        text_kl > text_threshold,
        "{text_kl} > {text_threshold}: {u}"
    );
    assert_eq!(texts["moved_most"].as_array().map(Vec::len), Some(5), "{u}");
    assert!(
        texts["moved_most"][0]["token"].is_string(),
        "the position is shown with its token: {u}"
    );
    assert!(
        !argv(&unit).contains("--enable-fused-moe-sum-all-reduce"),
        "the previous unit runs again"
    );
    clean(&unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn retrieval_broken_past_4k_tokens_is_caught_by_the_needle_and_the_long_context_tasks() {
    let (service, port, gpu) = ("t-q-needle", 37313, 54);
    let unit = format!("{service}.service");
    clean(&unit);
    let q = "{ needle: { lengths: [1024, 8192] }, long_context: { lengths: [1024, 8192] } }";
    let base = Reconcile::new().manifest("m.yaml", manifest(service, port, gpu, q));
    let (code, u) = apply(&base);
    assert_eq!((code, verdict(&u).as_str()), (0, "recorded"), "{u}");
    // A reader that sees everything finds every item of every task.
    let detail = u["quality"]["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("long context 64/64"), "{u}");

    let broken = Reconcile::new().manifest(
        "m.yaml",
        manifest(service, port, gpu, q).env("FAKE_SGLANG_RETRIEVAL_TOKENS", "4096"),
    );
    let (code, u) = apply(&broken);
    assert_eq!(
        (code, u["failed_stage"].as_str()),
        (3, Some("quality")),
        "{u}"
    );
    let reasons = u["quality"]["reasons"].to_string();
    assert!(
        reasons.contains("8192"),
        "the failing length is named: {reasons}"
    );
    assert!(
        !reasons.contains("1024"),
        "below 4k it still retrieves: {reasons}"
    );
    for task in ["multi_key", "variable_tracking"] {
        assert!(
            reasons.contains(&format!("long context {task} at 8192")),
            "each retrieval task fails past 4k: {reasons}"
        );
    }
    // The aggregation still holds: the ten common words are as common in the half it reads.
    assert!(!reasons.contains("common_words"), "{reasons}");
    clean(&unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn wrong_answers_are_caught_by_the_cases_and_with_gate_off_only_reported() {
    let (service, port, gpu) = ("t-q-cases", 37314, 55);
    let unit = format!("{service}.service");
    clean(&unit);
    let on = "{ cases: cases.jsonl }";
    let off = "{ cases: cases.jsonl, gate: false }";
    let wrong = [("FAKE_SGLANG_WRONG_ANSWERS", "1")];
    let run = |env: &[(&str, &str)], q: &str| {
        apply(
            &Reconcile::new()
                .manifest("m.yaml", manifest(service, port, gpu, q).env_all(env))
                .manifest("cases.jsonl", CASES),
        )
    };
    let (code, u) = run(&[], on);
    assert_eq!((code, verdict(&u).as_str()), (0, "recorded"), "{u}");
    assert_eq!(u["quality"]["cases"]["now"]["passed"], 4, "{u}");

    let (code, u) = run(&wrong, on);
    assert_eq!(
        (code, u["failed_stage"].as_str()),
        (3, Some("quality")),
        "{u}"
    );
    assert!(u["quality"]["reasons"].to_string().contains("cases"), "{u}");

    let (code, u) = run(&wrong, off);
    assert_outcome(code, &u, 0, "converged");
    assert_eq!(verdict(&u), "failed", "measured and reported: {u}");
    assert!(
        u["quality"]["detail"]
            .as_str()
            .unwrap()
            .contains("gate off"),
        "{u}"
    );
    clean(&unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_missing_or_malformed_cases_file_is_an_offline_error_with_file_and_line() {
    let q = "{ cases: cases.jsonl }";
    let text = manifest("t-q-bad", 37315, 56, q);
    let missing = Reconcile::new()
        .manifest("m.yaml", &text)
        .run_offline(&["validate"]);
    assert_eq!(missing.code, 1, "{}", missing.stderr);
    assert!(
        missing.stderr.contains("manifests/m.yaml:")
            && missing.stderr.contains("verify.quality.cases"),
        "{}",
        missing.stderr
    );
    let malformed = Reconcile::new()
        .manifest("m.yaml", &text)
        .manifest(
            "cases.jsonl",
            "{\"prompt\": \"a\", \"expect\": \"b\"}\nnot json\n",
        )
        .run_args(&["plan"]);
    assert_eq!(malformed.code, 1, "{}", malformed.stderr);
    assert_has(&malformed.stderr, "cases.jsonl:2");
    assert!(
        !malformed.stderr.contains("rl24"),
        "no host was contacted: {}",
        malformed.stderr
    );
}
