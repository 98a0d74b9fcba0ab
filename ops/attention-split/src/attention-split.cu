/* ATTENTION_SPLIT (code 25): split `s` of KV head `g` of the decode attention (the task's
 * n_off / N_tile = g * n_splits + s), over the rows the position gives it
 * (op_attention_split::split_rows), written as un-normalised [acc | m | l] partials of the
 * group's query heads at n_off; with flags bit 0 (one split a KV head) the heads' rows
 * normalised, acc / l, at n_off of the attention row in its dtype. Semantics:
 * ops/attention-split/src/reference.rs.
 *
 * Tensor-core path (mp_rows; 16-bit q, K and V of one dtype, head_dim 64, at most 4 query heads
 * a KV head: SmolLM2's and the Llama-3.2 1B's groupings): a warp takes 16 rows at a time
 * through mma.sync, every operand straight from the caches into registers (the section
 * "Tensor-core path" below); the warps merge as the direct path's do.
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
 * attention; on the short path 3 q, K and V copied, 4 warp 0's row weights; the prologue
 * point: the wait passed.
 *
 * The position is data: read before the wait when nothing in the launch writes it (its
 * descriptor's AMK_BUF_LAUNCH_CONST, as in a decode loop, whose tail writes it after every
 * reader of the pass), else after the wait. An inactive split (no rows at this position)
 * reads and writes nothing, so it does not wait: amk_task_skip_wait. */

/* Normalised tasks (one split a KV head: the first positions) of up to this many rows that the
 * short path (below) does not take (a kernel without it, operands it does not handle) take the
 * general path's tiny path (a lane group a head), measured faster there on SmolLM2; a split of
 * partials takes the direct path at every length, as the general path cost the split program
 * 0.03-0.05 ms a step at the positions whose last split holds a few rows (docs/perf-notes.md
 * round 44). */
#ifndef AMK_AS_MIN_ROWS
#define AMK_AS_MIN_ROWS 8
#endif

/* Normalised tasks of up to this many rows (at most 128) whose operands suit it take the short
 * path (sp_attend) instead; 0: never, and the path is not compiled. A normalised task asks for
 * 128 (the op's task_defines), so only the kernels of programs with such tasks (the
 * short-context program) hold it: compiled into the split program, whose tasks never take it,
 * its code alone cost that program's step up to 2.3 % (docs/perf-notes.md round 52). */
#ifndef AMK_AS_SHORT_ROWS
#define AMK_AS_SHORT_ROWS 0
#endif

/* 1 (the default): tasks whose operands suit it (16-bit q, K and V of one dtype, head_dim 64,
 * at most AD_HB query heads a KV head) take the tensor-core path (mp_rows) instead of the
 * direct one: on an H200 the short-context program's step 3-28 % faster from 129 rows, the
 * split program's 3-9 %, decode after 512 tokens of context +11 % on SmolLM2 and +3 % on the
 * 1B (docs/perf-notes.md round 55). 0: the direct path only. */
#ifndef AMK_AS_MMA
#define AMK_AS_MMA 1
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

#if AMK_AS_MMA
/* ------------------------------------------------------------------------------------------ */
/* Tensor-core path                                                                            */
/* ------------------------------------------------------------------------------------------ */

