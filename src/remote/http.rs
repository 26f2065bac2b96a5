//! The server's HTTP API, reached through an SSH port forward (servers usually listen on
//! 127.0.0.1) or directly when a URL is configured.
//!
//! Every timeout here comes from SGLang's own limits (0.5.23, `sglang/srt/entrypoints/http_server.py`):
//! `health_generate` sends a one-token generation and then sleeps in 1 s steps until the scheduler
//! answers, for up to `SGLANG_HEALTH_CHECK_TIMEOUT` (20 s). A probe that gives up sooner never sees
//! a healthy server, and an abandoned probe is not cancelled on the scheduler's side.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{error_chain, size, Host, RemoteError};

/// Above `SGLANG_HEALTH_CHECK_TIMEOUT` (20 s), so SGLang's own 503 arrives before we give up.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(25);
/// `/ready` answers at once (`tokenizer_manager.is_ready()`); a slow answer means a busy event loop.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// `/v1/models` is served by the HTTP process from memory, but behind a loaded event loop.
const MODELS_TIMEOUT: Duration = Duration::from_secs(60);
/// `/metrics` is prometheus_client's ASGI app in the HTTP process, reading the schedulers' files
/// (`add_prometheus_middleware`): like `/ready`, a slow answer means a busy event loop.
const METRICS_TIMEOUT: Duration = Duration::from_secs(10);
/// A first chat request can JIT-compile kernels for minutes (a 108 s compile is on record in
/// rllm-org/rllm#926); the smoke completion must outlast that.
const CHAT_TIMEOUT: Duration = Duration::from_secs(600);

/// The most of an answer's body reconcile reads. The largest SGLang sends to the routes read
/// here is `/metrics` (Prometheus text: every metric, histogram buckets per model, tens to
/// hundreds of KiB); `/v1/models`, a chat completion of at most a few thousand tokens and an
/// error page are KiB.
pub const BODY_LIMIT: u64 = 16 << 20;
/// The most of an answer of SGLang's native API (`post_json`) reconcile reads: the quality gate
/// asks `/generate` for every input token's logprob, about 40 bytes of JSON each, for batches of
/// 8 prompts: 8 prompts of 128k tokens are 40 MiB.
pub const NATIVE_BODY_LIMIT: u64 = 64 << 20;
/// The most of one line of a streamed completion reconcile holds. A line is one chunk of the
/// stream: a token or a few (hundreds of bytes of JSON), or the last chunk's usage.
pub const SSE_LINE_LIMIT: u64 = 1 << 20;
/// How much of a failed answer's body is read: its start is shown (200 characters), the rest
/// says nothing more.
const ERROR_BODY_READ: u64 = 4 << 10;

/// Why an answer's body was not read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// It held more than its bound; what came past it was not read.
    #[error("{what} is larger than {}, the most reconcile reads of it", size(*.limit))]
    TooLarge { what: String, limit: u64 },
    #[error("{what} could not be read")]
    Read {
        what: String,
        #[source]
        source: reqwest::Error,
    },
}

/// Why no client was made for a server.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("the HTTP client could not be made")]
    Build(#[source] reqwest::Error),
    /// Defence in depth behind the manifest check (`verify.url`): a token is sent over plain
    /// HTTP only to loopback or through a forward.
    #[error("the server's --api-key would cross the network in plain HTTP to {url}: reconcile sends a token over http:// only to loopback or through an SSH forward (leave out verify.url)")]
    KeyInClear { url: String },
}

/// Why a GET of the server's API has no body to read.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GetError {
    /// The route is not there: another SGLang version, or not SGLang.
    #[error("{path} answered 404 Not Found")]
    NotFound { path: String },
    /// No answer in time, the connection refused, another status, or a body that did not read.
    /// Shared: a status keeps what it asked (`Facts` are cloned).
    #[error(transparent)]
    Failed(Arc<ApiError>),
}

