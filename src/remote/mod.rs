//! The edge: every command that reaches a host goes through here, over one multiplexed SSH
//! connection per host and run, or straight to this machine for `local`.
//!
//! Commands are argv vectors; the SSH side escapes each argument for the remote shell, so no
//! manifest value is ever pasted into a shell string.
//!
//! A host is a [`Host`]: a handful of primitives (run a command within a limit, read and write a
//! file, forward a port, reconnect, close) that [`ssh`], [`local`] and, in tests, [`fake`]
//! implement. The edge knows nothing of systemd or SGLang: what is asked of a host is decided one
//! layer up (`crate::systemd`, `crate::probe`), so this module imports nothing from the crate.

pub mod etcd;
#[cfg(test)]
pub mod fake;
pub mod gpu;
pub mod http;
mod local;
mod ssh;
mod trace;

pub use gpu::GpuReading;
pub use http::{Endpoint, Health, Model, Server};
pub use local::Local;
pub use trace::{Trace, Traced};

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;

/// How to reach hosts: over SSH, and how long their commands may take.
#[derive(Debug, Clone, Default)]
pub struct SshOptions {
    /// An ssh_config file to use instead of `~/.ssh/config`.
    pub config_file: Option<PathBuf>,
    pub connect_timeout: Option<Duration>,
    /// Record the keys of hosts never seen before instead of refusing them; a changed key is
    /// always refused.
    pub accept_new_host_keys: bool,
    /// How long a command on the host may take (`--command-timeout`), held by each host.
    pub limits: Limits,
    /// `--trace-remote`: every host reached is [`Traced`] to this.
    pub trace: Option<Trace>,
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
    /// The command printed more than reconcile reads of it ([`Limits::output_for`]): what came
    /// past the bound was not read, and the command was ended. A host that floods its answers
    /// fails alone, and never takes the run's memory with it.
    #[error("{host}: `{command}` printed more than {} on its {stream}, the most reconcile reads of it", size(*.limit))]
    TooLarge {
        host: String,
        command: String,
        stream: Stream,
        limit: u64,
    },
}

impl RemoteError {
    /// `command` on `host` exited with `out`'s status, which is not 0.
    pub fn failed(host: &str, command: String, out: &Output) -> RemoteError {
        RemoteError::Failed {
            host: host.to_string(),
            command,
            status: out.status,
            stderr: out.stderr.trim().to_string(),
        }
    }
}

/// Which of a command's outputs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

impl std::fmt::Display for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        })
    }
}

/// A bound in bytes as a person reads it: `64 MiB`, `48 KiB`, `100 bytes`.
pub fn size(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{} MiB", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{} KiB", b >> 10),
        b => format!("{b} bytes"),
    }
}

/// How long a remote command may take before its host counts as hung (`--command-timeout`). Reading a file or asking
/// systemd takes milliseconds; `nvidia-smi` on a loaded 8-GPU host about a second.
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);
/// systemctl verbs that wait for their job: a stop waits up to the unit's `TimeoutStopSec` (90 s by
/// default, often raised for servers that drain), a restart for the stop and then the start.
pub const SYSTEMD_JOB_TIMEOUT: Duration = Duration::from_secs(10 * 60);

/// The most of a command's stdout reconcile reads. The largest answers a host legitimately
/// gives are a survey of all its units (unit files, drop-ins, deployment records, a few KiB to a
/// few MiB each) and the deep check's JSON: tens of MiB is already far past them.
pub const STDOUT_LIMIT: u64 = 64 << 20;
/// The most of a command's stderr reconcile reads: error messages and a Python traceback, with
/// room for a library's warnings printed on import.
pub const STDERR_LIMIT: u64 = 8 << 20;
/// The most of `journalctl`'s stdout reconcile reads. It is asked for at most 50 lines of the
/// failed invocation (and systemd's few lines about it), and journald cuts a line a service writes
/// at `LineMax` (48 KiB by default): 50 of those are 2.4 MiB.
pub const JOURNAL_LIMIT: u64 = 8 << 20;

/// How long a host's commands may take, and how much of their output is read: set once from the
/// command line and given to each host when it is reached, so every command of a run has the
/// same limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Any command (`--command-timeout`).
    pub command: Duration,
    /// A systemctl verb that waits for its job; never shorter than `command`.
    pub systemd_job: Duration,
    /// The most of a command's stdout read ([`STDOUT_LIMIT`]; `journalctl` gets less).
    pub stdout: u64,
    /// The most of a command's stderr read ([`STDERR_LIMIT`]).
    pub stderr: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            command: COMMAND_TIMEOUT,
            systemd_job: SYSTEMD_JOB_TIMEOUT,
            stdout: STDOUT_LIMIT,
            stderr: STDERR_LIMIT,
        }
    }
}

impl Limits {
    /// The default limits with `command` for every command (`--command-timeout`).
    pub fn with_command(command: Duration) -> Limits {
        Limits {
            command,
            ..Limits::default()
        }
    }

