//! The guide's lab blocks (`docs/guide.md`), read into steps: a fenced block whose info string is
//! `sh lab` holds commands, one a line, each `reconcile ...` with the exit code its comment states
//! (`# exit 2: ...`) and any other line a shell command that must succeed; one whose info string
//! is `<lang> lab <path>` (`yaml lab manifests/t-docs-guide.yaml`) is a file the steps after it
//! find at that path. Pure, so `tests/docs.rs` checks the guide's blocks without a test host and
//! `docs_guide.rs` runs them on one.

#![allow(dead_code)]

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Write `text` to `path`, relative to the run's folder.
    File { path: String, text: String },
    /// `sh -c line` in the run's folder; it must exit 0.
    Shell { line: String },
    /// `reconcile args...`, which must exit with `exit`.
    Reconcile {
        args: Vec<String>,
        exit: i32,
        line: String,
    },
}

/// Every lab step of `markdown`, in order; an error names the line (1-based) that cannot be read.
pub fn steps(markdown: &str) -> Result<Vec<Step>, String> {
    let mut steps = Vec::new();
    let mut lines = markdown.lines().enumerate();
    while let Some((n, line)) = lines.next() {
        let trimmed = line.trim_start();
        let Some(info) = trimmed.strip_prefix("```") else {
            continue;
        };
        let words: Vec<&str> = info.split_whitespace().collect();
        let mut body = Vec::new();
        for (_, inner) in lines.by_ref() {
            if inner.trim_start().starts_with("```") {
                break;
            }
            body.push(inner);
        }
        if words.get(1) != Some(&"lab") {
            continue;
        }
        match (words[0], words.get(2)) {
            ("sh", None) => {
                for (i, command) in body.iter().enumerate() {
                    if let Some(step) = command_step(command).map_err(|e| {
                        format!("line {}: {e}: {command}", n + 2 + i)
                    })? {
                        steps.push(step);
                    }
                }
            }
            (_, Some(path)) => steps.push(Step::File {
                path: path.to_string(),
                text: body.iter().map(|l| format!("{l}\n")).collect(),
            }),
            _ => {
                return Err(format!(
                    "line {}: a lab block is `sh lab` (commands) or `<lang> lab <path>` (a file), not `{info}`",
                    n + 1
                ))
            }
        }
    }
    Ok(steps)
}

/// One line of an `sh lab` block: nothing for a blank line or a comment.
fn command_step(line: &str) -> Result<Option<Step>, String> {
    let (command, comment) = split_comment(line);
    let command = command.trim();
    if command.is_empty() {
        return Ok(None);
    }
    let Some(rest) = command.strip_prefix("reconcile ") else {
        return Ok(Some(Step::Shell {
            line: command.to_string(),
        }));
    };
    if rest.contains(['"', '\'', '\\', '$', '`', '|', ';', '&', '<', '>']) {
        return Err("a reconcile line is plain words (no quotes or shell syntax)".into());
    }
    let exit = comment
        .and_then(|c| c.trim().strip_prefix("exit "))
        .and_then(|c| {
            c.split(|ch: char| !ch.is_ascii_digit())
                .next()
                .and_then(|d| d.parse().ok())
        })
        .ok_or("a reconcile line states its exit code: `# exit N: what it means`")?;
    Ok(Some(Step::Reconcile {
        args: rest.split_whitespace().map(String::from).collect(),
        exit,
        line: command.to_string(),
    }))
}

/// The command and its comment: a `#` at the start or after a space, outside quotes.
fn split_comment(line: &str) -> (&str, Option<&str>) {
    let mut quote = None;
    let mut previous = ' ';
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), _) if c == q => quote = None,
            (None, '#') if previous.is_whitespace() => return (&line[..i], Some(&line[i + 1..])),
            _ => {}
        }
        previous = c;
    }
    (line, None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_files_commands_and_exit_codes() {
        let md = "text\n```yaml lab manifests/a.yaml\nservice: a\n```\n```sh\nreconcile plan  # not a lab block\n```\n```sh lab\n# a comment\nsed -i 's/#x/y/' manifests/a.yaml\nreconcile plan --host rl1   # exit 2: changes pending\n\n```\n";
        assert_eq!(
            steps(md).unwrap(),
            [
                Step::File {
                    path: "manifests/a.yaml".into(),
                    text: "service: a\n".into()
                },
                Step::Shell {
                    line: "sed -i 's/#x/y/' manifests/a.yaml".into()
                },
                Step::Reconcile {
                    args: vec!["plan".into(), "--host".into(), "rl1".into()],
                    exit: 2,
                    line: "reconcile plan --host rl1".into()
                },
            ]
        );
    }

    #[test]
    fn a_reconcile_line_without_its_exit_code_is_an_error() {
        let err = steps("```sh lab\nreconcile apply   # applies\n```\n").unwrap_err();
        assert!(
            err.starts_with("line 2: a reconcile line states its exit code"),
            "{err}"
        );
    }
}
