/* ATTENTION_TILE (code 7): GQA decode attention over cache rows [kv_start, kv_start + kv_len).
 *
 * Semantics (ops/attention-tile/src/reference.rs): query head h of batch b reads kv head
 * h / (n_heads / n_kv_heads); s_j = (q . k_j) * scale, m = max_j s_j, e_j = exp(s_j - m),
 * l = sum e_j, acc = sum e_j v_j; the output is acc / l, or with flags & 2 (a split-KV shard)
 * the un-normalised [acc | m | l] per head (an empty shard writes acc = 0, m = -inf, l = 0).
 * Cache [max_seq, n_kv, hd] (any rank but 4, viewed flat) or batched [B, max_seq, n_kv, hd]
 * (rank 4; the value cache is read with the key cache's geometry, as the CPU does).
 *
 * Parallelisation: one warp per (batch, query head), heads strided over the block's warps;
 * no block barriers. Rows are processed in chunks of 32:
 *  - scores: every lane accumulates partial dot products of its dims (d = lane + 32k, so the
 *    32 lanes read 32 consecutive elements of a cache row) for all 32 rows of the chunk, then
 *    a butterfly reduce-scatter (31 shuffles) leaves row t's full dot product in lane t;
 *  - online softmax over the chunks (fp32): m only ever grows; when it grows the running l and
 *    acc are rescaled by expf(m_old - m_new) (exactly 1 when it does not), so once the maximum
 *    is reached every e_j is exactly the CPU's expf(s_j - m);
 *  - acc: lanes own dims (coalesced value-row reads), e_t broadcast by shuffle.
 * head_dim > 256 runs the online pass once per 256-dim slice of acc (scores recomputed; the
 * same m and l come out each time).
 * fp32 throughout (the CPU is fp32), expf (never __expf), IEEE division.
 */

#define ATT_SLICE_K 8 /* acc registers per lane: 8 x 32 = 256 dims per pass */

template <int DT>
__device__ __forceinline__ float att_ld(const amk_buffer_t* b, long long i) {
  if (DT == AMK_F32) return ((const float*)b->ptr)[i];
  if (DT == AMK_F16) return amk_f16_to_f32(((const uint16_t*)b->ptr)[i]);
  if (DT == AMK_BF16) return amk_bf16_to_f32(((const uint16_t*)b->ptr)[i]);
  return amk_ld_slow(b, i);
}

/* One reduce-scatter step: lanes with bit O keep the upper half of part[0..2O), the others the
 * lower half, and add the partner's copy of the half they keep. */
template <int O>
__device__ __forceinline__ void att_rs_step(float (&part)[32], int lane) {
  const bool upper = (lane & O) != 0;
#pragma unroll
  for (int t = 0; t < O; ++t) {
    const float send = upper ? part[t] : part[t + O];
    const float keep = upper ? part[t + O] : part[t];
    part[t] = keep + __shfl_xor_sync(0xffffffffu, send, O);
  }
}

template <int DT>
__device__ void att_heads(const amk_task_ctx& ctx, const amk_buffer_t* q, const amk_buffer_t* kc,
                          const amk_buffer_t* vc, const amk_buffer_t* out, int hd, int nh,
                          int rep, long long batch, long long row, long long per_batch,
                          long long kv_start, int kv_len, float scale, bool partial) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const float NEG_INF = -__int_as_float(0x7f800000);
  const long long n_heads_total = batch * nh;
  const long long per_head = partial ? (long long)hd + 2 : (long long)hd;

  for (long long bh = warp; bh < n_heads_total; bh += AMK_WARPS) {
    const long long b = bh / nh;
    const int h = (int)(bh - b * nh);
    const int kvh = h / rep;
    const long long qoff = bh * hd;
    /* element offset of cache row kv_start + j, kv head kvh */
    const long long kbase = b * per_batch + kv_start * row + (long long)kvh * hd;
    const long long obase = bh * per_head;

    for (int d0 = 0; d0 < hd; d0 += 32 * ATT_SLICE_K) {
      float acc[ATT_SLICE_K];
#pragma unroll
      for (int k = 0; k < ATT_SLICE_K; ++k) acc[k] = 0.0f;
      float m = NEG_INF;
      float l = 0.0f;

      for (int j0 = 0; j0 < kv_len; j0 += 32) {
        const int cnt = min(32, kv_len - j0);
        const long long cbase = kbase + (long long)j0 * row;
        /* ---- scores of the chunk's rows ---- */
        float part[32];
#pragma unroll
        for (int t = 0; t < 32; ++t) part[t] = 0.0f;
        for (int d = lane; d < hd; d += 32) {
          const float qd = amk_ldf32(q, qoff + d); /* q: any float dtype */
#pragma unroll
          for (int t = 0; t < 32; ++t)
            if (t < cnt) part[t] += qd * att_ld<DT>(kc, cbase + (long long)t * row + d);
        }
        att_rs_step<16>(part, lane);
        att_rs_step<8>(part, lane);
        att_rs_step<4>(part, lane);
        att_rs_step<2>(part, lane);
        att_rs_step<1>(part, lane);
        const float s = lane < cnt ? part[0] * scale : NEG_INF;
        /* ---- online softmax ---- */
        const float m_new = fmaxf(m, amk_warp_max(s));
        const float alpha = (m == NEG_INF) ? 0.0f : expf(m - m_new);
        const float e = lane < cnt ? expf(s - m_new) : 0.0f;
        l = l * alpha + amk_warp_sum(e);
        m = m_new;
#pragma unroll
        for (int k = 0; k < ATT_SLICE_K; ++k) acc[k] *= alpha;
        /* ---- acc += e_t * v_t over this slice's dims ---- */
        for (int t = 0; t < cnt; ++t) {
          const float et = __shfl_sync(0xffffffffu, e, t);
          const long long vrow = cbase + (long long)t * row;
#pragma unroll
          for (int k = 0; k < ATT_SLICE_K; ++k) {
            const int d = d0 + lane + 32 * k;
            if (d < hd) acc[k] += et * att_ld<DT>(vc, vrow + d);
          }
        }
      }

      /* ---- write this slice ---- */
#pragma unroll
      for (int k = 0; k < ATT_SLICE_K; ++k) {
        const int d = d0 + lane + 32 * k;
        if (d < hd) amk_st_slow(out, obase + d, partial ? acc[k] : __fdiv_rn(acc[k], l));
      }
      if (partial && d0 == 0 && lane == 0) {
        amk_st_slow(out, obase + hd, m);
        amk_st_slow(out, obase + hd + 1, l);
      }
    }
  }
}

