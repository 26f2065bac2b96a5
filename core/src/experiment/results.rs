//! What an experiment found: each run's figures or failure, the ranking, the drift check between
//! the two baselines, and the report in text, markdown (with a Mermaid `xychart-beta` block a pull
//! request comment renders) and JSON.

use serde::{Deserialize, Serialize};

use super::file::{Constraints, Experiment, Objective};
use crate::benchmark::Level;
use crate::verify::Stage;

/// One run of the experiment: a baseline measurement or a variant.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    pub name: String,
    /// The keys the variant sets (`flags.x: true`); empty for a baseline.
    pub changes: Vec<String>,
    /// `measured`, or `rolled_back` / `failed` with `detail` and `diagnosis`.
    pub status: Status,
    pub detail: String,
    /// The failed stage, when one failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_stage: Option<Stage>,
    /// A known SGLang failure read from the journal: the cause and what to change.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diagnosis: Option<String>,
    pub levels: Vec<Level>,
    /// The quality gate's verdict (`pass`, `fail`, ...), when it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quality: Option<String>,
    /// Wall time of the run, restoring the baseline after it included.
    pub seconds: f64,
    /// What of `seconds` was the server's (loading, verification windows, benchmark, quality)
    /// rather than the experiment's own work (SSH, planning, writing units and state).
    pub server_seconds: f64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Measured,
    /// A stage failed; the baseline was restored and verified.
    RolledBack,
    /// The run failed and the host may need attention (a failed rollback, an unreachable host).
    Failed,
}

impl RunResult {
    pub fn at(&self, concurrency: u32) -> Option<&Level> {
        self.levels.iter().find(|l| l.concurrency == concurrency)
    }

    /// The objective's value, when the run measured it.
    pub fn score(&self, o: &Objective) -> Option<f64> {
        (self.status == Status::Measured)
            .then(|| self.at(o.concurrency).map(|l| o.metric.of(l)))
            .flatten()
    }

    /// The overhead of the experiment itself for this run.
    pub fn overhead(&self) -> f64 {
        (self.seconds - self.server_seconds).max(0.0)
    }

    /// Every constraint this run misses, each a sentence; empty for one that meets them all.
    pub fn misses(&self, c: &Constraints) -> Vec<String> {
        let mut out = Vec::new();
        if self.status != Status::Measured {
            out.push("did not run to the end".to_string());
            return out;
        }
        for l in &self.levels {
            if let Some(max) = c.ttft_p99 {
                let max_ms = max.as_secs_f64() * 1000.0;
                if l.ttft_p99_ms > max_ms {
                    out.push(format!(
                        "TTFT p99 {:.0} ms at {} is over {:.0} ms",
                        l.ttft_p99_ms, l.concurrency, max_ms
                    ));
                }
            }
            if let Some(max) = c.itl_p99 {
                let max_ms = max.as_secs_f64() * 1000.0;
                if l.itl_p99_ms > max_ms {
                    out.push(format!(
                        "ITL p99 {:.1} ms at {} is over {:.1} ms",
                        l.itl_p99_ms, l.concurrency, max_ms
                    ));
                }
            }
            if c.no_errors && l.errors > 0 {
                out.push(format!("{} failed requests at {}", l.errors, l.concurrency));
            }
        }
        if c.quality && self.quality.as_deref() != Some("passed") {
            out.push(format!(
                "quality gate {}",
                self.quality.as_deref().unwrap_or("not run")
            ));
        }
        out
    }
}

/// The two baselines' agreement.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Drift {
    pub first: f64,
    pub last: f64,
    pub percent: f64,
    pub noise_percent: f64,
    pub trusted: bool,
}

pub fn drift(first: &RunResult, last: &RunResult, o: &Objective, noise: f64) -> Option<Drift> {
    let (a, b) = (first.score(o)?, last.score(o)?);
    let percent = if a == 0.0 {
        if b == 0.0 {
            0.0
        } else {
            100.0
        }
    } else {
        (b - a).abs() / a.abs() * 100.0
    };
    Some(Drift {
        first: a,
        last: b,
        percent,
        noise_percent: noise,
        trusted: percent <= noise,
    })
}

