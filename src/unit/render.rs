//! Manifest to unit text. Pure and deterministic: the same manifest and host always give the same
//! bytes, flags in a fixed order (model, then the flags by name, then host and port) so that
//! reordering a manifest changes nothing on the host.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::escape::{escape_specifiers, quote_env, quote_exec_arg};
use super::{section_of, UnitModel};
use crate::manifest::{FlagValue, HostSpec, Manifest};

/// The unit a host should have for a manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    /// `<service>.service`
    pub unit: String,
    pub text: String,
    pub model: UnitModel,
}

pub fn render(m: &Manifest, host: &HostSpec) -> Desired {
    let model = UnitModel {
        exec_start: argv(m, host),
        env: environment(m, host),
        settings: settings(m, host),
    };
    let text = unit_text(&m.source, &model);
    Desired {
        unit: m.unit_name(),
        text,
        model,
    }
}

fn argv(m: &Manifest, host: &HostSpec) -> Vec<String> {
    let s = &m.sglang;
    let mut argv = vec![s.python.clone(), "-m".into(), "sglang.launch_server".into()];
    let mut push = |name: &str, values: &[&str]| match values {
        // argparse would read a value starting with `-` as the next option; `=` keeps them together.
        [v] if v.starts_with('-') => argv.push(format!("--{name}={v}")),
        _ => {
            argv.push(format!("--{name}"));
            argv.extend(values.iter().map(|v| v.to_string()));
        }
    };
    push("model-path", &[&s.model_path]);
    if let Some(name) = &s.served_model_name {
        push("served-model-name", &[name]);
    }
    let mut flags = s.flags.clone();
    flags.extend(host.flags.clone());
    for (name, value) in &flags {
        match value {
            FlagValue::Switch(true) => push(name, &[]),
            FlagValue::Switch(false) => {}
            FlagValue::Value(v) => push(name, &[v]),
            FlagValue::List(items) => {
                push(name, &items.iter().map(String::as_str).collect::<Vec<_>>())
            }
        }
    }
    // Always present and always last, so adding or removing any other flag changes one line only.
    if let Some(h) = &s.host {
        push("host", &[h]);
    }
    push("port", &[&s.port.to_string()]);
    argv
}

fn environment(m: &Manifest, host: &HostSpec) -> BTreeMap<String, String> {
    let mut env = m.env.clone();
    env.extend(host.env.clone());
    env
}

fn settings(m: &Manifest, host: &HostSpec) -> BTreeMap<String, Vec<String>> {
    let description = m
        .description
        .clone()
        .unwrap_or_else(|| format!("SGLang {} (managed by reconcile)", m.model_id()));
    let mut settings: BTreeMap<String, Vec<String>> = [
        ("Unit.Description", escape_specifiers(&description)),
        ("Unit.After", "network-online.target".into()),
        ("Unit.Wants", "network-online.target".into()),
        ("Service.Type", "simple".into()),
        ("Install.WantedBy", "multi-user.target".into()),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), vec![v]))
    .collect();
    for (key, value) in m.systemd.iter().chain(&host.systemd) {
        settings.insert(format!("{}.{key}", section_of(key)), vec![value.clone()]);
    }
    settings
}

fn unit_text(source: &str, model: &UnitModel) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "# Managed by reconcile, rendered from {source}.");
    let _ = writeln!(out, "# Edits made here are replaced by the next `reconcile apply`; change the manifest instead.");
    for section in ["Unit", "Service", "Install"] {
        let _ = writeln!(out, "\n[{section}]");
        let in_section = model
            .settings
            .iter()
            .filter_map(|(k, v)| Some((k.strip_prefix(section)?.strip_prefix('.')?, v)));
        let (first, rest): (Vec<_>, Vec<_>) =
            in_section.partition(|(k, _)| matches!(*k, "Description" | "Type"));
        for (key, values) in first {
            write_setting(&mut out, key, values);
        }
        if section == "Service" {
            for (name, value) in &model.env {
                let _ = writeln!(out, "Environment={}", quote_env(name, value));
            }
            write_exec_start(&mut out, &model.exec_start);
        }
        for (key, values) in rest {
            write_setting(&mut out, key, values);
        }
    }
    out
}

fn write_setting(out: &mut String, key: &str, values: &[String]) {
    for value in values {
        let _ = writeln!(out, "{key}={value}");
    }
}

