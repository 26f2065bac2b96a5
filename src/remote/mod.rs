//! The edge: every command that reaches a host goes through here, over one multiplexed SSH
//! connection per host and run, or straight to this machine for `local`.
//!
//! Commands are argv vectors; the SSH side escapes each argument for the remote shell, so no
//! manifest value is ever pasted into a shell string.

pub mod gpu;
pub mod http;
pub mod liveness;
mod local;
mod ssh;

pub use gpu::GpuReading;
pub use http::{Endpoint, Health, Model, Server};

use std::path::PathBuf;
use std::time::Duration;

use crate::observed::{Observed, UnitState, SHOW_PROPERTIES};
use crate::plan::UNIT_DIR;

/// How to reach hosts over SSH.
#[derive(Debug, Clone, Default)]
pub struct SshOptions {
    /// An ssh_config file to use instead of `~/.ssh/config`.
    pub config_file: Option<PathBuf>,
    pub connect_timeout: Option<Duration>,
    /// Record the keys of hosts never seen before instead of refusing them; a changed key is
    /// always refused.
    pub accept_new_host_keys: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The SSH connection could not be made (unreachable, refused, host key mismatch, auth).
    #[error("cannot connect to {host}")]
    Connect {
        host: String,
        #[source]
        source: openssh::Error,
    },
    /// The command could not be started or its connection broke.
    #[error("{host}: `{command}` could not run")]
    Transport {
        host: String,
        command: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The command did not finish in time: a GPU that fell off the bus hangs `nvidia-smi`, a
    /// stale NFS mount hangs a `test -r` on the model path.
    #[error("`{command}` on {host} did not answer in {}", humantime::format_duration(*.after))]
    TimedOut {
        host: String,
        command: String,
        after: Duration,
    },
    /// The command ran and failed.
    #[error("{host}: `{command}` exited with {status}: {stderr}")]
    Failed {
        host: String,
        command: String,
        status: i32,
        stderr: String,
    },
}

/// How long a remote command may take before its host counts as hung (`--command-timeout`). Reading a file or asking
/// systemd takes milliseconds; `nvidia-smi` on a loaded 8-GPU host about a second.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// systemctl verbs that wait for their job: a stop waits up to the unit's `TimeoutStopSec` (90 s by
/// default, often raised for servers that drain), a restart for the stop and then the start.
pub const SYSTEMD_JOB_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// `--command-timeout`: set once from the command line, before any host is reached.
static COMMAND_TIMEOUT_SET: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();

pub fn set_command_timeout(limit: Duration) {
    let _ = COMMAND_TIMEOUT_SET.set(limit);
}

pub fn command_timeout() -> Duration {
    COMMAND_TIMEOUT_SET
        .get()
        .copied()
        .unwrap_or(COMMAND_TIMEOUT)
}

/// The limit for `argv`: a systemd job's, or the default.
pub fn timeout_for(argv: &[&str]) -> Duration {
    let waits_for_a_job = |verb: &str| {
        matches!(
            verb,
            "restart"
                | "stop"
                | "start"
                | "try-restart"
                | "reload-or-restart"
                | "isolate"
                | "reboot"
        )
    };
    match argv {
        ["systemctl", verb, ..] if waits_for_a_job(verb) => {
            SYSTEMD_JOB_TIMEOUT.max(command_timeout())
        }
        ["systemctl", "enable" | "disable", rest @ ..] if rest.contains(&"--now") => {
            SYSTEMD_JOB_TIMEOUT.max(command_timeout())
        }
        _ => command_timeout(),
    }
}

/// What a finished command printed.
#[derive(Debug, Clone)]
pub struct Output {
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
}

/// A host to read from and act on.
pub enum Host {
    Ssh(ssh::SshHost),
    Local,
}

impl Host {
    pub async fn connect(name: &str, options: &SshOptions) -> Result<Host, RemoteError> {
        if name == "local" {
            return Ok(Host::Local);
        }
        ssh::SshHost::connect(name, options).await.map(Host::Ssh)
    }

    pub fn name(&self) -> &str {
        match self {
            Host::Ssh(h) => h.name(),
            Host::Local => "local",
        }
    }

    /// Runs a command and returns what it printed, whatever its exit status.
    pub async fn run(&self, argv: &[&str]) -> Result<Output, RemoteError> {
        self.run_with_input(argv, None).await
    }

    /// Runs a command with `input` on its standard input, within [`timeout_for`] it.
    pub async fn run_with_input(
        &self,
        argv: &[&str],
        input: Option<&[u8]>,
    ) -> Result<Output, RemoteError> {
        self.run_within(argv, input, timeout_for(argv)).await
    }

