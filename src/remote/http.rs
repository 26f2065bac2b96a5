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

use super::{Host, RemoteError};

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
        let base = match url {
            Some(url) => url.trim_end_matches('/').to_string(),
            None => {
                let (address, port) = self
                    .forward(endpoint.forward_address(), endpoint.port)
                    .await?;
                format!("http://{}", socket(&address, port))
            }
        };
        Server::at(&base, endpoint.api_key.clone()).map_err(|e| RemoteError::Transport {
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

impl Server {
    /// The server at `base` (`http://127.0.0.1:30000`), with one client (and its connection pool)
    /// for every request made through it and its clones.
    pub fn at(base: &str, api_key: Option<String>) -> Result<Server, reqwest::Error> {
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(3))
            .no_proxy()
            .build()?;
        Ok(Server {
            client,
            base: base.trim_end_matches('/').to_string(),
            api_key,
            has_ready: Arc::new(AtomicBool::new(true)),
        })
    }

    /// The same server through a client (and connection pool) of its own: connections belong to
    /// the runtime that opened them, and a caller driving requests on a runtime of its own wants
    /// none of another's.
    pub fn with_own_client(&self) -> Result<Server, reqwest::Error> {
        Server::at(&self.base, self.api_key.clone())
    }

    /// One streamed chat completion (`request` must ask for `stream: true`): `on_data` gets each
    /// server-sent event's `data:` payload with when it arrived, as it arrives.
    pub async fn stream_chat(
        &self,
        request: &serde_json::Value,
        mut on_data: impl FnMut(Instant, &str),
    ) -> Result<(), String> {
        let mut response = self
            .authorized(
                self.client
                    .post(format!("{}/v1/chat/completions", self.base)),
            )
            .timeout(CHAT_TIMEOUT)
            .header("content-type", "application/json")
            .header("accept", "text/event-stream")
            .body(request.to_string())
            .send()
            .await
            .map_err(|e| request_error(e, CHAT_TIMEOUT))?;
        let status = response.status();
        if !status.is_success() {
            let body = response.text().await.unwrap_or_default();
            return Err(format!(
                "chat completion answered {status}: {}",
                body.chars().take(200).collect::<String>()
            ));
        }
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
            for data in events.push(&chunk) {
                any = true;
                on_data(now, &data);
            }
        }
        if !any && !start.is_empty() {
            return Err(format!(
                "the answer is not a stream of server-sent events (does the server stream?): {}",
                String::from_utf8_lossy(&start)
            ));
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
    pub async fn metrics(&self) -> Result<Option<String>, String> {
        let response = self
            .authorized(self.client.get(format!("{}/metrics", self.base)))
            .timeout(METRICS_TIMEOUT)
            .send()
            .await
            .map_err(|e| request_error(e, METRICS_TIMEOUT))?;
        match response.status().as_u16() {
            404 => Ok(None),
            200..=299 => response.text().await.map(Some).map_err(|e| e.to_string()),
            code => Err(format!("/metrics answered {code}")),
        }
    }

    pub async fn models(&self) -> Result<Vec<Model>, String> {
        let body = self.get_text("/v1/models", MODELS_TIMEOUT).await?;
        parse_models(&body)
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
    ) -> Result<Answer, String> {
        let mut request = serde_json::json!({
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "temperature": 0,
            "max_tokens": max_tokens,
        });
        if reasoning {
            request["chat_template_kwargs"] = serde_json::json!({"enable_thinking": false});
        }
        let response = self
            .authorized(
                self.client
                    .post(format!("{}/v1/chat/completions", self.base)),
            )
            .timeout(CHAT_TIMEOUT)
            .header("content-type", "application/json")
            .body(request.to_string())
            .send()
            .await
            .map_err(|e| request_error(e, CHAT_TIMEOUT))?;
        let status = response.status();
        let body = response.text().await.map_err(|e| e.to_string())?;
        if !status.is_success() {
            return Err(format!(
                "chat completion answered {status}: {}",
                body.chars().take(200).collect::<String>()
            ));
        }
        parse_answer(&body)
    }

    /// One JSON request to SGLang's native API (`/generate`): the answer's body, or why there was
    /// none (the status and the start of the body). The same limit as a chat completion: SGLang
    /// answers when the whole batch is done.
    pub async fn post_json(&self, path: &str, body: &serde_json::Value) -> Result<String, String> {
        self.post_json_within(path, body, CHAT_TIMEOUT).await
    }

    /// [`Server::post_json`] that gives up after `limit`: for a route whose own limit is not a
    /// generation's (a weight update loads a checkpoint).
    pub async fn post_json_within(
        &self,
        path: &str,
        body: &serde_json::Value,
        limit: Duration,
    ) -> Result<String, String> {
        let response = self
            .authorized(self.client.post(format!("{}{path}", self.base)))
            .timeout(limit)
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| request_error(e, limit))?;
        let status = response.status();
        let text = response.text().await.map_err(|e| e.to_string())?;
        if !status.is_success() {
            return Err(format!(
                "{path} answered {status}: {}",
                text.chars().take(200).collect::<String>()
            ));
        }
        Ok(text)
    }

    fn authorized(&self, request: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
        match &self.api_key {
            Some(key) => request.bearer_auth(key),
            None => request,
        }
    }

    async fn get_text(&self, path: &str, timeout: Duration) -> Result<String, String> {
        let response = self
            .authorized(self.client.get(format!("{}{path}", self.base)))
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| request_error(e, timeout))?;
        let status = response.status();
        let body = response.text().await.map_err(|e| e.to_string())?;
        match status.as_u16() {
            200..=299 => Ok(body),
            401 if self.api_key.is_none() => Err(format!(
                "{path} answered {status}: the server wants an API key and its unit sets no --api-key"
            )),
            401 => Err(format!("{path} answered {status}: the server refused the unit's --api-key")),
            _ => Err(format!("{path} answered {status}")),
        }
    }
}

/// Splits a server-sent event stream, as it arrives in arbitrary pieces, into its `data:` payloads
/// (`data: {...}` or `data:{...}`; other fields and comments are skipped).
#[derive(Default)]
pub struct SseLines {
    pending: Vec<u8>,
}

impl SseLines {
    pub fn push(&mut self, bytes: &[u8]) -> Vec<String> {
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
        out
    }
}

enum Probe {
    TimedOut,
    Closed(String),
}

fn request_error(e: reqwest::Error, timeout: Duration) -> String {
    if e.is_timeout() {
        format!("no answer in {}s", timeout.as_secs())
    } else {
        e.without_url().to_string()
    }
}

/// Parses SGLang's `/v1/models` answer.
pub fn parse_models(body: &str) -> Result<Vec<Model>, String> {
    let json: serde_json::Value =
        serde_json::from_str(body).map_err(|e| format!("/v1/models is not JSON: {e}"))?;
    let data = json["data"]
        .as_array()
        .ok_or("/v1/models has no `data` list")?;
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
pub fn parse_answer(body: &str) -> Result<Answer, String> {
    let json: serde_json::Value =
        serde_json::from_str(body).map_err(|e| format!("chat completion is not JSON: {e}"))?;
    let choice = &json["choices"][0];
    let message = choice
        .get("message")
        .filter(|m| m.is_object())
        .ok_or("chat completion has no choices[0].message")?;
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
        assert!(sse.push(b"data: {\"a\"").is_empty());
        assert_eq!(
            sse.push(b":1}\r\n\n: keep-alive\nevent: x\ndata:[DONE]\n"),
            [r#"{"a":1}"#, "[DONE]"]
        );
        assert!(sse.push(b"data: tail").is_empty());
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
