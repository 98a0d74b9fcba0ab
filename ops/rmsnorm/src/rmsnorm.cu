/* rmsnorm.cu — CUDA device function of RMSNORM (amk_op_rmsnorm); the semantics are
 * ops/rmsnorm/src/reference.rs: every row (all leading dims) of x over the last dim `hidden`
 * becomes y = x * rsqrt(mean(x^2) + eps) * w, with the values read as f32, the reduction and the
 * per-element products carried in f64, rounded once to f32 and cast on store. eps is the f32
 * param widened to f64 (as the CPU does after rounding it to f32).
 *
 * Parallelisation: many short rows (rows > 1, hidden <= 1024, and rows >= AMK_WARPS / 2 or
 * hidden <= 256): one warp per row, lanes strided over the row, shuffle reduce. Otherwise the
 * whole block per row (block-strided, coalesced), rows one after the other. An I4 output (two
 * elements per byte) is written by one thread per row in block mode, so no two threads
 * read-modify-write one byte. */

__device__ void amk_op_rmsnorm(const amk_task_ctx& ctx) {
  const amk_params_t& p = ctx.inst->params;
  const amk_buffer_t* x = amk_in(ctx, 0);
  const amk_buffer_t* w = amk_in(ctx, 1);
  const amk_buffer_t* out = amk_out(ctx, 0);
  const long long h = p.hidden;
  const double eps = (double)p.eps;
  if (h <= 0) {
    amk_fail(ctx, AMK_ERR_PARAM, h);
    return;
  }
  if (amk_last_dim(x) != h || w->numel != h || out->numel != x->numel) {
    amk_fail(ctx, AMK_ERR_SHAPE, amk_last_dim(x));
    return;
  }
  const long long rows = x->numel / h;
  const bool i4 = out->dtype == AMK_I4;
  if (!i4 && rows > 1 && h <= 1024 && (rows >= AMK_WARPS / 2 || h <= 256)) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (long long r = warp; r < rows; r += AMK_WARPS) {
      const long long base = r * h;
      double s = 0.0;
      for (long long j = lane; j < h; j += 32) {
        const double v = (double)amk_ldf(x, base + j);
        s += v * v;
      }
      s = amk_warp_sum_d(s);
      const double inv = 1.0 / sqrt(s / (double)h + eps);
      for (long long j = lane; j < h; j += 32) {
        const double v = (double)amk_ldf(x, base + j);
        amk_stf(out, base + j, (float)(v * inv * (double)amk_ldf(w, j)));
      }
    }
    return;
  }
  for (long long r = 0; r < rows; ++r) {
    const long long base = r * h;
    double s = 0.0;
    for (long long j = threadIdx.x; j < h; j += AMK_THREADS) {
      const double v = (double)amk_ldf(x, base + j);
      s += v * v;
    }
    /* amk_block_sum_d starts and ends with a barrier: the previous row's I4 writes are done */
    s = amk_block_sum_d(s);
    const double inv = 1.0 / sqrt(s / (double)h + eps);
    const long long j0 = i4 ? (threadIdx.x == 0 ? 0 : h) : threadIdx.x;
    const long long js = i4 ? 1 : AMK_THREADS;
    for (long long j = j0; j < h; j += js) {
      const double v = (double)amk_ldf(x, base + j);
      amk_stf(out, base + j, (float)(v * inv * (double)amk_ldf(w, j)));
    }
  }
}
