//! The quality gate's I/O: the requests to a server (SGLang's native `/generate` for greedy
//! generation and teacher-forced scoring, chat completions for the needle and the cases), and
//! the reference each host keeps per unit and settings key,
//! `/var/lib/reconcile/<unit>/quality/<settings key>.json` (0600).
//!
//! What the figures mean and the verdict are `reconcile_core::quality`'s; `apply::quality` runs
//! this as the stage after the benchmark, and `reconcile quality` runs it against the server a
//! host runs now.

pub mod hosts;

use std::time::Instant;

use reconcile_core::quality::{
    self, builtin_prompts, needles, AnswerError, Floors, Generated, Measures, NeedleRate,
    QualitySpec, Rate, Reference, Sequence, TaskRate, TextAnswer, TextComparison,
};

use crate::remote::http::ApiError;
use crate::remote::{Host, RemoteError, Server};
use crate::state::unit_dir;

/// Prompts scored per `/generate` request: SGLang batches them itself; a bounded batch keeps one
/// request's answer (and the client's memory) small.
const BATCH: usize = 8;

/// Tokens a needle or case answer may take: the key is a number, a case's answer a short one.
const ANSWER_TOKENS: u32 = 48;

/// Why a server's answers were not measured. The messages are the cause's own words, as the
/// quality report and `reconcile quality` print them.
#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    /// A request to SGLang's native API (`/generate`, `/tokenize`) got no answer to read.
    #[error("{source}")]
    Request {
        path: &'static str,
        #[source]
        source: ApiError,
    },
    /// A chat completion (the needle, the long-context tasks, the cases) got no answer.
    #[error("{source}")]
    Chat {
        #[source]
        source: ApiError,
    },
    /// A greedy generation's answer did not read.
    #[error("{source}")]
    Generations {
        #[source]
        source: quality::GenerateError,
    },
    /// A teacher-forced scoring's answer did not read.
    #[error("{source}")]
    Scores {
        #[source]
        source: quality::GenerateError,
    },
    /// `/tokenize`'s answer for the fixed texts did not read.
    #[error("/tokenize: {source}")]
    Tokens {
        #[source]
        source: AnswerError,
    },
    /// The fixed texts' distributions did not read.
    #[error("scoring the fixed texts: {source}")]
    TextScores {
        #[source]
        source: AnswerError,
    },
}

impl MeasureError {
    fn request(path: &'static str) -> impl FnOnce(ApiError) -> MeasureError {
        move |source| MeasureError::Request { path, source }
    }
}

/// What one server answered.
#[derive(Debug, Clone, Default)]
pub struct Measured {
    /// Its own greedy generation of every prompt.
    pub generated: Vec<Generated>,
    /// Its scores of the reference's output tokens, when there was a reference to score.
    pub scored: Option<Vec<Vec<f64>>>,
    /// Its distributions over the fixed texts (the reference's token ids when there was a
    /// reference, else the texts as it tokenized them), with the tokens' texts.
    pub texts: Vec<TextAnswer>,
    pub needle: Vec<NeedleRate>,
    pub long_context: Vec<TaskRate>,
    pub cases: Option<Rate>,
    /// Wall time of the measurement, client included.
    pub seconds: f64,
    /// The server's own time on the `/generate` requests (their `meta_info.e2e_latency`, the
    /// longest of each batch, since a batch runs at once) and the chat requests (their wall time).
    pub server_seconds: f64,
    /// The client's: building the requests and reading the answers.
    pub client_seconds: f64,
}

impl Measured {
    /// The verdict on these answers against `reference` (when there is one to compare with),
    /// with `floors` the old server's noise, and what the measurement cost.
    pub fn judge(
        &self,
        spec: &QualitySpec,
        reference: Option<&Reference>,
        floors: Floors,
    ) -> quality::QualityReport {
        let greedy = match (reference, &self.scored) {
            (Some(r), Some(scored)) => {
                let regenerated: Vec<Vec<u32>> = self
                    .generated
                    .iter()
                    .map(|g| g.output_ids.clone())
                    .collect();
                Some(quality::compare(r, scored, &regenerated))
            }
            _ => None,
        };
        let measures = Measures {
            greedy,
            texts: reference.and_then(|r| self.texts_against(r)),
            needle: &self.needle,
            long_context: &self.long_context,
            cases: self.cases,
        };
        let mut report = quality::judge(spec, reference, floors, measures);
        report.cost = Some(self.cost());
        report
    }

