//! The throughput benchmark's client: streamed chat completions (`stream: true`, usage included,
//! temperature 0, `ignore_eos` so every request generates exactly `output_tokens`) at each
//! concurrency level in turn, `concurrency` requests in flight until the level's requests (or its
//! duration) are done. Time to the first content chunk (TTFT) and the gaps between content chunks
//! (ITL) are measured per request; the figures are `reconcile_core::benchmark`'s. Used by apply's
//! `benchmark` stage (`apply::benchmark`) and by `reconcile bench` (`hosts`).

pub mod hosts;
pub mod running;

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::benchmark::{level, prompt, settings_key, BenchmarkRecord, Level, RequestSample};
use crate::manifest::BenchmarkSpec;
use crate::remote::http::ClientError;
use crate::remote::Server;

/// Why a level did not run at all: every request of it counts as failed with this.
#[derive(Debug, thiserror::Error)]
pub enum LevelError {
    /// The level's own HTTP client could not be made.
    #[error("no HTTP client: {0}")]
    Client(#[source] ClientError),
    /// The level's thread could not build its runtime.
    #[error("no runtime for the benchmark: {0}")]
    Runtime(#[source] std::io::Error),
    /// The level's thread panicked or was cancelled.
    #[error("the benchmark stopped: {0}")]
    Stopped(#[source] tokio::task::JoinError),
}

/// Why one request failed; its sample keeps the words.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// A `data:` payload that does not read as a chunk: its first 100 characters.
    #[error("a stream chunk is not JSON: {start}")]
    NotJson { start: String },
    /// SGLang's `{"error": ...}` in the stream: its message.
    #[error("the server answered an error in the stream: {message}")]
    Server { message: String },
    /// The request or its stream failed below the chunks (refused, timed out, cut).
    #[error(transparent)]
    Transport(crate::remote::http::ApiError),
    /// The stream closed before any content.
    #[error("the stream ended without a token")]
    NoToken,
    /// The stream closed without `[DONE]` or the usage chunk.
    #[error("the stream ended before `[DONE]`")]
    Cut,
}

/// What one benchmark run measured.
#[derive(Debug, Clone)]
pub struct Measured {
    pub record: BenchmarkRecord,
    /// The first failed request's reason, when any failed.
    pub first_error: Option<String>,
}

/// Runs every level of `spec` against `server` for `model`, one level after another; `on_level`
/// is told each level's figures as it ends (live progress).
pub async fn run(
    server: &Server,
    model: &str,
    spec: &BenchmarkSpec,
    on_level: &(dyn Fn(&Level) + Sync),
) -> Measured {
    let mut levels = Vec::new();
    let mut first_error = None;
    for &concurrency in &spec.levels {
        let (mut figures, error) = run_level(server, model, spec, concurrency).await;
        // The acceptance length SGLang keeps of the level's decoding (with speculative decoding
        // and `--enable-metrics`; absent otherwise, and nothing to fail on).
        if let Ok(Some(metrics)) = server.metrics().await {
            figures.spec_accept_length = crate::benchmark::spec_accept_length(&metrics);
        }
        on_level(&figures);
        levels.push(figures);
        first_error = first_error.or(error);
    }
    Measured {
        record: BenchmarkRecord {
            settings_key: settings_key(spec),
            levels,
        },
        first_error,
    }
}

/// The line of a finished level, for live progress.
pub fn level_line(l: &Level) -> String {
    format!(
        "benchmark at {}: {} tok/s, {:.2} req/s, TTFT p50 {:.0} ms p99 {:.0} ms, ITL p50 {:.1} ms p99 {:.1} ms{}",
        l.concurrency,
        crate::benchmark::thousands(l.output_tokens_per_s),
        l.requests_per_s,
        l.ttft_p50_ms,
        l.ttft_p99_ms,
        l.itl_p50_ms,
        l.itl_p99_ms,
        if l.errors > 0 { format!(", {} errors", l.errors) } else { String::new() }
    ) + &l
        .spec_accept_length
        .map_or(String::new(), |a| format!(", accept length {a:.2}"))
}

/// One level: `concurrency` workers, each sending one request after another, until the level's
/// requests are taken (or its duration is over; requests in flight then still finish and count).
async fn run_level(
    server: &Server,
    model: &str,
    spec: &BenchmarkSpec,
    concurrency: u32,
) -> (Level, Option<String>) {
    // One thread with a runtime of its own drives every stream of the level and reads their
    // sockets itself: on the shared runtime each token cost a wake-up across threads, most of the
    // client's CPU at thousands of tokens a second (bench/client.sh measures it).
    let server = match server.with_own_client() {
        Ok(server) => server,
        Err(e) => return failed_level(concurrency, LevelError::Client(e)),
    };
    let (model, spec) = (model.to_string(), spec.clone());
    let level = tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        Ok::<_, std::io::Error>(runtime.block_on(drive_level(&server, &model, &spec, concurrency)))
    })
    .await;
    match level {
        Ok(Ok(level)) => level,
        Ok(Err(e)) => failed_level(concurrency, LevelError::Runtime(e)),
        Err(e) => failed_level(concurrency, LevelError::Stopped(e)),
    }
}

