//! `amk ops list [--json]`: what the registry holds. `amk ops compile --arch sm_XY`: its
//! megakernel compiled ahead of time into the cubin cache.

use amk_core::{Origin, Registry};
use serde_json::{Value, json};
use std::process::ExitCode;

/// Subcommands of `amk ops`.
#[derive(clap::Subcommand)]
pub enum OpsCommand {
    /// One row per registered opcode: code, name, arity, required params, implementations,
    /// origin.
    List {
        /// Machine-readable output (a JSON array).
        #[arg(long)]
        json: bool,
    },
    /// Compile the megakernel of every registered op (plugins included) for GPU
    /// architectures into the cubin cache, with no GPU: a later run on such a GPU loads it
    /// instead of compiling (minutes for the full megakernel). Needs NVRTC (libnvrtc.so).
    Compile {
        /// Target architecture, as the backend names it (`sm_90a` on Hopper, `sm_80`,
        /// `sm_89`, `sm_120`, ...); repeatable.
        #[arg(long = "arch", value_name = "sm_XY", required = true, value_parser = parse_arch)]
        archs: Vec<String>,
        /// Cache directory (default: `$AMK_CUDA_CACHE`, else `$XDG_CACHE_HOME/amk/cubin`,
        /// else `~/.cache/amk/cubin`).
        #[arg(long, value_name = "DIR")]
        cache_dir: Option<std::path::PathBuf>,
        /// Machine-readable output (one JSON object per architecture, in an array).
        #[arg(long)]
        json: bool,
    },
}

/// `sm_` then digits, optionally `a` (architecture-specific features).
fn parse_arch(s: &str) -> Result<String, String> {
    let digits = s
        .strip_prefix("sm_")
        .map(|r| r.strip_suffix('a').unwrap_or(r));
    match digits {
        Some(d) if !d.is_empty() && d.len() <= 3 && d.bytes().all(|b| b.is_ascii_digit()) => {
            Ok(s.to_string())
        }
        _ => Err(format!(
            "'{s}' is not an architecture name like sm_80 or sm_90a"
        )),
    }
}

/// Compiles for each architecture in turn; stops at the first failure (exit 1). With `json`,
/// the architectures compiled so far are printed either way.
fn compile(
    reg: &Registry,
    archs: &[String],
    dir: Option<&std::path::Path>,
    json: bool,
) -> ExitCode {
    let mut out = Vec::new();
    let mut status = ExitCode::SUCCESS;
    for arch in archs {
        if !json {
            eprintln!(
                "amk: compiling the megakernel for {arch} (NVRTC; minutes for a cold cache) ..."
            );
        }
        let t0 = std::time::Instant::now();
        let (path, bytes, cached) = match amk_backend_cuda::precompile(reg, arch, dir) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("amk: {arch}: {e}");
                status = ExitCode::from(1);
                break;
            }
        };
        let secs = t0.elapsed().as_secs_f64();
        if json {
            out.push(json!({"arch": arch, "path": path, "bytes": bytes,
                            "cached": cached, "seconds": secs}));
        } else {
            let how = if cached { "already cached" } else { "compiled" };
            println!(
                "{arch}: {how}, {bytes} bytes, {secs:.1} s: {}",
                path.display()
            );
        }
    }
    if json {
        let doc = serde_json::to_string_pretty(&Value::Array(out)).unwrap_or_default();
        println!("{doc}");
    }
    status
}

fn origin_text(o: &Origin) -> String {
    match o {
        Origin::Builtin => "built-in".to_string(),
        Origin::Plugin(p) => format!("plugin {}", p.display()),
    }
}

/// `"built-in"` or `"plugin"` (JSON; the library path is in `"plugin"`).
fn origin_kind(o: &Origin) -> &'static str {
    match o {
        Origin::Builtin => "built-in",
        Origin::Plugin(_) => "plugin",
    }
}

fn plugin_path(o: &Origin) -> Value {
    match o {
        Origin::Builtin => Value::Null,
        Origin::Plugin(p) => Value::String(p.display().to_string()),
    }
}

fn rows(reg: &Registry) -> Vec<Value> {
    reg.iter()
        .map(|(spec, origin)| {
            let params: Vec<Value> = spec
                .required_params()
                .map(|p| json!({"name": p.name, "type": p.ty.name()}))
                .collect();
            json!({
                "code": spec.code.0,
                "name": spec.name,
                "inputs": {"min": spec.min_inputs, "max": spec.max_inputs},
                "outputs": spec.n_outputs,
                "required_params": params,
                "cpu": reg.reference(spec.code).is_some(),
                "cuda": reg.cuda(spec.code).is_some(),
                "origin": origin_kind(origin),
                "plugin": plugin_path(origin),
            })
        })
        .collect()
}

/// Runs `amk ops ...`.
pub fn run(cmd: &OpsCommand) -> ExitCode {
    let reg = match crate::registry::registry() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("amk: {e}");
            return ExitCode::from(2);
        }
    };
    match cmd {
        OpsCommand::Compile {
            archs,
            cache_dir,
            json,
        } => compile(&reg, archs, cache_dir.as_deref(), *json),
        OpsCommand::List { json } => {
            if *json {
                let doc = Value::Array(rows(&reg));
                println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
            } else {
                println!(
                    "{:>4}  {:<18} {:<6} {:<4} {:<4} {:<4} {:<9} required params",
                    "code", "name", "inputs", "outs", "cpu", "cuda", "origin"
                );
                for (spec, origin) in reg.iter() {
                    let params: Vec<String> = spec
                        .required_params()
                        .map(|p| format!("{}:{}", p.name, p.ty.name()))
                        .collect();
                    let yes = |b: bool| if b { "yes" } else { "no" };
                    println!(
                        "{:>4}  {:<18} {:<6} {:<4} {:<4} {:<4} {:<9} {}",
                        spec.code.0,
                        spec.name,
                        spec.arity_text(),
                        spec.n_outputs.map_or("var".to_string(), |n| n.to_string()),
                        yes(reg.reference(spec.code).is_some()),
                        yes(reg.cuda(spec.code).is_some()),
                        origin_text(origin),
                        params.join(" ")
                    );
                }
            }
            ExitCode::SUCCESS
        }
    }
}
