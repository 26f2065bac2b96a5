//! How far a server's logprobs moved from the reference's over the same tokens: the per-token
//! KL estimate SGLang's precision tests use (`compare_kl_divergence` in
//! `sglang/test/kl_test_utils.py`, 0.5.23), the greedy tokens the new server reproduced, and the
//! threshold the mean is held under.

use serde::Serialize;

use super::{QualitySpec, Reference};

/// The mean over tokens of `(exp(r) - 1) - r`, `r = scored - reference` per token: SGLang's
/// `compare_kl_divergence`, whose `logr = input_logprob - output_logprob` subtracts the
/// generation's logprobs (here the reference's) from the teacher-forced ones (here the new
/// server's). It is the "k3" estimator of KL(reference || new) over tokens drawn from the
/// reference: never negative, 0 only when every logprob is equal, about `r² / 2` for small `r`.
/// Over the tokens both have (zip); 0 for none.
pub fn kl_estimate(reference: &[f64], scored: &[f64]) -> f64 {
    let n = reference.len().min(scored.len());
    if n == 0 {
        return 0.0;
    }
    let sum: f64 = reference
        .iter()
        .zip(scored)
        .map(|(a, b)| {
            let r = b - a;
            r.exp_m1() - r
        })
        .sum();
    sum / n as f64
}

/// The new server against the reference.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    /// The mean over prompts of each prompt's [`kl_estimate`] (as SGLang averages).
    pub mean_kl: f64,
    /// The largest prompt's estimate, and that prompt (0-based, in the prompt set's order).
    pub worst_kl: f64,
    pub worst_prompt: usize,
    /// Of all reference output tokens, the share (0 to 1) the new server's own greedy generation
    /// reproduced at the same position.
    pub identical_share: f64,
    /// The first prompt and token position where the new generation left the reference's.
    pub first_divergence: Option<(usize, usize)>,
}

/// Each prompt's KL estimate: the reference's logprobs of its own tokens against `scored`, the
/// same tokens' logprobs by another run (a prompt it did not score counts as scoring nothing).
fn per_prompt(reference: &Reference, scored: &[Vec<f64>]) -> Vec<f64> {
    reference
        .sequences
        .iter()
        .enumerate()
        .map(|(i, s)| kl_estimate(&s.logprobs, scored.get(i).map_or(&[], Vec::as_slice)))
        .collect()
}

fn mean(estimates: &[f64]) -> f64 {
    if estimates.is_empty() {
        0.0
    } else {
        estimates.iter().sum::<f64>() / estimates.len() as f64
    }
}

/// The mean over prompts of each prompt's KL estimate: [`Comparison::mean_kl`] alone, for the old
/// server's run-to-run noise (the floor).
pub fn mean_kl(reference: &Reference, scored: &[Vec<f64>]) -> f64 {
    mean(&per_prompt(reference, scored))
}

/// Compares the reference with the new server's teacher-forced scores of its tokens (`scored`,
/// one list per sequence: [`super::read_scores`]) and the new server's own greedy generation
/// from the same prompt tokens (`regenerated`). A generation shorter than the reference diverges
/// where it ends; a sequence missing from `scored` counts no tokens.
pub fn compare(reference: &Reference, scored: &[Vec<f64>], regenerated: &[Vec<u32>]) -> Comparison {
    let estimates = per_prompt(reference, scored);
    let (worst_prompt, worst_kl) =
        estimates
            .iter()
            .copied()
            .enumerate()
            .fold(
                (0, 0.0),
                |(wi, w), (i, k)| if k > w || k.is_nan() { (i, k) } else { (wi, w) },
            );
    let mean_kl = mean(&estimates);
    let mut total = 0usize;
    let mut same = 0usize;
    let mut first_divergence = None;
    for (i, s) in reference.sequences.iter().enumerate() {
        let new = regenerated.get(i).map_or(&[][..], Vec::as_slice);
        for (t, id) in s.output_ids.iter().enumerate() {
            total += 1;
            if new.get(t) == Some(id) {
                same += 1;
            } else if first_divergence.is_none() {
                first_divergence = Some((i, t));
            }
        }
    }
    Comparison {
        mean_kl,
        worst_kl,
        worst_prompt,
        identical_share: if total == 0 {
            1.0
        } else {
            same as f64 / total as f64
        },
        first_divergence,
    }
}

