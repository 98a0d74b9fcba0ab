//! The CUDA backend: every registered op's device function (built-in and plugin) plus a
//! generated dispatcher and a persistent scheduler loop, compiled by NVRTC into one megakernel
//! for the live device; one cooperative launch runs a whole forward pass.
//!
//! Without the `cuda` feature the crate still builds: the host-side layout ([`tables`],
//! [`queues`]), the source assembly ([`assemble`]) and the ABI mirrors ([`abi`]) are plain
//! Rust, tested everywhere; [`CudaBackend::new`] then answers [`CudaError::NotCompiled`].
//! With it, the driver and NVRTC are loaded at run time (nothing CUDA is needed to build), and
//! every entry point checks they are present before the first call.

pub mod abi;
pub mod assemble;
mod env;
mod error;
pub mod loops;
pub mod queues;
pub mod tables;

#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
pub use device::{CudaBackend, CudaSession, compile_for_arch, driver_present, nvrtc, precompile};
#[cfg(not(feature = "cuda"))]
mod stub;
#[cfg(not(feature = "cuda"))]
pub use stub::{CudaBackend, CudaSession, precompile};

#[cfg(feature = "testing")]
pub mod testing;

pub use env::{ENV_KNOBS, EnvKnob};
pub use error::CudaError;
pub use loops::FusedLoops;

/// When one task ran (the device's `%globaltimer`, nanoseconds): the backend-neutral record.
pub use amk_core::TaskTrace;

const _: () = assert!(abi::TRACE_PROBES == amk_core::backend::TRACE_PROBES);

use amk_core::ir::{DType, Program};
use amk_core::{Opcode, Registry};
use std::path::PathBuf;
use std::time::Duration;

/// Default watchdog limit for one forward pass.
pub const DEFAULT_WATCHDOG: Duration = Duration::from_secs(10);

/// How to open the device.
#[derive(Debug, Clone)]
pub struct CudaOptions {
    /// Device ordinal.
    pub device: usize,
    /// A forward pass running longer than this is aborted with [`CudaError::Timeout`].
    pub watchdog: Duration,
    /// Where compiled cubins are cached (`None`: `$AMK_CUDA_CACHE`, else
    /// `$XDG_CACHE_HOME/amk/cubin`, else `~/.cache/amk/cubin`).
    pub cache_dir: Option<PathBuf>,
    /// Threads per block.
    pub threads: u32,
    /// Dynamic shared memory every launch reserves at least (a measuring knob: it shows what
    /// a carve-out of the L1 cache costs the kernel). `AMK_CUDA_SMEM_KB` sets it; default 0.
    pub min_smem_bytes: usize,
    /// Streamed weights are evicted first from L2, so that they do not push out the small
    /// lines every task reads (instructions, descriptors, counters, activations, KV caches).
    /// `AMK_CUDA_L2_EVICT_FIRST=0` turns it off.
    pub l2_evict_first: bool,
    /// Compile-time knobs of the device code, `#define`d before it (a measuring knob: one
    /// binary compares kernel variants, each its own cubin). `AMK_CUDA_DEFINES="NAME=VALUE
    /// NAME"` sets it (a bare NAME is defined as 1); a malformed entry fails the kernel's
    /// assembly with a message.
    pub defines: Vec<(String, String)>,
    /// Compile only the ops a program's tasks use into its kernel (every op when it has a
    /// FUSED task, whose steps may be any op): 0.014-0.030 ms a token faster on the H100 than
    /// the kernel of every registered op, and minutes less to compile (docs/perf-notes.md
    /// round 17). On by default; `AMK_CUDA_PROGRAM_OPS=0` turns it off.
    pub program_ops: bool,
}

