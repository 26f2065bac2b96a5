//! How bad a finding is, and what a check of a unit against its host finds.
//!
//! One [`Severity`] for every check: the offline check of a manifest against SGLang's catalog
//! (`sglang::ManifestFinding`, positioned in the manifest's file) and preflight's checks of a host
//! ([`Finding`], named by its check). They are different findings, shown differently, but they
//! grade the same way. A leaf module, so that `plan`, `targets` and `preflight` can all import it.

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// The server would not start, would start on something else than the manifest says, or
    /// SGLang would silently do something other than what is written.
    Error,
    /// Something could not be checked, or works but is worth a look (an abbreviation, a
    /// deprecated name).
    Warning,
}

/// What preflight found about a unit and its host (or its fleet).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    pub severity: Severity,
    /// Which check: `python`, `sglang-version`, `flags`, `model-path`, `gpus`,
    /// `cuda-visible-devices`, `gpu-conflict`, `port`, `deep`.
    pub check: &'static str,
    pub message: String,
}

impl Finding {
    pub fn error(check: &'static str, message: String) -> Finding {
        Finding {
            severity: Severity::Error,
            check,
            message,
        }
    }

    pub fn warning(check: &'static str, message: String) -> Finding {
        Finding {
            severity: Severity::Warning,
            check,
            message,
        }
    }
}

/// The host's findings under `--strict`: what it refuses as well as warns of becomes an error. A
/// path another user can write among what root or the server runs (`owner`) is one: the plan
/// names it either way, and `--strict` keeps the unit from being applied until it is root's.
pub fn strictly(findings: &mut [Finding]) {
    for f in findings.iter_mut().filter(|f| f.check == "owner") {
        f.severity = Severity::Error;
    }
}

pub fn has_errors(findings: &[Finding]) -> bool {
    findings.iter().any(|f| f.severity == Severity::Error)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_refuses_what_another_user_can_write_and_leaves_other_warnings() {
        let mut findings = vec![
            Finding::warning("owner", "/srv/venv is writable by uid 1000".into()),
            Finding::warning("flags", "an abbreviation".into()),
        ];
        assert!(!has_errors(&findings));
        strictly(&mut findings);
        assert_eq!(findings[0].severity, Severity::Error);
        assert_eq!(findings[1].severity, Severity::Warning);
    }
}
