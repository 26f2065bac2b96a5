//! The stand-in against the real thing: the same probe sequence (probe.py: `/health` through
//! start-up and its timing, `/ready`, `/v1/models`, a streamed chat completion's chunks, the
//! request gauges of `/metrics`, SIGTERM to the main process and a stop by systemd, each with a
//! request in flight, a misspelt flag) against the SGLang stand-in and the real
//! server, one after the other on the same host. Any difference in what the stand-in is meant to
//! copy fails the test, naming the observation.

use super::{slots, HOSTS, ROOT};
use crate::lab::lab;

const PROBE: &str = include_str!("probe.py");
const PORT: u16 = 38031;
const MODEL: &str = "compare-model";

/// What probe.py saw of one server, started with `python` and `model_path` and `env`.
fn probe(unit: &str, python: &str, model_path: &str, env: &[&str]) -> serde_json::Value {
    let host = HOSTS[1];
    let _stopped = super::stopped(host, unit);
    lab().put(host, "/root/probe.py", PROBE);
    let argv = format!(
        "{python} -m sglang.launch_server --model-path {model_path} --served-model-name {MODEL} \
         --host 127.0.0.1 --port {PORT} --enable-metrics --device cpu --attention-backend torch_native \
         --sampling-backend pytorch --max-total-tokens 4096"
    );
    let out = lab().sh(
        host,
        &format!(
            "python3 /root/probe.py {unit} {PORT} {MODEL} {} -- {argv}",
            env.join(" ")
        ),
    );
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("probe.py of {unit} ({e}): {out}"))
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn the_stand_in_answers_the_probes_as_the_real_server_does() {
    let _slot = slots(1);
    let tier = super::TIER_ENV.map(|(k, v)| format!("{k}={v}"));
    let mut env: Vec<&str> = tier.iter().map(String::as_str).collect();
    env.extend(["OMP_NUM_THREADS=1", "LONG_TOKENS=1500"]);
    let real = probe(
        "t-rs-compare-real",
        &format!("{ROOT}/bin/python3"),
        &format!("{ROOT}/tiny-model"),
        &env,
    );
    let standin = probe(
        "t-rs-compare-standin",
        "/usr/bin/python3",
        "/models/test",
        &[
            "FAKE_SGLANG_LOAD_SECONDS=1",
            "CUDA_VISIBLE_DEVICES=0",
            "FAKE_SGLANG_GPU_COUNT=64",
            "FAKE_SGLANG_REQUEST_SECONDS=12",
        ],
    );
    eprintln!("real:     {real}\nstand-in: {standin}");
    let keys: Vec<&String> = real.as_object().unwrap().keys().collect();
    assert_eq!(keys.len(), 10, "{real}");
    let differ: Vec<String> = keys
        .iter()
        .filter(|k| real[k.as_str()] != standin[k.as_str()])
        .map(|k| {
            format!(
                "{k}: real {} / stand-in {}",
                real[k.as_str()],
                standin[k.as_str()]
            )
        })
        .collect();
    assert!(
        differ.is_empty(),
        "the stand-in differs from the real server:\n{}",
        differ.join("\n")
    );
}
