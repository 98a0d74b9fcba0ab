//! The lowered programs, run through the engine on the CPU VM, against an independent f64
//! Llama forward pass written here from the architecture's definition: every knob computes the
//! same logits at every position; fused programs equal unfused ones bit for bit; half
//! precision stays close and agrees on the greedy token; the greedy token is the f64 argmax;
//! the KV cache's end is an error, not a panic; and a program without a decode loop, stepped
//! by the host with `pos` as an input, gives the engine's logits bit for bit. (The lowering's
//! structure is tested in `models/llama/tests/lower.rs`.)
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test file

use amk_backend_cpu::CpuBackend;
use amk_core::testkit::max_rel_err;
use amk_core::{
    Backend, DType, Opcode, PageStrategy, ScheduleConfig, SmAssignment, Tensor, decode,
};
use amk_engine::{Engine, EngineError, EngineOptions, Finish, Request, argmax, lower_and_load};
use amk_model_llama::Model;
use amk_model_llama::config::ModelConfig;
use amk_model_llama::lower::{LowerOptions, lower, tuned_schedule};
use rstest::rstest;

#[path = "../../llama/tests/support/shared.rs"]
mod shared;
use shared::*;

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

/// `model` lowered as a decode loop under `sc` with a `max_seq`-row cache, loaded on the CPU VM.
fn engine(model: &Model, sc: &ScheduleConfig, dtype: DType, max_seq: u64) -> Engine {
    let opts = EngineOptions {
        schedule: sc.clone(),
        target: h100(),
        dtype,
        max_seq: Some(max_seq),
        stop_slots: 2,
        prefill_rows: None,
        short_context: None,
    };
    lower_and_load(model, &opts, &CpuBackend::default(), &registry()).unwrap()
}

/// The engine's logits after each token of `tokens`, from position 0 (one pass per launch).
fn logits_after_each(e: &mut Engine, tokens: &[u32]) -> Vec<Vec<f32>> {
    let mut ids = tokens.to_vec();
    ids.push(0); // forced_logits feeds every id but the last
    let mut out: Vec<Vec<f32>> = Vec::new();
    e.forced_logits(&ids, &mut |pos, l| {
        assert_eq!(pos, out.len());
        out.push(l.to_vec());
    })
    .unwrap();
    assert_eq!(out.len(), tokens.len());
    out
}

/// Index of the largest f64 logit.
fn best(want: &[f64]) -> usize {
    want.iter()
        .enumerate()
        .fold(
            (0, f64::NEG_INFINITY),
            |b, (j, &v)| if v > b.1 { (j, v) } else { b },
        )
        .0
}

