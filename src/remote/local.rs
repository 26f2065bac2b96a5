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
        super::within_limit(self.name(), argv, limit, run(argv, input)).await
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

async fn run(argv: &[&str], input: Option<&[u8]>) -> Result<Output, RemoteError> {
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
    let out = child.wait_with_output().await.map_err(transport)?;
    Ok(Output {
        status: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_command_that_exits_before_reading_its_input_is_judged_by_its_exit() {
        // More than a pipe holds (64 KiB), so the write meets the closed pipe.
        let input = vec![b'x'; 4 << 20];
        let out = run(&["sh", "-c", "echo refused >&2; exit 3"], Some(&input))
            .await
            .unwrap();
        assert_eq!((out.status, out.stderr.as_str()), (3, "refused\n"));
    }
}
