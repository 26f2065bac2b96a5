//! Every position of fixed text: the distribution a server gives each next token of a known
//! text, teacher-forced, compared with the reference's as a KL divergence over its most likely
//! tokens and the rest of the mass.
//!
//! The greedy path (`kl`) scores the tokens the reference chose itself, so a model that still
//! picks the same greedy tokens while its distribution moved everywhere else passes it. Natural
//! text is not the model's choice: perplexity as lm-evaluation-harness measures it, and
//! llama.cpp's `perplexity --kl-divergence` (the mean KL of a quantized model's distribution
//! against the base model's at every position of wikitext), read every position of a known text.
//! llama.cpp keeps the whole vocabulary's logits; a reference kept on a host keeps the `top_k`
//! most likely tokens per position, and the KL is taken over those tokens and one bucket for the
//! rest ([`position_kl`]): a KL between two coarser distributions, so never more than the full KL
//! (the data-processing inequality), and equal to it when the top tokens hold the mass.
//!
//! SGLang's native `/generate` gives what this needs: `input_ids`, `max_new_tokens: 0`,
//! `return_logprob`, `logprob_start_len: 0` and `top_logprobs_num` answer, per input position,
//! the text's own token's logprob (`input_token_logprobs`) and the most likely tokens
//! (`input_top_logprobs`; the first position predicts nothing and is null). Its `/tokenize` gives
//! the texts' token ids, cut to fit the served context.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::jsonl::strings;
use super::QualityFileError;

/// The texts the project ships: plain English prose of three kinds and lengths (a scene, an
/// explanation, a story with dialogue), written for this gate. About 100, 280 and 950 words.
const BUILTIN: [&str; 3] = [
    include_str!("texts/harbour.txt"),
    include_str!("texts/bread.txt"),
    include_str!("texts/station.txt"),
];

/// The most tokens of one text that are scored: the longest built-in text is about 1,250
/// tokens of a BPE tokenizer; a manifest's longer text is cut here, to bound the reference.
pub const MAX_TEXT_TOKENS: usize = 1024;

/// Tokens kept free under the served context length (SGLang refuses an input of
/// `context_len` tokens or more, `tokenizer_manager.py` `_validate_one_request`, and may reserve
/// some of it: `num_reserved_tokens`).
const CONTEXT_MARGIN: usize = 16;

/// A logprob under this (a probability under 1e-5) is not kept: it joins the rest of the mass,
/// which keeps a peaked position's entry short and costs the KL at most what a coarser bucket
/// costs it.
const KEPT_LOGPROB: f64 = -11.5;

/// The built-in texts, then the manifest's own.
pub fn texts(builtin: bool, own: Option<&[String]>) -> Vec<String> {
    let shipped = BUILTIN
        .iter()
        .filter(|_| builtin)
        .map(|t| t.trim().to_string());
    shipped.chain(own.into_iter().flatten().cloned()).collect()
}

/// The texts of a texts file: JSONL, `{"text": "..."}` a line (other fields are ignored), blank
/// lines and `#` lines skipped. `file` is the path as the manifest wrote it, for errors.
pub fn parse_texts(file: &str, content: &str) -> Result<Vec<String>, QualityFileError> {
    strings(file, "verify.quality.texts_file", "text", content)
}

/// One position's most likely next tokens, most likely first: their ids and logprobs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Top(pub Vec<u32>, pub Vec<f64>);

/// One text as one server scored it: its token ids, and for every position after the first the
/// most likely next tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScoredText {
    pub ids: Vec<u32>,
    /// `top[t]` is the distribution of `ids[t + 1]` given `ids[..=t]`.
    pub top: Vec<Top>,
}

impl ScoredText {
    /// What a reference keeps: the `k` most likely tokens of each position over a probability of
    /// 1e-5, their logprobs rounded to 1e-4 (a difference of 5e-5 in a logprob moves a KL by
    /// about 1e-9, far under any threshold).
    pub fn kept(&self, k: usize) -> ScoredText {
        let round = |lp: f64| (lp * 1e4).round() / 1e4;
        ScoredText {
            ids: self.ids.clone(),
            top: self
                .top
                .iter()
                .map(|Top(ids, lps)| {
                    let n = lps
                        .iter()
                        .take(k)
                        .take_while(|lp| **lp >= KEPT_LOGPROB)
                        .count()
                        .max(1.min(lps.len()));
                    Top(
                        ids[..n].to_vec(),
                        lps[..n].iter().map(|&l| round(l)).collect(),
                    )
                })
                .collect(),
        }
    }
}

