//! Lowering: every knob yields a valid program that computes the same logits as an independent
//! f64 Llama forward pass written here from the architecture's definition; counts match the
//! reference lowering's published formulas; position patches are accepted up to the KV length.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test file

use amk_backend_cpu::CpuBackend;
use amk_core::sim::SplitMix;
use amk_core::{
    DType, GpuTarget, Opcode, PageStrategy, Registry, ScheduleConfig, SmAssignment, Tensor,
    WeightStore,
};
use amk_model_llama::config::{ModelConfig, RopeScaling};
use amk_model_llama::lower::{LowerOptions, lower, tuned_schedule};
use amk_model_llama::model::{Model, ModelFormat, tensor_names};
use amk_model_llama::run::{Engine, argmax};
use rstest::rstest;

fn cfg(
    layers: usize,
    hidden: usize,
    heads: usize,
    kv: usize,
    hd: usize,
    inter: usize,
    vocab: usize,
) -> ModelConfig {
    ModelConfig {
        hidden,
        n_heads: heads,
        n_kv_heads: kv,
        head_dim: hd,
        intermediate: inter,
        vocab,
        n_layers: layers,
        rms_eps: 1e-5,
        rope_theta: 10000.0,
        max_position_embeddings: 64,
        tie_word_embeddings: true,
        attention_bias: false,
        rope_scaling: RopeScaling::None,
    }
}

/// A model with random weights (norm weights around 1, matrices ±scale, biases ±0.1).
fn random_model(c: ModelConfig, seed: u64) -> Model {
    let mut rng = SplitMix(seed);
    let mut w = WeightStore::new();
    for (name, shape) in tensor_names(&c) {
        let t = if name.ends_with("norm.weight") {
            Tensor::random(DType::F32, &shape, &mut rng, 0.6, 1.4)
        } else if name.ends_with(".bias") {
            Tensor::random(DType::F32, &shape, &mut rng, -0.1, 0.1)
        } else {
            let k = *shape.last().unwrap_or(&1) as f64;
            let s = 1.5 / k.sqrt();
            Tensor::random(DType::F32, &shape, &mut rng, -s, s)
        };
        w.insert(name, t);
    }
    Model::new(c, w, None, "random", ModelFormat::Hf).unwrap()
}

/// Zero weights of the right shapes (for counting only; never run).
fn shaped_model(c: ModelConfig) -> Model {
    let mut w = WeightStore::new();
    for (name, shape) in tensor_names(&c) {
        w.insert(name, Tensor::zeros(DType::F32, &shape));
    }
    Model::new(c, w, None, "shaped", ModelFormat::Hf).unwrap()
}

fn mat(m: &Model, name: &str) -> (Vec<f64>, usize) {
    let t = m.weights.get(name).unwrap();
    let cols = *t.shape().last().unwrap() as usize;
    (t.to_f32_vec().into_iter().map(f64::from).collect(), cols)
}

fn matvec(m: &Model, name: &str, x: &[f64]) -> Vec<f64> {
    let (w, k) = mat(m, name);
    assert_eq!(k, x.len(), "{name}");
    w.chunks(k)
        .map(|r| r.iter().zip(x).map(|(a, b)| a * b).sum())
        .collect()
}

fn rmsnorm(m: &Model, name: &str, x: &[f64], eps: f64) -> Vec<f64> {
    let (w, _) = mat(m, name);
    let r = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + eps).sqrt();
    x.iter().zip(&w).map(|(a, g)| a * r * g).collect()
}

fn rope(x: &mut [f64], heads: usize, hd: usize, pos: usize, theta: f64) {
    for h in 0..heads {
        let v = &mut x[h * hd..(h + 1) * hd];
        for i in 0..hd / 2 {
            let ang = pos as f64 * theta.powf(-2.0 * i as f64 / hd as f64);
            let (a, b) = (v[i], v[i + hd / 2]);
            v[i] = a * ang.cos() - b * ang.sin();
            v[i + hd / 2] = b * ang.cos() + a * ang.sin();
        }
    }
}

