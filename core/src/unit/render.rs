//! Manifest to unit text. Pure and deterministic: the same manifest and host always give the same
//! bytes, flags in a fixed order (model, then the flags by name, then a server group's
//! `--nnodes`, `--node-rank` and `--dist-init-addr`, then host and port) so that reordering a
//! manifest changes nothing on the host.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::escape::{escape_specifiers, quote_env, quote_exec_arg};
use std::time::Duration;

use super::read::{continues, strip};
use super::secrets::{looks_secret, SecretsFile};
use super::{section_of, UnitModel};
use crate::manifest::{FlagValue, HostSpec, Manifest};

/// The unit a host should have for a manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct Desired {
    /// `<service>.service`
    pub unit: String,
    pub text: String,
    pub model: UnitModel,
    /// What apply does with drop-ins, a mask or a shadowing unit file (`systemd.dropins`).
    pub dropins: crate::manifest::DropInPolicy,
    /// The SGLang version the manifest names: its parser is what a plan compares flags as.
    pub sglang_version: String,
    /// The manifest lets a change SGLang takes without a restart be applied live (`apply.live`).
    pub live: bool,
    /// The secret environment, in a file of its own that the unit names (`EnvironmentFile=`);
    /// `model.env` holds the rest.
    pub secrets: Option<SecretsFile>,
}

impl Desired {
    /// The whole environment the server gets: the unit's own and its secrets file's.
    pub fn environment(&self) -> BTreeMap<String, String> {
        let mut env = self.model.env.clone();
        if let Some(secrets) = &self.secrets {
            env.extend(secrets.env.clone());
        }
        env
    }

    /// What the unit means with its secrets written inline, as a unit from before reconcile kept
    /// them apart has them: the whole environment, and no secrets file.
    pub fn inline_model(&self) -> UnitModel {
        let mut model = self.model.clone();
        model.env = self.environment();
        if let Some(file) = &self.secrets {
            if let Some(files) = model.settings.get_mut("Service.EnvironmentFile") {
                files.retain(|f| *f != file.path);
                if files.is_empty() {
                    model.settings.remove("Service.EnvironmentFile");
                }
            }
        }
        model
    }
}

pub fn render(m: &Manifest, host: &HostSpec) -> Desired {
    let unit = m.unit_name();
    let (env, secret) = environment(m, host);
    let secrets = SecretsFile::of(&unit, secret);
    let mut settings = settings(m, host);
    // Last, so that its values win over a file the manifest names itself.
    if let Some(file) = &secrets {
        settings
            .entry("Service.EnvironmentFile".to_string())
            .or_default()
            .push(file.path.clone());
    }
    let model = UnitModel {
        exec_start: argv(m, host),
        env,
        settings,
    };
    let text = unit_text(&m.source, &model);
    Desired {
        secrets,
        unit,
        text,
        model,
        dropins: m.dropins,
        sglang_version: m.sglang.version.clone(),
        live: m.apply.live,
    }
}

fn argv(m: &Manifest, host: &HostSpec) -> Vec<String> {
    let s = &m.sglang;
    let mut argv = match &s.console_script {
        Some(script) => vec![script.clone(), "serve".into()],
        None => vec![s.python.clone(), "-m".into(), "sglang.launch_server".into()],
    };
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
    // A server group (`nodes:`): the host's rank is its place in `m.hosts`. Validation refuses
    // these flags in `flags`, so they are never given twice.
    if let Some(group) = &m.group {
        if let Some(rank) = m.hosts.iter().position(|h| h.name == host.name) {
            push("nnodes", &[&group.nnodes().to_string()]);
            push("node-rank", &[&rank.to_string()]);
            push("dist-init-addr", &[&group.dist_init_addr()]);
        }
    }
    // Always present and always last, so adding or removing any other flag changes one line only.
    if let Some(h) = &s.host {
        push("host", &[h]);
    }
    push("port", &[&s.port.to_string()]);
    argv
}

