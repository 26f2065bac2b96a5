//! A manifest against one SGLang version's catalog: every flag name (service-wide and per host)
//! resolved as argparse would, every value converted as argparse would, every env var checked
//! against the names and parsers SGLang has. Like `manifest::validate`, every rule runs and every
//! finding is kept, each with the file, position and field path.

use std::collections::BTreeMap;

use super::catalog::Catalog;
pub use super::finding::{Checked, ManifestFinding, Severity};
use super::resolve::{resolve, Resolved};
use super::suggest::did_you_mean;
use super::values::check_value;
use crate::manifest::locate::{locate, Seg};
use crate::manifest::{FlagValue, Manifest};

pub fn check(m: &Manifest, text: &str, catalog: &Catalog) -> Checked {
    let mut c = Checker {
        file: &m.source,
        text,
        catalog,
        checked: Checked::default(),
    };
    c.flags(&[Seg::Key("sglang"), Seg::Key("flags")], &m.sglang.flags);
    c.env(&[Seg::Key("env")], &m.env);
    // `hosts[1].flags.tp`, or `nodes[1].flags.tp` for a server group.
    let key = m.hosts_key();
    for (i, host) in m.hosts.iter().enumerate() {
        c.flags(
            &[Seg::Key(key), Seg::Index(i), Seg::Key("flags")],
            &host.flags,
        );
        c.env(&[Seg::Key(key), Seg::Index(i), Seg::Key("env")], &host.env);
    }
    let mut checked = c.checked;
    checked
        .findings
        .sort_by_key(|f| f.position.map_or((usize::MAX, 0), |p| (p.line, p.column)));
    checked
}

struct Checker<'a> {
    file: &'a str,
    text: &'a str,
    catalog: &'a Catalog,
    checked: Checked,
}

impl Checker<'_> {
    fn push(&mut self, severity: Severity, path: &[Seg], message: String) {
        self.checked.findings.push(ManifestFinding {
            severity,
            file: self.file.to_string(),
            position: locate(self.text, path),
            field: field_name(path),
            message,
        });
    }

    fn flags(&mut self, base: &[Seg], flags: &BTreeMap<String, FlagValue>) {
        for (name, value) in flags {
            let path = [base, &[Seg::Key(name)]].concat();
            self.flag(&path, name, value);
        }
    }

    fn flag(&mut self, path: &[Seg], name: &str, value: &FlagValue) {
        let version = self.catalog.version;
        let flag = match resolve(self.catalog, name) {
            Resolved::Exact(flag) | Resolved::Alias(flag) => flag,
            Resolved::Prefix { flag, option } => {
                let message = format!(
                    "`{name}` is an abbreviation argparse expands to --{option}; it is rendered as --{option}, write that"
                );
                self.push(Severity::Warning, path, message);
                self.checked
                    .renames
                    .insert(name.to_string(), option.to_string());
                flag
            }
            Resolved::Ambiguous(options) => {
                let options = dashed(&options).join(", ");
                let message =
                    format!("`{name}` is ambiguous in SGLang {version}: it could mean {options}");
                return self.push(Severity::Error, path, message);
            }
            Resolved::Unknown => return self.push(Severity::Error, path, self.unknown(name)),
        };
        if let (Some(deprecation), false) = (&flag.deprecated, value == &FlagValue::Switch(false)) {
            let instead = deprecation
                .replacement
                .map_or(String::new(), |r| format!("; use {r} instead"));
            let message = format!("--{} is deprecated in SGLang {version}{instead}", flag.name);
            self.push(Severity::Warning, path, message);
        }
        if let Err(problem) = check_value(flag, value) {
            self.push(Severity::Error, path, problem.to_string());
        }
        if crate::redact::Redactor::default().is_secret(flag.name) {
            self.push(Severity::Warning, path, on_the_command_line(flag.name));
        }
    }

    fn unknown(&self, name: &str) -> String {
        let version = self.catalog.version;
        let mut message = format!("SGLang {version} has no flag --{name}");
        let near = did_you_mean(name, self.catalog.option_strings());
        if !near.is_empty() {
            message.push_str(&format!("; did you mean {}?", dashed(&near).join(" or ")));
        }
        let elsewhere: Vec<&str> = Catalog::versions()
            .filter(|v| Catalog::for_version(v).is_some_and(|c| c.option(name).is_some()))
            .collect();
        if !elsewhere.is_empty() {
            message.push_str(&format!(" (SGLang {} has it)", elsewhere.join(", ")));
        }
        message
    }

    fn env(&mut self, base: &[Seg], env: &BTreeMap<String, String>) {
        let Some(catalog) = self.catalog.env() else {
            return;
        };
        for (name, value) in env {
            let path = [base, &[Seg::Key(name)]].concat();
            match catalog.check(name, value) {
                Ok(None) => {}
                Ok(Some(warning)) => self.push(Severity::Warning, &path, warning),
                Err(error) => self.push(Severity::Error, &path, error.to_string()),
            }
        }
    }
}

