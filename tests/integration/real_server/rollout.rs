//! A rolling apply of two real replicas behind the real sglang-router 0.3.2 (on
//! `crate::lab::ROUTER`), with a client loop sending chat completions through the router the
//! whole time: no request is lost, each replica restarts once, and the worker list is whole.
//! The router's helpers are the stand-in router tests' (`crate::router`).

use std::time::Duration;

use super::{slots, HOSTS, ROOT};
use crate::lab::{lab, ROUTER};
use crate::router::{
    all_healthy, apply, fresh_router, listed, since_epoch, starts_since, unit_of, worker_url,
    Client, KEY_FILE, MODEL, ROUTER_PORT, SERVICE, TURN,
};

/// The replicas' manifest; a new `generation` (a flag value) restarts every replica.
fn manifest(generation: u32) -> String {
    let workers: Vec<String> = HOSTS
        .iter()
        .map(|h| format!("    {h}: \"{}\"\n", worker_url(h)))
        .collect();
    format!(
        "service: {SERVICE}\n\
         hosts: [{}]\n\
         sglang:\n  python: {ROOT}/bin/python3\n  version: 0.5.23\n  model_path: {ROOT}/tiny-model\n  served_model_name: {MODEL}\n  host: 0.0.0.0\n  port: 30000\n  flags:\n    device: cpu\n    attention-backend: torch_native\n    sampling-backend: pytorch\n    max-total-tokens: 4096\n    enable-metrics: true\n    max-running-requests: {}\n\
         env: {{ OMP_NUM_THREADS: \"1\" }}\n\
         verify: {{ crash_window: 3s, sample_interval: 500ms, stall_timeout: 300s, load_deadline: 240s }}\n\
         drain: {{ timeout: 120s }}\n\
         router:\n  url: http://127.0.0.1:{ROUTER_PORT}\n  via: {ROUTER}\n  admin_key_file: {KEY_FILE}\n  workers:\n{}",
        HOSTS.join(", "),
        16 + generation,
        workers.concat()
    )
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_rolling_apply_of_real_replicas_behind_the_router_loses_no_request() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    let _slots = slots(2);
    fresh_router();
    let _stopped: Vec<_> = HOSTS
        .iter()
        .map(|h| super::stopped(h, &format!("{SERVICE}.service")))
        .collect();
    let (code, first) = apply(&manifest(1), &[]);
    assert_eq!(code, 0, "{first:#}");
    assert_eq!(listed(), all_healthy(&HOSTS));
    let client = Client::start();
    std::thread::sleep(Duration::from_secs(2));
    let since = since_epoch();
    let (code, report) = apply(&manifest(2), &["--max-parallel", "1"]);
    std::thread::sleep(Duration::from_secs(2));
    let seen = client.stop();
    assert_eq!(code, 0, "{report:#}");
    for host in HOSTS {
        let u = unit_of(&report, host);
        assert_eq!(u["outcome"], "converged", "{u:#}");
        assert_eq!(starts_since(host, since), 1, "{host} restarted once");
    }
    assert_eq!(
        seen["failed"], 0,
        "requests failed through the router: {seen}"
    );
    assert!(seen["ok"].as_u64().unwrap_or(0) > 0, "{seen}");
    assert_eq!(listed(), all_healthy(&HOSTS), "the worker list is whole");
    eprintln!("through the router during the rollout: {seen}");
    for host in HOSTS {
        crate::lab::sh_quietly(host, &format!("systemctl disable --now {SERVICE}.service"));
    }
}