/// The unit's environment, and apart from it the secret part: the names that look secret and
/// those the manifest declares (`secret_env`).
fn environment(
    m: &Manifest,
    host: &HostSpec,
) -> (BTreeMap<String, String>, BTreeMap<String, String>) {
    let mut env = m.env.clone();
    env.extend(host.env.clone());
    env.into_iter()
        .partition(|(name, _)| !(looks_secret(name) || m.secret_env.contains(name)))
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
    // A graceful stop: SIGTERM to SGLang's main process alone, which stops taking requests,
    // finishes those in flight and then ends its schedulers itself. With systemd's default
    // (control-group) every process gets SIGTERM at once, the schedulers die mid-request and the
    // unit ends `failed`. A rank >= 1 of a server over several hosts answers SIGTERM only with a
    // log line: rank 0's drain ends with a ShutdownReq its schedulers broadcast to every rank's,
    // and then the rank's process exits by itself (sglang 0.5.23 `entrypoints/engine.py`,
    // `_launch_subprocesses`; `managers/tokenizer_manager.py`, `sigterm_watchdog`). So its
    // TimeoutStopSec outlasts rank 0's by SGLang's own stop: a group is stopped all at once
    // (`apply::pipeline`), and that timeout is only the backstop.
    let rank = m
        .group
        .as_ref()
        .and_then(|_| m.hosts.iter().position(|h| h.name == host.name));
    let timeout = match rank {
        Some(rank) if rank > 0 => stop_timeout(m) + SGLANG_STOP_OVERHEAD,
        _ => stop_timeout(m),
    };
    settings.insert("Service.KillMode".into(), vec!["mixed".into()]);
    settings.insert(
        "Service.TimeoutStopSec".into(),
        vec![format!("{}s", timeout.as_secs())],
    );
    // The sandbox preset (`systemd.hardening`) first: the manifest's own settings override it.
    super::hardening::add(&mut settings, m, host);
    for (key, value) in m.systemd.iter().chain(&host.systemd) {
        settings.insert(format!("{}.{key}", section_of(key)), vec![value.clone()]);
    }
    // What systemd will read: it strips whitespace around a value, and an empty assignment resets
    // the setting to its default, the same as leaving it out.
    for values in settings.values_mut() {
        for value in values.iter_mut() {
            if strip(value).len() != value.len() {
                *value = strip(value).to_string();
            }
        }
    }
    settings.retain(|_, values| values.iter().all(|v| !v.is_empty()));
    settings
}

/// How long the requests in flight may take when no `drain:` says: two minutes, as long as an
/// 8k-token answer at 70 tokens a second.
pub const DEFAULT_STOP_GRACE: Duration = Duration::from_secs(120);

/// SGLang's own time to stop once the requests are done (sglang 0.5.23
/// `managers/tokenizer_manager.py`): `sigterm_watchdog` sees SIGTERM within its 5 s poll, then
/// gives its schedulers `_SCHEDULER_EXIT_TIMEOUT_SECS` (15 s) to release the GPUs.
pub const SGLANG_STOP_OVERHEAD: Duration = Duration::from_secs(20);

/// `TimeoutStopSec=`: the drain's timeout (what the manifest allows the requests in flight), or
/// [`DEFAULT_STOP_GRACE`], plus SGLang's own stop. Past it systemd sends SIGKILL.
pub fn stop_timeout(m: &Manifest) -> Duration {
    m.drain.as_ref().map_or(DEFAULT_STOP_GRACE, |d| d.timeout) + SGLANG_STOP_OVERHEAD
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
        // A line ending in an unescaped backslash would continue onto the next setting; systemd
        // checks before stripping whitespace, so a trailing space keeps the backslash in the value.
        let end = if continues(value) { " " } else { "" };
        let _ = writeln!(out, "{key}={value}{end}");
    }
}

