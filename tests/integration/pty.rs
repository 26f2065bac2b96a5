//! `reconcile apply` on a real terminal (a pseudo-terminal from util-linux `script`): the live
//! line shows each unit's stage, elapsed time and memory with its sparkline; `NO_COLOR`, a dumb
//! terminal and a pipe get plain lines. On the pty host: ports 37031-37039, GPUs 0-9.

mod harness;

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::lab::{lab, stand_in, Manifest, Reconcile, PTY};
use harness::{live_line, not_plain, run_in_pty, shown_lines, Setup};

/// A run on the terminal gets this long before it counts as hung: the unit loads in 3 s and is
/// verified over seconds-long windows, SSH gives up connecting after 10 s, so only a hang (a
/// display that never ends, a prompt) comes near it, even on a loaded 2-core runner.
const WITHIN: Duration = Duration::from_secs(120);

/// A service on the pty host that loads in 3 s on GPUs `gpu` and `gpu + 1`, sampled every 500 ms:
/// enough samples for a sparkline, in the crash window and after it.
fn service(name: &str, port: u16, gpu: u32) -> Manifest {
    stand_in(name, &[PTY], port, format!("{gpu},{}", gpu + 1))
        .env("FAKE_SGLANG_GPU_COUNT", "64")
        .env("FAKE_SGLANG_LOAD_SECONDS", "3")
        .verify_all(&[
            ("crash_window", "2s"),
            ("sample_interval", "500ms"),
            ("stall_timeout", "4s"),
            ("load_deadline", "30s"),
        ])
}

/// `reconcile apply` of `service`'s fresh unit on a terminal set up with `env` and without
/// `remove`; the unit is removed before and after.
fn apply_on_terminal(
    name: &str,
    port: u16,
    gpu: u32,
    env: &[(&str, &str)],
    remove: &[&str],
) -> String {
    let unit = format!("{name}.service");
    lab().remove_unit(PTY, &unit);
    let run = Reconcile::new().manifest("a.yaml", service(name, port, gpu));
    let config = lab().ssh_config();
    let argv = [
        env!("CARGO_BIN_EXE_reconcile"),
        "apply",
        "--ssh-config",
        config.to_str().expect("a UTF-8 path"),
    ];
    let setup = Setup {
        dir: run.dir(),
        env,
        remove,
        within: WITHIN,
    };
    let term = run_in_pty(&argv, &setup);
    lab().remove_unit(PTY, &unit);
    assert_eq!(term.code, 0, "apply on a terminal:\n{}", term.output);
    term.output
}