    /// These texts' distributions against the reference's; `None` when either has none.
    pub fn texts_against(&self, reference: &Reference) -> Option<TextComparison> {
        if reference.texts.is_empty() || self.texts.is_empty() {
            return None;
        }
        Some(quality::compare_texts(&reference.texts, &self.texts))
    }

    /// What it cost, for the report.
    pub fn cost(&self) -> quality::Cost {
        quality::Cost {
            wall_seconds: self.seconds,
            server_seconds: self.server_seconds,
            client_seconds: self.client_seconds,
        }
    }
}

/// Time spent on each side of the requests.
#[derive(Default)]
struct Clock {
    server: f64,
    client: f64,
}

impl Clock {
    fn client<T>(&mut self, f: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let out = f();
        self.client += started.elapsed().as_secs_f64();
        out
    }

    /// One `/generate` answer: the longest `e2e_latency` of its items (they ran as one batch).
    /// One `/generate` request; the server's own time for it goes on the clock.
    async fn generate(
        &mut self,
        server: &Server,
        body: &serde_json::Value,
    ) -> Result<String, MeasureError> {
        let answer = server
            .post_json("/generate", body)
            .await
            .map_err(MeasureError::request("/generate"))?;
        self.generate_answer(&answer);
        Ok(answer)
    }

    fn generate_answer(&mut self, body: &str) {
        let started = Instant::now();
        let latency = serde_json::from_str::<serde_json::Value>(body)
            .ok()
            .map(|v| match v {
                serde_json::Value::Array(items) => items
                    .iter()
                    .filter_map(|i| i["meta_info"]["e2e_latency"].as_f64())
                    .fold(0.0, f64::max),
                one => one["meta_info"]["e2e_latency"].as_f64().unwrap_or(0.0),
            })
            .unwrap_or(0.0);
        self.server += latency;
        self.client += started.elapsed().as_secs_f64();
    }
}

/// The prompts the spec measures with: the manifest's file, or the built-in set.
pub fn prompts(spec: &QualitySpec) -> Vec<String> {
    match &spec.prompts_file {
        Some(file) => file.content.clone(),
        None => builtin_prompts(spec.prompts),
    }
}

/// Greedy generation of every prompt, with the prompt's ids and the output's logprobs.
pub async fn generate(
    server: &Server,
    prompts: &[String],
    max_new_tokens: u32,
) -> Result<Vec<Generated>, MeasureError> {
    generate_timed(server, prompts, max_new_tokens, &mut Clock::default()).await
}

async fn generate_timed(
    server: &Server,
    prompts: &[String],
    max_new_tokens: u32,
    clock: &mut Clock,
) -> Result<Vec<Generated>, MeasureError> {
    let mut all = Vec::with_capacity(prompts.len());
    for batch in prompts.chunks(BATCH) {
        let body = clock.client(|| quality::generation_request(batch, max_new_tokens));
        let answer = clock.generate(server, &body).await?;
        all.extend(
            clock
                .client(|| quality::read_generations(&answer, batch.len()))
                .map_err(|source| MeasureError::Generations { source })?,
        );
    }
    Ok(all)
}

/// The server's logprobs of the reference's output tokens, each after its prompt and the tokens
/// before it (teacher-forced): what `compare_kl_divergence` compares.
pub async fn score(server: &Server, reference: &Reference) -> Result<Vec<Vec<f64>>, MeasureError> {
    score_timed(server, reference, &mut Clock::default()).await
}

async fn score_timed(
    server: &Server,
    reference: &Reference,
    clock: &mut Clock,
) -> Result<Vec<Vec<f64>>, MeasureError> {
    let mut all = Vec::with_capacity(reference.sequences.len());
    for batch in reference.sequences.chunks(BATCH) {
        let (body, lengths) = clock.client(|| {
            let sequences: Vec<(Vec<u32>, Vec<u32>)> = batch
                .iter()
                .map(|s| (s.prompt_ids.clone(), s.output_ids.clone()))
                .collect();
            let lengths: Vec<usize> = batch.iter().map(|s| s.output_ids.len()).collect();
            (quality::scoring_request(&sequences), lengths)
        });
        let answer = clock.generate(server, &body).await?;
        all.extend(
            clock
                .client(|| quality::read_scores(&answer, &lengths))
                .map_err(|source| MeasureError::Scores { source })?,
        );
    }
    Ok(all)
}

/// Tokens a text's position is asked for beyond what the reference keeps: a reference token that
/// dropped a few places is still found in the new server's list.
const ASKED_PER_KEPT: u32 = 2;

