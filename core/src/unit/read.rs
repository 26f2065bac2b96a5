//! Reading a unit file the way systemd does, far enough to know what it runs: sections, settings,
//! line continuations, comments, and `ExecStart=`/`Environment=` word splitting.

use super::UnitModel;

/// What systemd calls whitespace (`WHITESPACE` in its sources): it strips exactly these around lines,
/// keys and values and splits words on them; other Unicode spaces are ordinary characters to it.
pub(crate) const WHITESPACE: [char; 4] = [' ', '\t', '\n', '\r'];

fn is_space(c: char) -> bool {
    WHITESPACE.contains(&c)
}

/// `s` without systemd whitespace at either end (systemd's `strstrip`).
pub(crate) fn strip(s: &str) -> &str {
    s.trim_matches(WHITESPACE)
}

/// Whether a raw line ends in a backslash that escapes the newline, i.e. continues on the next
/// line. Like systemd, backslashes are counted from the start: `a\\` ends in an escaped backslash
/// and does not continue, `a\\\` does.
pub(crate) fn continues(line: &str) -> bool {
    let mut escaped = false;
    for c in line.chars() {
        escaped = !escaped && c == '\\';
    }
    escaped
}

/// Parses unit text into what it means. Units written by hand or by other tools read as well as
/// rendered ones, so adopting an existing service shows only real differences.
pub fn parse_unit(text: &str) -> UnitModel {
    let mut model = UnitModel::default();
    for (section, key, value) in settings(text) {
        let (key, value) = (key.as_str(), value.as_str());
        match (section.as_str(), key) {
            ("Service", "ExecStart") => model.exec_start = split_exec(value),
            ("Service", "Environment") if value.is_empty() => model.env.clear(),
            ("Service", "Environment") => {
                for word in split_words(value) {
                    let word = super::specifier::resolve_fixed(&word);
                    if let Some((name, v)) = word.split_once('=') {
                        model.env.insert(name.to_string(), v.to_string());
                    }
                }
            }
            _ => {
                let values = model
                    .settings
                    .entry(format!("{section}.{key}"))
                    .or_default();
                if value.is_empty() {
                    values.clear();
                } else {
                    values.push(value.to_string());
                }
            }
        }
    }
    model.settings.retain(|_, v| !v.is_empty());
    model
}

/// What a unit file sets, as names the plan's summary uses: `ExecStart`, `env:NAME` for each
/// variable an `Environment=` line sets (`env:*` for an empty one, which resets them all), and
/// `Section.Key` for every other setting. For telling which file of a unit's files (its file and
/// drop-ins) a value in force comes from: the last one that sets it.
pub fn assigned(text: &str) -> Vec<String> {
    assignments(text)
        .into_iter()
        .map(|(name, _)| name)
        .collect()
}

/// [`assigned`], with whether each assignment is empty (a reset: `ExecStart=`, `After=`).
pub fn assignments(text: &str) -> Vec<(String, bool)> {
    let mut names = Vec::new();
    for (section, key, value) in settings(text) {
        let (key, value) = (key.as_str(), value.as_str());
        let empty = value.is_empty();
        match (section.as_str(), key) {
            ("Service", "ExecStart") => names.push(("ExecStart".to_string(), empty)),
            ("Service", "Environment") if empty => names.push(("env:*".to_string(), true)),
            ("Service", "Environment") => names.extend(
                split_words(value)
                    .iter()
                    .filter_map(|w| w.split_once('='))
                    .map(|(name, _)| (format!("env:{name}"), false)),
            ),
            _ => names.push((format!("{section}.{key}"), empty)),
        }
    }
    names
}

/// Each `Key=value` line of unit text with the section it stands in, key and value stripped as
/// systemd reads them; section headers and lines without `=` are passed over.
fn settings(text: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let mut section = String::new();
    for line in logical_lines(text) {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.to_string();
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            continue;
        };
        out.push((
            section.clone(),
            strip(key).to_string(),
            strip(value).to_string(),
        ));
    }
    out
}

/// The argv systemd executes for an `ExecStart=` value.
pub fn split_exec(value: &str) -> Vec<String> {
    let mut words: Vec<String> = split_words(value)
        .into_iter()
        .map(|w| super::specifier::resolve_fixed(&w).replace("$$", "$"))
        .collect();
    if let Some(first) = words.first_mut() {
        // `-`, `@`, `:`, `+`, `!` prefixes change how systemd runs the binary, not what it runs.
        *first = first
            .trim_start_matches(['-', '@', ':', '+', '!'])
            .to_string();
    }
    words
}

/// Joins continuation lines and drops comments and blank lines, as systemd's `config_parse` does:
/// a line ending in an unescaped backslash continues (the backslash becomes a space and the next
/// raw line is appended as is), and comment lines are skipped even in the middle of a continuation.
fn logical_lines(text: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut pending: Option<String> = None;
    for raw in raw_lines(text) {
        if strip(raw).starts_with(['#', ';']) {
            continue;
        }
        let mut joined = match pending.take() {
            Some(mut acc) => {
                acc.push_str(raw);
                acc
            }
            None => raw.to_string(),
        };
        if continues(&joined) {
            joined.pop();
            joined.push(' ');
            pending = Some(joined);
        } else if !strip(&joined).is_empty() {
            lines.push(strip(&joined).to_string());
        }
    }
    lines.extend(
        pending
            .map(|p| strip(&p).to_string())
            .filter(|p| !p.is_empty()),
    );
    lines
}

