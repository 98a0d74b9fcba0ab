//! Lowering: every knob yields a valid program; counts match the reference lowering's
//! published formulas; positions are device data (every position-dependent task reads the
//! `pos` buffer, attention windows are static, nothing is patched per token); a program lowered
//! with a decode loop ends in its NEXT_TOKEN tail. The lowered programs are run against an f64
//! forward pass through the engine in `models/engine/tests/lowering.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test file

use amk_backend_cpu::CpuBackend;
use amk_core::{
    BufferId, BufferKind, DType, ErrorKind, GpuTarget, MemSpace, Opcode, PageStrategy, Program,
    Registry, ScheduleConfig, Session, SmAssignment, Tensor, WeightStore, decode,
};
use amk_model_llama::config::ModelConfig;
use amk_model_llama::lower::{
    DecodeLoop, LowerOptions, StatsLayout, lower, shard_range, stats_layout, tuned_schedule,
};
use amk_model_llama::model::{Model, ModelFormat, tensor_names};
use rstest::rstest;
#[path = "support/shared.rs"]
mod shared;
use shared::*;

/// Zero weights of the right shapes (for counting only; never run).
fn shaped_model(c: ModelConfig) -> Model {
    let mut w = WeightStore::new();
    for (name, shape) in tensor_names(&c) {
        w.insert(name, Tensor::zeros(DType::F32, &shape));
    }
    Model::new(c, w, None, "shaped", ModelFormat::Hf).unwrap()
}

/// Index of the largest logit (lowest index on ties; NaN never wins): SAMPLE_ARGMAX's rule.
fn host_argmax(logits: &[f32]) -> usize {
    let mut best = (0, f32::NEG_INFINITY);
    for (i, &x) in logits.iter().enumerate() {
        if x > best.1 {
            best = (i, x);
        }
    }
    best.0
}

fn i32_scalar(v: i64) -> Tensor {
    Tensor::from_i64(DType::I32, &[1], &[v]).unwrap()
}

/// The one buffer named `name`.
fn named(p: &Program, name: &str) -> BufferId {
    let ids: Vec<BufferId> = (p.buffers.iter())
        .filter(|b| b.name == name)
        .map(|b| b.id)
        .collect();
    assert_eq!(ids.len(), 1, "buffers named '{name}': {ids:?}");
    ids[0]
}

/// A task's `(kv_start, kv_len)`.
fn window(t: &amk_core::Task) -> (u64, u64) {
    let get = |k: &str| {
        t.param_i64(k)
            .unwrap_or_else(|| panic!("{}: no {k}", t.label)) as u64
    };
    (get("kv_start"), get("kv_len"))
}

/// The positions facts of a lowered program with a `max_seq`-row cache and `parts` split-KV
/// shards: the `pos` buffer is one I32 element; every task that depends on the position reads
/// it in its position slot (KV_APPEND 3rd input, ROPE 2nd, the reshape + ROPE FUSED task 3rd,
/// QKV_ROPE_APPEND 5th, ATTENTION_TILE 4th, ATTENTION_GEMV last, ATTENTION_SPLIT 4th,
/// COMBINE_GEMV last, NEXT_TOKEN 2nd, which also
/// writes it); no other task touches it; no task has a `pos` param; the attention's windows are
/// static: the whole cache, or the shards' fixed slices, which tile it. Returns how many tasks
/// read the position.
fn check_positions(p: &Program, max_seq: u64, parts: u64) -> usize {
    let pos = named(p, decode::POS);
    let pb = &p.buffers[pos as usize];
    assert_eq!((pb.dtype, pb.shape.as_slice()), (DType::I32, &[1u64][..]));
    let mut readers = 0;
    let mut shards: std::collections::BTreeMap<String, Vec<(u64, u64)>> = Default::default();
    for t in &p.tasks {
        assert!(
            !t.params.contains_key("pos"),
            "task {} ('{}') has a position param",
            t.id,
            t.label
        );
        let slot = match t.op {
            Opcode::KV_APPEND => Some(2),
            Opcode::ROPE => Some(1),
            Opcode::QKV_ROPE_APPEND => Some(4),
            Opcode::ATTENTION_TILE => Some(3),
            Opcode::ATTENTION_GEMV => Some(t.inputs.len() - 1),
            Opcode::ATTENTION_SPLIT => Some(3),
            Opcode::COMBINE_GEMV => Some(t.inputs.len() - 1),
            Opcode::ATTENTION_MERGE => Some(1),
            Opcode::NEXT_TOKEN => Some(1),
            Opcode::FUSED if t.label.contains("reshape_rope") => Some(2),
            _ => None,
        };
        match slot {
            Some(i) => {
                assert_eq!(
                    t.inputs.get(i),
                    Some(&pos),
                    "task {} ('{}', {}) does not read the position in input {i}: {:?}",
                    t.id,
                    t.label,
                    t.op,
                    t.inputs
                );
                assert_eq!(
                    t.inputs.iter().filter(|&&b| b == pos).count(),
                    1,
                    "{}",
                    t.label
                );
                readers += 1;
            }
            None => assert!(
                !t.inputs.contains(&pos),
                "task {} ('{}', {}) reads the position",
                t.id,
                t.label,
                t.op
            ),
        }
        let writes_pos = t.outputs.contains(&pos);
        assert_eq!(writes_pos, t.op == Opcode::NEXT_TOKEN, "{}", t.label);
        if t.op == Opcode::NEXT_TOKEN {
            assert_eq!(
                t.outputs[0], pos,
                "NEXT_TOKEN advances the position in place"
            );
        }
        match t.op {
            Opcode::ATTENTION_GEMV => {
                assert_eq!(window(t), (0, max_seq), "{}", t.label);
                assert!(t.param_i64("flags").is_none(), "{}", t.label);
            }
            Opcode::ATTENTION_TILE if t.param_i64("flags").is_none() => {
                assert_eq!(parts, 1, "{}: a whole attention in a split KV", t.label);
                assert_eq!(window(t), (0, max_seq), "{}", t.label);
            }
            Opcode::ATTENTION_TILE => {
                assert_eq!(t.param_i64("flags"), Some(2), "{}", t.label);
                let (layer, i) = t.label.split_once(".attn_shard").unwrap();
                let i: u64 = i.parse().unwrap();
                assert_eq!(window(t), shard_range(max_seq, i, parts), "{}", t.label);
                shards.entry(layer.to_string()).or_default().push(window(t));
            }
            _ => {}
        }
    }
    // Each layer's shards tile the cache: consecutive slices from row 0 to max_seq.
    for (layer, mut w) in shards {
        assert_eq!(w.len() as u64, parts, "{layer}");
        w.sort_unstable();
        let mut next = 0;
        for (start, len) in w {
            assert_eq!(start, next, "{layer}: shards leave a gap or overlap");
            next = start + len;
        }
        assert_eq!(next, max_seq, "{layer}: the shards do not cover the cache");
    }
    readers
}

/// Every task of `p` that reaches task `sink` through the counters (its own waits, their
/// producers' waits, …), `sink` included.
fn reaching(p: &Program, sink: usize) -> Vec<bool> {
    let mut producers: std::collections::HashMap<u32, Vec<usize>> = Default::default();
    for (i, t) in p.tasks.iter().enumerate() {
        producers.entry(t.out_counter).or_default().push(i);
    }
    let mut seen = vec![false; p.tasks.len()];
    seen[sink] = true;
    let mut stack = vec![sink];
    while let Some(i) = stack.pop() {
        for w in &p.tasks[i].waits {
            for &j in producers.get(&w.counter).map_or(&[][..], Vec::as_slice) {
                if !seen[j] {
                    seen[j] = true;
                    stack.push(j);
                }
            }
        }
    }
    seen
}

/// The schedules of the position and decode-loop tests: reference, split KV (ragged and
/// with an empty shard), fused RoPE, every fusion, the attention fused (alone and with every
/// other fusion), the tuned schedule; with their split-KV part counts.
fn schedules() -> Vec<(&'static str, ScheduleConfig, u64)> {
    let split = |parts: i64, fusion: bool| {
        schedule(
            &[("attention", &[("n_partitions", parts)])],
            fusion,
            SmAssignment::LoadBalance,
            PageStrategy::GraphColor,
        )
    };
    let mut tuned = tuned_schedule();
    tuned.tiling.retain(|(g, _)| g != "attention");
    let mut tuned_split = tuned.clone();
    tuned_split.tiling.push((
        "attention".into(),
        vec![("own_sms".into(), 2), ("n_partitions".into(), 4)],
    ));
    vec![
        ("reference", ScheduleConfig::default(), 1),
        ("split3", split(3, false), 3),
        ("split8_fused_rope", split(8, true), 8),
        (
            "all_fused",
            all_fused(&[], SmAssignment::LoadBalance, PageStrategy::GraphColor),
            1,
        ),
        (
            "all_fused_split3",
            all_fused(
                &[
                    ("gemv", &[("N_tile", 6)]),
                    ("attention", &[("n_partitions", 3)]),
                ],
                SmAssignment::RoundRobin,
                PageStrategy::Linear,
            ),
            3,
        ),
        (
            "attention_fused",
            attention_fused(
                &[("gemv", &[("N_tile", 8)])],
                SmAssignment::LoadBalance,
                PageStrategy::GraphColor,
            ),
            1,
        ),
        ("attention_fused_alone", attention_fused_alone(), 1),
        ("tuned", tuned_schedule(), 1),
        (
            "split_kv",
            schedule(
                &[("attention", &[("split_kv", 4), ("split_chunk", 2)])],
                false,
                SmAssignment::LoadBalance,
                PageStrategy::GraphColor,
            ),
            1,
        ),
        ("tuned_split_kv", tuned_split_kv(4, 3), 1),
        (
            "split_kv_merged",
            schedule(
                &[(
                    "attention",
                    &[("split_kv", 4), ("split_chunk", 2), ("merge_heads", 3)],
                )],
                true,
                SmAssignment::LoadBalance,
                PageStrategy::GraphColor,
            ),
            1,
        ),
        ("tuned_without_own_sms", tuned, 1),
        ("tuned_split4_on_two_sms", tuned_split, 4),
    ]
}

