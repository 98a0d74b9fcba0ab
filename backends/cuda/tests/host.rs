//! Host-side tests of the CUDA backend (no GPU, no CUDA libraries): the C header against the
//! Rust mirrors, the table layout, the queues and the source assembly.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test file

use amk_backend_cuda::abi::{self, AmkInstruction};
use amk_backend_cuda::assemble::{ABI_HEADER, KNOBS, Knobs, SCHEDULER, megakernel_source};
use amk_backend_cuda::queues::build_queues;
use amk_backend_cuda::tables::{self, Placement, pack_params};
use amk_core::json::{Map, Value};
use amk_core::spec::param_field_index;
use amk_core::{BufferKind, DType, MemSpace, Opcode, Program, Registry, abi as core_abi};
use bytemuck::Zeroable;
use std::collections::{BTreeMap, HashMap};

/// The device libraries these tests read, as the registry hands them to the backend.
const TILE_HELPERS: &str = oplib_tile::CUDA;
const ATTENTION_HELPERS: &str = oplib_attention::CUDA;

fn registry() -> Registry {
    amk_ops::registry().unwrap()
}

/// `#define NAME value` lines of the header.
fn defines() -> HashMap<String, String> {
    ABI_HEADER
        .lines()
        .filter_map(|l| l.trim().strip_prefix("#define "))
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            Some((it.next()?.to_string(), it.next()?.to_string()))
        })
        .collect()
}

/// `NAME = value,` enumerator lines of the header.
fn enumerators() -> HashMap<String, i64> {
    ABI_HEADER
        .lines()
        .filter_map(|l| {
            let l = l.trim().trim_end_matches(',');
            let (name, rest) = l.split_once(" = ")?;
            let v = rest.split_whitespace().next()?.trim_end_matches(',');
            if !name.starts_with("AMK_") {
                return None;
            }
            Some((name.to_string(), v.parse().ok()?))
        })
        .collect()
}

/// `(struct, field) -> offset` from the `/*@N*/` comments, and `struct -> size` from
/// `/*@size N*/`.
fn layouts() -> (BTreeMap<(String, String), usize>, BTreeMap<String, usize>) {
    let (mut offs, mut sizes) = (BTreeMap::new(), BTreeMap::new());
    let mut current: Option<String> = None;
    for l in ABI_HEADER.lines() {
        let t = l.trim();
        if let Some(rest) = t.strip_prefix("typedef struct ") {
            let name = rest.split_whitespace().next().unwrap().to_string();
            let size = rest
                .split("/*@size ")
                .nth(1)
                .and_then(|s| s.split('*').next())
                .map(|s| s.trim().parse::<usize>().unwrap())
                .unwrap_or_else(|| panic!("struct {name} has no @size comment"));
            sizes.insert(name.clone(), size);
            current = Some(name);
            continue;
        }
        if t.starts_with('}') {
            current = None;
            continue;
        }
        let (Some(s), Some((decl, rest))) = (&current, t.split_once(';')) else {
            continue;
        };
        let Some(off) = rest
            .split("/*@")
            .nth(1)
            .and_then(|x| x.split('*').next())
            .and_then(|x| x.trim().parse::<usize>().ok())
        else {
            panic!("field `{t}` of {s} has no @offset comment");
        };
        let field = decl
            .split_whitespace()
            .last()
            .unwrap()
            .trim_start_matches('*')
            .split('[')
            .next()
            .unwrap()
            .to_string();
        offs.insert((s.clone(), field), off);
    }
    (offs, sizes)
}

#[test]
fn header_layouts_match_the_rust_mirrors() {
    let (offs, sizes) = layouts();
    for (s, size) in abi::struct_sizes() {
        assert_eq!(sizes.get(s), Some(&size), "size of {s}");
    }
    let mirrored = abi::field_offsets();
    for &(s, f, off) in &mirrored {
        assert_eq!(
            offs.get(&(s.to_string(), f.to_string())),
            Some(&off),
            "offset of {s}.{f}"
        );
    }
    assert_eq!(
        offs.len(),
        mirrored.len(),
        "the header has fields the mirrors lack"
    );
}

/// The `amk_device_program::flags` bits the device headers define (`AMK_PROG_*`, in the tile
/// helpers and the scheduler) are the host's, and no two share a bit.
#[test]
fn program_flag_bits_match_the_host() {
    let mut bits = HashMap::new();
    for src in [TILE_HELPERS, SCHEDULER] {
        for l in src.lines() {
            let Some(rest) = l.trim().strip_prefix("#define AMK_PROG_") else {
                continue;
            };
            let mut it = rest.split_whitespace();
            let (Some(name), Some(v)) = (it.next(), it.next()) else {
                continue;
            };
            bits.insert(name.to_string(), v.parse::<i32>().unwrap());
        }
    }
    let want = [
        ("L2_EVICT_FIRST", abi::PROG_L2_EVICT_FIRST),
        ("VERIFY", abi::PROG_VERIFY),
    ];
    assert_eq!(bits.len(), want.len(), "{bits:?}");
    let mut all = 0;
    for (name, v) in want {
        assert_eq!(bits.get(name), Some(&v), "AMK_PROG_{name}");
        assert_eq!(v.count_ones(), 1, "AMK_PROG_{name} is one bit");
        assert_eq!(all & v, 0, "AMK_PROG_{name} shares a bit");
        all |= v;
    }
}

#[test]
fn header_constants_match_the_core() {
    let d = defines();
    let num = |k: &str| -> i64 { d[k].parse().unwrap_or_else(|_| panic!("{k} = {}", d[k])) };
    assert_eq!(num("AMK_ABI_VERSION_MAJOR"), core_abi::VERSION_MAJOR as i64);
    assert_eq!(num("AMK_ABI_VERSION_MINOR"), core_abi::VERSION_MINOR as i64);
    assert_eq!(num("AMK_MAX_INPUTS"), core_abi::MAX_INPUTS as i64);
    assert_eq!(num("AMK_MAX_OUTPUTS"), core_abi::MAX_OUTPUTS as i64);
    assert_eq!(num("AMK_MAX_WAITS"), core_abi::MAX_WAITS as i64);
    assert_eq!(num("AMK_MAX_RANK"), core_abi::MAX_RANK as i64);
    assert_eq!(num("AMK_MAX_EXT_PARAMS"), abi::MAX_EXT_PARAMS as i64);
    assert_eq!(num("AMK_COUNTER_STRIDE"), abi::COUNTER_STRIDE as i64);
    assert_eq!(num("AMK_TASK_SLOTS"), abi::TASK_SLOTS as i64);
    assert_eq!(num("AMK_BUF_LAUNCH_CONST"), abi::BUF_LAUNCH_CONST as i64);
    assert_eq!(num("AMK_LOOP_WORDS"), abi::LOOP_WORDS as i64);
    assert_eq!(num("AMK_LOOP_CANCEL"), abi::LOOP_CANCEL as i64);
    assert_eq!(num("AMK_LOOP_DONE"), abi::LOOP_DONE as i64);
    assert_eq!(
        abi::TASK_SLOTS,
        core_abi::MAX_INPUTS + core_abi::MAX_OUTPUTS
    );
    assert_eq!(num("AMK_P_EXT0"), abi::PRESENT_EXT0 as i64);
    // Presence bits follow the host's device-field table.
    for (key, _) in amk_core::PARAM_FIELDS {
        let name = format!("AMK_P_{}", key.to_uppercase());
        assert_eq!(num(&name), param_field_index(key).unwrap() as i64, "{name}");
    }
    let e = enumerators();
    for dt in DType::ALL {
        assert_eq!(e[&format!("AMK_{}", dt.name())], dt.code() as i64, "{dt}");
    }
    for ms in MemSpace::ALL {
        assert_eq!(e[&format!("AMK_{}", ms.name())], ms.code() as i64, "{ms}");
    }
    for code in 0..Opcode::ABI_COUNT {
        let op = Opcode(code);
        let name = op.abi_name().unwrap();
        assert_eq!(e[&format!("AMK_OP_{name}")], code as i64, "{name}");
    }
    for (name, code) in [
        ("AMK_ERR_UNKNOWN_OPCODE", abi::status::UNKNOWN_OPCODE),
        ("AMK_ERR_BAD_BUFFER_ID", abi::status::BAD_BUFFER_ID),
        ("AMK_ERR_BAD_COUNTER_ID", abi::status::BAD_COUNTER_ID),
        ("AMK_ERR_INDEX", abi::status::INDEX),
        ("AMK_ERR_SHAPE", abi::status::SHAPE),
        ("AMK_ERR_DTYPE", abi::status::DTYPE),
        ("AMK_ERR_PARAM", abi::status::PARAM),
        ("AMK_ERR_ABORTED", abi::status::ABORTED),
        ("AMK_ERR_NO_WAIT", abi::status::NO_WAIT),
    ] {
        assert_eq!(e[name], code as i64, "{name}");
    }
}

