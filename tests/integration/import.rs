//! `reconcile import HOST UNIT` on hand-written units run by real systemd: the manifest it writes
//! plans as no restart against the same host, and applying it leaves the server running with the
//! same argv (read back from `/proc`) and the same invocation. Each test has its own unit, port
//! and GPUs on the import host.

use std::time::Duration;

use crate::lab::{assert_has, lab, Ran, Reconcile, IMPORT};

const UNIT_DIR: &str = "/etc/systemd/system";

/// The environment every test unit needs to start quickly on the stand-in: two of its 64 GPUs.
fn stand_in(gpu: u16) -> String {
    format!(
        "Environment=\"CUDA_VISIBLE_DEVICES={gpu},{}\" \"FAKE_SGLANG_GPU_COUNT=64\" \"FAKE_SGLANG_LOAD_SECONDS=1\"",
        gpu + 1
    )
}

/// Installs a hand-written unit (and its other files), starts it and waits until it runs.
fn start(unit: &str, files: &[(String, String)]) {
    lab().sh(
        IMPORT,
        &format!("systemctl disable --now {unit} 2>/dev/null; rm -rf {UNIT_DIR}/{unit} {UNIT_DIR}/{unit}.d /var/lib/reconcile/{unit}; mkdir -p {UNIT_DIR}/{unit}.d /etc/sglang"),
    );
    for (path, text) in files {
        lab().put(IMPORT, path, text);
    }
    lab().sh(
        IMPORT,
        &format!("systemctl daemon-reload && systemctl start {unit}"),
    );
    // 20 s bounds a start that never happens (a Type=simple unit is active once forked).
    lab().wait_until(
        IMPORT,
        &format!("systemctl is-active --quiet {unit}"),
        Duration::from_secs(20),
    );
}

fn stop(unit: &str) {
    crate::lab::sh_quietly(
        IMPORT,
        &format!("systemctl disable --now {unit}; rm -rf {UNIT_DIR}/{unit} {UNIT_DIR}/{unit}.d /var/lib/reconcile/{unit}; systemctl daemon-reload"),
    );
}

/// The argv the server's main process runs, from `/proc`, and systemd's invocation of it.
fn running(unit: &str) -> (Vec<String>, String) {
    let argv = lab().sh(
        IMPORT,
        &format!("tr '\\0' '\\n' < /proc/$(systemctl show -p MainPID --value {unit})/cmdline"),
    );
    (
        argv.lines().map(str::to_string).collect(),
        lab().invocation(IMPORT, unit),
    )
}

/// `reconcile import IMPORT unit -o manifests/imported.yaml` in a folder of its own, then
/// `plan` and `apply` of what it wrote with `secrets` exported: the manifest, the import's stderr
/// and the plan's JSON for the unit. Asserts the round trip: no restart planned, none happened,
/// the same argv before and after.
fn round_trip(unit: &str, secrets: &[(&str, &str)]) -> (String, String, serde_json::Value) {
    round_trip_moving(unit, secrets, &[])
}

