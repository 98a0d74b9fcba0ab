/* ATTENTION_COMBINE (code 18): merges P split-KV partials [acc | m | l] into the normalised
 * attention output.
 *
 * Mirrors ops/attention-combine/src/reference.rs exactly, in the CPU's order (p = 0..P-1):
 *   m   = max_p m_p                                  (fmaxf from -inf, NaN ignored like f32::max)
 *   w_p = l_p > 0 ? expf(m_p - m) : 0
 *   l   = sum_p l_p * w_p                            (fp32, sequential)
 *   out = (sum_p (w_p == 0 ? 0 : acc_p[d] * w_p)) / max(l, 1e-20)
 * Products and sums use __fmul_rn / __fadd_rn so no FMA contraction changes a rounding; only
 * expf (CUDA's, <= 2 ulp) can differ from the CPU.
 *
 * Parallelisation: one thread per output element (head, d), consecutive threads on consecutive
 * d (coalesced acc reads and output writes); every thread recomputes its head's m, w_p and l
 * from the (cached) m_p / l_p words, P <= 8, so no shared memory or barriers are needed.
 */

#define COMBINE_MAX_P 8

__device__ void amk_op_attention_combine(const amk_task_ctx& ctx) {
  const amk_params_t& p = ctx.inst->params;
  const amk_buffer_t* out = amk_out(ctx, 0);
  const int np = ctx.inst->n_inputs;
  const int hd = p.head_dim;
  if (hd <= 0) { amk_fail(ctx, AMK_ERR_PARAM, hd); return; }
  if (np < 1 || np > COMBINE_MAX_P) { amk_fail(ctx, AMK_ERR_SHAPE, np); return; }
  if (!amk_is_float(out->dtype)) { amk_fail(ctx, AMK_ERR_DTYPE, out->dtype); return; }
  if (out->numel % hd != 0) { amk_fail(ctx, AMK_ERR_SHAPE, out->numel); return; }
  const long long heads = out->numel / hd;
  if (amk_has(p, AMK_P_N_HEADS) && ((long long)p.n_heads != heads || p.n_heads == 0)) {
    amk_fail(ctx, AMK_ERR_PARAM, p.n_heads);
    return;
  }
  const long long stride = (long long)hd + 2;
  for (int i = 0; i < np; ++i) {
    const amk_buffer_t* part = amk_in(ctx, i);
    if (part->numel != heads * stride) { amk_fail(ctx, AMK_ERR_SHAPE, part->numel); return; }
  }

  const float NEG_INF = -__int_as_float(0x7f800000);
  const long long total = heads * hd;
  for (long long idx = threadIdx.x; idx < total; idx += AMK_THREADS) {
    const long long h = idx / hd;
    const long long d = idx - h * hd;
    const long long base = h * stride;
    float mp[COMBINE_MAX_P], lp[COMBINE_MAX_P], w[COMBINE_MAX_P];
    float m = NEG_INF;
#pragma unroll
    for (int i = 0; i < COMBINE_MAX_P; ++i) {
      if (i < np) {
        const amk_buffer_t* part = amk_in(ctx, i);
        mp[i] = amk_ldf32(part, base + hd);
        lp[i] = amk_ldf32(part, base + hd + 1);
        m = fmaxf(m, mp[i]);
      }
    }
    float l = 0.0f;
#pragma unroll
    for (int i = 0; i < COMBINE_MAX_P; ++i) {
      if (i < np) {
        w[i] = lp[i] > 0.0f ? expf(__fsub_rn(mp[i], m)) : 0.0f;
        l = __fadd_rn(l, __fmul_rn(lp[i], w[i]));
      }
    }
    const float denom = fmaxf(l, 1e-20f);
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < COMBINE_MAX_P; ++i) {
      if (i < np) {
        const float term = (w[i] == 0.0f) ? 0.0f : __fmul_rn(amk_ldf32(amk_in(ctx, i), base + d), w[i]);
        acc = __fadd_rn(acc, term);
      }
    }
    amk_stf32(out, idx, __fdiv_rn(acc, denom));
  }
}
