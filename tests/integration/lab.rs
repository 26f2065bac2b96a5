//! The harness: the test hosts `tests/run.sh` booted, and a fluent runner for the binary.
//!
//! Hosts are shared by every test, so each test uses its own unit names; tests that count what
//! happens on a host (SSH logins) have a host of their own.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};

pub use crate::builder::Manifest;

/// Host for tests that do not care which.
pub const SHARED: &str = "rl1";
/// Host whose sshd log one test counts logins in; nothing else may connect to it.
pub const COUNTED: &str = "rl2";
/// Host for the escaping round trip through systemd.
pub const ESCAPING: &str = "rl3";
/// Host where apply tests start and roll back services.
pub const APPLY: &str = "rl4";
/// Host the reboot fault reboots (tests/hostlab/reboot.sh); nothing else may use it.
pub const REBOOT: &str = "rl12";
/// Host where `reconcile agent` runs on the host itself, pulling from a git repository there.
pub const AGENT: &str = "rl13";
/// Host whose nvidia-smi and systemctl the hang tests wedge on purpose; nothing else may use it.
pub const HANGS: &str = "rl14";
/// The throughput gate, learned load times and failure diagnoses (issue 14): benchmark.rs uses
/// ports 37011-37019 and GPUs 10-29, learned.rs 37021-37029 and GPUs 30-39, diagnosis.rs
/// 37001-37009 and GPUs 0-9.
pub const THROUGHPUT: &str = "rl15";
/// `reconcile apply` on a real terminal (pty.rs): ports 37031-37039, GPUs 0-9.
pub const PTY: &str = "rl16";
/// Drain before a restart (issue 16): drain.rs uses ports 37101-37109 and GPUs 0-17.
pub const DRAIN: &str = "rl17";
/// Zero-downtime rollouts (issue 16): the host running the real sglang-router (a systemd unit the
/// router tests start), and the three replica hosts behind it. The lab must be booted with
/// `ROUTE=1` (tests/hostlab/up.sh) so the router host reaches the replicas.
pub const ROUTER: &str = "rl18";
pub const REPLICAS: [&str; 3] = ["rl19", "rl20", "rl21"];
/// `reconcile import` (import.rs): hand-written units adopted, ports 37201-37209, GPUs 40-57.
pub const IMPORT: &str = "rl25";
/// The Debian package installed, run and removed (package.rs): port 37701, GPUs 60-61, the
/// package's own files in /usr and /lib, node_exporter on 127.0.0.1:39100.
pub const PACKAGE: &str = "rl25";
/// Pull agents rolling out together (coordinator.rs): the host running etcd and the git daemon the
/// agents pull from, and the six hosts whose agents coordinate through it (ports 37401-37409,
/// GPUs 0-1; the tests take turns).
pub const COORDINATOR: &str = "rl26";
pub const FLEET: [&str; 6] = ["rl27", "rl28", "rl29", "rl30", "rl31", "rl32"];
/// Server groups (group.rs): one server over these two hosts, rank 0 first (ports 37501-37519).
/// The lab must be booted with `ROUTE=1` so the ranks reach each other.
pub const GROUP: [&str; 2] = ["rl22", "rl23"];
/// Experiments (experiment.rs): the host whose service an experiment's variants run on, and the
/// host of its real-SGLang variant set.
pub const EXPERIMENT: &str = "rl33";
pub const EXPERIMENT_REAL: &str = "rl34";
/// Entries of the lab's ssh_config that must fail.
pub const BAD_KEY: &str = "rl-badkey";
pub const UNREACHABLE: &str = "rl-unreachable";
/// Host 1 again, under a name whose known_hosts file starts empty.
pub const NEW_KEY: &str = "rl-newkey";

pub struct Lab {
    state: PathBuf,
    counted: Mutex<()>,
}

/// Why a lab test cannot run here, or `None` when the hosts are up.
fn missing() -> Option<String> {
    match std::env::var_os("RECONCILE_LAB") {
        None => Some("RECONCILE_LAB is not set: these tests need the throwaway test hosts; run them with `tests/run.sh` (as root)".to_string()),
        Some(state) if !PathBuf::from(&state).join("ssh_config").exists() => Some(format!(
            "no ssh_config in {}: are the test hosts up? `tests/run.sh` boots them",
            PathBuf::from(state).display()
        )),
        Some(_) => None,
    }
}