/// A level that could not run at all: every request counts as failed.
fn failed_level(concurrency: u32, why: LevelError) -> (Level, Option<String>) {
    let why = why.to_string();
    let sample = RequestSample {
        error: Some(why.clone()),
        ..RequestSample::default()
    };
    (level(concurrency, &[sample], 0.0), Some(why))
}

/// The level itself, on the runtime `run_level` made for it.
async fn drive_level(
    server: &Server,
    model: &str,
    spec: &BenchmarkSpec,
    concurrency: u32,
) -> (Level, Option<String>) {
    let total = spec.requests_at(concurrency);
    let taken = AtomicU32::new(0);
    let started = Instant::now();
    let deadline = spec.duration.map(|d| started + d);
    let worker = || async {
        let mut samples = Vec::new();
        loop {
            let i = taken.fetch_add(1, Ordering::Relaxed);
            let more = match deadline {
                Some(deadline) => Instant::now() < deadline,
                None => i < total,
            };
            if !more {
                break samples;
            }
            // The prompt's seed is the request's number in the level: reproducible, and not one
            // prompt the server's prefix cache would answer from memory.
            let body = request_body(
                model,
                &prompt(u64::from(i), spec.prompt_tokens),
                spec.output_tokens,
            );
            samples.push(one_request(server, &body).await);
        }
    };
    let samples: Vec<RequestSample> = futures::future::join_all((0..concurrency).map(|_| worker()))
        .await
        .into_iter()
        .flatten()
        .collect();
    let wall = started.elapsed().as_secs_f64();
    let error = samples.iter().find_map(|s| s.error.clone());
    (level(concurrency, &samples, wall), error)
}

/// The request: streamed, usage in the last chunk, greedy, and generating exactly `output_tokens`
/// (`ignore_eos`, an SGLang extension: `sglang/srt/entrypoints/openai/protocol.py`).
pub fn request_body(model: &str, prompt: &str, output_tokens: u32) -> serde_json::Value {
    serde_json::json!({
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "stream": true,
        "stream_options": {"include_usage": true},
        "temperature": 0,
        "max_tokens": output_tokens,
        "ignore_eos": true,
    })
}

async fn one_request(server: &Server, body: &serde_json::Value) -> RequestSample {
    let sent = Instant::now();
    let mut stream = Stream::new(sent);
    let result = server
        .stream_chat(body, |at, data| stream.data(at, data))
        .await;
    stream.finish(result.err())
}

/// The parts of a `chat.completion.chunk` (or SGLang's `{"error": ...}`) the figures need, read
/// without building the whole JSON tree: at 64 streams a chunk arrives every few microseconds, and
/// the client must measure the server, not itself. Unknown fields are skipped.
#[derive(serde::Deserialize)]
struct Chunk<'a> {
    #[serde(default, borrow)]
    choices: Vec<ChunkChoice<'a>>,
    #[serde(default)]
    usage: Option<ChunkUsage>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

#[derive(serde::Deserialize)]
struct ChunkChoice<'a> {
    #[serde(default, borrow)]
    delta: ChunkDelta<'a>,
}

#[derive(serde::Deserialize, Default)]
struct ChunkDelta<'a> {
    #[serde(default, borrow)]
    content: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, borrow)]
    reasoning_content: Option<std::borrow::Cow<'a, str>>,
}

#[derive(serde::Deserialize)]
struct ChunkUsage {
    completion_tokens: Option<u64>,
}

/// One request's stream as it arrives: the content chunks' times and the usage.
struct Stream {
    sent: Instant,
    last_content: Option<Instant>,
    sample: RequestSample,
    /// The first thing that went wrong; the sample gets its words at the end.
    error: Option<RequestError>,
    content_chunks: u64,
    usage_tokens: Option<u64>,
    done: bool,
}

impl Stream {
    fn new(sent: Instant) -> Stream {
        Stream {
            sent,
            last_content: None,
            sample: RequestSample::default(),
            error: None,
            content_chunks: 0,
            usage_tokens: None,
            done: false,
        }
    }

