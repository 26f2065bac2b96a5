//! Zero-downtime rollouts behind the real sglang-router 0.3.2 (issue 16): the router runs on
//! `ROUTER` as a systemd unit (the test-host image has it in /opt/sglang-router), three SGLang
//! stand-in replicas on `REPLICAS`, and a client loop on the router host sends chat completions
//! through it while `reconcile apply` rolls a restarting change over the replicas.
//!
//! The tests share these hosts, so they take turns (`TURN`).

use std::sync::Mutex;
use std::time::Duration;

use serde_yaml::Value;

use crate::builder::{map, yaml};
use crate::lab::{assert_has, lab, send_signal, Manifest, Reconcile, REPLICAS, ROUTER};

pub(crate) static TURN: Mutex<()> = Mutex::new(());

const ROUTER_UNIT: &str = "it-sglang-router";
pub(crate) const ROUTER_PORT: u16 = 30100;
pub(crate) const SERVICE: &str = "router-replica";
pub(crate) const MODEL: &str = "router-model";
pub(crate) const KEY_FILE: &str = "/etc/sglang-router/admin-key";
const CLIENT: &str = include_str!("../../bench/router_client.py");

/// The router's `/workers`, read on its host with its admin key (the image has no curl).
fn workers() -> Vec<serde_json::Value> {
    let script = format!(
        "python3 -c \"import urllib.request as u; k = open('{KEY_FILE}').read().strip(); \
         print(u.urlopen(u.Request('http://127.0.0.1:{ROUTER_PORT}/workers', \
         headers={{'Authorization': 'Bearer ' + k}}), timeout=10).read().decode())\""
    );
    let out = lab().sh(ROUTER, &script);
    let list: serde_json::Value = serde_json::from_str(&out).expect("the router's /workers");
    list["workers"].as_array().cloned().unwrap_or_default()
}

pub(crate) fn worker_url(host: &str) -> String {
    format!("http://{}:30000", lab().address(host))
}

/// Each listed worker's URL and health.
pub(crate) fn listed() -> Vec<(String, bool)> {
    let mut w: Vec<(String, bool)> = workers()
        .iter()
        .map(|w| {
            (
                w["url"].as_str().unwrap_or_default().to_string(),
                w["is_healthy"] == true,
            )
        })
        .collect();
    w.sort();
    w
}

pub(crate) fn all_healthy(hosts: &[&str]) -> Vec<(String, bool)> {
    let mut w: Vec<(String, bool)> = hosts.iter().map(|h| (worker_url(h), true)).collect();
    w.sort();
    w
}

/// Clean replica hosts and a fresh router with no workers and a random admin key.
pub(crate) fn fresh_router() {
    for host in REPLICAS.iter().chain(&crate::real_server::HOSTS) {
        lab().remove_unit(host, &format!("{SERVICE}.service"));
    }
    lab().sh(
        ROUTER,
        &format!(
            "systemctl stop {ROUTER_UNIT} 2>/dev/null; systemctl reset-failed {ROUTER_UNIT} 2>/dev/null; \
             mkdir -p /etc/sglang-router; (umask 077; od -An -N16 -tx1 /dev/urandom | tr -d ' \\n' > {KEY_FILE}); \
             systemd-run -q --unit {ROUTER_UNIT} /opt/sglang-router/bin/python -m sglang_router.launch_router \
             --host 127.0.0.1 --port {ROUTER_PORT} --policy round_robin --health-check-interval-secs 2 \
             --control-plane-api-keys \"reconcile:reconcile:admin:$(cat {KEY_FILE})\""
        ),
    );
    // 30 s bounds a router that never listens (it does within seconds).
    lab().wait_until(
        ROUTER,
        &format!("python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", {ROUTER_PORT}), 1)' 2>/dev/null"),
        Duration::from_secs(30),
    );
    assert_eq!(listed(), vec![], "a fresh router lists no worker");
}

/// The replicas' manifest. `generation` is an env value (a new one restarts every replica);
/// `failing` makes that host's stand-in crash as it starts.
fn manifest(hosts: &[&str], generation: u32, failing: Option<&str>) -> Manifest {
    let crash = [("FAKE_SGLANG_FAIL", "crash"), ("FAKE_SGLANG_FAIL_AT", "1")];
    let failing: Vec<_> = failing.iter().map(|f| (*f, &crash[..])).collect();
    manifest_with(hosts, generation, &failing)
}