/// The models of those tests: GQA tied, and MQA untied with Q/K/V biases (no QKV_ROPE_APPEND).
fn position_models() -> Vec<Model> {
    let mut biased = cfg(2, 32, 4, 1, 8, 48, 40);
    biased.attention_bias = true;
    biased.tie_word_embeddings = false;
    vec![
        shaped_model(cfg(2, 32, 4, 2, 8, 48, 40)),
        shaped_model(biased),
    ]
}

/// The fused lowering replaces the unfused ops by RMSNORM_GEMV, GATE_UP_SILU, QKV_ROPE_APPEND
/// (models without Q/K/V biases) and ATTENTION_GEMV, in fewer tasks; the programs' logits are
/// compared bit for bit in `models/engine/tests/lowering.rs`.
#[rstest]
#[case::f32(DType::F32, false)]
#[case::bf16(DType::BF16, false)]
#[case::bf16_biases(DType::BF16, true)]
fn fused_lowering_replaces_the_unfused_ops(#[case] dtype: DType, #[case] biases: bool) {
    let mut c = cfg(2, 32, 4, 2, 8, 48, 40);
    c.attention_bias = biases;
    c.tie_word_embeddings = !biases;
    let model = Model::random(c, 13).unwrap();
    let reg = registry();
    let tiling: &[(&str, &[(&str, i64)])] = &[("gemv", &[("N_tile", 6)])];
    // The residual fusion changes bf16 roundings (one instead of two): both programs keep it.
    let plain = ScheduleConfig {
        fusion_grouping: vec![vec!["gemv".into(), "add".into()]],
        ..schedule(tiling, false, SmAssignment::LoadBalance, PageStrategy::None)
    };
    let fused = attention_fused(tiling, SmAssignment::LoadBalance, PageStrategy::None);
    let opts = LowerOptions {
        dtype,
        max_seq: Some(16),
        ..LowerOptions::default()
    };
    let a = lower(&model, &plain, &h100(), &opts).unwrap();
    let b = lower(&model, &fused, &h100(), &opts).unwrap();
    assert!(b.program.tasks.len() < a.program.tasks.len());
    // Both read the position from the `pos` buffer: the unfused program in its ROPE,
    // KV_APPEND and attention tasks, the fused one in its Q/K/V tiles (when fused) and in
    // every ATTENTION_GEMV tile.
    let tiles = |l: &amk_model_llama::lower::Lowered, op: Opcode| {
        l.program.tasks.iter().filter(|t| t.op == op).count()
    };
    let (ra, rb) = (
        check_positions(&a.program, 16, 1),
        check_positions(&b.program, 16, 1),
    );
    assert_eq!(
        ra,
        2 * (2 + 2 + 1),
        "per layer: ROPE q/k, KV_APPEND k/v, the attention"
    );
    let qkv = if biases {
        2 * 2 + 2 * 2
    } else {
        tiles(&b, Opcode::QKV_ROPE_APPEND)
    };
    assert_eq!(rb, qkv + tiles(&b, Opcode::ATTENTION_GEMV), "{rb} readers");
    for l in [&a, &b] {
        let r = amk_core::validate(&l.program, &reg);
        assert!(r.ok(), "{}", r.report());
    }
    let ops = |l: &amk_model_llama::lower::Lowered| {
        l.program
            .tasks
            .iter()
            .map(|t| t.op)
            .collect::<std::collections::BTreeSet<_>>()
    };
    let want: &[Opcode] = if biases {
        &[
            Opcode::RMSNORM_GEMV,
            Opcode::GATE_UP_SILU,
            Opcode::ATTENTION_GEMV,
        ]
    } else {
        &[
            Opcode::RMSNORM_GEMV,
            Opcode::GATE_UP_SILU,
            Opcode::QKV_ROPE_APPEND,
            Opcode::ATTENTION_GEMV,
        ]
    };
    for op in want {
        assert!(ops(&b).contains(op), "the fused lowering uses {op}");
        assert!(!ops(&a).contains(op));
    }
    assert!(
        !ops(&b).contains(&Opcode::ATTENTION_TILE),
        "the attention is fused away"
    );
    if !biases {
        for op in [
            Opcode::RMSNORM,
            Opcode::SILU_MUL,
            Opcode::ROPE,
            Opcode::KV_APPEND,
        ] {
            assert!(!ops(&b).contains(&op), "{op} is fused away");
        }
    }
}

/// A program without a decode loop, stepped by the host on a CPU session (`token_id`, `pos`
/// and `reshape_id0` set as IO inputs each step): its SAMPLE_ARGMAX output `next_token` is the
/// host's argmax of its logits at every position, and the position input alone moves the
/// pass on (the same token at two positions gives different logits; no param changes).
#[test]
fn argmax_output_equals_host_argmax() {
    let model = Model::random(cfg(1, 32, 4, 2, 8, 48, 40), 3).unwrap();
    let reg = registry();
    let lowered = lower(
        &model,
        &ScheduleConfig::default(),
        &h100(),
        &LowerOptions {
            max_seq: Some(16),
            ..LowerOptions::default()
        },
    )
    .unwrap();
    let p = &lowered.program;
    assert!(p.step_loop.is_none());
    let next = named(p, "next_token");
    assert_eq!(p.buffers[next as usize].kind, BufferKind::IO_OUTPUT);
    assert_eq!(
        (
            p.tasks.last().unwrap().op,
            p.tasks.last().unwrap().outputs[0]
        ),
        (Opcode::SAMPLE_ARGMAX, next)
    );
    for name in [decode::TOKEN, decode::POS, decode::RESHAPE_ID] {
        assert_eq!(
            p.buffers[named(p, name) as usize].kind,
            BufferKind::IO_INPUT
        );
    }
    let vp = amk_core::validate_owned(lowered.program.clone(), &reg)
        .map_err(|r| r.report())
        .unwrap();
    let mut s = CpuBackend::default()
        .load_session(&vp, &lowered.weights, &reg)
        .unwrap();
    let params: Vec<_> = s.program().tasks.iter().map(|t| t.params.clone()).collect();
    let mut seen = Vec::new();
    for (pos, t) in [5u32, 17, 0, 29, 5, 11].into_iter().enumerate() {
        let out = s
            .step(&[
                (decode::TOKEN, i32_scalar(i64::from(t))),
                (decode::POS, i32_scalar(pos as i64)),
                (decode::RESHAPE_ID, i32_scalar(0)),
            ])
            .unwrap();
        let logits = out.get(decode::LOGITS).unwrap().to_f32_vec();
        let chosen = out.get("next_token").unwrap().get_i64(0);
        assert_eq!(chosen as usize, host_argmax(&logits), "position {pos}");
        seen.push(logits);
    }
    assert_ne!(
        seen[0], seen[4],
        "token 5 at positions 0 and 4 gives the same logits"
    );
    let after: Vec<_> = s.program().tasks.iter().map(|t| t.params.clone()).collect();
    assert_eq!(params, after, "stepping changed a param");
}

/// Counts of the reference lowering (docs/models.md, "The reference lowering"): toy 2L untied
/// (66 / 48 / 42 tasks at auto / N_tile 64 / 128; 65 buffers; 41 counters), Llama h512 L2
/// (458 / 274 / 182), and the SmolLM2-135M shape at N_tile 128 (1716 tasks, 848 buffers, 573
/// counters).
#[rstest]
#[case::toy_auto(cfg(2, 64, 4, 2, 16, 128, 256), false, None, 66, 65, 41)]
#[case::toy_64(cfg(2, 64, 4, 2, 16, 128, 256), false, Some(64), 48, 65, 41)]
#[case::toy_128(cfg(2, 64, 4, 2, 16, 128, 256), false, Some(128), 42, 65, 41)]
#[case::h512_auto(cfg(2, 512, 8, 2, 64, 2048, 32000), false, None, 458, 65, 41)]
#[case::h512_64(cfg(2, 512, 8, 2, 64, 2048, 32000), false, Some(64), 274, 65, 41)]
#[case::h512_128(cfg(2, 512, 8, 2, 64, 2048, 32000), false, Some(128), 182, 65, 41)]
#[case::smollm2_128(cfg(30, 576, 9, 3, 64, 1536, 49152), true, Some(128), 1716, 848, 573)]
fn counts_match_the_reference_lowering(
    #[case] mut c: ModelConfig,
    #[case] tied: bool,
    #[case] n_tile: Option<i64>,
    #[case] tasks: usize,
    #[case] buffers: usize,
    #[case] counters: usize,
) {
    c.tie_word_embeddings = tied;
    c.max_position_embeddings = 256;
    let model = shaped_model(c);
    let tiling: Vec<(&str, &[(&str, i64)])> = match n_tile {
        Some(64) => vec![("gemv", &[("N_tile", 64)])],
        Some(128) => vec![("gemv", &[("N_tile", 128)])],
        _ => vec![],
    };
    let sc = schedule(&tiling, false, SmAssignment::RoundRobin, PageStrategy::None);
    let opts = LowerOptions {
        argmax: false,
        ..LowerOptions::default()
    };
    let p = lower(&model, &sc, &h100(), &opts).unwrap().program;
    assert_eq!(
        (p.tasks.len(), p.buffers.len(), p.counters.len()),
        (tasks, buffers, counters)
    );
    let r = amk_core::validate(&p, &registry());
    assert!(r.ok(), "{}", r.report());
}

