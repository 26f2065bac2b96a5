//! Editing a manifest's YAML text in place: one key of `sglang.flags` or `env` set, every other
//! byte (comments, blank lines, order, quoting, flow or block style) left as it was.
//!
//! A variant is run as exactly this edit of the baseline manifest, and `--write` writes the same
//! edit back, so what was measured and what is committed cannot differ. A YAML library that
//! parses and re-serialises would drop the comments and reorder keys; the reviewer would then see
//! a diff far larger than the change.

use std::fmt;

/// Where the edited key lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Section {
    /// `sglang.flags`.
    Flags,
    /// The service-wide `env`.
    Env,
}

impl fmt::Display for Section {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Section::Flags => "sglang.flags",
            Section::Env => "env",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EditError {
    /// The map is written in a way this editor does not rewrite safely (a multi-line flow map,
    /// an anchor): the user edits it by hand, nothing is guessed.
    #[error("{section} at line {line} is written in a form that cannot be edited in place ({why}); write it as a block or one-line flow map")]
    Unsupported {
        section: Section,
        line: usize,
        why: &'static str,
    },
    #[error("the manifest has no `sglang:` section to add flags to")]
    NoSglang,
}

/// `text` with `section.key` set to `value` (a YAML scalar or one-line flow value, as it is to be
/// written). An existing entry keeps its line, indentation and trailing comment; a new one goes
/// after the map's last entry, in the map's style.
pub fn set(text: &str, section: Section, key: &str, value: &str) -> Result<String, EditError> {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let found = match section {
        Section::Flags => {
            let sglang =
                find_key(&lines, 0, lines.len(), 0, "sglang").ok_or(EditError::NoSglang)?;
            let (start, end) = children(&lines, sglang);
            let indent = child_indent(&lines, start, end).unwrap_or(2);
            match find_key(&lines, start, end, indent, "flags") {
                Some(at) => Some((at, indent)),
                None => {
                    // No `flags:` yet: added as the section's first key.
                    let pad = " ".repeat(indent);
                    let add = format!("{pad}flags:\n{pad}  {key}: {value}\n");
                    return Ok(insert(&lines, sglang + 1, &add));
                }
            }
        }
        Section::Env => find_key(&lines, 0, lines.len(), 0, "env").map(|at| (at, 0)),
    };
    let Some((at, indent)) = found else {
        // No top-level `env:`: one is added at the end.
        let mut out = text.to_string();
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
        out.push_str(&format!("env:\n  {key}: {value}\n"));
        return Ok(out);
    };
    let line = lines[at];
    let after_colon = value_after_key(line, indent).unwrap_or("");
    let inline = strip_comment(after_colon).trim();
    if inline.is_empty() {
        return set_block(&lines, at, key, value);
    }
    if inline.starts_with('{') && inline.ends_with('}') {
        let edited = set_flow(line, key, value).ok_or(EditError::Unsupported {
            section,
            line: at + 1,
            why: "a flow map this editor cannot split",
        })?;
        let mut out: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
        out[at] = edited;
        return Ok(out.concat());
    }
    Err(EditError::Unsupported {
        section,
        line: at + 1,
        why: if inline.starts_with('{') {
            "a flow map over several lines"
        } else {
            "not a map"
        },
    })
}

fn set_block(lines: &[&str], at: usize, key: &str, value: &str) -> Result<String, EditError> {
    let (start, end) = children(lines, at);
    let own = indent_of(lines[at]);
    let indent = child_indent(lines, start, end).unwrap_or(own + 2);
    let mut out: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    if let Some(hit) = find_key(lines, start, end, indent, key) {
        out[hit] = replace_value(lines[hit], indent, value);
        return Ok(out.concat());
    }
    // After the last entry (not after comments or blank lines that close the map).
    let last = (start..end)
        .rev()
        .find(|&i| is_content(lines[i]))
        .map_or(at, |i| i);
    let mut add = format!("{}{key}: {value}\n", " ".repeat(indent));
    if !out[last].ends_with('\n') {
        add.insert(0, '\n');
    }
    out.insert(last + 1, add);
    Ok(out.concat())
}

/// The one-line flow map on `line` with `key` set.
fn set_flow(line: &str, key: &str, value: &str) -> Option<String> {
    let open = line.find('{')?;
    let close = matching_close(line, open)?;
    let inner = &line[open + 1..close];
    let mut items = split_top(inner)?;
    let mut replaced = false;
    for item in items.iter_mut() {
        let trimmed = item.trim();
        let (k, _) = trimmed.split_once(':')?;
        if unquote(k.trim()) == key {
            let lead = &item[..item.len() - item.trim_start().len()];
            let trail = &item[item.trim_end().len()..];
            *item = format!("{lead}{}: {value}{trail}", k.trim());
            replaced = true;
        }
    }
    let body = if replaced {
        items.join(",")
    } else if inner.trim().is_empty() {
        format!(" {key}: {value} ")
    } else {
        let trimmed = inner.trim_end();
        format!("{trimmed}, {key}: {value}{}", &inner[trimmed.len()..])
    };
    Some(format!("{}{{{body}}}{}", &line[..open], &line[close + 1..]))
}

/// Items of a flow map's inside split at its top-level commas (not inside quotes or brackets);
/// `None` for text this editor does not follow (an unbalanced bracket or quote).
fn split_top(inner: &str) -> Option<Vec<String>> {
    let mut items = Vec::new();
    let mut depth = 0i32;
    let mut quote: Option<char> = None;
    let mut current = String::new();
    let mut chars = inner.chars().peekable();
    while let Some(c) = chars.next() {
        match quote {
            Some(q) => {
                current.push(c);
                if c == '\\' && q == '"' {
                    if let Some(n) = chars.next() {
                        current.push(n);
                    }
                } else if c == q {
                    quote = None;
                }
            }
            None => match c {
                '"' | '\'' => {
                    quote = Some(c);
                    current.push(c);
                }
                '[' | '{' => {
                    depth += 1;
                    current.push(c);
                }
                ']' | '}' => {
                    depth -= 1;
                    if depth < 0 {
                        return None;
                    }
                    current.push(c);
                }
                ',' if depth == 0 => items.push(std::mem::take(&mut current)),
                _ => current.push(c),
            },
        }
    }
    if quote.is_some() || depth != 0 {
        return None;
    }
    if !current.trim().is_empty() || !items.is_empty() {
        items.push(current);
    }
    Some(items.into_iter().filter(|i| !i.trim().is_empty()).collect())
}

fn matching_close(line: &str, open: usize) -> Option<usize> {
    let mut depth = 0;
    let mut quote: Option<char> = None;
    for (i, c) in line.char_indices().skip_while(|(i, _)| *i < open) {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None => match c {
                '"' | '\'' => quote = Some(c),
                '{' | '[' => depth += 1,
                '}' | ']' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(i);
                    }
                }
                _ => {}
            },
        }
    }
    None
}

