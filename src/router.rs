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

#[derive(Debug, thiserror::Error)]
pub enum RouterError {
    #[error("router {router}: cannot reach it through {via}: {}", error_chain(.source))]
    Via {
        router: String,
        via: String,
        #[source]
        source: RemoteError,
    },
    #[error("router {router}: its admin key: {why}")]
    Key { router: String, why: String },
    #[error("router {router}: {request}: {why}")]
    Request {
        router: String,
        request: String,
        why: String,
    },
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
            .map_err(|e| RouterError::Request {
                router: spec.url.clone(),
                request: "HTTP client".into(),
                why: e.to_string(),
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

    fn fail(&self, request: &str, why: impl Into<String>) -> RouterError {
        RouterError::Request {
            router: self.url.clone(),
            request: request.into(),
            why: why.into(),
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
        let response = builder
            .timeout(ADMIN_TIMEOUT)
            .send()
            .await
            .map_err(|e| self.fail(request, e.without_url().to_string()))?;
        let status = response.status();
        // A body that could not be read is as good as empty here (the status says what
        // happened); one past the bound is a router gone wrong.
        let body =
            match remote::http::read_body(response, "the answer", remote::http::BODY_LIMIT).await {
                Ok(body) => body,
                Err(e @ remote::http::BodyError::TooLarge { .. }) => {
                    return Err(self.fail(request, e.to_string()))
                }
                Err(remote::http::BodyError::Read { .. }) => String::new(),
            };
        if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN {
            return Err(self.fail(
                request,
                format!("answered {status}: the admin key is missing or not an admin key"),
            ));
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
            return Err(self.fail("GET /workers", format!("answered {status}")));
        }
        decide::parse_workers(&body).map_err(|e| self.fail("GET /workers", e.to_string()))
    }

    async fn remove(&self, id: &str) -> Result<(), RouterError> {
        let request = format!("DELETE /workers/{id}");
        let url = format!("{}/workers/{id}", self.base);
        let (status, body) = self.send(&request, self.client.delete(url)).await?;
        // 404: gone already (removed by hand meanwhile), which is what was asked.
        if status.is_success() || status == StatusCode::NOT_FOUND {
            return Ok(());
        }
        Err(self.fail(&request, format!("answered {status}: {}", body.trim())))
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
        Err(self.fail(
            "POST /workers",
            format!("answered {status}: {}", answer.trim()),
        ))
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

#[derive(Debug, thiserror::Error)]
pub enum TakeOutError {
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Router(#[from] RouterError),
}

/// The admin key, from the environment here or a file on the router's host. Its value goes
/// nowhere but the `Authorization` header.
async fn admin_key(
    spec: &RouterSpec,
    via: Option<&dyn Host>,
) -> Result<Option<String>, RouterError> {
    let fail = |why: String| RouterError::Key {
        router: spec.url.clone(),
        why,
    };
    let key = match &spec.admin_key {
        None => return Ok(None),
        Some(AdminKey::Env(name)) => {
            std::env::var(name).map_err(|_| fail(format!("${name} is not set")))?
        }
        Some(AdminKey::File(path)) => {
            let host = via.ok_or_else(|| fail("admin_key_file needs `via`".into()))?;
            host.read_file(path)
                .await
                .map_err(|e| fail(format!("reading {path}: {}", error_chain(&e))))?
                .ok_or_else(|| fail(format!("{path} does not exist on {}", host.name())))?
        }
    };
    let key = key.trim().to_string();
    if key.is_empty() {
        return Err(fail("it is empty".into()));
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
/// be reached keeps its error, and every replica behind it is refused with it.
#[derive(Default)]
pub struct Routers(HashMap<(String, Option<String>), Result<Arc<Router>, String>>);

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
                .map_err(|e| e.to_string());
            routers.insert(key, router);
        }
        Routers(routers)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The router `t`'s replica sits behind, if its manifest names one.
    pub fn of(&self, t: &Target) -> Option<Result<Arc<Router>, String>> {
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
}
