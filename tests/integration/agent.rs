//! `reconcile agent`: pull mode, run on the test host itself against a git repository there, and
//! the example systemd service and timer driving it.

use std::process::{Command, Stdio};

use crate::builder::STAND_IN_VERIFY;
use crate::lab::{assert_has, assert_starts_with, lab, manifest, Manifest, Ran, AGENT};

const UNIT: &str = "t-agent.service";
const REPO: &str = "/root/agent-repo.git";
const WORK: &str = "/root/agent-work";
const BIN: &str = "/usr/local/bin/reconcile";
/// The repository URL the example service names; the test points it at the host's own repository.
const EXAMPLE_REPO: &str = "https://git.example.com/infra/llm-manifests.git";

/// The test service for host `local`: loads in one second, judged over a three-second window (the
/// settings of the apply tests).
fn service() -> Manifest {
    manifest("t-agent", &["local"])
        .port(33001)
        .env("FAKE_SGLANG_LOAD_SECONDS", "1")
        .verify_all(&STAND_IN_VERIFY)
}

/// A script run on the agent host, whatever its exit status.
fn on_host(script: &str) -> Ran {
    let out = Command::new("ssh")
        .arg("-F")
        .arg(lab().ssh_config())
        .arg(AGENT)
        .arg(script)
        .stdin(Stdio::null())
        .output()
        .expect("ssh runs");
    Ran::from(out)
}

/// One round of the agent on the host, as root would run it there.
fn round() -> Ran {
    let ran = on_host(&format!("{BIN} agent --once --repo {REPO}"));
    eprintln!(
        "agent round, exit {}:\n{}{}",
        ran.code, ran.stdout, ran.stderr
    );
    ran
}

/// A round that exits with `code` and whose report begins with `commit` (its short hash), then
/// `rest`.
fn round_on(commit: &str, code: i32, rest: &str) -> Ran {
    let ran = round();
    assert_eq!(ran.code, code);
    assert_starts_with(&ran.stdout, &format!("round {}{rest}", &commit[..12]));
    ran
}

/// Commits the manifests as they are in the work tree and pushes; returns the commit.
fn commit_and_push(message: &str) -> String {
    lab().sh(
        AGENT,
        &format!(
            "cd {WORK} && git add -A && git -c user.name='Test Author' -c user.email=author@example.com commit -q -m '{message}' && git push -q origin main && git rev-parse HEAD"
        ),
    )
    .trim()
    .to_string()
}

fn write_manifest(manifest: &Manifest) {
    lab().put(
        AGENT,
        &format!("{WORK}/manifests/t-agent.yaml"),
        &manifest.to_yaml(),
    );
}

fn invocation() -> String {
    lab()
        .sh(
            AGENT,
            &format!("systemctl show -p InvocationID --value {UNIT}"),
        )
        .trim()
        .to_string()
}

fn record() -> serde_json::Value {
    let text = lab().sh(
        AGENT,
        &format!("cat /var/lib/reconcile/{UNIT}/current.json"),
    );
    serde_json::from_str(&text).expect("the record is JSON")
}

fn unit_file() -> String {
    lab().sh(AGENT, &format!("cat /etc/systemd/system/{UNIT}"))
}