/// The program and its module (or `serve`) on the first line, then one flag with its values per
/// line, so a diff shows one line per changed flag.
fn write_exec_start(out: &mut String, argv: &[String]) {
    let quoted: Vec<String> = argv.iter().map(|a| quote_exec_arg(a)).collect();
    let head = argv
        .iter()
        .position(|a| a.starts_with("--"))
        .unwrap_or(argv.len())
        .min(3);
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
KillMode=mixed
LimitNOFILE=1048576
Restart=on-failure
RestartSec=10
TimeoutStopSec=140s
User=root

[Install]
WantedBy=multi-user.target
";
        assert_eq!(unit.text, expected);
        assert_eq!(unit.unit, "sglang-qwen.service");
    }

    #[test]
    fn a_stop_is_graceful_for_the_drains_timeout_or_two_minutes_and_the_manifest_may_say_otherwise()
    {
        let settings = |yaml: &str| {
            let m = parse("q.yaml", yaml).unwrap();
            let unit = render(&m, &m.hosts[0]);
            let get = |k: &str| unit.model.settings.get(k).map(|v| v.join(" "));
            (get("Service.KillMode"), get("Service.TimeoutStopSec"))
        };
        let mixed = Some("mixed".to_string());
        assert_eq!(settings(QWEN), (mixed.clone(), Some("140s".into())));
        let drained = format!("{QWEN}drain: {{ timeout: 10m }}\n");
        assert_eq!(settings(&drained), (mixed, Some("620s".into())));
        let own = QWEN.replace(
            "LimitNOFILE: 1048576 }",
            "LimitNOFILE: 1048576, KillMode: control-group, TimeoutStopSec: 30 }",
        );
        assert_eq!(
            settings(&own),
            (Some("control-group".into()), Some("30".into()))
        );
        // The ranks of a server over several hosts stop gracefully too; rank 1 waits for rank
        // 0's drain and then its stop (see `settings`).
        let group = "service: big\nnodes: [gpu-a, gpu-b]\nsglang:\n  python: /usr/bin/python3\n  version: 0.5.23\n  model_path: /m\n  port: 30000\n  flags: { tp-size: 2 }\n";
        let m = parse("g.yaml", group).unwrap();
        let rank = |i: usize| {
            let unit = render(&m, &m.hosts[i]);
            let get = |k: &str| unit.model.settings.get(k).map(|v| v.join(" "));
            (get("Service.KillMode"), get("Service.TimeoutStopSec"))
        };
        assert_eq!(rank(0), (Some("mixed".into()), Some("140s".into())));
        assert_eq!(rank(1), (Some("mixed".into()), Some("160s".into())));
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

    pub(crate) const GROUP: &str = "\
service: sglang-big
nodes:
  - root@gpu-a:2222
  - name: gpu-b
    address: 10.0.0.12
    env: { NCCL_SOCKET_IFNAME: eth1 }
sglang:
  python: /root/ml-env/bin/python3
  version: 0.5.23
  model_path: /shared/models/Big
  port: 30000
  dist_init_port: 20100
  flags:
    tp-size: 16
";

    fn exec_start_lines(text: &str) -> Vec<&str> {
        let start = text.find("ExecStart=").unwrap();
        text[start..]
            .lines()
            .take_while(|l| l.ends_with('\\') || l.starts_with('\t') || l.starts_with("ExecStart"))
            .collect()
    }

    #[test]
    fn each_rank_gets_the_group_flags_before_host_and_port() {
        let m = parse("big.yaml", GROUP).unwrap();
        let rank0 = render(&m, &m.hosts[0]);
        assert_eq!(
            exec_start_lines(&rank0.text),
            [
                "ExecStart=/root/ml-env/bin/python3 -m sglang.launch_server \\",
                "\t--model-path /shared/models/Big \\",
                "\t--tp-size 16 \\",
                "\t--nnodes 2 \\",
                "\t--node-rank 0 \\",
                "\t--dist-init-addr gpu-a:20100 \\",
                "\t--port 30000",
            ]
        );
        let rank1 = render(&m, &m.hosts[1]);
        let argv = &rank1.model.exec_start;
        let at = argv.iter().position(|a| a == "--nnodes").unwrap();
        assert_eq!(
            argv[at..],
            [
                "--nnodes",
                "2",
                "--node-rank",
                "1",
                "--dist-init-addr",
                "gpu-a:20100",
                "--port",
                "30000"
            ]
        );
        assert_eq!(rank1.model.env["NCCL_SOCKET_IFNAME"], "eth1");
        assert_eq!(parse_unit(&rank1.text), rank1.model);
        // Deterministic: the same bytes every time.
        assert_eq!(render(&m, &m.hosts[1]), rank1);
    }

    #[test]
    fn a_group_renders_ipv6_rank_zero_in_brackets_and_the_default_port() {
        let text = GROUP
            .replace("  - root@gpu-a:2222\n", "  - \"[fd00::1]:22\"\n")
            .replace("  dist_init_port: 20100\n", "");
        let m = parse("big.yaml", &text).unwrap();
        let argv = render(&m, &m.hosts[1]).model.exec_start;
        let at = argv.iter().position(|a| a == "--dist-init-addr").unwrap();
        assert_eq!(argv[at + 1], "[fd00::1]:20000");
    }

    #[test]
    fn a_server_on_hosts_gets_no_group_flags() {
        let m = parse("q.yaml", QWEN).unwrap();
        for h in &m.hosts {
            let argv = render(&m, h).model.exec_start;
            assert!(
                !argv.iter().any(|a| a == "--nnodes" || a == "--node-rank"),
                "{argv:?}"
            );
        }
    }
}

