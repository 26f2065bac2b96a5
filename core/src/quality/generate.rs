//! The bodies sent to SGLang's native `/generate` and the readers of its answers, as SGLang's own
//! precision tests use them (`sglang/test/kl_test_utils.py`, 0.5.23): a greedy generation with
//! logprobs, and a teacher-forced scoring of given tokens (`max_new_tokens: 0`, the logprobs of
//! the input). Sending them is the binary's.
//!
//! An answer is a JSON list with one object per prompt (a single object when one prompt was sent
//! as a string): `output_ids`, and `meta_info` with `input_token_logprobs` and
//! `output_token_logprobs`, each a list of `[logprob, token_id, text]` (the prompt's first
//! logprob null).

use serde_json::{json, Value};

/// One prompt's greedy generation, as read from the answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Generated {
    /// The prompt's tokens as the server tokenized it (`input_token_logprobs`' ids).
    pub prompt_ids: Vec<u32>,
    pub output_ids: Vec<u32>,
    /// One per output id.
    pub output_logprobs: Vec<f64>,
}

fn greedy(max_new_tokens: u32) -> Value {
    json!({"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": true})
}

/// Greedy generation of `max_new_tokens` tokens for each prompt (`ignore_eos`, so every prompt
/// gives exactly that many), with the logprobs of the prompt and of the output.
pub fn generation_request(prompts: &[String], max_new_tokens: u32) -> Value {
    json!({
        "text": prompts,
        "sampling_params": greedy(max_new_tokens),
        "return_logprob": true,
        "logprob_start_len": 0,
        "return_text_in_logprobs": false,
    })
}

/// The same from token ids: a new server regenerates from exactly the reference's prompt tokens,
/// whatever its tokenizer would make of the text.
pub fn generation_request_ids(prompts: &[Vec<u32>], max_new_tokens: u32) -> Value {
    json!({
        "input_ids": prompts,
        "sampling_params": greedy(max_new_tokens),
        "return_logprob": true,
        "logprob_start_len": 0,
        "return_text_in_logprobs": false,
    })
}

/// Teacher-forced scoring: each (prompt ids, reference output ids) sent as one input, nothing
/// generated, every input token's logprob returned.
pub fn scoring_request(sequences: &[(Vec<u32>, Vec<u32>)]) -> Value {
    let inputs: Vec<Vec<u32>> = sequences
        .iter()
        .map(|(prompt, output)| prompt.iter().chain(output).copied().collect())
        .collect();
    json!({
        "input_ids": inputs,
        "sampling_params": greedy(0),
        "return_logprob": true,
        "logprob_start_len": 0,
        "return_text_in_logprobs": false,
    })
}

/// A plain greedy answer to each prompt (the needle and case checks): stops at the end of
/// sequence, no logprobs.
pub fn answer_request(prompts: &[String], max_new_tokens: u32) -> Value {
    json!({
        "text": prompts,
        "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens},
    })
}

/// What is wrong with a server's answer to a `/generate` request.
#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    /// The body is not JSON.
    #[error("the answer is not JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    /// The server answered an error object, not generations.
    #[error("the server answered an error: {message}")]
    Server { message: String },
    /// Neither a list nor an object.
    #[error("the answer is {value}, not a list of objects")]
    NotList { value: Value },
    /// Not one answer per prompt.
    #[error("{got} answers for {expected} {}", if *.expected == 1 { "prompt" } else { "prompts" })]
    Count { got: usize, expected: usize },
    /// An element of the list is not an object.
    #[error("answer {index} is {value}, not an object")]
    NotObject { index: usize, value: Value },
    /// One answer's fields are wrong.
    #[error("answer {index}: {fault}")]
    Answer { index: usize, fault: ItemFault },
}

