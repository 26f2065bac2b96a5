//! The quality gate: whether a changed server still gives the answers it gave.
//!
//! Pure: the prompts, the `/generate` bodies and their answers read, the KL estimate, the needle
//! and case checks, the reference kept on the host, and the verdict. The binary's `quality`
//! module sends the requests and keeps the reference.
//!
//! The design follows SGLang's own precision tests (`sglang/test/kl_test_utils.py`, 0.5.23): the
//! same tokens are scored by two runs and the per-token estimate `(exp(r) - 1) - r` of their
//! logprobs' difference is averaged ([`kl_estimate`]). Here the two runs are two deployments:
//!
//! 1. A converged deployment generates greedily for a seeded prompt set ([`builtin_prompts`], or
//!    the manifest's file) and keeps the tokens and their logprobs as the [`Reference`], on its
//!    host, under a [`settings_key`] of everything that changes what is measured.
//! 2. Before a change stops the old server, the old server scores the reference's tokens once
//!    more (teacher-forced, [`scoring_request`]): its own run-to-run KL is the noise floor.
//! 3. The new server scores the same tokens and regenerates from the same prompt tokens
//!    ([`compare`]: mean and worst KL, the share of identical greedy tokens, the first
//!    divergence), gives its distribution at every position of the fixed texts
//!    ([`compare_texts`]: the KL over each position's top tokens and the rest of the mass, which
//!    sees what the greedy path hides), answers the needle prompts ([`needles`]), the long-context
//!    tasks ([`long_context`]) and the cases ([`passes`]), and [`judge`] holds each mean under
//!    [`threshold`] `max(floor x factor, min_kl)` and the pass rates within `max_pass_drop` points
//!    of the reference's.
//!
//! Why the threshold comes from the floor: what a KL figure means depends on the model, the
//! kernels and the parallelism. SGLang's tests hold a server's decode logprobs against its own
//! prefill re-scoring of the same tokens under per-model thresholds: 0.002 for Granite MoE
//! hybrid and Kimi-Linear, 0.0005 to 0.0025 for Qwen3-Next (by test and version), 0.008 with MTP
//! speculative decoding, 0.02 for gpt-oss (raised from 0.002). A fixed threshold would be too
//! loose for one model and fail another on its own noise; the floor measures this deployment's
//! noise, and `factor` times it is what a change may add. The default `min_kl` 0.002 is the
//! tightest threshold most of those tests use, so a deterministic server (floor 0) is not failed
//! for the last bits of its floats.

mod cases;
mod fixed_text;
mod generate;
mod jsonl;
mod judge;
mod kl;
pub mod long_context;
mod needle;
mod prompts;
mod reference;
mod spec;

pub use cases::{case_rate, parse_cases, passes};
pub use fixed_text::{
    compare_texts, parse_texts, position_kl, read_text_scores, read_tokens, text_scoring_request,
    texts, tokenize_request, AnswerError, Moved, ScoredText, TextAnswer, TextComparison, TextFault,
    Top, MAX_TEXT_TOKENS,
};
pub use generate::{
    answer_request, generation_request, generation_request_ids, read_answers, read_generations,
    read_scores, scoring_request, GenerateError, Generated, ItemFault,
};
pub use jsonl::QualityFileError;
pub use judge::{
    judge, Cost, Floors, Measures, QualityFigures, QualityReport, RateChange, Verdict,
};
pub use kl::{compare, kl_estimate, mean_kl, threshold, Comparison};
pub use needle::{found, needles, rates, Needle, QUESTION};
pub use prompts::{builtin_prompts, parse_prompts};
pub use reference::{
    oversize_note, parse_reference, reference_json, settings_key, NeedleRate, Rate, Reference,
    ReferenceError, Sequence, TaskRate, MAX_REFERENCE_BYTES, REFERENCE_FORMAT,
};
pub use spec::{Case, Expected, LoadedFile, LongContextSpec, LongTask, NeedleSpec, QualitySpec};