/// Property tests: for manifests with arbitrary (hostile) values, the rendered unit reads back to
/// exactly the model `render` meant, and that model carries the manifest's values unchanged.
#[cfg(test)]
mod props {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;
    use crate::manifest::{parse, validate};
    use crate::unit::escape::props::hostile_string;
    use crate::unit::parse_unit;
    use crate::unit::read::strip;

    // A YAML double-quoted scalar that means exactly `s`, as `import` writes one: YAML's own line
    // breaks (NEL, U+2028, U+2029) and BOMs in the text cannot fold or vanish before `reconcile`
    // sees the value.
    use crate::import::yaml::quoted as yaml_quote;

    #[derive(Debug, Clone)]
    enum Flag {
        Switch(bool),
        Value(String),
        List(Vec<String>),
    }

    impl Flag {
        fn yaml(&self) -> String {
            match self {
                Flag::Switch(b) => b.to_string(),
                Flag::Value(v) => yaml_quote(v),
                Flag::List(items) => format!(
                    "[{}]",
                    items
                        .iter()
                        .map(|i| yaml_quote(i))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }
        }
        fn value(&self) -> FlagValue {
            match self {
                Flag::Switch(b) => FlagValue::Switch(*b),
                Flag::Value(v) => FlagValue::Value(v.clone()),
                Flag::List(items) => FlagValue::List(items.clone()),
            }
        }
    }

    fn flag() -> impl Strategy<Value = Flag> {
        prop_oneof![
            1 => any::<bool>().prop_map(Flag::Switch),
            3 => hostile_string().prop_map(Flag::Value),
            1 => proptest::collection::vec(hostile_string(), 1..4).prop_map(Flag::List),
        ]
    }

    fn flags() -> impl Strategy<Value = BTreeMap<String, Flag>> {
        let name =
            "[a-z][a-z0-9_-]{0,12}".prop_filter("set through the manifest's own fields", |n| {
                !matches!(
                    n.as_str(),
                    "model-path" | "model" | "served-model-name" | "host" | "port"
                ) && crate::manifest::group_flags(n).is_empty()
            });
        proptest::collection::btree_map(name, flag(), 0..5)
    }

    fn env() -> impl Strategy<Value = BTreeMap<String, String>> {
        proptest::collection::btree_map("[A-Za-z_][A-Za-z0-9_]{0,10}", hostile_string(), 0..4)
    }

    fn systemd() -> impl Strategy<Value = BTreeMap<String, String>> {
        let key = prop_oneof![
            proptest::sample::select(
                &[
                    "User",
                    "Group",
                    "Restart",
                    "RestartSec",
                    "LimitNOFILE",
                    "WorkingDirectory",
                    "After",
                    "Wants",
                    "WantedBy",
                    "Nice",
                    "ConditionPathExists",
                    "KillMode",
                ][..]
            )
            .prop_map(str::to_string),
            "[A-Z][A-Za-z0-9]{0,10}".prop_filter("rendered from the manifest", |k| {
                !matches!(
                    k.as_str(),
                    "ExecStart" | "Environment" | "Description" | "Type"
                )
            }),
        ];
        proptest::collection::btree_map(key, hostile_string(), 0..4)
    }

