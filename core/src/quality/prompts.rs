//! The prompts the KL comparison scores: a built-in, seeded set of varied length, or the
//! manifest's own file. The text is English-like (whole sentences from a small vocabulary) so a
//! real model's logprobs over its continuation mean something, and the same for every run: no
//! clock, no randomness.

use super::jsonl::strings;
use super::QualityFileError;

/// The words (about) of the built-in prompts' passages, from short to long; more prompts than
/// this cycle through it with other text.
const LENGTHS: [u32; 16] = [
    8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 200, 240, 280, 320, 360, 400,
];

/// What each built-in prompt asks of its passage, in turn.
const ASKS: [&str; 6] = [
    "Continue the story in the same style.",
    "Summarize the passage below in two sentences.",
    "Describe what happens next.",
    "List the people mentioned in the passage.",
    "Explain why these events matter to the village.",
    "Rewrite the passage in simpler words.",
];

/// `count` prompts, the same for every run: an instruction, then a seeded passage of 8 to 400
/// words (about 10 to 550 tokens of a BPE tokenizer).
pub fn builtin_prompts(count: u32) -> Vec<String> {
    (0..count as usize)
        .map(|i| {
            let ask = ASKS[i % ASKS.len()];
            let words = LENGTHS[i % LENGTHS.len()];
            format!("{ask}\n\n{}", passage(1000 + i as u64, words))
        })
        .collect()
}

/// The prompts of a prompts file: JSONL, `{"prompt": "..."}` a line (other fields are ignored),
/// blank lines and `#` lines skipped. `file` is the path as the manifest wrote it, for errors.
pub fn parse_prompts(file: &str, text: &str) -> Result<Vec<String>, QualityFileError> {
    strings(file, "verify.quality.prompts_file", "prompt", text)
}

/// A linear congruential generator, as `benchmark::prompt` uses; its high bits are drawn.
pub(crate) struct Lcg(u64);

impl Lcg {
    /// Seeds near each other (prompt 1000, 1001) start far apart: splitmix64's finalizer.
    pub fn new(seed: u64) -> Lcg {
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Lcg(z ^ (z >> 31))
    }

    pub fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    pub fn pick<'a>(&mut self, from: &[&'a str]) -> &'a str {
        from[self.next() as usize % from.len()]
    }
}

const OPENERS: [&str; 8] = [
    "",
    "",
    "",
    "Later, ",
    "Meanwhile, ",
    "That spring, ",
    "Years ago, ",
    "Once again, ",
];
const SUBJECTS: [&str; 12] = [
    "the old lighthouse keeper",
    "a young farmer",
    "the river pilot",
    "our neighbour",
    "the tired engineer",
    "a quiet student",
    "the baker",
    "the ship's captain",
    "a travelling musician",
    "the village teacher",
    "the night nurse",
    "a curious child",
];
const VERBS: [&str; 12] = [
    "carried",
    "noticed",
    "repaired",
    "painted",
    "counted",
    "followed",
    "described",
    "remembered",
    "measured",
    "cleaned",
    "opened",
    "watched",
];
const OBJECTS: [&str; 12] = [
    "the broken lantern",
    "a letter from the city",
    "the narrow bridge",
    "an old map of the valley",
    "the copper kettle",
    "the winter garden",
    "a basket of apples",
    "the harbor lights",
    "the long wooden table",
    "a box of faded photographs",
    "the mill by the river",
    "the only clock in the school",
];
const TAILS: [&str; 12] = [
    "before the rain began.",
    "while the others slept.",
    "for the first time in years.",
    "on the morning of the market.",
    "as the bells rang in the square.",
    "without saying a word.",
    "because nobody else would.",
    "just after sunset.",
    "in the light of the fire.",
    "at the edge of the forest.",
    "with great care.",
    "during the long, cold winter.",
];

/// Whole seeded sentences until at least `words` words (one sentence at least, of 7 to 14
/// words). Never a digit, nor the word "key": the needle's filler is this too.
pub(crate) fn passage(seed: u64, words: u32) -> String {
    let mut g = Lcg::new(seed);
    let mut out = String::new();
    let mut count = 0u32;
    while count == 0 || count < words {
        let sentence = sentence(&mut g);
        count += sentence.split_whitespace().count() as u32;
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(&sentence);
    }
    out
}

fn sentence(g: &mut Lcg) -> String {
    let opener = g.pick(&OPENERS);
    let subject = g.pick(&SUBJECTS);
    let s = format!(
        "{opener}{subject} {} {} {}",
        g.pick(&VERBS),
        g.pick(&OBJECTS),
        g.pick(&TAILS)
    );
    let mut chars = s.chars();
    match chars.next() {
        Some(first) => first.to_uppercase().chain(chars).collect(),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> usize {
        s.split_whitespace().count()
    }

    #[test]
    fn the_builtin_set_is_seeded_varied_and_english_like() {
        let p = builtin_prompts(16);
        assert_eq!(p.len(), 16);
        assert_eq!(p, builtin_prompts(16));
        assert_eq!(builtin_prompts(4), p[..4].to_vec());
        assert!(words(&p[0]) < 30, "{}", p[0]);
        assert!((400..440).contains(&words(&p[15])), "{}", words(&p[15]));
        let mut distinct = p.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 16);
        assert!(p[1].starts_with("Summarize the passage below in two sentences.\n\n"));
        assert!(p.iter().all(|s| s.ends_with('.') && !s.contains("key")));
        assert!(!p.iter().any(|s| s.chars().any(|c| c.is_ascii_digit())));
        // Past 16, the lengths cycle with other text.
        let more = builtin_prompts(20);
        assert_ne!(more[16], more[0]);
        assert!(words(&more[16]) < 30);
    }

    #[test]
    fn a_passage_is_whole_sentences_of_at_least_its_words() {
        let p = passage(3, 50);
        assert!((50..65).contains(&words(&p)), "{p}");
        assert!(p.starts_with(char::is_uppercase) && p.ends_with('.'));
        assert!(words(&passage(3, 0)) >= 7);
    }

    #[test]
    fn a_prompts_file_reads_a_prompt_a_line() {
        let text = "# mine\n{\"prompt\": \"Hello there\"}\n\n{\"prompt\": \"Bye\", \"id\": 2}\n";
        assert_eq!(
            parse_prompts("p.jsonl", text).unwrap(),
            vec!["Hello there".to_string(), "Bye".to_string()]
        );
    }

    #[test]
    fn a_bad_prompts_file_names_its_line_and_what_is_wrong() {
        let err = |text: &str| parse_prompts("p.jsonl", text).unwrap_err().to_string();
        assert!(err("{\"prompt\": \"a\"}\nnot json\n").starts_with("p.jsonl:2: not JSON"));
        assert_eq!(
            err("{\"prompt\": \"a\"}\n\n{\"text\": \"b\"}"),
            "p.jsonl:3: no `prompt` (a line is {\"prompt\": \"...\"})"
        );
        assert_eq!(err("{\"prompt\": \"  \"}"), "p.jsonl:1: `prompt` is empty");
        assert_eq!(
            err("{\"prompt\": 3}"),
            "p.jsonl:1: `prompt` is a string, not a number"
        );
        assert_eq!(
            err("# only a comment\n\n"),
            "p.jsonl:1: holds no prompts (a line is {\"prompt\": \"...\"})"
        );
    }
}
