//! The `amk` command line. Library crates do the work; this binary parses arguments, prints,
//! and maps outcomes to exit codes.

mod backend_choice;
mod bench_cmd;
mod e2e_bench;
mod model_cmd;
mod ops_cmd;
mod output;
mod prefill_bench;
mod registry;
mod run_cmd;
mod serve_cmd;
mod status;
mod validate_cmd;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// The build features, as `amk --version` lists them.
#[cfg(feature = "cuda")]
macro_rules! features {
    () => {
        "cuda"
    };
}
/// The build features, as `amk --version` lists them.
#[cfg(not(feature = "cuda"))]
macro_rules! features {
    () => {
        "none (CPU VM only; --features cuda adds the GPU backend)"
    };
}

/// `amk --version`: the version, the commit it was built from and the features compiled in
/// (the CUDA backend is a build feature, so a bug report needs to say which build).
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("AMK_COMMIT"),
    ", features: ",
    features!(),
    ")"
);

/// amk: compile Llama-family models into one statically checked CUDA megakernel.
#[derive(Parser)]
#[command(name = "amk", version = VERSION, about, long_about = None)]
struct Cli {
    /// Load an op plugin (a shared library) before running the command; repeatable. Plugins
    /// listed in the `AMK_PLUGINS` environment variable (`:`-separated) are loaded first.
    #[arg(long = "plugin", value_name = "PATH", global = true)]
    plugins: Vec<std::path::PathBuf>,
    /// Log what the command does on stderr: -v at info level (import, lowering, loading), -vv
    /// at debug. `RUST_LOG` (e.g. `RUST_LOG=amk=debug`) overrides it.
    #[arg(short = 'v', long = "verbose", action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    /// Only results: no backend line, progress, download progress or summary on stderr, and
    /// logs at error level (errors and warnings still go to stderr).
    #[arg(short = 'q', long, global = true, conflicts_with = "verbose")]
    quiet: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Statically check megakernel schedules (JSON or JSON.gz) for deadlocks, races and
    /// malformed tasks.
    #[command(after_help = validate_cmd::AFTER_HELP)]
    Validate(validate_cmd::Args),
    /// Inspect the registered opcodes.
    #[command(subcommand)]
    Ops(ops_cmd::OpsCommand),
    /// Run a program's forward passes on a backend with its weights and inputs, and print
    /// its outputs.
    #[command(after_help = run_cmd::AFTER_HELP)]
    Run(run_cmd::Args),
    /// Import a model and lower it to a validated decode program (JSON).
    #[command(after_help = model_cmd::LOWER_AFTER_HELP)]
    Lower(model_cmd::LowerArgs),
    /// Generate text from a model, streaming it token by token (greedy, or sampled with --temperature).
    // Negative numbers are values (`--temperature -1` reaches its range check), not flags.
    #[command(after_help = model_cmd::AFTER_HELP, allow_negative_numbers = true)]
    Generate(model_cmd::GenerateArgs),
    /// Teacher-forced perplexity of a model on a text file.
    #[command(after_help = model_cmd::AFTER_HELP, allow_negative_numbers = true)]
    Perplexity(model_cmd::PerplexityArgs),
    /// Serve the model over HTTP with OpenAI's API (chat and text completions, streaming,
    /// /v1/models, /health, /metrics).
    #[command(after_help = serve_cmd::AFTER_HELP)]
    Serve(serve_cmd::ServeArgs),
    /// Time one decode step on the GPU (median/p10/p90 over many launches) against the
    /// bandwidth floor, after a correctness gate against an f32 reference.
    #[command(after_help = bench_cmd::AFTER_HELP, allow_negative_numbers = true)]
    Bench(bench_cmd::BenchArgs),
    /// Print a shell completion script (e.g. `amk completions bash > ~/.local/share/bash-completion/completions/amk`).
    Completions {
        /// The shell: bash, zsh, fish, elvish or powershell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

/// `error` prefixed with `path`, unless its message names the path already (an I/O error
/// does): every error names its file once.
pub(crate) fn with_path(path: &std::path::Path, error: &dyn std::fmt::Display) -> String {
    let (p, e) = (path.display().to_string(), error.to_string());
    if e.contains(&p) {
        e
    } else {
        format!("{p}: {e}")
    }
}

/// Logs to stderr at the level `-v` asks for (warnings only without it, errors only with
/// `-q`), unless `RUST_LOG` says otherwise.
fn init_logging(verbose: u8, quiet: bool) {
    use tracing_subscriber::EnvFilter;
    let level = match (quiet, verbose) {
        (true, _) => "error",
        (false, 0) => "warn",
        (false, 1) => "info",
        (false, _) => "debug",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        .try_init();
}

fn main() -> ExitCode {
    output::finish(run())
}

/// Parses the command line (help and usage errors through [`output`] too) and runs the
/// command.
fn run() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let text = e.render().to_string();
            if e.use_stderr() {
                output::errln!("{}", text.trim_end());
            } else {
                output::outln!("{}", text.trim_end());
            }
            return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    init_logging(cli.verbose, cli.quiet);
    status::set_quiet(cli.quiet);
    registry::set_plugins(&cli.plugins);
    match cli.command {
        Command::Validate(args) => validate_cmd::run(&args),
        Command::Ops(cmd) => ops_cmd::run(&cmd),
        Command::Run(args) => run_cmd::run(&args),
        Command::Lower(args) => model_cmd::run_lower(&args),
        Command::Generate(args) => model_cmd::run_generate(&args),
        Command::Perplexity(args) => model_cmd::run_perplexity(&args),
        Command::Serve(args) => serve_cmd::run(&args),
        Command::Bench(args) => bench_cmd::run(&args),
        Command::Completions { shell } => {
            use clap::CommandFactory;
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "amk", &mut script);
            output::write_out_bytes(&script);
            ExitCode::SUCCESS
        }
    }
}
