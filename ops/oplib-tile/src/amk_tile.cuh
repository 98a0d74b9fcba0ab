/* amk_tile.cuh — the weight-streaming linear tile shared by GEMV_TILE (opcode 5) and GEMM_TILE
 * (opcode 6): columns [n_off, n_off + N_tile) of out[m, n] = sum_k x[m, k] * W[n, k] (+ bias[n])
 * for a range of rows of x (viewed as [M, K]); W is [N, K] (torch Linear layout). Float weights
 * (+ optional float bias of N), or weight-only quantised ones (qdtype 6 = int8: I8 without zeros,
 * U8 with; qdtype 7 = row-packed int4, low nibble first) with float group scales (and zeros) of
 * N * ceil(K / group) elements: w = (q - z) * s, z = zeros[..] or 8 (int4) / 0 (int8).
 *
 * Entry: amk_tile_run<MAXR, UNROLL>(ctx, gemm). MAXR = rows of x sharing one pass over a weight
 * row (GEMV_TILE 1, GEMM_TILE 4), UNROLL = 16-byte weight vectors in flight per lane (GEMV_TILE 8,
 * GEMM_TILE 2: code size). Each op instantiates its own copy (its own registers and code).
 *
 * Parallelisation: one warp per output column n (weight row), warps stride over the tile.
 * Each warp streams its weight row once per chunk of up to MAXR rows of x. Fast path: the
 * weight row read as 16-byte vectors (L1::no_allocate, UNROLL vectors in flight per lane), x
 * read with plain vector loads (it stays in L1 for all the warps), fp32 accumulation in 4
 * partial sums per row, warp shuffle reduce, cast on store. Everything else (K not a multiple
 * of the vector width, a group that splits a vector, fp8 operands, misaligned storage) takes
 * the scalar path: lanes stride over k, same numerics.
 *
 * Weights are loaded through the ordinary coherent path (not ld.global.nc): a program may
 * produce W in the same launch (DEQUANT -> GEMV), and a plain load is as fast here. */

#ifndef AMK_TILE_CUH
#define AMK_TILE_CUH

/* Weight kinds of the fast path (amk_tile_args::wk; -1: generic path only). */
enum {
  AMK_TILE_W_F32 = 0, AMK_TILE_W_F16 = 1, AMK_TILE_W_BF16 = 2,
  AMK_TILE_W_I8 = 3, AMK_TILE_W_U8 = 4, AMK_TILE_W_I4 = 5
};

struct amk_tile_args {
  const amk_buffer_t* xb;
  const amk_buffer_t* wb;
  const amk_buffer_t* ob;
  const amk_buffer_t* bias;   /* float mode only, may be null */
  const amk_buffer_t* scales; /* quantised mode only */
  const amk_buffer_t* zeros;  /* quantised mode only, may be null */
  const void* x;
  const void* w;
  long long wrow_bytes; /* bytes of one weight row */
  long long ldo;        /* last dim of the output */
  long long n_groups;   /* ceil(K / group) */
  int K, n_off, n_tile, m0, m_rows;
  int wk;               /* AMK_TILE_W_* */
  int group;
  int vpg, vpg_shift;   /* 16-byte vectors per group (fast quant path); shift if a power of 2, else -1 */
  float offset;         /* subtracted without zeros: 8 (int4) or 0 (int8) */
  unsigned long long pol; /* L2 policy of the weight loads (amk_weight_policy) */
};

template <int WK> struct amk_tile_ve { static constexpr int v = 4; };
template <> struct amk_tile_ve<AMK_TILE_W_F16> { static constexpr int v = 8; };
template <> struct amk_tile_ve<AMK_TILE_W_BF16> { static constexpr int v = 8; };
template <> struct amk_tile_ve<AMK_TILE_W_I8> { static constexpr int v = 16; };
template <> struct amk_tile_ve<AMK_TILE_W_U8> { static constexpr int v = 16; };
template <> struct amk_tile_ve<AMK_TILE_W_I4> { static constexpr int v = 32; };

/* Elements per 16-byte weight vector, at run time. */
__device__ __forceinline__ int amk_tile_ve_of(int wk) {
  switch (wk) {
    case AMK_TILE_W_F32: return 4;
    case AMK_TILE_W_F16: case AMK_TILE_W_BF16: return 8;
    case AMK_TILE_W_I8: case AMK_TILE_W_U8: return 16;
    default: return 32;
  }
}

/* The L2 policy of streamed weights: evicted first when the program asks for it
 * (AMK_PROG_L2_EVICT_FIRST), else normal. A decode step streams every weight once (gigabytes
 * through a 50 MB L2), so without it the weights push out the small lines every task needs next
 * — instructions, buffer descriptors, counters, activations, KV caches. */
#define AMK_PROG_L2_EVICT_FIRST 1
__device__ __forceinline__ unsigned long long amk_weight_policy(int prog_flags) {
  unsigned long long pol;
  if (prog_flags & AMK_PROG_L2_EVICT_FIRST)
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  else
    asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}

/* One 16-byte weight vector: coherent global load, not kept in L1 (x stays there), with the L2
 * policy `pol` (amk_weight_policy) and an L2 prefetch hint for the rest of the row. */
__device__ __forceinline__ uint4 amk_tile_ldw(const uint4* p, unsigned long long pol) {
  uint4 v;
  asm volatile("ld.global.L1::no_allocate.L2::cache_hint.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p), "l"(pol));
  return v;
}

/* A 16-bit activation (XT = AMK_BF16 covers F16 too, picked by the warp-uniform `bf`). */
__device__ __forceinline__ float amk_tile_h2f(uint32_t h, bool bf) {
  return bf ? __uint_as_float(h << 16) : amk_f16_to_f32((uint16_t)h);
}

/* The VE stored values of one weight vector as exact floats (integers as stored: I4 the raw
 * nibble 0..15, I8 signed, U8 unsigned; the magic-number conversions are exact). */
template <int WK>
__device__ __forceinline__ void amk_tile_decode(const uint4 v, float* w) {
  const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (WK == AMK_TILE_W_F32) {
      w[i] = __uint_as_float(u[i]);
    } else if constexpr (WK == AMK_TILE_W_BF16) {
      w[2 * i] = __uint_as_float(u[i] << 16);
      w[2 * i + 1] = __uint_as_float(u[i] & 0xffff0000u);
    } else if constexpr (WK == AMK_TILE_W_F16) {
      w[2 * i] = amk_f16_to_f32((uint16_t)(u[i] & 0xffffu));
      w[2 * i + 1] = amk_f16_to_f32((uint16_t)(u[i] >> 16));
    } else if constexpr (WK == AMK_TILE_W_I8) {
      const uint32_t t = u[i] ^ 0x80808080u; /* s + 128 in every byte */
#pragma unroll
      for (int j = 0; j < 4; ++j)
        w[4 * i + j] = __uint_as_float(__byte_perm(t, 0x4B000000u, 0x7440u | j)) - 8388736.0f;
    } else if constexpr (WK == AMK_TILE_W_U8) {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        w[4 * i + j] = __uint_as_float(__byte_perm(u[i], 0x4B000000u, 0x7440u | j)) - 8388608.0f;
    } else { /* AMK_TILE_W_I4: element e of the word is bits [4e, 4e + 4) */
#pragma unroll
      for (int j = 0; j < 8; ++j)
        w[8 * i + j] = __uint_as_float(0x4B000000u | ((u[i] >> (4 * j)) & 0xfu)) - 8388608.0f;
    }
  }
}

/* VE consecutive x elements from element index k (aligned: K % VE == 0), as floats; XT is
 * AMK_F32 or AMK_BF16 (16-bit: `bf` picks bf16 or f16). */