fn run_and_compare(model: &Model, sc: &ScheduleConfig, tokens: &[u32]) {
    let mut e = engine(model, sc, DType::F32, 16);
    let want = reference_logits(model, tokens);
    let got = logits_after_each(&mut e, tokens);
    for (i, (got, want)) in got.iter().zip(&want).enumerate() {
        let err = max_rel_err(got, want);
        assert!(err < 2e-5, "position {i}: max relative error {err}");
    }
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
#[case::split_kv(cfg(2, 32, 4, 2, 8, 48, 40), schedule(&[("attention", &[("split_kv", 4), ("split_chunk", 2)])], false, SmAssignment::LoadBalance, PageStrategy::GraphColor))]
#[case::split_kv_mha_odd(cfg(1, 24, 3, 3, 8, 40, 33), schedule(&[("gemv", &[("N_tile", 5)]), ("attention", &[("split_kv", 3), ("split_chunk", 3)])], true, SmAssignment::RoundRobin, PageStrategy::Linear))]
#[case::split_kv_all_fused_mqa(cfg(2, 32, 4, 1, 8, 48, 40), all_fused(&[("gemv", &[("sm_multiple", 1)]), ("attention", &[("split_kv", 3), ("split_chunk", 1)])], SmAssignment::LoadBalance, PageStrategy::GraphColor))]
#[case::split_kv_merged(cfg(2, 32, 4, 2, 8, 48, 40), schedule(&[("attention", &[("split_kv", 4), ("split_chunk", 2), ("merge_heads", 1)])], false, SmAssignment::LoadBalance, PageStrategy::GraphColor))]
#[case::split_kv_merged_ragged_fused(cfg(2, 32, 4, 1, 8, 48, 40), all_fused(&[("gemv", &[("sm_multiple", 1)]), ("attention", &[("split_kv", 3), ("split_chunk", 1), ("merge_heads", 3)])], SmAssignment::LoadBalance, PageStrategy::GraphColor))]
fn lowered_decode_matches_f64_forward(#[case] c: ModelConfig, #[case] sc: ScheduleConfig) {
    let model = Model::random(c, 7).unwrap();
    let tokens = [3u32, 17, 0, 29, 5, 5, 11, 2, 31, 8];
    run_and_compare(&model, &sc, &tokens);
}

#[test]
fn untied_head_and_qkv_biases_match() {
    let mut c = cfg(2, 32, 4, 2, 8, 48, 40);
    c.tie_word_embeddings = false;
    c.attention_bias = true;
    c.rope_theta = 500000.0;
    let model = Model::random(c, 11).unwrap();
    run_and_compare(&model, &ScheduleConfig::default(), &[1, 2, 3, 39, 0, 4]);
}

/// The fused ops round every intermediate as the unfused program stores it, so the CPU VM's
/// logits of a fused lowering equal the unfused one's bit for bit (f32 and bf16, biases too).
/// (Which ops the fused lowering uses: `models/llama/tests/lower.rs`.)
#[rstest]
#[case::f32(DType::F32, false)]
#[case::bf16(DType::BF16, false)]
#[case::bf16_biases(DType::BF16, true)]
fn fused_logits_equal_unfused_logits(#[case] dtype: DType, #[case] biases: bool) {
    let mut c = cfg(2, 32, 4, 2, 8, 48, 40);
    c.attention_bias = biases;
    c.tie_word_embeddings = !biases;
    let model = Model::random(c, 13).unwrap();
    let tiling: &[(&str, &[(&str, i64)])] = &[("gemv", &[("N_tile", 6)])];
    // The residual fusion changes bf16 roundings (one instead of two): both programs keep it.
    let plain = ScheduleConfig {
        fusion_grouping: vec![vec!["gemv".into(), "add".into()]],
        ..schedule(tiling, false, SmAssignment::LoadBalance, PageStrategy::None)
    };
    let fused = attention_fused(tiling, SmAssignment::LoadBalance, PageStrategy::None);
    let mut ea = engine(&model, &plain, dtype, 16);
    let mut eb = engine(&model, &fused, dtype, 16);
    let tasks = |e: &Engine| e.program().program().tasks.len();
    assert!(tasks(&eb) < tasks(&ea));
    let tokens = [3u32, 17, 0, 29, 5, 11];
    let (la, lb) = (
        logits_after_each(&mut ea, &tokens),
        logits_after_each(&mut eb, &tokens),
    );
    for (i, (la, lb)) in la.iter().zip(&lb).enumerate() {
        let same =
            la.len() == lb.len() && la.iter().zip(lb).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(
            same,
            "token {} (position {i}): fused logits differ from the unfused ones",
            tokens[i]
        );
    }
}

/// The engine's greedy choice (NEXT_TOKEN on the device) and the host argmax of its logits are
/// the f64 forward pass's argmax. (SAMPLE_ARGMAX against the host argmax:
/// `models/llama/tests/lower.rs`.)
#[test]
fn greedy_token_is_the_f64_argmax() {
    let model = Model::random(cfg(1, 32, 4, 2, 8, 48, 40), 3).unwrap();
    let mut e = engine(&model, &ScheduleConfig::default(), DType::F32, 16);
    let want = best(&reference_logits(&model, &[5])[0]);
    let logits = logits_after_each(&mut e, &[5]);
    assert_eq!(argmax(&logits[0]) as usize, want);
    let req = Request::greedy(&[5], 1, &[]);
    let g = e.generate(&req, &mut |_| true).unwrap();
    assert_eq!(g.tokens.len(), 1);
    assert_eq!(g.tokens[0].id as usize, want);
    assert_eq!(g.finish, Finish::Length);
}

/// A sequence longer than the KV cache is an error (teacher forcing, a prompt) or ends
/// generation with `ContextFull`, never a panic, and the engine serves the next request.
#[test]
fn context_overflow_is_an_error_not_a_panic() {
    let model = Model::random(cfg(1, 32, 4, 2, 8, 48, 40), 5).unwrap();
    let mut e = engine(&model, &ScheduleConfig::default(), DType::F32, 3);
    assert_eq!(e.max_seq(), 3);
    // Three tokens fit the three rows.
    let before = logits_after_each(&mut e, &[1, 2]);
    let mut n = 0;
    e.forced_logits(&[1, 2, 3], &mut |_, _| n += 1).unwrap();
    assert_eq!(n, 2);
    let full = |r: Result<(), EngineError>| match r {
        Err(EngineError::ContextFull { prompt, max_seq }) => (prompt, max_seq),
        other => panic!("expected ContextFull, got {other:?}"),
    };
    assert_eq!(full(e.forced_logits(&[1, 2, 3, 4], &mut |_, _| ())), (4, 3));
    let req = |prompt: &'static [u32], max_new: usize| Request::greedy(prompt, max_new, &[]);
    assert_eq!(
        full(
            e.generate(&req(&[1, 2, 3, 4], 1), &mut |_| true)
                .map(|_| ())
        ),
        (4, 3)
    );
    // Generation stops where the cache ends, and says so.
    let g = e.generate(&req(&[1, 2], 5), &mut |_| true).unwrap();
    assert_eq!((g.tokens.len(), g.finish), (1, Finish::ContextFull));
    let g = e.generate(&req(&[1, 2, 3], 5), &mut |_| true).unwrap();
    assert_eq!((g.tokens.len(), g.finish), (0, Finish::ContextFull));
    // A token outside the vocabulary is a request error; the engine still serves.
    assert!(matches!(
        e.forced_logits(&[40, 1], &mut |_, _| ()),
        Err(EngineError::Request(_))
    ));
    assert!(matches!(
        e.generate(&req(&[40], 1), &mut |_| true),
        Err(EngineError::Request(_))
    ));
    assert_eq!(logits_after_each(&mut e, &[39]).len(), 1);
    let after = logits_after_each(&mut e, &[1, 2]);
    let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
    assert!(
        before.iter().zip(&after).all(|(a, b)| same(a, b)),
        "the errors left state behind"
    );
}

/// Half-precision programs: weights, activations and caches in F16 / BF16 (fp32
/// accumulation inside the ops) stay close to the f64 forward pass and agree on the greedy
/// token (docs/ir.md, "Numerics": bf16 is judged by greedy agreement and logit error ≤ 2e-2).
#[rstest]
#[case::f16(DType::F16, 5e-3)]
#[case::bf16(DType::BF16, 2e-2)]
fn half_precision_decode_stays_close(#[case] dtype: DType, #[case] tol: f64) {
    let model = Model::random(cfg(2, 32, 4, 2, 8, 48, 40), 21).unwrap();
    let mut e = engine(&model, &ScheduleConfig::default(), dtype, 16);
    let tokens = [3u32, 17, 0, 29, 5, 11];
    let want = reference_logits(&model, &tokens);
    let got = logits_after_each(&mut e, &tokens);
    let mut agree = 0;
    for (i, (got, want)) in got.iter().zip(&want).enumerate() {
        let err = max_rel_err(got, want);
        assert!(err < tol, "{dtype} position {i}: max relative error {err}");
        agree += usize::from(argmax(got) as usize == best(want));
    }
    assert!(
        agree >= tokens.len() - 1,
        "{dtype}: greedy agreed at {agree}/{} positions",
        tokens.len()
    );
}

/// The split partials merged by ATTENTION_MERGE tasks (`attention.merge_heads`) give the logits
/// of the same program with the merge in every COMBINE_GEMV tile, bit for bit: the same merge
/// arithmetic, the row rounded to the activation dtype in both, then the same GEMV order.
#[rstest]
#[case::f32(DType::F32, 1)]
#[case::bf16(DType::BF16, 2)]
#[case::bf16_ragged(DType::BF16, 3)]
fn merge_tasks_give_the_combine_tiles_logits(#[case] dtype: DType, #[case] heads: i64) {
    let model = Model::random(cfg(2, 32, 4, 2, 8, 48, 40), 19).unwrap();
    let split = |merge: Option<i64>| {
        let mut keys = vec![("split_kv", 4), ("split_chunk", 2)];
        keys.extend(merge.map(|m| ("merge_heads", m)));
        let tiling: [(&str, &[(&str, i64)]); 2] =
            [("gemv", &[("sm_multiple", 1)]), ("attention", &keys)];
        all_fused(&tiling, SmAssignment::LoadBalance, PageStrategy::GraphColor)
    };
    let mut combined = engine(&model, &split(None), dtype, 16);
    let mut merged = engine(&model, &split(Some(heads)), dtype, 16);
    let count = |e: &Engine, op: Opcode| {
        (e.program().program().tasks.iter())
            .filter(|t| t.op == op)
            .count()
    };
    assert_eq!(count(&merged, Opcode::COMBINE_GEMV), 0);
    assert_eq!(
        count(&merged, Opcode::ATTENTION_MERGE),
        2 * 4usize.div_ceil(heads as usize)
    );
    assert!(count(&combined, Opcode::COMBINE_GEMV) > 0);
    let tokens = [3u32, 17, 0, 29, 5, 5, 11, 2, 31, 8, 1];
    let (a, b) = (
        logits_after_each(&mut combined, &tokens),
        logits_after_each(&mut merged, &tokens),
    );
    for (i, (a, b)) in a.iter().zip(&b).enumerate() {
        let same = a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "{dtype} position {i}: merged logits differ");
    }
}