/// Why a request to the server's API brought no answer to use. The report shows it as
/// `to_string()`: a variant whose cause's words were always part of the message keeps them in its
/// own text (a chain printer sees the cause is already there and skips it).
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// No answer within the route's limit.
    #[error("no answer in {}s", .limit.as_secs())]
    TimedOut {
        limit: Duration,
        #[source]
        source: reqwest::Error,
    },
    /// The request failed before an answer: the connection refused or broken.
    #[error(transparent)]
    Request(reqwest::Error),
    /// A POST answered a failed status; `start` is the start of its body.
    #[error("{what} answered {status}: {start}")]
    Refused {
        what: String,
        status: reqwest::StatusCode,
        start: String,
    },
    /// A GET answered another status than success, 401 or 404.
    #[error("{path} answered {status}")]
    Status {
        path: String,
        status: reqwest::StatusCode,
    },
    /// `/metrics` answered another status than success or 404.
    #[error("/metrics answered {code}")]
    MetricsStatus { code: u16 },
    /// 401 from a server whose unit sets no key.
    #[error(
        "{path} answered {status}: the server wants an API key and its unit sets no --api-key"
    )]
    KeyWanted {
        path: String,
        status: reqwest::StatusCode,
    },
    /// 401 to the unit's own key.
    #[error("{path} answered {status}: the server refused the unit's --api-key")]
    KeyRefused {
        path: String,
        status: reqwest::StatusCode,
    },
    /// The route is not there: another SGLang version, or not SGLang.
    #[error("{path} answered 404 Not Found")]
    NotFound { path: String },
    /// The body was not read whole.
    #[error("{}", error_chain(.0))]
    Body(#[from] BodyError),
    /// A streamed completion's first bytes were no event stream.
    #[error("the answer is not a stream of server-sent events (does the server stream?): {start}")]
    NotAStream { start: String },
    /// The body was read but is not the answer expected.
    #[error(transparent)]
    Answer(#[from] AnswerError),
}

/// Why an answer's body is not what its route returns.
#[derive(Debug, thiserror::Error)]
pub enum AnswerError {
    /// Not JSON at all (an error page, a proxy's answer); `what` names the answer.
    #[error("{what} is not JSON: {source}")]
    NotJson {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },
    /// `/v1/models` without its list.
    #[error("/v1/models has no `data` list")]
    NoModelList,
    /// A chat completion without its message.
    #[error("chat completion has no choices[0].message")]
    NoMessage,
}

/// How to reach the server, read from its unit.
#[derive(Clone)]
pub struct Endpoint {
    pub port: u16,
    /// The address the server binds (`--host`): a forward goes there. Wildcards mean loopback.
    pub bind: Option<String>,
    /// `--api-key`: sent as a bearer token to every route that needs it. Never printed.
    pub api_key: Option<String>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Endpoint")
            .field("port", &self.port)
            .field("bind", &self.bind)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl Endpoint {
    /// Where a forward from the host's side connects: the bound address, or loopback for a
    /// wildcard (or no `--host`: SGLang's default is 127.0.0.1).
    pub fn forward_address(&self) -> &str {
        match self.bind.as_deref() {
            None | Some("") | Some("0.0.0.0") | Some("localhost") => "127.0.0.1",
            Some("::") | Some("[::]") => "::1",
            Some(address) => address.trim_start_matches('[').trim_end_matches(']'),
        }
    }
}

/// A server's HTTP endpoint. Cheap to clone: a probe task holds its own.
#[derive(Clone)]
pub struct Server {
    client: reqwest::Client,
    base: String,
    api_key: Option<String>,
    /// `base` is where `Host::forward` put the server: an SSH forward's local end, or on `local`
    /// the address the server binds on this machine. Either way no request leaves the machine in
    /// the clear.
    forwarded: bool,
    /// Cleared once `/ready` answers 404: SGLang before 0.5.2x has no such route.
    has_ready: Arc<AtomicBool>,
}

/// What one look at the server's port found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// `/health` answered 200 (SGLang's empty body is success), after this long.
    Ready(Duration),
    /// The port answers but the server is not serving yet: `/ready` or `/health` said 503
    /// (SGLang's warmup), or `/health` did not answer within SGLang's own health timeout.
    Warming(String),
    /// Nothing answers on the port yet: SGLang opens it only after the weights, the KV cache and
    /// the CUDA graphs are in place.
    Closed(String),
}

/// One entry of `/v1/models`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Model {
    pub id: String,
    pub max_model_len: Option<u64>,
}

/// What a chat completion answered: the text, and the thinking of a reasoning model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    pub content: String,
    pub reasoning: Option<String>,
    pub finish_reason: Option<String>,
}