template <int XT, int VE>
__device__ __forceinline__ void amk_tile_ldx(const void* x, long long k, float* xs, bool bf) {
  if constexpr (XT == AMK_F32) {
    const float4* q = (const float4*)((const float*)x + k);
#pragma unroll
    for (int i = 0; i < VE / 4; ++i) {
      const float4 f = q[i];
      xs[4 * i] = f.x;
      xs[4 * i + 1] = f.y;
      xs[4 * i + 2] = f.z;
      xs[4 * i + 3] = f.w;
    }
  } else if constexpr (VE == 4) {
    const uint2 t = *(const uint2*)((const uint16_t*)x + k);
    xs[0] = amk_tile_h2f(t.x & 0xffffu, bf);
    xs[1] = amk_tile_h2f(t.x >> 16, bf);
    xs[2] = amk_tile_h2f(t.y & 0xffffu, bf);
    xs[3] = amk_tile_h2f(t.y >> 16, bf);
  } else {
    const uint4* q = (const uint4*)((const uint16_t*)x + k);
#pragma unroll
    for (int i = 0; i < VE / 8; ++i) {
      const uint4 t = q[i];
      const uint32_t u[4] = {t.x, t.y, t.z, t.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        xs[8 * i + 2 * j] = amk_tile_h2f(u[j] & 0xffffu, bf);
        xs[8 * i + 2 * j + 1] = amk_tile_h2f(u[j] >> 16, bf);
      }
    }
  }
}

/* Sum of the 4 partials across the warp, plus the bias, stored at (row, n) by lane 0. */
template <int MAXR>
__device__ __forceinline__ void amk_tile_store(const amk_tile_args& a, const float (*acc)[4], int r0, int mr,
                                         int n, float bias) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int r = 0; r < MAXR; ++r) {
    if (r < mr) { /* warp-uniform */
      float t = (acc[r][0] + acc[r][1]) + (acc[r][2] + acc[r][3]);
      t = amk_warp_sum(t);
      if (lane == 0) amk_stf(a.ob, (long long)(a.m0 + r0 + r) * a.ldo + n, t + bias);
    }
  }
}

/* Fast path: K % VE == 0 (so every weight and x row is vector-aligned), quantised groups hold
 * whole vectors. */
template <int WK, int XT, int MAXR, int UNROLL>
__device__ __noinline__ void amk_tile_fast(const amk_tile_args& args) {
  const amk_tile_args a = args; /* one copy in registers (the callee's own allocation) */
  const unsigned long long pol = a.pol;
  constexpr int VE = amk_tile_ve<WK>::v;
  constexpr bool QUANT = WK >= AMK_TILE_W_I8;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nvec = a.K / VE;
  const bool bf = a.xb->dtype == AMK_BF16;
  for (int j = warp; j < a.n_tile; j += AMK_WARPS) {
    const int n = a.n_off + j;
    const uint4* wrow = (const uint4*)((const unsigned char*)a.w + (long long)n * a.wrow_bytes);
    const long long sbase = (long long)n * a.n_groups;
    const float bias = (!QUANT && a.bias) ? amk_ldf(a.bias, n) : 0.0f;
    for (int r0 = 0; r0 < a.m_rows; r0 += MAXR) {
      const int mr = min(MAXR, a.m_rows - r0);
      const long long xrow0 = (long long)(a.m0 + r0) * a.K;
      float acc[MAXR][4];
#pragma unroll
      for (int r = 0; r < MAXR; ++r)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[r][i] = 0.0f;
      for (int v0 = 0; v0 < nvec; v0 += 32 * UNROLL) {
        uint4 wv[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
          const int v = v0 + u * 32 + lane;
          if (v < nvec) wv[u] = amk_tile_ldw(wrow + v, pol);
          else wv[u] = make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
          const int v = v0 + u * 32 + lane;
          if (v < nvec) {
            float w[VE];
            amk_tile_decode<WK>(wv[u], w);
            if constexpr (QUANT) {
              const int g = a.vpg_shift >= 0 ? (v >> a.vpg_shift) : v / a.vpg;
              const float s = amk_ldf(a.scales, sbase + g);
              const float z = a.zeros ? amk_ldf(a.zeros, sbase + g) : a.offset;
#pragma unroll
              for (int i = 0; i < VE; ++i) w[i] = (w[i] - z) * s;
            }
            const long long k = (long long)v * VE;
#pragma unroll
            for (int r = 0; r < MAXR; ++r) {
              if (r < mr) {
                float xs[VE];
                amk_tile_ldx<XT, VE>(a.x, xrow0 + (long long)r * a.K + k, xs, bf);
#pragma unroll
                for (int i = 0; i < VE; ++i) acc[r][i & 3] = fmaf(xs[i], w[i], acc[r][i & 3]);
              }
            }
          }
        }
      }
      amk_tile_store<MAXR>(a, acc, r0, mr, n, bias);
    }
  }
}

/* The real weight W[n, k] (generic path). */
__device__ __forceinline__ float amk_tile_wval(const amk_tile_args& a, int n, int k) {
  if (a.wk < AMK_TILE_W_I8) return amk_ldf(a.wb, (long long)n * a.K + k);
  float q;
  const unsigned char* row = (const unsigned char*)a.w + (long long)n * a.wrow_bytes;
  if (a.wk == AMK_TILE_W_I4) q = (float)((row[k >> 1] >> (4 * (k & 1))) & 0xf);
  else if (a.wk == AMK_TILE_W_I8) q = (float)((const signed char*)row)[k];
  else q = (float)row[k];
  const long long gi = (long long)n * a.n_groups + k / a.group;
  const float s = amk_ldf(a.scales, gi);
  const float z = a.zeros ? amk_ldf(a.zeros, gi) : a.offset;
  return (q - z) * s;
}

/* Scalar path for every shape and dtype: lanes stride over k (coalesced), one warp per n. */
template <int MAXR>
__device__ __noinline__ void amk_tile_generic(const amk_tile_args& args) {
  const amk_tile_args a = args;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int j = warp; j < a.n_tile; j += AMK_WARPS) {
    const int n = a.n_off + j;
    const float bias = (a.wk < AMK_TILE_W_I8 && a.bias) ? amk_ldf(a.bias, n) : 0.0f;
    for (int r0 = 0; r0 < a.m_rows; r0 += MAXR) {
      const int mr = min(MAXR, a.m_rows - r0);
      const long long xrow0 = (long long)(a.m0 + r0) * a.K;
      float acc[MAXR][4];
#pragma unroll
      for (int r = 0; r < MAXR; ++r)
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[r][i] = 0.0f;
      for (int k = lane; k < a.K; k += 32) {
        const float w = amk_tile_wval(a, n, k);
#pragma unroll
        for (int r = 0; r < MAXR; ++r)
          if (r < mr) acc[r][0] = fmaf(amk_ldf(a.xb, xrow0 + (long long)r * a.K + k), w, acc[r][0]);
      }
      amk_tile_store<MAXR>(a, acc, r0, mr, n, bias);
    }
  }
}

template <int WK, int MAXR, int UNROLL>
__device__ __forceinline__ void amk_tile_fast_x(const amk_tile_args& a, int xt) {
  if (xt == AMK_F32) amk_tile_fast<WK, AMK_F32, MAXR, UNROLL>(a);
  else amk_tile_fast<WK, AMK_BF16, MAXR, UNROLL>(a); /* BF16 or F16 */
}

/* ---- Fused decode tiles: RMSNORM_GEMV, GATE_UP_SILU, QKV_ROPE_APPEND -----------------------
 * One row x of K elements, optionally RMS-normalised first: every tile normalises it itself
 * into dynamic shared memory (RMSNORM's vector path), rounded to x's dtype as the unfused
 * RMSNORM stores it. Each warp then takes NR weight rows at a time (GATE_UP_SILU: the gate and
 * the up row of one column; QKV_ROPE_APPEND: the two rows RoPE rotates together), so the
 * epilogue that combines them runs in registers, with no phase and no hand-off between. Every
 * sum is GEMV_TILE's, in its order (4 partials per lane over the 16-byte vectors v = lane,
 * lane + 32, ..., then the warp sum), so a fused program rounds exactly as the unfused one. */

