//! Preflight against a real host: what the host lacks for a unit shows in the plan (exit 1), and
//! `apply` refuses the unit without touching the host. Units here are `t-pre-*` on ports 33000+.

use std::sync::Once;

use crate::builder::STAND_IN_VERIFY;
use crate::lab::{
    assert_has, assert_starts_with, install_rendered, lab, manifest, run_on, venv_script, Manifest,
    Reconcile, ESCAPING,
};

const HOST: &str = ESCAPING;

/// Two more "Pythons" on the host, each reporting another SGLang version while running the same
/// stand-in package: venvs as `python3 -m venv --system-site-packages` lays them out, each holding
/// only `sglang-<v>.dist-info`. `importlib.metadata` returns the first distribution it finds on
/// `sys.path`, the venv's, so `version('sglang')` says `<v>`, while `import sglang` still finds
/// the stand-in in the system's dist-packages, as a venv with another SGLang would run its own.
fn other_pythons() {
    static SETUP: Once = Once::new();
    SETUP.call_once(|| {
        for v in ["0.5.9", "0.6.0"] {
            lab().sh(HOST, &venv_script(&format!("/opt/t-pre-py-{v}"), Some(v)));
        }
        let script = "/opt/t-pre-py-0.5.9/bin/python3 -c \"from importlib.metadata import version; print(version('sglang'))\"";
        assert_eq!(lab().sh(HOST, script).trim(), "0.5.9");
    });
}

/// A test manifest on the preflight host, with its own port.
fn service(name: &str, port: u16) -> Manifest {
    manifest(name, &[HOST]).port(port)
}

fn plan_json(manifests: &[(&str, &Manifest)], extra: &[&str]) -> (i32, serde_json::Value, String) {
    let mut run = Reconcile::new();
    for (name, text) in manifests {
        run = run.manifest(name, text);
    }
    let ran = run.args(&["plan", "--format", "json"]).args(extra).run();
    let json = ran.json();
    (ran.code, json, ran.stderr)
}

/// The preflight findings of the plan's units: (check, severity, message).
fn findings(unit: &serde_json::Value) -> Vec<(String, String, String)> {
    unit["preflight"]
        .as_array()
        .unwrap_or_else(|| panic!("no preflight in {unit:#}"))
        .iter()
        .map(|f| {
            let s = |k: &str| f[k].as_str().unwrap().to_string();
            (s("check"), s("severity"), s("message"))
        })
        .collect()
}

fn messages_of(unit: &serde_json::Value, check: &str) -> Vec<String> {
    findings(unit)
        .into_iter()
        .filter(|(c, _, _)| c == check)
        .map(|(_, _, m)| m)
        .collect()
}

