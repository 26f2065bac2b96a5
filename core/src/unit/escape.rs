//! Writing values so that systemd reads back exactly what the manifest says.
//!
//! systemd splits `ExecStart=` into words with C-style escapes inside quotes, expands `%`
//! specifiers in it and in `Environment=`, and substitutes `$VAR` in command arguments. A value is
//! written bare only when it holds nothing systemd would interpret.

/// One `ExecStart=` argument.
pub fn quote_exec_arg(arg: &str) -> String {
    if arg == ";" {
        // A lone `;` separates commands in older systemd; escaped it is a literal argument.
        return "\\;".to_string();
    }
    if !arg.is_empty() && arg.chars().all(is_plain) {
        return arg.to_string();
    }
    quoted(arg, true)
}

/// One `Environment=` assignment, always quoted so every value reads back the same way.
pub fn quote_env(name: &str, value: &str) -> String {
    quoted(&format!("{name}={value}"), false)
}

/// Doubles `%` for settings written as plain text (Description=), where systemd expands specifiers.
pub fn escape_specifiers(text: &str) -> String {
    text.replace('%', "%%")
}

fn is_plain(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/' | ',' | ':' | '=' | '+' | '@')
}

fn quoted(text: &str, exec: bool) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '%' => out.push_str("%%"),
            '$' if exec => out.push_str("$$"),
            '\t' => out.push_str("\\t"),
            // systemd's `\xNN` is one byte, not a character: above ASCII it would leave invalid
            // UTF-8, so C1 controls (U+0080..U+009F) are written as `\uNNNN`.
            c if c.is_control() && c.is_ascii() => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_arguments_stay_bare() {
        assert_eq!(quote_exec_arg("--tp-size"), "--tp-size");
        assert_eq!(
            quote_exec_arg("/shared/models/Qwen3.5-122B-A10B"),
            "/shared/models/Qwen3.5-122B-A10B"
        );
    }

    #[test]
    fn everything_systemd_would_interpret_is_escaped() {
        assert_eq!(quote_exec_arg("a b"), "\"a b\"");
        assert_eq!(quote_exec_arg("50%"), "\"50%%\"");
        assert_eq!(quote_exec_arg("$HOME"), "\"$$HOME\"");
        assert_eq!(quote_exec_arg(r#"say "hi"\"#), r#""say \"hi\"\\""#);
        assert_eq!(quote_exec_arg(""), "\"\"");
        assert_eq!(quote_exec_arg(";"), "\\;");
        assert_eq!(quote_exec_arg("{\"a\": 1}"), "\"{\\\"a\\\": 1}\"");
    }

    #[test]
    fn environment_keeps_dollars_but_doubles_percent() {
        assert_eq!(quote_env("X", "$a 5%"), "\"X=$a 5%%\"");
    }
}

/// Property tests: whatever a manifest may hold (anything but the newline, carriage return and NUL
/// that `validate` rejects), quoting it and reading it back the way systemd does gives it back.
#[cfg(test)]
pub(crate) mod props {
    use super::*;
    use crate::unit::read::{parse_unit, split_exec};
    use proptest::prelude::*;

    /// Characters chosen on purpose: what systemd's word splitting, C unescaping, specifier (`%`)
    /// and variable (`$`) expansion, `;` separation and line continuation act on; exec prefixes;
    /// whitespace systemd does not split on; C0 and C1 controls; multi-byte and astral characters.
    const HOSTILE: &[char] = &[
        '"',
        '\'',
        '\\',
        '$',
        '%',
        ';',
        ' ',
        '\t',
        '-',
        '@',
        '+',
        '!',
        ':',
        '=',
        '#',
        '{',
        '}',
        '[',
        ']',
        '*',
        '?',
        '~',
        '`',
        '&',
        '|',
        '<',
        '>',
        '(',
        ')',
        'x',
        'u',
        'U',
        'n',
        's',
        't',
        '0',
        'a',
        'F',
        '\x01',
        '\x07',
        '\x0b',
        '\x0c',
        '\x1b',
        '\x7f',
        '\u{85}',
        '\u{9f}',
        '\u{a0}',
        '\u{2028}',
        '\u{2029}',
        '\u{3000}',
        '\u{feff}',
        'ü',
        'é',
        '✓',
        'Ω',
        '\u{1F600}',
    ];

    /// Any character a manifest value may hold.
    fn allowed(c: &char) -> bool {
        !matches!(c, '\n' | '\r' | '\0')
    }

    pub(crate) fn hostile_char() -> impl Strategy<Value = char> {
        prop_oneof![
            6 => proptest::sample::select(HOSTILE),
            2 => proptest::char::range(' ', '~'),
            1 => any::<char>().prop_filter("validate rejects it", allowed),
        ]
    }

    /// Strings built from hostile characters, arbitrary printable strings, and the shapes that
    /// matter at the edges: empty, a lone `;`, leading dashes, trailing backslashes.
    pub(crate) fn hostile_string() -> impl Strategy<Value = String> {
        prop_oneof![
            6 => proptest::collection::vec(hostile_char(), 0..16)
                .prop_map(|cs| cs.into_iter().collect::<String>()),
            2 => "\\PC{0,24}".prop_filter("validate rejects it", |s| s.chars().all(|c| allowed(&c))),
            1 => Just(String::new()),
            1 => Just(";".to_string()),
            1 => (proptest::collection::vec(hostile_char(), 0..8), 1..4usize, 0..4usize).prop_map(
                |(cs, dashes, backslashes)| {
                    let body: String = cs.into_iter().collect();
                    format!("{}{body}{}", "-".repeat(dashes), "\\".repeat(backslashes))
                }
            ),
        ]
    }

    /// `start`, then each of `args` quoted as an `ExecStart=` argument, each after `sep`.
    fn quoted_after(start: &str, sep: &str, args: &[String]) -> String {
        let mut line = start.to_string();
        for arg in args {
            line.push_str(sep);
            line.push_str(&quote_exec_arg(arg));
        }
        line
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn one_exec_argument_reads_back_as_itself(arg in hostile_string()) {
            let line = format!("/bin/prog {}", quote_exec_arg(&arg));
            prop_assert_eq!(split_exec(&line), vec!["/bin/prog".to_string(), arg]);
        }

        #[test]
        fn exec_arguments_keep_their_boundaries(args in proptest::collection::vec(hostile_string(), 0..6)) {
            let line = quoted_after("/bin/prog", " ", &args);
            let mut expected = vec!["/bin/prog".to_string()];
            expected.extend(args);
            prop_assert_eq!(split_exec(&line), expected);
        }

        /// The program itself (an absolute path in a manifest) survives quoting too, without
        /// losing characters to systemd's `-@:+!` prefixes.
        #[test]
        fn program_path_reads_back_as_itself(rest in hostile_string()) {
            let program = format!("/{rest}");
            prop_assert_eq!(split_exec(&quote_exec_arg(&program)), vec![program]);
        }

        /// Inside a unit file, on a continued `ExecStart=` line, as `render` writes them.
        #[test]
        fn exec_arguments_read_back_from_a_unit(args in proptest::collection::vec(hostile_string(), 1..5)) {
            let text = quoted_after("[Service]\nExecStart=/bin/prog", " \\\n\t", &args) + "\n";
            let mut expected = vec!["/bin/prog".to_string()];
            expected.extend(args);
            prop_assert_eq!(parse_unit(&text).exec_start, expected);
        }

        #[test]
        fn environment_value_reads_back_as_itself(value in hostile_string(), name in "[A-Za-z_][A-Za-z0-9_]{0,12}") {
            let text = format!("[Service]\nEnvironment={}\n", quote_env(&name, &value));
            let env = parse_unit(&text).env;
            prop_assert_eq!(env.len(), 1);
            prop_assert_eq!(&env[&name], &value);
        }

        /// No escape that systemd would turn into a raw byte above ASCII (invalid UTF-8).
        #[test]
        fn escapes_stay_in_ascii(arg in hostile_string()) {
            let quoted = quote_exec_arg(&arg);
            let mut chars = quoted.chars();
            while let Some(c) = chars.next() {
                if c == '\\' && chars.next() == Some('x') {
                    let hex: String = chars.by_ref().take(2).collect();
                    let byte = u8::from_str_radix(&hex, 16);
                    prop_assert!(matches!(byte, Ok(b) if b < 0x80), "{}", quoted);
                }
            }
        }
    }

    #[test]
    fn c1_controls_are_written_as_code_points() {
        assert_eq!(quote_exec_arg("a\u{85}b"), "\"a\\u0085b\"");
        assert_eq!(split_exec("/p \"a\\u0085b\""), ["/p", "a\u{85}b"]);
        assert_eq!(quote_exec_arg("\x1b[0m"), "\"\\x1b[0m\"");
    }
}
