//! A rolling apply of two real replicas behind the real sglang-router 0.3.2 (on
//! `crate::lab::ROUTER`), with a client loop sending chat completions through the router the
//! whole time: no request is lost, and the worker list is whole. The canary is baked on that
//! traffic against the other replica from their real `/metrics`: a change that makes it queue
//! its requests fails (rolled back, the rollout stops), a neutral one passes (the rollout goes
//! on, each replica restarted once). The router's helpers are the stand-in router tests'
//! (`crate::router`).

use super::{slots, HOSTS};
use crate::builder::yaml;
use crate::lab::Manifest;
use crate::router::{
    all_healthy, apply, fresh_router, listed, router_section, since_epoch, starts_since, unit_of,
    Client, MODEL, SERVICE, TURN,
};

/// The replicas' manifest; a new `max_running` (a flag value) restarts every replica. One
/// running request at a time is a regression: the canary's requests queue behind each other.
/// The bake waits out a warm-up, then a window long enough for a queueing canary to serve the
/// rank test's observations.
fn manifest(max_running: u32) -> Manifest {
    super::manifest(SERVICE, &HOSTS, 30000)
        .without("description")
        .without("systemd")
        .served_model_name(MODEL)
        .listen("0.0.0.0")
        .flag("enable-metrics", true)
        .flag("max-running-requests", max_running)
        .section("drain", yaml("{ timeout: 120s }"))
        .section("router", router_section(&HOSTS))
        .verify(
            "bake",
            yaml("{ warmup: 2s, duration: 10s, min_requests: 20 }"),
        )
}

/// What the canary's bake said, printed for the CI log, the detail last (a log's tail keeps the
/// end of a long message).
fn judged<'r>(report: &'r serde_json::Value, what: &str) -> &'r serde_json::Value {
    let bake = &unit_of(report, HOSTS[0])["bake"];
    eprintln!("bake, real replicas, {what}: {}", bake["detail"]);
    &bake["judged"]
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
    // A first install: the canary has no replica running the unit yet to be judged against.
    let (code, first) = apply(&manifest(17), &[]);
    assert_eq!(code, 0, "{first:#}");
    assert!(unit_of(&first, HOSTS[0]).get("bake").is_none(), "{first:#}");
    assert_eq!(listed(), all_healthy(&HOSTS));
    let client = Client::asking_for(32);
    client.wait_for_answers(4);

    // The regression: the canary fails its bake, is rolled back, and the rollout stops.
    let since = since_epoch();
    let (code, report) = apply(&manifest(1), &["--max-parallel", "1"]);
    client.wait_for_answers(4);
    let judgement = judged(&report, "max-running-requests 1");
    assert_eq!(code, 3, "{report:#}");
    assert_eq!(judgement["verdict"], "failed", "{judgement:#}");
    assert!(
        judgement["why"].to_string().contains("TTFT p50"),
        "{judgement:#}"
    );
    let canary = unit_of(&report, HOSTS[0]);
    assert_eq!(
        (&canary["outcome"], &canary["error"]),
        (&"rolled_back".into(), &"bake_failed".into()),
        "{canary:#}"
    );
    assert_eq!(unit_of(&report, HOSTS[1])["outcome"], "not_started");
    assert_eq!(
        starts_since(HOSTS[0], since),
        2,
        "the new unit, then the old"
    );
    assert_eq!(starts_since(HOSTS[1], since), 0);
    assert_eq!(listed(), all_healthy(&HOSTS), "the worker list is whole");

    // A neutral change: passed, and the rollout goes on to the other replica.
    let since = since_epoch();
    let (code, report) = apply(&manifest(18), &["--max-parallel", "1"]);
    client.wait_for_answers(4);
    let seen = client.stop();
    let judgement = judged(&report, "max-running-requests 18");
    assert_eq!(code, 0, "{report:#}");
    for host in HOSTS {
        let u = unit_of(&report, host);
        assert_eq!(u["outcome"], "converged", "{u:#}");
        assert_eq!(starts_since(host, since), 1, "{host} restarted once");
    }
    assert_eq!(judgement["verdict"], "passed", "{judgement:#}");
    for side in ["canary", "stable"] {
        let figures = &judgement[side];
        assert!(figures["requests"].as_f64() >= Some(20.0), "{judgement:#}");
        assert!(figures["ttft_p50_s"].as_f64().is_some(), "{judgement:#}");
    }
    assert!(unit_of(&report, HOSTS[1]).get("bake").is_none());
    assert_eq!(
        seen["failed"], 0,
        "requests failed through the router: {seen}"
    );
    assert!(seen["ok"].as_u64().unwrap_or(0) > 0, "{seen}");
    assert_eq!(listed(), all_healthy(&HOSTS), "the worker list is whole");
    eprintln!("through the router during both rollouts: {seen}");
    for host in HOSTS {
        crate::lab::sh_quietly(host, &format!("systemctl disable --now {SERVICE}.service"));
    }
}
