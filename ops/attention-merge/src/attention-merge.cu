/* attention-merge.cu — CUDA device function of ATTENTION_MERGE (amk_op_attention_merge);
 * semantics: ops/attention-merge/src/reference.rs. Columns [n_off, n_off + N_tile) (whole
 * heads) of the attention row, merged from the split-KV partials at the position.
 *
 * A warp a head works out its merge weights once (a lane a split) into shared memory, then a
 * thread an element sums its splits' values with them, a step of splits' loads in flight at a
 * time, in split order with the reference's arithmetic (COMBINE_GEMV's: no fused multiply-adds,
 * a zero weight skips its split). Without the shared memory for them (AMK_AM_SHARED=0, or a
 * tile of more heads and splits than it holds) each element works out its own weights in two
 * passes over the splits (am_element).
 *
 * The position says which splits are active (op_attention_split::active_splits): read before
 * the wait when nothing in the launch writes it (AMK_BUF_LAUNCH_CONST), else after it. */

struct am_args {
  const amk_buffer_t *parts, *pos, *y;
  int hd, nh, nkv, rep, n_splits, chunk, n_tile, n_off;
};

template <bool CHECK>
__device__ __forceinline__ bool am_setup(const amk_task_ctx& ctx, am_args& a) {
  const amk_params_t& p = ctx.inst->params;
  AMK_CHECK(ctx.inst->n_inputs == 2 && ctx.inst->n_outputs >= 1, AMK_ERR_SHAPE, ctx.inst->n_inputs);
  a.parts = amk_in(ctx, 0);
  a.pos = amk_in(ctx, 1);
  a.y = amk_out(ctx, 0);
  a.hd = p.head_dim;
  a.nh = p.n_heads;
  a.nkv = p.n_kv_heads;
  a.n_tile = p.N_tile;
  a.n_off = p.n_off;
  a.n_splits = p.ext[0];
  a.chunk = p.ext[1];
  AMK_CHECK(a.hd > 0 && a.nh > 0, AMK_ERR_PARAM, a.hd);
  AMK_CHECK(a.nkv > 0 && a.nh % a.nkv == 0, AMK_ERR_PARAM, a.nkv);
  AMK_CHECK(a.n_splits > 0 && a.n_splits <= 32, AMK_ERR_PARAM, a.n_splits);
  AMK_CHECK(a.chunk > 0, AMK_ERR_PARAM, a.chunk);
  a.rep = a.nh / a.nkv;
  if (CHECK) {
    const long long K = (long long)a.nh * a.hd;
    AMK_CHECK(a.parts->dtype == AMK_F32, AMK_ERR_DTYPE, a.parts->dtype);
    AMK_CHECK(a.parts->numel == (long long)a.nkv * a.n_splits * a.rep * (a.hd + 2), AMK_ERR_SHAPE,
              a.parts->numel);
    AMK_CHECK(!amk_is_int(a.y->dtype) && a.y->numel == K, AMK_ERR_SHAPE, a.y->numel);
    AMK_CHECK(a.n_tile > 0 && a.n_off >= 0 && a.n_tile % a.hd == 0 && a.n_off % a.hd == 0 &&
                  (long long)a.n_off + a.n_tile <= K,
              AMK_ERR_PARAM, a.n_tile);
    AMK_CHECK(amk_att_pos_ok(a.pos), AMK_ERR_DTYPE, a.pos->dtype);
  }
  return true;
}

__device__ __noinline__ bool am_check(const amk_task_ctx& ctx) {
  am_args a;
  return am_setup<true>(ctx, a);
}

/* Splits a step of am_element's passes, every load of a step in flight at once (8 by default;
 * AMK_AM_STEP=4 or 16 for measurements). A wider step is fewer L2 round trips at long context
 * but more code: each task runs it cold, and 16 measured slower than 8 at every position on
 * SmolLM2 (docs/perf-notes.md round 39). */
#ifndef AMK_AM_STEP
#define AMK_AM_STEP 8
#endif

/* Element e of the tile merged and stored: head h = (n_off + e) / head_dim, dim d. Two passes
 * over the active splits, AMK_AM_STEP splits a step: the maximum of their m, then the weights, the
 * denominator and the sum in split order. Scalars only: an array indexed by a split lived in
 * local memory, which raised the kernel's stack from 872 to 1,456 bytes a thread, and every
 * weight stream of the step ran 1.6-2x slower with it (docs/perf-notes.md round 39). */