    /// One `data:` payload: a `chat.completion.chunk`, SGLang's `{"error": ...}`, or `[DONE]`.
    fn data(&mut self, at: Instant, data: &str) {
        let data = data.trim();
        if data == "[DONE]" {
            self.done = true;
            return;
        }
        let Ok(chunk) = serde_json::from_str::<Chunk>(data) else {
            self.fail(RequestError::NotJson {
                start: data.chars().take(100).collect(),
            });
            return;
        };
        if let Some(e) = chunk.error.filter(|e| !e.is_null()) {
            let message = e["message"]
                .as_str()
                .map_or_else(|| e.to_string(), str::to_string);
            self.fail(RequestError::Server { message });
            return;
        }
        if let Some(tokens) = chunk.usage.and_then(|u| u.completion_tokens) {
            self.usage_tokens = Some(tokens);
        }
        let has_content = chunk.choices.first().is_some_and(|c| {
            [&c.delta.content, &c.delta.reasoning_content]
                .iter()
                .any(|t| t.as_deref().is_some_and(|t| !t.is_empty()))
        });
        if has_content {
            self.content(at);
        }
    }

    fn content(&mut self, at: Instant) {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        match self.last_content {
            None => self.sample.ttft_ms = Some(ms(at.duration_since(self.sent))),
            Some(last) => self.sample.itl_ms.push(ms(at.duration_since(last))),
        }
        self.last_content = Some(at);
        self.content_chunks += 1;
    }

    fn fail(&mut self, why: RequestError) {
        self.error.get_or_insert(why);
    }