    /// Runs a command that may take up to `limit`; past it, the host counts as hung.
    pub async fn run_within(
        &self,
        argv: &[&str],
        input: Option<&[u8]>,
        limit: Duration,
    ) -> Result<Output, RemoteError> {
        let run = async {
            match self {
                Host::Ssh(h) => h.run(argv, input).await,
                Host::Local => local::run(argv, input).await,
            }
        };
        tokio::time::timeout(limit, run).await.unwrap_or_else(|_| {
            Err(RemoteError::TimedOut {
                host: self.name().to_string(),
                command: command_name(argv),
                after: limit,
            })
        })
    }

    /// Runs a command that must succeed.
    pub async fn run_ok(&self, argv: &[&str]) -> Result<String, RemoteError> {
        let out = self.run(argv).await?;
        if out.status != 0 {
            return Err(RemoteError::Failed {
                host: self.name().to_string(),
                command: label(argv),
                status: out.status,
                stderr: out.stderr.trim().to_string(),
            });
        }
        Ok(out.stdout)
    }

    /// A file's text, or `None` when it does not exist.
    pub async fn read_file(&self, path: &str) -> Result<Option<String>, RemoteError> {
        // `test -e` first, so a missing file is told apart from one that cannot be read.
        let out = self
            .run(&[
                "sh",
                "-c",
                "test -e \"$1\" || exit 100; cat -- \"$1\"",
                "sh",
                path,
            ])
            .await?;
        match out.status {
            0 => Ok(Some(out.stdout)),
            100 => Ok(None),
            status => Err(RemoteError::Failed {
                host: self.name().to_string(),
                command: format!("cat {path}"),
                status,
                stderr: out.stderr.trim().to_string(),
            }),
        }
    }

    /// Replaces a file atomically: the content goes to a temporary file beside it, which is then
    /// renamed over it, so the file is always either complete old or complete new.
    pub async fn write_file(
        &self,
        path: &str,
        content: &str,
        mode: &str,
    ) -> Result<(), RemoteError> {
        // A host shutting down (a reboot mid-apply) kills the script with SIGTERM: it takes its
        // temporary file with it rather than leave it beside the unit.
        const SCRIPT: &str = "umask 077; t=\"$1.reconcile-tmp\"; trap 'rm -f \"$t\"; exit 1' HUP INT TERM; cat > \"$t\" && chmod \"$2\" \"$t\" && mv -f \"$t\" \"$1\" || { rm -f \"$t\"; exit 1; }";
        let out = self
            .run_with_input(
                &["sh", "-c", SCRIPT, "sh", path, mode],
                Some(content.as_bytes()),
            )
            .await?;
        if out.status != 0 {
            return Err(RemoteError::Failed {
                host: self.name().to_string(),
                command: format!("write {path}"),
                status: out.status,
                stderr: out.stderr.trim().to_string(),
            });
        }
        Ok(())
    }

    pub async fn unit_state(&self, unit: &str) -> Result<UnitState, RemoteError> {
        let out = self
            .run_ok(&["systemctl", "show", "-p", SHOW_PROPERTIES, "--", unit])
            .await?;
        Ok(UnitState::from_show(&out))
    }

    /// The unit's file and systemd's state for it, read concurrently over the one connection.
    pub async fn observe(&self, unit: &str) -> Result<Observed, RemoteError> {
        let path = format!("{UNIT_DIR}/{unit}");
        let (unit_text, state) = tokio::try_join!(self.read_file(&path), self.unit_state(unit))?;
        Ok(Observed { unit_text, state })
    }

    /// Whether commands still reach the host: not once its SSH connection broke (the host
    /// rebooted, the network was cut). `local` always does.
    pub async fn connected(&self) -> bool {
        match self {
            Host::Ssh(h) => h.connected().await,
            Host::Local => true,
        }
    }

    /// Connects again after the connection broke, retrying with backoff until `within` has
    /// passed: a rebooting host refuses connections until its sshd is back. Returns how long it
    /// took; the error is the last attempt's. Port forwards are not carried over.
    pub async fn reconnect(&self, within: Duration) -> Result<Duration, RemoteError> {
        let started = std::time::Instant::now();
        let mut wait = Duration::from_millis(500);
        loop {
            let attempt = match self {
                Host::Ssh(h) => h.reconnect().await,
                Host::Local => Ok(()),
            };
            match attempt {
                Ok(()) => return Ok(started.elapsed()),
                Err(e) if started.elapsed() >= within => return Err(e),
                Err(e) => {
                    tracing::debug!(host = %self.name(), error = %error_chain(&e), "reconnecting")
                }
            }
            // The last attempt falls on the deadline, not a backoff step before it.
            tokio::time::sleep(wait.min(within.saturating_sub(started.elapsed()))).await;
            wait = (wait * 2).min(Duration::from_secs(5));
        }
    }