/// Positions are device data: in every schedule (split KV, fused RoPE, every fusion, the
/// attention fused, tuned), with and without a decode loop, and for models with and without
/// Q/K/V biases, every task that depends on the position reads the `pos` buffer, no task has
/// a position param (so none is patched per token: `check_patch` refuses `pos` on every one of
/// them), and the attention's windows are static — `(0, max_seq)`, or the shards' slices.
#[test]
fn positions_are_read_from_the_pos_buffer_never_patched() {
    let reg = registry();
    let max_seq = 20;
    for model in position_models() {
        let biases = model.config.attention_bias;
        for (name, sc, parts) in schedules() {
            for decode_loop in [None, Some(DecodeLoop::default())] {
                let opts = LowerOptions {
                    max_seq: Some(max_seq),
                    decode_loop,
                    ..LowerOptions::default()
                };
                let l = lower(&model, &sc, &h100(), &opts).unwrap();
                assert_eq!(l.max_seq, max_seq);
                let what = format!("{name} biases={biases} loop={}", decode_loop.is_some());
                let readers = check_positions(&l.program, max_seq, parts);
                // Per layer at least the two appends (or the fused Q/K/V tiles) and the attention.
                assert!(readers >= 2 * 2, "{what}: {readers} position readers");
                let kv = (l.program.buffers.iter())
                    .filter(|b| b.kind == BufferKind::KV_CACHE)
                    .inspect(|b| assert_eq!(b.shape[0], max_seq, "{what}: {}", b.name))
                    .count();
                assert_eq!(kv, 2 * 2, "{what}");
                let vp = amk_core::validate_owned(l.program, &reg)
                    .map_err(|r| format!("{what}: {}", r.report()))
                    .unwrap();
                let p = vp.program();
                let pos = named(p, decode::POS);
                for t in p.tasks.iter().filter(|t| t.inputs.contains(&pos)) {
                    assert!(
                        vp.check_patch(&reg, &[(t.id, "pos", 3)]).is_err(),
                        "{what}: '{}' takes a position patch",
                        t.label
                    );
                }
            }
        }
    }
}

/// The attention fused into the output projection: every tile reads the position (its last
/// input) over the whole cache's static window, and a split KV (which the fused tiles cannot
/// compute) is a typed lowering error.
#[test]
fn attention_fused_tiles_read_the_position_and_refuse_split_kv() {
    let model = Model::random(cfg(2, 32, 4, 2, 8, 48, 40), 5).unwrap();
    let reg = registry();
    let sc = attention_fused(
        &[("gemv", &[("N_tile", 8)])],
        SmAssignment::LoadBalance,
        PageStrategy::GraphColor,
    );
    let opts = LowerOptions {
        max_seq: Some(12),
        ..LowerOptions::default()
    };
    let l = lower(&model, &sc, &h100(), &opts).unwrap();
    let pos = named(&l.program, decode::POS);
    let tiles: Vec<&amk_core::Task> = (l.program.tasks.iter())
        .filter(|t| t.op == Opcode::ATTENTION_GEMV)
        .collect();
    assert_eq!(tiles.len(), 2 * 4, "two layers of four tiles");
    for t in &tiles {
        assert_eq!(t.inputs.last(), Some(&pos), "tile '{}'", t.label);
        assert_eq!(window(t), (0, 12), "tile '{}'", t.label);
    }
    amk_core::validate_owned(l.program.clone(), &reg)
        .map_err(|r| r.report())
        .unwrap();
    let mut split = sc.clone();
    split
        .tiling
        .push(("attention".into(), vec![("n_partitions".into(), 2)]));
    let Err(err) = lower(&model, &split, &h100(), &opts) else {
        panic!("a split KV with the attention fused was accepted");
    };
    assert!(err.to_string().contains("n_partitions"), "{err}");
}

/// A program lowered with a decode loop: it has a step loop; `token_id`, `pos` and `halt` are
/// I32 STATE buffers; the NEXT_TOKEN task is the last, the only producer of the loop's gate,
/// reads the logits, the position and the control inputs (`prompt` of `max_seq`, `stop` of the
/// slots asked for, `limits`, `sampling`) and writes the position, the token, the halt word and
/// the `emitted` rows — the one buffer in host memory; every other task reaches it; `argmax`
/// is ignored (no SAMPLE_ARGMAX); the program validates; and the tasks before the tail are
/// the program lowered without the loop.
#[test]
fn a_decode_loop_program_ends_in_its_next_token_tail() {
    let reg = registry();
    let max_seq = 20;
    for model in position_models() {
        for (name, sc, _) in schedules() {
            let plain = LowerOptions {
                max_seq: Some(max_seq),
                argmax: false,
                ..LowerOptions::default()
            };
            let looped = LowerOptions {
                argmax: true,
                decode_loop: Some(DecodeLoop { stop_slots: 3 }),
                ..plain.clone()
            };
            let p = lower(&model, &sc, &h100(), &looped).unwrap().program;
            let sl = p
                .step_loop
                .unwrap_or_else(|| panic!("{name}: no step loop"));
            let kind = |n: &str| {
                let b = &p.buffers[named(&p, n) as usize];
                (b.kind, b.dtype, b.shape.clone(), b.space)
            };
            let state = |shape: &[u64]| (BufferKind::STATE, DType::I32, shape.to_vec());
            for n in [decode::TOKEN, decode::POS, decode::HALT] {
                let (k, d, s, _) = kind(n);
                assert_eq!((k, d, s), state(&[1]), "{name}: {n}");
            }
            assert_eq!(sl.halt, named(&p, decode::HALT), "{name}");
            let (k, d, s, space) = kind(decode::EMITTED);
            assert_eq!((k, d, s), state(&[max_seq, 2]), "{name}");
            assert_eq!(space, MemSpace::HOST, "{name}: emitted is host-mapped");
            let host: Vec<&str> = (p.buffers.iter())
                .filter(|b| b.space == MemSpace::HOST)
                .map(|b| b.name.as_str())
                .collect();
            assert_eq!(host, [decode::EMITTED], "{name}");
            let input = |dtype: DType, len: u64| (BufferKind::IO_INPUT, dtype, vec![len]);
            for (n, want) in [
                (decode::PROMPT, input(DType::I32, max_seq)),
                (decode::STOP, input(DType::I32, 3)),
                (decode::LIMITS, input(DType::I32, decode::LIMITS_LEN)),
                (decode::SAMPLING, input(DType::F32, decode::SAMPLING_LEN)),
            ] {
                let (k, d, s, _) = kind(n);
                assert_eq!((k, d, s), want, "{name}: {n}");
            }
            assert!(!p.buffers.iter().any(|b| b.name == "next_token"), "{name}");
            assert!(
                !p.tasks.iter().any(|t| t.op == Opcode::SAMPLE_ARGMAX),
                "{name}"
            );
            let vocab = model.config.vocab as u64;
            let stats = stats_layout(&sc, vocab);
            let n_stats = stats.map_or(0, |l| l.slots as usize);
            let tails: Vec<usize> = (0..p.tasks.len())
                .filter(|&i| p.tasks[i].op == Opcode::NEXT_TOKEN)
                .collect();
            assert_eq!(
                tails,
                [p.tasks.len() - 1],
                "{name}: NEXT_TOKEN is the last task"
            );
            let tail = &p.tasks[tails[0]];
            assert_eq!(tail.out_counter, sl.gate, "{name}");
            assert_eq!(
                p.tasks.iter().filter(|t| t.out_counter == sl.gate).count(),
                1,
                "{name}: the gate counts the tail alone"
            );
            let ids = |names: &[&str]| names.iter().map(|n| named(&p, n)).collect::<Vec<_>>();
            let mut tail_in = vec![
                decode::LOGITS,
                decode::POS,
                decode::PROMPT,
                decode::STOP,
                decode::LIMITS,
                decode::SAMPLING,
            ];
            if let Some(layout) = stats {
                tail_in.push("logit_stats");
                check_stats_tasks(&p, layout, vocab, tail, name);
            }
            assert_eq!(tail.inputs, ids(&tail_in), "{name}");
            assert_eq!(
                tail.outputs,
                ids(&[decode::POS, decode::TOKEN, decode::HALT, decode::EMITTED]),
                "{name}"
            );
            let reach = reaching(&p, tails[0]);
            for (t, r) in p.tasks.iter().zip(&reach) {
                assert!(
                    r,
                    "{name}: task {} ('{}') does not reach the tail",
                    t.id, t.label
                );
            }
            // The loop body is the plain program, plus the tail.
            let body = lower(&model, &sc, &h100(), &plain).unwrap().program;
            assert!(body.step_loop.is_none(), "{name}");
            for n in [decode::TOKEN, decode::POS] {
                assert_eq!(
                    body.buffers[named(&body, n) as usize].kind,
                    BufferKind::IO_INPUT,
                    "{name}: {n}"
                );
            }
            assert!(
                !(body.buffers.iter())
                    .any(|b| [decode::EMITTED, decode::HALT, decode::PROMPT]
                        .contains(&b.name.as_str())),
                "{name}"
            );
            assert_eq!(body.tasks.len() + n_stats + 1, p.tasks.len(), "{name}");
            for (a, b) in body.tasks.iter().zip(&p.tasks) {
                let key = |t: &amk_core::Task| {
                    (
                        t.op,
                        t.inputs.clone(),
                        t.outputs.clone(),
                        t.params.clone(),
                        t.label.clone(),
                    )
                };
                assert!(
                    key(a) == key(b),
                    "{name}: task {} ('{}') differs",
                    a.id,
                    a.label
                );
                assert_eq!(a.waits, b.waits, "{name}: '{}'", a.label);
            }
            amk_core::validate_owned(p, &reg)
                .map_err(|r| format!("{name}: {}", r.report()))
                .unwrap();
        }
    }
}