impl<'h> dyn Host + 'h {
    /// The server of `endpoint` on this host: forwarded from a local port over the SSH
    /// connection, or at `url` when one is given.
    pub async fn server(
        &self,
        endpoint: &Endpoint,
        url: Option<&str>,
    ) -> Result<Server, RemoteError> {
        let made = match url {
            Some(url) => Server::at(url, endpoint.api_key.clone()),
            None => {
                let (address, port) = self
                    .forward(endpoint.forward_address(), endpoint.port)
                    .await?;
                let base = format!("http://{}", socket(&address, port));
                Server::new(&base, endpoint.api_key.clone(), true)
            }
        };
        made.map_err(|e| RemoteError::Transport {
            host: self.name().to_string(),
            command: "HTTP client".into(),
            source: Box::new(e),
        })
    }
}

fn socket(address: &str, port: u16) -> String {
    if address.contains(':') {
        format!("[{address}]:{port}")
    } else {
        format!("{address}:{port}")
    }
}

/// Whether `url` is plain HTTP to another machine, as the edge reads it with the URL parser its
/// client uses (the manifest's own check, offline, is `reconcile_core::manifest::bearer`'s).
fn in_clear_off_host(url: &str) -> bool {
    let Ok(url) = reqwest::Url::parse(url) else {
        return false;
    };
    let host = url.host_str().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    url.scheme() == "http" && !loopback
}

impl Server {
    /// The server at `base` (`http://127.0.0.1:30000`), with one client (and its connection pool)
    /// for every request made through it and its clones. With `api_key`, `base` must not be
    /// plain HTTP to another machine ([`ClientError::KeyInClear`]).
    pub fn at(base: &str, api_key: Option<String>) -> Result<Server, ClientError> {
        Server::new(base, api_key, false)
    }