/// Lines as systemd's `read_line` ends them: at `\n`, `\r\n` or a lone `\r`.
fn raw_lines(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = Some(text);
    std::iter::from_fn(move || {
        let text = rest?;
        match text.find(['\n', '\r']) {
            Some(at) => {
                let skip = if text[at..].starts_with("\r\n") { 2 } else { 1 };
                rest = Some(&text[at + skip..]).filter(|r| !r.is_empty());
                Some(&text[..at])
            }
            None => {
                rest = None;
                Some(text)
            }
        }
    })
}

/// systemd's `extract_first_word` with unquoting and C unescaping, over a whole value.
fn split_words(value: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut chars = value.chars().peekable();
    loop {
        while chars.peek().is_some_and(|&c| is_space(c)) {
            chars.next();
        }
        if chars.peek().is_none() {
            return words;
        }
        let mut word = String::new();
        let mut quote: Option<char> = None;
        while let Some(c) = chars.next() {
            match (c, quote) {
                ('\\', _) => unescape(&mut chars, &mut word),
                ('"' | '\'', None) => quote = Some(c),
                (c, Some(q)) if c == q => quote = None,
                (c, None) if is_space(c) => break,
                (c, _) => word.push(c),
            }
        }
        words.push(word);
    }
}

fn unescape(chars: &mut std::iter::Peekable<std::str::Chars>, word: &mut String) {
    let Some(c) = chars.next() else { return };
    let simple = match c {
        'a' => Some('\x07'),
        'b' => Some('\x08'),
        'f' => Some('\x0c'),
        'n' => Some('\n'),
        'r' => Some('\r'),
        't' => Some('\t'),
        'v' => Some('\x0b'),
        's' => Some(' '),
        '\\' | '"' | '\'' | ';' => Some(c),
        _ => None,
    };
    if let Some(s) = simple {
        word.push(s);
        return;
    }
    let digits = match c {
        'x' => 2,
        'u' => 4,
        'U' => 8,
        _ => {
            word.push('\\');
            word.push(c);
            return;
        }
    };
    let hex: String = (0..digits).filter_map(|_| chars.next()).collect();
    match u32::from_str_radix(&hex, 16).ok().and_then(char::from_u32) {
        Some(ch) => word.push(ch),
        None => {
            word.push('\\');
            word.push(c);
            word.push_str(&hex);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn continuation_lines_join_and_comments_drop() {
        let m = parse_unit(
            "[Service]\n# note\nExecStart=/bin/py -m x \\\n\t--a 1 \\\n\t--b\nUser=root\n",
        );
        assert_eq!(m.exec_start, ["/bin/py", "-m", "x", "--a", "1", "--b"]);
        assert_eq!(m.settings["Service.User"], ["root"]);
    }

    #[test]
    fn quotes_escapes_and_specifiers_resolve() {
        let argv = split_exec(r#"-/bin/echo "a b" 'c d' "say \"hi\"\\" "50%%" "$$HOME" \x41"#);
        assert_eq!(
            argv,
            [
                "/bin/echo",
                "a b",
                "c d",
                "say \"hi\"\\",
                "50%",
                "$HOME",
                "A"
            ]
        );
    }

    #[test]
    fn environment_accumulates_and_an_empty_assignment_resets_it() {
        let m = parse_unit(
            "[Service]\nEnvironment=A=1 \"B=x y\"\nEnvironment=\nEnvironment=\"C=5%%\"\n",
        );
        assert_eq!(m.env.len(), 1);
        assert_eq!(m.env["C"], "5%");
    }
}

/// How systemd's `config_parse` ends and joins lines, and what it counts as whitespace.
#[cfg(test)]
mod systemd_syntax {
    use super::*;

    #[test]
    fn only_an_unescaped_trailing_backslash_continues() {
        let m = parse_unit("[Service]\nUser=a\\\\\nGroup=b\\\\\\\nc\nNice=1\\ \n");
        assert_eq!(m.settings["Service.User"], ["a\\\\"]);
        assert_eq!(m.settings["Service.Group"], ["b\\\\ c"]);
        assert_eq!(m.settings["Service.Nice"], ["1\\"]);
        assert!(continues("a\\") && !continues("a\\\\") && continues("a\\\\\\"));
        assert!(!continues("a\\ "));
    }

    #[test]
    fn comments_inside_a_continuation_are_skipped() {
        let m = parse_unit("[Service]\nExecStart=/p \\\n# note \\\n  ; other\n  --a 1\n");
        assert_eq!(m.exec_start, ["/p", "--a", "1"]);
    }

    #[test]
    fn unicode_spaces_are_not_whitespace_to_systemd() {
        let m = parse_unit("[Service]\nExecStart=/p a\u{a0}b\u{3000}\nUser=\u{3000}x\u{a0}\n");
        assert_eq!(m.exec_start, ["/p", "a\u{a0}b\u{3000}"]);
        assert_eq!(m.settings["Service.User"], ["\u{3000}x\u{a0}"]);
    }

    #[test]
    fn lines_end_at_cr_lf_and_lone_cr() {
        let m = parse_unit("[Service]\r\nUser=a\rGroup=b\r\n");
        assert_eq!(m.settings["Service.User"], ["a"]);
        assert_eq!(m.settings["Service.Group"], ["b"]);
    }

    #[test]
    fn a_continuation_at_the_end_of_the_file_still_counts() {
        let m = parse_unit("[Service]\nExecStart=/p --a \\");
        assert_eq!(m.exec_start, ["/p", "--a"]);
    }
}
