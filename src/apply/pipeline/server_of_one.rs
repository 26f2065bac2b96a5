//! The pipeline driven on a fake host for a server of one, from the drain on (`prepared`).

use tokio::time::Instant;

use tokio_util::sync::CancellationToken;

use super::*;
use crate::apply::error::ApplyErrorKind;
use crate::apply::testing::{observed, options, target};
use crate::apply::verifier::fake::Scripted;
use crate::apply::Outcome;
use crate::remote::fake::{FakeHost, Reply};
use crate::verify::{Failure, Sample};

const PATH: &str = "/etc/systemd/system/s.service";

/// A host where every command succeeds, and systemd reports a running invocation `inv-1`.
fn host(unit: Option<&str>) -> FakeHost {
    let fake = FakeHost::new("gpu-a")
        .on(&[], Reply::ok(""))
        // The guard program (its path names its build): found armed when renewed or taken
        // over.
        .on_with(&[], |argv, _| match argv {
            [program, command, ..]
                if program.contains("reconcile-guard") && ["take", "renew"].contains(command) =>
            {
                Reply::ok("armed\n")
            }
            _ => Reply::ok(""),
        })
        .on(
            &["systemctl", "show"],
            Reply::ok("InvocationID=inv-1\nActiveState=active\n"),
        )
        .on(&["systemctl", "is-system-running"], Reply::ok("running\n"));
    match unit {
        Some(text) => fake.with_file(PATH, text),
        None => fake,
    }
}

/// Whether `argv` runs the guard program (its path names its build) to `verb`.
fn guard(argv: &[&str], verb: &str) -> bool {
    matches!(argv, [program, v, ..] if program.contains("reconcile-guard") && *v == verb)
}

/// Whether the unit was restarted on `host`.
fn restarted(host: &FakeHost) -> bool {
    host.commands()
        .iter()
        .any(|c| c.starts_with(&["systemctl".into(), "restart".into()]))
}

fn passed() -> Result<Verification, Failure> {
    Ok(Verification {
        load_seconds: Some(2.0),
        ..Verification::default()
    })
}

fn failed(stage: Stage) -> Result<Verification, Failure> {
    Err(Failure {
        stage,
        reason: crate::verify::Reason::Judged("503".into()),
        verification: Box::default(),
    })
}

/// Installs `s.service` over what `host` has (`before`, `active_state`), as `verdict` says.
async fn install_on(
    host: &FakeHost,
    verifier: &Scripted,
    before: &Observed,
    verdict: Verdict,
    cancel: bool,
) -> (Ending, UnitReport) {
    install_as(target(), host, verifier, before, verdict, cancel).await
}

/// Installs `s.service` with a restart over an active `old` unit, the case most tests drive.
async fn restart_over_old(host: &FakeHost, verifier: &Scripted) -> (Ending, UnitReport) {
    let before = observed(Some("old"), "active");
    install_on(host, verifier, &before, Verdict::Restart, false).await
}

async fn install_as(
    t: crate::targets::Target,
    host: &FakeHost,
    verifier: &Scripted,
    before: &Observed,
    verdict: Verdict,
    cancel: bool,
) -> (Ending, UnitReport) {
    let token = CancellationToken::new();
    if cancel {
        token.cancel();
    }
    let options = options(token);
    let job = Job {
        host,
        t: &t,
        options: &options,
        verifier,
    };
    let fallback = Fallback {
        previous: before.unit_text.clone(),
        was_running: before.state.active_state == "active",
        saved: None,
        unit_files: Default::default(),
    };
    prepared(job, before.clone(), verdict, fallback).await
}

fn ran(host: &FakeHost, argv: &[&str]) -> bool {
    host.commands().iter().any(|c| c == argv)
}

fn draining(on_timeout: crate::manifest::OnTimeout) -> crate::targets::Target {
    let mut t = target();
    std::sync::Arc::make_mut(&mut t.manifest).drain = Some(crate::manifest::DrainSpec {
        timeout: std::time::Duration::from_secs(60),
        on_timeout,
    });
    t
}

