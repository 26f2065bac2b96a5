//! Changes applied live (`apply: { live: true }`, issue 33) on the SGLang stand-in, whose
//! `/update_weights_from_disk` and `/set_internal_state` are written from SGLang 0.5.23's
//! (`fixtures/fake-sglang`): a move to another checkpoint of the same shape and a new
//! `--pp-max-micro-batch-size` are applied without a restart and verified; a value the server
//! refuses is put back live, the previous unit file with it; another shape, `--restart` or a
//! manifest that does not ask restart as before. The real server's weight update is shown by
//! `real_server::quality`.

use crate::builder::STAND_IN_VERIFY;
use crate::lab::{lab, manifest, Manifest, Reconcile, LIVE};

const HOST: &str = LIVE.host();
const PORT: u16 = 37531;
const UNIT: &str = "t-live.service";

/// Checkpoints on the host: `a` and `b` of one shape (a different `_name_or_path`, other
/// weights), `c` with a wider hidden layer. Each holds a `config.json`, the same `tokenizer.json`
/// and one safetensors file (an F32 tensor of 1024 values: 8 bytes of header length, the JSON
/// header, the data), so that preflight's weights check and the stand-in's load read real files.
fn checkpoints() -> [String; 3] {
    checkpoints_on(HOST)
}

/// [`checkpoints`] on `host` (the crash matrix's live cells use them too).
pub fn checkpoints_on(host: &str) -> [String; 3] {
    let dirs = ["a", "b", "c"].map(|c| format!("/var/tmp/t-live-{c}"));
    let script = format!(
        r#"python3 - <<'EOF'
import json, os, shutil, struct
for d, hidden, fill in (("{a}", 64, 1), ("{b}", 64, 2), ("{c}", 128, 3)):
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    json.dump({{"architectures": ["Qwen3ForCausalLM"], "hidden_size": hidden, "_name_or_path": d}}, open(d + "/config.json", "w"))
    json.dump({{"model": {{"type": "BPE"}}}}, open(d + "/tokenizer.json", "w"))
    header = json.dumps({{"w": {{"dtype": "F32", "shape": [1024], "data_offsets": [0, 4096]}}}}).encode()
    open(d + "/model.safetensors", "wb").write(struct.pack("<Q", len(header)) + header + bytes([fill]) * 4096)
EOF"#,
        a = dirs[0],
        b = dirs[1],
        c = dirs[2],
    );
    lab().sh(host, &script);
    dirs
}

/// The service on checkpoint `model`, live changes asked for, with the pipeline micro-batch size
/// `/set_internal_state` takes (at most `--max-running-requests`, 16). No served name: after a
/// weight update SGLang answers under the model path.
fn service(model: &str, micro_batch: u32) -> Manifest {
    manifest("t-live", &[HOST])
        .port(PORT)
        .model_path(model)
        .without_served_model_name()
        .flag("max-running-requests", 16)
        .flag("pp-max-micro-batch-size", micro_batch)
        .without_env("NCCL_P2P_DISABLE")
        .env("CUDA_VISIBLE_DEVICES", LIVE.gpu_pair(PORT))
        .env("FAKE_SGLANG_GPU_COUNT", "64")
        .env("FAKE_SGLANG_LOAD_SECONDS", "1")
        .verify_all(&STAND_IN_VERIFY)
        .live()
}

fn run(m: &Manifest, args: &[&str]) -> (i32, serde_json::Value) {
    let ran = Reconcile::new().manifest("a.yaml", m).args(args).run();
    let json = ran.json();
    (ran.code, json["units"][0].clone())
}

fn plan(m: &Manifest, extra: &[&str]) -> (i32, serde_json::Value) {
    let mut args = vec!["plan", "--format", "json"];
    args.extend(extra);
    run(m, &args)
}

fn apply(m: &Manifest) -> (i32, serde_json::Value) {
    run(m, &["apply", "--format", "json"])
}

