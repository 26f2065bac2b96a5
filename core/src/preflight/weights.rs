//! The model's weights, checked before a restart stops the old server: a shard that is missing
//! or cut short (a copy that did not finish, a full disk) is otherwise found only when the new
//! server fails to load it, after the old one is gone.
//!
//! The host reads only the safetensors headers (`WEIGHTS_SCRIPT` in the binary's preflight): each
//! file `model.safetensors.index.json` names in its `weight_map` (or the single
//! `model.safetensors`) must exist and be exactly as long as its header says, 8 bytes of header
//! length, the header, then the last tensor's end offset. The safetensors library refuses any other
//! length ("incomplete metadata, file not fully covered", safetensors 0.8.0 in the CPU tier, for a
//! file 4 bytes short and one 16 bytes long), and so does SGLang's loader, which opens each shard
//! with it.

use serde::Deserialize;

use crate::finding::Finding;

/// The check of the model's weights: what the host found, or why the check gave no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WeightsCheck {
    Read(Weights),
    /// The check did not run or did not answer (no such Python, a hung read): why.
    Failed(String),
}

impl WeightsCheck {
    /// Reads the check's exit status and output.
    pub fn of(status: i32, stdout: &str, stderr: &str) -> WeightsCheck {
        match read_weights(stdout) {
            Ok(w) if status == 0 => WeightsCheck::Read(w),
            Ok(_) | Err(_) if status == 124 => {
                WeightsCheck::Failed("reading the safetensors headers timed out".into())
            }
            Ok(_) => WeightsCheck::Failed(format!("exit status {status}")),
            Err(why) => {
                let last = super::last_line(stderr);
                WeightsCheck::Failed(if last.is_empty() {
                    why.to_string()
                } else {
                    last
                })
            }
        }
    }

    /// The findings for a unit that restarts ([`judge_weights`]); a check that gave no answer is
    /// a warning.
    pub fn judge(&self, model_path: &str, at: Option<&str>) -> Option<Finding> {
        match self {
            WeightsCheck::Read(w) => judge_weights(model_path, at, w),
            WeightsCheck::Failed(why) => Some(Finding::warning(
                "weights",
                format!("the model's weights were not checked: {why}"),
            )),
        }
    }
}

/// What the host found of the model's weights.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct Weights {
    /// The files checked, relative to the model folder, in the index's order.
    #[serde(default)]
    pub files: Vec<String>,
    /// Their sizes together, as found on the host.
    #[serde(default)]
    pub bytes: u64,
    /// What is wrong with them.
    #[serde(default)]
    pub problems: Vec<WeightProblem>,
    /// Why nothing was checked: the model path is no folder (a hub id), or it has no safetensors
    /// index or file. `None`: checked.
    #[serde(default)]
    pub unchecked: Option<String>,
    /// The host's `MemAvailable` (`/proc/meminfo`) in bytes, which preloading the weights needs;
    /// `None` where it did not read.
    #[serde(default)]
    pub mem_available: Option<u64>,
}

/// One file that would not load.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct WeightProblem {
    /// Relative to the model folder.
    pub file: String,
    /// What is wrong, as a predicate: "is missing", "is truncated: ...".
    pub problem: String,
}

/// Why the weights check's output gave no [`Weights`].
#[derive(Debug, thiserror::Error)]
pub enum WeightsReadError {
    /// No line of the output is a JSON object (the script died before it answered).
    #[error("no answer in {stdout:?}")]
    NoAnswer {
        /// The whole output, trimmed.
        stdout: String,
    },
    /// The answer line is not the script's JSON.
    #[error("its answer does not read: {source}")]
    Unreadable {
        #[source]
        source: serde_json::Error,
    },
}

