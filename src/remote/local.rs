//! `local`: this machine, without SSH, for running `reconcile` on the GPU host itself.

use std::process::Stdio;

use tokio::io::AsyncWriteExt;

use super::{Output, RemoteError};

pub async fn run(argv: &[&str], input: Option<&[u8]>) -> Result<Output, RemoteError> {
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
        stdin.write_all(bytes).await.map_err(transport)?;
    }
    let out = child.wait_with_output().await.map_err(transport)?;
    Ok(Output {
        status: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}
