//! An in-memory host for unit tests: files in a map, commands answered from a script, every
//! command recorded, and a connection that can be made to hang or break, so the layers above the
//! edge are tested without a machine to reach.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;

use super::{command_name, label, Host, Limits, Output, RemoteError};

/// How the fake answers one command.
#[derive(Debug, Clone)]
pub enum Reply {
    /// The command ran and printed this.
    Output(Output),
    /// The command did not answer within its limit: [`RemoteError::TimedOut`] at once, without
    /// waiting the limit out.
    Hang,
    /// The command waits its limit out, then times out: a host behind a cut link, on tokio's
    /// clock (a paused test clock runs through it).
    Stall,
    /// The connection broke under the command: it fails as a transport error, and so does every
    /// command after it until a `reconnect`.
    Disconnect,
}

impl Reply {
    /// Exit 0 with `stdout`.
    pub fn ok(stdout: &str) -> Reply {
        Reply::exit(0, stdout, "")
    }

    pub fn exit(status: i32, stdout: &str, stderr: &str) -> Reply {
        Reply::Output(Output {
            status,
            stdout: stdout.to_string(),
            stderr: stderr.to_string(),
        })
    }
}

type Handler = Box<dyn Fn(&[&str], Option<&[u8]>) -> Reply + Send + Sync>;

/// A scripted answer to the commands whose argv starts with `prefix`.
struct Rule {
    prefix: Vec<String>,
    answer: Answer,
}

enum Answer {
    /// Used up by the first command it answers.
    Once(Reply),
    Always(Handler),
}

/// An in-memory [`Host`]. A command is answered by the first `once` reply whose prefix it starts
/// with, else by the last-added standing rule that matches, else as a shell answers an unknown
/// command (exit 127).
pub struct FakeHost {
    name: String,
    limits: Limits,
    files: Mutex<BTreeMap<String, String>>,
    /// The mode each file was last written with.
    modes: Mutex<BTreeMap<String, String>>,
    rules: Mutex<Vec<Rule>>,
    once: Mutex<VecDeque<Rule>>,
    commands: Mutex<Vec<Vec<String>>>,
    /// Each command's standard input, in the order of `commands`.
    inputs: Mutex<Vec<Vec<u8>>>,
    connected: AtomicBool,
}

impl FakeHost {
    pub fn new(name: &str) -> FakeHost {
        FakeHost {
            name: name.to_string(),
            limits: Limits::default(),
            files: Mutex::new(BTreeMap::new()),
            modes: Mutex::new(BTreeMap::new()),
            rules: Mutex::new(Vec::new()),
            once: Mutex::new(VecDeque::new()),
            commands: Mutex::new(Vec::new()),
            inputs: Mutex::new(Vec::new()),
            connected: AtomicBool::new(true),
        }
    }

    pub fn with_file(self, path: &str, text: &str) -> FakeHost {
        self.files
            .lock()
            .unwrap()
            .insert(path.to_string(), text.to_string());
        self
    }

    /// Answers every command that starts with `prefix` with `reply`.
    pub fn on(self, prefix: &[&str], reply: Reply) -> FakeHost {
        self.on_with(prefix, move |_, _| reply.clone())
    }

    /// Answers every command that starts with `prefix` by calling `handler` with its argv and
    /// standard input.
    pub fn on_with(
        self,
        prefix: &[&str],
        handler: impl Fn(&[&str], Option<&[u8]>) -> Reply + Send + Sync + 'static,
    ) -> FakeHost {
        self.rules.lock().unwrap().push(Rule {
            prefix: owned(prefix),
            answer: Answer::Always(Box::new(handler)),
        });
        self
    }

    /// Answers the next command that starts with `prefix` with `reply`, once; queued replies
    /// come before standing ones and are used in the order given.
    pub fn once(self, prefix: &[&str], reply: Reply) -> FakeHost {
        self.once.lock().unwrap().push_back(Rule {
            prefix: owned(prefix),
            answer: Answer::Once(reply),
        });
        self
    }

    /// Every command run so far, in order.
    /// Each command's standard input (empty where it had none), in the order of [`commands`].
    pub fn inputs(&self) -> Vec<Vec<u8>> {
        self.inputs.lock().unwrap().clone()
    }

