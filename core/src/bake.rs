//! The bake: a canary replica judged on the traffic it serves, against the stable replicas over
//! the same window (`verify.bake`; the rollout runs it, `src/apply/bake.rs`). Synthetic gates catch what
//! a known workload shows; a regression that only real prompts show (throughput falling from 5k
//! to under 1k tok/s while `/health` stays 200: vllm issue 51663) needs the live figures.
//!
//! The figures are SGLang 0.5.23's own, from every replica's `/metrics` (`--enable-metrics`;
//! `srt/observability/metrics_collector.py`, `TokenizerMetricsCollector`): the histograms
//! `sglang:time_to_first_token_seconds` and `sglang:inter_token_latency_seconds`, and the counters
//! `sglang:num_requests_total` and `sglang:num_aborted_requests_total`. A look is cumulative
//! ([`Snapshot`]); the bake is the difference of two looks ([`Window`]), its quantiles read as
//! Prometheus' `histogram_quantile` reads them ([`quantile`]).

use serde::Serialize;

use crate::prometheus::{samples, BadLine, Labels};

pub const TTFT: &str = "sglang:time_to_first_token_seconds";
pub const ITL: &str = "sglang:inter_token_latency_seconds";
pub const REQUESTS: &str = "sglang:num_requests_total";
pub const ABORTED: &str = "sglang:num_aborted_requests_total";
/// Output tokens of the finished requests, and the seconds each finished request was in flight
/// (the end-to-end latency histogram's sum): together the throughput each running request got.
pub const GENERATED: &str = "sglang:generation_tokens_total";
pub const IN_FLIGHT: &str = "sglang:e2e_request_latency_seconds_sum";

/// A histogram summed over its series (a replica's label sets: `is_streaming`, `model_name`):
/// cumulative counts by upper bound, ascending, the last `+Inf`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Histogram {
    pub buckets: Vec<(f64, f64)>,
}

impl Histogram {
    /// How many observations it holds (its `+Inf` bucket).
    pub fn count(&self) -> f64 {
        self.buckets.last().map_or(0.0, |(_, c)| *c)
    }

    fn read(text: &str, name: &str) -> Result<Histogram, BadLine> {
        let mut buckets: Vec<(f64, f64)> = Vec::new();
        for (labels, value) in samples(text, &format!("{name}_bucket"))? {
            let Some(le) = label(&labels, "le").and_then(|le| match le {
                "+Inf" => Some(f64::INFINITY),
                le => le.parse::<f64>().ok(),
            }) else {
                continue;
            };
            match buckets.iter_mut().find(|(b, _)| *b == le) {
                Some((_, count)) => *count += value,
                None => buckets.push((le, value)),
            }
        }
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        Ok(Histogram { buckets })
    }

    /// `self` less `before`, bucket by bucket; `None` when a count went down (the server
    /// restarted between the looks) or the bounds differ.
    fn since(&self, before: &Histogram) -> Option<Histogram> {
        if before.buckets.is_empty() {
            return Some(self.clone());
        }
        bucketwise(self, before, |now, was| (now >= was).then_some(now - was))
    }

    /// Two replicas' histograms as one; `None` when their bounds differ.
    fn plus(&self, other: &Histogram) -> Option<Histogram> {
        match (self.buckets.is_empty(), other.buckets.is_empty()) {
            (true, _) => Some(other.clone()),
            (_, true) => Some(self.clone()),
            _ => bucketwise(self, other, |x, y| Some(x + y)),
        }
    }
}

/// `count(a, b)` for each bucket of two histograms with the same bounds; `None` when the bounds
/// differ or `count` says so.
fn bucketwise(
    a: &Histogram,
    b: &Histogram,
    count: impl Fn(f64, f64) -> Option<f64>,
) -> Option<Histogram> {
    if a.buckets.len() != b.buckets.len() {
        return None;
    }
    a.buckets
        .iter()
        .zip(&b.buckets)
        .map(|((le, x), (le_b, y))| {
            if le == le_b {
                count(*x, *y).map(|c| (*le, c))
            } else {
                None
            }
        })
        .collect::<Option<Vec<_>>>()
        .map(|buckets| Histogram { buckets })
}

