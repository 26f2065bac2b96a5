//! The reference a converged deployment leaves on its host: the greedy tokens of the prompt set
//! with their logprobs, and the pass rates of the needle and case checks, under a settings key.
//! The next change with the same key is compared with it. Reading and writing the file on the
//! host is the binary's.

use serde::{Deserialize, Serialize};

use super::{Expected, LongTask, QualitySpec, ScoredText};

/// The format of the references this reconcile writes, and the newest it reads.
pub const REFERENCE_FORMAT: u32 = 1;

/// The most a reference may weigh, written or read: 4 MiB. The default settings (16 prompts of up
/// to 400 words, 32 new tokens) write about 100 KB, and token ids cost about 7 bytes, logprobs
/// about 21, so this holds some 500,000 prompt tokens or 150,000 generated ones: 256 prompts of
/// 500 new tokens. The bound keeps what the binary reads over SSH and holds in memory (and what
/// a damaged or foreign file in the state folder can make it read) small; settings that need more
/// keep only the sequences that fit ([`reference_json`]).
pub const MAX_REFERENCE_BYTES: usize = 4 * 1024 * 1024;

/// What a deployment's server answered, kept to compare the next one with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reference {
    pub format: u32,
    /// Only a reference with the same key is compared with: see [`settings_key`].
    pub settings_key: String,
    /// The served model, as the manifest names it.
    pub model: String,
    /// One per prompt, in the prompt set's order.
    pub sequences: Vec<Sequence>,
    /// The needle check's pass rate per length (empty: not run).
    #[serde(default)]
    pub needle: Vec<NeedleRate>,
    /// The cases' pass rate, when the manifest has cases.
    #[serde(default)]
    pub cases: Option<Rate>,
    /// The fixed texts, scored at every position (the built-in ones first). Absent from
    /// references written before it existed.
    #[serde(default)]
    pub texts: Vec<ScoredText>,
    /// The long-context tasks' rates per task and length (empty: not run).
    #[serde(default)]
    pub long_context: Vec<TaskRate>,
}

/// One prompt's greedy generation: the prompt's token ids, the generated ids and their logprobs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sequence {
    pub prompt_ids: Vec<u32>,
    pub output_ids: Vec<u32>,
    /// One per output id. Read back within an ulp or so of what was written (serde_json's
    /// default float parsing), far below any KL that matters.
    pub logprobs: Vec<f64>,
}

/// How many of a check's prompts passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rate {
    pub passed: u32,
    pub total: u32,
}

impl Rate {
    /// In percent; 100 for no prompts.
    pub fn percent(&self) -> f64 {
        if self.total == 0 {
            100.0
        } else {
            f64::from(self.passed) / f64::from(self.total) * 100.0
        }
    }
}

/// The needle check's rate at one prompt length (all depths).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NeedleRate {
    pub length: u32,
    pub passed: u32,
    pub total: u32,
}

impl NeedleRate {
    pub fn rate(&self) -> Rate {
        Rate {
            passed: self.passed,
            total: self.total,
        }
    }
}

/// One task's items found at one length (RULER's `string_match_all`: each expected item found in
/// the answer counts).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRate {
    pub task: LongTask,
    pub length: u32,
    pub passed: u32,
    pub total: u32,
}

impl Reference {
    /// The (prompt ids, output ids) pairs to score teacher-forced
    /// ([`super::scoring_request`]).
    pub fn scoring_sequences(&self) -> Vec<(Vec<u32>, Vec<u32>)> {
        self.sequences
            .iter()
            .map(|s| (s.prompt_ids.clone(), s.output_ids.clone()))
            .collect()
    }

    /// How many reference tokens each sequence has ([`super::read_scores`]).
    pub fn output_lengths(&self) -> Vec<usize> {
        self.sequences.iter().map(|s| s.output_ids.len()).collect()
    }

    /// The prompts' token ids, to regenerate from exactly the same tokens
    /// ([`super::generation_request_ids`]).
    pub fn prompt_ids(&self) -> Vec<Vec<u32>> {
        self.sequences
            .iter()
            .map(|s| s.prompt_ids.clone())
            .collect()
    }
}

/// The reference as written on the host. One over [`MAX_REFERENCE_BYTES`] keeps the longest run
/// of its first sequences that fits (the next comparison scores those prompts only:
/// [`oversize_note`] says so): a reference refused on every read would leave the gate comparing
/// nothing, deployment after deployment.
pub fn reference_json(reference: &Reference) -> String {
    let json = |r: &Reference| serde_json::to_string(r).unwrap_or_default();
    let full = json(reference);
    if full.len() <= MAX_REFERENCE_BYTES {
        return full;
    }
    let (sequences, texts) = fitting(reference);
    json(&Reference {
        sequences: reference.sequences[..sequences].to_vec(),
        texts: reference.texts[..texts].to_vec(),
        ..reference.clone()
    })
}