    #[derive(Debug, Clone)]
    struct Host {
        name: String,
        env: BTreeMap<String, String>,
        flags: BTreeMap<String, Flag>,
        systemd: BTreeMap<String, String>,
    }

    #[derive(Debug, Clone)]
    struct Spec {
        description: Option<String>,
        python: String,
        model_path: String,
        served_model_name: Option<String>,
        host: Option<String>,
        port: u16,
        flags: BTreeMap<String, Flag>,
        env: BTreeMap<String, String>,
        systemd: BTreeMap<String, String>,
        hosts: Vec<Host>,
    }

    fn host() -> impl Strategy<Value = Host> {
        ("[a-z][a-z0-9.@-]{0,10}", env(), flags(), systemd()).prop_map(
            |(name, env, flags, systemd)| Host {
                name,
                env,
                flags,
                systemd,
            },
        )
    }

    fn spec() -> impl Strategy<Value = Spec> {
        (
            (
                proptest::option::of(hostile_string()),
                hostile_string(),
                hostile_string().prop_filter("must not be empty", |s| !s.is_empty()),
                proptest::option::of(hostile_string()),
                proptest::option::of(hostile_string()),
                1..=u16::MAX,
            ),
            (
                flags(),
                env(),
                systemd(),
                proptest::collection::vec(host(), 1..3),
            ),
        )
            .prop_map(
                |(
                    (description, python, model_path, served_model_name, host, port),
                    (flags, env, systemd, hosts),
                )| Spec {
                    description,
                    python: format!("/{python}"),
                    model_path,
                    served_model_name,
                    host,
                    port,
                    flags,
                    env,
                    systemd,
                    hosts,
                },
            )
    }

    fn map_yaml<V>(map: &BTreeMap<String, V>, value: impl Fn(&V) -> String) -> String {
        let items: Vec<String> = map
            .iter()
            .map(|(k, v)| format!("{}: {}", yaml_quote(k), value(v)))
            .collect();
        format!("{{ {} }}", items.join(", "))
    }

    fn manifest_yaml(s: &Spec) -> String {
        let mut y = String::from("service: svc\n");
        if let Some(d) = &s.description {
            y += &format!("description: {}\n", yaml_quote(d));
        }
        y += "hosts:\n";
        for h in &s.hosts {
            y += &format!(
                "  - name: {}\n    env: {}\n    flags: {}\n    systemd: {}\n",
                yaml_quote(&h.name),
                map_yaml(&h.env, |v| yaml_quote(v)),
                map_yaml(&h.flags, Flag::yaml),
                map_yaml(&h.systemd, |v| yaml_quote(v)),
            );
        }
        y += &format!(
            "sglang:\n  python: {}\n  version: 0.5.23\n  model_path: {}\n",
            yaml_quote(&s.python),
            yaml_quote(&s.model_path)
        );
        if let Some(n) = &s.served_model_name {
            y += &format!("  served_model_name: {}\n", yaml_quote(n));
        }
        if let Some(h) = &s.host {
            y += &format!("  host: {}\n", yaml_quote(h));
        }
        y += &format!(
            "  port: {}\n  flags: {}\n",
            s.port,
            map_yaml(&s.flags, Flag::yaml)
        );
        y += &format!("env: {}\n", map_yaml(&s.env, |v| yaml_quote(v)));
        y += &format!("systemd: {}\n", map_yaml(&s.systemd, |v| yaml_quote(v)));
        y
    }

    /// `--name value` or, for one value starting with `-`, `--name=value`.
    fn flag_args(name: &str, values: &[String]) -> Vec<String> {
        match values {
            [v] if v.starts_with('-') => vec![format!("--{name}={v}")],
            _ => std::iter::once(format!("--{name}"))
                .chain(values.iter().cloned())
                .collect(),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(500))]

