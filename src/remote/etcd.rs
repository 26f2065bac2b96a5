//! An etcd v3 cluster, as a key-value store with leases: what the pull agents' coordinator is built
//! on. This file speaks etcd (through the `etcd-client` crate) and knows nothing of rollouts: the
//! keys and what they mean are one layer up.
//!
//! TLS and authentication work as in etcd's own clients: `--cacert`, `--cert`/`--key` (client
//! certificates) and a user with a password. The password is read from a file or the environment
//! by the caller and never appears in an error, a log line or `Debug`.

use std::path::PathBuf;
use std::time::Duration;

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, Identity, PutOptions,
    TlsOptions, Txn, TxnOp,
};
use tokio::sync::watch;

/// How to reach the cluster.
#[derive(Clone, Default)]
pub struct EtcdOptions {
    /// `http://host:2379` or `https://host:2379`, one per member.
    pub endpoints: Vec<String>,
    /// The CA that signed the members' certificates (`--cacert`); turns TLS on.
    pub ca: Option<PathBuf>,
    /// A client certificate and its key (`--cert`, `--key`), for clusters that ask for one.
    pub identity: Option<(PathBuf, PathBuf)>,
    /// A user and password (etcd's `--user`), for clusters with authentication on.
    pub user: Option<(String, String)>,
    /// How long connecting to a member may take.
    pub connect_timeout: Duration,
    /// How long one request may take.
    pub request_timeout: Duration,
}

impl std::fmt::Debug for EtcdOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdOptions")
            .field("endpoints", &self.endpoints)
            .field("ca", &self.ca)
            .field("identity", &self.identity)
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("cannot read {what} {path}")]
    File {
        what: &'static str,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot reach etcd at {endpoints}: {message}")]
    Connect { endpoints: String, message: String },
    #[error("etcd at {endpoints} did not answer {what} within {}s", timeout.as_secs_f64())]
    Timeout {
        endpoints: String,
        what: &'static str,
        timeout: Duration,
    },
    #[error("{what} to etcd at {endpoints} failed: {message}{}", if *.closed_plain { " (a member that serves TLS closes plain http connections: is TLS on?)" } else { "" })]
    Request {
        endpoints: String,
        what: &'static str,
        message: String,
        /// A plain-http connection the member accepted, then closed: what one that serves TLS
        /// does (callers say how to give its CA).
        closed_plain: bool,
    },
    #[error("{key} in etcd is not UTF-8 text")]
    NotText { key: String },
}

impl EtcdError {
    /// A member that serves TLS was asked in plain http.
    pub fn plain_to_tls(&self) -> bool {
        matches!(
            self,
            EtcdError::Request {
                closed_plain: true,
                ..
            }
        )
    }
}

/// A key and its value, as one read saw them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub key: String,
    pub value: String,
}

/// Every key under a prefix at one revision of the cluster.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The cluster's revision the read saw: a transaction can require that nothing under a
    /// prefix changed since.
    pub revision: i64,
    pub entries: Vec<Entry>,
}

/// A key to write in a transaction, on a lease or not.
#[derive(Debug, Clone)]
pub struct Put {
    pub key: String,
    pub value: String,
    pub lease: Option<i64>,
}

/// A connection to the cluster.
#[derive(Clone)]
pub struct Etcd {
    client: Client,
    endpoints: String,
    timeout: Duration,
    spent: std::sync::Arc<Spent>,
}

/// What this connection's requests have cost so far: how many, and how long they took in all
/// (connecting included). Lease renewals in the background are not counted.
#[derive(Debug, Default)]
pub struct Spent {
    requests: std::sync::atomic::AtomicU64,
    micros: std::sync::atomic::AtomicU64,
}

impl Spent {
    fn add(&self, requests: u64, took: Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        self.requests.fetch_add(requests, Relaxed);
        self.micros.fetch_add(took.as_micros() as u64, Relaxed);
    }

    /// Requests made and the time they took.
    pub fn read(&self) -> (u64, Duration) {
        use std::sync::atomic::Ordering::Relaxed;
        (
            self.requests.load(Relaxed),
            Duration::from_micros(self.micros.load(Relaxed)),
        )
    }
}

