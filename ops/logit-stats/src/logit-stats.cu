/* LOGIT_STATS (code 31): slots [n_off, n_off + N_tile) of one logits row summarised. Mirrors
 * ops/logit-stats/src/reference.rs (semantics in src/lib.rs, the summary in src/summary.rs).
 *
 * Inputs  [logits (F32/F16/BF16, one row of V), limits (I32 >= 6; element 5 the vocabulary
 *          limit, <= 0: none)]
 * Output  stats (I32 [4, G]): column g = slot g's (f32 bits of its largest valid logit, the
 *         first id holding it or -1, f32 bits of the sum of exp(l - max) or 0 when the
 *         maximum is not finite, the count of valid ids)
 * Params  cols (logits a slot; G * cols >= V > (G - 1) * cols), N_tile, n_off (slots)
 *
 * Slot g covers ids [min(g * cols, V'), min((g + 1) * cols, V')), V' = min(limit, V) when the
 * limit is > 0, else V. The op waits itself: its checks and, when no task of the program
 * writes the limits (AMK_BUF_LAUNCH_CONST), the limit come before the wait.
 *
 * Two paths. Slots of at most 32 * LS_U * 8 logits that start 16-byte aligned (cols a multiple
 * of 8, the row aligned): a warp a slot (warp w takes slots n_off + w, n_off + w + AMK_WARPS,
 * ...), every load of the slot in flight at once into the lanes' registers, the maximum and
 * then the sum from those registers, each merged by warp shuffles alone — no barrier, and one
 * L2 round trip a slot. The decode tail's slots (a few hundred logits each) take it: the block
 * path below spent about 4 us on one such slot (docs/perf-notes.md round 52: the limit read
 * after the wait, then two passes over the row, each merged over the block with three
 * barriers). Other slots: a block a slot, two passes of amk_logits.cuh, merged over the block
 * in a fixed order, thread 0 storing the column. Either way the same inputs give the same bits
 * on every run; the two paths may differ in the sum's last bits (their orders differ), as the
 * device does from the CPU's f64. Every check comes before the first write. */

/* 8-logit units a lane holds on the warp path. */
#define LS_U 4

/* The ids that take part, from the limits (lib.rs `effective_vocab`). */
__device__ __forceinline__ long long ls_vocab(const amk_buffer_t* lb, long long V) {
  const long long vl = ((const int32_t*)lb->ptr)[5];
  return vl > 0 && vl < V ? vl : V;
}

/* The warp path's visit of logit l at id i: valid ids are below vp and not NaN. */
__device__ __forceinline__ void ls_visit_max(amk_lg_max& st, float l, long long i, long long vp) {
  if (i < vp) st.visit(l, i);
}
__device__ __forceinline__ void ls_visit_sum(float& s, float l, long long i, long long vp, float m) {
  if (i < vp && l == l) s = __fadd_rn(s, expf(__fsub_rn(l, m)));
}

/* Slot g (ids [g * cols, min((g + 1) * cols, V)) loaded, then those below vp summarised) by
 * one warp, into column w[g], w[G + g], w[2G + g], w[3G + g]. Lane j holds units j, j + 32,
 * ... (8 logits each, ids in increasing order) and, past the whole units, the slot's id
 * 8 * units + j when there is one. `vp` < 0: read the limit here, its load in flight with the
 * slot's. */
template <bool W32>
__device__ __forceinline__ void ls_warp_slot(const amk_buffer_t* xb, const amk_buffer_t* lb, long long V,
                                             long long cols, long long g, long long vp, int32_t* w,
                                             long long G) {
  const int lane = threadIdx.x & 31, dt = xb->dtype;
  const long long lo = g * cols, hi = min(lo + cols, V), nu = (hi - lo) >> 3, ti = lo + nu * 8 + lane;
  uint4 a[LS_U], b[LS_U];
#pragma unroll
  for (int k = 0; k < LS_U; ++k) {
    a[k] = b[k] = make_uint4(0u, 0u, 0u, 0u);
    if (lane + 32 * k < nu) amk_ld8_raw<W32>(xb->ptr, dt, (lo >> 3) + lane + 32 * k, a[k], b[k]);
  }
  const float tl = ti < hi ? amk_ldf(xb, ti) : 0.0f;
  if (vp < 0) vp = ls_vocab(lb, V);

  amk_lg_max st{-__int_as_float(0x7f800000), -1, 0};
#pragma unroll
  for (int k = 0; k < LS_U; ++k) {
    if (lane + 32 * k >= nu) break;
    float f[8];
    amk_cvt8<W32>(dt, a[k], b[k], f);
    const long long i0 = lo + 8ll * (lane + 32 * k);
#pragma unroll
    for (int j = 0; j < 8; ++j) ls_visit_max(st, f[j], i0 + j, vp);
  }
  if (ti < hi) ls_visit_max(st, tl, ti, vp);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(AMK_LG_FULL, st.bv, o);
    const long long oi = __shfl_xor_sync(AMK_LG_FULL, st.bi, o);
    const int on = __shfl_xor_sync(AMK_LG_FULL, st.n, o);
    amk_lg_merge_max(st.bv, st.bi, st.n, ov, oi, on);
  }

  float s = 0.0f;
  if (st.bi >= 0 && amk_lg_finite(st.bv)) {
#pragma unroll
    for (int k = 0; k < LS_U; ++k) {
      if (lane + 32 * k >= nu) break;
      float f[8];
      amk_cvt8<W32>(dt, a[k], b[k], f);
      const long long i0 = lo + 8ll * (lane + 32 * k);
#pragma unroll
      for (int j = 0; j < 8; ++j) ls_visit_sum(s, f[j], i0 + j, vp, st.bv);
    }
    if (ti < hi) ls_visit_sum(s, tl, ti, vp, st.bv);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) s = __fadd_rn(s, __shfl_xor_sync(AMK_LG_FULL, s, o));
  }
  if (lane == 0) {
    w[g] = __float_as_int(st.bv);
    w[G + g] = (int32_t)st.bi;
    w[2 * G + g] = __float_as_int(s);
    w[3 * G + g] = st.n;
  }
}

