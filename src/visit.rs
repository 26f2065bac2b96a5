//! Visiting a fleet: for each host, at most N at once, connect, do its work, close; a host that
//! cannot be reached gets its caller's error result instead. Results come back in the hosts'
//! order. Plan, status, history, apply's survey and rollout, and `--rollback-all` all reach hosts
//! this way, so each says only what it does on a host and what an unreachable host means to it.

use std::collections::BTreeMap;
use std::time::Instant;

use futures::stream::{self, StreamExt};
use tracing::Instrument;

use crate::remote::{self, Host, RemoteError, SshOptions};
use crate::targets::Target;

/// A host's turn, as its work and its unreachable result see it.
pub struct Visit<'a> {
    /// The host, as named in the manifests (and given to `remote::connect`).
    pub name: &'a str,
    /// When the turn began, before connecting: reports time a host's turn from here.
    pub started: Instant,
}

/// Runs `work` on each host over one connection, at most `at_once` hosts at once (at least one),
/// and closes the connection after it. A host whose connection fails gets `unreachable` instead.
/// Each host's turn, its connection included, runs inside `span(name)`.
pub async fn each_host<I, T>(
    hosts: impl IntoIterator<Item = (String, I)>,
    ssh: &SshOptions,
    at_once: usize,
    span: impl Fn(&str) -> tracing::Span,
    work: impl AsyncFn(&dyn Host, &Visit<'_>, I) -> T,
    unreachable: impl Fn(&Visit<'_>, I, RemoteError) -> T,
) -> Vec<T> {
    let (work, unreachable) = (&work, &unreachable);
    stream::iter(hosts)
        .map(|(name, input)| {
            let span = span(&name);
            async move {
                let visit = Visit {
                    name: &name,
                    started: Instant::now(),
                };
                match remote::connect(&name, ssh).await {
                    Ok(host) => {
                        let done = work(&*host, &visit, input).await;
                        host.close().await;
                        done
                    }
                    Err(e) => unreachable(&visit, input, e),
                }
            }
            .instrument(span)
        })
        .buffered(at_once.max(1))
        .collect()
        .await
}

/// `targets` grouped by host, as [`each_host`] takes them, and in the order its results come
/// back (which a server group's ranks are found in).
pub fn by_host(targets: Vec<Target>) -> (BTreeMap<String, Vec<Target>>, Vec<Target>) {
    let by_host = crate::targets::by_host(targets);
    let ordered = by_host.values().flatten().cloned().collect();
    (by_host, ordered)
}

/// For a caller whose hosts' turns need no span of their own.
pub fn no_span(_: &str) -> tracing::Span {
    tracing::Span::none()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::remote::{Limits, Stream};

    #[tokio::test]
    async fn a_host_that_floods_its_answer_fails_alone() {
        let ssh = SshOptions {
            limits: Limits {
                stdout: 64 << 10,
                ..Limits::default()
            },
            ..SshOptions::default()
        };
        // Two turns on this machine: the first answers without end, the second as a host should.
        let hosts = [
            ("local".to_string(), "exec yes flood"),
            ("local".to_string(), "echo fine"),
        ];
        let results = each_host(
            hosts,
            &ssh,
            2,
            no_span,
            async |host: &dyn Host, _: &Visit<'_>, script: &str| {
                host.run(&["sh", "-c", script]).await.map(|out| out.stdout)
            },
            |_, _, e| Err(e),
        )
        .await;
        assert!(
            matches!(
                &results[0],
                Err(RemoteError::TooLarge {
                    stream: Stream::Stdout,
                    limit: 65536,
                    ..
                })
            ),
            "{:?}",
            results[0]
        );
        assert_eq!(results[1].as_deref().unwrap(), "fine\n");
    }
}
