/* ROPE (code 8): rotary position embedding at the positions held in an integer buffer.
 *
 * Mirrors ops/rope/src/reference.rs step by step:
 *   e          = (float)i / (float)half                      (fp32 division)
 *   inv_freq   = 1.0f / (float)pow((double)theta, (double)e)  (power in f64, rounded to fp32)
 *   ang        = (float)pos * inv_freq                         (one fp32 multiply)
 *   cos, sin   = (float)cos((double)ang), (float)sin((double)ang)
 *   out[a]     = x1*cos - x2*sin, out[b] = x2*cos + x1*sin     (separate fp32 roundings)
 * Every product uses __fmul_rn and every sum __fadd_rn / __fsub_rn so the compiler cannot
 * contract them into FMAs (the CPU rounds each step). Each (row, i) angle's cos and sin are
 * evaluated exactly this way once per task and shared by every head and both dims of a pair.
 *
 * pairing (ext[0], absent = 0): 0 rotates dims (i, i + half), 1 rotates (2i, 2i + 1).
 * Frequency factors (optional input 2, head_dim / 2 floats): inv_freq[i] is divided by
 * factor i (amk_rope_inv_freq_scaled) wherever it is taken.
 * Positions: rank <= 2 x uses positions[0] for every head; rank >= 3 has one position per row
 * of the leading dims. Every position is checked (0 <= p < 2^31) before anything is written.
 *
 * Parallelisation (one block per task; the decode case is one row: q [n_heads, hd] or k
 * [1, n_kv, hd]):
 * - Units: with hd % 16 == 0, F32/BF16/F16 operands and 16-byte aligned bases, a unit is 8
 *   pairs read and written with 16-byte accesses (rotate-half: dims i..i+7 and i+half..
 *   i+half+7 of one head; adjacent: 16 consecutive dims); otherwise a unit is one pair, through
 *   amk_ldf / amk_stf. Each thread issues the loads of all its units of a batch (ROPE_NB /
 *   ROPE_NS units) before using any.
 * - Tables: cos/sin of a chunk of rows (rows_in_chunk * half <= ROPE_TAB entries) go to shared
 *   memory, one entry per thread (cos and sin by different threads), computed while the
 *   thread's loads are in flight. With one row and half <= AMK_THREADS / 2 ("direct") the power
 *   is taken by the thread owning the entry and the position check comes after the loads were
 *   issued; otherwise inv_freq is cached once in shared memory and each chunk of rows reads
 *   its positions.
 * - half > ROPE_TAB or a huge x: every pair computes everything itself (same arithmetic).
 * x and out may alias: each element is read and written by the same thread.
 */

#define ROPE_TAB 256 /* table entries (cos and sin each): rows_in_chunk * half; also max half */
#define ROPE_NB 2    /* 8-pair units in flight per thread */
#define ROPE_NS 4    /* single pairs in flight per thread */

/* Out-of-line copy for the paths where nothing is in flight (one copy of the f64 power). */
__device__ __noinline__ float rope_inv_freq_call(float theta, int i, int half,
                                                 const amk_buffer_t* fac) {
  return amk_rope_inv_freq_scaled(theta, i, half, fac);
}

/* Raw words of the 8 elements at element offset e (a multiple of 8): one 16-byte load for a
 * 16-bit dtype, two for F32. Nothing is consumed here, so a thread's loads stay in flight. */
__device__ __forceinline__ void rope_load8(const void* p, bool f32, unsigned e, uint4& lo,
                                           uint4& hi) {
  if (f32) {
    const uint4* q = (const uint4*)((const unsigned char*)p + 4ull * e);
    lo = q[0];
    hi = q[1];
  } else {
    lo = *(const uint4*)((const unsigned char*)p + 2ull * e);
    hi = make_uint4(0u, 0u, 0u, 0u);
  }
}

/* Rotates the rows [0, rows) of x in chunks of table rows. VEC: 8-pair units (16-byte
 * accesses), else single pairs. direct: one row, half <= AMK_THREADS / 2, the position (p0, or
 * the raw I32 word p0_i32 when p_i32) not yet checked; otherwise every position was checked and
 * s_inv holds inv_freq. Returns false when it failed the task (block-uniformly). */
