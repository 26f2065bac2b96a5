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

/// The generations of an answer to [`generation_request`] for `expected` prompts. `output_ids`
/// may be missing (the ids of `output_token_logprobs` are taken).
pub fn read_generations(body: &str, expected: usize) -> Result<Vec<Generated>, String> {
    items(body, expected)?
        .iter()
        .enumerate()
        .map(|(i, item)| generated(item).map_err(|e| format!("answer {i}: {e}")))
        .collect()
}

fn generated(item: &Value) -> Result<Generated, String> {
    let meta = item.get("meta_info").ok_or("no `meta_info`")?;
    let input = entries(meta, "input_token_logprobs")?;
    let prompt_ids = input
        .iter()
        .enumerate()
        .map(|(t, e)| token_id(e, "input_token_logprobs", t))
        .collect::<Result<Vec<u32>, String>>()?;
    if let Some(n) = meta.get("prompt_tokens").and_then(Value::as_u64) {
        if n as usize != prompt_ids.len() {
            return Err(format!(
                "meta_info.prompt_tokens is {n} but input_token_logprobs has {} entries (was logprob_start_len 0 ignored?)",
                prompt_ids.len()
            ));
        }
    }
    let output = entries(meta, "output_token_logprobs")?;
    let output_logprobs = output
        .iter()
        .enumerate()
        .map(|(t, e)| logprob(e, "output_token_logprobs", t))
        .collect::<Result<Vec<f64>, String>>()?;
    let output_ids = match item.get("output_ids") {
        None | Some(Value::Null) => output
            .iter()
            .enumerate()
            .map(|(t, e)| token_id(e, "output_token_logprobs", t))
            .collect::<Result<Vec<u32>, String>>()?,
        Some(Value::Array(ids)) => ids
            .iter()
            .enumerate()
            .map(|(t, id)| {
                id_of(id).ok_or_else(|| format!("output_ids[{t}] is {id}, not a token id"))
            })
            .collect::<Result<Vec<u32>, String>>()?,
        Some(other) => return Err(format!("`output_ids` is {other}, not a list")),
    };
    if output_ids.len() != output_logprobs.len() {
        return Err(format!(
            "{} output_ids but {} output_token_logprobs",
            output_ids.len(),
            output_logprobs.len()
        ));
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
pub fn read_scores(body: &str, reference_lengths: &[usize]) -> Result<Vec<Vec<f64>>, String> {
    let items = items(body, reference_lengths.len())?;
    items
        .iter()
        .zip(reference_lengths)
        .enumerate()
        .map(|(i, (item, &n))| scores(item, n).map_err(|e| format!("answer {i}: {e}")))
        .collect()
}

fn scores(item: &Value, n: usize) -> Result<Vec<f64>, String> {
    let meta = item.get("meta_info").ok_or("no `meta_info`")?;
    let input = entries(meta, "input_token_logprobs")?;
    if input.len() < n {
        return Err(format!(
            "input_token_logprobs has {} entries, fewer than the {n} reference tokens",
            input.len()
        ));
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
pub fn read_answers(body: &str, expected: usize) -> Result<Vec<String>, String> {
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
fn items(body: &str, expected: usize) -> Result<Vec<Value>, String> {
    let value: Value =
        serde_json::from_str(body).map_err(|e| format!("the answer is not JSON: {e}"))?;
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
            return Err(format!("the server answered an error: {message}"));
        }
        Value::Object(_) => vec![value],
        other => return Err(format!("the answer is {other}, not a list of objects")),
    };
    if items.len() != expected {
        let prompts = if expected == 1 { "prompt" } else { "prompts" };
        return Err(format!("{} answers for {expected} {prompts}", items.len()));
    }
    if let Some(i) = items.iter().position(|v| !v.is_object()) {
        return Err(format!("answer {i} is {}, not an object", items[i]));
    }
    Ok(items)
}

fn entries<'a>(meta: &'a Value, key: &str) -> Result<&'a Vec<Value>, String> {
    match meta.get(key) {
        Some(Value::Array(v)) => Ok(v),
        None | Some(Value::Null) => Err(format!("no meta_info.{key} (was return_logprob sent?)")),
        Some(other) => Err(format!("meta_info.{key} is {other}, not a list")),
    }
}

fn logprob(entry: &Value, key: &str, t: usize) -> Result<f64, String> {
    match entry.get(0) {
        Some(Value::Null) => Err(format!("meta_info.{key}[{t}][0] is null, not a logprob")),
        Some(v) => v
            .as_f64()
            .ok_or_else(|| format!("meta_info.{key}[{t}][0] is {v}, not a logprob")),
        None => Err(format!(
            "meta_info.{key}[{t}] is {entry}, not [logprob, token_id, text]"
        )),
    }
}

fn token_id(entry: &Value, key: &str, t: usize) -> Result<u32, String> {
    match entry.get(1) {
        Some(v) => {
            id_of(v).ok_or_else(|| format!("meta_info.{key}[{t}][1] is {v}, not a token id"))
        }
        None => Err(format!(
            "meta_info.{key}[{t}] is {entry}, not [logprob, token_id, text]"
        )),
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
        let err = |body: &str, n| read_generations(body, n).unwrap_err();
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
        assert_eq!(
            err(r#"{"object": "error", "message": "context too long"}"#, 1),
            "the server answered an error: context too long"
        );
        assert_eq!(
            err(r#"{"error": {"message": "bad input_ids"}}"#, 1),
            "the server answered an error: bad input_ids"
        );
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
            read_scores(body, &[2, 2]).unwrap_err(),
            "answer 1: meta_info.input_token_logprobs[0][0] is null, not a logprob"
        );
        assert_eq!(
            read_scores(body, &[5, 1]).unwrap_err(),
            "answer 0: input_token_logprobs has 4 entries, fewer than the 5 reference tokens"
        );
        assert_eq!(
            read_scores(body, &[1]).unwrap_err(),
            "2 answers for 1 prompt"
        );
    }
}
