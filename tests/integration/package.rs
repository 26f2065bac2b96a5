//! The Debian package (packaging/deb/build.sh) on a test host (`PACKAGE`), and the agent's metrics
//! read by the real node_exporter: the package is built from the binary under test, installed
//! with `dpkg -i`, its agent service runs one round from the installed files with
//! `--metrics-file` pointed at node_exporter's textfile collector, node_exporter (Debian's
//! `prometheus-node-exporter`, fetched with `apt-get download` and run on the host) serves the
//! series back, `promtool check metrics` (Debian's `prometheus`) passes on the file, and
//! `dpkg -r` leaves no unit behind. The unit is `t-pkg.service`, port 37701, GPUs 60-61.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::builder::STAND_IN_VERIFY;
use crate::lab::{assert_has, lab, manifest, stdout_of, PACKAGE};

const UNIT: &str = "t-pkg.service";
const REPO: &str = "/root/pkg-repo.git";
const WORK: &str = "/root/pkg-work";
const TEXTFILES: &str = "/var/lib/t-node-exporter";
const EXPORTER_PORT: u16 = 39100;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Builds the package from the binary under test; returns its path.
fn build(out: &Path) -> PathBuf {
    let built = stdout_of(
        Command::new("bash")
            .arg(root().join("packaging/deb/build.sh"))
            .env("BIN", env!("CARGO_BIN_EXE_reconcile"))
            .env("OUT", out),
        "build.sh",
    );
    let deb = PathBuf::from(built.trim());
    lint(&deb);
    deb
}

/// Debian's own check of the package: no error (`--fail-on error`; warnings are printed). CI
/// installs lintian; it refuses to run as root unless told it may.
fn lint(deb: &Path) {
    let ran = Command::new("lintian")
        .args(["--fail-on", "error", "--allow-root"])
        .arg(deb)
        .output()
        .expect("lintian runs (Debian: lintian; .ci/run installs it)");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&ran.stdout),
        String::from_utf8_lossy(&ran.stderr)
    );
    eprintln!("lintian {}:\n{said}", deb.display());
    assert!(ran.status.success(), "lintian found errors:\n{said}");
}

/// Debian's node_exporter binary, from its package (downloaded once, kept beside the lab's other
/// downloads).
fn node_exporter() -> PathBuf {
    let cache = PathBuf::from("/var/cache/reconcile-lab/debs");
    let bin = cache.join("root/usr/bin/prometheus-node-exporter");
    if bin.exists() {
        return bin;
    }
    std::fs::create_dir_all(&cache).unwrap();
    stdout_of(
        Command::new("apt-get")
            .args(["download", "-q", "prometheus-node-exporter"])
            .current_dir(&cache),
        "apt-get download prometheus-node-exporter",
    );
    let deb = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".deb"))
        .expect("the downloaded package");
    let x = Command::new("dpkg-deb")
        .arg("-x")
        .arg(&deb)
        .arg(cache.join("root"))
        .status()
        .unwrap();
    assert!(x.success() && bin.exists());
    bin
}

fn copy_to_host(from: &Path, to: &str) {
    let status = Command::new("scp")
        .arg("-F")
        .arg(lab().ssh_config())
        .arg("-q")
        .arg(from)
        .arg(format!("{PACKAGE}:{to}"))
        .status()
        .expect("scp runs");
    assert!(status.success(), "copying {} to {PACKAGE}", from.display());
}

/// What an earlier run left: the package, the unit, the repository, the exporter.
fn fresh() {
    lab().sh(
        PACKAGE,
        &format!(
            "systemctl stop t-node-exporter 2>/dev/null; systemctl reset-failed t-node-exporter 2>/dev/null; \
             dpkg -P reconcile >/dev/null 2>&1; systemctl disable --now {UNIT} 2>/dev/null; \
             rm -rf /etc/systemd/system/{UNIT} /var/lib/reconcile {REPO} {WORK} {TEXTFILES}; \
             systemctl daemon-reload; systemctl reset-failed reconcile-agent.service {UNIT} 2>/dev/null; true"
        ),
    );
}