/// The KL divergence KL(reference || new) at one position, over the reference's top tokens and
/// one bucket for the rest of the mass. The new server's `new` list is asked longer than the
/// reference's; a reference token missing from it has at most the list's last probability and
/// shares what mass the list leaves with the others missing, and counts at that.
pub fn position_kl(reference: &Top, new: &Top) -> f64 {
    let Top(new_ids, new_lps) = new;
    let listed: f64 = new_lps.iter().map(|l| l.exp()).sum();
    let unlisted = (1.0 - listed).max(0.0);
    let missing = reference
        .0
        .iter()
        .filter(|id| !new_ids.contains(id))
        .count();
    let least = new_lps.last().map_or(unlisted, |l| l.exp());
    let missing_q = if missing == 0 {
        0.0
    } else {
        least.min(unlisted / missing as f64)
    };
    let mut kl = 0.0;
    let (mut p_top, mut q_top) = (0.0, 0.0);
    for (id, lp) in reference.0.iter().zip(&reference.1) {
        let p = lp.exp();
        let q = match new_ids.iter().position(|n| n == id) {
            Some(at) => new_lps[at].exp(),
            None => missing_q,
        };
        p_top += p;
        q_top += q;
        kl += p * (lp - q.max(f64::MIN_POSITIVE).ln());
    }
    let p_rest = (1.0 - p_top).max(0.0);
    let q_rest = (1.0 - q_top).max(1e-12);
    if p_rest > 0.0 {
        kl += p_rest * (p_rest / q_rest).ln();
    }
    kl.max(0.0)
}

/// One text as a server answered it: its distributions, and its tokens' texts as the server
/// showed them (to name the positions that moved; empty when it did not show them).
#[derive(Debug, Clone, PartialEq)]
pub struct TextAnswer {
    pub scored: ScoredText,
    pub tokens: Vec<String>,
}

/// One position where the distribution moved most.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Moved {
    /// The text (0-based, built-in texts first) and the position of the token predicted.
    pub text: usize,
    pub position: usize,
    pub kl: f64,
    /// The text's token there, as the new server showed it (when it did).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

/// How many of the most moved positions a comparison names.
const MOVED_SHOWN: usize = 5;

/// The new server's distributions against the reference's over the same texts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TextComparison {
    /// The mean over every position of every text (each position weighs the same, as perplexity
    /// and llama.cpp's mean KLD weigh them).
    pub mean_kl: f64,
    pub positions: usize,
    /// Each text's own mean.
    pub per_text: Vec<f64>,
    /// The share of positions (0 to 1) whose most likely token is the same (llama.cpp's "same
    /// top p").
    pub same_top: f64,
    /// The positions that moved most, largest first.
    pub moved_most: Vec<Moved>,
}

/// Compares the reference's texts with `answers`, the new server's scores of the same ids (one
/// per text, in order). A text the new server did not score, or scored over other ids, counts every position as moved
/// without bound (an infinite KL, which fails the stage): a text that cannot be compared is no
/// evidence the model is fine.
pub fn compare_texts(reference: &[ScoredText], answers: &[TextAnswer]) -> TextComparison {
    let mut all: Vec<Moved> = Vec::new();
    let mut per_text = Vec::with_capacity(reference.len());
    let (mut same, mut positions) = (0usize, 0usize);
    for (i, r) in reference.iter().enumerate() {
        let answer = answers.get(i).filter(|a| a.scored.ids == r.ids);
        let new = answer.map(|a| &a.scored);
        let mut sum = 0.0;
        for (t, top) in r.top.iter().enumerate() {
            let kl = match new.and_then(|s| s.top.get(t)) {
                Some(n) => {
                    same += usize::from(!n.0.is_empty() && n.0.first() == top.0.first());
                    position_kl(top, n)
                }
                None => f64::INFINITY,
            };
            sum += kl;
            all.push(Moved {
                text: i,
                position: t + 1,
                kl,
                token: answer.and_then(|a| a.tokens.get(t + 1)).cloned(),
            });
        }
        positions += r.top.len();
        per_text.push(if r.top.is_empty() {
            0.0
        } else {
            sum / r.top.len() as f64
        });
    }
    let total: f64 = all.iter().map(|m| m.kl).sum();
    all.sort_by(|a, b| b.kl.total_cmp(&a.kl));
    all.truncate(MOVED_SHOWN);
    TextComparison {
        mean_kl: if positions == 0 {
            0.0
        } else {
            total / positions as f64
        },
        positions,
        per_text,
        same_top: if positions == 0 {
            1.0
        } else {
            same as f64 / positions as f64
        },
        moved_most: all,
    }
}

