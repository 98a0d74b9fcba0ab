/* ROPE (code 8): rotary position embedding at the positions held in an integer buffer.
 *
 * Mirrors ops/rope/src/reference.rs step by step:
 *   e          = (float)i / (float)half                      (fp32 division)
 *   inv_freq   = 1.0f / (float)pow((double)theta, (double)e)  (power in f64, rounded to fp32)
 *   ang        = (float)pos * inv_freq                         (one fp32 multiply)
 *   cos, sin   = (float)cos((double)ang), (float)sin((double)ang)
 *   out[a]     = x1*cos - x2*sin, out[b] = x2*cos + x1*sin     (separate fp32 roundings)
 * Every product uses __fmul_rn and every sum __fadd_rn / __fsub_rn so the compiler cannot
 * contract them into FMAs (the CPU rounds each step).
 *
 * pairing (ext[0], absent = 0): 0 rotates dims (i, i + half), 1 rotates (2i, 2i + 1).
 * Positions: rank <= 2 x uses positions[0] for every head; rank >= 3 has one position per row
 * of the leading dims. Every position is checked (0 <= p < 2^31) before anything is written.
 *
 * Parallelisation: one block per task. When half <= ROPE_SMEM_HALF the block caches inv_freq
 * once, then per row computes cos/sin of the half angles into shared memory and rotates all
 * (head, i) pairs of the row with consecutive threads on consecutive i (coalesced for
 * rotate-half). Wider heads compute everything per pair (same arithmetic, no sharing).
 * x and out may alias: each pair is read and written by the same thread.
 */

#define ROPE_SMEM_HALF 256

__device__ __forceinline__ float rope_inv_freq(float theta, int i, int half) {
  const float e = __fdiv_rn((float)i, (float)half);
  const float pw = (float)pow((double)theta, (double)e);
  return __fdiv_rn(1.0f, pw);
}

__device__ __noinline__ void rope_rotate(const amk_buffer_t* x, const amk_buffer_t* out,
                                            long long a, long long b, float c, float s) {
  const float x1 = amk_ldf32(x, a);
  const float x2 = amk_ldf32(x, b);
  const float ya = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
  const float yb = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
  amk_stf32(out, a, ya);
  amk_stf32(out, b, yb);
}

__device__ void amk_op_rope(const amk_task_ctx& ctx) {
  const amk_params_t& p = ctx.inst->params;
  const amk_buffer_t* x = amk_in(ctx, 0);
  const amk_buffer_t* pb = amk_in(ctx, 1);
  const amk_buffer_t* out = amk_out(ctx, 0);

  const int hd = p.head_dim;
  if (hd <= 0 || (hd & 1)) {
    amk_fail(ctx, AMK_ERR_PARAM, hd);
    return;
  }
  const float theta = p.theta;
  if (!(isfinite(theta) && theta > 0.0f)) {
    amk_fail(ctx, AMK_ERR_PARAM, (long long)__float_as_int(theta));
    return;
  }
  const int pairing = amk_has(p, AMK_P_EXT0) ? p.ext[0] : 0;
  if (pairing != 0 && pairing != 1) {
    amk_fail(ctx, AMK_ERR_PARAM, pairing);
    return;
  }
  if (amk_is_float(pb->dtype)) {
    amk_fail(ctx, AMK_ERR_DTYPE, pb->dtype);
    return;
  }
  if (!amk_is_float(x->dtype)) {
    amk_fail(ctx, AMK_ERR_DTYPE, x->dtype);
    return;
  }
  const long long n = x->numel;
  if (n % hd != 0 || out->numel != n) {
    amk_fail(ctx, AMK_ERR_SHAPE, n);
    return;
  }
  long long rows = 1;
  if (x->rank >= 3)
    for (int d = 0; d < x->rank - 2; ++d) rows *= x->shape[d];
  const long long row_len = rows > 0 ? n / rows : 0;
  if (x->rank >= 3) {
    if (pb->numel != rows || row_len % hd != 0) {
      amk_fail(ctx, AMK_ERR_SHAPE, pb->numel);
      return;
    }
  } else if (n > 0 && pb->numel == 0) {
    amk_fail(ctx, AMK_ERR_SHAPE, 0);
    return;
  }
  if (n == 0) return;

  /* Every position in range before anything is written (the CPU checks them all first). */
  __shared__ long long s_badpos;
  __shared__ int s_bad;
  __syncthreads();
  if (threadIdx.x == 0) s_bad = 0;
  __syncthreads();
  for (long long r = threadIdx.x; r < rows; r += AMK_THREADS) {
    const long long v = amk_ldi(pb, r);
    if (v < 0 || v >= 2147483648LL) {
      if (atomicCAS(&s_bad, 0, 1) == 0) s_badpos = v;
    }
  }
  __syncthreads();
  if (s_bad) {
    amk_fail(ctx, AMK_ERR_INDEX, s_badpos);
    return;
  }

  const int half = hd / 2;
  const long long pairs_per_row = row_len / 2;

  if (half <= ROPE_SMEM_HALF) {
    __shared__ float s_inv[ROPE_SMEM_HALF];
    __shared__ float s_cos[ROPE_SMEM_HALF];
    __shared__ float s_sin[ROPE_SMEM_HALF];
    for (int i = threadIdx.x; i < half; i += AMK_THREADS) s_inv[i] = rope_inv_freq(theta, i, half);
    for (long long r = 0; r < rows; ++r) {
      const float pf = (float)amk_ldi(pb, r);
      __syncthreads(); /* s_inv ready; the previous row's s_cos/s_sin no longer read */
      for (int i = threadIdx.x; i < half; i += AMK_THREADS) {
        const float ang = __fmul_rn(pf, s_inv[i]);
        s_cos[i] = (float)cos((double)ang);
        s_sin[i] = (float)sin((double)ang);
      }
      __syncthreads();
      const long long row0 = r * row_len;
      for (long long k = threadIdx.x; k < pairs_per_row; k += AMK_THREADS) {
        const long long head = k / half;
        const int i = (int)(k - head * half);
        const long long base = row0 + head * hd;
        long long a, b;
        if (pairing == 1) {
          a = base + 2 * i;
          b = a + 1;
        } else {
          a = base + i;
          b = a + half;
        }
        rope_rotate(x, out, a, b, s_cos[i], s_sin[i]);
      }
    }
  } else {
    const long long total = rows * pairs_per_row;
    for (long long k = threadIdx.x; k < total; k += AMK_THREADS) {
      const long long r = k / pairs_per_row;
      const long long kk = k - r * pairs_per_row;
      const long long head = kk / half;
      const int i = (int)(kk - head * half);
      const float pf = (float)amk_ldi(pb, r);
      const float ang = __fmul_rn(pf, rope_inv_freq(theta, i, half));
      const float c = (float)cos((double)ang);
      const float s = (float)sin((double)ang);
      const long long base = r * row_len + head * hd;
      long long a, b;
      if (pairing == 1) {
        a = base + 2 * i;
        b = a + 1;
      } else {
        a = base + i;
        b = a + half;
      }
      rope_rotate(x, out, a, b, c, s);
    }
  }
}
