//! Lowering a model to its prefill program: a chunk of `rows` prompt tokens at consecutive
//! positions in one pass, every projection a grid of LINEAR_TILE tasks (many rows each: matrix
//! arithmetic instead of a weight stream per token), the attention ATTENTION_CAUSAL tasks over
//! (KV head × row block), the chunk's K and V rows appended to the same KV caches the decode
//! program reads (same names, dtype and shape), and logits for the last prompt row or every
//! row.
//!
//! The graph: EMBED of the chunk's ids; per layer LINEAR_TILE q/k/v (each normalising its rows
//! with the input norm, adding Qwen2's biases, turning q and k at the rows' positions — or, with
//! Qwen3's per-head norms, RMSNORM and ROPE tasks after them), KV_APPEND k/v at the chunk's
//! first position, ATTENTION_CAUSAL, LINEAR_TILE o_proj + residual,
//! LINEAR_TILE gate/up + SwiGLU (normalising with the post-attention norm), LINEAR_TILE
//! down_proj + residual; then the final norm and the LM head as LINEAR_TILEs over the last row
//! (gathered by an EMBED of the row index `last`) or every row.
//!
//! Interface ([`IDS`], [`POS`], [`LAST`], `logits`): the host sets the chunk's token ids and
//! positions (a chunk shorter than `rows` is padded: any valid id, the positions continuing
//! past the prompt — their K/V rows land past the prompt, where decoding overwrites each row
//! before it reads it — so `first position + rows` must fit the cache).

use super::{Lowered, cast, int, params, rope_factors, sm};
use crate::error::ModelError;
use crate::model::{
    self, EMBED, FINAL_NORM, LM_HEAD, Model, ModelFormat, ROPE_FREQS, layer_tensor,
};
use amk_core::json::{Map, Value};
use amk_core::{
    BufferId, BufferKind, CounterId, DType, GpuTarget, Opcode, Program, SmAssignment, WeightStore,
    decode,
};
use op_linear_tile::Epilogue;

/// The chunk's token ids: `[rows]` I32, an IO input.
pub const IDS: &str = "prefill.ids";
/// The chunk's positions: `[rows]` I32, an IO input, consecutive (KV_APPEND writes the rows
/// from element 0's position on).
pub const POS: &str = "prefill.pos";
/// With [`PrefillLogits::Last`], the row whose logits the program computes: `[1]` I32.
pub const LAST: &str = "prefill.last";

/// Which rows get logits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefillLogits {
    /// One row, chosen by the [`LAST`] input: `logits` is `[1, vocab]` (generation).
    Last,
    /// Every row: `logits` is `[rows, vocab]` (teacher-forced scoring, perplexity).
    Every,
}

/// How to lower a prefill program.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefillOptions {
    /// Activation, cache and weight dtype (F32, F16 or BF16).
    pub dtype: DType,
    /// KV-cache length: the decode program's, whose caches this program shares.
    pub max_seq: u64,
    /// Tokens a pass takes.
    pub rows: u64,
    /// Which rows get logits.
    pub logits: PrefillLogits,
}

/// A value some tasks produced: its buffer and what a consumer waits for.
#[derive(Clone, Copy)]
struct Val {
    buf: BufferId,
    wait: (CounterId, i64),
}

/// One LINEAR_TILE grid: `x` times `w` (`n` rows of `k`), optionally normalised with `norm`,
/// with an epilogue operand `extra`, into `out`.
struct Linear<'a> {
    x: Val,
    w: BufferId,
    k: u64,
    n: u64,
    norm: Option<BufferId>,
    /// A bias of `w`'s rows (Qwen2's q/k/v).
    bias: Option<BufferId>,
    epilogue: (Epilogue, Option<Val>),
    /// Inputs after the epilogue's operand (the RoPE divisors) and the params that go with
    /// them.
    tail: (&'a [BufferId], &'a Map),
    out: BufferId,
    label: &'a str,
}

struct Builder {
    p: Program,
    dtype: DType,
    dbytes: i64,
    eps: Value,
}

impl Builder {
    fn act(&mut self, name: String, shape: &[u64]) -> BufferId {
        self.p
            .new_buffer(name, BufferKind::ACTIVATION, self.dtype, shape)
    }

