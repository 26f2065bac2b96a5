//! The quality stage's verdict: the new server's figures against the reference's, held to the
//! threshold from the noise floor and to the pass-rate drop the manifest allows.

use serde::{Deserialize, Serialize};

use super::{
    settings_key, threshold, Comparison, LongTask, NeedleRate, QualitySpec, Rate, Reference,
    TaskRate, TextComparison,
};

/// What the quality stage came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// Within the threshold and the allowed drops.
    Passed,
    /// The KL mean over the threshold, a pass rate dropped too far, or the check could not run.
    Failed,
    /// No reference with these settings: the new server's figures become the reference.
    Recorded,
    /// A reference exists, but nothing was compared with it (its tokens were not scored, and no
    /// pass rate is in common).
    NotCompared,
}

/// A pass rate now and in the reference.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RateChange {
    /// The long-context task.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub task: Option<LongTask>,
    /// The prompt length, for the needle check and the long-context tasks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub length: Option<u32>,
    pub now: Rate,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub before: Option<Rate>,
    /// Dropped by more than `max_pass_drop` points.
    pub dropped: bool,
}

/// The quality stage's result, as the JSON report and the deployment history carry it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QualityReport {
    pub verdict: Verdict,
    /// Whether a failure fails the stage (`gate`).
    pub gate: bool,
    /// One line for the stage.
    pub detail: String,
    /// Every failure, each a sentence (also when the gate is off).
    pub reasons: Vec<String>,
    /// What the binary adds that is no failure (a reference that did not read, a floor that could
    /// not be measured); empty from [`judge`].
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// The new server's scores of the reference's tokens.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comparison: Option<Comparison>,
    /// The old server's own KL over the reference; `None`: not measured (0 used).
    pub floor: Option<f64>,
    pub threshold: f64,
    /// The new server's distributions over the fixed texts against the reference's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub texts: Option<TextComparison>,
    /// The old server's own KL over the reference's texts; `None`: not measured (0 used).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub text_floor: Option<f64>,
    pub text_threshold: f64,
    /// Per prompt length, now and before.
    pub needle: Vec<RateChange>,
    /// Per long-context task and length, now and before (items found of items asked).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub long_context: Vec<RateChange>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cases: Option<RateChange>,
    /// What the measurement cost, filled in by the binary: the wall time, the server's own time
    /// on the requests (their `e2e_latency`), and the client's (building and reading them).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cost: Option<Cost>,
    /// Wall seconds the old server spent before the restart on the floors (and on a reference,
    /// when there was none), filled in by the binary: server time, though no stage holds it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub before_seconds: Option<f64>,
}

/// Seconds a measurement took, and whose they were.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Cost {
    pub wall_seconds: f64,
    pub server_seconds: f64,
    pub client_seconds: f64,
}

impl QualityReport {
    /// The stage fails: a failure with the gate on.
    pub fn fails(&self) -> bool {
        self.gate && self.verdict == Verdict::Failed
    }

    /// What the deployment record keeps of it, for `history`: the verdict, the KL mean and the
    /// pass rates (the needle's summed over lengths).
    pub fn figures(&self) -> QualityFigures {
        let verdict = serde_json::to_value(self.verdict)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        let needle = (!self.needle.is_empty()).then(|| {
            self.needle
                .iter()
                .fold((0, 0), |(p, t), n| (p + n.now.passed, t + n.now.total))
        });
        QualityFigures {
            verdict,
            kl_mean: self.comparison.as_ref().map(|c| c.mean_kl),
            text_kl_mean: self.texts.as_ref().map(|t| t.mean_kl),
            needle_passed: needle.map(|n| n.0),
            needle_total: needle.map(|n| n.1),
            cases_passed: self.cases.as_ref().map(|c| c.now.passed),
            cases_total: self.cases.as_ref().map(|c| c.now.total),
        }
    }

    /// A check that could not run at all (the server did not answer, an answer did not read).
    pub fn could_not_run(spec: &QualitySpec, why: &str) -> QualityReport {
        let gate_off = if spec.gate { "" } else { GATE_OFF };
        QualityReport {
            verdict: Verdict::Failed,
            gate: spec.gate,
            detail: format!("the quality check could not run{gate_off}: {why}"),
            reasons: vec![format!("the quality check could not run: {why}")],
            notes: Vec::new(),
            comparison: None,
            floor: None,
            threshold: threshold(0.0, spec),
            texts: None,
            text_floor: None,
            text_threshold: threshold(0.0, spec),
            needle: Vec::new(),
            long_context: Vec::new(),
            cases: None,
            cost: None,
            before_seconds: None,
        }
    }
}