/// Independent f64 forward pass: logits after each token of `tokens`.
fn reference_logits(m: &Model, tokens: &[u32]) -> Vec<Vec<f64>> {
    let c = &m.config;
    let (nh, nkv, hd) = (c.n_heads, c.n_kv_heads, c.head_dim);
    let mut kcache: Vec<Vec<Vec<f64>>> = vec![Vec::new(); c.n_layers];
    let mut vcache: Vec<Vec<Vec<f64>>> = vec![Vec::new(); c.n_layers];
    let (emb, h) = mat(m, "model.embed_tokens.weight");
    let mut out = Vec::new();
    for (pos, &tok) in tokens.iter().enumerate() {
        let mut x: Vec<f64> = emb[tok as usize * h..(tok as usize + 1) * h].to_vec();
        for l in 0..c.n_layers {
            let p = |s: &str| format!("model.layers.{l}.{s}");
            let a = rmsnorm(m, &p("input_layernorm.weight"), &x, c.rms_eps);
            let mut q = matvec(m, &p("self_attn.q_proj.weight"), &a);
            let mut k = matvec(m, &p("self_attn.k_proj.weight"), &a);
            let mut v = matvec(m, &p("self_attn.v_proj.weight"), &a);
            if c.attention_bias {
                for (vec, b) in [(&mut q, "q"), (&mut k, "k"), (&mut v, "v")] {
                    let (bias, _) = mat(m, &p(&format!("self_attn.{b}_proj.bias")));
                    vec.iter_mut().zip(bias).for_each(|(y, b)| *y += b);
                }
            }
            rope(&mut q, nh, hd, pos, c.rope_theta);
            rope(&mut k, nkv, hd, pos, c.rope_theta);
            kcache[l].push(k);
            vcache[l].push(v);
            let mut att = vec![0.0; nh * hd];
            for hh in 0..nh {
                let g = hh / (nh / nkv);
                let qh = &q[hh * hd..(hh + 1) * hd];
                let s: Vec<f64> = kcache[l]
                    .iter()
                    .map(|k| {
                        qh.iter()
                            .zip(&k[g * hd..(g + 1) * hd])
                            .map(|(a, b)| a * b)
                            .sum::<f64>()
                            / (hd as f64).sqrt()
                    })
                    .collect();
                let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|v| (v - mx).exp()).collect();
                let z: f64 = e.iter().sum();
                for (j, v) in vcache[l].iter().enumerate() {
                    for d in 0..hd {
                        att[hh * hd + d] += e[j] / z * v[g * hd + d];
                    }
                }
            }
            let o = matvec(m, &p("self_attn.o_proj.weight"), &att);
            x.iter_mut().zip(&o).for_each(|(a, b)| *a += b);
            let a2 = rmsnorm(m, &p("post_attention_layernorm.weight"), &x, c.rms_eps);
            let g = matvec(m, &p("mlp.gate_proj.weight"), &a2);
            let u = matvec(m, &p("mlp.up_proj.weight"), &a2);
            let act: Vec<f64> = g
                .iter()
                .zip(&u)
                .map(|(g, u)| g / (1.0 + (-g).exp()) * u)
                .collect();
            let d = matvec(m, &p("mlp.down_proj.weight"), &act);
            x.iter_mut().zip(&d).for_each(|(a, b)| *a += b);
        }
        let f = rmsnorm(m, "model.norm.weight", &x, c.rms_eps);
        let head = if c.tie_word_embeddings {
            "model.embed_tokens.weight"
        } else {
            "lm_head.weight"
        };
        out.push(matvec(m, head, &f));
    }
    out
}

fn schedule(
    tiling: &[(&str, &[(&str, i64)])],
    fusion: bool,
    sm: SmAssignment,
    pages: PageStrategy,
) -> ScheduleConfig {
    ScheduleConfig {
        tiling: tiling
            .iter()
            .map(|(g, kv)| {
                (
                    g.to_string(),
                    kv.iter().map(|(k, v)| (k.to_string(), *v)).collect(),
                )
            })
            .collect(),
        fusion_grouping: if fusion {
            vec![
                vec!["embed".into(), "rope".into()],
                vec!["gemv".into(), "add".into()],
            ]
        } else {
            vec![]
        },
        sm_assignment: sm,
        page_allocation: pages,
        ..ScheduleConfig::default()
    }
}

/// `schedule` with every fusion of the tuned schedule (norms, Q/K/V + RoPE + append, gate/up +
/// SiLU, residual adds).
fn all_fused(
    tiling: &[(&str, &[(&str, i64)])],
    sm: SmAssignment,
    pages: PageStrategy,
) -> ScheduleConfig {
    ScheduleConfig {
        fusion_grouping: tuned_schedule().fusion_grouping,
        ..schedule(tiling, false, sm, pages)
    }
}

