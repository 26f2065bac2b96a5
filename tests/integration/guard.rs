//! The host holds the transaction: `reconcile apply` killed (it and every ssh it started) while a
//! change is verified, and the host's guard still leaves it right. Every wait polls the host to a
//! deadline derived from the manifest's own bounds (`reconcile_core::guard::judge_after`).

use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use crate::lab::{
    apply_first_unit as apply, assert_has, assert_outcome, classes_of, lab, reboot, run_on,
    Manifest, Reconcile, GUARD,
};

const HOST: &str = GUARD.host();

/// The guard's bounds in these tests: verification's (crash window 15 s, load deadline 20 s,
/// warmup 5 s) plus a 4 s margin, so the guard judges 44 s after it was armed. The crash window is
/// long so that apply cannot finish (converge, or see a crash at 10 s) before the test, polling
/// the host, has killed it or cut its link: the test needs the restart seen within 10 s.
const MARGIN: &str = "4s";
const JUDGE_AFTER: Duration = Duration::from_secs(15 + 20 + 5 + 4);

/// The tests here share one host, and one of them takes its only link down: while that link is
/// cut, another test's apply loses the host (these four run alone, all at once, failed 6 of 6 that
/// way). The others share the host with each other; the cut has it alone.
static LINK: RwLock<()> = RwLock::new(());

fn sharing_the_host() -> RwLockReadGuard<'static, ()> {
    LINK.read().unwrap_or_else(|p| p.into_inner())
}

fn host_alone() -> RwLockWriteGuard<'static, ()> {
    LINK.write().unwrap_or_else(|p| p.into_inner())
}

fn service(name: &str, port: u16) -> Manifest {
    crate::apply::service_on(HOST, name, port)
        .verify("crash_window", "15s")
        .verify("warmup_timeout", "5s")
        .verify("guard_margin", MARGIN)
}

fn sh(script: &str) -> String {
    lab().sh(HOST, script)
}

fn fresh(unit: &str) {
    sh(&format!("systemctl stop reconcile-guard-{}.service 2>/dev/null; systemctl disable --now {unit} 2>/dev/null; rm -rf /etc/systemd/system/{unit} /var/lib/reconcile/{unit}; systemctl daemon-reload", unit.trim_end_matches(".service")));
}

/// `reconcile status`'s classes for the only unit of `m`, and its exit code.
fn status(m: &Manifest) -> (Vec<String>, i32) {
    let ran = run_on(m, &["status", "--format", "json"]);
    (classes_of(&ran.json()["units"][0]), ran.code)
}

/// `reconcile plan`'s notes for the only unit of `m`.
fn plan_notes(m: &Manifest) -> String {
    run_on(m, &["plan", "--format", "json"]).json()["units"][0]["notes"].to_string()
}

fn unit_file(unit: &str) -> String {
    sh(&format!("cat /etc/systemd/system/{unit}"))
}

pub fn guard_state_on(host: &str, unit: &str) -> String {
    lab().sh(host, &format!("python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[\"state\"])' /var/lib/reconcile/{unit}/guard.json 2>/dev/null")).trim().to_string()
}

/// `unit`'s guard units left on the host (none once a run is done with it).
fn guard_state(unit: &str) -> String {
    guard_state_on(HOST, unit)
}

/// `unit`'s guards still at work on the host (none once a run is done with it). The guard's unit
/// file stays, wanted at boot: a settled guard it starts exits at once.
fn guards_left(unit: &str) -> String {
    let guard = format!("reconcile-guard-{}*", unit.trim_end_matches(".service"));
    sh(&format!("systemctl list-units --no-legend --state=active,activating,deactivating,reloading '{guard}'")).trim().to_string()
}

/// Whether the server on `port` of `host` answers `/health` 200, asked on the host itself.
pub fn healthy_on(host: &str, port: u16) -> bool {
    lab().sh(host, &format!("python3 -c 'import urllib.request; print(urllib.request.urlopen(\"http://127.0.0.1:{port}/health\", timeout=25).status)' 2>/dev/null || true")).trim() == "200"
}

fn healthy(port: u16) -> bool {
    healthy_on(HOST, port)
}