/// What is wrong inside one answer object; `key` is the `meta_info` list, `t` the position in
/// it.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ItemFault {
    /// No `meta_info` object.
    #[error("no `meta_info`")]
    NoMeta,
    /// A logprob list is missing: the request asked for none.
    #[error("no meta_info.{key} (was return_logprob sent?)")]
    NoList { key: &'static str },
    /// A logprob list is something else.
    #[error("meta_info.{key} is {value}, not a list")]
    NotList { key: &'static str, value: Value },
    /// The server scored fewer or more prompt tokens than it counted.
    #[error("meta_info.prompt_tokens is {counted} but input_token_logprobs has {scored} entries (was logprob_start_len 0 ignored?)")]
    PromptTokens { counted: u64, scored: usize },
    /// A logprob is null (the prompt's first token has none).
    #[error("meta_info.{key}[{t}][0] is null, not a logprob")]
    NullLogprob { key: &'static str, t: usize },
    /// A logprob is not a number.
    #[error("meta_info.{key}[{t}][0] is {value}, not a logprob")]
    NotLogprob {
        key: &'static str,
        t: usize,
        value: Value,
    },
    /// An entry is not `[logprob, token_id, text]`.
    #[error("meta_info.{key}[{t}] is {entry}, not [logprob, token_id, text]")]
    NotEntry {
        key: &'static str,
        t: usize,
        entry: Value,
    },
    /// An entry's token id is not a u32.
    #[error("meta_info.{key}[{t}][1] is {value}, not a token id")]
    NotTokenId {
        key: &'static str,
        t: usize,
        value: Value,
    },
    /// An `output_ids` item is not a u32.
    #[error("output_ids[{t}] is {value}, not a token id")]
    NotOutputId { t: usize, value: Value },
    /// `output_ids` is not a list.
    #[error("`output_ids` is {value}, not a list")]
    OutputIdsNotList { value: Value },
    /// Not one output logprob per output id.
    #[error("{ids} output_ids but {logprobs} output_token_logprobs")]
    OutputCount { ids: usize, logprobs: usize },
    /// A scored sequence shorter than its reference output.
    #[error(
        "input_token_logprobs has {scored} entries, fewer than the {reference} reference tokens"
    )]
    TooFewScored { scored: usize, reference: usize },
}

/// The generations of an answer to [`generation_request`] for `expected` prompts. `output_ids`
/// may be missing (the ids of `output_token_logprobs` are taken).
pub fn read_generations(body: &str, expected: usize) -> Result<Vec<Generated>, GenerateError> {
    items(body, expected)?
        .iter()
        .enumerate()
        .map(|(index, item)| {
            generated(item).map_err(|fault| GenerateError::Answer { index, fault })
        })
        .collect()
}

fn generated(item: &Value) -> Result<Generated, ItemFault> {
    let meta = item.get("meta_info").ok_or(ItemFault::NoMeta)?;
    let input = entries(meta, "input_token_logprobs")?;
    let prompt_ids = input
        .iter()
        .enumerate()
        .map(|(t, e)| token_id(e, "input_token_logprobs", t))
        .collect::<Result<Vec<u32>, ItemFault>>()?;
    if let Some(n) = meta.get("prompt_tokens").and_then(Value::as_u64) {
        if n as usize != prompt_ids.len() {
            return Err(ItemFault::PromptTokens {
                counted: n,
                scored: prompt_ids.len(),
            });
        }
    }
    let output = entries(meta, "output_token_logprobs")?;
    let output_logprobs = output
        .iter()
        .enumerate()
        .map(|(t, e)| logprob(e, "output_token_logprobs", t))
        .collect::<Result<Vec<f64>, ItemFault>>()?;
    let output_ids = match item.get("output_ids") {
        None | Some(Value::Null) => output
            .iter()
            .enumerate()
            .map(|(t, e)| token_id(e, "output_token_logprobs", t))
            .collect::<Result<Vec<u32>, ItemFault>>()?,
        Some(Value::Array(ids)) => ids
            .iter()
            .enumerate()
            .map(|(t, id)| {
                id_of(id).ok_or_else(|| ItemFault::NotOutputId {
                    t,
                    value: id.clone(),
                })
            })
            .collect::<Result<Vec<u32>, ItemFault>>()?,
        Some(other) => {
            return Err(ItemFault::OutputIdsNotList {
                value: other.clone(),
            })
        }
    };
    if output_ids.len() != output_logprobs.len() {
        return Err(ItemFault::OutputCount {
            ids: output_ids.len(),
            logprobs: output_logprobs.len(),
        });
    }
    Ok(Generated {
        prompt_ids,
        output_ids,
        output_logprobs,
    })
}

/// The scores of an answer to [`scoring_request`]: for each sequence, the logprobs of its last
/// `reference_lengths[i]` input tokens (the reference output's), as `_get_input_logprobs` takes
/// them.
pub fn read_scores(
    body: &str,
    reference_lengths: &[usize],
) -> Result<Vec<Vec<f64>>, GenerateError> {
    let items = items(body, reference_lengths.len())?;
    items
        .iter()
        .zip(reference_lengths)
        .enumerate()
        .map(|(index, (item, &n))| {
            scores(item, n).map_err(|fault| GenerateError::Answer { index, fault })
        })
        .collect()
}

fn scores(item: &Value, n: usize) -> Result<Vec<f64>, ItemFault> {
    let meta = item.get("meta_info").ok_or(ItemFault::NoMeta)?;
    let input = entries(meta, "input_token_logprobs")?;
    if input.len() < n {
        return Err(ItemFault::TooFewScored {
            scored: input.len(),
            reference: n,
        });
    }
    let from = input.len() - n;
    input[from..]
        .iter()
        .enumerate()
        .map(|(t, e)| logprob(e, "input_token_logprobs", from + t))
        .collect()
}