/// How many of the first sequences and the first texts fit under the bound, with everything
/// else: the sequences first (they are small), then the texts.
fn fitting(reference: &Reference) -> (usize, usize) {
    let empty = Reference {
        sequences: Vec::new(),
        texts: Vec::new(),
        ..reference.clone()
    };
    let mut total = size(&empty);
    let mut count = |sizes: Vec<usize>| {
        let mut kept = 0;
        for s in sizes {
            if total + s + 1 > MAX_REFERENCE_BYTES {
                break;
            }
            total += s + 1; // and its comma
            kept += 1;
        }
        kept
    };
    let sequences = count(reference.sequences.iter().map(size).collect());
    let texts = count(reference.texts.iter().map(size).collect());
    (sequences, texts)
}

/// The length of a value's JSON.
fn size<T: Serialize>(value: &T) -> usize {
    serde_json::to_string(value).map_or(0, |s| s.len())
}

/// Why a reference written now keeps fewer sequences than it has, if it does: for the report.
pub fn oversize_note(reference: &Reference) -> Option<String> {
    let (sequences, texts) = fitting(reference);
    if sequences < reference.sequences.len() {
        return Some(format!(
            "the quality reference keeps {sequences} of its {} prompts and no texts, to stay under {} bytes: lower verify.quality.prompts or max_new_tokens, or use shorter prompts",
            reference.sequences.len(),
            MAX_REFERENCE_BYTES
        ));
    }
    (texts < reference.texts.len()).then(|| {
        format!(
            "the quality reference keeps {texts} of its {} texts, to stay under {} bytes: lower verify.quality.top_logprobs, or use fewer or shorter texts",
            reference.texts.len(),
            MAX_REFERENCE_BYTES
        )
    })
}