/// What the new server measured, for [`judge`].
#[derive(Debug, Clone, Default)]
pub struct Measures<'a> {
    /// Its scores of the reference's greedy tokens, and its own greedy tokens; `None`: not scored.
    pub greedy: Option<Comparison>,
    /// Its distributions over the reference's texts; `None`: not scored.
    pub texts: Option<TextComparison>,
    pub needle: &'a [NeedleRate],
    pub long_context: &'a [TaskRate],
    pub cases: Option<Rate>,
}

/// The old server's own run-to-run KL over the reference, each `None` when not measured (the
/// old server was not running, or did not answer): 0 is used, and the detail says so.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Floors {
    pub greedy: Option<f64>,
    pub text: Option<f64>,
}

const GATE_OFF: &str = " (gate off: not rolled back)";

/// Judges the new server's figures against `reference`, the one stored under this spec's
/// settings key (one whose key is not this spec's for its model is taken as none). `floors`: the
/// old server's own KL over the reference. Each KL mean is held under its threshold
/// `max(floor x factor, min_kl)`, each pass rate within `max_pass_drop` points of the
/// reference's.
pub fn judge(
    spec: &QualitySpec,
    reference: Option<&Reference>,
    floors: Floors,
    measures: Measures<'_>,
) -> QualityReport {
    let floor = floors.greedy;
    let limit = threshold(floor.unwrap_or(0.0), spec);
    let text_limit = threshold(floors.text.unwrap_or(0.0), spec);
    let stale = reference.is_some_and(|r| r.settings_key != settings_key(spec, &r.model));
    let reference = reference.filter(|_| !stale);
    let change = |task, length, now: Rate, before: Option<Rate>| RateChange {
        task,
        length,
        now,
        before,
        dropped: before.is_some_and(|b| percent(b) - percent(now) > spec.max_pass_drop),
    };
    let needle: Vec<RateChange> = measures
        .needle
        .iter()
        .map(|n| {
            let before = reference
                .and_then(|r| r.needle.iter().find(|b| b.length == n.length))
                .map(NeedleRate::rate);
            change(None, Some(n.length), n.rate(), before)
        })
        .collect();
    let rate = |r: &TaskRate| Rate {
        passed: r.passed,
        total: r.total,
    };
    let long_context: Vec<RateChange> = measures
        .long_context
        .iter()
        .map(|n| {
            let before = reference
                .and_then(|r| {
                    r.long_context
                        .iter()
                        .find(|b| b.task == n.task && b.length == n.length)
                })
                .map(rate);
            change(Some(n.task), Some(n.length), rate(n), before)
        })
        .collect();
    let cases = measures
        .cases
        .map(|now| change(None, None, now, reference.and_then(|r| r.cases)));
    let comparison = measures.greedy.filter(|_| reference.is_some());
    let texts = measures
        .texts
        .filter(|_| reference.is_some_and(|r| !r.texts.is_empty()));

    let mut reasons = Vec::new();
    if let Some(c) = comparison.as_ref().filter(|c| over(c.mean_kl, limit)) {
        reasons.push(format!(
            "{} > {}, {}",
            kl_text(c),
            limit_text(spec, floor, limit),
            identical_text(c)
        ));
    }
    if let Some(t) = texts.as_ref().filter(|t| over(t.mean_kl, text_limit)) {
        reasons.push(format!(
            "{} > {}; moved most: {}",
            text_kl_text(t),
            limit_text(spec, floors.text, text_limit),
            moved_text(t)
        ));
    }
    for n in needle.iter().filter(|n| n.dropped) {
        reasons.push(drop_text(
            &format!("needle at {}", n.length.unwrap_or(0)),
            n,
            spec,
        ));
    }
    for n in long_context.iter().filter(|n| n.dropped) {
        let task = n.task.map_or("", LongTask::name);
        reasons.push(drop_text(
            &format!("long context {task} at {}", n.length.unwrap_or(0)),
            n,
            spec,
        ));
    }
    if let Some(c) = cases.as_ref().filter(|c| c.dropped) {
        reasons.push(drop_text("cases", c, spec));
    }

    let rates = rates_text(&needle, &long_context, cases.as_ref());
    let compared = comparison.is_some()
        || texts.is_some()
        || needle
            .iter()
            .chain(&long_context)
            .any(|n| n.before.is_some())
        || cases.as_ref().is_some_and(|c| c.before.is_some());
    let gate_off = if spec.gate { "" } else { GATE_OFF };
    let (verdict, detail) = if reference.is_none() {
        let why = if stale {
            "the stored one was recorded with other settings"
        } else {
            "nothing to compare with"
        };
        (
            Verdict::Recorded,
            join(format!("reference recorded ({why})"), &rates),
        )
    } else if !reasons.is_empty() {
        (
            Verdict::Failed,
            format!("quality dropped{gate_off}: {}", reasons.join("; ")),
        )
    } else if !compared {
        (
            Verdict::NotCompared,
            join(
                "not compared: the reference's tokens and texts were not scored and no pass rate is in common".into(),
                &rates,
            ),
        )
    } else {
        let kl = match &comparison {
            Some(c) => format!(
                "{} <= {}; {}",
                kl_text(c),
                limit_text(spec, floor, limit),
                identical_text(c)
            ),
            None => "KL not compared".into(),
        };
        let kl = match &texts {
            Some(t) => format!(
                "{kl}; {} <= {}",
                text_kl_text(t),
                limit_text(spec, floors.text, text_limit)
            ),
            None => kl,
        };
        (Verdict::Passed, join(kl, &rates))
    };
    QualityReport {
        verdict,
        gate: spec.gate,
        detail,
        reasons,
        notes: Vec::new(),
        comparison,
        floor,
        threshold: limit,
        texts,
        text_floor: floors.text,
        text_threshold: text_limit,
        needle,
        long_context,
        cases,
        cost: None,
        before_seconds: None,
    }
}

