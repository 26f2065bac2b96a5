//! The long-context check: a key hidden in a seeded filler at several depths, for prompts of
//! several lengths, and whether the answer found it. A kernel that is right on short prompts and
//! wrong past some length (a rope scaling, a chunked prefill, a paged attention bug) shows here and
//! not in the KL comparison's short prompts.
//!
//! Lengths are counted in words, taken for tokens: the filler is plain English, which a BPE
//! tokenizer cuts into about 1.3 tokens a word, so a prompt of length N is about 1.3 N tokens. The
//! ladder leaves room for that: its longest prompt is
//! `(context_length - max_new_tokens - 64) / 1.3` words, so prompt and answer fit.

use super::prompts::{passage, Lcg};
use super::{NeedleRate, NeedleSpec};

/// One prompt of the check.
#[derive(Debug, Clone, PartialEq)]
pub struct Needle {
    /// About this many words (see the module's note on tokens).
    pub length: u32,
    /// Where the key sits, as a fraction of the prompt.
    pub depth: f64,
    /// Six digits, different for every needle of a set.
    pub key: u32,
    pub prompt: String,
}

/// What the prompt opens with: no "The key is" in it, so the only such sentence is the key's.
const INTRO: &str =
    "Read the following text carefully. Somewhere in it is a key, a number of six digits.";
/// What it ends with.
pub const QUESTION: &str = "What is the key? Answer with the number only.";

/// The ladder's steps: 1024 words, then four times more each step while it fits.
const LADDER_START: u32 = 1024;
/// The served context length assumed when the server does not say.
const UNKNOWN_CONTEXT: u32 = 8192;
/// Tokens kept free besides the answer's (a chat template, the tokenizer's guess being low).
const MARGIN_TOKENS: u32 = 64;

/// The check's prompts: for each length (the spec's, or the ladder up to the served context
/// length) and each depth, a seeded filler with `The key is <KEY>.` at that depth and
/// [`QUESTION`] at the end.
pub fn needles(spec: &NeedleSpec, context_length: Option<u32>, max_new_tokens: u32) -> Vec<Needle> {
    let lengths = if spec.lengths.is_empty() {
        ladder(context_length, max_new_tokens)
    } else {
        spec.lengths.clone()
    };
    let mut keys = Vec::new();
    let mut out = Vec::new();
    for &length in &lengths {
        for (d, &depth) in spec.depths.iter().enumerate() {
            let mut g = Lcg::new(u64::from(length) << 8 | d as u64);
            let mut key = 100_000 + (g.next() % 900_000) as u32;
            while keys.contains(&key) {
                key = 100_000 + (g.next() % 900_000) as u32;
            }
            keys.push(key);
            out.push(Needle {
                length,
                depth,
                key,
                prompt: prompt(length, depth, key),
            });
        }
    }
    out
}

/// 1024, 4096, 16384, ... words while they fit in `context_length`, then the longest that fits
/// (rounded down to 256 words) when it is a quarter longer than the last step; at least one
/// length (the longest that fits, 64 at least).
pub(super) fn ladder(context_length: Option<u32>, max_new_tokens: u32) -> Vec<u32> {
    let context = context_length.unwrap_or(UNKNOWN_CONTEXT);
    let room = context.saturating_sub(max_new_tokens + MARGIN_TOKENS);
    let top = (u64::from(room) * 10 / 13) as u32;
    let mut lengths = Vec::new();
    let mut step = LADDER_START;
    while step <= top {
        lengths.push(step);
        step = step.saturating_mul(4);
    }
    let rounded = top / 256 * 256;
    match lengths.last() {
        None => lengths.push(top.max(64)),
        Some(&last) if u64::from(rounded) * 4 > u64::from(last) * 5 => lengths.push(rounded),
        Some(_) => {}
    }
    lengths
}

/// The prompt: the intro, filler up to `depth` of `length` words, the key's line, more filler,
/// the question.
fn prompt(length: u32, depth: f64, key: u32) -> String {
    let fixed = words(INTRO) + words(QUESTION) + 4;
    let filler = length.saturating_sub(fixed).max(2);
    let before = ((f64::from(length) * depth).round() as u32)
        .saturating_sub(words(INTRO))
        .clamp(1, filler - 1);
    let seed = u64::from(length) * 7919;
    let head = passage(seed, before);
    let tail = passage(seed + 1, filler - words(&head).min(filler - 1));
    format!("{INTRO}\n\n{head}\nThe key is {key}.\n{tail}\n\n{QUESTION}")
}

fn words(s: &str) -> u32 {
    s.split_whitespace().count() as u32
}