/// [`manifest`] with `special`'s host given more environment (a knob of the stand-in's).
fn manifest_with(hosts: &[&str], generation: u32, special: &[(&str, &[(&str, &str)])]) -> Manifest {
    let entries = hosts
        .iter()
        .map(|h| match special.iter().find(|(s, _)| s == h) {
            Some((_, env)) => map([("name", Value::from(*h)), ("env", map(env.iter().copied()))]),
            None => Value::from(*h),
        });
    entries
        .fold(Manifest::new(SERVICE), Manifest::host)
        .without("description")
        .without("systemd")
        .served_model_name(MODEL)
        .listen("0.0.0.0")
        .without_flag("tp-size")
        .without_flag("context-length")
        .flag("enable-metrics", true)
        .without("env")
        .env("FAKE_SGLANG_LOAD_SECONDS", "1")
        .env("FAKE_SGLANG_MEMORY_MB", "10")
        .env("GENERATION", generation.to_string())
        .verify("crash_window", "2s")
        .section("router", router_section(hosts))
}

/// `router:` of the replicas on `hosts`: the router on `ROUTER`, each host's worker URL.
pub(crate) fn router_section(hosts: &[&str]) -> Value {
    map([
        (
            "url",
            Value::from(format!("http://127.0.0.1:{ROUTER_PORT}")),
        ),
        ("via", ROUTER.into()),
        ("admin_key_file", KEY_FILE.into()),
        ("workers", map(hosts.iter().map(|h| (*h, worker_url(h))))),
    ])
}

pub(crate) fn apply(text: &Manifest, extra: &[&str]) -> (i32, serde_json::Value) {
    let ran = Reconcile::new()
        .manifest("replicas.yaml", text)
        .args(&["apply", "--format", "json"])
        .args(extra)
        .run();
    assert!(
        !ran.stdout
            .contains(&lab().sh(ROUTER, &format!("cat {KEY_FILE}"))),
        "the admin key is in the output"
    );
    (ran.code, ran.json())
}

pub(crate) fn unit_of<'a>(report: &'a serde_json::Value, host: &str) -> &'a serde_json::Value {
    report["units"]
        .as_array()
        .and_then(|u| u.iter().find(|u| u["host"] == host))
        .unwrap_or_else(|| panic!("no unit of {host} in {report}"))
}

/// The client loop on the router host, sending through the router until stopped.
pub(crate) struct Client;

/// Where the client loop keeps its counts so far (`OK FAILED`).
const PROGRESS: &str = "/root/client.progress";

impl Client {
    pub(crate) fn start() -> Client {
        Client::asking_for(8)
    }

    /// A loop whose answers are `max_tokens` long: a replica that runs one request at a time
    /// shows it in its requests' first tokens only when the one ahead takes a while.
    pub(crate) fn asking_for(max_tokens: u32) -> Client {
        lab().put(ROUTER, "/root/router_client.py", CLIENT);
        lab().sh(
            ROUTER,
            &format!("rm -f /root/stop /root/client.json {PROGRESS}; nohup python3 /root/router_client.py http://127.0.0.1:{ROUTER_PORT} {MODEL} /root/stop 4 {PROGRESS} {max_tokens} > /root/client.json 2>&1 < /dev/null &"),
        );
        Client
    }

    /// Requests answered so far.
    pub(crate) fn answered(&self) -> u64 {
        lab()
            .sh(
                ROUTER,
                &format!("cut -d' ' -f1 {PROGRESS} 2>/dev/null || echo 0"),
            )
            .trim()
            .parse()
            .unwrap_or(0)
    }

    /// Waits until `n` more requests have been answered: traffic flows through the router now.
    /// 60 s bounds a router that never answers (one answer takes well under a second).
    pub(crate) fn wait_for_answers(&self, n: u64) {
        let target = self.answered() + n;
        lab().wait_until(
            ROUTER,
            &format!("[ \"$(cut -d' ' -f1 {PROGRESS} 2>/dev/null || echo 0)\" -ge {target} ]"),
            Duration::from_secs(60),
        );
    }

    /// Stops the loop: what it saw.
    pub(crate) fn stop(self) -> serde_json::Value {
        lab().sh(ROUTER, "touch /root/stop");
        // 150 s bounds a loop that never ends: its requests time out at 120 s.
        lab().wait_until(ROUTER, "[ -s /root/client.json ]", Duration::from_secs(150));
        let out = lab().sh(ROUTER, "cat /root/client.json");
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("client output ({e}): {out}"))
    }
}

impl Drop for Client {
    fn drop(&mut self) {
        crate::lab::sh_quietly(ROUTER, "touch /root/stop");
    }
}

