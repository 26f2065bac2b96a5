//! sglang-router's admin API, for rollouts that take a replica out of the router, restart and
//! verify it, and put it back (`apply::rollout`). What the answers mean is `reconcile_core::router`'s.
//!
//! Read from the sglang-router 0.3.2 wheel (`sglang_router-0.3.2.dist-info/METADATA`,
//! "Administrative & Worker APIs", "Control Plane Authentication"): `POST /workers` with
//! `{"url": ...}` and `DELETE /workers/{id}` answer 202 and queue the change; `GET /workers`
//! lists workers with `is_healthy`. With `--control-plane-api-keys id:name:admin:KEY`, every admin
//! route wants `Authorization: Bearer KEY` (401 otherwise). The router is reached through an SSH
//! port forward from `router.via`, or directly at `router.url`. Draining a replica taken out is
//! `drain`'s (`apply` drains before the restart).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use reconcile_core::manifest::{AdminKey, RouterSpec};
use reconcile_core::router::{self as decide, Listed, Worker};
use reqwest::StatusCode;

use crate::remote::{self, error_chain, Host, RemoteError, SshOptions};
use crate::targets::Target;

/// The admin API answers from the router's memory; a slow answer means a loaded router, and 10 s
/// is the same bound as SGLang's own `/ready` (answered at once, `remote::http`).
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Polling a queued change: the router's job queue applies one within milliseconds (seen against
/// 0.3.2), so a fine poll keeps the bookkeeping short.
const POLL: Duration = Duration::from_millis(100);
/// A queued removal: a job the router's queue runs at once.
const GONE_TIMEOUT: Duration = Duration::from_secs(30);

/// Why a router was not reached, or did not do what was asked. Every message names the router
/// (its `router.url`), and the request where there was one.
#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    /// The SSH connection or port forward through `via` failed.
    #[error("router {router}: cannot reach it through {via}: {}", error_chain(.source))]
    Via {
        router: String,
        via: String,
        #[source]
        source: RemoteError,
    },
    /// `admin_key_env` names a variable this process does not have.
    #[error("router {router}: its admin key: ${var} is not set")]
    KeyUnset { router: String, var: String },
    /// `admin_key_file` is read on the router's host, which only `via` reaches.
    #[error("router {router}: its admin key: admin_key_file needs `via`")]
    KeyFileWithoutVia { router: String },
    /// The key file could not be read on the router's host.
    #[error("router {router}: its admin key: reading {path}: {}", error_chain(.source))]
    KeyRead {
        router: String,
        path: String,
        #[source]
        source: RemoteError,
    },
    /// The key file is not there.
    #[error("router {router}: its admin key: {path} does not exist on {host}")]
    KeyFileMissing {
        router: String,
        path: String,
        host: String,
    },
    /// The key read is blank.
    #[error("router {router}: its admin key: it is empty")]
    KeyEmpty { router: String },
    /// The HTTP client for the admin API could not be made.
    #[error("router {router}: HTTP client: {source}")]
    Client {
        router: String,
        #[source]
        source: reqwest::Error,
    },
    /// A request got no answer (refused, timed out, cut); the error has no URL in it.
    #[error("router {router}: {request}: {source}")]
    Send {
        router: String,
        request: String,
        #[source]
        source: reqwest::Error,
    },
    /// The answer was larger than any the admin API gives.
    #[error("router {router}: {request}: {source}")]
    AnswerTooLarge {
        router: String,
        request: String,
        #[source]
        source: remote::http::BodyError,
    },
    /// 401 or 403: the admin key is missing or has no admin role.
    #[error("router {router}: {request}: answered {status}: the admin key is missing or not an admin key")]
    Unauthorized {
        router: String,
        request: String,
        status: StatusCode,
    },
    /// Another status than success, with the answer's text when it has one to say.
    #[error("router {router}: {request}: answered {status}{}", answered(.body))]
    Status {
        router: String,
        request: String,
        status: StatusCode,
        /// The answer, trimmed; `None` where the request's message leaves it out (`GET /workers`).
        body: Option<String>,
    },
    /// `GET /workers` answered a list that does not read.
    #[error("router {router}: GET /workers: {source}")]
    Workers {
        router: String,
        #[source]
        source: reconcile_core::router::WorkersError,
    },
    /// A queued change did not show in the list in time.
    #[error("router {router}: {what} within {}s", .within.as_secs())]
    Timeout {
        router: String,
        what: String,
        within: Duration,
    },
    /// Defence in depth behind the manifest check (`router.url`): a token is sent over plain
    /// HTTP only to loopback or through the `via` forward.
    #[error("router {router}: {token} would cross the network in plain HTTP: set `via` (an SSH forward to the router) or use a loopback URL")]
    KeyInClear { router: String, token: &'static str },
}

