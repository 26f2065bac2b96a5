//! How long an experiment takes: before it starts, from the unit's learned load time (its past
//! converged loads) and the benchmark's length; live, from what the runs so far really took.

use std::time::Duration;

use crate::manifest::BenchmarkSpec;

/// What one run of a variant costs, in seconds, and what it is made of.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PerRun {
    /// Loading the server (learned, or the manifest's load deadline when nothing is learned).
    pub load: f64,
    /// The crash window after the load.
    pub window: f64,
    /// The benchmark's levels.
    pub benchmark: f64,
    /// The quality gate's measurement (from its last recorded cost, or a guess).
    pub quality: f64,
}

impl PerRun {
    /// A variant is loaded and verified, measured, then the baseline is loaded and verified again.
    pub fn variant(&self) -> f64 {
        2.0 * (self.load + self.window) + self.benchmark + self.quality
    }
}

/// The benchmark's length: per level, its requests at the throughput seen before (`per_request`:
/// seconds one request took alone, at concurrency 1) spread over the level's concurrency. Without
/// a figure seen before, a request is taken as `output_tokens` at 30 tok/s, a slow decode.
pub fn benchmark_seconds(spec: &BenchmarkSpec, per_request: Option<f64>) -> f64 {
    let one = per_request.unwrap_or(spec.output_tokens as f64 / 30.0);
    spec.levels
        .iter()
        .map(|&c| match spec.duration {
            Some(d) => d.as_secs_f64(),
            None => {
                let requests = spec.requests_at(c) as f64;
                (requests / c as f64).ceil() * one
            }
        })
        .sum()
}

/// Before the start: the first baseline's benchmark, every variant, and the last baseline.
pub fn before_start(variants: usize, per: &PerRun) -> Duration {
    let total = per.benchmark + variants as f64 * per.variant() + per.benchmark;
    Duration::from_secs_f64(total.max(0.0))
}

/// Live: the runs left at the mean of those done, and the last baseline's benchmark.
pub fn remaining(done_seconds: &[f64], left: usize, per: &PerRun) -> Duration {
    let each = if done_seconds.is_empty() {
        per.variant()
    } else {
        done_seconds.iter().sum::<f64>() / done_seconds.len() as f64
    };
    Duration::from_secs_f64((each * left as f64 + per.benchmark).max(0.0))
}

/// `about 1 h 50 min`, `about 40 s`: minutes are enough once it is over a few minutes.
pub fn human(d: Duration) -> String {
    let s = d.as_secs_f64().round() as u64;
    if s < 120 {
        format!("about {s} s")
    } else if s < 3600 {
        format!("about {} min", (s + 30) / 60)
    } else {
        let m = (s + 30) / 60;
        format!("about {} h {} min", m / 60, m % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn six_variants_of_a_fifteen_minute_load() {
        let per = PerRun {
            load: 480.0,
            window: 30.0,
            benchmark: 120.0,
            quality: 30.0,
        };
        // 2 x 510 + 150 = 1170 s a variant; x6 plus two baseline benchmarks = 7260 s.
        assert_eq!(before_start(6, &per), Duration::from_secs(7260));
        assert_eq!(human(before_start(6, &per)), "about 2 h 1 min");
        assert_eq!(human(Duration::from_secs(45)), "about 45 s");
        assert_eq!(human(Duration::from_secs(600)), "about 10 min");
        assert_eq!(
            remaining(&[100.0, 200.0], 2, &per),
            Duration::from_secs(420)
        );
    }

    #[test]
    fn the_benchmark_length_follows_requests_and_concurrency() {
        let spec = BenchmarkSpec {
            levels: vec![1, 4],
            requests: Some(8),
            output_tokens: 16,
            ..BenchmarkSpec::default()
        };
        // 8 requests one at a time, then 2 rounds of 4, at 0.5 s each.
        assert_eq!(benchmark_seconds(&spec, Some(0.5)), 5.0);
    }
}