/// One row of the ranked table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Ranked {
    /// 1-based place; `None` for a run that missed a constraint or failed.
    pub rank: Option<usize>,
    pub name: String,
    pub score: Option<f64>,
    /// Against the first baseline, in percent (positive: better).
    pub vs_baseline: Option<f64>,
    pub misses: Vec<String>,
}

/// The variants ranked: those meeting every constraint first, best objective first (ties keep
/// the file's order), then those that missed one, then failures.
pub fn rank(variants: &[RunResult], baseline: Option<&RunResult>, e: &Experiment) -> Vec<Ranked> {
    let o = &e.objective;
    let base = baseline.and_then(|b| b.score(o));
    let mut rows: Vec<(usize, Ranked)> = variants
        .iter()
        .map(|v| {
            let score = v.score(o);
            let vs_baseline = match (score, base) {
                (Some(s), Some(b)) if b != 0.0 => {
                    let change = (s - b) / b * 100.0;
                    Some(if o.metric.higher_is_better() {
                        change
                    } else {
                        -change
                    })
                }
                _ => None,
            };
            Ranked {
                rank: None,
                name: v.name.clone(),
                score,
                vs_baseline,
                misses: v.misses(&e.constraints),
            }
        })
        .enumerate()
        .collect();
    let class = |r: &Ranked| match (r.score, r.misses.is_empty()) {
        (Some(_), true) => 0,
        (Some(_), false) => 1,
        _ => 2,
    };
    let better = o.metric.higher_is_better();
    rows.sort_by(|(ia, a), (ib, b)| {
        class(a).cmp(&class(b)).then_with(|| {
            let (sa, sb) = (a.score.unwrap_or(0.0), b.score.unwrap_or(0.0));
            let by = if better {
                sb.partial_cmp(&sa)
            } else {
                sa.partial_cmp(&sb)
            };
            by.unwrap_or(std::cmp::Ordering::Equal).then(ia.cmp(ib))
        })
    });
    let mut place = 0;
    rows.into_iter()
        .map(|(_, mut r)| {
            if class(&r) == 0 {
                place += 1;
                r.rank = Some(place);
            }
            r
        })
        .collect()
}

/// The whole report, as `--format json` prints it and the host keeps it for `--resume`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Report {
    pub service: String,
    pub host: String,
    pub objective: String,
    pub baseline: Option<RunResult>,
    pub variants: Vec<RunResult>,
    pub baseline_end: Option<RunResult>,
    pub ranking: Vec<Ranked>,
    pub drift: Option<Drift>,
    /// The best variant meeting every constraint, when the drift check trusts the ranking.
    pub winner: Option<String>,
    /// What runs on the host at the end: `baseline` or the kept winner.
    pub left_running: String,
    /// Mean of the runs' own overhead (outside load and benchmark), in seconds.
    pub overhead_per_variant: Option<f64>,
    pub interrupted: bool,
}

impl Report {
    pub fn new(e: &Experiment, service: &str) -> Report {
        Report {
            service: service.to_string(),
            host: e.host.clone(),
            objective: format!(
                "{} at concurrency {}",
                e.objective.metric.label(),
                e.objective.concurrency
            ),
            baseline: None,
            variants: Vec::new(),
            baseline_end: None,
            ranking: Vec::new(),
            drift: None,
            winner: None,
            left_running: "baseline".into(),
            overhead_per_variant: None,
            interrupted: false,
        }
    }

    /// Ranks, checks drift and picks the winner from what was measured.
    pub fn conclude(&mut self, e: &Experiment) {
        self.ranking = rank(&self.variants, self.baseline.as_ref(), e);
        self.drift = match (&self.baseline, &self.baseline_end) {
            (Some(a), Some(b)) => drift(a, b, &e.objective, e.noise_percent),
            _ => None,
        };
        let trusted = self.drift.as_ref().is_some_and(|d| d.trusted);
        self.winner = if trusted {
            self.ranking
                .iter()
                .find(|r| r.rank == Some(1))
                .map(|r| r.name.clone())
        } else {
            None
        };
        let overheads: Vec<f64> = self.variants.iter().map(RunResult::overhead).collect();
        self.overhead_per_variant =
            (!overheads.is_empty()).then(|| overheads.iter().sum::<f64>() / overheads.len() as f64);
    }

