//! Server groups (issue 24): one SGLang server over two test hosts (`GROUP`, rank 0 first), the
//! stand-in's ranks meeting at rank 0's rendezvous port over the lab's network (`ROUTE=1`).
//! Each test has its own service, ports 37501-37519 (server port, then the rendezvous port one
//! above) and GPU, so they run alongside each other.

use std::time::Duration;

use serde_yaml::Value;

use crate::builder::map;
use crate::lab::{assert_has, lab, venv_script, Manifest, Reconcile, GROUP, UNREACHABLE};

/// A group manifest over `nodes` (each with the lab's address for it, or `address` when given):
/// `rank1_env` is more env for rank 1 only (a failure to inject).
fn group(
    service: &str,
    port: u16,
    nodes: &[(&str, Option<&str>)],
    rank1_env: &[(&str, &str)],
) -> Manifest {
    group_on_gpu(service, port, nodes, rank1_env, (port - 37501) / 2)
}

/// [`group`] on GPU `gpu` of each rank's host: for hosts of another lease (crash.rs's).
pub fn group_on_gpu(
    service: &str,
    port: u16,
    nodes: &[(&str, Option<&str>)],
    rank1_env: &[(&str, &str)],
    gpu: u16,
) -> Manifest {
    let base = Manifest::new(service)
        .description(format!("test server group {service}"))
        .without("hosts");
    nodes
        .iter()
        .enumerate()
        .fold(base, |m, (i, (name, address))| {
            let address = address.map_or_else(|| lab().address(name), str::to_string);
            let mut entry = vec![("name", Value::from(*name)), ("address", address.into())];
            if i == 1 && !rank1_env.is_empty() {
                entry.push(("env", map(rank1_env.iter().copied())));
            }
            m.node(map(entry))
        })
        .port(port)
        .dist_init_port(port + 1)
        .flag("dist-timeout", 30)
        .without_env("NCCL_P2P_DISABLE")
        .env("CUDA_VISIBLE_DEVICES", gpu.to_string())
        .env("FAKE_SGLANG_GPU_COUNT", "16")
        .env("FAKE_SGLANG_LOAD_SECONDS", "2")
        .verify_all(&[
            ("crash_window", "3s"),
            ("sample_interval", "1s"),
            ("stall_timeout", "15s"),
            ("load_deadline", "60s"),
        ])
}

fn both() -> Vec<(&'static str, Option<&'static str>)> {
    GROUP.iter().map(|h| (*h, None)).collect()
}

fn clean(unit: &str) {
    for host in GROUP {
        lab().remove_unit(host, unit);
    }
}

/// `reconcile apply --format json`: the exit code and the units' reports, by host.
fn apply(text: &Manifest) -> (i32, Vec<serde_json::Value>, String) {
    let ran = Reconcile::new()
        .manifest("group.yaml", text)
        .args(&["apply", "--format", "json"])
        .run();
    let json = ran.json();
    let units = json["units"].as_array().cloned().unwrap_or_default();
    (ran.code, units, ran.stdout)
}

fn unit_of<'a>(units: &'a [serde_json::Value], host: &str) -> &'a serde_json::Value {
    units
        .iter()
        .find(|u| u["host"] == host)
        .unwrap_or_else(|| panic!("no report for {host}: {units:?}"))
}

/// When the unit's current main process started, in microseconds of CLOCK_MONOTONIC: the test
/// hosts are containers of one kernel, without time namespaces, so one clock for all of them.
fn started_us(host: &str, unit: &str) -> u64 {
    lab()
        .sh(
            host,
            &format!("systemctl show -p ExecMainStartTimestampMonotonic --value {unit}"),
        )
        .trim()
        .parse()
        .unwrap_or(0)
}

/// The group `service` on `port`, installed fresh and converged: each rank's unit file.
fn deployed(service: &str, port: u16) -> Vec<String> {
    let unit = format!("{service}.service");
    clean(&unit);
    let (code, _, out) = apply(&group(service, port, &both(), &[]));
    assert_eq!(code, 0, "{out}");
    GROUP.iter().map(|h| unit_file(h, &unit)).collect()
}

fn active(host: &str, unit: &str) -> String {
    lab()
        .sh(host, &format!("systemctl is-active {unit} || true"))
        .trim()
        .to_string()
}

