//! Errors in manifests: each names the file, the position and the field, so it can be fixed without
//! guessing.

use std::fmt;

/// A position in a manifest, 1-based as editors show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub line: usize,
    pub column: usize,
}

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The file or folder could not be read.
    #[error("{path}: cannot read")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// Syntax, type, unknown or missing fields, and every rule `validate` checks.
    #[error("{file}:{}: {field}: {message}", position_text(.position))]
    Invalid {
        file: String,
        position: Option<Position>,
        field: String,
        message: String,
    },
}

fn position_text(position: &Option<Position>) -> String {
    match position {
        Some(p) => format!("{}:{}", p.line, p.column),
        None => "?:?".into(),
    }
}

/// Every error of a run, reported together.
#[derive(Debug)]
pub struct ManifestErrors(pub Vec<ManifestError>);

impl fmt::Display for ManifestErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0.len();
        write!(f, "{n} error{} in manifests", if n == 1 { "" } else { "s" })
    }
}

impl std::error::Error for ManifestErrors {}

impl From<ManifestError> for ManifestErrors {
    fn from(e: ManifestError) -> Self {
        ManifestErrors(vec![e])
    }
}

/// A quality gate's JSONL file is the manifest's: its errors point at the file's line, under the
/// key that named the file.
impl From<crate::quality::QualityFileError> for ManifestError {
    fn from(e: crate::quality::QualityFileError) -> Self {
        ManifestError::Invalid {
            file: e.file,
            position: Some(Position {
                line: e.line,
                column: e.column,
            }),
            field: e.field,
            message: e.message,
        }
    }
}
