/* gate-up-silu.cu — CUDA device function of GATE_UP_SILU (amk_op_gate_up_silu); the semantics
 * are ops/gate-up-silu/src/reference.rs: columns [n_off, n_off + N_tile) of
 * silu(xn·Wg^T)·(xn·Wu^T), xn = x or rmsnorm(x, norm_w, eps) (a 4th input).
 *
 * The fused-tile machinery is backends/cuda/include/amk_tile.cuh: each warp streams the gate and
 * the up row of one column together (4 16-byte vectors of each in flight per lane), rounds both
 * sums to the output's dtype and stores silu(g)·u. */

__device__ void amk_op_gate_up_silu(const amk_task_ctx& ctx) {
  const amk_params_t& p = ctx.inst->params;
  const int nin = ctx.inst->n_inputs;
  if (nin < 3 || nin > 4 || ctx.inst->n_outputs < 1) {
    amk_fail(ctx, AMK_ERR_SHAPE, nin);
    return;
  }
  const amk_buffer_t* x = amk_in(ctx, 0);
  const amk_buffer_t* w[2] = {amk_in(ctx, 1), amk_in(ctx, 2)};
  const amk_buffer_t* nw = nin == 4 ? amk_in(ctx, 3) : nullptr;
  const amk_buffer_t* y = amk_out(ctx, 0);
  const long long K = p.K;
  const int n_tile = p.N_tile, n_off = p.n_off;
  if (!amk_fused_check(ctx, x, w, 2, nw, K)) return;
  const long long n = amk_udiv(w[0]->numel, K);
  if (n_tile <= 0 || n_off < 0) { amk_fail(ctx, AMK_ERR_PARAM, n_tile <= 0 ? n_tile : n_off); return; }
  const long long end = (long long)n_off + n_tile;
  if (w[1]->numel != w[0]->numel || end > n || end > amk_last_dim(y) ||
      y->numel != amk_last_dim(y)) {
    amk_fail(ctx, AMK_ERR_SHAPE, end);
    return;
  }
  if (!amk_is_vec(y->dtype)) { amk_fail(ctx, AMK_ERR_DTYPE, y->dtype); return; }
  const amk_buffer_t* wg = w[0];
  const amk_buffer_t* wu = w[1];
  const int wdt = wg->dtype == wu->dtype ? wg->dtype : -1;
  if (!amk_task_wait(ctx)) return; /* the checks above read descriptors only */
  const amk_frow r = amk_frow_make(ctx, x, nw, K, p.eps);
  amk_fused_run<2>(
      r, K, wdt, amk_al16(wg->ptr) && amk_al16(wu->ptr), n_tile,
      [=](int j, const amk_buffer_t* (&wb)[2], long long (&row)[2]) {
        wb[0] = wg;
        wb[1] = wu;
        row[0] = row[1] = n_off + j;
      },
      [=](int j, const float (&s)[2]) {
        if ((threadIdx.x & 31) == 0) {
          const float g = amk_round_dt(y->dtype, s[0]), u = amk_round_dt(y->dtype, s[1]);
          amk_stf(y, (long long)n_off + j, g / (1.0f + expf(-g)) * u);
        }
      });
}