fn unit_file(host: &str, unit: &str) -> String {
    lab().sh(host, &format!("cat /etc/systemd/system/{unit}"))
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_group_installs_restarts_together_and_a_no_op_touches_neither() {
    let unit = "t-group-flow.service";
    clean(unit);
    // Each chat completion takes 6 s, counted in rank 0's metrics: a request in flight.
    let v1 = group("t-group-flow", 37501, &both(), &[])
        .flag("enable-metrics", true)
        .env("FAKE_SGLANG_REQUEST_SECONDS", "6");
    let (code, units, out) = apply(&v1);
    assert_eq!(code, 0, "{out}");
    for host in GROUP {
        assert_eq!(unit_of(&units, host)["outcome"], "converged", "{out}");
    }
    // Rank 1 serves no API: its readiness is its dummy health port.
    let rank1 = unit_of(&units, GROUP[1]);
    assert_eq!(rank1["group"]["rank"], 1, "{out}");
    let stages: Vec<&str> = rank1["verification"]["stages"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|s| s["name"].as_str())
        .collect();
    assert!(!stages.contains(&"identity"), "{stages:?}");
    assert!(stages.contains(&"readiness"), "{stages:?}");
    assert!(unit_file(GROUP[1], unit).contains("--node-rank 1"));
    assert!(unit_file(GROUP[0], unit).contains(&format!(
        "--dist-init-addr {}:37502",
        lab().address(GROUP[0])
    )));

    // A flag change restarts both ranks, together. A request in flight on rank 0 (no `drain:`) is
    // answered first: rank 0 drains it, then its shutdown ends rank 1, and neither stop is a
    // failure.
    let before: Vec<String> = GROUP.iter().map(|h| lab().invocation(h, unit)).collect();
    let result = "/tmp/t-group-flow.result";
    lab().slow_request(GROUP[0], 37501, result);
    let v2 = v1.clone().flag("mem-fraction-static", 0.8);
    let (code, units, out) = apply(&v2);
    assert_eq!(code, 0, "{out}");
    for (i, host) in GROUP.iter().enumerate() {
        assert_eq!(unit_of(&units, host)["outcome"], "converged", "{out}");
        assert_ne!(lab().invocation(host, unit), before[i], "{host} restarted");
    }
    let (status, _) = lab().request_result(GROUP[0], result);
    assert_eq!(status, "200", "the request in flight was answered");
    // The old invocation's journal: systemd's lines about it, and its own.
    let journal = |host: &str, id: &str| {
        lab().sh(
            host,
            &format!(
                "journalctl --no-pager -o cat INVOCATION_ID={id} + _SYSTEMD_INVOCATION_ID={id}"
            ),
        )
    };
    for (i, host) in GROUP.iter().enumerate() {
        let ended = journal(host, &before[i]);
        assert!(
            ended.contains("Deactivated successfully") && !ended.contains("Failed with result"),
            "{host}: {ended}"
        );
        let notes = unit_of(&units, host)["notes"].to_string();
        assert_has(&notes, "the old server stopped in");
    }
    let rank1 = journal(GROUP[1], &before[1]);
    assert_has(&rank1, "waiting for the rank-0 ShutdownReq");
    let (a, b) = (started_us(GROUP[0], unit), started_us(GROUP[1], unit));
    let apart = a.abs_diff(b) as f64 / 1e6;
    eprintln!("the ranks started {apart:.3}s apart");
    // Within one poll of each other: the manifest samples every second.
    assert!(apart < 1.0, "the ranks started {apart:.3}s apart");
    assert!(a <= b, "rank 0 (the rendezvous) starts first");

    // Nothing changed: neither rank is touched.
    let before: Vec<String> = GROUP.iter().map(|h| lab().invocation(h, unit)).collect();
    let (code, units, out) = apply(&v2);
    assert_eq!(code, 0, "{out}");
    for (i, host) in GROUP.iter().enumerate() {
        assert_eq!(unit_of(&units, host)["outcome"], "unchanged", "{out}");
        assert_eq!(lab().invocation(host, unit), before[i], "{host} untouched");
    }
    clean(unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn rank_one_crashing_while_loading_rolls_both_ranks_back() {
    let unit = "t-group-crash.service";
    let kept = deployed("t-group-crash", 37503);
    let crash = [("FAKE_SGLANG_FAIL", "crash"), ("FAKE_SGLANG_FAIL_AT", "1")];
    let v2 = group("t-group-crash", 37503, &both(), &crash).flag("mem-fraction-static", 0.8);
    let (code, units, out) = apply(&v2);
    assert_eq!(code, 3, "rolled back: {out}");
    for (i, host) in GROUP.iter().enumerate() {
        let u = unit_of(&units, host);
        assert_eq!(u["outcome"], "rolled_back", "{out}");
        assert_eq!(
            unit_file(host, unit),
            kept[i],
            "{host} runs its previous unit"
        );
        assert!(
            u["rollback"]["stages"]
                .as_array()
                .is_some_and(|s| !s.is_empty()),
            "the restored group was verified: {out}"
        );
        assert!(
            u["detail"]
                .as_str()
                .unwrap()
                .contains("the previous unit was restored and passed verification"),
            "{out}"
        );
    }
    let rank0 = unit_of(&units, GROUP[0]);
    assert!(
        rank0["detail"]
            .as_str()
            .unwrap()
            .contains(&format!("rank 1 ({})", GROUP[1])),
        "rank 0 names the rank that failed: {out}"
    );
    for host in GROUP {
        assert_eq!(active(host, unit), "active", "{host}");
    }
    clean(unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_group_whose_apply_is_killed_gets_every_rank_back_from_its_hosts_guard() {
    use crate::guard::{apply_then_kill, guard_state_on, healthy_on, until};
    let unit = "t-group-guard.service";
    let kept = deployed("t-group-guard", 37525);
    let before = lab().invocation(GROUP[1], unit);
    // Rank 1 crashes 10 s after each start (rank 0 dies of it); apply dies first. The crash
    // window outlasts the crash, so apply cannot finish before the test has killed it.
    let crash = [("FAKE_SGLANG_FAIL", "crash"), ("FAKE_SGLANG_FAIL_AT", "10")];
    let v2 = group("t-group-guard", 37525, &both(), &crash)
        .flag("mem-fraction-static", 0.8)
        .verify("crash_window", "15s")
        .verify("warmup_timeout", "5s")
        .verify("guard_margin", "4s");
    apply_then_kill(
        &v2,
        || lab().invocation(GROUP[1], unit) != before,
        "rank 1 restarted",
    );
    // Each rank's guard judges its own rank: broken at its first restart, it goes back. The
    // bound is the manifest's: crash window, load deadline, warmup and margin, thrice.
    let bound = Duration::from_secs((15 + 60 + 5 + 4) * 3);
    for (i, host) in GROUP.iter().enumerate() {
        until(bound, &format!("{host}'s guard rolled back"), || {
            guard_state_on(host, unit) == "rolled_back"
        });
        assert_eq!(
            unit_file(host, unit),
            kept[i],
            "{host} runs its previous unit"
        );
    }
    // The previous ranks meet again: rank 0 answers /health for the group.
    until(bound, "the restored group answers /health", || {
        healthy_on(GROUP[0], 37525)
    });
    for host in GROUP {
        assert_eq!(active(host, unit), "active", "{host}");
    }
    clean(unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn an_unreachable_rank_leaves_the_group_unplanned_and_untouched() {
    let unit = "t-group-unreach.service";
    clean(unit);
    let (code, _, out) = apply(&group("t-group-unreach", 37505, &both(), &[]));
    assert_eq!(code, 0, "{out}");
    let before = lab().invocation(GROUP[0], unit);
    let kept = unit_file(GROUP[0], unit);
    // Rank 1 moves to a host that cannot be reached (its address is a lab host's; nothing
    // dials it, since rank 0 is never restarted).
    let nodes = [
        (GROUP[0], None),
        (UNREACHABLE, Some(lab().address(GROUP[1]))),
    ];
    let nodes: Vec<(&str, Option<&str>)> = nodes.iter().map(|(h, a)| (*h, a.as_deref())).collect();
    let text = group("t-group-unreach", 37505, &nodes, &[]).flag("mem-fraction-static", 0.8);
    let plan = Reconcile::new()
        .manifest("group.yaml", &text)
        .run_args(&["plan", "--format", "json"]);
    assert_eq!(plan.code, 1, "{}", plan.stdout);
    let json = plan.json();
    let planned = json["units"].as_array().cloned().unwrap_or_default();
    let rank0 = planned
        .iter()
        .find(|u| u["host"] == GROUP[0])
        .unwrap_or_else(|| panic!("{}", plan.stdout));
    assert_eq!(rank0["outcome"], "error", "{}", plan.stdout);
    assert!(
        rank0["error"].as_str().unwrap().contains("is not planned"),
        "{}",
        plan.stdout
    );
    let (code, units, out) = apply(&text);
    assert_eq!(code, 1, "{out}");
    assert_eq!(unit_of(&units, GROUP[0])["outcome"], "error", "{out}");
    assert!(
        unit_of(&units, GROUP[0])["detail"]
            .as_str()
            .unwrap()
            .contains("rank 1 (rl-unreachable) was refused"),
        "{out}"
    );
    assert_eq!(
        lab().invocation(GROUP[0], unit),
        before,
        "rank 0 was not restarted"
    );
    assert_eq!(
        unit_file(GROUP[0], unit),
        kept,
        "rank 0's unit was not touched"
    );
    clean(unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn ctrl_c_during_the_groups_verification_puts_every_rank_back() {
    let unit = "t-group-int.service";
    let kept = deployed("t-group-int", 37507);
    let v2 = group("t-group-int", 37507, &both(), &[])
        .flag("mem-fraction-static", 0.8)
        .env("FAKE_SGLANG_LOAD_SECONDS", "30");
    let run = Reconcile::new()
        .manifest("group.yaml", &v2)
        .args(&["apply", "--format", "json"]);
    let (ran, json) = crate::lab::signalled(
        &run,
        (GROUP[1], unit),
        "-INT",
        Duration::from_secs(60),
        Duration::from_secs(2),
    );
    assert_eq!(ran.code, 3, "{}", ran.stdout);
    let units = json["units"].as_array().cloned().unwrap_or_default();
    for (i, host) in GROUP.iter().enumerate() {
        let u = unit_of(&units, host);
        assert_eq!(u["outcome"], "rolled_back", "{}", ran.stdout);
        assert!(
            u["detail"].as_str().unwrap().contains("interrupted"),
            "{}",
            ran.stdout
        );
        assert_eq!(
            unit_file(host, unit),
            kept[i],
            "{host} back on its previous unit"
        );
        assert_eq!(active(host, unit), "active", "{host}");
    }
    clean(unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn bad_group_input_is_refused_offline_with_its_place() {
    let validate = |text: &Manifest| {
        let ran = Reconcile::new()
            .manifest("group.yaml", text)
            .run_offline(&["validate"]);
        (ran.code, format!("{}{}", ran.stdout, ran.stderr))
    };
    // One node: a group of one is refused.
    let one = group("t-group-bad", 37509, &both()[..1], &[]);
    let (code, out) = validate(&one);
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("group.yaml:3:") && out.contains("nodes"),
        "{out}"
    );
    let ranked = group("t-group-bad", 37509, &both(), &[]).flag("node-rank", 1);
    let (code, out) = validate(&ranked);
    assert_ne!(code, 0, "{out}");
    assert!(
        out.contains("group.yaml:") && out.contains("node-rank"),
        "{out}"
    );
    // Two groups claiming one rendezvous port on rank 0's host.
    let a = group("t-group-bad-a", 37509, &both(), &[]);
    let b = group("t-group-bad-b", 37511, &both(), &[]).dist_init_port(37510);
    let ran = Reconcile::new()
        .manifest("a.yaml", &a)
        .manifest("b.yaml", &b)
        .run_offline(&["validate"]);
    let out = format!("{}{}", ran.stdout, ran.stderr);
    assert_ne!(ran.code, 0, "{out}");
    assert_has(&out, "37510");
    // Hosts that disagree on the SGLang version: preflight refuses the group, touching neither.
    let unit = "t-group-version.service";
    clean(unit);
    let py = "/opt/t-group-py/bin/python3";
    for (host, v) in [(GROUP[0], None), (GROUP[1], Some("0.5.9"))] {
        let script = venv_script("/opt/t-group-py", v);
        lab().sh(host, &script);
    }
    let text = group("t-group-version", 37513, &both(), &[]).python(py);
    let (code, units, out) = apply(&text);
    assert_eq!(code, 1, "{out}");
    let rank1 = unit_of(&units, GROUP[1]);
    assert!(rank1["detail"].as_str().unwrap().contains("0.5.9"), "{out}");
    assert!(
        unit_of(&units, GROUP[0])["detail"]
            .as_str()
            .unwrap()
            .contains("was refused"),
        "{out}"
    );
    for host in GROUP {
        assert_eq!(
            lab()
                .sh(
                    host,
                    &format!("test -e /etc/systemd/system/{unit} && echo there || echo absent")
                )
                .trim(),
            "absent",
            "{host} untouched"
        );
    }
}

/// A run of the binary over the group's manifest, as `group.yaml`.
fn run(text: &Manifest, args: &[&str]) -> crate::lab::Ran {
    Reconcile::new()
        .manifest("group.yaml", text)
        .args(args)
        .run()
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn status_history_and_rollback_take_the_group_whole() {
    let unit = "t-group-hist.service";
    clean(unit);
    let v1 = group("t-group-hist", 37515, &both(), &[]);
    let v2 = v1.clone().flag("mem-fraction-static", 0.8);
    let (code, _, out) = apply(&v1);
    assert_eq!(code, 0, "{out}");
    let first: Vec<String> = GROUP.iter().map(|h| unit_file(h, unit)).collect();
    let (code, _, out) = apply(&v2);
    assert_eq!(code, 0, "{out}");

    // Status: one line for the server, on every rank.
    let ran = run(&v2, &["status", "--format", "json"]);
    ran.assert_code(0);
    let units = ran.json()["units"].as_array().cloned().unwrap();
    for host in GROUP {
        let details = unit_of(&units, host)["details"].to_string();
        assert!(
            details.contains("one server over 2 hosts") && details.contains("every rank in sync"),
            "{details}"
        );
    }

    // History: the deployments every rank shares.
    let ran = run(&v2, &["history", "t-group-hist", "--format", "json"]);
    ran.assert_code(0);
    let notes = ran.json()["hosts"][0]["notes"].to_string();
    assert_has(&notes, "to roll the group back to: 1, 2");

    // Rollback: both ranks back to deployment 1 together, verified as a group.
    let ran = run(
        &v2,
        &["rollback", "t-group-hist", "--to", "1", "--format", "json"],
    );
    ran.assert_code(0);
    let units = ran.json()["units"].as_array().cloned().unwrap();
    for (i, host) in GROUP.iter().enumerate() {
        let u = unit_of(&units, host);
        assert_eq!(u["outcome"], "converged", "{u:#}");
        assert!(
            u["detail"]
                .as_str()
                .unwrap()
                .starts_with("rollback to deployment 1"),
            "{u:#}"
        );
        assert_eq!(
            unit_file(host, unit),
            first[i],
            "{host} on deployment 1's unit"
        );
    }
    // The manifest still says v2: the whole server is out of sync, and status says which ranks.
    let ran = run(&v2, &["status", "--format", "json"]);
    let units = ran.json()["units"].as_array().cloned().unwrap();
    let details = unit_of(&units, GROUP[0])["details"].to_string();
    assert_has(&details, "the server is NOT in sync");
    clean(unit);
}

/// A server group behind the real sglang-router (`crate::router`'s router on `ROUTER`): rank 0
/// (the group's only API) on `rank0`, the other rank on the other `GROUP` host, serving the
/// router's model on `port` (rendezvous one above). `generation` is an env value: a new one
/// restarts the group.
fn routed_group(service: &str, rank0: usize, port: u16, generation: u32) -> Manifest {
    use crate::router::{KEY_FILE, MODEL, ROUTER_PORT};
    let (first, second) = (GROUP[rank0], GROUP[1 - rank0]);
    let gpu = (port - 37501) / 2;
    let node = |name: &str| map([("name", name.to_string()), ("address", lab().address(name))]);
    let router = map([
        (
            "url",
            Value::from(format!("http://127.0.0.1:{ROUTER_PORT}")),
        ),
        ("via", crate::lab::ROUTER.into()),
        ("admin_key_file", KEY_FILE.into()),
        (
            "workers",
            map([(first, format!("http://{}:{port}", lab().address(first)))]),
        ),
    ]);
    Manifest::new(service)
        .without("description")
        .without("hosts")
        .without("systemd")
        .node(node(first))
        .node(node(second))
        .served_model_name(MODEL)
        .listen("0.0.0.0")
        .port(port)
        .dist_init_port(port + 1)
        .without_flag("context-length")
        .flag("dist-timeout", 30)
        .flag("enable-metrics", true)
        .without_env("NCCL_P2P_DISABLE")
        .env("CUDA_VISIBLE_DEVICES", gpu.to_string())
        .env("FAKE_SGLANG_GPU_COUNT", "16")
        .env("FAKE_SGLANG_LOAD_SECONDS", "1")
        .env("FAKE_SGLANG_MEMORY_MB", "10")
        .env("GENERATION", generation.to_string())
        .verify_all(&[
            ("crash_window", "2s"),
            ("sample_interval", "1s"),
            ("stall_timeout", "15s"),
            ("load_deadline", "60s"),
        ])
        .section("router", router)
}

/// Two groups of one model behind one router, rank 0 of each on a different host: a restarting
/// change rolls group after group, each group's rank 0 out of the router while its ranks restart
/// and back once the group is verified, so a client sending through the router all along loses
/// no request and one group always serves.
#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn two_groups_behind_a_router_roll_one_after_the_other_and_lose_no_request() {
    let _turn = crate::router::TURN
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    crate::router::fresh_router();
    let groups = [("t-group-ra", 0, 37521), ("t-group-rb", 1, 37523)];
    for (service, _, _) in groups {
        clean(&format!("{service}.service"));
    }
    let apply = |generation| {
        let mut r = Reconcile::new();
        for (service, rank0, port) in groups {
            r = r.manifest(
                &format!("{service}.yaml"),
                routed_group(service, rank0, port, generation),
            );
        }
        let ran = r.args(&["apply", "--format", "json"]).run();
        let units = ran.json()["units"].as_array().cloned().unwrap_or_default();
        (ran.code, units, format!("{}{}", ran.stdout, ran.stderr))
    };
    let rank0_url =
        |rank0: usize, port: u16| format!("http://{}:{port}", lab().address(GROUP[rank0]));
    let mut both_in: Vec<(String, bool)> = groups
        .iter()
        .map(|&(_, rank0, port)| (rank0_url(rank0, port), true))
        .collect();
    both_in.sort();

    // First install: each group's rank 0 goes into the router once its group is verified; the
    // other rank never does.
    let (code, _, out) = apply(1);
    assert_eq!(code, 0, "{out}");
    assert_eq!(crate::router::listed(), both_in, "{out}");

    let client = crate::router::Client::start();
    // Requests flow through the router before the rollout begins, and after it ends.
    client.wait_for_answers(4);
    let (code, units, out) = apply(2);
    client.wait_for_answers(4);
    let seen = client.stop();
    assert_eq!(code, 0, "{out}");
    let unit_at = |service: &str, host: &str| {
        units
            .iter()
            .find(|u| u["host"] == host && u["unit"] == format!("{service}.service"))
            .unwrap_or_else(|| panic!("no report of {service} on {host}: {out}"))
            .clone()
    };
    // Each group's ranks: (first start, last start) in CLOCK_MONOTONIC microseconds.
    let mut windows = Vec::new();
    for (service, rank0, port) in groups {
        let unit = format!("{service}.service");
        for host in GROUP {
            assert_eq!(unit_at(service, host)["outcome"], "converged", "{out}");
        }
        let notes = unit_at(service, GROUP[rank0])["notes"].to_string();
        assert!(
            notes.contains(&format!("router: {} out in", rank0_url(rank0, port)))
                && notes.contains("healthy after"),
            "rank 0 left the router and came back: {notes}"
        );
        let other = unit_at(service, GROUP[1 - rank0])["notes"].to_string();
        assert!(!other.contains("router: "), "rank 1 is no worker: {other}");
        let starts: Vec<u64> = GROUP.iter().map(|h| started_us(h, &unit)).collect();
        windows.push((*starts.iter().min().unwrap(), *starts.iter().max().unwrap()));
    }
    // Group after group: the second group's ranks started only after the first group's had,
    // and at least its verification (a crash window of 2 s) later.
    let (first, second) = if windows[0].0 <= windows[1].0 {
        (windows[0], windows[1])
    } else {
        (windows[1], windows[0])
    };
    let gap = second.0.saturating_sub(first.1) as f64 / 1e6;
    eprintln!("the second group started {gap:.2}s after the first");
    assert!(gap >= 2.0, "the groups overlapped: {windows:?}");
    assert_eq!(
        seen["failed"], 0,
        "requests failed through the router: {seen}"
    );
    assert!(seen["ok"].as_u64().unwrap_or(0) > 0, "{seen}");
    assert_eq!(crate::router::listed(), both_in, "the worker list is whole");
    for (service, _, _) in groups {
        clean(&format!("{service}.service"));
    }
}