    fn result(&self, name: &str) -> Option<&RunResult> {
        self.variants.iter().find(|v| v.name == name)
    }

    fn rows(&self) -> Vec<[String; 7]> {
        let mut rows = Vec::new();
        if let Some(b) = &self.baseline {
            rows.push(row("-", b, None, "baseline (first)"));
        }
        for r in &self.ranking {
            let Some(v) = self.result(&r.name) else {
                continue;
            };
            let note = if let Some(d) = &v.diagnosis {
                format!("{}: {}", status_text(v), d)
            } else if v.status != Status::Measured {
                format!("{}: {}", status_text(v), v.detail)
            } else if !r.misses.is_empty() {
                format!("misses: {}", r.misses.join("; "))
            } else {
                "meets every constraint".into()
            };
            let place = r.rank.map_or("-".into(), |n| n.to_string());
            rows.push(row(&place, v, r.vs_baseline, &note));
        }
        if let Some(b) = &self.baseline_end {
            rows.push(row("-", b, None, "baseline (last)"));
        }
        rows
    }

    /// The ranked table for a terminal.
    pub fn text(&self) -> String {
        let header = [
            "rank",
            "run",
            "change",
            "objective",
            "vs base",
            "quality",
            "note",
        ];
        let rows = self.rows();
        let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
        for r in &rows {
            for (w, c) in widths.iter_mut().zip(r.iter()) {
                *w = (*w).max(c.chars().count());
            }
        }
        let line = |cells: &[String]| {
            let mut s = String::new();
            for (i, (c, w)) in cells.iter().zip(&widths).enumerate() {
                if i + 1 == cells.len() {
                    s.push_str(c);
                } else {
                    s.push_str(&format!("{c:<w$}  "));
                }
            }
            s.trim_end().to_string() + "\n"
        };
        let mut out = format!(
            "experiment {} on {}: {}\n",
            self.service, self.host, self.objective
        );
        out.push_str(&line(&header.map(String::from)));
        for r in &rows {
            out.push_str(&line(r));
        }
        out.push_str(&self.summary());
        out
    }

