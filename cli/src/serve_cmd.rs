//! `amk serve`: the OpenAI-compatible HTTP server (`amk_server`) over a model loaded as
//! `amk generate` loads it.

use crate::backend_choice::{self, BackendKind};
use crate::model_cmd::{
    EngineArgs, ModelArgs, ModelCmdError, finish, import, load_engine, registry, tokenizer,
};
use crate::output::outln;
use crate::status::status;
use amk_server::{LoadError, Loaded, ModelInfo, ServeOptions, ServerError};
use std::net::SocketAddr;
use std::process::ExitCode;

/// Arguments of `amk serve`.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    common: ModelArgs,
    #[command(flatten)]
    prefill: EngineArgs,
    /// Address to listen on (0.0.0.0: every interface).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port, printed at start).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Require `Authorization: Bearer KEY` on every route but /health. Prefer the
    /// environment variable, which other users' `ps` does not show.
    #[arg(long, env = "AMK_API_KEY", hide_env_values = true, value_name = "KEY")]
    api_key: Option<String>,
    /// Generations that may wait behind the running one; more get 429 (Too Many Requests).
    #[arg(long, default_value_t = amk_server::DEFAULT_QUEUE, value_name = "N")]
    queue: usize,
    /// Largest request body accepted, in bytes; larger ones get 413.
    #[arg(long, default_value_t = amk_server::DEFAULT_MAX_BODY_BYTES, value_name = "BYTES")]
    max_body_bytes: usize,
    /// The model's name in /v1/models and in responses (default: its file or folder name).
    #[arg(long, value_name = "NAME")]
    model_name: Option<String>,
    /// Execution backend: `cpu` (the CPU VM), `cuda` (the GPU megakernel; needs a build with
    /// `--features cuda` and a GPU) or `auto` (cuda when available, else cpu).
    #[arg(long, value_enum, default_value_t = BackendKind::Auto)]
    backend: BackendKind,
    /// Worker threads of the CPU backend (at least 1).
    #[arg(long, default_value_t = 1, value_parser = crate::model_cmd::parse_threads)]
    threads: usize,
}

/// Shown after `amk serve --help`.
pub const AFTER_HELP: &str = "\
Routes: POST /v1/chat/completions, POST /v1/completions (both with \"stream\": true for
server-sent events), GET /v1/models, GET /health, GET /metrics (Prometheus text).

Once listening it prints `serving http://ADDR` on stderr (with --json, one JSON object
{\"listening\": \"http://ADDR\", \"model\": ..., \"backend\": ...} on stdout) and serves until
SIGINT (Ctrl-C) or SIGTERM; requests in flight finish first.

Exit status:
  0  stopped by a signal
  1  the lowered program was rejected by the validator (a bug: please report it)
  2  bad invocation or input (model, config, an address that cannot be bound)
  3  the backend failed while loading

docs/server.md has the API, its defaults and its limits.";

/// Runs `amk serve`.
pub fn run(a: &ServeArgs) -> ExitCode {
    finish(a.common.json, serve(a))
}

fn serve(a: &ServeArgs) -> Result<(), ModelCmdError> {
    if a.queue == 0 {
        return Err(ModelCmdError::Usage("--queue must be at least 1".into()));
    }
    let opts = ServeOptions {
        host: a.host.clone(),
        port: a.port,
        api_key: a.api_key.clone().filter(|k| !k.is_empty()),
        queue: a.queue,
        max_body_bytes: a.max_body_bytes,
        ..ServeOptions::default()
    };
    let loader = {
        let (common, prefill, backend, threads) =
            (a.common.clone(), a.prefill, a.backend, a.threads);
        let name = a.model_name.clone();
        move || -> Result<Loaded, LoadError> {
            load(&common, prefill, backend, threads, name).map_err(|e| Box::new(e) as LoadError)
        }
    };
    let json = a.common.json;
    let ready = move |addr: SocketAddr, info: &ModelInfo| {
        if json {
            let v = serde_json::json!({
                "listening": format!("http://{addr}"),
                "model": info.model_id,
                "backend": info.backend,
                "max_seq": info.max_seq,
            });
            outln!("{v}");
            crate::output::flush_out();
        } else {
            status!(
                "serving http://{addr} (model {}, backend {}, context {} tokens); Ctrl-C stops",
                info.model_id,
                info.backend,
                info.max_seq
            );
        }
        // Nobody can be told the address (the stream it went to cannot be written): stop, and
        // let the output policy give the exit status.
        if json {
            !crate::output::stdout_closed()
        } else {
            !crate::output::stderr_failed()
        }
    };
    match amk_server::serve(&opts, loader, ready) {
        Ok(()) => Ok(()),
        Err(ServerError::Load(e)) => Err(match e.downcast::<ModelCmdError>() {
            Ok(m) => *m,
            Err(other) => ModelCmdError::Usage(other.to_string()),
        }),
        Err(e) => Err(ModelCmdError::Serve(e)),
    }
}

/// Loads the model as `amk generate` does, on the engine's thread.
fn load(
    common: &ModelArgs,
    prefill: EngineArgs,
    backend: BackendKind,
    threads: usize,
    name: Option<String>,
) -> Result<Loaded, ModelCmdError> {
    let chosen = backend_choice::choose(backend, threads)?;
    let reg = registry()?;
    let imported = import(common, chosen.gpu_sms, Some(prefill))?;
    status!("{}", chosen.line);
    let tok = tokenizer(&imported.model)?.clone();
    let model_id = name.unwrap_or_else(|| imported.model.name());
    let (engine, _) = load_engine(&imported, &chosen, &reg)?;
    Ok(Loaded {
        engine,
        tokenizer: tok,
        model_id,
    })
}