fn params(kv: &[(&str, Value)]) -> Map {
    let mut m = Map::new();
    for (k, v) in kv {
        m.insert(*k, v.clone());
    }
    m
}

#[test]
fn params_pack_at_their_fields_with_presence_bits_and_ext_slots() {
    let reg = registry();
    let rope = reg.get(Opcode::ROPE).unwrap();
    let p = pack_params(
        rope,
        &params(&[
            ("head_dim", Value::Int(64)),
            ("theta", Value::Float(1e5)),
            ("pairing", Value::Int(1)),
        ]),
    )
    .unwrap();
    assert_eq!(p.head_dim, 64);
    assert_eq!(p.theta, 1e5f32);
    assert_eq!(p.ext[0], 1);
    let bits = (1 << param_field_index("head_dim").unwrap())
        | (1 << param_field_index("theta").unwrap())
        | (1 << abi::PRESENT_EXT0);
    assert_eq!(p.present, bits);
    let bytes = bytemuck::bytes_of(&p);
    assert_eq!(&bytes[36..40], &64i32.to_le_bytes());
    assert_eq!(&bytes[84..88], &1e5f32.to_le_bytes());
    // Absent optional params stay 0 with no presence bit.
    let p = pack_params(
        rope,
        &params(&[("head_dim", Value::Int(8)), ("theta", Value::Int(10000))]),
    )
    .unwrap();
    assert_eq!((p.ext[0], p.present >> abi::PRESENT_EXT0), (0, 0));
    // Out of int32: refused, never truncated.
    let gemv = reg.get(Opcode::GEMV_TILE).unwrap();
    let e = pack_params(gemv, &params(&[("K", Value::Int(1 << 40))])).unwrap_err();
    assert!(e.contains("int32"), "{e}");
}

/// A toy program: COPYs and an ADD over assigned and unassigned SMs, a weight, IO.
fn toy(sms: &[Option<i32>]) -> Program {
    let mut p = Program::new();
    let x = p.new_buffer("x", BufferKind::IO_INPUT, DType::F32, &[3, 5]);
    let w = p.new_buffer("w", BufferKind::WEIGHT, DType::BF16, &[3, 5]);
    p.buffers[w as usize].source = Some("w".into());
    let mut prev = x;
    let mut prev_c = None;
    for (i, &sm) in sms.iter().enumerate() {
        let a = p.new_buffer(format!("a{i}"), BufferKind::ACTIVATION, DType::F32, &[3, 5]);
        let c = p.new_counter(format!("c{i}"));
        let waits: Vec<_> = prev_c.map(|c| (c, 1)).into_iter().collect();
        let t = p.push_task(Opcode::ADD, &[prev, w], &[a], c, &waits, Map::new(), "");
        p.tasks[t as usize].sm = sm;
        prev = a;
        prev_c = Some(c);
    }
    let y = p.new_buffer("y", BufferKind::IO_OUTPUT, DType::F32, &[3, 5]);
    let c = p.new_counter("y");
    p.push_task(
        Opcode::COPY,
        &[prev],
        &[y],
        c,
        &[(prev_c.unwrap(), 1)],
        Map::new(),
        "out",
    );
    p
}

#[test]
fn tables_place_weights_and_align_the_arena() {
    let p = toy(&[Some(0), Some(1), None]);
    let t = tables::build(&p, &registry(), 132).unwrap();
    assert_eq!(t.buffers.len(), p.buffers.len());
    for (i, (d, b)) in t.buffers.iter().zip(&p.buffers).enumerate() {
        assert_eq!(d.dtype, b.dtype.code() as i32, "buffer {i}");
        assert_eq!(d.numel, b.numel() as i64);
        assert_eq!(&d.shape[..2], &[3, 5]);
        assert_eq!(&d.stride[..2], &[5, 1]);
        match t.placement[i] {
            Placement::Weight(j) => assert_eq!((j, b.kind), (i, BufferKind::WEIGHT)),
            Placement::Arena { offset, bytes } => {
                assert_eq!(offset % tables::ARENA_ALIGN, 0);
                assert_eq!(bytes, b.nbytes());
            }
            Placement::Host { .. } => panic!("buffer {i} is not in host memory"),
        }
    }
    let r: &AmkInstruction = &t.instructions[1];
    assert_eq!(
        (r.op, r.n_inputs, r.n_outputs, r.n_waits),
        (Opcode::ADD.0 as i32, 2, 1, 1)
    );
    assert_eq!(
        (r.wait_counter[0], r.wait_threshold[0], r.out_counter),
        (0, 1, 1)
    );
    assert_eq!(t.fused_off, vec![0; p.tasks.len() + 1]);
}

/// An instruction record of `op` with `inputs`, params `K`, `N_tile`, `n_off`.
fn record(op: Opcode, inputs: &[i32], k: i32, n_tile: i32, n_off: i32) -> abi::AmkInstruction {
    let mut r = abi::AmkInstruction::zeroed();
    r.op = i32::from(op.0);
    r.n_inputs = inputs.len() as i32;
    r.inputs[..inputs.len()].copy_from_slice(inputs);
    r.params.k = k;
    r.params.n_tile = n_tile;
    r.params.n_off = n_off;
    r
}

/// A `[rows, k]` bf16 weight descriptor at `ptr`.
fn weight(ptr: u64, rows: i64, k: i64) -> abi::AmkBuffer {
    let mut b = abi::AmkBuffer::zeroed();
    b.ptr = ptr;
    b.numel = rows * k;
    b.rank = 2;
    b.dtype = DType::BF16.code() as i32;
    b
}

#[test]
fn task_buffers_lay_out_each_tasks_operands_in_its_stage_slots() {
    let descs: Vec<abi::AmkBuffer> = (0..5)
        .map(|b| weight(0x1000 * (b + 1), b as i64 + 1, 8))
        .collect();
    let mut a = record(Opcode::ADD, &[3, 1], 8, 0, 0);
    a.n_outputs = 1;
    a.outputs[0] = 4;
    let mut bad = record(Opcode::GEMV_TILE, &[0, 7], 8, 1, 0);
    bad.n_outputs = 2;
    bad.outputs[..2].copy_from_slice(&[-1, 2]);
    let slots = tables::task_buffers(&[a, bad], &descs);
    assert_eq!(slots.len(), 2 * abi::TASK_SLOTS);
    let zero = abi::AmkBuffer::zeroed();
    let max_in = core_abi::MAX_INPUTS;
    for (t, expect) in [
        (0, vec![(0, 3), (1, 1), (max_in, 4)]),
        (1, vec![(0, 0), (max_in + 1, 2)]),
    ] {
        for s in 0..abi::TASK_SLOTS {
            let want = expect
                .iter()
                .find(|(slot, _)| *slot == s)
                .map_or(zero, |&(_, b)| descs[b]);
            assert_eq!(slots[t * abi::TASK_SLOTS + s], want, "task {t} slot {s}");
        }
    }
}

