//! `reconcile --dry-run` against real hosts.

use crate::lab::{
    assert_has, install_rendered, lab, manifest, round_trips, run_on, Manifest, Reconcile, BAD_KEY,
    COUNTED, SHARED, UNREACHABLE,
};

/// Installs what `run` renders for `host` as the host's unit, and has systemd load it.
/// SSH logins the host's sshd has accepted so far; each count is itself one login. journald
/// takes sshd's lines in when it gets to them, which on a loaded machine can be after the count's
/// own command ran: the count waits for its own login's line (logged by this session's sshd, the
/// shell's parent, from the port `SSH_CLIENT` names). sshd logs every login through the one syslog
/// socket, which journald reads in order, so once that line is in, every earlier login's is too.
/// 30 s bounds a journald that never catches up.
fn logins() -> usize {
    let script = "p=${SSH_CLIENT#* }; p=${p%% *}; \
                  for i in $(seq 300); do \
                    journalctl -u ssh _PID=$PPID --no-pager -o cat | grep -q \"^Accepted publickey for .* port $p ssh2\" && \
                      exec sh -c \"journalctl -u ssh --no-pager -o cat | grep -c '^Accepted publickey'\"; \
                    sleep 0.1; \
                  done; echo \"this login (port $p) never showed in sshd's journal\" >&2; exit 1";
    lab().sh(COUNTED, script).trim().parse().unwrap()
}

