/* ATTENTION_SPLIT (code 25): split `s` of KV head `g` of the decode attention (the task's
 * n_off / N_tile = g * n_splits + s), over the rows the position gives it
 * (op_attention_split::split_rows), written as un-normalised [acc | m | l] partials of the
 * group's query heads at n_off; with flags bit 0 (one split a KV head) the heads' rows
 * normalised, acc / l, at n_off of the attention row in its dtype. Semantics:
 * ops/attention-split/src/reference.rs.
 *
 * Direct path (ad_attend; K and V of one vector dtype, head_dim a multiple of 8 up to 256,
 * 16-byte aligned caches): the rows straight from the caches into registers, a lane group a
 * row, each group an online softmax of its own, the groups merged once at the end (the section
 * "Direct path" below). It replaced a path that staged each chunk of rows in shared memory,
 * slower on splits of 128 rows and more and about even at 64 (docs/perf-notes.md round 43).
 * Why not the general attention (amk_attention.cuh's amk_att_run, which the other cases take):
 * a split runs once a layer on an SM whose instruction cache holds the projections' code, so
 * its time is the fetch of the code it executes once (docs/perf-notes.md rounds 14 and 30); the
 * direct path is a few rolled loops, the general one unrolls rows and heads into thousands of
 * instructions.
 *
 * Probes (traced kernels): 0 the shape worked out, 1 the rows, 2 thread 0 through the
 * attention; the prologue point: the wait passed.
 *
 * The position is data: read before the wait when nothing in the launch writes it (its
 * descriptor's AMK_BUF_LAUNCH_CONST, as in a decode loop, whose tail writes it after every
 * reader of the pass), else after the wait. An inactive split (no rows at this position)
 * reads and writes nothing, so it does not wait: amk_task_skip_wait. */

/* Normalised tasks (one split a KV head: the first positions) of up to this many rows take the
 * general path's tiny path (a lane group a head), measured faster there on SmolLM2; a split of
 * partials takes the direct path at every length, as the general path cost the split program
 * 0.03-0.05 ms a step at the positions whose last split holds a few rows (docs/perf-notes.md
 * round 44). */
#ifndef AMK_AS_MIN_ROWS
#define AMK_AS_MIN_ROWS 8
#endif

/* Bytes of one element of a float cache or query (F32 4, F16/BF16 2, fp8 1). */
__device__ __forceinline__ long long as_esize(int dt) {
  return dt == AMK_F32 ? 4 : ((dt == AMK_F16 || dt == AMK_BF16) ? 2 : 1);
}

/* A rank-1 view of `b` from element `first`, `n` elements long. */
__device__ __forceinline__ amk_buffer_t as_view(const amk_buffer_t* b, long long first, long long n) {
  amk_buffer_t v = *b;
  v.ptr = (char*)b->ptr + first * as_esize(b->dtype);
  v.numel = n;
  v.rank = 1;
  for (int i = 0; i < 4; ++i) {
    v.shape[i] = i == 0 ? n : 1;
    v.stride[i] = 1;
  }
  return v;
}

/* The task's static shape: its group, its split and the cache's rows. */
struct as_args {
  int hd, nh, nkv, rep, n_splits, chunk, kv_head, split;
  bool norm; /* flags bit 0: normalised rows, not partials */
  long long rows; /* cache rows */
  float scale;
};

/* The params and descriptors, checked as the validator checks them when CHECK (failing the
 * task, false, on the first that fails). Reads descriptors and params only. */
