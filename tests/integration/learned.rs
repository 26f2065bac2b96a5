//! Learned load times (issue 14): a deployment record keeps its load's memory trajectory, and the
//! next load of the unit is shown against it, with the load deadline learned from history when
//! the manifest leaves it unset. On the throughput host: ports 37021-37029, GPUs 30-39.

use serde_json::Value;

use crate::lab::{
    apply_one_unit, assert_has, assert_outcome, lab, manifest, run_on, Manifest, THROUGHPUT,
};

/// A service on the throughput host that loads in two seconds, on GPUs `gpu` and `gpu + 1`, with
/// `--mem-fraction-static` (changing it restarts the server) and no load deadline of its own.
fn service(name: &str, port: u16, gpu: u32, mem_fraction_static: f64) -> Manifest {
    manifest(name, &[THROUGHPUT])
        .flag("mem-fraction-static", mem_fraction_static)
        .port(port)
        .without_env("NCCL_P2P_DISABLE")
        .env("CUDA_VISIBLE_DEVICES", format!("{gpu},{}", gpu + 1))
        .env("FAKE_SGLANG_GPU_COUNT", "64")
        .env("FAKE_SGLANG_LOAD_SECONDS", "2")
        .verify_all(&[
            ("crash_window", "2s"),
            ("sample_interval", "500ms"),
            ("stall_timeout", "4s"),
        ])
}

fn notes(report: &Value) -> Vec<String> {
    report["verification"]["notes"]
        .as_array()
        .map(|n| {
            n.iter()
                .filter_map(|n| n.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// The unit's `current.json` on the host.
fn current(unit: &str) -> Value {
    let text = lab().sh(
        THROUGHPUT,
        &format!("cat /var/lib/reconcile/{unit}/current.json"),
    );
    serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text}"))
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_second_load_is_shown_against_the_first_and_learns_its_deadline() {
    let unit = "t-learned.service";
    lab().remove_unit(THROUGHPUT, unit);
    let first = service("t-learned", 37021, 30, 0.8);

    // The first load has no history: nothing is learned or compared.
    let (code, report) = apply_one_unit(&first);
    assert_outcome(code, &report, 0, "converged");
    assert!(
        report["verification"].get("previous_loads").is_none(),
        "{report}"
    );
    assert!(
        !notes(&report)
            .iter()
            .any(|n| n.contains("last good load") || n.starts_with("load deadline")),
        "{report}"
    );
    let first_load = report["verification"]["load_seconds"].as_f64().unwrap();
    // Its record keeps the trajectory: at most 64 points, ending at the plateau, GPUs summed.
    let record = current(unit);
    let trajectory = record["trajectory"]
        .as_array()
        .expect("a trajectory")
        .clone();
    assert!((1..=64).contains(&trajectory.len()), "{record}");
    assert!(
        trajectory.last().unwrap()["gpu_mib"].as_u64().unwrap_or(0) > 0,
        "{record}"
    );
    let plateau: u64 = record["plateau_gpu_mib"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g.as_u64().unwrap())
        .sum();
    assert_eq!(
        trajectory.last().unwrap()["gpu_mib"].as_u64(),
        Some(plateau),
        "{record}"
    );

    // A changed flag restarts it: the second load is shown against the first.
    let second = service("t-learned", 37021, 30, 0.85);
    let (code, report) = apply_one_unit(&second);
    assert_outcome(code, &report, 0, "converged");
    let previous = &report["verification"]["previous_loads"];
    assert_eq!(
        previous["load_seconds"][0].as_f64(),
        Some(first_load),
        "{report}"
    );
    assert_eq!(
        previous["trajectory"].as_array().map(Vec::len),
        Some(trajectory.len())
    );
    let notes = notes(&report);
    assert!(
        notes.contains(&format!(
            "last good load {first_load:.1}s (1 converged load in history)"
        )),
        "{notes:?}"
    );
    // load_deadline is unset: learned, here the default as the load is short.
    assert!(
        notes.iter().any(|n| n
            .starts_with("load deadline 30m, the default: more than learned from history (2 × ")
            && n.ends_with("the slowest of the last load)")),
        "{notes:?}"
    );
    // Both loads are in the history, each with its trajectory.
    let history = lab().sh(
        THROUGHPUT,
        &format!("cat /var/lib/reconcile/{unit}/history.jsonl"),
    );
    let lines: Vec<Value> = history
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 2, "{history}");
    assert!(lines
        .iter()
        .all(|l| l["trajectory"].as_array().is_some_and(|t| !t.is_empty())));

    // A load deadline set in the manifest is kept; the text report compares with the last load.
    let third = service("t-learned", 37021, 30, 0.8).verify("load_deadline", "40s");
    let ran = run_on(&third, &["apply"]);
    assert_eq!(ran.code, 0, "{}\n{}", ran.stdout, ran.stderr);
    let out = &ran.stdout;
    assert_has(out, "new unit: ready after ");
    assert_has(out, "(last good load ");
    assert_has(out, "(2 converged loads in history)");
    assert!(
        out.contains("new unit: this load ") && out.contains("new unit: last load "),
        "{out}"
    );
    assert!(!out.contains("note: load deadline"), "{out}");

    lab().sh(THROUGHPUT, &format!("systemctl disable --now {unit}"));
}