/// The answers' texts of an answer to [`answer_request`]; a null or missing text reads as empty
/// (an answer that finds nothing).
pub fn read_answers(body: &str, expected: usize) -> Result<Vec<String>, GenerateError> {
    Ok(items(body, expected)?
        .iter()
        .map(|item| {
            item.get("text")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        })
        .collect())
}

/// The answer's objects: a list, or one object; an error the server answered is said as such.
fn items(body: &str, expected: usize) -> Result<Vec<Value>, GenerateError> {
    let value: Value = serde_json::from_str(body).map_err(GenerateError::NotJson)?;
    let items = match value {
        Value::Array(items) => items,
        Value::Object(ref o)
            if o.contains_key("error") || o.get("object") == Some(&json!("error")) =>
        {
            let message = o
                .get("error")
                .and_then(|e| e.get("message").or(Some(e)))
                .or(o.get("message"))
                .map(|m| m.as_str().map_or_else(|| m.to_string(), str::to_string))
                .unwrap_or_default();
            return Err(GenerateError::Server { message });
        }
        Value::Object(_) => vec![value],
        other => return Err(GenerateError::NotList { value: other }),
    };
    if items.len() != expected {
        return Err(GenerateError::Count {
            got: items.len(),
            expected,
        });
    }
    if let Some(index) = items.iter().position(|v| !v.is_object()) {
        return Err(GenerateError::NotObject {
            index,
            value: items[index].clone(),
        });
    }
    Ok(items)
}

fn entries<'a>(meta: &'a Value, key: &'static str) -> Result<&'a Vec<Value>, ItemFault> {
    match meta.get(key) {
        Some(Value::Array(v)) => Ok(v),
        None | Some(Value::Null) => Err(ItemFault::NoList { key }),
        Some(other) => Err(ItemFault::NotList {
            key,
            value: other.clone(),
        }),
    }
}

fn logprob(entry: &Value, key: &'static str, t: usize) -> Result<f64, ItemFault> {
    match entry.get(0) {
        Some(Value::Null) => Err(ItemFault::NullLogprob { key, t }),
        Some(v) => v.as_f64().ok_or_else(|| ItemFault::NotLogprob {
            key,
            t,
            value: v.clone(),
        }),
        None => Err(ItemFault::NotEntry {
            key,
            t,
            entry: entry.clone(),
        }),
    }
}

fn token_id(entry: &Value, key: &'static str, t: usize) -> Result<u32, ItemFault> {
    match entry.get(1) {
        Some(v) => id_of(v).ok_or_else(|| ItemFault::NotTokenId {
            key,
            t,
            value: v.clone(),
        }),
        None => Err(ItemFault::NotEntry {
            key,
            t,
            entry: entry.clone(),
        }),
    }
}

