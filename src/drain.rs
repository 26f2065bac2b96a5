//! Drain before a restart: poll the running server's `/metrics` until it has no running or queued
//! request, for at most the manifest's `drain.timeout`, showing the wait live. What a reading
//! means and what to do at the end is `reconcile_core::drain`'s; this module asks the server.
//!
//! [`wait_until_idle`] is the whole wait against a server already reached (apply calls it right
//! before `systemctl restart`; a rollout that first takes a replica out of its router calls it
//! after). [`before_restart`] is apply's way in: it reaches the server the old unit runs.

use std::time::Duration;

use indicatif::MultiProgress;
use serde::Serialize;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::flags::flags;
use crate::manifest::DrainSpec;
use crate::remote::{error_chain, Host, Server};
use crate::unit::parse_unit;
use crate::verify::{Expect, Progress};
use reconcile_core::drain::{self as judge, MetricsError, Reading, Step};
pub use reconcile_core::drain::{Ended, Load};

/// How often `/metrics` is read. SGLang 0.5.23 publishes the gauges at each batch report and,
/// once idle, at the scheduler's next idle pass as soon as the running-requests gauge disagrees
/// with the running batch (`metrics_reporter.py`, `_maybe_log_idle_metrics`), so a reading is
/// current within a scheduler pass. A quarter second keeps the wait after the last request ends
/// short (a rollout behind a router drains each replica) at four small requests a second.
pub const POLL: Duration = Duration::from_millis(250);

/// Off a terminal, a line every this often, so a CI log shows the wait without a line a second.
const LOG_EVERY: Duration = Duration::from_secs(10);

/// What a drain did, for the unit's report (`drain` in `--format json`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DrainReport {
    pub outcome: Ended,
    /// How long the wait took.
    pub seconds: f64,
    /// The last requests seen, when the server could be read.
    pub last: Option<Load>,
    /// Whether the restart went ahead after it.
    pub restarted: bool,
    /// What happened, in words (`drained in 8.2s`, `drain timed out after 10m with ...`).
    pub detail: String,
}

impl DrainReport {
    fn ended(
        spec: &DrainSpec,
        ended: Ended,
        seconds: f64,
        readings: u32,
        last: &Reading,
    ) -> DrainReport {
        DrainReport {
            outcome: ended,
            seconds,
            last: match last {
                Reading::Load(l) => Some(*l),
                _ => None,
            },
            restarted: judge::restarts(spec, ended),
            detail: judge::summary(spec, ended, seconds, readings, last),
        }
    }
}

/// Waits until `server` has no running or queued request, for at most `spec.timeout`, reading its
/// `/metrics` every [`POLL`]. Shown live under `label` (a spinner in `progress`, else a line every
/// 10 s on stderr). Returns at once when `/metrics` does not expose the requests (404, no
/// gauges), and when `cancel` is cancelled (Ctrl-C, SIGTERM). `restarted` in the result says
/// whether the caller should go on with the restart, as `spec.on_timeout` decides.
pub async fn wait_until_idle(
    server: &Server,
    spec: &DrainSpec,
    label: &str,
    progress: Option<&MultiProgress>,
    cancel: &CancellationToken,
) -> DrainReport {
    let started = Instant::now();
    let show = Progress::new(label.to_string(), progress);
    let mut logged: Option<Instant> = None;
    let mut readings = 0;
    loop {
        let Some(reading) = cancel.run_until_cancelled(read(server)).await else {
            return interrupted(spec, started);
        };
        let elapsed = started.elapsed();
        readings += 1;
        if let Step::Done(ended) = judge::step(spec, elapsed, &reading) {
            return DrainReport::ended(spec, ended, elapsed.as_secs_f64(), readings, &reading);
        }
        let line = judge::progress_line(&reading, elapsed);
        show.status(&line);
        if progress.is_none() && logged.is_none_or(|at| at.elapsed() >= LOG_EVERY) {
            show.line(&line);
            logged = Some(Instant::now());
        }
        if cancel
            .run_until_cancelled(tokio::time::sleep(POLL))
            .await
            .is_none()
        {
            return interrupted(spec, started);
        }
    }
}

