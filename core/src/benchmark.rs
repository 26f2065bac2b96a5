//! The throughput gate's pure part: what makes two benchmarks comparable (the settings key), the
//! per-level figures from raw samples, the seeded prompt, and the comparison with the previous
//! deployment's figures. Running the requests is the binary's (`bench`).

use serde::{Deserialize, Serialize};

use crate::manifest::BenchmarkSpec;

/// The figures of one concurrency level.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Level {
    pub concurrency: u32,
    /// Generated tokens of all requests over the level's wall time.
    pub output_tokens_per_s: f64,
    pub requests_per_s: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    pub itl_p50_ms: f64,
    pub itl_p99_ms: f64,
    /// Requests that failed (an HTTP error, a broken stream, no token).
    pub errors: u32,
    /// With speculative decoding: the server's mean acceptance length after the level
    /// (`sglang:spec_accept_length` on `/metrics`, served with `--enable-metrics`), so a change of
    /// speculative flags shows it before and after.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_accept_length: Option<f64>,
}

/// What a deployment record keeps of a benchmark.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchmarkRecord {
    /// Only figures with the same key are compared: see [`settings_key`].
    pub settings_key: String,
    pub levels: Vec<Level>,
}

impl BenchmarkRecord {
    /// The level with the highest concurrency, as history shows it.
    pub fn highest(&self) -> Option<&Level> {
        self.levels.iter().max_by_key(|l| l.concurrency)
    }
}

/// Everything that changes the numbers: the levels, the prompt and output lengths, and how much
/// each level runs. Two benchmarks compare only when their keys are equal.
pub fn settings_key(spec: &BenchmarkSpec) -> String {
    let levels: Vec<String> = spec.levels.iter().map(u32::to_string).collect();
    let amount = match spec.duration {
        Some(d) => format!("duration {}ms", d.as_millis()),
        None => {
            let requests: Vec<String> = spec
                .levels
                .iter()
                .map(|l| spec.requests_at(*l).to_string())
                .collect();
            format!("requests {}", requests.join(","))
        }
    };
    format!(
        "v1 levels {} prompt {} output {} {amount}",
        levels.join(","),
        spec.prompt_tokens,
        spec.output_tokens
    )
}

/// A prompt of `words` words, the same for every run with the same `seed` (a linear congruential
/// generator over a fixed word list; no clock, no randomness).
pub fn prompt(seed: u64, words: u32) -> String {
    const WORDS: [&str; 32] = [
        "river", "stone", "cloud", "lamp", "garden", "window", "paper", "engine", "forest",
        "signal", "bridge", "candle", "market", "orbit", "silver", "harbor", "meadow", "pencil",
        "thunder", "valley", "copper", "lantern", "island", "mirror", "rocket", "season", "shadow",
        "timber", "violet", "winter", "yellow", "zephyr",
    ];
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let mut out = String::with_capacity(words as usize * 7);
    for i in 0..words {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        if i > 0 {
            out.push(' ');
        }
        out.push_str(WORDS[(state >> 59) as usize]);
    }
    out
}

/// The `p`th percentile (0-100) of `samples` by nearest rank; 0 for no samples.
pub fn percentile(samples: &[f64], p: f64) -> f64 {
    let mut sorted: Vec<f64> = samples.iter().copied().filter(|s| s.is_finite()).collect();
    if sorted.is_empty() {
        return 0.0;
    }
    sorted.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// One finished request, as the client measured it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestSample {
    /// Time to the first content chunk, in ms.
    pub ttft_ms: Option<f64>,
    /// Gaps between content chunks, in ms.
    pub itl_ms: Vec<f64>,
    /// Generated tokens (`usage.completion_tokens`, or the content chunks without it).
    pub tokens: u64,
    /// Why it failed, when it did.
    pub error: Option<String>,
}

