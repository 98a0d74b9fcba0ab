//! The routes: OpenAI's chat and text completions (whole or streamed as server-sent events),
//! the model list, health and metrics; the API key and the request counts around them all.

use crate::api::{self, ChatRequest, CompletionRequest, Plan, PromptInput};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::worker::{Event, Job, ModelInfo, Queue, Summary, TokenReport};
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, MatchedPath, Path, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc;

/// What every handler shares.
pub struct Shared {
    /// The loaded model.
    pub info: ModelInfo,
    /// The engine's queue.
    pub queue: Queue,
    /// The metrics.
    pub metrics: Arc<Metrics>,
    /// The key every route but `/health` asks for, if any.
    pub api_key: Option<String>,
    /// Unix seconds at start (the model's `created`).
    pub started: u64,
    /// Numbers response ids.
    pub next_id: AtomicU64,
}

type AppState = Arc<Shared>;

/// The application: every route, the key check, the request counts and the body limit.
pub fn router(shared: Shared, max_body_bytes: usize) -> Router {
    let state: AppState = Arc::new(shared);
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/models/{id}", get(model))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route("/metrics", get(metrics))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(state.clone(), guard))
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(state)
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Checks the API key (all routes but `/health`) and counts the answer by route and status.
async fn guard(State(s): State<AppState>, req: Request, next: Next) -> Response {
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map_or("other", |p| p.as_str())
        .to_string();
    let response = if route != "/health" && !authorized(&s, &req) {
        ApiError::unauthorized().into_response()
    } else {
        next.run(req).await
    };
    s.metrics.answered(&route, response.status().as_u16());
    response
}

fn authorized(s: &Shared, req: &Request) -> bool {
    let Some(key) = &s.api_key else {
        return true;
    };
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    // Compared in full, whatever matches first (no early exit on the first wrong byte).
    given.is_some_and(|g| {
        g.len() == key.len()
            && g.bytes()
                .zip(key.bytes())
                .fold(0u8, |d, (a, b)| d | (a ^ b))
                == 0
    })
}

async fn health(State(s): State<AppState>) -> Response {
    axum::Json(json!({"status": "ok", "model": s.info.model_id, "backend": s.info.backend}))
        .into_response()
}

fn model_object(s: &Shared) -> Value {
    json!({"id": s.info.model_id, "object": "model", "created": s.started, "owned_by": "amk"})
}

async fn models(State(s): State<AppState>) -> Response {
    axum::Json(json!({"object": "list", "data": [model_object(&s)]})).into_response()
}

async fn model(State(s): State<AppState>, Path(id): Path<String>) -> Response {
    if id == s.info.model_id {
        axum::Json(model_object(&s)).into_response()
    } else {
        ApiError::not_found(
            format!("the model '{id}' does not exist"),
            "model_not_found",
        )
        .into_response()
    }
}

async fn metrics(State(s): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.render(),
    )
        .into_response()
}

async fn not_found(req: Request) -> Response {
    ApiError::not_found(
        format!("no route {} {}", req.method(), req.uri().path()),
        "unknown_url",
    )
    .into_response()
}

async fn method_not_allowed(req: Request) -> Response {
    ApiError {
        status: StatusCode::METHOD_NOT_ALLOWED,
        ..ApiError::not_found(
            format!("{} is not allowed on {}", req.method(), req.uri().path()),
            "method_not_allowed",
        )
    }
    .into_response()
}

/// A body that could not be read (too large, cut off) as an OpenAI error with its status.
fn body_error(r: BytesRejection) -> ApiError {
    let status = r.status();
    let code = (status == StatusCode::PAYLOAD_TOO_LARGE).then_some("request_too_large");
    ApiError {
        status,
        code,
        ..ApiError::invalid(None, r.body_text())
    }
}

/// Refuses a body not declared JSON (415). A web page may send a "simple" cross-origin POST
/// to a server on the user's machine, but only as text/plain or a form: requiring JSON keeps
/// such pages from starting generations on a server without an API key.
fn json_body(headers: &HeaderMap) -> Result<(), ApiError> {
    let declared = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(|v| v.trim().to_ascii_lowercase());
    match declared.as_deref() {
        Some("application/json") => Ok(()),
        other => Err(ApiError {
            status: StatusCode::UNSUPPORTED_MEDIA_TYPE,
            code: Some("unsupported_media_type"),
            ..ApiError::invalid(
                None,
                format!(
                    "send the body as JSON with 'Content-Type: application/json' (got {})",
                    other.map_or("none".to_string(), |t| format!("'{t}'"))
                ),
            )
        }),
    }
}

/// Which endpoint a generation answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    Chat,
    Text,
}

