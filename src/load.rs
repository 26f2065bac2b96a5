//! Reading the manifests for a run: parsed, validated, and checked against the flag catalog of the
//! SGLang version each names. Every error of every file comes back together; warnings are printed
//! and do not stop the run unless `strict`.

use std::path::PathBuf;

use crate::manifest::{self, Manifest, ManifestErrors};
use crate::redact;
use crate::sglang::{self, Finding, Severity};

pub struct Loaded {
    pub manifests: Vec<Manifest>,
    pub warnings: Vec<Finding>,
}

pub fn load(paths: &[PathBuf], strict: bool) -> Result<Loaded, (ManifestErrors, Vec<Finding>)> {
    let mut warnings = Vec::new();
    let result = manifest::load(paths, |m, text| {
        redact::declare_secret_names(&m.secret_env);
        let checked = sglang::check_manifest(m, text);
        // Render what argparse would run: `tp` becomes `--tp-size`, safe from a later ambiguity.
        checked.apply_renames(m);
        let (errors, warned): (Vec<Finding>, Vec<Finding>) = checked
            .findings
            .into_iter()
            .partition(|f| f.severity == Severity::Error || strict);
        warnings.extend(warned);
        errors.into_iter().map(Into::into).collect()
    });
    match result {
        Ok(manifests) => Ok(Loaded {
            manifests,
            warnings,
        }),
        Err(errors) => Err((errors, warnings)),
    }
}
