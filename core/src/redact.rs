//! Secrets never leave `reconcile`: values of env vars and flags whose names look secret are
//! replaced before anything is printed, in every format. What counts as secret is a value, a
//! [`Redactor`], built from the run's manifests and passed to whoever shows anything.

use std::collections::{BTreeMap, BTreeSet};

use crate::flags::flags;
use crate::manifest::Manifest;
use crate::unit::{looks_secret, quote_env, quote_exec_arg, Desired, UnitModel};

pub const REDACTED: &str = "<redacted>";
pub const REDACTED_CHANGED: &str = "<redacted, changed>";

/// What a run hides: secret-looking names (by their words), and the env names its manifests
/// declare secret (`secret_env`). Run-wide on purpose: a name declared secret by any manifest is
/// hidden wherever it shows up, in every host's output. A value built from the loaded manifests
/// and handed to whatever shows units, plans, statuses, journals or errors, so that what is hidden
/// never depends on state outside the call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Redactor {
    declared: BTreeSet<String>,
}

impl Redactor {
    /// Hides the names every manifest declares secret.
    pub fn of_manifests<'a>(manifests: impl IntoIterator<Item = &'a Manifest>) -> Redactor {
        let mut redactor = Redactor::default();
        for m in manifests {
            redactor.declare(&m.secret_env);
        }
        redactor
    }

    /// Adds env names to hide.
    pub fn declare<'a>(&mut self, names: impl IntoIterator<Item = &'a String>) {
        self.declared.extend(names.into_iter().cloned());
    }

    /// Hides, too, whatever `other` hides.
    pub fn extend(&mut self, other: &Redactor) {
        self.declare(&other.declared);
    }

    /// Whether an env var or flag name (`hf-token`, `HF_TOKEN`) holds a secret: by its words, or
    /// because a manifest declared it.
    pub fn is_secret(&self, name: &str) -> bool {
        looks_secret(name) || self.declared.contains(name)
    }

    /// A rendered unit with its secret values hidden, for showing.
    pub fn redact_unit(&self, desired: &Desired) -> String {
        self.redact_desired(desired, &desired.text)
    }

    /// Any text about a rendered unit (a failure's detail, a journal) with its secret values
    /// hidden, those of its secrets file too.
    pub fn redact_desired(&self, desired: &Desired, text: &str) -> String {
        hide(self.secret_values_of(desired), text)
    }

    /// [`Redactor::secret_values`] of a rendered unit, with every value of its secrets file.
    pub fn secret_values_of(&self, desired: &Desired) -> BTreeMap<String, String> {
        let mut values = self.secret_values(&desired.model);
        if let Some(file) = &desired.secrets {
            values.extend(file.env.clone());
        }
        values
    }

    /// Any text about a unit (a failure's detail, a journal) with that unit's secret values
    /// hidden.
    pub fn redact_for(&self, model: &UnitModel, text: &str) -> String {
        hide(self.secret_values(model), text)
    }

    /// Secret env values and secret flag values (keyed `--flag`) of a unit.
    pub fn secret_values(&self, model: &UnitModel) -> BTreeMap<String, String> {
        let mut values: BTreeMap<String, String> = model
            .env
            .iter()
            .filter(|(k, _)| self.is_secret(k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (name, value) in flags(&model.exec_start).1 {
            if self.is_secret(&name) {
                values.insert(format!("--{name}"), value);
            }
        }
        values
    }
}

/// `text` with each of `values` (secret name to value) shown as [`REDACTED`].
fn hide(values: BTreeMap<String, String>, text: &str) -> String {
    let secrets: Vec<Secret> = values
        .into_iter()
        .map(|(name, value)| Secret {
            name,
            value,
            placeholder: REDACTED,
        })
        .collect();
    redact_text(text, &secrets)
}

/// A secret to hide: its name, the value, and what to show instead.
#[derive(Debug, Clone)]
pub struct Secret {
    pub name: String,
    pub value: String,
    pub placeholder: &'static str,
}

/// Replaces secret values in text. Short values are replaced only on lines naming the secret, so a
/// token of `1` does not blank out every `1` in a unit; long ones everywhere they appear.
pub fn redact_text(text: &str, secrets: &[Secret]) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let mut line = line.to_string();
        for s in secrets.iter().filter(|s| !s.value.is_empty()) {
            if s.value.len() >= 8 || line.contains(&s.name) {
                for form in written_forms(&s.value) {
                    line = line.replace(&form, s.placeholder);
                }
            }
        }
        out.push_str(&line);
    }
    out
}

/// The value as it may appear in a unit file: raw, and escaped inside quotes.
fn written_forms(value: &str) -> Vec<String> {
    let exec = quote_exec_arg(value);
    let env = quote_env("", value);
    let mut forms = vec![
        exec.trim_matches('"').to_string(),
        env.trim_start_matches("\"=")
            .trim_end_matches('"')
            .to_string(),
        value.to_string(),
    ];
    forms.sort_by_key(|f| std::cmp::Reverse(f.len()));
    forms.dedup();
    forms
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_names() {
        let r = Redactor::default();
        let is_secret = |name| r.is_secret(name);
        assert!(is_secret("HF_TOKEN") && is_secret("api-key") && is_secret("OPENAI_API_KEY"));
        assert!(is_secret("HUGGING_FACE_HUB_TOKEN") && is_secret("AWS_SECRET_ACCESS_KEY"));
        assert!(!is_secret("CUDA_VISIBLE_DEVICES") && !is_secret("tp-size"));
        assert!(!is_secret("speculative-num-draft-tokens") && !is_secret("max-total-tokens"));
    }

    #[test]
    fn declared_names_are_secret_for_that_redactor_only() {
        let mut r = Redactor::default();
        assert!(!r.is_secret("MY_DSN"));
        r.declare(&["MY_DSN".to_string()]);
        assert!(r.is_secret("MY_DSN") && !Redactor::default().is_secret("MY_DSN"));
    }

    #[test]
    fn replaces_escaped_and_raw_forms() {
        let secrets = [Secret {
            name: "HF_TOKEN".into(),
            value: "hf_a%b\"c".into(),
            placeholder: REDACTED,
        }];
        let text = "Environment=\"HF_TOKEN=hf_a%%b\\\"c\"\nDescription=uses hf_a%b\"c\n";
        let out = redact_text(text, &secrets);
        assert_eq!(
            out,
            "Environment=\"HF_TOKEN=<redacted>\"\nDescription=uses <redacted>\n"
        );
    }

    #[test]
    fn short_values_only_on_their_own_lines() {
        let secrets = [Secret {
            name: "PASSWORD".into(),
            value: "1".into(),
            placeholder: REDACTED,
        }];
        let out = redact_text("Environment=\"PASSWORD=1\"\nRestartSec=1\n", &secrets);
        assert_eq!(out, "Environment=\"PASSWORD=<redacted>\"\nRestartSec=1\n");
    }
}