impl CudaOptions {
    /// The knobs of the megakernel these options run `program` on: its fused loops
    /// ([`FusedLoops::of_program`]), the quantised loops only if it holds a quantised buffer,
    /// no trace points (a traced session sets `trace`), the fused loop's pass sized to its
    /// rows ([`loops::fused_vecs`]) and without bounds tests where its rows allow
    /// ([`loops::fused_exact`]), every unit of its warps loaded before the wait where its rows
    /// are one pass ([`loops::row_pre`]), two units a warp at once where its rows are long
    /// ([`loops::pairs`]), only the float dtypes its buffers hold, the defines
    /// its tasks ask of their ops' code ([`task_defines`]), and, with
    /// [`CudaOptions::program_ops`], only the ops its tasks and their steps use
    /// ([`kernel_ops`]). `None`: the kernel of every op and every loop.
    pub fn knobs(&self, program: Option<&Program>, registry: &Registry) -> assemble::Knobs {
        let mut knobs = assemble::Knobs {
            threads: self.threads,
            defines: self.defines.clone(),
            fused_loops: FusedLoops::ALL,
            ops: None,
            quant: true,
            trace: false,
            fused_vecs: loops::DEFAULT_VECS,
            fused_exact: false,
            row_pre: false,
            pairs: false,
            floats: assemble::FloatDtypes::ALL,
            task_defines: Vec::new(),
        };
        if let Some(p) = program {
            knobs.fused_loops = FusedLoops::of_program(p, registry);
            knobs.fused_vecs = loops::fused_vecs(p, registry);
            // Whole passes of the pass the kernel will have: a user's define wins over ours.
            let vecs = match self.defines.iter().find(|(n, _)| n == loops::VECS_DEFINE) {
                Some((_, v)) => v.parse::<u32>().ok(),
                None => Some(knobs.fused_vecs),
            };
            knobs.fused_exact = vecs.is_some_and(|v| loops::fused_exact(p, registry, v));
            knobs.row_pre = vecs.is_some_and(|v| loops::row_pre(p, registry, v));
            knobs.pairs = loops::pairs(p, registry);
            knobs.floats = assemble::FloatDtypes::of_program(p, registry);
            knobs.quant = p
                .buffers
                .iter()
                .any(|b| matches!(b.dtype, DType::I8 | DType::U8 | DType::I4));
            if self.program_ops {
                knobs.ops = kernel_ops(p, registry);
            }
            knobs.task_defines = task_defines(p, registry);
        }
        knobs
    }
}

/// The defines `program`'s tasks ask of its kernel through their ops
/// (`CudaSource::task_defines`), sorted, one a name (the first value by that order, should two
/// tasks ask different values of one name).
pub fn task_defines(program: &Program, registry: &Registry) -> Vec<(String, String)> {
    let mut d: Vec<(String, String)> = (program.tasks.iter())
        .filter_map(|t| Some((registry.cuda(t.op)?.task_defines?.0)(t)))
        .flatten()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    d.sort();
    d.dedup_by(|b, a| a.0 == b.0);
    d
}

/// The ops `program`'s kernel needs: its tasks' and, for a task of an op that expands into
/// steps (FUSED), its steps' (the registry's expansion, as the tables lay them out). `None`
/// (every op) when a task's steps cannot be worked out: the load then refuses the program with
/// the expansion's own message. Why: a kernel of every op is twice every op's code (the
/// steps' dispatcher holds them all again), minutes of NVRTC where a program's own ops take
/// seconds.
pub fn kernel_ops(program: &Program, registry: &Registry) -> Option<Vec<Opcode>> {
    let mut ops = Vec::new();
    for t in &program.tasks {
        ops.push(t.op);
        if let Some(expand) = registry.expansion(t.op) {
            ops.extend(expand(t, registry).ok()?.iter().map(|s| s.op));
        }
    }
    ops.sort();
    ops.dedup();
    Some(ops)
}

/// `NAME=VALUE NAME ...` as (name, value) pairs; a bare NAME has the value 1.
pub fn parse_defines(text: &str) -> Vec<(String, String)> {
    text.split_whitespace()
        .map(|d| match d.split_once('=') {
            Some((n, v)) => (n.to_string(), v.to_string()),
            None => (d.to_string(), "1".to_string()),
        })
        .collect()
}

/// The defaults; no environment variable is read ([`CudaOptions::from_env`] applies them).
impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            device: 0,
            watchdog: DEFAULT_WATCHDOG,
            cache_dir: None,
            threads: assemble::DEFAULT_THREADS,
            min_smem_bytes: 0,
            l2_evict_first: true,
            defines: Vec::new(),
            program_ops: true,
        }
    }
}

/// What the device is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Name (e.g. `NVIDIA H100 80GB HBM3`).
    pub name: String,
    /// Compute capability.
    pub compute_capability: (i32, i32),
    /// Streaming multiprocessors.
    pub sms: usize,
    /// The NVRTC target (`sm_90a` on Hopper).
    pub arch: String,
    /// Global memory in bytes.
    pub memory: usize,
}