fn id_of(v: &Value) -> Option<u32> {
    v.as_u64().and_then(|id| u32::try_from(id).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two prompts' generations, shaped as SGLang 0.5.23 answers them.
    const LIST: &str = r#"[
      {"text": " the end", "output_ids": [7, 8],
       "meta_info": {"id": "a", "finish_reason": {"type": "length", "length": 2},
         "prompt_tokens": 3, "completion_tokens": 2, "cached_tokens": 0,
         "input_token_logprobs": [[null, 1, null], [-2.5, 2, null], [-0.5, 3, null]],
         "output_token_logprobs": [[-0.1, 7, null], [-0.25, 8, null]]}},
      {"text": null,
       "meta_info": {"prompt_tokens": 1,
         "input_token_logprobs": [[null, 1, null]],
         "output_token_logprobs": [[-1.0, 9, null], [-2.0, 10, null]]}}
    ]"#;

    #[test]
    fn the_requests_are_shaped_as_sglangs_tests_send_them() {
        let g = generation_request(&["a".into(), "b".into()], 32);
        assert_eq!(
            g,
            json!({"text": ["a", "b"],
                   "sampling_params": {"temperature": 0, "max_new_tokens": 32, "ignore_eos": true},
                   "return_logprob": true, "logprob_start_len": 0, "return_text_in_logprobs": false})
        );
        let s = scoring_request(&[(vec![1, 2], vec![7, 8]), (vec![1], vec![9])]);
        assert_eq!(s["input_ids"], json!([[1, 2, 7, 8], [1, 9]]));
        assert_eq!(s["sampling_params"]["max_new_tokens"], json!(0));
        assert_eq!(s["logprob_start_len"], json!(0));
        let r = generation_request_ids(&[vec![1, 2]], 4);
        assert_eq!(r["input_ids"], json!([[1, 2]]));
        assert!(r.get("text").is_none());
        let a = answer_request(&["q".into()], 16);
        assert!(
            a.get("return_logprob").is_none() && a["sampling_params"].get("ignore_eos").is_none()
        );
    }

    #[test]
    fn generations_read_from_a_list_with_or_without_output_ids() {
        let g = read_generations(LIST, 2).unwrap();
        assert_eq!(
            g[0],
            Generated {
                prompt_ids: vec![1, 2, 3],
                output_ids: vec![7, 8],
                output_logprobs: vec![-0.1, -0.25]
            }
        );
        assert_eq!(g[1].output_ids, vec![9, 10]);
        assert_eq!(g[1].prompt_ids, vec![1]);
    }

    #[test]
    fn a_single_prompt_may_be_answered_with_one_object() {
        let one: Value = serde_json::from_str::<Vec<Value>>(LIST).unwrap().remove(0);
        let g = read_generations(&one.to_string(), 1).unwrap();
        assert_eq!(g[0].output_ids, vec![7, 8]);
        assert_eq!(read_answers(&one.to_string(), 1).unwrap(), vec![" the end"]);
    }

    #[test]
    fn what_is_wrong_with_an_answer_is_said() {
        let err = |body: &str, n| read_generations(body, n).unwrap_err().to_string();
        assert!(err("<html>", 1).starts_with("the answer is not JSON"));
        assert_eq!(err(LIST, 3), "2 answers for 3 prompts");
        assert_eq!(err("[1]", 1), "answer 0 is 1, not an object");
        assert_eq!(err(r#"[{"text": "x"}]"#, 1), "answer 0: no `meta_info`");
        let null = LIST.replace("[-0.25, 8, null]", "[null, 8, null]");
        assert_eq!(
            err(&null, 2),
            "answer 0: meta_info.output_token_logprobs[1][0] is null, not a logprob"
        );
        let short = LIST.replace("\"prompt_tokens\": 3", "\"prompt_tokens\": 9");
        assert!(err(&short, 2).starts_with("answer 0: meta_info.prompt_tokens is 9"));
        let no_lp = r#"{"text": "x", "meta_info": {"prompt_tokens": 1}}"#;
        assert_eq!(
            err(no_lp, 1),
            "answer 0: no meta_info.input_token_logprobs (was return_logprob sent?)"
        );
        let mismatch = LIST.replace("\"output_ids\": [7, 8]", "\"output_ids\": [7]");
        assert_eq!(
            err(&mismatch, 2),
            "answer 0: 1 output_ids but 2 output_token_logprobs"
        );
        assert!(matches!(
            read_generations(&mismatch, 2),
            Err(GenerateError::Answer {
                index: 0,
                fault: ItemFault::OutputCount {
                    ids: 1,
                    logprobs: 2
                }
            })
        ));
        assert_eq!(
            err(r#"{"object": "error", "message": "context too long"}"#, 1),
            "the server answered an error: context too long"
        );
        assert_eq!(
            err(r#"{"error": {"message": "bad input_ids"}}"#, 1),
            "the server answered an error: bad input_ids"
        );
        assert!(matches!(
            read_generations("<html>", 1),
            Err(GenerateError::NotJson(_))
        ));
        assert!(matches!(
            read_generations(LIST, 3),
            Err(GenerateError::Count {
                got: 2,
                expected: 3
            })
        ));
    }

    #[test]
    fn scores_are_each_sequences_last_input_logprobs() {
        let body = r#"[
          {"meta_info": {"input_token_logprobs": [[null, 1, null], [-2.5, 2, null], [-0.11, 7, null], [-0.26, 8, null]]}},
          {"meta_info": {"input_token_logprobs": [[null, 1, null], [-1.5, 9, null]]}}
        ]"#;
        assert_eq!(
            read_scores(body, &[2, 1]).unwrap(),
            vec![vec![-0.11, -0.26], vec![-1.5]]
        );
        assert_eq!(
            read_scores(body, &[2, 2]).unwrap_err().to_string(),
            "answer 1: meta_info.input_token_logprobs[0][0] is null, not a logprob"
        );
        assert_eq!(
            read_scores(body, &[5, 1]).unwrap_err().to_string(),
            "answer 0: input_token_logprobs has 4 entries, fewer than the 5 reference tokens"
        );
        assert!(matches!(
            read_scores(body, &[5, 1]),
            Err(GenerateError::Answer {
                index: 0,
                fault: ItemFault::TooFewScored {
                    scored: 4,
                    reference: 5
                }
            })
        ));
        assert_eq!(
            read_scores(body, &[1]).unwrap_err().to_string(),
            "2 answers for 1 prompt"
        );
    }
}