    /// The closing lines: drift, winner, what runs now, overhead.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        match &self.drift {
            Some(d) => out.push_str(&format!(
                "drift: baseline {:.1} then {:.1} ({:.1} %, noise {:.1} %): ranking {}\n",
                d.first,
                d.last,
                d.percent,
                d.noise_percent,
                if d.trusted { "trusted" } else { "NOT trusted" }
            )),
            None => {
                out.push_str("drift: the baseline was not measured twice: ranking not trusted\n")
            }
        }
        match &self.winner {
            Some(w) => out.push_str(&format!("winner: {w}\n")),
            None => out.push_str("winner: none\n"),
        }
        out.push_str(&format!("running now: {}\n", self.left_running));
        if let Some(o) = self.overhead_per_variant {
            out.push_str(&format!(
                "overhead per variant (outside load, verification windows, benchmark and quality): {o:.2} s\n"
            ));
        }
        if self.interrupted {
            out.push_str("interrupted: the baseline was restored; `--resume` runs the rest\n");
        }
        out
    }

    /// The table as markdown, with the chart as a Mermaid block, for a pull request.
    pub fn markdown(&self, levels: &[u32]) -> String {
        let mut out = format!(
            "### Experiment: {} on {}\n\nObjective: {}\n\n| rank | run | change | objective | vs base | quality | note |\n|---|---|---|---|---|---|---|\n",
            self.service, self.host, self.objective
        );
        for r in self.rows() {
            let cells: Vec<String> = r.iter().map(|c| c.replace('|', "\\|")).collect();
            out.push_str(&format!("| {} |\n", cells.join(" | ")));
        }
        out.push('\n');
        for l in self.summary().lines() {
            out.push_str(&format!("- {l}\n"));
        }
        out.push_str(&format!("\n```mermaid\n{}```\n", self.mermaid(levels)));
        out
    }

    /// The series of the chart: each run that measured, its tok/s per level.
    pub fn series(&self, levels: &[u32]) -> Vec<(String, Vec<f64>)> {
        let mut runs: Vec<&RunResult> = Vec::new();
        runs.extend(self.baseline.iter());
        runs.extend(self.variants.iter());
        runs.into_iter()
            .filter(|r| r.status == Status::Measured)
            .map(|r| {
                let ys = levels
                    .iter()
                    .map(|c| r.at(*c).map_or(0.0, |l| l.output_tokens_per_s))
                    .collect();
                (r.name.clone(), ys)
            })
            .collect()
    }

    /// A Mermaid `xychart-beta`: output tok/s against concurrency, one line per run. Mermaid
    /// draws no legend for xychart, so the title lists the lines in order.
    pub fn mermaid(&self, levels: &[u32]) -> String {
        let series = self.series(levels);
        let max = series
            .iter()
            .flat_map(|(_, ys)| ys.iter().copied())
            .fold(0.0f64, f64::max);
        let names: Vec<String> = series.iter().map(|(n, _)| n.replace('"', "'")).collect();
        let mut out = format!(
            "xychart-beta\n    title \"output tok/s by concurrency: {}\"\n    x-axis \"concurrency\" [{}]\n    y-axis \"output tok/s\" 0 --> {}\n",
            names.join(", "),
            levels.iter().map(u32::to_string).collect::<Vec<_>>().join(", "),
            nice_ceiling(max)
        );
        for (_, ys) in &series {
            out.push_str(&format!(
                "    line [{}]\n",
                ys.iter()
                    .map(|y| format!("{y:.1}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        out
    }
}

fn status_text(v: &RunResult) -> String {
    match (v.status, &v.failed_stage) {
        (Status::RolledBack, Some(s)) => format!("rolled back at {s}"),
        (Status::RolledBack, None) => "rolled back".into(),
        (Status::Failed, _) => "failed".into(),
        (Status::Measured, _) => "measured".into(),
    }
}

fn row(place: &str, v: &RunResult, vs: Option<f64>, note: &str) -> [String; 7] {
    let objective = v
        .levels
        .iter()
        .map(|l| {
            format!(
                "{}@{}",
                crate::benchmark::thousands(l.output_tokens_per_s),
                l.concurrency
            )
        })
        .collect::<Vec<_>>()
        .join(" ");
    [
        place.to_string(),
        v.name.clone(),
        if v.changes.is_empty() {
            "-".into()
        } else {
            v.changes.join(", ")
        },
        if objective.is_empty() {
            "-".into()
        } else {
            objective
        },
        vs.map_or("-".into(), |p| format!("{p:+.1} %")),
        v.quality.clone().unwrap_or_else(|| "-".into()),
        note.to_string(),
    ]
}

/// The axis top: the next 1, 2 or 5 times a power of ten above `max`.
pub fn nice_ceiling(max: f64) -> f64 {
    if max <= 0.0 {
        return 1.0;
    }
    let power = 10f64.powf(max.log10().floor());
    for step in [1.0, 2.0, 5.0, 10.0] {
        if step * power >= max {
            return step * power;
        }
    }
    10.0 * power
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::experiment::file::parse;

    pub fn level(c: u32, tps: f64, ttft: f64) -> Level {
        Level {
            concurrency: c,
            output_tokens_per_s: tps,
            requests_per_s: tps / 16.0,
            ttft_p50_ms: ttft / 2.0,
            ttft_p99_ms: ttft,
            itl_p50_ms: 1.0,
            itl_p99_ms: 2.0,
            errors: 0,
            spec_accept_length: None,
        }
    }

    pub fn run(name: &str, status: Status, tps: f64, quality: &str) -> RunResult {
        RunResult {
            name: name.into(),
            changes: vec![format!("flags.{name}: true")],
            status,
            detail: "d".into(),
            failed_stage: (status != Status::Measured).then_some(Stage::CrashWindow),
            diagnosis: None,
            levels: if status == Status::Measured {
                vec![level(1, tps / 3.0, 50.0), level(4, tps, 80.0)]
            } else {
                Vec::new()
            },
            quality: Some(quality.into()),
            seconds: 12.0,
            server_seconds: 10.5,
        }
    }

    pub fn experiment() -> Experiment {
        parse(
            "e.yaml",
            "manifest: m.yaml\nhost: h\nbenchmark: { levels: [1, 4] }\nobjective: { metric: output_tokens_per_s, concurrency: 4 }\nconstraints: { ttft_p99: 2s, quality: true }\nvariants:\n  - { name: a, flags: { a: true } }\n",
        )
        .unwrap()
    }

    fn report() -> Report {
        let e = experiment();
        let mut r = Report::new(&e, "svc");
        r.baseline = Some(RunResult {
            changes: vec![],
            ..run("baseline", Status::Measured, 800.0, "passed")
        });
        r.variants = vec![
            run("slow", Status::Measured, 400.0, "passed"),
            run("crash", Status::RolledBack, 0.0, "-"),
            run("noisy", Status::Measured, 900.0, "fail"),
            run("fast", Status::Measured, 1600.0, "passed"),
        ];
        r.baseline_end = Some(RunResult {
            changes: vec![],
            ..run("baseline", Status::Measured, 810.0, "passed")
        });
        r.conclude(&e);
        r
    }

    #[test]
    fn the_ranking_puts_constraint_misses_and_failures_last() {
        let r = report();
        let order: Vec<_> = r
            .ranking
            .iter()
            .map(|x| (x.name.as_str(), x.rank))
            .collect();
        assert_eq!(
            order,
            [
                ("fast", Some(1)),
                ("slow", Some(2)),
                ("noisy", None),
                ("crash", None)
            ]
        );
        assert_eq!(r.ranking[0].vs_baseline.map(|v| v.round()), Some(100.0));
        assert_eq!(r.ranking[2].misses, ["quality gate fail"]);
        assert_eq!(r.winner.as_deref(), Some("fast"));
        assert!(r.drift.as_ref().unwrap().trusted);
        assert_eq!(r.overhead_per_variant, Some(1.5));
    }

    #[test]
    fn drift_beyond_the_noise_withholds_the_winner() {
        let mut r = report();
        r.baseline_end.as_mut().unwrap().levels = vec![level(4, 600.0, 80.0)];
        r.conclude(&experiment());
        assert!(!r.drift.as_ref().unwrap().trusted);
        assert_eq!(r.winner, None);
        assert!(r.text().contains("ranking NOT trusted"), "{}", r.text());
    }

    #[test]
    fn a_latency_constraint_is_checked_at_every_level() {
        let mut v = run("x", Status::Measured, 100.0, "passed");
        v.levels[0].ttft_p99_ms = 2500.0;
        assert_eq!(
            v.misses(&experiment().constraints),
            ["TTFT p99 2500 ms at 1 is over 2000 ms"]
        );
    }

    #[test]
    fn markdown_has_the_table_and_a_mermaid_chart_of_every_measured_run() {
        let md = report().markdown(&[1, 4]);
        assert!(md.contains("| 1 | fast | flags.fast: true |"), "{md}");
        assert!(md.contains("```mermaid\nxychart-beta\n"), "{md}");
        assert!(md.contains("x-axis \"concurrency\" [1, 4]"), "{md}");
        assert!(md.contains("y-axis \"output tok/s\" 0 --> 2000"), "{md}");
        // baseline, slow, noisy, fast: the crashed variant has no line.
        assert_eq!(md.matches("    line [").count(), 4, "{md}");
        assert!(md.contains("    line [533.3, 1600.0]"), "{md}");
    }

    #[test]
    fn the_report_round_trips_through_json_for_resume() {
        let r = report();
        let back: Report = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }
}
