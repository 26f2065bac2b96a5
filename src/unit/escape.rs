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
            c if c.is_control() => out.push_str(&format!("\\x{:02x}", c as u32)),
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
