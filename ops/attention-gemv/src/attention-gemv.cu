/* attention-gemv.cu — CUDA device function of ATTENTION_GEMV (amk_op_attention_gemv); the
 * semantics are ops/attention-gemv/src/reference.rs: columns [n_off, n_off + N_tile) of
 * y = attention(q, k_cache, v_cache) @ W^T (+ bias), the attention row rounded to q's dtype.
 *
 * A tile computes the whole attention row into shared memory (backends/cuda/include/
 * amk_attention.cuh, ATTENTION_TILE's paths and arithmetic; stores through a descriptor of
 * shared memory), then multiplies its weight rows by that row as GEMV_TILE's one-row path does
 * (same sums in the same order). With AMK_ROW_PRE (16-bit rows of one pass) it loads its weight
 * rows into registers before its wait (ag_pre); otherwise, after its wait, it asks L2 for them
 * (one bulk prefetch: the memory system idles while the attention runs) and streams them after
 * the attention (ag_run, amk_row_tile_run).
 *
 * A position input (the integer input after W and the bias) clips the attention's window to the
 * rows at or before it (amk_att_at_pos). It is data: ag_run reads it after the wait; ag_pre,
 * before the wait, only when nothing in the launch writes it (its descriptor's
 * AMK_BUF_LAUNCH_CONST), and otherwise leaves the tile to ag_run. */

/* The tile's operands and params. */
struct ag_args {
  amk_att_geom g;
  const amk_buffer_t *q, *kc, *vc, *w, *bias, *pos, *y;
  long long K;
  int n_tile, n_off;
};

/* The operands from the descriptors and params, the attention's checks included (they also
 * derive its geometry, the window not yet clipped by a position); CHECK: also the projection's
 * checks (the validator's, again on the device), failing the task (false) on the first that
 * fails. */
template <bool CHECK>
__device__ __forceinline__ bool ag_setup(const amk_task_ctx& ctx, ag_args& a) {
  const amk_params_t& p = ctx.inst->params;
  const int nin = ctx.inst->n_inputs;
  AMK_CHECK(nin >= 4 && nin <= 6 && ctx.inst->n_outputs >= 1, AMK_ERR_SHAPE, nin);
  if (!amk_att_setup<CHECK>(ctx, false, a.g)) return false;
  a.q = amk_in(ctx, 0);
  a.kc = amk_in(ctx, 1);
  a.vc = amk_in(ctx, 2);
  a.w = amk_in(ctx, 3);
  /* The bias (float) and the position (integer) follow W, the bias first: a lone fifth input
     is the one its dtype says (op_attention_gemv::operand_slots). */
  const amk_buffer_t* in4 = nin >= 5 ? amk_in(ctx, 4) : nullptr;
  const bool pos4 = nin == 5 && amk_is_int(in4->dtype);
  a.bias = pos4 ? nullptr : in4;
  a.pos = nin == 6 ? amk_in(ctx, 5) : (pos4 ? in4 : nullptr);
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
    AMK_CHECK(!a.pos || amk_att_pos_ok(a.pos), AMK_ERR_DTYPE, a.pos->dtype);
  }
  return true;
}

/* ag_setup<true> out of line: run unless amk_verify_tasks passed the task (ctx.verify). */
__device__ __noinline__ bool ag_check(const amk_task_ctx& ctx) {
  ag_args a;
  return ag_setup<true>(ctx, a);
}

/* The attention row into shared memory (every warp sees it after this), then the trace point:
 * the row is ready (the rest is the projection). */
__device__ __forceinline__ amk_frow ag_attend(const amk_task_ctx& ctx, const ag_args& a,
                                              const amk_buffer_t* row, unsigned long long pol) {
#if AMK_PROBE == 3 && !AMK_TRACE_OFF
  /* a cold attention, then the same warm (probe 6 between them, 7 after) */
  amk_att_run(a.q, a.kc, a.vc, row, a.g);
  __syncthreads();
  AMK_PROBE_AT(6, true);
#endif
  amk_att_run(a.q, a.kc, a.vc, row, a.g);
  __syncthreads();
  AMK_PROBE_IF(3, 7, true);
  if (ctx.trace && threadIdx.x == 0) ctx.trace[4] = amk_globaltimer();
  return amk_smem_frow(ctx, row, pol);
}