/// Over the threshold, or not a number (a logprob of -inf makes the estimate one).
fn over(kl: f64, limit: f64) -> bool {
    use std::cmp::Ordering::{Equal, Less};
    !matches!(kl.partial_cmp(&limit), Some(Less | Equal))
}

fn percent(r: Rate) -> f64 {
    if r.total == 0 {
        100.0
    } else {
        f64::from(r.passed) * 100.0 / f64::from(r.total)
    }
}

fn join(head: String, rates: &str) -> String {
    if rates.is_empty() {
        head
    } else {
        format!("{head}; {rates}")
    }
}

/// "KL mean 0.0003 (worst 0.0011, prompt 7)".
fn kl_text(c: &Comparison) -> String {
    format!(
        "KL mean {:.4} (worst {:.4}, prompt {})",
        c.mean_kl, c.worst_kl, c.worst_prompt
    )
}

/// "0.002 (floor 0.0000 x 10, min 0.002)".
fn limit_text(spec: &QualitySpec, floor: Option<f64>, limit: f64) -> String {
    let floor = match floor {
        Some(f) => format!("floor {f:.4}"),
        None => "no floor: the old server was not running, 0".into(),
    };
    format!(
        "{} ({floor} x {}, min {})",
        small(limit),
        trim(spec.factor),
        small(spec.min_kl)
    )
}

/// "fixed text: KL mean 0.0235 over 1,612 positions, top token the same at 91.2%".
fn text_kl_text(t: &TextComparison) -> String {
    format!(
        "fixed text: KL mean {:.4} over {} positions, top token the same at {:.1}%",
        t.mean_kl,
        t.positions,
        t.same_top * 100.0
    )
}

/// "text 2 position 318 ' the' (KL 0.93), ...".
fn moved_text(t: &TextComparison) -> String {
    let shown: Vec<String> = t
        .moved_most
        .iter()
        .map(|m| {
            let token = m
                .token
                .as_deref()
                .map(|s| format!(" {s:?}"))
                .unwrap_or_default();
            format!(
                "text {} position {}{token} (KL {:.3})",
                m.text, m.position, m.kl
            )
        })
        .collect();
    shown.join(", ")
}

/// "100.0% of greedy tokens identical", and where they first differ.
fn identical_text(c: &Comparison) -> String {
    let share = format!(
        "{:.1}% of greedy tokens identical",
        c.identical_share * 100.0
    );
    match c.first_divergence {
        Some((prompt, token)) => {
            format!("{share} (first divergence at prompt {prompt}, token {token})")
        }
        None => share,
    }
}

