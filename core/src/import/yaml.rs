//! Writing the imported manifest: block YAML with a comment where a value needs one (where it
//! came from, why it is a reference). Scalars are written bare only when YAML reads them back as
//! the same text; everything else is double-quoted with JSON's escapes.

use super::argv::{Item, Written};

/// The manifest being written, line by line.
#[derive(Default)]
pub struct Out {
    text: String,
}

impl Out {
    pub fn comment(&mut self, indent: usize, comment: &str) {
        for line in comment.lines() {
            self.text.push_str(&" ".repeat(indent));
            self.text
                .push_str(&format!("# {line}\n").replace("# \n", "#\n"));
        }
    }

    /// `key: value`, with a trailing comment when given.
    pub fn entry(&mut self, indent: usize, key: &str, value: &str, comment: Option<&str>) {
        self.text.push_str(&" ".repeat(indent));
        self.text.push_str(&text(key));
        self.text.push(':');
        if !value.is_empty() {
            self.text.push(' ');
            self.text.push_str(value);
        }
        if let Some(c) = comment {
            self.text.push_str("  # ");
            self.text.push_str(c);
        }
        self.text.push('\n');
    }

    pub fn line(&mut self, indent: usize, line: &str) {
        self.text.push_str(&" ".repeat(indent));
        self.text.push_str(line);
        self.text.push('\n');
    }

    pub fn into_text(self) -> String {
        self.text
    }
}

/// A flag's value as YAML.
pub fn written(w: &Written) -> String {
    match w {
        Written::True => "true".into(),
        Written::One(item) => self::item(item),
        Written::List(items) => format!(
            "[{}]",
            items.iter().map(item).collect::<Vec<_>>().join(", ")
        ),
        Written::FromEnv { var, .. } => from_env(var),
    }
}

pub fn from_env(var: &str) -> String {
    format!("{{ from_env: {} }}", text(var))
}

fn item(item: &Item) -> String {
    match item {
        Item::Number(n) => n.clone(),
        Item::Text(t) => text(t),
    }
}

/// A setting's value: a whole number bare (`1048576`, which the manifest reads back as the same
/// text), anything else as [`text`].
pub fn setting(s: &str) -> String {
    let whole = !s.is_empty()
        && s.chars().all(|c| c.is_ascii_digit())
        && (s == "0" || !s.starts_with('0'))
        && s.parse::<u64>().is_ok();
    if whole {
        s.to_string()
    } else {
        text(s)
    }
}

/// A string scalar: bare when it is plainly a word or path YAML keeps as text, else quoted.
pub fn text(s: &str) -> String {
    if plain(s) {
        s.to_string()
    } else {
        quoted(s)
    }
}

fn plain(s: &str) -> bool {
    const WORDS: [&str; 12] = [
        "true", "false", "yes", "no", "on", "off", "null", "y", "n", "~", "nan", "inf",
    ];
    let first = s.chars().next();
    first.is_some_and(|c| c.is_ascii_alphabetic() || c == '/')
        && s.chars().all(|c| {
            c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '/' | '-' | '+' | '@' | ',')
        })
        && !WORDS.contains(&s.to_ascii_lowercase().as_str())
}

/// JSON's escapes, which YAML's double-quoted scalars share, and every character outside
/// printable ASCII as `\u`/`\U`, so no YAML line break or BOM can fold or vanish.
pub(crate) fn quoted(s: &str) -> String {
    let json = serde_json::to_string(s).unwrap_or_default();
    let mut out = String::with_capacity(json.len());
    for c in json.chars() {
        match c as u32 {
            0x20..=0x7e => out.push(c),
            n if n <= 0xffff => out.push_str(&format!("\\u{n:04x}")),
            n => out.push_str(&format!("\\U{n:08x}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars_are_bare_only_when_they_read_back_as_text() {
        assert_eq!(text("/usr/bin/python3"), "/usr/bin/python3");
        assert_eq!(text("qwen3.5-122b"), "qwen3.5-122b");
        for quoted in [
            "0.5.23", "true", "No", "1048576", "a b", "", "x: y", "#x", "50%", "ü",
        ] {
            assert!(text(quoted).starts_with('"'), "{quoted}: {}", text(quoted));
            let back: String = serde_yaml::from_str(&text(quoted)).unwrap();
            assert_eq!(back, quoted);
        }
    }
}