pub(crate) fn since_epoch() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// Starts of the replica's unit since `since` (seconds since the epoch): systemd's "Started"
/// messages logged at or after it by PID 1's own clock (`_SOURCE_REALTIME_TIMESTAMP`), never
/// journald's timestamps (when it read a line, seconds late on a loaded machine), once the
/// message of the invocation running now is in the journal. The stand-in tests count by
/// invocation instead ([`crate::lab::Lab::starts_after`]).
pub(crate) fn starts_since(host: &str, since: u64) -> usize {
    let unit = format!("{SERVICE}.service");
    let started = crate::lab::Lab::started_messages(&unit);
    let now = lab().invocation(host, &unit);
    if !now.is_empty() {
        // Bounds a journald that never catches up; it lags seconds at most, under full load.
        lab().wait_until(
            host,
            &format!("{started} | grep -q '\"{now}\"'"),
            Duration::from_secs(30),
        );
    }
    lab()
        .sh(host, &started)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| {
            let us = e["_SOURCE_REALTIME_TIMESTAMP"]
                .as_str()
                .or(e["__REALTIME_TIMESTAMP"].as_str())
                .and_then(|t| t.parse::<u64>().ok())
                .unwrap_or(0);
            us >= since * 1_000_000
        })
        .count()
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_rolling_apply_behind_the_router_loses_no_request() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    fresh_router();
    let (code, first) = apply(&manifest(&REPLICAS, 1, None), &[]);
    assert_eq!(code, 0, "{first}");
    // New replicas are not in the router yet: each is added once verified.
    assert_eq!(listed(), all_healthy(&REPLICAS));
    let unit = format!("{SERVICE}.service");
    let before: Vec<String> = REPLICAS
        .iter()
        .map(|h| lab().invocation(h, &unit))
        .collect();
    let client = Client::start();
    // Requests flow through the router before the rollout begins, and after it ends.
    client.wait_for_answers(4);
    let (code, report) = apply(&manifest(&REPLICAS, 2, None), &[]);
    client.wait_for_answers(4);
    let seen = client.stop();
    assert_eq!(code, 0, "{report}");
    for (host, before) in REPLICAS.iter().zip(&before) {
        let u = unit_of(&report, host);
        assert_eq!(u["outcome"], "converged", "{u}");
        let notes = u["notes"].to_string();
        assert!(
            notes.contains("router: ") && notes.contains("healthy after"),
            "{notes}"
        );
        assert_eq!(
            lab().starts_after(host, &unit, before),
            1,
            "{host} restarted once"
        );
    }
    assert_eq!(
        seen["failed"], 0,
        "requests failed through the router: {seen}"
    );
    assert!(seen["ok"].as_u64().unwrap_or(0) > 0, "{seen}");
    assert_eq!(listed(), all_healthy(&REPLICAS), "the worker list is whole");
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_replica_failing_verification_is_back_in_the_router_on_its_old_unit() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    fresh_router();
    let (code, first) = apply(&manifest(&REPLICAS, 1, None), &[]);
    assert_eq!(code, 0, "{first}");
    let client = Client::start();
    let (code, report) = apply(
        &manifest(&REPLICAS, 2, Some(REPLICAS[1])),
        &["--max-parallel", "1"],
    );
    let seen = client.stop();
    assert_eq!(code, 3, "{report}");
    assert_eq!(unit_of(&report, REPLICAS[0])["outcome"], "converged");
    let failed = unit_of(&report, REPLICAS[1]);
    assert_eq!(failed["outcome"], "rolled_back", "{failed}");
    assert!(
        failed["notes"].to_string().contains("healthy after"),
        "{failed}"
    );
    // One replica at a time: the rollout stopped there (one failure allowed by default).
    assert_eq!(unit_of(&report, REPLICAS[2])["outcome"], "not_started");
    let unit = lab().sh(
        REPLICAS[1],
        &format!("cat /etc/systemd/system/{SERVICE}.service"),
    );
    assert!(
        unit.contains("GENERATION=1") && !unit.contains("FAKE_SGLANG_FAIL"),
        "{unit}"
    );
    assert_eq!(
        listed(),
        all_healthy(&REPLICAS),
        "every replica is back in the router"
    );
    assert_eq!(
        seen["failed"], 0,
        "requests failed through the router: {seen}"
    );
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn the_last_healthy_replica_is_never_taken_out() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    fresh_router();
    let only = &REPLICAS[..1];
    let (code, first) = apply(&manifest(only, 1, None), &[]);
    assert_eq!(code, 0, "{first}");
    let unit = format!("{SERVICE}.service");
    let before = lab().invocation(only[0], &unit);
    let (code, report) = apply(&manifest(only, 2, None), &[]);
    assert_eq!(code, 1, "{report}");
    let u = unit_of(&report, only[0]);
    assert_eq!(u["outcome"], "error", "{u}");
    assert_eq!(u["error"], "refused", "{u}");
    let detail = u["detail"].as_str().unwrap_or_default();
    assert_has(
        detail,
        &format!("would leave 0 healthy replica(s) of `{MODEL}` (min_available 1)"),
    );
    assert_eq!(lab().invocation(only[0], &unit), before, "not restarted");
    assert!(lab()
        .sh(only[0], &format!("cat /etc/systemd/system/{unit}"))
        .contains("GENERATION=1"));
    assert_eq!(listed(), all_healthy(only), "it stayed in the router");
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn sigterm_during_verification_puts_the_replica_back_on_its_old_unit() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    fresh_router();
    let two = &REPLICAS[..2];
    let (code, first) = apply(&manifest(two, 1, None), &[]);
    assert_eq!(code, 0, "{first}");
    let unit = format!("{SERVICE}.service");
    let slow = manifest(two, 2, None).env("FAKE_SGLANG_LOAD_SECONDS", "8");
    let before = lab().invocation(two[0], &unit);
    // Bound, not a temporary: the run's folder (its manifests) lives as long as this value.
    let run = Reconcile::new().manifest("replicas.yaml", &slow).args(&[
        "apply",
        "--format",
        "json",
        "--max-parallel",
        "1",
    ]);
    let child = run.spawn(&[]);
    lab().wait_for_restart(two[0], &unit, &before);
    assert_eq!(listed(), all_healthy(&two[1..]), "out while it restarts");
    // An input of the fault, not a wait: the signal lands half a second into a verification that
    // lasts the 8 s load at least.
    std::thread::sleep(Duration::from_millis(500));
    send_signal(&child, "-TERM");
    let ran = crate::lab::Ran::from(child.wait_with_output().unwrap());
    ran.assert_code(3);
    let report = ran.json();
    let u = unit_of(&report, two[0]);
    assert_eq!(u["outcome"], "rolled_back", "{u}");
    assert!(
        u["detail"].to_string().contains("interrupted (SIGTERM)"),
        "{u}"
    );
    assert!(lab()
        .sh(two[0], &format!("cat /etc/systemd/system/{unit}"))
        .contains("GENERATION=1"));
    assert_eq!(listed(), all_healthy(two), "back in the router");
}

