//! Preloading: the model's weights read into the host's page cache while the old server still
//! serves, so that the new one loads them from memory. After a restart SGLang reads every shard
//! again (sglang 0.5.23 `model_loader/weight_utils.py`, `safetensors_weights_iterator`: each rank
//! `get_tensor`s every tensor of every file), and from a cold cache that read is most of a
//! large model's load: 234 GB for the seed's Qwen3.5-122B BF16. SGLang's own
//! `--weight-loader-prefetch-checkpoints` reads ahead of its loader, but only once the new server
//! runs, after the old one stopped. Preloading moves that read before the stop.
//!
//! What to preload comes from preflight's weights check (the files the safetensors index names,
//! their bytes and the host's available memory); this module decides whether, and words what
//! happened. The binary's apply reads the files.

use std::time::Duration;

use serde::Serialize;

use crate::preflight::{Weights, WeightsCheck};

/// The weights may fill at most this share of the host's `MemAvailable`. Page cache is
/// reclaimable, so preloading cannot exhaust memory; but pages preloaded into memory the host needs
/// are evicted, oldest first, before the load reads them, and the stop, the new server's start
/// and its imports come in between. `MemAvailable` is the kernel's estimate of what new
/// allocations can take without swapping (`proc(5)`); the old server's own memory is outside it,
/// and the new server takes about as much back, so a tenth of it is left for what differs.
pub const PRELOAD_SHARE_PERCENT: u64 = 90;

/// What to read, and for how long at most.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreloadPlan {
    /// Relative to the model folder.
    pub files: Vec<String>,
    pub bytes: u64,
    pub limit: Duration,
}

/// Why the weights are not preloaded; the report words a skipped preloading by it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NotStaged {
    /// The weights check did not run or did not answer.
    #[error("the weights were not checked: {why}")]
    NotChecked { why: String },
    /// The check found nothing to check (a hub id, no safetensors): the host's own words.
    #[error("{why}")]
    Unchecked { why: String },
    /// A file is missing or cut short, or there are none.
    #[error("no whole weight files to read")]
    NoWholeFiles,
    /// The host's `MemAvailable` did not read.
    #[error("the host's available memory (MemAvailable in /proc/meminfo) did not read")]
    NoMemAvailable,
    /// The weights need more than [`PRELOAD_SHARE_PERCENT`] of `available`.
    #[error(
        "the weights ({}) need more than {PRELOAD_SHARE_PERCENT} % of the host's available memory ({}): pages staged now would be evicted before the load reads them",
        gigabytes(*.bytes),
        gigabytes(*.available)
    )]
    TooBig { bytes: u64, available: u64 },
}

/// Whether to preload, from the weights check: `Err` says why not. `limit` bounds the read: the
/// manifest's load deadline, the time it allows the load itself, so that preloading never costs
/// more than the load it shortens.
pub fn plan(weights: &WeightsCheck, limit: Duration) -> Result<PreloadPlan, NotStaged> {
    let w: &Weights = match weights {
        WeightsCheck::Read(w) => w,
        WeightsCheck::Failed(why) => return Err(NotStaged::NotChecked { why: why.clone() }),
    };
    if let Some(why) = &w.unchecked {
        return Err(NotStaged::Unchecked { why: why.clone() });
    }
    if !w.problems.is_empty() || w.files.is_empty() {
        return Err(NotStaged::NoWholeFiles);
    }
    let Some(available) = w.mem_available else {
        return Err(NotStaged::NoMemAvailable);
    };
    let room = available / 100 * PRELOAD_SHARE_PERCENT;
    if w.bytes > room {
        return Err(NotStaged::TooBig {
            bytes: w.bytes,
            available,
        });
    }
    Ok(PreloadPlan {
        files: w.files.clone(),
        bytes: w.bytes,
        limit,
    })
}

/// What preloading did, as a report says it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Preloading {
    pub outcome: PreloadOutcome,
    /// Files and bytes meant to be read (0 when skipped).
    pub files: usize,
    pub bytes: u64,
    /// How long the read took, on the controller's clock.
    pub seconds: f64,
    /// Why it was skipped, cut short or failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PreloadOutcome {
    /// Every file read.
    #[serde(rename = "staged")]
    Preloaded,
    /// Stopped at its limit, or by a signal: what was read stays cached.
    CutShort,
    /// Not attempted ([`plan`] said why).
    Skipped,
    /// The read failed (the apply goes on: preloading only saves time).
    Failed,
}

impl Preloading {
    pub fn skipped(why: String) -> Preloading {
        Preloading {
            outcome: PreloadOutcome::Skipped,
            files: 0,
            bytes: 0,
            seconds: 0.0,
            why: Some(why),
        }
    }

