//! A rolling apply of two real replicas behind the real sglang-router 0.3.2 (on
//! `crate::lab::ROUTER`), with a client loop sending chat completions through the router the
//! whole time: no request is lost, each replica restarts once, and the worker list is whole. The
//! canary is baked on that traffic against the other replica from their real `/metrics`, and
//! passes. The router's helpers are the stand-in router tests' (`crate::router`).

use super::{slots, HOSTS};
use crate::builder::yaml;
use crate::lab::Manifest;
use crate::router::{
    all_healthy, apply, fresh_router, listed, router_section, since_epoch, starts_since, unit_of,
    Client, MODEL, SERVICE, TURN,
};

/// The replicas' manifest; a new `generation` (a flag value) restarts every replica.
fn manifest(generation: u32) -> Manifest {
    super::manifest(SERVICE, &HOSTS, 30000)
        .without("description")
        .without("systemd")
        .served_model_name(MODEL)
        .listen("0.0.0.0")
        .flag("enable-metrics", true)
        .flag("max-running-requests", 16 + generation)
        .section("drain", yaml("{ timeout: 120s }"))
        .section("router", router_section(&HOSTS))
        .verify("bake", yaml("{ duration: 5s, min_requests: 20 }"))
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
    client.wait_for_answers(4);
    let since = since_epoch();
    let (code, report) = apply(&manifest(2), &["--max-parallel", "1"]);
    client.wait_for_answers(4);
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
    // The canary (the first host by name) was baked against the other replica, and passed.
    let bake = &unit_of(&report, HOSTS[0])["bake"];
    eprintln!("bake, real replicas: {}", bake["detail"]);
    // The detail last: a CI log's tail keeps the end of a long message.
    assert_eq!(
        bake["judged"]["verdict"], "passed",
        "{bake:#}\nthe bake said: {}",
        bake["detail"]
    );
    for side in ["canary", "stable"] {
        let figures = &bake["judged"][side];
        assert!(figures["requests"].as_f64() >= Some(20.0), "{bake:#}");
        assert!(figures["ttft_p50_s"].as_f64().is_some(), "{bake:#}");
    }
    assert!(unit_of(&report, HOSTS[1]).get("bake").is_none());
    for host in HOSTS {
        crate::lab::sh_quietly(host, &format!("systemctl disable --now {SERVICE}.service"));
    }
}