/// Exactly the descriptors that no task and no FUSED step writes are marked launch-constant
/// (a stale mark is cleared; ids out of range are skipped).
#[test]
fn launch_constant_buffers_are_those_nothing_writes() {
    let mut descs: Vec<abi::AmkBuffer> = (0..6).map(|b| weight(0x1000 * (b + 1), 1, 8)).collect();
    descs[2].flags = abi::BUF_LAUNCH_CONST; // stale: task `a` writes buffer 2
    let mut a = record(Opcode::ADD, &[0, 1], 8, 0, 0);
    a.n_outputs = 2;
    a.outputs[..2].copy_from_slice(&[2, 9]);
    let mut step = record(Opcode::ADD, &[2, 3], 8, 0, 0);
    step.n_outputs = 1;
    step.outputs[0] = 4;
    step.outputs[1] = 5; // beyond n_outputs: not a write
    tables::mark_launch_constant(&mut descs, &[a], &[step]);
    let marked: Vec<bool> = descs
        .iter()
        .map(|d| d.flags & abi::BUF_LAUNCH_CONST != 0)
        .collect();
    assert_eq!(marked, [true, true, false, true, false, true]);
}

#[test]
fn queues_follow_sm_assignment_and_never_deadlock() {
    for (sms, blocks) in [
        (vec![Some(0), Some(1), Some(2), Some(0)], 132),
        (vec![None, None, None, None, None], 132),
        (vec![Some(5), None, Some(2), None, Some(7), Some(1)], 3),
        (vec![Some(131), Some(0), None], 2),
    ] {
        let p = toy(&sms);
        let q = build_queues(&p, blocks).unwrap();
        assert!(q.len() <= blocks);
        let mut seen = vec![false; p.tasks.len()];
        for k in 0..q.len() {
            for &t in q.queue(k) {
                assert!(!seen[t as usize]);
                seen[t as usize] = true;
                if let Some(s) = p.tasks[t as usize].sm {
                    assert_eq!(s as usize % q.len(), k, "task {t} on queue {k}");
                }
            }
        }
        assert!(seen.iter().all(|&s| s), "every task queued");
        if sms.iter().all(Option::is_none) {
            let used = (0..q.len()).filter(|&k| !q.queue(k).is_empty()).count();
            assert!(used > 1, "unassigned tasks all on one queue");
        }
        simulate(&p, &q);
    }
}

/// Runs the queues in lockstep the way the device does (a block waits on its head task's
/// counters) and asserts every task finishes.
fn simulate(p: &Program, q: &amk_backend_cuda::queues::Queues) {
    let mut counters = vec![0i64; p.counters.len()];
    let mut head = vec![0usize; q.len()];
    let mut done = 0;
    loop {
        let mut progressed = false;
        for (k, h) in head.iter_mut().enumerate() {
            let Some(&t) = q.queue(k).get(*h) else {
                continue;
            };
            let task = &p.tasks[t as usize];
            if task
                .waits
                .iter()
                .all(|w| counters[w.counter as usize] >= w.threshold)
            {
                counters[task.out_counter as usize] += 1;
                *h += 1;
                done += 1;
                progressed = true;
            }
        }
        if !progressed {
            break;
        }
    }
    assert_eq!(
        done,
        p.tasks.len(),
        "deadlock: {done} of {} tasks ran",
        p.tasks.len()
    );
}

#[test]
fn the_source_has_one_case_per_op_and_is_deterministic() {
    let reg = registry();
    let a = megakernel_source(&reg, Knobs::default()).unwrap();
    let b = megakernel_source(&reg, Knobs::default()).unwrap();
    assert_eq!(a.source, b.source);
    for code in 0..Opcode::ABI_COUNT {
        assert!(a.has(Opcode(code)), "op {code} has no device function");
        // The scheduler's wait comes before every op that does not wait itself.
        let own = reg.cuda(Opcode(code)).unwrap().own_wait;
        let wait = if own { "" } else { "if (amk_task_wait(c)) " };
        assert!(
            a.source
                .contains(&format!("    case {code}: {wait}amk_op_{code}::")),
            "no dispatch case for {code} (own wait: {own})"
        );
    }
    assert!(a.source.contains("#define AMK_THREADS 256"));
    let e = megakernel_source(
        &reg,
        Knobs {
            threads: 100,
            ..Knobs::default()
        },
    )
    .unwrap_err();
    assert!(e.contains("multiple of 32"), "{e}");
}

/// The registry's device libraries go into the kernel after the backend's runtime and before
/// the ops that call them, each under its own file's line info; a registry without them gives
/// a kernel without them.
#[test]
fn device_libraries_come_between_the_runtime_and_the_ops() {
    let reg = registry();
    let src = megakernel_source(&reg, Knobs::default()).unwrap().source;
    let runtime = src
        .find("#line 1 \"backends/cuda/include/amk_device.cuh\"")
        .unwrap();
    let first_op = src.find("namespace amk_op_").unwrap();
    let mut last = runtime;
    for lib in reg.device_libraries() {
        let at = src
            .find(&format!("#line 1 \"{}\"\n{}", lib.file, lib.cuda))
            .unwrap_or_else(|| panic!("library {} is not in the kernel", lib.name));
        assert!(
            last < at && at < first_op,
            "library {} out of place",
            lib.name
        );
        last = at;
    }
    assert_eq!(reg.device_libraries().len(), 3);
    let bare = megakernel_source(&Registry::empty(), Knobs::default())
        .unwrap()
        .source;
    assert!(!bare.contains(TILE_HELPERS) && !bare.contains(ATTENTION_HELPERS));
}

/// Device defines go into the source before the device code, so each variant is its own
/// cubin; anything but NAME=token is refused (the text is pasted verbatim).
#[test]
fn device_defines_are_pasted_or_refused() {
    let reg = registry();
    let knobs = |d: &str| Knobs {
        defines: amk_backend_cuda::parse_defines(d),
        ..Knobs::default()
    };
    let plain = megakernel_source(&reg, Knobs::default()).unwrap().source;
    let a = megakernel_source(&reg, knobs("AMK_FUSED_PAIR=1 AMK_X"))
        .unwrap()
        .source;
    let head = &a[..a.find("#line").unwrap()];
    assert!(head.contains("#define AMK_FUSED_PAIR 1\n"), "{head}");
    assert!(head.contains("#define AMK_X 1\n"), "{head}");
    assert_ne!(a, plain);
    for bad in ["1X=2", "AMK_A=(1)", "AMK_A=1;x", "AMK_THREADS=64", "AMK_A="] {
        let e = megakernel_source(&reg, knobs(bad)).unwrap_err();
        assert!(e.contains("device define"), "{bad}: {e}");
    }
}

/// The op sources keep the device contract: no includes, kernels or traps of their own, no
/// fast-math intrinsics (they would break the 1e-5 agreement with the CPU VM).
#[test]
fn op_sources_keep_the_device_contract() {
    let reg = registry();
    for (spec, _) in reg.iter() {
        let cuda = reg
            .cuda(spec.code)
            .unwrap_or_else(|| panic!("{} has no CUDA source", spec.name));
        let src = cuda.source.as_ref();
        assert!(
            src.contains(&format!("void {}(const amk_task_ctx&", cuda.entry)),
            "{}: no `void {}(const amk_task_ctx& ...)`",
            spec.name,
            cuda.entry
        );
        // An op that waits itself calls the wait (directly, or through the tile runners that
        // do); any other op leaves it to the dispatcher (a second wait would only cost time).
        let waits = [
            "amk_task_wait(ctx)",
            "amk_tile_run<",
            "amk_fused_tile<",
            "amk_row_tile(ctx",
        ]
        .iter()
        .any(|w| src.contains(w));
        assert_eq!(
            waits,
            cuda.own_wait,
            "{}: registered own_wait = {}, but its source {} amk_task_wait",
            spec.name,
            cuda.own_wait,
            if waits { "calls" } else { "never calls" }
        );
        for banned in [
            "#include",
            "__global__",
            "__trap",
            "__expf(",
            "__sinf(",
            "__cosf(",
            "__powf(",
            "__fdividef(",
            "__logf(",
            "__exp10f(",
            "__tanf(",
            "asm(\"trap",
        ] {
            assert!(!src.contains(banned), "{} uses {banned}", spec.name);
        }
    }
}