/// The path of a kept file that `-v`'s line `said` names: what follows `said`, up to `)` or a space.
fn cached_path(stderr: &str, said: &str) -> Option<String> {
    let line = stderr.lines().find(|l| l.contains(said))?;
    let path = line.split(said).nth(1)?;
    Some(path.split([')', ' ']).next()?.to_string())
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_clean_unit_has_no_findings() {
    let (code, json, _) = plan_json(&[("a.yaml", &service("t-pre-clean", 33000))], &[]);
    assert_eq!(code, 2, "{json:#}");
    assert_eq!(findings(&json["units"][0]), []);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn another_sglang_version_on_the_host_names_both_and_fails_the_plan() {
    other_pythons();
    // --enable-tf32-matmul is new in 0.5.23: right for the manifest, unknown to the host's 0.5.9.
    let text = service("t-pre-version", 33001)
        .flag("enable-tf32-matmul", true)
        .python("/opt/t-pre-py-0.5.9/bin/python3");
    let (code, json, stderr) = plan_json(&[("a.yaml", &text)], &[]);
    assert_eq!(code, 1, "{json:#}{stderr}");
    let unit = &json["units"][0];
    assert_eq!(
        messages_of(unit, "sglang-version"),
        ["the manifest says SGLang 0.5.23 but /opt/t-pre-py-0.5.9/bin/python3 on the host has SGLang 0.5.9"]
    );
    let flags = messages_of(unit, "flags");
    assert!(
        flags
            .iter()
            .any(|m| m.contains("SGLang 0.5.9 has no flag --enable-tf32-matmul")),
        "{flags:?}"
    );
    assert_eq!(json["tally"]["preflight_errors"], 1);

    // The text view shows it under the unit, and the tally says so.
    let ran = run_on(&text, &["plan"]);
    assert_eq!(ran.code, 1);
    assert_has(&ran.stdout, "  preflight: error: the manifest says SGLang 0.5.23 but /opt/t-pre-py-0.5.9/bin/python3 on the host has SGLang 0.5.9");
    assert_has(&ran.stdout, ", 1 failed preflight");
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn too_few_gpus_for_tp_size() {
    // The host's nvidia-smi stand-in lists 64 GPUs (8 before a stand-in server wrote its state).
    let text = service("t-pre-gpus", 33002).flag("tp-size", 128);
    let (code, json, _) = plan_json(&[("a.yaml", &text)], &[]);
    assert_eq!(code, 1, "{json:#}");
    let unit = &json["units"][0];
    let gpus = messages_of(unit, "gpus");
    assert_eq!(gpus.len(), 1, "{unit:#}");
    assert_starts_with(
        &gpus[0],
        "tp-size 128 × dp-size 1 × pp-size 1 needs 128 GPUs but the host has ",
    );
    assert_eq!(
        messages_of(unit, "cuda-visible-devices"),
        ["CUDA_VISIBLE_DEVICES=\"0,1\" lists 2 devices but tp-size 128 × dp-size 1 × pp-size 1 needs 128"]
    );
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_missing_model_path() {
    let text = service("t-pre-model", 33003).model_path("/models/t-pre-absent");
    let (code, json, _) = plan_json(&[("a.yaml", &text)], &[]);
    assert_eq!(code, 1, "{json:#}");
    assert_eq!(
        messages_of(&json["units"][0], "model-path"),
        ["the model path /models/t-pre-absent does not exist on the host"]
    );
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn two_services_claiming_one_gpu_name_each_other() {
    let a = service("t-pre-share-a", 33004);
    let b = service("t-pre-share-b", 33005).env("CUDA_VISIBLE_DEVICES", "1,2");
    let (code, json, _) = plan_json(&[("a.yaml", &a), ("b.yaml", &b)], &[]);
    assert_eq!(code, 1, "{json:#}");
    let units = json["units"].as_array().unwrap();
    assert_eq!(
        messages_of(&units[0], "gpu-conflict"),
        ["GPU 1 of rl3 is also claimed by manifests/b.yaml (t-pre-share-b.service): give each service its own CUDA_VISIBLE_DEVICES"]
    );
    assert_eq!(
        messages_of(&units[1], "gpu-conflict"),
        ["GPU 1 of rl3 is also claimed by manifests/a.yaml (t-pre-share-a.service): give each service its own CUDA_VISIBLE_DEVICES"]
    );
}

/// Waits until something listens on the host's port; 10 s bounds a listener that never comes
/// (a Python one-liner, listening within a second).
fn wait_listening(port: u16) {
    lab().sh(
        HOST,
        &format!("for i in $(seq 100); do ss -Htln 'sport = :{port}' | grep -q . && exit 0; sleep 0.1; done; exit 1"),
    );
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_port_taken_by_another_process_but_not_by_the_unit_itself() {
    let port = 33006;
    lab().sh(
        HOST,
        &format!("systemctl stop t-pre-squatter t-pre-port 2>/dev/null; systemctl reset-failed t-pre-squatter 2>/dev/null; systemd-run --unit=t-pre-squatter python3 -m http.server {port} --bind 127.0.0.1"),
    );
    wait_listening(port);
    let text = service("t-pre-port", port)
        .without_env("NCCL_P2P_DISABLE")
        .env("FAKE_SGLANG_LOAD_SECONDS", "0");
    let (code, json, _) = plan_json(&[("a.yaml", &text)], &[]);
    lab().sh(HOST, "systemctl stop t-pre-squatter");
    assert_eq!(code, 1, "{json:#}");
    let port_findings = messages_of(&json["units"][0], "port");
    assert_eq!(port_findings.len(), 1, "{port_findings:?}");
    assert_starts_with(
        &port_findings[0],
        &format!("port {port} is already taken by python3 (pid "),
    );
    assert!(port_findings[0].ends_with("which is not t-pre-port.service"));

    // The unit's own server on its port is what should be there.
    let run = Reconcile::new().manifest("a.yaml", &text);
    lab().put(
        HOST,
        "/etc/systemd/system/t-pre-port.service",
        &run.rendered(HOST),
    );
    lab().sh(
        HOST,
        "systemctl daemon-reload && systemctl enable --now t-pre-port",
    );
    wait_listening(port);
    let ran = run.args(&["plan", "--format", "json"]).run();
    lab().sh(
        HOST,
        "systemctl disable --now t-pre-port; rm -f /etc/systemd/system/t-pre-port.service; systemctl daemon-reload",
    );
    ran.assert_code(0);
    assert_eq!(findings(&ran.json()["units"][0]), []);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn the_deep_check_asks_the_hosts_sglang_what_no_catalog_knows() {
    other_pythons();
    // SGLang 0.6.0 has no catalog here, so its flags go unchecked offline (a warning); the host's
    // SGLang, asked with --deep, refuses the misspelt flag.
    let valid = service("t-pre-deep", 33007)
        .version("0.6.0")
        .python("/opt/t-pre-py-0.6.0/bin/python3");
    let misspelt = valid.clone().flag("enable-fused-moe-sum-allreduce", true);
    let (code, json, stderr) = plan_json(&[("a.yaml", &misspelt)], &["--no-deep"]);
    assert_eq!(code, 2, "with --no-deep nothing sees it: {json:#}");
    assert_has(&stderr, "no catalog of SGLang 0.6.0");

    // A new unit gets the deep check by default, and --deep asks for it too; the refusal is
    // placed at the manifest's field.
    for args in [&[][..], &["--deep"][..]] {
        let (code, json, _) = plan_json(&[("a.yaml", &misspelt)], args);
        assert_eq!(code, 1, "{args:?}: {json:#}");
        let messages = messages_of(&json["units"][0], "deep");
        assert_eq!(messages.len(), 1, "{args:?}: {json:#}");
        let (place, said) = messages[0]
            .split_once(": sglang.flags.enable-fused-moe-sum-allreduce: ")
            .unwrap_or_else(|| panic!("not placed at the flag: {}", messages[0]));
        assert!(place.contains("a.yaml:"), "{}", messages[0]);
        assert_eq!(said, "the host's SGLang refuses t-pre-deep.service's arguments: launch_server.py: error: unrecognized arguments: --enable-fused-moe-sum-allreduce");
    }

    let (code, json, _) = plan_json(&[("a.yaml", &valid)], &["--deep"]);
    assert_eq!(code, 2, "{json:#}");
    assert_eq!(findings(&json["units"][0]), []);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn apply_refuses_a_unit_that_fails_preflight_and_touches_nothing() {
    let unit = "t-pre-apply.service";
    let text = service("t-pre-apply", 33008).model_path("/models/t-pre-absent");
    let ran = run_on(&text, &["apply", "--format", "json"]);
    ran.assert_code(1);
    let report = &ran.json()["units"][0];
    assert_eq!(report["outcome"], "error", "{report:#}");
    let detail = report["detail"].as_str().unwrap();
    assert!(
        detail.starts_with("preflight failed, nothing was changed: the model path /models/t-pre-absent does not exist on the host"),
        "{detail}"
    );
    let left = lab().sh(
        HOST,
        &format!("ls /etc/systemd/system/{unit} /var/lib/reconcile/{unit} 2>&1 | grep -vc 'No such file' || true"),
    );
    assert_eq!(
        left.trim(),
        "0",
        "neither the unit nor its lock folder exists"
    );
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_unit_with_nothing_to_change_gets_only_the_version_check() {
    other_pythons();
    let unit = "t-pre-unchanged.service";
    let text = service("t-pre-unchanged", 33009)
        .model_path("/models/t-pre-absent")
        .python("/opt/t-pre-py-0.5.9/bin/python3");
    let run = Reconcile::new().manifest("a.yaml", &text);
    install_rendered(&run, HOST, unit, false);

    let (code, json, _) = plan_json(&[("a.yaml", &text)], &[]);
    let planned = &json["units"][0];
    assert_eq!(planned["verdict"], "no_change", "{json:#}");
    assert_eq!(code, 1, "the version mismatch is still an error: {json:#}");
    assert_eq!(messages_of(planned, "sglang-version").len(), 1, "{json:#}");
    assert_eq!(
        messages_of(planned, "model-path"),
        Vec::<String>::new(),
        "a unit with nothing to change is not vetted for a change"
    );

    lab().sh(
        HOST,
        &format!(
            "systemctl disable {unit}; rm /etc/systemd/system/{unit}; systemctl daemon-reload"
        ),
    );
    let (_, json, _) = plan_json(&[("a.yaml", &text)], &[]);
    let planned = &json["units"][0];
    assert_eq!(planned["verdict"], "install", "{json:#}");
    assert_eq!(
        messages_of(planned, "model-path"),
        ["the model path /models/t-pre-absent does not exist on the host"]
    );
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_plan_of_the_same_change_again_reads_the_deep_checks_kept_verdict() {
    // A model folder of its own, whose config.json the test edits. The config names this run, so
    // that no verdict an earlier run left on the host is read.
    let model = "/var/tmp/t-pre-kept-model";
    let run = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    lab().sh(
        HOST,
        &format!("rm -rf {model} && mkdir -p {model} && echo '{{\"max_position_embeddings\": 2048, \"run\": {run}}}' > {model}/config.json"),
    );
    let text = service("t-pre-kept", 33010).model_path(model);
    let planned = || plan_json(&[("a.yaml", &text)], &["-v", "--trace-remote"]);
    // Each command the plan sent the host, by name: the survey, and the deep check where it ran.
    let commands = |stderr: &str| -> Vec<String> {
        stderr
            .lines()
            .filter_map(|l| l.split("command=\"").nth(1)?.split('"').next())
            .map(str::to_string)
            .collect()
    };
    const KEPT: &str = "the deep check's verdict is kept on the host as ";
    const READ: &str = "the deep check's verdict for these inputs was kept on the host (";

    // A new unit: the check runs, and its verdict is kept.
    let (code, json, stderr) = planned();
    assert_eq!(code, 2, "{json:#}");
    assert!(
        commands(&stderr).contains(&"deep check".to_string()),
        "{stderr}"
    );
    let path = cached_path(&stderr, KEPT).unwrap_or_else(|| panic!("nothing kept: {stderr}"));
    assert!(path.starts_with("/var/lib/reconcile/deep-check/"), "{path}");
    assert_eq!(cached_path(&stderr, READ), None, "{stderr}");
    let mode = lab().sh(HOST, &format!("stat -c %a {path}"));
    assert_eq!(mode.trim(), "600");

    // The same change again reads it: what the host keeps is what the plan says. (A verdict
    // written here in its place, after the line naming the SGLang that gave it, shows that the
    // check did not run.)
    let kept = lab().sh(HOST, &format!("cat {path}"));
    assert!(
        kept.starts_with("#reconcile-deep-version 0.5.23\n"),
        "{kept}"
    );
    let refusal = "#reconcile-deep {\"verdict\": \"refused\", \"stage\": \"model-config\", \"flag\": \"model-path\", \"reason\": \"kept: not run again\", \"unchecked\": []}";
    lab().sh(
        HOST,
        &format!("sed -i '2,$d' {path} && echo '{refusal}' >> {path}"),
    );
    let (code, json, stderr) = planned();
    assert_eq!(
        cached_path(&stderr, READ).as_deref(),
        Some(path.as_str()),
        "{stderr}"
    );
    // Read in the survey, it cost no command of its own.
    assert_eq!(commands(&stderr), ["connect", "survey"], "{stderr}");
    assert_eq!(code, 1, "{json:#}");
    let messages = messages_of(&json["units"][0], "deep");
    assert!(
        messages.len() == 1 && messages[0].ends_with("arguments: kept: not run again"),
        "{messages:?}"
    );

    // Another config.json is another check, which accepts it again.
    lab().sh(
        HOST,
        &format!("echo '{{\"max_position_embeddings\": 4096}}' > {model}/config.json"),
    );
    let (code, json, stderr) = planned();
    assert_eq!(code, 2, "{json:#}");
    assert_eq!(cached_path(&stderr, READ), None, "{stderr}");
    let again = cached_path(&stderr, KEPT).unwrap_or_else(|| panic!("nothing kept: {stderr}"));
    assert_ne!(again, path);
    lab().sh(HOST, &format!("rm -rf {model} {path} {again}"));
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_plan_again_reads_the_sglang_version_and_weights_the_host_kept_until_what_they_read_changes() {
    // A Python of its own (a wrapper putting its site folder first, with SGLang 0.5.23's
    // dist-info), and a model folder of its own with one shard of one F32 tensor.
    let (py, model) = ("/opt/t-pre-keep-py", "/var/tmp/t-pre-keep-model");
    let venv = venv_script(py, Some("0.5.23"));
    lab().sh(
        HOST,
        &format!(
            r#"{venv}
rm -rf {model} && mkdir -p {model}
cd {model} && python3 -c '
import json, struct
header = json.dumps({{"w": {{"dtype": "F32", "shape": [1024], "data_offsets": [0, 4096]}}}}).encode()
open("model.safetensors", "wb").write(struct.pack("<Q", len(header)) + header + bytes(4096))
'"#
        ),
    );
    let python = format!("{py}/bin/python3");
    let text = service("t-pre-keep", 33012)
        .python(python.as_str())
        .model_path(model);
    let planned = || plan_json(&[("a.yaml", &text)], &["--no-deep", "-v"]);
    const KEPT: &str = "'s SGLang version and weights are kept on the host as ";
    const READ: &str = "'s SGLang version and weights were kept on the host (";
    let version_found = |json: &serde_json::Value| messages_of(&json["units"][0], "sglang-version");

    // What the plan read is new here, and nothing changed in the last 2 s is kept (a write in
    // the same clock tick as the read would go unseen): a plan every half second, to a deadline.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let path = loop {
        let (code, json, stderr) = planned();
        assert_eq!(code, 2, "{json:#}{stderr}");
        if let Some(path) = cached_path(&stderr, KEPT) {
            break path;
        }
        assert!(std::time::Instant::now() < deadline, "never kept: {stderr}");
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    assert!(path.starts_with("/var/lib/reconcile/survey/"), "{path}");
    assert_eq!(lab().sh(HOST, &format!("stat -c %a {path}")).trim(), "600");

    // The same plan again reads it, not the Python: a version written into the cached answer
    // is what the plan says.
    lab().sh(HOST, &format!("sed -i 's/^0[.]5[.]23$/0.5.9/' {path}"));
    let (code, json, stderr) = planned();
    assert_eq!(
        cached_path(&stderr, READ).as_deref(),
        Some(path.as_str()),
        "{stderr}"
    );
    assert_eq!(code, 1, "{json:#}");
    let has = |v: &str| {
        format!("the manifest says SGLang 0.5.23 but {python} on the host has SGLang {v}")
    };
    assert_eq!(version_found(&json), [has("0.5.9")]);

    // Then, on the host, `change`; the plan after it reads afresh, and fails.
    let afresh = |change: &str| {
        lab().sh(HOST, change);
        let (code, json, stderr) = planned();
        assert_eq!(cached_path(&stderr, READ), None, "{stderr}");
        assert_eq!(code, 1, "{json:#}");
        json
    };
    let install = |from: &str, to: &str| {
        format!("cd {py}/lib/python3*/site-packages && mv sglang-{from}.dist-info sglang-{to}.dist-info && sed -i s/{from}/{to}/ sglang-{to}.dist-info/METADATA")
    };
    // Another SGLang installed where the Python looks.
    let json = afresh(&install("0.5.23", "0.6.0"));
    assert_eq!(version_found(&json), [has("0.6.0")]);
    // SGLang 0.5.23 again, and the shard cut short.
    let json = afresh(&format!(
        "{} && truncate -s -100 {model}/model.safetensors",
        install("0.6.0", "0.5.23")
    ));
    assert_eq!(version_found(&json), Vec::<String>::new());
    let weights = messages_of(&json["units"][0], "weights");
    assert!(
        weights.len() == 1
            && weights[0].contains(&format!("{model}/model.safetensors is truncated")),
        "{weights:?}"
    );
    lab().sh(
        HOST,
        &format!("grep -l {py} /var/lib/reconcile/survey/* | xargs -r rm -f; rm -rf {py} {model}"),
    );
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_restart_onto_a_truncated_shard_is_refused_at_the_model_path_and_the_old_server_runs_on() {
    // A model folder with an index and two shards, each one F32 tensor of 1024 values, written
    // as safetensors files are: 8 bytes of header length, the JSON header, the data.
    let model = "/var/tmp/t-pre-weights-model";
    let write = format!(
        r#"rm -rf {model} && mkdir -p {model} && cd {model} && python3 -c '
import json, struct
for name in ("s1", "s2"):
    header = json.dumps({{"w": {{"dtype": "F32", "shape": [1024], "data_offsets": [0, 4096]}}}}).encode()
    open(name + ".safetensors", "wb").write(struct.pack("<Q", len(header)) + header + bytes(4096))
json.dump({{"weight_map": {{"a": "s1.safetensors", "b": "s2.safetensors"}}}}, open("model.safetensors.index.json", "w"))
'"#
    );
    lab().sh(HOST, &write);
    let unit = "t-pre-weights.service";
    let v1 = service("t-pre-weights", 33011)
        .model_path(model)
        .without_env("NCCL_P2P_DISABLE")
        .env("CUDA_VISIBLE_DEVICES", "2,3")
        .env("FAKE_SGLANG_GPU_COUNT", "64")
        .env("FAKE_SGLANG_LOAD_SECONDS", "1")
        .verify_all(&STAND_IN_VERIFY);
    // The old server, started as a past apply would have left it.
    let run = Reconcile::new().manifest("a.yaml", &v1);
    install_rendered(&run, HOST, unit, true);
    let before = lab().invocation(HOST, unit);

    // A shard cut short (a copy that did not finish), then a change that restarts the server.
    lab().sh(HOST, &format!("truncate -s -100 {model}/s2.safetensors"));
    let v2 = v1.clone().flag("mem-fraction-static", 0.8);
    let ran = run_on(&v2, &["apply", "--format", "json"]);
    ran.assert_code(1);
    let report = &ran.json()["units"][0];
    assert_eq!(report["outcome"], "error", "{report:#}");
    let detail = report["detail"].as_str().unwrap();
    let line = v2
        .to_string()
        .lines()
        .position(|l| l.contains("model_path:"))
        .unwrap()
        + 1;
    assert_has(detail, &format!("a.yaml:{line}:3: sglang.model_path: the model's weights would not load: {model}/s2.safetensors is truncated: "));
    assert_eq!(
        lab().invocation(HOST, unit),
        before,
        "the old server runs on"
    );
    assert_eq!(
        lab()
            .sh(HOST, &format!("systemctl is-active {unit}"))
            .trim(),
        "active"
    );

    // The same plan with the shard whole again: nothing to say of the weights.
    lab().sh(HOST, &format!("truncate -s +100 {model}/s2.safetensors"));
    let (_, json, _) = plan_json(&[("a.yaml", &v2)], &["--no-deep"]);
    assert_eq!(
        messages_of(&json["units"][0], "weights"),
        Vec::<String>::new(),
        "{json:#}"
    );

    // Applied now: the weights are preloaded into the page cache before the old server stops (they
    // fit in the host's memory), and the report says so.
    let ran = run_on(&v2, &["apply", "--format", "json"]);
    let report = &ran.json()["units"][0];
    assert_eq!(report["outcome"], "converged", "{report:#}");
    assert_ne!(lab().invocation(HOST, unit), before, "restarted");
    let staging = &report["staging"];
    assert_eq!(staging["outcome"], "staged", "{report:#}");
    let shard = lab().sh(HOST, &format!("stat -c %s {model}/s1.safetensors"));
    let shard: u64 = shard.trim().parse().unwrap();
    assert_eq!(
        (staging["files"].as_u64(), staging["bytes"].as_u64()),
        (Some(2), Some(2 * shard)),
        "{staging}"
    );
    let notes = report["notes"].to_string();
    assert_has(
        &notes,
        "the weights were staged into the page cache before the stop: 2 file(s)",
    );
    // With --no-stage, a restart reads nothing ahead.
    let ran = Reconcile::new()
        .manifest("a.yaml", v2.clone().flag("mem-fraction-static", 0.7))
        .args(&["apply", "--format", "json", "--no-stage"])
        .run();
    let report = &ran.json()["units"][0];
    assert_eq!(report["outcome"], "converged", "{report:#}");
    assert!(report.get("staging").is_none(), "{report:#}");
    lab().remove_unit(HOST, unit);
    lab().sh(HOST, &format!("rm -rf {model}"));
}