fn label<'a>(labels: &'a Labels, name: &str) -> Option<&'a str> {
    labels
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// The `q` quantile (0..1) of a histogram, as Prometheus' `histogram_quantile` reads it: linear
/// within the bucket it falls in, the lowest bucket starting at 0, and the highest finite bound
/// when it falls in `+Inf`. `None` without observations.
pub fn quantile(q: f64, h: &Histogram) -> Option<f64> {
    let total = h.count();
    if total <= 0.0 {
        return None;
    }
    let rank = q.clamp(0.0, 1.0) * total;
    let mut lower = (0.0, 0.0);
    for &(le, count) in &h.buckets {
        if count >= rank {
            if le.is_infinite() {
                return Some(lower.0);
            }
            let within = count - lower.1;
            let share = if within > 0.0 {
                (rank - lower.1) / within
            } else {
                1.0
            };
            return Some(lower.0 + (le - lower.0) * share);
        }
        lower = (le, count);
    }
    Some(lower.0)
}

/// One replica's `/metrics` at one moment: cumulative since it started.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Snapshot {
    pub ttft: Histogram,
    pub itl: Histogram,
    pub requests: f64,
    pub aborted: f64,
    pub generated_tokens: f64,
    pub request_seconds: f64,
}

impl Snapshot {
    pub fn parse(text: &str) -> Result<Snapshot, BadLine> {
        let total = |name: &str| -> Result<f64, BadLine> {
            Ok(samples(text, name)?.iter().map(|(_, v)| v).sum())
        };
        Ok(Snapshot {
            ttft: Histogram::read(text, TTFT)?,
            itl: Histogram::read(text, ITL)?,
            requests: total(REQUESTS)?,
            aborted: total(ABORTED)?,
            generated_tokens: total(GENERATED)?,
            request_seconds: total(IN_FLIGHT)?,
        })
    }
}

/// What a replica served between two looks.
#[derive(Debug, Clone, PartialEq)]
pub struct Window {
    pub ttft: Histogram,
    pub itl: Histogram,
    pub requests: f64,
    pub aborted: f64,
    pub generated_tokens: f64,
    pub request_seconds: f64,
}

impl Window {
    /// `after` less `before`; `None` when the replica restarted between them (a counter went
    /// down): its window says nothing of the bake.
    pub fn between(before: &Snapshot, after: &Snapshot) -> Option<Window> {
        let requests = after.requests - before.requests;
        let aborted = after.aborted - before.aborted;
        if requests < 0.0 || aborted < 0.0 {
            return None;
        }
        Some(Window {
            ttft: after.ttft.since(&before.ttft)?,
            itl: after.itl.since(&before.itl)?,
            requests,
            aborted,
            generated_tokens: after.generated_tokens - before.generated_tokens,
            request_seconds: after.request_seconds - before.request_seconds,
        })
    }

    /// Several replicas' windows as one: the stable side.
    pub fn merged(windows: &[Window]) -> Option<Window> {
        let mut all = windows.iter();
        let first = all.next()?.clone();
        all.try_fold(first, |mut sum, w| {
            sum.requests += w.requests;
            sum.aborted += w.aborted;
            sum.generated_tokens += w.generated_tokens;
            sum.request_seconds += w.request_seconds;
            sum.ttft = sum.ttft.plus(&w.ttft)?;
            sum.itl = sum.itl.plus(&w.itl)?;
            Some(sum)
        })
    }
}

/// A side's figures over the window.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Figures {
    pub requests: f64,
    /// Aborted requests over requests (0 without requests).
    pub error_rate: f64,
    pub ttft_p50_s: Option<f64>,
    pub ttft_p95_s: Option<f64>,
    pub itl_p50_s: Option<f64>,
    pub itl_p95_s: Option<f64>,
    /// Output tokens per second of each request in flight: the finished requests' output tokens
    /// over the seconds they were in flight. Streamed or not, unlike inter-token latency.
    pub tokens_per_request_s: Option<f64>,
}

impl Figures {
    pub fn of(w: &Window) -> Figures {
        Figures {
            requests: w.requests,
            error_rate: if w.requests > 0.0 {
                w.aborted / w.requests
            } else {
                0.0
            },
            ttft_p50_s: quantile(0.5, &w.ttft),
            ttft_p95_s: quantile(0.95, &w.ttft),
            itl_p50_s: quantile(0.5, &w.itl),
            itl_p95_s: quantile(0.95, &w.itl),
            tokens_per_request_s: (w.request_seconds > 0.0)
                .then(|| w.generated_tokens / w.request_seconds),
        }
    }
}

/// How much worse than the stable replicas the canary may be.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Fewer requests than this on either side: too few to judge.
    pub min_requests: f64,
    /// The canary's error rate may exceed the stable one by this much (0.01: one point).
    pub error_rate_above: f64,
    /// The canary's latency quantiles may be this many times the stable ones (1.25: 25 % worse),
    /// and its throughput per running request this many times lower.
    pub latency_ratio: f64,
}