/// `all_fused` plus the attention inside the output projection (`["attention", "gemv"]`).
fn attention_fused(
    tiling: &[(&str, &[(&str, i64)])],
    sm: SmAssignment,
    pages: PageStrategy,
) -> ScheduleConfig {
    let mut sc = all_fused(tiling, sm, pages);
    let g = vec!["attention".to_string(), "gemv".to_string()];
    if !sc.fusion_grouping.contains(&g) {
        sc.fusion_grouping.push(g);
    }
    sc
}

/// Only the attention inside the output projection: its tiles write `o`, then an ADD.
fn attention_fused_alone() -> ScheduleConfig {
    ScheduleConfig {
        fusion_grouping: vec![vec!["attention".into(), "gemv".into()]],
        ..ScheduleConfig::default()
    }
}

fn h100() -> GpuTarget {
    GpuTarget::by_name("h100").unwrap()
}

fn max_rel_err(got: &[f32], want: &[f64]) -> f64 {
    let scale = want.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-6);
    got.iter()
        .zip(want)
        .map(|(g, w)| (*g as f64 - w).abs() / scale)
        .fold(0.0, f64::max)
}

fn run_and_compare(model: &Model, sc: &ScheduleConfig, tokens: &[u32]) {
    let reg = registry();
    let lowered = lower(
        model,
        sc,
        &h100(),
        &LowerOptions {
            max_seq: Some(16),
            ..LowerOptions::default()
        },
    )
    .unwrap();
    let mut e = Engine::new(lowered, &CpuBackend::default(), &reg).unwrap();
    let want = reference_logits(model, tokens);
    for (i, &t) in tokens.iter().enumerate() {
        let got = e.step(t).unwrap();
        let err = max_rel_err(&got, &want[i]);
        assert!(err < 2e-5, "position {i}: max relative error {err}");
    }
}

fn registry() -> Registry {
    amk_ops::registry().unwrap()
}

#[rstest]
#[case::gqa_auto(cfg(2, 32, 4, 2, 8, 48, 40), schedule(&[], false, SmAssignment::LoadBalance, PageStrategy::GraphColor))]
#[case::mha_ntile8(cfg(1, 24, 3, 3, 8, 40, 33), schedule(&[("gemv", &[("N_tile", 8)])], false, SmAssignment::RoundRobin, PageStrategy::Linear))]
#[case::mqa_split3(cfg(2, 32, 4, 1, 8, 48, 40), schedule(&[("gemv", &[("N_tile", 16)]), ("attention", &[("n_partitions", 3)])], false, SmAssignment::LoadBalance, PageStrategy::None))]
#[case::fused_rope(cfg(2, 32, 4, 2, 8, 48, 40), schedule(&[("gemv", &[("base_width", 20)])], true, SmAssignment::RoundRobin, PageStrategy::GraphColor))]
#[case::split8_fused(cfg(1, 32, 2, 2, 16, 64, 50), schedule(&[("attention", &[("n_partitions", 8)])], true, SmAssignment::LoadBalance, PageStrategy::GraphColor))]
#[case::sm_tiles_fused(cfg(2, 32, 4, 2, 8, 48, 40), schedule(&[("gemv", &[("sm_multiple", 1)])], true, SmAssignment::LoadBalance, PageStrategy::GraphColor))]
#[case::all_fused(cfg(2, 32, 4, 2, 8, 48, 40), all_fused(&[], SmAssignment::LoadBalance, PageStrategy::GraphColor))]
#[case::all_fused_sm(cfg(2, 32, 4, 2, 8, 48, 40), all_fused(&[("gemv", &[("sm_multiple", 1)])], SmAssignment::LoadBalance, PageStrategy::GraphColor))]
#[case::all_fused_mqa_split(cfg(2, 32, 4, 1, 8, 48, 40), all_fused(&[("gemv", &[("N_tile", 6)]), ("attention", &[("n_partitions", 3)])], SmAssignment::RoundRobin, PageStrategy::Linear))]
#[case::all_fused_odd_tiles(cfg(1, 24, 3, 3, 8, 40, 33), all_fused(&[("gemv", &[("N_tile", 5)])], SmAssignment::RoundRobin, PageStrategy::None))]
#[case::attention_fused(cfg(2, 32, 4, 2, 8, 48, 40), attention_fused(&[("gemv", &[("sm_multiple", 1)])], SmAssignment::LoadBalance, PageStrategy::GraphColor))]
#[case::attention_fused_mqa_odd(cfg(2, 24, 3, 1, 8, 40, 33), attention_fused(&[("gemv", &[("N_tile", 5)])], SmAssignment::RoundRobin, PageStrategy::Linear))]
#[case::attention_fused_alone(cfg(2, 32, 4, 2, 8, 48, 40), attention_fused_alone())]
fn lowered_decode_matches_f64_forward(#[case] c: ModelConfig, #[case] sc: ScheduleConfig) {
    let model = random_model(c, 7);
    let tokens = [3u32, 17, 0, 29, 5, 5, 11, 2, 31, 8];
    run_and_compare(&model, &sc, &tokens);
}

