/* combine-gemv.cu — CUDA device function of COMBINE_GEMV (amk_op_combine_gemv); semantics:
 * ops/combine-gemv/src/reference.rs. Columns [n_off, n_off + N_tile) of
 * y = combine(partials at pos) @ W^T (+ bias), the merged row rounded to W's dtype.
 *
 * A tile merges the whole attention row into shared memory (cg_merge: a warp per query head,
 * lane s holding split s's m and l, the merge weights by shuffle, lanes over the head's dims),
 * then multiplies its weight rows by it as ATTENTION_GEMV does (amk_row_tile_run, or with
 * AMK_ROW_PRE the weight rows loaded into registers before the wait, amk_pre_run).
 *
 * The position says which splits are active (op_attention_split::active_splits). It is data:
 * read before the wait only when nothing in the launch writes it (AMK_BUF_LAUNCH_CONST), else
 * after it. */

/* The tile's operands and params. */
struct cg_args {
  const amk_buffer_t *parts, *w, *bias, *pos, *y;
  int hd, nh, nkv, rep, n_splits, chunk, n_tile, n_off;
  long long K;
};

template <bool CHECK>
__device__ __forceinline__ bool cg_setup(const amk_task_ctx& ctx, cg_args& a) {
  const amk_params_t& p = ctx.inst->params;
  const int nin = ctx.inst->n_inputs;
  AMK_CHECK(nin >= 3 && nin <= 4 && ctx.inst->n_outputs >= 1, AMK_ERR_SHAPE, nin);
  a.parts = amk_in(ctx, 0);
  a.w = amk_in(ctx, 1);
  a.bias = nin == 4 ? amk_in(ctx, 2) : nullptr;
  a.pos = amk_in(ctx, nin - 1);
  a.y = amk_out(ctx, 0);
  a.hd = p.head_dim;
  a.nh = p.n_heads;
  a.nkv = p.n_kv_heads;
  a.n_splits = p.ext[0];
  a.chunk = p.ext[1];
  a.K = p.K;
  a.n_tile = p.N_tile;
  a.n_off = p.n_off;
  AMK_CHECK(a.hd > 0 && a.nh > 0, AMK_ERR_PARAM, a.hd);
  AMK_CHECK(a.nkv > 0 && a.nh % a.nkv == 0, AMK_ERR_PARAM, a.nkv);
  AMK_CHECK(a.n_splits > 0 && a.n_splits <= 32, AMK_ERR_PARAM, a.n_splits);
  AMK_CHECK(a.chunk > 0, AMK_ERR_PARAM, a.chunk);
  a.rep = a.nh / a.nkv;
  if (CHECK) {
    const long long K = a.K;
    AMK_CHECK(K > 0 && K == (long long)a.nh * a.hd, AMK_ERR_PARAM, K);
    AMK_CHECK(a.parts->dtype == AMK_F32, AMK_ERR_DTYPE, a.parts->dtype);
    AMK_CHECK(a.parts->numel == (long long)a.nkv * a.n_splits * a.rep * (a.hd + 2), AMK_ERR_SHAPE,
              a.parts->numel);
    AMK_CHECK(amk_is_vec(a.w->dtype), AMK_ERR_DTYPE, a.w->dtype);
    AMK_CHECK(K * (a.w->dtype == AMK_F32 ? 4 : 2) <= ctx.smem_bytes, AMK_ERR_SHAPE, K);
    AMK_CHECK(amk_last_dim(a.w) == K, AMK_ERR_SHAPE, amk_last_dim(a.w));
    if (!amk_row_tile_check(ctx, a.w, K, a.n_tile, a.n_off, a.y, a.bias)) return false;
    AMK_CHECK(amk_att_pos_ok(a.pos), AMK_ERR_DTYPE, a.pos->dtype);
  }
  return true;
}

__device__ __noinline__ bool cg_check(const amk_task_ctx& ctx) {
  cg_args a;
  return cg_setup<true>(ctx, a);
}

/* Splits with rows at the position (block-uniform); -1, having failed the task, for a negative
 * position. */
__device__ __forceinline__ int cg_active(const amk_task_ctx& ctx, const cg_args& a) {
  const long long p = amk_ldif(a.pos, 0);
  if (p < 0) {
    amk_fail(ctx, AMK_ERR_INDEX, p);
    return -1;
  }
  const long long per = (p + a.n_splits) / a.n_splits;
  const long long size = (per + a.chunk - 1) / a.chunk * a.chunk;
  return (int)((p + size) / size); /* ceil((p + 1) / size) <= n_splits */
}

/* The merged row into shared memory, rounded to W's dtype: a warp per query head. Every warp
 * sees it after the barrier at the end. Then the trace point: the row is ready. */