/// `: BODY` after a status, when the message carries the answer.
fn answered(body: &Option<String>) -> String {
    body.as_ref().map_or(String::new(), |b| format!(": {b}"))
}

/// One router, connected: an HTTP client to its base URL, through the SSH forward it holds.
/// It keeps only what identifies the router: every manifest behind it has its own worker URLs,
/// `min_available` and timeouts (its `router:`), which its callers pass in.
pub struct Router {
    /// The router's base URL as the manifests write it (`router.url`), for messages.
    pub url: String,
    client: reqwest::Client,
    base: String,
    key: Option<String>,
    /// `base` is plain HTTP to another machine (no `via`): no token goes there.
    in_clear: bool,
    /// The connection carrying the port forward; closed with the router.
    _via: Option<Box<dyn Host>>,
    /// Held from deciding to take a replica out until the router no longer lists it, so that
    /// replicas applied at once count each other out (`min_available`).
    taking_out: tokio::sync::Mutex<()>,
}

impl Router {
    pub async fn connect(spec: &RouterSpec, ssh: &SshOptions) -> Result<Router, RouterError> {
        let (base, via) = match &spec.via {
            None => (spec.url.clone(), None),
            Some(name) => {
                let fail = |source| RouterError::Via {
                    router: spec.url.clone(),
                    via: name.clone(),
                    source,
                };
                let host = remote::connect(name, ssh).await.map_err(fail)?;
                let (address, port) = authority(&spec.url);
                let (address, port) = host.forward(&address, port).await.map_err(fail)?;
                (format!("http://{}", socket(&address, port)), Some(host))
            }
        };
        let in_clear = via.is_none() && reconcile_core::manifest::in_clear_off_host(&base);
        let key = admin_key(spec, via.as_deref()).await?;
        if in_clear && key.is_some() {
            return Err(RouterError::KeyInClear {
                router: spec.url.clone(),
                token: "the admin key",
            });
        }
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(3))
            .no_proxy()
            .build()
            .map_err(|source| RouterError::Client {
                router: spec.url.clone(),
                source,
            })?;
        Ok(Router {
            url: spec.url.clone(),
            client,
            base,
            key,
            in_clear,
            _via: via,
            taking_out: tokio::sync::Mutex::new(()),
        })
    }

    /// The router answered `status` to `request`; `body`, when the message carries it.
    fn status(&self, request: &str, status: StatusCode, body: Option<&str>) -> RouterError {
        RouterError::Status {
            router: self.url.clone(),
            request: request.into(),
            status,
            body: body.map(|b| b.trim().to_string()),
        }
    }

    async fn send(
        &self,
        request: &str,
        builder: reqwest::RequestBuilder,
    ) -> Result<(StatusCode, String), RouterError> {
        let builder = match &self.key {
            Some(key) => builder.bearer_auth(key),
            None => builder,
        };
        let response =
            builder
                .timeout(ADMIN_TIMEOUT)
                .send()
                .await
                .map_err(|e| RouterError::Send {
                    router: self.url.clone(),
                    request: request.into(),
                    source: e.without_url(),
                })?;
        let status = response.status();
        // A body that could not be read is as good as empty here (the status says what
        // happened); one past the bound is a router gone wrong.
        let body =
            match remote::http::read_body(response, "the answer", remote::http::BODY_LIMIT).await {
                Ok(body) => body,
                Err(source @ remote::http::BodyError::TooLarge { .. }) => {
                    return Err(RouterError::AnswerTooLarge {
                        router: self.url.clone(),
                        request: request.into(),
                        source,
                    })
                }
                Err(remote::http::BodyError::Read { .. }) => String::new(),
            };
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(RouterError::Unauthorized {
                router: self.url.clone(),
                request: request.into(),
                status,
            });
        }
        Ok((status, body))
    }

    pub async fn workers(&self) -> Result<Vec<Worker>, RouterError> {
        let (status, body) = self
            .send(
                "GET /workers",
                self.client.get(format!("{}/workers", self.base)),
            )
            .await?;
        if !status.is_success() {
            return Err(self.status("GET /workers", status, None));
        }
        decide::parse_workers(&body).map_err(|source| RouterError::Workers {
            router: self.url.clone(),
            source,
        })
    }

    async fn remove(&self, id: &str) -> Result<(), RouterError> {
        let request = format!("DELETE /workers/{id}");
        let url = format!("{}/workers/{id}", self.base);
        let (status, body) = self.send(&request, self.client.delete(url)).await?;
        // 404: gone already (removed by hand meanwhile), which is what was asked.
        if status.is_success() || status == StatusCode::NOT_FOUND {
            return Ok(());
        }
        Err(self.status(&request, status, Some(&body)))
    }

    /// Registers the worker at `url`; `api_key` is the worker's own `--api-key`, which a worker
    /// added at run time does not inherit from the router (METADATA, "Router and Worker API Keys").
    async fn add(&self, url: &str, api_key: Option<&str>) -> Result<(), RouterError> {
        if self.in_clear && api_key.is_some() {
            return Err(RouterError::KeyInClear {
                router: self.url.clone(),
                token: "the worker's --api-key",
            });
        }
        let mut body = serde_json::json!({ "url": url });
        if let Some(key) = api_key {
            body["api_key"] = serde_json::Value::String(key.to_string());
        }
        let builder = self
            .client
            .post(format!("{}/workers", self.base))
            .header("content-type", "application/json")
            .body(body.to_string());
        let (status, answer) = self.send("POST /workers", builder).await?;
        if status.is_success() {
            return Ok(());
        }
        Err(self.status("POST /workers", status, Some(&answer)))
    }

    /// Polls the list until `url` stands as `want`.
    async fn wait_until(
        &self,
        url: &str,
        want: Listed,
        within: Duration,
    ) -> Result<(), RouterError> {
        let started = Instant::now();
        loop {
            if decide::listed(&self.workers().await?, url) == want {
                return Ok(());
            }
            if started.elapsed() >= within {
                let what = match want {
                    Listed::Absent => format!("still lists {url}"),
                    _ => format!("did not list {url} healthy"),
                };
                return Err(RouterError::Timeout {
                    router: self.url.clone(),
                    what,
                    within,
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Takes the replica at `url` out, unless that leaves fewer than `min_available` healthy
    /// replicas of its model. `Ok(None)`: the router did not list it. The manifests sharing one
    /// router each keep their own settings: `min_available` is the replica's manifest's.
    pub async fn take_out(
        &self,
        url: &str,
        min_available: usize,
    ) -> Result<Option<()>, TakeOutError> {
        let _one_at_a_time = self.taking_out.lock().await;
        let workers = self.workers().await?;
        match decide::take_out(&workers, url, min_available) {
            decide::TakeOut::NotListed => Ok(None),
            decide::TakeOut::Refuse(why) => Err(TakeOutError::Refused(why)),
            decide::TakeOut::Remove { id } => {
                self.remove(&id).await?;
                self.wait_until(url, Listed::Absent, GONE_TIMEOUT).await?;
                Ok(Some(()))
            }
        }
    }

    /// Puts the replica at `url` (back) in and waits, at most `healthy_timeout` (the replica's
    /// manifest's), until the router lists it healthy.
    pub async fn put_back(
        &self,
        url: &str,
        api_key: Option<&str>,
        healthy_timeout: Duration,
    ) -> Result<(), RouterError> {
        if decide::listed(&self.workers().await?, url) == Listed::Absent {
            self.add(url, api_key).await?;
        }
        self.wait_until(url, Listed::Healthy, healthy_timeout).await
    }
}

/// Why a replica was not taken out of its router.
#[derive(Debug, thiserror::Error)]
pub enum TakeOutError {
    /// Taking it out would leave too few healthy replicas (`reconcile_core::router::take_out`'s
    /// reason).
    #[error("{0}")]
    Refused(String),
    /// The router could not be asked, or did not do it.
    #[error(transparent)]
    Router(#[from] RouterError),
}

/// The admin key, from the environment here or a file on the router's host. Its value goes
/// nowhere but the `Authorization` header.
async fn admin_key(
    spec: &RouterSpec,
    via: Option<&dyn Host>,
) -> Result<Option<String>, RouterError> {
    let router = || spec.url.clone();
    let key = match &spec.admin_key {
        None => return Ok(None),
        Some(AdminKey::Env(name)) => std::env::var(name).map_err(|_| RouterError::KeyUnset {
            router: router(),
            var: name.clone(),
        })?,
        Some(AdminKey::File(path)) => {
            let host = via.ok_or_else(|| RouterError::KeyFileWithoutVia { router: router() })?;
            host.read_file(path)
                .await
                .map_err(|source| RouterError::KeyRead {
                    router: router(),
                    path: path.clone(),
                    source,
                })?
                .ok_or_else(|| RouterError::KeyFileMissing {
                    router: router(),
                    path: path.clone(),
                    host: host.name().to_string(),
                })?
        }
    };
    let key = key.trim().to_string();
    if key.is_empty() {
        return Err(RouterError::KeyEmpty { router: router() });
    }
    Ok(Some(key))
}

/// `host` and `port` of an `http://host[:port]/...` URL (validated by the manifest's rules).
fn authority(url: &str) -> (String, u16) {
    let rest = url.strip_prefix("http://").unwrap_or(url);
    let authority = rest.split('/').next().unwrap_or(rest);
    match authority.rsplit_once(':') {
        Some((host, port)) if !host.ends_with(']') || authority.starts_with('[') => {
            match port.parse() {
                Ok(port) => (host.trim_matches(['[', ']']).to_string(), port),
                Err(_) => (authority.trim_matches(['[', ']']).to_string(), 80),
            }
        }
        _ => (authority.trim_matches(['[', ']']).to_string(), 80),
    }
}

fn socket(address: &str, port: u16) -> String {
    if address.contains(':') {
        format!("[{address}]:{port}")
    } else {
        format!("{address}:{port}")
    }
}

/// The routers of a rollout, connected once each before the first turn; a router that could not
/// be reached keeps its error, and every replica behind it is refused with it (hence shared).
#[derive(Default)]
pub struct Routers(HashMap<(String, Option<String>), Connected>);

/// A router connected, or why it was not (one error for every replica behind it).
pub type Connected = Result<Arc<Router>, Arc<RouterError>>;

impl Routers {
    pub async fn connect(targets: &[Target], ssh: &SshOptions) -> Routers {
        let mut routers = HashMap::new();
        for spec in targets.iter().filter_map(|t| t.manifest.router.as_ref()) {
            let key = (spec.url.clone(), spec.via.clone());
            if routers.contains_key(&key) {
                continue;
            }
            let router = Router::connect(spec, ssh)
                .await
                .map(Arc::new)
                .map_err(Arc::new);
            routers.insert(key, router);
        }
        Routers(routers)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The router `t`'s replica sits behind, if its manifest names one.
    pub fn of(&self, t: &Target) -> Option<Connected> {
        let spec = t.manifest.router.as_ref()?;
        self.0.get(&(spec.url.clone(), spec.via.clone())).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn authorities_split_into_host_and_port() {
        assert_eq!(
            authority("http://10.0.0.9:30000"),
            ("10.0.0.9".into(), 30000)
        );
        assert_eq!(authority("http://router/x"), ("router".into(), 80));
        assert_eq!(authority("http://[fd00::1]:8080"), ("fd00::1".into(), 8080));
    }

    fn spec(url: &str, admin_key: Option<AdminKey>) -> RouterSpec {
        RouterSpec {
            url: url.into(),
            via: None,
            admin_key,
            workers: Default::default(),
            min_available: 1,
            drain_timeout: RouterSpec::DRAIN_TIMEOUT,
            healthy_timeout: RouterSpec::HEALTHY_TIMEOUT,
        }
    }

    #[tokio::test]
    async fn no_token_goes_to_a_router_over_plain_http_on_another_machine() {
        const VAR: &str = "RECONCILE_TEST_ROUTER_KEY_IN_CLEAR";
        // No other test reads this variable.
        std::env::set_var(VAR, "admin-secret");
        let ssh = SshOptions::default();
        let key = Some(AdminKey::Env(VAR.into()));
        let refused = Router::connect(&spec("http://10.0.0.9:30000", key.clone()), &ssh).await;
        let e = refused.err().expect("refused");
        assert!(
            matches!(
                e,
                RouterError::KeyInClear {
                    token: "the admin key",
                    ..
                }
            ),
            "{e:?}"
        );
        assert!(!e.to_string().contains("admin-secret"), "{e}");
        // To loopback the admin key goes; nothing is sent until a request is made.
        assert!(Router::connect(&spec("http://127.0.0.1:30000", key), &ssh)
            .await
            .is_ok());
        // Without an admin key the router is reached, but a worker's own key is not sent to it.
        let router = Router::connect(&spec("http://10.0.0.9:30000", None), &ssh)
            .await
            .unwrap();
        let e = router
            .add("http://10.0.0.19:30000", Some("sk-worker"))
            .await;
        assert!(
            matches!(
                e,
                Err(RouterError::KeyInClear {
                    token: "the worker's --api-key",
                    ..
                })
            ),
            "{e:?}"
        );
    }

    #[tokio::test]
    async fn each_cause_keeps_its_words() {
        const VAR: &str = "RECONCILE_TEST_ROUTER_KEY_UNSET";
        // No other test sets this variable.
        let unset = Some(AdminKey::Env(VAR.into()));
        let e = Router::connect(
            &spec("http://127.0.0.1:30000", unset),
            &SshOptions::default(),
        )
        .await
        .err()
        .expect("refused");
        assert_eq!(
            e.to_string(),
            format!("router http://127.0.0.1:30000: its admin key: ${VAR} is not set")
        );
        let status = |body: Option<&str>| RouterError::Status {
            router: "http://r".into(),
            request: "POST /workers".into(),
            status: StatusCode::BAD_REQUEST,
            body: body.map(str::to_string),
        };
        assert_eq!(
            status(None).to_string(),
            "router http://r: POST /workers: answered 400 Bad Request"
        );
        assert_eq!(
            status(Some("no such worker")).to_string(),
            "router http://r: POST /workers: answered 400 Bad Request: no such worker"
        );
    }
}