    pub fn commands(&self) -> Vec<Vec<String>> {
        self.commands.lock().unwrap().clone()
    }

    /// The mode a file was last written with.
    pub fn mode(&self, path: &str) -> Option<String> {
        self.modes.lock().unwrap().get(path).cloned()
    }

    /// A file's text as the host has it now.
    pub fn file(&self, path: &str) -> Option<String> {
        self.files.lock().unwrap().get(path).cloned()
    }

    /// Breaks the connection: every command fails until a `reconnect`.
    pub fn disconnect(&self) {
        self.connected.store(false, Ordering::SeqCst);
    }

    fn reply(&self, argv: &[&str], input: Option<&[u8]>) -> Reply {
        let starts = |prefix: &[String]| {
            prefix.len() <= argv.len() && prefix.iter().zip(argv).all(|(p, a)| p == a)
        };
        {
            let mut once = self.once.lock().unwrap();
            if let Some(at) = once.iter().position(|r| starts(&r.prefix)) {
                if let Some(Rule {
                    answer: Answer::Once(reply),
                    ..
                }) = once.remove(at)
                {
                    return reply;
                }
            }
        }
        let rules = self.rules.lock().unwrap();
        match rules.iter().rev().find(|r| starts(&r.prefix)) {
            Some(Rule {
                answer: Answer::Always(handler),
                ..
            }) => handler(argv, input),
            _ => Reply::exit(
                127,
                "",
                &format!("fake: no answer scripted for `{}`", argv.join(" ")),
            ),
        }
    }

    fn broken(&self, command: String) -> RemoteError {
        RemoteError::Transport {
            host: self.name.clone(),
            command,
            source: Box::new(std::io::Error::new(
                std::io::ErrorKind::BrokenPipe,
                "the connection is broken",
            )),
        }
    }

    fn check_connected(&self, command: impl FnOnce() -> String) -> Result<(), RemoteError> {
        if self.connected.load(Ordering::SeqCst) {
            Ok(())
        } else {
            Err(self.broken(command()))
        }
    }
}

fn owned(argv: &[&str]) -> Vec<String> {
    argv.iter().map(|a| a.to_string()).collect()
}

#[async_trait]
impl Host for FakeHost {
    fn name(&self) -> &str {
        &self.name
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
        self.commands.lock().unwrap().push(owned(argv));
        self.inputs
            .lock()
            .unwrap()
            .push(input.unwrap_or_default().to_vec());
        self.check_connected(|| label(argv))?;
        match self.reply(argv, input) {
            Reply::Output(out) => Ok(out),
            Reply::Hang => Err(RemoteError::TimedOut {
                host: self.name.clone(),
                command: command_name(argv),
                after: limit,
            }),
            Reply::Stall => {
                tokio::time::sleep(limit).await;
                Err(RemoteError::TimedOut {
                    host: self.name.clone(),
                    command: command_name(argv),
                    after: limit,
                })
            }
            Reply::Disconnect => {
                self.disconnect();
                Err(self.broken(label(argv)))
            }
        }
    }

    async fn read_file(&self, path: &str) -> Result<Option<String>, RemoteError> {
        self.check_connected(|| format!("cat {path}"))?;
        Ok(self.file(path))
    }

    async fn write_file(&self, path: &str, content: &str, mode: &str) -> Result<(), RemoteError> {
        self.check_connected(|| format!("write {path}"))?;
        self.modes
            .lock()
            .unwrap()
            .insert(path.to_string(), mode.to_string());
        self.files
            .lock()
            .unwrap()
            .insert(path.to_string(), content.to_string());
        Ok(())
    }

    /// Nothing is listening anywhere: the address is handed back as it is.
    async fn forward(&self, address: &str, port: u16) -> Result<(String, u16), RemoteError> {
        self.check_connected(|| format!("port forward to {address}:{port}"))?;
        Ok((address.to_string(), port))
    }

    async fn connected(&self) -> bool {
        self.connected.load(Ordering::SeqCst)
    }

    async fn reconnect(&self, _within: Duration) -> Result<Duration, RemoteError> {
        self.connected.store(true, Ordering::SeqCst);
        Ok(Duration::ZERO)
    }

