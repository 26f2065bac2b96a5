//! `--trace-remote`: one line per remote command, so the round trips a run costs can be counted.
//! On a real network every sequential command is a round trip (tens of ms across sites); what
//! overlaps on the one connection is not.
//!
//! A [`Traced`] host wraps the host `connect` made and reports each command to its [`Trace`]:
//! host, the command's short name (never its arguments, which carry manifest values), duration,
//! exit status, and the command's place in the host's longest chain of commands each started
//! after the one before it ended (`round`), with that chain's length so far (`rounds`: the
//! sequential round trips after connect).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::{command_name, gpu, Host, Limits, Output, RemoteError};

/// Where trace lines go.
#[derive(Clone)]
pub struct Trace {
    sink: Arc<dyn Fn(&str) + Send + Sync>,
}

impl std::fmt::Debug for Trace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Trace")
    }
}

impl Trace {
    /// Lines to stderr, as `--trace-remote` prints them.
    pub fn stderr() -> Trace {
        Trace::to(|line| eprintln!("{line}"))
    }

    pub fn to(sink: impl Fn(&str) + Send + Sync + 'static) -> Trace {
        Trace {
            sink: Arc::new(sink),
        }
    }

    fn line(
        &self,
        host: &str,
        command: &str,
        took: Duration,
        status: &str,
        round: u32,
        rounds: u32,
    ) {
        (self.sink)(&format!(
            "trace-remote host={host} command={command:?} ms={} status={status} round={round} rounds={rounds}",
            took.as_millis()
        ));
    }

    /// The connection itself (round 0: the count is of round trips after connect).
    pub(super) fn connected(&self, host: &str, took: Duration, ok: bool) {
        let status = if ok { "ok" } else { "error" };
        self.line(host, "connect", took, status, 0, 0);
    }
}

/// The chain's state: the longest chain among the commands that ended, and the longest so far.
#[derive(Default)]
struct Rounds {
    ended: u32,
    most: u32,
}

/// A host whose every command is traced.
pub struct Traced {
    inner: Box<dyn Host>,
    trace: Trace,
    rounds: Mutex<Rounds>,
}

impl Traced {
    pub fn new(inner: Box<dyn Host>, trace: Trace) -> Traced {
        Traced {
            inner,
            trace,
            rounds: Mutex::new(Rounds::default()),
        }
    }

    /// A command starting now follows every command that has ended.
    fn start(&self) -> u32 {
        self.rounds.lock().unwrap_or_else(|e| e.into_inner()).ended + 1
    }

    fn end(&self, name: &str, round: u32, started: Instant, status: &str) {
        let rounds = {
            let mut r = self.rounds.lock().unwrap_or_else(|e| e.into_inner());
            r.ended = r.ended.max(round);
            r.most = r.most.max(round);
            r.most
        };
        self.trace.line(
            self.inner.name(),
            name,
            started.elapsed(),
            status,
            round,
            rounds,
        );
    }
}

fn status_of<T>(result: &Result<T, RemoteError>, exit: impl Fn(&T) -> String) -> String {
    match result {
        Ok(v) => exit(v),
        Err(RemoteError::TimedOut { .. }) => "timed-out".into(),
        Err(_) => "error".into(),
    }
}

#[async_trait]
impl Host for Traced {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn limits(&self) -> &Limits {
        self.inner.limits()
    }

    async fn run_within(
        &self,
        argv: &[&str],
        input: Option<&[u8]>,
        limit: Duration,
    ) -> Result<Output, RemoteError> {
        let (round, started) = (self.start(), Instant::now());
        let result = self.inner.run_within(argv, input, limit).await;
        let status = status_of(&result, |o| o.status.to_string());
        self.end(&command_name(argv), round, started, &status);
        result
    }

    async fn forward(&self, address: &str, port: u16) -> Result<(String, u16), RemoteError> {
        let (round, started) = (self.start(), Instant::now());
        let result = self.inner.forward(address, port).await;
        let status = status_of(&result, |_| "0".into());
        self.end("port forward", round, started, &status);
        result
    }

    async fn connected(&self) -> bool {
        self.inner.connected().await
    }

    async fn reconnect(&self, within: Duration) -> Result<Duration, RemoteError> {
        let started = Instant::now();
        let result = self.inner.reconnect(within).await;
        self.trace
            .connected(self.inner.name(), started.elapsed(), result.is_ok());
        result
    }

    async fn close(self: Box<Self>) {
        self.inner.close().await
    }

    async fn native_gpu_memory(&self) -> Result<Option<Vec<gpu::Gpu>>, RemoteError> {
        self.inner.native_gpu_memory().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::Local;

    #[tokio::test]
    async fn each_command_is_a_line_and_overlapping_ones_share_a_round() {
        let lines = Arc::new(Mutex::new(Vec::<String>::new()));
        let sink = Arc::clone(&lines);
        let trace = Trace::to(move |l| sink.lock().unwrap().push(l.to_string()));
        let host = Traced::new(Box::new(Local::new(Limits::default())), trace);
        let secret = "HF_TOKEN=hf_secret";
        let script = [
            "sh",
            "-c",
            "# survey: all of it\nsleep 0.2; exit 3",
            "sh",
            secret,
        ];
        let (a, b) = tokio::join!(host.run(&["sleep", "0.3"]), host.run(&script));
        assert!(a.is_ok() && b.is_ok());
        let hung = host
            .run_within(&["sleep", "5"], None, Duration::from_millis(100))
            .await;
        assert!(hung.is_err());
        let lines = lines.lock().unwrap().clone();
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(
            lines[0].starts_with("trace-remote host=local command=\"survey\" ms="),
            "{lines:?}"
        );
        assert!(lines[1].contains("command=\"sleep\""), "{lines:?}");
        let ends = [
            " status=3 round=1 rounds=1",
            " status=0 round=1 rounds=1",
            " status=timed-out round=2 rounds=2",
        ];
        for (line, end) in lines.iter().zip(ends) {
            assert!(line.ends_with(end), "{lines:?}");
        }
        assert!(lines.iter().all(|l| !l.contains("hf_secret")));
    }
}
