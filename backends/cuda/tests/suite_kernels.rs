//! Compiles the kernels the GPU tests will load, on every core, into the cubin cache
//! (`AMK_CUDA_CACHE`): each conformance case's program under each configuration the suite runs
//! with (`test_support::conformance_configs`). A program's kernel holds only its ops and the
//! code its dtypes and rows need, so the suite needs a few hundred small kernels; the tests run
//! one at a time (`-j 1`, cooperative launches) and would otherwise compile them one after
//! another. Ignored by default: `scripts/gpu-check.sh run` runs it first. Needs NVRTC and the
//! GPU's architecture; says SKIPPED without a GPU (and fails under `AMK_REQUIRE_GPU=1`).
//! `AMK_SUITE_CONFIGS` (comma-separated configuration names, e.g. `conformance`) compiles only
//! those configurations' kernels; `AMK_SUITE_ARCH` (e.g. `sm_90a`) compiles for that
//! architecture without a GPU, into the cache the GPU machine will be given. `AMK_SUITE_OPS`
//! (comma-separated opcodes, e.g. `LINEAR_TILE`) compiles only the kernels of programs with a
//! task of one of them, for a run of only those ops' tests.
#![allow(clippy::unwrap_used)]

use amk_backend_cuda::test_support::{conformance_configs, gpu_or_skip};
use amk_core::{Backend, BackendError, Program, Registry, Session, ValidatedProgram, WeightStore};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The CPU VM, keeping every program it loads: the conformance cases' programs, as each case
/// builds them.
struct Recorder(amk_backend_cpu::CpuBackend, Mutex<Vec<Program>>);

impl Backend for Recorder {
    fn name(&self) -> &'static str {
        "recorder"
    }
    fn load(
        &self,
        p: &ValidatedProgram,
        w: &WeightStore,
        r: &Registry,
    ) -> Result<Box<dyn Session>, BackendError> {
        self.1.lock().unwrap().push(p.program().clone());
        self.0.load(p, w, r)
    }
}

#[test]
#[ignore = "a compile pass before the GPU tests: scripts/gpu-check.sh run starts with it"]
fn suite_kernels_compile() {
    // The kernels are keyed by the architecture: the live device's, or `AMK_SUITE_ARCH`'s
    // (e.g. `sm_90a`) to compile them ahead on a machine without the GPU.
    let arch = match std::env::var("AMK_SUITE_ARCH") {
        Ok(arch) => arch,
        Err(_) => match gpu_or_skip("suite_kernels_compile") {
            Some(gpu) => gpu.info().arch.clone(),
            None => return,
        },
    };
    let rec = Recorder(
        amk_backend_cpu::CpuBackend::default(),
        Mutex::new(Vec::new()),
    );
    let mut report = amk_conformance::conformance::Report::default();
    amk_conformance::conformance::run_all(&rec, &mut report);
    let programs = rec.1.into_inner().unwrap();
    assert!(
        !programs.is_empty(),
        "the conformance suite loaded no program"
    );
    let reg = amk_ops::registry().unwrap();
    // One job per distinct kernel (programs and configurations often share one).
    let mut jobs: Vec<(amk_backend_cuda::CudaOptions, &Program)> = Vec::new();
    let mut seen: Vec<String> = Vec::new();
    // `AMK_SUITE_CONFIGS=conformance,conformance_paired`: only those configurations' kernels
    // (a run of those test sets needs no others); unset: every configuration.
    let only = std::env::var("AMK_SUITE_CONFIGS").ok();
    let wanted = |name: &str| {
        only.as_deref()
            .is_none_or(|l| l.split(',').any(|n| n.trim() == name))
    };
    let configs: Vec<_> = conformance_configs()
        .into_iter()
        .filter(|(name, _)| wanted(name))
        .collect();
    assert!(
        !configs.is_empty(),
        "AMK_SUITE_CONFIGS names none of the suite's configurations"
    );
    // `AMK_SUITE_OPS=LINEAR_TILE,ATTENTION_CAUSAL`: only programs with a task of one of them.
    let ops: Option<Vec<String>> = std::env::var("AMK_SUITE_OPS")
        .ok()
        .map(|l| l.split(',').map(|o| o.trim().to_string()).collect());
    let selected: Vec<&Program> = programs
        .iter()
        .filter(|p| {
            ops.as_ref()
                .is_none_or(|l| p.tasks.iter().any(|t| l.contains(&t.op.to_string())))
        })
        .collect();
    assert!(
        !selected.is_empty(),
        "AMK_SUITE_OPS names no opcode of any suite program"
    );
    for (_, options) in configs {
        for &p in &selected {
            let knobs = options.knobs(Some(p), &reg);
            let source = amk_backend_cuda::assemble::megakernel_source(&reg, knobs)
                .unwrap()
                .source;
            if !seen.contains(&source) {
                seen.push(source);
                jobs.push((options.clone(), p));
            }
        }
    }
    let width = std::thread::available_parallelism().map_or(1, |n| n.get());
    eprintln!(
        "{} distinct kernels for {arch}, {width} at a time",
        jobs.len()
    );
    let next = AtomicUsize::new(0);
    let failures: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let t0 = std::time::Instant::now();
    std::thread::scope(|s| {
        for _ in 0..width.min(jobs.len()) {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some((options, p)) = jobs.get(i) else {
                        break;
                    };
                    eprintln!("kernel {i}: {}", describe(p));
                    let t = std::time::Instant::now();
                    match amk_backend_cuda::precompile(options, &reg, &arch, None, Some(p), false) {
                        // Each kernel's time, so a slow one can be found (--no-capture).
                        Ok((_, bytes, cached)) => eprintln!(
                            "kernel {i}: {bytes} bytes, {:.1} s{}",
                            t.elapsed().as_secs_f64(),
                            if cached { " (cached)" } else { "" }
                        ),
                        Err(e) => failures.lock().unwrap().push(e.to_string()),
                    }
                }
            });
        }
    });
    eprintln!("compiled in {:.0} s", t0.elapsed().as_secs_f64());
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} of {} kernels failed; the first: {}",
        failures.len(),
        jobs.len(),
        failures[0]
    );
}

/// A program in a line, to name a kernel in the log: its tasks, ops and dtypes.
fn describe(p: &Program) -> String {
    let mut ops: Vec<String> = p.tasks.iter().map(|t| t.op.to_string()).collect();
    ops.sort();
    ops.dedup();
    let mut dtypes: Vec<&str> = p.buffers.iter().map(|b| b.dtype.name()).collect();
    dtypes.sort_unstable();
    dtypes.dedup();
    format!(
        "{} tasks, ops {}, dtypes {}",
        p.tasks.len(),
        ops.join(" "),
        dtypes.join(" ")
    )
}
