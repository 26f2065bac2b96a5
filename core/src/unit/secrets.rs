//! A secret reaches only the server: the unit's secret environment (the names that look secret,
//! and the manifest's `secret_env`) is never written inline. An `Environment=` line is shown to
//! every local user by `systemctl show -p Environment` (D-Bus), whatever the unit file's mode.
//! The values go to a file of their own, root's alone (0600, in a 0700 folder), which systemd
//! reads as root before it starts the server (`EnvironmentFile=`); `systemctl show` names only the
//! file.
//!
//! The file is named by a digest of what it holds, so that the unit stays the one file a change
//! switches atomically: new secrets are a new file, written before the unit that names it; the
//! previous unit names the previous file, which stays, so a rollback or a guard's restore gets
//! its secrets back with it. kustomize's `secretGenerator` names a Secret by its content's hash
//! the same way, for the same reason. The digest tells a local user only whether two sets of
//! secrets are the same, or lets them check a guess of the whole set: a secret short enough to
//! guess is a warning of its own (`sglang::check`).

use std::collections::BTreeMap;

use crate::digest::sha256;

/// Where the secrets files are: inside reconcile's own state folder (0700).
pub const SECRETS_DIR: &str = "/var/lib/reconcile/secrets";

/// Words that mark a name as secret (`HF_TOKEN`, `OPENAI_API_KEY`, `--api-key`, ...). Whole words
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

/// Whether an env var or flag name (`hf-token`, `HF_TOKEN`) looks secret by its words.
pub fn looks_secret(name: &str) -> bool {
    name.to_ascii_uppercase()
        .split(['_', '-', '.'])
        .any(|word| SECRET_WORDS.contains(&word))
}

/// A unit's secret environment, as the file that holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretsFile {
    /// `<SECRETS_DIR>/<unit>-<digest>.env`.
    pub path: String,
    pub env: BTreeMap<String, String>,
}

impl SecretsFile {
    /// The file for `unit`'s secret `env`; `None` when there is none.
    pub fn of(unit: &str, env: BTreeMap<String, String>) -> Option<SecretsFile> {
        if env.is_empty() {
            return None;
        }
        let text = text_of(&env);
        let digest = sha256(&format!("reconcile-secrets\0{unit}\0{text}"));
        Some(SecretsFile {
            path: format!("{SECRETS_DIR}/{unit}-{}.env", &digest[..16]),
            env,
        })
    }

    /// What the file holds: `NAME="value"` a line, as systemd's `EnvironmentFile=` parser reads
    /// it (`env-file.c`: inside double quotes a backslash keeps the next `"`, `\`, `` ` `` or `$`
    /// as it is; no variable is expanded).
    pub fn text(&self) -> String {
        text_of(&self.env)
    }
}

fn text_of(env: &BTreeMap<String, String>) -> String {
    env.iter()
        .map(|(name, value)| {
            let mut line = format!("{name}=\"");
            for c in value.chars() {
                if matches!(c, '"' | '\\' | '`' | '$') {
                    line.push('\\');
                }
                line.push(c);
            }
            line.push_str("\"\n");
            line
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn names_look_secret_by_whole_words() {
        assert!(
            looks_secret("HF_TOKEN") && looks_secret("api-key") && looks_secret("OPENAI_API_KEY")
        );
        assert!(
            !looks_secret("speculative-num-draft-tokens") && !looks_secret("CUDA_VISIBLE_DEVICES")
        );
    }

    #[test]
    fn the_file_is_named_by_what_it_holds_and_written_as_systemd_reads_it() {
        let a = SecretsFile::of(
            "s.service",
            env(&[("HF_TOKEN", "hf_1"), ("DSN", "a\"b\\c $HOME `x`")]),
        )
        .unwrap();
        assert!(
            a.path.starts_with("/var/lib/reconcile/secrets/s.service-"),
            "{}",
            a.path
        );
        assert!(a.path.ends_with(".env") && !a.path.contains("hf_1"));
        assert_eq!(
            a.text(),
            "DSN=\"a\\\"b\\\\c \\$HOME \\`x\\`\"\nHF_TOKEN=\"hf_1\"\n"
        );
        let same = SecretsFile::of(
            "s.service",
            env(&[("DSN", "a\"b\\c $HOME `x`"), ("HF_TOKEN", "hf_1")]),
        )
        .unwrap();
        assert_eq!(a.path, same.path);
        let rotated = SecretsFile::of(
            "s.service",
            env(&[("HF_TOKEN", "hf_2"), ("DSN", "a\"b\\c $HOME `x`")]),
        )
        .unwrap();
        assert_ne!(a.path, rotated.path, "a new secret is a new file");
        let other = SecretsFile::of(
            "t.service",
            env(&[("HF_TOKEN", "hf_1"), ("DSN", "a\"b\\c $HOME `x`")]),
        )
        .unwrap();
        assert_ne!(a.path, other.path);
        assert_eq!(SecretsFile::of("s.service", BTreeMap::new()), None);
    }
}