/// The program and its module on the first line, then one flag with its values per line, so a
/// diff shows one line per changed flag.
fn write_exec_start(out: &mut String, argv: &[String]) {
    let quoted: Vec<String> = argv.iter().map(|a| quote_exec_arg(a)).collect();
    let head = quoted.len().min(3);
    out.push_str("ExecStart=");
    out.push_str(&quoted[..head].join(" "));
    let mut line: Vec<&str> = Vec::new();
    for (arg, raw) in quoted[head..].iter().zip(&argv[head..]) {
        if raw.starts_with("--") && !line.is_empty() {
            let _ = write!(out, " \\\n\t{}", line.join(" "));
            line.clear();
        }
        line.push(arg);
    }
    if !line.is_empty() {
        let _ = write!(out, " \\\n\t{}", line.join(" "));
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::parse;
    use crate::unit::parse_unit;

    pub(crate) const QWEN: &str = "\
service: sglang-qwen
description: SGLang Qwen3.5-122B-A10B BF16 (MTP enabled)
hosts:
  - gpu-a
  - name: gpu-b
    env: { CUDA_VISIBLE_DEVICES: \"4,5,6,7\" }
sglang:
  python: /root/ml-env/bin/python3
  version: 0.5.23
  model_path: /shared/models/Qwen3.5-122B-A10B
  served_model_name: qwen3.5-122b
  port: 30000
  flags:
    tp-size: 4
    context-length: 262144
    speculative-algorithm: NEXTN
    speculative-num-steps: 1
    enable-fused-moe-sum-all-reduce: true
    disable-radix-cache: false
env: { CUDA_VISIBLE_DEVICES: \"0,1,2,3\", NCCL_P2P_DISABLE: \"1\" }
systemd: { User: root, Restart: on-failure, RestartSec: 10, LimitNOFILE: 1048576 }
";

    #[test]
    fn renders_the_expected_unit() {
        let m = parse("manifests/qwen.yaml", QWEN).unwrap();
        let unit = render(&m, &m.hosts[0]);
        let expected = "\
# Managed by reconcile, rendered from manifests/qwen.yaml.
# Edits made here are replaced by the next `reconcile apply`; change the manifest instead.

[Unit]
Description=SGLang Qwen3.5-122B-A10B BF16 (MTP enabled)
After=network-online.target
Wants=network-online.target

[Service]
Type=simple
Environment=\"CUDA_VISIBLE_DEVICES=0,1,2,3\"
Environment=\"NCCL_P2P_DISABLE=1\"
ExecStart=/root/ml-env/bin/python3 -m sglang.launch_server \\
\t--model-path /shared/models/Qwen3.5-122B-A10B \\
\t--served-model-name qwen3.5-122b \\
\t--context-length 262144 \\
\t--enable-fused-moe-sum-all-reduce \\
\t--speculative-algorithm NEXTN \\
\t--speculative-num-steps 1 \\
\t--tp-size 4 \\
\t--port 30000
LimitNOFILE=1048576
Restart=on-failure
RestartSec=10
User=root

[Install]
WantedBy=multi-user.target
";
        assert_eq!(unit.text, expected);
        assert_eq!(unit.unit, "sglang-qwen.service");
    }

    #[test]
    fn host_overrides_win() {
        let m = parse("q.yaml", QWEN).unwrap();
        assert_eq!(
            render(&m, &m.hosts[1]).model.env["CUDA_VISIBLE_DEVICES"],
            "4,5,6,7"
        );
    }

    #[test]
    fn rendering_reads_back_to_the_same_model() {
        let m = parse("q.yaml", QWEN).unwrap();
        let unit = render(&m, &m.hosts[0]);
        assert_eq!(parse_unit(&unit.text), unit.model);
    }

    #[test]
    fn hostile_values_read_back_exactly() {
        let hostile = [
            "a b",
            "tab\there",
            "quote\"d",
            "it's",
            "back\\slash",
            "trailing\\",
            "$HOME",
            "${X}",
            "$$",
            "100%",
            "%n%i",
            "; rm -rf /",
            ";",
            "-leading-dash",
            "--not-a-flag",
            "ünïcödé ✓",
            "",
            "  spaced  ",
            "{\"k\": [1, 2]}",
        ];
        for value in hostile {
            let text = QWEN
                .replace(
                    "speculative-algorithm: NEXTN",
                    &format!("speculative-algorithm: {}", yaml_quote(value)),
                )
                .replace(
                    "NCCL_P2P_DISABLE: \"1\"",
                    &format!("NCCL_P2P_DISABLE: {}", yaml_quote(value)),
                );
            let m = parse("q.yaml", &text).unwrap();
            let unit = render(&m, &m.hosts[0]);
            let back = parse_unit(&unit.text);
            assert_eq!(back, unit.model, "value {value:?} in\n{}", unit.text);
            assert_eq!(back.env["NCCL_P2P_DISABLE"], value);
        }
    }

    fn yaml_quote(s: &str) -> String {
        serde_json::to_string(s).unwrap()
    }
}