/* The direct path spends its time on each row's instruction chain (a lane group's dot product
 * and its butterfly, the online step, the values' shuffles: about 0.8 us a batch of two rows a
 * group, docs/perf-notes.md round 43), not on the rows' bytes; more rows a batch did not help
 * (round 55). Here a warp takes 16 rows at a time through mma.sync.m16n8k16 (f32
 * accumulation): S = Q K^T with the query heads as M (at most AD_HB of its 16 rows used, the
 * rest zero) and the rows as N, then O^T += V^T P^T with the head's dims as M, the query
 * heads as N and the rows as K. No shared memory and no shuffle in the row loop but the block
 * maximum's two; every operand comes straight from the caches into registers, in layouts
 * chosen so that each lane loads whole 16-byte vectors:
 * - lane (g, t) = (lane / 4, lane % 4) holds dims 16t .. 16t + 15 of query head g and of rows
 *   n0 + g and n0 + 8 + g of K; k-step s of the score takes their 32-bit words 2s and 2s + 1
 *   as its (k = 2t, 2t + 1) and (2t + 8, 2t + 9) pairs (a dot product does not care which
 *   dims a k index stands for, as long as Q and K agree);
 * - its scores are head g's at rows n0 + 2t, + 1 (the first n-tile) and n0 + 8 + 2t, + 1 (the
 *   second), which are exactly P^T's B fragment for K = those 16 rows and N = head g: the
 *   weights need no data movement;
 * - it loads dims 8g .. 8g + 7 of rows n0 + 2t, n0 + 2t + 1, n0 + 8 + 2t, n0 + 9 + 2t of V;
 *   m-tile i of the values takes elements 2i and 2i + 1 of each (one byte permute a pair) as
 *   V^T's A fragment, so its rows g and g + 8 are dims 8g + 2i and 8g + 2i + 1, and the lane
 *   ends holding dims 8g .. 8g + 7 of heads 2t and 2t + 1.
 * Transposed, the values take 4 m-tiles of 16 dims (8 mmas a block with the split weights
 * below, none with a zero half) and 16 accumulators a lane; as the scores' layout (heads as M)
 * they took 16 mmas and 32 accumulators, and a step of SmolLM2's short-context program was
 * 0.005-0.026 ms slower from 128 rows (docs/perf-notes.md round 64).
 * P is split into a 16-bit high part and the 16-bit rounding of the rest (two value mmas), so
 * the weights keep about 16 bits and the result stays within the f32 paths' tolerance. The
 * scores are in base 2 (the scale times log2 e), each weight one ex2.approx (an exact 0 for a
 * -inf score, so no branch; expf with its branch was about 50 instructions of a block's 350,
 * round 63), the maxima turned back to base e for the cross-warp merge. The warps (rows in
 * blocks of 16, block b to warp b mod 8) then merge as the direct path's do (ad_store). Taken
 * by tasks of 16-bit q, K and V of one dtype, head_dim 64, at most AD_HB query heads a KV
 * head, from AMK_AS_SHORT_ROWS + 1 rows for a normalised task (1 for a split of partials). */

/* 32-bit word w (0..3) of a vector, by value (a selected reference would put the vectors in
 * memory). */
__device__ __forceinline__ uint32_t mp_w(const uint4& u, int w) {
  return w == 0 ? u.x : w == 1 ? u.y : w == 2 ? u.z : u.w;
}

/* Element j (0..7) of `x` in the low half and of `y` in the high half. */
__device__ __forceinline__ uint32_t mp_pair(const uint4& x, const uint4& y, int j) {
  return __byte_perm(mp_w(x, j >> 1), mp_w(y, j >> 1), (j & 1) ? 0x7632 : 0x5410);
}

/* Word i (0..7) of two vectors. */
__device__ __forceinline__ uint32_t mp_word(const uint4& lo, const uint4& hi, int i) {
  return i < 4 ? mp_w(lo, i & 3) : mp_w(hi, i & 3);
}

/* (x, y) rounded to the 16-bit type (x low), and the two back as f32. */
template <bool BF>
__device__ __forceinline__ uint32_t mp_round2(float x, float y, float& rx, float& ry) {
  uint32_t r;
  if (BF) {
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(y), "f"(x));
    rx = __uint_as_float(r << 16);
    ry = __uint_as_float(r & 0xffff0000u);
  } else {
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(y), "f"(x));
    rx = amk_f16_to_f32((uint16_t)(r & 0xffffu));
    ry = amk_f16_to_f32((uint16_t)(r >> 16));
  }
  return r;
}

/* Accumulator tiles a lane: tile i holds dims 8g + 2i and 8g + 2i + 1 of heads 2t, 2t + 1. */
#define MP_OT 4

/* One block's operands in registers: K rows n0 + g and n0 + 8 + g (dims 16t ..), V rows
 * n0 + 2t, + 1, n0 + 8 + 2t, + 1 (dims 8g ..); zeros past `len`. */
struct mp_blk {
  uint4 k[4], v[4];
};

__device__ __forceinline__ void mp_load(mp_blk& b, const char* kb, const char* vb,
                                        long long gstride, int n0, int len, int g, int t) {
  const uint4 z = make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = n0 + 8 * h + g;
    const uint4* kp = (const uint4*)(kb + (long long)r * gstride + 32 * t);
    b.k[2 * h] = r < len ? kp[0] : z;
    b.k[2 * h + 1] = r < len ? kp[1] : z;
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int r = n0 + 8 * (i >> 1) + 2 * t + (i & 1);
    b.v[i] = r < len ? *(const uint4*)(vb + (long long)r * gstride + 16 * g) : z;
  }
}