/// A checked generation: its prompt's ids, its plan, and what a response needs to say.
struct Prepared {
    prompt: Vec<u32>,
    plan: Plan,
    /// Text completions with `echo`: the prompt's text, sent before the completion.
    echo: Option<String>,
    endpoint: Endpoint,
}

impl Shared {
    fn fresh_seed(&self) -> u64 {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        nanos ^ self.next_id.fetch_add(1, Ordering::Relaxed).rotate_left(32)
    }

    fn response_id(&self, endpoint: Endpoint) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let prefix = match endpoint {
            Endpoint::Chat => "chatcmpl",
            Endpoint::Text => "cmpl",
        };
        format!("{prefix}-{:x}{n:06x}", unix_now())
    }

    /// `max_tokens` against the cache: the tokens to generate.
    fn max_new(&self, prompt: usize, plan: &Plan) -> Result<usize, ApiError> {
        let max_seq = self.info.max_seq;
        let room = max_seq.saturating_sub(prompt as u64);
        match plan.max_tokens {
            _ if room == 0 => Err(ApiError::context(format!(
                "the prompt's {prompt} tokens fill the model's context of {max_seq} tokens"
            ))),
            Some(m) if m > room => Err(ApiError::context(format!(
                "the prompt's {prompt} tokens and max_tokens {m} exceed the model's context of {max_seq} tokens"
            ))),
            Some(m) => Ok(m as usize),
            None => Ok(room as usize),
        }
    }
}