/// The stage lines verification prints for `label` (`✓ LABEL: STAGE passed: ...`).
fn passed_stages(lines: &[String], label: &str) -> Vec<String> {
    let prefix = format!("✓ {label}: ");
    lines
        .iter()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter_map(|l| l.split_once(" passed"))
        .map(|(stage, _)| stage.to_string())
        .collect()
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_terminal_shows_the_live_line_with_stage_elapsed_time_and_memory() {
    let output = apply_on_terminal(
        "t-pty-live",
        37031,
        0,
        &[("TERM", "xterm-256color")],
        &["NO_COLOR"],
    );
    let label = format!("{PTY} t-pty-live.service");
    assert!(
        not_plain(&output).is_some(),
        "no redrawn line on a terminal:\n{output}"
    );
    let lines = shown_lines(&output);
    let live: Vec<_> = lines.iter().filter_map(|l| live_line(l, &label)).collect();
    assert!(
        !live.is_empty(),
        "no live line for {label}:\n{}",
        lines.join("\n")
    );
    let stages: Vec<&str> = live.iter().map(|l| l.stage.as_str()).collect();
    assert!(stages.contains(&"crash window"), "stages shown: {stages:?}");
    assert!(
        stages.iter().any(|s| *s != "crash window"),
        "the live line never left the crash window: {stages:?}"
    );
    let seconds: Vec<u64> = live.iter().map(|l| l.seconds).collect();
    assert!(
        seconds.iter().max() > seconds.iter().min(),
        "the elapsed time never moved: {seconds:?}"
    );
    assert!(
        live.iter().any(|l| l.memory.is_some()),
        "no memory on any live line: {live:?}"
    );
    let longest = live.iter().map(|l| l.sparkline.chars().count()).max();
    assert!(longest >= Some(2), "the sparkline never grew: {live:?}");
    assert!(
        passed_stages(&lines, &label).contains(&"crash window".to_string()),
        "no stage line above the live line:\n{}",
        lines.join("\n")
    );
}

/// On a terminal with `env`, apply writes plain lines: its stage lines, no escape code, no
/// redrawn line.
fn plain_on_terminal(name: &str, port: u16, gpu: u32, env: &[(&str, &str)], remove: &[&str]) {
    let output = apply_on_terminal(name, port, gpu, env, remove);
    if let Some(why) = not_plain(&output) {
        panic!("{env:?} on a terminal: {why} in\n{output:?}");
    }
    let label = format!("{PTY} {name}.service");
    let lines = shown_lines(&output);
    assert!(
        passed_stages(&lines, &label).contains(&"crash window".to_string()),
        "no stage lines for {label}:\n{output}"
    );
    assert!(
        !lines.iter().any(|l| live_line(l, &label).is_some()),
        "a live line with {env:?}:\n{output}"
    );
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn no_color_on_a_terminal_gets_plain_lines() {
    plain_on_terminal(
        "t-pty-nocolor",
        37032,
        2,
        &[("TERM", "xterm-256color"), ("NO_COLOR", "1")],
        &[],
    );
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_dumb_terminal_gets_plain_lines() {
    plain_on_terminal("t-pty-dumb", 37033, 4, &[("TERM", "dumb")], &["NO_COLOR"]);
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn a_pipe_gets_plain_lines() {
    let (name, unit) = ("t-pty-pipe", "t-pty-pipe.service");
    lab().remove_unit(PTY, unit);
    let run = Reconcile::new().manifest("a.yaml", service(name, 37034, 6));
    // Not the harness's runner, which sets NO_COLOR: here only the pipe may make it plain.
    let out = Command::new(env!("CARGO_BIN_EXE_reconcile"))
        .args(["apply", "--ssh-config"])
        .arg(lab().ssh_config())
        .current_dir(run.dir())
        .env_remove("NO_COLOR")
        .env("TERM", "xterm-256color")
        .stdin(Stdio::null())
        .output()
        .expect("reconcile runs");
    lab().remove_unit(PTY, unit);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
    for (what, text) in [("stdout", &stdout), ("stderr", &stderr)] {
        if let Some(why) = not_plain(text) {
            panic!("{what} through a pipe: {why} in\n{text:?}");
        }
    }
    let lines = shown_lines(&stderr);
    assert!(
        passed_stages(&lines, &format!("{PTY} {unit}")).contains(&"crash window".to_string()),
        "no stage lines on stderr:\n{stderr}"
    );
}

/// The harness itself, on a command that needs no test host: clap colours `--help` on a
/// terminal, and neither with NO_COLOR nor through a pipe.
#[test]
fn the_harness_sees_a_terminal_where_a_pipe_is_plain() {
    let dir = tempfile::tempdir().expect("temp dir");
    let argv = [env!("CARGO_BIN_EXE_reconcile"), "--help"];
    let on_terminal = |env: &[(&str, &str)], remove: &[&str]| {
        run_in_pty(
            &argv,
            &Setup {
                dir: dir.path(),
                env,
                remove,
                within: WITHIN,
            },
        )
    };
    let coloured = on_terminal(&[("TERM", "xterm-256color")], &["NO_COLOR"]);
    assert_eq!(coloured.code, 0, "{}", coloured.output);
    assert!(
        not_plain(&coloured.output).is_some_and(|why| why.starts_with("escape code")),
        "no colour on a terminal:\n{:?}",
        coloured.output
    );
    assert!(shown_lines(&coloured.output)
        .iter()
        .any(|l| l.starts_with("Usage: reconcile")));
    let no_color = on_terminal(&[("NO_COLOR", "1")], &[]);
    assert_eq!(not_plain(&no_color.output), None, "{:?}", no_color.output);
    assert!(
        no_color.output.contains("\r\n"),
        "not a terminal's line ends"
    );
    let piped = Command::new(argv[0])
        .arg("--help")
        .env_remove("NO_COLOR")
        .output()
        .expect("reconcile runs");
    let piped = String::from_utf8_lossy(&piped.stdout);
    assert_eq!(not_plain(&piped), None, "{piped:?}");
    assert_eq!(
        shown_lines(&piped),
        shown_lines(&no_color.output),
        "the same help, plain, either way"
    );
}