/// A program lowered without a decode loop (positions as IO inputs) still runs: stepped by
/// the host on a CPU session, `token_id`, `pos` and `reshape_id0` set each step and no param
/// ever patched, it gives the engine's teacher-forced logits bit for bit (and, in f32, the
/// f64 forward pass's).
#[rstest]
#[case::reference(ScheduleConfig::default(), DType::F32)]
#[case::split3(schedule(&[("attention", &[("n_partitions", 3)])], true, SmAssignment::LoadBalance, PageStrategy::GraphColor), DType::F32)]
#[case::attention_fused(attention_fused(&[("gemv", &[("N_tile", 8)])], SmAssignment::RoundRobin, PageStrategy::Linear), DType::F32)]
#[case::tuned(tuned_schedule(), DType::F32)]
#[case::tuned_bf16(tuned_schedule(), DType::BF16)]
#[case::split_kv_fused(all_fused(&[("gemv", &[("sm_multiple", 1)]), ("attention", &[("split_kv", 4), ("split_chunk", 2)])], SmAssignment::LoadBalance, PageStrategy::GraphColor), DType::F32)]
fn a_host_stepped_program_gives_the_engines_logits(
    #[case] sc: ScheduleConfig,
    #[case] dtype: DType,
) {
    let model = Model::random(cfg(2, 32, 4, 2, 8, 48, 40), 7).unwrap();
    let reg = registry();
    let tokens = [3u32, 17, 0, 29, 5, 5, 11, 2];
    let opts = LowerOptions {
        dtype,
        max_seq: Some(16),
        decode_loop: None,
        ..LowerOptions::default()
    };
    let l = lower(&model, &sc, &h100(), &opts).unwrap();
    assert!(l.program.step_loop.is_none());
    let vp = amk_core::validate_owned(l.program, &reg)
        .map_err(|r| r.report())
        .unwrap();
    let mut s = CpuBackend::default().load(&vp, &l.weights, &reg).unwrap();
    let scalar = |v: i64| Tensor::from_i64(DType::I32, &[1], &[v]).unwrap();
    let mut host = Vec::new();
    for (pos, &t) in tokens.iter().enumerate() {
        let out = s
            .step(&[
                (decode::TOKEN, scalar(i64::from(t))),
                (decode::POS, scalar(pos as i64)),
                (decode::RESHAPE_ID, scalar(0)),
            ])
            .unwrap();
        host.push(out.get(decode::LOGITS).unwrap().to_f32_vec());
    }
    let mut e = engine(&model, &sc, dtype, 16);
    let forced = logits_after_each(&mut e, &tokens);
    for (i, (h, f)) in host.iter().zip(&forced).enumerate() {
        let same = h.len() == f.len() && h.iter().zip(f).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(
            same,
            "{dtype} position {i}: the host-stepped logits differ from the engine's"
        );
    }
    if dtype == DType::F32 {
        let want = reference_logits(&model, &tokens);
        for (i, (h, w)) in host.iter().zip(&want).enumerate() {
            let err = max_rel_err(h, w);
            assert!(err < 2e-5, "position {i}: max relative error {err}");
        }
    }
}

