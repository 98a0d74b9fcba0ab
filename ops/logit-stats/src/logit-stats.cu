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
 * limit is > 0, else V. A block a task; each slot is two passes of amk_logits.cuh (the maximum
 * with its first id and the count, then the sum), merged over the block in a fixed order, and
 * thread 0 stores the column. Every check comes before the first write. */

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

__device__ void amk_op_logit_stats(const amk_task_ctx& ctx) {
  const amk_params_t& p = ctx.inst->params;
  if (ctx.inst->n_inputs != 2 || ctx.inst->n_outputs != 1) {
    amk_fail(ctx, AMK_ERR_SHAPE, ctx.inst->n_inputs);
    return;
  }
  const amk_buffer_t* xb = amk_in(ctx, 0);
  const amk_buffer_t* lb = amk_in(ctx, 1);
  const amk_buffer_t* sb = amk_out(ctx, 0);
  const int xdt = xb->dtype;
  if (xdt != AMK_F32 && xdt != AMK_F16 && xdt != AMK_BF16) { amk_fail(ctx, AMK_ERR_DTYPE, xdt); return; }
  const long long V = xb->numel;
  if (V < 1 || V != amk_last_dim(xb)) { amk_fail(ctx, AMK_ERR_SHAPE, V); return; }
  if (lb->dtype != AMK_I32) { amk_fail(ctx, AMK_ERR_DTYPE, lb->dtype); return; }
  if (lb->numel < 6) { amk_fail(ctx, AMK_ERR_SHAPE, lb->numel); return; }
  if (sb->dtype != AMK_I32) { amk_fail(ctx, AMK_ERR_DTYPE, sb->dtype); return; }
  if (sb->rank != 2 || sb->shape[0] != 4) { amk_fail(ctx, AMK_ERR_SHAPE, sb->rank); return; }
  const long long G = sb->shape[1];
  const long long cols = p.ext[0];
  const long long n_off = p.n_off, n_tile = p.N_tile;
  if (cols < 1 || G * cols < V || (G - 1) * cols >= V) { amk_fail(ctx, AMK_ERR_PARAM, cols); return; }
  if (n_tile < 1 || n_off < 0 || n_off + n_tile > G) { amk_fail(ctx, AMK_ERR_PARAM, n_tile); return; }

  const long long vl = ((const int32_t*)lb->ptr)[5];
  const long long vp = vl > 0 && vl < V ? vl : V;
  int32_t* w = (int32_t*)sb->ptr;
  for (long long g = n_off; g < n_off + n_tile; ++g)
    ls_slot(xb, min(g * cols, vp), min((g + 1) * cols, vp), w + g, G);
}