/// The fixed texts' token ids as the server tokenizes them, cut to fit (`/tokenize`).
async fn tokenize(
    server: &Server,
    texts: &[String],
    context_length: Option<u32>,
    clock: &mut Clock,
) -> Result<Vec<Vec<u32>>, MeasureError> {
    let body = clock.client(|| quality::tokenize_request(texts));
    let answer = server
        .post_json("/tokenize", &body)
        .await
        .map_err(MeasureError::request("/tokenize"))?;
    clock
        .client(|| quality::read_tokens(&answer, texts.len(), context_length))
        .map_err(|source| MeasureError::Tokens { source })
}

/// The server's distributions at every position of each text (one request a text: its answer
/// is about 40 bytes per listed token, a megabyte or two for the longest).
async fn score_texts_timed(
    server: &Server,
    ids: &[Vec<u32>],
    top: u32,
    clock: &mut Clock,
) -> Result<Vec<TextAnswer>, MeasureError> {
    let mut all = Vec::with_capacity(ids.len());
    for text in ids.chunks(1) {
        let body = clock.client(|| quality::text_scoring_request(text, top * ASKED_PER_KEPT));
        let answer = clock.generate(server, &body).await?;
        all.extend(
            clock
                .client(|| quality::read_text_scores(&answer, text))
                .map_err(|source| MeasureError::TextScores { source })?,
        );
    }
    Ok(all)
}

/// The old server's distributions over the reference's texts against the reference's own: its
/// run-to-run KL (the fixed texts' noise floor). `Ok(None)`: the reference has no texts.
pub async fn text_floor(
    server: &Server,
    spec: &QualitySpec,
    reference: &Reference,
) -> Result<Option<f64>, MeasureError> {
    if reference.texts.is_empty() {
        return Ok(None);
    }
    let ids: Vec<Vec<u32>> = reference.texts.iter().map(|t| t.ids.clone()).collect();
    let answers = score_texts_timed(server, &ids, spec.top_logprobs, &mut Clock::default()).await?;
    Ok(Some(
        quality::compare_texts(&reference.texts, &answers).mean_kl,
    ))
}

/// Who the chat questions go to: the needle, the long-context tasks and the cases ask this way.
/// `context_length`: the longest prompt the server takes, which the long checks size themselves to.
struct Asker<'a> {
    server: &'a Server,
    model: &'a str,
    reasoning: bool,
    context_length: Option<u32>,
}

impl Asker<'_> {
    /// One chat completion's content.
    async fn ask(&self, prompt: &str, max_tokens: u32) -> Result<String, MeasureError> {
        let answer = self
            .server
            .chat(self.model, prompt, max_tokens, self.reasoning)
            .await
            .map_err(|source| MeasureError::Chat { source })?;
        Ok(answer.content)
    }

    /// Each item asked in turn (its prompt), and its answer judged.
    async fn judged<I, T>(
        &self,
        items: &[I],
        prompt: impl Fn(&I) -> &str,
        max_tokens: u32,
        judge: impl Fn(&I, &str) -> T,
    ) -> Result<Vec<T>, MeasureError> {
        let mut judged = Vec::with_capacity(items.len());
        for item in items {
            let answer = self.ask(prompt(item), max_tokens).await?;
            judged.push(judge(item, &answer));
        }
        Ok(judged)
    }
}

/// The long-context tasks' items found per task and length.
async fn long_context(
    asker: &Asker<'_>,
    spec: &QualitySpec,
) -> Result<Vec<TaskRate>, MeasureError> {
    use reconcile_core::quality::long_context;
    let Some(long_spec) = &spec.long_context else {
        return Ok(Vec::new());
    };
    let probes = long_context::probes(long_spec, asker.context_length);
    let found = asker
        .judged(
            &probes,
            |p| &p.prompt,
            long_context::ANSWER_TOKENS,
            long_context::found,
        )
        .await?;
    Ok(long_context::task_rates(&probes, &found))
}

/// The needle check's pass rate per length.
async fn needle(asker: &Asker<'_>, spec: &QualitySpec) -> Result<Vec<NeedleRate>, MeasureError> {
    let Some(needle_spec) = &spec.needle else {
        return Ok(Vec::new());
    };
    let set = needles(needle_spec, asker.context_length, ANSWER_TOKENS);
    let found = asker
        .judged(&set, |n| &n.prompt, ANSWER_TOKENS, quality::found)
        .await?;
    Ok(quality::rates(&set, &found))
}