/// Decodes token ids off the async threads (a long prompt takes a while).
async fn decode(s: &AppState, ids: Vec<u32>) -> Result<String, ApiError> {
    let tok = s.info.tokenizer.clone();
    tokio::task::spawn_blocking(move || tok.decode(&ids))
        .await
        .map_err(|e| ApiError::server(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(|e| {
            ApiError::invalid(Some("prompt"), format!("the prompt cannot be decoded: {e}"))
        })
}

/// Encodes text off the async threads (a long prompt takes a while).
async fn encode(s: &AppState, text: String) -> Result<Vec<u32>, ApiError> {
    let tok = s.info.tokenizer.clone();
    tokio::task::spawn_blocking(move || tok.encode(&text))
        .await
        .map_err(|e| ApiError::server(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
        .map_err(|e| ApiError::invalid(None, format!("the prompt cannot be encoded: {e}")))
}

async fn chat(
    State(s): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let arrived = Instant::now();
    let prepared = prepare_chat(&s, &headers, body).await;
    answer(s, prepared, arrived).await
}

/// Checks a chat completion request and encodes its prompt.
async fn prepare_chat(
    s: &AppState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Prepared, ApiError> {
    let req: ChatRequest = parse_json(headers, body)?;
    let plan = req.plan(s.fresh_seed())?;
    let turns = req.turns()?;
    s.queue.check_room()?;
    let tok = s.info.tokenizer.clone();
    let rendered = tokio::task::spawn_blocking(move || {
        let pairs: Vec<(&str, &str)> = (turns.iter())
            .map(|(r, t)| (r.as_str(), t.as_str()))
            .collect();
        tok.apply_chat_template(&pairs, true)
    })
    .await
    .map_err(|e| ApiError::server(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?
    .map_err(|e| ApiError::invalid(Some("messages"), e.to_string()))?;
    let prompt = encode(s, rendered).await?;
    Ok(Prepared {
        prompt,
        plan,
        echo: None,
        endpoint: Endpoint::Chat,
    })
}

async fn completions(
    State(s): State<AppState>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let arrived = Instant::now();
    let prepared = prepare_completion(&s, &headers, body).await;
    answer(s, prepared, arrived).await
}

/// Checks a text completion request and encodes its prompt.
async fn prepare_completion(
    s: &AppState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<Prepared, ApiError> {
    let req: CompletionRequest = parse_json(headers, body)?;
    let plan = req.plan(s.fresh_seed())?;
    s.queue.check_room()?;
    let wants_echo = req.echo.unwrap_or(false);
    let (prompt, echo) = match req.input()? {
        PromptInput::Text(t) => {
            let ids = encode(s, t.clone()).await?;
            (ids, wants_echo.then_some(t))
        }
        PromptInput::Ids(ids) => {
            if let Some(bad) = ids.iter().find(|&&t| t as usize >= s.info.vocab) {
                return Err(ApiError::invalid(
                    Some("prompt"),
                    format!(
                        "token id {bad} is outside the vocabulary of {}",
                        s.info.vocab
                    ),
                ));
            }
            // The context first: a prompt too long is refused before it is decoded.
            s.max_new(ids.len(), &plan)?;
            let echo = match wants_echo {
                true => Some(decode(s, ids.clone()).await?),
                false => None,
            };
            (ids, echo)
        }
    };
    if prompt.is_empty() {
        return Err(ApiError::invalid(
            Some("prompt"),
            "the prompt encodes to no tokens",
        ));
    }
    Ok(Prepared {
        prompt,
        plan,
        echo,
        endpoint: Endpoint::Text,
    })
}

/// The body as a request: declared JSON, readable, well-formed.
fn parse_json<T: serde::de::DeserializeOwned>(
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    json_body(headers)?;
    api::parse(&body.map_err(body_error)?)
}

/// The answer to a checked request (or its error).
async fn answer(s: AppState, prepared: Result<Prepared, ApiError>, arrived: Instant) -> Response {
    match prepared {
        Ok(g) => respond(s, g, arrived).await,
        Err(e) => e.into_response(),
    }
}

/// Queues the generation and answers: whole, or as a stream.
async fn respond(s: AppState, g: Prepared, arrived: Instant) -> Response {
    let max_new = match s.max_new(g.prompt.len(), &g.plan) {
        Ok(m) => m,
        Err(e) => return e.into_response(),
    };
    let (tx, rx) = mpsc::unbounded_channel();
    let job = Job {
        prompt: g.prompt.clone(),
        max_new,
        sampling: g.plan.sampling,
        stop: g.plan.stop.clone(),
        logprobs: g.plan.logprobs,
        ignore_eos: g.plan.ignore_eos,
        arrived,
        events: tx,
    };
    if let Err(e) = s.queue.submit(job) {
        return e.into_response();
    }
    let head = Head {
        id: s.response_id(g.endpoint),
        created: unix_now(),
        model: s.info.model_id.clone(),
        endpoint: g.endpoint,
        logprobs: g.plan.logprobs,
    };
    if g.plan.stream {
        stream(head, g, rx)
    } else {
        whole(head, g, rx).await
    }
}

/// What every response and chunk of one generation repeats.
struct Head {
    id: String,
    created: u64,
    model: String,
    endpoint: Endpoint,
    logprobs: Option<usize>,
}

impl Head {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.endpoint, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Text, _) => "text_completion",
        }
    }

    fn wrap(&self, chunk: bool, choices: Value, usage: Option<Value>) -> Value {
        let mut v = json!({
            "id": self.id,
            "object": self.object(chunk),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        });
        if let Some(u) = usage {
            v["usage"] = u;
        }
        v
    }

    /// A choice: a chat message or delta, or a text, with its log-probabilities.
    fn choice(
        &self,
        chunk: bool,
        text: &str,
        tokens: &[TokenReport],
        offset: usize,
        finish: Option<&str>,
    ) -> Value {
        let logprobs = match (chunk, tokens.is_empty()) {
            (true, true) => Value::Null,
            _ => self.logprobs_value(tokens, offset),
        };
        match self.endpoint {
            Endpoint::Chat => {
                let key = if chunk { "delta" } else { "message" };
                let body = match (chunk, finish) {
                    (true, Some(_)) => json!({}),
                    (true, None) => json!({"content": text}),
                    (false, _) => json!({"role": "assistant", "content": text}),
                };
                json!({"index": 0, key: body, "logprobs": logprobs, "finish_reason": finish})
            }
            Endpoint::Text => {
                json!({"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish})
            }
        }
    }

    fn logprobs_value(&self, tokens: &[TokenReport], offset: usize) -> Value {
        let Some(k) = self.logprobs else {
            return Value::Null;
        };
        match self.endpoint {
            Endpoint::Chat => {
                let entry = |text: &str, bytes: &[u8], logprob: f32| json!({"token": text, "logprob": logprob, "bytes": bytes});
                let content: Vec<Value> = (tokens.iter())
                    .map(|t| {
                        let mut e = entry(&t.text, &t.bytes, t.logprob);
                        e["top_logprobs"] = (t.top.iter())
                            .map(|a| entry(&a.text, &a.bytes, a.logprob))
                            .collect();
                        e
                    })
                    .collect();
                json!({"content": content})
            }
            Endpoint::Text => {
                let mut offsets = Vec::with_capacity(tokens.len());
                let mut at = offset;
                for t in tokens {
                    offsets.push(at);
                    at += t.text.chars().count();
                }
                let top: Value = if k == 0 {
                    Value::Null
                } else {
                    (tokens.iter())
                        .map(|t| {
                            let m: serde_json::Map<String, Value> = (t.top.iter())
                                .map(|a| (a.text.clone(), json!(a.logprob)))
                                .collect();
                            Value::Object(m)
                        })
                        .collect()
                };
                json!({
                    "tokens": tokens.iter().map(|t| t.text.clone()).collect::<Vec<_>>(),
                    "token_logprobs": tokens.iter().map(|t| t.logprob).collect::<Vec<_>>(),
                    "top_logprobs": top,
                    "text_offset": offsets,
                })
            }
        }
    }
}

fn usage(s: &Summary) -> Value {
    json!({
        "prompt_tokens": s.prompt_tokens,
        "completion_tokens": s.completion_tokens,
        "total_tokens": s.prompt_tokens + s.completion_tokens,
    })
}

/// The whole answer, once the generation ends. If the client goes away first, this future
/// is dropped with its receiver, and the generation stops at its next token.
async fn whole(head: Head, g: Prepared, mut rx: mpsc::UnboundedReceiver<Event>) -> Response {
    let mut text = g.echo.clone().unwrap_or_default();
    let mut tokens = Vec::new();
    while let Some(event) = rx.recv().await {
        match event {
            Event::Delta { text: t, tokens: r } => {
                text.push_str(&t);
                tokens.extend(r);
            }
            Event::Done(summary) => {
                let offset = g.echo.as_ref().map_or(0, |e| e.chars().count());
                let choice = head.choice(false, &text, &tokens, offset, Some(summary.finish));
                let body = head.wrap(false, json!([choice]), Some(usage(&summary)));
                return axum::Json(body).into_response();
            }
            Event::Failed(e) => return e.into_response(),
        }
    }
    ApiError::server(
        StatusCode::INTERNAL_SERVER_ERROR,
        "the engine stopped during the request",
    )
    .into_response()
}

/// The answer as server-sent events: a first chunk (the assistant's role, or the echoed
/// prompt), a chunk per piece of text, a last chunk with the finish reason, the token counts
/// when asked for, then `[DONE]`. Dropping the stream (the client left) drops the receiver.
fn stream(head: Head, g: Prepared, rx: mpsc::UnboundedReceiver<Event>) -> Response {
    let mut pending = VecDeque::new();
    let mut offset = 0;
    match (head.endpoint, &g.echo) {
        (Endpoint::Chat, _) => {
            let first = json!({"index": 0, "delta": {"role": "assistant", "content": ""},
                               "logprobs": null, "finish_reason": null});
            pending.push_back(data(&head.wrap(true, json!([first]), None)));
        }
        (Endpoint::Text, Some(echo)) => {
            pending.push_back(data(&head.wrap(
                true,
                json!([head.choice(true, echo, &[], 0, None)]),
                None,
            )));
            offset = echo.chars().count();
        }
        (Endpoint::Text, None) => {}
    }
    let state = Streaming {
        head,
        rx,
        pending,
        offset,
        include_usage: g.plan.include_usage,
        done: false,
    };
    let events = futures_util::stream::unfold(state, |mut st| async move {
        loop {
            if let Some(e) = st.pending.pop_front() {
                return Some((Ok::<_, Infallible>(e), st));
            }
            if st.done {
                return None;
            }
            st.next().await;
        }
    });
    Sse::new(events).into_response()
}

fn data(v: &Value) -> SseEvent {
    SseEvent::default().data(v.to_string())
}

/// A stream's state between chunks.
struct Streaming {
    head: Head,
    rx: mpsc::UnboundedReceiver<Event>,
    pending: VecDeque<SseEvent>,
    /// Characters of the tokens reported so far, the echoed prompt's included (text
    /// completions' `text_offset`).
    offset: usize,
    include_usage: bool,
    done: bool,
}

impl Streaming {
    /// Waits for the generation's next event and queues the chunks it makes.
    async fn next(&mut self) {
        let Some(event) = self.rx.recv().await else {
            let e = ApiError::server(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the engine stopped during the request",
            );
            self.end_with_error(&e);
            return;
        };
        match event {
            Event::Delta { text, tokens } => {
                if text.is_empty() && tokens.is_empty() {
                    return;
                }
                let choice = self.head.choice(true, &text, &tokens, self.offset, None);
                // Offsets count the tokens' text, which runs ahead of the text released
                // while a stop string may be forming.
                self.offset += tokens.iter().map(|t| t.text.chars().count()).sum::<usize>();
                let chunk = self.head.wrap(true, json!([choice]), None);
                self.pending.push_back(data(&chunk));
            }
            Event::Done(summary) => {
                let last = self
                    .head
                    .choice(true, "", &[], self.offset, Some(summary.finish));
                let chunk = self.head.wrap(true, json!([last]), None);
                self.pending.push_back(data(&chunk));
                if self.include_usage {
                    let u = self.head.wrap(true, json!([]), Some(usage(&summary)));
                    self.pending.push_back(data(&u));
                }
                self.pending.push_back(SseEvent::default().data("[DONE]"));
                self.done = true;
            }
            Event::Failed(e) => self.end_with_error(&e),
        }
    }

    fn end_with_error(&mut self, e: &ApiError) {
        self.pending.push_back(data(&e.body()));
        self.pending.push_back(SseEvent::default().data("[DONE]"));
        self.done = true;
    }
}
