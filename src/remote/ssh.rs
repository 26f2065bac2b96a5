//! One multiplexed OpenSSH connection per host: the user's ssh config, known_hosts checked
//! strictly, batch mode (never a prompt).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use openssh::{ForwardType, KnownHosts, Session, SessionBuilder, Socket, Stdio};
use tokio::io::AsyncWriteExt;

use super::{error_chain, Host, Limits, Output, RemoteError, SshOptions};

pub struct SshHost {
    name: String,
    options: SshOptions,
    /// Replaced by `reconnect` after the connection broke (the host rebooted); commands in flight
    /// keep the old one until they end.
    session: std::sync::Mutex<Arc<Session>>,
    /// sshd allows 10 sessions per connection by default (MaxSessions); commands beyond that
    /// wait here rather than fail there.
    sessions: tokio::sync::Semaphore,
}

const SESSIONS_AT_ONCE: usize = 8;

/// How often ssh checks that the host still answers (ssh's ServerAliveInterval; 3 misses end it).
const KEEPALIVE: std::time::Duration = std::time::Duration::from_secs(20);

impl SshHost {
    pub async fn connect(name: &str, options: &SshOptions) -> Result<SshHost, RemoteError> {
        Ok(SshHost {
            name: name.to_string(),
            options: options.clone(),
            session: std::sync::Mutex::new(Arc::new(open(name, options).await?)),
            sessions: tokio::sync::Semaphore::new(SESSIONS_AT_ONCE),
        })
    }

    fn session(&self) -> Arc<Session> {
        Arc::clone(&self.session.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Opens a new connection in place of the current one (port forwards do not carry over).
    async fn reopen(&self) -> Result<(), RemoteError> {
        let session = Arc::new(open(&self.name, &self.options).await?);
        *self.session.lock().unwrap_or_else(|e| e.into_inner()) = session;
        Ok(())
    }
}

/// sshd counts a session as open until its close reaches it, so right after a command ends a new
/// one can still find MaxSessions full, even though no more than `SESSIONS_AT_ONCE` run here. Such
/// a refusal is transient: it is retried for a few seconds before it counts as a failure.
async fn spawn_when_sshd_allows<'s>(
    command: &mut openssh::OwningCommand<&'s Session>,
) -> Result<openssh::Child<&'s Session>, openssh::Error> {
    let mut wait = std::time::Duration::from_millis(20);
    let mut waited = std::time::Duration::ZERO;
    loop {
        match command.spawn().await {
            Err(openssh::Error::SshMux(e))
                if e.to_string().contains("Session open refused")
                    && waited < std::time::Duration::from_secs(5) =>
            {
                tracing::debug!(error = %e, "sshd refused a session; retrying");
                tokio::time::sleep(wait).await;
                waited += wait;
                wait = (wait * 2).min(std::time::Duration::from_millis(500));
            }
            other => return other,
        }
    }
}

/// One connection to `name`, with the user's ssh config and strict host key checking.
async fn open(name: &str, options: &SshOptions) -> Result<Session, RemoteError> {
    let mut builder = SessionBuilder::default();
    // Host keys are always checked; there is no option to turn that off. New hosts' keys are
    // recorded only when the operator asked for it.
    builder.known_hosts_check(if options.accept_new_host_keys {
        KnownHosts::Add
    } else {
        KnownHosts::Strict
    });
    // A link that dies without a reset (a cable, a switch, a host frozen mid-reboot) must not hang
    // an apply until TCP gives up, many minutes later: ssh asks every 20 s and gives up after 3
    // unanswered asks. A blip shorter than that is ridden out: breaking the connection would roll
    // back a deploy that may be fine, and cost another model load.
    builder.server_alive_interval(KEEPALIVE);
    // The control socket path must stay short (a Unix socket limit), whatever the cwd.
    builder.control_directory(std::env::temp_dir());
    if let Some(config) = &options.config_file {
        builder.config_file(config);
    }
    if let Some(timeout) = options.connect_timeout {
        builder.connect_timeout(timeout);
    }
    // ssh says why it could not connect in its log; one that ends with an empty log was stopped
    // from outside before it could say (a signal), which says nothing about the host: it is
    // asked once more, and a second silent end is reported as such.
    let to = destination(name);
    let mut result = builder.connect_mux(&to).await;
    if result.as_ref().err().is_some_and(is_silent) {
        tracing::debug!(
            host = name,
            "ssh ended without a reason; connecting once more"
        );
        result = builder.connect_mux(&to).await;
    }
    result.map_err(|source| RemoteError::Connect {
        host: name.to_string(),
        source: if is_silent(&source) {
            openssh::Error::Connect(std::io::Error::other(
                "ssh ended twice without saying why (its log was empty)",
            ))
        } else {
            source
        },
    })
}

/// A failed connection whose ssh left no reason in its log.
fn is_silent(error: &openssh::Error) -> bool {
    matches!(error, openssh::Error::Connect(e) if e.to_string().trim().is_empty())
}

#[async_trait]
impl Host for SshHost {
    fn name(&self) -> &str {
        &self.name
    }

    fn limits(&self) -> &Limits {
        &self.options.limits
    }

