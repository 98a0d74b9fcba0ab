//! The engine's thread. The engine decodes one sequence at a time (batch 1), so it lives on a
//! thread of its own and takes generations from a bounded first-in-first-out queue: fair by
//! arrival, and a full queue is refused at once (429) instead of growing without bound. Each
//! generation streams its text back through a channel; when the request's side of it is gone
//! (the client disconnected) the generation stops at its next token.

use crate::error::{ApiError, ServerError};
use crate::metrics::Metrics;
use crate::stop::StopText;
use amk_engine::{Alternative, Engine, EngineError, Finish, Request, Sampling, Token};
use amk_model_llama::Tokenizer;
use axum::http::StatusCode;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc;

/// What the loader hands the engine thread: a loaded engine, its tokenizer and the name the
/// API calls the model by.
pub struct Loaded {
    /// The engine, its programs loaded.
    pub engine: Engine,
    /// The model's tokenizer (chat template included).
    pub tokenizer: Tokenizer,
    /// The model's id in `/v1/models` and in every response.
    pub model_id: String,
}

/// What the request side knows of the loaded model.
#[derive(Debug, Clone)]
pub struct ModelInfo {
    /// The tokenizer, shared (requests are encoded on the request side).
    pub tokenizer: Arc<Tokenizer>,
    /// The KV cache's length: prompt and generated tokens together.
    pub max_seq: u64,
    /// The logits' width: token ids must be below it.
    pub vocab: usize,
    /// The model's id.
    pub model_id: String,
    /// The backend running it (`cpu`, `cuda`).
    pub backend: &'static str,
}

/// One generation, queued.
#[derive(Debug)]
pub struct Job {
    /// The prompt's token ids (at least one).
    pub prompt: Vec<u32>,
    /// Tokens to generate at most.
    pub max_new: usize,
    /// How to sample.
    pub sampling: Sampling,
    /// Stop strings.
    pub stop: Vec<String>,
    /// `Some(k)`: report each token's log-probability and `k` alternatives.
    pub logprobs: Option<usize>,
    /// Generate past the model's end tokens (benchmarks: a fixed number of tokens).
    pub ignore_eos: bool,
    /// When the request arrived (time to first token counts from here).
    pub arrived: Instant,
    /// Where the generation's events go.
    pub events: mpsc::UnboundedSender<Event>,
}

/// One token's log-probability report.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenReport {
    /// The token's text (decoded alone).
    pub text: String,
    /// The bytes it stands for (its text may be U+FFFD where it is part of a character).
    pub bytes: Vec<u8>,
    /// Its log-probability.
    pub logprob: f32,
    /// The most likely tokens at its position (text, log-probability), most likely first.
    pub top: Vec<TopEntry>,
}

/// One alternative at a position.
#[derive(Debug, Clone, PartialEq)]
pub struct TopEntry {
    /// Its text (decoded alone).
    pub text: String,
    /// The bytes it stands for.
    pub bytes: Vec<u8>,
    /// Its log-probability.
    pub logprob: f32,
}

/// What a generation sends back.
#[derive(Debug, Clone, PartialEq)]
pub enum Event {
    /// More output: text (empty while a stop string may be forming) and, with log-probabilities
    /// asked for, the tokens it came from.
    Delta {
        /// Text certain to be part of the output.
        text: String,
        /// Log-probability reports of the tokens behind it.
        tokens: Vec<TokenReport>,
    },
    /// The end.
    Done(Summary),
    /// The generation failed.
    Failed(ApiError),
}

/// How a generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// OpenAI's `finish_reason`: `stop` (an end token or a stop string) or `length`.
    pub finish: &'static str,
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Tokens generated (an end token included).
    pub completion_tokens: usize,
}

/// The request side's handle on the engine thread.
#[derive(Debug, Clone)]
pub struct Queue {
    jobs: mpsc::Sender<Job>,
    metrics: Arc<Metrics>,
    capacity: usize,
}

impl Queue {
    /// Refuses at once (429) when no generation can wait now, before a request's prompt is
    /// templated and encoded; [`Queue::submit`] still decides.
    pub fn check_room(&self) -> Result<(), ApiError> {
        if self.jobs.capacity() == 0 {
            return Err(ApiError::busy(self.capacity));
        }
        Ok(())
    }