    pub async fn close(self) {
        if let Host::Ssh(h) = self {
            h.close().await;
        }
    }
}

/// A command as a person names it: `nvidia-smi`, `systemctl show`, a script by its first word.
fn command_name(argv: &[&str]) -> String {
    match argv {
        ["sh", "-c", script, ..] => {
            let first = script
                .split(|c: char| c.is_whitespace() || c == ';')
                .find(|w| !w.is_empty() && !w.contains('='))
                .unwrap_or("sh");
            format!("sh -c {first}…")
        }
        [py, "-c", ..] => format!("{py} -c …"),
        ["systemctl", verb, ..] => format!("systemctl {verb}"),
        [first, ..] => first.to_string(),
        [] => String::new(),
    }
}

/// A command as shown in errors: a fixed `sh -c` script is shown by its arguments, not its text.
fn label(argv: &[&str]) -> String {
    match argv {
        ["sh", "-c", _, _, args @ ..] => format!("sh -c … {}", args.join(" ")),
        _ => argv.join(" "),
    }
}

/// The whole chain of an error on one line: openssh's own message is generic, ssh's reason
/// (`Host key verification failed.`) is in its source.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let part = one_line(&e.to_string());
        if !text.contains(&part) {
            text.push_str(": ");
            text.push_str(&part);
        }
        source = e.source();
    }
    if text.contains("Host key verification failed") {
        text.push_str(" (the host's key does not match known_hosts: verify the new key out of band, then update known_hosts)");
    }
    text
}

/// ssh's messages span lines, and its changed-host-key warning is a banner; one line keeps what
/// says why (the key it saw, the known_hosts line it clashes with, the verdict).
fn one_line(message: &str) -> String {
    let lines = message.lines().map(str::trim).filter(|l| !l.is_empty());
    let kept: Vec<&str> = if message.contains("REMOTE HOST IDENTIFICATION HAS CHANGED") {
        lines
            .filter(|l| {
                l.starts_with("SHA256:") || l.starts_with("Offending") || l.starts_with("Host key")
            })
            .collect()
    } else {
        lines.collect()
    };
    let joined = kept.join(" ");
    if message.contains("REMOTE HOST IDENTIFICATION HAS CHANGED") {
        format!("REMOTE HOST IDENTIFICATION HAS CHANGED: key {joined}")
    } else {
        joined
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn systemd_jobs_get_longer_than_other_commands() {
        assert_eq!(
            timeout_for(&["systemctl", "restart", "--", "a.service"]),
            SYSTEMD_JOB_TIMEOUT
        );
        assert_eq!(
            timeout_for(&["systemctl", "disable", "--now", "--", "a"]),
            SYSTEMD_JOB_TIMEOUT
        );
        assert_eq!(
            timeout_for(&["systemctl", "show", "-p", "X"]),
            COMMAND_TIMEOUT
        );
        assert_eq!(timeout_for(&["nvidia-smi", "-L"]), COMMAND_TIMEOUT);
        assert_eq!(command_name(&["nvidia-smi", "--query-gpu=x"]), "nvidia-smi");
        assert_eq!(command_name(&["systemctl", "show", "-p"]), "systemctl show");
        assert_eq!(
            command_name(&["sh", "-c", "\ncg=$(x)\ntest -r", "sh"]),
            "sh -c test…"
        );
    }

    #[tokio::test]
    async fn a_command_past_its_limit_is_a_hung_host() {
        let started = std::time::Instant::now();
        let e = Host::Local
            .run_within(&["sleep", "5"], None, Duration::from_millis(200))
            .await
            .unwrap_err();
        assert!(started.elapsed() < Duration::from_secs(2));
        assert_eq!(e.to_string(), "`sleep` on local did not answer in 200ms");
    }

    #[test]
    fn a_changed_host_key_banner_becomes_one_line() {
        let ssh = "@@@@@@@@\n@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n@@@@@@@@\nIT IS POSSIBLE THAT SOMEONE IS DOING SOMETHING NASTY!\nThe fingerprint for the ED25519 key sent by the remote host is\nSHA256:bXpZ.\nOffending ED25519 key in /k:1\n  remove with:\nHost key for h has changed and you have requested strict checking.\nHost key verification failed.\n";
        assert_eq!(
            one_line(ssh),
            "REMOTE HOST IDENTIFICATION HAS CHANGED: key SHA256:bXpZ. Offending ED25519 key in /k:1 Host key for h has changed and you have requested strict checking. Host key verification failed."
        );
        assert_eq!(one_line("a\nb\n"), "a b");
    }
}
