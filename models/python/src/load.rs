//! Loading a model as `amk generate` does: the path or the default model, its importer, a
//! backend, the engine's options.

use amk_core::{Backend, DType, GpuTarget, ScheduleConfig};
use amk_engine::{EngineOptions, Placement, lower_and_load};
use amk_model_llama::lower::tuned_schedule;
use amk_server::worker::{LoadError, Loaded};
use std::path::PathBuf;

pub use amk_backend_choice::BackendKind;

/// "f32", "f16" or "bf16".
pub fn parse_dtype(s: &str) -> Result<DType, String> {
    match s {
        "f32" => Ok(DType::F32),
        "f16" => Ok(DType::F16),
        "bf16" => Ok(DType::BF16),
        other => Err(format!(
            "dtype {other:?} is not one of \"f32\", \"f16\", \"bf16\""
        )),
    }
}

/// What `amk.Model(...)` was given.
#[derive(Debug, Clone)]
pub struct Config {
    pub path: Option<PathBuf>,
    pub backend: BackendKind,
    pub dtype: DType,
    pub max_seq: Option<u64>,
    pub threads: usize,
    pub prefill_rows: Option<u64>,
}

/// The backend, and the GPU's SM count when it is one (the CLI's choice: `amk_backend_choice`).
fn open(kind: BackendKind, threads: usize) -> Result<(Box<dyn Backend>, Option<usize>), LoadError> {
    let chosen = amk_backend_choice::choose(kind, threads)?;
    Ok((chosen.backend, chosen.gpu_sms))
}

/// Imports the model and loads it on the backend (on the engine's thread).
pub fn load(c: Config) -> Result<Loaded, LoadError> {
    let path = match c.path {
        Some(p) => p,
        None => amk_model_fetch::default_model_path(&amk_model_fetch::FetchOptions::smollm2())?,
    };
    if !path.exists() {
        return Err(format!("{}: no such file or directory", path.display()).into());
    }
    let importer = amk_model_llama::importer_for(&path).ok_or_else(|| {
        format!(
            "{}: not a model: expected a GGUF file or a HuggingFace directory",
            path.display()
        )
    })?;
    let model = importer
        .import(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let tokenizer = model.tokenizer.clone().ok_or_else(|| {
        format!(
            "{}: the model carries no tokenizer (an HF directory needs tokenizer.json)",
            path.display()
        )
    })?;
    let (backend, sms) = open(c.backend, c.threads)?;
    let mut target = GpuTarget::by_name("h100").ok_or("the built-in h100 target is missing")?;
    if let Some(s) = sms {
        target.num_sms = s as i64;
    }
    let gpu = sms.is_some();
    let schedule = if gpu {
        tuned_schedule()
    } else {
        ScheduleConfig::default()
    };
    let at = Placement {
        gpu,
        scoring: false,
    };
    let options = EngineOptions {
        max_seq: c.max_seq,
        ..EngineOptions::defaults(schedule, target, c.dtype, at).with_asked(c.prefill_rows, None)
    };
    let registry = amk_ops::registry()?;
    let engine = lower_and_load(&model, &options, backend.as_ref(), &registry)?;
    let model_id = model.name();
    Ok(Loaded {
        engine,
        tokenizer,
        model_id,
    })
}
