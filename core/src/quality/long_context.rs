//! Long context beyond one needle, in RULER's spirit (NVIDIA, 2024): several keys among
//! distractors, a chain of variables, the most common words of a list; seeded, at lengths up
//! to the served context.
//!
//! Three of RULER's tasks (github.com/NVIDIA/RULER, scripts/synthetic.yaml), with its templates
//! (scripts/data/synthetic/constants.py) and its scoring (`string_match_all`, scripts/eval/
//! synthetic/constants.py: each expected item found in the answer counts), but a seeded filler
//! of our own (prompts.rs's `passage`: no digits, no word in capitals) and seeded keys, numbers,
//! names and words, so a prompt is the same in every run and on every host:
//!
//! - `multi_key` (niah_multikey_1, niah.py): four lines `One of the special magic numbers for
//!   <key> is: <7 digits>.` at four of forty evenly spaced depths; the question asks for one key.
//! - `variable_tracking` (vt, variable_tracking.py): a chain `VAR AAAAA = 12345`, `VAR BBBBB =
//!   VAR AAAAA`, ... of four hops and a second one with another value, each line in order among
//!   lines of filler; the answer is the five variables of the asked value.
//! - `common_words` (cwe, common_words_extraction.py): a numbered list in which ten words appear
//!   6 times and the others once (30 and 3 from 4096 tokens on, as RULER); the answer is the ten.
//!   The words are made up (three syllables): RULER draws thousands of distinct words for long
//!   lists, more than a word list here could hold.
//!
//! RULER's few-shot examples (vt, cwe) are left out: the answer prefix at the prompt's end
//! already says what shape the answer takes.

use super::needle::ladder;
use super::prompts::{passage, Lcg};
use super::{LongContextSpec, LongTask, TaskRate};
use std::collections::BTreeSet;

/// Tokens an answer may take (the longest answer is ten words or five variable names). RULER
/// lets `niah` generate 128 tokens and `cwe` 120: ten made-up words, numbered, are about 60
/// tokens, and a model may say a sentence first.
pub const ANSWER_TOKENS: u32 = 128;

impl LongTask {
    /// Part of every prompt's seed, so the tasks' prompts at one length differ.
    fn seed(self) -> u64 {
        match self {
            LongTask::MultiKey => 1,
            LongTask::VariableTracking => 2,
            LongTask::CommonWords => 3,
        }
    }
}

/// One prompt of the check and the items its answer should hold.
#[derive(Debug, Clone, PartialEq)]
pub struct Probe {
    pub task: LongTask,
    /// About this many words' worth of tokens (see [`probes`]).
    pub length: u32,
    pub prompt: String,
    /// RULER's references: each one found in the answer counts.
    pub expected: Vec<String>,
}

/// The prompts: for each length (spec.lengths, or needle's ladder(context_length,
/// ANSWER_TOKENS) when empty), each task of spec.tasks, spec.samples prompts each.
///
/// A prompt of length N is sized to about 1.3 N tokens, the needle's measure, by a generous
/// guess of its tokens (`tokens`): the keys' and the chains' prompts are about N words, the
/// common words' fewer, since its list's numbers take a token a digit.
pub fn probes(spec: &LongContextSpec, context_length: Option<u32>) -> Vec<Probe> {
    let lengths = if spec.lengths.is_empty() {
        ladder(context_length, ANSWER_TOKENS)
    } else {
        spec.lengths.clone()
    };
    // A task named twice would give the same prompts twice (they are seeded) and count twice.
    let mut tasks: Vec<LongTask> = Vec::new();
    for &task in &spec.tasks {
        if !tasks.contains(&task) {
            tasks.push(task);
        }
    }
    let mut out = Vec::new();
    for &length in &lengths {
        for &task in &tasks {
            for sample in 0..spec.samples {
                let built = build(task, length, sample);
                out.push(Probe {
                    task,
                    length,
                    prompt: built.prompt,
                    expected: built.expected,
                });
            }
        }
    }
    out
}

