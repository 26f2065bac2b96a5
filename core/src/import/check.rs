//! The imported manifest checked the way `reconcile plan` will read it: parsed, validated, its
//! references resolved with the values the unit had, checked against the SGLang catalog, rendered,
//! and compared with the host's unit by what makes the plan restart the server. A difference is a
//! bug of import's, reported rather than handed out.

use std::collections::BTreeMap;

use crate::manifest::{parse, validate};
use crate::plan::restart_reason;
use crate::sglang::{check as check_flags, Catalog, Severity};
use crate::unit::{render, UnitModel};

/// The source name the check parses the manifest under.
const SOURCE: &str = "imported.yaml";

/// The catalog's warnings about the manifest (deprecated flags), or what is wrong with it.
pub fn check(
    yaml: &str,
    secrets: &BTreeMap<String, String>,
    host: &UnitModel,
    catalog: Option<&Catalog>,
) -> Result<Vec<String>, Vec<String>> {
    let all = |e: crate::manifest::ManifestErrors| -> Vec<String> {
        e.0.iter().map(|e| e.to_string()).collect()
    };
    let mut m = parse(SOURCE, yaml).map_err(all)?;
    validate(&m, yaml).map_err(all)?;
    let unresolved = m.resolve_references(|var| secrets.get(var).cloned());
    if !unresolved.is_empty() {
        return Err(unresolved.iter().map(|e| e.to_string()).collect());
    }
    let mut warnings = Vec::new();
    if let Some(catalog) = catalog {
        let (errors, warned): (Vec<_>, Vec<_>) = check_flags(&m, yaml, catalog)
            .findings
            .into_iter()
            .partition(|f| f.severity == Severity::Error);
        if !errors.is_empty() {
            return Err(errors.iter().map(|f| f.to_string()).collect());
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
        Some(what) => Err(vec![what]),
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
