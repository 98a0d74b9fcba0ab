//! `amk validate FILE... [--json]`.

use crate::output::{MAX_ERR_BYTES, bounded, errln, outln};
use amk_core::{IrError, Registry, ValidationResult, validate};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Shown after `amk validate --help`.
pub const AFTER_HELP: &str = "\
Exit status:
  0  every file loaded and every program was accepted
  1  every file loaded, but at least one program was rejected
  2  at least one file could not be read or parsed (this wins over 1)

With --json, stdout holds one object per file (a JSON array when several files are given):
  {\"file\", \"ok\", \"stage\": \"load\"|\"validate\", \"errors\": [{\"kind\", \"message\", ...}],
   \"warnings\": [...], \"stats\": {\"tasks\", \"buffers\", \"counters\", \"edges\", \"acyclic\",
   \"weight_MB\", \"sm_assigned\", \"pages\"}}
Error kinds are the stable vocabulary of docs/ir.md; load errors have kind \"load\".
Files ending in .gz (or starting with the gzip magic) are decompressed transparently.";

/// Arguments of `amk validate`.
#[derive(clap::Args)]
pub struct Args {
    /// Program files (.json or .json.gz).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Machine-readable output on stdout.
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    limit: ProgramLimit,
}

/// `--max-program-mib`, for every command that reads a program file (`validate`, `run`).
#[derive(clap::Args)]
pub struct ProgramLimit {
    /// Largest program accepted, in MiB, as a file and decompressed; its parsed JSON values
    /// may take four times as much memory (bounds on what a hostile file can make the loader
    /// allocate).
    #[arg(long, value_name = "MIB", default_value_t = amk_core::codec::MAX_PROGRAM_BYTES >> 20,
          value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    max_program_mib: u64,
}

impl ProgramLimit {
    /// The program at `path` (`amk_core::codec::load_limited` at this bound).
    pub fn load(&self, path: &Path, reg: &Registry) -> Result<amk_core::Program, IrError> {
        amk_core::codec::load_limited(path, reg, self.max_program_mib << 20)
    }
}

enum Outcome {
    Loaded(Box<ValidationResult>),
    LoadFailed(IrError),
}

fn check_file(path: &Path, reg: &Registry, limit: &ProgramLimit) -> Outcome {
    match limit.load(path, reg) {
        Ok(p) => Outcome::Loaded(Box::new(validate(&p, reg))),
        Err(e) => Outcome::LoadFailed(e),
    }
}

fn diag_json<K: std::fmt::Display>(d: &amk_core::validate::Diagnostic<K>) -> Value {
    let mut o = serde_json::Map::new();
    o.insert("kind".into(), json!(d.kind.to_string()));
    o.insert("message".into(), json!(bounded(&d.message, MAX_ERR_BYTES)));
    if let Some(t) = d.task {
        o.insert("task".into(), json!(t));
    }
    if let Some(b) = d.buffer {
        o.insert("buffer".into(), json!(b));
    }
    if let Some(c) = d.counter {
        o.insert("counter".into(), json!(c));
    }
    if !d.others.is_empty() {
        o.insert("others".into(), json!(d.others));
    }
    if !d.path.is_empty() {
        o.insert("path".into(), json!(d.path));
    }
    Value::Object(o)
}

fn outcome_json(file: &Path, o: &Outcome) -> Value {
    match o {
        Outcome::Loaded(r) => json!({
            "file": file.display().to_string(),
            "ok": r.ok(),
            "stage": "validate",
            "errors": r.errors.iter().map(diag_json).collect::<Vec<_>>(),
            "warnings": r.warnings.iter().map(diag_json).collect::<Vec<_>>(),
            "stats": serde_json::to_value(&r.stats).unwrap_or(Value::Null),
        }),
        Outcome::LoadFailed(e) => json!({
            "file": file.display().to_string(),
            "ok": false,
            "stage": "load",
            "errors": [{"kind": "load", "message": bounded(&e.to_string(), MAX_ERR_BYTES)}],
            "warnings": [],
            "stats": {},
        }),
    }
}

/// Runs the command; returns the documented exit status.
pub fn run(args: &Args) -> ExitCode {
    let reg = match crate::registry::registry() {
        Ok(r) => r,
        Err(e) => {
            errln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let mut any_load_error = false;
    let mut any_rejected = false;
    let mut docs = Vec::new();
    for file in &args.files {
        let o = check_file(file, &reg, &args.limit);
        match &o {
            Outcome::LoadFailed(_) => any_load_error = true,
            Outcome::Loaded(r) if !r.ok() => any_rejected = true,
            Outcome::Loaded(_) => {}
        }
        if args.json {
            docs.push(outcome_json(file, &o));
        } else {
            match &o {
                Outcome::Loaded(r) => {
                    outln!("{}: {}", file.display(), r.report());
                }
                // Not a verdict: an error, on stderr like every command's, naming the file once.
                Outcome::LoadFailed(e) => errln!("error: {}", crate::with_path(file, e)),
            }
        }
    }
    if args.json {
        let doc = if docs.len() == 1 {
            docs.pop().unwrap_or(Value::Null)
        } else {
            Value::Array(docs)
        };
        outln!("{}", serde_json::to_string(&doc).unwrap_or_default());
    }
    if any_load_error {
        ExitCode::from(2)
    } else if any_rejected {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