/// The most the mean KL may be: `max(floor x factor, min_kl)`. The floor is the old server's own
/// run-to-run KL over the reference, so a deployment whose kernels are not bit-deterministic is
/// allowed its own noise and no more than `factor` times it; `min_kl` keeps a floor of 0 (a
/// deterministic server) from failing on any difference at all.
pub fn threshold(floor: f64, spec: &QualitySpec) -> f64 {
    (floor * spec.factor).max(spec.min_kl)
}

#[cfg(test)]
mod tests {
    use super::super::Sequence;
    use super::*;

    fn reference(logprobs: Vec<Vec<f64>>) -> Reference {
        Reference {
            format: 1,
            settings_key: "k".into(),
            model: "m".into(),
            sequences: logprobs
                .into_iter()
                .map(|l| Sequence {
                    prompt_ids: vec![1],
                    output_ids: (10..10 + l.len() as u32).collect(),
                    logprobs: l,
                })
                .collect(),
            needle: Vec::new(),
            cases: None,
            texts: Vec::new(),
            long_context: Vec::new(),
        }
    }

    #[test]
    fn identical_logprobs_have_no_divergence() {
        let l = [-0.1, -2.0, -0.0001, -7.5];
        assert_eq!(kl_estimate(&l, &l), 0.0);
        assert_eq!(kl_estimate(&[], &[]), 0.0);
    }

    #[test]
    fn a_small_perturbation_gives_the_hand_computed_estimate() {
        // r = -1.1 - (-1.0) = -0.1: e^-0.1 - 1 + 0.1 = 0.0048374180...
        let k = kl_estimate(&[-1.0], &[-1.1]);
        assert!((k - 0.004_837_418_035_959_6).abs() < 1e-15, "{k}");
        // The direction matters: r = +0.1 gives e^0.1 - 1 - 0.1 = 0.0051709180...
        let up = kl_estimate(&[-1.0], &[-0.9]);
        assert!((up - 0.005_170_918_075_647_6).abs() < 1e-15, "{up}");
        // A mean over tokens: one token unchanged halves it.
        let half = kl_estimate(&[-1.0, -0.5], &[-1.1, -0.5]);
        assert!((half - 0.004_837_418_035_959_6 / 2.0).abs() < 1e-15);
    }

    #[test]
    fn the_comparison_averages_per_prompt_and_finds_the_worst_and_the_first_divergence() {
        let r = reference(vec![vec![-1.0, -1.0], vec![-1.0, -0.5], vec![-2.0]]);
        let scored = vec![vec![-1.0, -1.0], vec![-1.1, -0.5], vec![-2.0]];
        let regenerated = vec![vec![10, 11], vec![10, 99], vec![10]];
        let c = compare(&r, &scored, &regenerated);
        let second = 0.004_837_418_035_959_6 / 2.0;
        assert!((c.mean_kl - second / 3.0).abs() < 1e-15);
        assert_eq!(
            (c.worst_prompt, c.worst_kl),
            (1, kl_estimate(&[-1.0, -0.5], &[-1.1, -0.5]))
        );
        assert_eq!(c.first_divergence, Some((1, 1)));
        assert!((c.identical_share - 4.0 / 5.0).abs() < 1e-12);
        let same = compare(
            &r,
            &[vec![-1.0, -1.0], vec![-1.0, -0.5], vec![-2.0]],
            &[vec![10, 11], vec![10, 11], vec![10]],
        );
        assert_eq!(
            (same.mean_kl, same.identical_share, same.first_divergence),
            (0.0, 1.0, None)
        );
        // A shorter generation diverges where it ends.
        let short = compare(&r, &scored, &[vec![10, 11], vec![10, 11]]);
        assert_eq!(short.first_divergence, Some((2, 0)));
    }

    #[test]
    fn the_threshold_is_the_floor_times_the_factor_but_never_under_min_kl() {
        let spec = QualitySpec::default();
        assert_eq!(threshold(0.0, &spec), 0.002);
        assert_eq!(threshold(0.0001, &spec), 0.002);
        assert!((threshold(0.0005, &spec) - 0.005).abs() < 1e-15);
        let loose = QualitySpec {
            factor: 2.0,
            min_kl: 0.01,
            ..spec
        };
        assert_eq!(threshold(0.004, &loose), 0.01);
        assert_eq!(threshold(0.02, &loose), 0.04);
    }
}
