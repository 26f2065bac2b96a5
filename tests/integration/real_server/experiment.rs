//! An experiment on the real server (issue 25): two variants of `--max-running-requests` on the
//! experiment's real host (`EXPERIMENT_REAL`), each through apply's path, between two baseline
//! measurements. A cap of 1 makes the real scheduler run the benchmark's four concurrent requests
//! one at a time, so it must rank below a cap of 64 (neutral) by far; the baseline runs at the end.
//!
//! One real server at a time: the variants replace each other on the same unit.

use super::{slots, Service, SLOTS_FREE};
use crate::lab::{lab, Reconcile, EXPERIMENT_REAL};

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_real_server_experiment_ranks_a_neutral_cap_above_a_serialising_one() {
    // One real server beside it at most, as when the tier ran two tests at a time: its drift
    // check compares two baselines, which more servers starting beside it would spread.
    let _slots = slots(SLOTS_FREE - 1);
    let s = Service::new("t-rs-exp", EXPERIMENT_REAL, 38051);
    let _stopped = s.fresh();
    s.converge();
    let r = Reconcile::new().manifest("svc.yaml", s.manifest());
    // 25 %: the throughput test's measured spread of two runs of one unit on this shared 2-core
    // machine (17.5 %), with room; the serialising cap costs about three quarters at 4.
    std::fs::write(
        r.dir().join("experiment.yaml"),
        format!(
            "manifest: manifests/svc.yaml\n\
             host: {EXPERIMENT_REAL}\n\
             benchmark: {{ levels: [1, 4], prompt_tokens: 32, output_tokens: 64, requests: 8 }}\n\
             objective: {{ metric: output_tokens_per_s, concurrency: 4 }}\n\
             noise_percent: 25\n\
             budget: 20m\n\
             grid:\n  max-running-requests: [64, 1]\n"
        ),
    )
    .unwrap();
    let ran = r.run_args(&["experiment", "experiment.yaml", "--format", "json"]);
    let json = ran.json();
    eprintln!("{}", ran.stderr);
    let trusted = json["drift"]["trusted"]
        .as_bool()
        .expect("the drift is checked");
    assert_eq!(ran.code, if trusted { 0 } else { 2 }, "{json:#}");
    let names: Vec<&str> = json["ranking"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["max-running-requests=64", "max-running-requests=1"],
        "{json:#}"
    );
    let at4 = |v: &serde_json::Value| v["levels"][1]["output_tokens_per_s"].as_f64().unwrap();
    let base = at4(&json["baseline"]);
    let capped = at4(&json["variants"][1]);
    assert!(
        capped < 0.75 * base,
        "{capped} vs baseline {base}: {json:#}"
    );
    if trusted {
        assert_eq!(json["winner"], "max-running-requests=64");
    }
    let overhead = json["overhead_per_variant"].as_f64().unwrap();
    eprintln!(
        "real experiment: baseline {base:.1} tok/s at 4, cap 1 {capped:.1}; drift {:.1} %; overhead per variant {overhead:.2} s",
        json["drift"]["percent"].as_f64().unwrap_or(f64::NAN)
    );
    assert!(overhead < 5.0, "{overhead}");
    // The baseline runs again: no cap on its command line.
    let argv = lab().sh(
        EXPERIMENT_REAL,
        &format!(
            "tr '\\0' ' ' < /proc/$(systemctl show -p MainPID --value {})/cmdline",
            s.unit()
        ),
    );
    assert!(!argv.contains("--max-running-requests"), "{argv}");
    s.stop();
}