__device__ __forceinline__ amk_frow cg_merge(const amk_task_ctx& ctx, const cg_args& a, int active,
                                             const amk_buffer_t* row, unsigned long long pol) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const float NEG_INF = -__int_as_float(0x7f800000);
  const long long stride = (long long)a.hd + 2;
  for (int h = warp; h < a.nh; h += AMK_WARPS) {
    const int g = h / a.rep, r = h - (h / a.rep) * a.rep;
    /* split s of head h starts at base + s * split_stride */
    const long long base = ((long long)g * a.n_splits * a.rep + r) * stride;
    const long long split_stride = (long long)a.rep * stride;
    float ms = NEG_INF, ls = 0.0f;
    if (lane < active) {
      ms = amk_ldf32(a.parts, base + lane * split_stride + a.hd);
      ls = amk_ldf32(a.parts, base + lane * split_stride + a.hd + 1);
    }
    float m = ms;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(ATT_FULL, m, o));
    const float w = (lane < active && ls > 0.0f) ? expf(__fsub_rn(ms, m)) : 0.0f;
    float l = __fmul_rn(ls, w);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) l = __fadd_rn(l, __shfl_xor_sync(ATT_FULL, l, o));
    const float denom = fmaxf(l, 1e-20f);
    for (int d0 = 0; d0 < a.hd; d0 += 32) { /* warp-uniform: every lane shuffles */
      const int d = d0 + lane;
      float acc = 0.0f;
      for (int s = 0; s < active; ++s) {
        const float ws = __shfl_sync(ATT_FULL, w, s);
        if (d < a.hd && ws != 0.0f)
          acc = __fadd_rn(acc, __fmul_rn(amk_ldf32(a.parts, base + s * split_stride + d), ws));
      }
      if (d < a.hd) amk_stf(row, (long long)h * a.hd + d, __fdiv_rn(acc, denom));
    }
  }
  __syncthreads();
  if (ctx.trace && threadIdx.x == 0) ctx.trace[4] = amk_globaltimer();
  return amk_smem_frow(ctx, row, pol);
}

/* Everything after the wait, out of line (ATTENTION_GEMV's ag_run says why): the weight rows to
 * L2 first, then the merged row, then the projection. */
__device__ __noinline__ void cg_run(const amk_task_ctx& ctx) {
  cg_args a;
  cg_setup<false>(ctx, a);
  const int active = cg_active(ctx, a);
  if (active < 0) return;
  const amk_buffer_t* w = a.w;
  const unsigned long long pol = amk_weight_policy(ctx.prog->flags);
  if (threadIdx.x == 0) {
    const long long wsz = w->dtype == AMK_F32 ? 4 : 2;
    amk_prefetch_l2_bulk((uint64_t)w->ptr + (uint64_t)((long long)a.n_off * a.K * wsz),
                         (uint64_t)((long long)a.n_tile * a.K * wsz), pol);
  }
  const amk_buffer_t row = amk_smem_row(ctx, a.K, a.w->dtype); /* the merged row */
  const amk_frow r = cg_merge(ctx, a, active, &row, pol);
  amk_row_tile_run(r, a.K, w, amk_al16(w->ptr), a.n_tile, a.n_off, a.y, a.bias);
}

#if AMK_ROW_PRE
/* The pre path (ATTENTION_GEMV's ag_pre says how): weight rows into registers before the wait
 * when the position is final by then; false, having done nothing, otherwise. */
__device__ __noinline__ bool cg_pre(const amk_task_ctx& ctx) {
  cg_args a;
  cg_setup<false>(ctx, a);
  const amk_buffer_t* w = a.w;
  const bool al = amk_al16(w->ptr);
  if (!amk_pre_row_ok<1>(ctx, w->dtype, true, a.K, w->dtype, al, a.n_tile)) return false;
  if (!(a.pos->flags & AMK_BUF_LAUNCH_CONST)) return false;
  const int active = cg_active(ctx, a);
  if (active < 0) return true; /* the task failed: nothing more */
  const unsigned long long pol = amk_weight_policy(ctx.prog->flags);
  const amk_buffer_t row = amk_smem_row(ctx, a.K, w->dtype);
  return amk_row_tile_pre(ctx, a.K, w, a.n_tile, a.n_off, a.y, a.bias,
                          [&] { return cg_merge(ctx, a, active, &row, pol); });
}
#endif

__device__ __forceinline__ void amk_op_combine_gemv(const amk_task_ctx& ctx) {
  if (ctx.verify && !cg_check(ctx)) return;
#if AMK_ROW_PRE
  if (cg_pre(ctx)) return;
#endif
  if (!amk_task_wait(ctx)) return;
  cg_run(ctx);
}