/* AMK_FUSED_VECS: device knob, defined with its default in amk_knobs.cuh. */
/* AMK_FUSED_EXACT: device knob, defined with its default in amk_knobs.cuh. */

/* The row the tile multiplies. */
struct amk_frow {
  const void* p;         /* the row for the vector path (x, or its normalised copy), or null */
  int dt;                /* x's dtype */
  const amk_buffer_t* x; /* generic path: x and the norm weight (null: no norm) */
  const amk_buffer_t* nw;
  amk_norm_t inv;        /* 1 / rms(x) (generic path with a norm) */
  unsigned long long pol; /* L2 policy of the weight loads (amk_weight_policy) */
};

/* Element k of the row on the generic path: the prepared row when the tile made one (r.p, of
 * x's dtype: a vector pair whose loop this build left out, amk_fused_pick), else x[k],
 * normalised and rounded when there is a norm. */
__device__ __forceinline__ float amk_frow_at(const amk_frow& r, long long k) {
  if (r.p) {
    if (r.dt == AMK_F32) return ((const float*)r.p)[k];
    const uint16_t h = ((const uint16_t*)r.p)[k];
    return AMK_BF_OF(r.dt) ? amk_bf16_to_f32(h) : amk_f16_to_f32(h);
  }
  const float v = amk_ldf(r.x, k);
  if (!r.nw) return v;
  return amk_round_dt(r.dt, amk_rms_apply(v, r.inv, amk_ldf(r.nw, k)));
}

/* AMK_NORM_WPRE: device knob, defined with its default in amk_knobs.cuh. */

/* The norm weight's vector of this thread, loaded before the wait when `ok` (never for a task
 * run for its checks alone, which reads nothing). */
struct amk_norm_pre {
  amk_norm_w w;
  bool ok;
};

__device__ __forceinline__ amk_norm_pre amk_norm_pre_load(const amk_task_ctx& ctx, const amk_buffer_t* nw,
                                                          long long K) {
  amk_norm_pre np;
  np.w.a = np.w.b = make_uint4(0u, 0u, 0u, 0u);
  np.ok = AMK_NORM_WPRE && nw && !ctx.check_only && (K & 7) == 0 && (K >> 3) <= AMK_THREADS &&
          amk_is_vec(nw->dtype) && amk_al16(nw->ptr);
  if (np.ok && threadIdx.x < (K >> 3)) amk_ld8_raw(nw->ptr, nw->dtype, threadIdx.x, np.w.a, np.w.b);
  return np;
}

/* amk_frow_make without the trace point. */
__device__ __forceinline__ amk_frow amk_frow_prepare(const amk_task_ctx& ctx, const amk_buffer_t* x,
                                                     const amk_buffer_t* nw, long long K, float eps,
                                                     const amk_norm_pre* np) {
  amk_frow r;
  r.pol = amk_weight_policy(ctx.prog->flags);
  r.x = x;
  r.nw = nw;
  r.dt = x->dtype;
  r.inv = 0;
  const bool vec = amk_is_vec(x->dtype) && amk_al16(x->ptr);
  r.p = vec ? x->ptr : nullptr;
  const long long esz = x->dtype == AMK_F32 ? 4 : 2;
  if (!nw) {
    /* Every warp re-reads x for each of its rows: from shared memory when the launch reserves
       enough (docs/perf-notes.md round 4: read from global memory through an L1 cache that
       the reservation shrinks, those re-reads made a tile several times slower). */
    if (vec && (K & 7) == 0 && K * esz <= ctx.smem_bytes) {
      const long long nv = (K * esz) >> 4;
      for (long long i = threadIdx.x; i < nv; i += AMK_THREADS)
        ((uint4*)ctx.smem)[i] = ((const uint4*)x->ptr)[i];
      __syncthreads();
      r.p = ctx.smem;
    }
    return r;
  }
  if (vec && (K & 7) == 0 && (K >> 3) <= (long long)AMK_THREADS * AMK_RMS_VB &&
      amk_is_vec(nw->dtype) && amk_al16(nw->ptr) && K * esz <= ctx.smem_bytes) {
    /* The fewest vectors a thread that cover the row (same arithmetic, same order: a thread's
       vectors past the row are skipped either way): the unrolled norm is ~1,500 instructions
       at 4 vectors, fetched again every layer (docs/perf-notes.md round 14 §8). */
    const long long hv = K >> 3;
#if AMK_PROBE == 3 && !AMK_TRACE_OFF
    /* a cold norm, then the same warm (probe 6 between them, 7 after); rows of at most
       8 * AMK_THREADS elements (the one-vector norm below) */
    if (hv <= AMK_THREADS) {
      amk_rms_rows<AMK_THREADS, 1>(x->ptr, x->dtype, nw->ptr, nw->dtype, ctx.smem, x->dtype, K,
                                   eps, 1, 0, 1, threadIdx.x);
      __syncthreads();
      AMK_PROBE_AT(6, true);
    }
#endif
    if (np && np->ok)
      amk_rms_rows<AMK_THREADS, 1, true>(x->ptr, x->dtype, nw->ptr, nw->dtype, ctx.smem, x->dtype,
                                         K, eps, 1, 0, 1, threadIdx.x, np->w);
    else if (hv <= AMK_THREADS)
      amk_rms_rows<AMK_THREADS, 1>(x->ptr, x->dtype, nw->ptr, nw->dtype, ctx.smem, x->dtype, K,
                                   eps, 1, 0, 1, threadIdx.x);
    else if (hv <= 2 * AMK_THREADS)
      amk_rms_rows<AMK_THREADS, 2>(x->ptr, x->dtype, nw->ptr, nw->dtype, ctx.smem, x->dtype, K,
                                   eps, 1, 0, 1, threadIdx.x);
    else
      amk_rms_rows<AMK_THREADS, AMK_RMS_VB>(x->ptr, x->dtype, nw->ptr, nw->dtype, ctx.smem,
                                            x->dtype, K, eps, 1, 0, 1, threadIdx.x);
    __syncthreads(); /* the row is in shared memory for every warp */
    AMK_PROBE_IF(3, 7, true);
    r.p = ctx.smem;
    return r;
  }
  r.p = nullptr;
  amk_norm_t s = 0;
  for (long long k = threadIdx.x; k < K; k += AMK_THREADS) s = amk_rms_sq(s, amk_ldf(x, k));
  s = amk_block_sum_of(s);
  r.inv = amk_rms_inv(s, K, eps);
  return r;
}

/* Prepares the row (block-uniform; every thread gets the same result). The row goes to shared
 * memory when it fits (vector dtypes, 16-byte aligned, K a multiple of 8, K elements of x's
 * dtype within ctx.smem_bytes): normalised with a norm weight `nw`, else copied. Otherwise the
 * vector path reads x in place, or, with a norm, the generic path takes 1 / rms(x) from a block
 * sum and normalises on the fly. `np`: the norm weight loaded before the wait, or null. */
__device__ __forceinline__ amk_frow amk_frow_make(const amk_task_ctx& ctx, const amk_buffer_t* x,
                                                  const amk_buffer_t* nw, long long K, float eps,
                                                  const amk_norm_pre* np = nullptr) {
  amk_frow r = amk_frow_prepare(ctx, x, nw, K, eps, np);
#if !AMK_TRACE_OFF
  if (ctx.trace && threadIdx.x == 0) ctx.trace[4] = amk_globaltimer();
#endif
  return r;
}


/* The warp's NR dot products of the row with weight rows w[0..NR) (16-byte aligned, nvec
 * vectors each), U vectors of each row in flight per lane; every lane gets the sums. Rows from
 * `live` on (warp-uniform) are not loaded: their sums are meaningless. */