/* 2^x; 0 for x = -inf. */
__device__ __forceinline__ float mp_ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
#define MP_SCALE_BASE 1.4426950408889634f /* log2 e: the scores in base 2 */
#define MP_M_BACK 0.6931471805599453f     /* ln 2: a base-2 maximum back to base e */

/* The query's words 0..7 (dims 16t .. 16t + 15 of head g): the score's A fragments. */
typedef uint32_t mp_qfrag[8];

/* One block of 16 rows into the warp's online softmax (m, l: head g's; o: dims 8g .. 8g + 7 of
 * heads 2t and 2t + 1, whose rescale factors lanes 8t and 8t + 4 hold). */
template <bool BF>
__device__ __forceinline__ void mp_block(const mp_blk& b, const mp_qfrag& qa, int n0,
                                         int len, int t, float scale, float& m, float& l,
                                         float (&o)[MP_OT][4]) {
  const float NEG_INF = -__int_as_float(0x7f800000);
  float sa[4] = {0.0f, 0.0f, 0.0f, 0.0f}, sb[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int s = 0; s < 4; ++s) {
    const uint32_t a[4] = {qa[2 * s], 0u, qa[2 * s + 1], 0u};
    amk_mma_16816<BF>(sa, a, mp_word(b.k[0], b.k[1], 2 * s), mp_word(b.k[0], b.k[1], 2 * s + 1));
    amk_mma_16816<BF>(sb, a, mp_word(b.k[2], b.k[3], 2 * s), mp_word(b.k[2], b.k[3], 2 * s + 1));
  }
  const int r0 = n0 + 2 * t, r1 = n0 + 8 + 2 * t;
  const float x[4] = {r0 < len ? sa[0] * scale : NEG_INF, r0 + 1 < len ? sa[1] * scale : NEG_INF,
                      r1 < len ? sb[0] * scale : NEG_INF, r1 + 1 < len ? sb[1] * scale : NEG_INF};
  float bm = fmaxf(fmaxf(x[0], x[1]), fmaxf(x[2], x[3]));
  bm = fmaxf(bm, __shfl_xor_sync(ATT_FULL, bm, 1));
  bm = fmaxf(bm, __shfl_xor_sync(ATT_FULL, bm, 2));
  const float mn = fmaxf(m, bm);
  const float alpha = m == mn ? 1.0f : mp_ex2(m - mn);
  float e[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) e[i] = mp_ex2(x[i] - mn);
  l = l * alpha + ((e[0] + e[1]) + (e[2] + e[3]));
  m = mn;
  if (__any_sync(ATT_FULL, alpha != 1.0f)) {
    const float a0 = __shfl_sync(ATT_FULL, alpha, 8 * t);
    const float a1 = __shfl_sync(ATT_FULL, alpha, 8 * t + 4);
#pragma unroll
    for (int i = 0; i < MP_OT; ++i) {
      o[i][0] *= a0;
      o[i][1] *= a1;
      o[i][2] *= a0;
      o[i][3] *= a1;
    }
  }
  float h0, h1, h2, h3;
  const uint32_t hi0 = mp_round2<BF>(e[0], e[1], h0, h1);
  const uint32_t hi1 = mp_round2<BF>(e[2], e[3], h2, h3);
  float d;
  const uint32_t lo0 = mp_round2<BF>(e[0] - h0, e[1] - h1, d, d);
  const uint32_t lo1 = mp_round2<BF>(e[2] - h2, e[3] - h3, d, d);
#pragma unroll
  for (int i = 0; i < MP_OT; ++i) {
    const uint32_t va[4] = {mp_pair(b.v[0], b.v[1], 2 * i), mp_pair(b.v[0], b.v[1], 2 * i + 1),
                            mp_pair(b.v[2], b.v[3], 2 * i), mp_pair(b.v[2], b.v[3], 2 * i + 1)};
    amk_mma_16816<BF>(o[i], va, hi0, hi1);
    amk_mma_16816<BF>(o[i], va, lo0, lo1);
  }
}

/* Whether the tensor-core path takes the task (ad_plan_for passed): q, K and V 16-bit of one
 * dtype, q 16-byte aligned, head_dim 64, at most AD_HB query heads a KV head. */
__device__ __forceinline__ bool mp_ok(const amk_task_ctx& ctx, const as_args& a) {
  const amk_buffer_t* qb = amk_in(ctx, 0);
  const int dt = amk_in(ctx, 1)->dtype;
  return a.hd == 64 && a.rep <= AD_HB && qb->dtype == dt && amk_al16(qb->ptr) &&
         (AMK_IS_BF16(dt) || AMK_IS_F16(dt));
}

