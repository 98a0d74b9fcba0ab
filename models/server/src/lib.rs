//! `amk-server`: an OpenAI-compatible HTTP server over the engine (`amk serve`).
//!
//! - `POST /v1/chat/completions` (the model's chat template) and `POST /v1/completions`,
//!   whole or streamed as server-sent events ending in `data: [DONE]`: `max_tokens`,
//!   `temperature`, `top_p`, `top_k`, `seed`, `stop` strings (matched across tokens),
//!   `logprobs`/`top_logprobs`, `usage`.
//! - `GET /v1/models`, `GET /health`, `GET /metrics` (Prometheus text).
//! - One engine decodes one sequence at a time: generations queue first in, first out; a full
//!   queue answers 429; a client that disconnects stops its generation at the next token.
//! - Every error is OpenAI's error object with a 4xx or 5xx status; `--api-key` guards every
//!   route but `/health`.
//!
//! The engine is built by the caller's loader on the engine's own thread ([`serve`]), so the
//! server knows nothing of backends or model formats. That thread and its queue ([`worker`])
//! serve other front ends too (the Python bindings stream through it).

mod api;
mod error;
mod metrics;
mod routes;
mod stop;
pub mod worker;

pub use api::{MAX_STOP_BYTES, MAX_STOPS};
pub use error::{ApiError, ServerError};
pub use metrics::Metrics;
pub use stop::{Released, StopText};
pub use worker::{LoadError, Loaded, ModelInfo};

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;

/// How to serve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeOptions {
    /// The address to listen on (`127.0.0.1`; `0.0.0.0` for every interface).
    pub host: String,
    /// The port (0: any free one, reported to `on_ready`).
    pub port: u16,
    /// The key clients must send as `Authorization: Bearer KEY` (all routes but `/health`).
    pub api_key: Option<String>,
    /// Generations that may wait behind the running one before requests get 429.
    pub queue: usize,
    /// The largest request body accepted, in bytes (413 above it).
    pub max_body_bytes: usize,
    /// Threads answering HTTP (the engine has its own).
    pub http_threads: usize,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            host: "127.0.0.1".into(),
            port: 8000,
            api_key: None,
            queue: DEFAULT_QUEUE,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            http_threads: 2,
        }
    }
}

/// Generations that may wait by default.
pub const DEFAULT_QUEUE: usize = 64;
/// The largest body by default: 4 MiB, a long prompt's worth of text many times over.
pub const DEFAULT_MAX_BODY_BYTES: usize = 4 << 20;

/// Loads the model with `loader` (on the engine's thread), listens, calls `on_ready` with the
/// address bound and the model, and serves until SIGINT or SIGTERM; requests in flight then
/// finish. `on_ready` returning false (it could not tell anyone where the server is) stops
/// the server before it serves.
pub fn serve<L, R>(opts: &ServeOptions, loader: L, on_ready: R) -> Result<(), ServerError>
where
    L: FnOnce() -> Result<Loaded, LoadError> + Send + 'static,
    R: FnOnce(SocketAddr, &ModelInfo) -> bool,
{
    let metrics = Arc::new(Metrics::new());
    let started = worker::start(loader, opts.queue, metrics.clone())?;
    let io = |what: String| move |source| ServerError::Io { what, source };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(opts.http_threads.max(1))
        .enable_all()
        .build()
        .map_err(io("starting the HTTP runtime".into()))?;
    let info = started.info.clone();
    let shared = routes::Shared {
        info: started.info,
        queue: started.queue,
        metrics,
        api_key: opts.api_key.clone(),
        started: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        next_id: AtomicU64::new(0),
    };
    let app = routes::router(shared, opts.max_body_bytes);
    let bind = format!("{}:{}", opts.host, opts.port);
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(&bind)
            .await
            .map_err(io(format!("binding {bind}")))?;
        let addr = listener
            .local_addr()
            .map_err(io(format!("reading the address bound for {bind}")))?;
        if !on_ready(addr, &info) {
            return Ok(());
        }
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown())
            .await
            .map_err(io(format!("serving {addr}")))
    })?;
    // The router (and with it the queue's sender) is gone: the engine thread ends.
    drop(runtime);
    let _ = started.thread.join();
    Ok(())
}

/// Resolves at SIGINT (Ctrl-C) or SIGTERM.
async fn shutdown() {
    let interrupt = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = interrupt => {},
        () = terminate => {},
    }
}
