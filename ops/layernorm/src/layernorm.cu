/* layernorm.cu — CUDA device function of LAYERNORM (amk_op_layernorm); the semantics are
 * ops/layernorm/src/reference.rs: every row (all leading dims) of x over the last dim `hidden`
 * becomes y = (x - mean) / sqrt(var + eps) * w + b (b = 0.0 when absent: still added, as the CPU
 * does, so -0.0 becomes +0.0 alike), biased variance, two-pass (mean, then mean((x - mean)^2)),
 * values read as f32, everything carried in f64, rounded once to f32 and cast on store. eps is
 * the f32 param widened to f64.
 *
 * Parallelisation: many short rows (rows > 1, hidden <= 1024, and rows >= AMK_WARPS / 2 or
 * hidden <= 256): one warp per row, lanes strided over the row, shuffle reduces. Otherwise the
 * whole block per row (block-strided, coalesced), rows one after the other. An I4 output (two
 * elements per byte) is written by one thread per row in block mode, so no two threads
 * read-modify-write one byte. */

__device__ void amk_op_layernorm(const amk_task_ctx& ctx) {
  const amk_params_t& p = ctx.inst->params;
  const int nin = ctx.inst->n_inputs;
  if (nin < 2 || nin > 3) {
    amk_fail(ctx, AMK_ERR_SHAPE, nin);
    return;
  }
  const amk_buffer_t* x = amk_in(ctx, 0);
  const amk_buffer_t* w = amk_in(ctx, 1);
  const amk_buffer_t* b = nin == 3 ? amk_in(ctx, 2) : (const amk_buffer_t*)0;
  const amk_buffer_t* out = amk_out(ctx, 0);
  const long long h = p.hidden;
  const double eps = (double)p.eps;
  if (h <= 0) {
    amk_fail(ctx, AMK_ERR_PARAM, h);
    return;
  }
  if (amk_last_dim(x) != h || w->numel != h || (b && b->numel != h) || out->numel != x->numel) {
    amk_fail(ctx, AMK_ERR_SHAPE, amk_last_dim(x));
    return;
  }
  const long long rows = x->numel / h;
  const double dh = (double)h;
  const bool i4 = out->dtype == AMK_I4;
  if (!i4 && rows > 1 && h <= 1024 && (rows >= AMK_WARPS / 2 || h <= 256)) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (long long r = warp; r < rows; r += AMK_WARPS) {
      const long long base = r * h;
      double s = 0.0;
      for (long long j = lane; j < h; j += 32) s += (double)amk_ldf(x, base + j);
      const double mean = amk_warp_sum_d(s) / dh;
      double q = 0.0;
      for (long long j = lane; j < h; j += 32) {
        const double d = (double)amk_ldf(x, base + j) - mean;
        q += d * d;
      }
      const double rstd = 1.0 / sqrt(amk_warp_sum_d(q) / dh + eps);
      for (long long j = lane; j < h; j += 32) {
        const double d = (double)amk_ldf(x, base + j) - mean;
        const double bj = b ? (double)amk_ldf(b, j) : 0.0;
        amk_stf(out, base + j, (float)(d * rstd * (double)amk_ldf(w, j) + bj));
      }
    }
    return;
  }
  for (long long r = 0; r < rows; ++r) {
    const long long base = r * h;
    double s = 0.0;
    for (long long j = threadIdx.x; j < h; j += AMK_THREADS) s += (double)amk_ldf(x, base + j);
    /* amk_block_sum_d starts and ends with a barrier: the previous row's I4 writes are done */
    const double mean = amk_block_sum_d(s) / dh;
    double q = 0.0;
    for (long long j = threadIdx.x; j < h; j += AMK_THREADS) {
      const double d = (double)amk_ldf(x, base + j) - mean;
      q += d * d;
    }
    const double rstd = 1.0 / sqrt(amk_block_sum_d(q) / dh + eps);
    const long long j0 = i4 ? (threadIdx.x == 0 ? 0 : h) : threadIdx.x;
    const long long js = i4 ? 1 : AMK_THREADS;
    for (long long j = j0; j < h; j += js) {
      const double d = (double)amk_ldf(x, base + j) - mean;
      const double bj = b ? (double)amk_ldf(b, j) : 0.0;
      amk_stf(out, base + j, (float)(d * rstd * (double)amk_ldf(w, j) + bj));
    }
  }
}