/* The tensor-core path's operands as values (passed to mp_rows in registers, so that the
 * dispatcher keeps nothing of its own on the stack for it). */
struct mp_plan {
  const char* q;   /* query head kv_head * rep, dims 16t .. of head g */
  const char* k;   /* cache row `start`, KV head kv_head */
  const char* v;
  float* red;      /* ad_plan's cross-warp buffers */
  float* ml;
  long long gstride;
  int len, rep;
  float scale;
#if AMK_PROBE == 5 && !AMK_TRACE_OFF
  uint64_t* tr; /* the traced task's words (probes 3..7: warp 0's blocks, mp_rows) */
#endif
};

__device__ __forceinline__ mp_plan mp_plan_of(const amk_task_ctx& ctx, const as_args& a,
                                              const ad_plan& s, long long start, int len) {
  mp_plan p;
  p.gstride = (long long)a.nkv * 128;
  const long long first = start * p.gstride + (long long)a.kv_head * 128;
  p.q = (const char*)amk_in(ctx, 0)->ptr + (long long)a.kv_head * a.rep * 128;
  p.k = (const char*)amk_in(ctx, 1)->ptr + first;
  p.v = (const char*)amk_in(ctx, 2)->ptr + first;
  p.red = s.red;
  p.ml = s.ml;
  p.len = len;
  p.rep = a.rep;
  p.scale = a.scale;
#if AMK_PROBE == 5 && !AMK_TRACE_OFF
  p.tr = ctx.trace;
#endif
  return p;
}

/* AMK_PROBE 5 (diagnostic, traced kernel only): warp 0's first two blocks, each once its rows
 * have landed (probes 3, 5) and once summed (4, 6), and its last block summed (7). */
#if AMK_PROBE == 5 && !AMK_TRACE_OFF
#define MP_PROBE_LOADED(bi, b)                                                               \
  do {                                                                                       \
    if (p.tr && threadIdx.x == 0 && (bi) < 2 * AMK_WARPS && (b).k[0].x != 0x7fc12345u &&     \
        (b).v[0].x != 0x7fc12345u)                                                           \
      p.tr[8 + 3 + 2 * ((bi) / AMK_WARPS)] = amk_globaltimer();                              \
  } while (0)
#define MP_PROBE_DONE(bi, m)                                                                 \
  do {                                                                                       \
    if (p.tr && threadIdx.x == 0 && (bi) < 2 * AMK_WARPS && (m) != 12345.0f)                 \
      p.tr[8 + 4 + 2 * ((bi) / AMK_WARPS)] = amk_globaltimer();                              \
  } while (0)
#define MP_PROBE_LAST(m)                                                                     \
  do {                                                                                       \
    if (p.tr && threadIdx.x == 0 && (m) != 12345.0f) p.tr[8 + 7] = amk_globaltimer();        \
  } while (0)
#else
#define MP_PROBE_LOADED(bi, b) \
  do {                         \
  } while (0)
#define MP_PROBE_DONE(bi, m) \
  do {                       \
  } while (0)
#define MP_PROBE_LAST(m) \
  do {                   \
  } while (0)
#endif

/* The split's rows on the tensor-core path, after the task's wait: each warp's online softmax
 * of its blocks, left in the cross-warp buffers for ad_store (after a barrier). Out of line,
 * its operands by value: inlined into the dispatcher, its registers made the rest of the
 * kernel spill (the 1B's short-context step 1.02 -> 1.52 ms, docs/perf-notes.md round 55). */
template <bool BF>
__device__ __noinline__ void mp_rows(const mp_plan p) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  mp_qfrag qa;
  {
    const uint4 z = make_uint4(0u, 0u, 0u, 0u);
    const uint4* qp = (const uint4*)(p.q + (long long)g * 128 + 32 * t);
    const uint4 q0 = g < p.rep ? qp[0] : z, q1 = g < p.rep ? qp[1] : z;
#pragma unroll
    for (int i = 0; i < 8; ++i) qa[i] = mp_word(q0, q1, i);
  }
  float o[MP_OT][4];
