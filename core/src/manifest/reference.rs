//! `{ from_env: VAR }`: an env value or flag value the manifest names instead of holding, so a
//! secret (an `HF_TOKEN`, an `--api-key`) never sits in git. The manifest keeps the reference
//! beside `env` and `flags`; the binary's loader, which may read its own environment, resolves it
//! with [`Manifest::resolve_references`] before anything is rendered, and the resolved names join
//! `secret_env`, so their values are redacted wherever they would be shown.

use super::error::{ManifestError, Position};
use super::{FlagValue, Manifest};

/// One `{ from_env: VAR }` of a manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reference {
    /// The value it stands for.
    pub target: RefTarget,
    /// `hosts[i]`'s override, or `None` for the service-wide value.
    pub host: Option<usize>,
    /// The environment variable of the process running `reconcile` that holds the value.
    pub var: String,
    /// Where it is written: `env.HF_TOKEN`, `hosts[0].flags.api-key`.
    pub field: String,
    pub position: Option<Position>,
}

/// Which value a reference stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RefTarget {
    /// The value of an `env:` entry.
    Env(String),
    /// The one value of a `flags:` entry (without `--`).
    Flag(String),
}

impl RefTarget {
    /// The env or flag name, which `secret_env` hides once resolved.
    pub fn name(&self) -> &str {
        match self {
            RefTarget::Env(name) | RefTarget::Flag(name) => name,
        }
    }
}

impl Manifest {
    /// Puts each reference's value in place, read with `lookup` (the loader passes
    /// `std::env::var`), and declares its name secret. An unset variable is an error naming the
    /// file, line and field; nothing else is touched for it.
    pub fn resolve_references(
        &mut self,
        lookup: impl Fn(&str) -> Option<String>,
    ) -> Vec<ManifestError> {
        let mut errors = Vec::new();
        for r in self.references.clone() {
            let Some(value) = lookup(&r.var) else {
                errors.push(self.invalid(
                    &r,
                    format!(
                        "`{}` is not set in reconcile's environment: export it (this value is read from it, never written in the manifest)",
                        r.var
                    ),
                ));
                continue;
            };
            let name = r.target.name().to_string();
            match (&r.target, r.host) {
                (RefTarget::Env(_), None) => {
                    self.env.insert(name.clone(), value);
                }
                (RefTarget::Env(_), Some(i)) => {
                    self.hosts[i].env.insert(name.clone(), value);
                }
                (RefTarget::Flag(_), None) => {
                    self.sglang
                        .flags
                        .insert(name.clone(), FlagValue::Value(value));
                }
                (RefTarget::Flag(_), Some(i)) => {
                    self.hosts[i]
                        .flags
                        .insert(name.clone(), FlagValue::Value(value));
                }
            }
            if !self.secret_env.contains(&name) {
                self.secret_env.push(name);
            }
        }
        errors
    }

    fn invalid(&self, r: &Reference, message: String) -> ManifestError {
        ManifestError::Invalid {
            file: self.source.clone(),
            position: r.position,
            field: r.field.clone(),
            message,
        }
    }
}

/// `validate`'s rules for references: the variable must be one a shell can export, and the name
/// it stands for one `env`/`flags` could hold.
pub(super) fn check(m: &Manifest) -> Vec<ManifestError> {
    let mut errors = Vec::new();
    for r in &m.references {
        if !crate::is_identifier(&r.var) {
            errors.push(m.invalid(
                r,
                format!(
                    "`{}` is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)",
                    r.var
                ),
            ));
        }
        let name_ok = match &r.target {
            RefTarget::Env(name) => crate::is_identifier(name),
            RefTarget::Flag(name) => {
                !name.is_empty()
                    && !name.starts_with('-')
                    && name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
            }
        };
        if !name_ok {
            errors.push(m.invalid(
                r,
                format!("`{}` is not a name this value can have", r.target.name()),
            ));
        }
    }
    errors
}

#[cfg(test)]
mod tests {
    use crate::manifest::{parse, validate, FlagValue, Position, RefTarget};

    const TEXT: &str = "service: s\nhosts:\n  - name: a\n    env: { DSN: { from_env: A_DSN } }\nsglang:\n  python: /usr/bin/python3\n  version: 0.5.23\n  model_path: /m\n  port: 30000\n  flags:\n    api-key: { from_env: SGLANG_API_KEY }\n    tp-size: 2\nenv:\n  HF_TOKEN: { from_env: HF_TOKEN }\n  PLAIN: x\n";

    #[test]
    fn references_stay_beside_env_and_flags_until_resolved() {
        let m = parse("m.yaml", TEXT).unwrap();
        assert!(validate(&m, TEXT).is_ok());
        assert!(!m.env.contains_key("HF_TOKEN") && m.env["PLAIN"] == "x");
        assert!(!m.sglang.flags.contains_key("api-key"));
        let vars: Vec<(&str, &str, Option<usize>)> = m
            .references
            .iter()
            .map(|r| (r.field.as_str(), r.var.as_str(), r.host))
            .collect();
        assert_eq!(
            vars,
            [
                ("env.HF_TOKEN", "HF_TOKEN", None),
                ("sglang.flags.api-key", "SGLANG_API_KEY", None),
                ("hosts[0].env.DSN", "A_DSN", Some(0)),
            ]
        );
        assert_eq!(m.references[0].target, RefTarget::Env("HF_TOKEN".into()));
        assert_eq!(
            m.references[0].position,
            Some(Position {
                line: 14,
                column: 13
            })
        );
    }

    #[test]
    fn resolving_puts_the_values_in_place_and_declares_them_secret() {
        let mut m = parse("m.yaml", TEXT).unwrap();
        let errors = m.resolve_references(|var| Some(format!("value-of-{var}")));
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(m.env["HF_TOKEN"], "value-of-HF_TOKEN");
        assert_eq!(
            m.sglang.flags["api-key"],
            FlagValue::Value("value-of-SGLANG_API_KEY".into())
        );
        assert_eq!(m.hosts[0].env["DSN"], "value-of-A_DSN");
        assert_eq!(m.secret_env, ["HF_TOKEN", "api-key", "DSN"]);
    }

    #[test]
    fn an_unset_variable_names_the_file_line_and_field() {
        let mut m = parse("m.yaml", TEXT).unwrap();
        let errors = m.resolve_references(|var| (var != "HF_TOKEN").then(|| "v".to_string()));
        assert_eq!(errors.len(), 1);
        assert_eq!(
            errors[0].to_string(),
            "m.yaml:14:13: env.HF_TOKEN: `HF_TOKEN` is not set in reconcile's environment: export it (this value is read from it, never written in the manifest)"
        );
        assert!(!m.env.contains_key("HF_TOKEN"));
    }

    #[test]
    fn a_reference_must_be_one_variable() {
        let bad = TEXT.replace("{ from_env: HF_TOKEN }", "{ from_env: \"1X\" }");
        let m = parse("m.yaml", &bad).unwrap();
        let e = validate(&m, &bad).unwrap_err();
        assert!(
            e.0[0]
                .to_string()
                .contains("`1X` is not an environment variable name"),
            "{}",
            e.0[0]
        );
        let other = TEXT.replace("{ from_env: HF_TOKEN }", "{ from_file: /x }");
        let e = parse("m.yaml", &other).unwrap_err();
        assert!(e.0[0].to_string().contains("from_env"), "{}", e.0[0]);
    }
}