template <bool VEC>
__device__ __forceinline__ bool rope_run(const amk_task_ctx& ctx, const amk_buffer_t* x,
                                         const amk_buffer_t* pb, const amk_buffer_t* out,
                                         long long rows, unsigned row_len, int hd, int pairing,
                                         float theta, bool direct, long long p0, bool p_i32,
                                         int32_t p0_i32, float* s_cos, float* s_sin,
                                         const float* s_inv, const amk_buffer_t* fac) {
  const int half = hd >> 1;
  const unsigned uhalf = (unsigned)half, uhd = (unsigned)hd;
  constexpr int NB = VEC ? ROPE_NB : ROPE_NS;
  const unsigned per_row = VEC ? (row_len >> 4) : (row_len >> 1); /* units per row */
  const long long R = direct ? 1 : (ROPE_TAB / half < rows ? ROPE_TAB / half : rows);
  const int xdt = x->dtype, odt = out->dtype;
  const bool xf32 = xdt == AMK_F32;
  const unsigned tid = threadIdx.x;

  for (long long r0 = 0; r0 < rows; r0 += R) {
    const int rc = (int)(rows - r0 < R ? rows - r0 : R);
    const unsigned units = (unsigned)rc * per_row; /* >= 1: row_len >= hd >= 2 (>= 16 if VEC) */
    const unsigned rbase = (unsigned)r0 * row_len;
    for (unsigned ub = 0; ub < units; ub += NB * AMK_THREADS) {
      /* 1. Issue every load of this batch. */
      unsigned ea[NB], eb[NB], ti[NB];
      uint4 ra[NB], rah[NB], rb[NB], rbh[NB];
      float x1[NB], x2[NB];
#pragma unroll
      for (int k = 0; k < NB; ++k) {
        const unsigned u = ub + tid + (unsigned)k * AMK_THREADS;
        ea[k] = eb[k] = ti[k] = 0u; /* defined on every path: no undef kept live */
        ra[k] = rah[k] = rb[k] = rbh[k] = make_uint4(0u, 0u, 0u, 0u);
        x1[k] = x2[k] = 0.0f;
        if (u < units) {
          const unsigned rr = u / per_row, rem = u - rr * per_row;
          const unsigned base = rbase + rr * row_len;
          ti[k] = rr * uhalf;
          if (VEC) {
            if (pairing == 0) {
              const unsigned G = uhalf >> 3, h = rem / G, g = rem - h * G;
              ea[k] = base + h * uhd + 8u * g;
              eb[k] = ea[k] + uhalf;
              ti[k] += 8u * g;
            } else {
              const unsigned off = 16u * rem, h = off / uhd;
              ea[k] = base + off;
              eb[k] = ea[k] + 8u;
              ti[k] += (off - h * uhd) >> 1;
            }
            rope_load8(x->ptr, xf32, ea[k], ra[k], rah[k]);
            rope_load8(x->ptr, xf32, eb[k], rb[k], rbh[k]);
          } else {
            const unsigned h = rem / uhalf, i = rem - h * uhalf;
            const unsigned hb = base + h * uhd;
            if (pairing == 1) {
              ea[k] = hb + 2u * i;
              eb[k] = ea[k] + 1u;
            } else {
              ea[k] = hb + i;
              eb[k] = ea[k] + uhalf;
            }
            ti[k] += i;
            x1[k] = amk_ldf(x, ea[k]);
            x2[k] = amk_ldf(x, eb[k]);
          }
        }
      }
      /* 2. First batch of a chunk: the chunk's cos/sin table, while the loads are in flight. */
      if (ub == 0) {
        const int E = rc * half; /* entries; threads [0, E) take cos, [E, 2E) sin */
        float inv0 = 0.0f;
        if (direct) {
          if ((int)tid < 2 * E) {
            inv0 = amk_rope_inv_freq_scaled(theta, (int)tid < E ? (int)tid : (int)tid - E, half, fac);
          } else if (tid == AMK_THREADS - 1 || tid == AMK_THREADS - 33) {
            /* Two idle threads of two warps evaluate sin(1) and cos(1) now: f64 sin/cos read
             * their polynomial coefficients from a global table (one sector per quadrant
             * parity; sin and cos of one angle use both), which would otherwise be a cold miss
             * on the critical path after the power and the position. The opaque 1.0 keeps the
             * calls from being folded, and the never-taken store (sin 1, cos 1 != 0) keeps
             * them from being dropped; it would write an entry the table fill rewrites. */
            double one;
            asm volatile("mov.f64 %0, 0d3FF0000000000000;" : "=d"(one));
            const double warm = tid == AMK_THREADS - 1 ? sin(one) : cos(one);
            if (warm == 0.0) s_cos[0] = 0.0f;
          }
          if (p_i32) {
            /* First use of the raw word (volatile asm: not hoisted up to its load). */
            int32_t v;
            asm volatile("mov.b32 %0, %1;" : "=r"(v) : "r"(p0_i32));
            p0 = v;
          }
          if (p0 < 0 || p0 >= 2147483648LL) {
            amk_fail(ctx, AMK_ERR_INDEX, p0);
            return false;
          }
        }
        __syncthreads(); /* s_inv ready; no thread still reads the previous table */
        if (direct) {
          if ((int)tid < 2 * E) {
            const int w = (int)tid >= E ? 1 : 0;
            const int e = (int)tid - w * E;
            const float ang = __fmul_rn((float)p0, inv0);
            if (w) s_sin[e] = (float)sin((double)ang);
            else s_cos[e] = (float)cos((double)ang);
          }
        } else {
          for (int j = (int)tid; j < 2 * E; j += AMK_THREADS) {
            const int w = j >= E ? 1 : 0;
            const int e = j - w * E;
            const int rr = e / half, i = e - rr * half;
            const float pf = (float)amk_ldif(pb, r0 + rr);
            const float t = amk_rope_trig(__fmul_rn(pf, s_inv[i]), w);
            if (w) s_sin[e] = t;
            else s_cos[e] = t;
          }
        }
        __syncthreads();
      }
      /* 3. Rotate and store. */
#pragma unroll
      for (int k = 0; k < NB; ++k) {
        const unsigned u = ub + tid + (unsigned)k * AMK_THREADS;
        if (u >= units) continue;
        if (VEC) {
          float fa[8], fb[8], c[8], s[8], ya[8], yb[8];
          amk_cvt8(xdt, ra[k], rah[k], fa);
          amk_cvt8(xdt, rb[k], rbh[k], fb);
          const float4* cp = (const float4*)(s_cos + ti[k]);
          const float4* sp = (const float4*)(s_sin + ti[k]);
          const float4 c0 = cp[0], c1 = cp[1], s0 = sp[0], s1 = sp[1];
          c[0] = c0.x; c[1] = c0.y; c[2] = c0.z; c[3] = c0.w;
          c[4] = c1.x; c[5] = c1.y; c[6] = c1.z; c[7] = c1.w;
          s[0] = s0.x; s[1] = s0.y; s[2] = s0.z; s[3] = s0.w;
          s[4] = s1.x; s[5] = s1.y; s[6] = s1.z; s[7] = s1.w;
          if (pairing == 0) {
#pragma unroll
            for (int q = 0; q < 8; ++q) amk_rope_pair(fa[q], fb[q], c[q], s[q], ya[q], yb[q]);
          } else {
#pragma unroll
            for (int q = 0; q < 4; ++q) {
              amk_rope_pair(fa[2 * q], fa[2 * q + 1], c[q], s[q], ya[2 * q], ya[2 * q + 1]);
              amk_rope_pair(fb[2 * q], fb[2 * q + 1], c[4 + q], s[4 + q], yb[2 * q], yb[2 * q + 1]);
            }
          }
          amk_st8(out->ptr, odt, (long long)(ea[k] >> 3), ya);
          amk_st8(out->ptr, odt, (long long)(eb[k] >> 3), yb);
        } else {
          float ya, yb;
          amk_rope_pair(x1[k], x2[k], s_cos[ti[k]], s_sin[ti[k]], ya, yb);
          amk_stf(out, ea[k], ya);
          amk_stf(out, eb[k], yb);
        }
      }
    }
  }
  return true;
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
  const amk_buffer_t* fac = ctx.inst->n_inputs > 2 ? amk_in(ctx, 2) : nullptr;
  if (fac && (!amk_is_float(fac->dtype) || fac->numel != hd / 2)) {
    amk_fail(ctx, AMK_ERR_SHAPE, fac->numel);
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

  const int half = hd / 2;
  const bool fast = half <= ROPE_TAB && n < (1LL << 30);
  const bool direct = fast && rows == 1 && half <= AMK_THREADS / 2;

  __shared__ __align__(16) float s_cos[ROPE_TAB];
  __shared__ __align__(16) float s_sin[ROPE_TAB];
  __shared__ float s_inv[ROPE_TAB];

  /* Every position in range before anything is written (the CPU checks them all first). One
   * row: every thread reads positions[0] itself (the same value, so a failure is
   * block-uniform); the direct path checks it only once its loads are in flight. */
  long long p0 = 0;
  int32_t p0_i32 = 0; /* direct path, I32 positions: the raw word, first used after the loads */
  const bool p_i32 = direct && pb->dtype == AMK_I32;
  if (p_i32) {
    p0_i32 = *(const int32_t*)pb->ptr;
  } else if (rows == 1) {
    p0 = amk_ldif(pb, 0);
    if (!direct) {
      if (p0 < 0 || p0 >= 2147483648LL) {
        amk_fail(ctx, AMK_ERR_INDEX, p0);
        return;
      }
      __syncthreads(); /* s_inv below: no thread still in a previous use of it */
    }
  } else {
    __shared__ long long s_badpos;
    __shared__ int s_bad;
    __syncthreads();
    if (threadIdx.x == 0) s_bad = 0;
    __syncthreads();
    for (long long r = threadIdx.x; r < rows; r += AMK_THREADS) {
      const long long v = amk_ldif(pb, r);
      if (v < 0 || v >= 2147483648LL) {
        if (atomicCAS(&s_bad, 0, 1) == 0) s_badpos = v;
      }
    }
    __syncthreads();
    if (s_bad) {
      amk_fail(ctx, AMK_ERR_INDEX, s_badpos);
      return;
    }
  }

  if (fast) {
    if (!direct)
      for (int i = threadIdx.x; i < half; i += AMK_THREADS)
        s_inv[i] = rope_inv_freq_call(theta, i, half, fac);
    /* (rope_run's first barrier publishes s_inv.) */
    const bool vec = (hd & 15) == 0 && amk_is_vec(x->dtype) && amk_is_vec(out->dtype) &&
                     ((((unsigned long long)x->ptr) | ((unsigned long long)out->ptr)) & 15) == 0;
    if (vec)
      rope_run<true>(ctx, x, pb, out, rows, (unsigned)row_len, hd, pairing, theta, direct, p0,
                     p_i32, p0_i32, s_cos, s_sin, s_inv, fac);
    else
      rope_run<false>(ctx, x, pb, out, rows, (unsigned)row_len, hd, pairing, theta, direct, p0,
                      p_i32, p0_i32, s_cos, s_sin, s_inv, fac);
    return;
  }

  /* Wide heads or a huge x: every pair computes its own angle (same arithmetic). */
  const long long pairs_per_row = row_len / 2;
  const long long total = rows * pairs_per_row;
  for (long long k = threadIdx.x; k < total; k += AMK_THREADS) {
    const long long r = k / pairs_per_row;
    const long long kk = k - r * pairs_per_row;
    const long long head = kk / half;
    const int i = (int)(kk - head * half);
    const float pf = (float)amk_ldif(pb, r);
    const float ang = __fmul_rn(pf, rope_inv_freq_call(theta, i, half, fac));
    const float c = amk_rope_trig(ang, 0);
    const float s = amk_rope_trig(ang, 1);
    const long long base = r * row_len + head * hd;
    long long a, b;
    if (pairing == 1) {
      a = base + 2 * i;
      b = a + 1;
    } else {
      a = base + i;
      b = a + half;
    }
    float ya, yb;
    amk_rope_pair(amk_ldf(x, a), amk_ldf(x, b), c, s, ya, yb);
    amk_stf(out, a, ya);
    amk_stf(out, b, yb);
  }
}