#pragma unroll
  for (int j = 0; j < MP_OT; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m = -__int_as_float(0x7f800000), l = 0.0f;
  const int nb = (p.len + 15) >> 4;
  const float sc = p.scale * MP_SCALE_BASE;
  /* one block in registers at a time (two a step, their chains side by side, took as long as
     one after the other: the loop is bound by its instructions, docs/perf-notes.md round 63);
     every later block of the warp's prefetched into L2 first, a lane a 128-byte row line
     (against each block the next as it loads: the short-context program 1-3 % faster from 256
     rows, docs/perf-notes.md round 55) */
  for (int bi = warp + AMK_WARPS; bi < nb; bi += AMK_WARPS) {
    const int nr = 16 * bi + (lane & 15);
    if (nr < p.len) amk_prefetch_l2((lane < 16 ? p.k : p.v) + (long long)nr * p.gstride);
  }
  for (int bi = warp; bi < nb; bi += AMK_WARPS) {
    mp_blk b;
    mp_load(b, p.k, p.v, p.gstride, 16 * bi, p.len, g, t);
    MP_PROBE_LOADED(bi, b);
    mp_block<BF>(b, qa, 16 * bi, p.len, t, sc, m, l, o);
    MP_PROBE_DONE(bi, m);
  }
  MP_PROBE_LAST(m);
  l += __shfl_xor_sync(ATT_FULL, l, 1);
  l += __shfl_xor_sync(ATT_FULL, l, 2);
#pragma unroll
  for (int u = 0; u < 2; ++u) {
    if (2 * t + u < p.rep) {
      float4* r = (float4*)(p.red + (warp * AD_HB + 2 * t + u) * 64 + 8 * g);
      r[0] = make_float4(o[0][u], o[0][2 + u], o[1][u], o[1][2 + u]);
      r[1] = make_float4(o[2][u], o[2][2 + u], o[3][u], o[3][2 + u]);
    }
  }
  if (g < p.rep) {
    if (t == 0) {
      p.ml[(warp * AD_HB + g) * 2] = m * MP_M_BACK;
      p.ml[(warp * AD_HB + g) * 2 + 1] = l;
    }
  }
}
#endif /* AMK_AS_MMA */

#if AMK_AS_SHORT_ROWS > 0
/* ------------------------------------------------------------------------------------------ */
/* Short path                                                                                  */
/* ------------------------------------------------------------------------------------------ */

/* The first positions of a decode (the short-context program's one task a KV head, a few to
 * AMK_AS_SHORT_ROWS rows, at most 128): the whole attention is a few KB, so its time is the
 * chain of dependent steps after the wait, not bytes. Every address comes from descriptors
 * before the wait (sp_plan_for); after it the block copies q, K and V into shared memory in one
 * round of loads, then a warp (up to 32 rows) or two (33 to 128: each a half of the rows, one
 * or two rows a lane) a query head: a lane a row's score (a whole row's dot product a lane),
 * the softmax by shuffles, then lane j the output dims head_dim/32 * j .. with each row's
 * weight read from shared memory (sp_attend). Same semantics as the other paths (a -inf score
 * weighs 0; every score -inf gives NaN); the sums' order differs. */

/* The short path's operands, from descriptors and params alone. */
struct sp_plan {
  const char* q;      /* query head kv_head * rep */
  const char* k;      /* element kv_head * head_dim of cache row `start` */
  const char* v;
  char* out;          /* element n_off of the output */
  long long gstride;  /* bytes from one cache row to the next */
  int odt;            /* the output's dtype */
  int cs;             /* log2 of the 16-byte vectors a row of head_dim elements holds */
  int len;            /* rows */
};

/* Shared memory the short path takes: q, K rows padded by 16 bytes (the lanes' rows fall in
 * different banks), V rows, a warp's 64 row weights, and the two-warp heads' exchange (a warp's
 * maximum and sum, a head's values). */
__device__ __forceinline__ long long sp_smem(const as_args& a, long long len) {
  return (long long)a.rep * a.hd * 2 + len * (a.hd * 2 + 16) + len * a.hd * 2 +
         (AMK_WARPS * 64 + 2 * AMK_WARPS + (long long)a.rep * a.hd) * 4;
}

/* The short path's plan for a normalised task of `len` rows from `start`, or false (another
 * path then): 16-bit q, K and V of one dtype, 16-byte aligned, head_dim 32, 64 or 128, the
 * buffers in ctx.smem_bytes. Block-uniform. */
