//! Fleets: planning many hosts at once, and rolling apply with a canary, batches, a failure
//! budget and --rollback-all, on six test hosts of their own.

use crate::builder::map;
use crate::lab::{lab, manifest, run_on, Manifest, Reconcile, UNREACHABLE};

/// The fleet's hosts in the order a rollout takes them (sorted by name).
const FLEET: [&str; 6] = ["rl10", "rl5", "rl6", "rl7", "rl8", "rl9"];

/// A service on the whole fleet; `failing` hosts get a server that crashes one second in.
fn fleet_service(name: &str, port: u16, gpus: &str, failing: &[&str], version: &str) -> Manifest {
    let hosts = FLEET.iter().map(|h| {
        let mut env = vec![("RELEASE", version)];
        if failing.contains(h) {
            env.extend([("FAKE_SGLANG_FAIL", "crash"), ("FAKE_SGLANG_FAIL_AT", "1")]);
        }
        map([("name", (*h).into()), ("env", map(env))])
    });
    hosts
        .fold(manifest(name, &[]), Manifest::host)
        .port(port)
        .without_env("NCCL_P2P_DISABLE")
        .env("CUDA_VISIBLE_DEVICES", gpus)
        .env("FAKE_SGLANG_LOAD_SECONDS", "1")
        .verify_all(&[
            ("crash_window", "3s"),
            ("sample_interval", "500ms"),
            ("stall_timeout", "5s"),
            ("load_deadline", "20s"),
        ])
}

/// The budget both failure tests roll out under: a canary, then batches of three, stopping at the
/// first failure.
const BATCHES_OF_THREE: [&str; 6] = [
    "--canary",
    "1",
    "--max-parallel",
    "3",
    "--max-failures",
    "1",
];

/// [`rollout`] that must end with exit code `code`: the units' reports.
#[track_caller]
fn rollout_ending(code: i32, text: &Manifest, args: &[&str]) -> Vec<serde_json::Value> {
    let (got, units) = rollout(text, args);
    assert_eq!(got, code, "{units:#?}");
    units
}

fn rollout(text: &Manifest, args: &[&str]) -> (i32, Vec<serde_json::Value>) {
    let mut all = vec!["apply", "--format", "json"];
    all.extend_from_slice(args);
    let ran = run_on(text, &all);
    let units = ran.json()["units"].as_array().unwrap().clone();
    (ran.code, units)
}

/// Asserts each unit's host and outcome, in the report's order.
#[track_caller]
fn assert_outcomes(units: &[serde_json::Value], expected: &[(&str, &str)]) {
    let outcomes: Vec<(&str, &str)> = units
        .iter()
        .map(|u| (u["host"].as_str().unwrap(), u["outcome"].as_str().unwrap()))
        .collect();
    assert_eq!(outcomes, expected);
}

fn unit_on(host: &str, unit: &str) -> Option<String> {
    let text = lab().sh(
        host,
        &format!("cat /etc/systemd/system/{unit} 2>/dev/null || echo MISSING"),
    );
    (text.trim() != "MISSING").then_some(text)
}

