//! Drain before a restart: what the server's `/metrics` says about its requests, and whether to
//! wait, restart or refuse. The binary (`src/drain.rs`) polls the server and shows the lines made
//! here; nothing here reads a host or the clock.
//!
//! The gauges are SGLang's (0.5.23, `srt/observability/metrics_collector.py`,
//! `SchedulerMetricsCollector`): `sglang:num_running_reqs` ("The number of running requests.")
//! and `sglang:num_queue_reqs` ("The number of requests in the waiting queue."), one series per
//! scheduler that logs stats, labelled `model_name`, `engine_type`, `tp_rank`, `pp_rank`,
//! `moe_ep_rank`, plus `dp_rank` with data parallelism, `priority` with priority scheduling and
//! any `--extra-metric-labels`. They are served by prometheus_client's multiprocess collector
//! (`srt/utils/common.py`, `add_prometheus_middleware`; gauges in `mostrecent` mode, so no `pid`
//! label).

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::manifest::{DrainSpec, OnTimeout};
use crate::prometheus::{split_sample, SampleFault};

pub const RUNNING: &str = "sglang:num_running_reqs";
pub const QUEUED: &str = "sglang:num_queue_reqs";

/// Labels that tell apart schedulers serving the same batch: the tensor, pipeline and expert
/// parallel ranks of one data-parallel group all report it (with
/// `--enable-metrics-for-all-schedulers`), so their series are one batch, not several.
const SAME_BATCH: [&str; 3] = ["tp_rank", "pp_rank", "moe_ep_rank"];

/// The requests a server has: running (in a batch) and queued (waiting for one).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Load {
    pub running: u64,
    pub queued: u64,
}

impl Load {
    pub fn is_idle(&self) -> bool {
        self.running == 0 && self.queued == 0
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetricsError {
    #[error("/metrics has neither {RUNNING} nor {QUEUED} (SGLang reports them once its scheduler logged stats)")]
    NoGauges,
    #[error("/metrics line {line}: {why}: `{text}`")]
    BadLine {
        line: usize,
        why: SampleFault,
        text: String,
    },
}

/// The running and queued requests in a `/metrics` answer (Prometheus text format).
///
/// With priority scheduling, SGLang writes each total under `priority=""` and breaks it down
/// under `priority="<n>"` (`_log_gauge_queue_count`), so only the totals count. Series of one
/// data-parallel group count once (their largest value); groups add up. A missing gauge reads as
/// 0 when the other is there; neither is an error: a drain must not take "no numbers" for idle.
pub fn parse_metrics(text: &str) -> Result<Load, MetricsError> {
    let mut groups: BTreeMap<(bool, Vec<(String, String)>), u64> = BTreeMap::new();
    let mut seen = false;
    for (i, line) in text.lines().enumerate() {
        let line = line.trim_start();
        let Some((running, rest)) = gauge_of(line) else {
            continue;
        };
        seen = true;
        let bad = |why| MetricsError::BadLine {
            line: i + 1,
            why,
            text: line.chars().take(200).collect(),
        };
        let (labels, value) = split_sample(rest).map_err(bad)?;
        let value = count(value).ok_or_else(|| bad(SampleFault::NotACount))?;
        if labels.iter().any(|(k, v)| k == "priority" && !v.is_empty()) {
            continue;
        }
        let key: Vec<(String, String)> = labels
            .into_iter()
            .filter(|(k, _)| !SAME_BATCH.contains(&k.as_str()))
            .collect();
        let slot = groups.entry((running, key)).or_default();
        *slot = (*slot).max(value);
    }
    if !seen {
        return Err(MetricsError::NoGauges);
    }
    let mut load = Load::default();
    for ((running, _), value) in groups {
        let sum = if running {
            &mut load.running
        } else {
            &mut load.queued
        };
        *sum = sum.saturating_add(value);
    }
    Ok(load)
}

/// Whether `line` is a sample of one of the two gauges (`true`: running), and what follows the name.
fn gauge_of(line: &str) -> Option<(bool, &str)> {
    for (name, running) in [(RUNNING, true), (QUEUED, false)] {
        if let Some(rest) = line.strip_prefix(name) {
            if rest.starts_with(['{', ' ', '\t']) {
                return Some((running, rest));
            }
        }
    }
    None
}

/// A gauge's value as a number of requests: prometheus_client writes `3.0`; negative, fractional
/// or not finite is not a count.
fn count(value: &str) -> Option<u64> {
    let v: f64 = value.parse().ok()?;
    (v.is_finite() && v >= 0.0 && v.fract() == 0.0 && v <= u64::MAX as f64).then_some(v as u64)
}

/// One look at the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reading {
    Load(Load),
    /// The server does not expose its requests (`/metrics` answered 404, or has no gauges, or
    /// the running unit has no `--enable-metrics`): waiting would never see them.
    NotExposed(String),
    /// This look failed (a timeout, a broken connection, a 5xx); the next may not.
    Failed(String),
}

/// How a drain ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Ended {
    /// No running or queued request.
    Idle,
    /// The server was not running: no request could be in flight.
    NotRunning,
    /// Still busy (or unreadable) when the timeout came.
    TimedOut,
    /// The server does not expose its requests.
    Blind,
    /// A signal (Ctrl-C, SIGTERM) stopped the wait.
    Interrupted,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Wait,
    Done(Ended),
}

