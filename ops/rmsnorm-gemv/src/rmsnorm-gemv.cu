/* rmsnorm-gemv.cu — CUDA device function of RMSNORM_GEMV (amk_op_rmsnorm_gemv); the semantics
 * are ops/rmsnorm-gemv/src/reference.rs: columns [n_off, n_off + N_tile) of
 * y = rmsnorm(x, norm_w, eps) @ W^T (+ bias) for one row x.
 *
 * The fused-tile machinery is backends/cuda/include/amk_tile.cuh (amk_frow_make normalises the
 * row into shared memory, amk_fused_run streams the weight rows): one weight row per warp at a
 * time, 8 16-byte vectors in flight per lane, as GEMV_TILE. */

__device__ void amk_op_rmsnorm_gemv(const amk_task_ctx& ctx) {
  const amk_params_t& p = ctx.inst->params;
  const int nin = ctx.inst->n_inputs;
  if (nin < 3 || nin > 4 || ctx.inst->n_outputs < 1) {
    amk_fail(ctx, AMK_ERR_SHAPE, nin);
    return;
  }
  const amk_buffer_t* x = amk_in(ctx, 0);
  const amk_buffer_t* nw = amk_in(ctx, 1);
  const amk_buffer_t* w = amk_in(ctx, 2);
  const amk_buffer_t* bias = nin == 4 ? amk_in(ctx, 3) : nullptr;
  const amk_buffer_t* y = amk_out(ctx, 0);
  const long long K = p.K;
  const int n_tile = p.N_tile, n_off = p.n_off;
  if (!amk_fused_check(ctx, x, &w, 1, nw, K)) return;
  const long long n = amk_udiv(w->numel, K);
  if (n_tile <= 0 || n_off < 0) { amk_fail(ctx, AMK_ERR_PARAM, n_tile <= 0 ? n_tile : n_off); return; }
  const long long end = (long long)n_off + n_tile;
  if (end > n || end > amk_last_dim(y) || y->numel != amk_last_dim(y) ||
      (bias && bias->numel != n)) {
    amk_fail(ctx, AMK_ERR_SHAPE, end);
    return;
  }
  if (!amk_is_vec(y->dtype) || (bias && !amk_is_vec(bias->dtype))) {
    amk_fail(ctx, AMK_ERR_DTYPE, y->dtype);
    return;
  }
  if (!amk_task_wait(ctx)) return; /* the checks above read descriptors only */
  const amk_frow r = amk_frow_make(ctx, x, nw, K, p.eps);
  amk_fused_run<1>(
      r, K, w->dtype, amk_al16(w->ptr), n_tile,
      [=](int j, const amk_buffer_t* (&wb)[1], long long (&row)[1]) {
        wb[0] = w;
        row[0] = n_off + j;
      },
      [=](int j, const float (&s)[1]) {
        if ((threadIdx.x & 31) == 0) {
          const long long c = n_off + j;
          amk_stf(y, c, s[0] + (bias ? amk_ldf(bias, c) : 0.0f));
        }
      });
}
