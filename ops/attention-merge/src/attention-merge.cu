/* attention-merge.cu — CUDA device function of ATTENTION_MERGE (amk_op_attention_merge);
 * semantics: ops/attention-merge/src/reference.rs. Columns [n_off, n_off + N_tile) (whole
 * heads) of the attention row, merged from the split-KV partials at the position.
 *
 * A thread per element of the tile (head h, dim d): every load it needs — acc[d], m and l of
 * each active split — is issued before the first is used (one L2 round trip, however many
 * splits), then the merge runs in registers in split order with the reference's arithmetic
 * (COMBINE_GEMV's: no fused multiply-adds, a zero weight skips its split). The threads of one
 * head load the same m and l: one transaction a warp. The loop over the splits is unrolled to
 * a bound (4, 16 or 32) chosen by the active count, so the loads stay in registers.
 *
 * The position says which splits are active (op_attention_split::active_splits): read before
 * the wait when nothing in the launch writes it (AMK_BUF_LAUNCH_CONST), else after it. */

struct am_args {
  const amk_buffer_t *parts, *pos, *y;
  int hd, nh, nkv, rep, n_splits, chunk, n_tile, n_off;
};

template <bool CHECK>
__device__ __forceinline__ bool am_setup(const amk_task_ctx& ctx, am_args& a) {
  const amk_params_t& p = ctx.inst->params;
  AMK_CHECK(ctx.inst->n_inputs == 2 && ctx.inst->n_outputs >= 1, AMK_ERR_SHAPE, ctx.inst->n_inputs);
  a.parts = amk_in(ctx, 0);
  a.pos = amk_in(ctx, 1);
  a.y = amk_out(ctx, 0);
  a.hd = p.head_dim;
  a.nh = p.n_heads;
  a.nkv = p.n_kv_heads;
  a.n_tile = p.N_tile;
  a.n_off = p.n_off;
  a.n_splits = p.ext[0];
  a.chunk = p.ext[1];
  AMK_CHECK(a.hd > 0 && a.nh > 0, AMK_ERR_PARAM, a.hd);
  AMK_CHECK(a.nkv > 0 && a.nh % a.nkv == 0, AMK_ERR_PARAM, a.nkv);
  AMK_CHECK(a.n_splits > 0 && a.n_splits <= 32, AMK_ERR_PARAM, a.n_splits);
  AMK_CHECK(a.chunk > 0, AMK_ERR_PARAM, a.chunk);
  a.rep = a.nh / a.nkv;
  if (CHECK) {
    const long long K = (long long)a.nh * a.hd;
    AMK_CHECK(a.parts->dtype == AMK_F32, AMK_ERR_DTYPE, a.parts->dtype);
    AMK_CHECK(a.parts->numel == (long long)a.nkv * a.n_splits * a.rep * (a.hd + 2), AMK_ERR_SHAPE,
              a.parts->numel);
    AMK_CHECK(!amk_is_int(a.y->dtype) && a.y->numel == K, AMK_ERR_SHAPE, a.y->numel);
    AMK_CHECK(a.n_tile > 0 && a.n_off >= 0 && a.n_tile % a.hd == 0 && a.n_off % a.hd == 0 &&
                  (long long)a.n_off + a.n_tile <= K,
              AMK_ERR_PARAM, a.n_tile);
    AMK_CHECK(amk_att_pos_ok(a.pos), AMK_ERR_DTYPE, a.pos->dtype);
  }
  return true;
}

__device__ __noinline__ bool am_check(const amk_task_ctx& ctx) {
  am_args a;
  return am_setup<true>(ctx, a);
}

/* Splits with rows at the position (block-uniform); -1, having failed the task, for a negative
 * position. 32-bit arithmetic, as COMBINE_GEMV's cg_active. */
__device__ __forceinline__ int am_active(const amk_task_ctx& ctx, const am_args& a) {
  const long long p = amk_ldif(a.pos, 0);
  if (p < 0) {
    amk_fail(ctx, AMK_ERR_INDEX, p);
    return -1;
  }
  const int q = (int)min(p, (long long)(1 << 30));
  const int per = (q + a.n_splits) / a.n_splits;
  const int size = (per + a.chunk - 1) / a.chunk * a.chunk;
  return (q + size) / size; /* ceil((p + 1) / size) <= n_splits */
}

/* Element e of the tile merged and stored: head h = (n_off + e) / head_dim, dim d. MAX bounds
 * the active splits (active <= MAX). */
template <int MAX>
__device__ __forceinline__ void am_element(const am_args& a, const float* parts, int active, int e) {
  const int k = a.n_off + e, h = k / a.hd, d = k - h * a.hd;
  const int g = h / a.rep, r = h - g * a.rep;
  const long long stride = (long long)a.hd + 2, sstride = (long long)a.rep * stride;
  const float* base = parts + ((long long)g * a.n_splits * a.rep + r) * stride;
  float x[MAX], m[MAX], l[MAX];
#pragma unroll
  for (int s = 0; s < MAX; ++s) {
    if (s < active) {
      const float* b = base + s * sstride;
      x[s] = __ldcg(b + d);
      m[s] = __ldcg(b + a.hd);
      l[s] = __ldcg(b + a.hd + 1);
    }
  }
  float M = -__int_as_float(0x7f800000);
#pragma unroll
  for (int s = 0; s < MAX; ++s)
    if (s < active) M = fmaxf(M, m[s]);
  float den = 0.0f, acc = 0.0f;
#pragma unroll
  for (int s = 0; s < MAX; ++s) {
    if (s < active) {
      const float w = l[s] > 0.0f ? expf(__fsub_rn(m[s], M)) : 0.0f;
      den = __fadd_rn(den, __fmul_rn(l[s], w));
      const float t = __fadd_rn(acc, __fmul_rn(x[s], w));
      acc = w != 0.0f ? t : acc;
    }
  }
  amk_stf(a.y, k, __fdiv_rn(acc, fmaxf(den, 1e-20f)));
}

template <int MAX>
__device__ __noinline__ void am_merge(const am_args& a, int active) {
  const float* parts = (const float*)a.parts->ptr;
#pragma unroll 1
  for (int e = threadIdx.x; e < a.n_tile; e += AMK_THREADS) am_element<MAX>(a, parts, active, e);
}

__device__ __forceinline__ void amk_op_attention_merge(const amk_task_ctx& ctx) {
  if (ctx.verify && !am_check(ctx)) return;
  am_args a;
  am_setup<false>(ctx, a);
  const bool late = ctx.check_only || !(a.pos->flags & AMK_BUF_LAUNCH_CONST);
  int active = late ? 0 : am_active(ctx, a);
  if (active < 0 || !amk_task_wait(ctx)) return;
  if (late) active = am_active(ctx, a);
  if (active < 0) return;
  if (active <= 4) am_merge<4>(a, active);
  else if (active <= 16) am_merge<16>(a, active);
  else am_merge<32>(a, active);
}