        #[test]
        fn rendered_units_read_back_to_the_manifest(s in spec()) {
            let text = manifest_yaml(&s);
            let m = parse("p.yaml", &text).map_err(|e| {
                TestCaseError::fail(format!("{:?}\n{text}", e.0))
            })?;
            prop_assert!(validate(&m, &text).is_ok(), "{:?}\n{}", validate(&m, &text), text);
            prop_assert_eq!(&m.sglang.python, &s.python);
            prop_assert_eq!(&m.sglang.model_path, &s.model_path);
            prop_assert_eq!(&m.env, &s.env);
            prop_assert_eq!(&m.systemd, &s.systemd);

            for (i, h) in s.hosts.iter().enumerate() {
                let unit = render(&m, &m.hosts[i]);
                let back = parse_unit(&unit.text);
                prop_assert_eq!(&back, &unit.model, "unit:\n{}\nmanifest:\n{}", unit.text, text);

                // The argv is the manifest's, value for value.
                let mut argv = vec![s.python.clone(), "-m".into(), "sglang.launch_server".into()];
                argv.extend(flag_args("model-path", std::slice::from_ref(&s.model_path)));
                if let Some(n) = &s.served_model_name {
                    argv.extend(flag_args("served-model-name", std::slice::from_ref(n)));
                }
                let mut all_flags = s.flags.clone();
                all_flags.extend(h.flags.clone());
                for (name, flag) in &all_flags {
                    match flag.value() {
                        FlagValue::Switch(true) => argv.push(format!("--{name}")),
                        FlagValue::Switch(false) => {}
                        FlagValue::Value(v) => argv.extend(flag_args(name, &[v])),
                        FlagValue::List(items) => argv.extend(flag_args(name, &items)),
                    }
                }
                if let Some(host) = &s.host {
                    argv.extend(flag_args("host", std::slice::from_ref(host)));
                }
                argv.extend(flag_args("port", &[s.port.to_string()]));
                prop_assert_eq!(&back.exec_start, &argv);

                // The server gets every variable; a name that looks secret (`keY`, `hf_token`)
                // goes to the secrets file, never into the unit's text.
                let mut env = s.env.clone();
                env.extend(h.env.clone());
                prop_assert_eq!(&unit.environment(), &env);
                env.retain(|name, _| !looks_secret(name));
                prop_assert_eq!(&back.env, &env);

                // Settings as systemd sees them: stripped, and an empty one is no setting.
                let mut systemd = s.systemd.clone();
                systemd.extend(h.systemd.clone());
                for (key, value) in &systemd {
                    let got = back.settings.get(&format!("{}.{key}", section_of(key)));
                    match strip(value) {
                        "" => prop_assert!(got.is_none(), "{}={:?} read back as {:?}", key, value, got),
                        v => prop_assert_eq!(got, Some(&vec![v.to_string()])),
                    }
                }
                if let Some(d) = &s.description {
                    let got = back.settings.get("Unit.Description");
                    match strip(d) {
                        "" => prop_assert!(got.is_none()),
                        d => prop_assert_eq!(got, Some(&vec![escape_specifiers(d)])),
                    }
                }
            }
        }
    }

    /// Found by the property above: a trailing backslash continued the line onto the next setting,
    /// and whitespace around a value (or a Unicode space systemd keeps) made the model disagree
    /// with what systemd reads.
    #[test]
    fn setting_values_at_line_edges() {
        let text = "service: s\ndescription: \"ends in \\\\\"\nhosts:\n  - name: a\n    systemd: { Nice: \" 5 \", Group: \"\" }\nsglang:\n  python: /p\n  version: 1\n  model_path: /m\n  port: 1\nsystemd: { User: \"root\\\\\", WorkingDirectory: \"/srv\\u3000\" }\n";
        let m = parse("e.yaml", text).unwrap();
        let unit = render(&m, &m.hosts[0]);
        let back = parse_unit(&unit.text);
        assert_eq!(back, unit.model, "{}", unit.text);
        assert_eq!(back.settings["Unit.Description"], ["ends in \\"]);
        assert_eq!(back.settings["Unit.After"], ["network-online.target"]);
        assert_eq!(back.settings["Service.User"], ["root\\"]);
        assert_eq!(back.settings["Service.Nice"], ["5"]);
        assert_eq!(back.settings["Service.WorkingDirectory"], ["/srv\u{3000}"]);
        assert!(!back.settings.contains_key("Service.Group"));
        assert!(unit.text.contains("Description=ends in \\ \n"));
    }
}