    fn new(base: &str, api_key: Option<String>, forwarded: bool) -> Result<Server, ClientError> {
        let base = base.trim_end_matches('/').to_string();
        if api_key.is_some() && !forwarded && in_clear_off_host(&base) {
            return Err(ClientError::KeyInClear { url: base });
        }
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(3))
            .no_proxy()
            .build()
            .map_err(ClientError::Build)?;
        Ok(Server {
            client,
            base,
            api_key,
            forwarded,
            has_ready: Arc::new(AtomicBool::new(true)),
        })
    }

    /// The same server through a client (and connection pool) of its own: connections belong to
    /// the runtime that opened them, and a caller driving requests on a runtime of its own wants
    /// none of another's.
    pub fn with_own_client(&self) -> Result<Server, ClientError> {
        Server::new(&self.base, self.api_key.clone(), self.forwarded)
    }

    /// One streamed chat completion (`request` must ask for `stream: true`): `on_data` gets each
    /// server-sent event's `data:` payload with when it arrived, as it arrives.
    pub async fn stream_chat(
        &self,
        request: &serde_json::Value,
        mut on_data: impl FnMut(Instant, &str),
    ) -> Result<(), ApiError> {
        let request = self
            .post("/v1/chat/completions", request, CHAT_TIMEOUT)
            .header("accept", "text/event-stream");
        let mut response = accepted(request, "chat completion", CHAT_TIMEOUT).await?;
        let mut events = SseLines::default();
        let (mut any, mut start) = (false, Vec::new());
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| request_error(e, CHAT_TIMEOUT))?
        {
            let now = Instant::now();
            if !any && start.len() < 200 {
                start.extend_from_slice(&chunk[..chunk.len().min(200 - start.len())]);
            }
            for data in events.push(&chunk)? {
                any = true;
                on_data(now, &data);
            }
        }
        if !any && !start.is_empty() {
            return Err(ApiError::NotAStream {
                start: String::from_utf8_lossy(&start).into_owned(),
            });
        }
        Ok(())
    }

    /// One look at readiness: `/ready` first where the version has it (it answers at once and
    /// tells warmup from a closed port without a generation), then `/health`, which sends a
    /// one-token generation and so proves the scheduler serves.
    pub async fn health(&self) -> Health {
        if self.has_ready.load(Ordering::Relaxed) {
            match self.get_status("/ready", READY_TIMEOUT).await {
                Ok(404) => self.has_ready.store(false, Ordering::Relaxed),
                Ok(code) if (200..300).contains(&code) => {}
                Ok(code) => return Health::Warming(format!("/ready answered {code}")),
                Err(Probe::TimedOut) => {
                    return Health::Warming(format!(
                        "/ready did not answer in {}s",
                        READY_TIMEOUT.as_secs()
                    ))
                }
                Err(Probe::Closed(e)) => return Health::Closed(e),
            }
        }
        let asked = Instant::now();
        match self.get_status("/health", HEALTH_TIMEOUT).await {
            Ok(code) if (200..300).contains(&code) => Health::Ready(asked.elapsed()),
            Ok(code) => Health::Warming(format!("/health answered {code}")),
            Err(Probe::TimedOut) => Health::Warming(format!(
                "/health did not answer in {}s",
                HEALTH_TIMEOUT.as_secs()
            )),
            Err(Probe::Closed(e)) => Health::Closed(e),
        }
    }

    async fn get_status(&self, path: &str, timeout: Duration) -> Result<u16, Probe> {
        match self
            .client
            .get(format!("{}{path}", self.base))
            .timeout(timeout)
            .send()
            .await
        {
            Ok(r) => Ok(r.status().as_u16()),
            Err(e) if e.is_timeout() => Err(Probe::TimedOut),
            Err(e) => Err(Probe::Closed(e.without_url().to_string())),
        }
    }

    /// `/metrics` (Prometheus text; SGLang serves it only with `--enable-metrics`, and needs no
    /// API key for it): `Ok(None)` when it answers 404.
    pub async fn metrics(&self) -> Result<Option<String>, ApiError> {
        let response = sent(self.getting("/metrics", METRICS_TIMEOUT), METRICS_TIMEOUT).await?;
        match response.status().as_u16() {
            404 => Ok(None),
            200..=299 => Ok(Some(
                read_body(response, "the answer to /metrics", BODY_LIMIT).await?,
            )),
            code => Err(ApiError::MetricsStatus { code }),
        }
    }

    pub async fn models(&self) -> Result<Vec<Model>, ApiError> {
        let body = self.get("/v1/models", MODELS_TIMEOUT).await?;
        Ok(parse_models(&body)?)
    }

    /// One deterministic chat completion (temperature 0). A reasoning model is asked not to think
    /// (`chat_template_kwargs.enable_thinking`, which Qwen3-style templates read); one that thinks
    /// anyway puts it in `reasoning_content`.
    pub async fn chat(
        &self,
        model: &str,
        prompt: &str,
        max_tokens: u32,
        reasoning: bool,
    ) -> Result<Answer, ApiError> {
        let mut request = serde_json::json!({
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": 0,
            "max_tokens": max_tokens,
        });
        if reasoning {
            request["chat_template_kwargs"] = serde_json::json!({"enable_thinking": false});
        }
        let request = self.post("/v1/chat/completions", &request, CHAT_TIMEOUT);
        let response = accepted(request, "chat completion", CHAT_TIMEOUT).await?;
        let body = read_body(response, "the chat completion", BODY_LIMIT).await?;
        Ok(parse_answer(&body)?)
    }

    /// One JSON request to SGLang's native API (`/generate`): the answer's body, or why there was
    /// none (the status and the start of the body). The same limit as a chat completion: SGLang
    /// answers when the whole batch is done.
    pub async fn post_json(
        &self,
        path: &str,
        body: &serde_json::Value,
    ) -> Result<String, ApiError> {
        self.post_json_within(path, body, CHAT_TIMEOUT).await
    }

    /// [`Server::post_json`] that gives up after `limit`: for a route whose own limit is not a
    /// generation's (a weight update loads a checkpoint).
    pub async fn post_json_within(
        &self,
        path: &str,
        body: &serde_json::Value,
        limit: Duration,
    ) -> Result<String, ApiError> {
        let response = accepted(self.post(path, body, limit), path, limit).await?;
        Ok(read_body(
            response,
            &format!("the answer to {path}"),
            NATIVE_BODY_LIMIT,
        )
        .await?)
    }

    /// A JSON POST of `body` to `path` on the server, with its key, given up after `limit`.
    fn post(
        &self,
        path: &str,
        body: &serde_json::Value,
        limit: Duration,
    ) -> reqwest::RequestBuilder {
        self.authorized(self.client.post(format!("{}{path}", self.base)))
            .timeout(limit)
            .header("content-type", "application/json")
            .body(body.to_string())
    }

    fn authorized(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.api_key {
            Some(key) => request.bearer_auth(key),
            None => request,
        }
    }

    /// One GET of the server's API (`/server_info`) that gives up after `limit`: the answer's
    /// body (at most [`BODY_LIMIT`]), or why there is none, a route the server lacks apart.
    pub async fn get_within(&self, path: &str, limit: Duration) -> Result<String, GetError> {
        self.get(path, limit).await.map_err(|e| match e {
            ApiError::NotFound { path } => GetError::NotFound { path },
            e => GetError::Failed(Arc::new(e)),
        })
    }

    /// A GET of `path`, with the unit's key, given up on after `limit`.
    fn getting(&self, path: &str, limit: Duration) -> reqwest::RequestBuilder {
        self.authorized(self.client.get(format!("{}{path}", self.base)))
            .timeout(limit)
    }

    async fn get(&self, path: &str, limit: Duration) -> Result<String, ApiError> {
        let response = sent(self.getting(path, limit), limit).await?;
        let status = response.status();
        let path = path.to_string();
        match status.as_u16() {
            200..=299 => {
                Ok(read_body(response, &format!("the answer to {path}"), BODY_LIMIT).await?)
            }
            401 if self.api_key.is_none() => Err(ApiError::KeyWanted { path, status }),
            401 => Err(ApiError::KeyRefused { path, status }),
            404 => Err(ApiError::NotFound { path }),
            _ => Err(ApiError::Status { path, status }),
        }
    }
}