template <int WK, int XT, int NR, int U>
__device__ __forceinline__ void amk_fdot(const void* x, const unsigned char* const (&w)[NR], int nvec,
                                         int live, bool bf, unsigned long long pol, float (&s)[NR]) {
  constexpr int VE = amk_tile_ve<WK>::v;
  const int lane = threadIdx.x & 31;
  float acc[NR][4];
#pragma unroll
  for (int r = 0; r < NR; ++r)
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[r][i] = 0.0f;
  for (int v0 = 0; v0 < nvec; v0 += 32 * U) {
    uint4 wv[NR][U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int v = v0 + u * 32 + lane;
#pragma unroll
      for (int r = 0; r < NR; ++r)
        wv[r][u] = (AMK_FUSED_EXACT || v < nvec) && r < live
                       ? amk_tile_ldw((const uint4*)w[r] + v, pol)
                       : make_uint4(0u, 0u, 0u, 0u);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int v = v0 + u * 32 + lane;
      if (AMK_FUSED_EXACT || v < nvec) {
        float xs[VE];
        amk_tile_ldx<XT, VE>(x, (long long)v * VE, xs, bf);
#pragma unroll
        for (int r = 0; r < NR; ++r) {
          float wf[VE];
          amk_tile_decode<WK>(wv[r][u], wf);
#pragma unroll
          for (int i = 0; i < VE; ++i) acc[r][i & 3] = fmaf(xs[i], wf[i], acc[r][i & 3]);
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < NR; ++r) s[r] = amk_warp_sum((acc[r][0] + acc[r][1]) + (acc[r][2] + acc[r][3]));
}

/* AMK_FUSED_PAIR: device knob, defined with its default in amk_knobs.cuh. */
#define AMK_FUSED_PAIR_OF(bit) ((AMK_FUSED_PAIR & (bit)) ? 2 : 1)

/* Vector path: units j = warp, warp + AMK_WARPS, .. < n_units; rows(j, wb, row) names the unit's
 * NR weight rows (buffer and row index), epi(j, s) stores its results (all lanes call it). */
template <int WK, int XT, int NR, int P, typename Rows, typename Epi>
__device__ __noinline__ void amk_fused_fast(const void* x, bool bf, unsigned long long pol, long long K,
                                            int n_units, Rows rows, Epi epi) {
  constexpr int VE = amk_tile_ve<WK>::v;
  constexpr long long ESZ = WK == AMK_TILE_W_F32 ? 4 : 2;
  const int nvec = (int)(K / VE);
  for (int j = threadIdx.x >> 5; j < n_units; j += P * AMK_WARPS) {
    const unsigned char* w[P * NR];
    int live = NR;
#pragma unroll
    for (int p = 0; p < P; ++p) {
      const int jp = j + p * AMK_WARPS;
      const bool ok = p == 0 || jp < n_units; /* warp-uniform */
      const amk_buffer_t* wb[NR];
      long long row[NR];
      rows(ok ? jp : j, wb, row);
#pragma unroll
      for (int r = 0; r < NR; ++r) w[p * NR + r] = (const unsigned char*)wb[r]->ptr + row[r] * K * ESZ;
      if (p > 0 && ok) live += NR;
    }
    float s[P * NR];
    /* P > 2 (short rows, amk_fused_run): the same registers, fewer vectors of each row a pass */
    amk_fdot<WK, XT, P * NR, (P > 2 ? AMK_FUSED_VECS * 2 / P : AMK_FUSED_VECS) / NR>(x, w, nvec, live,
                                                                                bf, pol, s);
#pragma unroll
    for (int p = 0; p < P; ++p) {
      if (p * NR < live) {
        float sp[NR];
#pragma unroll
        for (int r = 0; r < NR; ++r) sp[r] = s[p * NR + r];
        epi(j + p * AMK_WARPS, sp);
      }
    }
  }
}

/* Generic path (any alignment, K, float dtypes): lanes stride over k, same roles. */
template <int NR, typename Rows, typename Epi>
__device__ __noinline__ void amk_fused_generic(const amk_frow r, long long K, int n_units, Rows rows,
                                               Epi epi) {
  const int lane = threadIdx.x & 31;
  for (int j = threadIdx.x >> 5; j < n_units; j += AMK_WARPS) {
    const amk_buffer_t* wb[NR];
    long long row[NR];
    rows(j, wb, row);
    float acc[NR];
#pragma unroll
    for (int q = 0; q < NR; ++q) acc[q] = 0.0f;
    for (long long k = lane; k < K; k += 32) {
      const float xv = amk_frow_at(r, k);
#pragma unroll
      for (int q = 0; q < NR; ++q) acc[q] = fmaf(xv, amk_ldf(wb[q], row[q] * K + k), acc[q]);
    }
    float s[NR];
#pragma unroll
    for (int q = 0; q < NR; ++q) s[q] = amk_warp_sum(acc[q]);
    epi(j, s);
  }
}

/* AMK_FUSED_LOOPS: device knob, defined with its default in amk_knobs.cuh. */
#define AMK_FUSED_HAS(wk, x16) ((AMK_FUSED_LOOPS >> (2 * (wk) + (x16))) & 1)

/* Runs a fused tile: the vector path when the row is in place, every weight buffer has dtype
 * `wdt` (one of F32/F16/BF16, else -1) and a 16-byte aligned base (`w_al16`), K is a multiple of
 * the vector width and the pair's loop is compiled in (AMK_FUSED_LOOPS); the generic path
 * otherwise. P: units a warp streams at once (amk_fused_run). */
template <int NR, int P, typename Rows, typename Epi>
__device__ __forceinline__ void amk_fused_pick(const amk_frow& r, long long K, int wdt, bool w_al16,
                                               int n_units, Rows rows, Epi epi) {
  const int wk = wdt == AMK_F32 ? AMK_TILE_W_F32 : wdt == AMK_F16 ? AMK_TILE_W_F16
               : wdt == AMK_BF16 ? AMK_TILE_W_BF16 : -1;
  const bool bf = AMK_BF_OF(r.dt), xf = r.dt == AMK_F32;
  const bool vec = r.p && wk >= 0 && w_al16 && amk_urem(K, amk_tile_ve_of(wk)) == 0;
#define AMK_FUSED_TRY(WK, XT, X16)                                                                \
  if constexpr (AMK_FUSED_HAS(WK, X16)) {                                                         \
    if (vec && wk == (WK) && xf == !(X16)) {                                                      \
      amk_fused_fast<WK, XT, NR, P>(r.p, bf, r.pol, K, n_units, rows, epi);                       \
      return;                                                                                     \
    }                                                                                             \
  }
  AMK_FUSED_TRY(AMK_TILE_W_BF16, AMK_BF16, 1)
  AMK_FUSED_TRY(AMK_TILE_W_BF16, AMK_F32, 0)
  AMK_FUSED_TRY(AMK_TILE_W_F16, AMK_BF16, 1)
  AMK_FUSED_TRY(AMK_TILE_W_F16, AMK_F32, 0)
  AMK_FUSED_TRY(AMK_TILE_W_F32, AMK_BF16, 1)
  AMK_FUSED_TRY(AMK_TILE_W_F32, AMK_F32, 0)
#undef AMK_FUSED_TRY
  amk_fused_generic<NR>(r, K, n_units, rows, epi);
}

/* AMK_FUSED_PAIR_MIN, AMK_FUSED_PAIR_MIN_LONG: device knobs, defined with their defaults in
 * amk_knobs.cuh. */

/* AMK_FUSED_QUAD_BYTES: device knob, defined with its default in amk_knobs.cuh. */

/* amk_fused_pick<NR, P> for a tile that pairs its units (above), else amk_fused_pick<NR, 1>;
 * <NR, 2P> for a paired one-row projection of short rows (AMK_FUSED_QUAD_BYTES). */
template <int NR, int P, typename Rows, typename Epi>
__device__ __forceinline__ void amk_fused_run(const amk_frow& r, long long K, int wdt, bool w_al16,
                                              int n_units, Rows rows, Epi epi) {
  if constexpr (P > 1) {
    const long long row_bytes = K * (wdt == AMK_F32 ? 4 : 2);
    if (n_units < AMK_FUSED_PAIR_MIN * AMK_WARPS &&
        (n_units < AMK_FUSED_PAIR_MIN_LONG * AMK_WARPS || row_bytes < 8192)) {
      amk_fused_pick<NR, 1>(r, K, wdt, w_al16, n_units, rows, epi);
      return;
    }
    if constexpr (NR == 1 && P == 2 && AMK_FUSED_QUAD_BYTES > 0) {
      if (row_bytes <= AMK_FUSED_QUAD_BYTES) {
        amk_fused_pick<NR, 2 * P>(r, K, wdt, w_al16, n_units, rows, epi);
        return;
      }
    }
  }
  amk_fused_pick<NR, P>(r, K, wdt, w_al16, n_units, rows, epi);
}

/* Shared operand checks of the fused tiles (the validator's opcheck::fused_row, again on the
 * device against a corrupted table): x one row of K, every weight [N, K] of a vector dtype,
 * the norm weight (when given) K elements. Fails the task and returns false otherwise. */
__device__ __forceinline__ bool amk_fused_check(const amk_task_ctx& ctx, const amk_buffer_t* x,
                                                const amk_buffer_t* const* w, int nw,
                                                const amk_buffer_t* norm, long long K) {
  if (K <= 0) { amk_fail(ctx, AMK_ERR_PARAM, K); return false; }
  if (!amk_is_vec(x->dtype)) { amk_fail(ctx, AMK_ERR_DTYPE, x->dtype); return false; }
  if (x->numel != K || amk_last_dim(x) != K) { amk_fail(ctx, AMK_ERR_SHAPE, x->numel); return false; }
  for (int i = 0; i < nw; ++i) {
    if (!amk_is_vec(w[i]->dtype)) { amk_fail(ctx, AMK_ERR_DTYPE, w[i]->dtype); return false; }
    if (amk_last_dim(w[i]) != K) { amk_fail(ctx, AMK_ERR_SHAPE, amk_last_dim(w[i])); return false; }
  }
  if (norm && (norm->numel != K || !amk_is_vec(norm->dtype))) {
    amk_fail(ctx, AMK_ERR_SHAPE, norm->numel);
    return false;
  }
  return true;
}

/* The column-tile checks of a one-row projection (RMSNORM_GEMV, ATTENTION_GEMV; the validator's
 * opcheck::tile_within and output rule, again on the device): columns [n_off, n_off + n_tile)
 * within the numel(w) / K rows of w and within the one-row output y, the bias (optional) one
 * element per row, y and the bias of a vector dtype. Fails the task and returns false
 * otherwise. */
__device__ __forceinline__ bool amk_row_tile_check(const amk_task_ctx& ctx, const amk_buffer_t* w,
                                                   long long K, int n_tile, int n_off,
                                                   const amk_buffer_t* y, const amk_buffer_t* bias) {
  const bool CHECK = true;
  const long long n = amk_udiv(w->numel, K);
  AMK_CHECK(n_tile > 0 && n_off >= 0, AMK_ERR_PARAM, n_tile <= 0 ? n_tile : n_off);
  const long long end = (long long)n_off + n_tile;
  AMK_CHECK(end <= n && end <= amk_last_dim(y) && y->numel == amk_last_dim(y) &&
                (!bias || bias->numel == n),
            AMK_ERR_SHAPE, end);
  AMK_CHECK(amk_is_vec(y->dtype) && (!bias || amk_is_vec(bias->dtype)), AMK_ERR_DTYPE, y->dtype);
  return true;
}

/* The one-row projection's unit j: weight row n_off + j of w. */
__device__ __forceinline__ auto amk_row_tile_rows(const amk_buffer_t* w, int n_off) {
  return [=](int j, const amk_buffer_t* (&wb)[1], long long (&row)[1]) {
    wb[0] = w;
    row[0] = n_off + j;
  };
}

/* The one-row projection's store: y[n_off + j] = sum (+ bias[n_off + j]), by lane 0. */
__device__ __forceinline__ auto amk_row_tile_epi(const amk_buffer_t* y, const amk_buffer_t* bias, int n_off) {
  return [=](int j, const float (&s)[1]) {
    if ((threadIdx.x & 31) == 0) {
      const long long c = n_off + j;
      amk_stf(y, c, s[0] + (bias ? amk_ldf(bias, c) : 0.0f));
    }
  };
}

/* A row of K elements of `dtype` made in the tile's shared memory (ATTENTION_GEMV's attention
 * row, COMBINE_GEMV's merged one), as a one-row buffer the stores of amk_attention.cuh and
 * amk_stf can write. */
__device__ __forceinline__ amk_buffer_t amk_smem_row(const amk_task_ctx& ctx, long long K, int dtype) {
  amk_buffer_t row;
  row.ptr = ctx.smem;
  row.numel = K;
  row.rank = 1;
  row.dtype = dtype;
  row.space = 0;
  row.flags = 0;
  for (int i = 0; i < 4; ++i) {
    row.shape[i] = i == 0 ? K : 1;
    row.stride[i] = 1;
  }
  return row;
}

/* The prepared row (amk_frow) of an amk_smem_row the block has written (after its barrier),
 * weights loaded with L2 policy `pol`. */
__device__ __forceinline__ amk_frow amk_smem_frow(const amk_task_ctx& ctx, const amk_buffer_t* row,
                                                  unsigned long long pol) {
  amk_frow r;
  r.p = ctx.smem;
  r.dt = row->dtype;
  r.x = row;
  r.nw = nullptr;
  r.inv = 0.0;
  r.pol = pol;
  return r;
}

/* Columns [n_off, n_off + n_tile) of y = row . w^T (+ bias) for a prepared row r (one weight row
 * per warp at a time, amk_fused_run): ATTENTION_GEMV's projection (amk_row_tile below for the
 * tiles that prepare their row from x). w_al16: w's base is 16-byte aligned. */
__device__ __forceinline__ void amk_row_tile_run(const amk_frow& r, long long K, const amk_buffer_t* w,
                                                 bool w_al16, int n_tile, int n_off,
                                                 const amk_buffer_t* y, const amk_buffer_t* bias) {
  amk_fused_run<1, AMK_FUSED_PAIR_OF(1)>(r, K, w->dtype, w_al16, n_tile, amk_row_tile_rows(w, n_off),
                                         amk_row_tile_epi(y, bias, n_off));
}

/* AMK_ROW_PRE: device knob, defined with its default in amk_knobs.cuh. */

#if AMK_ROW_PRE
/* Vectors of each of a unit's NR rows a lane holds: the whole row in one pass. */
template <int NR>
struct amk_pre_u { static constexpr int v = AMK_FUSED_VECS / NR > 0 ? AMK_FUSED_VECS / NR : 1; };

/* AMK_ROW_PRE_UNITS: device knob, defined with its default in amk_knobs.cuh. */

/* Whether a tile whose row is `rdt` (16-byte aligned: `r_al16`) can take the pre path with
 * units of NR rows, U vectors of each a lane and PU units a warp (block-uniform, from
 * descriptors only): at most PU units a warp, a 16-bit row that fits shared memory, 16-bit
 * weights with a compiled-in loop, aligned, and rows of at most U vectors a lane (one pass).
 * A caller checks with the U and PU it then runs amk_pre_run with: amk_pre_run drops vectors
 * and units past them. */
template <int NR, int U = amk_pre_u<NR>::v, int PU = AMK_ROW_PRE_UNITS>
__device__ __forceinline__ bool amk_pre_row_ok(const amk_task_ctx& ctx, int rdt, bool r_al16, long long K,
                                               int wdt, bool w_al16, int n_units) {
  const bool w16 = (wdt == AMK_BF16 && AMK_FUSED_HAS(AMK_TILE_W_BF16, 1)) ||
                   (wdt == AMK_F16 && AMK_FUSED_HAS(AMK_TILE_W_F16, 1));
  return !ctx.check_only && n_units <= PU * AMK_WARPS && w16 && w_al16 &&
         rdt != AMK_F32 && amk_is_vec(rdt) && r_al16 && (K & 7) == 0 && K * 2 <= ctx.smem_bytes &&
         (K >> 3) <= 32 * U;
}

/* Whether a tile takes amk_pre_fast: amk_pre_row_ok for its row x, which amk_frow_prepare puts
 * in shared memory (normalised by nw, or copied). */
template <int NR, int U = amk_pre_u<NR>::v, int PU = AMK_ROW_PRE_UNITS>
__device__ __forceinline__ bool amk_pre_ok(const amk_task_ctx& ctx, const amk_buffer_t* x,
                                           const amk_buffer_t* nw, long long K, int wdt, bool w_al16,
                                           int n_units) {
  if (!amk_pre_row_ok<NR, U, PU>(ctx, x->dtype, amk_al16(x->ptr), K, wdt, w_al16, n_units)) return false;
  return !nw || ((K >> 3) <= (long long)AMK_THREADS * AMK_RMS_VB && amk_is_vec(nw->dtype) &&
                 amk_al16(nw->ptr));
}

/* The pre path: loads every unit of each warp (weights: no task writes them, so nothing orders
 * their loads after a counter), waits, has `prep` make the 16-bit row and return its reader
 * (`ldx(u, v, xs)`: the lane's vector v = 32 u + lane of the row as VE floats; amk_pre_smem,
 * amk_pre_x), and sums as amk_fdot does, in the same order. */
template <int WK, int NR, int U, int PU, typename Prep, typename Rows, typename Epi>
__device__ __forceinline__ void amk_pre_run(const amk_task_ctx& ctx, long long K, int n_units,
                                            Prep prep, Rows rows, Epi epi) {
  /* U: vectors of each row a lane holds; PU: a warp's units, all loaded before the wait */
  constexpr int VE = amk_tile_ve<WK>::v;
  const unsigned long long pol = amk_weight_policy(ctx.prog->flags);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nvec = (int)(K / VE);
  uint4 wv[PU][NR][U];
  const auto issue = [&](uint4 (&wk)[NR][U], int j, bool live) {
    const amk_buffer_t* wb[NR];
    long long row[NR];
    rows(j, wb, row);
#pragma unroll
    for (int r = 0; r < NR; ++r) {
      const uint4* w = (const uint4*)((const unsigned char*)wb[r]->ptr + row[r] * K * 2);
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int v = u * 32 + lane;
        wk[r][u] = live && v < nvec ? amk_tile_ldw(w + v, pol) : make_uint4(0u, 0u, 0u, 0u);
      }
    }
  };
#pragma unroll
  for (int k = 0; k < PU; ++k) {
    const int j = warp + k * AMK_WARPS;
    const bool live = j < n_units; /* warp-uniform */
    issue(wv[k], live ? j : 0, live);
  }
  if (!amk_task_wait(ctx)) return;
  const auto ldx = prep();
  const auto sum = [&](const uint4 (&wk)[NR][U], int j) {
    float acc[NR][4];
#pragma unroll
    for (int r = 0; r < NR; ++r)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[r][i] = 0.0f;
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int v = u * 32 + lane;
      if (v < nvec) {
        float xs[VE];
        ldx(u, v, xs);
#pragma unroll
        for (int r = 0; r < NR; ++r) {
          float wf[VE];
          amk_tile_decode<WK>(wk[r][u], wf);
#pragma unroll
          for (int i = 0; i < VE; ++i) acc[r][i & 3] = fmaf(xs[i], wf[i], acc[r][i & 3]);
        }
      }
    }
    float s[NR];
#pragma unroll
    for (int r = 0; r < NR; ++r) s[r] = amk_warp_sum((acc[r][0] + acc[r][1]) + (acc[r][2] + acc[r][3]));
    AMK_PROBE_IF(2, 6, j == 0 && s[0] != -1.0f); /* the first unit's sums */
    epi(j, s);
    AMK_PROBE_IF(2, 7, j == 0); /* and its epilogue's stores issued */
  };
#pragma unroll
  for (int k = 0; k < PU; ++k) { /* amk_pre_ok: n_units <= PU * AMK_WARPS */
    const int j = warp + k * AMK_WARPS;
    if (j < n_units) sum(wv[k], j);
  }
}

/* amk_pre_run's reader of a 16-bit row made in shared memory (an amk_frow whose p is it). */
template <int VE>
__device__ __forceinline__ auto amk_pre_smem(const amk_frow rw) {
  const void* p = rw.p;
  const bool bf = AMK_BF_OF(rw.dt);
  return [=](int, int v, float* xs) { amk_tile_ldx<AMK_BF16, VE>(p, (long long)v * VE, xs, bf); };
}

/* The pre path of a one-row tile whose 16-bit row `prep` makes in shared memory after the wait
 * (ATTENTION_GEMV, COMBINE_GEMV; `prep` returns the amk_frow of amk_smem_frow): columns
 * [n_off, n_off + n_tile) of y = row . w^T (+ bias), w's rows in registers before the wait.
 * False, having done nothing, when w's dtype has no compiled-in 16-bit loop. */
template <class Prep>
__device__ __forceinline__ bool amk_row_tile_pre(const amk_task_ctx& ctx, long long K, const amk_buffer_t* w,
                                                 int n_tile, int n_off, const amk_buffer_t* y,
                                                 const amk_buffer_t* bias, Prep prep) {
  const auto reader = [&] { return amk_pre_smem<8>(prep()); };
  const auto rows = amk_row_tile_rows(w, n_off);
  const auto epi = amk_row_tile_epi(y, bias, n_off);
  if constexpr (AMK_FUSED_HAS(AMK_TILE_W_BF16, 1)) {
    if (w->dtype == AMK_BF16) { amk_pre_run<AMK_TILE_W_BF16, 1, amk_pre_u<1>::v, AMK_ROW_PRE_UNITS>(ctx, K, n_tile, reader, rows, epi); return true; }
  }
  if constexpr (AMK_FUSED_HAS(AMK_TILE_W_F16, 1)) {
    if (w->dtype == AMK_F16) { amk_pre_run<AMK_TILE_W_F16, 1, amk_pre_u<1>::v, AMK_ROW_PRE_UNITS>(ctx, K, n_tile, reader, rows, epi); return true; }
  }
  return false;
}

/* A lane's vectors v = 32 u + lane (u < U) of a 16-bit row in registers: amk_pre_run's reader
 * for amk_pre_fast (amk_pre_row). */
template <int U>
struct amk_pre_x {
  uint4 q[U];
  bool bf;
  __device__ __forceinline__ void operator()(int u, int, float* xs) const {
    const uint32_t h[4] = {q[u].x, q[u].y, q[u].z, q[u].w};
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      xs[2 * j] = amk_tile_h2f(h[j] & 0xffffu, bf);
      xs[2 * j + 1] = amk_tile_h2f(h[j] >> 16, bf);
    }
  }
};