/// What the running server says of itself: the model it serves and its micro-batch size, as
/// `/server_info`'s `internal_states` read back what `/set_internal_state` set.
fn serving() -> (String, i64) {
    let out = lab().sh(
        HOST,
        &format!(
            r#"python3 -c 'import json, urllib.request as u
i = json.load(u.urlopen("http://127.0.0.1:{PORT}/server_info"))
print(i["model_path"], i["internal_states"][0]["pp_max_micro_batch_size"])'"#
        ),
    );
    let (model, size) = out.trim().split_once(' ').expect("two words");
    (model.to_string(), size.parse().expect("a number"))
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_move_to_a_checkpoint_of_one_shape_and_a_new_value_apply_live_and_a_refusal_goes_back_live() {
    lab().remove_unit(HOST, UNIT);
    let [a, b, c] = checkpoints();
    let (code, first) = apply(&service(&a, 4));
    assert_eq!(
        (code, &first["outcome"]),
        (0, &"converged".into()),
        "{first:#}"
    );
    let started = lab().invocation(HOST, UNIT);

    // The plan says live, and what the server will be told.
    let moved = service(&b, 8);
    let (code, planned) = plan(&moved, &[]);
    assert_eq!(code, 2, "{planned:#}");
    assert_eq!(planned["verdict"], "live", "{planned:#}");
    assert_eq!(planned["live"]["weights"]["to"], b.as_str(), "{planned:#}");
    assert_eq!(planned["live"]["settings"][0]["to"], 8, "{planned:#}");
    // --restart, another shape, or a manifest that does not ask: a restart, as before.
    assert_eq!(plan(&moved, &["--restart"]).1["verdict"], "restart");
    let (_, wider) = plan(&service(&c, 4), &[]);
    assert_eq!(wider["verdict"], "restart", "{wider:#}");
    assert!(
        wider["notes"]
            .to_string()
            .contains("not applied live (config.json's hidden_size differs: 64 -> 128)"),
        "{wider:#}"
    );
    let unasked = moved.clone().without("apply");
    assert_eq!(plan(&unasked, &[]).1["verdict"], "restart");

    // Applied live: the same process serves the new weights and value, verified, recorded.
    let (code, report) = apply(&moved);
    assert_eq!(code, 0, "{report:#}");
    assert_eq!(report["outcome"], "converged", "{report:#}");
    let detail = report["detail"].as_str().unwrap();
    eprintln!("live, stand-in: {detail}");
    assert!(detail.starts_with("applied live, no restart ("), "{detail}");
    assert_eq!(lab().invocation(HOST, UNIT), started, "no restart");
    assert_eq!(serving(), (b.clone(), 8));
    assert!(lab()
        .sh(HOST, &format!("cat /etc/systemd/system/{UNIT}"))
        .contains(&b));
    assert_eq!(plan(&moved, &[]).1["verdict"], "no_change");
    // `status` believes the live apply: the process told holds what the unit says.
    let (code, unit) = run(&moved, &["status", "--format", "json"]);
    assert_eq!(
        (code, &unit["classes"]),
        (0, &serde_json::json!(["in_sync"])),
        "{unit:#}"
    );
    assert!(
        unit["details"].to_string().contains(&format!(
            "applied live: weights from {b}, --pp-max-micro-batch-size 8 set"
        )),
        "{unit:#}"
    );

    // A value the server refuses (above --max-running-requests): nothing changed there, so the
    // previous values go back live with the previous unit file, and nothing restarts.
    let refused = service(&b, 64);
    let (code, report) = apply(&refused);
    assert_eq!(code, 3, "{report:#}");
    assert_eq!(report["outcome"], "rolled_back", "{report:#}");
    assert_eq!(report["failed_stage"], "live", "{report:#}");
    let detail = report["detail"].as_str().unwrap();
    eprintln!("live, stand-in, refused: {detail}");
    assert!(
        detail.contains("/set_internal_state did not take")
            && detail.contains("put back live, no restart"),
        "{detail}"
    );
    assert_eq!(lab().invocation(HOST, UNIT), started, "no restart");
    assert_eq!(serving(), (b.clone(), 8));
    assert_eq!(
        plan(&moved, &[]).1["verdict"],
        "no_change",
        "the previous unit file is back"
    );
    assert_eq!(run(&moved, &["status", "--format", "json"]).0, 0);

    lab().remove_unit(HOST, UNIT);
    lab().sh(HOST, &format!("rm -rf {a} {b} {c}"));
}