/// "needle 9/9; long context 58/60 (before 60/60); cases 15/16 (before 16/16)".
fn rates_text(
    needle: &[RateChange],
    long_context: &[RateChange],
    cases: Option<&RateChange>,
) -> String {
    let mut parts = Vec::new();
    for (name, changes) in [("needle", needle), ("long context", long_context)] {
        if changes.is_empty() {
            continue;
        }
        let sum = |pick: &dyn Fn(&RateChange) -> Option<Rate>| {
            changes.iter().filter_map(pick).fold(
                Rate {
                    passed: 0,
                    total: 0,
                },
                |a, r| Rate {
                    passed: a.passed + r.passed,
                    total: a.total + r.total,
                },
            )
        };
        let now = sum(&|n| Some(n.now));
        let before = changes
            .iter()
            .any(|n| n.before.is_some())
            .then(|| sum(&|n| n.before));
        parts.push(rate_text(name, now, before));
    }
    if let Some(c) = cases {
        parts.push(rate_text("cases", c.now, c.before));
    }
    parts.join("; ")
}

fn rate_text(name: &str, now: Rate, before: Option<Rate>) -> String {
    match before {
        Some(b) if b != now => format!(
            "{name} {}/{} (before {}/{})",
            now.passed, now.total, b.passed, b.total
        ),
        _ => format!("{name} {}/{}", now.passed, now.total),
    }
}

/// "needle at 16384: 1/3 after 3/3 (-66.7 points, over the 10 allowed)".
fn drop_text(name: &str, c: &RateChange, spec: &QualitySpec) -> String {
    let before = c.before.unwrap_or(c.now);
    format!(
        "{name}: {}/{} after {}/{} ({:+.1} points, over the {} allowed)",
        c.now.passed,
        c.now.total,
        before.passed,
        before.total,
        percent(c.now) - percent(before),
        trim(spec.max_pass_drop)
    )
}

/// `10` rather than `10.0`, `7.5` as it is.
fn trim(x: f64) -> String {
    if x.fract() == 0.0 {
        format!("{x:.0}")
    } else {
        format!("{x}")
    }
}

/// A small figure with at most four decimals and no trailing zeros: `0.002`, `0.0035`.
fn small(x: f64) -> String {
    let s = format!("{x:.4}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "0" && x > 0.0 {
        format!("{x:.1e}")
    } else {
        s.to_string()
    }
}

/// What `history` shows of a deployment's quality stage: the KL against the reference, and the
/// needle's pass rate. Beside the judge that makes it, as `BenchmarkRecord` is beside the
/// benchmark: the record holds one without the quality code importing the record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QualityFigures {
    pub verdict: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kl_mean: Option<f64>,
    /// The mean KL over every position of the fixed texts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text_kl_mean: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needle_passed: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needle_total: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cases_passed: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cases_total: Option<u32>,
}

#[cfg(test)]
mod tests {
    use super::super::{Sequence, REFERENCE_FORMAT};
    use super::*;
    use crate::testing::assert_holds;

    fn spec() -> QualitySpec {
        QualitySpec::default()
    }

    /// The greedy path and the pass rates alone, as the tests before the texts judged them.
    fn judged(
        spec: &QualitySpec,
        reference: Option<&Reference>,
        floor: Option<f64>,
        greedy: Option<Comparison>,
        needle: &[NeedleRate],
        cases: Option<Rate>,
    ) -> QualityReport {
        let floors = Floors {
            greedy: floor,
            text: floor,
        };
        let measures = Measures {
            greedy,
            needle,
            cases,
            ..Measures::default()
        };
        judge(spec, reference, floors, measures)
    }

    fn reference(spec: &QualitySpec) -> Reference {
        Reference {
            format: REFERENCE_FORMAT,
            settings_key: settings_key(spec, "m"),
            model: "m".into(),
            sequences: vec![Sequence {
                prompt_ids: vec![1],
                output_ids: vec![2, 3],
                logprobs: vec![-0.5, -0.25],
            }],
            needle: vec![
                NeedleRate {
                    length: 1024,
                    passed: 3,
                    total: 3,
                },
                NeedleRate {
                    length: 4096,
                    passed: 3,
                    total: 3,
                },
            ],
            cases: Some(Rate {
                passed: 16,
                total: 16,
            }),
            texts: Vec::new(),
            long_context: Vec::new(),
        }
    }