__device__ __forceinline__ bool sp_plan_for(const amk_task_ctx& ctx, const as_args& a,
                                            long long start, long long len, sp_plan& s) {
  if (!a.norm || len > AMK_AS_SHORT_ROWS || len > 128 || len < 1) return false;
  /* q in one vector a thread, K and V in four; from 33 rows two warps a head */
  if (a.rep * (a.hd >> 3) > AMK_THREADS || len * (a.hd >> 3) > 4 * AMK_THREADS ||
      (len > 32 && 2 * a.rep > AMK_WARPS))
    return false;
  const amk_buffer_t* qb = amk_in(ctx, 0);
  const amk_buffer_t* kc = amk_in(ctx, 1);
  const amk_buffer_t* vc = amk_in(ctx, 2);
  const amk_buffer_t* ob = amk_out(ctx, 0);
  const int dt = kc->dtype;
  if (!(AMK_IS_BF16(dt) || AMK_IS_F16(dt)) || vc->dtype != dt || qb->dtype != dt) return false;
  if (a.hd != 32 && a.hd != 64 && a.hd != 128) return false;
  if (!amk_al16(qb->ptr) || !amk_al16(kc->ptr) || !amk_al16(vc->ptr)) return false;
  if (!(AMK_IS_BF16(ob->dtype) || AMK_IS_F16(ob->dtype) || AMK_IS_F32(ob->dtype))) return false;
  if (sp_smem(a, len) > ctx.smem_bytes) return false;
  s.gstride = (long long)a.nkv * a.hd * 2;
  s.q = (const char*)qb->ptr + (long long)a.kv_head * a.rep * a.hd * 2;
  s.k = (const char*)kc->ptr + start * s.gstride + (long long)a.kv_head * a.hd * 2;
  s.v = (const char*)vc->ptr + start * s.gstride + (long long)a.kv_head * a.hd * 2;
  s.odt = ob->dtype;
  s.out = (char*)ob->ptr + ctx.inst->params.n_off * (AMK_IS_F32(s.odt) ? 4 : 2);
  s.cs = a.hd == 32 ? 2 : a.hd == 64 ? 3 : 4;
  s.len = (int)len;
  return true;
}

/* One 16-bit element as f32. */
template <int DT>
__device__ __forceinline__ float sp_f(uint16_t h) {
  if constexpr (DT == AMK_BF16) return amk_bf16_to_f32(h);
  else return amk_f16_to_f32(h);
}

/* One row's score: q . k over `nvec` 16-byte vectors of 16-bit elements in shared memory,
 * times `scale`. */
template <int DT>
__device__ __forceinline__ float sp_score(const uint4* q, const uint4* k, int nvec, float scale) {
  float p[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int i = 0; i < nvec; ++i) {
    att_vec<DT> qv, kv;
    qv.x[0] = q[i];
    kv.x[0] = k[i];
    float qf[8], kf[8];
    att_cvt<DT>(qv, qf);
    att_cvt<DT>(kv, kf);
#pragma unroll
    for (int d = 0; d < 8; ++d) p[d & 3] = fmaf(qf[d], kf[d], p[d & 3]);
  }
  return ((p[0] + p[1]) + (p[2] + p[3])) * scale;
}

/* acc[0 .. D) += e_r * V[r][D * lane ..] over rows [r0, r1) (weights in `es`, indexed from r0). */
template <int DT>
__device__ __forceinline__ void sp_values(const uint16_t* vs, const float* es, int hd, int D,
                                          int lane, int r0, int r1, float (&acc)[4]) {
  const uint16_t* vp = vs + D * lane;
#pragma unroll 4
  for (int r = r0; r < r1; ++r) {
    const float e = es[r - r0];
#pragma unroll
    for (int d = 0; d < 4; ++d)
      if (d < D) acc[d] = fmaf(e, sp_f<DT>(vp[r * hd + d]), acc[d]);
  }
}

/* Head h's output dims D * lane .. of acc / l (NaN when every score was -inf). */
__device__ __forceinline__ void sp_store(const sp_plan& s, int h, int hd, int D, int lane,
                                         const float (&acc)[4], float l, bool none) {
  const float qnan = __int_as_float(0x7fc00000);
  const long long o = (long long)h * hd + D * lane;
#pragma unroll
  for (int d = 0; d < 4; ++d) {
    if (d >= D) break;
    const float y = none ? qnan : __fdiv_rn(acc[d], l);
    if (AMK_IS_F32(s.odt)) ((float*)s.out)[o + d] = y;
    else if (AMK_IS_BF16(s.odt)) ((uint16_t*)s.out)[o + d] = amk_f32_to_bf16(y);
    else ((uint16_t*)s.out)[o + d] = amk_f32_to_f16(y);
  }
}