    async fn close(self: Box<Self>) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn commands_are_answered_by_prefix_and_recorded() {
        let fake = FakeHost::new("gpu-a")
            .on(&["systemctl"], Reply::ok("any systemctl\n"))
            .on(&["systemctl", "show"], Reply::ok("ActiveState=active\n"))
            .once(
                &["systemctl", "show"],
                Reply::ok("ActiveState=activating\n"),
            );
        // Held as callers hold a host.
        let host: &dyn Host = &fake;
        let show = ["systemctl", "show", "-p", "ActiveState", "--", "a.service"];
        assert_eq!(
            host.run_ok(&show).await.unwrap(),
            "ActiveState=activating\n"
        );
        assert_eq!(host.run_ok(&show).await.unwrap(), "ActiveState=active\n");
        assert_eq!(
            host.run_ok(&["systemctl", "daemon-reload"]).await.unwrap(),
            "any systemctl\n"
        );
        let unknown = host.run(&["nvidia-smi", "-L"]).await.unwrap();
        assert_eq!(unknown.status, 127);
        assert_eq!(
            host.run_ok(&["nvidia-smi", "-L"])
                .await
                .unwrap_err()
                .to_string(),
            "gpu-a: `nvidia-smi -L` exited with 127: fake: no answer scripted for `nvidia-smi -L`"
        );
        let recorded = fake.commands();
        assert_eq!(recorded.len(), 5);
        assert_eq!(recorded[0], owned(&show));
        assert_eq!(recorded[2], owned(&["systemctl", "daemon-reload"]));
    }

    #[tokio::test]
    async fn a_handler_sees_the_argv_and_the_input() {
        let host = FakeHost::new("h").on_with(&["sh", "-c"], |argv, input| {
            Reply::ok(&format!(
                "{} {}",
                argv.len(),
                String::from_utf8_lossy(input.unwrap_or_default())
            ))
        });
        let out = host
            .run_with_input(&["sh", "-c", "cat", "sh"], Some(b"hello"))
            .await
            .unwrap();
        assert_eq!(out.stdout, "4 hello");
    }

    #[tokio::test]
    async fn files_live_in_the_map() {
        let host = FakeHost::new("h").with_file("/etc/a", "old");
        assert_eq!(
            host.read_file("/etc/a").await.unwrap().as_deref(),
            Some("old")
        );
        assert_eq!(host.read_file("/etc/b").await.unwrap(), None);
        host.write_file("/etc/a", "new", "0644").await.unwrap();
        assert_eq!(host.file("/etc/a").as_deref(), Some("new"));
        assert!(host.commands().is_empty());
    }

    #[tokio::test]
    async fn a_hang_is_a_timeout_with_the_commands_limit() {
        let host = FakeHost::new("gpu-a")
            .on(&["nvidia-smi"], Reply::Hang)
            .on(&["systemctl"], Reply::Hang);
        let e = host.run(&["nvidia-smi", "-L"]).await.unwrap_err();
        assert_eq!(e.to_string(), "`nvidia-smi` on gpu-a did not answer in 30s");
        let e = host
            .run(&["systemctl", "restart", "--", "a"])
            .await
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "`systemctl restart` on gpu-a did not answer in 10m"
        );
        // Only what is scripted to hang hangs.
        assert_eq!(host.run(&["true"]).await.unwrap().status, 127);
    }

    #[tokio::test]
    async fn a_broken_connection_fails_everything_until_a_reconnect() {
        let host = FakeHost::new("gpu-a")
            .on(&["true"], Reply::ok(""))
            .once(&["reboot"], Reply::Disconnect);
        assert!(host.connected().await);
        assert!(matches!(
            host.run(&["reboot"]).await.unwrap_err(),
            RemoteError::Transport { .. }
        ));
        assert!(!host.connected().await);
        assert!(host.run(&["true"]).await.is_err());
        assert!(host.read_file("/x").await.is_err());
        host.reconnect(Duration::from_secs(1)).await.unwrap();
        assert!(host.run(&["true"]).await.is_ok());
        assert_eq!(host.commands().len(), 3);
    }
}
