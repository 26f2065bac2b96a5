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

    /// Every constraint this run misses, each a sentence naming its level; empty for one that
    /// meets them all.
    pub fn misses(&self, c: &Constraints) -> Vec<String> {
        if self.status != Status::Measured {
            return vec!["did not run to the end".to_string()];
        }
        let mut out: Vec<String> = self.levels.iter().flat_map(|l| misses_at(c, l)).collect();
        out.extend(self.quality_miss(c));
        out
    }

    /// What this run misses at `concurrency` (its level's limits, errors, the quality gate);
    /// a run that did not measure that level misses it.
    pub fn misses_at(&self, c: &Constraints, concurrency: u32) -> Vec<String> {
        let Some(l) = self
            .at(concurrency)
            .filter(|_| self.status == Status::Measured)
        else {
            return vec![format!("not measured at {concurrency}")];
        };
        let mut out = misses_at(c, l);
        out.extend(self.quality_miss(c));
        out
    }

    fn quality_miss(&self, c: &Constraints) -> Option<String> {
        (c.quality && self.quality.as_deref() != Some("passed")).then(|| {
            format!(
                "quality gate {}",
                self.quality.as_deref().unwrap_or("not run")
            )
        })
    }
}

/// The limits one level misses, each naming the level.
fn misses_at(c: &Constraints, l: &Level) -> Vec<String> {
    let limits = c.at(l.concurrency);
    // (what, its limit, its value in ms, decimals shown): TTFTs in whole ms, ITLs in tenths.
    let latencies = [
        ("TTFT p99", limits.ttft_p99, l.ttft_p99_ms, 0),
        ("ITL p99", limits.itl_p99, l.itl_p99_ms, 1),
    ];
    let mut out: Vec<String> = latencies
        .into_iter()
        .filter_map(|(what, max, value, decimals)| {
            let max_ms = max?.as_secs_f64() * 1000.0;
            (value > max_ms).then(|| {
                format!(
                    "{what} {value:.decimals$} ms at {} is over {max_ms:.decimals$} ms",
                    l.concurrency
                )
            })
        })
        .collect();
    if c.no_errors && l.errors > 0 {
        out.push(format!("{} failed requests at {}", l.errors, l.concurrency));
    }
    out
}

/// The best run at one concurrency level: among the baseline and the variants that meet that
/// level's constraints, the best by the objective's metric read at that level.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LevelBest {
    pub concurrency: u32,
    /// `None`: no run met that level's constraints.
    pub name: Option<String>,
    pub value: Option<f64>,
}

/// [`LevelBest`] for each of `levels`; ties keep the first run (the baseline first).
pub fn best_per_level(runs: &[&RunResult], e: &Experiment, levels: &[u32]) -> Vec<LevelBest> {
    let metric = e.objective.metric;
    levels
        .iter()
        .map(|&c| {
            let mut best: Option<(&RunResult, f64)> = None;
            for r in runs
                .iter()
                .filter(|r| r.misses_at(&e.constraints, c).is_empty())
            {
                let Some(v) = r.at(c).map(|l| metric.of(l)) else {
                    continue;
                };
                let better = match best {
                    None => true,
                    Some((_, b)) if metric.higher_is_better() => v > b,
                    Some((_, b)) => v < b,
                };
                if better {
                    best = Some((r, v));
                }
            }
            LevelBest {
                concurrency: c,
                name: best.map(|(r, _)| r.name.clone()),
                value: best.map(|(_, v)| v),
            }
        })
        .collect()
}

/// One configuration on the throughput/latency chart: a run at one concurrency level.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TradeOff {
    pub name: String,
    pub concurrency: u32,
    pub output_tokens_per_s: f64,
    /// The chart's latency (see [`trade_off_latency`]), in ms.
    pub latency_ms: f64,
    /// Another configuration has at least its throughput at no more latency, and is better in
    /// one of them: this one is off the Pareto front.
    pub dominated: bool,
}