/* The warp's maximum of `x` (every lane gets it). */
__device__ __forceinline__ float sp_warp_max(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(ATT_FULL, x, o));
  return x;
}

/* The warp's sum of `x` (every lane gets it). */
__device__ __forceinline__ float sp_warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(ATT_FULL, x, o);
  return x;
}

/* A row's weight exp(sc - m) under the head's maximum `m`: 0 for a -inf score, and 0 for
 * every row when `none` (every score -inf or NaN: the row is NaN). */
__device__ __forceinline__ float sp_weight(float sc, float m, bool none) {
  return none || sc == -__int_as_float(0x7f800000) ? 0.0f : expf(sc - m);
}

/* A warp's row weights under the head's maximum `m` (`none`: every score -inf or NaN) into
 * `es` (lane j row j's, and with `two` row 32 + j's from `sc2`), then probe 4 and a warp
 * barrier; returns the warp's sum of them. */
__device__ __forceinline__ float sp_publish(float sc, float m, bool none, float* es, int lane,
                                            uint64_t* tr, bool two = false, float sc2 = 0.0f) {
  const float e = sp_weight(sc, m, none);
  const float e2 = two ? sp_weight(sc2, m, none) : 0.0f;
  const float l = sp_warp_sum(e + e2);
  es[lane] = e;
  if (two) es[32 + lane] = e2;
#if !AMK_TRACE_OFF
  if (tr && threadIdx.x == 0) tr[8 + 4] = amk_globaltimer(); /* probe 4: warp 0's weights */
#endif
  __syncwarp();
  return l;
}

/* The short path after the wait (sp_plan_for passed), its operands as values: every thread
 * loads its vectors of q (at most one), K and V (at most four each, row-major: vector e of
 * the rows is thread e mod AMK_THREADS's) before it stores any into shared memory; one
 * barrier. Up to 32 rows, warp w takes query head w (lane j row j's score, then the head's
 * dims over every row); from 33 rows two warps take a head, a half of its rows each (from 65
 * rows two scores a lane), their maxima, sums and values exchanged through shared memory (two
 * more barriers), so that every warp's values loop covers 32 rows, or 64 from 65 rows. */
template <int DT>
__device__ __noinline__ void sp_attend(const sp_plan s, const int rep, const int hd,
                                       const float scale, uint64_t* const tr) {
  const float NEG_INF = -__int_as_float(0x7f800000);
  extern __shared__ __align__(AMK_SMEM_ALIGN) unsigned char amk_smem[];
  const int len = s.len, cs = s.cs, C = 1 << cs, tid = threadIdx.x;
  const int kst = hd * 2 + 16, nq = rep * C, nk = len * C;
  const int k0 = rep * hd * 2, v0 = k0 + len * kst;
  uint4 qv = make_uint4(0u, 0u, 0u, 0u), kv[4], vv[4];
  if (tid < nq) qv = ((const uint4*)s.q)[tid];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int e = tid + i * AMK_THREADS;
    if (e < nk) {
      const long long off = (long long)(e >> cs) * s.gstride + (e & (C - 1)) * 16;
      kv[i] = *(const uint4*)(s.k + off);
      vv[i] = *(const uint4*)(s.v + off);
    }
  }
  if (tid < nq) *(uint4*)(amk_smem + tid * 16) = qv;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int e = tid + i * AMK_THREADS;
    if (e < nk) {
      *(uint4*)(amk_smem + k0 + (e >> cs) * kst + (e & (C - 1)) * 16) = kv[i];
      *(uint4*)(amk_smem + v0 + e * 16) = vv[i];
    }
  }
  __syncthreads();
#if !AMK_TRACE_OFF
  if (tr && tid == 0) tr[8 + 3] = amk_globaltimer(); /* probe 3: q, K and V copied */