/// How many of the probe's expected items the answer holds (case-insensitive, whole words /
/// whole numbers: 1234567 does not match 12345678). Each item counts once.
pub fn found(probe: &Probe, answer: &str) -> u32 {
    let said: BTreeSet<String> = answer
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    probe
        .expected
        .iter()
        .filter(|item| said.contains(&item.to_lowercase()))
        .count() as u32
}

/// Items found over items expected, per (task, length), in the probes' order of first
/// appearance (`found[i]` for `probes[i]`: a missing one counts 0, and none more than its
/// probe's items).
pub fn task_rates(probes: &[Probe], found: &[u32]) -> Vec<TaskRate> {
    let mut out: Vec<TaskRate> = Vec::new();
    for (i, p) in probes.iter().enumerate() {
        let items = p.expected.len() as u32;
        let hit = found.get(i).copied().unwrap_or(0).min(items);
        let at = match out
            .iter()
            .position(|r| r.task == p.task && r.length == p.length)
        {
            Some(at) => at,
            None => {
                out.push(TaskRate {
                    task: p.task,
                    length: p.length,
                    passed: 0,
                    total: 0,
                });
                out.len() - 1
            }
        };
        out[at].passed += hit;
        out[at].total += items;
    }
    out
}

// The templates are RULER's (scripts/data/synthetic/constants.py), each with its answer prefix
// appended as RULER's `base` model template does (scripts/data/prepare.py), less the prefix's
// trailing space: a prompt ending in a space makes the answer's first token an odd one.

/// `niah` as niah.py words it for one asked value ("Some" -> "A", "are" -> "is", "numbers" ->
/// "number"), several keys in the text or not.
const MULTI_KEY_INTRO: &str = "A special magic number is hidden within the following text. Make sure to memorize it. I will quiz you about the number afterwards.";
/// `variable_tracking`.
const CHAIN_INTRO: &str =
    "Memorize and track the chain(s) of variable assignment hidden in the following text.";
/// `common_words_extraction`.
const WORDS_INTRO: &str = "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones that appear most often.";
const WORDS_QUESTION: &str = "Question: What are the 10 most common words in the above list? Answer: The top 10 words that appear most often in the list are:";

/// niah_multikey_1: four keys, one asked for.
const KEYS: usize = 4;
/// niah.py's depths: 40 evenly spaced from the start of the text to its end.
const DEPTHS: u64 = 40;
/// RULER's keys are an adjective and a noun; none of these is in the filler.
const ADJECTIVES: [&str; 16] = [
    "amber", "brisk", "clever", "dusty", "eager", "fuzzy", "gentle", "hollow", "icy", "jolly",
    "lucky", "mellow", "noble", "proud", "rusty", "silent",
];
const NOUNS: [&str; 16] = [
    "anchor", "badger", "cactus", "dolphin", "falcon", "glacier", "hammer", "igloo", "jigsaw",
    "walrus", "meadow", "nugget", "orchid", "pepper", "quartz", "saddle",
];
/// vt: four hops, so five variables hold the value.
const HOPS: usize = 4;
/// cwe: ten common words.
const COMMON: usize = 10;
/// The made-up words: a consonant and a vowel a syllable.
const CONSONANTS: &[u8] = b"bdfgklmnprstvz";
const VOWELS: &[u8] = b"aeiou";

/// A prompt, its expected items and its facts (each with where it sits, a fraction of the
/// filler; none for the common words).
struct Built {
    prompt: String,
    expected: Vec<String>,
    /// Read by the tests only: where each fact sits.
    #[cfg_attr(not(test), allow(dead_code))]
    facts: Vec<(f64, String)>,
}

fn build(task: LongTask, length: u32, sample: u32) -> Built {
    let mut g = Lcg::new(task.seed() << 56 ^ u64::from(length) << 24 ^ u64::from(sample));
    match task {
        LongTask::MultiKey => multi_key(&mut g, length),
        LongTask::VariableTracking => variable_tracking(&mut g, length),
        LongTask::CommonWords => common_words(&mut g, length),
    }
}