/// The bake's verdict, with both sides' figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "verdict", rename_all = "snake_case")]
pub enum Verdict {
    Passed {
        canary: Figures,
        stable: Figures,
    },
    /// Worse beyond the limits: each way it was, named.
    Worse {
        canary: Figures,
        stable: Figures,
        why: Vec<String>,
    },
    /// Too few requests to judge: the operator decides, the canary stays.
    TooFew {
        canary: Figures,
        stable: Figures,
        why: String,
    },
}

impl Figures {
    /// `312 requests, 0.0 % aborted, TTFT p50/p95 110/240 ms, ITL p50/p95 21/35 ms`.
    pub fn describe(&self) -> String {
        let ms = |s: Option<f64>| s.map_or("-".to_string(), |s| format!("{:.0}", s * 1000.0));
        let per_request = self
            .tokens_per_request_s
            .map_or("-".to_string(), |t| format!("{t:.1}"));
        format!(
            "{:.0} requests, {:.1} % aborted, TTFT p50/p95 {}/{} ms, ITL p50/p95 {}/{} ms, {per_request} tokens/s per request",
            self.requests,
            100.0 * self.error_rate,
            ms(self.ttft_p50_s),
            ms(self.ttft_p95_s),
            ms(self.itl_p50_s),
            ms(self.itl_p95_s)
        )
    }
}

impl Verdict {
    /// What the report says: the verdict, then each side's figures.
    pub fn describe(&self) -> String {
        let (canary, stable, said) = match self {
            Verdict::Passed { canary, stable } => (canary, stable, "passed".to_string()),
            Verdict::Worse {
                canary,
                stable,
                why,
            } => (
                canary,
                stable,
                format!("worse than the stable replicas: {}", why.join("; ")),
            ),
            Verdict::TooFew {
                canary,
                stable,
                why,
            } => (canary, stable, format!("{why}; the canary stays")),
        };
        format!(
            "{said} (canary: {}; stable: {})",
            canary.describe(),
            stable.describe()
        )
    }
}