/* The lane's vectors of a 16-bit array of hv vectors (0 past it), all loads issued at once. */
template <int U>
__device__ __forceinline__ void amk_pre_ld(const void* p, long long hv, uint4 (&q)[U]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int v = u * 32 + lane;
    q[u] = v < hv ? ((const uint4*)p)[v] : make_uint4(0u, 0u, 0u, 0u);
  }
}

/* AMK_PRE_XREG: device knob, defined with its default in amk_knobs.cuh. */

/* The row of a pre-path tile (after its wait) in the lanes' registers: x itself without a norm
 * (AMK_PRE_XREG; the same values as a copy), else prepared by the block in shared memory
 * (amk_frow_make: normalised, or copied) and read from there. */
template <int U>
__device__ __forceinline__ amk_pre_x<U> amk_pre_row(const amk_task_ctx& ctx, const amk_buffer_t* x,
                                                    const amk_buffer_t* nw, long long K, float eps,
                                                    const amk_norm_pre& np) {
  amk_pre_x<U> r;
  r.bf = AMK_BF_OF(x->dtype);
  if (AMK_PRE_XREG && !nw) {
    amk_pre_ld<U>(x->ptr, K >> 3, r.q);
#if !AMK_TRACE_OFF
    if (ctx.trace && threadIdx.x == 0) ctx.trace[4] = amk_globaltimer();
#endif
    return r;
  }
  amk_pre_ld<U>(amk_frow_make(ctx, x, nw, K, eps, &np).p, K >> 3, r.q);
  return r;
}