__device__ void amk_op_attention_tile(const amk_task_ctx& ctx) {
  const amk_params_t& p = ctx.inst->params;
  const amk_buffer_t* q = amk_in(ctx, 0);
  const amk_buffer_t* kc = amk_in(ctx, 1);
  const amk_buffer_t* vc = amk_in(ctx, 2);
  const amk_buffer_t* out = amk_out(ctx, 0);

  const int hd = p.head_dim, nh = p.n_heads, nkv = p.n_kv_heads;
  if (hd <= 0) { amk_fail(ctx, AMK_ERR_PARAM, hd); return; }
  if (nh <= 0) { amk_fail(ctx, AMK_ERR_PARAM, nh); return; }
  if (nkv <= 0 || nh % nkv != 0) { amk_fail(ctx, AMK_ERR_PARAM, nkv); return; }
  if (p.kv_start < 0) { amk_fail(ctx, AMK_ERR_PARAM, p.kv_start); return; }
  if (p.kv_len < 0) { amk_fail(ctx, AMK_ERR_PARAM, p.kv_len); return; }
  const float scale = p.scale;
  if (!isfinite(scale)) { amk_fail(ctx, AMK_ERR_PARAM, (long long)__float_as_int(scale)); return; }
  const bool partial = (p.flags & 2) != 0;
  const int rep = nh / nkv;

  const long long row = (long long)nkv * hd;
  if (kc->numel != vc->numel) { amk_fail(ctx, AMK_ERR_SHAPE, vc->numel); return; }
  long long batch, max_seq;
  if (kc->rank == 4) {
    batch = kc->shape[0];
    max_seq = kc->shape[1];
  } else {
    batch = 1;
    max_seq = kc->numel / row;
  }
  const long long per_batch = max_seq * row;
  if (kc->numel != batch * per_batch) { amk_fail(ctx, AMK_ERR_SHAPE, kc->numel); return; }
  if (p.kv_len == 0 && !partial) { amk_fail(ctx, AMK_ERR_PARAM, 0); return; }
  if ((long long)p.kv_start + p.kv_len > max_seq) {
    amk_fail(ctx, AMK_ERR_PARAM, (long long)p.kv_start + p.kv_len);
    return;
  }
  if (q->numel != batch * nh * (long long)hd) { amk_fail(ctx, AMK_ERR_SHAPE, q->numel); return; }
  if (!amk_is_float(q->dtype)) { amk_fail(ctx, AMK_ERR_DTYPE, q->dtype); return; }
  if (!amk_is_float(out->dtype)) { amk_fail(ctx, AMK_ERR_DTYPE, out->dtype); return; }
  const long long per_head = partial ? (long long)hd + 2 : (long long)hd;
  if (out->numel != batch * nh * per_head) { amk_fail(ctx, AMK_ERR_SHAPE, out->numel); return; }

  /* The key cache's dtype picks the load path; the value cache normally shares it. */
  const int dt = (kc->dtype == vc->dtype) ? kc->dtype : -1;
  switch (dt) {
    case AMK_F32:
      att_heads<AMK_F32>(ctx, q, kc, vc, out, hd, nh, rep, batch, row, per_batch, p.kv_start,
                         p.kv_len, scale, partial);
      break;
    case AMK_BF16:
      att_heads<AMK_BF16>(ctx, q, kc, vc, out, hd, nh, rep, batch, row, per_batch, p.kv_start,
                          p.kv_len, scale, partial);
      break;
    case AMK_F16:
      att_heads<AMK_F16>(ctx, q, kc, vc, out, hd, nh, rep, batch, row, per_batch, p.kv_start,
                         p.kv_len, scale, partial);
      break;
    default:
      att_heads<-1>(ctx, q, kc, vc, out, hd, nh, rep, batch, row, per_batch, p.kv_start,
                    p.kv_len, scale, partial);
      break;
  }
}