#[tokio::test(start_paused = true)]
async fn a_drain_that_cannot_see_the_server_refuses_before_anything_changes() {
    // "old" has no --enable-metrics: its server has no /metrics to read.
    let host = host(Some("old"));
    let verifier = Scripted::new(vec![passed()]);
    let before = observed(Some("old"), "active");
    let t = draining(crate::manifest::OnTimeout::Refuse);
    let (end, report) = install_as(t, &host, &verifier, &before, Verdict::Restart, false).await;
    assert_eq!(
        (end.outcome, end.detail.as_str(), end.error),
        (
            Outcome::Error,
            "drain cannot see the server's requests: the running unit has no --enable-metrics, so its server has no /metrics; the server was not restarted (drain.on_timeout: refuse); nothing was changed on the host",
            Some(ApplyErrorKind::DrainRefused)
        )
    );
    assert_eq!(host.file(PATH).as_deref(), Some("old"));
    assert!(host.commands().is_empty(), "{:?}", host.commands());
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(
        (&json["drain"]["outcome"], &json["drain"]["restarted"]),
        (&serde_json::json!("blind"), &serde_json::json!(false))
    );
}

#[tokio::test(start_paused = true)]
async fn with_on_timeout_restart_a_blind_drain_restarts_and_says_so() {
    let host = host(Some("old"));
    let verifier = Scripted::new(vec![passed()]);
    let before = observed(Some("old"), "active");
    let t = draining(crate::manifest::OnTimeout::Restart);
    let (end, report) = install_as(t, &host, &verifier, &before, Verdict::Restart, false).await;
    assert_eq!(end.outcome, Outcome::Converged, "{}", end.detail);
    assert!(ran(&host, &["systemctl", "restart", "--", "s.service"]));
    assert!(
        report
            .notes
            .iter()
            .any(|n| n.starts_with("drain cannot see")
                && n.ends_with("restarted anyway (drain.on_timeout: restart)")),
        "{:?}",
        report.notes
    );
}