fn dashed(options: &[&str]) -> Vec<String> {
    options.iter().map(|o| format!("--{o}")).collect()
}

/// `hosts[1].flags.tp`, as `manifest::validate` names fields.
fn field_name(path: &[Seg]) -> String {
    let mut name = String::new();
    for seg in path {
        match seg {
            Seg::Key(k) if name.is_empty() => name.push_str(k),
            Seg::Key(k) => name.push_str(&format!(".{k}")),
            Seg::Index(i) => name.push_str(&format!("[{i}]")),
        }
    }
    name
}

/// A secret flag is one of the server's arguments, and a process's arguments are readable by every
/// local user (`ps`, `/proc/<pid>/cmdline`). SGLang 0.5.23 reads its flags only from its argv or
/// from a YAML file named by `--config` (`srt/server_args.py` `prepare_server_args`,
/// `srt/utils/server_args_config_parser.py`), which reconcile does not write yet.
fn on_the_command_line(name: &str) -> String {
    format!(
        "--{name} is a secret on the server's command line: every local user of the host can read \
         it (ps, /proc/<pid>/cmdline) while the server runs. SGLang reads it from its arguments or \
         a --config YAML file only; see docs/guarantees.md for what an operator can do"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::parse;

    /// One of each mistake, service-wide and per host, block and flow style.
    const MISTAKES: &str = "\
service: s
hosts:
  - gpu-a
  - name: gpu-b
    env: { SGLANG_ENABLE_TORCH_INFERENCE_MODE: \"on\" }
    flags:
      enable-metrics: \"yes\"
      tp: 8
sglang:
  python: /usr/bin/python3
  version: 0.5.23
  model_path: /m
  port: 30000
  flags:
    tp: 4
    cuda-graph-max-bs: 8
    enable-fused-moe-sum-allreduce: true
    mem-fraction-static: high
    kv-cache-dtype: fp9
    context-length: 128k
    max-total-tokens: 1.5Ki
    max-running-requests: true
    enable-flashinfer-allreduce-fusion: true
    monokernel-backend: amd
    numa-node: [0, 1]
    tokenizer-mode: [auto]
    trust-remote-code: false
    expert-parallel-size: 2
env:
  SGLANG_ENABLE_TORCH_INFERENCE_MOD: \"1\"
  SGLANG_USE_TRITON_ROUTER_SUM: \"1\"
";

    fn checked(text: &str) -> Checked {
        let m = parse("m.yaml", text).unwrap();
        check(&m, text, Catalog::for_version(&m.sglang.version).unwrap())
    }

    #[test]
    fn a_secret_flag_is_named_as_readable_by_every_local_user_where_it_is_written() {
        let text = "service: s\nhosts: [h]\nsglang:\n  python: /p\n  version: 0.5.23\n  model_path: /m\n  port: 30000\n  flags:\n    api-key: sk-1\n    tp-size: 2\n";
        let findings = checked(text).findings;
        assert_eq!(findings.len(), 1, "{findings:?}");
        assert_eq!(findings[0].severity, Severity::Warning);
        assert_eq!(findings[0].position.map(|p| p.line), Some(9));
        assert!(
            findings[0].message.contains("every local user"),
            "{findings:?}"
        );
        assert!(!findings[0].message.contains("sk-1"), "{findings:?}");
    }

    #[test]
    fn every_mistake_is_found_at_once_with_its_position() {
        use Severity::{Error, Warning};
        let checked = checked(MISTAKES);
        let found: Vec<(Severity, usize, usize, &str)> = checked
            .findings
            .iter()
            .map(|f| {
                let p = f.position.unwrap();
                (f.severity, p.line, p.column, f.field.as_str())
            })
            .collect();
        assert_eq!(
            found,
            [
                (
                    Error,
                    5,
                    12,
                    "hosts[1].env.SGLANG_ENABLE_TORCH_INFERENCE_MODE"
                ),
                (Error, 7, 7, "hosts[1].flags.enable-metrics"),
                (Warning, 8, 7, "hosts[1].flags.tp"),
                (Warning, 15, 5, "sglang.flags.tp"),
                (Error, 16, 5, "sglang.flags.cuda-graph-max-bs"),
                (Error, 17, 5, "sglang.flags.enable-fused-moe-sum-allreduce"),
                (Error, 18, 5, "sglang.flags.mem-fraction-static"),
                (Error, 19, 5, "sglang.flags.kv-cache-dtype"),
                (Error, 21, 5, "sglang.flags.max-total-tokens"),
                (Error, 22, 5, "sglang.flags.max-running-requests"),
                (
                    Warning,
                    23,
                    5,
                    "sglang.flags.enable-flashinfer-allreduce-fusion"
                ),
                (Warning, 24, 5, "sglang.flags.monokernel-backend"),
                // A flow value is placed at the value, the part that is wrong.
                (Error, 26, 21, "sglang.flags.tokenizer-mode"),
                (Warning, 30, 3, "env.SGLANG_ENABLE_TORCH_INFERENCE_MOD"),
                (Warning, 31, 3, "env.SGLANG_USE_TRITON_ROUTER_SUM"),
            ]
        );
        assert!(checked.has_errors());
    }

    #[test]
    fn messages_say_what_to_write_instead() {
        let checked = checked(MISTAKES);
        let message = |field: &str| {
            let f = checked.findings.iter().find(|f| f.field == field).unwrap();
            f.to_string()
        };
        assert_eq!(
            message("sglang.flags.enable-fused-moe-sum-allreduce"),
            "m.yaml:17:5: sglang.flags.enable-fused-moe-sum-allreduce: SGLang 0.5.23 has no flag \
             --enable-fused-moe-sum-allreduce; did you mean --enable-fused-moe-sum-all-reduce?"
        );
        assert!(message("sglang.flags.cuda-graph-max-bs")
            .ends_with("could mean --cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill"));
        assert!(message("sglang.flags.kv-cache-dtype").contains("fp8_e4m3"));
        assert!(message("sglang.flags.monokernel-backend")
            .ends_with("use --enable-amd-monokernel instead"));
        assert!(message("hosts[1].env.SGLANG_ENABLE_TORCH_INFERENCE_MODE").contains("(False)"));
        assert!(message("env.SGLANG_ENABLE_TORCH_INFERENCE_MOD")
            .ends_with("did you mean SGLANG_ENABLE_TORCH_INFERENCE_MODE?"));
    }

    #[test]
    fn a_nodes_flag_is_named_and_placed_under_nodes() {
        let text = "service: s\nnodes:\n  - a\n  - name: b\n    flags: { no-such-flag: 1 }\nsglang:\n  python: /p\n  version: 0.5.23\n  model_path: /m\n  port: 1\n";
        let checked = checked(text);
        assert_eq!(checked.findings.len(), 1, "{:?}", checked.findings);
        assert!(
            checked.findings[0]
                .to_string()
                .starts_with("m.yaml:5:14: nodes[1].flags.no-such-flag: SGLang 0.5.23 has no flag"),
            "{}",
            checked.findings[0]
        );
    }

    #[test]
    fn abbreviations_are_renamed_for_rendering_everywhere() {
        let mut m = parse("m.yaml", MISTAKES).unwrap();
        let checked = checked(MISTAKES);
        assert_eq!(checked.renames.len(), 1);
        assert_eq!(checked.renames["tp"], "tp-size");
        checked.apply_renames(&mut m);
        assert_eq!(m.sglang.flags["tp-size"], FlagValue::Value("4".into()));
        assert_eq!(m.hosts[1].flags["tp-size"], FlagValue::Value("8".into()));
        assert!(!m.sglang.flags.contains_key("tp"));
    }

    #[test]
    fn the_same_name_differs_between_versions() {
        let text = MISTAKES.replace("version: 0.5.23", "version: 0.5.9");
        let checked = checked(&text);
        let field = |name: &str| checked.findings.iter().find(|f| f.field == name);
        assert!(field("sglang.flags.cuda-graph-max-bs").is_none());
        let fused = field("sglang.flags.enable-fused-moe-sum-allreduce").unwrap();
        assert!(
            fused.message.starts_with("SGLang 0.5.9 has no flag"),
            "{}",
            fused.message
        );
        // No env catalog for 0.5.9: env is not checked.
        assert!(checked.findings.iter().all(|f| !f.field.contains("env")));
    }

    #[test]
    fn a_flag_of_another_version_says_which_has_it() {
        let text = MISTAKES.replace(
            "enable-fused-moe-sum-allreduce",
            "enable-fused-moe-sum-all-reduce",
        );
        let text = text.replace("version: 0.5.23", "version: 0.5.9");
        let checked = checked(&text);
        let f = checked
            .findings
            .iter()
            .find(|f| f.field == "sglang.flags.enable-fused-moe-sum-all-reduce")
            .unwrap();
        assert!(
            f.message.ends_with("(SGLang 0.5.23 has it)"),
            "{}",
            f.message
        );
    }
}
