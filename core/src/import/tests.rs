//! Import's round trip without a host: each hand-written unit is imported, the manifest parsed,
//! its references resolved, rendered, and planned against the same unit: never a restart.

use super::*;
use crate::manifest::{parse, FlagValue};
use crate::observed::Observed;
use crate::plan::{plan, Verdict};
use crate::sglang::check_manifest;
use crate::testing::{
    assert_any, assert_any_starts, assert_each_holds, assert_holds, assert_starts,
};
use crate::unit::render;

const UNIT: &str = "sglang-qwen.service";
const FRAGMENT: &str = "/etc/systemd/system/sglang-qwen.service";
const DROPIN: &str = "/etc/systemd/system/sglang-qwen.service.d/override.conf";

/// The seeds' unit (fixtures/demo/sglang-qwen.service) with two secrets added.
const SEEDS: &str = "\
# The unit an operator wrote by hand.
[Unit]
Description=SGLang Qwen3.5-122B-A10B BF16
After=network-online.target
Wants=network-online.target

[Service]
Type=simple
Environment=\"CUDA_VISIBLE_DEVICES=0,1,2,3\" \"NCCL_P2P_DISABLE=1\"
Environment=\"CUDA_HOME=/usr/local/cuda-13.0\" \"LD_LIBRARY_PATH=/usr/local/cuda-13.0/lib64\"
Environment=HF_TOKEN=hf_abcdefghijklmnop
ExecStart=/root/ml-env/bin/python3 -m sglang.launch_server --model-path /shared/models/Qwen3.5-122B-A10B --served-model-name qwen3.5-122b --host 127.0.0.1 --port 30000 --tp-size 4 --context-length 131072 --mem-fraction-static 0.85 --reasoning-parser qwen3 --tool-call-parser qwen3_coder --enable-metrics --api-key sk-secret-key-123
User=root
Restart=on-failure
RestartSec=10
LimitNOFILE=1048576
TimeoutStartSec=30min

[Install]
WantedBy=multi-user.target
";

/// Quoting, escapes and `%%` (a literal `%`) everywhere systemd reads them.
const QUOTED: &str = "\
[Unit]
Description=Qwen at 100%% (quoted)

[Service]
Type=simple
Environment='GREETING=hello world' \"RATIO=50%%\" PLAIN=x\\x41y
ExecStart=/usr/bin/python3 -m sglang.launch_server \\
\t--model-path \"/models/with space\" \\
\t--served-model-name 'qwen 100%%' \\
\t--chat-template \"{\\\"a\\\": 1}\" \\
\t--api-key=\"$$NOT_A_VAR\" \\
\t--port 31000
";

const LISTS: &str = "\
[Unit]
Description=lists

[Service]
Type=simple
ExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /models/test --port 30000 --cuda-graph-bs-decode 1 2 4 8 --numa-node 0 --bucket-time-to-first-token 0.1 0.5 1e1 --enable-metrics --mem-fraction-static=0.5
";

const ENVFILE: &str = "\
[Unit]
Description=env file

[Service]
Type=simple
EnvironmentFile=-/etc/sglang/qwen.env
ExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /models/test --port 30000
";

const OVERRIDE: &str = "\
[Service]
ExecStart=
ExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /models/test --port 30000 --tp-size 1
Environment=EXTRA=1
Nice=5
";

fn files(parts: &[(&str, &str)]) -> Vec<UnitFile> {
    parts
        .iter()
        .map(|(path, text)| UnitFile {
            path: path.to_string(),
            text: text.to_string(),
        })
        .collect()
}

fn request<'a>(files: &'a [UnitFile], secret_env: &'a [String]) -> Request<'a> {
    Request {
        host: "gpu-a",
        unit: UNIT,
        files,
        version: "0.5.23",
        secret_env,
        interpreter: None,
    }
}

/// Imports, then plans the imported manifest against the same unit (the files in force as one
/// text): the verdict and the manifest.
fn round_trip(files: &[UnitFile]) -> (Verdict, Imported) {
    round_trip_of(files, request(files, &[]))
}