impl Etcd {
    pub async fn connect(options: &EtcdOptions) -> Result<Etcd, EtcdError> {
        let endpoints = options.endpoints.join(",");
        let mut connect = ConnectOptions::new()
            .with_connect_timeout(options.connect_timeout)
            .with_timeout(options.request_timeout)
            // Without it a member that vanished (a partition) is noticed only when a request
            // times out; with it the channel learns within seconds and tries the next member.
            .with_keep_alive(Duration::from_secs(5), Duration::from_secs(5));
        if let Some(ca) = &options.ca {
            let mut tls = TlsOptions::new().ca_certificate(Certificate::from_pem(read(
                "the coordinator's CA certificate",
                ca,
            )?));
            if let Some((cert, key)) = &options.identity {
                tls = tls.identity(Identity::from_pem(
                    read("the coordinator client certificate", cert)?,
                    read("the coordinator client key", key)?,
                ));
            }
            connect = connect.with_tls(tls);
        }
        if let Some((user, password)) = &options.user {
            connect = connect.with_user(user.clone(), password.clone());
        }
        let began = std::time::Instant::now();
        let connecting = Client::connect(options.endpoints.clone(), Some(connect));
        let client = tokio::time::timeout(options.connect_timeout, connecting)
            .await
            .map_err(|_| EtcdError::Connect {
                endpoints: endpoints.clone(),
                message: format!(
                    "no member answered within {}s",
                    options.connect_timeout.as_secs_f64()
                ),
            })?
            .map_err(|e| EtcdError::Connect {
                endpoints: endpoints.clone(),
                message: e.to_string(),
            })?;
        let spent = std::sync::Arc::new(Spent::default());
        // Connecting is no request (with a user, it is one: the authentication).
        spent.add(u64::from(options.user.is_some()), began.elapsed());
        Ok(Etcd {
            client,
            endpoints,
            timeout: options.request_timeout,
            spent,
        })
    }

    /// What this connection's requests have cost so far.
    pub fn spent(&self) -> (u64, Duration) {
        self.spent.read()
    }