#[cfg(not(feature = "cuda"))]
#[test]
fn without_the_feature_the_backend_says_so() {
    let e =
        amk_backend_cuda::CudaBackend::new(amk_backend_cuda::CudaOptions::default()).unwrap_err();
    assert!(matches!(e, amk_backend_cuda::CudaError::NotCompiled), "{e}");
    assert!(e.to_string().contains("--features cuda"));
}

/// With the feature but no driver (as on machines without a GPU), opening the backend is a
/// typed error, never cudarc's panic.
#[cfg(feature = "cuda")]
#[test]
fn without_a_driver_the_backend_errors_instead_of_panicking() {
    match amk_backend_cuda::CudaBackend::new(amk_backend_cuda::CudaOptions::default()) {
        Ok(b) => eprintln!("a device is present: {}", b.info()),
        Err(e) => {
            eprintln!("no device: {e}");
            assert!(amk_backend_cuda::test_support::is_absent(&e), "{e}");
        }
    }
}

/// The SmolLM2-135M shape lowered in `dtype` (no weights: the shape is all the loops need).
fn smollm2_program(dtype: DType, schedule: &amk_core::ScheduleConfig) -> Program {
    preset_program("smollm2-135m", dtype, schedule)
}

/// A preset shape's decode program (64 cache rows, an H100's 132 SMs).
fn preset_program(shape: &str, dtype: DType, schedule: &amk_core::ScheduleConfig) -> Program {
    use amk_model_llama::lower::{LowerOptions, lower};
    use amk_model_llama::{Model, presets};
    let cfg = presets::preset(shape).unwrap();
    let m = Model::shape_only(cfg, shape);
    let opts = LowerOptions {
        dtype,
        max_seq: Some(64),
        ..LowerOptions::default()
    };
    let target = amk_core::GpuTarget::by_name("h100").unwrap();
    lower(&m, schedule, &target, &opts).unwrap().program
}

/// A model program in one dtype names exactly that dtype's loop, fused (tuned) or not
/// (reference schedule), so its kernel compiles one of the six; the define says so and the
/// kernel of every pair has none (its source, so its cache key, is the plain one).
#[rstest::rstest]
fn a_model_program_compiles_its_own_dtype_loop(
    #[values(DType::F32, DType::F16, DType::BF16)] dtype: DType,
    #[values(false, true)] tuned: bool,
) {
    use amk_backend_cuda::FusedLoops;
    let reg = registry();
    let schedule = if tuned {
        amk_model_llama::lower::tuned_schedule()
    } else {
        amk_core::ScheduleConfig::default()
    };
    let p = smollm2_program(dtype, &schedule);
    let loops = FusedLoops::of_program(&p, &reg);
    assert_eq!(
        Some(loops),
        FusedLoops::of_dtype(dtype),
        "{dtype:?} tuned={tuned}"
    );
    let bit = match dtype {
        DType::F32 => 1u8 << 0, /* f32 weights, f32 row */
        DType::F16 => 1u8 << 3, /* f16 weights, 16-bit row */
        _ => 1u8 << 5,          /* bf16 weights, 16-bit row */
    };
    assert_eq!(loops.bits(), bit);
    let src = megakernel_source(
        &reg,
        Knobs {
            fused_loops: loops,
            ..Knobs::default()
        },
    )
    .unwrap()
    .source;
    let head = &src[..src.find("#line").unwrap()];
    assert!(
        head.contains(&format!("#define AMK_FUSED_LOOPS {bit}\n")),
        "{head}"
    );
    let plain = megakernel_source(&reg, Knobs::default()).unwrap().source;
    assert!(!plain[..plain.find("#line").unwrap()].contains("AMK_FUSED_LOOPS"));
}

/// Mixed pairs are found per task; a program with no row-loop op gets every pair (one shared
/// kernel); a user's own AMK_FUSED_LOOPS define wins over the program's.
#[test]
fn fused_loops_follow_the_tasks_operands() {
    use amk_backend_cuda::FusedLoops;
    let reg = registry();
    let mut p = smollm2_program(DType::BF16, &amk_model_llama::lower::tuned_schedule());
    // The first GEMV_TILE's row made f32: bf16 weights against an f32 row (bit 2 * 2 + 0).
    let t = p
        .tasks
        .iter()
        .find(|t| t.op == Opcode::GEMV_TILE)
        .expect("the LM head is a GEMV_TILE")
        .clone();
    p.buffers[t.inputs[0] as usize].dtype = DType::F32;
    let loops = FusedLoops::of_program(&p, &reg);
    assert_eq!(loops.bits(), (1 << 5) | (1 << 4), "{loops}");
    assert_eq!(loops.to_string(), "bf16/f32,bf16/16");
    p.tasks
        .retain(|t| reg.cuda(t.op).and_then(|c| c.row_loop).is_none());
    assert_eq!(FusedLoops::of_program(&p, &reg), FusedLoops::ALL);
    assert_eq!(FusedLoops::ALL.to_string(), "all");
    assert_eq!(FusedLoops::ALL.define(), None);
    let src = megakernel_source(
        &reg,
        Knobs {
            defines: amk_backend_cuda::parse_defines("AMK_FUSED_LOOPS=33"),
            fused_loops: FusedLoops::of_dtype(DType::BF16).unwrap(),
            ..Knobs::default()
        },
    )
    .unwrap()
    .source;
    let head = &src[..src.find("#line").unwrap()];
    assert!(head.contains("#define AMK_FUSED_LOOPS 33\n"), "{head}");
    assert_eq!(head.matches("AMK_FUSED_LOOPS").count(), 1, "{head}");
}

/// The host's bit layout is the device's: `2 * AMK_TILE_W_* + x16`, weights f32/f16/bf16 =
/// 0/1/2, every pair by default.
#[test]
fn fused_loop_bits_match_the_device_code() {
    assert!(TILE_HELPERS.contains("AMK_TILE_W_F32 = 0, AMK_TILE_W_F16 = 1, AMK_TILE_W_BF16 = 2,"));
    assert!(KNOBS.contains("#define AMK_FUSED_LOOPS 63\n"));
    assert!(TILE_HELPERS.contains("((AMK_FUSED_LOOPS >> (2 * (wk) + (x16))) & 1)"));
    assert_eq!(amk_backend_cuda::FusedLoops::ALL.bits(), 63);
}

/// The kernel `program` loads when a session compiles only its ops (`program_ops`).
fn program_kernel(reg: &Registry, program: &Program) -> amk_backend_cuda::assemble::Megakernel {
    program_kernel_with(reg, program, Vec::new())
}

/// [`program_kernel`] with device defines (`CudaOptions::defines`).
fn program_kernel_with(
    reg: &Registry,
    program: &Program,
    defines: Vec<(String, String)>,
) -> amk_backend_cuda::assemble::Megakernel {
    let opts = amk_backend_cuda::CudaOptions {
        program_ops: true,
        defines,
        ..amk_backend_cuda::CudaOptions::default()
    };
    megakernel_source(reg, opts.knobs(Some(program), reg)).unwrap()
}