fn round_trip_of(files: &[UnitFile], request: Request) -> (Verdict, Imported) {
    let imported = import(&request).unwrap_or_else(|e| panic!("{e}: {:#?}", e.errors));
    let mut m = parse("manifests/imported.yaml", &imported.yaml)
        .unwrap_or_else(|e| panic!("{:?}\n{}", e.0, imported.yaml));
    let secrets: BTreeMap<String, String> = secret_values(files, &imported);
    assert!(m.resolve_references(|v| secrets.get(v).cloned()).is_empty());
    assert!(!check_manifest(&m, &imported.yaml).has_errors());
    let desired = render(&m, &m.hosts[0]);
    let mut text = String::new();
    for f in files {
        text.push_str(&f.text);
        text.push('\n');
    }
    let observed = Observed {
        unit_text: Some(text),
        state: Default::default(),
        unit_files: Default::default(),
    };
    let p = plan("gpu-a", &m.source, &desired, &observed, &Default::default());
    // A unit with its secrets inline restarts once, to move them to a file only root reads, and
    // for nothing else: what it means with them inline is the unit's.
    if desired.secrets.is_some() && !text_names_secrets_file(files) {
        assert_eq!(p.verdict, Verdict::Restart, "{:?}", p.summary);
        let inline = crate::unit::Desired {
            model: desired.inline_model(),
            ..desired.clone()
        };
        assert_eq!(
            crate::plan::restart_reason(
                &crate::unit::parse_unit(&observed.unit_text.clone().unwrap()),
                &inline.model,
                crate::plan::parser(&desired)
            ),
            None
        );
        return (p.verdict, imported);
    }
    assert!(
        matches!(p.verdict, Verdict::NoChange | Verdict::ReloadOnly),
        "{:?}: {:?}\n{}\n{}",
        p.verdict,
        p.summary,
        imported.yaml,
        p.diff
    );
    (p.verdict, imported)
}

fn text_names_secrets_file(files: &[UnitFile]) -> bool {
    files
        .iter()
        .any(|f| f.text.contains(crate::unit::SECRETS_DIR))
}

/// The values of the references, read back out of the unit the way a user would export them.
fn secret_values(files: &[UnitFile], imported: &Imported) -> BTreeMap<String, String> {
    let model = effective(files);
    let (_, flags) = crate::flags::flags(&model.exec_start);
    imported
        .exports
        .iter()
        .map(|(var, what)| {
            let value = match what.strip_prefix("env ") {
                Some(name) => model.env[name].clone(),
                None => flags[what.trim_start_matches("--")].clone(),
            };
            (var.clone(), value)
        })
        .collect()
}

#[test]
fn the_seeds_unit_round_trips_with_its_secrets_as_references() {
    let (verdict, imported) = round_trip(&files(&[(FRAGMENT, SEEDS)]));
    assert_eq!(
        verdict,
        Verdict::Restart,
        "the inline HF_TOKEN moves to a file only root reads (round_trip checks it is all)"
    );
    assert!(
        imported
            .notes
            .iter()
            .any(|n| n.contains("HF_TOKEN") && n.contains("restarts the server once")),
        "{:?}",
        imported.notes
    );
    let yaml = &imported.yaml;
    assert!(
        !yaml.contains("hf_abcdefghijklmnop") && !yaml.contains("sk-secret-key-123"),
        "{yaml}"
    );
    assert_holds(yaml, "HF_TOKEN: { from_env: HF_TOKEN }");
    assert_holds(yaml, "api-key: { from_env: SGLANG_API_KEY }");
    assert_eq!(
        imported.exports,
        [
            ("SGLANG_API_KEY".to_string(), "--api-key".to_string()),
            ("HF_TOKEN".to_string(), "env HF_TOKEN".to_string()),
        ]
    );
    for typed in [
        "    tp-size: 4\n",
        "    mem-fraction-static: 0.85\n",
        "    enable-metrics: true\n",
        "  TimeoutStartSec: \"30min\"\n",
        "  LimitNOFILE: 1048576\n",
        "  version: \"0.5.23\"",
        "  host: \"127.0.0.1\"\n",
    ] {
        assert!(yaml.contains(typed), "no `{typed}` in\n{yaml}");
    }
    assert!(!yaml.contains("dropins"), "{yaml}");
    let m = parse("m.yaml", yaml).unwrap();
    assert_eq!(m.sglang.flags["tp-size"], FlagValue::Value("4".into()));
    assert_eq!(m.sglang.port, 30000);
}