/// Reads the host's answer (one JSON line); `Err` names what did not read.
pub fn read_weights(stdout: &str) -> Result<Weights, WeightsReadError> {
    let line = stdout.lines().rev().find(|l| l.starts_with('{'));
    let line = line.ok_or_else(|| WeightsReadError::NoAnswer {
        stdout: stdout.trim().to_string(),
    })?;
    serde_json::from_str(line).map_err(|source| WeightsReadError::Unreadable { source })
}

/// How many problem files a finding names before it counts the rest.
const NAMED: usize = 5;

/// The finding for a unit that restarts: an error naming the files that would not load, at the
/// manifest's `model_path` (`at`, `file:line:column: field`, when known). Nothing when the
/// weights are whole or were not checked.
pub fn judge_weights(model_path: &str, at: Option<&str>, weights: &Weights) -> Option<Finding> {
    let (named, rest) = weights.problems.split_at(weights.problems.len().min(NAMED));
    if named.is_empty() {
        return None;
    }
    let mut text = format!("the model's weights would not load: {}", {
        let list: Vec<String> = named
            .iter()
            .map(|p| {
                format!(
                    "{}/{} {}",
                    model_path.trim_end_matches('/'),
                    p.file,
                    p.problem
                )
            })
            .collect();
        list.join("; ")
    });
    if !rest.is_empty() {
        text.push_str(&format!("; and {} more", rest.len()));
    }
    text.push_str(" (the old server keeps running: nothing was stopped)");
    Some(Finding::error(
        "weights",
        at.map_or(text.clone(), |at| format!("{at}: {text}")),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_truncated_shard_is_an_error_at_the_model_path() {
        let answer = r#"{"files": ["a.safetensors", "b.safetensors"], "bytes": 100, "problems": [{"file": "b.safetensors", "problem": "is truncated: 100 of the 200 bytes its safetensors header implies"}], "unchecked": null}"#;
        let weights = read_weights(answer).unwrap();
        assert_eq!(weights.files.len(), 2);
        let finding = judge_weights(
            "/models/m/",
            Some("m.yaml:7:3: sglang.model_path"),
            &weights,
        )
        .expect("an error");
        assert_eq!(finding.check, "weights");
        assert_eq!(
            finding.message,
            "m.yaml:7:3: sglang.model_path: the model's weights would not load: /models/m/b.safetensors is truncated: 100 of the 200 bytes its safetensors header implies (the old server keeps running: nothing was stopped)"
        );
    }

    #[test]
    fn whole_or_unchecked_weights_say_nothing_and_many_problems_are_counted() {
        let whole = read_weights(r#"{"files": ["model.safetensors"], "bytes": 9}"#).unwrap();
        assert_eq!(judge_weights("/m", None, &whole), None);
        let hub =
            read_weights(r#"{"unchecked": "the model path is not a folder on the host"}"#).unwrap();
        assert_eq!(judge_weights("Qwen/Qwen3-8B", None, &hub), None);
        let many = Weights {
            files: Vec::new(),
            bytes: 0,
            problems: (0..8)
                .map(|i| WeightProblem {
                    file: format!("s{i}.safetensors"),
                    problem: "is missing".into(),
                })
                .collect(),
            unchecked: None,
            mem_available: None,
        };
        let message = judge_weights("/m", None, &many).unwrap().message;
        assert!(
            message.contains("/m/s4.safetensors is missing; and 3 more"),
            "{message}"
        );
        assert!(!message.contains("s5"), "{message}");
        let e = read_weights("Traceback (most recent call last):").unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"no answer in "Traceback (most recent call last):""#
        );
        assert!(matches!(e, WeightsReadError::NoAnswer { .. }));
        assert!(matches!(
            read_weights("{\"files\": 3}"),
            Err(WeightsReadError::Unreadable { .. })
        ));
        let failed = WeightsCheck::of(1, "", "Traceback ...\nPermissionError: [Errno 13]\n");
        assert_eq!(
            failed.judge("/m", None).map(|f| f.message),
            Some("the model's weights were not checked: PermissionError: [Errno 13]".into())
        );
    }
}