/// The cases' pass rate.
async fn cases(asker: &Asker<'_>, spec: &QualitySpec) -> Result<Option<Rate>, MeasureError> {
    let Some(file) = &spec.cases else {
        return Ok(None);
    };
    let passes = asker
        .judged(&file.content, |c| &c.prompt, ANSWER_TOKENS, quality::passes)
        .await?;
    Ok(Some(Rate {
        passed: passes.iter().filter(|p| **p).count() as u32,
        total: passes.len() as u32,
    }))
}

/// Everything the spec measures on one server; with `reference`, its tokens scored too.
pub async fn measure(
    server: &Server,
    model: &str,
    spec: &QualitySpec,
    reference: Option<&Reference>,
    context_length: Option<u32>,
    reasoning: bool,
) -> Result<Measured, MeasureError> {
    let started = Instant::now();
    let mut clock = Clock::default();
    let prompts = clock.client(|| prompts(spec));
    let generated = generate_timed(server, &prompts, spec.max_new_tokens, &mut clock).await?;
    let scored = match reference {
        Some(r) => Some(score_timed(server, r, &mut clock).await?),
        None => None,
    };
    // The reference's texts as it scored them; with none, the spec's, tokenized here.
    let text_ids: Vec<Vec<u32>> = match reference.filter(|r| !r.texts.is_empty()) {
        Some(r) => r.texts.iter().map(|t| t.ids.clone()).collect(),
        None => {
            let texts = quality::texts(
                spec.texts,
                spec.texts_file.as_ref().map(|f| f.content.as_slice()),
            );
            if texts.is_empty() {
                Vec::new()
            } else {
                tokenize(server, &texts, context_length, &mut clock).await?
            }
        }
    };
    let texts = score_texts_timed(server, &text_ids, spec.top_logprobs, &mut clock).await?;
    // Chat requests carry no server timing: their wall time counts as the server's.
    let chats = Instant::now();
    let asker = Asker {
        server,
        model,
        reasoning,
        context_length,
    };
    let needle = needle(&asker, spec).await?;
    let long_context = long_context(&asker, spec).await?;
    let cases = cases(&asker, spec).await?;
    clock.server += chats.elapsed().as_secs_f64();
    Ok(Measured {
        generated,
        scored,
        texts,
        needle,
        long_context,
        cases,
        seconds: started.elapsed().as_secs_f64(),
        server_seconds: clock.server,
        client_seconds: clock.client,
    })
}

/// The reference a measurement makes: its own greedy tokens, and its pass rates.
pub fn reference_of(spec: &QualitySpec, model: &str, m: &Measured) -> Reference {
    Reference {
        format: quality::REFERENCE_FORMAT,
        settings_key: quality::settings_key(spec, model),
        model: model.to_string(),
        sequences: m
            .generated
            .iter()
            .map(|g| Sequence {
                prompt_ids: g.prompt_ids.clone(),
                output_ids: g.output_ids.clone(),
                logprobs: g.output_logprobs.clone(),
            })
            .collect(),
        needle: m.needle.clone(),
        cases: m.cases,
        texts: m
            .texts
            .iter()
            .map(|a| a.scored.kept(spec.top_logprobs as usize))
            .collect(),
        long_context: m.long_context.clone(),
    }
}

fn path(unit: &str, key: &str) -> String {
    format!("{}/quality/{key}.json", unit_dir(unit))
}

/// The reference kept for `unit` under `key`; `Ok(None)` when there is none, or it cannot be read
/// (the reason as a note: a reference that does not read is recorded anew, never trusted).
pub async fn read_reference(
    host: &dyn Host,
    unit: &str,
    key: &str,
) -> Result<(Option<Reference>, Option<String>), RemoteError> {
    let path = path(unit, key);
    Ok(match host.read_file(&path).await? {
        None => (None, None),
        Some(text) => match quality::parse_reference(&text) {
            Ok(r) => (Some(r), None),
            Err(e) => (
                None,
                Some(format!(
                    "the quality reference {path} is unusable ({e}); a new one is recorded"
                )),
            ),
        },
    })
}

/// Keeps `reference` for `unit` (0600, in the unit's 0700 state folder), replacing the one of its
/// key.
pub async fn keep_reference(
    host: &dyn Host,
    unit: &str,
    reference: &Reference,
) -> Result<String, RemoteError> {
    let dir = format!("{}/quality", unit_dir(unit));
    crate::state::private_dir(host, &dir).await?;
    let path = path(unit, &reference.settings_key);
    host.write_file(&path, &quality::reference_json(reference), "0600")
        .await?;
    Ok(path)
}