    /// A task with its own counter.
    fn single(
        &mut self,
        op: Opcode,
        (ins, out): (&[BufferId], BufferId),
        waits: &[(CounterId, i64)],
        pr: Map,
        label: String,
        bytes: i64,
    ) -> Val {
        let c = self.p.new_counter(format!("{label} ready"));
        let t = self.p.push_task(op, ins, &[out], c, waits, pr, label);
        if let Some(task) = self.p.tasks.get_mut(t as usize) {
            task.est_bytes = bytes;
        }
        Val {
            buf: out,
            wait: (c, 1),
        }
    }

    /// Columns a tile takes: the device tile's (128, or 64 with SwiGLU). A narrower task would
    /// still run the whole device tile, its other columns zero.
    fn tile_cols(epilogue: Epilogue) -> u64 {
        epilogue.device_cols()
    }

    /// The LINEAR_TILE grid of `lin` over `rows` rows, on one counter.
    fn linear(&mut self, lin: &Linear<'_>, rows: u64) -> Val {
        let (epilogue, extra) = lin.epilogue;
        let mut cols = Self::tile_cols(epilogue);
        if let Some(Value::Int(hd)) = lin.tail.1.get("head_dim") {
            let hd = (*hd).max(1) as u64;
            cols = (cols / hd).max(1) * hd;
        }
        let c = self.p.new_counter(format!("{} ready", lin.label));
        let mut ins = vec![lin.x.buf, lin.w];
        ins.extend(lin.norm);
        ins.extend(lin.bias);
        let mut waits = vec![lin.x.wait];
        if let Some(e) = extra {
            ins.push(e.buf);
            if !waits.contains(&e.wait) {
                waits.push(e.wait);
            }
        }
        ins.extend(lin.tail.0);
        let mut tiles = 0;
        let dr = op_linear_tile::DEVICE_ROWS;
        for m0 in (0..rows).step_by(dr as usize) {
            for n0 in (0..lin.n).step_by(cols as usize) {
                let mut pr = params(&[
                    ("K", int(lin.k)),
                    ("m_off", int(m0)),
                    ("M_tile", int(dr.min(rows - m0))),
                    ("n_off", int(n0)),
                    ("N_tile", int(cols.min(lin.n - n0))),
                ]);
                if lin.norm.is_some() {
                    pr.insert("norm", int(1));
                    pr.insert("eps", self.eps.clone());
                }
                if lin.bias.is_some() {
                    pr.insert("flags", Value::Int(op_linear_tile::FLAG_BIAS));
                }
                if epilogue != Epilogue::None {
                    pr.insert("epilogue", Value::Int(epilogue.code()));
                }
                for (key, v) in lin.tail.1.iter() {
                    pr.insert(key, v.clone());
                }
                let label = format!("{}[{tiles}]", lin.label);
                let t =
                    self.p
                        .push_task(Opcode::LINEAR_TILE, &ins, &[lin.out], c, &waits, pr, label);
                if let Some(task) = self.p.tasks.get_mut(t as usize) {
                    let weights = if epilogue == Epilogue::SwiGlu { 2 } else { 1 };
                    task.est_bytes =
                        weights * cols.min(lin.n - n0) as i64 * lin.k as i64 * self.dbytes;
                    task.est_flops =
                        2 * weights * (dr.min(rows - m0) * cols.min(lin.n - n0) * lin.k) as i64;
                }
                tiles += 1;
            }
        }
        Val {
            buf: lin.out,
            wait: (c, tiles),
        }
    }
}

fn check(model: &Model, opts: &PrefillOptions) -> Result<(), ModelError> {
    let mc = &model.config;
    if !matches!(opts.dtype, DType::F32 | DType::F16 | DType::BF16) {
        return Err(ModelError::Lower(format!(
            "dtype {} is not supported for lowering (F32, F16, BF16)",
            opts.dtype
        )));
    }
    if mc.hidden as u64 > op_linear_tile::MAX_NORM_K {
        return Err(ModelError::Lower(format!(
            "the prefill projections normalise rows of at most {} elements, the model's are {}",
            op_linear_tile::MAX_NORM_K,
            mc.hidden
        )));
    }
    if mc.head_dim as u64 > op_attention_causal::MAX_HEAD_DIM {
        return Err(ModelError::Lower(format!(
            "the prefill attention takes heads up to {} wide, the model's are {}",
            op_attention_causal::MAX_HEAD_DIM,
            mc.head_dim
        )));
    }
    if opts.rows == 0 || opts.rows > opts.max_seq {
        return Err(ModelError::Lower(format!(
            "a prefill chunk of {} rows must be between 1 and the cache's {} rows",
            opts.rows, opts.max_seq
        )));
    }
    Ok(())
}