/// [`round_trip`] of a unit whose secret environment (`inline`) is written inline: the one
/// restart planned and made moves it to a file only root reads, and the server runs the same
/// argv after it.
fn round_trip_moving(
    unit: &str,
    secrets: &[(&str, &str)],
    inline: &[&str],
) -> (String, String, serde_json::Value) {
    let before = running(unit);
    let run = secrets
        .iter()
        .fold(Reconcile::new(), |run, (var, value)| run.env(var, value));
    std::fs::create_dir_all(run.dir().join("manifests")).unwrap();
    let imported = run.run_args(&["import", IMPORT, unit, "-o", "manifests/imported.yaml"]);
    imported.assert_code(0);
    let yaml = std::fs::read_to_string(run.dir().join("manifests/imported.yaml")).unwrap();
    for (_, value) in secrets {
        assert!(!yaml.contains(value), "a secret was copied:\n{yaml}");
        assert!(!imported.stderr.contains(value), "{}", imported.stderr);
    }

    let planned = run.run_args(&["plan", "manifests/imported.yaml", "--format", "json"]);
    assert!(
        matches!(planned.code, 0 | 2),
        "{}{}",
        planned.stdout,
        planned.stderr
    );
    let plan = planned.json()["units"][0].clone();
    let verdict = plan["verdict"].as_str().unwrap_or_default().to_string();
    if inline.is_empty() {
        assert!(
            verdict == "reload_only" || verdict == "no_change",
            "{verdict}: {plan:#}\n{yaml}"
        );
    } else {
        let moved = format!("the secret environment ({})", inline.join(", "));
        assert_eq!(verdict, "restart", "{plan:#}\n{yaml}");
        assert!(plan["notes"].to_string().contains(&moved), "{plan:#}");
    }

    let applied: Ran = run.run_args(&["apply", "manifests/imported.yaml", "--format", "json"]);
    assert_eq!(
        applied.code, 0,
        "{}{}\n{yaml}",
        applied.stdout, applied.stderr
    );
    let report = &applied.json()["units"][0];
    let moved = !inline.is_empty();
    assert!(
        matches!(report["outcome"].as_str(), Some("reloaded" | "unchanged")) != moved,
        "{report:#}"
    );
    let after = running(unit);
    if moved {
        // Rendered, the flags are in reconcile's order: the same words, the same values.
        let sorted = |argv: &[String]| {
            let mut words = argv.to_vec();
            words.sort();
            words
        };
        assert_eq!(
            sorted(&after.0),
            sorted(&before.0),
            "the server runs another argv"
        );
        assert_ne!(after.1, before.1, "the move of the secrets restarted it");
    } else {
        assert_eq!(
            after, before,
            "the server was restarted or runs another argv"
        );
    }
    let managed = lab().sh(IMPORT, &format!("cat {UNIT_DIR}/{unit}"));
    assert!(managed.starts_with("# Managed by reconcile"), "{managed}");
    // Planned again, the applied manifest is the host's unit: nothing to change.
    let again = run.run_args(&["plan", "manifests/imported.yaml", "--format", "json"]);
    again.assert_code(0);
    (yaml, imported.stderr, plan)
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn the_seeds_unit_round_trips_with_its_secrets_kept_out() {
    let unit = "t-import-seeds.service";
    let text = format!(
        "[Unit]\nDescription=SGLang test (hand-written)\nAfter=network-online.target\nWants=network-online.target\n\n[Service]\nType=simple\n{}\nEnvironment=\"NCCL_P2P_DISABLE=1\" HF_TOKEN=hf_import_secret_token\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /models/test --served-model-name test-model --host 127.0.0.1 --port 37201 --tp-size 2 --context-length 8192 --mem-fraction-static 0.85 --enable-metrics --api-key sk-import-secret-key\nUser=root\nRestart=on-failure\nRestartSec=10\nLimitNOFILE=1048576\nTimeoutStartSec=30min\n\n[Install]\nWantedBy=multi-user.target\n",
        stand_in(40)
    );
    start(unit, &[(format!("{UNIT_DIR}/{unit}"), text)]);
    let (yaml, stderr, _) = round_trip_moving(
        unit,
        &[
            ("HF_TOKEN", "hf_import_secret_token"),
            ("SGLANG_API_KEY", "sk-import-secret-key"),
        ],
        &["HF_TOKEN"],
    );
    assert_has(&yaml, "HF_TOKEN: { from_env: HF_TOKEN }");
    assert_has(&yaml, "api-key: { from_env: SGLANG_API_KEY }");
    assert_has(&yaml, "    tp-size: 2\n");
    assert_has(&yaml, "  LimitNOFILE: 1048576\n");
    assert_has(&stderr, "export HF_TOKEN");
    assert_has(&stderr, "export SGLANG_API_KEY");

    // Without the secrets exported, the manifest is refused before any host is contacted.
    let run = Reconcile::new().manifest("imported.yaml", &yaml);
    let refused = run.run_args(&["plan", "manifests/imported.yaml"]);
    assert_eq!(refused.code, 1);
    assert!(
        refused
            .stderr
            .contains("env.HF_TOKEN: `HF_TOKEN` is not set in reconcile's environment"),
        "{}",
        refused.stderr
    );
    stop(unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn quoted_values_and_percent_signs_round_trip() {
    let unit = "t-import-quoted.service";
    let text = format!(
        "[Unit]\nDescription=Quoted at 100%% \"really\"\n\n[Service]\nType=simple\n{}\nEnvironment='GREETING=hello  world' \"RATIO=50%%\" PLAIN=x\\x41y\nExecStart=/usr/bin/python3 -m sglang.launch_server \\\n\t--model-path \"/models/test\" \\\n\t--served-model-name 'test model 100%%' \\\n\t--tp-size=2 \\\n\t--api-key \"$$NOT_A_VAR\" \\\n\t--port 37202\n",
        stand_in(42)
    );
    start(unit, &[(format!("{UNIT_DIR}/{unit}"), text)]);
    let (yaml, _, _) = round_trip(unit, &[("SGLANG_API_KEY", "$NOT_A_VAR")]);
    assert_has(&yaml, "served_model_name: \"test model 100%\"");
    assert!(
        yaml.contains("RATIO: \"50%\"") && yaml.contains("GREETING: \"hello  world\""),
        "{yaml}"
    );
    assert_has(&yaml, "  After: \"\"");
    stop(unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_drop_in_is_folded_in_and_moved_aside() {
    let unit = "t-import-dropin.service";
    let text = format!(
        "[Unit]\nDescription=with a drop-in\nAfter=network-online.target\nWants=network-online.target\n\n[Service]\nType=simple\n{}\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /models/test --port 37203 --tp-size 2\n\n[Install]\nWantedBy=multi-user.target\n",
        stand_in(44)
    );
    let dropin = "[Service]\nExecStart=\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /models/test --port 37203 --tp-size 2 --context-length 4096\nEnvironment=EXTRA=1\nNice=5\n";
    start(
        unit,
        &[
            (format!("{UNIT_DIR}/{unit}"), text),
            (
                format!("{UNIT_DIR}/{unit}.d/override.conf"),
                dropin.to_string(),
            ),
        ],
    );
    let (yaml, _, plan) = round_trip(unit, &[]);
    let dropin_path = format!("{UNIT_DIR}/{unit}.d/override.conf");
    assert_has(&yaml, "    context-length: 4096\n");
    assert_has(&yaml, &format!("  EXTRA: \"1\"  # from {dropin_path}:4\n"));
    assert_has(&yaml, "  dropins: replace\n");
    assert!(
        plan.to_string().contains(&dropin_path),
        "the plan names the drop-in: {plan:#}"
    );
    let left = lab().sh(
        IMPORT,
        &format!("ls {UNIT_DIR}/{unit}.d/ 2>/dev/null | wc -l"),
    );
    assert_eq!(left.trim(), "0", "the drop-in was moved aside");
    stop(unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn an_environment_file_is_carried_as_is() {
    let unit = "t-import-envfile.service";
    let text = format!(
        "[Unit]\nDescription=with an EnvironmentFile\nAfter=network-online.target\nWants=network-online.target\n\n[Service]\nType=simple\n{}\nEnvironmentFile=-/etc/sglang/t-import-envfile.env\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /models/test --port 37204 --tp-size 2\n\n[Install]\nWantedBy=multi-user.target\n",
        stand_in(46)
    );
    start(
        unit,
        &[
            (
                "/etc/sglang/t-import-envfile.env".into(),
                "HF_TOKEN=hf_in_the_env_file\n".into(),
            ),
            (format!("{UNIT_DIR}/{unit}"), text),
        ],
    );
    let (yaml, _, _) = round_trip(unit, &[]);
    assert_has(
        &yaml,
        "  EnvironmentFile: \"-/etc/sglang/t-import-envfile.env\"\n",
    );
    assert!(!yaml.contains("hf_in_the_env_file"), "{yaml}");
    stop(unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn list_flags_round_trip_as_lists() {
    let unit = "t-import-lists.service";
    let text = format!(
        "[Unit]\nDescription=list flags\nAfter=network-online.target\nWants=network-online.target\n\n[Service]\nType=simple\n{}\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /models/test --port 37205 --tp-size 2 --cuda-graph-bs-decode 1 2 4 8 --bucket-time-to-first-token 0.1 0.5 2 --enable-metrics\n\n[Install]\nWantedBy=multi-user.target\n",
        stand_in(48)
    );
    start(unit, &[(format!("{UNIT_DIR}/{unit}"), text)]);
    let (yaml, _, _) = round_trip(unit, &[]);
    assert_has(&yaml, "    cuda-graph-bs-decode: [1, 2, 4, 8]\n");
    assert_has(&yaml, "    bucket-time-to-first-token: [0.1, 0.5, 2]\n");
    stop(unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn an_inexpressible_unit_is_refused_with_its_file_and_line() {
    let unit = "t-import-refused.service";
    let text = format!(
        "[Unit]\nDescription=refused\n\n[Service]\nType=simple\n{}\nEnvironment=TP=2\nExecStart=/usr/bin/python3 -m sglang.launch_server --model-path /models/test --port 37206 --tp-size ${{TP}}\n",
        stand_in(50)
    );
    start(unit, &[(format!("{UNIT_DIR}/{unit}"), text)]);
    let run = Reconcile::new();
    let out = run.dir().join("imported.yaml");
    let refused = run.run_args(&["import", IMPORT, unit, "-o", out.to_str().unwrap()]);
    refused.assert_code(1);
    assert_has(
        &refused.stderr,
        &format!("error: {UNIT_DIR}/{unit}:8: `${{TP}}` in ExecStart is expanded by systemd"),
    );
    assert!(!out.exists(), "nothing is written");
    let missing = run.run_args(&["import", IMPORT, "t-import-nothing"]);
    assert_eq!(missing.code, 1);
    assert!(
        missing
            .stderr
            .contains("rl25 has no unit t-import-nothing.service"),
        "{}",
        missing.stderr
    );
    stop(unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_command_line_sglang_reads_the_same_way_restarts_nothing() {
    let unit = "t-import-same.service";
    let m = crate::apply::service_on(IMPORT, "t-import-same", 37207)
        .flag("tp-size", 2)
        .flag("mem-fraction-static", 0.8);
    let run = Reconcile::new().manifest("a.yaml", &m);
    // The unit as an operator wrote it: `--tp`, argparse's unique prefix of `--tp-size`, and the
    // fraction with a trailing zero. SGLang reads both as the manifest says.
    let rendered = run.rendered(IMPORT);
    let written = rendered.replace("\t--tp-size 2 ", "\t--tp 2 ").replace(
        "\t--mem-fraction-static 0.8 ",
        "\t--mem-fraction-static 0.80 ",
    );
    assert_eq!(
        (
            written.matches("\t--tp 2 ").count(),
            written.matches(" 0.80 ").count()
        ),
        (1, 1),
        "{rendered}"
    );
    start(unit, &[(format!("{UNIT_DIR}/{unit}"), written)]);
    lab().sh(IMPORT, &format!("systemctl enable --quiet {unit}"));
    let (argv, invocation) = running(unit);
    assert!(argv.iter().any(|a| a == "--tp"), "{argv:?}");
    // The plan shows the text that changes, and restarts nothing.
    let plan = run.run_args(&["plan", "--format", "json"]);
    let planned = &plan.json()["units"][0];
    assert_eq!(planned["verdict"], "reload_only", "{planned:#}");
    let diff = planned["diff"].as_str().unwrap();
    assert!(
        diff.contains("-\t--tp 2 ") && diff.contains("+\t--tp-size 2 "),
        "{diff}"
    );
    // Applied: the manifest's spelling on disk, the same server running.
    let applied = run.run_args(&["apply", "--format", "json"]);
    applied.assert_code(0);
    assert_eq!(applied.json()["units"][0]["outcome"], "reloaded");
    assert_eq!(running(unit), (argv, invocation));
    assert_eq!(
        lab().sh(IMPORT, &format!("cat {UNIT_DIR}/{unit}")),
        rendered
    );
    stop(unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn an_operators_aliases_and_old_spellings_are_adopted_restarting_nothing() {
    let unit = "t-import-operator.service";
    // As operators publish them: `--model` and `--tp` for `--model-path` and `--tp-size`, a
    // fraction with a trailing zero, the start limits in `[Service]`, no Description.
    let text = format!(
        "[Unit]\nAfter=network.target\n\n[Service]\nStartLimitInterval=60\nStartLimitBurst=3\n{}\nExecStart=/usr/bin/python3 -m sglang.launch_server --model /models/test --tp 2 --mem-fraction-static 0.80 --port 37208\nRestart=always\n",
        stand_in(54)
    );
    start(unit, &[(format!("{UNIT_DIR}/{unit}"), text)]);
    let (yaml, stderr, plan) = round_trip(unit, &[]);
    for written in [
        "  model_path: /models/test\n",
        "    tp-size: 2\n",
        "    mem-fraction-static: \"0.80\"\n",
        "  StartLimitBurst: 3\n",
        "  StartLimitIntervalSec: 60\n",
    ] {
        assert!(yaml.contains(written), "no `{written}` in\n{yaml}");
    }
    for note in [
        "--model is SGLang 0.5.23's --model-path",
        "--tp is SGLang 0.5.23's --tp-size",
        "StartLimitBurst= in [Service] is systemd's old spelling",
    ] {
        assert!(stderr.contains(note), "no `{note}` in {stderr}");
    }
    let diff = plan["diff"].as_str().unwrap();
    let changed = |sign: char, text: &str| {
        diff.lines()
            .any(|l| l.starts_with(sign) && l.contains(text))
    };
    assert!(
        changed('-', " --tp 2 ") && changed('+', "--tp-size 2 "),
        "{diff}"
    );
    // systemd reads the limits where the manifest put them.
    let limits = lab().sh(
        IMPORT,
        &format!("systemctl show -p StartLimitBurst,StartLimitIntervalUSec {unit}"),
    );
    assert!(
        limits.contains("StartLimitBurst=3") && limits.contains("StartLimitIntervalUSec=1min"),
        "{limits}"
    );
    stop(unit);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_unit_that_runs_sglang_serve_is_adopted_with_its_console_script() {
    let unit = "t-import-serve.service";
    // SGLang 0.5.23's console script, which pip installed with the host's Python on its `#!` line.
    let text = format!(
        "[Unit]\nDescription=sglang serve\n\n[Service]\n{}\nExecStart=/usr/local/bin/sglang serve --model-path /models/test --tp-size 2 --port 37209\n",
        stand_in(56)
    );
    start(unit, &[(format!("{UNIT_DIR}/{unit}"), text)]);
    let (argv, _) = running(unit);
    assert_eq!(argv[1..3], ["/usr/local/bin/sglang", "serve"], "{argv:?}");
    let (yaml, _, plan) = round_trip(unit, &[]);
    for written in [
        "  python: /usr/bin/python3",
        "  console_script: /usr/local/bin/sglang",
    ] {
        assert!(yaml.contains(written), "no `{written}` in\n{yaml}");
    }
    // Applied, reconcile's own unit runs the console script too.
    let managed = lab().sh(IMPORT, &format!("cat {UNIT_DIR}/{unit}"));
    assert_has(&managed, "\nExecStart=/usr/local/bin/sglang serve ");
    assert_eq!(plan["verdict"], "reload_only", "{plan:#}");
    stop(unit);
}