/// A program's kernel holds the ops its tasks use and no other (the dispatch has a case for
/// each of them; a task of an op left out would fail its load, not run); a FUSED task whose
/// steps cannot be worked out brings every op back, and so does `program_ops` off. Without a
/// program, the kernel is every op's.
#[test]
fn a_program_kernel_holds_only_its_ops() {
    use amk_backend_cuda::CudaOptions;
    let reg = registry();
    let p = smollm2_program(DType::BF16, &amk_model_llama::lower::tuned_schedule());
    let mut used: Vec<Opcode> = p.tasks.iter().map(|t| t.op).collect();
    used.sort();
    used.dedup();
    let opts = CudaOptions {
        program_ops: true,
        ..CudaOptions::default()
    };
    let mk = program_kernel(&reg, &p);
    let compiled: Vec<Opcode> = mk.ops.iter().map(|o| o.code).collect();
    assert_eq!(compiled, used);
    for op in &used {
        assert!(mk.has(*op));
        assert!(mk.source.contains(&format!("    case {}: ", op.0)));
    }
    let every = megakernel_source(&reg, opts.knobs(None, &reg)).unwrap();
    assert!(every.ops.len() > used.len());
    for o in every.ops.iter().filter(|o| !used.contains(&o.code)) {
        assert!(!mk.has(o.code));
        assert!(!mk.source.contains(&format!("    case {}: ", o.code.0)));
    }
    let off = CudaOptions {
        program_ops: false,
        ..opts.clone()
    };
    let all_ops = megakernel_source(&reg, off.knobs(Some(&p), &reg)).unwrap();
    assert_eq!(all_ops.ops.len(), every.ops.len());
    let mut fused = p.clone();
    let mut t = fused.tasks[0].clone();
    t.op = Opcode::FUSED;
    fused.tasks.push(t);
    let k = opts.knobs(Some(&fused), &reg);
    assert_eq!(k.ops, None, "a FUSED task may run any op as a step");
}

/// A FUSED task brings its steps' ops into the kernel and no other: a program with the
/// reshape+ROPE pairs fused (each FUSED task an EMBED step and a ROPE step) has the kernel of
/// its tasks' ops, EMBED and ROPE, not every op's.
#[test]
fn a_fused_task_brings_only_its_steps_ops() {
    let reg = registry();
    let schedule = amk_core::ScheduleConfig {
        fusion_grouping: vec![vec!["embed".into(), "rope".into()]],
        ..amk_core::ScheduleConfig::default()
    };
    let p = smollm2_program(DType::F32, &schedule);
    assert!(p.tasks.iter().any(|t| t.op == Opcode::FUSED));
    let mut expected: Vec<Opcode> = p.tasks.iter().map(|t| t.op).collect();
    expected.extend([Opcode::EMBED, Opcode::ROPE]);
    expected.sort();
    expected.dedup();
    let mk = program_kernel(&reg, &p);
    let compiled: Vec<Opcode> = mk.ops.iter().map(|o| o.code).collect();
    assert_eq!(compiled, expected);
    assert!(compiled.len() < reg.len() - 10, "{compiled:?}");
}

/// In a kernel with the FUSED op both dispatchers (the task's and a FUSED step's) call each
/// other op through one out-of-line wrapper, so its body is in the kernel once; a kernel
/// without FUSED calls the entries directly and has no wrapper. (The verify pass's own
/// dispatcher calls an op that waits itself a third time.)
#[test]
fn a_fused_kernel_holds_each_op_once() {
    use amk_backend_cuda::assemble::OUT_OF_LINE;
    let reg = registry();
    let every = megakernel_source(&reg, Knobs::default()).unwrap();
    assert!(every.has(Opcode::FUSED));
    for o in every.ops.iter().filter(|o| o.code != Opcode::FUSED) {
        let code = o.code.0;
        let call = format!("{}(c)", o.entry);
        let wrapper =
            format!("namespace amk_op_{code} {{ __device__ __noinline__ void {OUT_OF_LINE}(");
        assert_eq!(every.source.matches(&wrapper).count(), 1, "op {code}");
        let dispatched = format!("amk_op_{code}::{OUT_OF_LINE}(c); break;");
        assert_eq!(
            every.source.matches(&dispatched).count(),
            2 + usize::from(o.own_wait),
            "op {code}: both dispatchers"
        );
        assert!(
            !every.source.contains(&format!("amk_op_{code}::{call}")),
            "op {code}"
        );
    }
    let p = smollm2_program(DType::BF16, &amk_model_llama::lower::tuned_schedule());
    let plain = program_kernel(&reg, &p);
    assert!(!plain.has(Opcode::FUSED));
    assert!(!plain.source.contains(OUT_OF_LINE));
    for o in &plain.ops {
        let direct = format!("amk_op_{}::{}(c); break;", o.code.0, o.entry);
        let calls = 2 + usize::from(o.own_wait);
        assert_eq!(
            plain.source.matches(&direct).count(),
            calls,
            "op {}",
            o.code.0
        );
    }
}

/// The task dispatcher inlines into the kernel's entry by default, and the verify pass gets a
/// dispatcher of its own that runs only the ops that wait themselves; with
/// `AMK_DISPATCH_INLINE=0` (a define) the verify pass calls the one out-of-line dispatcher.
#[test]
fn dispatch_inline_gives_the_verify_pass_its_own_dispatcher() {
    let reg = registry();
    let p = smollm2_program(DType::BF16, &amk_model_llama::lower::tuned_schedule());
    let outline = program_kernel_with(&reg, &p, vec![("AMK_DISPATCH_INLINE".into(), "0".into())]);
    assert!(
        outline
            .source
            .contains("__device__ __noinline__ void amk_dispatch(")
    );
    assert!(!outline.source.contains("amk_dispatch_verify"));
    let inline = program_kernel(&reg, &p);
    assert!(
        inline
            .source
            .contains("__device__ __forceinline__ void amk_dispatch(")
    );
    assert!(
        inline
            .source
            .contains("#define AMK_VERIFY_DISPATCH amk_dispatch_verify")
    );
    let verify = &inline.source[inline.source.find("void amk_dispatch_verify(").unwrap()..];
    let verify = &verify[..verify.find("\n}\n").unwrap()];
    for o in &inline.ops {
        let call = format!("amk_op_{}::{}(c); break;", o.code.0, o.entry);
        assert_eq!(verify.contains(&call), o.own_wait, "op {}", o.code.0);
        assert!(
            verify.contains(&format!("case {}:", o.code.0)),
            "op {}",
            o.code.0
        );
    }
}

/// A kernel with FUSED (every op an out-of-line call) is compiled as separate code and linked;
/// every other kernel, the shipped programs' included, as one program (NVRTC's default).
#[test]
fn only_a_fused_kernel_is_compiled_as_separate_code() {
    use amk_backend_cuda::assemble::Linkage;
    let reg = registry();
    let every = megakernel_source(&reg, Knobs::default()).unwrap();
    assert_eq!(every.linkage(), Linkage::Separate);
    for schedule in [
        amk_model_llama::lower::tuned_schedule(),
        amk_core::ScheduleConfig::default(),
    ] {
        let p = smollm2_program(DType::BF16, &schedule);
        assert_eq!(program_kernel(&reg, &p).linkage(), Linkage::WholeProgram);
    }
}

/// The defines a kernel's source starts with (everything before the first `#line`).
fn kernel_head(reg: &Registry, knobs: Knobs) -> String {
    let s = megakernel_source(reg, knobs).unwrap().source;
    s[..s.find("#line").unwrap()].to_string()
}