/// A level's figures from its requests and its wall time.
pub fn level(concurrency: u32, samples: &[RequestSample], wall_seconds: f64) -> Level {
    let ok: Vec<&RequestSample> = samples.iter().filter(|s| s.error.is_none()).collect();
    let tokens: u64 = ok.iter().map(|s| s.tokens).sum();
    let ttft: Vec<f64> = ok.iter().filter_map(|s| s.ttft_ms).collect();
    let itl: Vec<f64> = ok.iter().flat_map(|s| s.itl_ms.iter().copied()).collect();
    let wall = wall_seconds.max(1e-9);
    let round = |x: f64| (x * 10.0).round() / 10.0;
    Level {
        concurrency,
        output_tokens_per_s: round(tokens as f64 / wall),
        requests_per_s: (ok.len() as f64 / wall * 1000.0).round() / 1000.0,
        ttft_p50_ms: round(percentile(&ttft, 50.0)),
        ttft_p99_ms: round(percentile(&ttft, 99.0)),
        itl_p50_ms: round(percentile(&itl, 50.0)),
        itl_p99_ms: round(percentile(&itl, 99.0)),
        errors: (samples.len() - ok.len()) as u32,
        spec_accept_length: None,
    }
}

/// `sglang:spec_accept_length` from a `/metrics` text: a gauge of SGLang 0.5.23's
/// `observability/metrics_collector.py` ("Mean acceptance length of speculative decoding
/// (accepted drafts + bonus token per forward)", multiprocess mode `mostrecent`), one sample per
/// label set; the largest is taken (one per DP rank). `None` when absent or 0 (no speculative
/// decoding ran).
pub fn spec_accept_length(metrics: &str) -> Option<f64> {
    metrics
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let rest = l.strip_prefix("sglang:spec_accept_length")?;
            if !(rest.starts_with('{') || rest.starts_with(' ')) {
                return None;
            }
            let value = rest.rsplit(' ').next()?.parse::<f64>().ok()?;
            value.is_finite().then_some(value)
        })
        .fold(None, |max: Option<f64>, v| {
            Some(max.map_or(v, |m| m.max(v)))
        })
        .filter(|v| *v > 0.0)
}

/// One level compared with the previous figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LevelChange {
    pub concurrency: u32,
    pub previous_tokens_per_s: f64,
    pub tokens_per_s: f64,
    /// Percent change of output tokens/s (negative: slower).
    pub change_percent: f64,
    pub regressed: bool,
    /// Speculative decoding's acceptance length before and after, when either server had one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub spec_accept_length: Option<(Option<f64>, Option<f64>)>,
}

/// The current figures against the previous deployment's.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    pub levels: Vec<LevelChange>,
    /// Levels measured now that the previous figures do not have (not compared).
    pub new_levels: Vec<u32>,
    pub max_regression: f64,
}

impl Comparison {
    pub fn regressed(&self) -> bool {
        self.levels.iter().any(|l| l.regressed)
    }

    /// "+6.2% at 64, -23.5% at 16 (over the 10% allowed)".
    pub fn text(&self) -> String {
        let parts: Vec<String> = self
            .levels
            .iter()
            .map(|l| {
                let over = if l.regressed {
                    format!(" (over the {}% allowed)", trim(self.max_regression))
                } else {
                    String::new()
                };
                let accept = match l.spec_accept_length {
                    Some((before, now)) => {
                        let shown =
                            |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
                        format!(" (accept length {} -> {})", shown(before), shown(now))
                    }
                    None => String::new(),
                };
                format!(
                    "{:+.1}% at {}{over}{accept}",
                    l.change_percent, l.concurrency
                )
            })
            .collect();
        if parts.is_empty() {
            "no level in common".into()
        } else {
            parts.join(", ")
        }
    }
}

/// `10` rather than `10.0`, `7.5` as it is.
fn trim(x: f64) -> String {
    if x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        format!("{x}")
    }
}