/// The latency the trade-off is drawn against: the objective's when it is one, else ITL p99,
/// what a higher concurrency costs each stream.
pub fn trade_off_latency(o: &Objective) -> super::file::Metric {
    use super::file::Metric;
    match o.metric {
        Metric::TtftP99Ms => Metric::TtftP99Ms,
        _ => Metric::ItlP99Ms,
    }
}

/// Every measured run at every level, each marked on or off the Pareto front of output tok/s
/// (higher is better) against `latency` (lower is better), across runs and levels: a
/// configuration is both a variant and the concurrency it is run at.
pub fn trade_offs(runs: &[&RunResult], latency: super::file::Metric) -> Vec<TradeOff> {
    let mut points: Vec<TradeOff> = runs
        .iter()
        .filter(|r| r.status == Status::Measured)
        .flat_map(|r| {
            r.levels.iter().map(|l| TradeOff {
                name: r.name.clone(),
                concurrency: l.concurrency,
                output_tokens_per_s: l.output_tokens_per_s,
                latency_ms: latency.of(l),
                dominated: false,
            })
        })
        .collect();
    let dominated: Vec<bool> = points
        .iter()
        .map(|p| {
            points.iter().any(|q| {
                q.output_tokens_per_s >= p.output_tokens_per_s
                    && q.latency_ms <= p.latency_ms
                    && (q.output_tokens_per_s > p.output_tokens_per_s
                        || q.latency_ms < p.latency_ms)
            })
        })
        .collect();
    for (p, d) in points.iter_mut().zip(dominated) {
        p.dominated = d;
    }
    points
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
    /// The best run at each benchmark level, under that level's constraints.
    #[serde(default)]
    pub best_per_level: Vec<LevelBest>,
    /// Every measured run at every level against the trade-off's latency, on or off the Pareto
    /// front.
    #[serde(default)]
    pub trade_offs: Vec<TradeOff>,
    /// The latency the trade-off is drawn against (`ITL p99 ms`, ...).
    #[serde(default)]
    pub trade_off_latency: String,
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
            best_per_level: Vec::new(),
            trade_offs: Vec::new(),
            trade_off_latency: trade_off_latency(&e.objective).label().to_string(),
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
        let runs = self.runs();
        let best = best_per_level(&runs, e, &e.benchmark.levels);
        let points = trade_offs(&runs, trade_off_latency(&e.objective));
        (self.best_per_level, self.trade_offs) = (best, points);
        self.trade_off_latency = trade_off_latency(&e.objective).label().to_string();
        let overheads: Vec<f64> = self.variants.iter().map(RunResult::overhead).collect();
        self.overhead_per_variant =
            (!overheads.is_empty()).then(|| overheads.iter().sum::<f64>() / overheads.len() as f64);
    }

    /// The first baseline, then the variants.
    fn runs(&self) -> Vec<&RunResult> {
        self.baseline.iter().chain(self.variants.iter()).collect()
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
        for b in &self.best_per_level {
            match (&b.name, b.value) {
                (Some(name), Some(v)) => out.push_str(&format!(
                    "best at {}: {name} ({})\n",
                    b.concurrency,
                    shown(v)
                )),
                _ => out.push_str(&format!(
                    "best at {}: none meets that level's constraints\n",
                    b.concurrency
                )),
            }
        }
        if !self.trade_offs.is_empty() {
            let named = |dominated: bool| {
                let list: Vec<String> = self
                    .trade_offs
                    .iter()
                    .filter(|p| p.dominated == dominated)
                    .map(|p| format!("{}@{}", p.name, p.concurrency))
                    .collect();
                if list.is_empty() {
                    "none".to_string()
                } else {
                    list.join(", ")
                }
            };
            out.push_str(&format!(
                "trade-off front (output tok/s against {}): {}; dominated: {}\n",
                self.trade_off_latency,
                named(false),
                named(true)
            ));
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
        if !self.trade_offs.is_empty() {
            out.push_str(&format!("\n```mermaid\n{}```\n", self.trade_off_mermaid()));
        }
        out
    }

    /// A Mermaid `quadrantChart` of the trade-off: each run at each level, latency across and
    /// output tok/s up (both scaled to the chart's 0-1 axes by their largest value), the
    /// Pareto front coloured and the dominated configurations grey.
    pub fn trade_off_mermaid(&self) -> String {
        let max_x = self
            .trade_offs
            .iter()
            .map(|p| p.latency_ms)
            .fold(0.0f64, f64::max);
        let max_y = self
            .trade_offs
            .iter()
            .map(|p| p.output_tokens_per_s)
            .fold(0.0f64, f64::max);
        let scale = |v: f64, max: f64| {
            if max > 0.0 {
                (v / max).clamp(0.0, 1.0)
            } else {
                0.0
            }
        };
        let mut out = format!(
            "quadrantChart\n    title \"output tok/s against {}: the front in colour, dominated in grey\"\n    x-axis \"low {0}\" --> \"high {0}\"\n    y-axis \"low tok/s\" --> \"high tok/s\"\n",
            self.trade_off_latency.replace('"', "'")
        );
        for p in &self.trade_offs {
            let colour = if p.dominated { "#bbbbbb" } else { "#0072B2" };
            out.push_str(&format!(
                "    {} at {}: [{:.3}, {:.3}] color: {colour}, radius: 6\n",
                mermaid_name(&p.name),
                p.concurrency,
                scale(p.latency_ms, max_x),
                scale(p.output_tokens_per_s, max_y)
            ));
        }
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

/// A figure as the summary shows it: thousands separated, or one decimal below 100.
fn shown(v: f64) -> String {
    if v.abs() >= 100.0 {
        crate::benchmark::thousands(v)
    } else {
        format!("{v:.1}")
    }
}

/// A point's name as Mermaid's quadrant chart reads it: letters, digits, spaces and `-._=`.
fn mermaid_name(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_alphanumeric() || " -._=".contains(c) {
                c
            } else {
                ' '
            }
        })
        .collect()
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
    use crate::testing::assert_holds;

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

    /// Three variants and the baseline at an interactive level (1) and a batch level (8), with a
    /// TTFT limit at each: the batch one is looser.
    fn per_level() -> (Experiment, Report) {
        let e = parse(
            "e.yaml",
            "manifest: m.yaml\nhost: h\nbenchmark: { levels: [1, 8] }\nobjective: { metric: output_tokens_per_s, concurrency: 8 }\nconstraints:\n  no_errors: true\n  levels:\n    1: { ttft_p99: 100ms }\n    8: { ttft_p99: 2s }\nvariants:\n  - { name: a, flags: { a: true } }\n",
        )
        .unwrap();
        let measured = |name: &str, l1: (f64, f64, f64), l8: (f64, f64, f64)| {
            let at = |c: u32, (tps, ttft, itl): (f64, f64, f64)| Level {
                itl_p99_ms: itl,
                ..level(c, tps, ttft)
            };
            RunResult {
                levels: vec![at(1, l1), at(8, l8)],
                ..run(name, Status::Measured, 0.0, "passed")
            }
        };
        let mut r = Report::new(&e, "svc");
        // (tok/s, TTFT p99 ms, ITL p99 ms) at 1, then at 8.
        r.baseline = Some(measured(
            "baseline",
            (50.0, 80.0, 20.0),
            (300.0, 900.0, 30.0),
        ));
        r.variants = vec![
            // Fast at 1, slow to first token at 8: best interactive, over the batch limit.
            measured("chunked", (60.0, 70.0, 17.0), (280.0, 2500.0, 29.0)),
            // The batch champion, too slow to first token at 1.
            measured("big-batch", (45.0, 150.0, 22.0), (420.0, 1500.0, 25.0)),
            // Worse than the baseline everywhere.
            measured("worse", (40.0, 90.0, 24.0), (250.0, 1000.0, 35.0)),
        ];
        r.conclude(&e);
        (e, r)
    }

    #[test]
    fn each_level_has_its_own_limits_and_its_own_best_run() {
        let (e, r) = per_level();
        assert_eq!(
            e.constraints.at(1).ttft_p99,
            Some(std::time::Duration::from_millis(100))
        );
        let best: Vec<(u32, Option<&str>)> = r
            .best_per_level
            .iter()
            .map(|b| (b.concurrency, b.name.as_deref()))
            .collect();
        assert_eq!(best, [(1, Some("chunked")), (8, Some("big-batch"))]);
        // Each miss names its constraint and its level.
        let misses = |name: &str| {
            r.ranking
                .iter()
                .find(|x| x.name == name)
                .unwrap()
                .misses
                .clone()
        };
        assert_eq!(misses("chunked"), ["TTFT p99 2500 ms at 8 is over 2000 ms"]);
        assert_eq!(misses("big-batch"), ["TTFT p99 150 ms at 1 is over 100 ms"]);
        let summary = r.summary();
        assert_holds(
            &summary,
            "best at 1: chunked (60.0)\nbest at 8: big-batch (420)\n",
        );
    }

    #[test]
    fn the_trade_off_front_keeps_what_no_other_configuration_beats_on_both() {
        let (_, r) = per_level();
        assert_eq!(r.trade_off_latency, "ITL p99 ms");
        let front: Vec<String> = r
            .trade_offs
            .iter()
            .filter(|p| !p.dominated)
            .map(|p| format!("{}@{}", p.name, p.concurrency))
            .collect();
        // big-batch@8 has the most tok/s; chunked@1 the least ITL; chunked@8 (280 tok/s, 29 ms)
        // and baseline@8 (300, 30) lie between; big-batch@8 (420, 25) beats both.
        assert_eq!(front, ["chunked@1", "big-batch@8"]);
        assert!(r.summary().contains(
            "trade-off front (output tok/s against ITL p99 ms): chunked@1, big-batch@8; dominated: baseline@1, baseline@8, chunked@8, big-batch@1, worse@1, worse@8\n"
        ));
        let chart = r.trade_off_mermaid();
        assert!(chart.starts_with("quadrantChart\n"), "{chart}");
        assert_holds(
            &chart,
            "    big-batch at 8: [0.714, 1.000] color: #0072B2, radius: 6\n",
        );
        assert_holds(
            &chart,
            "    worse at 8: [1.000, 0.595] color: #bbbbbb, radius: 6\n",
        );
        let md = r.markdown(&[1, 8]);
        assert_eq!(md.matches("```mermaid").count(), 2, "{md}");
    }

    #[test]
    fn a_level_limit_for_a_level_the_benchmark_does_not_run_is_refused_where_written() {
        let errors = parse(
            "e.yaml",
            "manifest: m.yaml\nhost: h\nbenchmark: { levels: [1, 8] }\nobjective: { metric: output_tokens_per_s, concurrency: 8 }\nconstraints:\n  levels:\n    4: { ttft_p99: 100ms }\n    8: { itl_p99: soon }\nvariants:\n  - { name: a, flags: { a: true } }\n",
        )
        .unwrap_err()
        .0
        .iter()
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join("\n");
        assert_holds(
            &errors,
            "e.yaml:7:8: constraints.levels.4: 4 is not one of benchmark.levels ([1, 8])",
        );
        assert_holds(
            &errors,
            "e.yaml:8:10: constraints.levels.8.itl_p99: `soon` is not a duration above zero",
        );
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
        assert_holds(&md, "| 1 | fast | flags.fast: true |");
        assert_holds(&md, "```mermaid\nxychart-beta\n");
        assert_holds(&md, "x-axis \"concurrency\" [1, 4]");
        assert_holds(&md, "y-axis \"output tok/s\" 0 --> 2000");
        // baseline, slow, noisy, fast: the crashed variant has no line.
        assert_eq!(md.matches("    line [").count(), 4, "{md}");
        assert_holds(&md, "    line [533.3, 1600.0]");
    }

    #[test]
    fn the_report_round_trips_through_json_for_resume() {
        let r = report();
        let back: Report = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
    }
}