/// The tail's LOGIT_STATS tasks (`next_token.stats_slots`): the last before NEXT_TOKEN, one
/// a slot in order, each reading the logits and the limits after every LM-head tile and
/// writing its column of `logit_stats` (I32 `[4, slots]`, the slots covering the vocabulary
/// exactly, 8-aligned); the tail waits for all of them, and for nothing else.
fn check_stats_tasks(
    p: &Program,
    layout: StatsLayout,
    vocab: u64,
    tail: &amk_core::Task,
    name: &str,
) {
    let out = named(p, "logit_stats");
    let b = &p.buffers[out as usize];
    assert_eq!(
        (b.kind, b.dtype, b.shape.clone()),
        (BufferKind::ACTIVATION, DType::I32, vec![4, layout.slots]),
        "{name}"
    );
    assert_eq!(layout.cols % 8, 0, "{name}");
    assert!(
        layout.slots * layout.cols >= vocab && (layout.slots - 1) * layout.cols < vocab,
        "{name}: {layout:?} against {vocab}"
    );
    let n = layout.slots as usize;
    let first = p.tasks.len() - 1 - n;
    let logits = named(p, decode::LOGITS);
    let head: Vec<&amk_core::Task> = (p.tasks.iter())
        .filter(|t| t.outputs.contains(&logits))
        .collect();
    for (g, t) in p.tasks[first..first + n].iter().enumerate() {
        assert_eq!(t.op, Opcode::LOGIT_STATS, "{name}: '{}'", t.label);
        assert_eq!(t.inputs, [logits, named(p, decode::LIMITS)], "{name}");
        assert_eq!(t.outputs, [out], "{name}");
        assert_eq!(
            t.params.get("n_off"),
            Some(&amk_core::json::Value::Int(g as i64))
        );
        assert_eq!(
            t.params.get("cols"),
            Some(&amk_core::json::Value::Int(layout.cols as i64))
        );
        let w = |c, n: usize| amk_core::Wait {
            counter: c,
            threshold: n as i64,
        };
        assert_eq!(
            t.waits,
            [w(head[0].out_counter, head.len())],
            "{name}: a slot waits for every LM-head tile"
        );
        assert!(head.iter().all(|h| h.out_counter == head[0].out_counter));
    }
    let ctr = p.tasks[first].out_counter;
    let want = amk_core::Wait {
        counter: ctr,
        threshold: n as i64,
    };
    assert_eq!(tail.waits, [want], "{name}");
    assert_eq!(
        p.tasks.iter().filter(|t| t.out_counter == ctr).count(),
        n,
        "{name}"
    );
}

#[test]
fn bad_options_are_typed_errors() {
    let model = Model::random(cfg(1, 32, 4, 2, 8, 48, 40), 5).unwrap();
    let t = h100();
    let bad = [
        schedule(
            &[("gemv", &[("N_tiles", 8)])],
            false,
            SmAssignment::LoadBalance,
            PageStrategy::None,
        ),
        schedule(
            &[("mlp", &[("N_tile", 8)])],
            false,
            SmAssignment::LoadBalance,
            PageStrategy::None,
        ),
        schedule(
            &[("gemv", &[("N_tile", 0)])],
            false,
            SmAssignment::LoadBalance,
            PageStrategy::None,
        ),
        ScheduleConfig {
            fusion_grouping: vec![vec!["add".into(), "rmsnorm".into()]],
            ..ScheduleConfig::default()
        },
        // The kernel-build knobs, as the reference checks them before lowering.
        ScheduleConfig {
            threads_per_block: 7,
            ..ScheduleConfig::default()
        },
        ScheduleConfig {
            threads_per_block: 2048,
            ..ScheduleConfig::default()
        },
        ScheduleConfig {
            smem_bytes_per_block: -1,
            ..ScheduleConfig::default()
        },
        ScheduleConfig {
            smem_bytes_per_block: t.smem_bytes_per_block_optin + 1,
            ..ScheduleConfig::default()
        },
        ScheduleConfig {
            pipelining_depth: -3,
            ..ScheduleConfig::default()
        },
    ];
    for sc in bad {
        let e = lower(&model, &sc, &t, &LowerOptions::default()).unwrap_err();
        assert!(matches!(e, amk_model_llama::ModelError::Lower(_)), "{e}");
    }
    for decode_loop in [None, Some(DecodeLoop::default())] {
        let base = LowerOptions {
            decode_loop,
            ..LowerOptions::default()
        };
        for opts in [
            LowerOptions {
                max_seq: Some(0),
                ..base.clone()
            },
            LowerOptions {
                max_seq: Some(65),
                ..base.clone()
            },
            LowerOptions {
                dtype: DType::I8,
                ..base.clone()
            },
        ] {
            assert!(lower(&model, &ScheduleConfig::default(), &t, &opts).is_err());
        }
        // The position is no option any more: the cache's length bounds it, and a cache as
        // long as max_position_embeddings (64) is the default and accepted.
        for max_seq in [None, Some(64)] {
            let opts = LowerOptions {
                max_seq,
                ..base.clone()
            };
            let l = lower(&model, &ScheduleConfig::default(), &t, &opts).unwrap();
            assert_eq!(l.max_seq, 64);
            assert_eq!(
                l.program.meta.get("max_seq").and_then(|v| v.as_i64()),
                Some(64)
            );
        }
    }
}