    /// Queues `job`, or refuses it: 429 when `capacity` generations wait already, 503 when
    /// the engine is gone.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        match self.jobs.try_send(job) {
            Ok(()) => {
                self.metrics.queue_depth.inc();
                Ok(())
            }
            Err(mpsc::error::TrySendError::Full(_)) => Err(ApiError::busy(self.capacity)),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(ApiError::server(
                StatusCode::SERVICE_UNAVAILABLE,
                "the engine has stopped",
            )),
        }
    }
}

/// The engine thread, started.
pub struct Started {
    /// The loaded model.
    pub info: ModelInfo,
    /// Its queue.
    pub queue: Queue,
    /// The thread (it ends when every [`Queue`] is dropped).
    pub thread: std::thread::JoinHandle<()>,
}

/// The loader's error.
pub type LoadError = Box<dyn std::error::Error + Send + Sync>;

/// Starts the engine thread: it runs `loader` (the engine is built where it runs, so it need
/// not move between threads), reports the model, then serves the queue (`capacity`
/// generations may wait) until every [`Queue`] is dropped.
pub fn start<L>(loader: L, capacity: usize, metrics: Arc<Metrics>) -> Result<Started, ServerError>
where
    L: FnOnce() -> Result<Loaded, LoadError> + Send + 'static,
{
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<ModelInfo, LoadError>>();
    let (jobs, rx) = mpsc::channel::<Job>(capacity.max(1));
    let m = metrics.clone();
    let thread = std::thread::Builder::new()
        .name("amk-engine".into())
        .spawn(move || engine_thread(loader, ready_tx, rx, m))
        .map_err(|source| ServerError::Io {
            what: "starting the engine thread".into(),
            source,
        })?;
    match ready_rx.recv() {
        Ok(Ok(info)) => Ok(Started {
            info,
            queue: Queue {
                jobs,
                metrics,
                capacity: capacity.max(1),
            },
            thread,
        }),
        Ok(Err(e)) => {
            let _ = thread.join();
            Err(ServerError::Load(e))
        }
        Err(_) => {
            let _ = thread.join();
            Err(ServerError::EngineGone)
        }
    }
}

fn engine_thread<L>(
    loader: L,
    ready: std::sync::mpsc::Sender<Result<ModelInfo, LoadError>>,
    mut rx: mpsc::Receiver<Job>,
    metrics: Arc<Metrics>,
) where
    L: FnOnce() -> Result<Loaded, LoadError>,
{
    let Loaded {
        mut engine,
        tokenizer,
        model_id,
    } = match loader() {
        Ok(l) => l,
        Err(e) => {
            let _ = ready.send(Err(e));
            return;
        }
    };
    let tokenizer = Arc::new(tokenizer);
    let info = ModelInfo {
        tokenizer: tokenizer.clone(),
        max_seq: engine.max_seq(),
        vocab: engine.vocab().min(tokenizer.vocab_size()),
        model_id,
        backend: engine.backend(),
    };
    if ready.send(Ok(info)).is_err() {
        return;
    }
    let stop_ids = tokenizer.stop_ids();
    while let Some(job) = rx.blocking_recv() {
        let runner = Runner {
            engine: &mut engine,
            tokenizer: &tokenizer,
            stop_ids: &stop_ids,
            metrics: &metrics,
        };
        runner.run(job);
        metrics.queue_depth.dec();
    }
}

/// One generation's run on the engine thread.
struct Runner<'a> {
    engine: &'a mut Engine,
    tokenizer: &'a Tokenizer,
    stop_ids: &'a [u32],
    metrics: &'a Metrics,
}

/// A token's own text (decoded alone: a token inside a multi-byte character shows as the
/// replacement character) and the bytes it stands for.
fn token_text(tok: &Tokenizer, id: u32) -> (String, Vec<u8>) {
    let text = tok.decode(&[id]).unwrap_or_default();
    let bytes = tok
        .token_bytes(id)
        .unwrap_or_else(|| text.as_bytes().to_vec());
    (text, bytes)
}