/* Everything after the wait, out of line: the dispatcher keeps only the check flag and the
 * wait inline, so a late block goes from its previous task to its wait at once (the setup's
 * divisions and the arguments' spills would sit on that path otherwise). The weight rows go
 * to L2 first (HBM idles while the attention runs), then the attention row into shared
 * memory, then the projection. */
__device__ __noinline__ void ag_run(const amk_task_ctx& ctx) {
  ag_args a;
  ag_setup<false>(ctx, a);
  if (a.pos && !amk_att_at_pos(ctx, a.pos, a.g)) return; /* after the wait: the value is final */
  const amk_buffer_t* w = a.w;
  const unsigned long long pol = amk_weight_policy(ctx.prog->flags);
  if (threadIdx.x == 0) {
    const long long wsz = w->dtype == AMK_F32 ? 4 : 2;
    amk_prefetch_l2_bulk((uint64_t)w->ptr + (uint64_t)((long long)a.n_off * a.K * wsz),
                         (uint64_t)((long long)a.n_tile * a.K * wsz), pol);
  }
  const amk_buffer_t row = amk_smem_row(ctx, a.K, a.q->dtype); /* the attention row */
  const amk_frow r = ag_attend(ctx, a, &row, pol);
  amk_row_tile_run(r, a.K, w, amk_al16(w->ptr), a.n_tile, a.n_off, a.y, a.bias);
}

#if AMK_ROW_PRE
/* The pre path (AMK_ROW_PRE, amk_pre_run): a tile whose 16-bit attention row and weight rows
 * qualify (amk_pre_row_ok) loads its weight rows into registers before its wait, which the
 * tile spends waiting for Q/K/V anyway, so its projection after the attention is one pass over
 * registers (the same sums in the same order as amk_row_tile_run's). Returns false, having
 * done nothing, for a tile that does not qualify, or whose position is not final before the
 * wait (it then repeats the setup after its wait, in ag_run); true when it ran the tile or
 * failed it (a negative position, an empty window). Out of line, as ag_run. */
__device__ __noinline__ bool ag_pre(const amk_task_ctx& ctx) {
  ag_args a;
  ag_setup<false>(ctx, a);
  const amk_buffer_t* w = a.w;
  const bool al = amk_al16(w->ptr);
  if (!amk_pre_row_ok<1>(ctx, a.q->dtype, true, a.K, w->dtype, al, a.n_tile)) return false;
  /* Before the wait a position is final only when nothing in the launch writes it; otherwise
     the tile takes ag_run, which reads it after its wait. (Not in amk_verify_tasks:
     amk_pre_row_ok refuses check_only.) */
  if (a.pos) {
    if (!(a.pos->flags & AMK_BUF_LAUNCH_CONST)) return false;
    if (!amk_att_at_pos(ctx, a.pos, a.g)) return true; /* the task failed: nothing more */
  }
  const unsigned long long pol = amk_weight_policy(ctx.prog->flags);
  const amk_buffer_t row = amk_smem_row(ctx, a.K, a.q->dtype);
  return amk_row_tile_pre(ctx, a.K, w, a.n_tile, a.n_off, a.y, a.bias,
                          [&] { return ag_attend(ctx, a, &row, pol); });
}
#endif

__device__ __forceinline__ void amk_op_attention_gemv(const amk_task_ctx& ctx) {
  if (ctx.verify && !ag_check(ctx)) return;
#if AMK_ROW_PRE
  if (ag_pre(ctx)) return; /* waited (or the launch is aborting, or the task failed) inside */
#endif
  if (!amk_task_wait(ctx)) return; /* the checks read descriptors only */
  ag_run(ctx);
}