/// Every knob combination on several shapes (MHA, GQA, MQA, biases, untied, odd widths),
/// with and without a decode loop, lowers to a program the validator accepts.
#[test]
fn every_knob_combination_validates() {
    let reg = registry();
    let t = h100();
    let mut shapes = vec![
        cfg(1, 24, 3, 3, 8, 40, 33),
        cfg(2, 32, 4, 2, 8, 48, 40),
        cfg(2, 32, 4, 1, 8, 48, 40),
        cfg(1, 48, 6, 2, 8, 100, 77),
    ];
    let mut biased = cfg(2, 32, 4, 2, 8, 48, 40);
    biased.attention_bias = true;
    biased.tie_word_embeddings = false;
    shapes.push(biased);
    let mut n = 0;
    for c in shapes {
        let model = shaped_model(c);
        for n_tile in [None, Some(8), Some(64)] {
            for parts in [1, 3] {
                for fusion in [false, true] {
                    for sm in [SmAssignment::RoundRobin, SmAssignment::LoadBalance] {
                        for pages in [
                            PageStrategy::None,
                            PageStrategy::Linear,
                            PageStrategy::GraphColor,
                        ] {
                            for dtype in [DType::F32, DType::BF16] {
                                let mut tiling: Vec<(&str, &[(&str, i64)])> = vec![];
                                let nt = n_tile.map(|v| [("N_tile", v)]);
                                if let Some(nt) = &nt {
                                    tiling.push(("gemv", nt));
                                }
                                let pp = [("n_partitions", parts)];
                                tiling.push(("attention", &pp));
                                let sc = schedule(&tiling, fusion, sm.clone(), pages);
                                for decode_loop in [None, Some(DecodeLoop::default())] {
                                    let opts = LowerOptions {
                                        dtype,
                                        max_seq: Some(20),
                                        argmax: true,
                                        decode_loop,
                                    };
                                    let p = lower(&model, &sc, &t, &opts).unwrap().program;
                                    assert_eq!(p.step_loop.is_some(), decode_loop.is_some());
                                    let r = amk_core::validate(&p, &reg);
                                    assert!(
                                        r.ok(),
                                        "{sc:?} {dtype} {decode_loop:?}: {}",
                                        r.report()
                                    );
                                    n += 1;
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    assert_eq!(n, 5 * 3 * 2 * 2 * 2 * 3 * 2 * 2);
}

#[test]
fn explicit_sm_map_is_used_and_checked() {
    let model = shaped_model(cfg(1, 32, 4, 2, 8, 48, 40));
    let t = h100();
    let probe = lower(
        &model,
        &ScheduleConfig::default(),
        &t,
        &LowerOptions::default(),
    )
    .unwrap()
    .program;
    let map: Vec<(u32, u32)> = (0..probe.tasks.len() as u32)
        .map(|i| (i, (i * 7) % 5))
        .collect();
    let sc = ScheduleConfig {
        sm_assignment: SmAssignment::Explicit(map),
        ..ScheduleConfig::default()
    };
    let p = lower(&model, &sc, &t, &LowerOptions::default())
        .unwrap()
        .program;
    assert!(
        p.tasks
            .iter()
            .enumerate()
            .all(|(i, t)| t.sm == Some(((i as i32) * 7) % 5))
    );
    assert!(amk_core::validate(&p, &registry()).ok());
    let short = ScheduleConfig {
        sm_assignment: SmAssignment::Explicit(vec![(0, 0)]),
        ..ScheduleConfig::default()
    };
    assert!(matches!(
        lower(&model, &short, &t, &LowerOptions::default()),
        Err(amk_model_llama::ModelError::Lower(_))
    ));
}

/// `check_patch` still serves params that are not positions (a tool moving an attention
/// window, say): patches are absolute (each is checked against the loaded program, so a
/// session applies it to the loaded params, not on top of the previous patch) and bound to
/// their program; region params are never patchable; unknown keys and tasks are refused.
#[test]
fn param_patches_are_absolute_and_bound_to_their_program() {
    let model = Model::random(cfg(1, 32, 4, 2, 8, 48, 40), 5).unwrap();
    let reg = registry();
    let (l, vp) = split_kv_program(&model, 2, &reg);
    let shard = vp
        .program()
        .tasks
        .iter()
        .position(|t| t.label == "L0.attn_shard1")
        .unwrap() as u32;
    let mut s = CpuBackend::default()
        .load_session(&vp, &l.weights, &reg)
        .unwrap();
    let params = |s: &amk_backend_cpu::CpuSession| {
        let t = &s.program().tasks[shard as usize];
        (t.param_i64("kv_start"), t.param_i64("kv_len"))
    };
    // The loaded window is the shard's static slice of the 12-row cache.
    assert_eq!(params(&s), (Some(6), Some(6)));
    let p1 = vp
        .check_patch(&reg, &[(shard, "kv_start", 8), (shard, "kv_len", 4)])
        .unwrap();
    s.set_params(&p1).unwrap();
    assert_eq!(params(&s), (Some(8), Some(4)));
    // Checked against the loaded kv_start (6): 6 + 5 rows fit, 8 + 5 would not.
    let p2 = vp.check_patch(&reg, &[(shard, "kv_len", 5)]).unwrap();
    s.set_params(&p2).unwrap();
    assert_eq!(
        params(&s),
        (Some(6), Some(5)),
        "the first patch's kv_start must not linger"
    );
    // kv_start 8 + kv_len 11 would overrun the 12-row cache: refused when checked together.
    assert!(
        vp.check_patch(&reg, &[(shard, "kv_start", 8), (shard, "kv_len", 11)])
            .is_err()
    );
    assert!(vp.check_patch(&reg, &[(shard, "kv_len", 7)]).is_err());
    // Region params are never patchable; a position is no param; unknown tasks are refused.
    let tile = vp
        .program()
        .tasks
        .iter()
        .position(|t| t.op == Opcode::GEMV_TILE)
        .unwrap() as u32;
    assert!(vp.check_patch(&reg, &[(tile, "n_off", 0)]).is_err());
    assert!(vp.check_patch(&reg, &[(shard, "pos", 0)]).is_err());
    assert!(vp.check_patch(&reg, &[(99_999, "kv_len", 1)]).is_err());
    // A patch checked against another validation of the same program is refused.
    let other = amk_core::validate_owned(l.program.clone(), &reg).unwrap();
    let foreign = other.check_patch(&reg, &[(shard, "kv_len", 2)]).unwrap();
    assert!(s.set_params(&foreign).is_err());
    assert_eq!(
        params(&s),
        (Some(6), Some(5)),
        "a refused patch changed nothing"
    );
}

#[test]
fn f16_overflow_and_oversized_kv_are_refused() {
    let mut model = Model::random(cfg(1, 32, 4, 2, 8, 48, 40), 5).unwrap();
    let name = "model.layers.0.mlp.up_proj.weight";
    let mut t = (**model.weights.get(name).unwrap()).clone();
    t.set_f32(3, 1.0e6);
    model.weights.insert(name, t);
    let e = lower(
        &model,
        &ScheduleConfig::default(),
        &h100(),
        &LowerOptions {
            dtype: DType::F16,
            ..LowerOptions::default()
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains(name), "{e}");
    lower(
        &model,
        &ScheduleConfig::default(),
        &h100(),
        &LowerOptions {
            dtype: DType::BF16,
            ..LowerOptions::default()
        },
    )
    .unwrap();
    let mut big = cfg(80, 8192, 64, 8, 128, 64, 64);
    big.max_position_embeddings = 1 << 20;
    let model = shaped_model_lazy(big);
    let e = lower(
        &model,
        &ScheduleConfig::default(),
        &h100(),
        &LowerOptions {
            max_seq: Some(1 << 20),
            ..LowerOptions::default()
        },
    )
    .unwrap_err();
    assert!(e.to_string().contains("--max-seq"), "{e}");
}

/// Like [`shaped_model`] but every tensor is one shared zero tensor per shape (a large model's
/// shapes without its memory).
fn shaped_model_lazy(c: ModelConfig) -> Model {
    let mut w = WeightStore::new();
    let mut cache: std::collections::HashMap<Vec<u64>, std::sync::Arc<Tensor>> = Default::default();
    for (name, shape) in tensor_names(&c) {
        let t = cache
            .entry(shape.clone())
            .or_insert_with(|| std::sync::Arc::new(Tensor::zeros(DType::F32, &shape)));
        w.insert_shared(name, std::sync::Arc::clone(t));
    }
    Model::new(c, w, None, "shaped", ModelFormat::Hf).unwrap()
}

/// `model` lowered with `parts` split-KV shards and a 12-row cache, and its validation.
fn split_kv_program(
    model: &Model,
    parts: i64,
    reg: &Registry,
) -> (amk_model_llama::lower::Lowered, amk_core::ValidatedProgram) {
    let sc = schedule(
        &[("attention", &[("n_partitions", parts)])],
        false,
        SmAssignment::LoadBalance,
        PageStrategy::None,
    );
    let opts = LowerOptions {
        max_seq: Some(12),
        ..LowerOptions::default()
    };
    let l = lower(model, &sc, &h100(), &opts).unwrap();
    let vp = amk_core::validate_owned(l.program.clone(), reg).unwrap();
    (l, vp)
}

/// `gemv.sm_multiple` (the tuned schedule) splits every projection over all SMs in row
/// counts a multiple of 8: on the Llama-3.2-1B shape the LM head becomes 132 tiles of 976
/// rows (the reference rule: 64 tiles of 2,004), the down-projection 128 tiles of 16 rows;
/// the program validates and a shape-only model lowers without weight data (but the RoPE
/// divisors its llama3 scaling derives).
#[test]
fn sm_multiple_tiles_every_projection_over_all_sms() {
    use amk_model_llama::lower::tuned_schedule;
    use amk_model_llama::presets;
    let reg = amk_ops::registry().unwrap();
    let m = Model::shape_only(presets::preset("llama-3.2-1b").unwrap(), "1b shape");
    let target = GpuTarget::by_name("h100").unwrap();
    let tiles = |cfg: &ScheduleConfig, prefix: &str| -> Vec<i64> {
        let lowered = lower(&m, cfg, &target, &LowerOptions::default()).unwrap();
        // No checkpoint data; only the RoPE divisors the lowering derives from the config.
        let names: Vec<&str> = lowered.weights.names().collect();
        assert_eq!(names, [amk_model_llama::model::ROPE_FREQS]);
        let v = amk_core::validate_owned(lowered.program, &reg)
            .map_err(|r| r.report())
            .unwrap();
        v.program()
            .tasks
            .iter()
            .filter(|t| t.label.starts_with(prefix) && t.label[prefix.len()..].starts_with('['))
            .map(|t| t.params.get("N_tile").and_then(|v| v.as_i64()).unwrap())
            .collect()
    };
    // The tuned schedule with one SM kept for the attention: 131 LM-head tiles of 984 rows.
    let head = tiles(&tuned_own_sm(), "lm_head");
    assert!(
        head.len() == 131 && head[..130].iter().all(|&w| w == 984),
        "{head:?}"
    );
    let mut tuned = tuned_schedule();
    tuned.tiling.retain(|(g, _)| g != "attention");
    let head = tiles(&tuned, "lm_head");
    assert_eq!(head.len(), 132);
    assert!(head[..131].iter().all(|&w| w == 976) && head[131] == 128256 - 131 * 976);
    let down = tiles(&tuned, "L3.down_add");
    assert_eq!((down.len(), down[0]), (128, 16));
    // Fused: Q/K/V as 96 tiles of 16 RoPE pairs (32 of the 3,072 rows), gate/up as 128 tiles
    // of 64 columns (each streaming 64 gate and 64 up rows).
    let qkv = tiles(&tuned, "L0.qkv");
    assert!(qkv.len() == 96 && qkv.iter().all(|&w| w == 32), "{qkv:?}");
    let gate_up = tiles(&tuned, "L0.gate_up");
    assert!(
        gate_up.len() == 128 && gate_up.iter().all(|&w| w == 64),
        "{gate_up:?}"
    );
    // Unfused projections of one phase share the SMs in proportion to their rows: Q 88, K 22,
    // V 22 SMs (2048, 512, 512 rows); gate and up 66 each.
    let tuned = ScheduleConfig {
        fusion_grouping: vec![vec!["gemv".into(), "add".into()]],
        ..tuned
    };
    let gate = tiles(&tuned, "L0.gate");
    assert!(
        gate.iter().all(|&w| w == 128) && gate.len() == 64,
        "{gate:?}"
    );
    let (q, k) = (tiles(&tuned, "L0.q"), tiles(&tuned, "L0.k"));
    assert!(
        q.len() == 86 && q[..85].iter().all(|&w| w == 24) && q[85] == 8,
        "{q:?}"
    );
    assert_eq!((k.len(), k[0], k[21]), (22, 24, 512 - 21 * 24));
    let reference = tiles(&ScheduleConfig::default(), "lm_head");
    assert_eq!((reference.len(), reference[0]), (64, 2004));
}

/// With the tuned schedule no SM runs two tiles of one phase (the fused Q/K/V or gate/up tiles
/// of a layer; unfused, its Q, K and V tiles, or its gate and up tiles), so a phase costs one
/// task's fixed overhead per SM.
#[rstest]
#[case::fused(false)]
#[case::unfused_projections(true)]
fn tuned_phases_put_one_tile_per_sm(#[case] unfused: bool) {
    use amk_model_llama::lower::tuned_schedule;
    use amk_model_llama::presets;
    let reg = amk_ops::registry().unwrap();
    let target = GpuTarget::by_name("h100").unwrap();
    let mut sc = tuned_schedule();
    let phases: [(i32, &[&str]); 2] = if unfused {
        sc.fusion_grouping = vec![vec!["gemv".into(), "add".into()]];
        [(1, &["q", "k", "v"]), (2, &["gate", "up"])]
    } else {
        [(1, &["qkv"]), (2, &["gate_up"])]
    };
    for shape in ["llama-3.2-1b", "smollm2-135m", "llama-3.1-8b"] {
        let m = Model::shape_only(presets::preset(shape).unwrap(), shape);
        let lowered = lower(&m, &sc, &target, &LowerOptions::default()).unwrap();
        let v = amk_core::validate_owned(lowered.program, &reg)
            .map_err(|r| r.report())
            .unwrap();
        for (l, phase) in phases {
            let sms: Vec<i32> = v
                .program()
                .tasks
                .iter()
                .filter(|t| {
                    phase
                        .iter()
                        .any(|p| t.label.starts_with(&format!("L{l}.{p}[")))
                })
                .map(|t| t.sm.expect("the lowering assigns every task an SM"))
                .collect();
            let mut distinct = sms.clone();
            distinct.sort_unstable();
            distinct.dedup();
            assert!(
                sms.len() >= 48,
                "{shape} L{l} {phase:?}: {} tiles",
                sms.len()
            );
            assert_eq!(
                distinct.len(),
                sms.len(),
                "{shape} L{l} {phase:?}: an SM runs two tiles"
            );
        }
    }
}

/// The tuned schedule (its attention on one SM of its own) alternates a small model's phases
/// (`gemv.alternate_max_kb`): SmolLM2's
/// projections are tiled for half the SMs, no projection phase shares an SM with the one before
/// it, the output projection runs on SMs of the Q/K/V phase (so gate/up loads its weights before the
/// attention, not beside it), and the LM head still spans every SM but the attention's. The
/// 1B, the 8B, and SmolLM2 without the key keep every projection on every SM.
#[rstest]
#[case::bf16(DType::BF16)]
#[case::f32(DType::F32)]
fn tuned_small_models_alternate_their_phases(#[case] dtype: DType) {
    use amk_model_llama::lower::alternates;
    use amk_model_llama::presets;
    use std::collections::BTreeSet;
    let reg = amk_ops::registry().unwrap();
    let target = GpuTarget::by_name("h100").unwrap();
    let tuned = tuned_own_sm();
    let mut plain = tuned_own_sm();
    for (group, kvs) in &mut plain.tiling {
        if group == "gemv" {
            kvs.retain(|(k, _)| k != "alternate_max_kb");
        }
    }
    let dbytes = dtype.bits() / 8;
    for shape in ["smollm2-135m", "llama-3.2-1b", "llama-3.1-8b"] {
        let cfg = presets::preset(shape).unwrap();
        assert_eq!(
            alternates(&tuned, &cfg, dbytes),
            shape == "smollm2-135m",
            "{shape}"
        );
        assert!(!alternates(&plain, &cfg, dbytes), "{shape}");
    }
    let m = Model::shape_only(presets::preset("smollm2-135m").unwrap(), "smollm2");
    let opts = LowerOptions {
        dtype,
        ..LowerOptions::default()
    };
    let sms_of = |sc: &ScheduleConfig| {
        let lowered = lower(&m, sc, &target, &opts).unwrap();
        let v = amk_core::validate_owned(lowered.program, &reg)
            .map_err(|r| r.report())
            .unwrap();
        move |label: &str| -> BTreeSet<i32> {
            v.program()
                .tasks
                .iter()
                .filter(|t| t.label.starts_with(&format!("{label}[")))
                .map(|t| t.sm.expect("the lowering assigns every task an SM"))
                .collect()
        }
    };
    let alt = sms_of(&tuned);
    for l in 1..4 {
        let phases = [
            alt(&format!("L{l}.qkv")),
            alt(&format!("L{l}.o_add")),
            alt(&format!("L{l}.gate_up")),
            alt(&format!("L{l}.down_add")),
            alt(&format!("L{}.qkv", l + 1)),
        ];
        for p in &phases {
            assert!((30..=66).contains(&p.len()), "L{l}: {} SMs", p.len());
        }
        // Q/K/V and o_proj have the attention between them (on its own SM).
        for w in phases[1..].windows(2) {
            assert!(
                w[0].is_disjoint(&w[1]),
                "L{l}: consecutive phases share SMs"
            );
        }
        assert!(
            phases[1].is_subset(&phases[0]),
            "L{l}: o_proj off the Q/K/V SMs"
        );
    }
    assert_eq!(alt("lm_head").len(), 131);
    let all = sms_of(&plain);
    assert!(all("L1.gate_up").len() > 66 && all("L1.o_add").len() > 66);
}

/// SM shares are proportional to rows, at least 1 each, and sum to the SM count.
#[rstest::rstest]
#[case(132, &[2048, 512, 512], &[88, 22, 22])]
#[case(132, &[576, 192, 192], &[79, 27, 26])]
#[case(132, &[8192, 8192], &[66, 66])]
#[case(2, &[100, 1, 1], &[1, 1, 1])]
#[case(10, &[0, 0], &[10, 10])]
fn sm_shares_are_proportional(#[case] sms: u64, #[case] rows: &[u64], #[case] want: &[u64]) {
    assert_eq!(amk_model_llama::lower::sm_shares(sms, rows), want);
}

/// `attention.own_sms = k`: every attention task (shards and combines too) runs on the grid's
/// last k SMs and nothing else does; the projections are tiled over the other SMs (half of them
/// where the layers alternate), still one tile per SM and phase; the program validates.
#[rstest]
#[case::one_sm("llama-3.2-1b", 1, 1)]
#[case::smollm2("smollm2-135m", 1, 1)]
#[case::split_kv_on_two("llama-3.1-8b", 2, 4)]
fn own_sms_keep_attention_alone(#[case] shape: &str, #[case] own: i64, #[case] partitions: i64) {
    use amk_model_llama::presets;
    let reg = amk_ops::registry().unwrap();
    let target = GpuTarget::by_name("h100").unwrap();
    let grid = target.num_sms as i32;
    let mut sc = tuned_schedule();
    sc.tiling.retain(|(g, _)| g != "attention");
    sc.tiling.push((
        "attention".into(),
        vec![("own_sms".into(), own), ("n_partitions".into(), partitions)],
    ));
    let m = Model::shape_only(presets::preset(shape).unwrap(), shape);
    let opts = LowerOptions::default();
    let lowered = lower(&m, &sc, &target, &opts).unwrap();
    let v = amk_core::validate_owned(lowered.program, &reg)
        .map_err(|r| r.report())
        .unwrap();
    let first_own = grid - own as i32;
    let mut att_sms = Vec::new();
    for t in &v.program().tasks {
        let s = t.sm.expect("every task has an SM");
        let attention = t.op == Opcode::ATTENTION_TILE || t.op == Opcode::ATTENTION_COMBINE;
        assert_eq!(
            s >= first_own,
            attention,
            "{shape}: task {} ('{}') on SM {s}",
            t.id,
            t.label
        );
        if attention {
            att_sms.push(s);
        }
    }
    att_sms.sort_unstable();
    att_sms.dedup();
    assert_eq!(att_sms.len() as i64, own.min(partitions + 1), "{att_sms:?}");
    for phase in ["qkv", "o_add", "gate_up", "down_add"] {
        let mut sms: Vec<i32> = v
            .program()
            .tasks
            .iter()
            .filter(|t| t.label.starts_with(&format!("L1.{phase}[")))
            .map(|t| t.sm.unwrap())
            .collect();
        let n = sms.len();
        sms.sort_unstable();
        sms.dedup();
        // A layer that alternates is tiled for half the SMs.
        let dbytes = opts.dtype.bits() / 8;
        let least = if amk_model_llama::lower::alternates(&sc, &m.config, dbytes) {
            30
        } else {
            48
        };
        assert!(n >= least, "{shape} L1.{phase}: {n} tiles");
        assert!(n <= first_own as usize, "{shape} L1.{phase}: {n} tiles");
        assert_eq!(sms.len(), n, "{shape} L1.{phase}: an SM runs two tiles");
    }
    // A reservation that would leave no SM for the projections keeps one.
    let tiny = GpuTarget {
        num_sms: 2,
        ..target.clone()
    };
    let mut greedy = tuned_schedule();
    greedy.tiling.retain(|(g, _)| g != "attention");
    greedy
        .tiling
        .push(("attention".into(), vec![("own_sms".into(), 5)]));
    let l = lower(&m, &greedy, &tiny, &opts).unwrap();
    assert!(l.program.tasks.iter().all(|t| {
        let attention = t.op == Opcode::ATTENTION_TILE;
        t.sm == Some(i32::from(attention))
    }));
}

/// The tuned schedule with its attention split over the SMs: `split_kv` splits a KV head at
/// most, split sizes multiples of `chunk` rows.
fn tuned_split_kv(split_kv: i64, chunk: i64) -> ScheduleConfig {
    let mut sc = tuned_schedule();
    sc.tiling.retain(|(g, _)| g != "attention");
    sc.tiling.push((
        "attention".into(),
        vec![("split_kv".into(), split_kv), ("split_chunk".into(), chunk)],
    ));
    sc
}

/// Split-KV attention on a full-size shape: every layer has `n_kv_heads × n_splits` split
/// tasks (8 × 16 on the 1B over 132 SMs), on as many distinct SMs, all signalling one counter
/// that every output-projection tile waits for in full; the program validates.
#[rstest]
#[case::llama_1b("llama-3.2-1b", 8, 16)]
#[case::smollm2("smollm2-135m", 3, 16)]
#[case::llama_8b("llama-3.1-8b", 8, 16)]
fn split_kv_spreads_each_layer_over_the_sms(
    #[case] shape: &str,
    #[case] nkv: usize,
    #[case] splits: usize,
) {
    use amk_model_llama::presets;
    let reg = amk_ops::registry().unwrap();
    let target = GpuTarget::by_name("h100").unwrap();
    let m = Model::shape_only(presets::preset(shape).unwrap(), shape);
    let lowered = lower(
        &m,
        &tuned_split_kv(16, 64),
        &target,
        &LowerOptions::default(),
    )
    .unwrap();
    let v = amk_core::validate_owned(lowered.program, &reg)
        .map_err(|r| r.report())
        .unwrap();
    let p = v.program();
    assert!(!p.tasks.iter().any(|t| t.op == Opcode::ATTENTION_TILE));
    let layer = |t: &amk_core::Task| t.label.split('.').next().unwrap_or("").to_string();
    let mut by_layer: std::collections::BTreeMap<String, Vec<&amk_core::Task>> = Default::default();
    for t in p.tasks.iter().filter(|t| t.op == Opcode::ATTENTION_SPLIT) {
        by_layer.entry(layer(t)).or_default().push(t);
    }
    assert_eq!(by_layer.len(), m.config.n_layers, "{shape}");
    for (l, tasks) in &by_layer {
        assert_eq!(tasks.len(), nkv * splits, "{shape} {l}");
        let mut sms: Vec<i32> = tasks.iter().map(|t| t.sm.unwrap()).collect();
        sms.sort_unstable();
        sms.dedup();
        assert_eq!(sms.len(), tasks.len(), "{shape} {l}: an SM runs two splits");
        let ctr = tasks[0].out_counter;
        assert!(tasks.iter().all(|t| t.out_counter == ctr));
        let tiles: Vec<_> = (p.tasks.iter())
            .filter(|t| t.op == Opcode::COMBINE_GEMV && &layer(t) == l)
            .collect();
        assert!(tiles.len() >= 30, "{shape} {l}: {} tiles", tiles.len());
        for t in tiles {
            assert!(
                t.waits
                    .iter()
                    .any(|w| w.counter == ctr && w.threshold == tasks.len() as i64),
                "{shape} {}: does not wait for every split",
                t.label
            );
        }
    }
}

/// The toy GQA model's program under the fused schedule with the attention keys `attention`
/// (a 20-row cache), checked to validate.
fn valid_split_kv_program(attention: &[(&str, i64)], reg: &amk_core::Registry) -> Program {
    let model = shaped_model(cfg(2, 32, 4, 2, 8, 48, 40));
    let sc = schedule(
        &[("attention", attention)],
        true,
        SmAssignment::LoadBalance,
        PageStrategy::None,
    );
    let opts = LowerOptions {
        max_seq: Some(20),
        ..LowerOptions::default()
    };
    let p = lower(&model, &sc, &h100(), &opts).unwrap().program;
    let r = amk_core::validate(&p, reg);
    assert!(r.ok(), "{}", r.report());
    p
}

/// `p` is refused by the validator with an error of `kind` (`what` names the breakage).
fn assert_refused(p: &Program, reg: &amk_core::Registry, kind: ErrorKind, what: &str) {
    let r = amk_core::validate(p, reg);
    assert!(
        r.has(kind),
        "{what}: not refused as {kind:?}: {}",
        r.report()
    );
}

/// The combine's dependency pattern is proven, not assumed: a split-KV program validates, and
/// each way of breaking it is refused with its kind — an output-projection tile that does not
/// wait for the splits (a read racing their writes), one that waits for all but one (a
/// partial wait on their shared counter), a split that does not wait for the query and the
/// cache rows, two splits writing the same partials.
#[test]
fn split_kv_waits_are_proven_and_breaking_them_is_refused() {
    let reg = registry();
    let p = valid_split_kv_program(&[("split_kv", 4), ("split_chunk", 2)], &reg);
    let split = |p: &Program| {
        (p.tasks.iter())
            .position(|t| t.op == Opcode::ATTENTION_SPLIT)
            .unwrap()
    };
    let tile = |p: &Program| {
        (p.tasks.iter())
            .position(|t| t.op == Opcode::COMBINE_GEMV)
            .unwrap()
    };
    let refused = |p: &Program, kind: ErrorKind, what: &str| assert_refused(p, &reg, kind, what);
    let ctr = p.tasks[split(&p)].out_counter;

    let mut no_wait = p.clone();
    let t = tile(&no_wait);
    no_wait.tasks[t].waits.retain(|w| w.counter != ctr);
    refused(
        &no_wait,
        ErrorKind::RawRace,
        "a tile that does not wait for the splits",
    );

    let mut partial = p.clone();
    let t = tile(&partial);
    for w in partial.tasks[t]
        .waits
        .iter_mut()
        .filter(|w| w.counter == ctr)
    {
        w.threshold -= 1;
    }
    refused(
        &partial,
        ErrorKind::PartialSharedWait,
        "a tile that waits for all splits but one",
    );

    let mut blind = p.clone();
    let t = split(&blind);
    blind.tasks[t].waits.clear();
    let r = amk_core::validate(&blind, &reg);
    assert!(
        r.has(ErrorKind::RawRace) || r.has(ErrorKind::RawRaceKv),
        "a split that does not wait for q and the cache: {}",
        r.report()
    );

    let mut clash = p.clone();
    let t = split(&clash);
    let n_off = clash.tasks[t + 1].params.get("n_off").cloned().unwrap();
    clash.tasks[t].params.insert("n_off", n_off);
    refused(
        &clash,
        ErrorKind::WawRace,
        "two splits writing the same partials",
    );
}

/// The merge tasks' dependency pattern is proven too: a program whose partials are merged by
/// ATTENTION_MERGE tasks (`attention.merge_heads`) validates, with plain GEMV tiles after them;
/// a merge that does not wait for the splits, one that waits for all but one, a projection
/// tile that does not wait for the merges, and two merges writing the same heads are refused.
#[test]
fn merge_task_waits_are_proven_and_breaking_them_is_refused() {
    let reg = registry();
    let attention = [("split_kv", 4), ("split_chunk", 2), ("merge_heads", 1)];
    let p = valid_split_kv_program(&attention, &reg);
    let first = |p: &Program, op: Opcode| p.tasks.iter().position(|t| t.op == op).unwrap();
    assert!(!p.tasks.iter().any(|t| t.op == Opcode::COMBINE_GEMV));
    let merges = (p.tasks.iter())
        .filter(|t| t.op == Opcode::ATTENTION_MERGE && t.label.starts_with("L0."))
        .count();
    assert_eq!(merges, 4, "one merge a query head");
    let refused = |p: &Program, kind: ErrorKind, what: &str| assert_refused(p, &reg, kind, what);
    let split_ctr = p.tasks[first(&p, Opcode::ATTENTION_SPLIT)].out_counter;
    let merge = first(&p, Opcode::ATTENTION_MERGE);
    let merge_ctr = p.tasks[merge].out_counter;

    let mut blind = p.clone();
    blind.tasks[merge].waits.clear();
    refused(
        &blind,
        ErrorKind::RawRace,
        "a merge that does not wait for the splits",
    );

    let mut partial = p.clone();
    for w in partial.tasks[merge].waits.iter_mut() {
        w.threshold -= 1;
    }
    refused(
        &partial,
        ErrorKind::PartialSharedWait,
        "a merge that waits for all splits but one",
    );

    let mut early = p.clone();
    let proj = (early.tasks.iter())
        .position(|t| t.waits.iter().any(|w| w.counter == merge_ctr))
        .unwrap();
    early.tasks[proj].waits.retain(|w| w.counter != merge_ctr);
    refused(
        &early,
        ErrorKind::RawRace,
        "a projection tile that does not wait for the merges",
    );

    let mut clash = p.clone();
    let n_off = clash.tasks[merge + 1].params.get("n_off").cloned().unwrap();
    clash.tasks[merge].params.insert("n_off", n_off);
    refused(
        &clash,
        ErrorKind::WawRace,
        "two merges writing the same heads",
    );
    assert!(p.tasks[merge].waits.iter().all(|w| w.counter == split_ctr));
}

/// The tuned schedule as it was before the split-KV attention: the attention on one SM of its
/// own (`attention.own_sms` 1; bench/schedules/tuned-own-sm.json).
fn tuned_own_sm() -> ScheduleConfig {
    let mut sc = tuned_schedule();
    sc.tiling.retain(|(g, _)| g != "attention");
    sc.tiling
        .push(("attention".into(), vec![("own_sms".into(), 1)]));
    sc
}

/// The long contexts `amk bench --pos` reaches: the 1B and 8B shapes lowered with a
/// 32,768-row cache under the tuned (split-KV) schedule validate, each split covering at most
/// 2,048 rows there.
#[rstest]
#[case::llama_1b("llama-3.2-1b")]
#[case::llama_8b("llama-3.1-8b")]
fn split_kv_lowers_for_a_32k_cache(#[case] shape: &str) {
    use amk_model_llama::presets;
    let reg = amk_ops::registry().unwrap();
    let target = GpuTarget::by_name("h100").unwrap();
    let m = Model::shape_only(presets::preset(shape).unwrap(), shape);
    let opts = LowerOptions {
        dtype: DType::BF16,
        max_seq: Some(32768),
        ..LowerOptions::default()
    };
    let lowered = lower(&m, &tuned_schedule(), &target, &opts).unwrap();
    assert_eq!(lowered.max_seq, 32768);
    let v = amk_core::validate_owned(lowered.program, &reg)
        .map_err(|r| r.report())
        .unwrap();
    let split = (v.program().tasks.iter())
        .find(|t| t.op == Opcode::ATTENTION_SPLIT)
        .unwrap();
    let n_splits = split.param_i64("n_splits").unwrap() as u64;
    let chunk = split.param_i64("chunk").unwrap() as u64;
    assert_eq!(n_splits, 16);
    assert!(op_attention_split::split_size(32767, n_splits, chunk) <= 2048);
}

/// Qwen3's per-head q/k norms ride in the tuned schedule's Q/K/V tiles: every
/// QKV_ROPE_APPEND tile holds whole heads (`qk_norm` = 1, `n_off` and `N_tile` multiples of
/// `head_dim`, the two norm weights as inputs), no RMSNORM or ROPE task is left for them, and
/// the program validates. The reference schedule keeps the unfused per-head RMSNORM tasks.
#[rstest]
#[case::qwen3_0_6b("qwen3-0.6b")]
#[case::qwen3_8b("qwen3-8b")]
fn qwen3_qk_norms_fuse_into_whole_head_tiles(#[case] shape: &str) {
    use amk_model_llama::presets;
    let reg = amk_ops::registry().unwrap();
    let target = GpuTarget::by_name("h100").unwrap();
    let c = presets::preset(shape).unwrap();
    let (hd, layers) = (c.head_dim as i64, c.n_layers);
    let m = Model::shape_only(c, shape);
    let opts = LowerOptions {
        dtype: DType::BF16,
        max_seq: Some(256),
        ..LowerOptions::default()
    };
    let count = |p: &Program, op: Opcode| p.tasks.iter().filter(|t| t.op == op).count();
    let tuned = lower(&m, &tuned_schedule(), &target, &opts)
        .unwrap()
        .program;
    let tiles: Vec<_> = (tuned.tasks.iter())
        .filter(|t| t.op == Opcode::QKV_ROPE_APPEND)
        .collect();
    assert!(tiles.len() >= layers, "{} tiles", tiles.len());
    for t in &tiles {
        assert_eq!(t.param_i64("qk_norm"), Some(1));
        assert_eq!(t.inputs.len(), 8, "x, 3 weights, pos, norm, q/k norms");
        let (off, n) = (
            t.param_i64("n_off").unwrap(),
            t.param_i64("N_tile").unwrap(),
        );
        assert!(
            off % hd == 0 && n % hd == 0,
            "tile [{off}, +{n}) splits a head"
        );
    }
    assert_eq!(count(&tuned, Opcode::RMSNORM), 0);
    assert_eq!(count(&tuned, Opcode::ROPE), 0);
    let v = amk_core::validate(&tuned, &reg);
    assert!(v.ok(), "{}", v.report());
    let reference = lower(&m, &ScheduleConfig::default(), &target, &opts)
        .unwrap()
        .program;
    // Per layer: the input and post-attention norms, and one per Q and one per K head set.
    assert!(count(&reference, Opcode::RMSNORM) >= 4 * layers);
}

/// A model's short name: its file's name without `.gguf`, or its folder's.
#[test]
fn model_names_drop_the_folder_and_the_extension() {
    let mut m = Model::random(cfg(1, 32, 4, 2, 8, 48, 40), 3).unwrap();
    m.source = "/c/SmolLM2-135M-Instruct.Q4_1.gguf".into();
    assert_eq!(m.name(), "SmolLM2-135M-Instruct.Q4_1");
    m.source = "/models/tiny-mqa".into();
    assert_eq!(m.name(), "tiny-mqa");
}

/// The decode tail's summaries are proven, not assumed: a looped program with LOGIT_STATS
/// tasks (`next_token.stats_slots`) validates; a slot that does not wait for the LM head (its
/// read of the logits racing their writes), a tail that does not wait for the slots, one that
/// waits for all but one, and two slots writing the same column are refused.
#[test]
fn logit_stats_waits_are_proven_and_breaking_them_is_refused() {
    let reg = registry();
    let model = shaped_model(cfg(2, 32, 4, 2, 8, 48, 40));
    let mut sc = schedule(&[], true, SmAssignment::LoadBalance, PageStrategy::None);
    sc.tiling
        .push(("next_token".into(), vec![("stats_slots".into(), 4)]));
    let opts = LowerOptions {
        max_seq: Some(20),
        decode_loop: Some(DecodeLoop::default()),
        ..LowerOptions::default()
    };
    let p = lower(&model, &sc, &h100(), &opts).unwrap().program;
    let r = amk_core::validate(&p, &reg);
    assert!(r.ok(), "{}", r.report());
    let first = p
        .tasks
        .iter()
        .position(|t| t.op == Opcode::LOGIT_STATS)
        .unwrap();
    let tail = p.tasks.len() - 1;
    assert_eq!(
        tail - first,
        3,
        "40 logits in 3 slots of 16 (about 4 asked, 8-aligned)"
    );
    let refused = |p: &Program, kind: ErrorKind, what: &str| assert_refused(p, &reg, kind, what);

    let mut blind = p.clone();
    blind.tasks[first].waits.clear();
    refused(
        &blind,
        ErrorKind::RawRace,
        "a slot that does not wait for the LM head",
    );

    let mut eager = p.clone();
    eager.tasks[tail].waits.clear();
    refused(
        &eager,
        ErrorKind::RawRace,
        "a tail that does not wait for the slots",
    );

    let mut partial = p.clone();
    partial.tasks[tail].waits[0].threshold -= 1;
    refused(
        &partial,
        ErrorKind::PartialSharedWait,
        "a tail that waits for all slots but one",
    );

    let mut clash = p.clone();
    let n_off = clash.tasks[first + 1].params.get("n_off").cloned().unwrap();
    clash.tasks[first].params.insert("n_off", n_off);
    refused(&clash, ErrorKind::WawRace, "two slots writing one column");
}

/// The A/B schedule `bench/schedules/{name}`, parsed.
fn bench_schedule(name: &str) -> ScheduleConfig {
    let path = format!(
        "{}/../../bench/schedules/{name}",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).unwrap();
    amk_core::codec::schedule_config_from_json(&text).unwrap()
}

/// `bench/schedules/tuned-no-stats.json`, the A/B partner of the tuned schedule's summarised
/// tail, is the tuned schedule without `next_token.stats_slots` and nothing else.
#[test]
fn the_no_stats_schedule_is_the_tuned_one_without_its_stats() {
    let file = bench_schedule("tuned-no-stats.json");
    let mut want = tuned_schedule();
    want.tiling.retain(|(g, _)| g != "next_token");
    assert_eq!(file, want);
    assert!(stats_layout(&tuned_schedule(), 49152).is_some());
    assert_eq!(stats_layout(&file, 49152), None);
}

/// The decode loop's NEXT_TOKEN is seated on an SM that summarises no slot of the logits, here
/// under the tuned schedule on 132 SMs (131 LM-head tiles, 128 LOGIT_STATS tasks, so every SM
/// runs one or the other): it is reached once its SM's LM-head tile is done, while the
/// summaries still run, so its dispatch and its work before the wait leave the tail's critical
/// path (`sm::seat_next_token_early`).
#[rstest]
#[case::smollm2("smollm2-135m")]
#[case::llama_1b("llama-3.2-1b")]
fn the_next_token_task_sits_on_an_sm_free_during_the_tail(#[case] shape: &str) {
    use amk_model_llama::presets;
    let target = GpuTarget::by_name("h100").unwrap();
    let m = Model::shape_only(presets::preset(shape).unwrap(), shape);
    let opts = LowerOptions {
        dtype: DType::BF16,
        max_seq: Some(256),
        argmax: true,
        decode_loop: Some(DecodeLoop { stop_slots: 2 }),
    };
    let p = lower(&m, &tuned_schedule(), &target, &opts)
        .unwrap()
        .program;
    let tail = p.tasks.last().unwrap();
    assert_eq!(tail.op, Opcode::NEXT_TOKEN);
    let logits = named(&p, decode::LOGITS);
    let on_its_sm = |pred: &dyn Fn(&amk_core::Task) -> bool| {
        (p.tasks.iter()).any(|t| t.sm == tail.sm && t.id != tail.id && pred(t))
    };
    assert!(!on_its_sm(&|t| t.op == Opcode::LOGIT_STATS), "{shape}");
    assert!(on_its_sm(&|t| t.outputs.contains(&logits)), "{shape}");
}

/// The tuned schedule's `attention.own_sms_alternating` gives a small model's tasks that run once
/// a layer beside the projections an SM each of their own, where its projections alternate
/// between halves of the SMs: the short-context program's attention tasks (SmolLM2: 3 KV
/// heads, 3 SMs that run nothing else) and the split program's merge tasks; a model whose
/// projections use every SM (the 1B) is left as it was. The split program keeps every other SM
/// for its splits, and asking own SMs for them is still refused.
#[rstest]
#[case::smollm2("smollm2-135m", 3)]
#[case::llama_1b("llama-3.2-1b", 0)]
fn attention_tasks_have_sms_of_their_own_on_small_models(#[case] shape: &str, #[case] own: i32) {
    use amk_model_llama::lower::short_context_schedule;
    use amk_model_llama::presets;
    let reg = amk_ops::registry().unwrap();
    let target = GpuTarget::by_name("h100").unwrap();
    let grid = target.num_sms as i32;
    let m = Model::shape_only(presets::preset(shape).unwrap(), shape);
    let opts = LowerOptions {
        dtype: DType::BF16,
        max_seq: Some(256),
        ..LowerOptions::default()
    };
    let short = short_context_schedule(&tuned_schedule()).unwrap();
    let lowered = lower(&m, &short, &target, &opts).unwrap();
    let v = amk_core::validate_owned(lowered.program, &reg)
        .map_err(|r| r.report())
        .unwrap();
    let mut att_sms: Vec<i32> = Vec::new();
    for t in &v.program().tasks {
        let s = t.sm.expect("every task has an SM");
        let attention = t.op == Opcode::ATTENTION_SPLIT;
        if attention {
            att_sms.push(s);
        }
        if own > 0 {
            assert_eq!(
                s >= grid - own,
                attention,
                "{shape}: task '{}' on SM {s}",
                t.label
            );
        }
    }
    att_sms.sort_unstable();
    att_sms.dedup();
    if own > 0 {
        assert_eq!(att_sms, ((grid - own)..grid).collect::<Vec<_>>());
    } else {
        assert!(att_sms.len() > 1, "{shape}: {att_sms:?}");
    }
    // The split program spreads its splits over the whole grid; on the small model its merge
    // tasks (⌈9 / 4⌉ = 3) have the own SMs instead; asking own SMs for the splits is refused.
    let split = lower(&m, &tuned_schedule(), &target, &opts).unwrap();
    let split = amk_core::validate_owned(split.program, &reg)
        .map_err(|r| r.report())
        .unwrap();
    for t in &split.program().tasks {
        let s = t.sm.expect("every task has an SM");
        if own > 0 {
            let merge = t.op == Opcode::ATTENTION_MERGE;
            assert_eq!(
                s >= grid - own,
                merge,
                "{shape}: task '{}' on SM {s}",
                t.label
            );
        }
    }
    let split_sms: std::collections::BTreeSet<i32> = (split.program().tasks.iter())
        .filter(|t| t.op == Opcode::ATTENTION_SPLIT)
        .filter_map(|t| t.sm)
        .collect();
    assert!(split_sms.len() as i32 > grid / 4, "{shape}: {split_sms:?}");
    let mut own_split = tuned_schedule();
    for (g, keys) in &mut own_split.tiling {
        if g == "attention" {
            keys.push(("own_sms".into(), 2));
        }
    }
    assert!(lower(&m, &own_split, &target, &opts).is_err());
}
