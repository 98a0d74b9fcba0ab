//! GPU tests (`--features cuda`): they need an NVIDIA device with its driver and NVRTC, skip
//! visibly without them (`SKIPPED …` on stderr) and fail instead under `AMK_REQUIRE_GPU=1`.
//! The model tests read SmolLM2 from `$AMK_TEST_GGUF` (never fetched here: a GPU machine may
//! have no network). `docs/gpu-testing.md` says how to build these on a machine without CUDA
//! and run them on one with it.
#![cfg(feature = "cuda")]
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test file

use amk_backend_cpu::CpuBackend;
use amk_backend_cuda::assemble::Knobs;
#[cfg(feature = "testing")]
use amk_backend_cuda::test_support::gpu_with_watchdog;
use amk_backend_cuda::test_support::{gpu_or_skip, skip};
use amk_backend_cuda::{CudaBackend, CudaError, compile_for_arch, nvrtc};
use amk_core::json::Map;
#[cfg(feature = "testing")]
use amk_core::json::Value;
use amk_core::{
    Backend, BufferKind, DType, Opcode, Program, Registry, Tensor, WeightStore, validate_owned,
};
#[cfg(feature = "testing")]
use std::time::Duration;
use std::time::Instant;

fn registry() -> Registry {
    amk_ops::registry().unwrap()
}

/// The CPU VM on every core (the oracle the device is compared with).
fn cpu_vm() -> CpuBackend {
    CpuBackend::new(amk_backend_cpu::CpuOptions {
        threads: std::thread::available_parallelism().map_or(1, |n| n.get()),
        ..Default::default()
    })
}

/// SmolLM2 from `$AMK_TEST_GGUF`, if set (never fetched: a GPU machine may have no network).
fn smollm2_from_env() -> Option<amk_model_llama::Model> {
    let path = std::env::var_os("AMK_TEST_GGUF")?;
    Some(amk_model_llama::gguf_import::import_gguf(std::path::Path::new(&path)).unwrap())
}

/// The built-in ops plus the example plugin's op, loaded from its shared library (built with
/// the workspace; `$AMK_TEST_PLUGIN` names it where the tests run from an archive), exactly as
/// `amk --plugin` loads it: its CUDA source comes from the library's descriptor.
fn registry_with_plugin() -> Registry {
    use amk_plugin_abi::PluginRegistry;
    let path = std::env::var_os("AMK_TEST_PLUGIN")
        .map(std::path::PathBuf::from)
        .or_else(|| amk_plugin_abi::find_built_cdylib("amk_plugin_example_gelu_tanh"))
        .expect("the example plugin library: build the workspace or set AMK_TEST_PLUGIN");
    let mut reg = registry();
    let loaded = reg.load_plugin(&path).unwrap();
    let cuda = loaded.ops[0]
        .cuda
        .as_ref()
        .expect("the example ships CUDA source");
    assert_eq!(cuda.entry, amk_plugin_example_gelu_tanh::CUDA_ENTRY);
    reg
}

#[test]
fn probe_reports_the_device() {
    let Some(b) = gpu_or_skip("probe_reports_the_device") else {
        return;
    };
    let v = nvrtc::version().unwrap();
    eprintln!("device: {} (NVRTC {}.{})", b.info(), v.0, v.1);
    assert!(b.info().sms > 0);
}