    fn comparison(mean_kl: f64) -> Comparison {
        Comparison {
            mean_kl,
            worst_kl: mean_kl * 3.0,
            worst_prompt: 7,
            identical_share: 1.0,
            first_divergence: None,
        }
    }

    const NEEDLE_OK: [NeedleRate; 2] = [
        NeedleRate {
            length: 1024,
            passed: 3,
            total: 3,
        },
        NeedleRate {
            length: 4096,
            passed: 3,
            total: 3,
        },
    ];
    const CASES_OK: Option<Rate> = Some(Rate {
        passed: 16,
        total: 16,
    });

    #[test]
    fn without_a_reference_the_figures_are_recorded() {
        let s = spec();
        let r = judged(&s, None, None, None, &NEEDLE_OK, CASES_OK);
        assert_eq!(r.verdict, Verdict::Recorded);
        assert_eq!(
            r.detail,
            "reference recorded (nothing to compare with); needle 6/6; cases 16/16"
        );
        assert!(!r.fails() && r.reasons.is_empty());
        // One recorded with other settings is none.
        let other = QualitySpec {
            max_new_tokens: 64,
            ..s.clone()
        };
        let old = reference(&other);
        let r = judged(&s, Some(&old), Some(0.0), Some(comparison(0.5)), &[], None);
        assert_eq!(
            (r.verdict, r.detail.as_str(), r.comparison.is_none()),
            (
                Verdict::Recorded,
                "reference recorded (the stored one was recorded with other settings)",
                true
            )
        );
    }

    #[test]
    fn within_the_threshold_and_the_rates_it_passes() {
        let s = spec();
        let reference = reference(&s);
        let r = judged(
            &s,
            Some(&reference),
            Some(0.00001),
            Some(comparison(0.0003)),
            &NEEDLE_OK,
            CASES_OK,
        );
        assert_eq!(r.verdict, Verdict::Passed);
        assert_eq!(
            r.detail,
            "KL mean 0.0003 (worst 0.0009, prompt 7) <= 0.002 (floor 0.0000 x 10, min 0.002); 100.0% of greedy tokens identical; needle 6/6; cases 16/16"
        );
        assert_eq!(r.threshold, 0.002);
        // A small drop within max_pass_drop (10 points: 15/16 is 6.25 below).
        let fewer = Some(Rate {
            passed: 15,
            total: 16,
        });
        let r = judged(
            &s,
            Some(&reference),
            None,
            Some(comparison(0.0003)),
            &NEEDLE_OK,
            fewer,
        );
        assert_eq!(r.verdict, Verdict::Passed);
        assert_holds(
            &r.detail,
            "(no floor: the old server was not running, 0 x 10, min 0.002)",
        );
        assert!(
            r.detail.ends_with("; cases 15/16 (before 16/16)"),
            "{}",
            r.detail
        );
        // A floor above min_kl raises the threshold.
        let r = judged(
            &s,
            Some(&reference),
            Some(0.0005),
            Some(comparison(0.004)),
            &[],
            None,
        );
        assert_eq!((r.verdict, r.threshold), (Verdict::Passed, 0.005));
        assert!(r
            .detail
            .starts_with("KL mean 0.0040 (worst 0.0120, prompt 7) <= 0.005 (floor 0.0005 x 10"));
    }

    #[test]
    fn a_kl_mean_over_the_threshold_fails_naming_the_worst_prompt_and_the_first_divergence() {
        let s = spec();
        let reference = reference(&s);
        let c = Comparison {
            identical_share: 0.875,
            first_divergence: Some((3, 12)),
            ..comparison(0.015)
        };
        let r = judged(
            &s,
            Some(&reference),
            Some(0.0001),
            Some(c),
            &NEEDLE_OK,
            CASES_OK,
        );
        assert_eq!((r.verdict, r.fails()), (Verdict::Failed, true));
        assert_eq!(
            r.detail,
            "quality dropped: KL mean 0.0150 (worst 0.0450, prompt 7) > 0.002 (floor 0.0001 x 10, min 0.002), 87.5% of greedy tokens identical (first divergence at prompt 3, token 12)"
        );
        assert_eq!(r.reasons.len(), 1);
        let nan = judged(
            &s,
            Some(&reference),
            Some(0.0),
            Some(comparison(f64::NAN)),
            &[],
            None,
        );
        assert_eq!(
            nan.verdict,
            Verdict::Failed,
            "a KL that is not a number fails"
        );
    }