/// Four needles (niah.py's `One of the special magic numbers for <key> is: <value>.`) among the
/// filler's sentences at four of niah.py's depths, and the question for one of their keys.
fn multi_key(g: &mut Lcg, length: u32) -> Built {
    let mut keys: Vec<String> = Vec::new();
    while keys.len() < KEYS {
        let key = format!("{}-{}", g.pick(&ADJECTIVES), g.pick(&NOUNS));
        if !keys.contains(&key) {
            keys.push(key);
        }
    }
    // Seven digits, as niah.py's; the distractors' numbers differ from the answer.
    let mut numbers: Vec<u64> = Vec::new();
    while numbers.len() < KEYS {
        let n = 1_000_000 + g.next() % 9_000_000;
        if !numbers.contains(&n) {
            numbers.push(n);
        }
    }
    let mut slots: Vec<u64> = Vec::new();
    while slots.len() < KEYS {
        let s = g.next() % DEPTHS;
        if !slots.contains(&s) {
            slots.push(s);
        }
    }
    slots.sort_unstable();
    let asked = g.next() as usize % KEYS;
    let facts: Vec<(f64, String)> = (0..KEYS)
        .map(|i| {
            let needle = format!(
                "One of the special magic numbers for {} is: {}.",
                keys[i], numbers[i]
            );
            (slots[i] as f64 / (DEPTHS - 1) as f64, needle)
        })
        .collect();
    let key = &keys[asked];
    let question = format!(
        "What is the special magic number for {key} mentioned in the provided text? The special magic number for {key} mentioned in the provided text is"
    );
    let words = filler_words(length, &[MULTI_KEY_INTRO, &question], &facts);
    // Inline, between sentences, as niah.py puts needles in its essay.
    let context = hide(g.next(), words, &facts, " ");
    Built {
        prompt: format!("{MULTI_KEY_INTRO}\n{context}\n{question}"),
        expected: vec![numbers[asked].to_string()],
        facts,
    }
}

/// Two chains (variable_tracking.py's `VAR <name> = <value>`, `VAR <next> = VAR <name>`, ...,
/// less its lines' trailing space), each line on its own line, in order, at seeded places among
/// lines of filler; the question asks for the first chain's value.
fn variable_tracking(g: &mut Lcg, length: u32) -> Built {
    let question = |value: u64| {
        format!(
            "Question: Find all variables that are assigned the value {value} in the text above. Answer: According to the chain(s) of variable assignment in the text above, {} variables are assigned the value {value}, they are:",
            HOPS + 1
        )
    };
    let template = format!("{CHAIN_INTRO} {}", question(0));
    // Five capitals, as RULER's: not in the filler, which has no word in capitals, nor a word
    // of the template, which an answer may repeat.
    let mut names: Vec<String> = Vec::new();
    while names.len() < 2 * (HOPS + 1) {
        let name: String = (0..5)
            .map(|_| char::from(b'A' + (g.next() % 26) as u8))
            .collect();
        if !names.contains(&name) && !has_word(&template, &name) {
            names.push(name);
        }
    }
    let value = 10_000 + g.next() % 90_000;
    let mut other = value;
    while other == value {
        other = 10_000 + g.next() % 90_000;
    }
    let mut facts: Vec<(f64, String)> = Vec::new();
    for (chain, start) in [(&names[..=HOPS], value), (&names[HOPS + 1..], other)] {
        let mut depths: Vec<f64> = (0..=HOPS)
            .map(|_| (g.next() % 1001) as f64 / 1000.0)
            .collect();
        depths.sort_by(f64::total_cmp);
        facts.push((depths[0], format!("VAR {} = {start}", chain[0])));
        for hop in 1..=HOPS {
            let line = format!("VAR {} = VAR {}", chain[hop], chain[hop - 1]);
            facts.push((depths[hop], line));
        }
    }
    // Stable: a chain's lines keep their order where two share a depth.
    facts.sort_by(|a, b| a.0.total_cmp(&b.0));
    let question = question(value);
    let words = filler_words(length, &[CHAIN_INTRO, &question], &facts);
    let context = hide(g.next(), words, &facts, "\n");
    Built {
        prompt: format!("{CHAIN_INTRO}\n\n{context}\n{question}"),
        expected: names[..=HOPS].to_vec(),
        facts,
    }
}