/// What one reading, `elapsed` into the drain, means.
pub fn step(spec: &DrainSpec, elapsed: Duration, reading: &Reading) -> Step {
    match reading {
        Reading::Load(load) if load.is_idle() => Step::Done(Ended::Idle),
        Reading::NotExposed(_) => Step::Done(Ended::Blind),
        _ if elapsed >= spec.timeout => Step::Done(Ended::TimedOut),
        _ => Step::Wait,
    }
}

/// Whether the restart goes ahead after a drain that ended so. A drain that did not see the
/// server idle restarts only when the manifest says `on_timeout: restart`; one stopped by a signal
/// never does (apply puts the old unit back).
pub fn restarts(spec: &DrainSpec, ended: Ended) -> bool {
    match ended {
        Ended::Idle | Ended::NotRunning => true,
        Ended::TimedOut | Ended::Blind => spec.on_timeout == OnTimeout::Restart,
        Ended::Interrupted => false,
    }
}

/// The live line: `draining: 3 running, 12 queued, 12 s`.
pub fn progress_line(reading: &Reading, elapsed: Duration) -> String {
    let secs = elapsed.as_secs();
    match reading {
        Reading::Load(l) => format!(
            "draining: {} running, {} queued, {secs} s",
            l.running, l.queued
        ),
        Reading::NotExposed(why) | Reading::Failed(why) => {
            format!("draining: cannot read the server's requests ({why}), {secs} s")
        }
    }
}