/// Lowers `model` to its prefill program for `target` (see the module documentation).
pub fn lower_prefill(
    model: &Model,
    target: &GpuTarget,
    opts: &PrefillOptions,
) -> Result<Lowered, ModelError> {
    lower_prefill_sharing(model, target, opts, WeightStore::new())
}

/// [`lower_prefill`] starting from `weights` (a decode lowering's, of the same dtype): tensors
/// already there are not cast again.
pub fn lower_prefill_sharing(
    model: &Model,
    target: &GpuTarget,
    opts: &PrefillOptions,
    mut weights: WeightStore,
) -> Result<Lowered, ModelError> {
    check(model, opts)?;
    let mc = &model.config;
    let (h, nh, nkv, hd) = (
        mc.hidden as u64,
        mc.n_heads as u64,
        mc.n_kv_heads as u64,
        mc.head_dim as u64,
    );
    let (q_dim, kv_dim, inter, vocab) =
        (nh * hd, nkv * hd, mc.intermediate as u64, mc.vocab as u64);
    let (rows, max_seq) = (opts.rows, opts.max_seq);
    let mut b = Builder {
        p: Program::new(),
        dtype: opts.dtype,
        dbytes: (opts.dtype.bits() / 8) as i64,
        eps: Value::Float(mc.rms_eps),
    };
    let rope_factors = match rope_factors(model)? {
        Some(f) => {
            let half = f.numel() as u64;
            weights.insert(ROPE_FREQS, f);
            Some(b.p.new_weight(ROPE_FREQS, DType::F32, &[half], ROPE_FREQS))
        }
        None => None,
    };
    let synthetic: Option<std::collections::HashMap<String, Vec<u64>>> = (model.format
        == ModelFormat::Synthetic)
        .then(|| model::tensor_names(mc).into_iter().collect());
    let mut weight = |b: &mut Builder, name: &str| -> Result<BufferId, ModelError> {
        let shape = match &synthetic {
            Some(shapes) => shapes
                .get(name)
                .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?
                .clone(),
            None => {
                let t = model
                    .weights
                    .get(name)
                    .ok_or_else(|| ModelError::MissingTensor(name.to_string()))?;
                if weights.get(name).is_none() {
                    weights.insert_shared(name, cast(name, t, opts.dtype)?);
                }
                t.shape().to_vec()
            }
        };
        Ok(b.p.new_weight(name, opts.dtype, &shape, name))
    };
    let meta = &mut b.p.meta;
    meta.insert("model", Value::from(model.source.clone()));
    meta.insert("gpu", Value::from(target.name.clone()));
    meta.insert("regime", Value::from("prefill"));
    meta.insert("max_seq", int(max_seq));
    meta.insert("rows", int(rows));
    meta.insert("dtype", Value::from(opts.dtype.name().to_string()));
    meta.insert("n_layers", int(mc.n_layers as u64));
    b.p.target = Some(target.clone());

    let io = |b: &mut Builder, name: &str, len: u64| {
        b.p.new_buffer(name, BufferKind::IO_INPUT, DType::I32, &[len])
    };
    let ids = io(&mut b, IDS, rows);
    let pos = io(&mut b, POS, rows);
    let table = weight(&mut b, EMBED)?;
    let h0 = b.act("h0".into(), &[rows, h]);
    let mut resid = b.single(
        Opcode::EMBED,
        (&[ids, table], h0),
        &[],
        params(&[("hidden", int(h))]),
        "embed".into(),
        (rows * h) as i64 * b.dbytes,
    );
    let theta = Value::Float(mc.rope_theta);
    let scale = Value::Float(1.0 / (hd as f64).sqrt());
    for l in 0..mc.n_layers {
        let w = |what: &str| layer_tensor(l, what);
        let in_norm = weight(&mut b, &w("input_layernorm.weight"))?;
        let wq = weight(&mut b, &w("self_attn.q_proj.weight"))?;
        let wk = weight(&mut b, &w("self_attn.k_proj.weight"))?;
        let wv = weight(&mut b, &w("self_attn.v_proj.weight"))?;
        // Qwen2's q/k/v biases, added by the projections' tiles.
        let biases = if mc.attention_bias {
            Some((
                weight(&mut b, &w("self_attn.q_proj.bias"))?,
                weight(&mut b, &w("self_attn.k_proj.bias"))?,
                weight(&mut b, &w("self_attn.v_proj.bias"))?,
            ))
        } else {
            None
        };
        let qk_norms = if mc.qk_norm {
            Some((
                weight(&mut b, &w("self_attn.q_norm.weight"))?,
                weight(&mut b, &w("self_attn.k_norm.weight"))?,
            ))
        } else {
            None
        };
        let wo = weight(&mut b, &w("self_attn.o_proj.weight"))?;
        let post_norm = weight(&mut b, &w("post_attention_layernorm.weight"))?;
        let wg = weight(&mut b, &w("mlp.gate_proj.weight"))?;
        let wu = weight(&mut b, &w("mlp.up_proj.weight"))?;
        let wd = weight(&mut b, &w("mlp.down_proj.weight"))?;
        let cache = |b: &mut Builder, what: &str| {
            b.p.new_buffer(
                format!("L{l}.{what}"),
                BufferKind::KV_CACHE,
                opts.dtype,
                &[max_seq, nkv, hd],
            )
        };
        let (kc, vc) = (cache(&mut b, "kcache"), cache(&mut b, "vcache"));

        // Q, K, V as [rows, heads, head_dim]. Q and K are turned at each row's position by the
        // projection's RoPE epilogue, or — with Qwen3's per-head norms, which come between the
        // projection and the RoPE — by RMSNORM and ROPE tasks after it.
        let no_params = Map::new();
        let mut rope_params = params(&[("head_dim", int(hd)), ("theta", theta.clone())]);
        if rope_factors.is_some() {
            rope_params.insert("rope_factors", int(1));
        }
        let rope_tail: Vec<BufferId> = rope_factors.into_iter().collect();
        let pos_val = Val {
            buf: pos,
            wait: resid.wait,
        };
        let proj = |b: &mut Builder,
                    (wt, bias): (BufferId, Option<BufferId>),
                    heads: u64,
                    tag: &str,
                    rope: bool| {
            let out = b.act(format!("L{l}.{tag}"), &[rows, heads, hd]);
            let lin = Linear {
                x: resid,
                w: wt,
                k: h,
                n: heads * hd,
                norm: Some(in_norm),
                bias,
                epilogue: if rope {
                    (Epilogue::Rope, Some(pos_val))
                } else {
                    (Epilogue::None, None)
                },
                tail: if rope {
                    (&rope_tail, &rope_params)
                } else {
                    (&[], &no_params)
                },
                out,
                label: &format!("L{l}.{tag}"),
            };
            b.linear(&lin, rows)
        };
        let fused_rope = qk_norms.is_none();
        let q = proj(&mut b, (wq, biases.map(|x| x.0)), nh, "q", fused_rope);
        let k = proj(&mut b, (wk, biases.map(|x| x.1)), nkv, "k", fused_rope);
        let v = proj(&mut b, (wv, biases.map(|x| x.2)), nkv, "v", false);
        let rope = |b: &mut Builder, x: Val, heads: u64, tag: &str, qkn: Option<BufferId>| {
            let Some(nw) = qkn else { return x };
            let normed = b.act(format!("L{l}.{tag}n"), &[rows, heads, hd]);
            let x = b.single(
                Opcode::RMSNORM,
                (&[x.buf, nw], normed),
                &[x.wait],
                params(&[("eps", b.eps.clone()), ("hidden", int(hd))]),
                format!("L{l}.{tag}_norm"),
                (rows * heads * hd) as i64 * b.dbytes,
            );
            let out = b.act(format!("L{l}.{tag}r"), &[rows, heads, hd]);
            let mut ins = vec![x.buf, pos];
            ins.extend(rope_factors);
            b.single(
                Opcode::ROPE,
                (&ins, out),
                &[x.wait],
                params(&[("head_dim", int(hd)), ("theta", theta.clone())]),
                format!("L{l}.rope_{tag}"),
                (rows * heads * hd) as i64 * b.dbytes,
            )
        };
        let qr = rope(&mut b, q, nh, "q", qk_norms.map(|n| n.0));
        let kr = rope(&mut b, k, nkv, "k", qk_norms.map(|n| n.1));
        let append = |b: &mut Builder, new: Val, cache: BufferId, tag: &str| {
            b.single(
                Opcode::KV_APPEND,
                (&[new.buf, cache, pos], cache),
                &[new.wait],
                Map::new(),
                format!("L{l}.kv_append_{tag}"),
                (rows * kv_dim) as i64 * b.dbytes,
            )
        };
        let k_app = append(&mut b, kr, kc, "k");
        let v_app = append(&mut b, v, vc, "v");

        // The attention: tasks of one KV head's query heads over a block of rows, sized so a
        // task's (row, head) pairs are one device group.
        let attn = b.act(format!("L{l}.attn"), &[rows, q_dim]);
        let rep = nh / nkv.max(1);
        let block = (op_attention_causal::DEVICE_PAIRS / rep.max(1)).max(1);
        let ca = b.p.new_counter(format!("L{l}.attention ready"));
        let mut n_att = 0;
        for g in 0..nkv {
            for m0 in (0..rows).step_by(block as usize) {
                let pr = params(&[
                    ("head_dim", int(hd)),
                    ("n_heads", int(nh)),
                    ("n_kv_heads", int(nkv)),
                    ("scale", scale.clone()),
                    ("m_off", int(m0)),
                    ("M_tile", int(block.min(rows - m0))),
                    ("n_off", int(g * rep * hd)),
                    ("N_tile", int(rep * hd)),
                ]);
                let t = b.p.push_task(
                    Opcode::ATTENTION_CAUSAL,
                    &[qr.buf, kc, vc, pos],
                    &[attn],
                    ca,
                    &[qr.wait, k_app.wait, v_app.wait],
                    pr,
                    format!("L{l}.attention[{n_att}]"),
                );
                if let Some(task) = b.p.tasks.get_mut(t as usize) {
                    task.est_bytes = (max_seq * hd) as i64 * b.dbytes;
                }
                n_att += 1;
            }
        }
        let attn = Val {
            buf: attn,
            wait: (ca, n_att),
        };
        let hm = b.act(format!("L{l}.h_mid"), &[rows, h]);
        let hm = b.linear(
            &Linear {
                x: attn,
                w: wo,
                k: q_dim,
                n: h,
                norm: None,
                bias: None,
                epilogue: (Epilogue::Residual, Some(resid)),
                tail: (&[], &no_params),
                out: hm,
                label: &format!("L{l}.o_add"),
            },
            rows,
        );
        let act = b.act(format!("L{l}.act"), &[rows, inter]);
        let act = b.linear(
            &Linear {
                x: hm,
                w: wg,
                k: h,
                n: inter,
                norm: Some(post_norm),
                bias: None,
                epilogue: (
                    Epilogue::SwiGlu,
                    Some(Val {
                        buf: wu,
                        wait: hm.wait,
                    }),
                ),
                tail: (&[], &no_params),
                out: act,
                label: &format!("L{l}.gate_up"),
            },
            rows,
        );
        let out = b.act(format!("L{l}.h_out"), &[rows, h]);
        resid = b.linear(
            &Linear {
                x: act,
                w: wd,
                k: inter,
                n: h,
                norm: None,
                bias: None,
                epilogue: (Epilogue::Residual, Some(hm)),
                tail: (&[], &no_params),
                out,
                label: &format!("L{l}.down_add"),
            },
            rows,
        );
    }
    let fnorm = weight(&mut b, FINAL_NORM)?;
    let head = if mc.tie_word_embeddings {
        table
    } else {
        weight(&mut b, LM_HEAD)?
    };
    let (x, logit_rows) = match opts.logits {
        PrefillLogits::Every => (resid, rows),
        PrefillLogits::Last => {
            let last = io(&mut b, LAST, 1);
            let row = b.act("h_last".into(), &[1, h]);
            let row = b.single(
                Opcode::EMBED,
                (&[last, resid.buf], row),
                &[resid.wait],
                params(&[("hidden", int(h))]),
                "last_row".into(),
                h as i64 * b.dbytes,
            );
            (row, 1)
        }
    };
    let logits = b.p.new_buffer(
        decode::LOGITS,
        BufferKind::IO_OUTPUT,
        opts.dtype,
        &[logit_rows, vocab],
    );
    b.linear(
        &Linear {
            x,
            w: head,
            k: h,
            n: vocab,
            norm: Some(fnorm),
            bias: None,
            epilogue: (Epilogue::None, None),
            tail: (&[], &Map::new()),
            out: logits,
            label: "lm_head",
        },
        logit_rows,
    );
    let Builder { mut p, .. } = b;
    sm::assign_sms(
        &mut p,
        &SmAssignment::LoadBalance,
        target.num_sms.max(0) as u32,
    )?;
    Ok(Lowered {
        program: p,
        weights,
        max_seq,
        page_stats: None,
    })
}