/// A list `1. <word> 2. <word> ...` (common_words_extraction.py) of ten words `often` times
/// each and the others `rarely`, shuffled, as long as the length's tokens allow.
fn common_words(g: &mut Lcg, length: u32) -> Built {
    let budget = budget(length);
    // RULER's repeats: 6 and 1 below 4096 tokens, 30 and 3 from there on.
    let (often, rarely) = if budget < 4096 { (6, 1) } else { (30, 3) };
    let room = budget.saturating_sub(tokens(WORDS_INTRO) + tokens(WORDS_QUESTION));
    // Three syllables give 343,000 words; past about a tenth of them, four (a list of 10M
    // tokens).
    let syllables = if room / 7 > 100_000 { 4 } else { 3 };
    let mut entries = 0u32;
    let mut cost = 0u32;
    while cost + entry_tokens(entries + 1, syllables) <= room {
        entries += 1;
        cost += entry_tokens(entries, syllables);
    }
    // Ten rare words at least: a length too short for them gets a longer prompt.
    let rare = (entries.saturating_sub(COMMON as u32 * often) / rarely).max(COMMON as u32);
    let mut seen = BTreeSet::new();
    let mut words: Vec<String> = Vec::new();
    while words.len() < COMMON + rare as usize {
        let word = made_up(g, syllables);
        if !has_word(WORDS_INTRO, &word)
            && !has_word(WORDS_QUESTION, &word)
            && seen.insert(word.clone())
        {
            words.push(word);
        }
    }
    let mut list: Vec<&str> = Vec::new();
    for (i, word) in words.iter().enumerate() {
        let times = if i < COMMON { often } else { rarely };
        list.extend(std::iter::repeat_n(word.as_str(), times as usize));
    }
    for i in (1..list.len()).rev() {
        let j = (g.next() % (i as u64 + 1)) as usize;
        list.swap(i, j);
    }
    let context = list
        .iter()
        .enumerate()
        .map(|(i, word)| format!("{}. {word}", i + 1))
        .collect::<Vec<_>>()
        .join(" ");
    Built {
        prompt: format!("{WORDS_INTRO}\n{context}\n{WORDS_QUESTION}"),
        expected: words[..COMMON].to_vec(),
        facts: Vec::new(),
    }
}

/// A made-up lowercase word, a consonant and a vowel a syllable (the caller skips repeats and
/// the template's words).
fn made_up(g: &mut Lcg, syllables: usize) -> String {
    let mut word = String::new();
    for _ in 0..syllables {
        word.push(char::from(CONSONANTS[g.next() as usize % CONSONANTS.len()]));
        word.push(char::from(VOWELS[g.next() as usize % VOWELS.len()]));
    }
    word
}

/// The tokens a prompt of `length` words may take: 1.3 a word, the needle's measure.
fn budget(length: u32) -> u32 {
    (u64::from(length) * 13 / 10) as u32
}

/// The words of filler that bring `fixed` and the facts to the length's tokens.
fn filler_words(length: u32, fixed: &[&str], facts: &[(f64, String)]) -> u32 {
    let taken: u32 = fixed.iter().map(|s| tokens(s)).sum::<u32>()
        + facts.iter().map(|(_, f)| tokens(f)).sum::<u32>();
    (u64::from(budget(length).saturating_sub(taken)) * 10 / 13) as u32
}

/// About `words` words of seeded filler with each fact (in order of depth) after the whole
/// sentence where its depth falls, joined by `sep`. A fact whose place the sentences before it
/// already passed follows the last one directly.
fn hide(seed: u64, words: u32, facts: &[(f64, String)], sep: &str) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut emitted = 0u32;
    for (i, (depth, fact)) in facts.iter().enumerate() {
        let target = (f64::from(words) * depth).round() as u32;
        if target > emitted {
            let part = passage(seed.wrapping_add(i as u64), target - emitted);
            emitted += word_count(&part);
            parts.push(part);
        }
        parts.push(fact.clone());
    }
    if words > emitted {
        parts.push(passage(
            seed.wrapping_add(facts.len() as u64),
            words - emitted,
        ));
    }
    parts.join(sep)
}

fn word_count(s: &str) -> u32 {
    s.split_whitespace().count() as u32
}