/// Why a kept reference cannot be read; the caller names the file and records a new one.
#[derive(Debug, thiserror::Error)]
pub enum ReferenceError {
    /// Larger than any reference reconcile writes.
    #[error("is {bytes} bytes, over the {MAX_REFERENCE_BYTES} a reference may have")]
    TooBig { bytes: usize },
    /// Not JSON.
    #[error("does not parse: {0}")]
    NotJson(#[source] serde_json::Error),
    /// No positive `format` number.
    #[error("does not parse: no `format` number")]
    NoFormat,
    /// Written by a newer reconcile, in a format this one does not know.
    #[error("was written by a newer reconcile (format {format}); upgrade reconcile")]
    Newer { format: u64 },
    /// JSON, but not a reference's fields.
    #[error("does not parse: {0}")]
    Fields(#[source] serde_json::Error),
    /// A sequence without one logprob per output token.
    #[error("does not parse: sequence {index} has {tokens} output tokens but {logprobs} logprobs")]
    SequenceLogprobs {
        index: usize,
        tokens: usize,
        logprobs: usize,
    },
    /// A text without one scored position per token after the first.
    #[error("does not parse: text {index} has {tokens} tokens but {positions} scored positions (or a position's ids and logprobs differ in number)")]
    TextPositions {
        index: usize,
        tokens: usize,
        positions: usize,
    },
}

/// Reads a reference. Its size and format are judged first: a newer reference is refused by name,
/// not as damaged. Each sequence must have a logprob per output token.
pub fn parse_reference(text: &str) -> Result<Reference, ReferenceError> {
    if text.len() > MAX_REFERENCE_BYTES {
        return Err(ReferenceError::TooBig { bytes: text.len() });
    }
    let value: serde_json::Value = serde_json::from_str(text).map_err(ReferenceError::NotJson)?;
    let format = value
        .get("format")
        .and_then(serde_json::Value::as_u64)
        .filter(|f| *f >= 1)
        .ok_or(ReferenceError::NoFormat)?;
    if format > u64::from(REFERENCE_FORMAT) {
        return Err(ReferenceError::Newer { format });
    }
    let reference: Reference = serde_json::from_value(value).map_err(ReferenceError::Fields)?;
    for (index, s) in reference.sequences.iter().enumerate() {
        if s.logprobs.len() != s.output_ids.len() {
            return Err(ReferenceError::SequenceLogprobs {
                index,
                tokens: s.output_ids.len(),
                logprobs: s.logprobs.len(),
            });
        }
    }
    for (index, t) in reference.texts.iter().enumerate() {
        if t.top.len() + 1 != t.ids.len().max(1)
            || t.top.iter().any(|top| top.0.len() != top.1.len())
        {
            return Err(ReferenceError::TextPositions {
                index,
                tokens: t.ids.len(),
                positions: t.top.len(),
            });
        }
    }
    Ok(reference)
}

/// Everything that changes what is measured, as a short hex digest: the model, the prompt set
/// (the built-in set's size, or the file's prompts themselves, not its path), the new tokens per
/// prompt, the needle's lengths (or "the ladder") and depths, and the cases (prompts and expected
/// answers). Not `factor`, `min_kl`, `max_pass_drop` nor `gate`: they change only the judgement,
/// and a reference stays comparable across them. The reference's file is named by it.
pub fn settings_key(spec: &QualitySpec, model: &str) -> String {
    let mut text = format!("quality v1\nmodel {model}\n");
    match &spec.prompts_file {
        Some(file) => {
            text.push_str(&format!("prompts file {}\n", file.content.len()));
            for p in &file.content {
                text.push_str(&format!("{p:?}\n"));
            }
        }
        None => text.push_str(&format!("prompts builtin {}\n", spec.prompts)),
    }
    text.push_str(&format!("max_new_tokens {}\n", spec.max_new_tokens));
    // The texts as they are: an edit of a built-in text makes a new reference.
    let texts = super::texts(
        spec.texts,
        spec.texts_file.as_ref().map(|f| f.content.as_slice()),
    );
    text.push_str(&format!(
        "texts {} top {}\n",
        texts.len(),
        spec.top_logprobs
    ));
    for t in &texts {
        text.push_str(&format!("{t:?}\n"));
    }
    if let Some(l) = &spec.long_context {
        let lengths: Vec<String> = l.lengths.iter().map(u32::to_string).collect();
        let tasks: Vec<&str> = l.tasks.iter().map(|t| LongTask::name(*t)).collect();
        text.push_str(&format!(
            "long_context lengths {} tasks {} samples {}\n",
            if lengths.is_empty() {
                "ladder".to_string()
            } else {
                lengths.join(",")
            },
            tasks.join(","),
            l.samples
        ));
    }
    if let Some(n) = &spec.needle {
        let lengths: Vec<String> = n.lengths.iter().map(u32::to_string).collect();
        let depths: Vec<String> = n.depths.iter().map(f64::to_string).collect();
        text.push_str(&format!(
            "needle lengths {} depths {}\n",
            if lengths.is_empty() {
                "ladder".to_string()
            } else {
                lengths.join(",")
            },
            depths.join(",")
        ));
    }
    if let Some(cases) = &spec.cases {
        text.push_str(&format!("cases {}\n", cases.content.len()));
        for c in &cases.content {
            let expect = match &c.expect {
                Expected::Contains(t) => format!("expect {t:?}"),
                Expected::Regex(r) => format!("regex {r:?}"),
            };
            text.push_str(&format!("{:?} {expect}\n", c.prompt));
        }
    }
    crate::digest::short(&crate::digest::sha256(&text), 16).to_string()
}

#[cfg(test)]
mod tests {
    use super::super::{builtin_prompts, Case, LoadedFile, NeedleSpec};
    use super::*;

    pub(crate) fn reference(prompts: usize, tokens: usize) -> Reference {
        Reference {
            format: REFERENCE_FORMAT,
            settings_key: "k".into(),
            model: "Qwen/Qwen3-8B".into(),
            sequences: (0..prompts)
                .map(|p| Sequence {
                    prompt_ids: (0..550).map(|t| 100_000 + t + p as u32).collect(),
                    output_ids: (0..tokens as u32).map(|t| 150_000 + t).collect(),
                    logprobs: (0..tokens)
                        .map(|t| -0.123_456_789_012_345_6 * t as f64)
                        .collect(),
                })
                .collect(),
            needle: vec![NeedleRate {
                length: 1024,
                passed: 3,
                total: 3,
            }],
            cases: Some(Rate {
                passed: 15,
                total: 16,
            }),
            texts: Vec::new(),
            long_context: Vec::new(),
        }
    }

    #[test]
    fn a_reference_round_trips_and_its_size_is_bounded_both_ways() {
        let r = reference(16, 32);
        let json = reference_json(&r);
        assert!(
            json.starts_with(r#"{"format":1,"settings_key":"k","#),
            "{json}"
        );
        assert!(json.len() < 150_000, "the defaults weigh {}", json.len());
        assert_eq!(oversize_note(&r), None);
        // serde_json reads a float back within an ulp or so (its default, fast parsing), far
        // below any KL that matters; everything else is exact.
        let mut back = parse_reference(&json).unwrap();
        for (b, s) in back.sequences.iter_mut().zip(&r.sequences) {
            assert!(b
                .logprobs
                .iter()
                .zip(&s.logprobs)
                .all(|(x, y)| (x - y).abs() < 1e-14));
            b.logprobs.clone_from(&s.logprobs);
        }
        assert_eq!(back, r);

        // Too big to write whole: the first sequences that fit are kept, and it reads back.
        let big = reference(256, 1024);
        let written = reference_json(&big);
        assert!(written.len() <= MAX_REFERENCE_BYTES);
        let back = parse_reference(&written).unwrap();
        assert!(
            (100..256).contains(&back.sequences.len()),
            "{}",
            back.sequences.len()
        );
        assert_eq!(back.sequences[0].output_ids, big.sequences[0].output_ids);
        assert_eq!((back.needle, back.cases), (big.needle.clone(), big.cases));
        let note = oversize_note(&big).unwrap();
        assert!(
            note.starts_with(&format!(
                "the quality reference keeps {} of its 256 prompts",
                back.sequences.len()
            )),
            "{note}"
        );
        // Too big to read.
        let padded = format!("{json}{}", " ".repeat(MAX_REFERENCE_BYTES));
        let too_big = parse_reference(&padded).unwrap_err();
        assert!(
            too_big.to_string().contains("over the 4194304"),
            "{too_big}"
        );
        assert!(matches!(too_big, ReferenceError::TooBig { .. }));
    }

    #[test]
    fn a_newer_or_damaged_reference_is_refused_by_name() {
        let newer = parse_reference(r#"{"format":2,"whatever":true}"#).unwrap_err();
        assert_eq!(
            newer.to_string(),
            "was written by a newer reconcile (format 2); upgrade reconcile"
        );
        assert!(matches!(newer, ReferenceError::Newer { format: 2 }));
        let damaged = parse_reference("{").unwrap_err();
        assert!(damaged.to_string().starts_with("does not parse"));
        assert!(matches!(damaged, ReferenceError::NotJson(_)));
        assert!(parse_reference(r#"{"format":"1"}"#)
            .unwrap_err()
            .to_string()
            .contains("no `format`"));
        let mut r = reference(2, 4);
        r.sequences[1].logprobs.pop();
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(
            parse_reference(&json).unwrap_err().to_string(),
            "does not parse: sequence 1 has 4 output tokens but 3 logprobs"
        );
        // Older readers' fields may be absent.
        let minimal = r#"{"format":1,"settings_key":"k","model":"m","sequences":[]}"#;
        let m = parse_reference(minimal).unwrap();
        assert!(m.needle.is_empty() && m.cases.is_none());
    }

    #[test]
    fn the_key_changes_with_what_is_measured_and_not_with_the_judgement() {
        let spec = QualitySpec::default();
        let key = settings_key(&spec, "m");
        assert_eq!(key.len(), 16);
        assert!(key.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(key, settings_key(&spec.clone(), "m"));
        let judged = QualitySpec {
            factor: 3.0,
            min_kl: 0.01,
            max_pass_drop: 0.0,
            gate: false,
            ..spec.clone()
        };
        assert_eq!(settings_key(&judged, "m"), key);
        let case = |expect| LoadedFile {
            path: "c.jsonl".into(),
            content: vec![Case {
                prompt: "2+2?".into(),
                expect,
                line: 1,
            }],
        };
        let with_cases = QualitySpec {
            cases: Some(case(Expected::Contains("4".into()))),
            ..spec.clone()
        };
        let others = [
            QualitySpec {
                prompts: 8,
                ..spec.clone()
            },
            QualitySpec {
                max_new_tokens: 64,
                ..spec.clone()
            },
            QualitySpec {
                prompts_file: Some(LoadedFile {
                    path: "p.jsonl".into(),
                    content: builtin_prompts(16),
                }),
                ..spec.clone()
            },
            QualitySpec {
                needle: Some(NeedleSpec::default()),
                ..spec.clone()
            },
            QualitySpec {
                needle: Some(NeedleSpec {
                    lengths: vec![2048],
                    ..NeedleSpec::default()
                }),
                ..spec.clone()
            },
            with_cases.clone(),
            QualitySpec {
                cases: Some(case(Expected::Regex("4".into()))),
                ..spec.clone()
            },
        ];
        let mut keys: Vec<String> = others.iter().map(|s| settings_key(s, "m")).collect();
        keys.push(key.clone());
        keys.push(settings_key(&spec, "other/model"));
        let n = keys.len();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), n, "every setting changes the key");
        // The file's path is not what is measured.
        let mut moved = with_cases.clone();
        moved.cases.as_mut().unwrap().path = "elsewhere.jsonl".into();
        assert_eq!(settings_key(&moved, "m"), settings_key(&with_cases, "m"));
    }
}