/// `/tokenize` of the texts (SGLang's `TokenizeRequest`: `prompt` a list; special tokens added
/// as a plain completion adds them).
pub fn tokenize_request(texts: &[String]) -> Value {
    json!({ "prompt": texts })
}

/// The ids of an answer to [`tokenize_request`] for `expected` texts, each cut to fit: at most
/// [`MAX_TEXT_TOKENS`], and under `context_length` with a margin.
pub fn read_tokens(
    body: &str,
    expected: usize,
    context_length: Option<u32>,
) -> Result<Vec<Vec<u32>>, AnswerError> {
    let value: Value = serde_json::from_str(body).map_err(AnswerError::NotJson)?;
    if let Some(message) = server_error(&value) {
        return Err(AnswerError::Server(message));
    }
    let lists = match value.get("tokens") {
        // One text may be answered with one list.
        Some(Value::Array(l)) if l.first().is_some_and(Value::is_number) => {
            vec![Value::Array(l.clone())]
        }
        Some(Value::Array(l)) => l.clone(),
        _ => return Err(AnswerError::NoTokens),
    };
    if lists.len() != expected {
        return Err(AnswerError::Count {
            got: lists.len(),
            expected,
        });
    }
    let room = context_length
        .map_or(usize::MAX, |c| (c as usize).saturating_sub(CONTEXT_MARGIN))
        .min(MAX_TEXT_TOKENS);
    lists
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let ids = l
                .as_array()
                .ok_or(AnswerError::TokensNotList { index: i })?
                .iter()
                .map(|v| v.as_u64().and_then(|id| u32::try_from(id).ok()))
                .collect::<Option<Vec<u32>>>()
                .ok_or(AnswerError::NonId { index: i })?;
            Ok(ids.into_iter().take(room).collect())
        })
        .collect()
}

/// Teacher-forced scoring of the texts' ids: nothing generated, the `top` most likely tokens of
/// every position, the tokens' texts (to name the positions that moved).
pub fn text_scoring_request(texts: &[Vec<u32>], top: u32) -> Value {
    json!({
        "input_ids": texts,
        "sampling_params": {"temperature": 0, "max_new_tokens": 0},
        "return_logprob": true,
        "logprob_start_len": 0,
        "top_logprobs_num": top,
        "return_text_in_logprobs": true,
    })
}

/// The answer to [`text_scoring_request`] for `ids`: each text's distributions, and its tokens'
/// texts.
pub fn read_text_scores(body: &str, ids: &[Vec<u32>]) -> Result<Vec<TextAnswer>, AnswerError> {
    let value: Value = serde_json::from_str(body).map_err(AnswerError::NotJson)?;
    if let Some(message) = server_error(&value) {
        return Err(AnswerError::Server(message));
    }
    let items = match value {
        Value::Array(items) => items,
        one @ Value::Object(_) => vec![one],
        _ => return Err(AnswerError::NotList),
    };
    if items.len() != ids.len() {
        return Err(AnswerError::Count {
            got: items.len(),
            expected: ids.len(),
        });
    }
    items
        .iter()
        .zip(ids)
        .enumerate()
        .map(|(i, (item, ids))| {
            scored_text(item, ids).map_err(|fault| AnswerError::Text { index: i, fault })
        })
        .collect()
}

