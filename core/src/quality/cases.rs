//! Task accuracy: the manifest's prompts with an expected answer (`cases`, JSONL), read and
//! checked offline, and whether an answer passes.

use super::jsonl::{objects, text_field, FileAt};
use super::{Case, Expected, QualityFileError, Rate};

/// The cases of a cases file: JSONL, `{"prompt": "...", "expect": "..."}` (the answer contains
/// it, ignoring case) or `{"prompt": "...", "regex": "..."}` (the answer matches it) a line,
/// exactly one of `expect` and `regex`; other fields are ignored, blank and `#` lines skipped. A
/// regex that does not compile is an error at its line.
pub fn parse_cases(file: &str, text: &str) -> Result<Vec<Case>, QualityFileError> {
    let at = FileAt {
        file,
        field: "verify.quality.cases",
    };
    let mut cases = Vec::new();
    for (line, map) in objects(&at, text)? {
        let Some(prompt) = text_field(&at, line, &map, "prompt")? else {
            return Err(at.error(line, 1, format!("no `prompt` ({SHAPE})")));
        };
        let expect = match (
            text_field(&at, line, &map, "expect")?,
            text_field(&at, line, &map, "regex")?,
        ) {
            (Some(text), None) => Expected::Contains(text),
            (None, Some(pattern)) => {
                if let Err(e) = regex::Regex::new(&pattern) {
                    return Err(at.error(
                        line,
                        1,
                        format!("`regex` does not compile: {}", one_line(&e.to_string())),
                    ));
                }
                Expected::Regex(pattern)
            }
            (Some(_), Some(_)) => {
                return Err(at.error(line, 1, "both `expect` and `regex`: give one of them"))
            }
            (None, None) => {
                return Err(at.error(line, 1, format!("no `expect` nor `regex` ({SHAPE})")))
            }
        };
        cases.push(Case {
            prompt,
            expect,
            line,
        });
    }
    if cases.is_empty() {
        return Err(at.error(1, 1, format!("holds no cases ({SHAPE})")));
    }
    Ok(cases)
}

const SHAPE: &str = "a line is {\"prompt\": \"...\", \"expect\": \"...\"} or {\"prompt\": \"...\", \"regex\": \"...\"}";

/// The regex crate's errors draw the pattern over several lines; a report line needs one.
fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Whether `answer` passes: it contains the expected text, trimmed and ignoring case, or the
/// trimmed answer matches the regex (unanchored: anchor it with `^...$` to match all of it). A
/// regex that does not compile (never, after [`parse_cases`]) passes nothing.
pub fn passes(case: &Case, answer: &str) -> bool {
    let answer = answer.trim();
    match &case.expect {
        Expected::Contains(text) => answer.to_lowercase().contains(&text.trim().to_lowercase()),
        Expected::Regex(pattern) => regex::Regex::new(pattern).is_ok_and(|r| r.is_match(answer)),
    }
}

/// How many of `cases` their `answers` (in the same order) pass.
pub fn case_rate(cases: &[Case], answers: &[String]) -> Rate {
    Rate {
        passed: cases
            .iter()
            .zip(answers)
            .filter(|(c, a)| passes(c, a))
            .count() as u32,
        total: cases.len() as u32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"# arithmetic
{"prompt": "What is 2+2?", "expect": "4"}

{"prompt": "Capital of France?", "expect": "Paris", "note": "geography"}
{"prompt": "Give a year.", "regex": "^(19|20)\\d\\d\\.?$"}
"#;

    #[test]
    fn a_cases_file_reads_each_case_with_its_line() {
        let cases = parse_cases("c.jsonl", FILE).unwrap();
        assert_eq!(cases.len(), 3);
        assert_eq!(
            cases[1],
            Case {
                prompt: "Capital of France?".into(),
                expect: Expected::Contains("Paris".into()),
                line: 4
            }
        );
        assert_eq!(cases[2].expect, Expected::Regex(r"^(19|20)\d\d\.?$".into()));
        assert_eq!(cases[2].line, 5);
    }

    #[test]
    fn a_bad_case_names_its_line_and_what_is_wrong() {
        let err = |text: &str| parse_cases("c.jsonl", text).unwrap_err().to_string();
        let ok = "{\"prompt\": \"a\", \"expect\": \"b\"}\n";
        assert!(err(&format!(
            "{ok}{{\"prompt\": \"x\", \"regex\": \"(unclosed\"}}"
        ))
        .starts_with("c.jsonl:2: `regex` does not compile: regex parse error:"));
        assert_eq!(
            err(&format!(
                "{ok}{ok}{{\"prompt\": \"x\", \"expect\": \"y\", \"regex\": \"z\"}}"
            )),
            "c.jsonl:3: both `expect` and `regex`: give one of them"
        );
        assert!(err("{\"prompt\": \"x\"}").starts_with("c.jsonl:1: no `expect` nor `regex`"));
        assert!(err("{\"expect\": \"x\"}").starts_with("c.jsonl:1: no `prompt`"));
        assert_eq!(err(&format!("{ok}{{oops")).split(':').nth(1), Some("2"));
        assert!(err("\n# nothing\n").starts_with("c.jsonl:1: holds no cases"));
        assert_eq!(
            err("{\"prompt\": \"x\", \"expect\": \"\"}"),
            "c.jsonl:1: `expect` is empty"
        );
    }

    #[test]
    fn an_answer_passes_by_substring_ignoring_case_or_by_regex() {
        let cases = parse_cases("c.jsonl", FILE).unwrap();
        assert!(passes(&cases[0], " The answer is 4.\n"));
        assert!(passes(&cases[1], "paris, of course"));
        assert!(!passes(&cases[1], "Lyon"));
        assert!(passes(&cases[2], "  1999.\n"));
        assert!(!passes(&cases[2], "In 1999."));
        let answers: Vec<String> = ["4", "Rome", "2024"].map(String::from).to_vec();
        assert_eq!(
            case_rate(&cases, &answers),
            Rate {
                passed: 2,
                total: 3
            }
        );
    }
}
