//! `amk run PROGRAM --weights FILE [--set NAME=v1,v2,…]… [--steps N] [--backend cpu|cuda|auto]
//! [--json]`:
//! load, validate, bind weights, set the IO inputs, run forward passes, print the IO outputs.
//!
//! Everything the user can get wrong is checked before the backend runs and reported as a
//! [`RunError`] naming the file or buffer; nothing here panics.

use crate::backend_choice::{self, BackendKind, BackendUnavailable};
use crate::output::{errln, outln};
use amk_core::{
    BackendError, Buffer, BufferKind, DType, IrError, Program, Registry, Tensor, ValidatedProgram,
    ValidationResult, WeightStore, validate_owned,
};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Shown after `amk run --help`.
pub const AFTER_HELP: &str = "\
Every IO_INPUT buffer of the program needs one --set NAME=v1,v2,... with exactly as many
comma-separated numbers as the buffer has elements (row-major): integers for integer dtypes
(I32, I8, U8, I4 as a raw nibble 0..15, BOOL 0/1), finite decimals otherwise, except
`reshape_id0`, which the decode programs of `amk lower` carry and which is 0 unless set (a
decode program's other inputs: `token_id`, the token, and `pos`, its position from 0). A
missing input's error names what it holds when it is one of these. The same inputs are used
for every step; KV caches start zeroed and persist from step to step. The IO_OUTPUT
buffers of the last step are printed. One line on stderr names the backend that runs and why:
`backend: cpu`, `backend: cuda (DEVICE)` or, on a build with the cuda feature that cannot open
a GPU, `backend: cpu (cuda unavailable: REASON)`.

Exit status:
  0  the program ran; its outputs are on stdout
  1  the program was rejected by the validator (the report is printed)
  2  bad invocation or input: unreadable program or weights file, a weight missing or of the
     wrong dtype/shape, an unknown, malformed, repeated or missing --set, --backend cuda
     where this build or machine has no CUDA backend
  3  the backend failed while running (an op refused a task, a race was detected, ...)

With --json, stdout holds exactly
  {\"outputs\": {NAME: {\"dtype\": \"F32\", \"shape\": [..], \"data\": [..]}, ...},
   \"backend\": \"cpu\"|\"cuda\"}
(every value; NaN and infinities as the strings \"nan\", \"inf\", \"-inf\"), or on failure
  {\"error\": {\"kind\": \"load\"|\"rejected\"|\"weights\"|\"input\"|\"backend\"|\"run\",
              \"message\": \"...\", \"buffer\": NAME (when one is at fault)}}";

/// Arguments of `amk run`.
#[derive(clap::Args)]
pub struct Args {
    /// Program file (.json or .json.gz).
    program: PathBuf,
    #[command(flatten)]
    limit: crate::validate_cmd::ProgramLimit,
    /// Safetensors file holding the WEIGHT/CONST tensors, keyed by each buffer's `source`
    /// (needed when the program has such buffers).
    #[arg(long, value_name = "FILE.safetensors")]
    weights: Option<PathBuf>,
    /// Value of one IO_INPUT buffer: its name and comma-separated numbers (repeatable).
    #[arg(long = "set", value_name = "NAME=V1,V2,...")]
    set: Vec<String>,
    /// Forward passes to run (same inputs each step); the last step's outputs are printed.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    steps: u64,
    /// Execution backend: `cpu` (the CPU VM), `cuda` (the GPU megakernel; needs a build with
    /// `--features cuda` and a GPU) or `auto` (cuda when available, else cpu). The choice is
    /// reported on stderr.
    #[arg(long, value_enum, default_value_t = BackendKind::Auto)]
    backend: BackendKind,
    /// Machine-readable output on stdout.
    #[arg(long)]
    json: bool,
}

/// Why `amk run` could not produce outputs.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The op registry could not be built.
    #[error("{0}")]
    Registry(crate::registry::RegistryError),
    /// The program file could not be read or parsed.
    #[error("{}", crate::with_path(path, source))]
    Load {
        /// File.
        path: PathBuf,
        /// Cause.
        source: IrError,
    },
    /// The validator rejected the program.
    #[error("{}: {}", path.display(), result.report())]
    Rejected {
        /// File.
        path: PathBuf,
        /// The validation result.
        result: Box<ValidationResult>,
    },
    /// `--backend cuda` cannot be opened here.
    #[error("{0}")]
    Backend(#[from] BackendUnavailable),
    /// The weights file is unreadable, or a WEIGHT/CONST buffer cannot be bound to it.
    #[error("weights: {0}")]
    Weights(BackendError),
    /// A `--set` or a missing input.
    #[error("input '{name}': {message}")]
    Input {
        /// Buffer name (as given on the command line).
        name: String,
        /// What is wrong.
        message: String,
    },
    /// The backend refused to load the program or failed while running it.
    #[error("{backend} backend: {source}")]
    Run {
        /// Backend name.
        backend: String,
        /// Cause.
        source: BackendError,
    },
}

impl RunError {
    /// The documented exit status.
    pub fn exit_code(&self) -> u8 {
        match self {
            RunError::Rejected { .. } => 1,
            RunError::Run { source, .. } => match source {
                BackendError::Io { .. }
                | BackendError::Format { .. }
                | BackendError::Weights { .. }
                | BackendError::Input { .. } => 2,
                _ => 3,
            },
            _ => 2,
        }
    }

    /// The `kind` of the `--json` error object.
    fn kind(&self) -> &'static str {
        match self {
            RunError::Registry(_) | RunError::Backend(_) => "backend",
            RunError::Load { .. } => "load",
            RunError::Rejected { .. } => "rejected",
            RunError::Weights(_) => "weights",
            RunError::Input { .. } => "input",
            RunError::Run { source, .. } => match source {
                BackendError::Io { .. }
                | BackendError::Format { .. }
                | BackendError::Weights { .. } => "weights",
                BackendError::Input { .. } => "input",
                _ => "run",
            },
        }
    }

    /// The buffer at fault, when there is one.
    fn buffer(&self) -> Option<&str> {
        match self {
            RunError::Input { name, .. }
            | RunError::Weights(BackendError::Weights { buffer: name, .. })
            | RunError::Run {
                source:
                    BackendError::Weights { buffer: name, .. }
                    | BackendError::Input { name, .. }
                    | BackendError::Race { buffer: name, .. },
                ..
            } => Some(name),
            _ => None,
        }
    }
}

fn input_err(name: &str, message: impl Into<String>) -> RunError {
    RunError::Input {
        name: name.to_string(),
        message: message.into(),
    }
}

/// Parses one comma-separated value list for `buf` into a tensor of its dtype and shape.
pub fn parse_values(buf: &Buffer, text: &str) -> Result<Tensor, RunError> {
    let name = buf.name.as_str();
    let want = buf.numel();
    let items: Vec<&str> = text.split(',').map(str::trim).collect();
    if items.len() as u64 != want {
        return Err(input_err(
            name,
            format!(
                "{} value(s) given, but the {} buffer {:?} holds {want} element(s)",
                items.len(),
                buf.dtype,
                buf.shape
            ),
        ));
    }
    let bad = |i: usize, s: &str, why: &str| {
        input_err(
            name,
            format!("value {i} ('{s}') is not {why} (buffer is {})", buf.dtype),
        )
    };
    let built = if buf.dtype.is_integer() {
        let (lo, hi) = match buf.dtype {
            DType::I32 => (i32::MIN as i64, i32::MAX as i64),
            DType::I8 => (i8::MIN as i64, i8::MAX as i64),
            DType::U8 => (0, u8::MAX as i64),
            DType::I4 => (0, 15),
            _ => (0, 1), // BOOL
        };
        let mut v = Vec::with_capacity(items.len());
        for (i, s) in items.iter().enumerate() {
            let x: i64 = s.parse().map_err(|_| bad(i, s, "an integer"))?;
            if x < lo || x > hi {
                return Err(bad(i, s, &format!("in [{lo}, {hi}]")));
            }
            v.push(x);
        }
        Tensor::from_i64(buf.dtype, &buf.shape, &v)
    } else {
        let mut v = Vec::with_capacity(items.len());
        for (i, s) in items.iter().enumerate() {
            let x: f64 = s.parse().map_err(|_| bad(i, s, "a number"))?;
            if !x.is_finite() {
                return Err(bad(i, s, "a finite number"));
            }
            v.push(x as f32);
        }
        Tensor::from_f32(buf.dtype, &buf.shape, &v)
    };
    built.map_err(|e| input_err(name, e.to_string()))
}

/// Turns the `--set` list into named tensors: every IO_INPUT buffer exactly once.
pub fn parse_inputs(p: &Program, sets: &[String]) -> Result<Vec<(String, Tensor)>, RunError> {
    let io: Vec<&Buffer> = p
        .buffers
        .iter()
        .filter(|b| b.kind == BufferKind::IO_INPUT)
        .collect();
    let mut out: Vec<(String, Tensor)> = Vec::new();
    for s in sets {
        let Some((name, values)) = s.split_once('=') else {
            return Err(input_err(
                s,
                "--set needs NAME=V1,V2,... (no '=' found)".to_string(),
            ));
        };
        let name = name.trim();
        let Some(buf) = io.iter().find(|b| b.name == name) else {
            let known: Vec<&str> = io.iter().map(|b| b.name.as_str()).collect();
            let why = if p.buffers.iter().any(|b| b.name == name) {
                "is not an IO_INPUT buffer".to_string()
            } else {
                "no buffer has this name".to_string()
            };
            return Err(input_err(
                name,
                format!("{why}; the program's inputs are: {}", known.join(", ")),
            ));
        };
        if out.iter().any(|(n, _)| n == name) {
            return Err(input_err(name, "set more than once"));
        }
        out.push((name.to_string(), parse_values(buf, values)?));
    }
    let mut missing: Vec<&Buffer> = Vec::new();
    for b in io.iter().copied() {
        if out.iter().any(|(n, _)| *n == b.name) {
            continue;
        }
        match decode_default(b)? {
            Some(t) => out.push((b.name.clone(), t)),
            None => missing.push(b),
        }
    }
    if let Some(first) = missing.first() {
        let all: Vec<String> = missing.iter().map(|b| describe_input(b)).collect();
        return Err(input_err(
            &first.name,
            format!(
                "missing: every IO_INPUT buffer needs a --set; not set: {}",
                all.join(", ")
            ),
        ));
    }
    Ok(out)
}

/// The value of an input of the decode interface that always has one (`reshape_id0` = 0 in
/// the decode programs `amk lower` writes), as a tensor of the buffer's dtype and shape.
fn decode_default(b: &Buffer) -> Result<Option<Tensor>, RunError> {
    let Some(v) = amk_core::decode::input_default(&b.name) else {
        return Ok(None);
    };
    let values = vec![v.to_string(); b.numel() as usize].join(",");
    parse_values(b, &values).map(Some)
}

/// `NAME (DTYPE [SHAPE])`, with what the input holds when it is one of the decode interface's.
fn describe_input(b: &Buffer) -> String {
    match amk_core::decode::input_meaning(&b.name) {
        Some(m) => format!("{} ({} {:?}: {m})", b.name, b.dtype, b.shape),
        None => format!("{} ({} {:?})", b.name, b.dtype, b.shape),
    }
}

/// Loads the weights (an empty store when no file is given).
fn load_weights(path: Option<&Path>) -> Result<WeightStore, RunError> {
    match path {
        Some(p) => WeightStore::load_safetensors(p).map_err(RunError::Weights),
        None => Ok(WeightStore::new()),
    }
}

/// What a successful run produced.
struct RunOutput {
    /// `(name, value)` of every IO_OUTPUT buffer after the last step.
    outputs: Vec<(String, Tensor)>,
    /// Weights-file tensors no buffer uses.
    unused: Vec<String>,
    backend: &'static str,
    steps: u64,
}

fn run_inner(args: &Args) -> Result<RunOutput, RunError> {
    // The backend first: an unavailable one should not wait on loading a large program.
    let chosen = backend_choice::open(args.backend, 1)?;
    let backend = chosen.backend.as_ref();
    let reg: Registry = crate::registry::registry().map_err(RunError::Registry)?;
    let program = args
        .limit
        .load(&args.program, &reg)
        .map_err(|source| RunError::Load {
            path: args.program.clone(),
            source,
        })?;
    let validated: ValidatedProgram =
        validate_owned(program, &reg).map_err(|result| RunError::Rejected {
            path: args.program.clone(),
            result: Box::new(result),
        })?;
    let p = validated.program();
    let weights = load_weights(args.weights.as_deref())?;
    let bound = weights.bind(p).map_err(|e| match (e, &args.weights) {
        (BackendError::Weights { buffer, message }, None) => {
            RunError::Weights(BackendError::Weights {
                buffer,
                message: format!("{message} (no --weights file was given)"),
            })
        }
        (e, _) => RunError::Weights(e),
    })?;
    let inputs = parse_inputs(p, &args.set)?;
    let run_err = |source| RunError::Run {
        backend: backend.name().to_string(),
        source,
    };
    let mut session = backend.load(&validated, &weights, &reg).map_err(run_err)?;
    let refs: Vec<(&str, Tensor)> = inputs
        .iter()
        .map(|(n, t)| (n.as_str(), t.clone()))
        .collect();
    let mut last = None;
    for _ in 0..args.steps {
        last = Some(session.step(&refs).map_err(run_err)?);
    }
    Ok(RunOutput {
        outputs: last.map(|o| o.tensors).unwrap_or_default(),
        unused: bound.unused,
        backend: backend.name(),
        steps: args.steps,
    })
}

/// One element as JSON text: integers exactly, floats in their shortest f32 form.
fn json_value(t: &Tensor, i: usize) -> String {
    if t.dtype().is_integer() {
        return t.get_i64(i).to_string();
    }
    let x = t.get_f32(i);
    if x.is_nan() {
        "\"nan\"".into()
    } else if x.is_infinite() {
        if x > 0.0 { "\"inf\"" } else { "\"-inf\"" }.into()
    } else {
        format!("{x:?}")
    }
}

/// One element as human text.
fn text_value(t: &Tensor, i: usize) -> String {
    if t.dtype().is_integer() {
        t.get_i64(i).to_string()
    } else {
        format!("{:?}", t.get_f32(i))
    }
}

fn json_string(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into())
}

/// The `--json` document (compact, as every command's), outputs in buffer order, then the
/// backend that ran them.
fn outputs_json(outputs: &[(String, Tensor)], backend: &str) -> String {
    let mut s = String::from("{\"outputs\":{");
    for (k, (name, t)) in outputs.iter().enumerate() {
        if k > 0 {
            s.push(',');
        }
        let shape: Vec<String> = t.shape().iter().map(u64::to_string).collect();
        let _ = write!(
            s,
            "{}:{{\"dtype\":\"{}\",\"shape\":[{}],\"data\":[",
            json_string(name),
            t.dtype(),
            shape.join(",")
        );
        for i in 0..t.numel() {
            if i > 0 {
                s.push(',');
            }
            s.push_str(&json_value(t, i));
        }
        s.push_str("]}");
    }
    let _ = write!(s, "}},\"backend\":{}}}", json_string(backend));
    s
}

/// Most values shown per output in human mode before abbreviating.
const SHOW_ALL_UP_TO: usize = 16;

/// Human text: one line per output, long arrays abbreviated.
fn outputs_text(o: &RunOutput) -> String {
    let mut s = format!(
        "ran {} step(s) on the {} backend; outputs of the last step:\n",
        o.steps, o.backend
    );
    for (name, t) in &o.outputs {
        let n = t.numel();
        let vals: Vec<String> = if n <= SHOW_ALL_UP_TO {
            (0..n).map(|i| text_value(t, i)).collect()
        } else {
            let mut v: Vec<String> = (0..8).map(|i| text_value(t, i)).collect();
            v.push("...".into());
            v.extend((n - 4..n).map(|i| text_value(t, i)));
            v
        };
        let _ = write!(
            s,
            "{name}: {} {:?} = [{}]",
            t.dtype(),
            t.shape(),
            vals.join(", ")
        );
        if n > SHOW_ALL_UP_TO {
            let _ = write!(s, " ({n} values; --json prints all)");
        }
        s.push('\n');
    }
    s
}

fn error_json(e: &RunError) -> String {
    let mut s = format!(
        "{{\"error\":{{\"kind\":\"{}\",\"message\":{}",
        e.kind(),
        json_string(&e.to_string())
    );
    if let Some(b) = e.buffer() {
        let _ = write!(s, ",\"buffer\":{}", json_string(b));
    }
    s.push_str("}}");
    s
}

/// Runs the command; returns the documented exit status.
pub fn run(args: &Args) -> ExitCode {
    let code = match run_inner(args) {
        Ok(o) => {
            if !o.unused.is_empty() {
                errln!(
                    "warning: {} weights tensor(s) not used by any buffer: {}",
                    o.unused.len(),
                    o.unused.join(", ")
                );
            }
            let text = if args.json {
                outputs_json(&o.outputs, o.backend)
            } else {
                outputs_text(&o)
            };
            outln!("{}", text.trim_end());
            0
        }
        Err(e) => {
            if let RunError::Rejected { path, result } = &e {
                // The report is the useful part; it goes where `amk validate` puts it.
                if !args.json {
                    outln!("{e}");
                }
                errln!(
                    "error: {}: rejected by the validator ({} error(s))",
                    path.display(),
                    result.errors.len()
                );
            } else {
                errln!("error: {e}");
            }
            if args.json {
                outln!("{}", error_json(&e));
            }
            e.exit_code()
        }
    };
    ExitCode::from(code)
}