template <bool CHECK>
__device__ __forceinline__ bool as_setup(const amk_task_ctx& ctx, as_args& a) {
  const amk_params_t& p = ctx.inst->params;
  const amk_buffer_t* q = amk_in(ctx, 0);
  const amk_buffer_t* kc = amk_in(ctx, 1);
  const amk_buffer_t* vc = amk_in(ctx, 2);
  const amk_buffer_t* out = amk_out(ctx, 0);
  a.hd = p.head_dim;
  a.nh = p.n_heads;
  a.nkv = p.n_kv_heads;
  a.n_splits = p.ext[0];
  a.chunk = p.ext[1];
  a.scale = p.scale;
  a.norm = (p.flags & 1) != 0;
  AMK_CHECK((p.flags & ~1) == 0 && (!a.norm || a.n_splits == 1), AMK_ERR_PARAM, p.flags);
  AMK_CHECK(ctx.inst->n_inputs == 4 && ctx.inst->n_outputs >= 1, AMK_ERR_SHAPE, ctx.inst->n_inputs);
  AMK_CHECK(a.hd > 0, AMK_ERR_PARAM, a.hd);
  AMK_CHECK(a.nh > 0, AMK_ERR_PARAM, a.nh);
  AMK_CHECK(a.nkv > 0 && a.nh % a.nkv == 0, AMK_ERR_PARAM, a.nkv);
  AMK_CHECK(a.n_splits > 0 && a.n_splits <= 32, AMK_ERR_PARAM, a.n_splits);
  AMK_CHECK(a.chunk > 0, AMK_ERR_PARAM, a.chunk);
  AMK_CHECK(isfinite(a.scale), AMK_ERR_PARAM, (long long)__float_as_int(a.scale));
  a.rep = a.nh / a.nkv;
  const long long tile = (long long)a.rep * (a.norm ? a.hd : a.hd + 2);
  const long long row = (long long)a.nkv * a.hd;
  AMK_CHECK(p.N_tile == tile, AMK_ERR_PARAM, p.N_tile);
  AMK_CHECK(p.n_off >= 0 && p.n_off % tile == 0 && p.n_off / tile < (long long)a.nkv * a.n_splits,
            AMK_ERR_PARAM, p.n_off);
  AMK_CHECK(amk_is_float(q->dtype) && amk_is_float(kc->dtype) && amk_is_float(vc->dtype),
            AMK_ERR_DTYPE, q->dtype);
  AMK_CHECK(q->numel == (long long)a.nh * a.hd, AMK_ERR_SHAPE, q->numel);
  AMK_CHECK(kc->numel == vc->numel && kc->numel % row == 0, AMK_ERR_SHAPE, kc->numel);
  AMK_CHECK(a.norm ? amk_is_float(out->dtype) : out->dtype == AMK_F32, AMK_ERR_DTYPE, out->dtype);
  AMK_CHECK(out->numel == (long long)a.nkv * a.n_splits * tile, AMK_ERR_SHAPE, out->numel);
  AMK_CHECK(amk_att_pos_ok(amk_in(ctx, 3)), AMK_ERR_DTYPE, amk_in(ctx, 3)->dtype);
  const int task = (int)p.n_off / (int)tile;
  a.kv_head = task / a.n_splits;
  a.split = task % a.n_splits;
  /* 32-bit divisions where the values allow (a 64-bit one is a call of ~100 instructions, on
   * every split's path before its wait) */
  a.rows = kc->numel < 0x7fffffffLL ? (long long)((unsigned)kc->numel / (unsigned)row) : kc->numel / row;
  return true;
}

__device__ __noinline__ bool as_check(const amk_task_ctx& ctx) {
  as_args a;
  return as_setup<true>(ctx, a);
}

/* The split's rows at the position in `pb` (block-uniform): its length, with `start` set;
 * -1, having failed the task, for a position outside the cache. */
__device__ __forceinline__ long long as_rows(const amk_task_ctx& ctx, const as_args& a,
                                             const amk_buffer_t* pb, long long& start) {
  const long long p = amk_ldif(pb, 0);
  if (p < 0 || p >= a.rows) {
    amk_fail(ctx, AMK_ERR_INDEX, p);
    return -1;
  }
  const int size = amk_split_size(p, a.n_splits, a.chunk);
  start = (long long)a.split * size;
  return start > p ? 0 : min((long long)size, p + 1 - start);
}

/* ------------------------------------------------------------------------------------------ */
/* Direct path                                                                                 */
/* ------------------------------------------------------------------------------------------ */

/* Query heads a pass over the split's rows takes (their q and acc in registers; more heads
 * would take more passes, the rows then read again from L2): a row group's lanes, 4. A pass
 * costs nearly the same with 4, 2 or 1 heads (the 1B's short program at 256 rows: +0.045 ms a
 * step a pass more, docs/perf-notes.md round 46), so a KV head's query heads stay in one task. */