/// Whether `word` is a word of `text`, whatever the case.
fn has_word(text: &str, word: &str) -> bool {
    text.split(|c: char| !c.is_alphanumeric())
        .any(|w| w.eq_ignore_ascii_case(word))
}

/// A list entry's tokens: its number's digits, the dot, the word.
fn entry_tokens(number: u32, syllables: usize) -> u32 {
    number.to_string().len() as u32 + 1 + syllables as u32
}

/// A generous guess of the tokens a BPE tokenizer makes of `text`: 1.3 a word of prose; a
/// digit and a punctuation mark next to one a token each (Qwen and Llama 2 split numbers into
/// digits); a made-up word (a list word, after its number, or a word in capitals) a token per two
/// letters; a hyphenated key a word a part and a token a hyphen.
fn tokens(text: &str) -> u32 {
    let mut tenths = 0usize;
    let mut listed = false;
    for w in text.split_whitespace() {
        let after_number = std::mem::replace(&mut listed, false);
        let len = w.chars().count();
        let digits = w.chars().filter(char::is_ascii_digit).count();
        let capitals = w.chars().filter(char::is_ascii_uppercase).count();
        tenths += if digits > 0 {
            listed = digits + 1 == len && w.ends_with('.');
            10 * len
        } else if (after_number && w.chars().all(|c| c.is_ascii_lowercase()))
            || (len >= 2 && capitals == len)
        {
            10 * len.div_ceil(2)
        } else if w.contains('-') {
            13 * w.split('-').filter(|p| !p.is_empty()).count() + 10 * w.matches('-').count()
        } else {
            13
        };
    }
    tenths.div_ceil(10) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::collections::BTreeMap;

    fn spec(lengths: Vec<u32>, samples: u32) -> LongContextSpec {
        LongContextSpec {
            lengths,
            samples,
            ..LongContextSpec::default()
        }
    }

    /// The runs of digits of a text.
    fn numbers(s: &str) -> Vec<&str> {
        s.split(|c: char| !c.is_ascii_digit())
            .filter(|r| !r.is_empty())
            .collect()
    }

    /// The text between the intro's line and the question's.
    fn context(prompt: &str) -> &str {
        let start = prompt.find('\n').unwrap();
        let end = prompt.rfind('\n').unwrap();
        prompt[start..end].trim()
    }

    /// Where `fact` starts in the context, a fraction of its words.
    fn place(prompt: &str, fact: &str) -> f64 {
        let context = context(prompt);
        let at = context.find(fact).expect("the fact");
        f64::from(word_count(&context[..at])) / f64::from(word_count(context))
    }

    #[test]
    fn a_prompt_takes_about_its_lengths_tokens_and_the_prose_ones_about_its_words() {
        for length in [1024, 4096] {
            for task in LongTask::ALL {
                for sample in 0..2 {
                    let b = build(task, length, sample);
                    let t = i64::from(tokens(&b.prompt));
                    let want = i64::from(budget(length));
                    // Whole sentences or list entries: over by a sentence (19 words at most),
                    // under by two entries.
                    assert!(
                        (want - 30..=want + 26).contains(&t),
                        "{task:?} {length}: {t} tokens for {want}"
                    );
                    let words = word_count(&b.prompt);
                    if task == LongTask::CommonWords {
                        // Its numbers take a token a digit.
                        assert!(words * 2 < length * 3 / 2 && words * 3 > length, "{words}");
                    } else {
                        // The facts' digits and capitals take a few words' room.
                        assert!(
                            words <= length + 15 && words * 100 >= length * 93,
                            "{task:?} {length}: {words} words"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn prompts_are_seeded_by_task_length_and_sample() {
        let s = spec(vec![300, 700], 2);
        let set = probes(&s, None);
        assert_eq!(set.len(), 2 * 3 * 2);
        assert_eq!(set, probes(&s, None), "the same twice");
        let mut distinct: Vec<&str> = set.iter().map(|p| p.prompt.as_str()).collect();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), set.len(), "every prompt its own");
        // In order: each length, each task, each sample.
        let order: Vec<(u32, &str)> = set.iter().map(|p| (p.length, p.task.name())).collect();
        assert_eq!(
            order[..6].iter().map(|o| o.1).collect::<Vec<_>>(),
            [
                "multi_key",
                "multi_key",
                "variable_tracking",
                "variable_tracking",
                "common_words",
                "common_words"
            ]
        );
        assert!(order[..6].iter().all(|o| o.0 == 300) && order[6..].iter().all(|o| o.0 == 700));
        // A sample is the same whatever else the spec asks for.
        let one = probes(
            &LongContextSpec {
                lengths: vec![700],
                tasks: vec![LongTask::CommonWords],
                samples: 2,
            },
            None,
        );
        assert_eq!(one[..], set[10..]);
    }

    #[test]
    fn multi_key_hides_four_needles_at_their_depths_and_asks_for_one() {
        let mut asked = BTreeSet::new();
        for sample in 0..6 {
            let b = build(LongTask::MultiKey, 2048, sample);
            assert!(b.prompt.starts_with(&format!("{MULTI_KEY_INTRO}\n")));
            assert_eq!(b.facts.len(), 4);
            assert_eq!(b.expected.len(), 1);
            let answer = &b.expected[0];
            let mut keys = Vec::new();
            for (depth, needle) in &b.facts {
                assert_eq!(b.prompt.matches(needle.as_str()).count(), 1);
                assert!((place(&b.prompt, needle) - depth).abs() < 0.03, "{needle}");
                let key = needle
                    .strip_prefix("One of the special magic numbers for ")
                    .and_then(|r| r.split(' ').next())
                    .unwrap();
                keys.push(key);
                let number = numbers(needle)[0];
                assert_eq!(number.len(), 7);
                if number == answer {
                    assert!(b.prompt.ends_with(&format!(
                        "\nWhat is the special magic number for {key} mentioned in the provided text? The special magic number for {key} mentioned in the provided text is"
                    )));
                    asked.insert(key.to_string());
                }
            }
            // The only numbers are the needles', all different: the answer is in the text once.
            let mut all = numbers(&b.prompt);
            assert_eq!(all.len(), 4);
            all.sort_unstable();
            all.dedup();
            assert_eq!(all.len(), 4);
            assert_eq!(b.prompt.matches(answer.as_str()).count(), 1);
            keys.sort_unstable();
            keys.dedup();
            assert_eq!(keys.len(), 4, "the distractors' keys differ");
        }
        assert!(asked.len() > 1, "the asked key changes with the sample");
    }

    #[test]
    fn variable_tracking_hides_two_chains_in_order_and_asks_for_the_first_ones_names() {
        for sample in 0..4 {
            let b = build(LongTask::VariableTracking, 2048, sample);
            let lines: Vec<&str> = b.prompt.lines().collect();
            let vars: Vec<&str> = lines
                .iter()
                .copied()
                .filter(|l| l.starts_with("VAR "))
                .collect();
            let facts: Vec<&str> = b.facts.iter().map(|f| f.1.as_str()).collect();
            assert_eq!(vars, facts, "each on its own line, in the facts' order");
            for (depth, line) in &b.facts {
                assert!((place(&b.prompt, line) - depth).abs() < 0.03, "{line}");
            }
            let question = lines.last().unwrap();
            let value = numbers(question)[0];
            assert_eq!(value.len(), 5);
            assert!(question.ends_with(&format!(
                "in the text above. Answer: According to the chain(s) of variable assignment in the text above, 5 variables are assigned the value {value}, they are:"
            )));
            // A reader's walk from the value gives the expected names, in order.
            let mut chain = vec![vars
                .iter()
                .find_map(|l| l.strip_suffix(&format!(" = {value}")))
                .and_then(|l| l.strip_prefix("VAR "))
                .unwrap()
                .to_string()];
            while let Some(next) = vars.iter().find_map(|l| {
                l.strip_suffix(&format!(" = VAR {}", chain.last().unwrap()))
                    .and_then(|l| l.strip_prefix("VAR "))
            }) {
                chain.push(next.to_string());
            }
            assert_eq!(chain, b.expected);
            // The distractor chain starts from another value.
            let starts: Vec<&str> = vars.iter().filter_map(|l| numbers(l).pop()).collect();
            assert_eq!(starts.len(), 2);
            assert!(starts.contains(&value) && starts[0] != starts[1]);
            let mut names: Vec<&str> = vars.iter().map(|l| &l[4..9]).collect();
            names.sort_unstable();
            names.dedup();
            assert_eq!(names.len(), 10);
            for name in &names {
                assert!(name.chars().all(|c| c.is_ascii_uppercase()));
                // In its line and the next hop's only.
                let uses = b.prompt.matches(name).count();
                assert!(uses == 1 || uses == 2, "{name}: {uses}");
            }
            let template = format!("{CHAIN_INTRO} {question}");
            assert!(!b.expected.iter().any(|n| has_word(&template, n)));
        }
    }

    #[test]
    fn common_words_lists_ten_words_often_and_the_others_rarely() {
        let mut distinct = Vec::new();
        for (length, often, rarely) in [(1024, 6, 1), (2048, 6, 1), (4096, 30, 3)] {
            let b = build(LongTask::CommonWords, length, 0);
            assert!(b.prompt.starts_with(&format!("{WORDS_INTRO}\n1. ")));
            assert!(b.prompt.ends_with(&format!("\n{WORDS_QUESTION}")));
            let list: Vec<&str> = context(&b.prompt).split_whitespace().collect();
            let mut counts: BTreeMap<&str, u32> = BTreeMap::new();
            for (i, pair) in list.chunks(2).enumerate() {
                assert_eq!(pair[0], format!("{}.", i + 1), "numbered from 1");
                assert!(pair[1].chars().all(|c| c.is_ascii_lowercase()));
                *counts.entry(pair[1]).or_default() += 1;
            }
            assert_eq!(b.expected.len(), 10);
            for (word, n) in &counts {
                let common = b.expected.iter().any(|e| e == word);
                assert_eq!(*n, if common { often } else { rarely }, "{word}");
                assert!(!has_word(WORDS_INTRO, word) && !has_word(WORDS_QUESTION, word));
            }
            assert!(b.expected.iter().all(|e| counts.contains_key(e.as_str())));
            distinct.push(counts.len());
        }
        assert!(
            distinct[0] < distinct[1] && distinct[0] > 100,
            "the list grows with the length: {distinct:?}"
        );
    }

    #[test]
    fn an_answer_finds_whole_items_whatever_the_case_each_once() {
        let probe = |expected: &[&str]| Probe {
            task: LongTask::MultiKey,
            length: 64,
            prompt: String::new(),
            expected: expected.iter().map(|s| s.to_string()).collect(),
        };
        let key = probe(&["1234567"]);
        assert_eq!(found(&key, "1234567"), 1);
        assert_eq!(found(&key, " The special magic number is 1234567."), 1);
        assert_eq!(found(&key, "12345678"), 0);
        assert_eq!(found(&key, "123456 7"), 0);
        assert_eq!(found(&key, "I could not find it."), 0);
        let chain = probe(&["QWERT", "ASDFG", "ZXCVB"]);
        assert_eq!(found(&chain, "qwert, ASDFG and QWERT again"), 2);
        assert_eq!(found(&chain, "QWERTY ASDFGH VAR"), 0);
        let words = probe(&["bakeno", "tomira"]);
        assert_eq!(found(&words, "1. bakeno 2. Tomira 3. sulema"), 2);
        assert_eq!(found(&words, "bakenos tomirabakeno"), 0);
        // A prompt's own items, said back, are all found.
        for p in probes(&spec(vec![300], 1), None) {
            assert_eq!(found(&p, &p.expected.join(", ")), p.expected.len() as u32);
        }
    }

    #[test]
    fn rates_count_items_per_task_and_length() {
        let set = probes(&spec(vec![300, 700], 2), None);
        // Per probe: the keys' 1 item, the chains' 5, the words' 10.
        let hits = [1, 0, 5, 3, 10, 9, 1, 1, 2, 0, 4];
        let r = task_rates(&set, &hits);
        let rate = |task, length, passed, total| TaskRate {
            task,
            length,
            passed,
            total,
        };
        use LongTask::*;
        assert_eq!(
            r,
            vec![
                rate(MultiKey, 300, 1, 2),
                rate(VariableTracking, 300, 8, 10),
                rate(CommonWords, 300, 19, 20),
                rate(MultiKey, 700, 2, 2),
                rate(VariableTracking, 700, 2, 10),
                // The last probe's count is missing: none found.
                rate(CommonWords, 700, 4, 20),
            ]
        );
        // No probe counts more than its items.
        let r = task_rates(&set[..1], &[7]);
        assert_eq!(r, vec![rate(MultiKey, 300, 1, 1)]);
        assert!(task_rates(&[], &[]).is_empty());
    }

    #[test]
    fn without_lengths_the_ladder_is_used_and_every_prompt_leaves_room_for_the_answer() {
        for context in [Some(32768), Some(8192), None, Some(2048)] {
            let set = probes(&LongContextSpec::default(), context);
            let mut lengths: Vec<u32> = set.iter().map(|p| p.length).collect();
            lengths.dedup();
            assert_eq!(lengths, ladder(context, ANSWER_TOKENS));
            assert_eq!(set.len(), lengths.len() * 3 * 2);
            let room = context.unwrap_or(8192);
            for p in &set {
                assert!(
                    tokens(&p.prompt) + ANSWER_TOKENS <= room,
                    "{:?} {}: {} tokens in {room}",
                    p.task,
                    p.length,
                    tokens(&p.prompt)
                );
            }
        }
        assert_eq!(ladder(None, ANSWER_TOKENS), vec![1024, 4096, 6144]);
    }

    #[test]
    fn a_spec_without_samples_asks_nothing_and_a_task_named_twice_counts_once() {
        assert!(probes(&spec(vec![300], 0), None).is_empty());
        let twice = LongContextSpec {
            lengths: vec![300],
            tasks: vec![
                LongTask::CommonWords,
                LongTask::MultiKey,
                LongTask::CommonWords,
            ],
            samples: 1,
        };
        let tasks: Vec<LongTask> = probes(&twice, None).iter().map(|p| p.task).collect();
        assert_eq!(tasks, vec![LongTask::CommonWords, LongTask::MultiKey]);
    }

    #[test]
    fn the_token_guess_counts_digits_capitals_and_made_up_words_high() {
        assert_eq!(tokens("The baker opened the mill."), 7);
        // VAR 2, the name 3, "=" 1.3, five digits 5.
        assert_eq!(tokens("VAR QWERT = 12345"), 12);
        // "12." 3, a list word 3 a word of three syllables.
        assert_eq!(tokens("12. bakeno"), 6);
        assert_eq!(tokens("amber-falcon"), 4);
        assert_eq!(entry_tokens(12, 3), tokens("12. bakeno"));
    }

    #[test]
    fn tasks_are_named_as_the_manifest_spells_them() {
        let names: Vec<&str> = LongTask::ALL.iter().map(|t| t.name()).collect();
        assert_eq!(names, ["multi_key", "variable_tracking", "common_words"]);
        for task in LongTask::ALL {
            assert_eq!(json!(task), json!(task.name()));
        }
        assert_eq!(LongContextSpec::default().tasks, LongTask::ALL.to_vec());
    }

    /// The stand-in's self test (fixtures/fake-sglang) answers these prompts: they must be the
    /// ones this module writes.
    #[test]
    fn the_stand_ins_fixture_holds_these_prompts() {
        let fixture: serde_json::Value = serde_json::from_str(include_str!(
            "../../../fixtures/fake-sglang/long_context_probes.json"
        ))
        .unwrap();
        let want = json!(probes(&spec(vec![200, 1200], 1), None)
            .iter()
            .map(|p| json!({"task": p.task, "length": p.length, "prompt": p.prompt, "expected": p.expected}))
            .collect::<Vec<_>>());
        if fixture != want {
            // What to write there, between the markers.
            eprintln!("<<<\n{}\n>>>", serde_json::to_string_pretty(&want).unwrap());
        }
        assert!(
            fixture == want,
            "fixtures/fake-sglang/long_context_probes.json is stale: write the JSON printed above into it"
        );
    }
}