    async fn run_within(
        &self,
        argv: &[&str],
        input: Option<&[u8]>,
        limit: Duration,
    ) -> Result<Output, RemoteError> {
        super::within_limit(&self.name, argv, limit, self.exec(argv, input)).await
    }

    /// Forwards a free local port to `address:port` as the host sees it (its loopback, or the
    /// address the server binds); returns the local end.
    async fn forward(&self, address: &str, port: u16) -> Result<(String, u16), RemoteError> {
        self.forward_port(address, port)
            .await
            .map(|local| ("127.0.0.1".to_string(), local))
    }

    /// Whether the connection still carries commands.
    async fn connected(&self) -> bool {
        self.session().check().await.is_ok()
    }

    async fn reconnect(&self, within: Duration) -> Result<Duration, RemoteError> {
        let started = std::time::Instant::now();
        let mut wait = Duration::from_millis(500);
        loop {
            match self.reopen().await {
                Ok(()) => return Ok(started.elapsed()),
                Err(e) if started.elapsed() >= within => return Err(e),
                Err(e) => {
                    tracing::debug!(host = %self.name, error = %error_chain(&e), "reconnecting")
                }
            }
            // The last attempt falls on the deadline, not a backoff step before it.
            tokio::time::sleep(wait.min(within.saturating_sub(started.elapsed()))).await;
            wait = (wait * 2).min(Duration::from_secs(5));
        }
    }

    async fn close(self: Box<Self>) {
        let session = self.session.into_inner().unwrap_or_else(|e| e.into_inner());
        // Shared only while a command runs, and none runs once the host is closed.
        let Ok(session) = Arc::try_unwrap(session) else {
            return;
        };
        if let Err(e) = session.close().await {
            tracing::debug!(host = %self.name, error = %e, "closing the ssh connection");
        }
    }
}

impl SshHost {
    /// Runs a command however long it takes; [`Host::run_within`] bounds it.
    async fn exec(&self, argv: &[&str], input: Option<&[u8]>) -> Result<Output, RemoteError> {
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
        let session = self.session();
        let mut command = session.command(argv[0]);
        command
            .args(&argv[1..])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command.stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        let mut child = spawn_when_sshd_allows(&mut command)
            .await
            .map_err(|e| transport(Box::new(e)))?;
        if let (Some(bytes), Some(mut stdin)) = (input, child.stdin().take()) {
            let written = stdin.write_all(bytes).await.and(stdin.shutdown().await);
            super::input_taken(written).map_err(|e| transport(Box::new(e)))?;
        }
        // As `wait_with_output` does, stdin closed first, but each output read only up to its
        // bound.
        child.stdin().take();
        let (stdout, stderr) = (child.stdout().take(), child.stderr().take());
        let output = self.options.limits.output_for(argv);
        let (stdout, stderr) = match super::read_outputs(stdout, stderr, output).await {
            Ok(read) => read,
            Err(unread) => {
                // Our ends of the pipes are closed and the session is let go: ssh tells sshd the
                // output is no longer read (`eow@openssh.com`) and closes the channel, so the
                // remote command's next write fails (SIGPIPE) and it ends. No local process is
                // left: the connection's one ssh carries every command.
                if let Err(e) = child.disconnect().await {
                    tracing::debug!(host = %self.name, error = %e, "letting go of a command");
                }
                return Err(unread.error(&self.name, argv));
            }
        };
        let status = child.wait().await.map_err(|e| transport(Box::new(e)))?;
        Ok(Output {
            status: status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
        })
    }

    /// Forwards a free local port to `address:port` as the host sees it; returns the local port.
    async fn forward_port(&self, address: &str, port: u16) -> Result<u16, RemoteError> {
        let local = std::net::TcpListener::bind(("127.0.0.1", 0))
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| RemoteError::Transport {
                host: self.name.clone(),
                command: "port forward".into(),
                source: Box::new(e),
            })?;
        self.session()
            .request_port_forward(
                ForwardType::Local,
                Socket::new("127.0.0.1", local),
                Socket::new(address, port),
            )
            .await
            .map_err(|e| RemoteError::Transport {
                host: self.name.clone(),
                command: format!("port forward to {address}:{port}"),
                source: Box::new(e),
            })?;
        Ok(local)
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
    use super::{destination, is_silent};

    #[test]
    fn only_an_empty_ssh_log_is_silent() {
        let said = |text: &str| {
            openssh::Error::Connect(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                text,
            ))
        };
        assert!(is_silent(&said("")));
        assert!(is_silent(&said(" \n")));
        assert!(!is_silent(&said(
            "connect to host 10.0.0.9 port 22: No route to host"
        )));
        // An error of this machine's own (ssh could not start) is not ssh's silence.
        let not_found = std::io::Error::from(std::io::ErrorKind::NotFound);
        assert!(!is_silent(&openssh::Error::Connect(not_found)));
    }

    #[test]
    fn ports_move_into_the_uri_form() {
        assert_eq!(destination("root@gpu-a:2222"), "ssh://root@gpu-a:2222");
        assert_eq!(destination("gpu-a"), "gpu-a");
        assert_eq!(destination("root@gpu-a"), "root@gpu-a");
    }
}
