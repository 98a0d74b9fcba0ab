//! `amk ops list [--json]`: what the registry holds.

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