/// Polls `check` every 200 ms until it holds; panics with `what` at the deadline.
pub fn until(within: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < deadline, "not within {within:?}: {what}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Starts `reconcile apply` of `m`, waits until `ready` holds on the host, then SIGKILLs it and
/// every ssh it started (found by the TMPDIR their control sockets live in).
pub fn apply_then_kill(m: &Manifest, ready: impl FnMut() -> bool, what: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_str().unwrap().to_string();
    // Kept until the end: its folder holds the manifests the run reads.
    let run = Reconcile::new()
        .manifest("a.yaml", m)
        .args(&["apply", "--format", "json"]);
    let mut child = run.spawn(&[("TMPDIR", &dir)]);
    let mut ready = ready;
    until(Duration::from_secs(60), what, || {
        if let Ok(Some(status)) = child.try_wait() {
            let out = child.wait_with_output_now();
            panic!("reconcile ended ({status}) before {what}: {out}");
        }
        ready()
    });
    child.kill().unwrap();
    let _ = std::process::Command::new("pkill")
        .args(["-KILL", "-f", &format!("{dir}/")])
        .status();
    child.wait().unwrap();
}

trait Output {
    fn wait_with_output_now(&mut self) -> String;
}

impl Output for std::process::Child {
    fn wait_with_output_now(&mut self) -> String {
        use std::io::Read;
        let mut text = String::new();
        if let Some(o) = self.stdout.as_mut() {
            let _ = o.read_to_string(&mut text);
        }
        if let Some(e) = self.stderr.as_mut() {
            let _ = e.read_to_string(&mut text);
        }
        text
    }
}

/// Waits for the guard to settle `unit` as rolled back, then checks the host as a rollback must
/// leave it: the previous unit's file, its server answering `/health` on `port`, no guard unit
/// left. Returns the guard's record.
fn rolled_back_by_the_guard(unit: &str, port: u16, previous: &str) -> String {
    until(JUDGE_AFTER * 3, "the guard rolled back", || {
        guard_state(unit) == "rolled_back"
    });
    assert_eq!(unit_file(unit), previous);
    assert!(healthy(port), "the previous unit answers /health");
    assert_eq!(guards_left(unit), "");
    sh(&format!("cat /var/lib/reconcile/{unit}/guard.json"))
}

/// A second apply of `m` finds nothing to do.
fn assert_unchanged(m: &Manifest) {
    let (code, report) = apply(m);
    assert_outcome(code, &report, 0, "unchanged");
}

fn invocation(unit: &str) -> String {
    lab().invocation(HOST, unit)
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_crash_looping_change_goes_back_when_the_controller_is_killed() {
    let _host = sharing_the_host();
    let unit = "t-guard-crash.service";
    fresh(unit);
    let good = service("t-guard-crash", 37601);
    let (code, report) = apply(&good);
    assert_eq!(code, 0, "{report}");
    // A confirmed apply leaves no guard behind.
    assert_eq!(guards_left(unit), "");
    assert_eq!(guard_state(unit), "disarmed");
    let good_text = unit_file(unit);
    // Another run's command is refused, and the record is left as it was.
    let record = sh(&format!("cat /var/lib/reconcile/{unit}/guard.json"));
    let refused = sh(&format!(
        "p=$(sed -n 's/^ExecStart=\\([^ ]*\\) .*/\\1/p' /etc/systemd/system/reconcile-guard-t-guard-crash.service); \
         \"$p\" renew /var/lib/reconcile/{unit} another-run 2>&1; echo \"status=$?\""
    ));
    assert!(
        refused.contains("belongs to another run") && refused.ends_with("status=3\n"),
        "{refused}"
    );
    assert_eq!(
        sh(&format!("cat /var/lib/reconcile/{unit}/guard.json")),
        record
    );
    let before = invocation(unit);
    // The new server crashes 10 s after each start: the controller dies before it can see it.
    let crashing = good
        .clone()
        .env("FAKE_SGLANG_FAIL", "crash")
        .env("FAKE_SGLANG_FAIL_AT", "10");
    apply_then_kill(
        &crashing,
        || invocation(unit) != before,
        "the new unit started",
    );
    let detail = rolled_back_by_the_guard(unit, 37601, &good_text);
    // Caught as a crash loop once the lease ran out, not left until the deadline a unit that
    // never answers gets ("not healthy by the deadline").
    assert_has(&detail, "crash-looping");
    // status says what the host did with the change the manifest still asks for.
    assert_eq!(
        status(&crashing),
        (
            vec!["pending_change".into(), "rolled_back_by_guard".into()],
            2
        )
    );
    // history keeps what the guard did.
    let history = run_on(&crashing, &["history", "t-guard-crash", "--format", "json"]);
    let notes = history.json()["hosts"][0]["notes"].to_string();
    assert_has(&notes, "the host's guard rolled back to the previous unit");
    // plan says so of the change asked for again.
    let notes = plan_notes(&crashing);
    assert!(
        notes.contains("the host's guard rolled back to the previous unit")
            && notes.contains("this plan asks for that change again"),
        "{notes}"
    );
    // The next apply of the good manifest finds nothing to do.
    assert_unchanged(&good);
    fresh(unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_healthy_change_whose_controller_dies_is_kept_and_the_next_apply_confirms_it() {
    let _host = sharing_the_host();
    let unit = "t-guard-healthy.service";
    fresh(unit);
    let good = service("t-guard-healthy", 37602);
    let (code, report) = apply(&good);
    assert_eq!(code, 0, "{report}");
    let before = invocation(unit);
    let changed = good.clone().env("FAKE_SGLANG_LOAD_SECONDS", "2");
    apply_then_kill(
        &changed,
        || invocation(unit) != before,
        "the new unit started",
    );
    let new = invocation(unit);
    until(JUDGE_AFTER * 3, "the guard kept the unit", || {
        guard_state(unit) == "unconfirmed"
    });
    // Never rolled back blind, never restarted.
    assert_eq!(invocation(unit), new);
    assert!(healthy(37602));
    assert_eq!(guards_left(unit), "");
    // status says it is kept but unconfirmed, not edited by hand.
    assert_eq!(
        status(&changed),
        (vec!["pending_change".into(), "unconfirmed".into()], 2)
    );
    // So does plan, with what the next apply does about it.
    let notes = plan_notes(&changed);
    assert!(
        notes.contains("kept the new unit, unconfirmed")
            && notes.contains("apply verifies it as it runs, without a restart, and confirms it"),
        "{notes}"
    );
    // The next apply verifies the server as it runs and confirms it: no restart.
    let (code, report) = apply(&changed);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["outcome"], "converged", "{report}");
    let notes = report["notes"].to_string();
    assert_has(&notes, "kept the new unit, unconfirmed");
    assert_eq!(invocation(unit), new, "confirming restarted the server");
    assert_eq!(guard_state(unit), "disarmed");
    assert_eq!(guards_left(unit), "");
    assert_unchanged(&changed);
    fresh(unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn an_apply_right_after_a_dead_one_verifies_the_started_server_as_it_runs_without_a_restart() {
    let _host = sharing_the_host();
    let unit = "t-guard-again.service";
    fresh(unit);
    let good = service("t-guard-again", 37606);
    let (code, report) = apply(&good);
    assert_eq!(code, 0, "{report}");
    let before = invocation(unit);
    // The new server takes 10 s to load: the controller dies while it loads, and the next apply
    // comes long before the dead run's guard would judge it.
    let changed = good.clone().env("FAKE_SGLANG_LOAD_SECONDS", "10");
    apply_then_kill(
        &changed,
        || invocation(unit) != before,
        "the new unit started",
    );
    let new = invocation(unit);
    // The dead run's guard has seen the restart take (it looks once a second).
    until(
        Duration::from_secs(30),
        "the guard saw the new start",
        || {
            sh(&format!(
                "grep -c '\"new_started\": true' /var/lib/reconcile/{unit}/guard.json || true"
            ))
            .trim()
                == "1"
        },
    );
    assert_eq!(guard_state(unit), "armed");
    let (code, report) = apply(&changed);
    assert_eq!(code, 0, "{report}");
    assert_eq!(report["outcome"], "converged", "{report}");
    let notes = report["notes"].to_string();
    assert_has(
        &notes,
        "died after its restart; the host's guard still watches the new unit",
    );
    // Another 15-minute load saved: the server the dead run started is the one confirmed.
    assert_eq!(invocation(unit), new, "the server was restarted");
    assert_eq!(guard_state(unit), "disarmed");
    assert_eq!(guards_left(unit), "");
    assert_unchanged(&changed);
    fresh(unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn the_controller_killed_during_its_own_rollback_leaves_the_guard_to_finish_it() {
    let _host = sharing_the_host();
    let unit = "t-guard-midway.service";
    fresh(unit);
    // The controller's rollback verifies the restored unit through its 15 s crash window: it is
    // still at it when the test kills it.
    let good = service("t-guard-midway", 37603);
    let (code, report) = apply(&good);
    assert_eq!(code, 0, "{report}");
    let good_text = unit_file(unit);
    let crashing = good
        .clone()
        .env("FAKE_SGLANG_FAIL", "crash")
        .env("FAKE_SGLANG_FAIL_AT", "1");
    apply_then_kill(
        &crashing,
        || guard_state(unit) == "rolling_back",
        "the controller's rollback began",
    );
    rolled_back_by_the_guard(unit, 37603, &good_text);
    fresh(unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_crash_looping_change_whose_host_reboots_after_the_controller_died_goes_back_at_boot() {
    // The reboot takes the host from every other test here.
    let _host = host_alone();
    let unit = "t-guard-boot.service";
    fresh(unit);
    let good = service("t-guard-boot", 37605);
    let (code, report) = apply(&good);
    assert_eq!(code, 0, "{report}");
    let good_text = unit_file(unit);
    let before = invocation(unit);
    let crashing = good
        .clone()
        .env("FAKE_SGLANG_FAIL", "crash")
        .env("FAKE_SGLANG_FAIL_AT", "10");
    // The controller dies as the new server starts, and the rack loses power right after: the
    // host boots with the new unit installed and its guard's record armed, nobody watching.
    apply_then_kill(
        &crashing,
        || invocation(unit) != before,
        "the new unit started",
    );
    let booted_before = sh("cat /proc/sys/kernel/random/boot_id");
    reboot(HOST);
    let booted = sh("cat /proc/sys/kernel/random/boot_id");
    assert_ne!(booted, booted_before, "the host did not reboot");
    // The guard's unit is wanted at boot: it acts on its record in the new boot.
    let record = rolled_back_by_the_guard(unit, 37605, &good_text);
    let record: serde_json::Value = serde_json::from_str(&record).unwrap();
    assert_eq!(
        record["boot_id"].as_str(),
        Some(booted.trim()),
        "{record:#}"
    );
    let detail = record["detail"].as_str().unwrap_or("");
    assert!(
        detail.contains("crash-looping") || detail.contains("never started"),
        "{detail}"
    );
    fresh(unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_link_cut_past_the_deadline_leaves_the_rollback_to_the_host_and_apply_reports_it() {
    let _host = host_alone();
    let unit = "t-guard-cut.service";
    fresh(unit);
    let good = service("t-guard-cut", 37604);
    let (code, report) = apply(&good);
    assert_eq!(code, 0, "{report}");
    let good_text = unit_file(unit);
    let before = invocation(unit);
    let crashing = good
        .clone()
        .env("FAKE_SGLANG_FAIL", "crash")
        .env("FAKE_SGLANG_FAIL_AT", "10");
    let run = Reconcile::new()
        .manifest("a.yaml", &crashing)
        .args(&["apply", "--format", "json"]);
    let child = run.spawn(&[]);
    until(Duration::from_secs(60), "the new unit started", || {
        invocation(unit) != before
    });
    // This machine's side of the host's only link, down: the host is cut off from apply, which
    // stays alive. Put back whatever happens, so no later test finds the host unreachable.
    let link = Link::cut(HOST);
    // The guard acts on its own once the lease runs out, while the link is still down.
    until(
        JUDGE_AFTER * 3,
        "the guard rolled back behind the cut",
        || link.guard_state(unit) == "rolled_back",
    );
    drop(link);
    let out = child.wait_with_output().unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let report = &json["units"][0];
    assert_eq!(out.status.code(), Some(3), "{report:#}");
    assert_eq!(report["outcome"], "rolled_back", "{report:#}");
    let detail = report["detail"].as_str().unwrap();
    assert_has(detail, "the host's guard rolled back to the previous unit");
    rolled_back_by_the_guard(unit, 37604, &good_text);
    fresh(unit);
}

/// A host's link cut on this machine's side (its veth, `<host>h`), put back when dropped.
pub struct Link(&'static str);

impl Link {
    pub fn cut(host: &'static str) -> Link {
        let status = std::process::Command::new("ip")
            .args(["link", "set", &format!("{host}h"), "down"])
            .status()
            .unwrap();
        assert!(status.success(), "ip link set {host}h down");
        Link(host)
    }

    /// The guard's state read without the link: through the root of a process in the host's
    /// network namespace (the container's own files, as its systemd sees them).
    pub fn guard_state(&self, unit: &str) -> String {
        let pids = std::process::Command::new("ip")
            .args(["netns", "pids", self.0])
            .output()
            .unwrap();
        let pids = String::from_utf8_lossy(&pids.stdout);
        let pid = pids
            .split_whitespace()
            .next()
            .expect("a process in the host");
        let path = format!("/proc/{pid}/root/var/lib/reconcile/{unit}/guard.json");
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        serde_json::from_str::<serde_json::Value>(&text)
            .map(|g| g["state"].as_str().unwrap_or("").to_string())
            .unwrap_or_default()
    }
}

impl Drop for Link {
    fn drop(&mut self) {
        let _ = std::process::Command::new("ip")
            .args(["link", "set", &format!("{}h", self.0), "up"])
            .status();
    }
}
