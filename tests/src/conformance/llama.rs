//! Toy Llama decode programs against an f64 forward pass and the oracle.

use super::Ctx;
use super::compare::{BF16_TOL, MODEL_TOL, Tol, against_oracle, close, output};
use super::formulas::{Attn, attention, linear, rmsnorm, rope, silu};
use super::outcome::{CaseResult, Failure};
use super::run::{Inputs, random_weights, weight_vals};
use crate::r#gen::{self, LlamaConfig};
use amk_core::{DType, Tensor, WeightStore};

/// A toy decode configuration: 2 layers, H 16, 4 query heads over 2 KV heads of 4, I 24,
/// vocabulary 32, tiles of 8, 8 cache rows.
fn toy_llama(pos: u64) -> LlamaConfig {
    let mut cfg = LlamaConfig::new(2, 16, 4, 2, 4, 24, 32, 8);
    cfg.max_seq = 8;
    cfg.pos = pos;
    cfg
}

/// Inputs of a [`crate::llama_like_with`] program: `token_id` as given, `pos` = the
/// configuration's position, `reshape_id0` = 0.
pub fn llama_inputs(cfg: &LlamaConfig, token: i64) -> Inputs {
    let i32_of = |v: i64| Tensor::from_i64(DType::I32, &[1], &[v]);
    let mut out = Vec::new();
    for (name, v) in [
        ("token_id", token),
        ("pos", cfg.pos as i64),
        ("reshape_id0", 0),
    ] {
        if let Ok(t) = i32_of(v) {
            out.push((name.to_string(), t));
        }
    }
    out
}

/// The logits of one decode step of [`crate::llama_like_with`] in f64: cache rows before
/// `cfg.pos` are zero (fresh caches), row `pos` holds this step's keys and values.
fn llama_f64(cfg: &LlamaConfig, w: &WeightStore, token: usize) -> Result<Vec<f64>, Failure> {
    let (h, hd, nh, nkv) = (
        cfg.hidden as usize,
        cfg.head_dim as usize,
        cfg.heads as usize,
        cfg.kv_heads as usize,
    );
    let (pos, inter) = (cfg.pos as usize, cfg.inter as usize);
    let eps = 1e-6;
    let theta = 10000.0;
    let emb = weight_vals(w, "embed.weight")?;
    let mut x = emb[token * h..(token + 1) * h].to_vec();
    let a = Attn {
        nh,
        nkv,
        hd,
        scale: 1.0 / (hd as f64).sqrt(),
    };
    let row = nkv * hd;
    for l in 0..cfg.layers {
        let wv = |s: &str| weight_vals(w, &format!("layers.{l}.{s}"));
        let an = rmsnorm(&x, &wv("input_norm")?, eps);
        let q = linear(&an, &wv("attn.q_proj.weight")?, h, None);
        let k = linear(&an, &wv("attn.k_proj.weight")?, h, None);
        let v = linear(&an, &wv("attn.v_proj.weight")?, h, None);
        let p = [pos as f64];
        let q = rope(&q, &p, hd, theta);
        let k = rope(&k, &p, hd, theta);
        let mut kc = vec![0.0; (pos + 1) * row];
        let mut vc = vec![0.0; (pos + 1) * row];
        kc[pos * row..].copy_from_slice(&k);
        vc[pos * row..].copy_from_slice(&v);
        let att = attention(a, &q, &kc, &vc, 0, pos + 1);
        let o = linear(&att, &wv("attn.o_proj.weight")?, nh * hd, None);
        let hm: Vec<f64> = x.iter().zip(&o).map(|(a, b)| a + b).collect();
        let mn = rmsnorm(&hm, &wv("post_norm")?, eps);
        let g = linear(&mn, &wv("mlp.gate_proj.weight")?, h, None);
        let u = linear(&mn, &wv("mlp.up_proj.weight")?, h, None);
        let act: Vec<f64> = g.iter().zip(&u).map(|(g, u)| silu(*g) * u).collect();
        let down = linear(&act, &wv("mlp.down_proj.weight")?, inter, None);
        x = hm.iter().zip(&down).map(|(a, b)| a + b).collect();
    }
    let hf = rmsnorm(&x, &weight_vals(w, "final_norm")?, eps);
    Ok(linear(&hf, &weight_vals(w, "lm_head.weight")?, h, None))
}

/// Two steps (two tokens) of `cfg` on the backend, against the oracle and, when `f64_check`,
/// against [`llama_f64`].
fn llama_case(c: &Ctx<'_>, cfg: &LlamaConfig, f64_check: bool, tol: Tol) -> CaseResult {
    let p = r#gen::llama_like_with(cfg);
    let w = random_weights(&p, cfg.pos ^ 0x11A3A);
    let tokens = [5i64, cfg.vocab as i64 - 2];
    let steps: Vec<Inputs> = tokens.iter().map(|&t| llama_inputs(cfg, t)).collect();
    let got = against_oracle(c, &p, &w, &steps, tol)?;
    if f64_check {
        for (k, (o, &tok)) in got.iter().zip(&tokens).enumerate() {
            let want = llama_f64(cfg, &w, tok as usize)?;
            close(
                &format!("step {k} (token {tok}): logits vs f64"),
                output(o, "logits", k)?,
                &want,
                tol,
            )?;
        }
    }
    Ok(())
}

pub(super) fn llama_pos0(c: &Ctx<'_>) -> CaseResult {
    llama_case(c, &toy_llama(0), true, MODEL_TOL)
}

pub(super) fn llama_pos3(c: &Ctx<'_>) -> CaseResult {
    llama_case(c, &toy_llama(3), true, MODEL_TOL)
}

pub(super) fn llama_split_kv(c: &Ctx<'_>) -> CaseResult {
    let mut cfg = toy_llama(5);
    cfg.split_kv = 3;
    llama_case(c, &cfg, true, MODEL_TOL)
}

pub(super) fn llama_sm_pages(c: &Ctx<'_>) -> CaseResult {
    let mut cfg = toy_llama(2);
    cfg.sm_round_robin = true;
    cfg.pages = true;
    cfg.split_kv = 2;
    llama_case(c, &cfg, true, MODEL_TOL)
}

pub(super) fn llama_bf16(c: &Ctx<'_>) -> CaseResult {
    let mut cfg = toy_llama(1);
    cfg.dtype = DType::BF16;
    llama_case(c, &cfg, false, BF16_TOL)
}

pub(super) fn llama_wide(c: &Ctx<'_>) -> CaseResult {
    let mut cfg = LlamaConfig::new(3, 32, 8, 2, 8, 64, 64, 16);
    cfg.max_seq = 16;
    cfg.pos = 9;
    cfg.split_kv = 4;
    llama_case(c, &cfg, true, MODEL_TOL)
}