#define AD_HB 4
/* Rows a lane group takes a batch (4 was slower: docs/perf-notes.md round 44), and how many
 * batches ahead the L2 prefetches run. */
#define AD_B 2
#define AD_PF 4

/* The direct path's layout (ad_plan_for): L lanes a cache row (a power of two, 4..32, L * 8 >=
 * head_dim; lane li holds dims 8li .. 8li+7, idle when li >= head_dim / 8), GW = 32 / L groups
 * a warp, NG groups a block; this thread's group `grp` (global) and its first lane `gbase`;
 * the cross-warp sums `red` (AMK_WARPS x AD_HB x head_dim f32) and maxima/sums `ml` in the
 * task's shared memory. */
struct ad_plan {
  int L, NG, li, grp, gbase, wfirst;
  float *red, *ml;
};

/* The direct path's plan, or false (another path then): K and V of one vector dtype, 16-byte
 * aligned, head_dim a multiple of 8 up to 256, the cross-warp buffers in ctx.smem_bytes.
 * Descriptors and params only, block-uniform but for the lane's own fields. */
__device__ __forceinline__ bool ad_plan_for(const amk_task_ctx& ctx, const as_args& a,
                                            ad_plan& s) {
  const amk_buffer_t* kc = amk_in(ctx, 1);
  const amk_buffer_t* vc = amk_in(ctx, 2);
  if (kc->dtype != vc->dtype || !amk_is_vec(kc->dtype)) return false;
  if ((a.hd & 7) != 0 || a.hd > 256) return false;
  if (!amk_al16(kc->ptr) || !amk_al16(vc->ptr)) return false;
  if (AMK_WARPS * AD_HB * (a.hd + 2) * 4 > ctx.smem_bytes) return false;
  int L = 4;
  while (L * 8 < a.hd) L <<= 1;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  s.L = L;
  s.NG = AMK_WARPS * (32 / L);
  s.li = lane & (L - 1);
  s.gbase = lane & ~(L - 1);
  s.grp = warp * (32 / L) + lane / L;
  s.wfirst = warp * (32 / L);
  extern __shared__ __align__(AMK_SMEM_ALIGN) unsigned char amk_smem[];
  s.red = (float*)amk_smem;
  s.ml = s.red + AMK_WARPS * AD_HB * a.hd;
  return true;
}

/* The lane's pieces of the group's rows of the batch at `base` (row base + i * NG + grp), zero
 * for rows past `len` and idle lanes; `kb`, `vb` the lane's piece of the split's row 0. */
template <int DT>
__device__ __forceinline__ void ad_load(const ad_plan& s, bool act, const char* kb,
                                        const char* vb, long long gstride, int base, int len,
                                        att_vec<DT> (&k)[AD_B], att_vec<DT> (&v)[AD_B]) {
#pragma unroll
  for (int i = 0; i < AD_B; ++i) {
    const int row = base + i * s.NG + s.grp;
    const bool ok = act && row < len;
    att_vload<DT>(k[i], kb + (long long)row * gstride, ok);
    att_vload<DT>(v[i], vb + (long long)row * gstride, ok);
  }
}

/* L2 prefetches of the group's rows of the batch at `base`: a lane a 128-byte line. */
__device__ __forceinline__ void ad_prefetch(const ad_plan& s, bool line, const char* kb,
                                            const char* vb, long long gstride, int base, int len) {
#pragma unroll
  for (int i = 0; i < AD_B; ++i) {
    const int row = base + i * s.NG + s.grp;
    if (line && row < len) {
      amk_prefetch_l2(kb + (long long)row * gstride);
      amk_prefetch_l2(vb + (long long)row * gstride);
    }
  }
}

/* One batch into the group's online softmax: the scores of its AD_B rows for the pass's AD_HB
 * heads (dot products over the lane's dims, then a butterfly over the group's lanes, which
 * leaves the same sums in every lane), the running (m, l) of head `hs` = li mod AD_HB in this
 * lane, and acc[head][the lane's dims] rescaled and summed with e_j of each head shuffled from
 * the group's lane holding it (amk_attention.cuh's att_dot8, att_scale8, att_axpy8, which the
 * general path's batches use too). */