fn scored_text(item: &Value, ids: &[u32]) -> Result<TextAnswer, TextFault> {
    let meta = item.get("meta_info").ok_or(TextFault::NoMeta)?;
    let list = |key: &'static str| match meta.get(key) {
        Some(Value::Array(v)) => Ok(v),
        _ => Err(TextFault::NoList { key }),
    };
    let input = list("input_token_logprobs")?;
    let tops = list("input_top_logprobs")?;
    if input.len() != ids.len() || tops.len() != ids.len() {
        return Err(TextFault::Count {
            input: input.len(),
            tops: tops.len(),
            tokens: ids.len(),
        });
    }
    let tokens = input
        .iter()
        .map(|e| e.get(2).and_then(Value::as_str).unwrap_or("").to_string())
        .collect();
    let top = tops[1..]
        .iter()
        .enumerate()
        .map(|(t, entries)| {
            let entries = entries
                .as_array()
                .ok_or(TextFault::TopNotList { position: t + 1 })?;
            let mut pairs = Vec::with_capacity(entries.len());
            for e in entries {
                let lp = e.get(0).and_then(Value::as_f64);
                let id = e
                    .get(1)
                    .and_then(Value::as_u64)
                    .and_then(|i| u32::try_from(i).ok());
                match (lp, id) {
                    (Some(lp), Some(id)) => pairs.push((id, lp)),
                    _ => {
                        return Err(TextFault::TopEntry {
                            position: t + 1,
                            entry: e.clone(),
                        })
                    }
                }
            }
            pairs.sort_by(|a, b| b.1.total_cmp(&a.1));
            Ok(Top(
                pairs.iter().map(|p| p.0).collect(),
                pairs.iter().map(|p| p.1).collect(),
            ))
        })
        .collect::<Result<Vec<Top>, TextFault>>()?;
    Ok(TextAnswer {
        scored: ScoredText {
            ids: ids.to_vec(),
            top,
        },
        tokens,
    })
}

fn server_error(value: &Value) -> Option<String> {
    let o = value.as_object()?;
    if !(o.contains_key("error") || o.get("object") == Some(&json!("error"))) {
        return None;
    }
    let message = o
        .get("error")
        .and_then(|e| e.get("message").or(Some(e)))
        .or(o.get("message"))
        .map(|m| m.as_str().map_or_else(|| m.to_string(), str::to_string));
    Some(message.unwrap_or_default())
}

/// What is wrong with a server's answer to a fixed-text request.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    /// The body is not JSON.
    #[error("the answer is not JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    /// The server answered an error object.
    #[error("the server answered an error: {0}")]
    Server(String),
    /// Not one answer per text.
    #[error("{got} answers for {expected} texts")]
    Count { got: usize, expected: usize },
    /// A `/tokenize` answer without a `tokens` list.
    #[error("`tokens` is not a list")]
    NoTokens,
    /// A text's `tokens` entry is not a list.
    #[error("tokens[{index}] is not a list")]
    TokensNotList { index: usize },
    /// A text's tokens hold something other than a u32 id.
    #[error("tokens[{index}] holds a non-id")]
    NonId { index: usize },
    /// A scoring answer that is neither a list nor an object.
    #[error("the answer is not a list of objects")]
    NotList,
    /// One answer's fields are not those of a scored text.
    #[error("answer {index}: {fault}")]
    Text { index: usize, fault: TextFault },
}