#[test]
#[ignore = "lab test: needs the throwaway test hosts, run by `tests/run.sh`"]
fn the_package_installs_runs_an_agent_round_with_metrics_and_removes_cleanly() {
    fresh();
    let out = tempfile::tempdir().unwrap();
    let deb = build(out.path());
    copy_to_host(&deb, "/tmp/reconcile.deb");
    lab().sh(PACKAGE, "dpkg -i /tmp/reconcile.deb >/dev/null");
    let version = lab().sh(PACKAGE, "reconcile --version");
    assert_eq!(
        version.trim(),
        format!("reconcile {}", env!("CARGO_PKG_VERSION"))
    );
    // The man pages and completions are where man and the shells look.
    lab().sh(
        PACKAGE,
        "test -s /usr/share/man/man1/reconcile-apply.1.gz && test -s /usr/share/bash-completion/completions/reconcile \
         && test -s /usr/share/zsh/vendor-completions/_reconcile && test -s /usr/share/fish/vendor_completions.d/reconcile.fish",
    );

    // A repository for this host (`--as pkg`), and the installed agent configured to pull it.
    let text = manifest("t-pkg", &["pkg"])
        .port(37701)
        .env("CUDA_VISIBLE_DEVICES", "60,61")
        .env("FAKE_SGLANG_LOAD_SECONDS", "1")
        .verify_all(&STAND_IN_VERIFY);
    lab().sh(
        PACKAGE,
        &format!("git init -q --bare -b main {REPO} && git clone -q {REPO} {WORK} 2>/dev/null && mkdir -p {WORK}/manifests {TEXTFILES}"),
    );
    lab().put(
        PACKAGE,
        &format!("{WORK}/manifests/t-pkg.yaml"),
        &text.to_yaml(),
    );
    lab().sh(
        PACKAGE,
        &format!("cd {WORK} && git add -A && git -c user.name=T -c user.email=t@example.com commit -q -m one && git push -q origin main"),
    );
    lab().put(
        PACKAGE,
        "/etc/default/reconcile-agent",
        &format!("RECONCILE_AGENT_ARGS=\"--repo {REPO} --as pkg --metrics-file {TEXTFILES}/reconcile.prom\"\n"),
    );
    // One round, from the installed service (a oneshot: `start` returns when the round ends).
    lab().sh(PACKAGE, "systemctl start reconcile-agent.service");
    assert_eq!(
        lab()
            .sh(PACKAGE, &format!("systemctl is-active {UNIT}"))
            .trim(),
        "active",
        "the installed agent applied the unit"
    );
    let metrics = lab().sh(PACKAGE, &format!("cat {TEXTFILES}/reconcile.prom"));
    assert_has(
        &metrics,
        "reconcile_unit_in_sync{service=\"t-pkg\",unit=\"t-pkg.service\",host=\"pkg\"} 1\n",
    );
    assert_has(&metrics, "reconcile_last_outcome{service=\"t-pkg\",unit=\"t-pkg.service\",host=\"pkg\",outcome=\"converged\"} 1\n");
    // No temporary file is left beside it for the collector to trip over.
    assert_eq!(
        lab().sh(PACKAGE, &format!("ls -A {TEXTFILES}")).trim(),
        "reconcile.prom"
    );

    // promtool's lint of the exposition.
    let mut check = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .output_with(metrics.as_bytes());
    assert!(
        check.0,
        "promtool check metrics: {}{}",
        check.1,
        std::mem::take(&mut check.2)
    );

    // The real node_exporter reads the file through its textfile collector and serves the series.
    copy_to_host(&node_exporter(), "/tmp/prometheus-node-exporter");
    lab().sh(
        PACKAGE,
        &format!(
            "systemd-run -q --unit t-node-exporter /tmp/prometheus-node-exporter --web.listen-address=127.0.0.1:{EXPORTER_PORT} \
             --collector.disable-defaults --collector.textfile --collector.textfile.directory={TEXTFILES}"
        ),
    );
    let scrape = format!(
        "python3 -c 'import urllib.request; print(urllib.request.urlopen(\"http://127.0.0.1:{EXPORTER_PORT}/metrics\", timeout=5).read().decode())'"
    );
    // 20 s bounds a node_exporter that never serves (it does within a second).
    lab().wait_until(
        PACKAGE,
        &format!("{scrape} >/dev/null 2>&1"),
        std::time::Duration::from_secs(20),
    );
    let served = lab().sh(PACKAGE, &scrape);
    // node_exporter sorts a series' labels by name.
    assert_has(
        &served,
        "reconcile_unit_in_sync{host=\"pkg\",service=\"t-pkg\",unit=\"t-pkg.service\"} 1",
    );
    assert_has(&served, "node_textfile_scrape_error 0");
    lab().sh(PACKAGE, "systemctl stop t-node-exporter");

    // Removal leaves no unit behind, even with the timer enabled.
    lab().sh(PACKAGE, "systemctl enable -q reconcile-agent.timer");
    lab().sh(PACKAGE, "dpkg -r reconcile >/dev/null");
    let left = lab().sh(
        PACKAGE,
        "ls /lib/systemd/system/reconcile-agent.* /etc/systemd/system/*/reconcile-agent.* /usr/bin/reconcile 2>/dev/null; \
         systemctl list-unit-files 'reconcile-agent*' --no-legend 2>/dev/null; true",
    );
    assert_eq!(left.trim(), "", "left behind after dpkg -r");
    fresh();
}

/// Feeding a command's stdin and reading how it ended.
trait OutputWith {
    /// (success, stdout, stderr).
    fn output_with(&mut self, input: &[u8]) -> (bool, String, String);
}

impl OutputWith for Command {
    fn output_with(&mut self, input: &[u8]) -> (bool, String, String) {
        use std::io::Write;
        let mut child = self
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("the command runs");
        child.stdin.take().unwrap().write_all(input).unwrap();
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}