/// A kernel holds the quantised tile loops only for a program with a quantised buffer (every
/// op's kernel keeps them); a user's define of the name wins over the derived one.
#[test]
fn quantised_loops_follow_the_program() {
    use amk_backend_cuda::CudaOptions;
    let reg = registry();
    let head = |k: Knobs| kernel_head(&reg, k);
    let p = smollm2_program(DType::BF16, &amk_model_llama::lower::tuned_schedule());
    let off = CudaOptions {
        defines: Vec::new(),
        ..CudaOptions::default()
    };
    let h = head(off.knobs(Some(&p), &reg));
    assert!(h.contains("#define AMK_TILE_QUANT_OFF 1\n"), "{h}");
    let mut q = p.clone();
    // A quantised weight anywhere brings the quantised loops back.
    let w = p
        .tasks
        .iter()
        .find(|t| t.op == Opcode::GEMV_TILE)
        .unwrap()
        .inputs[1];
    q.buffers[w as usize].dtype = DType::I8;
    assert!(!head(off.knobs(Some(&q), &reg)).contains("AMK_TILE_QUANT_OFF"));
    // Every op's kernel (no program) keeps them.
    assert!(!head(off.knobs(None, &reg)).contains("AMK_TILE_QUANT_OFF"));
    let user = CudaOptions {
        defines: amk_backend_cuda::parse_defines("AMK_TILE_QUANT_OFF=0"),
        ..off
    };
    let h = head(user.knobs(Some(&p), &reg));
    assert!(h.contains("#define AMK_TILE_QUANT_OFF 0\n"), "{h}");
    assert_eq!(h.matches("AMK_TILE_QUANT_OFF").count(), 1, "{h}");
    assert!(TILE_HELPERS.contains("#if !AMK_TILE_QUANT_OFF"));
}

/// A kernel has no trace points unless a traced session asks for them; the device code
/// honours the define.
#[test]
fn trace_points_follow_the_session() {
    use amk_backend_cuda::CudaOptions;
    let reg = registry();
    let head = |k: Knobs| kernel_head(&reg, k);
    let p = smollm2_program(DType::BF16, &amk_model_llama::lower::tuned_schedule());
    let off = CudaOptions {
        defines: Vec::new(),
        ..CudaOptions::default()
    };
    for program in [Some(&p), None] {
        let h = head(off.knobs(program, &reg));
        assert!(h.contains("#define AMK_TRACE_OFF 1\n"), "{h}");
    }
    let mut traced = off.knobs(Some(&p), &reg);
    traced.trace = true;
    assert!(!head(traced).contains("AMK_TRACE_OFF"));
    // The traced and untraced kernels are different sources, so different cubins.
    let mut t = off.knobs(Some(&p), &reg);
    let untraced = megakernel_source(&reg, t.clone()).unwrap().source;
    t.trace = true;
    assert_ne!(untraced, megakernel_source(&reg, t).unwrap().source);
    // Every trace point of the device code sits under its define.
    assert!(KNOBS.contains("#ifndef AMK_TRACE_OFF\n#define AMK_TRACE_OFF 0"));
    for (name, src) in [("scheduler", SCHEDULER), ("tile", TILE_HELPERS)] {
        let lines: Vec<&str> = src.lines().collect();
        for (i, l) in lines.iter().enumerate() {
            let guarded = |define: &str| {
                lines[..i]
                    .iter()
                    .rev()
                    .take(4)
                    .any(|p| p.contains(define) && p.trim_start().starts_with("#if"))
            };
            if l.contains("trace[") || l.contains("prog.trace +") {
                assert!(
                    guarded("AMK_TRACE_OFF"),
                    "{name}: unguarded trace point: {l}"
                );
            }
        }
    }
}

/// The fused loop's pass (`AMK_FUSED_VECS`) is the smallest that adds no pass to any of the
/// program's rows: SmolLM2's rows (72 and 192 bf16 vectors) fit a pass of 6 vectors a lane as
/// they fit one of 8, the 1B's and 8B's (256 and more) would take more passes; the define
/// appears only when it differs from the device default, and a user's define wins.
#[test]
fn the_fused_pass_is_sized_to_the_programs_rows() {
    use amk_backend_cuda::CudaOptions;
    use amk_backend_cuda::loops::fused_vecs;
    use amk_model_llama::lower::{LowerOptions, lower, tuned_schedule};
    use amk_model_llama::{Model, presets};
    let reg = registry();
    let target = amk_core::GpuTarget::by_name("h100").unwrap();
    let program = |shape: &str, dtype: DType| {
        let m = Model::shape_only(presets::preset(shape).unwrap(), shape);
        let opts = LowerOptions {
            dtype,
            max_seq: Some(64),
            ..LowerOptions::default()
        };
        lower(&m, &tuned_schedule(), &target, &opts)
            .unwrap()
            .program
    };
    let s = program("smollm2-135m", DType::BF16);
    assert_eq!(fused_vecs(&s, &reg), 6);
    for shape in ["llama-3.2-1b", "llama-3.1-8b"] {
        assert_eq!(fused_vecs(&program(shape, DType::BF16), &reg), 8, "{shape}");
    }
    // f32 SmolLM2: rows of 144 and 384 vectors take 2 passes of a two-row unit either way.
    assert_eq!(fused_vecs(&program("smollm2-135m", DType::F32), &reg), 6);
    // A longer row that a pass of 6 would split: 8.
    let mut long = s.clone();
    let t = long
        .tasks
        .iter_mut()
        .find(|t| t.op == Opcode::GEMV_TILE)
        .unwrap();
    t.params.insert("K", amk_core::json::Value::Int(2048));
    let x = t.inputs[0] as usize;
    long.buffers[x].shape = vec![1, 2048];
    assert_eq!(fused_vecs(&long, &reg), 8);
    let head = |k: Knobs| kernel_head(&reg, k);
    let opts = CudaOptions {
        defines: Vec::new(),
        ..CudaOptions::default()
    };
    assert!(head(opts.knobs(Some(&s), &reg)).contains("#define AMK_FUSED_VECS 6\n"));
    let b = program("llama-3.2-1b", DType::BF16);
    assert!(!head(opts.knobs(Some(&b), &reg)).contains("AMK_FUSED_VECS"));
    let user = CudaOptions {
        defines: amk_backend_cuda::parse_defines("AMK_FUSED_VECS=8"),
        ..CudaOptions::default()
    };
    let h = head(user.knobs(Some(&s), &reg));
    assert_eq!(h.matches("AMK_FUSED_VECS").count(), 1, "{h}");
    assert!(h.contains("#define AMK_FUSED_VECS 8\n"), "{h}");
    assert!(KNOBS.contains("#ifndef AMK_FUSED_VECS\n#define AMK_FUSED_VECS 8\n"));
    // Whole passes: the 1B's and 8B's rows (256 to 1,792 vectors) at 8 vectors a lane, not
    // SmolLM2's (72) and not the 1B's at 6 (a pass of 192, or of 96 for a two-row unit).
    use amk_backend_cuda::loops::fused_exact;
    assert!(fused_exact(&b, &reg, 8));
    assert!(fused_exact(&program("llama-3.1-8b", DType::BF16), &reg, 8));
    assert!(!fused_exact(&s, &reg, 6) && !fused_exact(&s, &reg, 8));
    assert!(!fused_exact(&b, &reg, 6));
    assert!(head(opts.knobs(Some(&b), &reg)).contains("#define AMK_FUSED_EXACT 1\n"));
    assert!(!head(opts.knobs(Some(&s), &reg)).contains("AMK_FUSED_EXACT"));
    // A user's pass is the one that counts: 6 on the 1B is not whole passes.
    let six = CudaOptions {
        defines: amk_backend_cuda::parse_defines("AMK_FUSED_VECS=6"),
        ..CudaOptions::default()
    };
    assert!(!head(six.knobs(Some(&b), &reg)).contains("AMK_FUSED_EXACT"));
    // A FUSED task may run any op's loop: no claim.
    let mut f = b.clone();
    f.tasks[0].op = Opcode::FUSED;
    assert!(!fused_exact(&f, &reg, 8));
    assert!(TILE_HELPERS.contains("(AMK_FUSED_EXACT || v < nvec)"));
    // Loads before the wait: SmolLM2's bf16 rows are one pass (72 or 192 vectors; 96 a pass of
    // a two-row unit at 6 vectors a lane), the 1B's Q/K/V rows (256 vectors) are not, and an
    // f32 row never takes the 16-bit path.
    use amk_backend_cuda::loops::row_pre;
    assert!(row_pre(&s, &reg, 6));
    assert!(!row_pre(&s, &reg, 4)); // a pass of 64 vectors a row of a two-row unit
    assert!(!row_pre(&b, &reg, 8));
    assert!(!row_pre(&program("llama-3.1-8b", DType::BF16), &reg, 8));
    assert!(!row_pre(&program("smollm2-135m", DType::F32), &reg, 6));
    assert!(!row_pre(&program("smollm2-135m", DType::F16), &reg, 2)); // one vector a lane
    assert!(row_pre(&program("smollm2-135m", DType::F16), &reg, 6));
    assert!(head(opts.knobs(Some(&s), &reg)).contains("#define AMK_ROW_PRE 1\n"));
    assert!(!head(opts.knobs(Some(&b), &reg)).contains("AMK_ROW_PRE"));
    let off = CudaOptions {
        defines: amk_backend_cuda::parse_defines("AMK_ROW_PRE=0"),
        ..CudaOptions::default()
    };
    let h = head(off.knobs(Some(&s), &reg));
    assert_eq!(h.matches("#define AMK_ROW_PRE").count(), 1, "{h}");
    assert!(h.contains("#define AMK_ROW_PRE 0\n"), "{h}");
    assert!(KNOBS.contains("#ifndef AMK_ROW_PRE\n#define AMK_ROW_PRE 0\n"));
    // Two units a warp at once where every row is 4 KB or more: the 1B's and the 8B's (bf16
    // and f32), not SmolLM2's (1,152 and 3,072 bytes in bf16; 2,304 and 6,144 in f32: its
    // shortest decides); a user's define wins.
    use amk_backend_cuda::loops::pairs;
    assert!(pairs(&b, &reg) && pairs(&program("llama-3.1-8b", DType::BF16), &reg));
    assert!(pairs(&program("llama-3.2-1b", DType::F32), &reg));
    assert!(!pairs(&s, &reg) && !pairs(&program("smollm2-135m", DType::F32), &reg));
    let h = head(opts.knobs(Some(&b), &reg));
    assert!(h.contains("#define AMK_FUSED_PAIR 7\n"), "{h}");
    assert!(h.contains("#define AMK_FUSED_PAIR_MIN 2\n"), "{h}");
    let h = head(opts.knobs(Some(&s), &reg));
    assert!(!h.contains("#define AMK_FUSED_PAIR"), "{h}");
    let one = CudaOptions {
        defines: amk_backend_cuda::parse_defines("AMK_FUSED_PAIR=1"),
        ..CudaOptions::default()
    };
    let h = head(one.knobs(Some(&b), &reg));
    assert_eq!(h.matches("#define AMK_FUSED_PAIR ").count(), 1, "{h}");
    assert!(
        h.contains("#define AMK_FUSED_PAIR 1\n") && h.contains("#define AMK_FUSED_PAIR_MIN 2\n")
    );
    assert!(KNOBS.contains("#ifndef AMK_FUSED_PAIR\n#define AMK_FUSED_PAIR 1\n"));
    assert!(KNOBS.contains("#ifndef AMK_FUSED_PAIR_MIN\n#define AMK_FUSED_PAIR_MIN 16\n"));
}