template <int DT>
__device__ __forceinline__ void ad_batch(const ad_plan& s, const as_args& a,
                                         const att_vec<DT> (&k)[AD_B], const att_vec<DT> (&v)[AD_B],
                                         const float (&q)[AD_HB][8], int base, int len, float& m,
                                         float& l, float (&acc)[AD_HB][8]) {
  const float NEG_INF = -__int_as_float(0x7f800000);
  const int hs = s.li & (AD_HB - 1);
  float sc[AD_B];
#pragma unroll
  for (int i = 0; i < AD_B; ++i) {
    float kf[8];
    att_cvt<DT>(k[i], kf);
    float p[AD_HB];
    att_dot8<AD_HB>(q, kf, p);
    for (int o = 1; o < s.L; o <<= 1) {
#pragma unroll
      for (int r = 0; r < AD_HB; ++r) p[r] += __shfl_xor_sync(ATT_FULL, p[r], o);
    }
    const float x = hs == 0 ? p[0] : hs == 1 ? p[1] : hs == 2 ? p[2] : p[3];
    sc[i] = base + i * s.NG + s.grp < len ? x * a.scale : NEG_INF;
  }
  float e[AD_B];
  const float alpha = att_online<AD_B>(sc, m, l, e);
  int src[AD_HB]; /* the group's lane holding head r's (m, l) */
#pragma unroll
  for (int r = 0; r < AD_HB; ++r) src[r] = s.gbase + r;
  if (__any_sync(ATT_FULL, alpha != 1.0f)) /* warp-uniform; rare once m settles */
    att_scale8<AD_HB>(acc, alpha, src);
#pragma unroll
  for (int i = 0; i < AD_B; ++i) {
    float vf[8];
    att_cvt<DT>(v[i], vf);
    att_axpy8<AD_HB>(acc, e[i], vf, src);
  }
}

/* The warp's groups merged into its first (M = max m, l = sum l exp(m - M), acc likewise),
 * by shuffles, then left in the task's shared memory for the cross-warp merge. */
__device__ __forceinline__ void ad_warp_merge(const ad_plan& s, const as_args& a, bool act,
                                              float m, float l, float (&acc)[AD_HB][8]) {
#pragma unroll 1
  for (int o = s.L; o < 32; o <<= 1) {
    const float mo = __shfl_xor_sync(ATT_FULL, m, o);
    const float lo = __shfl_xor_sync(ATT_FULL, l, o);
    const float M = fmaxf(m, mo);
    const float wa = m == M ? 1.0f : expf(m - M);
    const float wb = mo == M ? 1.0f : expf(mo - M);
    l = l * wa + lo * wb;
    m = M;
#pragma unroll
    for (int r = 0; r < AD_HB; ++r) {
      const float war = __shfl_sync(ATT_FULL, wa, s.gbase + r);
      const float wbr = __shfl_sync(ATT_FULL, wb, s.gbase + r);
#pragma unroll
      for (int d = 0; d < 8; ++d)
        acc[r][d] = acc[r][d] * war + __shfl_xor_sync(ATT_FULL, acc[r][d], o) * wbr;
    }
  }
  const int warp = threadIdx.x >> 5;
  if (s.gbase == 0) {
    if (act) {
#pragma unroll
      for (int r = 0; r < AD_HB; ++r) {
        float4* p = (float4*)(s.red + (warp * AD_HB + r) * a.hd + 8 * s.li);
        p[0] = make_float4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]);
        p[1] = make_float4(acc[r][4], acc[r][5], acc[r][6], acc[r][7]);
      }
    }
    if (s.li < AD_HB) {
      s.ml[(warp * AD_HB + s.li) * 2] = m;
      s.ml[(warp * AD_HB + s.li) * 2 + 1] = l;
    }
  }
}

/* The warps' states merged, an element a thread, and stored for heads h0 .. h0 + rb - 1 of the
 * group: partials [acc | m | l] (acc NaN and l NaN when every score was -inf or NaN, m = -inf,
 * as the CPU's e_j are NaN then), or with a.norm the rows acc / l in the row's dtype. */
