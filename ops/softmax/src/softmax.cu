/* softmax.cu — CUDA device function of SOFTMAX (amk_op_softmax); the semantics are
 * ops/softmax/src/reference.rs: param `dim` (default -1 when absent, negative counts from the
 * end; a rank-0 input is one element along dim 0 / -1) picks the axis; the input is viewed as
 * [outer, n, inner] around it and every slice becomes exp(x - max) / sum exp(x - max) in f32,
 * cast on store (the output viewed with the input's shape). max ignores NaN like f32::max /
 * fmaxf, starting from -inf.
 *
 * Parallelisation: inner == 1 (the usual last-dim case): one warp per slice when there are
 * several short slices (slices > 1, n <= 1024, and slices >= AMK_WARPS / 2 or n <= 256), else
 * the whole block per slice (block reduces).
 * inner > 1 with many slices: one thread per slice, consecutive threads on consecutive inner
 * indices (coalesced), serial over the axis. An I4 output (two elements per byte) is computed
 * and written by thread 0 alone. */

/* Slice s of [outer, n, inner]: element j sits at first + j * inner. */
__device__ __forceinline__ long long slice_first(long long s, long long n, long long inner) {
  const long long o = s / inner, i = s - o * inner;
  return o * n * inner + i;
}

__device__ void amk_op_softmax(const amk_task_ctx& ctx) {
  const amk_params_t& p = ctx.inst->params;
  const amk_buffer_t* x = amk_in(ctx, 0);
  const amk_buffer_t* out = amk_out(ctx, 0);
  const int rank = x->rank;
  const long long dim = amk_has(p, AMK_P_DIM) ? (long long)p.dim : -1;
  const long long r1 = rank > 1 ? rank : 1;
  if (dim < -r1 || dim >= r1) {
    amk_fail(ctx, AMK_ERR_PARAM, dim);
    return;
  }
  if (out->numel != x->numel) {
    amk_fail(ctx, AMK_ERR_SHAPE, out->numel);
    return;
  }
  if (x->numel == 0) return;
  const int axis = (int)(dim < 0 ? dim + r1 : dim);
  long long outer = 1, n = 1, inner = 1;
  if (rank > 0) {
    for (int d = 0; d < axis; ++d) outer *= x->shape[d];
    n = x->shape[axis];
    for (int d = axis + 1; d < rank; ++d) inner *= x->shape[d];
  }
  const long long slices = outer * inner;
  const float neg_inf = -__int_as_float(0x7f800000);

  if (out->dtype == AMK_I4 || (inner > 1 && slices >= AMK_THREADS)) {
    /* One thread per slice (thread 0 for everything with an I4 output). */
    const bool i4 = out->dtype == AMK_I4;
    const long long s0 = i4 ? (threadIdx.x == 0 ? 0 : slices) : threadIdx.x;
    const long long ss = i4 ? 1 : AMK_THREADS;
    for (long long s = s0; s < slices; s += ss) {
      const long long f = slice_first(s, n, inner);
      float m = neg_inf;
      for (long long j = 0; j < n; ++j) m = fmaxf(m, amk_ldf(x, f + j * inner));
      float sum = 0.0f;
      for (long long j = 0; j < n; ++j) sum += expf(amk_ldf(x, f + j * inner) - m);
      for (long long j = 0; j < n; ++j) {
        const long long at = f + j * inner;
        amk_stf(out, at, expf(amk_ldf(x, at) - m) / sum);
      }
    }
    return;
  }
  if (slices > 1 && n <= 1024 && (slices >= AMK_WARPS / 2 || n <= 256)) {
    /* One warp per slice. */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    for (long long s = warp; s < slices; s += AMK_WARPS) {
      const long long f = slice_first(s, n, inner);
      float m = neg_inf;
      for (long long j = lane; j < n; j += 32) m = fmaxf(m, amk_ldf(x, f + j * inner));
      m = amk_warp_max(m);
      float sum = 0.0f;
      for (long long j = lane; j < n; j += 32) sum += expf(amk_ldf(x, f + j * inner) - m);
      sum = amk_warp_sum(sum);
      for (long long j = lane; j < n; j += 32) {
        const long long at = f + j * inner;
        amk_stf(out, at, expf(amk_ldf(x, at) - m) / sum);
      }
    }
    return;
  }
  /* The whole block per slice. */
  for (long long s = 0; s < slices; ++s) {
    const long long f = slice_first(s, n, inner);
    float m = neg_inf;
    for (long long j = threadIdx.x; j < n; j += AMK_THREADS)
      m = fmaxf(m, amk_ldf(x, f + j * inner));
    m = amk_block_max(m);
    float sum = 0.0f;
    for (long long j = threadIdx.x; j < n; j += AMK_THREADS)
      sum += expf(amk_ldf(x, f + j * inner) - m);
    sum = amk_block_sum(sum);
    for (long long j = threadIdx.x; j < n; j += AMK_THREADS) {
      const long long at = f + j * inner;
      amk_stf(out, at, expf(amk_ldf(x, at) - m) / sum);
    }
  }
}
