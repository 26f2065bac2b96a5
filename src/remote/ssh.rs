//! One multiplexed OpenSSH connection per host: the user's ssh config, known_hosts checked
//! strictly, batch mode (never a prompt).

use openssh::{ForwardType, KnownHosts, Session, SessionBuilder, Socket, Stdio};
use tokio::io::AsyncWriteExt;

use super::{Output, RemoteError, SshOptions};

pub struct SshHost {
    name: String,
    session: Session,
    /// sshd allows 10 sessions per connection by default (MaxSessions); commands beyond that
    /// wait here rather than fail there.
    sessions: tokio::sync::Semaphore,
}

const SESSIONS_AT_ONCE: usize = 8;

impl SshHost {
    pub async fn connect(name: &str, options: &SshOptions) -> Result<SshHost, RemoteError> {
        let mut builder = SessionBuilder::default();
        // Host keys are always checked; there is no option to turn that off.
        builder.known_hosts_check(KnownHosts::Strict);
        // The control socket path must stay short (a Unix socket limit), whatever the cwd.
        builder.control_directory(std::env::temp_dir());
        if let Some(config) = &options.config_file {
            builder.config_file(config);
        }
        if let Some(timeout) = options.connect_timeout {
            builder.connect_timeout(timeout);
        }
        let session = builder
            .connect_mux(destination(name))
            .await
            .map_err(|source| RemoteError::Connect {
                host: name.to_string(),
                source,
            })?;
        Ok(SshHost {
            name: name.to_string(),
            session,
            sessions: tokio::sync::Semaphore::new(SESSIONS_AT_ONCE),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub async fn run(&self, argv: &[&str], input: Option<&[u8]>) -> Result<Output, RemoteError> {
        let transport = |source: Box<dyn std::error::Error + Send + Sync>| RemoteError::Transport {
            host: self.name.clone(),
            command: super::label(argv),
            source,
        };
        let _session = self
            .sessions
            .acquire()
            .await
            .expect("the semaphore is never closed");
        let mut command = self.session.command(argv[0]);
        command
            .args(&argv[1..])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command.stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        let mut child = command.spawn().await.map_err(|e| transport(Box::new(e)))?;
        if let (Some(bytes), Some(mut stdin)) = (input, child.stdin().take()) {
            let written = stdin.write_all(bytes).await.and(stdin.shutdown().await);
            written.map_err(|e| transport(Box::new(e)))?;
        }
        let out = child
            .wait_with_output()
            .await
            .map_err(|e| transport(Box::new(e)))?;
        Ok(Output {
            status: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    /// Forwards a free local port to `port` on the host's loopback; returns the local port.
    pub async fn forward(&self, port: u16) -> Result<u16, RemoteError> {
        let local = std::net::TcpListener::bind(("127.0.0.1", 0))
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| RemoteError::Transport {
                host: self.name.clone(),
                command: "port forward".into(),
                source: Box::new(e),
            })?;
        self.session
            .request_port_forward(
                ForwardType::Local,
                Socket::new("127.0.0.1", local),
                Socket::new("127.0.0.1", port),
            )
            .await
            .map_err(|e| RemoteError::Transport {
                host: self.name.clone(),
                command: format!("port forward to 127.0.0.1:{port}"),
                source: Box::new(e),
            })?;
        Ok(local)
    }

    pub async fn close(self) {
        if let Err(e) = self.session.close().await {
            tracing::debug!(host = %self.name, error = %e, "closing the ssh connection");
        }
    }
}

/// `user@host:port` is not something ssh itself parses; its URI form is.
fn destination(name: &str) -> String {
    match name.rsplit_once(':') {
        Some((host, port))
            if !port.is_empty()
                && port.chars().all(|c| c.is_ascii_digit())
                && !host.contains(':') =>
        {
            format!("ssh://{host}:{port}")
        }
        _ => name.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::destination;

    #[test]
    fn ports_move_into_the_uri_form() {
        assert_eq!(destination("root@gpu-a:2222"), "ssh://root@gpu-a:2222");
        assert_eq!(destination("gpu-a"), "gpu-a");
        assert_eq!(destination("root@gpu-a"), "root@gpu-a");
    }
}