/// Whether `answer` gives the needle's key: a run of digits in it equal to the key (so
/// "The key is 123456." counts, and 1234567 does not).
pub fn found(needle: &Needle, answer: &str) -> bool {
    let key = needle.key.to_string();
    answer
        .split(|c: char| !c.is_ascii_digit())
        .any(|run| run == key)
}

/// The pass rate per length, in the needles' order, from whether each one's answer found its
/// key (`found[i]` for `needles[i]`).
pub fn rates(needles: &[Needle], found: &[bool]) -> Vec<NeedleRate> {
    let mut out: Vec<NeedleRate> = Vec::new();
    for (i, n) in needles.iter().enumerate() {
        let hit = found.get(i).copied().unwrap_or(false);
        let at = match out.iter().position(|r| r.length == n.length) {
            Some(at) => at,
            None => {
                out.push(NeedleRate {
                    length: n.length,
                    passed: 0,
                    total: 0,
                });
                out.len() - 1
            }
        };
        out[at].total += 1;
        out[at].passed += u32::from(hit);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(lengths: Vec<u32>) -> NeedleSpec {
        NeedleSpec {
            lengths,
            ..NeedleSpec::default()
        }
    }

    #[test]
    fn the_key_sits_at_about_its_depth_of_a_prompt_of_about_its_length() {
        let set = needles(&spec(vec![2000, 64]), None, 32);
        assert_eq!(set.len(), 6);
        for n in &set {
            let all: Vec<&str> = n.prompt.split_whitespace().collect();
            let total = all.len() as f64;
            // Whole sentences: over by a sentence or two at most.
            assert!(
                (total - f64::from(n.length)).abs() <= 30.0,
                "{} words for {}",
                total,
                n.length
            );
            let line = format!("The key is {}.", n.key);
            assert_eq!(n.prompt.matches("The key is").count(), 1);
            let at = n.prompt.find(&line).expect("the key's line");
            let before = words(&n.prompt[..at]) as f64;
            if n.length >= 1000 {
                assert!(
                    (before / total - n.depth).abs() < 0.02,
                    "{before} of {total}"
                );
            }
            assert!((100_000..1_000_000).contains(&n.key));
            assert!(n
                .prompt
                .ends_with("\n\nWhat is the key? Answer with the number only."));
            assert!(n.prompt.contains(&format!("\n{line}\n")));
        }
        let mut keys: Vec<u32> = set.iter().map(|n| n.key).collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), 6);
        assert_eq!(set, needles(&spec(vec![2000, 64]), None, 32), "seeded");
        // The filler holds no other number.
        let digits: String = set[0].prompt.chars().filter(char::is_ascii_digit).collect();
        assert_eq!(digits, set[0].key.to_string());
    }

    #[test]
    fn the_ladder_climbs_to_the_served_context_and_leaves_room() {
        assert_eq!(ladder(Some(32768), 32), vec![1024, 4096, 16384, 25088]);
        assert_eq!(
            ladder(Some(131072), 32),
            vec![1024, 4096, 16384, 65536, 100608]
        );
        // 4096 words are about 5,300 tokens: in 8192 with room, and so are 6144.
        assert_eq!(ladder(None, 32), vec![1024, 4096, 6144]);
        assert_eq!(ladder(Some(5500), 32), vec![1024, 4096]);
        assert_eq!(ladder(Some(1024), 32), vec![713]);
        assert_eq!(ladder(Some(100), 64), vec![64]);
        for (context, max_new) in [(32768, 32), (131072, 512), (4096, 256)] {
            let top = *ladder(Some(context), max_new).last().unwrap();
            assert!(f64::from(top) * 1.3 + f64::from(max_new) <= f64::from(context));
        }
        let depths = NeedleSpec::default().depths.len();
        assert_eq!(needles(&spec(vec![]), Some(8192), 32).len(), 3 * depths);
    }

    #[test]
    fn an_answer_finds_the_key_as_a_whole_number() {
        let n = &needles(&spec(vec![64]), None, 32)[0];
        let key = n.key;
        assert!(found(n, &format!("{key}")));
        assert!(found(n, &format!("The key is {key}.")));
        assert!(!found(n, &format!("{key}7")));
        assert!(!found(n, "I could not find it."));
    }

    #[test]
    fn rates_count_per_length() {
        let set = needles(&spec(vec![64, 128]), None, 32);
        let r = rates(&set, &[true, true, false, true, true, true]);
        assert_eq!(
            r,
            vec![
                NeedleRate {
                    length: 64,
                    passed: 2,
                    total: 3
                },
                NeedleRate {
                    length: 128,
                    passed: 3,
                    total: 3
                },
            ]
        );
    }
}