    #[test]
    fn a_needle_or_case_drop_beyond_the_allowance_fails() {
        let s = spec();
        let reference = reference(&s);
        let needle = [
            NeedleRate {
                length: 1024,
                passed: 3,
                total: 3,
            },
            NeedleRate {
                length: 4096,
                passed: 1,
                total: 3,
            },
            NeedleRate {
                length: 16384,
                passed: 0,
                total: 3,
            },
        ];
        let cases = Some(Rate {
            passed: 12,
            total: 16,
        });
        let r = judged(
            &s,
            Some(&reference),
            Some(0.0),
            Some(comparison(0.0)),
            &needle,
            cases,
        );
        assert_eq!(r.verdict, Verdict::Failed);
        assert_eq!(
            r.reasons,
            vec![
                "needle at 4096: 1/3 after 3/3 (-66.7 points, over the 10 allowed)".to_string(),
                "cases: 12/16 after 16/16 (-25.0 points, over the 10 allowed)".to_string(),
            ]
        );
        assert_eq!(
            r.needle[2].before, None,
            "a length the reference lacks is not compared"
        );
        assert!(!r.needle[2].dropped);
        // A drop of exactly max_pass_drop is allowed.
        let loose = QualitySpec {
            max_pass_drop: 25.0,
            ..s.clone()
        };
        let reference = Reference {
            settings_key: settings_key(&loose, "m"),
            ..reference
        };
        let r = judged(&loose, Some(&reference), Some(0.0), None, &NEEDLE_OK, cases);
        assert_eq!(r.verdict, Verdict::Passed);
        assert_eq!(
            r.detail,
            "KL not compared; needle 6/6; cases 12/16 (before 16/16)"
        );
    }

    #[test]
    fn with_the_gate_off_a_failure_is_reported_and_does_not_fail_the_stage() {
        let s = QualitySpec {
            gate: false,
            ..spec()
        };
        let reference = reference(&s);
        let r = judged(
            &s,
            Some(&reference),
            Some(0.0),
            Some(comparison(0.5)),
            &[],
            None,
        );
        assert_eq!(
            (r.verdict, r.fails(), r.reasons.len()),
            (Verdict::Failed, false, 1)
        );
        assert!(
            r.detail
                .starts_with("quality dropped (gate off: not rolled back): KL mean 0.5000"),
            "{}",
            r.detail
        );
        let none = QualityReport::could_not_run(&s, "connection refused");
        assert!(!none.fails());
        assert!(QualityReport::could_not_run(&spec(), "connection refused").fails());
    }

    fn texts(mean_kl: f64) -> TextComparison {
        TextComparison {
            mean_kl,
            positions: 1612,
            per_text: vec![mean_kl],
            same_top: 0.912,
            moved_most: vec![super::super::Moved {
                text: 2,
                position: 318,
                kl: 0.93,
                token: Some(" the".into()),
            }],
        }
    }

    fn with_texts(spec: &QualitySpec) -> Reference {
        let mut r = reference(spec);
        r.texts = vec![super::super::ScoredText {
            ids: vec![1, 2],
            top: vec![super::super::Top(vec![2], vec![-0.1])],
        }];
        r
    }

    #[test]
    fn fixed_texts_that_moved_fail_while_the_greedy_path_passes() {
        let s = spec();
        let reference = with_texts(&s);
        let floors = Floors {
            greedy: Some(0.0),
            text: Some(0.0001),
        };
        let measures = |text_kl| Measures {
            greedy: Some(comparison(0.0003)),
            texts: Some(texts(text_kl)),
            ..Measures::default()
        };
        let r = judge(&s, Some(&reference), floors, measures(0.0235));
        assert_eq!((r.verdict, r.fails()), (Verdict::Failed, true));
        assert_eq!(
            r.reasons,
            vec![
                "fixed text: KL mean 0.0235 over 1612 positions, top token the same at 91.2% > 0.002 (floor 0.0001 x 10, min 0.002); moved most: text 2 position 318 \" the\" (KL 0.930)"
                    .to_string()
            ]
        );
        assert_eq!(r.text_floor, Some(0.0001));
        let ok = judge(&s, Some(&reference), floors, measures(0.0004));
        assert_eq!(ok.verdict, Verdict::Passed);
        assert!(
            ok.detail.ends_with("; fixed text: KL mean 0.0004 over 1612 positions, top token the same at 91.2% <= 0.002 (floor 0.0001 x 10, min 0.002)"),
            "{}",
            ok.detail
        );
        // Each KL has its own floor: a noisy greedy path does not loosen the texts' threshold.
        let noisy_greedy = Floors {
            greedy: Some(0.01),
            text: Some(0.0),
        };
        let r = judge(&s, Some(&reference), noisy_greedy, measures(0.0235));
        assert_eq!((r.threshold, r.text_threshold), (0.1, 0.002));
        assert_eq!(r.verdict, Verdict::Failed);
        // A reference without texts (written before them) compares none.
        let r = judge(
            &s,
            Some(&super::tests::reference(&s)),
            floors,
            measures(0.5),
        );
        assert_eq!((r.verdict, r.texts.is_none()), (Verdict::Passed, true));
    }