/// The lab; panics, saying how to run the test, when the hosts are not up.
pub fn lab() -> &'static Lab {
    lab_if_up().unwrap_or_else(|| panic!("{}", missing().unwrap_or_default()))
}

/// The lab when its hosts are up. For clean-ups in `Drop`: a second panic while a test unwinds
/// would abort every test after it.
pub fn lab_if_up() -> Option<&'static Lab> {
    static LAB: OnceLock<Option<Lab>> = OnceLock::new();
    LAB.get_or_init(|| {
        missing().is_none().then(|| Lab {
            state: PathBuf::from(std::env::var_os("RECONCILE_LAB").unwrap_or_default()),
            counted: Mutex::new(()),
        })
    })
    .as_ref()
}

impl Lab {
    pub fn ssh_config(&self) -> PathBuf {
        self.state.join("ssh_config")
    }

    /// A file of the lab's state folder (known_hosts files, keys).
    pub fn file(&self, name: &str) -> PathBuf {
        self.state.join(name)
    }

    /// A host's address on its veth (`hosts.tsv`, written by up.sh).
    pub fn address(&self, host: &str) -> String {
        let tsv = std::fs::read_to_string(self.state.join("hosts.tsv")).expect("hosts.tsv");
        tsv.lines()
            .map(|l| l.split('\t').collect::<Vec<_>>())
            .find(|f| f.first() == Some(&host))
            .and_then(|f| f.get(1).map(|a| a.to_string()))
            .unwrap_or_else(|| panic!("{host} is not in hosts.tsv: boot more test hosts"))
    }