    /// A request, bounded by the request timeout, its error in words.
    async fn ask<T>(
        &self,
        what: &'static str,
        request: impl std::future::Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, EtcdError> {
        let began = std::time::Instant::now();
        let answer = tokio::time::timeout(self.timeout, request).await;
        self.spent.add(1, began.elapsed());
        match answer {
            Err(_) => Err(EtcdError::Timeout {
                endpoints: self.endpoints.clone(),
                what,
                timeout: self.timeout,
            }),
            Ok(Err(e)) => {
                let message = e.to_string();
                // What a member that serves TLS does to a plain connection: it accepts, then
                // closes it (a member that is down refuses the connection instead). etcd-client
                // says which only in its text.
                let closed = message.contains("Error(Transport")
                    && !message.contains("refused")
                    && !message.contains("ConnectError");
                Err(EtcdError::Request {
                    endpoints: self.endpoints.clone(),
                    what,
                    message,
                    closed_plain: closed && self.endpoints.starts_with("http://"),
                })
            }
            Ok(Ok(v)) => Ok(v),
        }
    }

    /// Every key under `prefix`, in one round trip.
    pub async fn range(&self, prefix: &str) -> Result<Snapshot, EtcdError> {
        let mut kv = self.client.kv_client();
        let response = self
            .ask(
                "a read",
                kv.get(prefix, Some(GetOptions::new().with_prefix())),
            )
            .await?;
        let revision = response.header().map_or(0, |h| h.revision());
        let entries = response
            .kvs()
            .iter()
            .map(|kv| {
                let key = String::from_utf8_lossy(kv.key()).into_owned();
                match std::str::from_utf8(kv.value()) {
                    Ok(value) => Ok(Entry {
                        key,
                        value: value.to_string(),
                    }),
                    Err(_) => Err(EtcdError::NotText { key }),
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(Snapshot { revision, entries })
    }

    /// One key's value, in one round trip.
    pub async fn get(&self, key: &str) -> Result<Option<String>, EtcdError> {
        let mut kv = self.client.kv_client();
        let response = self.ask("a read", kv.get(key, None)).await?;
        match response.kvs().first() {
            None => Ok(None),
            Some(kv) => std::str::from_utf8(kv.value())
                .map(|v| Some(v.to_string()))
                .map_err(|_| EtcdError::NotText {
                    key: key.to_string(),
                }),
        }
    }

    /// Writes `puts` and deletes `deletes` at once, if no key under any of `unchanged` was
    /// created or modified after `since` (a [`Snapshot::revision`]); `unchanged` empty: always.
    /// Returns whether it wrote. One round trip.
    pub async fn write_if_unchanged(
        &self,
        unchanged: &[&str],
        since: i64,
        puts: &[Put],
        deletes: &[&str],
    ) -> Result<bool, EtcdError> {
        let compares: Vec<Compare> = unchanged
            .iter()
            .map(|prefix| {
                Compare::mod_revision(*prefix, CompareOp::Less, since + 1)
                    .with_range(range_end(prefix))
            })
            .collect();
        let mut ops: Vec<TxnOp> = puts
            .iter()
            .map(|p| {
                let options = p.lease.map(|id| PutOptions::new().with_lease(id));
                TxnOp::put(p.key.as_str(), p.value.as_str(), options)
            })
            .collect();
        ops.extend(deletes.iter().map(|k| TxnOp::delete(*k, None)));
        let txn = Txn::new().when(compares).and_then(ops);
        let mut kv = self.client.kv_client();
        let response = self.ask("a transaction", kv.txn(txn)).await?;
        Ok(response.succeeded())
    }

    /// Writes and deletes at once, unconditionally. One round trip.
    pub async fn write(&self, puts: &[Put], deletes: &[&str]) -> Result<(), EtcdError> {
        self.write_if_unchanged(&[], 0, puts, deletes)
            .await
            .map(|_| ())
    }

    /// A lease of `ttl`, kept alive from here on until [`Lease::release`] or until the
    /// process dies, when the cluster lets it run out and deletes every key written on it.
    pub async fn lease(&self, ttl: Duration) -> Result<Lease, EtcdError> {
        let seconds = ttl.as_secs().max(2) as i64;
        let mut lease = self.client.lease_client();
        let granted = self.ask("a lease", lease.grant(seconds, None)).await?;
        let id = granted.id();
        let (lost_tx, lost) = watch::channel(false);
        let etcd = self.clone();
        // Renewed three times per TTL: one lost renewal (a slow member) does not lose the lease.
        let every = Duration::from_millis((seconds as u64 * 1000) / 3);
        let keeper = tokio::spawn(async move {
            let mut leases = etcd.client.lease_client();
            let Ok((mut keeper, mut answers)) = leases.keep_alive(id).await else {
                let _ = lost_tx.send(true);
                return;
            };
            loop {
                tokio::time::sleep(every).await;
                let renewed = async {
                    keeper.keep_alive().await?;
                    answers.message().await
                };
                match tokio::time::timeout(etcd.timeout, renewed).await {
                    // A TTL of 0 in the answer: the cluster no longer has the lease.
                    Ok(Ok(Some(answer))) if answer.ttl() > 0 => {}
                    Ok(Ok(Some(_))) => {
                        let _ = lost_tx.send(true);
                        return;
                    }
                    // The stream broke or the member did not answer: open a new one and keep
                    // trying, for the lease may still be alive on the cluster.
                    _ => match leases.keep_alive(id).await {
                        Ok((k, a)) => {
                            keeper = k;
                            answers = a;
                        }
                        Err(_) => continue,
                    },
                }
            }
        });
        Ok(Lease { id, keeper, lost })
    }

    /// Ends a lease now: its keys go at once.
    pub async fn revoke(&self, id: i64) -> Result<(), EtcdError> {
        let mut lease = self.client.lease_client();
        self.ask("a lease revocation", lease.revoke(id))
            .await
            .map(|_| ())
    }
}

/// A lease this process keeps alive.
#[derive(Debug)]
pub struct Lease {
    pub id: i64,
    keeper: tokio::task::JoinHandle<()>,
    lost: watch::Receiver<bool>,
}

impl Lease {
    /// Whether the cluster said the lease is gone (it ran out while the keeper could not reach
    /// the cluster).
    pub fn lost(&self) -> bool {
        *self.lost.borrow()
    }

    /// Stops keeping it alive and revokes it, so its keys go now rather than after the TTL.
    pub async fn release(self, etcd: &Etcd) -> Result<(), EtcdError> {
        self.keeper.abort();
        etcd.revoke(self.id).await
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

fn read(what: &'static str, path: &PathBuf) -> Result<Vec<u8>, EtcdError> {
    std::fs::read(path).map_err(|source| EtcdError::File {
        what,
        path: path.display().to_string(),
        source,
    })
}

/// The end of the key range holding every key that starts with `prefix`: the prefix with its
/// last byte raised by one (etcd's own rule for `--prefix`).
fn range_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_range_end_covers_exactly_the_prefix() {
        assert_eq!(range_end("/a/"), b"/a0".to_vec());
        let end = range_end("/r/services/s/slots/");
        assert!(b"/r/services/s/slots/gpu-z".as_slice() < end.as_slice());
        assert!(b"/r/services/s/slotsz".as_slice() >= end.as_slice());
    }

    #[test]
    fn debug_never_shows_the_password() {
        let o = EtcdOptions {
            user: Some(("agent".into(), "hunter2-secret".into())),
            ..EtcdOptions::default()
        };
        let shown = format!("{o:?}");
        assert!(
            shown.contains("agent") && !shown.contains("hunter2"),
            "{shown}"
        );
    }
}