    #[test]
    fn a_long_context_task_that_dropped_at_a_length_fails_by_name() {
        let s = spec();
        let mut reference = reference(&s);
        let rate = |task, length, passed| TaskRate {
            task,
            length,
            passed,
            total: 20,
        };
        reference.long_context = vec![
            rate(LongTask::MultiKey, 4096, 2),
            rate(LongTask::VariableTracking, 4096, 20),
            rate(LongTask::VariableTracking, 32768, 18),
        ];
        let now = [
            rate(LongTask::MultiKey, 4096, 2),
            rate(LongTask::VariableTracking, 4096, 20),
            rate(LongTask::VariableTracking, 32768, 9),
        ];
        let measures = Measures {
            long_context: &now,
            ..Measures::default()
        };
        let r = judge(&s, Some(&reference), Floors::default(), measures);
        assert_eq!(r.verdict, Verdict::Failed);
        assert_eq!(
            r.reasons,
            vec!["long context variable_tracking at 32768: 9/20 after 18/20 (-45.0 points, over the 10 allowed)".to_string()]
        );
        // Within the allowance, the rates are summed in the detail.
        let loose = QualitySpec {
            max_pass_drop: 50.0,
            ..s.clone()
        };
        reference.settings_key = settings_key(&loose, "m");
        let measures = Measures {
            long_context: &now,
            ..Measures::default()
        };
        let passed = judge(&loose, Some(&reference), Floors::default(), measures);
        assert_eq!(passed.verdict, Verdict::Passed);
        assert!(
            passed.detail.ends_with("long context 31/60 (before 40/60)"),
            "{}",
            passed.detail
        );
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["long_context"][2]["task"], "variable_tracking");
        assert_eq!(v["long_context"][2]["dropped"], true);
    }

    #[test]
    fn nothing_in_common_is_not_compared() {
        let s = spec();
        let reference = reference(&s);
        let r = judged(
            &s,
            Some(&reference),
            Some(0.0),
            None,
            &[NeedleRate {
                length: 999,
                passed: 3,
                total: 3,
            }],
            None,
        );
        assert_eq!(r.verdict, Verdict::NotCompared);
        assert!(!r.fails());
        assert_eq!(
            r.detail,
            "not compared: the reference's tokens and texts were not scored and no pass rate is in common; needle 3/3"
        );
    }

    #[test]
    fn the_report_serializes_as_reports_carry_it() {
        let s = spec();
        let reference = reference(&s);
        let r = judged(
            &s,
            Some(&reference),
            Some(0.0),
            Some(comparison(0.0)),
            &NEEDLE_OK[..1],
            None,
        );
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["verdict"], "passed");
        assert_eq!(
            v["needle"][0],
            serde_json::json!({"length": 1024, "now": {"passed": 3, "total": 3}, "before": {"passed": 3, "total": 3}, "dropped": false})
        );
        assert_eq!(v["comparison"]["first_divergence"], serde_json::Value::Null);
        assert!(v.get("cases").is_none());
        let f = r.figures();
        assert_eq!(
            (
                f.verdict.as_str(),
                f.kl_mean,
                f.needle_passed,
                f.needle_total,
                f.cases_total
            ),
            ("passed", Some(0.0), Some(3), Some(3), None)
        );
        assert_eq!(small(0.0035), "0.0035");
        assert_eq!(small(0.00001), "1.0e-5");
    }
}