#[tokio::test(start_paused = true)]
async fn a_reload_only_change_and_a_new_unit_never_drain() {
    let t = || draining(crate::manifest::OnTimeout::Refuse);
    let host = host(Some("old"));
    let verifier = Scripted::new(vec![passed()]);
    let before = observed(Some("old"), "active");
    let (end, report) =
        install_as(t(), &host, &verifier, &before, Verdict::ReloadOnly, false).await;
    assert_eq!(end.outcome, Outcome::Reloaded, "{}", end.detail);
    assert!(report.drain.is_none());
    let fresh = super::super::testing::observed(None, "inactive");
    let host = self::host(None);
    let (end, report) = install_as(t(), &host, &verifier, &fresh, Verdict::Install, false).await;
    assert_eq!(end.outcome, Outcome::Converged, "{}", end.detail);
    assert!(report.drain.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_verified_restart_converges_and_is_recorded() {
    let host = host(Some("old"));
    let verifier = Scripted::new(vec![passed()]);
    let (end, report) = restart_over_old(&host, &verifier).await;
    assert_eq!(end.outcome, Outcome::Converged, "{}", end.detail);
    assert_eq!(end.error, None);
    assert_eq!(host.file(PATH), Some(target().desired.text));
    assert!(ran(&host, &["systemctl", "restart", "--", "s.service"]));
    assert!(!ran(&host, &["systemctl", "enable", "--", "s.service"]));
    assert!(host
        .file("/var/lib/reconcile/s.service/current.json")
        .is_some_and(|r| r.contains(r#""outcome":"converged""#)));
    assert!(report.verification.is_some() && report.journal.is_none());
    assert_eq!(*verifier.asked.lock().unwrap(), ["gpu-a s.service"]);
}

#[tokio::test(start_paused = true)]
async fn past_loads_are_noted_and_the_trajectory_is_recorded() {
    const HISTORY: &str = "/var/lib/reconcile/s.service/history.jsonl";
    let line = |load: f64| {
        format!(
            r#"{{"format":1,"unit":"s.service","manifest":"m","manifest_sha256":"m","unit_sha256":"u","git_commit":null,"git_author":null,"applied_at":"t","applied_by":"me","outcome":"converged","load_seconds":{load},"plateau_service_bytes":null,"plateau_gpu_mib":[],"trajectory":[{{"seconds":0.0,"gpu_mib":10}},{{"seconds":{load},"gpu_mib":100}}]}}"#
        )
    };
    let host = host(Some("old")).with_file(
        HISTORY,
        &format!("{}\n{}\nnot a record\n", line(4.0), line(6.5)),
    );
    let sample = |seconds: f64, gpu: u64| Sample {
        seconds,
        gpu_mib: vec![gpu / 2, gpu / 2],
        ..Sample::default()
    };
    let verifier = Scripted::new(vec![Ok(Verification {
        load_seconds: Some(5.0),
        samples: vec![sample(0.0, 20), sample(2.0, 60), sample(5.0, 100)],
        ..Verification::default()
    })]);
    let (end, report) = restart_over_old(&host, &verifier).await;
    assert_eq!(end.outcome, Outcome::Converged, "{}", end.detail);
    let v = report.verification.unwrap();
    assert_eq!(
        v.notes,
        [
            "last good load 6.5s (2 converged loads in history)",
            "load deadline 30m, the default: more than learned from history (2 × 6.5s, the slowest of the last 2 loads)"
        ]
    );
    let h = v.previous_loads.unwrap();
    assert_eq!(
        (h.load_seconds.as_slice(), h.trajectory.len()),
        (&[6.5, 4.0][..], 2)
    );
    let record = host
        .file("/var/lib/reconcile/s.service/current.json")
        .unwrap();
    assert!(
        record.contains(r#""trajectory":[{"seconds":0.0,"gpu_mib":20},{"seconds":2.0,"gpu_mib":60},{"seconds":5.0,"gpu_mib":100}]"#),
        "{record}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_guard_that_cannot_be_taken_over_is_left_the_rollback_alone() {
    // The host answers, but its guard does not take the rollback over: restoring now could
    // race the guard's own restore, so this run restores nothing and does not disarm it.
    let host = host(Some("old")).on_with(&[], |argv, _| match argv {
        _ if guard(argv, "renew") => Reply::ok("armed\n"),
        [program, ..] if program.contains("reconcile-guard") => {
            Reply::exit(1, "", "guard.json: unreadable")
        }
        _ => Reply::ok(""),
    });
    let verifier = Scripted::new(vec![failed(Stage::Readiness)]);
    let (end, _) = restart_over_old(&host, &verifier).await;
    assert_eq!(end.outcome, Outcome::RollbackFailed, "{}", end.detail);
    assert!(
        end.detail
            .contains("the host's guard could not be taken over")
            && end.detail.contains("guard.json: unreadable"),
        "{}",
        end.detail
    );
    // The new unit stays for the guard to judge; no restore, no disarm.
    assert_ne!(host.file(PATH).as_deref(), Some("old"));
    let guard_calls: Vec<String> = host
        .commands()
        .iter()
        .filter(|c| c[0].contains("reconcile-guard"))
        .map(|c| c[1].clone())
        .collect();
    assert!(guard_calls.contains(&"take".to_string()), "{guard_calls:?}");
    assert!(
        !guard_calls.contains(&"disarm".to_string()),
        "{guard_calls:?}"
    );
    assert_eq!(*verifier.asked.lock().unwrap(), ["gpu-a s.service"]);
}

#[tokio::test(start_paused = true)]
async fn a_guard_that_acted_before_the_write_has_nothing_written_under_it() {
    // Armed, then the link was cut past the lease: the guard put the previous file back and
    // watches no more. The new file is not written and the server is not restarted.
    let host = host(Some("old")).on_with(&[], |argv, _| match argv {
        _ if guard(argv, "renew") => Reply::ok("rolled_back\n"),
        _ => Reply::ok(""),
    });
    let verifier = Scripted::new(vec![passed()]);
    let (end, _) = restart_over_old(&host, &verifier).await;
    assert_eq!(end.outcome, Outcome::Error, "{}", end.detail);
    assert!(
        end.detail.contains("nothing was written")
            && end.detail.contains("does not hold for this run"),
        "{}",
        end.detail
    );
    assert_eq!(host.file(PATH).as_deref(), Some("old"));
    assert!(!restarted(&host));
    assert!(verifier.asked.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_guard_that_acted_after_the_write_has_nothing_restarted_under_it() {
    // The write went in under the guard; then the link was cut past the lease and the guard put
    // the previous file back. The restart that would follow costs a load for nothing: not done,
    // and the guard's act is left as it is (its take-over is refused, nothing restored).
    let renewals = std::sync::atomic::AtomicUsize::new(0);
    let host = host(Some("old")).on_with(&[], move |argv, _| match argv {
        _ if guard(argv, "renew") => {
            match renewals.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
                0 => Reply::ok("armed\n"),
                _ => Reply::ok("rolled_back\n"),
            }
        }
        _ if guard(argv, "take") => Reply::ok("rolled_back\n"),
        _ => Reply::ok(""),
    });
    let verifier = Scripted::new(vec![]);
    let (end, _) = restart_over_old(&host, &verifier).await;
    assert_ne!(end.outcome, Outcome::Converged, "{}", end.detail);
    assert!(!restarted(&host));
    assert!(verifier.asked.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_take_over_cut_short_by_the_connection_is_tried_again_once_the_host_is_back() {
    // The host goes down for a reboot as the rollback begins: the take-over is lost with the
    // connection, not refused, so it is tried again over the new one and the rollback goes on.
    let takes = std::sync::atomic::AtomicUsize::new(0);
    let host = host(Some("old")).on_with(&[], move |argv, _| match argv {
        _ if guard(argv, "take") => match takes.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
            0 => Reply::Disconnect,
            _ => Reply::ok("armed\n"),
        },
        _ if guard(argv, "renew") => Reply::ok("armed\n"),
        _ => Reply::ok(""),
    });
    let verifier = Scripted::new(vec![failed(Stage::Readiness), passed()]);
    let (end, _) = restart_over_old(&host, &verifier).await;
    assert_eq!(end.outcome, Outcome::RolledBack, "{}", end.detail);
    assert!(
        end.detail
            .contains("the previous unit was restored and passed verification"),
        "{}",
        end.detail
    );
    assert_eq!(host.file(PATH).as_deref(), Some("old"));
    let takes = host
        .commands()
        .iter()
        .filter(|c| c[0].contains("reconcile-guard") && c[1] == "take")
        .count();
    assert_eq!(takes, 2);
}

/// The failed start's journal holds the lines journald tagged with the invocation and every line
/// of their streams: those journald took in after their process died carry no invocation, and
/// are still shown.
#[tokio::test(start_paused = true)]
async fn the_journal_shows_lines_of_a_dead_process_through_its_stream() {
    let tagged = concat!(
        r#"{"MESSAGE":"loading","_STREAM_ID":"s1","_SYSTEMD_INVOCATION_ID":"inv-1"}"#,
        "\n",
        r#"{"MESSAGE":"Failed with result 'exit-code'.","INVOCATION_ID":"inv-1"}"#,
        "\n",
    );
    let streamed = concat!(
        r#"{"MESSAGE":"loading","_STREAM_ID":"s1","_SYSTEMD_INVOCATION_ID":"inv-1"}"#,
        "\n",
        r#"{"MESSAGE":"Failed with result 'exit-code'.","INVOCATION_ID":"inv-1"}"#,
        "\n",
        r#"{"MESSAGE":"Traceback: the child's last line","_STREAM_ID":"s1"}"#,
        "\n",
    );
    let by_invocation = [
        "journalctl",
        "_SYSTEMD_INVOCATION_ID=inv-1",
        "+",
        "INVOCATION_ID=inv-1",
    ];
    let host = host(Some("old")).on(&by_invocation, Reply::ok(tagged)).on(
        &[&by_invocation[..], &["+", "_STREAM_ID=s1"]].concat(),
        Reply::ok(streamed),
    );
    let verifier = Scripted::new(vec![failed(Stage::Readiness), passed()]);
    let before = observed(Some("old"), "active");
    let (end, report) = install_on(&host, &verifier, &before, Verdict::Restart, false).await;
    assert_eq!(end.outcome, Outcome::RolledBack, "{}", end.detail);
    assert_eq!(
        report.journal.as_deref(),
        Some("loading\nFailed with result 'exit-code'.\nTraceback: the child's last line\n")
    );
}

#[tokio::test(start_paused = true)]
async fn a_failed_stage_restores_restarts_and_verifies_the_previous_unit() {
    let host = host(Some("old"));
    let verifier = Scripted::new(vec![failed(Stage::Readiness), passed()]);
    let before = observed(Some("old"), "active");
    let (end, report) = install_on(&host, &verifier, &before, Verdict::Restart, false).await;
    assert_eq!(
        (end.outcome, end.detail.as_str(), end.error),
        (
            Outcome::RolledBack,
            "readiness failed: 503; the previous unit was restored and passed verification (ready after 2.0s)",
            Some(ApplyErrorKind::VerificationFailed)
        )
    );
    assert_eq!(host.file(PATH).as_deref(), Some("old"));
    assert_eq!(report.failed_stage.map(Stage::name), Some("readiness"));
    assert!(report.rollback.is_some() && report.journal.is_some());
    // The journal is synced (the crash's last lines may still be in its stream) before it is read.
    let commands = host.commands();
    let synced = commands
        .iter()
        .position(|c| c[..] == ["journalctl", "--sync"]);
    let read = commands
        .iter()
        .position(|c| c[0] == "journalctl" && c[1] == "_SYSTEMD_INVOCATION_ID=inv-1");
    assert!(
        matches!((synced, read), (Some(s), Some(r)) if s < r),
        "{commands:?}"
    );
    assert_eq!(
        *verifier.asked.lock().unwrap(),
        ["gpu-a s.service", "gpu-a s.service (rollback)"]
    );
}

#[tokio::test(start_paused = true)]
async fn a_new_unit_that_fails_is_removed_and_a_failing_restore_says_so() {
    let host = host(None);
    let verifier = Scripted::new(vec![failed(Stage::Smoke)]);
    let before = observed(None, "inactive");
    let (end, _) = install_on(&host, &verifier, &before, Verdict::Install, false).await;
    assert_eq!(
        (end.outcome, end.detail.as_str()),
        (
            Outcome::RolledBack,
            "smoke failed: 503; the new unit was stopped, disabled and removed"
        )
    );
    assert!(ran(&host, &["systemctl", "enable", "--", "s.service"]));
    assert!(ran(
        &host,
        &["systemctl", "disable", "--now", "--", "s.service"]
    ));
    assert!(ran(&host, &["rm", "-f", "--", PATH]));

    // The restored unit fails its own verification: the host needs attention.
    let host = self::host(Some("old"));
    let verifier = Scripted::new(vec![failed(Stage::Readiness), failed(Stage::Smoke)]);
    let (end, report) = restart_over_old(&host, &verifier).await;
    assert_eq!(
        (end.outcome, end.detail.as_str(), end.error),
        (
            Outcome::RollbackFailed,
            "readiness failed: 503; the restored previous unit failed too: smoke: 503",
            Some(ApplyErrorKind::RollbackFailed)
        )
    );
    assert!(report.rollback.is_some());
}

#[tokio::test(start_paused = true)]
async fn a_failed_install_puts_the_file_back_without_a_restart() {
    let host = host(Some("old")).once(
        &["systemctl", "daemon-reload"],
        Reply::exit(1, "", "no bus"),
    );
    let verifier = Scripted::new(Vec::new());
    let (end, _) = restart_over_old(&host, &verifier).await;
    assert_eq!(end.outcome, Outcome::Error);
    assert_eq!(end.error, Some(ApplyErrorKind::InstallFailed));
    assert!(
        end.detail.starts_with("installing failed: ")
            && end.detail.ends_with(
                "no bus; the previous unit is back in place (the server was not restarted)"
            ),
        "{}",
        end.detail
    );
    assert_eq!(host.file(PATH).as_deref(), Some("old"));
    assert!(!ran(&host, &["systemctl", "restart", "--", "s.service"]));
}

#[tokio::test(start_paused = true)]
async fn reload_only_keeps_the_server_and_a_cancel_stops_before_the_restart() {
    let host = host(Some("old"));
    let verifier = Scripted::new(Vec::new());
    let before = observed(Some("old"), "active");
    let (end, _) = install_on(&host, &verifier, &before, Verdict::ReloadOnly, false).await;
    assert_eq!(end, decide::reloaded());
    assert!(!ran(&host, &["systemctl", "restart", "--", "s.service"]));
    assert!(host
        .file("/var/lib/reconcile/s.service/current.json")
        .is_some_and(|r| r.contains(r#""outcome":"reloaded""#)));

    let host = self::host(Some("old"));
    let (end, _) = install_on(&host, &verifier, &before, Verdict::Restart, true).await;
    assert_eq!(end.outcome, Outcome::NotStarted);
    assert_eq!(end.error, Some(ApplyErrorKind::Interrupted));
    assert!(end.detail.ends_with(
        "before the restart; the previous unit is back in place and the server was not restarted"
    ));
    assert_eq!(host.file(PATH).as_deref(), Some("old"));
    assert!(!ran(&host, &["systemctl", "restart", "--", "s.service"]));
}

#[tokio::test(start_paused = true)]
async fn a_restart_that_breaks_the_connection_reconnects_and_rolls_back() {
    let host = host(Some("old")).once(&["systemctl", "restart"], Reply::Disconnect);
    let verifier = Scripted::new(vec![passed()]);
    let (end, report) = restart_over_old(&host, &verifier).await;
    assert_eq!(end.outcome, Outcome::RolledBack, "{}", end.detail);
    assert_eq!(end.error, Some(ApplyErrorKind::RestartFailed));
    assert!(end.detail.starts_with("restart failed: "), "{}", end.detail);
    assert!(
        end.detail.contains("; the connection to the host was lost, reconnected after 0.0s; the previous unit was restored and passed verification"),
        "{}",
        end.detail
    );
    assert_eq!(report.failed_stage.map(Stage::name), Some("restart"));
    // No invocation started, so there is no journal to read.
    assert!(report.journal.is_none());
    assert_eq!(host.file(PATH).as_deref(), Some("old"));
}

#[tokio::test(start_paused = true)]
async fn a_rollback_that_fails_while_the_host_shuts_down_starts_over() {
    let running = Reply::ok("running\n");
    let stopping = Reply::ok("stopping\n");
    let host = host(Some("old"))
        // The new unit's restart, then the rollback's first restart, which fails.
        .once(&["systemctl", "restart"], Reply::ok(""))
        .once(
            &["systemctl", "restart"],
            Reply::exit(1, "", "shutting down"),
        )
        .once(&["systemctl", "is-system-running"], running)
        .once(&["systemctl", "is-system-running"], stopping.clone())
        .once(&["systemctl", "is-system-running"], stopping);
    let verifier = Scripted::new(vec![failed(Stage::Readiness), passed()]);
    let before = observed(Some("old"), "active");
    let started = Instant::now();
    let (end, _) = install_on(&host, &verifier, &before, Verdict::Restart, false).await;
    assert_eq!(
        (end.outcome, end.detail.as_str()),
        (
            Outcome::RolledBack,
            "readiness failed: 503; the host was shutting down; the previous unit was restored and passed verification (ready after 2.0s)"
        )
    );
    // It waited (on the paused clock) for the shutdown to pass before trying again.
    assert!(started.elapsed() >= crate::verify::POLL_INTERVAL);
    let restarts = host
        .commands()
        .iter()
        .filter(|c| c[..] == ["systemctl", "restart", "--", "s.service"])
        .count();
    assert_eq!(restarts, 3);
}

/// Installs `t` over a host that had `old` and ran it, the verifier passing every stage.
async fn install_target(
    host: &FakeHost,
    t: &crate::targets::Target,
    answers: usize,
) -> (Ending, UnitReport) {
    let verifier = Scripted::new((0..answers).map(|_| passed()).collect());
    let before = observed(Some("old"), "active");
    let options = options(CancellationToken::new());
    let job = Job {
        host,
        t,
        options: &options,
        verifier: &verifier,
    };
    let fallback = Fallback {
        previous: Some("old".into()),
        was_running: true,
        saved: None,
        unit_files: Default::default(),
    };
    prepared(job, before, Verdict::Restart, fallback).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_benchmark_stage_records_a_baseline_then_rolls_back_a_regression() {
    let (base, _) = crate::bench::tests::serve(4).await;
    let mut t = target();
    t.verify.url = Some(base);
    t.verify.benchmark = Some(crate::manifest::BenchmarkSpec {
        levels: vec![1, 2],
        prompt_tokens: 4,
        output_tokens: 4,
        requests: Some(2),
        ..Default::default()
    });
    let current = "/var/lib/reconcile/s.service/current.json";
    let first = host(Some("old"));
    let (end, report) = install_target(&first, &t, 1).await;
    assert_eq!(end.outcome, Outcome::Converged, "{}", end.detail);
    assert!(
        end.detail.contains("benchmark passed) memory"),
        "{}",
        end.detail
    );
    assert!(
        end.detail.contains("; benchmark: baseline recorded: 1: "),
        "{}",
        end.detail
    );
    let b = report.benchmark.as_ref().unwrap();
    assert_eq!(b.verdict, crate::benchmark::Verdict::Baseline);
    let written = first.file(current).unwrap();
    let mut record = state::parse_record(written.trim()).unwrap();
    assert_eq!(record.benchmark, b.record());

    // The deployment before was ten times as fast: the gate fails the stage and rolls back.
    for level in &mut record.benchmark.as_mut().unwrap().levels {
        level.output_tokens_per_s *= 10.0;
    }
    let faster = state::record_json(&record).unwrap();
    let second = host(Some("old")).with_file(current, &faster);
    let (end, report) = install_target(&second, &t, 2).await;
    assert_eq!(end.outcome, Outcome::RolledBack, "{}", end.detail);
    assert_eq!(end.error, Some(ApplyErrorKind::VerificationFailed));
    assert!(
        end.detail
            .starts_with("benchmark failed: throughput regressed: -"),
        "{}",
        end.detail
    );
    assert!(
        end.detail.contains("(over the 10% allowed)"),
        "{}",
        end.detail
    );
    assert_eq!(report.failed_stage.map(Stage::name), Some("benchmark"));
    let stages = &report.verification.as_ref().unwrap().stages;
    assert_eq!(
        (stages[0].name.name(), stages[0].passed),
        ("benchmark", false)
    );
    // The record of the deployment that still runs is left as it was.
    assert_eq!(second.file(current).as_deref(), Some(faster.as_str()));
    assert_eq!(second.file(PATH).as_deref(), Some("old"));

    // With the gate off the same drop converges, and says so.
    t.verify.benchmark.as_mut().unwrap().gate = false;
    let third = host(Some("old")).with_file(current, &faster);
    let (end, _) = install_target(&third, &t, 1).await;
    assert_eq!(end.outcome, Outcome::Converged, "{}", end.detail);
    assert!(
        end.detail
            .contains("; benchmark: throughput regressed (gate off: not rolled back): -"),
        "{}",
        end.detail
    );
}