/* The pre path of a tile that prepares its row from x (normalised by nw, when given). */
template <int WK, int NR, int U = amk_pre_u<NR>::v, int PU = AMK_ROW_PRE_UNITS, typename Rows, typename Epi>
__device__ __forceinline__ void amk_pre_fast(const amk_task_ctx& ctx, const amk_buffer_t* x,
                                             const amk_buffer_t* nw, long long K, float eps,
                                             int n_units, Rows rows, Epi epi) {
  const amk_norm_pre np = amk_norm_pre_load(ctx, nw, K);
  amk_pre_run<WK, NR, U, PU>(ctx, K, n_units, [&] { return amk_pre_row<U>(ctx, x, nw, K, eps, np); },
                             rows, epi);
}
#endif

/* A fused tile from its wait on: waits for its counters (unless `waited`), prepares its row from x (normalised by
 * the norm weight nw, when given) and streams its units (amk_fused_run); with AMK_ROW_PRE, a tile
 * that amk_pre_ok accepts loads its weights before the wait. */
template <int NR, int P, typename Rows, typename Epi>
__device__ __forceinline__ void amk_fused_tile(const amk_task_ctx& ctx, bool waited, const amk_buffer_t* x,
                                               const amk_buffer_t* nw, long long K, float eps, int wdt,
                                               bool w_al16, int n_units, Rows rows, Epi epi) {
#if AMK_ROW_PRE
  if (!waited && amk_pre_ok<NR>(ctx, x, nw, K, wdt, w_al16, n_units)) {
    if constexpr (AMK_FUSED_HAS(AMK_TILE_W_BF16, 1)) {
      if (wdt == AMK_BF16) { amk_pre_fast<AMK_TILE_W_BF16, NR>(ctx, x, nw, K, eps, n_units, rows, epi); return; }
    }
    if constexpr (AMK_FUSED_HAS(AMK_TILE_W_F16, 1)) {
      if (wdt == AMK_F16) { amk_pre_fast<AMK_TILE_W_F16, NR>(ctx, x, nw, K, eps, n_units, rows, epi); return; }
    }
  }
#endif
  const amk_norm_pre np = amk_norm_pre_load(ctx, waited ? nullptr : nw, K);
  if (!waited && !amk_task_wait(ctx)) return;
  const amk_frow r = amk_frow_make(ctx, x, nw, K, eps, &np);
  amk_fused_run<NR, P>(r, K, wdt, w_al16, n_units, rows, epi);
}