    /// The limit for `argv`: a systemd job's, or the default.
    pub fn timeout_for(&self, argv: &[&str]) -> Duration {
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
            ["systemctl", verb, ..] if waits_for_a_job(verb) => self.systemd_job.max(self.command),
            ["systemctl", "enable" | "disable", rest @ ..] if rest.contains(&"--now") => {
                self.systemd_job.max(self.command)
            }
            _ => self.command,
        }
    }

    /// The most of `argv`'s stdout and stderr read: the journal's own bound for `journalctl`.
    pub fn output_for(&self, argv: &[&str]) -> (u64, u64) {
        match argv {
            ["journalctl", ..] => (self.stdout.min(JOURNAL_LIMIT), self.stderr),
            _ => (self.stdout, self.stderr),
        }
    }
}

/// What a finished command printed.
#[derive(Debug, Clone)]
pub struct Output {
    pub status: i32,
    pub stdout: String,
    pub stderr: String,
}

/// Reaches `name`: this machine for `local`, else one SSH connection with `options`.
/// With `options.trace`, the host is [`Traced`].
pub async fn connect(name: &str, options: &SshOptions) -> Result<Box<dyn Host>, RemoteError> {
    let started = std::time::Instant::now();
    let host: Result<Box<dyn Host>, RemoteError> = if name == "local" {
        Ok(Box::new(Local::new(options.limits)))
    } else {
        match ssh::SshHost::connect(name, options).await {
            Ok(host) => Ok(Box::new(host)),
            Err(e) => Err(e),
        }
    };
    let Some(trace) = &options.trace else {
        return host;
    };
    trace.connected(name, started.elapsed(), host.is_ok());
    Ok(Box::new(Traced::new(host?, trace.clone())))
}

/// The writing of a command's input, where a command that exited before reading all of it (its
/// end of the pipe closed: `EPIPE`) is no failure of the transport: its exit status and stderr,
/// read next, say why it stopped (a write to a read-only folder failed before reading the unit).
pub(crate) fn input_taken(written: std::io::Result<()>) -> std::io::Result<()> {
    match written {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

/// A host to read from and act on. The required methods are what a way of reaching a host must
/// provide; the provided ones are built on them, the same for every host.
#[async_trait]
pub trait Host: Send + Sync {
    fn name(&self) -> &str;

    /// The limits its commands run under.
    fn limits(&self) -> &Limits;

    /// Runs a command with `input` on its standard input, and returns what it printed, whatever
    /// its exit status. Past `limit` the host counts as hung: [`RemoteError::TimedOut`].
    async fn run_within(
        &self,
        argv: &[&str],
        input: Option<&[u8]>,
        limit: Duration,
    ) -> Result<Output, RemoteError>;

    /// Where on this machine the host's `address:port` answers: a free local port forwarded over
    /// the connection (to the host's loopback, or the address the server binds), or the address
    /// itself on `local`.
    async fn forward(&self, address: &str, port: u16) -> Result<(String, u16), RemoteError>;

    /// Whether commands still reach the host: not once its SSH connection broke (the host
    /// rebooted, the network was cut). `local` always does.
    async fn connected(&self) -> bool;

    /// Connects again after the connection broke, retrying with backoff until `within` has
    /// passed: a rebooting host refuses connections until its sshd is back. Returns how long it
    /// took; the error is the last attempt's. Port forwards are not carried over.
    async fn reconnect(&self, within: Duration) -> Result<Duration, RemoteError>;

    async fn close(self: Box<Self>);

    /// GPU memory read without a command (NVML on `local`); `Ok(None)` when the host has no such
    /// way, and `nvidia-smi` is asked instead.
    async fn native_gpu_memory(&self) -> Result<Option<Vec<gpu::Gpu>>, RemoteError> {
        Ok(None)
    }

    /// Runs a command and returns what it printed, whatever its exit status.
    async fn run(&self, argv: &[&str]) -> Result<Output, RemoteError> {
        self.run_with_input(argv, None).await
    }

    /// Runs a command with `input` on its standard input, within [`Limits::timeout_for`] it.
    async fn run_with_input(
        &self,
        argv: &[&str],
        input: Option<&[u8]>,
    ) -> Result<Output, RemoteError> {
        self.run_within(argv, input, self.limits().timeout_for(argv))
            .await
    }

    /// Runs a command that must succeed.
    async fn run_ok(&self, argv: &[&str]) -> Result<String, RemoteError> {
        let out = self.run(argv).await?;
        if out.status != 0 {
            return Err(RemoteError::failed(self.name(), label(argv), &out));
        }
        Ok(out.stdout)
    }

    /// A file's text, or `None` when it does not exist.
    async fn read_file(&self, path: &str) -> Result<Option<String>, RemoteError> {
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
            _ => Err(RemoteError::failed(
                self.name(),
                format!("cat {path}"),
                &out,
            )),
        }
    }

    /// Replaces a file atomically: the content goes to a temporary file beside it, which is then
    /// renamed over it, so the file is always either complete old or complete new.
    async fn write_file(&self, path: &str, content: &str, mode: &str) -> Result<(), RemoteError> {
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
            return Err(RemoteError::failed(
                self.name(),
                format!("write {path}"),
                &out,
            ));
        }
        Ok(())
    }
}