/// The request's error for an engine error: a bad request is the client's (400), the rest
/// the server's (500).
fn engine_error(e: EngineError) -> ApiError {
    match e {
        EngineError::Request(m) => ApiError::invalid(None, m),
        EngineError::ContextFull { .. } => ApiError::context(e.to_string()),
        other => ApiError::server(StatusCode::INTERNAL_SERVER_ERROR, other.to_string()),
    }
}

impl Runner<'_> {
    fn run(self, job: Job) {
        if job.events.is_closed() {
            return; // the client left while the job waited
        }
        let Runner {
            engine,
            tokenizer: tok,
            stop_ids,
            metrics,
        } = self;
        let stop_ids: &[u32] = if job.ignore_eos { &[] } else { stop_ids };
        let mut decoder = tok.decode_stream();
        let mut text = StopText::new(&job.stop);
        let mut last: Option<Instant> = None;
        let mut failure: Option<ApiError> = None;
        let request = Request {
            prompt: &job.prompt,
            max_new: job.max_new,
            sampling: job.sampling,
            stop: stop_ids,
            vocab_limit: Some(tok.vocab_size()),
            passes_per_launch: None,
            top_logprobs: job.logprobs.unwrap_or(0),
        };
        let mut on_token = |t: &Token, alternatives: &[Alternative]| {
            let now = Instant::now();
            match last {
                None => (metrics.time_to_first_token)
                    .observe(now.duration_since(job.arrived).as_secs_f64()),
                Some(prev) => metrics
                    .token_latency
                    .observe(now.duration_since(prev).as_secs_f64()),
            }
            last = Some(now);
            metrics.generated_tokens.inc();
            if stop_ids.contains(&t.id) {
                return true; // the end token: no text; the engine stops after it
            }
            let piece = match decoder.step(t.id) {
                Ok(p) => p.unwrap_or_default(),
                Err(e) => {
                    failure = Some(ApiError::server(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        format!("decoding token {}: {e}", t.id),
                    ));
                    return false;
                }
            };
            let released = text.push(&piece);
            let tokens = match job.logprobs {
                None => Vec::new(),
                Some(_) => {
                    let (text, bytes) = token_text(tok, t.id);
                    let top = (alternatives.iter())
                        .map(|a| {
                            let (text, bytes) = token_text(tok, a.id);
                            TopEntry {
                                text,
                                bytes,
                                logprob: a.logprob,
                            }
                        })
                        .collect();
                    vec![TokenReport {
                        text,
                        bytes,
                        logprob: t.logprob,
                        top,
                    }]
                }
            };
            let sent = job.events.send(Event::Delta {
                text: released.text,
                tokens,
            });
            // Stop at a stop string, or when nobody listens any more.
            sent.is_ok() && !released.stopped
        };
        metrics.prompt_tokens.inc_by(job.prompt.len() as u64);
        let generation = engine.generate_with(&request, &mut on_token, None);
        let generation = match (generation, failure) {
            (Err(e), _) => return send(&job, Event::Failed(engine_error(e))),
            (_, Some(f)) => return send(&job, Event::Failed(f)),
            (Ok(g), None) => g,
        };
        if !text.stopped() {
            // The decoder's and the matcher's last held-back text.
            let mut tail = match decoder.finish() {
                Ok(p) => text.push(&p.unwrap_or_default()).text,
                Err(_) => String::new(),
            };
            if !text.stopped() {
                tail.push_str(&text.finish());
            }
            if !tail.is_empty() {
                send(
                    &job,
                    Event::Delta {
                        text: tail,
                        tokens: Vec::new(),
                    },
                );
            }
        }
        let finish = match generation.finish {
            _ if text.stopped() => "stop",
            Finish::Stop | Finish::Cancelled => "stop",
            Finish::Length | Finish::ContextFull => "length",
        };
        send(
            &job,
            Event::Done(Summary {
                finish,
                prompt_tokens: job.prompt.len(),
                completion_tokens: generation.tokens.len(),
            }),
        );
    }
}

/// Sends `event` to the job's request (gone requests are ignored).
fn send(job: &Job, event: Event) {
    let _ = job.events.send(event);
}
