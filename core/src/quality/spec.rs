//! `verify.quality`: what the quality stage measures and how it judges, as the manifest says.

use serde::{Deserialize, Serialize};

/// The quality gate's settings (`verify.quality`). Every figure it compares comes from the same
/// settings (the [`super::settings_key`]), so a reference recorded under other settings is not
/// compared with.
#[derive(Debug, Clone, PartialEq)]
pub struct QualitySpec {
    /// Prompts of the built-in, seeded set (varied length).
    pub prompts: u32,
    /// The manifest's own prompts instead (`prompts_file`, JSONL `{"prompt": "..."}` per line),
    /// read and checked when the manifest is loaded: the path as written, and the prompts.
    pub prompts_file: Option<LoadedFile<Vec<String>>>,
    /// Greedy tokens generated per prompt (temperature 0, `ignore_eos`).
    pub max_new_tokens: u32,
    /// Score the built-in fixed texts at every position (`texts`; `false`: only the file's).
    pub texts: bool,
    /// The manifest's own texts (`texts_file`, JSONL `{"text": "..."}` per line), scored after
    /// the built-in ones.
    pub texts_file: Option<LoadedFile<Vec<String>>>,
    /// The most likely tokens a reference keeps per position of a text (`top_logprobs`).
    pub top_logprobs: u32,
    /// The stage fails when the mean KL estimate exceeds `max(noise floor x factor, min_kl)`.
    pub factor: f64,
    pub min_kl: f64,
    /// The needle-in-a-haystack check; `None`: off.
    pub needle: Option<NeedleSpec>,
    /// The long-context tasks (several keys, a chain of variables, common words); `None`: off.
    pub long_context: Option<LongContextSpec>,
    /// Prompts with an expected answer (`cases`, JSONL), read and checked when loaded.
    pub cases: Option<LoadedFile<Vec<Case>>>,
    /// A pass rate (needle at a length, cases) may drop this many percentage points below the
    /// previous deployment's.
    pub max_pass_drop: f64,
    /// A failure fails the stage (and rolls back); `false`: reported only.
    pub gate: bool,
}

impl Default for QualitySpec {
    fn default() -> Self {
        QualitySpec {
            prompts: 16,
            prompts_file: None,
            max_new_tokens: 32,
            texts: true,
            texts_file: None,
            top_logprobs: 20,
            factor: 10.0,
            min_kl: 0.002,
            needle: None,
            long_context: None,
            cases: None,
            max_pass_drop: 10.0,
            gate: true,
        }
    }
}

/// A file a manifest names, read by the binary when it loads the manifest: its path as written
/// (relative to the manifest's folder), and what it held.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadedFile<T> {
    pub path: String,
    pub content: T,
}

/// `needle:`: a key hidden at each depth of a seeded filler, for each length.
#[derive(Debug, Clone, PartialEq)]
pub struct NeedleSpec {
    /// Prompt lengths in tokens; empty: a ladder up to the served context length.
    pub lengths: Vec<u32>,
    /// Where the key sits, as a fraction of the prompt (0.1, 0.5, 0.9 by default).
    pub depths: Vec<f64>,
}

impl Default for NeedleSpec {
    fn default() -> Self {
        NeedleSpec {
            lengths: Vec::new(),
            depths: vec![0.1, 0.5, 0.9],
        }
    }
}

/// One prompt with its expected answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    pub prompt: String,
    pub expect: Expected,
    /// The file's line, for reports.
    pub line: usize,
}

/// How an answer is judged.
#[derive(Debug, Clone, PartialEq)]
pub enum Expected {
    /// The answer, trimmed, contains this text (case-insensitive).
    Contains(String),
    /// The answer matches this regular expression.
    Regex(String),
}

/// `long_context:`: the tasks, at which lengths, how many samples each.
#[derive(Debug, Clone, PartialEq)]
pub struct LongContextSpec {
    /// Prompt lengths in words (about 1.3 tokens each); empty: a ladder up to the served context
    /// length, as the needle's.
    pub lengths: Vec<u32>,
    /// Which tasks; all three by default.
    pub tasks: Vec<LongTask>,
    /// Prompts per task and length.
    pub samples: u32,
}

impl Default for LongContextSpec {
    fn default() -> Self {
        LongContextSpec {
            lengths: Vec::new(),
            tasks: vec![
                LongTask::MultiKey,
                LongTask::VariableTracking,
                LongTask::CommonWords,
            ],
            samples: 2,
        }
    }
}

/// A long-context task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LongTask {
    /// RULER's `niah_multikey`: several keys with their numbers, one asked for.
    MultiKey,
    /// RULER's `vt`: a value passed along a chain of variables; every variable that holds it.
    VariableTracking,
    /// RULER's `cwe`: a list of words, the most common ones.
    CommonWords,
}

impl LongTask {
    /// Every task, in the order the report lists them.
    pub const ALL: [LongTask; 3] = [
        LongTask::MultiKey,
        LongTask::VariableTracking,
        LongTask::CommonWords,
    ];

    /// The task's name in the manifest and the report.
    pub fn name(self) -> &'static str {
        match self {
            LongTask::MultiKey => "multi_key",
            LongTask::VariableTracking => "variable_tracking",
            LongTask::CommonWords => "common_words",
        }
    }
}