#endif
  const int lane = tid & 31, warp = tid >> 5;
  const int nvec = hd >> 3, D = hd >> 5;
  const uint16_t* const vs = (const uint16_t*)(amk_smem + v0);
  float* const es = (float*)(amk_smem + v0 + len * hd * 2) + warp * 64;
  float* const xm = (float*)(amk_smem + v0 + len * hd * 2) + AMK_WARPS * 64; /* a warp's max */
  float* const xl = xm + AMK_WARPS;                                          /* and sum */
  float* const xa = xl + AMK_WARPS;                                          /* and values */
  if (len <= 32) {
    for (int h = warp; h < rep; h += AMK_WARPS) {
      const uint4* qh = (const uint4*)(amk_smem + h * hd * 2);
      const float sc = lane < len ? sp_score<DT>(qh, (const uint4*)(amk_smem + k0 + lane * kst), nvec, scale) : NEG_INF;
      const float m = sp_warp_max(sc);
      const bool none = m == NEG_INF; /* every score -inf (or NaN): the row is NaN */
      const float l = sp_publish(sc, m, none, es, lane, tr);
      float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      sp_values<DT>(vs, es, hd, D, lane, 0, len, acc);
      sp_store(s, h, hd, D, lane, acc, l, none);
      __syncwarp(); /* es is the next head's */
    }
    return;
  }
  /* 33 to 128 rows, at most AMK_WARPS / 2 heads (sp_plan_for): warps 2h and 2h + 1, each a
     half of the rows (32, or from 65 rows 64: lane j rows j and 32 + j of its half) */
  const int cw = len > 64 ? 64 : 32;
  const int h = warp >> 1, half = warp & 1, r0 = cw * half, r1 = min(len, r0 + cw);
  const bool act = h < rep, two = cw == 64;
  const int row = r0 + lane, row2 = row + 32;
  const uint4* qh = (const uint4*)(amk_smem + (act ? h : 0) * hd * 2);
  const float sc = act && row < r1 ? sp_score<DT>(qh, (const uint4*)(amk_smem + k0 + row * kst), nvec, scale) : NEG_INF;
  const float sc2 = two && act && row2 < r1 ? sp_score<DT>(qh, (const uint4*)(amk_smem + k0 + row2 * kst), nvec, scale) : NEG_INF;
  const float mw = sp_warp_max(fmaxf(sc, sc2));
  if (lane == 0) xm[warp] = mw;
  __syncthreads();
  const float m = fmaxf(mw, xm[warp ^ 1]);
  const bool none = m == NEG_INF;
  const float l = sp_publish(sc, m, none, es, lane, tr, two, sc2);
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  if (act) sp_values<DT>(vs, es, hd, D, lane, r0, r1, acc);
  if (act && half == 1) {
#pragma unroll
    for (int d = 0; d < 4; ++d)
      if (d < D) xa[h * hd + D * lane + d] = acc[d];
    if (lane == 0) xl[warp] = l;
  }
  __syncthreads();
  if (act && half == 0) {
#pragma unroll
    for (int d = 0; d < 4; ++d)
      if (d < D) acc[d] += xa[h * hd + D * lane + d];
    sp_store(s, h, hd, D, lane, acc, l + xl[warp + 1], none);
  }
}
#endif /* AMK_AS_SHORT_ROWS > 0 */

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
#if AMK_AS_SHORT_ROWS > 0
  sp_plan sp;
  const bool shortp = sp_plan_for(ctx, a, start, len, sp);
#else
  const bool shortp = false;
#endif
  ad_plan s;
  const bool fast = !shortp && (!a.norm || len > AMK_AS_MIN_ROWS) && ad_plan_for(ctx, a, s);
#if AMK_AS_MMA
  const bool mma = fast && mp_ok(ctx, a);
#endif
  if (!late && !amk_task_wait(ctx)) return;
  if (ctx.trace && threadIdx.x == 0) ctx.trace[4] = amk_globaltimer();
#if AMK_AS_SHORT_ROWS > 0
  if (shortp && AMK_IS_BF16(dt)) sp_attend<AMK_BF16>(sp, a.rep, a.hd, a.scale, ctx.trace);
  else if (shortp && AMK_IS_F16(dt)) sp_attend<AMK_F16>(sp, a.rep, a.hd, a.scale, ctx.trace);
  else
#endif
#if AMK_AS_MMA
  if (mma) {
    if (AMK_IS_BF16(dt)) mp_rows<true>(mp_plan_of(ctx, a, s, start, (int)len));
    else mp_rows<false>(mp_plan_of(ctx, a, s, start, (int)len));
    __syncthreads();
    ad_store(ctx, s, a, 0, a.rep);
  } else
#endif
  if (fast && AMK_IS_BF16(dt)) ad_attend<AMK_BF16>(ctx, a, s, start, (int)len);
  else if (fast && AMK_IS_F16(dt)) ad_attend<AMK_F16>(ctx, a, s, start, (int)len);
  else if (fast && AMK_IS_F32(dt)) ad_attend<AMK_F32>(ctx, a, s, start, (int)len);
  else
    as_general(ctx, a, start, (int)len);
  amk_probe(ctx, 2); /* the attention run (thread 0's part: its stores issued) */
}