#[test]
fn untied_head_and_qkv_biases_match() {
    let mut c = cfg(2, 32, 4, 2, 8, 48, 40);
    c.tie_word_embeddings = false;
    c.attention_bias = true;
    c.rope_theta = 500000.0;
    let model = random_model(c, 11);
    run_and_compare(&model, &ScheduleConfig::default(), &[1, 2, 3, 39, 0, 4]);
}

/// The fused ops round every intermediate as the unfused program stores it, so the CPU VM's
/// logits of a fused lowering equal the unfused one's bit for bit (f32 and bf16, biases too).
#[rstest]
#[case::f32(DType::F32, false)]
#[case::bf16(DType::BF16, false)]
#[case::bf16_biases(DType::BF16, true)]
fn fused_logits_equal_unfused_logits(#[case] dtype: DType, #[case] biases: bool) {
    let mut c = cfg(2, 32, 4, 2, 8, 48, 40);
    c.attention_bias = biases;
    c.tie_word_embeddings = !biases;
    let model = random_model(c, 13);
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
    // The fused Q/K/V tiles read the position from the `pos` input (KV_APPEND's patches go);
    // every ATTENTION_GEMV tile carries its own kv_len (one patch per tile).
    let tiles = |l: &amk_model_llama::lower::Lowered| {
        l.program
            .tasks
            .iter()
            .filter(|t| t.op == Opcode::ATTENTION_GEMV)
            .count()
    };
    let (ea, eb) = (a.positions.edits(3).len(), b.positions.edits(3).len());
    let appends = if biases { 0 } else { 2 * 2 };
    assert_eq!(eb, ea - 2 - appends + tiles(&b), "{eb} vs {ea} edits");
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
    let mut ea = Engine::new(a, &CpuBackend::default(), &reg).unwrap();
    let mut eb = Engine::new(b, &CpuBackend::default(), &reg).unwrap();
    for t in [3u32, 17, 0, 29, 5, 11] {
        let (la, lb) = (ea.step(t).unwrap(), eb.step(t).unwrap());
        let same = la.iter().zip(&lb).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "token {t}: fused logits differ from the unfused ones");
    }
}

#[test]
fn argmax_output_equals_host_argmax() {
    let model = random_model(cfg(1, 32, 4, 2, 8, 48, 40), 3);
    let reg = registry();
    let lowered = lower(
        &model,
        &ScheduleConfig::default(),
        &h100(),
        &LowerOptions::default(),
    )
    .unwrap();
    assert!(
        lowered
            .program
            .buffers
            .iter()
            .any(|b| b.name == "next_token")
    );
    let mut e = Engine::new(lowered, &CpuBackend::default(), &reg).unwrap();
    let logits = e.step(5).unwrap();
    let want = reference_logits(&model, &[5]);
    let best =
        want[0].iter().enumerate().fold(
            (0, f64::NEG_INFINITY),
            |b, (i, &v)| if v > b.1 { (i, v) } else { b },
        );
    assert_eq!(argmax(&logits) as usize, best.0);
}

/// Counts of the reference lowering (notes §4.3): toy 2L untied (66 / 48 / 42 tasks at auto /
/// N_tile 64 / 128; 65 buffers; 41 counters), Llama h512 L2 (458 / 274 / 182), and the
/// SmolLM2-135M shape at N_tile 128 (1716 tasks, 848 buffers, 573 counters).
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

#[test]
fn position_patches_are_accepted_to_the_end_of_the_cache_and_refused_beyond() {
    let model = random_model(cfg(1, 32, 4, 2, 8, 48, 40), 5);
    let reg = registry();
    for parts in [1, 4] {
        let (l, vp) = split_kv_program(&model, parts, &reg);
        for pos in 0..12 {
            vp.check_patch(&reg, &l.positions.edits(pos)).unwrap();
        }
        assert!(vp.check_patch(&reg, &l.positions.edits(12)).is_err());
    }
}

