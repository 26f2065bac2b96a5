//! Experiments (issue 25) against the SGLang stand-in on their own host (`EXPERIMENT`, port
//! 37511, one GPU): four variants (one faster, one slower, one failing at start with a CUDA OOM,
//! one degrading answers) ranked between two baseline measurements, the failures rolled back and
//! listed with their diagnoses, the baseline left running, and the winner written into the
//! manifest with its comments; SIGTERM in the middle of a variant and `--resume`; and a bad flag
//! in one variant reported offline at its line.
//!
//! The stand-in streams at 200 tok/s per request; `FAKE_SGLANG_SLOW_FLAG` multiplies its rates
//! by 2 with `--enable-mixed-chunk` and by 0.5 with `--chunked-prefill-size`, and its logits move
//! (the quality gate's KL fails) with `--enable-fused-moe-sum-all-reduce`.

use std::time::Duration;

use crate::lab::{assert_field_has, assert_has, lab, names_in, Ran, Reconcile, EXPERIMENT};

const UNIT: &str = "t-exp.service";

/// The experiment host's unit is one: its tests take turns.
fn exclusive() -> std::sync::MutexGuard<'static, ()> {
    static HOST: std::sync::Mutex<()> = std::sync::Mutex::new(());
    HOST.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The manifest, with comments and a layout `--write` must keep (text, not a
/// [`crate::builder::Manifest`]: the test compares it byte for byte).
fn manifest() -> String {
    manifest_with("")
}

/// [`manifest`] with `more_flags` lines after its last flag: what `--write` should make of it.
fn manifest_with(more_flags: &str) -> String {
    format!(
        "# The experiment's service. This comment must survive --write.\n\
         service: t-exp\n\
         hosts: [{EXPERIMENT}]\n\
         sglang:\n\
         \x20 python: /usr/bin/python3\n\
         \x20 version: 0.5.23\n\
         \x20 model_path: /models/test\n\
         \x20 served_model_name: test-model\n\
         \x20 port: 37511\n\
         \x20 flags:\n\
         \x20   tp-size: 1        # one GPU\n\
         \x20   # keep the context short: the stand-in's needle runs at 1k\n\
         \x20   context-length: 16384\n\
         {more_flags}\
         \n\
         env: {{ CUDA_VISIBLE_DEVICES: \"0\", FAKE_SGLANG_GPU_COUNT: \"8\", FAKE_SGLANG_LOAD_SECONDS: \"1\", FAKE_SGLANG_SLOW_FLAG: \"--enable-mixed-chunk=2.0,--chunked-prefill-size=0.5\", FAKE_SGLANG_LOGIT_NOISE: \"0.5\", FAKE_SGLANG_NOISE_FLAG: \"--enable-fused-moe-sum-all-reduce\" }}\n\
         systemd: {{ Restart: \"no\" }}\n\
         verify:\n\
         \x20 crash_window: 3s\n\
         \x20 sample_interval: 500ms\n\
         \x20 stall_timeout: 5s\n\
         \x20 load_deadline: 30s\n\
         \x20 # the greedy path catches the noisy variant; the fixed texts' cost is the gate's own,\n\
         \x20 # measured in quality.rs, and would count here as the experiment's overhead\n\
         \x20 quality: {{ texts: false }}\n"
    )
}

/// The experiment: `variants` as written under `variants:`.
fn experiment(variants: &str) -> String {
    format!(
        "manifest: manifests/t-exp.yaml\n\
         host: {EXPERIMENT}\n\
         benchmark: {{ levels: [1, 4], prompt_tokens: 16, output_tokens: 64, requests: 16 }}\n\
         objective: {{ metric: output_tokens_per_s, concurrency: 4 }}\n\
         constraints: {{ ttft_p99: 2s, quality: true, levels: {{ 4: {{ ttft_p99: 3s }} }} }}\n\
         # Baselines over an SSH forward on two cores: up to 27 % apart run alone, 29 % beside other\n\
         # tests; trusted up to three times that (the file allows under 100). Variants are 2x apart.\n\
         noise_percent: 90\n\
         budget: 30m\n\
         variants:\n{variants}"
    )
}

const FOUR: &str = "  - name: chunked-prefill\n    flags: { chunked-prefill-size: 4096 }\n  - name: oom\n    env: { FAKE_SGLANG_FAIL: oom, FAKE_SGLANG_FAIL_AT: \"1\", FAKE_SGLANG_OOM_CAP_MB: \"300\", FAKE_SGLANG_LOAD_SECONDS: \"3\" }\n  - name: fused-moe\n    flags: { enable-fused-moe-sum-all-reduce: true }\n  - name: mixed-chunk\n    flags:\n      enable-mixed-chunk: true\n";

fn clean() {
    lab().sh(
        EXPERIMENT,
        &format!(
            "systemctl disable --now {UNIT} 2>/dev/null; rm -rf /etc/systemd/system/{UNIT} /var/lib/reconcile/{UNIT}; systemctl daemon-reload; systemctl reset-failed {UNIT} 2>/dev/null; true"
        ),
    );
}

fn setup(variants: &str) -> Reconcile {
    clean();
    let r = Reconcile::new().manifest("t-exp.yaml", manifest());
    std::fs::write(r.dir().join("experiment.yaml"), experiment(variants)).unwrap();
    // The baseline, deployed as an operator would have it before experimenting.
    let ran = r.run_args(&["apply", "--format", "json"]);
    ran.assert_code(0);
    r
}

/// The argv the unit's server runs with now.
fn argv() -> String {
    lab().sh(
        EXPERIMENT,
        &format!("tr '\\0' ' ' < /proc/$(systemctl show -p MainPID --value {UNIT})/cmdline"),
    )
}

/// `reconcile experiment experiment.yaml` in `r`'s folder with `extra` arguments and a JSON
/// report, which must end with exit code 0: how it ran and the report.
fn run_experiment(r: &Reconcile, extra: &[&str]) -> (Ran, serde_json::Value) {
    let mut args = vec!["experiment", "experiment.yaml"];
    args.extend(extra);
    args.extend(["--format", "json"]);
    let ran = r.run_args(&args);
    let json = ran.json();
    assert_eq!(ran.code, 0, "{json:#}\n{}", ran.stderr);
    (ran, json)
}

fn variant<'a>(json: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    json["variants"]
        .as_array()
        .and_then(|v| v.iter().find(|r| r["name"] == name))
        .unwrap_or_else(|| panic!("no variant {name}: {json:#}"))
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn four_variants_are_ranked_failures_rolled_back_and_the_winner_written() {
    let _host = exclusive();
    let r = setup(FOUR);
    let (ran, json) = run_experiment(&r, &["--write", "--chart", "chart.svg"]);
    assert!(
        ran.stderr.contains("4 variants, about "),
        "the estimate before the start: {}",
        ran.stderr
    );

    // The ranking: the faster one first, the slower second; the two that failed unranked.
    let ranking: Vec<(String, serde_json::Value)> = json["ranking"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["name"].as_str().unwrap().to_string(), r["rank"].clone()))
        .collect();
    assert_eq!(
        ranking[..2],
        [
            ("mixed-chunk".to_string(), serde_json::json!(1)),
            ("chunked-prefill".to_string(), serde_json::json!(2)),
        ],
        "{json:#}"
    );
    assert!(
        ranking[2..].iter().all(|(_, rank)| rank.is_null()),
        "{json:#}"
    );
    let base = json["baseline"]["levels"][1]["output_tokens_per_s"]
        .as_f64()
        .unwrap();
    let fast = variant(&json, "mixed-chunk")["levels"][1]["output_tokens_per_s"]
        .as_f64()
        .unwrap();
    let slow = variant(&json, "chunked-prefill")["levels"][1]["output_tokens_per_s"]
        .as_f64()
        .unwrap();
    eprintln!(
        "tok/s at 4: baseline {base:.1}, mixed-chunk {fast:.1}, chunked-prefill {slow:.1}; drift {}",
        json["drift"]
    );
    // What the constraint `ttft_p99: 2s` judged: the slowest first token of each measured run.
    let ttft: Vec<f64> = std::iter::once(&json["baseline"])
        .chain(json["variants"].as_array().into_iter().flatten())
        .flat_map(|r| r["levels"].as_array().cloned().unwrap_or_default())
        .filter_map(|l| l["ttft_p99_ms"].as_f64())
        .collect();
    eprintln!("ttft p99 (ms): {ttft:?}");
    // Against the first baseline, each on its side of it: the stand-in doubles and halves its
    // rate, but what the client measures of that moves with the machine's load (a CI run measured
    // the doubled rate only 1.28x the baseline, run alone), so only the direction is asserted.
    assert!(fast > base && slow < base, "{base} {fast} {slow}");
    for (name, sign) in [("mixed-chunk", 1.0), ("chunked-prefill", -1.0)] {
        let vs = json["ranking"]
            .as_array()
            .and_then(|r| r.iter().find(|r| r["name"] == name))
            .and_then(|r| r["vs_baseline"].as_f64())
            .unwrap_or_else(|| panic!("{name} has no vs_baseline: {json:#}"));
        assert!(vs * sign > 0.0, "{name}: {vs} % against the baseline");
    }

    // The OOM: rolled back, with the journal's diagnosis.
    let oom = variant(&json, "oom");
    assert_eq!(oom["status"], "rolled_back", "{oom:#}");
    assert_field_has(oom, "diagnosis", "out of memory");
    // The degraded answers: rolled back at the quality gate.
    let noisy = variant(&json, "fused-moe");
    assert_eq!(noisy["status"], "rolled_back", "{noisy:#}");
    assert_eq!(noisy["failed_stage"], "quality", "{noisy:#}");
    assert_eq!(noisy["quality"], "failed", "{noisy:#}");

    // Drift checked, winner named, the baseline running again.
    assert_eq!(json["drift"]["trusted"], true, "{json:#}");
    assert_eq!(json["winner"], "mixed-chunk");
    assert_eq!(json["left_running"], "baseline");
    let running = argv();
    for flag in [
        "--enable-mixed-chunk",
        "--chunked-prefill-size",
        "--enable-fused-moe-sum-all-reduce",
    ] {
        assert!(!running.contains(flag), "{running}");
    }
    assert_eq!(
        lab()
            .sh(EXPERIMENT, &format!("systemctl is-active {UNIT}"))
            .trim(),
        "active"
    );
    assert!(
        !lab()
            .sh(EXPERIMENT, &format!("ls /var/lib/reconcile/{UNIT}"))
            .contains("experiment.json"),
        "a finished experiment leaves no state to resume"
    );

    // The experiment's own overhead per variant, outside the server's time: measured 1.1 s beside
    // other tests, under a third of the bound.
    let overhead = json["overhead_per_variant"].as_f64().unwrap();
    eprintln!("overhead per variant: {overhead:.2} s");
    assert!(overhead < 5.0, "{overhead}");

    // The manifest: exactly the winner's one line more, every comment kept.
    let written = std::fs::read_to_string(r.dir().join("manifests/t-exp.yaml")).unwrap();
    assert_eq!(written, manifest_with("    enable-mixed-chunk: true\n"));
    let diff = json["manifest_diff"].as_str().unwrap();
    assert_has(diff, "\n+    enable-mixed-chunk: true\n");

    // The best run at each level, under that level's constraints: at 4, the winner.
    let best: Vec<(u64, &str)> = json["best_per_level"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| {
            (
                b["concurrency"].as_u64().unwrap(),
                b["name"].as_str().unwrap_or("none"),
            )
        })
        .collect();
    assert_eq!(best.len(), 2, "{json:#}");
    assert_eq!(best[1], (4, "mixed-chunk"), "{json:#}");
    // The trade-off: the three measured runs at both levels; the most tok/s of all is on the
    // front whatever its latency.
    let points = json["trade_offs"].as_array().unwrap();
    assert_eq!(points.len(), 6, "{json:#}");
    let top = points
        .iter()
        .find(|p| p["name"] == "mixed-chunk" && p["concurrency"] == 4)
        .unwrap();
    assert_eq!(top["dominated"], false, "{json:#}");

    // The chart: one line per measured run (two baselines are one series; the failures none),
    // then the trade-off below it, its front joined by one more.
    let svg = std::fs::read_to_string(r.dir().join("chart.svg")).unwrap();
    assert_eq!(svg.matches("<polyline").count(), 4, "{svg}");
    assert_has(&svg, ">mixed-chunk@4</text>");
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn sigterm_in_a_variant_restores_the_baseline_and_resume_finishes() {
    let _host = exclusive();
    // The first variant loads for 6 s: the signal comes while it is being verified.
    let variants = "  - name: slow-load\n    flags: { chunked-prefill-size: 4096 }\n    env: { FAKE_SGLANG_LOAD_SECONDS: \"6\" }\n  - name: mixed-chunk\n    flags: { enable-mixed-chunk: true }\n";
    let r = setup(variants);
    let run = r.args(&["experiment", "experiment.yaml", "--format", "json"]);
    let (ran, json) = crate::lab::signalled(
        &run,
        (EXPERIMENT, UNIT),
        "-TERM",
        Duration::from_secs(60),
        Duration::from_secs(2),
    );
    assert_eq!(ran.code, 3, "{json:#}\n{}", ran.stderr);
    assert_eq!(json["interrupted"], true, "{json:#}");
    assert_eq!(
        json["variants"].as_array().map(Vec::len),
        Some(0),
        "{json:#}"
    );
    // The baseline back, verified by apply's rollback: running, without the variant's flag.
    assert_eq!(
        lab()
            .sh(EXPERIMENT, &format!("systemctl is-active {UNIT}"))
            .trim(),
        "active"
    );
    assert!(!argv().contains("--chunked-prefill-size"), "{}", argv());
    assert!(lab()
        .sh(EXPERIMENT, &format!("ls /var/lib/reconcile/{UNIT}"))
        .contains("experiment.json"));

    let (resumed, json) = run_experiment(&run, &["--resume"]);
    assert_has(&resumed.stderr, "resuming: 0 of 2 variants done");
    let names = names_in(&json["variants"]);
    assert_eq!(names, ["slow-load", "mixed-chunk"]);
    assert_eq!(json["winner"], "mixed-chunk");
    assert!(!argv().contains("--enable-mixed-chunk"));

    // Nothing left to resume now.
    let again = run.run_args(&["experiment", "experiment.yaml", "--resume"]);
    assert_eq!(again.code, 1, "{}", again.stderr);
    assert_has(&again.stderr, "no interrupted experiment");
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn an_unknown_flag_in_one_variant_is_reported_at_its_line_and_nothing_starts() {
    let _host = exclusive();
    clean();
    let r = Reconcile::new().manifest("t-exp.yaml", manifest());
    let variants = "  - name: good\n    flags: { enable-mixed-chunk: true }\n  - name: typo\n    flags:\n      enable-mixed-chunks: true\n";
    std::fs::write(r.dir().join("experiment.yaml"), experiment(variants)).unwrap();
    let ran = r.run_args(&["experiment", "experiment.yaml"]);
    ran.assert_code(1);
    // Line 15 of the experiment file: `enable-mixed-chunks: true`.
    assert_has(
        &ran.stderr,
        "experiment.yaml:15:7: variants[1].flags.enable-mixed-chunks: variant `typo`:",
    );
    assert_has(&ran.stderr, "no host was contacted");
    assert_eq!(
        lab()
            .sh(EXPERIMENT, &format!("systemctl is-active {UNIT} || true"))
            .trim(),
        "inactive"
    );
    assert_eq!(
        lab()
            .sh(
                EXPERIMENT,
                &format!("ls /var/lib/reconcile/{UNIT} 2>/dev/null | wc -l")
            )
            .trim(),
        "0"
    );
}