/// The megakernel (every built-in op and the example plugin's op) compiles for every
/// architecture we target. Needs NVRTC only, not a device.
#[test]
fn megakernel_compiles_for_sm80_sm89_sm90_sm120() {
    if !nvrtc::nvrtc_present() {
        skip(
            "megakernel_compiles_for_sm80_sm89_sm90_sm120",
            &CudaError::NvrtcMissing,
        );
        return;
    }
    let reg = registry_with_plugin();
    // One thread per architecture: NVRTC compiles independent programs in parallel.
    let archs = ["sm_80", "sm_89", "sm_90", "sm_90a", "sm_120"];
    let results: Vec<_> = std::thread::scope(|s| {
        let handles: Vec<_> = archs
            .iter()
            .map(|&arch| {
                let reg = &reg;
                s.spawn(move || {
                    let t = Instant::now();
                    (
                        arch,
                        compile_for_arch(reg, arch, Knobs::default()),
                        t.elapsed(),
                    )
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (arch, cubin, took) in results {
        let cubin = cubin.unwrap_or_else(|e| panic!("{arch}: {e}"));
        assert!(cubin.starts_with(b"\x7fELF"), "{arch}: not an ELF cubin");
        eprintln!(
            "{arch}: {} bytes in {:.1} s",
            cubin.len(),
            took.as_secs_f64()
        );
    }
}

/// A source NVRTC refuses: the error carries the compiler's log and the path of the generated
/// source, which is written out in full.
#[test]
fn compile_errors_report_the_log_and_the_dumped_source() {
    if !nvrtc::nvrtc_present() {
        skip(
            "compile_errors_report_the_log_and_the_dumped_source",
            &CudaError::NvrtcMissing,
        );
        return;
    }
    let mut reg = Registry::empty();
    let spec = amk_core::OpSpec {
        code: Opcode(1234),
        name: std::borrow::Cow::Borrowed("test.broken"),
        min_inputs: 1,
        max_inputs: Some(1),
        n_outputs: Some(1),
        params: std::borrow::Cow::Borrowed(&[]),
        write_region: amk_core::WriteRegion::Whole,
        check: None,
        summary: std::borrow::Cow::Borrowed("does not compile"),
    };
    let cuda = amk_core::CudaSource::builtin(
        "__device__ void amk_broken(const amk_task_ctx& ctx) { this_is_not_declared(ctx); }",
        "amk_broken",
    );
    reg.register_full(
        spec,
        amk_core::Origin::Plugin("broken.so".into()),
        None,
        Some(cuda),
    )
    .unwrap();
    match compile_for_arch(&reg, "sm_80", Knobs::default()) {
        Err(CudaError::Compile {
            arch,
            log,
            source_path,
        }) => {
            assert_eq!(arch, "sm_80");
            assert!(log.contains("this_is_not_declared"), "{log}");
            let dumped = std::fs::read_to_string(&source_path).unwrap();
            assert!(dumped.contains("amk_broken") && dumped.contains("amk_megakernel"));
        }
        other => panic!("expected a compile error, got {other:?}"),
    }
}

mod conformance {
    amk_conformance::conformance_tests!(maybe: amk_backend_cuda::test_support::gpu_or_skip(
        "conformance"
    ));
}

/// The whole suite again with every fused tile (one-row projections, gate/up, Q/K/V)
/// streaming two units a warp at once (by default only a program whose rows are all 4 KB or
/// more pairs them, `loops::pairs`, and the suite's tiles are small), so that the paired loop
/// — a partner unit or none, the epilogue of each — stays checked against the CPU VM;
/// one-row projections of rows up to `AMK_FUSED_QUAD_BYTES` take four units a warp (round
/// 16). The two-unit loop on longer rows runs in the SmolLM2 f32 tests (its LM head) and in
/// `paired_units_give_the_same_bits` (the 1B shape).
/// Its own kernels (each case's program's), compiled on first use.
mod conformance_paired {
    use amk_backend_cuda::test_support::{conformance_options, gpu_with_options};
    amk_conformance::conformance_tests!(maybe: gpu_with_options(
        "conformance_paired",
        conformance_options("conformance_paired")
    ));
}

#[cfg(feature = "testing")]
fn params(kv: &[(&str, Value)]) -> Map {
    let mut m = Map::new();
    for (k, v) in kv {
        m.insert(*k, v.clone());
    }
    m
}

/// A two-task COPY chain `x → a → y` (validated), and its input.
fn copy_chain() -> (Program, Tensor) {
    let mut p = Program::new();
    let x = p.new_buffer("x", BufferKind::IO_INPUT, DType::F32, &[37]);
    let a = p.new_buffer("a", BufferKind::ACTIVATION, DType::F32, &[37]);
    let y = p.new_buffer("y", BufferKind::IO_OUTPUT, DType::F32, &[37]);
    let c0 = p.new_counter("a ready");
    let c1 = p.new_counter("y ready");
    p.push_task(Opcode::COPY, &[x], &[a], c0, &[], Map::new(), "copy x");
    p.push_task(
        Opcode::COPY,
        &[a],
        &[y],
        c1,
        &[(c0, 1)],
        Map::new(),
        "copy a",
    );
    let xs: Vec<f32> = (0..37).map(|i| 0.37 * i as f32 - 3.1).collect();
    (p, Tensor::from_f32(DType::F32, &[37], &xs).unwrap())
}

#[cfg(feature = "testing")]
fn run_copy_chain(b: &CudaBackend, reg: &Registry) {
    let (p, x) = copy_chain();
    let v = validate_owned(p, reg).map_err(|r| r.report()).unwrap();
    let mut s = b.load(&v, &WeightStore::new(), reg).unwrap();
    let out = s.step(&[("x", x.clone())]).unwrap();
    assert_eq!(out.get("y").unwrap().to_f32_vec(), x.to_f32_vec());
}

/// A task whose wait can never be met (threshold 2, one producer — the validator would refuse
/// it, so it is loaded through the `testing` entry): the watchdog raises the abort flag, the
/// kernel stops, `Timeout` comes back, and the same backend runs a good program afterwards.
#[cfg(feature = "testing")]
#[test]
fn watchdog_times_out_and_the_device_stays_usable() {
    let limit = Duration::from_millis(1500);
    let Some(b) = gpu_with_watchdog("watchdog_times_out_and_the_device_stays_usable", limit) else {
        return;
    };
    let reg = registry();
    let (mut p, x) = copy_chain();
    p.tasks[1].waits[0].threshold = 2;
    let mut s =
        amk_backend_cuda::testing::load_unvalidated(&b, &p, &WeightStore::new(), &reg).unwrap();
    let t = Instant::now();
    let err = s.run(&[("x", x.clone())]).unwrap_err();
    let took = t.elapsed();
    match err {
        CudaError::Timeout { after, recovered } => {
            assert_eq!(after, limit);
            assert!(recovered, "the kernel ignored the abort flag");
        }
        other => panic!("expected Timeout, got {other}"),
    }
    assert!(
        took >= limit && took < limit + Duration::from_secs(3),
        "took {took:?}"
    );
    // The same session can launch again (and times out again: its program is still stuck)…
    assert!(matches!(
        s.run(&[]),
        Err(CudaError::Timeout {
            recovered: true,
            ..
        })
    ));
    // …and a good program runs on the same device.
    run_copy_chain(&b, &reg);
}

/// The device's own checks run once, when a program is loaded (the megakernel's check mode):
/// a GEMV tile whose rows run past its weight (N_tile 8 of 4 rows; the validator would refuse
/// it, so it is loaded through the `testing` entry) fails the load with the error its step
/// would have raised, naming the task, and the device stays usable.
#[cfg(feature = "testing")]
#[test]
fn device_checks_fail_the_load_and_the_device_stays_usable() {
    let Some(b) = gpu_or_skip("device_checks_fail_the_load_and_the_device_stays_usable") else {
        return;
    };
    let reg = registry();
    let mut p = Program::new();
    let x = p.new_buffer("x", BufferKind::IO_INPUT, DType::F32, &[1, 8]);
    let w = p.new_buffer("w", BufferKind::WEIGHT, DType::F32, &[4, 8]);
    p.buffers[w as usize].source = Some("w".into());
    let y = p.new_buffer("y", BufferKind::IO_OUTPUT, DType::F32, &[1, 4]);
    let c = p.new_counter("y");
    p.push_task(
        Opcode::GEMV_TILE,
        &[x, w],
        &[y],
        c,
        &[],
        params(&[
            ("K", Value::Int(8)),
            ("N_tile", Value::Int(8)),
            ("n_off", Value::Int(0)),
        ]),
        "proj",
    );
    let mut ws = WeightStore::new();
    let wv: Vec<f32> = (0..32).map(|i| i as f32 * 0.25 - 3.0).collect();
    ws.insert("w", Tensor::from_f32(DType::F32, &[4, 8], &wv).unwrap());
    match amk_backend_cuda::testing::load_unvalidated(&b, &p, &ws, &reg) {
        Err(CudaError::Trap {
            task,
            label,
            reason,
            ..
        }) => {
            assert_eq!((task, label.as_str()), (0, "proj"));
            assert!(reason.contains("shapes"), "{reason}");
        }
        Err(e) => panic!("expected a trap at load, got {e}"),
        Ok(_) => panic!("expected a trap at load, the program loaded"),
    }
    run_copy_chain(&b, &reg);
}

/// A device-side error names its task: an EMBED id out of the table, then a corrupted opcode.
#[cfg(feature = "testing")]
#[test]
fn device_errors_name_the_task_and_the_device_stays_usable() {
    let Some(b) = gpu_or_skip("device_errors_name_the_task_and_the_device_stays_usable") else {
        return;
    };
    let reg = registry();
    let mut p = Program::new();
    let ids = p.new_buffer("ids", BufferKind::IO_INPUT, DType::I32, &[2]);
    let table = p.new_buffer("table", BufferKind::WEIGHT, DType::F32, &[5, 8]);
    p.buffers[table as usize].source = Some("table".into());
    let y = p.new_buffer("y", BufferKind::IO_OUTPUT, DType::F32, &[2, 8]);
    let c = p.new_counter("y");
    p.push_task(
        Opcode::EMBED,
        &[ids, table],
        &[y],
        c,
        &[],
        params(&[("hidden", Value::Int(8))]),
        "gather",
    );
    let mut w = WeightStore::new();
    let tv: Vec<f32> = (0..40).map(|i| i as f32 * 0.5 + 0.25).collect();
    w.insert("table", Tensor::from_f32(DType::F32, &[5, 8], &tv).unwrap());
    let v = validate_owned(p.clone(), &reg)
        .map_err(|r| r.report())
        .unwrap();
    let mut s = b.load_session(&v, &w, &reg).unwrap();
    let bad = Tensor::from_i64(DType::I32, &[2], &[1, 7]).unwrap();
    match s.run(&[("ids", bad)]) {
        Err(CudaError::Trap {
            task,
            label,
            detail,
            ..
        }) => {
            assert_eq!((task, label.as_str(), detail), (0, "gather", 7));
        }
        other => panic!("expected a trap, got {other:?}"),
    }
    let good = Tensor::from_i64(DType::I32, &[2], &[4, 0]).unwrap();
    let out = s.run(&[("ids", good)]).unwrap();
    let got = out.get("y").unwrap().to_f32_vec();
    assert_eq!(&got[..8], &tv[32..40]);
    assert_eq!(&got[8..], &tv[..8]);

    let mut s2 = amk_backend_cuda::testing::load_unvalidated(&b, &p, &w, &reg).unwrap();
    amk_backend_cuda::testing::overwrite_opcode(&mut s2, 0, 999).unwrap();
    let good = Tensor::from_i64(DType::I32, &[2], &[4, 0]).unwrap();
    match s2.run(&[("ids", good.clone())]) {
        Err(CudaError::Trap {
            task,
            reason,
            detail,
            ..
        }) => {
            assert_eq!((task, detail), (0, 999));
            assert!(reason.contains("unknown opcode"), "{reason}");
        }
        other => panic!("expected a trap, got {other:?}"),
    }
    // The first session still works after the other one trapped.
    assert_eq!(
        s.run(&[("ids", good)])
            .unwrap()
            .get("y")
            .unwrap()
            .to_f32_vec()[..8],
        tv[32..40]
    );
}

/// The example plugin's op, loaded from its library and compiled into the megakernel from the
/// source its descriptor carries, runs on the device and matches the plugin's own formula.
#[test]
fn plugin_op_runs_on_the_device() {
    let Some(b) = gpu_or_skip("plugin_op_runs_on_the_device") else {
        return;
    };
    let reg = registry_with_plugin();
    let mut p = Program::new();
    let n = 1000u64;
    let x = p.new_buffer("x", BufferKind::IO_INPUT, DType::F32, &[n]);
    let y = p.new_buffer("y", BufferKind::IO_OUTPUT, DType::F32, &[n]);
    let c = p.new_counter("y");
    p.push_task(
        Opcode(amk_plugin_example_gelu_tanh::CODE as u16),
        &[x],
        &[y],
        c,
        &[],
        Map::new(),
        "gelu",
    );
    let v = validate_owned(p, &reg).map_err(|r| r.report()).unwrap();
    let mut s = b.load_session(&v, &WeightStore::new(), &reg).unwrap();
    let xs: Vec<f32> = (0..n)
        .map(|i| (i as f32 - 500.0) * 0.013 + 0.0007)
        .collect();
    let out = s
        .run(&[("x", Tensor::from_f32(DType::F32, &[n], &xs).unwrap())])
        .unwrap();
    let got = out.get("y").unwrap().to_f32_vec();
    let scale = xs.iter().fold(0f32, |m, &x| {
        m.max(amk_plugin_example_gelu_tanh::gelu_tanh(x).abs())
    });
    for (i, (&g, &x)) in got.iter().zip(&xs).enumerate() {
        let w = amk_plugin_example_gelu_tanh::gelu_tanh(x);
        assert!((g - w).abs() <= 1e-5 * scale, "[{i}] x={x}: {g} vs {w}");
    }
}

// ---- SmolLM2 on the device ---------------------------------------------------------------------

/// The SmolLM2-135M shape (no data) lowered under `schedule` in `dtype` at `pos` and
/// validated, with its synthetic weights of `seed`; the program's inputs are the ones
/// [`step_inputs`] gives.
fn smollm2_shape(
    schedule: &amk_core::ScheduleConfig,
    dtype: DType,
    pos: u64,
    seed: u64,
) -> ShapeProgram {
    preset_shape("smollm2-135m", schedule, dtype, pos, seed)
}

/// [`smollm2_shape`] for the preset `shape` (e.g. `llama-3.2-1b`).
fn preset_shape(
    shape: &str,
    schedule: &amk_core::ScheduleConfig,
    dtype: DType,
    pos: u64,
    seed: u64,
) -> ShapeProgram {
    use amk_core::GpuTarget;
    use amk_model_llama::lower::{LowerOptions, lower};
    use amk_model_llama::{Model, presets};
    let cfg = presets::preset(shape).unwrap();
    let synth = presets::synthetic_weights(&cfg, seed);
    let m = Model::shape_only(cfg, format!("{shape} shape"));
    let opts = LowerOptions {
        dtype,
        max_seq: Some(64),
        ..LowerOptions::default()
    };
    let target = GpuTarget::by_name("h100").unwrap();
    // Its weights come from `synth` (the loader refuses a weight it has no init for).
    let lowered = lower(&m, schedule, &target, &opts).unwrap();
    let v = validate_owned(lowered.program, &registry())
        .map_err(|r| r.report())
        .unwrap();
    let io: Vec<&str> = v
        .program()
        .buffers
        .iter()
        .filter(|b| b.kind == BufferKind::IO_INPUT)
        .map(|b| b.name.as_str())
        .collect();
    for (name, _) in step_inputs(0, pos) {
        assert!(io.contains(&name), "no input {name} in {io:?}");
    }
    (v, synth)
}

/// The inputs of one decode step of a lowered Llama program: `token` at `pos`.
fn step_inputs(token: i64, pos: u64) -> [(&'static str, Tensor); 3] {
    let scalar = |x: i64| Tensor::from_i64(DType::I32, &[1], &[x]).unwrap();
    [
        ("token_id", scalar(token)),
        ("pos", scalar(pos as i64)),
        ("reshape_id0", scalar(0)),
    ]
}

/// The SmolLM2-135M shape in f32 with synthetic weights generated on `gpu` gives the CPU VM's
/// logits (within the f32 conformance bound) at two positions, under `schedule`.
fn smollm2_f32_matches_the_cpu_vm(gpu: &CudaBackend, schedule: &amk_core::ScheduleConfig) {
    let reg = registry();
    for pos in [0u64, 5] {
        let (v, synth) = smollm2_shape(schedule, DType::F32, pos, 42);
        let host = synth.materialize(v.program()).unwrap();
        let inputs = step_inputs(777, pos);
        let want = cpu_vm()
            .load(&v, &host, &reg)
            .unwrap()
            .step(&inputs)
            .unwrap()
            .get("logits")
            .unwrap()
            .to_f32_vec();
        let mut s = gpu.load_session_synthetic(&v, &synth, &reg).unwrap();
        s.poison_outputs().unwrap();
        let got = s.run(&inputs).unwrap().get("logits").unwrap().to_f32_vec();
        let scale = want.iter().fold(0f32, |a, &w| a.max(w.abs()));
        let err = got
            .iter()
            .zip(&want)
            .fold(0f32, |a, (&g, &w)| a.max((g - w).abs()));
        assert!(
            err <= 1e-5 * scale,
            "pos {pos}: device {err:e} from the CPU VM (max |logit| {scale})"
        );
        let spread = want.iter().fold(f32::INFINITY, |a, &w| a.min(w));
        assert!(scale > 0.0 && spread < scale, "degenerate logits");
    }
}

/// Weights generated on the device (`load_session_synthetic`) are the host's
/// `SyntheticWeights::materialize` bit for bit: the SmolLM2-135M shape in f32 with synthetic
/// weights gives the CPU VM's logits (within the f32 conformance bound) at two positions.
#[test]
fn synthetic_weights_on_the_device_match_the_host() {
    let Some(gpu) = gpu_or_skip("synthetic_weights_on_the_device_match_the_host") else {
        return;
    };
    smollm2_f32_matches_the_cpu_vm(&gpu, &amk_core::ScheduleConfig::default());
}

/// A fused tile whose (weight, row) pair its kernel leaves out runs the generic loop on the row
/// the tile prepared (normalised in shared memory, or in place): the tuned SmolLM2 shape in
/// f32 on a kernel with only the f16 loop (`AMK_FUSED_LOOPS=8`, a user's define winning over
/// the program's set) still gives the CPU VM's logits.
#[test]
fn fused_tiles_without_their_loop_take_the_generic_path() {
    let Some(gpu) = gpu_with_defines(
        "fused_tiles_without_their_loop_take_the_generic_path",
        "AMK_FUSED_LOOPS=8",
    ) else {
        return;
    };
    smollm2_f32_matches_the_cpu_vm(&gpu, &amk_model_llama::lower::tuned_schedule());
}

/// ATTENTION_MERGE on the device: the tuned SmolLM2 shape in f32 with its split partials
/// merged by merge tasks of 4 query heads (`attention.merge_heads`; splits of 2 rows, so that
/// position 5 has three active splits a KV head) gives the CPU VM's logits.
#[test]
fn merge_tasks_match_the_cpu_vm() {
    let Some(gpu) = gpu_or_skip("merge_tasks_match_the_cpu_vm") else {
        return;
    };
    smollm2_f32_matches_the_cpu_vm(&gpu, &merge_schedule());
}

/// The tuned schedule with merge tasks of 4 query heads over splits of 2 rows (position 5 has
/// three active splits a KV head).
fn merge_schedule() -> amk_core::ScheduleConfig {
    let mut sc = amk_model_llama::lower::tuned_schedule();
    sc.tiling.retain(|(g, _)| g != "attention");
    sc.tiling.push((
        "attention".into(),
        vec![
            ("split_kv".into(), 16),
            ("split_chunk".into(), 2),
            ("merge_heads".into(), 4),
        ],
    ));
    sc
}

/// ATTENTION_MERGE's path without shared memory (each element works out its own weights:
/// `AMK_AM_SHARED=0`, the path a tile of more heads and splits than its shared memory holds
/// takes) gives the CPU VM's logits too.
#[test]
fn merge_tasks_without_shared_weights_match_the_cpu_vm() {
    let Some(gpu) = gpu_with_defines(
        "merge_tasks_without_shared_weights_match_the_cpu_vm",
        "AMK_AM_SHARED=0",
    ) else {
        return;
    };
    smollm2_f32_matches_the_cpu_vm(&gpu, &merge_schedule());
}

/// A decode step gives bit-identical logits however often it runs: the tuned schedule (the
/// fused decode tiles over every SM) on the SmolLM2-135M shape, bf16, synthetic weights, 24
/// launches each at two positions, and its short-context program at three (its attention's
/// short path with one warp a query head at 1 and 6 rows, two at 41). A race between blocks
/// or warps (a barrier two warps pair differently, a read before its counter) shows up as
/// logits that move from launch to launch, which the comparisons with a reference can miss
/// when the error stays within tolerance. A traced step (its own kernel) gives the same bits
/// and times every task.
#[test]
fn tuned_decode_steps_are_bit_identical_across_launches() {
    let tuned = amk_model_llama::lower::tuned_schedule();
    let short = amk_model_llama::lower::short_context_schedule(&tuned).unwrap();
    // Lowered and validated first, so that a machine without a GPU checks this part too.
    let points = [
        ("tuned", &tuned, 0u64),
        ("tuned", &tuned, 5),
        ("short-context", &short, 0),
        ("short-context", &short, 5),
        ("short-context", &short, 40),
    ];
    let programs: Vec<_> = (points.into_iter())
        .map(|(name, schedule, pos)| (name, pos, smollm2_shape(schedule, DType::BF16, pos, 7)))
        .collect();
    let Some(gpu) = gpu_or_skip("tuned_decode_steps_are_bit_identical_across_launches") else {
        return;
    };
    let reg = registry();
    for (name, pos, (v, synth)) in &programs {
        let pos = *pos;
        let mut s = gpu.load_session_synthetic(v, synth, &reg).unwrap();
        let inputs = step_inputs(321, pos);
        let mut first: Option<Vec<u32>> = None;
        for launch in 0..24 {
            s.poison_outputs().unwrap();
            let got: Vec<u32> = s
                .run(&inputs)
                .unwrap()
                .get("logits")
                .unwrap()
                .to_f32_vec()
                .iter()
                .map(|x| x.to_bits())
                .collect();
            assert!(
                got.iter().all(|&b| f32::from_bits(b).is_finite()),
                "{name} pos {pos}, launch {launch}: non-finite logits"
            );
            match &first {
                None => first = Some(got),
                Some(f) => {
                    let diff = f.iter().zip(&got).filter(|(a, b)| a != b).count();
                    assert_eq!(
                        diff, 0,
                        "{name} pos {pos}, launch {launch}: {diff} logits moved"
                    );
                }
            }
        }
        // A traced step runs a kernel of its own (the untraced one has no trace points): the
        // same logits, bit for bit, and a time for every task.
        s.enable_trace(&reg).unwrap();
        s.poison_outputs().unwrap();
        let traced: Vec<u32> = (s.run(&inputs).unwrap().get("logits").unwrap().to_f32_vec())
            .iter()
            .map(|x| x.to_bits())
            .collect();
        assert!(
            Some(&traced) == first.as_ref(),
            "{name} pos {pos}: the traced step's logits moved"
        );
        let tr = s.trace().unwrap();
        assert_eq!(tr.len(), v.program().tasks.len());
        for t in &tr {
            assert!(
                t.reached > 0 && t.ready >= t.reached && t.done >= t.ready,
                "{name} pos {pos}: task {} has no trace: {t:?}",
                t.task
            );
        }
    }
}

/// Two device handles, the default one and one whose kernels are built with `defines`
/// (`AMK_CUDA_DEFINES` syntax), or `None` (the test skipped) without a GPU.
fn gpu_and_variant(
    test: &str,
    defines: &str,
) -> Option<(amk_backend_cuda::CudaBackend, amk_backend_cuda::CudaBackend)> {
    let gpu = gpu_or_skip(test)?;
    let variant = gpu_with_defines(test, defines)?;
    Some((gpu, variant))
}

/// A device handle whose kernels are built with `defines` (`AMK_CUDA_DEFINES` syntax) over the
/// default options, or `None` (the test skipped) without a GPU.
fn gpu_with_defines(test: &str, defines: &str) -> Option<amk_backend_cuda::CudaBackend> {
    amk_backend_cuda::test_support::gpu_with_options(
        test,
        amk_backend_cuda::CudaOptions {
            defines: amk_backend_cuda::parse_defines(defines),
            ..amk_backend_cuda::CudaOptions::default()
        },
    )
}

/// One decode step's logits of the program `v` with the synthetic weights `synth` generated on
/// `g`, its outputs poisoned before the launch.
fn synthetic_logits(
    g: &amk_backend_cuda::CudaBackend,
    v: &amk_core::ValidatedProgram,
    synth: &amk_core::synth::SyntheticWeights,
    reg: &Registry,
    inputs: &[(&'static str, Tensor); 3],
) -> Vec<f32> {
    let mut s = g.load_session_synthetic(v, synth, reg).unwrap();
    s.poison_outputs().unwrap();
    s.run(inputs).unwrap().get("logits").unwrap().to_f32_vec()
}

/// Each program's decode-step logits on the default device and on one whose kernels are built
/// with `defines` ([`logits_with_defines`]) are finite and the same, bit for bit.
fn assert_same_bits(test: &str, defines: &str, programs: &[(u64, ShapeProgram)], token: i64) {
    let Some(runs) = logits_with_defines(test, defines, programs, token) else {
        return;
    };
    for (pos, a, b) in runs {
        assert!(a.iter().all(|x| x.is_finite()), "pos {pos}");
        let diff = a
            .iter()
            .zip(&b)
            .filter(|(x, y)| x.to_bits() != y.to_bits())
            .count();
        assert_eq!(diff, 0, "pos {pos}: {diff} logits differ");
    }
}

/// A lowered, validated program and its synthetic weights ([`smollm2_shape`]).
type ShapeProgram = (
    amk_core::ValidatedProgram,
    amk_core::synth::SyntheticWeights,
);
/// A position's logits on the default device and on a variant.
type PosLogits = (u64, Vec<f32>, Vec<f32>);

/// Each program's decode-step logits (fresh caches, inputs `step_inputs(token, pos)`) on the
/// default device and on one whose kernels are built with `defines`, as (pos, default,
/// variant); None when the test skips (no GPU).
fn logits_with_defines(
    test: &str,
    defines: &str,
    programs: &[(u64, ShapeProgram)],
    token: i64,
) -> Option<Vec<PosLogits>> {
    let (gpu, variant) = gpu_and_variant(test, defines)?;
    let reg = registry();
    Some(
        programs
            .iter()
            .map(|(pos, (v, synth))| {
                let inputs = step_inputs(token, *pos);
                let default = synthetic_logits(&gpu, v, synth, &reg, &inputs);
                (
                    *pos,
                    default,
                    synthetic_logits(&variant, v, synth, &reg, &inputs),
                )
            })
            .collect(),
    )
}

/// The work before the wait changes no bit: the loads of each warp's weight rows (`AMK_ROW_PRE`,
/// on for the bf16 SmolLM2 shape's kernel, whose sums keep the loop's order; rows without a
/// norm then go straight to registers, `AMK_PRE_XREG`), of the norm weight (`AMK_NORM_WPRE`)
/// and the tiny attention's lane plan (`AMK_ATT_TINY_PRE`): the tuned decode step gives the
/// same logits, bit for bit, as the kernel without any of them (`AMK_ROW_PRE=0
/// AMK_NORM_WPRE=0 AMK_ATT_TINY_PRE=0`), at two positions; so does the tuned schedule with the
/// attention fused into the output projection (ATTENTION_GEMV's pre path). The one-row tiles
/// of an even number of rows take two rows a unit there (`AMK_ROW_PAIRS`).
#[test]
fn loads_before_the_wait_give_the_same_bits() {
    let tuned = amk_model_llama::lower::tuned_schedule();
    // The attention fused into the output projection: one attention a layer (on its own SM),
    // not split over the SMs.
    let mut fused = tuned.clone();
    fused.tiling.retain(|(g, _)| g != "attention");
    fused
        .tiling
        .push(("attention".into(), vec![("own_sms".into(), 1)]));
    fused
        .fusion_grouping
        .push(vec!["attention".into(), "gemv".into()]);
    let programs: Vec<_> = [(&tuned, 0u64), (&tuned, 5), (&fused, 0), (&fused, 5)]
        .into_iter()
        .map(|(cfg, pos)| (pos, smollm2_shape(cfg, DType::BF16, pos, 11)))
        .collect();
    assert!(
        programs[2]
            .1
            .0
            .program()
            .tasks
            .iter()
            .any(|t| t.op == amk_core::Opcode::ATTENTION_GEMV),
        "the fused schedule has ATTENTION_GEMV tiles"
    );
    let reg = registry();
    for (_, (v, _)) in &programs {
        let p = v.program();
        assert!(amk_backend_cuda::loops::row_pre(
            p,
            &reg,
            amk_backend_cuda::loops::fused_vecs(p, &reg)
        ));
    }
    // The tiles the paired paths take (their device conditions, amk_pre_row_ok, beside them):
    // one-row tiles of an even number of rows, of 576 (3 vectors a lane: the output
    // projection's tiles, after the merge tasks of the split attention) and
    // 1,536 (6: the down projection's GEMV tiles) elements, and gate/up tiles of a multiple of
    // three pairs, at most 8 units of three.
    let tuned_p = programs[0].1.0.program();
    let int = |t: &amk_core::ir::Task, k: &str| {
        t.params
            .get(k)
            .and_then(|v| v.as_i64())
            .unwrap_or_else(|| panic!("{}: no int param {k}", t.label))
    };
    let paired: Vec<i64> = tuned_p
        .tasks
        .iter()
        .filter(|t| {
            matches!(
                t.op,
                amk_core::Opcode::GEMV_TILE | amk_core::Opcode::COMBINE_GEMV
            ) && t.label.starts_with("L6.")
        })
        .inspect(|t| assert_eq!(int(t, "N_tile") % 2, 0, "{}", t.label))
        .map(|t| int(t, "K"))
        .collect();
    assert!(
        paired.contains(&576) && paired.contains(&1536),
        "{paired:?}"
    );
    let triples = tuned_p
        .tasks
        .iter()
        .filter(|t| t.op == amk_core::Opcode::GATE_UP_SILU)
        .inspect(|t| {
            let n = int(t, "N_tile");
            assert!(n % 3 == 0 && n / 3 <= 8, "{}: {n} pairs", t.label);
        })
        .count();
    assert!(triples > 0);
    assert_same_bits(
        "loads_before_the_wait_give_the_same_bits",
        "AMK_ROW_PRE=0 AMK_NORM_WPRE=0 AMK_ATT_TINY_PRE=0",
        &programs,
        77,
    );
}

/// Two units a warp at once changes no bit: the Llama-3.2-1B shape's kernels, whose rows of
/// 4 KB and more pair every fused tile's units (`loops::pairs`: `AMK_FUSED_PAIR` 7 from two
/// units a warp — the Q/K/V, output projection, gate/up, down and LM-head tiles), give the
/// same logits, bit for bit, as kernels that stream one unit a warp at a time where main did
/// (`AMK_FUSED_PAIR=1 AMK_FUSED_PAIR_MIN=16`), for the short-context program at position 0
/// and the split one at position 5.
#[test]
fn paired_units_give_the_same_bits() {
    let tuned = amk_model_llama::lower::tuned_schedule();
    let short = amk_model_llama::lower::short_context_schedule(&tuned).unwrap();
    let programs: Vec<_> = [(&short, 0u64), (&tuned, 5)]
        .into_iter()
        .map(|(cfg, pos)| (pos, preset_shape("llama-3.2-1b", cfg, DType::BF16, pos, 17)))
        .collect();
    let reg = registry();
    for (_, (v, _)) in &programs {
        assert!(amk_backend_cuda::loops::pairs(v.program(), &reg));
    }
    assert_same_bits(
        "paired_units_give_the_same_bits",
        "AMK_FUSED_PAIR=1 AMK_FUSED_PAIR_MIN=16",
        &programs,
        123,
    );
}

/// RMSNORM in f32 (`AMK_NORM_F32=1`, a knob; f64 by default, as the CPU reference): the
/// SmolLM2-135M shape in bf16, tuned, gives the logits of the default kernel within the bf16
/// gate's bound (2e-2 of the largest |logit|), with the same argmax, at two positions.
#[test]
fn f32_norms_stay_within_the_bf16_bound_of_f64_norms() {
    let tuned = amk_model_llama::lower::tuned_schedule();
    let programs: Vec<_> = [0u64, 5]
        .into_iter()
        .map(|pos| (pos, smollm2_shape(&tuned, DType::BF16, pos, 13)))
        .collect();
    let Some(runs) = logits_with_defines(
        "f32_norms_stay_within_the_bf16_bound_of_f64_norms",
        "AMK_NORM_F32=1",
        &programs,
        91,
    ) else {
        return;
    };
    for (pos, want, got) in runs {
        assert!(got.iter().all(|x| x.is_finite()), "pos {pos}");
        let scale = want.iter().fold(0f32, |a, &w| a.max(w.abs()));
        let err = got
            .iter()
            .zip(&want)
            .fold(0f32, |a, (&g, &w)| a.max((g - w).abs()));
        assert!(
            scale > 0.0 && err <= 2e-2 * scale,
            "pos {pos}: f32 norms {err:e} from f64 norms (max |logit| {scale})"
        );
        assert_eq!(
            amk_engine::argmax(&got),
            amk_engine::argmax(&want),
            "pos {pos}"
        );
        eprintln!(
            "pos {pos}: f32 norms {err:e} from f64 norms (max |logit| {scale}), {} of {} logits differ",
            got.iter()
                .zip(&want)
                .filter(|(a, b)| a.to_bits() != b.to_bits())
                .count(),
            got.len()
        );
    }
}

mod smollm2 {
    use super::*;
    use amk_core::{GpuTarget, ScheduleConfig};
    use amk_engine::{Engine, EngineOptions, Finish, Request, Sampling, argmax, lower_and_load};
    use amk_model_llama::Model;

    /// The committed HF reference (embedded: the test may run where the source tree is not).
    const HF: &str = include_str!("../../../tests/reference/smollm2_hf.json");

    fn model(test: &str) -> Option<Model> {
        let m = smollm2_from_env();
        if m.is_none() {
            skip(test, &"AMK_TEST_GGUF is not set (the SmolLM2 GGUF)");
        }
        m
    }

    fn engine(m: &Model, backend: &dyn Backend, dtype: DType, max_seq: u64) -> Engine {
        engine_with(m, backend, dtype, max_seq, &ScheduleConfig::default())
    }

    fn engine_with(
        m: &Model,
        backend: &dyn Backend,
        dtype: DType,
        max_seq: u64,
        cfg: &ScheduleConfig,
    ) -> Engine {
        let opts = EngineOptions {
            schedule: cfg.clone(),
            target: GpuTarget::by_name("h100").unwrap(),
            dtype,
            max_seq: Some(max_seq),
            stop_slots: 4,
            prefill_rows: None,
            short_context: None,
        };
        lower_and_load(m, &opts, backend, &registry()).unwrap()
    }

    fn request<'a>(prompt: &'a [u32], max_new: usize, stop: &'a [u32]) -> Request<'a> {
        Request::greedy(prompt, max_new, stop)
    }

    /// The generated ids and why generation ended.
    fn ids(e: &mut Engine, req: &Request<'_>) -> (Vec<u32>, Finish) {
        let g = e.generate(req, &mut |_| true).unwrap();
        (g.ids(), g.finish)
    }

    /// `(name, prompt ids, HF's greedy ids, HF's top-2 gaps)` of each reference prompt.
    type Prompt = (String, Vec<u32>, Vec<u32>, Vec<f64>);

    fn prompts() -> Vec<Prompt> {
        let doc: serde_json::Value = serde_json::from_str(HF).unwrap();
        let ids = |v: &serde_json::Value| -> Vec<u32> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        };
        doc["prompts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                (
                    p["name"].as_str().unwrap().to_string(),
                    ids(&p["prompt_ids"]),
                    ids(&p["generated_ids"]),
                    p["top2_gap"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|g| g.as_f64().unwrap())
                        .collect(),
                )
            })
            .collect()
    }

    /// f32 logits on the device within 1e-5 (max error / max |logit|) of the CPU VM at the
    /// first 5 positions of a prompt (teacher-forced, one pass per launch).
    #[test]
    fn smollm2_f32_logits_match_the_cpu_vm() {
        let name = "smollm2_f32_logits_match_the_cpu_vm";
        let Some(gpu) = gpu_or_skip(name) else { return };
        let Some(m) = model(name) else { return };
        let cpu_backend = cpu_vm();
        let mut cpu = engine(&m, &cpu_backend, DType::F32, 64);
        let mut dev = engine(&m, &gpu, DType::F32, 64);
        let (_, prompt, _, _) = prompts().into_iter().next().unwrap();
        let fed = &prompt[..6];
        let (mut want, mut got) = (Vec::new(), Vec::new());
        cpu.forced_logits(fed, &mut |_, l| want.push(l.to_vec()))
            .unwrap();
        dev.forced_logits(fed, &mut |_, l| got.push(l.to_vec()))
            .unwrap();
        assert_eq!(got.len(), 5);
        for (pos, (got, want)) in got.iter().zip(&want).enumerate() {
            let scale = want.iter().fold(0f32, |a, &w| a.max(w.abs()));
            let err = got
                .iter()
                .zip(want)
                .fold(0f32, |a, (&g, &w)| a.max((g - w).abs()));
            eprintln!("pos {pos}: max error {err:e}, relative {:e}", err / scale);
            assert!(
                err <= 1e-5 * scale,
                "pos {pos}: relative error {:e}",
                err / scale
            );
            assert_eq!(argmax(got), argmax(want), "pos {pos}");
        }
    }

    /// f32 greedy continuations on the device equal HF's, token for token, for every prompt,
    /// under the reference and the tuned schedule: each request one launch of many passes,
    /// and, for the tuned schedule, one pass per launch too.
    #[test]
    fn smollm2_f32_greedy_matches_transformers() {
        let name = "smollm2_f32_greedy_matches_transformers";
        let Some(gpu) = gpu_or_skip(name) else { return };
        let Some(m) = model(name) else { return };
        // The reference schedule, and the tuned one (the fused decode opcodes) that `amk
        // generate` runs on the GPU.
        let tuned = amk_model_llama::lower::tuned_schedule();
        for (sname, cfg) in [("reference", ScheduleConfig::default()), ("tuned", tuned)] {
            let mut e = engine_with(&m, &gpu, DType::F32, 128, &cfg);
            for (pname, prompt, want, _) in prompts() {
                let got = ids(&mut e, &request(&prompt, want.len(), &[])).0;
                assert_eq!(got, want, "{sname} schedule, {pname}");
                eprintln!(
                    "{sname} schedule, {pname}: {} tokens identical to HF (one launch)",
                    want.len()
                );
            }
            if sname == "tuned" {
                let (_, prompt, want, _) = prompts().into_iter().next().unwrap();
                let req = Request {
                    passes_per_launch: Some(1),
                    top_logprobs: 0,
                    ..request(&prompt, want.len(), &[])
                };
                assert_eq!(ids(&mut e, &req).0, want, "one pass per launch");
            }
        }
    }

    /// bf16 greedy tokens equal the f32 ones (= HF's, which the CPU VM reproduces exactly) for
    /// 32 tokens on at least 4 of 5 prompts.
    #[test]
    fn smollm2_bf16_greedy_matches_f32_on_most_prompts() {
        let name = "smollm2_bf16_greedy_matches_f32_on_most_prompts";
        let Some(gpu) = gpu_or_skip(name) else { return };
        let Some(m) = model(name) else { return };
        let mut e = engine(&m, &gpu, DType::BF16, 128);
        let mut identical = 0;
        for (pname, prompt, want, gaps) in prompts().into_iter().take(5) {
            let want = &want[..32];
            let got = ids(&mut e, &request(&prompt, 32, &[])).0;
            match got.iter().zip(want).position(|(a, b)| a != b) {
                None => {
                    identical += 1;
                    eprintln!("{pname}: 32 bf16 tokens identical to f32");
                }
                Some(i) => eprintln!(
                    "{pname}: bf16 diverges at token {i} ({} vs {}; HF top-2 gap there {})",
                    got[i], want[i], gaps[i]
                ),
            }
        }
        assert!(identical >= 4, "only {identical} of 5 prompts identical");
    }

    /// The device loop's promises, tuned bf16 (what `amk generate` runs): a stop token mid-launch
    /// ends generation at exactly that token; a cancel mid-launch keeps the tokens so far and
    /// leaves the engine usable; a seed repeats its sampled text; the device's tokens equal the
    /// CPU VM's in f32 (greedy) and its sampled ones with the same seed.
    #[test]
    fn smollm2_device_loop_stops_cancels_and_samples() {
        let name = "smollm2_device_loop_stops_cancels_and_samples";
        let Some(gpu) = gpu_or_skip(name) else { return };
        let Some(m) = model(name) else { return };
        let tuned = amk_model_llama::lower::tuned_schedule();
        let mut e = engine_with(&m, &gpu, DType::BF16, 256, &tuned);
        let (_, prompt, _, _) = prompts().into_iter().next().unwrap();
        let full = ids(&mut e, &request(&prompt, 48, &[])).0;
        let k = (8..full.len())
            .find(|&i| !full[..i].contains(&full[i]))
            .expect("a fresh token");
        let (got, finish) = ids(&mut e, &request(&prompt, 48, &[full[k]]));
        assert_eq!((got.as_slice(), finish), (&full[..=k], Finish::Stop));
        let mut seen = 0;
        let g = e
            .generate(&request(&prompt, 48, &[]), &mut |_| {
                seen += 1;
                seen < 5
            })
            .unwrap();
        assert_eq!(g.finish, Finish::Cancelled);
        let cut = g.ids();
        assert!(
            cut.len() >= 5 && cut.len() < full.len(),
            "{} tokens",
            cut.len()
        );
        assert_eq!(cut, full[..cut.len()], "the tokens before the cancel");
        assert_eq!(
            ids(&mut e, &request(&prompt, 48, &[])).0,
            full,
            "usable after"
        );
        let sampled = |e: &mut Engine, seed: u64| {
            let req = Request {
                sampling: Sampling {
                    temperature: 0.8,
                    top_p: 0.9,
                    top_k: 40,
                    seed,
                },
                ..request(&prompt, 48, &[])
            };
            ids(e, &req).0
        };
        let a = sampled(&mut e, 5);
        assert_eq!(sampled(&mut e, 5), a, "same seed, same tokens");
        assert!(
            (6..10).any(|s| sampled(&mut e, s) != a),
            "other seeds all gave {a:?}"
        );
        // f32: the device and the CPU VM choose the same tokens, greedy and sampled.
        let cpu_backend = cpu_vm();
        let mut dev = engine_with(&m, &gpu, DType::F32, 64, &tuned);
        let mut cpu = engine_with(&m, &cpu_backend, DType::F32, 64, &tuned);
        let short = &prompt[..prompt.len().min(8)];
        for seed in [None, Some(3)] {
            let req = Request {
                sampling: seed.map_or(Sampling::greedy(), |seed| Sampling {
                    temperature: 0.7,
                    top_p: 0.95,
                    top_k: 0,
                    seed,
                }),
                ..request(short, 12, &[])
            };
            let (d, c) = (ids(&mut dev, &req).0, ids(&mut cpu, &req).0);
            eprintln!("seed {seed:?}: device {d:?}, CPU VM {c:?}");
            assert_eq!(d, c, "seed {seed:?}");
        }
    }
}

// ---- performance report (ignored by default: `--run-ignored only -E 'test(perf_report)'`) ----

mod perf {
    use super::*;
    use amk_core::sim::SplitMix;
    use amk_core::{GpuTarget, ScheduleConfig, validate_owned};
    use amk_engine::argmax;
    use amk_model_llama::lower::{LowerOptions, lower};
    use amk_model_llama::model::tensor_names;
    use amk_model_llama::{Model, ModelFormat};

    /// A Llama-3.2-1B-shaped model with random weights (uniform ±0.02, norms 1 ± 0.1: never
    /// zeros), RoPE scaling left out (the shape is what is measured).
    fn llama_1b_random() -> Model {
        let cfg = amk_model_llama::presets::preset("llama-3.2-1b").unwrap();
        let mut w = WeightStore::new();
        let mut rng = SplitMix(0x1b1b_2024);
        for (name, shape) in tensor_names(&cfg) {
            let n: u64 = shape.iter().product();
            let norm = name.ends_with("norm.weight");
            let vals: Vec<f32> = (0..n)
                .map(|_| {
                    let u = (rng.next() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0;
                    if norm { 1.0 + 0.1 * u } else { 0.02 * u }
                })
                .collect();
            w.insert(name, Tensor::from_f32(DType::BF16, &shape, &vals).unwrap());
        }
        Model::new(cfg, w, None, "random llama-3.2-1b shape", ModelFormat::Hf).unwrap()
    }

    fn quantile(sorted: &[f64], q: f64) -> f64 {
        sorted[((sorted.len() - 1) as f64 * q).round() as usize]
    }

    /// Logits of one decode step of `m` lowered in `dtype` at `pos` (fresh caches) on `backend`,
    /// and the validated program with its weights.
    fn step_logits(
        backend: &dyn Backend,
        m: &Model,
        cfg: &ScheduleConfig,
        dtype: DType,
        pos: u64,
    ) -> (Vec<f32>, amk_core::ValidatedProgram, WeightStore) {
        let reg = registry();
        let target = GpuTarget::by_name("h100").unwrap();
        let opts = LowerOptions {
            dtype,
            max_seq: Some(1024),
            ..LowerOptions::default()
        };
        let lowered = lower(m, cfg, &target, &opts).unwrap();
        let v = validate_owned(lowered.program, &reg)
            .map_err(|r| r.report())
            .unwrap();
        let mut s = backend.load(&v, &lowered.weights, &reg).unwrap();
        let logits = s
            .step(&inputs(m, pos))
            .unwrap()
            .get("logits")
            .unwrap()
            .to_f32_vec();
        (logits, v, lowered.weights)
    }

    fn inputs(m: &Model, pos: u64) -> [(&'static str, Tensor); 3] {
        step_inputs((pos as i64 * 7919 + 1234) % m.config.vocab as i64, pos)
    }

    /// max |a − b| / max |b|.
    fn rel(a: &[f32], b: &[f32]) -> f64 {
        let scale = b.iter().fold(0f64, |s, &w| s.max(w.abs() as f64));
        let err = a
            .iter()
            .zip(b)
            .fold(0f64, |s, (&x, &w)| s.max((x - w).abs() as f64));
        err / scale
    }

    /// Times one decode step (the kernel, from device events) of `m` in bf16 at `pos`, after a
    /// correctness gate against an f32 reference on the CPU VM: the device's bf16 logits must
    /// be as close to the f32 ones as bf16 itself allows (at most twice the CPU VM's own bf16
    /// error, or 1e-2 of the largest logit). The caches start empty, so at pos 511 attention
    /// sees 511 zero keys — an ill-conditioned input where bf16 alone moves logits by several
    /// percent; the gate's bound follows the CPU's own bf16 error for that reason.
    fn point(
        gpu: &CudaBackend,
        cpu: &CpuBackend,
        m: &Model,
        cfg: &ScheduleConfig,
        name: &str,
        pos: u64,
        bw: f64,
    ) -> String {
        let (want, _, _) = step_logits(cpu, m, cfg, DType::F32, pos);
        let (cpu16, v, weights) = step_logits(cpu, m, cfg, DType::BF16, pos);
        let reg = registry();
        let mut s = gpu.load_session(&v, &weights, &reg).unwrap();
        let x = inputs(m, pos);
        let got = s.run(&x).unwrap().get("logits").unwrap().to_f32_vec();
        let (e_dev, e_cpu) = (rel(&got, &want), rel(&cpu16, &want));
        assert!(
            e_dev <= (2.0 * e_cpu).max(1e-2),
            "{name} pos {pos}: device bf16 is {e_dev:e} from f32, the CPU VM's bf16 {e_cpu:e}"
        );
        for _ in 0..20 {
            s.run(&x).unwrap();
        }
        let mut ms: Vec<f64> = (0..200)
            .map(|_| {
                s.run(&x).unwrap();
                s.last_kernel_ms().unwrap() as f64
            })
            .collect();
        ms.sort_by(f64::total_cmp);
        s.enable_trace(&reg).unwrap();
        s.run(&x).unwrap();
        eprintln!("{name} pos {pos}:\n{}", s.trace_summary().unwrap());
        let p = v.program();
        let kv_bytes: u64 = p
            .buffers
            .iter()
            .filter(|b| b.kind == BufferKind::KV_CACHE)
            .map(|b| b.nbytes() / b.shape[0].max(1) * (pos + 1))
            .sum();
        let bytes = p.total_weight_bytes() + kv_bytes;
        let floor_ms = bytes as f64 / bw * 1e3;
        let med = quantile(&ms, 0.5);
        format!(
            "| {name} | {pos} | {:.3} | {:.3} | {:.3} | {:.1} | {:.3} | {:.1} % | {} | {:.1e} / {:.1e} | {} |",
            med,
            quantile(&ms, 0.1),
            quantile(&ms, 0.9),
            bytes as f64 / 1e6,
            floor_ms,
            100.0 * floor_ms / med,
            s.grid(),
            e_dev,
            e_cpu,
            if argmax(&got) == argmax(&want) {
                "yes"
            } else {
                "no"
            },
        )
    }

    /// Diagnostic: SmolLM2 and the 1B shape under other schedules (SM assignment, GEMV width,
    /// split-KV), same gate and timing as `perf_report`.
    #[test]
    #[ignore = "diagnostic: run on a GPU with --run-ignored"]
    fn schedule_variants() {
        let Some(gpu) = gpu_or_skip("schedule_variants") else {
            return;
        };
        let bw = gpu.read_bandwidth(2 << 30, 20).unwrap();
        let cpu = cpu_vm();
        let cfg = |j: &str| amk_core::codec::schedule_config_from_json(j).unwrap();
        let variants = [
            ("round_robin", r#"{"sm_assignment": "round_robin"}"#),
            ("N_tile 128", r#"{"tiling": {"gemv": {"N_tile": 128}}}"#),
            (
                "split-KV 8",
                r#"{"tiling": {"attention": {"n_partitions": 8}}}"#,
            ),
        ];
        let mut rows = Vec::new();
        if let Some(m) = smollm2_from_env() {
            for (name, j) in &variants {
                for pos in [0, 511] {
                    rows.push(point(
                        &gpu,
                        &cpu,
                        &m,
                        &cfg(j),
                        &format!("SmolLM2 {name}"),
                        pos,
                        bw,
                    ));
                }
            }
        }
        let m = llama_1b_random();
        for (name, j) in &variants[2..] {
            rows.push(point(
                &gpu,
                &cpu,
                &m,
                &cfg(j),
                &format!("1B {name}"),
                511,
                bw,
            ));
        }
        eprintln!("{}", rows.join("\n"));
    }

    /// Diagnostic: one decode step of SmolLM2 at many positions (fresh caches), device vs CPU VM,
    /// f32 and bf16; prints the relative logit error per position.
    #[test]
    #[ignore = "diagnostic: run on a GPU with --run-ignored"]
    fn kv_length_sweep() {
        let Some(gpu) = gpu_or_skip("kv_length_sweep") else {
            return;
        };
        let Some(m) = smollm2_from_env() else {
            return;
        };
        let reg = registry();
        let target = GpuTarget::by_name("h100").unwrap();
        let cpu_backend = cpu_vm();
        for dtype in [DType::F32, DType::BF16] {
            for pos in [
                0u64, 31, 32, 33, 64, 127, 128, 129, 200, 255, 256, 257, 300, 400, 511,
            ] {
                let opts = LowerOptions {
                    dtype,
                    max_seq: Some(1024),
                    ..LowerOptions::default()
                };
                let lowered = lower(&m, &ScheduleConfig::default(), &target, &opts).unwrap();
                let v = validate_owned(lowered.program, &reg)
                    .map_err(|r| r.report())
                    .unwrap();
                let inputs = step_inputs(1234, pos);
                let mut cpu = cpu_backend.load(&v, &lowered.weights, &reg).unwrap();
                let want = cpu
                    .step(&inputs)
                    .unwrap()
                    .get("logits")
                    .unwrap()
                    .to_f32_vec();
                let mut s = gpu.load_session(&v, &lowered.weights, &reg).unwrap();
                let got = s.run(&inputs).unwrap().get("logits").unwrap().to_f32_vec();
                eprintln!(
                    "{dtype} pos {pos}: relative error {:e}, argmax {} vs {}",
                    rel(&got, &want),
                    argmax(&got),
                    argmax(&want)
                );
            }
        }
    }

    #[test]
    #[ignore = "performance report: run on a GPU with --run-ignored"]
    fn perf_report() {
        let Some(gpu) = gpu_or_skip("perf_report") else {
            return;
        };
        let bw = gpu.read_bandwidth(2 << 30, 20).unwrap();
        let cpu = cpu_vm();
        let (regs, stack) = {
            let reg = registry();
            let (p, _) = copy_chain();
            let v = validate_owned(p, &reg).unwrap();
            let s = gpu.load_session(&v, &WeightStore::new(), &reg).unwrap();
            s.kernel_resources()
        };
        let mut rows = vec![
            format!("device: {}; read bandwidth {:.0} GB/s (2 GiB, median of 20); megakernel {regs} registers/thread, {stack} B stack/thread", gpu.info(), bw / 1e9),
            "| model | pos | median ms | p10 | p90 | MB read | floor ms | % of floor | blocks | bf16 err vs f32: device / CPU VM | argmax = f32 |".into(),
            "|---|---|---|---|---|---|---|---|---|---|---|".into(),
        ];
        if let Some(m) = smollm2_from_env() {
            for pos in [0, 511] {
                rows.push(point(
                    &gpu,
                    &cpu,
                    &m,
                    &ScheduleConfig::default(),
                    "SmolLM2-135M",
                    pos,
                    bw,
                ));
            }
        } else {
            eprintln!("SmolLM2 skipped: AMK_TEST_GGUF is not set");
        }
        let m = llama_1b_random();
        for pos in [0, 511] {
            rows.push(point(
                &gpu,
                &cpu,
                &m,
                &ScheduleConfig::default(),
                "Llama-3.2-1B shape (random)",
                pos,
                bw,
            ));
        }
        eprintln!("{}", rows.join("\n"));
    }
}

/// The committed tiny checkpoints (made by transformers, `tests/reference/tiny_models.py`) on
/// the device: f32 logits at every position of HF's teacher-forced sequence within 1e-5 of
/// HF's (max error / max |logit|) and the same argmax, under the reference and the tuned
/// schedules — Llama (GQA tied, MQA untied), Mistral, Qwen2's q/k/v biases, Qwen3's q/k norm
/// and Llama 3's RoPE scaling (the frequency divisors as ROPE's and the fused Q/K/V tiles'
/// input) — each from its HF directory and from the GGUF llama.cpp's converter wrote from it
/// (`tests/reference/tiny_gguf.py`). Embedded, as the test may run where the source tree is not.
mod tiny_checkpoints {
    use super::*;
    use amk_core::testkit::check_rows;
    use amk_core::{GpuTarget, ScheduleConfig};
    use amk_engine::{EngineOptions, lower_and_load};
    use amk_model_llama::gguf_import::import_gguf_file;

    macro_rules! tiny {
        ($name:literal) => {
            (
                $name,
                include_str!(concat!("../../../tests/reference/", $name, "/config.json")),
                include_bytes!(concat!(
                    "../../../tests/reference/",
                    $name,
                    "/model.safetensors"
                ))
                .as_slice(),
                include_str!(concat!(
                    "../../../tests/reference/",
                    $name,
                    "/hf_logits.json"
                )),
                include_bytes!(concat!("../../../tests/reference/gguf/", $name, ".gguf"))
                    .as_slice(),
            )
        };
    }

    /// Name, `config.json`, `model.safetensors`, `hf_logits.json`, the converter's GGUF.
    type Tiny = (
        &'static str,
        &'static str,
        &'static [u8],
        &'static str,
        &'static [u8],
    );

    const TINY: [Tiny; 6] = [
        tiny!("tiny-gqa"),
        tiny!("tiny-mqa"),
        tiny!("tiny-mistral"),
        tiny!("tiny-qwen2"),
        tiny!("tiny-qwen3"),
        tiny!("tiny-llama3"),
    ];

    /// transformers' rows of logits, as `hf_logits.json` holds them.
    fn hf_rows(rows: &[serde_json::Value]) -> Vec<Vec<f64>> {
        let row = |r: &serde_json::Value| -> Vec<f64> {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        };
        rows.iter().map(row).collect()
    }

    /// The HF checkpoint written to a scratch directory and imported.
    fn import(name: &str, config: &str, weights: &[u8]) -> amk_model_llama::Model {
        let dir = std::env::temp_dir().join(format!("amk-gpu-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.json"), config).unwrap();
        std::fs::write(dir.join("model.safetensors"), weights).unwrap();
        let m = amk_model_llama::hf::import_hf(&dir).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        m
    }

    #[test]
    fn tiny_checkpoints_match_transformers_on_the_device() {
        let Some(gpu) = gpu_or_skip("tiny_checkpoints_match_transformers_on_the_device") else {
            return;
        };
        // The tuned schedule also with the short-context program for positions 0..3 (the
        // attention on one SM), the split program from there.
        let tuned = amk_model_llama::lower::tuned_schedule;
        let schedules = [
            ("reference", ScheduleConfig::default(), None),
            ("tuned", tuned(), None),
            ("tuned + short context", tuned(), Some(3)),
        ];
        let mut report = Vec::new();
        for (name, config, weights, logits, gguf) in TINY {
            let gguf = amk_model_llama::GgufFile::parse(gguf.to_vec()).unwrap();
            let models = [
                ("hf", import(name, config, weights)),
                ("gguf", import_gguf_file(&gguf, name).unwrap()),
            ];
            let doc: serde_json::Value = serde_json::from_str(logits).unwrap();
            let ids_at = |key: &str| -> Vec<u32> {
                (doc[key].as_array().unwrap().iter())
                    .map(|x| x.as_u64().unwrap() as u32)
                    .collect()
            };
            let ids = ids_at("input_ids");
            let want = doc["logits"].as_array().unwrap();
            let greedy = ids_at("greedy_next");
            for ((format, model), (sched, cfg, short)) in models
                .iter()
                .flat_map(|m| schedules.iter().map(move |s| (m, s)))
            {
                let sched = format!("{format} {sched}");
                let opts = EngineOptions {
                    schedule: cfg.clone(),
                    target: GpuTarget::by_name("h100").unwrap(),
                    dtype: DType::F32,
                    max_seq: Some(32),
                    stop_slots: 1,
                    prefill_rows: None,
                    short_context: *short,
                };
                let mut e = lower_and_load(model, &opts, &gpu, &registry()).unwrap();
                assert_eq!(e.short_context(), *short, "{:?}", e.short_refused());
                let mut fed = ids.clone();
                fed.push(0); // forced_logits feeds every id but the last
                let mut got: Vec<Vec<f32>> = Vec::new();
                e.forced_logits(&fed, &mut |_, l| got.push(l.to_vec()))
                    .unwrap();
                let worst = check_rows(&got, &hf_rows(want), Some(&greedy), 1e-5)
                    .unwrap_or_else(|e| panic!("{name} {sched}: {e}"));
                report.push(format!("{name} {sched}: worst {worst:.2e}"));
            }
        }
        println!("{}", report.join("\n"));
    }

    /// The prefill program on the device: each tiny checkpoint (Qwen2's biases included) fed as
    /// two chunks of 8 rows — the second padded — in f32,
    /// every row's logits within 1e-5 of transformers' and the same greedy tokens; in bf16
    /// (LINEAR_TILE on the tensor cores) within 2e-2 of the CPU VM's bf16 prefill. Then an engine with the prefill
    /// program beside its decode loop generates the tokens the decode loop alone generates.
    #[test]
    fn tiny_checkpoints_prefill_on_the_device() {
        use amk_model_llama::lower::prefill::{
            IDS, NLL, POS, PrefillLogits, PrefillOptions, TARGETS, lower_prefill,
        };
        let Some(gpu) = gpu_or_skip("tiny_checkpoints_prefill_on_the_device") else {
            return;
        };
        const ROWS: usize = 8;
        let mut report = Vec::new();
        for (name, config, weights, logits, _) in TINY {
            let model = import(name, config, weights);
            let doc: serde_json::Value = serde_json::from_str(logits).unwrap();
            let ids: Vec<i64> = (doc["input_ids"].as_array().unwrap().iter())
                .map(|x| x.as_i64().unwrap())
                .collect();
            let greedy: Vec<u32> = (doc["greedy_next"].as_array().unwrap().iter())
                .map(|x| x.as_u64().unwrap() as u32)
                .collect();
            let want = doc["logits"].as_array().unwrap();
            // bf16 is judged against the CPU VM's bf16 prefill (the same roundings at every
            // op boundary; only f32 accumulation orders differ): bf16 itself moves a random
            // tiny model's logits by up to 5e-2 of the largest from transformers' f32.
            let mut cpu_bf16: Vec<Vec<f32>> = Vec::new();
            for (dtype, bound) in [(DType::F32, 1e-5), (DType::BF16, 2e-2)] {
                let opts = PrefillOptions {
                    dtype,
                    max_seq: 32,
                    rows: ROWS as u64,
                    logits: PrefillLogits::Every,
                };
                let target = GpuTarget::by_name("h100").unwrap();
                let lowered = lower_prefill(&model, &target, &opts).unwrap();
                let v = amk_core::validate_owned(lowered.program, &registry()).unwrap();
                let mut s = gpu.load_session(&v, &lowered.weights, &registry()).unwrap();
                let mut cpu = amk_core::Backend::load(
                    &amk_backend_cpu::CpuBackend::default(),
                    &v,
                    &lowered.weights,
                    &registry(),
                )
                .unwrap();
                let mut got: Vec<Vec<f32>> = Vec::new();
                for (c, chunk) in ids.chunks(ROWS).enumerate() {
                    let padded = |from: usize| {
                        let mut v: Vec<i64> = ids.iter().skip(from).take(ROWS).copied().collect();
                        v.resize(ROWS, 0);
                        v
                    };
                    let p0 = (c * ROWS) as i64;
                    let pos: Vec<i64> = (p0..p0 + ROWS as i64).collect();
                    let t = |v: &[i64]| {
                        amk_core::Tensor::from_i64(DType::I32, &[ROWS as u64], v).unwrap()
                    };
                    s.poison_outputs().unwrap();
                    let targets = padded(c * ROWS + 1);
                    let inputs = [
                        (IDS, t(&padded(c * ROWS))),
                        (POS, t(&pos)),
                        (TARGETS, t(&targets)),
                    ];
                    let out = s.run(&inputs).unwrap();
                    let l = out.get("logits").unwrap().to_f32_vec();
                    let vocab = l.len() / ROWS;
                    // TOKEN_NLL on the device: each row's NLL of its target is the f64 one of
                    // the device's own logits, to the F32 output's rounding.
                    let nll = out.get(NLL).unwrap();
                    for (r, row) in l.chunks(vocab).enumerate() {
                        let want = amk_engine::nll(row, targets[r] as usize);
                        let got = f64::from(nll.get_f32(r));
                        assert!(
                            (got - want).abs() <= 1e-5 * want.abs().max(1.0),
                            "{name} {dtype} chunk {c} row {r}: NLL {got} vs {want}"
                        );
                    }
                    got.extend(l.chunks(vocab).take(chunk.len()).map(<[f32]>::to_vec));
                    if dtype == DType::BF16 {
                        let c = cpu.step(&inputs).unwrap();
                        let l = c.get("logits").unwrap().to_f32_vec();
                        cpu_bf16.extend(l.chunks(vocab).take(chunk.len()).map(<[f32]>::to_vec));
                    }
                }
                let (reference, tokens) = match dtype {
                    DType::BF16 => {
                        let cpu = cpu_bf16
                            .iter()
                            .map(|r| r.iter().map(|&x| f64::from(x)).collect());
                        (cpu.collect(), None)
                    }
                    _ => (hf_rows(want), Some(&greedy[..])),
                };
                let worst = check_rows(&got, &reference, tokens, bound)
                    .unwrap_or_else(|e| panic!("{name} {dtype} prefill: {e}"));
                report.push(format!("{name} {dtype} prefill: worst {worst:.2e}"));
            }
            let engine_with = |prefill: Option<u64>, short_context: Option<u64>| {
                let opts = EngineOptions {
                    schedule: amk_model_llama::lower::tuned_schedule(),
                    target: GpuTarget::by_name("h100").unwrap(),
                    dtype: DType::F32,
                    max_seq: Some(32),
                    stop_slots: 1,
                    prefill_rows: prefill,
                    short_context,
                };
                lower_and_load(&model, &opts, &gpu, &registry()).unwrap()
            };
            let engine = |prefill: Option<u64>| engine_with(prefill, None);
            let prompt: Vec<u32> = ids.iter().map(|&x| x as u32).collect();
            let req = amk_engine::Request::greedy(&prompt, 6, &[]);
            let want = engine(None).generate(&req, &mut |_| true).unwrap().ids();
            let mut e = engine(Some(4));
            assert_eq!(
                e.prefill_rows(),
                Some(4),
                "{name}: {:?}",
                e.prefill_refused()
            );
            let got = e.generate(&req, &mut |_| true).unwrap().ids();
            assert_eq!(got, want, "{name}: tokens after a prefilled prompt");
            // The short-context program below position 6 (inside the 12-token prompt) or 14
            // (two generated tokens), the split program from there: the same tokens, in one
            // launch or a pass a launch.
            for (below, per_launch) in [(6, None), (14, None), (14, Some(1))] {
                let mut e = engine_with(None, Some(below));
                let req = amk_engine::Request {
                    passes_per_launch: per_launch,
                    ..req
                };
                let g = e.generate(&req, &mut |_| true).unwrap();
                assert_eq!(
                    g.ids(),
                    want,
                    "{name}: tokens with the short program below {below}"
                );
                assert_eq!(g.short_passes, below, "{name}: passes of the short program");
            }
        }
        println!("{}", report.join("\n"));
    }
}