/// A program's kernel handles inline only the float dtypes its buffers hold: a bf16 program
/// leaves out the F32 and F16 branches — its attention split over the SMs too, whose F32
/// partials only the split-KV ops touch (`CudaSource::f32_direct`) — and keeps them when an
/// F32 buffer meets another op; an f32 one leaves out the 16-bit ones; the kernel of every op
/// keeps all three; a user's define wins.
#[test]
fn a_program_kernel_handles_only_its_float_dtypes() {
    use amk_backend_cuda::CudaOptions;
    use amk_backend_cuda::assemble::DEVICE_HELPERS;
    let reg = registry();
    let head = |k: Knobs| kernel_head(&reg, k);
    let opts = CudaOptions {
        defines: Vec::new(),
        ..CudaOptions::default()
    };
    let split = amk_model_llama::lower::tuned_schedule();
    let split_bf16 = smollm2_program(DType::BF16, &split);
    let h = head(opts.knobs(Some(&split_bf16), &reg));
    assert!(
        h.contains("#define AMK_NO_F32 1\n") && h.contains("#define AMK_NO_F16 1\n"),
        "{h}"
    );
    // The partials read by a COPY as well: the F32 branches stay.
    let mut copied = split_bf16.clone();
    let parts = (copied.buffers.iter())
        .position(|b| b.name.ends_with(".partials"))
        .unwrap() as u32;
    let t = (copied.tasks.iter_mut())
        .find(|t| t.op == Opcode::ATTENTION_SPLIT)
        .unwrap();
    t.op = Opcode::COPY;
    t.inputs = vec![parts];
    let h = head(opts.knobs(Some(&copied), &reg));
    assert!(!h.contains("AMK_NO_F32"), "{h}");
    let mut tuned = split.clone();
    tuned.tiling.retain(|(g, _)| g != "attention");
    tuned
        .tiling
        .push(("attention".into(), vec![("own_sms".into(), 1)]));
    let h = head(opts.knobs(Some(&smollm2_program(DType::BF16, &tuned)), &reg));
    assert!(
        h.contains("#define AMK_NO_F32 1\n") && h.contains("#define AMK_NO_F16 1\n"),
        "{h}"
    );
    assert!(!h.contains("AMK_NO_BF16"), "{h}");
    let h = head(opts.knobs(Some(&smollm2_program(DType::F32, &tuned)), &reg));
    assert!(
        h.contains("#define AMK_NO_F16 1\n") && h.contains("#define AMK_NO_BF16 1\n"),
        "{h}"
    );
    assert!(!h.contains("AMK_NO_F32"), "{h}");
    assert!(!head(opts.knobs(None, &reg)).contains("AMK_NO_"));
    let user = CudaOptions {
        defines: amk_backend_cuda::parse_defines("AMK_NO_F16=0"),
        ..CudaOptions::default()
    };
    let h = head(user.knobs(Some(&smollm2_program(DType::BF16, &tuned)), &reg));
    assert_eq!(h.matches("AMK_NO_F16").count(), 1, "{h}");
    // Every inline branch the defines fold has a fallback that is right for any dtype.
    assert!(DEVICE_HELPERS.contains("if (AMK_IS_F16(dt)) return amk_f16_to_f32"));
    assert!(DEVICE_HELPERS.contains("  return amk_ld_slow(b, i);"));
    assert!(
        ATTENTION_HELPERS
            .contains("else if (AMK_IS_F32(dt)) ATT_TINY(AMK_F32);\n    else att_heads(")
    );
}

/// The conformance configurations the GPU tests and their compile pass share: the defaults
/// and the paired loops, each a different kernel for a fused program.
#[test]
fn the_conformance_configurations_are_two_kernels() {
    use amk_backend_cuda::test_support::{conformance_configs, conformance_options};
    let reg = registry();
    let p = smollm2_program(DType::BF16, &amk_model_llama::lower::tuned_schedule());
    let configs = conformance_configs();
    let names: Vec<&str> = configs.iter().map(|(n, _)| *n).collect();
    assert_eq!(names, ["conformance", "conformance_paired"]);
    let mut sources: Vec<String> = configs
        .iter()
        .map(|(_, o)| {
            megakernel_source(&reg, o.knobs(Some(&p), &reg))
                .unwrap()
                .source
        })
        .collect();
    sources.sort();
    sources.dedup();
    assert_eq!(
        sources.len(),
        2,
        "each configuration is a kernel of its own"
    );
    assert!(!conformance_options("conformance_paired").defines.is_empty());
    assert!(conformance_options("no such").defines.is_empty());
}