#[test]
fn quoted_values_and_percent_signs_round_trip() {
    let (_, imported) = round_trip(&files(&[(FRAGMENT, QUOTED)]));
    let m = parse("m.yaml", &imported.yaml).unwrap();
    assert_eq!(m.description.as_deref(), Some("Qwen at 100% (quoted)"));
    assert_eq!(m.sglang.model_path, "/models/with space");
    assert_eq!(m.sglang.served_model_name.as_deref(), Some("qwen 100%"));
    assert_eq!(
        m.sglang.flags["chat-template"],
        FlagValue::Value("{\"a\": 1}".into())
    );
    assert_eq!(m.env["GREETING"], "hello world");
    assert_eq!(m.env["RATIO"], "50%");
    assert_eq!(m.env["PLAIN"], "xAy");
    // No After/Wants/WantedBy in the unit: the manifest says so, rather than gaining reconcile's.
    assert_holds(&imported.yaml, "  After: \"\"  # the unit has no After=");
    assert_eq!(m.references[0].var, "SGLANG_API_KEY");
}

#[test]
fn list_flags_round_trip_as_yaml_lists() {
    let (_, imported) = round_trip(&files(&[(FRAGMENT, LISTS)]));
    assert_holds(&imported.yaml, "    cuda-graph-bs-decode: [1, 2, 4, 8]\n");
    assert_holds(&imported.yaml, "    numa-node: [0]\n");
    assert_holds(&imported.yaml, "    mem-fraction-static: 0.5\n");
}

#[test]
fn an_environment_file_is_carried_as_a_setting() {
    let (_, imported) = round_trip(&files(&[(FRAGMENT, ENVFILE)]));
    assert_holds(
        &imported.yaml,
        "  EnvironmentFile: \"-/etc/sglang/qwen.env\"\n",
    );
}

#[test]
fn a_drop_in_is_folded_in_and_moved_aside() {
    let both = files(&[(FRAGMENT, ENVFILE), (DROPIN, OVERRIDE)]);
    let (_, imported) = round_trip(&both);
    let yaml = &imported.yaml;
    assert_holds(yaml, "    tp-size: 1\n");
    assert_holds(
        yaml,
        &format!("  python: /usr/bin/python3  # ExecStart from {DROPIN}:3\n"),
    );
    assert_holds(yaml, &format!("  EXTRA: \"1\"  # from {DROPIN}:4\n"));
    assert_holds(yaml, &format!("  Nice: 5  # from {DROPIN}:5\n"));
    assert_holds(yaml, "  dropins: replace\n");
    let m = parse("m.yaml", yaml).unwrap();
    assert_eq!(m.dropins, crate::manifest::DropInPolicy::Replace);
    assert_eq!(python(UNIT, &both).as_deref(), Some("/usr/bin/python3"));
}

#[test]
fn drop_ins_shared_with_other_units_are_not_folded_in() {
    let shared = "/etc/systemd/system/service.d/10-all.conf";
    let all = files(&[(FRAGMENT, ENVFILE), (shared, "[Service]\nLimitCORE=0\n")]);
    let imported = import(&request(&all, &[])).unwrap();
    assert!(!imported.yaml.contains("LimitCORE"), "{}", imported.yaml);
    assert_any(&imported.notes, shared);
}

#[test]
fn a_declared_secret_env_is_a_reference_and_stays_declared() {
    let unit = SEEDS.replace("NCCL_P2P_DISABLE=1", "MY_DSN=postgres://u:p@db/x");
    let fs = files(&[(FRAGMENT, &unit)]);
    let declared = ["MY_DSN".to_string()];
    let imported = import(&request(&fs, &declared)).unwrap();
    assert!(!imported.yaml.contains("postgres://"), "{}", imported.yaml);
    assert_holds(&imported.yaml, "MY_DSN: { from_env: MY_DSN }");
    assert_holds(&imported.yaml, "secret_env: [MY_DSN]");
}

/// Each problem, with the file and line it is on.
fn refused(parts: &[(&str, &str)]) -> Vec<String> {
    let fs = files(parts);
    let e = import(&request(&fs, &[])).expect_err("refused");
    e.errors.iter().map(|e| e.to_string()).collect()
}

