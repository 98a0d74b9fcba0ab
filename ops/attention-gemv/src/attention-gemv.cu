/* attention-gemv.cu — CUDA device function of ATTENTION_GEMV (amk_op_attention_gemv); the
 * semantics are ops/attention-gemv/src/reference.rs: columns [n_off, n_off + N_tile) of
 * y = attention(q, k_cache, v_cache) @ W^T (+ bias), the attention row rounded to q's dtype.
 *
 * After its wait a tile asks L2 for its weight rows (one bulk prefetch: the memory system
 * idles while the attention runs; issued before the wait it measured no faster), computes
 * the whole attention row into shared memory (backends/cuda/include/amk_attention.cuh,
 * ATTENTION_TILE's paths and arithmetic; stores through a descriptor of shared memory), then
 * streams its weight rows against that row as GEMV_TILE's one-row path does (amk_row_tile_run:
 * same sums in the same order). */

/* The tile's operands and params. */
struct ag_args {
  amk_att_geom g;
  const amk_buffer_t *q, *kc, *vc, *w, *bias, *y;
  long long K;
  int n_tile, n_off;
};

/* The operands from the descriptors and params, the attention's checks included (they also
 * derive its geometry); CHECK: also the projection's checks (the validator's, again on the
 * device), failing the task (false) on the first that fails. */
template <bool CHECK>
__device__ __forceinline__ bool ag_setup(const amk_task_ctx& ctx, ag_args& a) {
  const amk_params_t& p = ctx.inst->params;
  const int nin = ctx.inst->n_inputs;
  AMK_CHECK(nin >= 4 && nin <= 5 && ctx.inst->n_outputs >= 1, AMK_ERR_SHAPE, nin);
  if (!amk_att_setup<CHECK>(ctx, false, a.g)) return false;
  a.q = amk_in(ctx, 0);
  a.kc = amk_in(ctx, 1);
  a.vc = amk_in(ctx, 2);
  a.w = amk_in(ctx, 3);
  a.bias = nin == 5 ? amk_in(ctx, 4) : nullptr;
  a.y = amk_out(ctx, 0);
  a.K = p.K;
  a.n_tile = p.N_tile;
  a.n_off = p.n_off;
  if (CHECK) {
    const long long K = a.K;
    AMK_CHECK(K > 0 && a.g.batch == 1 && (long long)a.g.nh * a.g.hd == K, AMK_ERR_PARAM, K);
    AMK_CHECK(amk_is_vec(a.q->dtype), AMK_ERR_DTYPE, a.q->dtype);
    AMK_CHECK(K * (a.q->dtype == AMK_F32 ? 4 : 2) <= ctx.smem_bytes, AMK_ERR_SHAPE, K);
    AMK_CHECK(amk_is_vec(a.w->dtype), AMK_ERR_DTYPE, a.w->dtype);
    AMK_CHECK(amk_last_dim(a.w) == K, AMK_ERR_SHAPE, amk_last_dim(a.w));
    if (!amk_row_tile_check(ctx, a.w, K, a.n_tile, a.n_off, a.y, a.bias)) return false;
  }
  return true;
}

/* ag_setup<true> out of line: run unless amk_verify_tasks passed the task (ctx.verify). */
__device__ __noinline__ bool ag_check(const amk_task_ctx& ctx) {
  ag_args a;
  return ag_setup<true>(ctx, a);
}

/* Everything after the wait, out of line: the dispatcher keeps only the check flag and the
 * wait inline, so a late block goes from its previous task to its wait at once (the setup's
 * divisions and the arguments' spills would sit on that path otherwise). The weight rows go
 * to L2 first (HBM idles while the attention runs), then the attention row into shared
 * memory, then the projection. */
__device__ __noinline__ void ag_run(const amk_task_ctx& ctx) {
  ag_args a;
  ag_setup<false>(ctx, a);
  const long long K = a.K;
  const int n_tile = a.n_tile, n_off = a.n_off;
  const amk_buffer_t* w = a.w;
  const unsigned long long pol = amk_weight_policy(ctx.prog->flags);
  if (threadIdx.x == 0) {
    const long long wsz = w->dtype == AMK_F32 ? 4 : 2;
    amk_prefetch_l2_bulk((uint64_t)w->ptr + (uint64_t)((long long)n_off * K * wsz),
                         (uint64_t)((long long)n_tile * K * wsz), pol);
  }
  /* The attention row's home: shared memory, as a one-row buffer of q's dtype. */
  amk_buffer_t row;
  row.ptr = ctx.smem;
  row.numel = K;
  row.rank = 1;
  row.dtype = a.q->dtype;
  row.space = 0;
  row.flags = 0;
  for (int i = 0; i < 4; ++i) {
    row.shape[i] = i == 0 ? K : 1;
    row.stride[i] = 1;
  }
  amk_att_run(a.q, a.kc, a.vc, &row, a.g);
  __syncthreads(); /* the row is in shared memory for every warp */
  /* Trace point: the row is ready (the rest is the projection). */
  if (ctx.trace && threadIdx.x == 0) ctx.trace[4] = amk_globaltimer();
  amk_frow r;
  r.p = ctx.smem;
  r.dt = a.q->dtype;
  r.x = &row;
  r.nw = nullptr;
  r.inv = 0.0;
  r.pol = pol;
  amk_row_tile_run(r, K, w, amk_al16(w->ptr), a.n_tile, a.n_off, a.y, a.bias);
}

__device__ __forceinline__ void amk_op_attention_gemv(const amk_task_ctx& ctx) {
  if (ctx.verify && !ag_check(ctx)) return;
  if (!amk_task_wait(ctx)) return; /* the checks read descriptors only */
  ag_run(ctx);
}