#[test]
fn host_buffers_go_to_host_memory_and_carried_reads_are_launch_constant() {
    let mut p = toy(&[Some(0), Some(1), None]);
    let last = p.buffers.len() - 1;
    p.buffers[last].space = MemSpace::HOST;
    let t = tables::build(&p, &registry(), 132).unwrap();
    match t.placement[last] {
        Placement::Host { offset, bytes } => {
            assert_eq!((offset, bytes), (0, p.buffers[last].nbytes()));
            assert!(t.host_bytes >= bytes);
        }
        other => panic!("buffer {last} placed at {other:?}"),
    }
    // Task 1's first input as a carried read: only that task's slot is marked.
    let descs = t.buffers.clone();
    let mut per_task = tables::task_buffers(&t.instructions, &descs);
    let b = t.instructions[1].inputs[0] as u32;
    let before: Vec<i32> = per_task.iter().map(|d| d.flags).collect();
    tables::mark_carried_reads(&mut per_task, &t.instructions, &[(1, b)]);
    for (k, d) in per_task.iter().enumerate() {
        let marked = k == abi::TASK_SLOTS;
        assert_eq!(
            d.flags & abi::BUF_LAUNCH_CONST != 0,
            marked || before[k] & abi::BUF_LAUNCH_CONST != 0,
            "slot {k}"
        );
    }
}

/// A FUSED task's recipe laid out as step records through the registry's expansion (the
/// backend names no op crate): GELU of input 0 into a fresh zeroed F32 scratch of the output's
/// shape, then MUL by 0.5 of that scratch into the task's output.
#[test]
fn a_fused_task_expands_into_step_records() {
    let mut p = Program::new();
    let x = p.new_buffer("x", BufferKind::IO_INPUT, DType::F32, &[2, 3]);
    let y = p.new_buffer("y", BufferKind::IO_OUTPUT, DType::F32, &[2, 3]);
    let c = p.new_counter("y");
    let pr = params(&[("recipe", amk_conformance::r#gen::gelu_scale_recipe())]);
    p.push_task(Opcode::FUSED, &[x], &[y], c, &[], pr, "fused");
    let t = tables::build(&p, &registry(), 132).unwrap();
    assert_eq!(t.fused_off, [0, 2]);
    let (gelu, mul) = (&t.fused_steps[0], &t.fused_steps[1]);
    let scratch = gelu.outputs[0];
    assert_eq!(
        (gelu.op, gelu.n_inputs, gelu.inputs[0]),
        (Opcode::GELU.0 as i32, 1, x as i32)
    );
    assert_eq!(
        scratch as usize,
        p.buffers.len(),
        "a scratch buffer after the program's"
    );
    assert_eq!(gelu.sm, abi::STEP_ZERO_OUTPUTS);
    assert_eq!(t.buffers[scratch as usize].dtype, DType::F32.code() as i32);
    assert_eq!(&t.buffers[scratch as usize].shape[..2], &[2, 3]);
    assert_eq!(
        (mul.op, mul.inputs[0], mul.outputs[0]),
        (Opcode::MUL.0 as i32, scratch, y as i32)
    );
    assert_eq!(mul.params.scale, 0.5);
    // A recipe the structural rule refuses is an error naming the task, never a layout.
    let mut bad = p.clone();
    bad.tasks[0].params = params(&[("recipe", Value::Object(Map::new()))]);
    let err = tables::build(&bad, &registry(), 132).unwrap_err();
    assert!(
        err.contains("FUSED task 0") && err.contains("steps"),
        "{err}"
    );
}

/// A LINEAR_TILE program's kernel holds the 256-row tile (`AMK_LT_256`, the op's
/// `task_defines`) only when a task takes more than 128 rows; a user's define of that name wins.
#[test]
fn task_defines_follow_the_programs_tasks() {
    let reg = registry();
    let linear = |rows: i64| {
        let mut p = Program::new();
        let x = p.new_buffer("x", BufferKind::IO_INPUT, DType::BF16, &[300, 64]);
        let w = p.new_buffer("w", BufferKind::WEIGHT, DType::BF16, &[128, 64]);
        p.buffers[w as usize].source = Some("w".into());
        let y = p.new_buffer("y", BufferKind::IO_OUTPUT, DType::BF16, &[300, 128]);
        let c = p.new_counter("y");
        for m0 in (0..300).step_by(rows as usize) {
            let pr = params(&[
                ("K", Value::Int(64)),
                ("m_off", Value::Int(m0)),
                ("M_tile", Value::Int(rows.min(300 - m0))),
                ("n_off", Value::Int(0)),
                ("N_tile", Value::Int(128)),
            ]);
            p.push_task(Opcode::LINEAR_TILE, &[x, w], &[y], c, &[], pr, "lin");
        }
        p
    };
    let define = "#define AMK_LT_256 1\n";
    assert!(!program_kernel(&reg, &linear(128)).source.contains(define));
    let wide = linear(150);
    assert_eq!(
        amk_backend_cuda::task_defines(&wide, &reg),
        vec![("AMK_LT_256".to_string(), "1".to_string())]
    );
    let src = program_kernel(&reg, &wide).source;
    assert_eq!(src.matches(define).count(), 1);
    // A norm keeps a task on the 128-row tiles: it asks for nothing.
    let mut normed = wide.clone();
    for t in &mut normed.tasks {
        t.params.insert("norm", Value::Int(1));
    }
    assert!(amk_backend_cuda::task_defines(&normed, &reg).is_empty());
    let off = program_kernel_with(&reg, &wide, vec![("AMK_LT_256".into(), "0".into())]);
    assert!(!off.source.contains(define));
    // The user's define, then the op's own default (`#ifndef`), which it overrides.
    assert_eq!(off.source.matches("#define AMK_LT_256 0\n").count(), 2);
}

/// ATTENTION_SPLIT's short path (`AMK_AS_SHORT_ROWS`) is in the kernel of the short-context
/// program (one normalised task a KV head) and not in the split program's (partials only);
/// a user's 0 wins. Where the tensor-core path takes longer rows (head_dim 64, at most 4 query
/// heads a KV head: SmolLM2's and the 1B's groupings) it goes to 32 rows; Llama-3.1-8B's
/// (head_dim 128, 4 a KV head) keeps 64 (docs/perf-notes.md rounds 54 and 55).
#[test]
fn the_short_attention_path_is_only_in_short_context_kernels() {
    use amk_model_llama::lower::{short_context_schedule, tuned_schedule};
    let reg = registry();
    let short_schedule = short_context_schedule(&tuned_schedule()).unwrap();
    let split = smollm2_program(DType::BF16, &tuned_schedule());
    let short = smollm2_program(DType::BF16, &short_schedule);
    let define = "#define AMK_AS_SHORT_ROWS 32\n";
    let asked = |p: &Program| amk_backend_cuda::task_defines(p, &reg);
    let rows = |p: &Program| -> Vec<String> {
        asked(p)
            .into_iter()
            .filter(|(n, _)| n == "AMK_AS_SHORT_ROWS")
            .map(|(_, v)| v)
            .collect()
    };
    assert!(rows(&split).is_empty());
    assert!(!program_kernel(&reg, &split).source.contains(define));
    assert_eq!(rows(&short), ["32"]);
    assert_eq!(
        program_kernel(&reg, &short).source.matches(define).count(),
        1
    );
    let off = program_kernel_with(&reg, &short, vec![("AMK_AS_SHORT_ROWS".into(), "0".into())]);
    assert!(!off.source.contains(define));
    let short_1b = preset_program("llama-3.2-1b", DType::BF16, &short_schedule);
    assert_eq!(rows(&short_1b), ["32"]);
    let short_8b = preset_program("llama-3.1-8b", DType::BF16, &short_schedule);
    assert_eq!(rows(&short_8b), ["64"]);
}