/// What the drain did, for the unit's report: `drained in 8.2s` or why it did not.
/// `readings`: how many times the server's requests were read (1: idle at the first look).
pub fn summary(
    spec: &DrainSpec,
    ended: Ended,
    seconds: f64,
    readings: u32,
    last: &Reading,
) -> String {
    let then = match (ended, restarts(spec, ended)) {
        (Ended::Idle | Ended::NotRunning | Ended::Interrupted, _) => "",
        (_, true) => "; restarted anyway (drain.on_timeout: restart)",
        (_, false) => "; the server was not restarted (drain.on_timeout: refuse)",
    };
    let what = match (ended, last) {
        (Ended::Idle, _) if readings <= 1 => "drain: the server was idle".to_string(),
        (Ended::Idle, _) => format!("drained in {seconds:.1}s"),
        (Ended::NotRunning, _) => "drain: the server was not running; nothing to wait for".into(),
        (Ended::Interrupted, _) => format!("drain interrupted after {seconds:.1}s"),
        (Ended::TimedOut, Reading::Load(l)) => format!(
            "drain timed out after {} with {} running, {} queued",
            humantime::format_duration(spec.timeout),
            l.running,
            l.queued
        ),
        (Ended::TimedOut, Reading::NotExposed(why) | Reading::Failed(why)) => format!(
            "drain timed out after {}: the server's requests could not be read ({why})",
            humantime::format_duration(spec.timeout)
        ),
        (Ended::Blind, Reading::NotExposed(why) | Reading::Failed(why)) => {
            format!("drain cannot see the server's requests: {why}")
        }
        (Ended::Blind, Reading::Load(_)) => "drain cannot see the server's requests".into(),
    };
    format!("{what}{then}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What SGLang 0.5.23 serves for one scheduler (prometheus_client's text: HELP, TYPE, the
    /// labels sorted, `%.1f`-like floats).
    const ONE: &str = "# HELP sglang:num_running_reqs The number of running requests.\n# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{engine_type=\"unified\",model_name=\"qwen\",moe_ep_rank=\"0\",pp_rank=\"0\",tp_rank=\"0\"} 3.0\n# HELP sglang:num_queue_reqs The number of requests in the waiting queue.\n# TYPE sglang:num_queue_reqs gauge\nsglang:num_queue_reqs{engine_type=\"unified\",model_name=\"qwen\",moe_ep_rank=\"0\",pp_rank=\"0\",tp_rank=\"0\"} 12.0\n# HELP sglang:num_running_reqs_offline_batch x\nsglang:num_running_reqs_offline_batch{tp_rank=\"0\"} 99.0\n";

    fn spec(timeout: u64, on_timeout: OnTimeout) -> DrainSpec {
        DrainSpec {
            timeout: Duration::from_secs(timeout),
            on_timeout,
        }
    }

    #[test]
    fn one_scheduler_reads_as_its_gauges_and_other_metrics_are_ignored() {
        assert_eq!(
            parse_metrics(ONE),
            Ok(Load {
                running: 3,
                queued: 12
            })
        );
    }

    #[test]
    fn ranks_of_one_batch_count_once_and_data_parallel_groups_add_up() {
        let text = "sglang:num_running_reqs{dp_rank=\"0\",tp_rank=\"0\"} 2.0\nsglang:num_running_reqs{dp_rank=\"0\",tp_rank=\"1\"} 2.0\nsglang:num_running_reqs{dp_rank=\"1\",tp_rank=\"2\"} 5.0\nsglang:num_queue_reqs{dp_rank=\"1\",tp_rank=\"2\"} 1\n";
        assert_eq!(
            parse_metrics(text),
            Ok(Load {
                running: 7,
                queued: 1
            })
        );
    }

    #[test]
    fn priority_breakdowns_are_not_added_to_their_total() {
        let text = "sglang:num_queue_reqs{priority=\"\",tp_rank=\"0\"} 4.0\nsglang:num_queue_reqs{priority=\"1\",tp_rank=\"0\"} 3.0\nsglang:num_queue_reqs{priority=\"2\",tp_rank=\"0\"} 1.0\nsglang:num_running_reqs{priority=\"\",tp_rank=\"0\"} 0.0\n";
        assert_eq!(
            parse_metrics(text),
            Ok(Load {
                running: 0,
                queued: 4
            })
        );
    }

    #[test]
    fn escapes_timestamps_and_bare_names_parse() {
        let text = "sglang:num_running_reqs{model_name=\"a \\\"b\\\" \\\\ c\\n\",} 1 1700000000000\nsglang:num_queue_reqs 0\n";
        assert_eq!(
            parse_metrics(text),
            Ok(Load {
                running: 1,
                queued: 0
            })
        );
    }

    #[test]
    fn no_gauges_is_an_error_not_idle() {
        assert_eq!(
            parse_metrics("# HELP x y\nx 1\n"),
            Err(MetricsError::NoGauges)
        );
        assert_eq!(parse_metrics(""), Err(MetricsError::NoGauges));
    }

    #[test]
    fn a_broken_line_of_the_gauges_names_its_line() {
        for (text, why) in [
            (
                "sglang:num_running_reqs{a=\"1\" 2\n",
                "labels not separated by commas",
            ),
            (
                "sglang:num_running_reqs{a=1} 2\n",
                "a label value without quotes",
            ),
            (
                "sglang:num_running_reqs{a=\"1} 2\n",
                "a label value without its closing quote",
            ),
            ("sglang:num_running_reqs{a=\"1\"}\n", "no value"),
            (
                "sglang:num_running_reqs 1.5\n",
                "the value is not a count of requests",
            ),
            (
                "sglang:num_running_reqs NaN\n",
                "the value is not a count of requests",
            ),
            (
                "sglang:num_running_reqs -1\n",
                "the value is not a count of requests",
            ),
            (
                "sglang:num_running_reqs 1 x\n",
                "the timestamp is not a number",
            ),
            (
                "sglang:num_running_reqs{9a=\"1\"} 2\n",
                "a label name that is not one",
            ),
        ] {
            match parse_metrics(&format!("# x\n{text}")) {
                Err(MetricsError::BadLine {
                    line: 2, why: w, ..
                }) => assert_eq!(w.to_string(), why, "{text}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        assert!(matches!(
            parse_metrics("sglang:num_running_reqs 1 x\n"),
            Err(MetricsError::BadLine {
                why: SampleFault::Timestamp(_),
                ..
            })
        ));
    }

    #[test]
    fn idle_restarts_busy_waits_until_the_timeout() {
        let s = spec(60, OnTimeout::Refuse);
        let busy = Reading::Load(Load {
            running: 1,
            queued: 0,
        });
        let queued = Reading::Load(Load {
            running: 0,
            queued: 2,
        });
        let idle = Reading::Load(Load::default());
        let failed = Reading::Failed("timed out".into());
        let at = Duration::from_secs;
        assert_eq!(step(&s, at(5), &idle), Step::Done(Ended::Idle));
        assert_eq!(step(&s, at(59), &busy), Step::Wait);
        assert_eq!(step(&s, at(59), &queued), Step::Wait);
        assert_eq!(step(&s, at(59), &failed), Step::Wait);
        assert_eq!(step(&s, at(60), &busy), Step::Done(Ended::TimedOut));
        assert_eq!(step(&s, at(60), &failed), Step::Done(Ended::TimedOut));
        // Idle at the last moment is idle.
        assert_eq!(step(&s, at(61), &idle), Step::Done(Ended::Idle));
        let blind = Reading::NotExposed("404".into());
        assert_eq!(step(&s, at(0), &blind), Step::Done(Ended::Blind));
    }

    #[test]
    fn on_timeout_decides_for_a_drain_that_did_not_see_idle() {
        let refuse = spec(60, OnTimeout::Refuse);
        let restart = spec(60, OnTimeout::Restart);
        for ended in [Ended::Idle, Ended::NotRunning] {
            assert!(restarts(&refuse, ended) && restarts(&restart, ended));
        }
        for ended in [Ended::TimedOut, Ended::Blind] {
            assert!(!restarts(&refuse, ended) && restarts(&restart, ended));
        }
        assert!(!restarts(&restart, Ended::Interrupted));
    }

    #[test]
    fn lines_say_what_is_waited_for_and_what_happened() {
        let busy = Reading::Load(Load {
            running: 3,
            queued: 12,
        });
        assert_eq!(
            progress_line(&busy, Duration::from_millis(12_400)),
            "draining: 3 running, 12 queued, 12 s"
        );
        let s = spec(600, OnTimeout::Refuse);
        assert_eq!(
            summary(&s, Ended::TimedOut, 600.2, 2401, &busy),
            "drain timed out after 10m with 3 running, 12 queued; the server was not restarted (drain.on_timeout: refuse)"
        );
        let s = spec(90, OnTimeout::Restart);
        assert_eq!(
            summary(&s, Ended::TimedOut, 90.0, 361, &busy),
            "drain timed out after 1m 30s with 3 running, 12 queued; restarted anyway (drain.on_timeout: restart)"
        );
        let idle = Reading::Load(Load::default());
        assert_eq!(summary(&s, Ended::Idle, 8.24, 34, &idle), "drained in 8.2s");
        // Busy at the first look, idle at the second: a wait, however short.
        assert_eq!(summary(&s, Ended::Idle, 0.3, 2, &idle), "drained in 0.3s");
        assert_eq!(
            summary(&s, Ended::Idle, 0.3, 1, &idle),
            "drain: the server was idle"
        );
        let blind = Reading::NotExposed("/metrics answered 404".into());
        assert_eq!(
            summary(&s, Ended::Blind, 0.1, 1, &blind),
            "drain cannot see the server's requests: /metrics answered 404; restarted anyway (drain.on_timeout: restart)"
        );
    }
}