/// Splits a server-sent event stream, as it arrives in arbitrary pieces, into its `data:` payloads
/// (`data: {...}` or `data:{...}`; other fields and comments are skipped). A line is held until
/// its end arrives, up to [`SSE_LINE_LIMIT`].
pub struct SseLines {
    pending: Vec<u8>,
    limit: u64,
}

impl Default for SseLines {
    fn default() -> SseLines {
        SseLines::within(SSE_LINE_LIMIT)
    }
}

impl SseLines {
    /// Lines of at most `limit` bytes.
    pub fn within(limit: u64) -> SseLines {
        SseLines {
            pending: Vec::new(),
            limit,
        }
    }

    /// The `data:` payloads of the lines `bytes` completes. A line past the bound is an error,
    /// and the stream is not read further: its rest would be held too.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<String>, BodyError> {
        self.pending.extend_from_slice(bytes);
        let mut out = Vec::new();
        // Complete lines are read in place and dropped at once: a stream delivers many small
        // pieces, and the client must cost little beside the server it measures.
        let mut start = 0;
        while let Some(at) = self.pending[start..].iter().position(|b| *b == b'\n') {
            let line = &self.pending[start..start + at];
            start += at + 1;
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if let Some(data) = line.strip_prefix(b"data:") {
                let data = data.strip_prefix(b" ").unwrap_or(data);
                out.push(String::from_utf8_lossy(data).into_owned());
            }
        }
        self.pending.drain(..start);
        // Only the unfinished line is left: no newline in it.
        if self.pending.len() as u64 > self.limit {
            self.pending = Vec::new();
            return Err(BodyError::TooLarge {
                what: "a line of the completion's event stream".into(),
                limit: self.limit,
            });
        }
        Ok(out)
    }
}