/// What is wrong inside one answer to [`text_scoring_request`].
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum TextFault {
    /// No `meta_info` object.
    #[error("no `meta_info`")]
    NoMeta,
    /// A logprob list is missing: the request asked for none.
    #[error("no meta_info.{key} list (was return_logprob sent?)")]
    NoList { key: &'static str },
    /// Not one logprob and one top list per token sent.
    #[error("{input} input logprobs and {tops} top lists for {tokens} tokens")]
    Count {
        input: usize,
        tops: usize,
        tokens: usize,
    },
    /// A position's top list is not a list.
    #[error("input_top_logprobs[{position}] is not a list")]
    TopNotList { position: usize },
    /// A top list's entry is not `[logprob, token_id, ...]`.
    #[error("input_top_logprobs[{position}] holds {entry}")]
    TopEntry { position: usize, entry: Value },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn top(entries: &[(u32, f64)]) -> Top {
        Top(
            entries.iter().map(|e| e.0).collect(),
            entries.iter().map(|e| e.1.ln()).collect(),
        )
    }

    #[test]
    fn the_same_distribution_has_no_divergence() {
        let p = top(&[(1, 0.6), (2, 0.3)]);
        assert_eq!(position_kl(&p, &p), 0.0);
    }

    #[test]
    fn a_moved_distribution_gives_the_hand_computed_kl_with_the_rest_of_the_mass() {
        // Reference 0.6, 0.3, rest 0.1; new 0.5, 0.3 listed, then 0.15 on a third token: the rest
        // of the reference's top is 0.2 for the new server.
        let r = top(&[(1, 0.6), (2, 0.3)]);
        let n = top(&[(1, 0.5), (2, 0.3), (3, 0.15)]);
        let hand = 0.6 * (0.6f64 / 0.5).ln() + 0.1 * (0.1f64 / 0.2).ln();
        assert!(
            (position_kl(&r, &n) - hand).abs() < 1e-12,
            "{}",
            position_kl(&r, &n)
        );
    }

    #[test]
    fn a_reference_token_the_new_list_lacks_counts_at_what_the_list_leaves() {
        // Token 2 is not in the new list: it gets min(0.2, unlisted 0.05 / 1) = 0.05.
        let r = top(&[(1, 0.6), (2, 0.3)]);
        let n = top(&[(1, 0.75), (3, 0.2)]);
        let q2 = 0.05;
        let hand = 0.6 * (0.6f64 / 0.75).ln()
            + 0.3 * (0.3f64 / q2).ln()
            + 0.1 * (0.1f64 / (1.0 - 0.75 - q2)).ln();
        assert!((position_kl(&r, &n) - hand).abs() < 1e-12);
        // Never negative, even when rounding makes the reference's mass a hair over one.
        let over = Top(vec![1], vec![1e-5]);
        assert!(position_kl(&over, &top(&[(1, 0.999)])) >= 0.0);
    }

    fn scored(tops: Vec<Top>) -> ScoredText {
        ScoredText {
            ids: (0..=tops.len() as u32).collect(),
            top: tops,
        }
    }

    #[test]
    fn the_comparison_weighs_every_position_and_names_the_most_moved() {
        let same = top(&[(1, 0.9)]);
        let moved = top(&[(2, 0.9)]);
        let reference = vec![
            scored(vec![same.clone(), same.clone()]),
            scored(vec![same.clone()]),
        ];
        let answer = |scored, tokens: &[&str]| TextAnswer {
            scored,
            tokens: tokens.iter().map(|t| t.to_string()).collect(),
        };
        let new = vec![
            answer(
                scored(vec![same.clone(), moved.clone()]),
                &["a", " b", " c"],
            ),
            answer(scored(vec![same.clone()]), &[]),
        ];
        let c = compare_texts(&reference, &new);
        let one = position_kl(&same, &moved);
        assert!(one > 1.0);
        assert_eq!(c.positions, 3);
        assert!((c.mean_kl - one / 3.0).abs() < 1e-12);
        assert_eq!(c.per_text, vec![one / 2.0, 0.0]);
        assert!((c.same_top - 2.0 / 3.0).abs() < 1e-12);
        assert_eq!(
            c.moved_most[0],
            Moved {
                text: 0,
                position: 2,
                kl: one,
                token: Some(" c".into())
            }
        );
        // A text scored over other ids is not compared: it counts as moved without bound.
        let mut other = new.clone();
        other[1].scored.ids[0] = 99;
        let c = compare_texts(&reference, &other);
        assert!(c.mean_kl.is_infinite());
        assert_eq!(
            (c.moved_most[0].text, c.moved_most[0].token.as_ref()),
            (1, None)
        );
    }

    #[test]
    fn a_kept_reference_is_short_where_the_model_is_sure() {
        let s = ScoredText {
            ids: vec![5, 6, 7],
            top: vec![
                Top(vec![6, 8, 9], vec![-0.000_012_34, -12.0, -13.0]),
                Top(vec![7, 1, 2], vec![-0.123_456, -2.5, -3.0]),
            ],
        };
        let kept = s.kept(2);
        assert_eq!(kept.top[0], Top(vec![6], vec![-0.0]));
        assert_eq!(kept.top[1], Top(vec![7, 1], vec![-0.1235, -2.5]));
        assert_eq!(
            serde_json::to_string(&kept.top[1]).unwrap(),
            "[[7,1],[-0.1235,-2.5]]"
        );
    }

    #[test]
    fn the_builtin_texts_are_prose_and_a_texts_file_adds_its_own() {
        let builtin = texts(true, None);
        assert_eq!(builtin.len(), 3);
        let words: Vec<usize> = builtin
            .iter()
            .map(|t| t.split_whitespace().count())
            .collect();
        assert!(
            words[0] > 90 && words[1] > 250 && words[2] > 900,
            "{words:?}"
        );
        let own = parse_texts("t.jsonl", "# mine\n{\"text\": \"Two words.\"}\n\n").unwrap();
        assert_eq!(own, vec!["Two words.".to_string()]);
        assert_eq!(texts(true, Some(&own)).len(), 4);
        assert_eq!(texts(false, Some(&own)), vec!["Two words.".to_string()]);
        let err = parse_texts("t.jsonl", "{\"prompt\": \"x\"}\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("t.jsonl:1") && err.contains("no `text`"),
            "{err}"
        );
    }

    /// An answer shaped as SGLang 0.5.23 answers `text_scoring_request` (two positions after
    /// the first, top 2).
    const ANSWER: &str = r#"[{"text": "", "meta_info": {"prompt_tokens": 3,
        "input_token_logprobs": [[null, 5, "The"], [-0.5, 6, " fog"], [-1.0, 7, " lifted"]],
        "input_top_logprobs": [null, [[-0.5, 6, " fog"], [-1.2, 9, " sea"]], [[-0.9, 8, " rose"], [-1.0, 7, " lifted"]]],
        "output_token_logprobs": [], "output_top_logprobs": []}}]"#;

    #[test]
    fn scores_and_tokens_read_from_sglangs_answer() {
        let read = read_text_scores(ANSWER, &[vec![5, 6, 7]]).unwrap();
        let TextAnswer { scored: s, tokens } = &read[0];
        assert_eq!(tokens, &["The", " fog", " lifted"]);
        assert_eq!(s.top[0], Top(vec![6, 9], vec![-0.5, -1.2]));
        assert_eq!(s.top[1], Top(vec![8, 7], vec![-0.9, -1.0]));
        let err = read_text_scores(ANSWER, &[vec![5, 6]])
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "answer 0: 3 input logprobs and 3 top lists for 2 tokens"
        );
        assert!(matches!(
            read_text_scores(ANSWER, &[vec![5, 6]]),
            Err(AnswerError::Text {
                index: 0,
                fault: TextFault::Count { tokens: 2, .. }
            })
        ));
        assert_eq!(
            read_text_scores("[]", &[vec![1]]).unwrap_err().to_string(),
            "0 answers for 1 texts"
        );
        assert!(matches!(
            read_text_scores("3", &[vec![1]]),
            Err(AnswerError::NotList)
        ));
        let non_id = read_tokens(r#"{"tokens": [[1, "x"]]}"#, 1, None).unwrap_err();
        assert_eq!(non_id.to_string(), "tokens[0] holds a non-id");
        assert!(matches!(non_id, AnswerError::NonId { index: 0 }));
        let r = text_scoring_request(&[vec![5, 6, 7]], 40);
        assert_eq!(r["top_logprobs_num"], 40);
        assert_eq!(r["sampling_params"]["max_new_tokens"], 0);
    }

    #[test]
    fn token_ids_are_cut_to_the_context_and_the_bound() {
        let body = r#"{"tokens": [[1, 2, 3, 4, 5], [6]], "count": [5, 1], "max_model_len": 2048}"#;
        assert_eq!(
            read_tokens(body, 2, Some(19)).unwrap(),
            vec![vec![1, 2, 3], vec![6]]
        );
        let long: Vec<u32> = (0..3000).collect();
        let body = json!({ "tokens": [long] }).to_string();
        assert_eq!(
            read_tokens(&body, 1, None).unwrap()[0].len(),
            MAX_TEXT_TOKENS
        );
        assert!(matches!(
            read_tokens(r#"{"error": {"message": "no"}}"#, 1, None),
            Err(AnswerError::Server(m)) if m == "no"
        ));
    }
}
