//! Secrets never leave `reconcile`: values of env vars and flags whose names look secret are
//! replaced before anything is printed, in every format.

/// Words that mark a value as secret (`HF_TOKEN`, `OPENAI_API_KEY`, `--api-key`, ...). Whole words
/// only: `--speculative-num-draft-tokens` is a count, not a token.
const SECRET_WORDS: [&str; 11] = [
    "TOKEN",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "KEY",
    "APIKEY",
    "CREDENTIAL",
    "CREDENTIALS",
    "AUTH",
    "PRIVATE",
    "PAT",
];

pub const REDACTED: &str = "<redacted>";
pub const REDACTED_CHANGED: &str = "<redacted, changed>";

/// Env names the manifests of this run declare secret (`secret_env`). Run-wide on purpose: a name
/// declared secret by any manifest is hidden wherever it shows up, in every host's output.
static DECLARED: std::sync::RwLock<std::collections::BTreeSet<String>> =
    std::sync::RwLock::new(std::collections::BTreeSet::new());

/// Adds env names to hide for the rest of the run.
pub fn declare_secret_names<'a>(names: impl IntoIterator<Item = &'a String>) {
    let mut declared = DECLARED.write().unwrap_or_else(|e| e.into_inner());
    declared.extend(names.into_iter().cloned());
}

/// Whether an env var or flag name (`hf-token`, `HF_TOKEN`) holds a secret: by its words, or
/// because a manifest declared it.
pub fn is_secret(name: &str) -> bool {
    let upper = name.to_ascii_uppercase();
    upper
        .split(['_', '-', '.'])
        .any(|word| SECRET_WORDS.contains(&word))
        || DECLARED
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(name)
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

/// A rendered unit with its secret values hidden, for showing.
pub fn redact_unit(desired: &crate::unit::Desired) -> String {
    let secrets: Vec<Secret> = secret_values(&desired.model)
        .into_iter()
        .map(|(name, value)| Secret {
            name,
            value,
            placeholder: REDACTED,
        })
        .collect();
    redact_text(&desired.text, &secrets)
}

/// Secret env values and secret flag values (keyed `--flag`) of a unit.
pub fn secret_values(model: &crate::unit::UnitModel) -> std::collections::BTreeMap<String, String> {
    let mut values: std::collections::BTreeMap<String, String> = model
        .env
        .iter()
        .filter(|(k, _)| is_secret(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    for (name, value) in crate::plan::flags(&model.exec_start).1 {
        if is_secret(&name) {
            values.insert(format!("--{name}"), value);
        }
    }
    values
}

/// The value as it may appear in a unit file: raw, and escaped inside quotes.
fn written_forms(value: &str) -> Vec<String> {
    let exec = crate::unit::quote_exec_arg(value);
    let env = crate::unit::quote_env("", value);
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
        assert!(is_secret("HF_TOKEN") && is_secret("api-key") && is_secret("OPENAI_API_KEY"));
        assert!(is_secret("HUGGING_FACE_HUB_TOKEN") && is_secret("AWS_SECRET_ACCESS_KEY"));
        assert!(!is_secret("CUDA_VISIBLE_DEVICES") && !is_secret("tp-size"));
        assert!(!is_secret("speculative-num-draft-tokens") && !is_secret("max-total-tokens"));
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