/// A bake that cannot tell: the canary serves the client loop's traffic as well as the stable
/// replicas, but on fewer requests than the manifest asks for to show it (`min_requests`). The
/// rollout pauses (exit 5) with the canary on its new unit and the others on their old, and
/// says how to go on; `--rollback-all` does not take the canary back.
#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_bake_that_cannot_tell_pauses_the_rollout_with_the_canary_kept() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    fresh_router();
    let canary = REPLICAS[0];
    let baked = |m: Manifest| {
        m.verify(
            "bake",
            yaml("{ warmup: 1s, duration: 3s, min_requests: 100000 }"),
        )
        .section("rollout", map([("canary", canary)]))
    };
    let (code, first) = apply(&baked(manifest_with(&REPLICAS, 1, &[])), &[]);
    assert_eq!(code, 0, "{first}");
    let client = Client::start();
    client.wait_for_answers(4);
    let (code, report) = apply(
        &baked(manifest_with(&REPLICAS, 2, &[])),
        &["--rollback-all"],
    );
    let seen = client.stop();
    assert_eq!(code, 5, "{report:#}");
    let u = unit_of(&report, canary);
    assert_eq!(u["outcome"], "converged", "{u:#}");
    let judged = &u["bake"]["judged"];
    assert_eq!(judged["verdict"], "inconclusive", "{u:#}");
    assert!(
        judged["why"][0]
            .as_str()
            .unwrap_or_default()
            .starts_with("too few requests to show the canary is no worse"),
        "{u:#}"
    );
    for other in &REPLICAS[1..] {
        let o = unit_of(&report, other);
        assert_eq!(o["outcome"], "not_started", "{o:#}");
        let detail = o["detail"].as_str().unwrap_or_default();
        assert!(
            detail.contains(&format!(
                "the rollout paused: the bake could not judge the canary {canary}"
            )) && detail.contains(&format!("`reconcile rollback <service> --host {canary}`")),
            "{o:#}"
        );
        assert!(lab()
            .sh(other, &format!("cat /etc/systemd/system/{SERVICE}.service"))
            .contains("GENERATION=1"));
    }
    assert!(lab()
        .sh(
            canary,
            &format!("cat /etc/systemd/system/{SERVICE}.service")
        )
        .contains("GENERATION=2"));
    assert_eq!(
        listed(),
        all_healthy(&REPLICAS),
        "every replica in the router"
    );
    assert_eq!(
        seen["failed"], 0,
        "requests failed through the router: {seen}"
    );
}