/// Level by level, output tokens/s now against before; a drop beyond `max_regression` percent at
/// any level is a regression.
pub fn compare(previous: &[Level], current: &[Level], max_regression: f64) -> Comparison {
    let mut levels = Vec::new();
    let mut new_levels = Vec::new();
    for now in current {
        let Some(before) = previous.iter().find(|p| p.concurrency == now.concurrency) else {
            new_levels.push(now.concurrency);
            continue;
        };
        let change = if before.output_tokens_per_s > 0.0 {
            (now.output_tokens_per_s - before.output_tokens_per_s) / before.output_tokens_per_s
                * 100.0
        } else {
            0.0
        };
        let change = (change * 10.0).round() / 10.0;
        levels.push(LevelChange {
            concurrency: now.concurrency,
            previous_tokens_per_s: before.output_tokens_per_s,
            tokens_per_s: now.output_tokens_per_s,
            change_percent: change,
            regressed: -change > max_regression,
            spec_accept_length: (before.spec_accept_length.is_some()
                || now.spec_accept_length.is_some())
            .then_some((before.spec_accept_length, now.spec_accept_length)),
        });
    }
    Comparison {
        levels,
        new_levels,
        max_regression,
    }
}

/// `1,540` for 1540.4: tokens/s as reports show them.
pub fn thousands(x: f64) -> String {
    let n = x.round().max(0.0) as u64;
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// "1: 210 tok/s, 16: 1,540 tok/s" for a report line.
pub fn summary(levels: &[Level]) -> String {
    levels
        .iter()
        .map(|l| {
            format!(
                "{}: {} tok/s",
                l.concurrency,
                thousands(l.output_tokens_per_s)
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the benchmark stage came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// No comparable previous figures: these are the baseline.
    Baseline,
    /// Within `max_regression` of the previous figures at every level.
    Passed,
    /// A drop beyond `max_regression` at some level.
    Regressed,
    /// Requests failed, or the benchmark could not run.
    Failed,
}

/// The benchmark stage's result, as reports show it (`benchmark` of a unit's JSON).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchmarkReport {
    pub verdict: Verdict,
    /// Whether a regression or a failure fails the stage (`gate`).
    pub gate: bool,
    pub detail: String,
    /// The figures measured (empty when it could not run).
    pub settings_key: String,
    pub levels: Vec<Level>,
    /// Against the previous deployment's figures, when they were comparable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comparison: Option<Comparison>,
}

impl BenchmarkReport {
    /// The stage fails: a regression or failed requests, with the gate on.
    pub fn fails(&self) -> bool {
        self.gate && matches!(self.verdict, Verdict::Regressed | Verdict::Failed)
    }

    /// The figures to keep in the deployment record.
    pub fn record(&self) -> Option<BenchmarkRecord> {
        (!self.levels.is_empty()).then(|| BenchmarkRecord {
            settings_key: self.settings_key.clone(),
            levels: self.levels.clone(),
        })
    }

    /// A benchmark that could not run at all (no connection to the server, interrupted).
    pub fn could_not_run(spec: &BenchmarkSpec, why: &str) -> BenchmarkReport {
        BenchmarkReport {
            verdict: Verdict::Failed,
            gate: spec.gate,
            detail: format!("the benchmark could not run: {why}"),
            settings_key: settings_key(spec),
            levels: Vec::new(),
            comparison: None,
        }
    }
}

/// Judges the figures `measured` with `spec` against the previous deployment's (`previous`).
/// `first_error` is the first failed request's reason, when one failed.
pub fn judge(
    spec: &BenchmarkSpec,
    measured: BenchmarkRecord,
    previous: Option<&BenchmarkRecord>,
    first_error: Option<&str>,
) -> BenchmarkReport {
    let figures = summary(&measured.levels);
    let failed: Vec<String> = measured
        .levels
        .iter()
        .filter(|l| l.errors > 0)
        .map(|l| format!("{} at {}", l.errors, l.concurrency))
        .collect();
    let comparable = previous.filter(|p| p.settings_key == measured.settings_key);
    let comparison = comparable.map(|p| compare(&p.levels, &measured.levels, spec.max_regression));
    let gate_off = if spec.gate {
        ""
    } else {
        " (gate off: not rolled back)"
    };
    let (verdict, detail) = if !failed.is_empty() {
        (
            Verdict::Failed,
            format!(
                "requests failed ({}){gate_off}: {}",
                failed.join(", "),
                first_error.unwrap_or("unknown error")
            ),
        )
    } else {
        match &comparison {
            None if previous.is_some_and(|p| p.settings_key != measured.settings_key) => (
                Verdict::Baseline,
                format!("baseline recorded (the previous figures were measured with other settings): {figures}"),
            ),
            None => (Verdict::Baseline, format!("baseline recorded: {figures}")),
            Some(c) if c.regressed() => (
                Verdict::Regressed,
                format!("throughput regressed{gate_off}: {}", c.text()),
            ),
            Some(c) => (
                Verdict::Passed,
                format!(
                    "throughput within {}% of the previous deployment: {} ({figures})",
                    trim(spec.max_regression),
                    c.text()
                ),
            ),
        }
    };
    BenchmarkReport {
        verdict,
        gate: spec.gate,
        detail,
        settings_key: measured.settings_key,
        levels: measured.levels,
        comparison,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::assert_holds;
    use std::time::Duration;

    fn at(concurrency: u32, tokens_per_s: f64) -> Level {
        Level {
            concurrency,
            output_tokens_per_s: tokens_per_s,
            requests_per_s: 1.0,
            ttft_p50_ms: 20.0,
            ttft_p99_ms: 30.0,
            itl_p50_ms: 5.0,
            itl_p99_ms: 9.0,
            errors: 0,
            spec_accept_length: None,
        }
    }

    #[test]
    fn the_accept_length_is_read_from_sglangs_gauge() {
        let metrics = "# HELP sglang:spec_accept_length Mean acceptance length\n# TYPE sglang:spec_accept_length gauge\nsglang:spec_accept_length{model_name=\"m\",engine_type=\"unified\",tp_rank=\"0\"} 2.75\nsglang:spec_accept_rate{model_name=\"m\"} 0.6\nsglang:spec_accept_length_total 9\n";
        assert_eq!(spec_accept_length(metrics), Some(2.75));
        assert_eq!(spec_accept_length("sglang:num_running_reqs{} 0.0\n"), None);
        assert_eq!(
            spec_accept_length("sglang:spec_accept_length{a=\"1\"} 0.0\n"),
            None
        );
    }

    #[test]
    fn the_key_changes_with_everything_that_changes_the_numbers() {
        let spec = BenchmarkSpec::default();
        assert_eq!(
            settings_key(&spec),
            "v1 levels 1,16,64 prompt 128 output 128 requests 8,64,256"
        );
        let same = BenchmarkSpec {
            max_regression: 5.0,
            gate: false,
            ..spec.clone()
        };
        assert_eq!(settings_key(&same), settings_key(&spec));
        for other in [
            BenchmarkSpec {
                levels: vec![1, 16],
                ..spec.clone()
            },
            BenchmarkSpec {
                prompt_tokens: 64,
                ..spec.clone()
            },
            BenchmarkSpec {
                output_tokens: 64,
                ..spec.clone()
            },
            BenchmarkSpec {
                requests: Some(8),
                ..spec.clone()
            },
            BenchmarkSpec {
                duration: Some(Duration::from_secs(30)),
                ..spec.clone()
            },
        ] {
            assert_ne!(settings_key(&other), settings_key(&spec), "{other:?}");
        }
    }

    #[test]
    fn the_prompt_is_seeded_and_has_its_length() {
        let p = prompt(7, 128);
        assert_eq!(p.split(' ').count(), 128);
        assert_eq!(p, prompt(7, 128));
        assert_ne!(p, prompt(8, 128));
        assert_eq!(prompt(1, 0), "");
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let samples: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(percentile(&samples, 50.0), 50.0);
        assert_eq!(percentile(&samples, 99.0), 99.0);
        assert_eq!(percentile(&samples, 100.0), 100.0);
        assert_eq!(percentile(&[3.0], 99.0), 3.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }

    #[test]
    fn a_level_counts_tokens_over_wall_time_and_keeps_errors_apart() {
        let ok = RequestSample {
            ttft_ms: Some(20.0),
            itl_ms: vec![5.0, 5.0, 7.0],
            tokens: 100,
            error: None,
        };
        let bad = RequestSample {
            error: Some("503".into()),
            ..RequestSample::default()
        };
        let l = level(4, &[ok.clone(), ok, bad], 2.0);
        assert_eq!(l.output_tokens_per_s, 100.0);
        assert_eq!(l.requests_per_s, 1.0);
        assert_eq!(
            (l.ttft_p50_ms, l.itl_p50_ms, l.itl_p99_ms),
            (20.0, 5.0, 7.0)
        );
        assert_eq!(l.errors, 1);
    }

    #[test]
    fn a_drop_beyond_the_allowance_at_any_level_regresses() {
        let before = [at(1, 200.0), at(16, 1000.0), at(64, 1500.0)];
        let now = [at(1, 199.0), at(16, 765.0), at(64, 1593.0)];
        let c = compare(&before, &now, 10.0);
        assert!(c.regressed());
        assert_eq!(
            c.text(),
            "-0.5% at 1, -23.5% at 16 (over the 10% allowed), +6.2% at 64"
        );
        let fine = compare(&before, &[at(1, 190.0), at(16, 1000.0)], 10.0);
        assert!(!fine.regressed());
        assert_eq!(fine.text(), "-5.0% at 1, +0.0% at 16");
        let new = compare(&before[..1], &[at(1, 200.0), at(4, 500.0)], 7.5);
        assert_eq!(
            (new.new_levels.as_slice(), new.regressed()),
            (&[4][..], false)
        );
        let down = compare(&before[..1], &[at(1, 170.0)], 7.5);
        assert_eq!(down.text(), "-15.0% at 1 (over the 7.5% allowed)");
    }

    #[test]
    fn tokens_per_second_read_with_thousands() {
        assert_eq!(thousands(1540.4), "1,540");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(1234567.0), "1,234,567");
        assert_eq!(
            summary(&[at(1, 210.0), at(64, 1540.0)]),
            "1: 210 tok/s, 64: 1,540 tok/s"
        );
    }

    #[test]
    fn the_stage_records_a_baseline_passes_or_fails_on_a_regression() {
        let spec = BenchmarkSpec {
            levels: vec![1, 4],
            ..BenchmarkSpec::default()
        };
        let measured = |a, b| BenchmarkRecord {
            settings_key: settings_key(&spec),
            levels: vec![at(1, a), at(4, b)],
        };
        let first = judge(&spec, measured(200.0, 700.0), None, None);
        assert_eq!(first.verdict, Verdict::Baseline);
        assert_eq!(
            first.detail,
            "baseline recorded: 1: 200 tok/s, 4: 700 tok/s"
        );
        assert!(!first.fails() && first.record().is_some());
        let before = first.record().unwrap();

        let faster = judge(&spec, measured(210.0, 800.0), Some(&before), None);
        assert_eq!(faster.verdict, Verdict::Passed);
        assert_eq!(
            faster.detail,
            "throughput within 10% of the previous deployment: +5.0% at 1, +14.3% at 4 (1: 210 tok/s, 4: 800 tok/s)"
        );

        let slower = judge(&spec, measured(100.0, 700.0), Some(&before), None);
        assert_eq!(
            (slower.verdict, slower.fails(), slower.detail.as_str()),
            (
                Verdict::Regressed,
                true,
                "throughput regressed: -50.0% at 1 (over the 10% allowed), +0.0% at 4"
            )
        );
        let off = BenchmarkSpec {
            gate: false,
            ..spec.clone()
        };
        let reported = judge(&off, measured(100.0, 700.0), Some(&before), None);
        assert!(!reported.fails());
        assert!(reported
            .detail
            .starts_with("throughput regressed (gate off: not rolled back): -50.0% at 1"));

        let other = BenchmarkRecord {
            settings_key: "v1 other".into(),
            ..before.clone()
        };
        let rebased = judge(&spec, measured(100.0, 700.0), Some(&other), None);
        assert_eq!(rebased.verdict, Verdict::Baseline);
        assert_holds(&rebased.detail, "other settings");

        let mut broken = measured(100.0, 700.0);
        broken.levels[1].errors = 3;
        let failed = judge(
            &spec,
            broken,
            Some(&before),
            Some("503 Service Unavailable"),
        );
        assert_eq!(
            (failed.verdict, failed.fails(), failed.detail.as_str()),
            (
                Verdict::Failed,
                true,
                "requests failed (3 at 4): 503 Service Unavailable"
            )
        );
        let none = BenchmarkReport::could_not_run(&spec, "connection refused");
        assert!(none.fails() && none.record().is_none());
    }
}