fn unquote(k: &str) -> &str {
    k.trim_matches(|c| c == '"' || c == '\'')
}

fn indent_of(line: &str) -> usize {
    line.len() - line.trim_start_matches(' ').len()
}

fn is_content(line: &str) -> bool {
    let t = line.trim();
    !t.is_empty() && !t.starts_with('#')
}

/// The text after `key:` when `line` is a key at `indent`.
fn value_after_key(line: &str, indent: usize) -> Option<&str> {
    if indent_of(line) != indent {
        return None;
    }
    let body = &line[indent..];
    let colon = body.find(':')?;
    Some(&body[colon + 1..])
}

fn key_of(line: &str, indent: usize) -> Option<&str> {
    if indent_of(line) != indent || !is_content(line) {
        return None;
    }
    let body = &line[indent..];
    let colon = body.find(':')?;
    let rest = &body[colon + 1..];
    (rest.is_empty() || rest.starts_with([' ', '\n', '\r'])).then(|| unquote(body[..colon].trim()))
}

fn find_key(lines: &[&str], start: usize, end: usize, indent: usize, key: &str) -> Option<usize> {
    (start..end).find(|&i| key_of(lines[i], indent) == Some(key))
}

/// The lines below `at` that are indented deeper than it: its block's children (comments and
/// blank lines between them included).
fn children(lines: &[&str], at: usize) -> (usize, usize) {
    let own = indent_of(lines[at]);
    let mut end = at + 1;
    for (i, line) in lines.iter().enumerate().skip(at + 1) {
        if is_content(line) {
            if indent_of(line) <= own {
                break;
            }
            end = i + 1;
        }
    }
    (at + 1, end)
}

fn child_indent(lines: &[&str], start: usize, end: usize) -> Option<usize> {
    (start..end)
        .find(|&i| is_content(lines[i]))
        .map(|i| indent_of(lines[i]))
}

