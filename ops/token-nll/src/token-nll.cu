/* TOKEN_NLL (opcode 29): for every row r of the logits (all leading dims; rank 0 is one row of
 * one), out[r] = ln sum_j exp(x_j) - x_t with t = targets[r], as F32. With the row tile params
 * (M_tile > 0; m_off, n_off = 0, N_tile = 1) only rows [m_off, m_off + M_tile). Mirrors
 * ops/token-nll/src/reference.rs: the sum is shifted by the row's largest value and carried in
 * f64; each term is expf of the f32 difference (within an f32 rounding of the reference's f64
 * exp, below the F32 output's own rounding). A target outside [0, vocab) fails the task with
 * AMK_ERR_INDEX (detail: the target) before any row is written.
 *
 * One block a row at a time, two passes over it: the largest value (amk_block_max), then the
 * sum of the shifted exponentials (amk_block_sum_d); the second pass reads the row from L2. F32,
 * BF16 and F16 rows whose length is a whole number of 8-element units (and start 16-byte
 * aligned) go 8 elements a 16-byte load, TN_U loads a thread in flight; others element by
 * element. */

#define TN_U 4 /* 8-element units a thread has in flight */

/* Applies f to every value of row [base, base + V) this thread owns: vector units when `vec`. */
template <typename F>
__device__ __forceinline__ void tn_each(const amk_buffer_t* x, long long base, long long V, bool vec,
                                        F f) {
  if (vec) {
    const long long u0 = base / 8, nu = V / 8;
    for (long long b = 0; b < nu; b += TN_U * AMK_THREADS) {
      float v[TN_U][8];
#pragma unroll
      for (int k = 0; k < TN_U; ++k) {
        const long long u = b + threadIdx.x + (long long)k * AMK_THREADS;
        if (u < nu) amk_ld8(x->ptr, x->dtype, u0 + u, v[k]);
      }
#pragma unroll
      for (int k = 0; k < TN_U; ++k) {
        const long long u = b + threadIdx.x + (long long)k * AMK_THREADS;
        if (u < nu) {
#pragma unroll
          for (int e = 0; e < 8; ++e) f(v[k][e]);
        }
      }
    }
  } else {
    for (long long j = threadIdx.x; j < V; j += AMK_THREADS) f(amk_ldf(x, base + j));
  }
}

__device__ void amk_op_token_nll(const amk_task_ctx& ctx) {
  if (ctx.inst->n_inputs != 2 || ctx.inst->n_outputs < 1) {
    amk_fail(ctx, AMK_ERR_SHAPE, ctx.inst->n_inputs);
    return;
  }
  const amk_buffer_t* x = amk_in(ctx, 0);
  const amk_buffer_t* t = amk_in(ctx, 1);
  const amk_buffer_t* o = amk_out(ctx, 0);
  if (!amk_is_float(x->dtype)) { amk_fail(ctx, AMK_ERR_DTYPE, x->dtype); return; }
  if (!amk_is_int(t->dtype)) { amk_fail(ctx, AMK_ERR_DTYPE, t->dtype); return; }
  if (o->dtype != AMK_F32) { amk_fail(ctx, AMK_ERR_DTYPE, o->dtype); return; }
  const long long V = amk_last_dim(x);
  if (V <= 0) { amk_fail(ctx, AMK_ERR_SHAPE, V); return; }
  const long long rows = x->numel / V;
  if (t->numel != rows) { amk_fail(ctx, AMK_ERR_SHAPE, t->numel); return; }
  if (o->numel != rows) { amk_fail(ctx, AMK_ERR_SHAPE, o->numel); return; }
  const amk_params_t& p = ctx.inst->params;
  const bool tiled = p.M_tile > 0;
  const long long r0 = tiled ? p.m_off : 0, r1 = tiled ? p.m_off + p.M_tile : rows;
  if (r0 < 0 || r1 > rows) { amk_fail(ctx, AMK_ERR_SHAPE, r1); return; }
  /* Every target checked before any row is written (the reference's order). */
  for (long long r = r0; r < r1; ++r) {
    const long long id = amk_ldi(t, r);
    if (id < 0 || id >= V) { amk_fail(ctx, AMK_ERR_INDEX, id); return; }
  }
  const bool vec = amk_is_vec(x->dtype) && V % 8 == 0 && amk_al16(x->ptr);
  float* out = (float*)o->ptr;
  for (long long r = r0; r < r1; ++r) {
    const long long base = r * V;
    float m = -__int_as_float(0x7f800000);
    tn_each(x, base, V, vec, [&](float v) { m = fmaxf(m, v); });
    m = amk_block_max(m);
    double s = 0.0;
    tn_each(x, base, V, vec, [&](float v) { s += (double)expf(v - m); });
    s = amk_block_sum_d(s);
    if (threadIdx.x == 0) {
      const double xt = (double)amk_ldf(x, base + amk_ldi(t, r));
      out[r] = (float)((double)m + log(s) - xt);
    }
  }
}
