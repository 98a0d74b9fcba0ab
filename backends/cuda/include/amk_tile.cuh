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

#ifndef AMK_TILE_PF_AHEAD
#define AMK_TILE_PF_AHEAD (128 * 1024) /* bytes of weights a block keeps prefetched ahead */
#endif

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
  bool pf;              /* prefetch rows ahead (the program has prefetch ranges) */
  int group;
  int vpg, vpg_shift;   /* 16-byte vectors per group (fast quant path); shift if a power of 2, else -1 */
  float offset;         /* subtracted without zeros: 8 (int4) or 0 (int8) */
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

/* One 16-byte weight vector: coherent global load, not kept in L1 (x stays there), with an
 * L2 prefetch hint for the rest of the row. */
__device__ __forceinline__ uint4 amk_tile_ldw(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
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
  constexpr int VE = amk_tile_ve<WK>::v;
  constexpr bool QUANT = WK >= AMK_TILE_W_I8;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int nvec = a.K / VE;
  const bool bf = a.xb->dtype == AMK_BF16;
  /* L2 prefetch distance, in rows per warp: AMK_TILE_PF_AHEAD bytes ahead of the block's
     consumption. The scheduler prefetched the tile's first AMK_PF_FIRST bytes before the
     wait; rows past them are pulled in this far ahead, so the 16-byte loads below hit L2
     and the bytes in flight do not depend on registers. */
  const int pf_rows = max(1, (int)(AMK_TILE_PF_AHEAD / ((long long)AMK_WARPS * a.wrow_bytes)));
  for (int j = warp; j < a.n_tile; j += AMK_WARPS) {
    const int n = a.n_off + j;
    const uint4* wrow = (const uint4*)((const unsigned char*)a.w + (long long)n * a.wrow_bytes);
    const int jp = j + pf_rows * AMK_WARPS;
    if (a.pf && jp < a.n_tile && (long long)jp * a.wrow_bytes >= AMK_PF_FIRST) {
      const unsigned char* prow = (const unsigned char*)a.w + (long long)(a.n_off + jp) * a.wrow_bytes;
      for (long long o = (long long)lane * 128; o < a.wrow_bytes; o += 32 * 128) amk_prefetch_l2(prow + o);
    }
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
          if (v < nvec) wv[u] = amk_tile_ldw(wrow + v);
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

/* Validates what the CPU reference checks at run time (cheap, block-uniform), then computes
 * rows [m0, m0 + m_rows) of the tile. `gemm`: GEMM_TILE's row range from M_tile / m_off. */
template <int MAXR, int UNROLL>
__device__ __forceinline__ void amk_tile_run(const amk_task_ctx& ctx, bool gemm) {
  const amk_params_t& p = ctx.inst->params;
  const int nin = ctx.inst->n_inputs;
  if (nin < 2 || nin > 4 || ctx.inst->n_outputs < 1) {
    amk_fail(ctx, AMK_ERR_SHAPE, nin);
    return;
  }
  amk_tile_args a;
  a.xb = amk_in(ctx, 0);
  a.wb = amk_in(ctx, 1);
  a.ob = amk_out(ctx, 0);
  a.bias = nullptr;
  a.scales = nullptr;
  a.zeros = nullptr;
  a.K = p.K;
  a.n_tile = p.N_tile;
  a.n_off = p.n_off;
  if (a.K <= 0) { amk_fail(ctx, AMK_ERR_PARAM, a.K); return; }
  if (a.n_tile <= 0) { amk_fail(ctx, AMK_ERR_PARAM, a.n_tile); return; }
  if (a.n_off < 0) { amk_fail(ctx, AMK_ERR_PARAM, a.n_off); return; }
  const int xdt = a.xb->dtype, wdt = a.wb->dtype;
  if (amk_last_dim(a.wb) != a.K || amk_last_dim(a.xb) != a.K) {
    amk_fail(ctx, AMK_ERR_SHAPE, a.K);
    return;
  }
  if (!amk_is_float(xdt)) { amk_fail(ctx, AMK_ERR_DTYPE, xdt); return; }
  const long long n = a.wb->numel / a.K, m = a.xb->numel / a.K;
  const bool quant = amk_has(p, AMK_P_QDTYPE);
  a.offset = 0.0f;
  a.group = a.K;
  a.vpg = 1;
  a.vpg_shift = 0;
  a.n_groups = 1;
  if (!quant) {
    if (nin == 4) { amk_fail(ctx, AMK_ERR_SHAPE, nin); return; }
    if (!amk_is_float(wdt)) { amk_fail(ctx, AMK_ERR_DTYPE, wdt); return; }
    if (nin == 3) {
      a.bias = amk_in(ctx, 2);
      if (!amk_is_float(a.bias->dtype)) { amk_fail(ctx, AMK_ERR_DTYPE, a.bias->dtype); return; }
      if (a.bias->numel != n) { amk_fail(ctx, AMK_ERR_SHAPE, a.bias->numel); return; }
    }
    a.wk = wdt == AMK_F32 ? AMK_TILE_W_F32 : wdt == AMK_F16 ? AMK_TILE_W_F16 : wdt == AMK_BF16 ? AMK_TILE_W_BF16 : -1;
  } else {
    const int qd = p.qdtype;
    if (qd != 6 && qd != 7) { amk_fail(ctx, AMK_ERR_PARAM, qd); return; }
    if (nin < 3) { amk_fail(ctx, AMK_ERR_SHAPE, nin); return; }
    const bool asym = nin == 4;
    const int want = qd == 7 ? AMK_I4 : (asym ? AMK_U8 : AMK_I8);
    if (wdt != want) { amk_fail(ctx, AMK_ERR_DTYPE, wdt); return; }
    if (amk_has(p, AMK_P_GROUP)) {
      if (p.group <= 0) { amk_fail(ctx, AMK_ERR_PARAM, p.group); return; }
      a.group = p.group;
    }
    a.n_groups = (a.K + a.group - 1) / a.group;
    a.scales = amk_in(ctx, 2);
    a.zeros = asym ? amk_in(ctx, 3) : nullptr;
    for (int i = 0; i < 2; ++i) {
      const amk_buffer_t* t = i == 0 ? a.scales : a.zeros;
      if (!t) continue;
      if (!amk_is_float(t->dtype)) { amk_fail(ctx, AMK_ERR_DTYPE, t->dtype); return; }
      if (t->numel != n * a.n_groups) { amk_fail(ctx, AMK_ERR_SHAPE, t->numel); return; }
    }
    a.offset = qd == 7 ? 8.0f : 0.0f;
    a.wk = qd == 7 ? AMK_TILE_W_I4 : (asym ? AMK_TILE_W_U8 : AMK_TILE_W_I8);
  }
  if ((long long)a.n_off + a.n_tile > n) { amk_fail(ctx, AMK_ERR_SHAPE, (long long)a.n_off + a.n_tile); return; }
  if (!amk_is_float(a.ob->dtype)) { amk_fail(ctx, AMK_ERR_DTYPE, a.ob->dtype); return; }
  a.ldo = amk_last_dim(a.ob);
  if ((long long)a.n_off + a.n_tile > a.ldo || a.ldo <= 0 || a.ob->numel / a.ldo != m) {
    amk_fail(ctx, AMK_ERR_SHAPE, a.ldo);
    return;
  }
  a.m0 = 0;
  a.m_rows = (int)m;
  if (gemm) {
    const int mt = p.M_tile;
    if (mt <= 0) { amk_fail(ctx, AMK_ERR_PARAM, mt); return; }
    const bool has_off = amk_has(p, AMK_P_M_OFF);
    const int mo = has_off ? p.m_off : 0;
    if (mo < 0) { amk_fail(ctx, AMK_ERR_PARAM, mo); return; }
    if ((long long)mo + mt > m) { amk_fail(ctx, AMK_ERR_SHAPE, (long long)mo + mt); return; }
    if (has_off) {
      a.m0 = mo;
      a.m_rows = mt;
    }
  }
  a.x = a.xb->ptr;
  a.w = a.wb->ptr;
  a.pf = ctx.prog->prefetch != nullptr;
  a.wrow_bytes = a.wk == AMK_TILE_W_I4 ? (long long)(a.K + 1) / 2
               : (long long)a.K * (a.wk == AMK_TILE_W_F32 ? 4 : (a.wk == AMK_TILE_W_F16 || a.wk == AMK_TILE_W_BF16) ? 2 : 1);

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
  if (!fast) {
    amk_tile_generic<MAXR>(a);
    return;
  }
  switch (a.wk) {
    case AMK_TILE_W_F32: amk_tile_fast_x<AMK_TILE_W_F32, MAXR, UNROLL>(a, xdt); break;
    case AMK_TILE_W_F16: amk_tile_fast_x<AMK_TILE_W_F16, MAXR, UNROLL>(a, xdt); break;
    case AMK_TILE_W_BF16: amk_tile_fast_x<AMK_TILE_W_BF16, MAXR, UNROLL>(a, xdt); break;
    case AMK_TILE_W_I8: amk_tile_fast_x<AMK_TILE_W_I8, MAXR, UNROLL>(a, xdt); break;
    case AMK_TILE_W_U8: amk_tile_fast_x<AMK_TILE_W_U8, MAXR, UNROLL>(a, xdt); break;
    default: amk_tile_fast_x<AMK_TILE_W_I4, MAXR, UNROLL>(a, xdt); break;
  }
}

#endif /* AMK_TILE_CUH */
