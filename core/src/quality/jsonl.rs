//! The JSONL files a manifest's quality gate names (`prompts_file`, `cases`): one JSON object a
//! line, blank and `#` lines skipped, and errors that name the file, the line and what is wrong,
//! so the manifest is refused offline before any host is touched.

use serde_json::{Map, Value};

/// What is wrong with a line of a prompts or cases file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{file}:{line}: {message}")]
pub struct QualityFileError {
    /// The path as the manifest wrote it.
    pub file: String,
    /// 1-based, as editors show it.
    pub line: usize,
    pub column: usize,
    /// The manifest key that named the file (`verify.quality.cases`).
    pub field: String,
    pub message: String,
}

/// Where errors of one file point.
pub(crate) struct FileAt<'a> {
    pub file: &'a str,
    pub field: &'a str,
}

impl FileAt<'_> {
    pub fn error(
        &self,
        line: usize,
        column: usize,
        message: impl Into<String>,
    ) -> QualityFileError {
        QualityFileError {
            file: self.file.to_string(),
            line,
            column,
            field: self.field.to_string(),
            message: message.into(),
        }
    }
}

/// A line's object with its 1-based line number.
pub(crate) type Line = (usize, Map<String, Value>);

/// The objects of a JSONL text with their 1-based line numbers; blank lines and lines starting
/// with `#` are skipped. A line that is not a JSON object is an error at its line.
pub(crate) fn objects(at: &FileAt<'_>, text: &str) -> Result<Vec<Line>, QualityFileError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut out = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let value: Value = serde_json::from_str(trimmed).map_err(|e| {
            let lead = raw.len() - raw.trim_start().len();
            at.error(line, lead + e.column().max(1), format!("not JSON: {e}"))
        })?;
        match value {
            Value::Object(map) => out.push((line, map)),
            other => {
                return Err(at.error(
                    line,
                    1,
                    format!("a line is a JSON object, not {}", kind(&other)),
                ))
            }
        }
    }
    Ok(out)
}

/// The `key` string of every line of a JSONL file of one-field objects (`{"prompt": "..."}`),
/// in order; at least one. `field` is the manifest key that named the file.
pub(crate) fn strings(
    file: &str,
    field: &str,
    key: &str,
    text: &str,
) -> Result<Vec<String>, QualityFileError> {
    let at = FileAt { file, field };
    let shape = format!("a line is {{\"{key}\": \"...\"}}");
    let mut found = Vec::new();
    for (line, map) in objects(&at, text)? {
        match text_field(&at, line, &map, key)? {
            Some(s) => found.push(s),
            None => return Err(at.error(line, 1, format!("no `{key}` ({shape})"))),
        }
    }
    if found.is_empty() {
        return Err(at.error(1, 1, format!("holds no {key}s ({shape})")));
    }
    Ok(found)
}

/// A non-empty string field of a line's object: `Ok(None)` when absent.
pub(crate) fn text_field(
    at: &FileAt<'_>,
    line: usize,
    map: &Map<String, Value>,
    key: &str,
) -> Result<Option<String>, QualityFileError> {
    match map.get(key) {
        None => Ok(None),
        Some(Value::String(s)) if s.trim().is_empty() => {
            Err(at.error(line, 1, format!("`{key}` is empty")))
        }
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(at.error(line, 1, format!("`{key}` is a string, not {}", kind(other)))),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AT: FileAt<'static> = FileAt {
        file: "p.jsonl",
        field: "verify.quality.prompts_file",
    };

    #[test]
    fn lines_are_numbered_as_editors_show_them_skipping_blanks_and_comments() {
        let text = "\u{feff}# comment\n\n{\"a\": 1}\r\n  # indented comment\n{\"b\": 2}\n";
        let got = objects(&AT, text).unwrap();
        assert_eq!(got.iter().map(|(l, _)| *l).collect::<Vec<_>>(), vec![3, 5]);
    }

    #[test]
    fn a_line_that_is_not_an_object_names_its_line_and_becomes_a_manifest_error() {
        let e = objects(&AT, "{\"a\": 1}\n\n{\"a\": }\n").unwrap_err();
        assert_eq!((e.line, e.file.as_str()), (3, "p.jsonl"));
        assert!(e.message.starts_with("not JSON"), "{}", e.message);
        let e = objects(&AT, "[1, 2]").unwrap_err();
        assert_eq!(
            e.to_string(),
            "p.jsonl:1: a line is a JSON object, not a list"
        );
        let m: crate::manifest::ManifestError = e.into();
        assert_eq!(
            m.to_string(),
            "p.jsonl:1:1: verify.quality.prompts_file: a line is a JSON object, not a list"
        );
    }
}