fn interrupted(spec: &DrainSpec, started: Instant) -> DrainReport {
    let seconds = started.elapsed().as_secs_f64();
    let none = Reading::Failed(String::new());
    DrainReport::ended(spec, Ended::Interrupted, seconds, 0, &none)
}

/// One look at the server's requests.
async fn read(server: &Server) -> Reading {
    match server.metrics().await {
        Ok(None) => Reading::NotExposed(
            "/metrics answered 404 (SGLang serves it only with --enable-metrics)".into(),
        ),
        Ok(Some(text)) => match judge::parse_metrics(&text) {
            Ok(load) => Reading::Load(load),
            Err(e @ MetricsError::NoGauges) => Reading::NotExposed(e.to_string()),
            Err(e) => Reading::Failed(e.to_string()),
        },
        Err(e) => Reading::Failed(e.to_string()),
    }
}

/// The server the unit on the host runs now, for the drain before its restart.
pub struct Running<'a> {
    /// The unit file the running server was started from.
    pub unit_text: &'a str,
    /// Whether systemd has it active (or activating).
    pub running: bool,
    /// `verify.url`: reach the server there instead of a port forward.
    pub url: Option<&'a str>,
}

/// Apply's drain: the server the old unit runs, reached as verification reaches servers (a port
/// forward to its `--port`, with its `--api-key`), waited on by [`wait_until_idle`]. A server
/// that is not running has nothing to wait for; one whose unit has no `--enable-metrics`, or
/// that no forward reaches, cannot be seen, which `spec.on_timeout` then decides at once.
pub async fn before_restart(
    host: &dyn Host,
    running: &Running<'_>,
    spec: &DrainSpec,
    label: &str,
    options: (Option<&MultiProgress>, &CancellationToken),
) -> DrainReport {
    let none = Reading::Failed(String::new());
    if !running.running {
        return DrainReport::ended(spec, Ended::NotRunning, 0.0, 0, &none);
    }
    let model = parse_unit(running.unit_text);
    if !flags(&model.exec_start).1.contains_key("enable-metrics") {
        let why = Reading::NotExposed(
            "the running unit has no --enable-metrics, so its server has no /metrics".into(),
        );
        return DrainReport::ended(spec, Ended::Blind, 0.0, 0, &why);
    }
    let endpoint = Expect::from_unit(&model).endpoint;
    let server = match host.server(&endpoint, running.url).await {
        Ok(s) => s,
        // No forward, no reading: as blind as a server without metrics.
        Err(e) => {
            let why = Reading::NotExposed(format!(
                "the server could not be reached: {}",
                error_chain(&e)
            ));
            return DrainReport::ended(spec, Ended::Blind, 0.0, 0, &why);
        }
    };
    wait_until_idle(&server, spec, label, options.0, options.1).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::OnTimeout;
    use crate::remote::fake::FakeHost;

    fn spec(on_timeout: OnTimeout) -> DrainSpec {
        DrainSpec {
            timeout: Duration::from_secs(60),
            on_timeout,
        }
    }

    /// A local HTTP server whose `/metrics` answers `bodies` in turn (the last one from then on),
    /// or 404 when `bodies` is empty.
    async fn serve(bodies: Vec<&'static str>) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let mut n = 0;
            loop {
                let (mut socket, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 4096];
                let _ = socket.read(&mut buf).await;
                let reply = match bodies.get(n.min(bodies.len().saturating_sub(1))) {
                    Some(body) => format!(
                        "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                        body.len()
                    ),
                    None => {
                        "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                            .into()
                    }
                };
                n += 1;
                let _ = socket.write_all(reply.as_bytes()).await;
            }
        });
        base
    }

    const BUSY: &str =
        "sglang:num_running_reqs{tp_rank=\"0\"} 1.0\nsglang:num_queue_reqs{tp_rank=\"0\"} 2.0\n";
    const IDLE: &str =
        "sglang:num_running_reqs{tp_rank=\"0\"} 0.0\nsglang:num_queue_reqs{tp_rank=\"0\"} 0.0\n";

    #[tokio::test]
    async fn it_waits_while_requests_run_and_ends_when_none_do() {
        let server = Server::at(&serve(vec![BUSY, BUSY, IDLE]).await, None).unwrap();
        let cancel = CancellationToken::new();
        let d = wait_until_idle(&server, &spec(OnTimeout::Refuse), "", None, &cancel).await;
        assert_eq!((d.outcome, d.restarted), (Ended::Idle, true));
        assert_eq!(d.last, Some(Load::default()));
        // Two busy readings, a poll apart each.
        let two_polls = 2.0 * POLL.as_secs_f64();
        assert!(d.seconds >= two_polls && d.seconds < 10.0, "{}", d.seconds);
        assert!(d.detail.starts_with("drained in "), "{}", d.detail);
    }

    #[tokio::test]
    async fn a_busy_server_times_out_and_a_404_is_blind_at_once() {
        let server = Server::at(&serve(vec![BUSY]).await, None).unwrap();
        let cancel = CancellationToken::new();
        let short = DrainSpec {
            timeout: Duration::from_secs(1),
            on_timeout: OnTimeout::Restart,
        };
        let d = wait_until_idle(&server, &short, "", None, &cancel).await;
        assert_eq!((d.outcome, d.restarted), (Ended::TimedOut, true));
        assert_eq!(
            d.detail,
            "drain timed out after 1s with 1 running, 2 queued; restarted anyway (drain.on_timeout: restart)"
        );
        let server = Server::at(&serve(vec![]).await, None).unwrap();
        let d = wait_until_idle(&server, &spec(OnTimeout::Refuse), "", None, &cancel).await;
        assert_eq!((d.outcome, d.restarted), (Ended::Blind, false));
        assert!(
            d.seconds < 5.0 && d.detail.contains("/metrics answered 404"),
            "{d:?}"
        );
    }

    #[tokio::test]
    async fn a_signal_ends_the_wait_without_a_restart() {
        let server = Server::at(&serve(vec![BUSY]).await, None).unwrap();
        let cancel = CancellationToken::new();
        let cancelling = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            cancelling.cancel();
        });
        let d = wait_until_idle(&server, &spec(OnTimeout::Restart), "", None, &cancel).await;
        assert_eq!((d.outcome, d.restarted), (Ended::Interrupted, false));
        assert!(d.seconds >= 1.4 && d.seconds < 5.0, "{}", d.seconds);
    }

    const UNIT: &str = "[Service]\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /m --port 30000\n";

    #[tokio::test]
    async fn a_stopped_server_is_not_waited_for_and_an_unmetered_one_is_blind() {
        let host = FakeHost::new("gpu-a");
        let cancel = CancellationToken::new();
        let decide = async |running: &Running<'_>, on_timeout| {
            before_restart(&host, running, &spec(on_timeout), "", (None, &cancel)).await
        };
        let stopped = Running {
            unit_text: UNIT,
            running: false,
            url: None,
        };
        let d = decide(&stopped, OnTimeout::Refuse).await;
        assert_eq!((d.outcome, d.restarted), (Ended::NotRunning, true));
        let blind = Running {
            running: true,
            ..stopped
        };
        let d = decide(&blind, OnTimeout::Refuse).await;
        assert_eq!((d.outcome, d.restarted), (Ended::Blind, false));
        assert_eq!(
            d.detail,
            "drain cannot see the server's requests: the running unit has no --enable-metrics, so its server has no /metrics; the server was not restarted (drain.on_timeout: refuse)"
        );
        let d = decide(&blind, OnTimeout::Restart).await;
        assert_eq!((d.outcome, d.restarted), (Ended::Blind, true));
        // Neither touched the host: the decision needed no request.
        assert!(host.commands().is_empty());
    }
}