/* AMK_ROW_PAIRS: device knob, defined with its default in amk_knobs.cuh. */

/* A one-row projection tile that prepares its row from x (GEMV_TILE's one-row path,
 * RMSNORM_GEMV), from its wait on. */
__device__ __forceinline__ void amk_row_tile(const amk_task_ctx& ctx, const amk_buffer_t* x,
                                             const amk_buffer_t* nw, long long K, float eps,
                                             const amk_buffer_t* w, bool w_al16, int n_tile, int n_off,
                                             const amk_buffer_t* y, const amk_buffer_t* bias) {
#if AMK_ROW_PRE
  /* AMK_ROW_PAIRS: on the pre path, two consecutive rows a unit (an even tile): a warp's two
     rows share each vector of the row and their two warp sums overlap, where two units of one
     row ran one after the other (SmolLM2's o_proj and down: -0.045 ms a token, docs/perf-notes.md
     round 22); each row's sum is the same, in the same order. Lanes 0 and 1 store one row each. */
  const int pairs = n_tile >> 1;
  const bool shrt = amk_pre_ok<2>(ctx, x, nw, K, w->dtype, w_al16, pairs);
  if (AMK_ROW_PAIRS && (n_tile & 1) == 0 && (shrt || amk_pre_ok<2, 6, 1>(ctx, x, nw, K, w->dtype, w_al16, pairs))) {
    const auto rows = [=](int j, const amk_buffer_t* (&wb)[2], long long (&row)[2]) {
      wb[0] = wb[1] = w;
      row[0] = n_off + 2LL * j;
      row[1] = row[0] + 1;
    };
    const auto epi = [=](int j, const float (&s)[2]) {
      const int lane = threadIdx.x & 31;
      if (lane < 2) {
        const long long c = n_off + 2LL * j + lane;
        amk_stf(y, c, (lane ? s[1] : s[0]) + (bias ? amk_ldf(bias, c) : 0.0f));
      }
    };
    /* rows of one pass at amk_pre_u (3 units a warp), or up to 6 vectors a lane (one unit) */
    if constexpr (AMK_FUSED_HAS(AMK_TILE_W_BF16, 1)) {
      if (w->dtype == AMK_BF16) {
        if (shrt) amk_pre_fast<AMK_TILE_W_BF16, 2>(ctx, x, nw, K, eps, pairs, rows, epi);
        else amk_pre_fast<AMK_TILE_W_BF16, 2, 6, 1>(ctx, x, nw, K, eps, pairs, rows, epi);
        return;
      }
    }
    if constexpr (AMK_FUSED_HAS(AMK_TILE_W_F16, 1)) {
      if (w->dtype == AMK_F16) {
        if (shrt) amk_pre_fast<AMK_TILE_W_F16, 2>(ctx, x, nw, K, eps, pairs, rows, epi);
        else amk_pre_fast<AMK_TILE_W_F16, 2, 6, 1>(ctx, x, nw, K, eps, pairs, rows, epi);
        return;
      }
    }
  }
#endif
  amk_fused_tile<1, AMK_FUSED_PAIR_OF(1)>(ctx, false, x, nw, K, eps, w->dtype, w_al16, n_tile,
                                          amk_row_tile_rows(w, n_off), amk_row_tile_epi(y, bias, n_off));
}

/* The tile's arguments from its descriptors and params (block-uniform). CHECK: also what the
 * CPU reference checks at run time, each failure failing the task (false); !CHECK: the same
 * arguments with no check, for a task amk_verify_tasks passed (straight-line code: the late
 * tile of a phase runs this between its previous tile and its wait). `gemm`: GEMM_TILE's row
 * range from M_tile / m_off. */