__device__ __noinline__ void ad_store(const amk_task_ctx& ctx, const ad_plan& s,
                                      const as_args& a, int h0, int rb) {
  const float NEG_INF = -__int_as_float(0x7f800000);
  const float qnan = __int_as_float(0x7fc00000);
  const amk_buffer_t* ob = amk_out(ctx, 0);
  const long long o0 = ctx.inst->params.n_off;
  for (int t = threadIdx.x; t < rb * a.hd; t += AMK_THREADS) {
    const int r = t / a.hd, d = t - r * a.hd;
    float M = NEG_INF;
    for (int w = 0; w < AMK_WARPS; ++w) M = fmaxf(M, s.ml[(w * AD_HB + r) * 2]);
    float L = 0.0f, A = 0.0f;
    for (int w = 0; w < AMK_WARPS; ++w) {
      const float mw = s.ml[(w * AD_HB + r) * 2];
      const float wt = mw == M ? 1.0f : expf(mw - M);
      L += s.ml[(w * AD_HB + r) * 2 + 1] * wt;
      A += s.red[(w * AD_HB + r) * a.hd + d] * wt;
    }
    const bool nan = M == NEG_INF;
    const int h = h0 + r;
    if (a.norm) {
      amk_stf(ob, o0 + (long long)h * a.hd + d, nan ? qnan : __fdiv_rn(A, L));
    } else {
      float* out = (float*)ob->ptr + o0 + (long long)h * (a.hd + 2);
      out[d] = nan ? qnan : A;
      if (d == 0) {
        out[a.hd] = M;
        out[a.hd + 1] = nan ? qnan : L;
      }
    }
  }
}

/* The split's attention on the direct path (ad_plan_for passed), after the task's wait: rows
 * [start, start + len) of KV head a.kv_head straight from the caches into registers, lane
 * groups of L lanes a row; each group an online softmax over rows grp, grp + NG, ... (AD_B of
 * them a batch, the next batch's loads in flight while one is consumed, L2 prefetches AD_PF
 * batches ahead); then the groups merged (shuffles, then shared memory) and stored. AD_HB query
 * heads a pass. No barrier but the cross-warp merge's: each warp runs at its own pace. */
template <int DT>
__device__ void ad_attend(const amk_task_ctx& ctx, const as_args& a, const ad_plan& s,
                          long long start, int len) {
  constexpr int ESZ = DT == AMK_F32 ? 4 : 2;
  const bool act = s.li < (a.hd >> 3);
  const bool line = act && ((8 * s.li * ESZ) & 127) == 0;
  const long long gstride = (long long)a.nkv * a.hd * ESZ;
  const long long first = start * gstride + ((long long)a.kv_head * a.hd + 8 * s.li) * ESZ;
  const char* kb = (const char*)amk_in(ctx, 1)->ptr + first;
  const char* vb = (const char*)amk_in(ctx, 2)->ptr + first;
  const int step = s.NG * AD_B;
  const amk_buffer_t* qb = amk_in(ctx, 0);
  const bool qvec = amk_is_vec(qb->dtype) && amk_al16(qb->ptr);
  for (int t = 1; t < AD_PF; ++t) ad_prefetch(s, line, kb, vb, gstride, t * step, len);
  for (int h0 = 0; h0 < a.rep; h0 += AD_HB) {
    att_vec<DT> kc[AD_B], vc[AD_B], kn[AD_B], vn[AD_B];
    ad_load<DT>(s, act, kb, vb, gstride, 0, len, kc, vc);
    float q[AD_HB][8], acc[AD_HB][8];
#pragma unroll
    for (int r = 0; r < AD_HB; ++r) {
#pragma unroll
      for (int d = 0; d < 8; ++d) q[r][d] = acc[r][d] = 0.0f;
      if (act && h0 + r < a.rep)
        att_q8(qb, qvec, ((long long)a.kv_head * a.rep + h0 + r) * a.hd + 8 * s.li, q[r]);
    }
    float m = -__int_as_float(0x7f800000), l = 0.0f;
    for (int base = 0; base + s.wfirst < len; base += step) {
      ad_load<DT>(s, act, kb, vb, gstride, base + step, len, kn, vn);
      if (h0 == 0) ad_prefetch(s, line, kb, vb, gstride, base + AD_PF * step, len);
      ad_batch<DT>(s, a, kc, vc, q, base, len, m, l, acc);
#pragma unroll
      for (int i = 0; i < AD_B; ++i) {
        kc[i] = kn[i];
        vc[i] = vn[i];
      }
    }
    if (h0 > 0) __syncthreads(); /* the previous pass's ad_store read the buffers */
    ad_warp_merge(s, a, act, m, l, acc);
    __syncthreads();
    ad_store(ctx, s, a, h0, min(AD_HB, a.rep - h0));
  }
}