/// The canary's window against the stable replicas' over the same time.
pub fn judge(canary: &Window, stable: &Window, limits: &Limits) -> Verdict {
    let (c, s) = (Figures::of(canary), Figures::of(stable));
    if c.requests < limits.min_requests || s.requests < limits.min_requests {
        let why = format!(
            "too few requests to judge: the canary served {:.0}, the stable replicas {:.0} (at least {:.0} each)",
            c.requests, s.requests, limits.min_requests
        );
        return Verdict::TooFew {
            canary: c,
            stable: s,
            why,
        };
    }
    let mut why = Vec::new();
    if c.error_rate > s.error_rate + limits.error_rate_above {
        why.push(format!(
            "aborted requests {:.1} % against {:.1} % on the stable replicas",
            100.0 * c.error_rate,
            100.0 * s.error_rate
        ));
    }
    let pairs = [
        ("TTFT p50", c.ttft_p50_s, s.ttft_p50_s),
        ("TTFT p95", c.ttft_p95_s, s.ttft_p95_s),
        ("ITL p50", c.itl_p50_s, s.itl_p50_s),
        ("ITL p95", c.itl_p95_s, s.itl_p95_s),
    ];
    for (name, canary_s, stable_s) in pairs {
        if let (Some(a), Some(b)) = (canary_s, stable_s) {
            if b > 0.0 && a > b * limits.latency_ratio {
                why.push(format!(
                    "{name} {:.0} ms against {:.0} ms on the stable replicas ({:.2}x, limit {:.2}x)",
                    a * 1000.0,
                    b * 1000.0,
                    a / b,
                    limits.latency_ratio
                ));
            }
        }
    }
    if let (Some(a), Some(b)) = (c.tokens_per_request_s, s.tokens_per_request_s) {
        if a > 0.0 && b > a * limits.latency_ratio {
            why.push(format!(
                "{a:.1} output tokens/s per running request against {b:.1} on the stable replicas ({:.2}x slower, limit {:.2}x)",
                b / a,
                limits.latency_ratio
            ));
        }
    }
    if why.is_empty() {
        Verdict::Passed {
            canary: c,
            stable: s,
        }
    } else {
        Verdict::Worse {
            canary: c,
            stable: s,
            why,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A replica's `/metrics` as prometheus_client writes SGLang's: two series a histogram
    /// (streaming and not), cumulative buckets.
    fn metrics(ttft: [f64; 4], itl: [f64; 4], requests: f64, aborted: f64) -> String {
        let mut text = String::new();
        for (name, counts) in [(TTFT, ttft), (ITL, itl)] {
            text += &format!("# TYPE {name} histogram\n");
            for streaming in ["true", "false"] {
                for (le, c) in ["0.01", "0.1", "1.0", "+Inf"].iter().zip(counts) {
                    text += &format!(
                        "{name}_bucket{{is_streaming=\"{streaming}\",le=\"{le}\",model_name=\"q\"}} {:.1}\n",
                        c / 2.0
                    );
                }
                text += &format!(
                    "{name}_count{{is_streaming=\"{streaming}\",model_name=\"q\"}} {:.1}\n",
                    counts[3] / 2.0
                );
            }
        }
        text += &format!("{REQUESTS}{{is_streaming=\"true\",model_name=\"q\"}} {requests:.1}\n");
        text += &format!("{ABORTED}{{model_name=\"q\"}} {aborted:.1}\n");
        text
    }

    fn snapshot(ttft: [f64; 4], itl: [f64; 4], requests: f64, aborted: f64) -> Snapshot {
        Snapshot::parse(&metrics(ttft, itl, requests, aborted)).unwrap()
    }

    /// What a replica served since it started.
    fn served(ttft: [f64; 4], itl: [f64; 4], requests: f64, aborted: f64) -> Window {
        let start = snapshot([0.0; 4], [0.0; 4], 0.0, 0.0);
        Window::between(&start, &snapshot(ttft, itl, requests, aborted)).unwrap()
    }

    const LIMITS: Limits = Limits {
        min_requests: 50.0,
        error_rate_above: 0.01,
        latency_ratio: 1.25,
    };

    #[test]
    fn quantiles_read_as_prometheus_reads_them() {
        let h = Histogram {
            buckets: vec![(0.1, 50.0), (1.0, 100.0), (f64::INFINITY, 100.0)],
        };
        assert_eq!(quantile(0.5, &h), Some(0.1));
        assert!((quantile(0.75, &h).unwrap() - 0.55).abs() < 1e-9);
        assert!((quantile(0.25, &h).unwrap() - 0.05).abs() < 1e-9);
        let tail = Histogram {
            buckets: vec![(0.1, 0.0), (f64::INFINITY, 10.0)],
        };
        assert_eq!(
            quantile(0.95, &tail),
            Some(0.1),
            "in +Inf: the highest finite bound"
        );
        assert_eq!(quantile(0.5, &Histogram::default()), None);
    }

    #[test]
    fn a_window_is_the_difference_of_two_looks_and_a_restart_spoils_it() {
        let before = snapshot(
            [10.0, 20.0, 20.0, 20.0],
            [100.0, 100.0, 100.0, 100.0],
            20.0,
            0.0,
        );
        let after = snapshot(
            [10.0, 80.0, 120.0, 120.0],
            [200.0, 900.0, 1000.0, 1000.0],
            120.0,
            2.0,
        );
        let w = Window::between(&before, &after).unwrap();
        assert_eq!(w.requests, 100.0);
        assert_eq!(w.aborted, 2.0);
        assert_eq!(
            w.ttft.buckets,
            [
                (0.01, 0.0),
                (0.1, 60.0),
                (1.0, 100.0),
                (f64::INFINITY, 100.0)
            ]
        );
        // Restarted in the window: its counters began again.
        assert_eq!(Window::between(&after, &before), None);
    }

    #[test]
    fn a_canary_slower_or_failing_beyond_the_limits_is_worse_and_says_how() {
        // Stable: most first tokens under 0.1 s. Canary: most between 0.1 and 1 s, and 5 % aborted.
        let stable = served(
            [50.0, 190.0, 200.0, 200.0],
            [900.0, 1000.0, 1000.0, 1000.0],
            200.0,
            0.0,
        );
        let slow = served(
            [0.0, 20.0, 100.0, 100.0],
            [900.0, 1000.0, 1000.0, 1000.0],
            100.0,
            5.0,
        );
        let Verdict::Worse { why, .. } = judge(&slow, &stable, &LIMITS) else {
            panic!("{:?}", judge(&slow, &stable, &LIMITS))
        };
        assert!(
            why[0].starts_with("aborted requests 5.0 % against 0.0 %"),
            "{why:?}"
        );
        assert!(why.iter().any(|w| w.starts_with("TTFT p50 ")), "{why:?}");
        // The same as the stable replicas: passed.
        let same = served(
            [25.0, 95.0, 100.0, 100.0],
            [450.0, 500.0, 500.0, 500.0],
            100.0,
            0.0,
        );
        assert!(matches!(
            judge(&same, &stable, &LIMITS),
            Verdict::Passed { .. }
        ));
        // Too few requests: no verdict on the canary.
        let few = served([0.0, 2.0, 10.0, 10.0], [0.0; 4], 10.0, 0.0);
        let Verdict::TooFew { why, .. } = judge(&few, &stable, &LIMITS) else {
            panic!()
        };
        assert!(
            why.starts_with("too few requests to judge: the canary served 10"),
            "{why}"
        );
    }

    #[test]
    fn a_verdict_says_itself_then_both_sides_figures() {
        let stable = served([50.0, 190.0, 200.0, 200.0], [0.0; 4], 200.0, 0.0);
        let slow = served([0.0, 20.0, 100.0, 100.0], [0.0; 4], 100.0, 5.0);
        let text = judge(&slow, &stable, &LIMITS).describe();
        assert!(
            text.starts_with("worse than the stable replicas: aborted requests 5.0 %"),
            "{text}"
        );
        assert!(
            text.contains("(canary: 100 requests, 5.0 % aborted, TTFT p50/p95 ")
                && text.contains("; stable: 200 requests, 0.0 % aborted, ")
                && text.ends_with("ITL p50/p95 -/- ms, - tokens/s per request)"),
            "{text}"
        );
        let few = served([0.0, 2.0, 10.0, 10.0], [0.0; 4], 10.0, 0.0);
        assert!(judge(&few, &stable, &LIMITS)
            .describe()
            .contains("; the canary stays (canary: 10 requests"));
    }

    #[test]
    fn the_real_servers_metrics_read() {
        // The real SGLang 0.5.23 after four chat completions and its own warmup and health
        // requests (fixtures/metrics/README.md).
        let text = include_str!("../../fixtures/metrics/sglang-0.5.23-cpu.prom");
        let s = Snapshot::parse(text).unwrap();
        assert_eq!((s.requests, s.aborted), (5.0, 0.0));
        // Both `is_streaming` series add up; the buckets are SGLang's.
        assert_eq!(s.ttft.count(), 5.0);
        assert_eq!(s.ttft.buckets.first(), Some(&(0.1, 5.0)));
        assert_eq!(s.ttft.buckets.len(), 19, "0.1 s to 400 s, and +Inf");
        assert_eq!(s.itl.count(), 14.0);
        let f = Figures::of(&Window::between(&Snapshot::default(), &s).unwrap());
        assert!(f.ttft_p95_s.is_some_and(|q| q > 0.0 && q <= 0.1), "{f:?}");
        // 40 output tokens over 0.101 s in flight, both `is_streaming` series.
        let per_request = 40.0 / (0.0717384950039559 + 0.029627231000631582);
        assert!(
            f.tokens_per_request_s
                .is_some_and(|t| (t - per_request).abs() < 1e-6),
            "{f:?}"
        );
    }

    #[test]
    fn a_canary_whose_requests_each_get_fewer_tokens_a_second_is_worse() {
        let with = |tokens: f64, seconds: f64| Window {
            generated_tokens: tokens,
            request_seconds: seconds,
            ..served([0.0, 100.0, 100.0, 100.0], [0.0; 4], 100.0, 0.0)
        };
        // 5,000 tokens over 100 request-seconds on the stable side: 50 tokens/s each.
        let stable = with(5000.0, 100.0);
        let Verdict::Worse { why, .. } = judge(&with(1000.0, 100.0), &stable, &LIMITS) else {
            panic!("a fifth of the throughput passed")
        };
        assert_eq!(
            why,
            ["10.0 output tokens/s per running request against 50.0 on the stable replicas (5.00x slower, limit 1.25x)"]
        );
        assert!(matches!(
            judge(&with(4500.0, 100.0), &stable, &LIMITS),
            Verdict::Passed { .. }
        ));
    }

    #[test]
    fn the_stable_side_is_every_stable_replica_at_once() {
        let one = served([10.0, 20.0, 20.0, 20.0], [0.0; 4], 20.0, 1.0);
        let both = Window::merged(&[one.clone(), one]).unwrap();
        assert_eq!((both.requests, both.aborted), (40.0, 2.0));
        assert_eq!(both.ttft.count(), 40.0);
    }
}
