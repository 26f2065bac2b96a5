//! `local`: this machine, without SSH, for running `reconcile` on the GPU host itself.

use std::process::Stdio;
use std::time::Duration;

use async_trait::async_trait;
use tokio::io::AsyncWriteExt;

use super::{gpu, Host, Limits, Output, RemoteError};

/// This machine as a host: commands run as child processes, GPUs are read through NVML.
pub struct Local {
    limits: Limits,
}

impl Local {
    pub fn new(limits: Limits) -> Local {
        Local { limits }
    }
}

#[async_trait]
impl Host for Local {
    fn name(&self) -> &str {
        "local"
    }

    fn limits(&self) -> &Limits {
        &self.limits
    }

    async fn run_within(
        &self,
        argv: &[&str],
        input: Option<&[u8]>,
        limit: Duration,
    ) -> Result<Output, RemoteError> {
        let output = self.limits.output_for(argv);
        super::within_limit(self.name(), argv, limit, run(argv, input, output)).await
    }

    /// No forward is needed: the server's own address is reachable from here.
    async fn forward(&self, address: &str, port: u16) -> Result<(String, u16), RemoteError> {
        Ok((address.to_string(), port))
    }

    async fn connected(&self) -> bool {
        true
    }

    async fn reconnect(&self, _within: Duration) -> Result<Duration, RemoteError> {
        Ok(Duration::ZERO)
    }

    async fn close(self: Box<Self>) {}

    async fn native_gpu_memory(&self) -> Result<Option<Vec<gpu::Gpu>>, RemoteError> {
        gpu::nvml_memory(self.limits.command).await
    }
}

/// Runs `argv`, reading at most `output` (stdout's, stderr's bound) of what it prints.
async fn run(
    argv: &[&str],
    input: Option<&[u8]>,
    output: (u64, u64),
) -> Result<Output, RemoteError> {
    let transport = |e: std::io::Error| RemoteError::Transport {
        host: "local".into(),
        command: super::label(argv),
        source: Box::new(e),
    };
    let mut command = tokio::process::Command::new(argv[0]);
    // A command given up on (past its timeout) must not outlive the wait for it.
    command.kill_on_drop(true);
    command
        .args(&argv[1..])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command.stdin(if input.is_some() {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = command.spawn().map_err(transport)?;
    if let (Some(bytes), Some(mut stdin)) = (input, child.stdin.take()) {
        super::input_taken(stdin.write_all(bytes).await).map_err(transport)?;
    }
    let read = super::read_outputs(child.stdout.take(), child.stderr.take(), output).await;
    let (stdout, stderr) = match read {
        Ok(read) => read,
        Err(unread) => {
            // Killed and waited for here, not left to the drop: the process is reaped before
            // the error is reported.
            let _ = child.kill().await;
            return Err(unread.error("local", argv));
        }
    };
    let status = child.wait().await.map_err(transport)?;
    Ok(Output {
        status: status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::{Stream, JOURNAL_LIMIT, STDERR_LIMIT, STDOUT_LIMIT};

    #[tokio::test]
    async fn a_command_that_exits_before_reading_its_input_is_judged_by_its_exit() {
        // More than a pipe holds (64 KiB), so the write meets the closed pipe.
        let input = vec![b'x'; 4 << 20];
        let out = run(
            &["sh", "-c", "echo refused >&2; exit 3"],
            Some(&input),
            Limits::default().output_for(&["sh"]),
        )
        .await
        .unwrap();
        assert_eq!((out.status, out.stderr.as_str()), (3, "refused\n"));
    }

    /// Whether process `pid` is gone: reaped, not a zombie (`kill -0` succeeds on a zombie; it
    /// fails only once the parent has waited for it).
    fn gone(pid: &str) -> bool {
        !std::process::Command::new("kill")
            .args(["-0", pid])
            .status()
            .unwrap()
            .success()
    }

    #[tokio::test]
    async fn output_past_its_bound_fails_the_command_and_the_process_is_reaped() {
        let limits = Limits {
            stdout: 1 << 20,
            stderr: 4096,
            ..Limits::default()
        };
        let local = Local::new(limits);
        // `yes` would print forever: reading stops one byte past the bound.
        let flood = ["sh", "-c", "exec yes flood"];
        let e = local.run(&flood).await.unwrap_err();
        match &e {
            RemoteError::TooLarge {
                host,
                command,
                stream,
                limit,
            } => {
                assert_eq!(
                    (host.as_str(), command.as_str(), *stream, *limit),
                    ("local", "sh -c exec…", Stream::Stdout, 1 << 20)
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            e.to_string(),
            "local: `sh -c exec…` printed more than 1 MiB on its stdout, the most reconcile reads of it"
        );
        // The same on stderr, and the flooding process is gone, not left running or a zombie.
        let pid_file = tempfile::NamedTempFile::new().unwrap();
        let script = format!(
            "echo $$ > {}; exec yes flood >&2",
            pid_file.path().display()
        );
        let e = local.run(&["sh", "-c", &script]).await.unwrap_err();
        assert!(
            matches!(
                e,
                RemoteError::TooLarge {
                    stream: Stream::Stderr,
                    limit: 4096,
                    ..
                }
            ),
            "{e:?}"
        );
        let pid = std::fs::read_to_string(pid_file.path()).unwrap();
        assert!(gone(pid.trim()), "process {pid} outlived its command");
        // Within the bound, all of it is read.
        let out = local
            .run(&["sh", "-c", "head -c 1048576 /dev/zero"])
            .await
            .unwrap();
        assert_eq!(out.stdout.len(), 1 << 20);
    }

    #[test]
    fn the_journal_has_a_bound_of_its_own() {
        let limits = Limits::default();
        assert_eq!(
            limits.output_for(&["journalctl", "-n", "50"]),
            (JOURNAL_LIMIT, STDERR_LIMIT)
        );
        assert_eq!(
            limits.output_for(&["sh", "-c", "x"]),
            (STDOUT_LIMIT, STDERR_LIMIT)
        );
    }
}
