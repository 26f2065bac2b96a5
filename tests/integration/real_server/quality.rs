//! The quality gate on the real SGLang 0.5.23 server (its native `/generate`, logprobs and
//! teacher-forced scoring on the CPU engine): a first deployment records a reference, neutral
//! changes pass at the noise floor (none fails: the real server scores its own tokens the same
//! way every time), and the same model saved with perturbed weights is measured and rolled back
//! at stage `quality` with the default thresholds.

use super::{slots, Service, HOSTS, ROOT};
use crate::builder::yaml;
use crate::lab::lab;

/// `verify.quality`: sixteen greedy tokens per prompt keep the stage a few seconds on the CPU
/// engine.
fn quality_gate() -> serde_yaml::Value {
    yaml("{ max_new_tokens: 16 }")
}

/// Copies the tiny model to `dst` with every weight matrix moved by Gaussian noise of its own
/// standard deviation (seeded): the same architecture, tokenizer and name, other numbers. The
/// host's own Python (the tier's venv) does it.
const PERTURB: &str = r#"
import os, shutil, sys, torch
from safetensors.torch import load_file, save_file
src, dst = sys.argv[1], sys.argv[2]
shutil.rmtree(dst, ignore_errors=True)
shutil.copytree(src, dst)
path = os.path.join(dst, "model.safetensors")
weights = load_file(path)
g = torch.Generator().manual_seed(7)
for name, w in weights.items():
    if w.is_floating_point() and w.dim() >= 2:
        noise = torch.randn(w.shape, generator=g) * w.float().std()
        weights[name] = (w.float() + noise).to(w.dtype)
save_file(weights, path, metadata={"format": "pt"})
"#;

fn quality(report: &serde_json::Value) -> &serde_json::Value {
    let q = &report["quality"];
    assert!(
        q.is_object(),
        "the report has the quality stage: {report:#}"
    );
    q
}

/// Neutral changes: each restarts `base` with a batch limit that the stage's requests (eight at
/// a time) never reach, so nothing it computes changes.
fn neutral_changes(base: impl Fn() -> Service<'static>, limits: std::ops::Range<u32>) -> Vec<f64> {
    let mut kls = Vec::new();
    for limit in limits {
        let s = base().flag("max-running-requests", limit);
        let report = converge(&s);
        let q = quality(&report);
        assert_eq!(q["verdict"], "passed", "neutral change {limit}: {report:#}");
        let kl = q["comparison"]["mean_kl"].as_f64().unwrap();
        let threshold = q["threshold"].as_f64().unwrap();
        assert!(kl <= threshold, "{kl} <= {threshold}");
        let cost = &q["cost"];
        let (server, client) = (
            cost["server_seconds"].as_f64().unwrap(),
            cost["client_seconds"].as_f64().unwrap(),
        );
        eprintln!(
            "quality, real server, neutral change max-running-requests {limit}: KL mean {kl:.6}, floor {}, threshold {threshold}, {} of greedy tokens identical; stage {:.1}s: wall {:.3}s, server {server:.3}s, client {client:.4}s",
            q["floor"], q["comparison"]["identical_share"], stage_seconds(&report), cost["wall_seconds"].as_f64().unwrap()
        );
        assert!(
            server > 0.0 && client < server,
            "the client costs less than its requests' server time: {cost}"
        );
        kls.push(kl);
    }
    kls
}

/// Applies without the deep check (its seconds of imports show nothing about answers) and asserts
/// the unit converged.
fn converge(s: &Service<'_>) -> serde_json::Value {
    let (code, report) = s.apply_with(&s.manifest(), &["--no-deep"]);
    assert_eq!(
        (code, report["outcome"].as_str()),
        (0, Some("converged")),
        "{report:#}"
    );
    report
}