#[test]
fn what_a_manifest_cannot_express_is_refused_with_its_line() {
    let e = refused(&[(
        FRAGMENT,
        "[Service]\nType=simple\nExecStartPre=/bin/a\nExecStartPre=/bin/b\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /m --port 1 --tp-size ${TP} --nope 1\n[X-Extra]\nKey=1\n",
    )]);
    assert_starts(
        &e,
        &[
            &format!("{FRAGMENT}:5: `${{TP}}` in ExecStart is expanded by systemd"),
            &format!("{FRAGMENT}:5: SGLang 0.5.23 has no flag --nope"),
            &format!("{FRAGMENT}:3: one of 2 ExecStartPre= lines"),
            &format!("{FRAGMENT}:4: one of 2 ExecStartPre= lines"),
            &format!("{FRAGMENT}:7: [X-Extra] is a section"),
        ],
    );

    let e = refused(&[
        (FRAGMENT, "[Service]\nType=notify\nExecStart=/bin/sleep infinity\n"),
        (DROPIN, "[Service]\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /m --port 1\nEnvironment=HOST=%H\n"),
    ]);
    assert_any_starts(
        &e,
        &format!("{FRAGMENT}:3: one of several ExecStart= lines"),
    );
    assert_any_starts(&e, &format!("{DROPIN}:2: one of several ExecStart= lines"));
    assert_any_starts(&e, &format!("{DROPIN}:3: `%H` in Environment="));
    assert_any_starts(&e, &format!("{FRAGMENT}:2: Type=notify"));

    let e = refused(&[(FRAGMENT, "[Service]\nExecStart=-/usr/bin/python3 -m sglang.launch_server --model-path /m --port 1 --tp 2 --tensor-parallel-size 2\n")]);
    assert!(
        !e.iter().any(|e| e.contains("Type")),
        "no Type= is Type=simple, systemd's default: {e:#?}"
    );
    assert_any(&e, ":2: ExecStart's `-` prefix");
    assert!(
        e.iter().any(
            |e| e.contains(":2: --tp-size is given twice (as --tp and --tensor-parallel-size)")
        ),
        "{e:#?}"
    );

    let e = refused(&[(
        FRAGMENT,
        "[Service]\nStartLimitBurst=3\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /m --port 1\n[Unit]\nStartLimitBurst=5\n",
    )]);
    assert_eq!(
        e,
        [format!("{FRAGMENT}:5: StartLimitBurst= is set both in its old and its current spelling; systemd keeps whichever it reads last: keep one in the unit first")]
    );
}

/// Shaped like units operators publish: flags by alias or abbreviation, the start limits in
/// `[Service]` (where systemd once kept them), no Description.
const OPERATORS: &str = "\
[Unit]
After=network.target

[Service]
StartLimitInterval=60
StartLimitBurst=3
ExecStart=/opt/sglang/.venv/bin/python -m sglang.launch_server --model /models/Qwen3-32B --tp 4 --mem-fraction-static 0.80 --tensor-parallel-size 4 --trust-remote-code --host 0.0.0.0 --port 30000
Restart=always
";

#[test]
fn aliases_abbreviations_and_old_spellings_are_adopted_restarting_nothing() {
    let unit = OPERATORS.replace(" --tensor-parallel-size 4", "");
    let (verdict, imported) = round_trip(&files(&[(FRAGMENT, &unit)]));
    assert_eq!(verdict, Verdict::ReloadOnly);
    let yaml = &imported.yaml;
    for written in [
        "  model_path: /models/Qwen3-32B\n",
        "    tp-size: 4\n",
        "    mem-fraction-static: \"0.80\"\n",
        "  StartLimitBurst: 3\n",
        "  StartLimitIntervalSec: 60\n",
    ] {
        assert!(yaml.contains(written), "no `{written}` in\n{yaml}");
    }
    let m = parse("m.yaml", yaml).unwrap();
    let desired = render(&m, &m.hosts[0]);
    assert_eq!(
        desired.model.settings.get("Unit.StartLimitBurst"),
        Some(&vec!["3".to_string()]),
        "rendered where systemd keeps it now"
    );
    for note in [
        "--model is SGLang 0.5.23's --model-path",
        "--tp is SGLang 0.5.23's --tp-size",
        "StartLimitInterval= in [Service] is systemd's old spelling of StartLimitIntervalSec= in [Unit]",
        "StartLimitBurst= in [Service] is systemd's old spelling of StartLimitBurst= in [Unit]",
    ] {
        assert!(
            imported.notes.iter().any(|n| n.starts_with(note)),
            "no note `{note}` in {:#?}",
            imported.notes
        );
    }

    // An alias stays as written: the unit's text is the manifest's.
    let unit = OPERATORS.replace(" --tp 4", "");
    let (_, imported) = round_trip(&files(&[(FRAGMENT, &unit)]));
    assert_holds(&imported.yaml, "    tensor-parallel-size: 4\n");
}