impl std::fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}, {}, {} SMs, {:.1} GiB",
            self.name,
            self.arch,
            self.sms,
            self.memory as f64 / (1u64 << 30) as f64
        )
    }
}

/// The NVRTC architecture name for a compute capability: `sm_90a` for Hopper (so the
/// architecture-specific instructions are available), `sm_XY` otherwise.
pub fn arch_for(cc: (i32, i32)) -> String {
    match cc {
        (9, 0) => "sm_90a".into(),
        (major, minor) => format!("sm_{major}{minor}"),
    }
}

/// Helpers for GPU tests: open the device or say visibly why the test is skipped.
pub mod test_support {
    use crate::{CudaBackend, CudaError, CudaOptions};

    /// Whether `AMK_REQUIRE_GPU=1`: a missing device then fails the test instead of
    /// skipping it.
    pub fn gpu_required() -> bool {
        std::env::var("AMK_REQUIRE_GPU").is_ok_and(|v| v == "1")
    }

    /// Reports a test that cannot run here: fails under `AMK_REQUIRE_GPU=1`, else prints
    /// `SKIPPED` with the reason on stderr.
    #[allow(clippy::panic)] // a test helper: failing the test is its job
    pub fn skip(test: &str, why: &dyn std::fmt::Display) {
        if gpu_required() {
            panic!("{test}: AMK_REQUIRE_GPU=1 but {why}");
        }
        eprintln!("SKIPPED {test}: {why}");
    }

    /// The default device with the environment's knobs ([`CudaOptions::from_env`]), or
    /// `None` after [`skip`] when there is none (or no driver, or no `cuda` feature, or a
    /// knob's value is refused).
    pub fn gpu_or_skip(test: &str) -> Option<CudaBackend> {
        match CudaOptions::from_env().and_then(CudaBackend::new) {
            Ok(b) => Some(b),
            Err(e) => {
                skip(test, &e);
                None
            }
        }
    }

    /// Like [`gpu_or_skip`] with the given options.
    pub fn gpu_with_options(test: &str, options: CudaOptions) -> Option<CudaBackend> {
        match CudaBackend::new(options) {
            Ok(b) => Some(b),
            Err(e) => {
                skip(test, &e);
                None
            }
        }
    }

    /// Like [`gpu_or_skip`] with a given watchdog.
    pub fn gpu_with_watchdog(test: &str, watchdog: std::time::Duration) -> Option<CudaBackend> {
        let options = CudaOptions::from_env().map(|o| CudaOptions { watchdog, ..o });
        match options.and_then(CudaBackend::new) {
            Ok(b) => Some(b),
            Err(e) => {
                skip(test, &e);
                None
            }
        }
    }

    /// The configurations the GPU tests run the conformance suite under, by test module
    /// name: the defaults, and every fused tile (one-row projections, gate/up, Q/K/V)
    /// streaming two units a warp (or four for short rows) at once. Each is its own set of
    /// kernels, over the environment's knobs ([`CudaOptions::from_env`]; a refused value fails
    /// the test).
    #[allow(clippy::panic)] // a test helper: failing the test is its job
    pub fn conformance_configs() -> [(&'static str, CudaOptions); 2] {
        let base = CudaOptions::from_env().unwrap_or_else(|e| panic!("{e}"));
        [
            ("conformance", base.clone()),
            (
                "conformance_paired",
                CudaOptions {
                    defines: crate::parse_defines(
                        "AMK_FUSED_PAIR=7 AMK_FUSED_PAIR_MIN=0 AMK_FUSED_PAIR_MIN_LONG=0",
                    ),
                    ..base
                },
            ),
        ]
    }

    /// The options of one of [`conformance_configs`] (the defaults for an unknown name).
    pub fn conformance_options(name: &str) -> CudaOptions {
        conformance_configs()
            .into_iter()
            .find(|(n, _)| *n == name)
            .map(|(_, o)| o)
            .unwrap_or_default()
    }

    /// Whether an error means "no GPU here" rather than a failure.
    pub fn is_absent(e: &CudaError) -> bool {
        matches!(
            e,
            CudaError::NotCompiled
                | CudaError::DriverMissing
                | CudaError::NvrtcMissing
                | CudaError::JitLinkMissing
                | CudaError::NoDevice
        )
    }
}