/// The bake: each replica's first token takes 20 ms (the stand-in's default) under the client
/// loop's traffic; the canary of the next change takes 500 ms, which its gates do not see. Baked
/// for 5 s behind the router against the two stable replicas, it fails (TTFT, beyond chance),
/// is taken out, rolled back, verified and put back in, and the rollout stops there; a look at a stable
/// replica that timed out on the way was taken again. (A bake that passes
/// and lets the rollout go on: `real_server::rollout`, on two real replicas.)
#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_canary_slower_on_live_traffic_is_rolled_back_by_its_bake_and_the_rollout_stops() {
    let _turn = TURN.lock().unwrap_or_else(|p| p.into_inner());
    fresh_router();
    let canary = REPLICAS[0];
    let baked = |m: Manifest| {
        m.verify("bake", yaml("{ duration: 5s, min_requests: 20 }"))
            .section("rollout", map([("canary", canary)]))
    };
    // One stable replica answers every second `/metrics` past reconcile's 10 s timeout for it,
    // as a busy real server can: the bake's second look at it fails and is taken again.
    let stalling = (REPLICAS[1], &[("FAKE_SGLANG_METRICS_STALL_EVERY", "2")][..]);
    let (code, first) = apply(&baked(manifest_with(&REPLICAS, 1, &[stalling])), &[]);
    assert_eq!(code, 0, "{first}");
    let client = Client::start();
    client.wait_for_answers(4);
    let slow = (canary, &[("FAKE_SGLANG_TTFT_SECONDS", "0.5")][..]);
    let (code, report) = apply(&baked(manifest_with(&REPLICAS, 2, &[slow, stalling])), &[]);
    assert_eq!(code, 3, "{report}");
    let u = unit_of(&report, canary);
    assert_eq!(
        (&u["outcome"], &u["error"]),
        (&"rolled_back".into(), &"bake_failed".into()),
        "{u:#}"
    );
    let judged = &u["bake"]["judged"];
    eprintln!("bake, stand-in, slow canary: {}", u["bake"]["detail"]);
    assert_eq!(judged["verdict"], "failed", "{u:#}");
    assert!(judged["why"].to_string().contains("TTFT p50"), "{u:#}");
    // Judged by ranks, beyond chance.
    assert_eq!(judged["ranked"][0]["metric"], "ttft", "{u:#}");
    assert!(
        judged["ranked"][0]["p_value"].as_f64() < Some(0.01),
        "{u:#}"
    );
    assert_eq!(
        u["bake"]["failed_looks"],
        serde_json::json!([format!("{}'s /metrics: no answer in 10s", REPLICAS[1])]),
        "{u:#}"
    );
    let (c, s) = (&judged["canary"], &judged["stable"]);
    assert!(c["ttft_p50_s"].as_f64().unwrap() >= 0.4, "{judged}");
    assert!(s["ttft_p50_s"].as_f64().unwrap() <= 0.1, "{judged}");
    assert!(u["detail"]
        .to_string()
        .contains("and the bake restored the previous unit, which passed verification"));
    for other in &REPLICAS[1..] {
        assert_eq!(unit_of(&report, other)["outcome"], "not_started");
    }
    assert!(lab()
        .sh(
            canary,
            &format!("cat /etc/systemd/system/{SERVICE}.service")
        )
        .contains("GENERATION=1"));
    // Put back through apply's transaction: its record restores deployment 1.
    let record = lab().sh(
        canary,
        &format!("cat /var/lib/reconcile/{SERVICE}.service/current.json"),
    );
    let record: serde_json::Value =
        serde_json::from_str(&record).unwrap_or_else(|e| panic!("{e}: {record}"));
    assert_eq!(record["restored_from"], 1, "{record:#}");
    assert_eq!(listed(), all_healthy(&REPLICAS), "back in the router");
    let seen = client.stop();
    assert_eq!(
        seen["failed"], 0,
        "requests failed through the router: {seen}"
    );
}
