//! What a check of a manifest finds, in the shape of the manifest errors (`file:line:col: field: message`), and
//! the renames it asks the renderer to make.

use std::collections::BTreeMap;
use std::fmt;

pub use crate::finding::Severity;
use crate::manifest::{Manifest, Position};

/// A finding of the check of a manifest against SGLang's catalog: where in the manifest's file.
/// Not preflight's `finding::Finding` (a host's fact, named by its check); the two share only
/// their [`Severity`].
#[derive(Debug, Clone, PartialEq)]
pub struct ManifestFinding {
    pub severity: Severity,
    pub file: String,
    pub position: Option<Position>,
    /// `sglang.flags.tp`, `hosts[1].flags.x`, `env.SGLANG_X`.
    pub field: String,
    pub message: String,
}

/// Formatted like `ManifestError::Invalid`; the caller prefixes warnings as it sees fit.
impl fmt::Display for ManifestFinding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.position {
            Some(p) => write!(f, "{}:{}:{}: ", self.file, p.line, p.column)?,
            None => write!(f, "{}:?:?: ", self.file)?,
        }
        write!(f, "{}: {}", self.field, self.message)
    }
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Checked {
    /// In the order they appear in the file.
    pub findings: Vec<ManifestFinding>,
    /// Manifest flag name to the full option string argparse expands it to (`tp` -> `tp-size`).
    pub renames: BTreeMap<String, String>,
}

impl Checked {
    #[cfg(test)]
    pub fn has_errors(&self) -> bool {
        self.findings.iter().any(|f| f.severity == Severity::Error)
    }

    /// Renames abbreviated flags to their full names, service-wide and per host, for rendering.
    pub fn apply_renames(&self, m: &mut Manifest) {
        let flag_maps =
            std::iter::once(&mut m.sglang.flags).chain(m.hosts.iter_mut().map(|h| &mut h.flags));
        for flags in flag_maps {
            for (from, to) in &self.renames {
                if let Some(value) = flags.remove(from) {
                    flags.insert(to.clone(), value);
                }
            }
        }
    }
}

impl From<ManifestFinding> for crate::manifest::ManifestError {
    fn from(f: ManifestFinding) -> Self {
        crate::manifest::ManifestError::Invalid {
            file: f.file,
            position: f.position,
            field: f.field,
            message: f.message,
        }
    }
}