    /// Holds the counted host for one test at a time.
    pub fn exclusive(&self, host: &str) -> MutexGuard<'_, ()> {
        assert_eq!(
            host, COUNTED,
            "only the counted host is handed out exclusively"
        );
        self.counted
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Runs a shell script on a host as root; panics when it fails.
    pub fn sh(&self, host: &str, script: &str) -> String {
        let out = self.ssh(host, script, None);
        assert!(
            out.status.success(),
            "on {host}: {script}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).expect("utf-8 output")
    }

    /// Waits, on the host itself, until `condition` (a shell test) holds; panics after `within`.
    /// Tests wait for what they need to see rather than sleep a fixed time, which a loaded machine
    /// (a 2-core CI runner building while it tests) can outlast.
    pub fn wait_until(&self, host: &str, condition: &str, within: std::time::Duration) {
        let tries = (within.as_millis() / 100).max(1);
        let script = format!(
            "for i in $(seq {tries}); do if {condition}; then exit 0; fi; sleep 0.1; done; exit 1"
        );
        let out = self.ssh(host, &script, None);
        assert!(
            out.status.success(),
            "on {host}: `{condition}` did not hold within {within:?}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// systemd's invocation ID of a unit: it changes with every start.
    pub fn invocation(&self, host: &str, unit: &str) -> String {
        self.sh(
            host,
            &format!("systemctl show -p InvocationID --value {unit}"),
        )
        .trim()
        .to_string()
    }

    /// Waits until the unit has been started again since it had invocation `before`: a restart
    /// happened and its verification is under way.
    pub fn wait_for_restart(&self, host: &str, unit: &str, before: &str) {
        self.wait_for_restart_within(host, unit, before, std::time::Duration::from_secs(60));
    }

    /// [`Lab::wait_for_restart`], bounded by `within` (a real server's apply runs the deep
    /// check, seconds of imports, before it restarts).
    pub fn wait_for_restart_within(
        &self,
        host: &str,
        unit: &str,
        before: &str,
        within: std::time::Duration,
    ) {
        self.wait_until(
            host,
            &format!("[ \"$(systemctl show -p InvocationID --value {unit})\" != '{before}' ]"),
            within,
        );
    }

    /// Removes a unit, its state folder and its deployment records from a host: what an earlier
    /// run of the same test left.
    pub fn remove_unit(&self, host: &str, unit: &str) {
        self.sh(
            host,
            &format!("systemctl disable --now {unit} 2>/dev/null; rm -rf /etc/systemd/system/{unit} /var/lib/reconcile/{unit}; systemctl daemon-reload"),
        );
    }

    /// Writes a file on a host.
    pub fn put(&self, host: &str, path: &str, content: &str) {
        let out = self.ssh(host, &format!("cat > '{path}'"), Some(content.as_bytes()));
        assert!(
            out.status.success(),
            "writing {path} on {host}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn ssh(&self, host: &str, script: &str, stdin: Option<&[u8]>) -> std::process::Output {
        let mut ssh = Command::new("ssh");
        ssh.arg("-F").arg(self.ssh_config());
        if host != COUNTED {
            // The harness's own commands share one connection per host; the counted host sees
            // exactly one login per command, so its counts stay exact.
            let socket = self.state.join(format!("harness-{host}"));
            ssh.args(["-o", "ControlMaster=auto", "-o", "ControlPersist=120", "-o"]);
            ssh.arg(format!("ControlPath={}", socket.display()));
        }
        let mut child = ssh
            .arg(host)
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("ssh runs");
        let mut input = child.stdin.take().expect("stdin");
        if let Some(bytes) = stdin {
            input.write_all(bytes).expect("write stdin");
        }
        drop(input);
        child.wait_with_output().expect("ssh finishes")
    }
}

/// Undoes a break a test made on a shared host when dropped, so a failing assertion (a panic)
/// cannot leave the host broken for the tests after it. `undo()` runs it at a chosen point.
pub struct Undo {
    host: &'static str,
    script: &'static str,
    done: bool,
}

impl Undo {
    pub fn new(host: &'static str, script: &'static str) -> Undo {
        Undo {
            host,
            script,
            done: false,
        }
    }

    pub fn undo(mut self) {
        self.done = true;
        lab().sh(self.host, self.script);
    }
}

impl Drop for Undo {
    fn drop(&mut self) {
        if !self.done {
            sh_quietly(self.host, self.script);
        }
    }
}

/// Starts `run`, an apply that restarts `unit` on `host`; once the restarted unit has been
/// verifying for `settle` (its restart seen within `within`), sends `signal` (`-TERM`, `-INT`) to
/// the run and returns what it reported. `run` must outlive the child: it holds its manifests.
pub fn signalled(
    run: &Reconcile,
    (host, unit): (&str, &str),
    signal: &str,
    within: std::time::Duration,
    settle: std::time::Duration,
) -> (Ran, serde_json::Value) {
    let before = lab().invocation(host, unit);
    let child = run.spawn(&[]);
    lab().wait_for_restart_within(host, unit, &before, within);
    std::thread::sleep(settle);
    let sent = Command::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(sent.success());
    let ran = Ran::from(child.wait_with_output().expect("the run ends"));
    let json = ran.json();
    (ran, json)
}

/// Runs a shell script on a host as root, ignoring how it ends, and nothing when the lab is not
/// up: for clean-ups in `Drop`, where a panic while a failing test unwinds would abort the run.
pub fn sh_quietly(host: &str, script: &str) {
    if let Some(lab) = lab_if_up() {
        let _ = lab.ssh(host, script, None);
    }
}

/// The stand-in tests' base manifest on `hosts` (see [`Manifest::new`]): `/usr/bin/python3` on
/// the hosts runs the SGLang stand-in.
pub fn manifest(service: &str, hosts: &[&str]) -> Manifest {
    Manifest::new(service).hosts(hosts)
}

/// Sequential round trips to `host` after connecting, from `--trace-remote`'s lines on stderr:
/// each connection's longest chain (`rounds=`), added up over the connections the run made.
pub fn round_trips(stderr: &str, host: &str) -> u32 {
    let mut total = 0;
    let mut current = 0;
    let prefix = format!("trace-remote host={host} ");
    for line in stderr.lines().filter(|l| l.starts_with(&prefix)) {
        if line.contains("command=\"connect\"") {
            total += current;
            current = 0;
        } else if let Some(rounds) = line.rsplit_once(" rounds=") {
            current = current.max(rounds.1.trim().parse().unwrap_or(0));
        }
    }
    total + current
}

/// `reconcile apply --format json` of one manifest with one unit: the exit code and that unit's
/// report.
pub fn apply_one_unit(manifest: &Manifest) -> (i32, serde_json::Value) {
    let ran = Reconcile::new()
        .manifest("a.yaml", manifest)
        .args(&["apply", "--format", "json"])
        .run();
    let json = ran.json();
    assert_eq!(
        json["units"].as_array().map(Vec::len),
        Some(1),
        "{}",
        ran.stdout
    );
    (ran.code, json["units"][0].clone())
}

/// The figures at concurrency `level` in a benchmark's `levels`: a record's, a report's, or the
/// report's `comparison`.
pub fn level_at(figures: &serde_json::Value, level: u64) -> &serde_json::Value {
    figures["levels"]
        .as_array()
        .and_then(|levels| levels.iter().find(|l| l["concurrency"] == level))
        .unwrap_or_else(|| panic!("no figures at {level}: {figures:#}"))
}

/// Output tokens/s at concurrency `level` in a record's (or a report's) figures.
pub fn tokens_at(benchmark: &serde_json::Value, level: u64) -> f64 {
    level_at(benchmark, level)["output_tokens_per_s"]
        .as_f64()
        .unwrap_or_else(|| panic!("no output tokens/s at {level}: {benchmark:#}"))
}

/// One run of the binary in a folder of its own.
pub struct Reconcile {
    dir: tempfile::TempDir,
    args: Vec<String>,
    env: Vec<(String, String)>,
    /// An ssh_config of the test's own in place of the lab's.
    ssh_config: Option<PathBuf>,
}

#[derive(Debug)]
pub struct Ran {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl Reconcile {
    pub fn new() -> Reconcile {
        Reconcile {
            dir: tempfile::tempdir().expect("temp dir"),
            args: Vec::new(),
            env: Vec::new(),
            ssh_config: None,
        }
    }

    /// Writes `text` as the run's ssh_config, used instead of the lab's (which it may `Include`).
    pub fn ssh_config(mut self, text: &str) -> Reconcile {
        let path = self.dir.path().join("ssh_config");
        std::fs::write(&path, text).unwrap();
        self.ssh_config = Some(path);
        self
    }

    fn ssh_config_path(&self) -> PathBuf {
        self.ssh_config
            .clone()
            .unwrap_or_else(|| lab().ssh_config())
    }

    /// Writes `text` (a [`Manifest`], or any other file's text) as `manifests/NAME`.
    pub fn manifest(self, name: &str, text: impl std::fmt::Display) -> Reconcile {
        let path = self.dir.path().join("manifests").join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text.to_string()).unwrap();
        self
    }

    pub fn env(mut self, name: &str, value: &str) -> Reconcile {
        self.env.push((name.to_string(), value.to_string()));
        self
    }

    pub fn args(mut self, args: &[&str]) -> Reconcile {
        self.args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    pub fn run(&self) -> Ran {
        Ran::from(self.command().output().expect("reconcile runs"))
    }

    /// Starts the run without waiting for it, with extra environment (e.g. its own TMPDIR, where
    /// its SSH control socket lives).
    pub fn spawn(&self, env: &[(&str, &str)]) -> std::process::Child {
        let mut command = self.command();
        command
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command.spawn().expect("reconcile starts")
    }

    fn command(&self) -> Command {
        self.command_with(&self.args)
    }

    /// The binary in the run's folder with `args`, its environment and the ssh_config.
    fn command_with<S: AsRef<std::ffi::OsStr>>(&self, args: &[S]) -> Command {
        let mut command = Command::new(env!("CARGO_BIN_EXE_reconcile"));
        command
            .args(args)
            .arg("--ssh-config")
            .arg(self.ssh_config_path())
            .current_dir(self.dir.path())
            .env("NO_COLOR", "1")
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        command
    }

    /// The run's folder: its `manifests/` and any file a run writes there (a plan file).
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Runs the binary in the same folder with other arguments (a plan, then its apply).
    pub fn run_args(&self, args: &[&str]) -> Ran {
        Ran::from(self.command_with(args).output().expect("reconcile runs"))
    }

    /// Runs the binary in the same folder for a command that reaches no host (`validate`, which
    /// takes no SSH options).
    pub fn run_offline(&self, args: &[&str]) -> Ran {
        let mut command = Command::new(env!("CARGO_BIN_EXE_reconcile"));
        command
            .args(args)
            .current_dir(self.dir.path())
            .env("NO_COLOR", "1")
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        Ran::from(command.output().expect("reconcile runs"))
    }

    /// The unit text `reconcile render` gives for a host (tests' manifests hold no secrets).
    pub fn rendered(&self, host: &str) -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_reconcile"))
            .args(["render", "--host", host])
            .current_dir(self.dir.path())
            .output()
            .expect("reconcile render runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }
}

impl From<std::process::Output> for Ran {
    fn from(out: std::process::Output) -> Ran {
        Ran {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }
}

impl Ran {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", self.stdout))
    }
}