/// The attention fused into the output projection: every tile's kv_len moves with the
/// position, patches are accepted to the end of the cache and refused beyond, and a split KV
/// (which the fused tiles cannot compute) is a typed lowering error.
#[test]
fn attention_fused_tiles_take_position_patches_and_refuse_split_kv() {
    let model = random_model(cfg(2, 32, 4, 2, 8, 48, 40), 5);
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
    let tiles: Vec<u32> = l
        .program
        .tasks
        .iter()
        .filter(|t| t.op == Opcode::ATTENTION_GEMV)
        .map(|t| t.id)
        .collect();
    assert_eq!(tiles.len(), 2 * 4, "two layers of four tiles");
    let edits = l.positions.edits(7);
    for t in &tiles {
        assert!(
            edits.contains(&(*t, "kv_len", 8)),
            "tile {t} is not patched to 8 rows"
        );
    }
    let vp = amk_core::validate_owned(l.program.clone(), &reg)
        .map_err(|r| r.report())
        .unwrap();
    for pos in 0..12 {
        vp.check_patch(&reg, &l.positions.edits(pos)).unwrap();
    }
    assert!(vp.check_patch(&reg, &l.positions.edits(12)).is_err());
    let mut split = sc.clone();
    split
        .tiling
        .push(("attention".into(), vec![("n_partitions".into(), 2)]));
    let Err(err) = lower(&model, &split, &h100(), &opts) else {
        panic!("a split KV with the attention fused was accepted");
    };
    assert!(err.to_string().contains("n_partitions"), "{err}");
}

#[test]
fn bad_options_are_typed_errors() {
    let model = random_model(cfg(1, 32, 4, 2, 8, 48, 40), 5);
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
    ];
    for sc in bad {
        let e = lower(&model, &sc, &t, &LowerOptions::default()).unwrap_err();
        assert!(matches!(e, amk_model_llama::ModelError::Lower(_)), "{e}");
    }
    for opts in [
        LowerOptions {
            max_seq: Some(0),
            ..LowerOptions::default()
        },
        LowerOptions {
            max_seq: Some(65),
            ..LowerOptions::default()
        },
        LowerOptions {
            pos: 64,
            ..LowerOptions::default()
        },
        LowerOptions {
            dtype: DType::I8,
            ..LowerOptions::default()
        },
    ] {
        assert!(lower(&model, &ScheduleConfig::default(), &t, &opts).is_err());
    }
}

#[test]
fn context_overflow_is_an_error_not_a_panic() {
    let model = random_model(cfg(1, 32, 4, 2, 8, 48, 40), 5);
    let reg = registry();
    let l = lower(
        &model,
        &ScheduleConfig::default(),
        &h100(),
        &LowerOptions {
            max_seq: Some(3),
            ..LowerOptions::default()
        },
    )
    .unwrap();
    let mut e = Engine::new(l, &CpuBackend::default(), &reg).unwrap();
    for t in [1, 2, 3] {
        e.step(t).unwrap();
    }
    assert!(matches!(
        e.step(4),
        Err(amk_model_llama::ModelError::ContextFull { max_seq: 3 })
    ));
    assert!(e.step(1).is_err());
    e.reset();
    e.step(40).unwrap_err(); // outside the vocabulary
    e.step(39).unwrap();
}

/// Every knob combination on several shapes (MHA, GQA, MQA, biases, untied, odd widths)
/// lowers to a program the validator accepts.
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
                                let opts = LowerOptions {
                                    dtype,
                                    max_seq: Some(20),
                                    pos: 5,
                                    argmax: true,
                                };
                                let p = lower(&model, &sc, &t, &opts).unwrap().program;
                                let r = amk_core::validate(&p, &reg);
                                assert!(r.ok(), "{sc:?} {dtype}: {}", r.report());
                                n += 1;
                            }
                        }
                    }
                }
            }
        }
    }
    assert_eq!(n, 5 * 3 * 2 * 2 * 2 * 3 * 2);
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