/* The task's slots on the warp path (see the top), out of line like ls_slot. */
template <bool W32>
__device__ __noinline__ void ls_warp_slots(const amk_buffer_t* xb, const amk_buffer_t* lb, long long V,
                                           long long cols, long long g0, long long g1, long long vp,
                                           int32_t* w, long long G) {
  for (long long g = g0 + (threadIdx.x >> 5); g < g1; g += AMK_WARPS) ls_warp_slot<W32>(xb, lb, V, cols, g, vp, w, G);
}

/* One slot, ids [lo, hi), into column w[0], w[G], w[2G], w[3G]. Out of line: its loads in
 * flight would take the registers of the dispatcher it is otherwise inlined into (which then
 * spills more). */
__device__ __noinline__ void ls_slot(const amk_buffer_t* xb, long long lo, long long hi, int32_t* w,
                                     long long G) {
  const amk_lg_max st = amk_lg_each(xb, lo, hi, amk_lg_max{-__int_as_float(0x7f800000), -1, 0});
  float bv = st.bv;
  long long bi = st.bi;
  int n = st.n;
  amk_lg_reduce_max(bv, bi, n);
  float s = 0.0f;
  if (bi >= 0 && amk_lg_finite(bv)) s = amk_lg_reduce_sum(amk_lg_each(xb, lo, hi, amk_lg_sum{bv, 0.0f}).s);
  if (threadIdx.x == 0) {
    w[0] = __float_as_int(bv);
    w[G] = (int32_t)bi;
    w[2 * G] = __float_as_int(s);
    w[3 * G] = n;
  }
}

/* The operands and params, checked when CHECK (all before the wait: descriptors and params). */
struct ls_args {
  const amk_buffer_t *x, *lim, *stats;
  long long V, G, cols, n_off, n_tile;
};

template <bool CHECK>
__device__ __forceinline__ bool ls_setup(const amk_task_ctx& ctx, ls_args& a) {
  const amk_params_t& p = ctx.inst->params;
  AMK_CHECK(ctx.inst->n_inputs == 2 && ctx.inst->n_outputs == 1, AMK_ERR_SHAPE, ctx.inst->n_inputs);
  a.x = amk_in(ctx, 0);
  a.lim = amk_in(ctx, 1);
  a.stats = amk_out(ctx, 0);
  a.V = a.x->numel;
  a.G = a.stats->shape[1];
  a.cols = p.ext[0];
  a.n_off = p.n_off;
  a.n_tile = p.N_tile;
  const int xdt = a.x->dtype;
  AMK_CHECK(xdt == AMK_F32 || xdt == AMK_F16 || xdt == AMK_BF16, AMK_ERR_DTYPE, xdt);
  AMK_CHECK(a.V >= 1 && a.V == amk_last_dim(a.x), AMK_ERR_SHAPE, a.V);
  AMK_CHECK(a.lim->dtype == AMK_I32, AMK_ERR_DTYPE, a.lim->dtype);
  AMK_CHECK(a.lim->numel >= 6, AMK_ERR_SHAPE, a.lim->numel);
  AMK_CHECK(a.stats->dtype == AMK_I32, AMK_ERR_DTYPE, a.stats->dtype);
  AMK_CHECK(a.stats->rank == 2 && a.stats->shape[0] == 4, AMK_ERR_SHAPE, a.stats->rank);
  AMK_CHECK(a.cols >= 1 && a.G * a.cols >= a.V && (a.G - 1) * a.cols < a.V, AMK_ERR_PARAM, a.cols);
  AMK_CHECK(a.n_tile >= 1 && a.n_off >= 0 && a.n_off + a.n_tile <= a.G, AMK_ERR_PARAM, a.n_tile);
  return true;
}

__device__ __noinline__ bool ls_check(const amk_task_ctx& ctx) {
  ls_args a;
  return ls_setup<true>(ctx, a);
}

__device__ void amk_op_logit_stats(const amk_task_ctx& ctx) {
  if (ctx.verify && !ls_check(ctx)) return;
  ls_args a;
  ls_setup<false>(ctx, a);
  const bool early = !ctx.check_only && (a.lim->flags & AMK_BUF_LAUNCH_CONST);
  long long vp = early ? ls_vocab(a.lim, a.V) : -1;
  if (!amk_task_wait(ctx)) return;
  int32_t* w = (int32_t*)a.stats->ptr;
  const long long g1 = a.n_off + a.n_tile;
  if (a.cols % 8 == 0 && a.cols <= 32 * LS_U * 8 && amk_al16(a.x->ptr)) {
    if (a.x->dtype == AMK_F32) ls_warp_slots<true>(a.x, a.lim, a.V, a.cols, a.n_off, g1, vp, w, a.G);
    else ls_warp_slots<false>(a.x, a.lim, a.V, a.cols, a.n_off, g1, vp, w, a.G);
    return;
  }
  if (vp < 0) vp = ls_vocab(a.lim, a.V);
  for (long long g = a.n_off; g < g1; ++g) ls_slot(a.x, min(g * a.cols, vp), min((g + 1) * a.cols, vp), w + g, a.G);
}