/* The general path: amk_att_run on views of the operands narrowed to the group (q from head
 * g * rep, the caches from element g * head_dim of a row, which keep their n_kv_heads *
 * head_dim stride, the output from n_off): one KV head of `rep` query heads. */
__device__ __noinline__ void as_general(const amk_task_ctx& ctx, const as_args& a,
                                        long long start, int len) {
  const amk_buffer_t* q = amk_in(ctx, 0);
  const amk_buffer_t* kc = amk_in(ctx, 1);
  const amk_buffer_t* vc = amk_in(ctx, 2);
  const long long row = (long long)a.nkv * a.hd;
  const amk_buffer_t qv = as_view(q, (long long)a.kv_head * a.rep * a.hd, (long long)a.rep * a.hd);
  const amk_buffer_t kv = as_view(kc, (long long)a.kv_head * a.hd, kc->numel - (long long)a.kv_head * a.hd);
  const amk_buffer_t vv = as_view(vc, (long long)a.kv_head * a.hd, vc->numel - (long long)a.kv_head * a.hd);
  const long long tile = (long long)a.rep * (a.norm ? a.hd : a.hd + 2);
  const amk_buffer_t ov = as_view(amk_out(ctx, 0), ctx.inst->params.n_off, tile);
  amk_att_geom g;
  g.hd = a.hd;
  g.nh = a.rep;
  g.nkv = 1;
  g.rep = a.rep;
  g.batch = 1;
  g.row = row;
  g.per_batch = a.rows * row;
  g.kv_start = start;
  g.kv_len = len;
  g.scale = a.scale;
  g.partial = !a.norm;
  amk_att_run(&qv, &kv, &vv, &ov, g);
}

__device__ void amk_op_attention_split(const amk_task_ctx& ctx) {
  if (ctx.verify && !as_check(ctx)) return;
  as_args a;
  as_setup<false>(ctx, a);
  amk_probe(ctx, 0); /* the shape worked out */
  const amk_buffer_t* pb = amk_in(ctx, 3);
  const bool late = ctx.check_only || !(pb->flags & AMK_BUF_LAUNCH_CONST);
  if (late && !amk_task_wait(ctx)) return;
  long long start = 0;
  const long long len = as_rows(ctx, a, pb, start);
  amk_probe(ctx, 1); /* the rows worked out */
  if (len < 0) return;
  if (len == 0) { /* inactive: nothing read, nothing written */
    if (!late) amk_task_skip_wait(ctx);
    return;
  }
  const int dt = amk_in(ctx, 1)->dtype;
  ad_plan s;
  const bool fast = (!a.norm || len > AMK_AS_MIN_ROWS) && ad_plan_for(ctx, a, s);
  if (!late && !amk_task_wait(ctx)) return;
  if (ctx.trace && threadIdx.x == 0) ctx.trace[4] = amk_globaltimer();
  if (fast && AMK_IS_BF16(dt)) ad_attend<AMK_BF16>(ctx, a, s, start, (int)len);
  else if (fast && AMK_IS_F16(dt)) ad_attend<AMK_F16>(ctx, a, s, start, (int)len);
  else if (fast && AMK_IS_F32(dt)) ad_attend<AMK_F32>(ctx, a, s, start, (int)len);
  else
    as_general(ctx, a, start, (int)len);
  amk_probe(ctx, 2); /* the attention run (thread 0's part: its stores issued) */
}