/// Patches are absolute (each is checked against the loaded program, so a session applies it
/// to the loaded params, not on top of the previous patch) and bound to their program.
#[test]
fn param_patches_are_absolute_and_bound_to_their_program() {
    use amk_core::Session;
    let model = random_model(cfg(1, 32, 4, 2, 8, 48, 40), 5);
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
    let p1 = vp
        .check_patch(&reg, &[(shard, "kv_start", 8), (shard, "kv_len", 4)])
        .unwrap();
    s.set_params(&p1).unwrap();
    let params = |s: &amk_backend_cpu::CpuSession| {
        let t = &s.program().tasks[shard as usize];
        (t.param_i64("kv_start"), t.param_i64("kv_len"))
    };
    assert_eq!(params(&s), (Some(8), Some(4)));
    // Checked against the loaded kv_start (1 at pos 0: shard 1 of 2 over one row is empty).
    let p2 = vp.check_patch(&reg, &[(shard, "kv_len", 11)]).unwrap();
    s.set_params(&p2).unwrap();
    assert_eq!(
        params(&s),
        (Some(1), Some(11)),
        "the first patch's kv_start must not linger"
    );
    // kv_start 8 + kv_len 11 would overrun the 12-row cache: refused when checked together.
    assert!(
        vp.check_patch(&reg, &[(shard, "kv_start", 8), (shard, "kv_len", 11)])
            .is_err()
    );
    // Region params are never patchable; unknown keys and tasks are refused.
    let tile = vp
        .program()
        .tasks
        .iter()
        .position(|t| t.op == amk_core::Opcode::GEMV_TILE)
        .unwrap() as u32;
    assert!(vp.check_patch(&reg, &[(tile, "n_off", 0)]).is_err());
    assert!(vp.check_patch(&reg, &[(shard, "pos", 0)]).is_err());
    assert!(vp.check_patch(&reg, &[(99_999, "kv_len", 1)]).is_err());
    // A patch checked against another validation of the same program is refused.
    let other = amk_core::validate_owned(l.program.clone(), &reg).unwrap();
    let foreign = other.check_patch(&reg, &[(shard, "kv_len", 2)]).unwrap();
    assert!(s.set_params(&foreign).is_err());
}

/// Half-precision programs: weights, activations and caches in F16 / BF16 (fp32
/// accumulation inside the ops) stay close to the f64 forward pass and agree on the greedy
/// token (spec §5: bf16 is judged by greedy agreement and logit error ≤ 2e-2).
#[rstest]
#[case::f16(DType::F16, 5e-3)]
#[case::bf16(DType::BF16, 2e-2)]
fn half_precision_decode_stays_close(#[case] dtype: DType, #[case] tol: f64) {
    let model = random_model(cfg(2, 32, 4, 2, 8, 48, 40), 21);
    let reg = registry();
    let opts = LowerOptions {
        dtype,
        max_seq: Some(16),
        ..LowerOptions::default()
    };
    let l = lower(&model, &ScheduleConfig::default(), &h100(), &opts).unwrap();
    let mut e = Engine::new(l, &CpuBackend::default(), &reg).unwrap();
    let tokens = [3u32, 17, 0, 29, 5, 11];
    let want = reference_logits(&model, &tokens);
    let mut agree = 0;
    for (i, &t) in tokens.iter().enumerate() {
        let got = e.step(t).unwrap();
        let err = max_rel_err(&got, &want[i]);
        assert!(err < tol, "{dtype} position {i}: max relative error {err}");
        let best = want[i]
            .iter()
            .enumerate()
            .fold(
                (0, f64::NEG_INFINITY),
                |b, (j, &v)| if v > b.1 { (j, v) } else { b },
            )
            .0;
        agree += usize::from(argmax(&got) as usize == best);
    }
    assert!(
        agree >= tokens.len() - 1,
        "{dtype}: greedy agreed at {agree}/{} positions",
        tokens.len()
    );
}

#[test]
fn f16_overflow_and_oversized_kv_are_refused() {
    let mut model = random_model(cfg(1, 32, 4, 2, 8, 48, 40), 5);
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
/// the program validates and a shape-only model lowers without weight data.
#[test]
fn sm_multiple_tiles_every_projection_over_all_sms() {
    use amk_model_llama::lower::tuned_schedule;
    use amk_model_llama::presets;
    let reg = amk_ops::registry().unwrap();
    let m = Model::shape_only(presets::preset("llama-3.2-1b").unwrap(), "1b shape");
    let target = GpuTarget::by_name("h100").unwrap();
    let tiles = |cfg: &ScheduleConfig, prefix: &str| -> Vec<i64> {
        let lowered = lower(&m, cfg, &target, &LowerOptions::default()).unwrap();
        assert!(lowered.weights.is_empty());
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
    // The tuned schedule keeps one SM for the attention: 131 LM-head tiles of 984 rows.
    let head = tiles(&tuned_schedule(), "lm_head");
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

/// The tuned schedule alternates a small model's phases (`gemv.alternate_max_kb`): SmolLM2's
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
    let tuned = tuned_schedule();
    let mut plain = tuned_schedule();
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
    let opts = LowerOptions {
        pos: 37,
        ..LowerOptions::default()
    };
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
