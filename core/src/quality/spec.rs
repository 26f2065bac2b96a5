//! `verify.quality`: what the quality stage measures and how it judges, as the manifest says.

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
    /// The stage fails when the mean KL estimate exceeds `max(noise floor x factor, min_kl)`.
    pub factor: f64,
    pub min_kl: f64,
    /// The needle-in-a-haystack check; `None`: off.
    pub needle: Option<NeedleSpec>,
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
            factor: 10.0,
            min_kl: 0.002,
            needle: None,
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