/// The body of `response`, read piece by piece up to `limit` bytes: one that says (or turns out)
/// to be longer is refused before (or as soon as) it passes the bound, the rest never read.
pub(crate) async fn read_body(
    mut response: reqwest::Response,
    what: &str,
    limit: u64,
) -> Result<String, BodyError> {
    let too_large = || BodyError::TooLarge {
        what: what.to_string(),
        limit,
    };
    if response.content_length().is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(piece) = response.chunk().await.map_err(|source| BodyError::Read {
        what: what.to_string(),
        source: source.without_url(),
    })? {
        if (body.len() + piece.len()) as u64 > limit {
            return Err(too_large());
        }
        body.extend_from_slice(&piece);
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// Sends a request; no answer within `limit` (or none at all) is the error.
async fn sent(
    request: reqwest::RequestBuilder,
    limit: Duration,
) -> Result<reqwest::Response, ApiError> {
    request.send().await.map_err(|e| request_error(e, limit))
}

/// Sends a POST and takes its answer if the status is a success; else the start of the body
/// says why (`what`: the request, as the error names it).
async fn accepted(
    request: reqwest::RequestBuilder,
    what: &str,
    limit: Duration,
) -> Result<reqwest::Response, ApiError> {
    let response = sent(request, limit).await?;
    let status = response.status();
    if !status.is_success() {
        return Err(ApiError::Refused {
            what: what.to_string(),
            status,
            start: error_start(response).await,
        });
    }
    Ok(response)
}

/// The start of a failed answer's body, to show beside its status: a few KiB are read, 200
/// characters kept.
async fn error_start(mut response: reqwest::Response) -> String {
    let mut start = Vec::new();
    while (start.len() as u64) < ERROR_BODY_READ {
        match response.chunk().await {
            Ok(Some(piece)) => start.extend_from_slice(&piece),
            _ => break,
        }
    }
    String::from_utf8_lossy(&start).chars().take(200).collect()
}

enum Probe {
    TimedOut,
    Closed(String),
}

fn request_error(e: reqwest::Error, limit: Duration) -> ApiError {
    let e = e.without_url();
    if e.is_timeout() {
        ApiError::TimedOut { limit, source: e }
    } else {
        ApiError::Request(e)
    }
}

/// Parses SGLang's `/v1/models` answer.
pub fn parse_models(body: &str) -> Result<Vec<Model>, AnswerError> {
    let json: serde_json::Value =
        serde_json::from_str(body).map_err(|source| AnswerError::NotJson {
            what: "/v1/models",
            source,
        })?;
    let data = json["data"].as_array().ok_or(AnswerError::NoModelList)?;
    Ok(data
        .iter()
        .filter_map(|m| {
            Some(Model {
                id: m["id"].as_str()?.to_string(),
                max_model_len: m["max_model_len"].as_u64(),
            })
        })
        .collect())
}

/// Parses a `chat.completion`: with `--reasoning-parser`, SGLang moves the thinking to
/// `message.reasoning_content` and `content` may be `""` or null
/// (`sglang/srt/entrypoints/openai/serving_chat.py`).
pub fn parse_answer(body: &str) -> Result<Answer, AnswerError> {
    let json: serde_json::Value =
        serde_json::from_str(body).map_err(|source| AnswerError::NotJson {
            what: "chat completion",
            source,
        })?;
    let choice = &json["choices"][0];
    let message = choice
        .get("message")
        .filter(|m| m.is_object())
        .ok_or(AnswerError::NoMessage)?;
    let text = |key: &str| message[key].as_str().map(str::to_string);
    Ok(Answer {
        content: text("content").unwrap_or_default(),
        reasoning: text("reasoning_content"),
        finish_reason: choice["finish_reason"].as_str().map(str::to_string),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_sglang_models() {
        let body = r#"{"object":"list","data":[{"id":"qwen3.5-122b","object":"model","created":1,"owned_by":"sglang","root":"qwen3.5-122b","parent":null,"max_model_len":262144}]}"#;
        assert_eq!(
            parse_models(body).unwrap(),
            [Model {
                id: "qwen3.5-122b".into(),
                max_model_len: Some(262144)
            }]
        );
        assert!(parse_models("{}").is_err());
    }

    #[test]
    fn reads_answers_with_and_without_thinking() {
        let plain = r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"Paris","reasoning_content":null},"finish_reason":"stop"}]}"#;
        let a = parse_answer(plain).unwrap();
        assert_eq!((a.content.as_str(), a.reasoning), ("Paris", None));
        let thinking = r#"{"choices":[{"message":{"content":null,"reasoning_content":"The capital of France is Paris"},"finish_reason":"length"}]}"#;
        let a = parse_answer(thinking).unwrap();
        assert_eq!(a.content, "");
        assert_eq!(
            a.reasoning.as_deref(),
            Some("The capital of France is Paris")
        );
        assert_eq!(a.finish_reason.as_deref(), Some("length"));
        assert!(parse_answer(r#"{"choices":[]}"#).is_err());
        assert!(parse_answer("<html>").is_err());
    }

    #[test]
    fn server_sent_events_split_into_data_payloads_across_pieces() {
        let mut sse = SseLines::default();
        assert!(sse.push(b"data: {\"a\"").unwrap().is_empty());
        assert_eq!(
            sse.push(b":1}\r\n\n: keep-alive\nevent: x\ndata:[DONE]\n")
                .unwrap(),
            [r#"{"a":1}"#, "[DONE]"]
        );
        assert!(sse.push(b"data: tail").unwrap().is_empty());
    }

    #[test]
    fn an_event_line_past_its_bound_is_refused_however_it_arrives() {
        let mut sse = SseLines::within(16);
        // Lines up to the bound, however many, pass.
        let many = b"data: 0123456789\n".repeat(1000);
        assert_eq!(sse.push(&many).unwrap().len(), 1000);
        // A line that never ends is refused once it holds more than the bound, piece by piece.
        assert!(sse.push(b"data: 0123456789").unwrap().is_empty());
        let e = sse.push(b"x").unwrap_err();
        assert_eq!(
            e.to_string(),
            "a line of the completion's event stream is larger than 16 bytes, the most reconcile reads of it"
        );
        assert_eq!(
            SseLines::default().limit,
            SSE_LINE_LIMIT,
            "1 MiB by default"
        );
    }

    /// One HTTP answer on a local port, its body `body` (with a Content-Length unless
    /// `chunked`); returns the base URL.
    async fn answer_once(body: Vec<u8>, chunked: bool) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let mut request = [0u8; 4096];
            let _ = socket.read(&mut request).await;
            let head = if chunked {
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n".to_string()
            } else {
                format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n", body.len())
            };
            let _ = socket.write_all(head.as_bytes()).await;
            if chunked {
                for piece in body.chunks(64 << 10) {
                    let size = format!("{:x}\r\n", piece.len());
                    let sent = socket.write_all(size.as_bytes()).await;
                    let sent = sent.and(socket.write_all(piece).await);
                    // The client stopped reading: the rest is never sent.
                    if sent.and(socket.write_all(b"\r\n").await).is_err() {
                        return;
                    }
                }
                let _ = socket.write_all(b"0\r\n\r\n").await;
            } else {
                let _ = socket.write_all(&body).await;
            }
        });
        base
    }

    #[tokio::test]
    async fn a_body_past_its_bound_is_refused_whether_announced_or_not() {
        let big = vec![b'#'; (BODY_LIMIT + 1) as usize];
        for chunked in [false, true] {
            let server = Server::at(&answer_once(big.clone(), chunked).await, None).unwrap();
            let e = server.metrics().await.unwrap_err();
            assert!(
                matches!(e, ApiError::Body(BodyError::TooLarge { .. })),
                "{e:?}"
            );
            assert_eq!(
                e.to_string(),
                "the answer to /metrics is larger than 16 MiB, the most reconcile reads of it",
                "chunked: {chunked}"
            );
        }
        // At the bound, all of it is read.
        let at = vec![b'#'; BODY_LIMIT as usize];
        let server = Server::at(&answer_once(at, true).await, None).unwrap();
        let metrics = server.metrics().await.unwrap().unwrap();
        assert_eq!(metrics.len() as u64, BODY_LIMIT);
    }

    #[test]
    fn a_key_never_goes_over_plain_http_to_another_machine() {
        let key = || Some("sk-secret".to_string());
        let e = Server::at("http://10.0.0.5:30000/", key()).err().unwrap();
        assert!(
            matches!(&e, ClientError::KeyInClear { url } if url == "http://10.0.0.5:30000"),
            "{e:?}"
        );
        assert!(!e.to_string().contains("sk-secret"), "{e}");
        // To loopback, or without a key: made.
        assert!(Server::at("http://127.0.0.1:30000", key()).is_ok());
        assert!(Server::at("http://[::1]:30000", key()).is_ok());
        assert!(Server::at("http://10.0.0.5:30000", None).is_ok());
        // Where `Host::forward` put the server (an SSH forward's end, or `local`'s own address).
        let forwarded = Server::new("http://10.0.0.5:30000", key(), true).unwrap();
        assert!(forwarded.with_own_client().is_ok());
    }

    #[test]
    fn forwards_follow_the_bound_address() {
        let at = |bind: Option<&str>| Endpoint {
            port: 1,
            bind: bind.map(str::to_string),
            api_key: None,
        };
        assert_eq!(at(None).forward_address(), "127.0.0.1");
        assert_eq!(at(Some("0.0.0.0")).forward_address(), "127.0.0.1");
        assert_eq!(at(Some("::")).forward_address(), "::1");
        assert_eq!(at(Some("10.1.2.3")).forward_address(), "10.1.2.3");
        assert_eq!(at(Some("[fd00::5]")).forward_address(), "fd00::5");
        assert_eq!(socket("fd00::5", 80), "[fd00::5]:80");
    }

    #[test]
    fn an_api_key_never_shows_in_debug_output() {
        let e = Endpoint {
            port: 1,
            bind: None,
            api_key: Some("sk-very-secret".into()),
        };
        assert!(!format!("{e:?}").contains("sk-very-secret"));
    }
}