fn clean(unit: &str) {
    for h in FLEET {
        lab().sh(h, &format!("systemctl disable --now {unit} 2>/dev/null; rm -rf /etc/systemd/system/{unit} /var/lib/reconcile/{unit}; systemctl daemon-reload"));
    }
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn planning_six_hosts_with_one_unreachable_reports_it_and_plans_the_rest_in_order() {
    let mut hosts: Vec<&str> = FLEET[..5].to_vec();
    hosts.push(UNREACHABLE);
    let ran = Reconcile::new()
        .manifest("a.yaml", manifest("t-fleet-plan", &hosts))
        .args(&["plan", "--format", "json"])
        .run();
    ran.assert_code(1);
    let units = ran.json()["units"].as_array().unwrap().clone();
    let order: Vec<&str> = units.iter().map(|u| u["host"].as_str().unwrap()).collect();
    assert_eq!(
        order,
        ["rl-unreachable", "rl10", "rl5", "rl6", "rl7", "rl8"],
        "stable, sorted order"
    );
    for u in &units {
        if u["host"] == UNREACHABLE {
            assert_eq!(u["outcome"], "error");
        } else {
            assert_eq!(u["verdict"], "install", "{u}");
        }
    }
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_failing_canary_stops_the_rollout_before_any_other_host_is_touched() {
    let unit = "t-fleet-canary.service";
    clean(unit);
    let text = fleet_service("t-fleet-canary", 34001, "0,1", &["rl10"], "1");
    let units = rollout_ending(3, &text, &["--canary", "1", "--max-parallel", "5"]);
    assert_outcomes(
        &units,
        &[
            ("rl10", "rolled_back"),
            ("rl5", "not_started"),
            ("rl6", "not_started"),
            ("rl7", "not_started"),
            ("rl8", "not_started"),
            ("rl9", "not_started"),
        ],
    );
    assert!(
        units[1]["detail"]
            .as_str()
            .unwrap()
            .contains("the canary failed"),
        "{:#}",
        units[1]
    );
    for h in FLEET {
        assert_eq!(unit_on(h, unit), None, "{h} was touched");
    }
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn the_failure_budget_spans_the_rollout_and_untouched_hosts_are_reported() {
    let unit = "t-fleet-budget.service";
    clean(unit);
    // Canary rl10, then batches of three: rl5 rl6 rl7 (rl7 fails), then rl8 rl9 never start.
    let text = fleet_service("t-fleet-budget", 34002, "2,3", &["rl7"], "1");
    let units = rollout_ending(3, &text, &BATCHES_OF_THREE);
    assert_outcomes(
        &units,
        &[
            ("rl10", "converged"),
            ("rl5", "converged"),
            ("rl6", "converged"),
            ("rl7", "rolled_back"),
            ("rl8", "not_started"),
            ("rl9", "not_started"),
        ],
    );
    assert!(
        units[4]["detail"]
            .as_str()
            .unwrap()
            .contains("1 host(s) failed (max_failures 1)"),
        "{:#}",
        units[4]
    );
    assert_eq!(unit_on("rl8", unit), None);
    assert_eq!(unit_on("rl9", unit), None);
    assert!(unit_on("rl5", unit).is_some());
    clean(unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn rollback_all_puts_every_converged_host_back_when_the_rollout_stops() {
    let unit = "t-fleet-all.service";
    clean(unit);
    let v1 = fleet_service("t-fleet-all", 34003, "4,5", &[], "1");
    rollout_ending(0, &v1, &["--max-parallel", "6"]);
    let before: Vec<Option<String>> = FLEET.iter().map(|h| unit_on(h, unit)).collect();
    let v2 = fleet_service("t-fleet-all", 34003, "4,5", &["rl7"], "2");
    let units = rollout_ending(
        3,
        &v2,
        &[&BATCHES_OF_THREE[..], &["--rollback-all"]].concat(),
    );
    assert_outcomes(
        &units,
        &[
            ("rl10", "rolled_back"),
            ("rl5", "rolled_back"),
            ("rl6", "rolled_back"),
            ("rl7", "rolled_back"),
            ("rl8", "not_started"),
            ("rl9", "not_started"),
        ],
    );
    assert!(
        units[0]["detail"]
            .as_str()
            .unwrap()
            .contains("--rollback-all restored the previous unit, which passed verification"),
        "{:#}",
        units[0]
    );
    let after: Vec<Option<String>> = FLEET.iter().map(|h| unit_on(h, unit)).collect();
    assert_eq!(after, before, "every host runs release 1 again");
    // Each went back through apply's transaction: a guard armed over release 2 and disarmed once
    // release 1 verified, and a record of deployment 3 restoring deployment 1.
    for host in &FLEET[..3] {
        let read = |file: &str| -> serde_json::Value {
            let text = lab().sh(host, &format!("cat /var/lib/reconcile/{unit}/{file}"));
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{host} {file} ({e}): {text}"))
        };
        let (record, guard) = (read("current.json"), read("guard.json"));
        assert_eq!(record["restored_from"], 1, "{host}: {record:#}");
        assert_eq!(guard["state"], "disarmed", "{host}: {guard:#}");
        assert_eq!(
            guard["new_sha256"], record["unit_sha256"],
            "{host}: {guard:#}"
        );
        let lines = lab().sh(
            host,
            &format!("wc -l < /var/lib/reconcile/{unit}/history.jsonl"),
        );
        assert_eq!(
            lines.trim(),
            "3",
            "{host}: release 1, release 2, release 1 again"
        );
    }
    clean(unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn the_canary_is_the_first_host_with_work_not_one_already_up_to_date() {
    let unit = "t-fleet-uptodate.service";
    clean(unit);
    // Release 1 everywhere; then release 2, already on rl10 (the first host by name) and crashing
    // on rl5, the first host that has work.
    rollout_ending(
        0,
        &fleet_service("t-fleet-uptodate", 34004, "6,7", &[], "1"),
        &["--canary", "1", "--max-parallel", "6"],
    );
    let release2 = fleet_service("t-fleet-uptodate", 34004, "6,7", &["rl5"], "2");
    let (code, _) = rollout(&release2, &["--host", "rl10"]);
    assert_eq!(code, 0, "rl10 took release 2");
    let before: Vec<String> = FLEET[2..]
        .iter()
        .map(|h| unit_on(h, unit).unwrap())
        .collect();
    let units = rollout_ending(3, &release2, &["--canary", "1", "--max-parallel", "5"]);
    assert_outcomes(
        &units,
        &[
            ("rl10", "unchanged"),
            ("rl5", "rolled_back"),
            ("rl6", "not_started"),
            ("rl7", "not_started"),
            ("rl8", "not_started"),
            ("rl9", "not_started"),
        ],
    );
    let after: Vec<String> = FLEET[2..]
        .iter()
        .map(|h| unit_on(h, unit).unwrap())
        .collect();
    assert_eq!(before, after, "a host after the failed canary was touched");
    clean(unit);
}
