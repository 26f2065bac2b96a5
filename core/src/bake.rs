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

/// How much worse than the stable replicas the canary may be, and how sure the bake must be.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Fewer requests than this on either side, and nothing shown worse: too few to show the
    /// canary is no worse (inconclusive). A difference the ranks show is judged on fewer.
    pub min_requests: f64,
    /// The canary's error rate may exceed the stable one by this much (0.01: one point).
    pub error_rate_above: f64,
    /// The canary's TTFT and inter-token latency quantiles may be this many times the stable
    /// ones (1.5: half as slow again).
    pub latency_ratio: f64,
    /// The canary's output tokens per second per running request may be this many times lower.
    pub throughput_ratio: f64,
    /// How sure a test must be that the canary is worse (0.99): a one-sided test at 0.99 is
    /// what Kayenta's judge asks with its two-sided 98 % interval excluding "no difference"
    /// on the worse side (`NetflixACAJudge`: `MannWhitneyClassifier(confLevel = 0.98)`).
    pub confidence: f64,
}

/// Fewer observations than this on either side and the rank test is not taken: its normal
/// approximation is the textbooks' choice above about ten a side (Siegel and Castellan,
/// *Nonparametric Statistics*, 6.4), and exact tables below, which ties in buckets rule out.
pub const MIN_RANKED: f64 = 10.0;

/// The three results of a bake, as Argo Rollouts' analysis has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Not worse, on enough requests to show it: the rollout goes on.
    Passed,
    /// Worse beyond a limit and beyond chance, or restarted during the window: rolled back,
    /// and the rollout stops.
    Failed,
    /// The bake could not tell (too few requests, a look that could not be taken, a stable
    /// replica that restarted): the canary stays and the rollout pauses for the operator.
    Inconclusive,
}

impl Verdict {
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Passed => "passed",
            Verdict::Failed => "failed",
            Verdict::Inconclusive => "inconclusive",
        }
    }
}

/// A latency compared by ranks: the Mann-Whitney U test of the canary's observations against
/// the stable replicas', from their histograms' buckets.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Ranked {
    /// `ttft` or `itl`.
    pub metric: &'static str,
    /// How often a canary observation is slower than a stable one (ties count half): U over
    /// the pairs. 0.5 when the two are alike, 1 when every canary one is slower.
    pub slower_share: f64,
    /// The chance of ranks at least this far to the canary's slow side if both came from one
    /// distribution (one-sided, normal approximation with ties and continuity corrected).
    pub p_value: f64,
}

/// The bake's verdict, why, and both sides' figures where there were any.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Judged {
    pub verdict: Verdict,
    /// Each reason it failed, or the one reason it could not tell; empty when it passed.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub why: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub canary: Option<Figures>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stable: Option<Figures>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ranked: Vec<Ranked>,
}

impl Judged {
    /// A bake that failed without figures to show: the canary restarted in the window.
    pub fn failed(why: String) -> Judged {
        Judged {
            verdict: Verdict::Failed,
            why: vec![why],
            canary: None,
            stable: None,
            ranked: Vec::new(),
        }
    }

    /// A bake that could not judge: a look not taken, a stable replica restarted.
    pub fn inconclusive(why: String) -> Judged {
        Judged {
            verdict: Verdict::Inconclusive,
            why: vec![why],
            canary: None,
            stable: None,
            ranked: Vec::new(),
        }
    }

    /// What the report says: the verdict, why, then each side's figures.
    pub fn describe(&self) -> String {
        let said = match self.verdict {
            Verdict::Passed => "passed".to_string(),
            Verdict::Failed => format!("failed: {}", self.why.join("; ")),
            Verdict::Inconclusive => format!(
                "inconclusive: {}; the canary stays and the rollout pauses",
                self.why.join("; ")
            ),
        };
        match (&self.canary, &self.stable) {
            (Some(canary), Some(stable)) => format!(
                "{said} (canary: {}; stable: {})",
                canary.describe(),
                stable.describe()
            ),
            _ => said,
        }
    }
}