fn stage_seconds(report: &serde_json::Value) -> f64 {
    let stages = report["verification"]["stages"].as_array().unwrap();
    let at = |name: &str| {
        stages
            .iter()
            .find(|s| s["name"] == name)
            .and_then(|s| s["seconds"].as_f64())
    };
    at("quality").unwrap_or(0.0) - at("memory").or(at("readiness")).unwrap_or(0.0)
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_reference_then_five_neutral_changes_pass_and_perturbed_weights_are_rolled_back() {
    let _slot = slots(1);
    let (name, host, port) = ("t-rs-quality", HOSTS[0], 38021);
    let s = Service::new(name, host, port).verify("quality", quality_gate());
    let _stopped = s.fresh();
    let first = converge(&s);
    assert_eq!(quality(&first)["verdict"], "recorded", "{first:#}");

    let base = || Service::new(name, host, port).verify("quality", quality_gate());
    let kls = neutral_changes(base, 8..13);
    assert_eq!(kls.len(), 5);

    // The same model with perturbed weights, under the same name: it starts, serves the right
    // model, answers, and is not slower; only its numbers moved.
    lab().sh(
        host,
        &format!(
            "env {} {ROOT}/bin/python3 - {ROOT}/tiny-model /models/tiny-perturbed <<'EOF'\n{PERTURB}\nEOF",
            super::tier_env_words()
        ),
    );
    let perturbed = Service::new(name, host, port).verify("quality", quality_gate());
    let text = perturbed.manifest().model_path("/models/tiny-perturbed");
    let before = perturbed.invocation();
    let (code, report) = perturbed.apply_with(&text, &["--no-deep"]);
    assert_eq!(code, 3, "{report:#}");
    assert_eq!(report["failed_stage"], "quality", "{report:#}");
    let q = quality(&report);
    let kl = q["comparison"]["mean_kl"].as_f64().unwrap();
    let threshold = q["threshold"].as_f64().unwrap();
    eprintln!(
        "quality, real server, perturbed weights: KL mean {kl:.6} (worst {}), threshold {threshold}, {} of greedy tokens identical",
        q["comparison"]["worst_kl"], q["comparison"]["identical_share"]
    );
    assert!(kl > threshold, "{kl} > {threshold}");
    assert_eq!(report["outcome"], "rolled_back", "{report:#}");
    assert_ne!(
        perturbed.invocation(),
        before,
        "the previous unit was started again"
    );
    assert!(
        perturbed
            .unit_file()
            .contains(&format!("{ROOT}/tiny-model")),
        "the previous unit is back"
    );
    crate::lab::sh_quietly(host, "rm -rf /models/tiny-perturbed");
    s.stop();
}

/// Five more neutral changes, on a manifest that asks for live changes (which a batch limit is
/// not); then live changes on the real CPU engine: checkpoints moved (`/update_weights_from_disk`),
/// a copy of the model passing the quality gate without a restart and the perturbed weights
/// failing it and put back live, the same process serving the previous checkpoint again; the
/// pipeline micro-batch size set (`/set_internal_state`), read back from `/server_info`; and
/// `status` in sync after them, read back from the server, until a value is changed by hand.
#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn five_more_neutral_changes_pass_and_changes_apply_live_on_the_other_host() {
    let _slot = slots(1);
    let (name, host, port) = ("t-rs-quality2", HOSTS[1], 38022);
    // `--pp-max-micro-batch-size` from the start: `/set_internal_state` can change it, not set it
    // back to SGLang's own default (`reconcile_core::live`).
    let base = || {
        Service::new(name, host, port)
            .verify("quality", quality_gate())
            .flag("pp-max-micro-batch-size", 4)
            .live()
    };
    let s = base();
    let _stopped = s.fresh();
    assert_eq!(quality(&converge(&s))["verdict"], "recorded");
    let kls = neutral_changes(base, 13..18);
    assert_eq!(kls.len(), 5);

    let (copy, perturbed) = ("/models/tiny-copy", "/models/tiny-perturbed2");
    lab().sh(
        host,
        &format!(
            "rm -rf {copy} && cp -r {ROOT}/tiny-model {copy} && env {} {ROOT}/bin/python3 - {ROOT}/tiny-model {perturbed} <<'EOF'\n{PERTURB}\nEOF",
            super::tier_env_words()
        ),
    );
    let last = base().flag("max-running-requests", 17);
    let started = last.invocation();
    let moved = last.manifest().model_path(copy);
    let (code, report) = last.apply_with(&moved, &["--no-deep"]);
    eprintln!(
        "quality, real server, live move to a copy: {}",
        report["detail"]
    );
    assert_eq!(
        (code, &report["outcome"]),
        (0, &"converged".into()),
        "{report:#}"
    );
    assert!(
        report["detail"].as_str().is_some_and(|d| d
            .starts_with("applied live, no restart (weights loaded from /models/tiny-copy in ")),
        "{report:#}"
    );
    assert_eq!(quality(&report)["verdict"], "passed", "{report:#}");
    assert_eq!(last.invocation(), started, "no restart");

    let (code, report) = last.apply_with(&last.manifest().model_path(perturbed), &["--no-deep"]);
    eprintln!(
        "quality, real server, live move to perturbed weights: {}",
        report["detail"]
    );
    assert_eq!(code, 3, "{report:#}");
    assert_eq!(
        (&report["outcome"], &report["failed_stage"]),
        (&"rolled_back".into(), &"quality".into()),
        "{report:#}"
    );
    assert!(
        report["detail"]
            .as_str()
            .is_some_and(|d| d
                .contains("put back live, no restart (weights loaded from /models/tiny-copy in ")),
        "{report:#}"
    );
    assert_eq!(last.invocation(), started, "no restart");
    assert!(last.unit_file().contains(copy), "the previous unit is back");
    // The same process serves the copy again.
    let served = lab().sh(
        host,
        &format!(
            r#"python3 -c 'import json, urllib.request as u; print(json.load(u.urlopen("http://127.0.0.1:{port}/v1/models"))["data"][0]["id"])'"#
        ),
    );
    assert_eq!(served.trim(), copy);

    // A value `/set_internal_state` takes, applied live and read back.
    let valued = moved.flag("pp-max-micro-batch-size", 8);
    let (code, report) = last.apply_with(&valued, &["--no-deep"]);
    eprintln!("quality, real server, live value: {}", report["detail"]);
    assert_eq!(
        (code, &report["outcome"]),
        (0, &"converged".into()),
        "{report:#}"
    );
    assert_eq!(last.invocation(), started, "no restart");
    let size = lab().sh(
        host,
        &format!(
            r#"python3 -c 'import json, urllib.request as u; print(json.load(u.urlopen("http://127.0.0.1:{port}/server_info"))["internal_states"][0]["pp_max_micro_batch_size"])'"#
        ),
    );
    assert_eq!(size.trim(), "8");

    // `status` after the live applies: the server still runs the command line it started with
    // (the original checkpoint, size 4), and holds what it was told since (the copy, by the move
    // whose failed successor was put back, and size 8): in sync, read back from the server.
    let (code, unit) = status(&valued);
    eprintln!("quality, real server, status after the live applies: {unit}");
    assert_eq!(
        (code, &unit["classes"]),
        (0, &serde_json::json!(["in_sync"])),
        "{unit:#}"
    );
    let details = unit["details"].to_string();
    assert!(
        details.contains(
            "applied live: weights from /models/tiny-copy, --pp-max-micro-batch-size 8 set; the server"
        ),
        "{unit:#}"
    );
    // The value changed on the server by hand: no longer what the unit says, named.
    let (answer, body) = last.http(
        "POST",
        "/set_internal_state",
        Some(r#"{"server_args": {"pp_max_micro_batch_size": 4}}"#),
        None,
    );
    assert!(
        answer == 200 && body.contains("true") && !body.contains("false"),
        "{answer} {body}"
    );
    let (code, unit) = status(&valued);
    eprintln!("quality, real server, status after a value set by hand: {unit}");
    assert_eq!(
        (code, &unit["classes"]),
        (2, &serde_json::json!(["not_restarted"])),
        "{unit:#}"
    );
    assert!(
        unit["details"].to_string().contains(
            "does not hold what the live apply told it: --pp-max-micro-batch-size is 4 on the server, the live apply set 8"
        ),
        "{unit:#}"
    );
    crate::lab::sh_quietly(host, &format!("rm -rf {copy} {perturbed}"));
    s.stop();
}

/// `reconcile status --format json` of `text`: the exit code and the unit's status.
fn status(text: &crate::lab::Manifest) -> (i32, serde_json::Value) {
    let ran = crate::lab::Reconcile::new()
        .manifest("a.yaml", text)
        .args(&["status", "--format", "json"])
        .run();
    let json = ran.json();
    (ran.code, json["units"][0].clone())
}