/// Removes what an earlier run of this test left on its host.
fn fresh() {
    lab().sh(
        AGENT,
        &format!(
            "systemctl disable --now reconcile-agent.timer reconcile-agent.service {UNIT} 2>/dev/null; \
             rm -rf /etc/systemd/system/{UNIT} /etc/systemd/system/reconcile-agent.* /var/lib/reconcile/{UNIT} \
                    /var/lib/reconcile/agent {REPO} {WORK}; \
             systemctl daemon-reload; systemctl reset-failed reconcile-agent.service {UNIT} 2>/dev/null; true"
        ),
    );
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn the_agent_pulls_applies_skips_no_ops_and_refuses_bad_commits() {
    let version = on_host("git --version");
    assert_eq!(
        version.code, 0,
        "the agent host needs git: {}",
        version.stderr
    );
    fresh();
    lab().install_reconcile(AGENT, BIN);
    lab().sh(
        AGENT,
        &format!(
            "git init -q --bare -b main {REPO} && git clone -q {REPO} {WORK} 2>/dev/null && mkdir -p {WORK}/manifests"
        ),
    );
    let text = service();
    write_manifest(&text);
    // Another host's service in the same repository: the agent leaves it alone.
    lab().put(
        AGENT,
        &format!("{WORK}/manifests/elsewhere.yaml"),
        &manifest("t-agent-elsewhere", &["rl1"]).to_yaml(),
    );
    let first = commit_and_push("t-agent");

    // (i) The first round installs, starts and verifies the unit, and records the commit.
    let ran = round_on(
        &first,
        0,
        &format!(" (Test Author <author@example.com>): local {UNIT} converged"),
    );
    assert!(!ran.stdout.contains("t-agent-elsewhere"), "{}", ran.stdout);
    assert_eq!(
        on_host("test -e /etc/systemd/system/t-agent-elsewhere.service").code,
        1,
        "another host's unit was installed here"
    );
    assert_eq!(
        lab()
            .sh(AGENT, &format!("systemctl is-active {UNIT}"))
            .trim(),
        "active"
    );
    let r = record();
    assert_eq!(r["git_commit"], first.as_str());
    assert_eq!(r["git_author"], "Test Author <author@example.com>");
    assert_eq!(r["outcome"], "converged");
    assert_eq!(r["manifest"], "manifests/t-agent.yaml");
    let started = invocation();

    // (ii) Nothing new: the round touches nothing.
    let ran = round();
    assert_eq!(ran.code, 0);
    assert_has(&ran.stdout, &format!("local {UNIT} unchanged"));
    assert_eq!(invocation(), started, "a no-op round restarted the server");

    // (iii) A changed flag is pulled and applied.
    write_manifest(&text.clone().flag("context-length", 4096));
    let second = commit_and_push("shorter context");
    let ran = round_on(&second, 0, "");
    assert_has(&ran.stdout, &format!("local {UNIT} converged"));
    let restarted = invocation();
    assert_ne!(
        restarted, started,
        "the changed flag did not restart the server"
    );
    assert!(unit_file().contains("--context-length 4096"));
    assert_eq!(record()["git_commit"], second.as_str());

    // (iv) A bad manifest: the error names file, line and field; the host is not touched.
    let bad = text.clone().flag("context-length", 4096).port("seventy");
    let line = bad
        .to_yaml()
        .lines()
        .position(|l| l.contains("port: seventy"))
        .expect("the port line")
        + 1;
    write_manifest(&bad);
    let third = commit_and_push("bad port");
    let before = unit_file();
    let ran = round_on(&third, 1, ": 1 error in manifests, nothing touched");
    assert!(
        ran.stdout
            .contains(&format!("manifests/t-agent.yaml:{line}:"))
            && ran.stdout.contains("sglang.port"),
        "{}",
        ran.stdout
    );
    assert_eq!(invocation(), restarted);
    assert_eq!(unit_file(), before);
    assert_eq!(record()["git_commit"], second.as_str());

    // (v) The example service and timer, pointed at this repository, run a round: a fix that
    // also renames the service reloads it.
    write_manifest(
        &text
            .clone()
            .flag("context-length", 4096)
            .description("pulled service t-agent"),
    );
    let fourth = commit_and_push("fixed, renamed");
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/systemd");
    for name in ["reconcile-agent.service", "reconcile-agent.timer"] {
        let example = std::fs::read_to_string(examples.join(name)).expect("the example exists");
        assert!(
            name.ends_with(".timer") || example.contains(EXAMPLE_REPO),
            "the example service no longer names {EXAMPLE_REPO}"
        );
        lab().put(
            AGENT,
            &format!("/etc/systemd/system/{name}"),
            &example.replace(EXAMPLE_REPO, REPO),
        );
    }
    lab().sh(AGENT, "systemctl daemon-reload");
    // The journal from here on: the service's lines are read after this cursor.
    let cursor = lab().cursor(AGENT);
    let ran_service = on_host("systemctl start reconcile-agent.service");
    let service = lab().sh(
        AGENT,
        "systemctl show -p Result -p ExecMainStatus reconcile-agent.service",
    );
    assert_eq!(ran_service.code, 0, "{}\n{service}", ran_service.stderr);
    assert!(
        service.contains("Result=success") && service.contains("ExecMainStatus=0"),
        "{service}"
    );
    // journald takes in a finished process's last lines when it gets to them: polled for (30 s
    // bounds a journald that never does), and a round that never said them fails there.
    lab().journal_after(
        AGENT,
        "reconcile-agent.service",
        &cursor,
        &[
            &format!("round {}", &fourth[..12]),
            &format!("local {UNIT} reloaded"),
        ],
        std::time::Duration::from_secs(30),
    );
    assert!(unit_file().contains("Description=pulled service"));
    assert_eq!(
        invocation(),
        restarted,
        "a description change restarted the server"
    );
    assert_eq!(record()["git_commit"], fourth.as_str());

    // The timer loads and is scheduled; stopped again so it fires no round after the test.
    lab().sh(AGENT, "systemctl start reconcile-agent.timer");
    let timer = lab().sh(
        AGENT,
        "systemctl show -p ActiveState -p Triggers reconcile-agent.timer",
    );
    assert!(
        timer.contains("ActiveState=active") && timer.contains("Triggers=reconcile-agent.service"),
        "{timer}"
    );
    lab().sh(
        AGENT,
        &format!("systemctl stop reconcile-agent.timer reconcile-agent.service; systemctl disable --now {UNIT}"),
    );
}