/// The defaults every front end starts from, and a user's asks over them (0: none).
#[test]
fn engine_options_defaults_follow_the_placement_and_the_asks() {
    use amk_engine::{
        CPU_SCORE_ROWS, EngineOptions, GPU_PREFILL_ROWS, Placement, SHORT_CONTEXT_ROWS,
    };
    let target = amk_core::GpuTarget::by_name("h100").unwrap();
    let at = |gpu, scoring| Placement { gpu, scoring };
    let of = |dtype, p| {
        EngineOptions::defaults(
            amk_core::ScheduleConfig::default(),
            target.clone(),
            dtype,
            p,
        )
    };
    let gpu = of(DType::BF16, at(true, false));
    assert_eq!(gpu.prefill_rows, Some(GPU_PREFILL_ROWS));
    assert_eq!(gpu.short_context, Some(SHORT_CONTEXT_ROWS));
    assert_eq!(gpu.max_seq, None);
    // f32 on a GPU: prompts token by token; the CPU VM: no short program, chunks only to score.
    assert_eq!(of(DType::F32, at(true, false)).prefill_rows, None);
    let cpu = of(DType::F32, at(false, false));
    assert_eq!((cpu.prefill_rows, cpu.short_context), (None, None));
    assert_eq!(
        of(DType::F32, at(false, true)).prefill_rows,
        Some(CPU_SCORE_ROWS)
    );
    let asked = gpu.clone().with_asked(Some(128), None);
    assert_eq!(
        (asked.prefill_rows, asked.short_context),
        (Some(128), Some(SHORT_CONTEXT_ROWS))
    );
    let none = gpu.with_asked(Some(0), Some(0));
    assert_eq!((none.prefill_rows, none.short_context), (None, None));
}