fn changed_lines(diff: &str) -> Vec<&str> {
    diff.lines()
        .filter(|l| {
            (l.starts_with('+') || l.starts_with('-'))
                && !l.starts_with("+++")
                && !l.starts_with("---")
        })
        .collect()
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_host_without_the_unit_gets_it_installed() {
    let run = Reconcile::new()
        .manifest("a.yaml", manifest("t-missing", &[SHARED]))
        .args(&["--dry-run"]);
    let ran = run.run();
    ran.assert_code(2);
    assert_has(
        &ran.stdout,
        "rl1 t-missing.service: new unit (install, enable, start)",
    );
    assert_has(&ran.stdout, "on the host now: not installed");
    assert_has(&ran.stdout, "--- /dev/null");
    assert_has(&ran.stdout, "+\t--tp-size 2 \\");
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn an_identical_unit_means_nothing_to_do() {
    let run = Reconcile::new()
        .manifest("a.yaml", manifest("t-same", &[SHARED]))
        .args(&["plan", "--format", "json"]);
    install_rendered(&run, SHARED, "t-same.service", false);
    let ran = run.run();
    ran.assert_code(0);
    let json = ran.json();
    assert_eq!(json["format_version"], 1);
    let unit = &json["units"][0];
    assert_eq!(unit["verdict"], "no_change");
    assert_eq!(unit["diff"], "");
    assert_eq!(unit["state"]["load_state"], "loaded");
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn two_changed_flags_show_as_two_lines_and_need_a_restart() {
    // Four visible GPUs in both, so tp-size 4 passes preflight and only the flags differ.
    let four_gpus = manifest("t-flags", &[SHARED]).env("CUDA_VISIBLE_DEVICES", "0,1,2,3");
    let before =
        Reconcile::new().manifest("a.yaml", four_gpus.clone().flag("mem-fraction-static", 0.8));
    install_rendered(&before, SHARED, "t-flags.service", false);
    let after = four_gpus
        .flag("mem-fraction-static", 0.9)
        .flag("tp-size", 4);
    let ran = run_on(&after, &["plan", "--format", "json"]);
    ran.assert_code(2);
    let unit = &ran.json()["units"][0];
    assert_eq!(unit["verdict"], "restart");
    assert_eq!(
        changed_lines(unit["diff"].as_str().unwrap()),
        [
            "-\t--mem-fraction-static 0.8 \\",
            "-\t--tp-size 2 \\",
            "+\t--mem-fraction-static 0.9 \\",
            "+\t--tp-size 4 \\"
        ]
    );
    let flags: Vec<(String, String, String)> = unit["summary"]["flags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            (
                d["name"].as_str().unwrap().into(),
                d["old"].as_str().unwrap().into(),
                d["new"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(
        flags,
        [
            ("mem-fraction-static".into(), "0.8".into(), "0.9".into()),
            ("tp-size".into(), "2".into(), "4".into())
        ]
    );
    assert!(unit["summary"]["env"].as_array().unwrap().is_empty());
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_new_description_only_needs_a_reload() {
    let before = Reconcile::new().manifest("a.yaml", manifest("t-desc", &[SHARED]));
    install_rendered(&before, SHARED, "t-desc.service", false);
    let after = manifest("t-desc", &[SHARED]).description("renamed");
    let ran = run_on(&after, &["--dry-run"]);
    ran.assert_code(2);
    assert_has(
        &ran.stdout,
        "t-desc.service: reload only (daemon-reload, no restart)",
    );
    assert_has(
        &ran.stdout,
        "~ Unit.Description test service t-desc -> renamed",
    );
    assert_eq!(
        changed_lines(&ran.stdout.replace("    ", "")),
        ["-Description=test service t-desc", "+Description=renamed"]
    );
}

/// Five hosts of the fleet tests' (fleet.rs), only read here: planning writes nothing on a host.
const FIVE: [&str; 5] = ["rl9", "rl5", "rl7", "rl6", "rl8"];

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn the_same_new_unit_on_five_hosts_is_shown_once_in_text_and_markdown() {
    let text = manifest("t-group", &FIVE);
    let plan = |format: &str| {
        let ran = run_on(&text, &["plan", "--format", format]);
        ran.assert_code(2);
        ran
    };
    let shown = plan("text").stdout;
    assert_has(
        &shown,
        "t-group.service: new unit (install, enable, start)\n  same change on 5 hosts: rl5..rl9\n",
    );
    assert_eq!(shown.matches("--- /dev/null").count(), 1, "{shown}");
    assert_has(&shown, "Plan: 5 to install,");

    let markdown = plan("markdown").stdout;
    assert_has(
        &markdown,
        "| rl5..rl9 (5 hosts) | t-group.service | **install** |",
    );
    assert_eq!(markdown.matches("<details>").count(), 1, "{markdown}");

    let json = plan("json").json();
    assert_eq!(json["format_version"], 1);
    assert_eq!(
        json["units"].as_array().unwrap().len(),
        5,
        "one entry per unit"
    );
    assert_eq!(json["groups"].as_array().unwrap().len(), 1);
    assert_eq!(json["groups"][0]["hosts_shown"], "rl5..rl9");
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_host_whose_key_does_not_match_is_refused_and_the_others_are_planned() {
    let text = manifest("t-badkey", &[BAD_KEY, SHARED]);
    let ran = run_on(&text, &["--dry-run"]);
    ran.assert_code(1);
    let bad = ran
        .stdout
        .lines()
        .find(|l| l.starts_with(BAD_KEY))
        .expect("a line for the bad host");
    assert_has(bad, "error: cannot connect to rl-badkey");
    assert_has(bad, "Host key verification failed");
    assert_has(bad, "does not match known_hosts");
    assert_has(&ran.stdout, "rl1 t-badkey.service: new unit");
    assert!(ran
        .stdout
        .contains("1 to install, 0 to restart, 0 reload only, 0 unchanged, 1 failed to plan"));
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn an_unreachable_host_is_an_error_for_that_host_only() {
    let text = manifest("t-unreach", &[UNREACHABLE, SHARED]);
    let ran = run_on(&text, &["plan", "--format", "json"]);
    ran.assert_code(1);
    let json = ran.json();
    let units = json["units"].as_array().unwrap();
    assert_eq!(units.len(), 2);
    let failed = units.iter().find(|u| u["host"] == UNREACHABLE).unwrap();
    assert_eq!(failed["outcome"], "error");
    let error = failed["error"].as_str().unwrap();
    assert_has(error, "cannot connect to rl-unreachable");
    assert!(
        error.contains("No route to host") || error.contains("timed out"),
        "{error}"
    );
    let planned = units.iter().find(|u| u["host"] == SHARED).unwrap();
    assert_eq!(planned["verdict"], "install");
}

/// An ssh stopped from outside before it could say why (killed by a signal: its log is empty)
/// says nothing about the host. Its `ProxyCommand` kills it here, on the first connect only or
/// every time: the first is asked once more and gives ssh's reason; the second is named as such.
#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn an_ssh_killed_before_it_said_why_is_asked_once_more() {
    for (every_time, said) in [
        (false, "Connection closed"),
        (true, "ssh ended twice without saying why"),
    ] {
        let run = Reconcile::new().manifest("a.yaml", manifest("t-silent", &["rl-silent", SHARED]));
        let marker = run.dir().join("killed-once");
        // Asked again, the proxy reads ssh's banner before it ends: ssh then reads the end of the
        // connection ("Connection closed"); ending at once raced ssh's write of its banner, which
        // a loaded machine lost now and then ("Broken pipe").
        let kill = if every_time {
            "kill -KILL $PPID".to_string()
        } else {
            format!(
                "[ -e {m} ] || {{ : > {m}; kill -KILL $PPID; }}; head -c 1 > /dev/null; exit 1",
                m = marker.display()
            )
        };
        let run = run.ssh_config(&format!(
            // An Include inside a Host block would apply only to that host: it comes first.
            "Include {}\n\nHost rl-silent\n  HostName 127.0.0.1\n  BatchMode yes\n  \
             ProxyCommand /bin/sh -c '{kill}'\n",
            lab().ssh_config().display()
        ));
        let run = run.args(&["plan", "--format", "json"]);
        let ran = run.run();
        ran.assert_code(1);
        let json = ran.json();
        let units = json["units"].as_array().unwrap();
        let silent = units.iter().find(|u| u["host"] == "rl-silent").unwrap();
        let error = silent["error"].as_str().unwrap();
        assert_has(error, "cannot connect to rl-silent");
        assert!(error.contains(said), "every time: {every_time}: {error}");
        if !every_time {
            assert!(marker.exists(), "the first ssh was killed");
        }
        let planned = units.iter().find(|u| u["host"] == SHARED).unwrap();
        assert_eq!(planned["verdict"], "install", "{planned}");
    }
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn secret_env_values_are_redacted_in_every_format() {
    const CANARY: &str = "hf_canary_3c9e1f";
    let secret = |value: &str| {
        manifest("t-secret", &[SHARED])
            .flag("api-key", "sk-canary-flag-77")
            .env("HF_TOKEN", value)
    };
    let before = Reconcile::new().manifest("a.yaml", secret("hf_old_value_000"));
    lab().put(
        SHARED,
        "/etc/systemd/system/t-secret.service",
        &before
            .rendered(SHARED)
            .replace("<redacted>", "hf_old_value_000"),
    );
    for format in ["text", "markdown", "json"] {
        let ran = Reconcile::new()
            .manifest("a.yaml", secret(CANARY))
            .args(&["plan", "-vv", "--format", format])
            .run();
        ran.assert_code(2);
        for (what, output) in [("stdout", &ran.stdout), ("stderr", &ran.stderr)] {
            for leaked in [CANARY, "hf_old_value_000", "sk-canary-flag-77"] {
                assert!(
                    !output.contains(leaked),
                    "{format} {what} shows {leaked}:\n{output}"
                );
            }
        }
        assert!(
            ran.stdout.contains("<redacted, changed>"),
            "{format}: {}",
            ran.stdout
        );
    }
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_bad_manifest_is_reported_whole_and_touches_no_host() {
    let _alone = lab().exclusive(COUNTED);
    let before = logins();
    let bad = manifest("t-bad", &["rl2"]).flag("port", 1).port(70000);
    let also_bad = manifest("t-bad2", &["rl2"])
        .without_env("NCCL_P2P_DISABLE")
        .env("NCCL-P2P", "1");
    let ran = Reconcile::new()
        .manifest("a.yaml", &bad)
        .manifest("b.yaml", &also_bad)
        .args(&["--dry-run"])
        .run();
    ran.assert_code(1);
    assert_has(
        &ran.stderr,
        "manifests/a.yaml:10:3: sglang.port: port must be between 1 and 65535",
    );
    assert_has(
        &ran.stderr,
        "manifests/a.yaml:14:5: sglang.flags.port: --port is set through `sglang.port`",
    );
    assert_has(
        &ran.stderr,
        "manifests/b.yaml:16:3: env.NCCL-P2P: `NCCL-P2P` is not an environment variable name",
    );
    assert_has(&ran.stderr, "3 errors in manifests; no host was contacted");
    assert!(ran.stdout.is_empty());
    assert_eq!(
        logins() - before,
        1,
        "a host was contacted (the one login is this count's own)"
    );
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn one_ssh_connection_per_host_per_run() {
    let _alone = lab().exclusive(COUNTED);
    let before = logins();
    // Three services on one host: each its own port and GPUs, so preflight passes.
    let other = |name: &str, port: u16, gpus: &str| {
        manifest(name, &[COUNTED])
            .port(port)
            .env("CUDA_VISIBLE_DEVICES", gpus)
    };
    let run = Reconcile::new()
        .manifest("a.yaml", manifest("t-conn-a", &[COUNTED]))
        .manifest("b.yaml", other("t-conn-b", 30001, "2,3"))
        .manifest("c.yaml", other("t-conn-c", 30002, "4,5"))
        .args(&["--dry-run"]);
    let ran = run.run();
    ran.assert_code(2);
    assert_has(&ran.stdout, "3 to install");
    // the counting itself logs in once
    assert_eq!(
        logins() - before,
        2,
        "one login for reconcile (three units), one for this count"
    );
}

/// One of three services on the shared host, with a port and GPUs of its own.
fn round_trip_service(i: u16) -> Manifest {
    manifest(&format!("t-round-{i}"), &[SHARED])
        .port(30410 + i)
        .env("CUDA_VISIBLE_DEVICES", format!("{},{}", 2 * i, 2 * i + 1))
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_plan_reads_a_host_of_three_units_in_one_round_trip() {
    // b.yaml, as in the plan below: the rendered unit's header names its manifest file.
    let one = Reconcile::new().manifest("b.yaml", round_trip_service(2));
    install_rendered(&one, SHARED, "t-round-2.service", false);
    let run = Reconcile::new()
        .manifest("a.yaml", round_trip_service(1))
        .manifest("b.yaml", round_trip_service(2))
        .manifest("c.yaml", round_trip_service(3))
        // The survey's one round trip; the deep check of the two new units is a round trip of
        // its own (docs/benchmarks.md: "Round trips").
        .args(&["plan", "--format", "json", "--trace-remote", "--no-deep"]);
    let ran = run.run();
    lab().sh(
        SHARED,
        "rm -f /etc/systemd/system/t-round-2.service; systemctl daemon-reload",
    );
    ran.assert_code(2);
    let json = ran.json();
    let verdicts: Vec<(String, String)> = json["units"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| {
            (
                u["unit"].as_str().unwrap().to_string(),
                u["verdict"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(
        verdicts.contains(&("t-round-2.service".into(), "no_change".into())),
        "{verdicts:?}"
    );
    assert!(
        verdicts.contains(&("t-round-1.service".into(), "install".into())),
        "{verdicts:?}"
    );
    let traced: Vec<&str> = ran
        .stderr
        .lines()
        .filter(|l| l.starts_with("trace-remote host=rl1 "))
        .collect();
    assert_eq!(round_trips(&ran.stderr, SHARED), 1, "{traced:#?}");
    assert_eq!(traced.len(), 2, "a connect and one command: {traced:#?}");
    assert!(traced[1].contains("command=\"survey\" "), "{traced:#?}");
}
