/* rmsnorm-gemv.cu — CUDA device function of RMSNORM_GEMV (amk_op_rmsnorm_gemv); the semantics
 * are ops/rmsnorm-gemv/src/reference.rs: columns [n_off, n_off + N_tile) of
 * y = rmsnorm(x, norm_w, eps) @ W^T (+ bias) for one row x.
 *
 * The fused-tile machinery is ops/oplib-tile/src/amk_tile.cuh (amk_frow_make normalises the
 * row into shared memory, amk_row_tile_run streams the weight rows): one weight row per warp at a
 * time, 8 16-byte vectors in flight per lane, as GEMV_TILE. */

/* The tile's operands and params. */
struct rg_args {
  const amk_buffer_t *x, *nw, *w, *bias, *y;
  long long K;
  int n_tile, n_off;
};

/* The operands from the descriptors and params; CHECK: also the checks that read only those
 * (the validator's, again on the device), failing the task (false) on the first that fails. */
template <bool CHECK>
__device__ __forceinline__ bool rg_setup(const amk_task_ctx& ctx, rg_args& a) {
  const amk_params_t& p = ctx.inst->params;
  const int nin = ctx.inst->n_inputs;
  AMK_CHECK(nin >= 3 && nin <= 4 && ctx.inst->n_outputs >= 1, AMK_ERR_SHAPE, nin);
  a.x = amk_in(ctx, 0);
  a.nw = amk_in(ctx, 1);
  a.w = amk_in(ctx, 2);
  a.bias = nin == 4 ? amk_in(ctx, 3) : nullptr;
  a.y = amk_out(ctx, 0);
  a.K = p.K;
  a.n_tile = p.N_tile;
  a.n_off = p.n_off;
  if (CHECK) {
    if (!amk_fused_check(ctx, a.x, &a.w, 1, a.nw, a.K)) return false;
    if (!amk_row_tile_check(ctx, a.w, a.K, a.n_tile, a.n_off, a.y, a.bias)) return false;
  }
  return true;
}

/* rg_setup<true> out of line: run unless amk_verify_tasks passed the task (ctx.verify). */
__device__ __noinline__ bool rg_check(const amk_task_ctx& ctx) {
  rg_args a;
  return rg_setup<true>(ctx, a);
}

__device__ void amk_op_rmsnorm_gemv(const amk_task_ctx& ctx) {
  if (ctx.verify && !rg_check(ctx)) return;
  rg_args a;
  rg_setup<false>(ctx, a);
  /* the checks read descriptors only: the tile waits from here */
  amk_row_tile(ctx, a.x, a.nw, a.K, ctx.inst->params.eps, a.w, amk_al16(a.w->ptr), a.n_tile, a.n_off,
               a.y, a.bias);
}