    /// How the read of `plan` ended: its exit status (`timeout`'s 124 at the limit) and stderr,
    /// after `seconds`.
    pub fn ended(plan: &PreloadPlan, status: i32, stderr: &str, seconds: f64) -> Preloading {
        let (outcome, why) = match status {
            0 => (PreloadOutcome::Preloaded, None),
            124 => (
                PreloadOutcome::CutShort,
                Some(format!(
                    "its limit, the load deadline ({} s), was reached",
                    plan.limit.as_secs()
                )),
            ),
            _ => (
                PreloadOutcome::Failed,
                Some(match crate::preflight::last_line(stderr) {
                    line if line.is_empty() => format!("exit status {status}"),
                    line => line,
                }),
            ),
        };
        Preloading {
            outcome,
            files: plan.files.len(),
            bytes: plan.bytes,
            seconds,
            why,
        }
    }

    /// The report's note.
    pub fn note(&self) -> String {
        let what = format!("{} file(s), {}", self.files, gigabytes(self.bytes));
        let why = self.why.as_deref().unwrap_or("");
        match self.outcome {
            PreloadOutcome::Preloaded => format!(
                "the weights were staged into the page cache before the stop: {what} in {:.1}s",
                self.seconds
            ),
            PreloadOutcome::CutShort => format!(
                "staging the weights stopped after {:.1}s ({why}): part of {what} is in the page cache",
                self.seconds
            ),
            PreloadOutcome::Skipped => format!("the weights were not staged: {why}"),
            PreloadOutcome::Failed => format!("staging the weights failed ({why}); the load reads them from disk"),
        }
    }
}

/// Bytes as GB (10^9, as disks and model cards count them), one decimal.
fn gigabytes(bytes: u64) -> String {
    format!("{:.1} GB", bytes as f64 / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weights(bytes: u64, available: Option<u64>) -> WeightsCheck {
        WeightsCheck::Read(Weights {
            files: vec!["a.safetensors".into(), "b.safetensors".into()],
            bytes,
            problems: Vec::new(),
            unchecked: None,
            mem_available: available,
        })
    }

    const LIMIT: Duration = Duration::from_secs(1800);

    #[test]
    fn weights_that_fit_in_nine_tenths_of_the_available_memory_are_staged() {
        let plan = plan(&weights(234_000_000_000, Some(500_000_000_000)), LIMIT).unwrap();
        assert_eq!(plan.files, ["a.safetensors", "b.safetensors"]);
        assert_eq!((plan.bytes, plan.limit), (234_000_000_000, LIMIT));
        let why = super::plan(&weights(234_000_000_000, Some(256_000_000_000)), LIMIT).unwrap_err();
        assert_eq!(
            why,
            NotStaged::TooBig {
                bytes: 234_000_000_000,
                available: 256_000_000_000
            }
        );
        assert_eq!(
            why.to_string(),
            "the weights (234.0 GB) need more than 90 % of the host's available memory (256.0 GB): pages staged now would be evicted before the load reads them"
        );
        assert_eq!(
            super::plan(&weights(1, None), LIMIT),
            Err(NotStaged::NoMemAvailable)
        );
    }

    #[test]
    fn unchecked_weights_are_not_staged_and_say_why() {
        let hub = WeightsCheck::Read(Weights {
            unchecked: Some("the model path is not a folder on the host".into()),
            ..match weights(0, Some(1)) {
                WeightsCheck::Read(w) => w,
                WeightsCheck::Failed(_) => unreachable!(),
            }
        });
        assert_eq!(
            plan(&hub, LIMIT).unwrap_err().to_string(),
            "the model path is not a folder on the host"
        );
        let failed = WeightsCheck::Failed("exit status 1".into());
        assert_eq!(
            plan(&failed, LIMIT).unwrap_err().to_string(),
            "the weights were not checked: exit status 1"
        );
    }

    #[test]
    fn how_the_read_ended_is_the_note() {
        let plan = plan(&weights(2_500_000_000, Some(10_000_000_000)), LIMIT).unwrap();
        let staged = Preloading::ended(&plan, 0, "", 3.21);
        assert_eq!(
            staged.note(),
            "the weights were staged into the page cache before the stop: 2 file(s), 2.5 GB in 3.2s"
        );
        let cut = Preloading::ended(&plan, 124, "", 1800.0);
        assert_eq!(cut.outcome, PreloadOutcome::CutShort);
        assert!(
            cut.note().contains("the load deadline (1800 s)"),
            "{}",
            cut.note()
        );
        let failed = Preloading::ended(&plan, 1, "cat: b.safetensors: Input/output error\n", 0.5);
        assert_eq!(
            failed.note(),
            "staging the weights failed (cat: b.safetensors: Input/output error); the load reads them from disk"
        );
        let json = serde_json::to_value(&staged).unwrap();
        assert_eq!(json["outcome"], "staged");
        assert!(json.get("why").is_none());
    }
}
