//! Which journal entries one invocation of a unit logged.
//!
//! journald tags a line with `_SYSTEMD_INVOCATION_ID` from the cgroup of the process that wrote
//! it, read when journald takes the line in. A process that has died by then (a crash's last
//! lines, a child that printed its traceback and exited) has no cgroup to read: its lines carry
//! the unit's name and their stdout stream's id, and no invocation (systemd 252 on the test hosts:
//! a shell that prints and exits 1 lost its last line to a query by invocation in 7 of 30
//! crashes). A stream is one started process's stdout, so the lines are read by invocation and by
//! the streams its tagged lines came through, and kept when they name the invocation or come from
//! a stream no other invocation wrote to. A process that died before journald read any of its
//! lines leaves no tagged line to find its stream by: its lines are not found.

use std::collections::HashSet;

use serde_json::Value;

/// One entry of `journalctl -o json`, the fields that place it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub message: String,
    /// `_STREAM_ID`: the stdout connection the line came through, one per started process.
    pub stream: Option<String>,
    /// `INVOCATION_ID` (systemd's own lines about the unit) or `_SYSTEMD_INVOCATION_ID` (the
    /// unit's processes, while journald could still read their cgroup).
    pub invocation: Option<String>,
}

/// The entries of `journalctl -o json --all` output, one JSON object a line. A line that is not
/// an object is skipped: journalctl prints nothing else, and one torn line is no reason to lose
/// the others.
pub fn parse(json_lines: &str) -> Vec<Entry> {
    json_lines
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(Value::is_object)
        .map(|v| Entry {
            message: field(&v, "MESSAGE").unwrap_or_default(),
            stream: field(&v, "_STREAM_ID"),
            invocation: field(&v, "INVOCATION_ID").or_else(|| field(&v, "_SYSTEMD_INVOCATION_ID")),
        })
        .collect()
}

/// A field's value: journalctl writes text as a string, bytes that are not UTF-8 or hold control
/// characters as an array of numbers, and a field set twice as an array of those (the last one
/// is taken).
fn field(entry: &Value, name: &str) -> Option<String> {
    fn text(v: &Value) -> Option<String> {
        match v {
            Value::String(s) => Some(s.clone()),
            Value::Array(items) if items.iter().all(Value::is_u64) => {
                let bytes: Vec<u8> = items
                    .iter()
                    .filter_map(|b| b.as_u64().and_then(|b| u8::try_from(b).ok()))
                    .collect();
                Some(String::from_utf8_lossy(&bytes).into_owned())
            }
            Value::Array(items) => items.last().and_then(text),
            _ => None,
        }
    }
    entry.get(name).and_then(text)
}

/// The last `last` lines that `invocation` logged, in the journal's order, each ending in a
/// newline (as `journalctl -o cat` prints them). An entry counts when it names the invocation, or
/// names none and came through a stream that no entry ties to another invocation: a stream is
/// one process's stdout, so its lines share one invocation.
pub fn of_invocation(entries: &[Entry], invocation: &str, last: usize) -> String {
    let others: HashSet<&str> = entries
        .iter()
        .filter(|e| e.invocation.as_deref().is_some_and(|i| i != invocation))
        .filter_map(|e| e.stream.as_deref())
        .collect();
    let ours: Vec<&Entry> = entries
        .iter()
        .filter(|e| match (&e.invocation, &e.stream) {
            (Some(i), _) => i == invocation,
            (None, Some(s)) => !others.contains(s.as_str()),
            (None, None) => true,
        })
        .collect();
    ours[ours.len().saturating_sub(last)..]
        .iter()
        .map(|e| format!("{}\n", e.message))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(message: &str, stream: Option<&str>, invocation: Option<&str>) -> Entry {
        Entry {
            message: message.into(),
            stream: stream.map(Into::into),
            invocation: invocation.map(Into::into),
        }
    }

    #[test]
    fn reads_text_bytes_and_repeated_fields_and_skips_what_is_not_an_entry() {
        let text = concat!(
            r#"{"MESSAGE":"Started s.service.","INVOCATION_ID":"x","_SYSTEMD_UNIT":"init.scope"}"#,
            "\n",
            // "\x1b]0;owned\x07": control characters come as bytes.
            r#"{"MESSAGE":[27,93,48,59,111,119,110,101,100,7],"_STREAM_ID":"s1","_SYSTEMD_INVOCATION_ID":"x"}"#,
            "\n",
            "not json\n",
            r#"{"MESSAGE":["first","second"],"_STREAM_ID":"s1"}"#,
            "\n",
            r#"{"_STREAM_ID":"s1"}"#,
            "\n",
        );
        assert_eq!(
            parse(text),
            [
                entry("Started s.service.", None, Some("x")),
                entry("\u{1b}]0;owned\u{7}", Some("s1"), Some("x")),
                entry("second", Some("s1"), None),
                entry("", Some("s1"), None),
            ]
        );
    }

    #[test]
    fn lines_journald_took_in_after_their_process_died_stay_with_its_invocation() {
        // As a crash on the test hosts logged it: the shell's lines tagged, the line of its child
        // `tr` (dead when journald read it) only by its stream, systemd's lines by their object.
        let entries = [
            entry("title set", Some("s1"), Some("x")),
            entry(
                "Main process exited, code=exited, status=1/FAILURE",
                None,
                Some("x"),
            ),
            entry("Failed with result 'exit-code'.", None, Some("x")),
            entry("yyyy", Some("s1"), None),
        ];
        assert_eq!(
            of_invocation(&entries, "x", 50),
            "title set\nMain process exited, code=exited, status=1/FAILURE\nFailed with result 'exit-code'.\nyyyy\n"
        );
    }

    #[test]
    fn an_untagged_line_of_a_stream_no_other_invocation_wrote_to_is_kept() {
        // The judgement alone: in the report, a stream with no tagged line is never read.
        let entries = [
            entry("Started s.service.", None, Some("x")),
            entry("error: unrecognized arguments: --bad", Some("s1"), None),
            entry("Failed with result 'exit-code'.", None, Some("x")),
        ];
        assert_eq!(of_invocation(&entries, "x", 50).lines().count(), 3);
    }

    #[test]
    fn other_invocations_and_their_streams_are_left_out_and_the_last_lines_kept() {
        let entries = [
            // The old server's stop, and a line of its dying child.
            entry("Stopping s.service...", None, Some("old")),
            entry("old server shutting down", Some("s0"), Some("old")),
            entry("old child's last line", Some("s0"), None),
            entry("one", Some("s1"), Some("x")),
            entry("two", Some("s1"), None),
            entry("three", Some("s1"), Some("x")),
            // The previous unit, restored after the failure, loading.
            entry("Started s.service.", None, Some("restored")),
            entry("loading weights", Some("s2"), Some("restored")),
            entry("restored child", Some("s2"), None),
        ];
        assert_eq!(of_invocation(&entries, "x", 2), "two\nthree\n");
        assert_eq!(of_invocation(&entries, "x", 50), "one\ntwo\nthree\n");
        assert_eq!(of_invocation(&entries, "none-such", 50), "");
    }
}