/// Why a command's output was not read whole.
pub(crate) enum Unread {
    /// Reading it failed (the connection broke).
    Io(std::io::Error),
    /// It held more than its bound; the rest was left unread.
    TooLarge { stream: Stream, limit: u64 },
}

impl Unread {
    /// The error `host` reports for `argv`'s output that was not read whole.
    pub(crate) fn error(self, host: &str, argv: &[&str]) -> RemoteError {
        match self {
            Unread::Io(e) => RemoteError::Transport {
                host: host.to_string(),
                command: label(argv),
                source: Box::new(e),
            },
            Unread::TooLarge { stream, limit } => RemoteError::TooLarge {
                host: host.to_string(),
                command: command_name(argv),
                stream,
                limit,
            },
        }
    }
}

/// Reads a command's stdout and stderr at once (a full pipe would stop the command), each to its
/// end but no further than its bound in `limits` (stdout's, stderr's). Past a bound, reading
/// stops there and the other stream is dropped too: the caller then ends the command, whose next
/// write meets a closed pipe.
pub(crate) async fn read_outputs<O, E>(
    stdout: Option<O>,
    stderr: Option<E>,
    (stdout_limit, stderr_limit): (u64, u64),
) -> Result<(Vec<u8>, Vec<u8>), Unread>
where
    O: tokio::io::AsyncRead + Unpin,
    E: tokio::io::AsyncRead + Unpin,
{
    tokio::try_join!(
        read_bounded(stdout, stdout_limit, Stream::Stdout),
        read_bounded(stderr, stderr_limit, Stream::Stderr),
    )
}

/// One stream read to its end, or to one byte past `limit`: that byte says there was more, and
/// nothing after it is read.
async fn read_bounded<R: tokio::io::AsyncRead + Unpin>(
    stream: Option<R>,
    limit: u64,
    which: Stream,
) -> Result<Vec<u8>, Unread> {
    use tokio::io::AsyncReadExt;
    let mut bytes = Vec::new();
    if let Some(stream) = stream {
        stream
            .take(limit.saturating_add(1))
            .read_to_end(&mut bytes)
            .await
            .map_err(Unread::Io)?;
    }
    if bytes.len() as u64 > limit {
        return Err(Unread::TooLarge {
            stream: which,
            limit,
        });
    }
    Ok(bytes)
}

/// `run`, given up on past `limit` as [`RemoteError::TimedOut`] naming the command: how every
/// host gives up on a hung command.
async fn within_limit(
    host: &str,
    argv: &[&str],
    limit: Duration,
    run: impl std::future::Future<Output = Result<Output, RemoteError>>,
) -> Result<Output, RemoteError> {
    tokio::time::timeout(limit, run).await.unwrap_or_else(|_| {
        Err(RemoteError::TimedOut {
            host: host.to_string(),
            command: command_name(argv),
            after: limit,
        })
    })
}

/// A command as a person names it: `nvidia-smi`, `systemctl show`, a script by its first word.
fn command_name(argv: &[&str]) -> String {
    match argv {
        // A script that names itself: `# survey: ...`.
        ["sh", "-c", script, ..] if script.starts_with("# ") => {
            let first = script.lines().next().unwrap_or_default();
            first[2..]
                .split(':')
                .next()
                .unwrap_or_default()
                .trim()
                .to_string()
        }
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
        let limits = Limits::default();
        assert_eq!(
            limits.timeout_for(&["systemctl", "restart", "--", "a.service"]),
            SYSTEMD_JOB_TIMEOUT
        );
        assert_eq!(
            limits.timeout_for(&["systemctl", "disable", "--now", "--", "a"]),
            SYSTEMD_JOB_TIMEOUT
        );
        assert_eq!(
            limits.timeout_for(&["systemctl", "show", "-p", "X"]),
            COMMAND_TIMEOUT
        );
        assert_eq!(limits.timeout_for(&["nvidia-smi", "-L"]), COMMAND_TIMEOUT);
        assert_eq!(command_name(&["nvidia-smi", "--query-gpu=x"]), "nvidia-smi");
        assert_eq!(command_name(&["systemctl", "show", "-p"]), "systemctl show");
        assert_eq!(
            command_name(&["sh", "-c", "\ncg=$(x)\ntest -r", "sh"]),
            "sh -c test…"
        );
        // A script that names itself on its first line is called by that name.
        assert_eq!(
            command_name(&["sh", "-c", "# survey: unit files, ...\nt=$1", "sh", "30"]),
            "survey"
        );
    }

    #[test]
    fn a_longer_command_timeout_also_holds_for_systemd_jobs() {
        let limits = Limits::with_command(Duration::from_secs(3600));
        assert_eq!(
            limits.timeout_for(&["systemctl", "stop", "--", "a"]),
            Duration::from_secs(3600)
        );
        assert_eq!(limits.timeout_for(&["true"]), Duration::from_secs(3600));
    }

    #[tokio::test]
    async fn a_command_past_its_limit_is_a_hung_host() {
        let started = std::time::Instant::now();
        let e = Local::new(Limits::default())
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
