//! `local`: this machine, without SSH, for running `reconcile` on the GPU host itself.

use super::{Output, RemoteError};

pub async fn run(argv: &[&str]) -> Result<Output, RemoteError> {
    let out = tokio::process::Command::new(argv[0])
        .args(&argv[1..])
        .output()
        .await
        .map_err(|e| RemoteError::Transport {
            host: "local".into(),
            command: argv.join(" "),
            source: Box::new(e),
        })?;
    Ok(Output {
        status: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    })
}