    /// The sample, once the stream is over; `transport`: how the request failed, if it did.
    fn finish(mut self, transport: Option<crate::remote::http::ApiError>) -> RequestSample {
        if let Some(cause) = transport {
            self.fail(RequestError::Transport(cause));
        } else if self.content_chunks == 0 {
            self.fail(RequestError::NoToken);
        } else if !self.done && self.usage_tokens.is_none() {
            self.fail(RequestError::Cut);
        }
        self.sample.error = self.error.map(|e| e.to_string());
        self.sample.tokens = self.usage_tokens.unwrap_or(self.content_chunks);
        self.sample
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    pub(crate) fn chunk(content: &str) -> String {
        format!(
            r#"{{"id":"1","object":"chat.completion.chunk","choices":[{{"index":0,"delta":{{"content":"{content}"}},"finish_reason":null}}],"usage":null}}"#
        )
    }

    #[test]
    fn a_stream_gives_ttft_gaps_and_the_usage_tokens() {
        let sent = Instant::now();
        let ms = |n| sent + Duration::from_millis(n);
        let mut s = Stream::new(sent);
        s.data(
            ms(5),
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#,
        );
        s.data(ms(20), &chunk("Hel"));
        s.data(ms(25), &chunk("lo"));
        s.data(ms(32), &chunk("!"));
        s.data(
            ms(33),
            r#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13}}"#,
        );
        s.data(ms(33), "[DONE]");
        let sample = s.finish(None);
        assert_eq!(sample.error, None);
        assert_eq!(sample.tokens, 4);
        assert_eq!(sample.ttft_ms.map(f64::round), Some(20.0));
        let gaps: Vec<f64> = sample.itl_ms.iter().map(|g| g.round()).collect();
        assert_eq!(gaps, [5.0, 7.0]);
    }

    #[test]
    fn without_usage_the_chunks_count_and_broken_streams_are_errors() {
        let sent = Instant::now();
        let mut s = Stream::new(sent);
        s.data(sent, &chunk("a"));
        s.data(sent, &chunk("b"));
        s.data(sent, "[DONE]");
        assert_eq!((s.finish(None).tokens, None), (2, None::<String>));

        let mut cut = Stream::new(sent);
        cut.data(sent, &chunk("a"));
        assert!(cut.finish(None).error.unwrap().contains("before `[DONE]`"));
        let mut error = Stream::new(sent);
        error.data(
            sent,
            r#"{"object":"error","error":{"message":"overloaded"}}"#,
        );
        assert!(error.finish(None).error.unwrap().contains("overloaded"));
        assert!(Stream::new(sent)
            .finish(None)
            .error
            .unwrap()
            .contains("without a token"));
        let gone = crate::remote::http::ApiError::NotFound {
            path: "/v1/chat/completions".into(),
        };
        let refused = Stream::new(sent).finish(Some(gone));
        assert_eq!(
            refused.error.as_deref(),
            Some("/v1/chat/completions answered 404 Not Found")
        );
    }

    /// A tiny SSE chat server: each request streams `tokens` chunks, usage and `[DONE]`; it counts
    /// the requests it served and the most it had in flight at once.
    pub(crate) async fn serve(
        tokens: u32,
    ) -> (String, std::sync::Arc<(AtomicU32, AtomicU32, AtomicU32)>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let counts = std::sync::Arc::new((AtomicU32::new(0), AtomicU32::new(0), AtomicU32::new(0)));
        let c = counts.clone();
        tokio::spawn(async move {
            loop {
                let (mut socket, _) = listener.accept().await.unwrap();
                socket.set_nodelay(true).unwrap();
                let c = c.clone();
                tokio::spawn(async move {
                    // Keep-alive: serve requests on this connection until it closes.
                    let mut pending = Vec::new();
                    loop {
                        let mut buf = [0u8; 8192];
                        let n = match socket.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        pending.extend_from_slice(&buf[..n]);
                        let text = String::from_utf8_lossy(&pending).to_string();
                        let Some(head_end) = text.find("\r\n\r\n") else {
                            continue;
                        };
                        let length: usize = text[..head_end]
                            .lines()
                            .find_map(|l| {
                                l.to_ascii_lowercase()
                                    .strip_prefix("content-length:")
                                    .map(|v| v.trim().parse().unwrap())
                            })
                            .unwrap_or(0);
                        if pending.len() < head_end + 4 + length {
                            continue;
                        }
                        let body =
                            String::from_utf8_lossy(&pending[head_end + 4..head_end + 4 + length])
                                .to_string();
                        pending.drain(..head_end + 4 + length);
                        assert!(
                            body.contains(r#""stream":true"#)
                                && body.contains(r#""ignore_eos":true"#),
                            "{body}"
                        );
                        let now = c.1.fetch_add(1, Ordering::SeqCst) + 1;
                        c.2.fetch_max(now, Ordering::SeqCst);
                        let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n";
                        socket.write_all(head.as_bytes()).await.unwrap();
                        let mut send = async |data: String| {
                            let event = format!("data: {data}\n\n");
                            let piece = format!("{:x}\r\n{event}\r\n", event.len());
                            socket.write_all(piece.as_bytes()).await.unwrap();
                        };
                        for _ in 0..tokens {
                            tokio::time::sleep(Duration::from_millis(2)).await;
                            send(chunk("x")).await;
                        }
                        send(format!(
                            r#"{{"choices":[],"usage":{{"completion_tokens":{tokens}}}}}"#
                        ))
                        .await;
                        // Counted before the client can see the end, so a client that has read
                        // every [DONE] finds every request counted.
                        c.1.fetch_sub(1, Ordering::SeqCst);
                        c.0.fetch_add(1, Ordering::SeqCst);
                        send("[DONE]".into()).await;
                        socket.write_all(b"0\r\n\r\n").await.unwrap();
                    }
                });
            }
        });
        (base, counts)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn levels_run_in_turn_with_their_concurrency_until_their_requests_are_done() {
        let (base, counts) = serve(5).await;
        let server = Server::at(&base, None).unwrap();
        let spec = BenchmarkSpec {
            levels: vec![1, 4],
            prompt_tokens: 8,
            output_tokens: 5,
            requests: Some(8),
            ..BenchmarkSpec::default()
        };
        let seen = std::sync::Mutex::new(Vec::new());
        let measured = run(&server, "m", &spec, &|l| {
            seen.lock().unwrap().push(l.concurrency)
        })
        .await;
        assert_eq!(measured.first_error, None);
        assert_eq!(*seen.lock().unwrap(), [1, 4]);
        assert_eq!(counts.0.load(Ordering::SeqCst), 16);
        assert_eq!(counts.2.load(Ordering::SeqCst), 4);
        let levels = &measured.record.levels;
        assert_eq!(levels.iter().map(|l| l.errors).sum::<u32>(), 0);
        assert!(
            levels[1].output_tokens_per_s > levels[0].output_tokens_per_s,
            "{levels:?}"
        );
        assert!(
            levels[0].ttft_p50_ms >= 1.0 && levels[0].itl_p50_ms >= 1.0,
            "{levels:?}"
        );
        assert_eq!(
            measured.record.settings_key,
            "v1 levels 1,4 prompt 8 output 5 requests 8,8"
        );
    }

    #[tokio::test]
    async fn a_server_that_is_not_there_counts_every_request_as_an_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        drop(listener);
        let server = Server::at(&base, None).unwrap();
        let spec = BenchmarkSpec {
            levels: vec![2],
            requests: Some(3),
            ..BenchmarkSpec::default()
        };
        let measured = run(&server, "m", &spec, &|_| {}).await;
        assert_eq!(measured.record.levels[0].errors, 3);
        assert!(measured.first_error.is_some());
    }
}