template <bool CHECK>
__device__ __forceinline__ bool amk_tile_setup(const amk_task_ctx& ctx, bool gemm, amk_tile_args& a) {
  const amk_params_t& p = ctx.inst->params;
  const int nin = ctx.inst->n_inputs;
  AMK_CHECK(nin >= 2 && nin <= 4 && ctx.inst->n_outputs >= 1, AMK_ERR_SHAPE, nin);
  a.xb = amk_in(ctx, 0);
  a.wb = amk_in(ctx, 1);
  a.ob = amk_out(ctx, 0);
  a.bias = nullptr;
  a.scales = nullptr;
  a.zeros = nullptr;
  a.pol = amk_weight_policy(ctx.prog->flags);
  a.K = p.K;
  a.n_tile = p.N_tile;
  a.n_off = p.n_off;
  AMK_CHECK(a.K > 0, AMK_ERR_PARAM, a.K);
  AMK_CHECK(a.n_tile > 0, AMK_ERR_PARAM, a.n_tile);
  AMK_CHECK(a.n_off >= 0, AMK_ERR_PARAM, a.n_off);
  const int xdt = a.xb->dtype, wdt = a.wb->dtype;
  AMK_CHECK(amk_last_dim(a.wb) == a.K && amk_last_dim(a.xb) == a.K, AMK_ERR_SHAPE, a.K);
  AMK_CHECK(amk_is_float(xdt), AMK_ERR_DTYPE, xdt);
  const long long n = amk_udiv(a.wb->numel, a.K), m = amk_udiv(a.xb->numel, a.K);
  const bool quant = amk_has(p, AMK_P_QDTYPE);
  a.offset = 0.0f;
  a.group = a.K;
  a.vpg = 1;
  a.vpg_shift = 0;
  a.n_groups = 1;
  if (!quant) {
    AMK_CHECK(nin != 4, AMK_ERR_SHAPE, nin);
    AMK_CHECK(amk_is_float(wdt), AMK_ERR_DTYPE, wdt);
    if (nin == 3) {
      a.bias = amk_in(ctx, 2);
      AMK_CHECK(amk_is_float(a.bias->dtype), AMK_ERR_DTYPE, a.bias->dtype);
      AMK_CHECK(a.bias->numel == n, AMK_ERR_SHAPE, a.bias->numel);
    }
    a.wk = wdt == AMK_F32 ? AMK_TILE_W_F32 : wdt == AMK_F16 ? AMK_TILE_W_F16 : wdt == AMK_BF16 ? AMK_TILE_W_BF16 : -1;
  } else {
    const int qd = p.qdtype;
    AMK_CHECK(qd == 6 || qd == 7, AMK_ERR_PARAM, qd);
    AMK_CHECK(nin >= 3, AMK_ERR_SHAPE, nin);
    const bool asym = nin == 4;
    const int want = qd == 7 ? AMK_I4 : (asym ? AMK_U8 : AMK_I8);
    AMK_CHECK(wdt == want, AMK_ERR_DTYPE, wdt);
    if (amk_has(p, AMK_P_GROUP)) {
      AMK_CHECK(p.group > 0, AMK_ERR_PARAM, p.group);
      a.group = p.group;
    }
    a.n_groups = (a.K + a.group - 1) / a.group;
    a.scales = amk_in(ctx, 2);
    a.zeros = asym ? amk_in(ctx, 3) : nullptr;
    for (int i = 0; i < 2; ++i) {
      const amk_buffer_t* t = i == 0 ? a.scales : a.zeros;
      if (!t) continue;
      AMK_CHECK(amk_is_float(t->dtype), AMK_ERR_DTYPE, t->dtype);
      AMK_CHECK(t->numel == n * a.n_groups, AMK_ERR_SHAPE, t->numel);
    }
    a.offset = qd == 7 ? 8.0f : 0.0f;
    a.wk = qd == 7 ? AMK_TILE_W_I4 : (asym ? AMK_TILE_W_U8 : AMK_TILE_W_I8);
  }
  AMK_CHECK((long long)a.n_off + a.n_tile <= n, AMK_ERR_SHAPE, (long long)a.n_off + a.n_tile);
  AMK_CHECK(amk_is_float(a.ob->dtype), AMK_ERR_DTYPE, a.ob->dtype);
  a.ldo = amk_last_dim(a.ob);
  AMK_CHECK((long long)a.n_off + a.n_tile <= a.ldo && a.ldo > 0 && amk_udiv(a.ob->numel, a.ldo) == m,
            AMK_ERR_SHAPE, a.ldo);
  a.m0 = 0;
  a.m_rows = (int)m;
  if (gemm) {
    const int mt = p.M_tile;
    AMK_CHECK(mt > 0, AMK_ERR_PARAM, mt);
    const bool has_off = amk_has(p, AMK_P_M_OFF);
    const int mo = has_off ? p.m_off : 0;
    AMK_CHECK(mo >= 0, AMK_ERR_PARAM, mo);
    AMK_CHECK((long long)mo + mt <= m, AMK_ERR_SHAPE, (long long)mo + mt);
    if (has_off) {
      a.m0 = mo;
      a.m_rows = mt;
    }
  }
  a.x = a.xb->ptr;
  a.w = a.wb->ptr;
  a.wrow_bytes = a.wk == AMK_TILE_W_I4 ? (long long)(a.K + 1) / 2
               : (long long)a.K * (a.wk == AMK_TILE_W_F32 ? 4 : (a.wk == AMK_TILE_W_F16 || a.wk == AMK_TILE_W_BF16) ? 2 : 1);
  return true;
}

/* amk_tile_setup<true> out of line: the checks run only for a task amk_verify_tasks has not
 * passed (and in amk_verify_tasks itself). */
__device__ __noinline__ bool amk_tile_check(const amk_task_ctx& ctx, bool gemm) {
  amk_tile_args a;
  return amk_tile_setup<true>(ctx, gemm, a);
}

/* Checks the tile unless amk_verify_tasks passed it (ctx.verify), waits for the task's counters
 * (GEMV_TILE and GEMM_TILE wait themselves), then computes rows [m0, m0 + m_rows) of the tile.
 * `gemm`: GEMM_TILE's row range from M_tile / m_off. */
template <int MAXR, int UNROLL>
__device__ __forceinline__ void amk_tile_run(const amk_task_ctx& ctx, bool gemm) {
  if (ctx.verify && !amk_tile_check(ctx, gemm)) return;
  amk_tile_args a;
  amk_tile_setup<false>(ctx, gemm, a);
  const int xdt = a.xb->dtype, wdt = a.wb->dtype;

  bool fast = a.wk >= 0 && (xdt == AMK_F32 || xdt == AMK_F16 || xdt == AMK_BF16) &&
              (((unsigned long long)a.x | (unsigned long long)a.w) & 15ull) == 0;
  if (fast) {
    const int ve = amk_tile_ve_of(a.wk);
    fast = a.K % ve == 0;
    if (fast && a.wk >= AMK_TILE_W_I8) {
      fast = a.group % ve == 0;
      a.vpg = a.group / ve;
      a.vpg_shift = (a.vpg & (a.vpg - 1)) == 0 ? __ffs(a.vpg) - 1 : -1;
    }
  }
  if (fast && MAXR == 1 && a.m_rows == 1 && a.wk <= AMK_TILE_W_BF16) {
    /* One row of x, float weights (every decode projection): the fused tiles' streaming loop,
       same sums in the same order. It keeps its operands in registers, so it stays fast when
       a launch reserves shared memory (which shrinks the L1 cache that amk_tile_fast's
       arguments live in; docs/perf-notes.md round 4). */
    amk_row_tile(ctx, a.xb, nullptr, a.K, 0.0f, a.wb, true, a.n_tile, a.n_off, a.ob, a.bias);
    return;
  }
  /* Everything above read descriptors and params only: the data waits from here. */
  if (!amk_task_wait(ctx)) return;
  if (!fast) {
    amk_tile_generic<MAXR>(a);
    return;
  }
  switch (a.wk) {
    case AMK_TILE_W_F32: amk_tile_fast_x<AMK_TILE_W_F32, MAXR, UNROLL>(a, xdt); break;
    case AMK_TILE_W_F16: amk_tile_fast_x<AMK_TILE_W_F16, MAXR, UNROLL>(a, xdt); break;
    case AMK_TILE_W_BF16: amk_tile_fast_x<AMK_TILE_W_BF16, MAXR, UNROLL>(a, xdt); break;
#if !AMK_TILE_QUANT_OFF
    case AMK_TILE_W_I8: amk_tile_fast_x<AMK_TILE_W_I8, MAXR, UNROLL>(a, xdt); break;
    case AMK_TILE_W_U8: amk_tile_fast_x<AMK_TILE_W_U8, MAXR, UNROLL>(a, xdt); break;
    default: amk_tile_fast_x<AMK_TILE_W_I4, MAXR, UNROLL>(a, xdt); break;
#else
    /* AMK_TILE_QUANT_OFF: the program holds no quantised buffer (the backend defines it), so
       the quantised loops are left out; the generic loop computes any that comes anyway. */
    default: amk_tile_generic<MAXR>(a); break;
#endif
  }
}


#endif /* AMK_TILE_CUH */