/// The text after `# ` that starts a comment (a `#` after whitespace, outside quotes), with the
/// whitespace before it; empty when there is none.
fn comment_start(text: &str) -> Option<usize> {
    let mut quote: Option<char> = None;
    let mut previous = ' ';
    for (i, c) in text.char_indices() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '"' || c == '\'' => quote = Some(c),
            None if c == '#' && previous.is_whitespace() => return Some(i),
            None => {}
        }
        previous = c;
    }
    None
}

fn strip_comment(text: &str) -> &str {
    match comment_start(text) {
        Some(i) => &text[..i],
        None => text,
    }
}

/// `line` (a `key: old  # comment`) with `value` in place of `old`, the comment kept.
fn replace_value(line: &str, indent: usize, value: &str) -> String {
    let body = &line[indent..];
    let colon = body.find(':').expect("a key line has a colon");
    let rest = &body[colon + 1..];
    let newline = if rest.ends_with("\r\n") {
        "\r\n"
    } else if rest.ends_with('\n') {
        "\n"
    } else {
        ""
    };
    let rest = &rest[..rest.len() - newline.len()];
    let comment = match comment_start(rest) {
        Some(i) => {
            let before = &rest[..i];
            let gap = &before[before.trim_end().len()..];
            format!("{gap}{}", &rest[i..])
        }
        None => String::new(),
    };
    format!(
        "{}{}: {value}{comment}{newline}",
        &line[..indent],
        &body[..colon]
    )
}

fn insert(lines: &[&str], at: usize, add: &str) -> String {
    let mut out: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    out.insert(at, add.to_string());
    out.concat()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::assert_holds;

    const BLOCK: &str = "service: a\n# the model\nsglang:\n  python: /usr/bin/python3\n  flags:\n    tp-size: 2   # two GPUs\n    # mixed chunk was slower in March\n    context-length: 8192\n\n  port: 30000\nenv: { A: \"1\", B: \"x,y\" }  # keep\n";

    #[test]
    fn an_existing_flag_keeps_its_line_and_comment() {
        let out = set(BLOCK, Section::Flags, "tp-size", "4").unwrap();
        assert_eq!(
            out,
            BLOCK.replace("tp-size: 2   # two", "tp-size: 4   # two")
        );
    }

    #[test]
    fn a_new_flag_goes_after_the_last_entry_and_nothing_else_moves() {
        let out = set(BLOCK, Section::Flags, "enable-mixed-chunk", "true").unwrap();
        assert_eq!(
            out,
            BLOCK.replace(
                "    context-length: 8192\n",
                "    context-length: 8192\n    enable-mixed-chunk: true\n"
            )
        );
    }

    #[test]
    fn a_flow_env_gains_or_changes_one_item() {
        let out = set(BLOCK, Section::Env, "C", "\"2\"").unwrap();
        assert_holds(&out, "env: { A: \"1\", B: \"x,y\", C: \"2\" }  # keep\n");
        let out = set(BLOCK, Section::Env, "B", "\"z\"").unwrap();
        assert_holds(&out, "env: { A: \"1\", B: \"z\" }  # keep\n");
    }

    #[test]
    fn missing_maps_are_added() {
        let text = "service: a\nsglang:\n  python: p\n";
        let out = set(text, Section::Flags, "x", "1").unwrap();
        assert_eq!(
            out,
            "service: a\nsglang:\n  flags:\n    x: 1\n  python: p\n"
        );
        let out = set(text, Section::Env, "E", "\"1\"").unwrap();
        assert_eq!(out, format!("{text}env:\n  E: \"1\"\n"));
        assert_eq!(
            set("service: a\n", Section::Flags, "x", "1"),
            Err(EditError::NoSglang)
        );
    }

    #[test]
    fn a_multiline_flow_map_is_refused_not_guessed() {
        let text = "sglang:\n  flags: { a: 1,\n    b: 2 }\n";
        assert!(matches!(
            set(text, Section::Flags, "c", "3"),
            Err(EditError::Unsupported { line: 2, .. })
        ));
    }

    #[test]
    fn the_edit_parses_as_the_manifest_parser_reads_it() {
        let text = crate::manifest::parse(
            "m.yaml",
            &set(
                BLOCK.split("env:").next().unwrap(),
                Section::Flags,
                "speculative-num-steps",
                "3",
            )
            .unwrap()
            .replace(
                "  port: 30000\n",
                "  port: 30000\n  version: 0.5.23\n  model_path: /m\n",
            )
            .replace("service: a\n", "service: a\nhosts: [h]\n"),
        )
        .unwrap();
        assert_eq!(
            text.sglang.flags["speculative-num-steps"],
            crate::manifest::FlagValue::Value("3".into())
        );
    }
}
