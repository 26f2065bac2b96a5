//! A real server's life through `reconcile`: first install, a no-op and a flag change (one
//! server), an API key, drain of a long generation, and `reconcile` stopped by SIGTERM or Ctrl-C
//! while it verifies (one server, shared).

use std::time::Duration;

use super::{slots, stage, Service, Shared, HOSTS};
use crate::builder::yaml;
use crate::lab::{assert_field_has, assert_has, lab, probe_seconds, Manifest, Ran, Reconcile};

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn first_install_converges_a_second_apply_touches_nothing_and_a_flag_change_restarts_it() {
    let _slot = slots(1);
    let s = Service::new("t-rs-first", HOSTS[0], 38001).flag("enable-metrics", true);
    let _stopped = s.fresh();
    let report = s.converge();
    let v = &report["verification"];
    // Identity from the real /v1/models, readiness from the real /health (a one-token generation,
    // never sooner than about a second).
    let identity = stage(v, "identity")["detail"].as_str().unwrap();
    assert_has(identity, "`tiny-t-rs-first`");
    let readiness = stage(v, "readiness")["detail"].as_str().unwrap();
    let took = probe_seconds(readiness);
    assert!(
        took >= 0.95,
        "a real /health answered in {took}s: {readiness}"
    );
    // The real server's processes: the scheduler and detokenizer set their titles.
    let titles = s.processes();
    assert_has(&titles, "sglang::scheduler");
    let (status, models) = s.http("GET", "/v1/models", None, None);
    assert_eq!(status, 200);
    assert_has(&models, "\"max_model_len\":2048");

    s.applies_as_a_no_op();

    // A flag change restarts the same server, which then runs it. The stop is graceful
    // (KillMode=mixed, no `drain:` asked for): SGLang answers a long generation in flight in
    // full before it exits, and its invocation ends successfully.
    let before = s.invocation();
    let result = "/tmp/t-rs-first.result";
    let changed = Service::new("t-rs-first", HOSTS[0], 38001)
        .flag("enable-metrics", true)
        .flag("max-running-requests", 7);
    let run = Reconcile::new()
        .manifest("a.yaml", changed.manifest())
        .args(&["apply", "--format", "json"]);
    let apply = run.spawn(&[]);
    // Once apply wrote the new unit, the restart is a few round trips away (the guard armed,
    // then `systemctl restart`): a generation of 4 answers of 1900 tokens begun then is still
    // running when the old server gets SIGTERM (one answer alone ended 2.7 s after it here).
    lab().wait_until(
        s.host,
        &format!(
            "grep -q -- --max-running-requests /etc/systemd/system/{}",
            s.unit()
        ),
        Duration::from_secs(120),
    );
    long_generation(&s, 1900, 4, result);
    let out = apply.wait_with_output().unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let report = &json["units"][0];
    assert_eq!(report["outcome"], "converged", "{report:#}");
    assert_ne!(s.invocation(), before, "restarted");
    // 4 answers of 1900 tokens, all of them.
    let ended = generated(&s, result, 7600);
    // It ended after the stop began (systemd's monotonic clock, the host's): in flight then.
    let stop_began = monotonic(&s, "ActiveExitTimestampMonotonic");
    assert!(
        ended > stop_began,
        "the generation ended at {ended}, before the stop began at {stop_began}"
    );
    let notes = report["notes"].to_string();
    assert_has(&notes, "the old server stopped in");
    let ended = lab().sh(
        s.host,
        &format!("journalctl --no-pager -o cat INVOCATION_ID={before}"),
    );
    assert!(
        ended.contains("Deactivated successfully") && !ended.contains("Failed with result"),
        "{ended}"
    );
    // The real server resolved the new flag: its /server_info says so.
    let (status, info) = s.http("GET", "/server_info", None, None);
    assert_eq!(status, 200, "{info}");
    let info: serde_json::Value = serde_json::from_str(&info).expect("server_info is JSON");
    assert_eq!(info["max_running_requests"], 7, "{info:#}");
    s.stop();
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn an_api_key_server_is_verified_with_its_key_which_never_shows() {
    let _slot = slots(1);
    let key = "sk-reconcile-real-3e9b27";
    let s = Service::new("t-rs-apikey", HOSTS[0], 38003).flag("api-key", key);
    let _stopped = s.fresh();
    let ran = Reconcile::new()
        .manifest("a.yaml", s.manifest())
        .args(&["apply", "--format", "json"])
        .run();
    assert_eq!(ran.code, 0, "{}\n{}", ran.stdout, ran.stderr);
    assert_eq!(
        ran.json()["units"][0]["outcome"],
        "converged",
        "{}",
        ran.stdout
    );
    assert!(
        !ran.stdout.contains(key) && !ran.stderr.contains(key),
        "the key was shown"
    );
    let plan = Reconcile::new()
        .manifest("a.yaml", s.manifest().flag("max-total-tokens", 4000))
        .args(&["plan"])
        .run();
    plan.assert_code(2);
    assert!(
        !plan.stdout.contains(key) && !plan.stderr.contains(key),
        "the key is in the diff"
    );
    // The real server refuses requests without it, and serves them with it.
    assert_eq!(s.http("GET", "/v1/models", None, None).0, 401);
    assert_eq!(s.http("GET", "/v1/models", None, Some(key)).0, 200);
    s.stop();
}

/// A long generation in flight on the host (`ignore_eos`, many tokens); `result` gets
/// `STATUS COMPLETION_TOKENS MONOTONIC_END` when it ends.
/// Waits for [`long_generation`]'s `result`, asserts it was answered 200 with `tokens` in all,
/// and returns when it ended (CLOCK_MONOTONIC seconds on the host).
fn generated(s: &Service, result: &str, tokens: u32) -> f64 {
    lab().wait_until(s.host, &format!("[ -s {result} ]"), Duration::from_secs(60));
    let text = lab().sh(s.host, &format!("cat {result}"));
    let fields: Vec<&str> = text.split_whitespace().collect();
    assert_eq!(
        (fields[0], fields[1]),
        ("200", tokens.to_string().as_str()),
        "the generation in flight, answered in full: {text}"
    );
    fields[2].parse().unwrap()
}

/// One of systemd's monotonic timestamps of the unit, in seconds.
fn monotonic(s: &Service, property: &str) -> f64 {
    let us = lab().sh(
        s.host,
        &format!("systemctl show -p {property} --value {}", s.unit()),
    );
    us.trim().parse::<f64>().expect("a monotonic timestamp") / 1e6
}

fn long_generation(s: &Service, tokens: u32, choices: u32, result: &str) {
    let script = format!(
        r#"rm -f {result}; ( python3 -c '
import http.client, json, time
try:
    c = http.client.HTTPConnection("127.0.0.1", {port}, timeout=300)
    c.request("POST", "/v1/chat/completions", body=json.dumps({{"model": "m", "messages": [{{"role": "user", "content": "tell me a story"}}], "max_tokens": {tokens}, "n": {choices}, "ignore_eos": True}}), headers={{"Content-Type": "application/json"}})
    r = c.getresponse()
    body = json.loads(r.read())
    out = "%d %d %.3f" % (r.status, body.get("usage", {{}}).get("completion_tokens", -1), time.monotonic())
except Exception as e:
    out = "error -1 %.3f %s" % (time.monotonic(), type(e).__name__)
open("{result}.tmp", "w").write(out)
' && mv {result}.tmp {result} ) </dev/null >/dev/null 2>&1 &"#,
        port = s.port,
    );
    lab().sh(s.host, &script);
    let running = format!(
        r#"python3 -c 'import sys, urllib.request; b = urllib.request.urlopen("http://127.0.0.1:{}/metrics", timeout=5).read().decode(); sys.exit(0 if any(l.startswith("sglang:num_running_reqs") and not l.endswith(" 0.0") for l in b.splitlines()) else 1)' 2>/dev/null"#,
        s.port
    );
    lab().wait_until(s.host, &running, Duration::from_secs(30));
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn drain_waits_for_a_long_generation_which_completes_before_the_restart() {
    let _slot = slots(1);
    let drain = yaml("{ timeout: 240s }");
    let s = Service::new("t-rs-drain", HOSTS[1], 38004)
        .flag("enable-metrics", true)
        .section("drain", drain.clone());
    let _stopped = s.fresh();
    s.converge();
    let before = s.invocation();
    let result = "/tmp/t-rs-drain.result";
    // 1500 tokens of the tiny model on one CPU thread: several seconds of generation.
    long_generation(&s, 1500, 1, result);
    let changed = Service::new("t-rs-drain", HOSTS[1], 38004)
        .flag("enable-metrics", true)
        .flag("max-running-requests", 6)
        .section("drain", drain);
    let report = changed.converge();
    assert_ne!(s.invocation(), before, "restarted");
    assert_eq!(report["drain"]["outcome"], "idle", "{report:#}");
    let ended = generated(&s, result, 1500);
    let started = monotonic(&s, "ExecMainStartTimestampMonotonic");
    assert!(
        ended < started,
        "the new server started at {started}, before the generation ended at {ended}"
    );
    s.stop();
}

/// Starts an apply of `s` with `text`, sends `signal` once the restarted server is verifying
/// (the real server imports torch for seconds), and returns what the run reported.
fn signalled(s: &Service, text: &Manifest, signal: &str) -> (Ran, serde_json::Value) {
    let run = Reconcile::new()
        .manifest("a.yaml", text)
        .args(&["apply", "--format", "json"]);
    crate::lab::signalled(
        &run,
        (s.host, &s.unit()),
        signal,
        super::RESTART_WITHIN,
        Duration::from_secs(2),
    )
}

/// The server `reconcile` is interrupted on, by SIGTERM in one test and Ctrl-C in the other.
static INTERRUPTED: Shared = Shared::new("t-rs-interrupted", HOSTS[0], 38005, 2);

fn interrupted_apply_rolls_back(signal: &str, says: &str) {
    let turn = INTERRUPTED.take();
    let s = turn.service();
    let good = s.unit_file();
    let changed = INTERRUPTED.good().flag("max-running-requests", 5);
    let (ran, json) = signalled(s, &changed.manifest(), signal);
    ran.assert_code(3);
    let report = &json["units"][0];
    assert_eq!(report["outcome"], "rolled_back", "{report:#}");
    assert_field_has(report, "detail", says);
    assert_eq!(s.unit_file(), good);
    // The previous unit was verified again and the real server serves.
    assert_eq!(s.http("GET", "/health", None, None).0, 200);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn sigterm_during_verification_of_a_real_server_rolls_back() {
    interrupted_apply_rolls_back("-TERM", "interrupted (SIGTERM)");
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn ctrl_c_during_verification_of_a_real_server_rolls_back() {
    interrupted_apply_rolls_back("-INT", "interrupted (Ctrl-C)");
}