#[test]
fn an_unknown_sglang_version_imports_untyped() {
    let fs = files(&[(FRAGMENT, LISTS)]);
    let imported = import(&Request {
        version: "9.9.9",
        ..request(&fs, &[])
    })
    .unwrap();
    assert_holds(
        &imported.yaml,
        "    cuda-graph-bs-decode: [\"1\", \"2\", \"4\", \"8\"]\n",
    );
    assert!(
        imported.notes[0].contains("no catalog of SGLang 9.9.9"),
        "{:?}",
        imported.notes
    );
}

#[test]
fn a_unit_that_runs_sglang_serve_round_trips_with_its_console_script() {
    let unit = "[Unit]\nDescription=serve\n\n[Service]\nExecStart=/opt/sglang/.venv/bin/sglang serve --model-path /models/test --tp 2 --port 30000\n";
    let fs = files(&[(FRAGMENT, unit)]);
    assert_eq!(
        console_script(UNIT, &fs).as_deref(),
        Some("/opt/sglang/.venv/bin/sglang")
    );
    let with_python = Request {
        interpreter: Some("/opt/sglang/.venv/bin/python3"),
        ..request(&fs, &[])
    };
    let (_, imported) = round_trip_of(&fs, with_python);
    let m = parse("m.yaml", &imported.yaml).unwrap();
    assert_eq!(m.sglang.python, "/opt/sglang/.venv/bin/python3");
    assert_eq!(
        m.sglang.console_script.as_deref(),
        Some("/opt/sglang/.venv/bin/sglang")
    );
    let desired = render(&m, &m.hosts[0]);
    assert_eq!(
        desired.model.exec_start[..4],
        [
            "/opt/sglang/.venv/bin/sglang",
            "serve",
            "--model-path",
            "/models/test"
        ]
    );
    assert_holds(
        &desired.text,
        "\nExecStart=/opt/sglang/.venv/bin/sglang serve \\\n\t--model-path /models/test \\\n",
    );
    assert_eq!(
        crate::flags::server_args(&desired.model.exec_start)[..2],
        ["--model-path", "/models/test"]
    );

    // Without the script's interpreter there is no python to name.
    let e = refused(&[(FRAGMENT, unit)]);
    assert_each_holds(
        &e,
        &["the Python of `/opt/sglang/.venv/bin/sglang` (its `#!` line) could not be read"],
    );
}

#[test]
fn specifiers_every_host_resolves_alike_are_adopted_and_the_others_refused() {
    let unit = "[Unit]\nDescription=specifiers\n\n[Service]\nEnvironment=HF_HOME=%C/hf\nExecStart=%h/venv/bin/python3 -m sglang.launch_server --model-path %S/models/q --port 30000\n";
    let (verdict, imported) = round_trip(&files(&[(FRAGMENT, unit)]));
    assert_eq!(verdict, Verdict::ReloadOnly);
    let m = parse("m.yaml", &imported.yaml).unwrap();
    assert_eq!(
        (m.sglang.python.as_str(), m.sglang.model_path.as_str()),
        ("/root/venv/bin/python3", "/var/lib/models/q")
    );
    assert_eq!(m.env["HF_HOME"], "/var/cache/hf");
    assert!(
        imported.notes.iter().any(|n| n
            .starts_with("`%h` in ExecStart is /root to systemd's system manager on every host")),
        "{:#?}",
        imported.notes
    );

    let e = refused(&[(
        FRAGMENT,
        "[Service]\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /m --port 30000 --served-model-name %N-%H\n",
    )]);
    assert_eq!(e.len(), 2, "{e:#?}");
    assert!(
        e[0].starts_with(&format!(
            "{FRAGMENT}:2: `%N` in ExecStart is a systemd specifier only the host or the unit's name resolves"
        )),
        "{e:#?}"
    );
    assert!(e[1].contains("`%H` in ExecStart"), "{e:#?}");
}

#[test]
fn a_variable_in_execstart_is_refused_naming_where_systemd_takes_it_from() {
    let e = refused(&[(
        FRAGMENT,
        "[Service]\nEnvironmentFile=/etc/default/sglang\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /m --port 30000 $SGLANG_ARGS\n",
    )]);
    assert_eq!(
        e,
        [format!("{FRAGMENT}:3: `$SGLANG_ARGS` in ExecStart is expanded by systemd from EnvironmentFile=/etc/default/sglang (its values stay on the host), which a manifest's command cannot refer to (reconcile writes `$` as `$$`): write its value in ExecStart first")]
    );
    let e = refused(&[(
        FRAGMENT,
        "[Service]\nEnvironment=TP=2\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /m --port 30000 --tp-size ${TP}\n",
    )]);
    assert!(e[0].contains("from the unit's Environment="), "{e:#?}");
}
