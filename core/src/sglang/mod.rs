//! What SGLang itself accepts: flag catalogs per version, and checks of manifests against them.
//!
//! A flag SGLang does not know, or a value it refuses, only shows when the server starts on the
//! host, after a restart that drops the running model. Checking the manifest against the catalog of
//! the SGLang version it names catches those mistakes offline, before any host is contacted. The
//! check is pure: it needs the manifest, its text (for positions) and a catalog compiled in.
//!
//! Wiring: call [`check_manifest`] after `manifest::validate`, print the findings, stop on errors,
//! and apply [`Checked::renames`] (see [`Checked::apply_renames`]) before rendering, so an
//! abbreviation argparse would expand (`tp`) is rendered as the full flag (`--tp-size`).

pub mod catalog;
pub mod check;
mod env;
mod finding;
pub mod meaning;
mod python;
pub mod resolve;
mod suggest;
mod values;

pub use catalog::Catalog;
pub use check::{check, Checked, ManifestFinding, Severity};
pub use env::EnvValueError;
pub use values::{human_readable_int_value, FlagValueError};

use crate::manifest::locate::{locate, Seg};
use crate::manifest::Manifest;

/// Checks `m` (read from `text`) against the catalog of the SGLang version it names. A version we
/// have no catalog for gets one warning and no checks, so a new SGLang release is not blocked.
pub fn check_manifest(m: &Manifest, text: &str) -> Checked {
    match Catalog::for_version(&m.sglang.version) {
        Some(catalog) => check(m, text, catalog),
        None => Checked {
            findings: vec![ManifestFinding {
                severity: Severity::Warning,
                file: m.source.clone(),
                position: locate(text, &[Seg::Key("sglang"), Seg::Key("version")]),
                field: "sglang.version".into(),
                message: format!(
                    "no catalog of SGLang {}'s flags (known: {}), so flags and env are not checked",
                    m.sglang.version,
                    Catalog::versions().collect::<Vec<_>>().join(", ")
                ),
            }],
            renames: Default::default(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::{parse, Position};

    #[test]
    fn an_unknown_version_gets_one_warning_and_no_checks() {
        let text = "service: s\nhosts: [a]\nsglang:\n  python: /p\n  version: 0.6.1\n  model_path: /m\n  port: 1\n  flags: { no-such-flag: 1 }\n";
        let checked = check_manifest(&parse("m.yaml", text).unwrap(), text);
        assert_eq!(checked.findings.len(), 1);
        let finding = &checked.findings[0];
        assert_eq!(finding.severity, Severity::Warning);
        assert_eq!(finding.position, Some(Position { line: 5, column: 3 }));
        assert!(finding
            .to_string()
            .starts_with("m.yaml:5:3: sglang.version: no catalog of SGLang 0.6.1"));
    }

    #[test]
    fn the_example_manifests_pass_against_0_5_23() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../manifests");
        let mut seen = 0;
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            let m = parse(&path.display().to_string(), &text).unwrap();
            assert_eq!(m.sglang.version, "0.5.23");
            let checked = check_manifest(&m, &text);
            assert!(checked.findings.is_empty(), "{:?}", checked.findings);
            assert!(checked.renames.is_empty());
            seen += 1;
        }
        assert!(seen >= 2);
    }
}
