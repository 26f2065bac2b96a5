//! Assertions the unit tests share. Most tests check messages (errors, findings, notes, report
//! text) by the part each must hold; these say which part is missing and show the whole text or
//! list when one is, so each test states only what it expects.

use std::fmt::Debug;

/// `messages` are as many as `prefixes`, and each begins with its own.
#[track_caller]
pub(crate) fn assert_starts<S: AsRef<str> + Debug>(messages: &[S], prefixes: &[&str]) {
    assert_each(messages, prefixes, "begin with", |m, p| m.starts_with(p));
}

/// `messages` are as many as `parts`, and each holds its own.
#[track_caller]
pub(crate) fn assert_each_holds<S: AsRef<str> + Debug>(messages: &[S], parts: &[&str]) {
    assert_each(messages, parts, "hold", |m, p| m.contains(p));
}

/// `messages` are as many as `parts`, and each passes `test` against its own.
#[track_caller]
fn assert_each<S: AsRef<str> + Debug>(
    messages: &[S],
    parts: &[&str],
    what: &str,
    test: fn(&str, &str) -> bool,
) {
    assert_eq!(messages.len(), parts.len(), "{messages:#?}");
    for (i, (message, part)) in messages.iter().zip(parts).enumerate() {
        assert!(
            test(message.as_ref(), part),
            "message {i} does not {what} {part:?}: {messages:#?}"
        );
    }
}

/// Some message of `messages` holds `part`.
#[track_caller]
pub(crate) fn assert_any<S: AsRef<str> + Debug>(messages: &[S], part: &str) {
    assert_some(messages, part, "holds", |m, p| m.contains(p));
}

/// Some message of `messages` begins with `prefix`.
#[track_caller]
pub(crate) fn assert_any_starts<S: AsRef<str> + Debug>(messages: &[S], prefix: &str) {
    assert_some(messages, prefix, "begins with", |m, p| m.starts_with(p));
}

/// Some message of `messages` passes `test` against `part`.
#[track_caller]
fn assert_some<S: AsRef<str> + Debug>(
    messages: &[S],
    part: &str,
    what: &str,
    test: fn(&str, &str) -> bool,
) {
    assert!(
        messages.iter().any(|m| test(m.as_ref(), part)),
        "no message {what} {part:?}: {messages:#?}"
    );
}

/// `text` holds `part`.
#[track_caller]
pub(crate) fn assert_holds(text: &str, part: &str) {
    assert!(text.contains(part), "{part:?} is not in:\n{text}");
}