__device__ __forceinline__ void am_element(const am_args& a, const float* parts, int active, int e) {
  const int k = a.n_off + e, h = k / a.hd, d = k - h * a.hd;
  const int g = h / a.rep, r = h - g * a.rep;
  const long long stride = (long long)a.hd + 2, sstride = (long long)a.rep * stride;
  const float* base = parts + ((long long)g * a.n_splits * a.rep + r) * stride;
  float M = -__int_as_float(0x7f800000);
#pragma unroll 1
  for (int s0 = 0; s0 < active; s0 += AMK_AM_STEP) {
#pragma unroll
    for (int j = 0; j < AMK_AM_STEP; ++j)
      if (s0 + j < active) M = fmaxf(M, __ldcg(base + (s0 + j) * sstride + a.hd));
  }
  float den = 0.0f, acc = 0.0f;
#pragma unroll 1
  for (int s0 = 0; s0 < active; s0 += AMK_AM_STEP) {
#pragma unroll
    for (int j = 0; j < AMK_AM_STEP; ++j) {
      if (s0 + j < active) {
        const float* b = base + (s0 + j) * sstride;
        const float m = __ldcg(b + a.hd), l = __ldcg(b + a.hd + 1), x = __ldcg(b + d);
        const float w = l > 0.0f ? expf(__fsub_rn(m, M)) : 0.0f;
        den = __fadd_rn(den, __fmul_rn(l, w));
        const float t = __fadd_rn(acc, __fmul_rn(x, w));
        acc = w != 0.0f ? t : acc;
      }
    }
  }
  amk_stf(a.y, k, __fdiv_rn(acc, fmaxf(den, 1e-20f)));
}

__device__ __noinline__ void am_merge(const am_args& a, int active) {
  const float* parts = (const float*)a.parts->ptr;
#pragma unroll 1
  for (int e = threadIdx.x; e < a.n_tile; e += AMK_THREADS) am_element(a, parts, active, e);
}

/* The weights once a (head, split) instead of once an element (on, 1, by default; 0 gives every
 * element its own, am_element): a head's head_dim threads would otherwise each work out the
 * same expf of every split, and the merge's time is its instructions (docs/perf-notes.md round
 * 39). */
#ifndef AMK_AM_SHARED
#define AMK_AM_SHARED 1
#endif

/* Splits a step of the shared path's sums (every load of a step in flight at once): a load, a
 * multiply and an add a split, so a wide step stays little code. */
constexpr int AM_SUM_STEP = 16;

/* Most active splits whose values a thread holds in registers while the warps work out the
 * weights (an array indexed only by unrolled constants, so never in local memory): loading
 * them first overlaps the shared path's two L2 round trips, 0.004-0.024 ms a step faster on
 * the split program (docs/perf-notes.md round 46). */
#define AM_PRE_MAX 16

/* Floats of shared memory the shared path takes for `heads` heads of `active` splits: each
 * split's weight, then each head's denominator. */
__device__ __forceinline__ int am_shared_floats(int heads, int active) { return heads * (active + 1); }

/* The shared path: a warp a head works out its weights (a lane a split: m and l loaded at
 * once, the maximum by shuffles, the denominator summed in split order from the lanes'
 * products, the reference's order) into shared memory; then a thread an element sums its
 * splits' values with them, AM_SUM_STEP loads in flight at a time. */
