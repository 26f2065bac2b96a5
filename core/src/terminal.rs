//! Text from hosts on its way to a terminal. Journal lines, systemd's status text, a guard's
//! detail and the output carried by errors are written by whatever runs on the host; printed
//! raw, their control sequences would drive the operator's terminal (retitle it, clear it, hide
//! lines behind a carriage return, forge a link). journalctl shows such a message as `[N blob
//! data]` unless given `--all`; the reports show each control character as a visible escape
//! instead, so the text stays readable and nothing in it acts. Every text and markdown report
//! passes through [`escape_controls`]; JSON keeps its strings' characters, written as JSON
//! escapes ([`json_controls`]).

use std::borrow::Cow;
use std::fmt::Write;

/// Whether `c` acts on a terminal rather than shows: C0 controls other than newline and tab,
/// DEL, and the C1 controls (U+0080 to U+009F, which some terminals take as ESC sequences: U+009B
/// is CSI).
fn acts(c: char) -> bool {
    c.is_control() && c != '\n' && c != '\t'
}

/// `text` with each control character but newline and tab written as an escape: `\x1b` for C0
/// and DEL, `\u{9b}` for C1. Text without one comes back as it is.
pub fn escape_controls(text: &str) -> Cow<'_, str> {
    if !text.chars().any(acts) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            c if !acts(c) => out.push(c),
            c if (c as u32) < 0x80 => {
                let _ = write!(out, "\\x{:02x}", c as u32);
            }
            c => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
        }
    }
    Cow::Owned(out)
}

/// A text or markdown report as it is printed: [`escape_controls`], without a copy when there is
/// nothing to escape.
pub fn text(report: String) -> String {
    match escape_controls(&report) {
        Cow::Borrowed(_) => report,
        Cow::Owned(escaped) => escaped,
    }
}

/// JSON text with DEL and the C1 controls in its strings written as `\u007f`, `\u009b`:
/// serde_json escapes C0 itself but writes these as they are, and a terminal the JSON is read on
/// would act on them. The document means the same: only strings can hold them.
pub fn json_controls(json: String) -> String {
    if !json.chars().any(acts) {
        return json;
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if acts(c) {
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn control_characters_are_shown_not_acted_on() {
        // A title set (OSC 0, ended by BEL), a screen cleared, a line hidden behind a carriage
        // return, CSI as one C1 character, DEL.
        assert_eq!(
            escape_controls("\x1b]0;owned\x07 and \x1b[2J"),
            "\\x1b]0;owned\\x07 and \\x1b[2J"
        );
        assert_eq!(escape_controls("ok\rfake"), "ok\\x0dfake");
        assert_eq!(escape_controls("\u{9b}31m \u{7f}"), "\\u{9b}31m \\x7f");
        assert_eq!(escape_controls("\u{0}\u{85}"), "\\x00\\u{85}");
    }

    #[test]
    fn plain_text_newlines_tabs_and_other_scripts_pass_as_they_are() {
        let text = "line 1\n\tline 2 ✓ 日本語 é\n";
        assert!(matches!(escape_controls(text), Cow::Borrowed(t) if t == text));
    }

    #[test]
    fn json_keeps_its_meaning_with_every_control_escaped() {
        let value = serde_json::json!({"line": "\u{1b}[2J \u{7f} \u{9b}31m \u{85}"});
        let json = json_controls(serde_json::to_string(&value).unwrap());
        assert!(!json.chars().any(acts), "{json}");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&json).unwrap(),
            value
        );
    }

    proptest! {
        #[test]
        fn nothing_that_acts_survives_escaping(s in any::<String>()) {
            let escaped = escape_controls(&s);
            prop_assert!(!escaped.chars().any(acts));
            // Escaping what is already escaped changes nothing.
            prop_assert_eq!(escape_controls(&escaped), escaped.clone());
        }

        #[test]
        fn json_of_any_text_reads_back_the_same(s in any::<String>()) {
            let json = json_controls(serde_json::to_string(&s).unwrap());
            prop_assert!(!json.chars().any(acts));
            prop_assert_eq!(serde_json::from_str::<String>(&json).unwrap(), s);
        }
    }
}
