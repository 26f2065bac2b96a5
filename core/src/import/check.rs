//! The imported manifest checked the way `reconcile plan` will read it: parsed, validated, its
//! references resolved with the values the unit had, checked against the SGLang catalog, rendered,
//! and compared with the host's unit by what makes the plan restart the server. A difference is a
//! bug of import's, reported rather than handed out.

use std::collections::BTreeMap;

use crate::manifest::{parse, validate, ManifestError};
use crate::plan::restart_reason;
use crate::sglang::{check as check_flags, Catalog, ManifestFinding, Severity};
use crate::unit::{render, UnitModel};

/// The source name the check parses the manifest under.
const SOURCE: &str = "imported.yaml";

/// Why the manifest import wrote does not reproduce the unit: a bug of import's, each one
/// reported as such.
#[derive(Debug, thiserror::Error)]
pub enum Unreproduced {
    /// It does not parse or validate, or a reference in it does not resolve.
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    /// The SGLang catalog finds an error in it.
    #[error("{0}")]
    Flag(ManifestFinding),
    /// Rendered, it differs from the host's unit in what restarts the server
    /// ([`restart_reason`]'s words).
    #[error("{reason}")]
    Restarts { reason: String },
}

/// The catalog's warnings about the manifest (deprecated flags), or what is wrong with it.
/// Warnings are only shown, so they stay messages.
pub fn check(
    yaml: &str,
    secrets: &BTreeMap<String, String>,
    host: &UnitModel,
    catalog: Option<&Catalog>,
) -> Result<Vec<String>, Vec<Unreproduced>> {
    let all = |e: crate::manifest::ManifestErrors| -> Vec<Unreproduced> {
        e.0.into_iter().map(Unreproduced::Manifest).collect()
    };
    let mut m = parse(SOURCE, yaml).map_err(all)?;
    validate(&m, yaml).map_err(all)?;
    let unresolved = m.resolve_references(|var| secrets.get(var).cloned());
    if !unresolved.is_empty() {
        return Err(unresolved.into_iter().map(Unreproduced::Manifest).collect());
    }
    let mut warnings = Vec::new();
    if let Some(catalog) = catalog {
        let (errors, warned): (Vec<_>, Vec<_>) = check_flags(&m, yaml, catalog)
            .findings
            .into_iter()
            .partition(|f| f.severity == Severity::Error);
        if !errors.is_empty() {
            return Err(errors.into_iter().map(Unreproduced::Flag).collect());
        }
        warnings.extend(warned.iter().map(|f| {
            format!(
                "{}: {} (the host runs it so; `reconcile validate` will warn)",
                f.field, f.message
            )
        }));
    }
    let desired = render(&m, &m.hosts[0]);
    // The unit's secrets are inline; the manifest's unit keeps them in a file of their own. It
    // means the same, and the first apply moves them (a restart: systemd reads them at a start).
    let (model, secrets) = match (
        &desired.secrets,
        host.settings.get("Service.EnvironmentFile"),
    ) {
        (Some(file), files) if !files.is_some_and(|f| f.contains(&file.path)) => (
            desired.inline_model(),
            file.env.keys().cloned().collect::<Vec<_>>(),
        ),
        _ => (desired.model.clone(), Vec::new()),
    };
    match restart_reason(host, &model, crate::plan::parser(&desired)) {
        Some(reason) => Err(vec![Unreproduced::Restarts { reason }]),
        None if !secrets.is_empty() => {
            warnings.push(format!(
                "the unit writes {} inline, where every local user reads it (systemctl show); \
                 reconcile keeps it in a file only root reads, so the first apply restarts the \
                 server once to move it",
                secrets.join(", ")
            ));
            Ok(warnings)
        }
        None => Ok(warnings),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manifest_that_does_not_read_is_unreproduced_by_its_manifest_error() {
        let host = crate::unit::parse_unit("[Service]\nExecStart=/p\n");
        let e = check("service: [", &BTreeMap::new(), &host, None).unwrap_err();
        assert!(matches!(e[0], Unreproduced::Manifest(_)), "{e:?}");
        assert!(e[0].to_string().starts_with("imported.yaml:"), "{}", e[0]);
    }
}