__device__ __noinline__ void am_merge_shared(const amk_task_ctx& ctx, const am_args& a, int active) {
  const float* parts = (const float*)a.parts->ptr;
  const int heads = a.n_tile / a.hd, h0 = a.n_off / a.hd;
  const long long stride = (long long)a.hd + 2;
  float* w = (float*)ctx.smem;
  float* den = w + heads * active;
  const int lane = threadIdx.x & 31;
  /* For a tile of at most a block's elements and at most AM_PRE_MAX splits, thread t's
     element t: its values of every active split, in flight while the warps below work out the
     weights. Same sums in the same order as the loop at the end. */
  const bool pre = active <= AM_PRE_MAX && a.n_tile <= AMK_THREADS;
  const bool mine = pre && (int)threadIdx.x < a.n_tile;
  float xv[AM_PRE_MAX];
  {
    const int e = mine ? (int)threadIdx.x : 0, hh = e / a.hd, d = e - hh * a.hd, h = h0 + hh;
    const int g = h / a.rep, r = h - g * a.rep;
    const float* x = parts + ((long long)g * a.n_splits * a.rep + r) * stride + d;
    const long long sstride = (long long)a.rep * stride;
#pragma unroll
    for (int j = 0; j < AM_PRE_MAX; ++j) xv[j] = mine && j < active ? __ldcg(x + j * sstride) : 0.0f;
  }
#pragma unroll 1
  for (int hh = threadIdx.x >> 5; hh < heads; hh += AMK_WARPS) {
    const int h = h0 + hh, g = h / a.rep, r = h - g * a.rep;
    const float* b = parts + (((long long)g * a.n_splits + lane) * a.rep + r) * stride + a.hd;
    const bool on = lane < active;
    const float m = on ? __ldcg(b) : -__int_as_float(0x7f800000);
    const float l = on ? __ldcg(b + 1) : 0.0f;
    float M = m;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, o));
    const float ws = on && l > 0.0f ? expf(__fsub_rn(m, M)) : 0.0f;
    const float prod = __fmul_rn(l, ws);
    float sum = 0.0f;
#pragma unroll 1
    for (int s = 0; s < active; ++s) sum = __fadd_rn(sum, __shfl_sync(0xffffffffu, prod, s));
    if (on) w[hh * active + lane] = ws;
    if (lane == 0) den[hh] = fmaxf(sum, 1e-20f);
  }
  __syncthreads();
  if (pre) {
    if (mine) {
      const int e = threadIdx.x, hh = e / a.hd;
      const float* wh = w + hh * active;
      float acc = 0.0f;
#pragma unroll
      for (int j = 0; j < AM_PRE_MAX; ++j) {
        if (j < active) {
          const float ws = wh[j], t = __fadd_rn(acc, __fmul_rn(xv[j], ws));
          acc = ws != 0.0f ? t : acc;
        }
      }
      amk_stf(a.y, a.n_off + e, __fdiv_rn(acc, den[hh]));
    }
    return;
  }
#pragma unroll 1
  for (int e = threadIdx.x; e < a.n_tile; e += AMK_THREADS) {
    const int hh = e / a.hd, d = e - hh * a.hd, h = h0 + hh;
    const int g = h / a.rep, r = h - g * a.rep;
    const float* x = parts + ((long long)g * a.n_splits * a.rep + r) * stride + d;
    const long long sstride = (long long)a.rep * stride;
    const float* wh = w + hh * active;
    float acc = 0.0f;
#pragma unroll 1
    for (int s0 = 0; s0 < active; s0 += AM_SUM_STEP) {
#pragma unroll
      for (int j = 0; j < AM_SUM_STEP; ++j) {
        if (s0 + j < active) {
          const float ws = wh[s0 + j], t = __fadd_rn(acc, __fmul_rn(__ldcg(x + (s0 + j) * sstride), ws));
          acc = ws != 0.0f ? t : acc;
        }
      }
    }
    amk_stf(a.y, a.n_off + e, __fdiv_rn(acc, den[hh]));
  }
}

__device__ __forceinline__ void amk_op_attention_merge(const amk_task_ctx& ctx) {
  if (ctx.verify && !am_check(ctx)) return;
  am_args a;
  am_setup<false>(ctx, a);
  const bool late = ctx.check_only || !(a.pos->flags & AMK_BUF_LAUNCH_CONST);
  int active = late ? 0 : amk_split_active_at(ctx, a.pos, a.n_splits, a.chunk);
  if (active < 0 || !amk_task_wait(ctx)) return;
  if (late) active = amk_split_active_at(ctx, a.pos, a.n_splits, a.chunk);
  if (active < 0) return;
  const int heads = a.n_tile / a.hd;
  if (AMK_AM_SHARED && 4 * am_shared_floats(heads, active) <= ctx.smem_bytes) am_merge_shared(ctx, a, active);
  else am_merge(a, active);
}