/// Per-bucket counts of a cumulative histogram.
fn counts(h: &Histogram) -> Vec<f64> {
    let mut below = 0.0;
    h.buckets
        .iter()
        .map(|&(_, cumulative)| {
            let n = (cumulative - below).max(0.0);
            below = cumulative.max(below);
            n
        })
        .collect()
}

/// The Mann-Whitney U test that the canary's observations run slower than the stable ones',
/// from two histograms with the same buckets: two observations in one bucket are a tie, which
/// is all the buckets can say of them. U counts, for each canary observation, the stable ones
/// in lower buckets and half those in its own; its variance is corrected for the ties (Lehmann,
/// *Nonparametrics*, 1975, 1.4). `None` with fewer than [`MIN_RANKED`] a side, or other buckets.
pub fn rank_test(metric: &'static str, canary: &Histogram, stable: &Histogram) -> Option<Ranked> {
    let same_bounds = canary.buckets.len() == stable.buckets.len()
        && canary
            .buckets
            .iter()
            .zip(&stable.buckets)
            .all(|(a, b)| a.0 == b.0);
    let (n1, n2) = (canary.count(), stable.count());
    if !same_bounds || n1 < MIN_RANKED || n2 < MIN_RANKED {
        return None;
    }
    let (c, s) = (counts(canary), counts(stable));
    let mut stable_below = 0.0;
    let mut u = 0.0;
    let mut ties = 0.0;
    for (ci, si) in c.iter().zip(&s) {
        u += ci * (stable_below + si / 2.0);
        stable_below += si;
        let t = ci + si;
        ties += t * t * t - t;
    }
    let n = n1 + n2;
    let mean = n1 * n2 / 2.0;
    let variance = n1 * n2 / 12.0 * ((n + 1.0) - ties / (n * (n - 1.0)));
    let p_value = if variance <= 0.0 {
        // Every observation in one bucket: the buckets show no difference.
        1.0
    } else {
        let z = (u - mean - 0.5) / variance.sqrt();
        upper_tail(z)
    };
    Some(Ranked {
        metric,
        slower_share: u / (n1 * n2),
        p_value,
    })
}

/// P(Z > z) of the standard normal distribution.
fn upper_tail(z: f64) -> f64 {
    0.5 * libm::erfc(z / std::f64::consts::SQRT_2)
}

/// The one-sided two-proportion z test that the canary aborts more requests than the stable
/// replicas: its p-value, 1 when neither side aborted any.
fn proportion_test(aborted_c: f64, n_c: f64, aborted_s: f64, n_s: f64) -> f64 {
    let pooled = (aborted_c + aborted_s) / (n_c + n_s);
    let variance = pooled * (1.0 - pooled) * (1.0 / n_c + 1.0 / n_s);
    if n_c <= 0.0 || n_s <= 0.0 || variance <= 0.0 {
        return 1.0;
    }
    upper_tail((aborted_c / n_c - aborted_s / n_s) / variance.sqrt())
}

/// `p < 0.0001` or `p = 0.0032`.
fn p_text(p: f64) -> String {
    if p < 1e-4 {
        "p < 0.0001".into()
    } else {
        format!("p = {p:.4}")
    }
}

