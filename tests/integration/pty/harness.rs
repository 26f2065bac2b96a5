//! A real pseudo-terminal for a command (util-linux `script`), and reading what it drew there:
//! the escape codes, the lines a redrawn line went through, and `reconcile`'s live line.
//!
//! Plain std, no lab: its own tests run anywhere `script` is installed.

use std::path::Path;
use std::process::{Command, Stdio};

/// What a command wrote on its terminal (stdout and stderr both, as a user sees them, with the
/// terminal's `\r\n` line ends) and how it exited.
pub struct Terminal {
    pub code: i32,
    pub output: String,
}

/// How a run on the terminal is set up besides its command line.
pub struct Setup<'a> {
    /// The folder it runs in.
    pub dir: &'a Path,
    /// Variables added to its environment.
    pub env: &'a [(&'a str, &'a str)],
    /// Variables taken out of it (the harness's NO_COLOR, say).
    pub remove: &'a [&'a str],
    /// How long it may run before it is killed and the test fails.
    pub within: std::time::Duration,
}

/// Columns of the terminal: wide enough that indicatif's `{wide_msg}` never cuts the live line
/// (label, stage, time, memory, GPUs, sparkline, the last load's progress).
const COLUMNS: u32 = 240;

/// Runs `argv` on a fresh pseudo-terminal of its own. `script -qfec CMD /dev/null`: quiet (no
/// "Script started" banner on stdout), flushed as it comes, the command's exit code, and no
/// typescript file (stdout carries the same bytes).
pub fn run_in_pty(argv: &[&str], setup: &Setup) -> Terminal {
    let line = format!(
        "stty cols {COLUMNS} rows 50 && exec {}",
        argv.iter().map(|a| quoted(a)).collect::<Vec<_>>().join(" ")
    );
    let mut command = Command::new("timeout");
    command
        .arg(format!("{}", setup.within.as_secs().max(1)))
        .args(["script", "-qfec", &line, "/dev/null"])
        .current_dir(setup.dir)
        // `script -c` runs its command with $SHELL; a POSIX one, whatever the caller's is.
        .env("SHELL", "/bin/sh")
        .envs(setup.env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for name in setup.remove {
        command.env_remove(name);
    }
    let out = command
        .output()
        .expect("`timeout` and `script` (util-linux) run");
    let code = out.status.code().unwrap_or(-1);
    assert_ne!(
        code,
        124,
        "`{}` did not finish within {:?} on its terminal; it drew:\n{}",
        argv.join(" "),
        setup.within,
        String::from_utf8_lossy(&out.stdout)
    );
    Terminal {
        code,
        output: String::from_utf8_lossy(&out.stdout).into_owned(),
    }
}

/// A word for `sh -c`, single-quoted.
fn quoted(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// The escape sequences in `text`, in order: CSI (`ESC [` parameters, final byte), OSC (`ESC ]`
/// to BEL or `ESC \`), and any other `ESC` with the character after it.
pub fn escape_codes(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find('\x1b') {
        let len = escape_len(&rest[start..]);
        found.push(rest[start..start + len].to_string());
        rest = &rest[start + len..];
    }
    found
}

/// `text` without its escape sequences.
pub fn strip_escapes(text: &str) -> String {
    let mut plain = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find('\x1b') {
        plain.push_str(&rest[..start]);
        rest = &rest[start + escape_len(&rest[start..])..];
    }
    plain.push_str(rest);
    plain
}

/// The length in bytes of the escape sequence `at` starts with (`at` starts with ESC).
fn escape_len(at: &str) -> usize {
    let mut chars = at.char_indices().skip(1);
    match chars.next() {
        None => 1,
        Some((_, '[')) => chars
            .find(|(_, c)| ('\x40'..='\x7e').contains(c))
            .map_or(at.len(), |(i, c)| i + c.len_utf8()),
        Some((_, ']')) => {
            let end = at.find('\x07').map(|i| i + 1);
            let st = at.find("\x1b\\").filter(|&i| i > 0).map(|i| i + 2);
            match (end, st) {
                (Some(a), Some(b)) => a.min(b),
                (a, b) => a.or(b).unwrap_or(at.len()),
            }
        }
        Some((i, c)) => i + c.len_utf8(),
    }
}

/// Everything the terminal showed as a line at some moment: the text without escape codes, cut
/// at line ends and at carriage returns (a redrawn line starts again after `\r`).
pub fn shown_lines(text: &str) -> Vec<String> {
    strip_escapes(text)
        .split(['\n', '\r'])
        .map(|l| l.trim().to_string())
        .filter(|l| !l.is_empty())
        .collect()
}

/// Why `text` is not plain lines: an escape code, or a carriage return that redraws a line
/// rather than ends it. `None` when it is.
pub fn not_plain(text: &str) -> Option<String> {
    if let Some(code) = escape_codes(text).first() {
        return Some(format!("escape code {code:?}"));
    }
    let bytes = text.as_bytes();
    let redraw = bytes
        .iter()
        .enumerate()
        .find(|&(i, &b)| b == b'\r' && bytes.get(i + 1) != Some(&b'\n'));
    redraw.map(|(i, _)| format!("a carriage return that redraws, at byte {i}"))
}

/// The parts of `reconcile`'s live line (src/verify/progress.rs):
/// `{spinner} {label} {stage} {elapsed}s mem {memory}[ gpu [..] MiB] {sparkline}[ against]`.
#[derive(Debug, PartialEq)]
pub struct LiveLine {
    pub stage: String,
    pub seconds: u64,
    /// `None` while the memory is not known yet (`?`).
    pub memory: Option<String>,
    pub sparkline: String,
}

/// The stages the live line names, as verification's rounds call them.
const STAGES: [&str; 4] = ["crash window", "loading", "warmup", "loaded"];
const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// `line` read as the live line of the unit `label`; `None` when it is not one.
pub fn live_line(line: &str, label: &str) -> Option<LiveLine> {
    let rest = &line[line.find(label)? + label.len()..];
    let rest = rest.strip_prefix(' ')?;
    let stage = STAGES.into_iter().find(|s| rest.starts_with(s))?;
    let rest = rest[stage.len()..].strip_prefix(' ')?;
    let (seconds, rest) = rest.split_once("s mem ")?;
    let seconds = seconds.parse().ok()?;
    let (memory, rest) = match rest.strip_prefix('?') {
        Some(rest) => (None, rest),
        None => {
            let unit = [" MiB", " GiB"]
                .into_iter()
                .filter_map(|u| rest.find(u).map(|i| i + u.len()))
                .min()?;
            let memory = &rest[..unit];
            memory[..memory.len() - 4].parse::<f64>().ok()?;
            (Some(memory.to_string()), &rest[unit..])
        }
    };
    let rest = match rest.strip_prefix(" gpu [") {
        Some(gpus) => gpus.split_once("] MiB")?.1,
        None => rest,
    };
    let sparkline: String = rest
        .strip_prefix(' ')?
        .chars()
        .take_while(|c| BARS.contains(c))
        .collect();
    Some(LiveLine {
        stage: stage.to_string(),
        seconds,
        memory,
        sparkline,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_codes_are_found_and_stripped() {
        let text = "\x1b[2K\x1b[1A⠁ a\x1b[0m b\x1b]0;title\x07c\x1b7d\x1b]8;;x\x1b\\e";
        assert_eq!(
            escape_codes(text),
            [
                "\x1b[2K",
                "\x1b[1A",
                "\x1b[0m",
                "\x1b]0;title\x07",
                "\x1b7",
                "\x1b]8;;x\x1b\\"
            ]
        );
        assert_eq!(strip_escapes(text), "⠁ a bcde");
        assert_eq!(escape_codes("plain ✓ text\r\n"), Vec::<String>::new());
        assert_eq!(strip_escapes("cut \x1b["), "cut ");
    }

    #[test]
    fn plain_lines_have_no_escape_codes_and_no_redraws() {
        assert_eq!(not_plain("✓ a: crash window passed\r\nb\n"), None);
        assert!(not_plain("a\x1b[1mb").is_some_and(|w| w.contains("escape code")));
        assert!(not_plain("⠁ loading\r⠂ loading\r\n").is_some_and(|w| w.contains("redraws")));
    }

    #[test]
    fn shown_lines_split_redraws() {
        assert_eq!(
            shown_lines("\x1b[2K⠁ one\r\x1b[2K⠂ two\r\nthree\n\n"),
            ["⠁ one", "⠂ two", "three"]
        );
    }

    #[test]
    fn the_live_line_is_read_in_its_parts() {
        let label = "rl16 t.service";
        assert_eq!(
            live_line("⠙ rl16 t.service crash window 2s mem 512 MiB ▁▄█", label),
            Some(LiveLine {
                stage: "crash window".into(),
                seconds: 2,
                memory: Some("512 MiB".into()),
                sparkline: "▁▄█".into(),
            })
        );
        let with_gpus =
            "⠙ rl16 t.service loading 12s mem 1.5 GiB gpu [100, 200] MiB ▁▂ 40% of last";
        let read = live_line(with_gpus, label).expect("a live line");
        assert_eq!((read.stage.as_str(), read.seconds), ("loading", 12));
        assert_eq!(read.memory.as_deref(), Some("1.5 GiB"));
        assert_eq!(read.sparkline, "▁▂");
        let unknown = live_line("⠙ rl16 t.service warmup 0s mem ? ▁", label).expect("a live line");
        assert_eq!(unknown.memory, None);
        assert_eq!(
            live_line("✓ rl16 t.service: crash window passed: 3s", label),
            None
        );
        assert_eq!(
            live_line("⠙ rl16 other.service loading 1s mem ? ▁", label),
            None
        );
    }
}