/// The canary's window against the stable replicas' over the same time. Failed only where a
/// difference is both beyond its limit and beyond what chance makes of these samples; passed
/// only on enough requests to show it; inconclusive in between.
pub fn judge(canary: &Window, stable: &Window, limits: &Limits) -> Judged {
    let (c, s) = (Figures::of(canary), Figures::of(stable));
    let alpha = 1.0 - limits.confidence;
    let mut why = Vec::new();
    if c.error_rate > s.error_rate + limits.error_rate_above {
        let p = proportion_test(
            canary.aborted,
            canary.requests,
            stable.aborted,
            stable.requests,
        );
        if p < alpha {
            why.push(format!(
                "aborted requests {:.1} % against {:.1} % on the stable replicas ({})",
                100.0 * c.error_rate,
                100.0 * s.error_rate,
                p_text(p)
            ));
        }
    }
    let mut ranked = Vec::new();
    let latencies = [
        (
            "ttft",
            "TTFT",
            &canary.ttft,
            &stable.ttft,
            [c.ttft_p50_s, c.ttft_p95_s],
            [s.ttft_p50_s, s.ttft_p95_s],
        ),
        (
            "itl",
            "ITL",
            &canary.itl,
            &stable.itl,
            [c.itl_p50_s, c.itl_p95_s],
            [s.itl_p50_s, s.itl_p95_s],
        ),
    ];
    for (metric, name, canary_h, stable_h, canary_q, stable_q) in latencies {
        let Some(test) = rank_test(metric, canary_h, stable_h) else {
            continue;
        };
        if test.p_value < alpha {
            // Beyond chance; worse only where a quantile is beyond the limit as well.
            for ((q, a), b) in ["p50", "p95"].iter().zip(canary_q).zip(stable_q) {
                if let (Some(a), Some(b)) = (a, b) {
                    if b > 0.0 && a > b * limits.latency_ratio {
                        why.push(format!(
                            "{name} {q} {:.0} ms against {:.0} ms on the stable replicas ({:.2}x, limit {:.2}x; ranks {:.0} % slower, {})",
                            a * 1000.0,
                            b * 1000.0,
                            a / b,
                            limits.latency_ratio,
                            100.0 * test.slower_share,
                            p_text(test.p_value)
                        ));
                    }
                }
            }
        }
        ranked.push(test);
    }
    let enough = c.requests >= limits.min_requests && s.requests >= limits.min_requests;
    // A ratio of two sums has no samples to rank: judged on enough requests only.
    if let (true, Some(a), Some(b)) = (enough, c.tokens_per_request_s, s.tokens_per_request_s) {
        if a > 0.0 && b > a * limits.throughput_ratio {
            why.push(format!(
                "{a:.1} output tokens/s per running request against {b:.1} on the stable replicas ({:.2}x slower, limit {:.2}x)",
                b / a,
                limits.throughput_ratio
            ));
        }
    }
    let verdict = if !why.is_empty() {
        Verdict::Failed
    } else if !enough {
        why.push(format!(
            "too few requests to show the canary is no worse: it served {:.0}, the stable replicas {:.0} (at least {:.0} each), and nothing they served shows it worse",
            c.requests, s.requests, limits.min_requests
        ));
        Verdict::Inconclusive
    } else {
        Verdict::Passed
    };
    Judged {
        verdict,
        why,
        canary: Some(c),
        stable: Some(s),
        ranked,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::assert_any_starts;

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
        throughput_ratio: 1.25,
        confidence: 0.99,
    };

    /// SGLang 0.5.23's TTFT buckets (`metrics_collector.py`), and `+Inf`.
    const TTFT_BOUNDS: [f64; 19] = [
        0.1,
        0.2,
        0.4,
        0.6,
        0.8,
        1.0,
        2.0,
        4.0,
        6.0,
        8.0,
        10.0,
        20.0,
        40.0,
        60.0,
        80.0,
        100.0,
        200.0,
        400.0,
        f64::INFINITY,
    ];

    /// A window of `requests` whose first tokens fell `per_bucket` (upper bound, count) into
    /// SGLang's TTFT buckets, nothing aborted.
    fn first_tokens(per_bucket: &[(f64, f64)]) -> Window {
        let mut cumulative = 0.0;
        let buckets = TTFT_BOUNDS
            .iter()
            .map(|&le| {
                cumulative += per_bucket
                    .iter()
                    .filter(|(b, _)| *b == le)
                    .map(|(_, n)| n)
                    .sum::<f64>();
                (le, cumulative)
            })
            .collect();
        Window {
            ttft: Histogram { buckets },
            itl: Histogram::default(),
            requests: cumulative,
            aborted: 0.0,
            generated_tokens: 0.0,
            request_seconds: 0.0,
        }
    }

    fn defaults() -> Limits {
        crate::manifest::BakeSpec::lasting(std::time::Duration::from_secs(150)).limits()
    }

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
        let judged = judge(&slow, &stable, &LIMITS);
        assert_eq!(judged.verdict, Verdict::Failed, "{judged:?}");
        let why = judged.why;
        assert!(
            why[0].starts_with(
                "aborted requests 5.0 % against 0.0 % on the stable replicas (p = 0.00"
            ),
            "{why:?}"
        );
        assert_any_starts(&why, "TTFT p50 ");
        // The same as the stable replicas: passed.
        let same = served(
            [25.0, 95.0, 100.0, 100.0],
            [450.0, 500.0, 500.0, 500.0],
            100.0,
            0.0,
        );
        assert_eq!(judge(&same, &stable, &LIMITS).verdict, Verdict::Passed);
        // Too few requests, served as the stable ones were: the bake cannot tell.
        let few = served([2.0, 9.0, 10.0, 10.0], [0.0; 4], 10.0, 0.0);
        let judged = judge(&few, &stable, &LIMITS);
        assert_eq!(judged.verdict, Verdict::Inconclusive);
        assert!(
            judged.why[0]
                .starts_with("too few requests to show the canary is no worse: it served 10,"),
            "{judged:?}"
        );
    }

    #[test]
    fn a_verdict_says_itself_then_both_sides_figures() {
        let stable = served([50.0, 190.0, 200.0, 200.0], [0.0; 4], 200.0, 0.0);
        let slow = served([0.0, 20.0, 100.0, 100.0], [0.0; 4], 100.0, 5.0);
        let text = judge(&slow, &stable, &LIMITS).describe();
        assert!(text.starts_with("failed: aborted requests 5.0 %"), "{text}");
        assert!(
            text.contains("(canary: 100 requests, 5.0 % aborted, TTFT p50/p95 ")
                && text.contains("; stable: 200 requests, 0.0 % aborted, ")
                && text.ends_with("ITL p50/p95 -/- ms, - tokens/s per request)"),
            "{text}"
        );
        let few = served([2.0, 9.0, 10.0, 10.0], [0.0; 4], 10.0, 0.0);
        assert!(judge(&few, &stable, &LIMITS)
            .describe()
            .contains("; the canary stays and the rollout pauses (canary: 10 requests"));
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
        let judged = judge(&with(1000.0, 100.0), &stable, &LIMITS);
        assert_eq!(
            judged.verdict,
            Verdict::Failed,
            "a fifth of the throughput passed"
        );
        assert_eq!(
            judged.why,
            ["10.0 output tokens/s per running request against 50.0 on the stable replicas (5.00x slower, limit 1.25x)"]
        );
        assert_eq!(
            judge(&with(4500.0, 100.0), &stable, &LIMITS).verdict,
            Verdict::Passed
        );
    }

    #[test]
    fn the_stable_side_is_every_stable_replica_at_once() {
        let one = served([10.0, 20.0, 20.0, 20.0], [0.0; 4], 20.0, 1.0);
        let both = Window::merged(&[one.clone(), one]).unwrap();
        assert_eq!((both.requests, both.aborted), (40.0, 2.0));
        assert_eq!(both.ttft.count(), 40.0);
    }
    /// The first run (real replicas behind the router, four client streams, a 150 s
    /// bake, the defaults): a canary that queues (`max-running-requests: 1`) read TTFT p50
    /// 4,909 ms on 56 requests against 142 ms on 63. Too few for the old count (100 each);
    /// beyond any doubt for the ranks.
    #[test]
    fn a_canary_thirty_five_times_slower_fails_on_fifty_six_requests() {
        let canary = first_tokens(&[(4.0, 6.0), (6.0, 50.0)]);
        let stable = first_tokens(&[(0.1, 3.0), (0.2, 60.0)]);
        let judged = judge(&canary, &stable, &defaults());
        assert_eq!(judged.verdict, Verdict::Failed, "{judged:?}");
        assert!(
            judged.why[0].starts_with("TTFT p50 ")
                && judged.why[0].contains("ranks 100 % slower, p < 0.0001)"),
            "{:?}",
            judged.why
        );
        assert_eq!(judged.ranked[0].metric, "ttft");
    }

    /// The second run (`min_requests: 10`, a 40 s bake): a neutral change read TTFT
    /// p95 1.86x the stable side's on 37 requests against 40, a few slow requests on a canary
    /// whose prefix cache was empty. The ranks see nothing beyond chance: passed on enough
    /// requests, inconclusive where the manifest asks for more.
    #[test]
    fn a_neutral_change_whose_p95_stands_on_two_requests_is_not_failed() {
        let canary = first_tokens(&[(0.2, 30.0), (0.4, 5.0), (0.6, 2.0)]);
        let stable = first_tokens(&[(0.2, 37.0), (0.4, 3.0)]);
        let c = Figures::of(&canary);
        let s = Figures::of(&stable);
        let ratio = c.ttft_p95_s.unwrap() / s.ttft_p95_s.unwrap();
        assert!(
            ratio > 1.5,
            "the p95 alone is past the default limit: {ratio}"
        );
        let few = Limits {
            min_requests: 10.0,
            ..defaults()
        };
        let judged = judge(&canary, &stable, &few);
        assert_eq!(judged.verdict, Verdict::Passed, "{judged:?}");
        assert!(judged.ranked[0].p_value > 0.01, "{judged:?}");
        assert_eq!(
            judge(&canary, &stable, &defaults()).verdict,
            Verdict::Inconclusive
        );
    }

    #[test]
    fn a_difference_beyond_chance_but_within_the_limit_passes() {
        // A thousand requests a side, a tenth of them one bucket slower on the canary: the
        // ranks are sure, the median 1.17x, within 1.25x.
        let canary = first_tokens(&[(0.2, 400.0), (0.4, 600.0)]);
        let stable = first_tokens(&[(0.2, 500.0), (0.4, 500.0)]);
        let judged = judge(&canary, &stable, &LIMITS);
        assert!(judged.ranked[0].p_value < 0.01, "{judged:?}");
        assert_eq!(judged.verdict, Verdict::Passed, "{judged:?}");
    }

    #[test]
    fn the_rank_test_is_even_on_one_distribution_and_needs_ten_a_side() {
        let one = first_tokens(&[(0.1, 20.0), (0.2, 20.0), (0.4, 10.0)]);
        let test = rank_test("ttft", &one.ttft, &one.ttft).unwrap();
        assert!((test.slower_share - 0.5).abs() < 1e-12, "{test:?}");
        assert!(test.p_value > 0.4 && test.p_value < 0.6, "{test:?}");
        // Every observation in one bucket: nothing to rank.
        let tied = first_tokens(&[(0.2, 20.0)]);
        assert_eq!(
            rank_test("ttft", &tied.ttft, &tied.ttft).unwrap().p_value,
            1.0
        );
        let nine = first_tokens(&[(0.2, 9.0)]);
        assert_eq!(rank_test("ttft", &nine.ttft, &one.ttft), None);
        // Faster on the canary: not worse, however sure.
        let fast = first_tokens(&[(0.1, 50.0)]);
        let slow = first_tokens(&[(1.0, 50.0)]);
        assert!(rank_test("ttft", &fast.ttft, &slow.ttft).unwrap().p_value > 0.99);
        assert!(rank_test("ttft", &slow.ttft, &fast.ttft).unwrap().p_value < 1e-6);
    }

    #[test]
    fn more_aborted_requests_fail_only_beyond_chance() {
        let with = |aborted: f64, requests: f64| Window {
            aborted,
            requests,
            ..first_tokens(&[(0.2, requests)])
        };
        // 2 of 60 against none of 60: 3.3 points above, within what chance makes of 60.
        assert_eq!(
            judge(&with(2.0, 60.0), &with(0.0, 60.0), &LIMITS).verdict,
            Verdict::Passed
        );
        // 12 of 60: beyond it.
        let judged = judge(&with(12.0, 60.0), &with(0.0, 60.0), &LIMITS);
        assert_eq!(judged.verdict, Verdict::Failed, "{judged:?}");
    }
}
