/* LINEAR_TILE (code 27): rows [m_off, m_off + M_tile) x columns [n_off, n_off + N_tile) of
 * y = x . W^T over many rows of x, optionally RMS-normalised first (ext[0] norm = 1, input 2 the
 * weight, param eps), plus a bias of W's rows (flags bit 0; the next input), with epilogue
 * ext[1]: 0 none, 1 residual (y = round(s) + r, r the next input, shaped like y), 2 SwiGLU
 * (y = silu(round(s)) * round(x . U^T), U the next input), 3 RoPE (y = rope(round(s)) at
 * pos[row], the positions the next input, then with ext[2] rope_factors = 1 the divisors).
 * Mirrors ops/linear-tile/src/reference.rs; `round` is the output dtype's rounding.
 *
 * The task walks its tile in device tiles of LT_BM rows x LT_BN columns (LT_BN / 2 output
 * columns with SwiGLU, whose tile holds the gate's columns in its first half and the up
 * projection's in its second). On the tensor-core path a row block with more than LT_BM rows
 * left takes LT_BM2 rows at once: each K step's weight tile then feeds twice the rows, which
 * halves the weight bytes a FLOP reads from L2 (the K loop of 64-row tiles streams about as
 * many bytes as L2 delivers when every SM runs one; docs/perf-notes.md round 37). Every output
 * element's sum is the same sequence of mma steps in either size: the same values, to the bit.
 *
 * Tensor-core path (x, W and U all BF16 or all F16, K % 8 == 0, 16-byte aligned): K in steps
 * of LT_BK through an LT_STAGES-deep cp.async pipeline of A (rows of x) and B (weight rows),
 * both XOR-swizzled by 16-byte chunk so ldmatrix reads conflict-free. With a norm, each
 * thread normalises its own landed A chunk in shared memory (x * inv * w, rounded to x's
 * dtype: the value an RMSNORM task would store), the norm weight staged once as f32. 8 warps
 * as 2 (rows) x 4 (columns), each BM / 2 x 32 of the tile: BM / 32 x 4 mma.sync.m16n8k16 per 16 of K,
 * f32 accumulators. The accumulators go through shared memory (f32, LT_LD a row) to the
 * epilogue, which stores coalesced. The output is viewed as [rows of x, width]. On sm_90a
 * (AMK_LT_WGMMA) the same stages feed wgmma instead of ldmatrix + mma.sync, a warpgroup per 64
 * rows or columns, and a task of more than LT_BM2 rows without a norm may take LT_BM4 rows at
 * once (AMK_LT_256): see "The Hopper path" below.
 *
 * Any other dtype mix (f32 programs), or a block of other than 8 warps: each thread sums its
 * outputs' products in f32 in K order (no TF32), the same epilogue. Slow; it keeps f32 programs
 * within rounding of the reference.
 *
 * Row scales of the norm: one warp a row (two rows at a time on the tensor-core path), the sum
 * of squares in amk_norm_t, as RMSNORM.
 *
 * Probes (traced kernel; the last device tile's stamps win): 0 checked and staged, 4 a row
 * block begins (its scales done on the generic path; the tensor-core tiles work them out after
 * issuing their first copies, so probe 1 includes them), 1 the first K step landed, 2 the K
 * loop done, 5 the sums in shared memory, 3 the epilogue stored. */

#define LT_BM 64
#define LT_BM2 128 /* the tensor-core path's wide row block */
#define LT_BM4 256 /* the wgmma path's widest row block (AMK_LT_256) */
#define LT_BN 128
#define LT_BK 64
#define LT_LD (LT_BN + 4)
/* Pipeline depth; a build may raise it (AMK_CUDA_DEFINES=LT_STAGES=N) when the program's block
 * reserves the shared memory it takes (AMK_CUDA_SMEM_KB). */
#ifndef LT_STAGES
#define LT_STAGES 4
#endif
#define LT_A_BYTES (LT_BM * LT_BK * 2)
#define LT_STAGE (LT_A_BYTES + LT_BN * LT_BK * 2)
/* Shared memory: the stages (or, after the K loop, the f32 tile), then the row scales (LT_BM2
 * of them), the RoPE pair frequencies (LT_BN / 2 floats), then the norm weight as f32 (K at
 * most LT_KMAX). The wide row block's stages share the same bytes: as many as fit, at most
 * LT_STAGES (lt_dims). */
#define LT_TILE_BYTES (LT_STAGES * LT_STAGE > LT_BM * LT_LD * 4 ? LT_STAGES * LT_STAGE : LT_BM * LT_LD * 4)
#define LT_KMAX 8192

struct lt_args {
  const amk_buffer_t* x;
  const amk_buffer_t* w;
  const amk_buffer_t* nw;  /* norm weight or null */
  const amk_buffer_t* bias; /* bias of W's rows or null */
  const amk_buffer_t* ex;  /* residual, up weight or positions, or null */
  const amk_buffer_t* fac; /* RoPE frequency divisors or null */
  const amk_buffer_t* y;
  long long K, width;
  long long m_end, n_end;
  int epi, hd;
  bool vec_out; /* y (and a residual) take 8 elements a 16-byte access */
  float eps;
};

/* 1 / rms of rows m0 .. m0 + LT_BM - 1 (those below m_end) into rinv: a warp a row, 8
 * elements a 16-byte load where the row allows. */
__device__ __forceinline__ void lt_row_scales(const lt_args& a, long long m0, amk_norm_t* rinv) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int dt = a.x->dtype;
  const bool vec = (dt == AMK_F32 || dt == AMK_BF16 || dt == AMK_F16) && a.K % 8 == 0 &&
                   ((unsigned long long)a.x->ptr & 15) == 0;
  for (int r = warp; r < LT_BM; r += AMK_WARPS) {
    const long long m = m0 + r;
    if (m >= a.m_end) break;
    amk_norm_t s = (amk_norm_t)0;
    if (vec) {
      const long long base = (m * a.K) >> 3;
#pragma unroll 4
      for (long long u = lane; u < (a.K >> 3); u += 32) {
        float f[8];
        amk_ld8(a.x->ptr, dt, base + u, f);
#pragma unroll
        for (int e = 0; e < 8; ++e) s = amk_rms_sq(s, f[e]);
      }
    } else {
      for (long long k = lane; k < a.K; k += 32) s = amk_rms_sq(s, amk_ldf(a.x, m * a.K + k));
    }
    s = amk_warp_reduce<amk_norm_t, false>(s);
    if (lane == 0) rinv[r] = amk_rms_inv(s, a.K, a.eps);
  }
}

/* lt_row_scales for the tensor-core path (x BF16 or F16, 16-byte aligned, K % 8 == 0): each
 * warp takes two rows at a time (r and r + AMK_WARPS) and issues all its loads of 256 columns
 * of both (16 vectors a lane) before it sums any, so a task's 64 rows cost about four L2 round
 * trips for K up to 2048 instead of sixteen. Each row's sum keeps lt_row_scales' order
 * (lane-strided vectors in order, then the warp's reduction): the same scales, to the bit. */
template <bool BF>
__device__ __forceinline__ void lt_row_scales16(const lt_args& a, long long m0, int bm,
                                                amk_norm_t* rinv) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int dt = BF ? AMK_BF16 : AMK_F16;
  const long long kv = a.K >> 3;
  const uint4* x = (const uint4*)a.x->ptr;
  for (int r = warp; r < bm; r += 2 * AMK_WARPS) {
    const int r2 = r + AMK_WARPS;
    const long long m = m0 + r, m2 = m0 + r2;
    if (m >= a.m_end) break;
    const bool two = r2 < bm && m2 < a.m_end;
    const uint4* x1 = x + m * kv;
    const uint4* x2 = x + (two ? m2 : m) * kv;
    amk_norm_t s = (amk_norm_t)0, s2 = (amk_norm_t)0;
    for (long long c = 0; c < kv; c += 8 * 32) {
      uint4 v1[8], v2[8];
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        const long long u = c + lane + q * 32;
        const bool ok = u < kv;
        v1[q] = ok ? x1[u] : make_uint4(0u, 0u, 0u, 0u);
        v2[q] = ok ? x2[u] : make_uint4(0u, 0u, 0u, 0u);
      }
#pragma unroll
      for (int q = 0; q < 8; ++q) {
        if (c + lane + q * 32 >= kv) break;
        float f[8], g[8];
        amk_cvt8<false>(dt, v1[q], v1[q], f);
        amk_cvt8<false>(dt, v2[q], v2[q], g);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          s = amk_rms_sq(s, f[e]);
          s2 = amk_rms_sq(s2, g[e]);
        }
      }
    }
    s = amk_warp_reduce<amk_norm_t, false>(s);
    s2 = amk_warp_reduce<amk_norm_t, false>(s2);
    if (lane == 0) {
      rinv[r] = amk_rms_inv(s, a.K, a.eps);
      if (two) rinv[r2] = amk_rms_inv(s2, a.K, a.eps);
    }
  }
}

/* One output element of the tile from its sums (s, and u with SwiGLU). */
__device__ __forceinline__ void lt_store(const lt_args& a, long long m, long long n, float s,
                                         float u) {
  const long long at = m * a.width + n;
  const int dt = a.y->dtype;
  float v = s;
  if (a.epi == 1) {
    v = amk_round_dt(dt, s) + amk_ldf(a.ex, at);
  } else if (a.epi == 2) {
    const float g = amk_round_dt(dt, s);
    v = g / (1.0f + expf(-g)) * amk_round_dt(dt, u);
  }
  amk_stf(a.y, at, v);
}

/* ---- the generic path ---- */

__device__ __forceinline__ float lt_xn(const lt_args& a, const amk_norm_t* rinv, int r, long long m,
                                       long long k) {
  const float v = amk_ldf(a.x, m * a.K + k);
  if (!a.nw) return v;
  return amk_round_dt(a.x->dtype, amk_rms_apply(v, rinv[r], amk_ldf(a.nw, k)));
}

/* The sums of the tile into `cs` (f32, LT_LD a row; the up projection's at column + cols). */
__device__ __noinline__ void lt_tile_generic(const lt_args& a, long long m0, long long c0,
                                             int cols, const amk_norm_t* rinv, float* cs) {
  for (int i = threadIdx.x; i < LT_BM * cols; i += AMK_THREADS) {
    const int r = i / cols, c = i % cols;
    const long long m = m0 + r, n = c0 + c;
    if (m >= a.m_end || n >= a.n_end) continue;
    float s = 0.f, u = 0.f;
    for (long long k = 0; k < a.K; ++k) {
      const float xv = lt_xn(a, rinv, r, m, k);
      s = fmaf(xv, amk_ldf(a.w, n * a.K + k), s);
      if (a.epi == 2) u = fmaf(xv, amk_ldf(a.ex, n * a.K + k), u);
    }
    cs[r * LT_LD + c] = s;
    if (a.epi == 2) cs[r * LT_LD + c + cols] = u;
  }
}

/* The RoPE epilogue: each (row, pair) of the tile's `bm` rows works out its angle's cosine and
 * sine once and turns that pair in every head of the tile, the pair's two sums rounded to y's
 * dtype (what a projection stores), rotated as ROPE does at the row's position. `fq` holds the
 * pair frequencies. The trigonometry (f64, as ROPE's) is worked out once a row and pair (not
 * once a head) from one argument reduction. What the loop reads of the op's arguments is
 * copied into registers first: a store through y's pointer could alias them, so the compiler
 * would otherwise re-read them (the descriptors among them) after every store. */
__device__ __forceinline__ void lt_rope_out(const lt_args& a, long long m0, long long c0, int cols,
                                            int bm, const float* cs, const float* fq) {
  const int hd = a.hd, half = hd >> 1, heads = cols / hd, dt = a.y->dtype;
  const long long m_end = a.m_end, n_end = a.n_end, width = a.width;
  const amk_buffer_t* pb = a.ex;
  const amk_buffer_t* yb = a.y;
  const int32_t* p32 = pb->dtype == AMK_I32 ? (const int32_t*)pb->ptr : nullptr;
  const bool bf = AMK_IS_BF16(dt), f16 = AMK_IS_F16(dt);
  uint16_t* y16 = bf || f16 ? (uint16_t*)yb->ptr : nullptr;
  for (int i = threadIdx.x; i < bm * half; i += AMK_THREADS) {
    const int r = i / half, k = i % half;
    const long long m = m0 + r;
    if (m >= m_end) continue;
    const long long pos = p32 ? (long long)p32[m] : amk_ldif(pb, m);
    float c, sn;
    amk_rope_sincos(__fmul_rn((float)pos, fq[k]), c, sn);
    for (int h = 0; h < heads; ++h) {
      const long long n = c0 + (long long)h * hd;
      if (n >= n_end) break;
      const float x1 = amk_round_dt(dt, cs[r * LT_LD + h * hd + k]);
      const float x2 = amk_round_dt(dt, cs[r * LT_LD + h * hd + k + half]);
      float ya, yv;
      amk_rope_pair(x1, x2, c, sn, ya, yv);
      const long long at = m * width + n + k;
      if (y16) {
        y16[at] = bf ? amk_f32_to_bf16(ya) : amk_f32_to_f16(ya);
        y16[at + half] = bf ? amk_f32_to_bf16(yv) : amk_f32_to_f16(yv);
      } else {
        amk_stf(yb, at, ya);
        amk_stf(yb, at + half, yv);
      }
    }
  }
}

/* The bias on W's columns of the tile in `cs` (GEMV_TILE's: after the sum, before any
 * rounding); a barrier follows in the caller. */
__device__ __forceinline__ void lt_add_bias(const lt_args& a, long long c0, int cols, int bm,
                                            float* cs) {
  for (int i = threadIdx.x; i < bm * cols; i += AMK_THREADS) {
    const int r = i / cols, c = i % cols;
    if (c0 + c < a.n_end) cs[r * LT_LD + c] += amk_ldf(a.bias, c0 + c);
  }
}

/* The epilogue of a device tile of `bm` rows whose sums are in `cs`: 8 consecutive columns a
 * unit, through 16-byte loads of the residual and stores of y where they fit. What the loop
 * reads of the op's arguments is copied into registers first (see lt_rope_out). */
__device__ __noinline__ void lt_epilogue(const lt_args& a, long long m0, long long c0, int cols,
                                         int bm, const float* cs, const float* fq) {
  if (a.epi == 3) {
    lt_rope_out(a, m0, c0, cols, bm, cs, fq);
    return;
  }
  const int epi = a.epi, dt = a.y->dtype, xdt = a.ex ? a.ex->dtype : 0;
  void* yp = a.y->ptr;
  const void* xp = a.ex ? a.ex->ptr : nullptr;
  const bool vec = a.vec_out;
  const long long m_end = a.m_end, n_end = a.n_end, width = a.width;
  const int cu = cols >> 3;
  for (int u = threadIdx.x; u < bm * cu; u += AMK_THREADS) {
    const int r = u / cu, c = (u % cu) * 8;
    const long long m = m0 + r, n = c0 + c;
    if (m >= m_end || n >= n_end) continue;
    const float* src = cs + r * LT_LD + c;
    if (vec && (n & 7) == 0 && n + 8 <= n_end) {
      const long long at = (m * width + n) >> 3;
      float v[8], rr[8];
      if (epi == 1) amk_ld8(xp, xdt, at, rr);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if (epi == 1) {
          v[e] = amk_round_dt(dt, src[e]) + rr[e];
        } else if (epi == 2) {
          const float g = amk_round_dt(dt, src[e]);
          v[e] = g / (1.0f + expf(-g)) * amk_round_dt(dt, src[e + cols]);
        } else {
          v[e] = src[e];
        }
      }
      amk_st8(yp, dt, at, v);
    } else {
      for (int e = 0; e < 8 && n + e < n_end; ++e)
        lt_store(a, m, n + e, src[e], epi == 2 ? src[e + cols] : 0.f);
    }
  }
}

/* ---- the tensor-core path ---- */

/* Byte offset of 16-byte chunk `ch` (0..7) of row `row` in a stage of 128-byte rows (LT_BK
 * 16-bit elements): the chunk XOR the row's low 3 bits, so the 8 rows an ldmatrix phase reads
 * at one logical chunk sit in 8 different bank groups. */
__device__ __forceinline__ uint32_t lt_swz(int row, int ch) {
  return (uint32_t)(row * (LT_BK * 2) + ((ch ^ (row & 7)) << 4));
}

/* The tensor-core tile's sizes for BM rows: its stage's A bytes, the stage, the pipeline depth
 * (as many stages as LT_TILE_BYTES holds, at most LT_STAGES), the m16 fragments a warp takes
 * (BM / 2 rows a warp: 2 warp rows of 4 warp columns). */
template <int BM>
struct lt_dims {
  static constexpr int A_BYTES = BM * LT_BK * 2;
  static constexpr int STAGE = A_BYTES + LT_BN * LT_BK * 2;
  static constexpr int FIT = LT_TILE_BYTES / STAGE;
  static constexpr int STAGES = FIT < LT_STAGES ? FIT : LT_STAGES;
  static constexpr int MI = BM / 32;
  static constexpr int ACH = BM * (LT_BK / 8) / AMK_THREADS;
};

/* What one thread copies and normalises in every K step of a tensor-core tile, worked out once
 * a tile so that the K loop runs on registers alone (no reloads of the op's arguments or of the
 * operands' descriptors after each copy's memory clobber). A thread owns ACH chunks of A
 * (rows of x) and LT_BCH chunks of B (weight rows, U's in SwiGLU's second half), all at the
 * same 16-byte chunk `ch` of the K step. */
#define LT_CPR (LT_BK / 8) /* 16-byte chunks a stage row */
#define LT_BCH (LT_BN * LT_CPR / AMK_THREADS)
template <int BM>
struct lt_plan {
  const uint16_t* a[lt_dims<BM>::ACH]; /* the chunk's source at k = ch * 8, or null outside the rows */
  const uint16_t* b[LT_BCH];
  const uint16_t* any;       /* a valid address for the zero-filled copies (they read nothing) */
  long long K;
  int ch;
  int row0;                  /* the first owned row of a stage; row q is row0 + q * rstep */
};
#define LT_RSTEP (AMK_THREADS / LT_CPR)

template <int BM>
__device__ __forceinline__ lt_plan<BM> lt_make_plan(const lt_args& a, long long m0, long long c0,
                                                    int half_cols) {
  lt_plan<BM> p;
  p.K = a.K;
  p.ch = threadIdx.x % LT_CPR;
  p.row0 = threadIdx.x / LT_CPR;
  const uint16_t* x = (const uint16_t*)a.x->ptr;
  p.any = x;
#pragma unroll
  for (int q = 0; q < lt_dims<BM>::ACH; ++q) {
    const int r = p.row0 + q * LT_RSTEP;
    const long long m = m0 + r;
    p.a[q] = m < a.m_end ? x + m * a.K + p.ch * 8 : nullptr;
  }
#pragma unroll
  for (int q = 0; q < LT_BCH; ++q) {
    const int row = p.row0 + q * LT_RSTEP;
    const bool up = a.epi == 2 && row >= half_cols;
    const long long n = c0 + (up ? row - half_cols : row);
    const uint16_t* src = (const uint16_t*)(up ? a.ex : a.w)->ptr;
    p.b[q] = n < a.n_end ? src + n * a.K + p.ch * 8 : nullptr;
  }
  return p;
}

/* Issues this thread's cp.async copies of the K step at k0 into the stage at `as` (A) and `bs`
 * (B), zero-filled outside the rows, the columns and K. */
template <int BM>
__device__ __forceinline__ void lt_load_stage(const lt_plan<BM>& p, long long k0, uint32_t as,
                                              uint32_t bs) {
  const bool kok = k0 + p.ch * 8 < p.K;
#pragma unroll
  for (int q = 0; q < lt_dims<BM>::ACH; ++q) {
    const bool ok = kok && p.a[q];
    amk_cp_async16_zfill(as + lt_swz(p.row0 + q * LT_RSTEP, p.ch), ok ? p.a[q] + k0 : p.any,
                         ok);
  }
#pragma unroll
  for (int q = 0; q < LT_BCH; ++q) {
    const bool ok = kok && p.b[q];
    amk_cp_async16_zfill(bs + lt_swz(p.row0 + q * LT_RSTEP, p.ch), ok ? p.b[q] + k0 : p.any,
                         ok);
  }
  amk_cp_async_commit();
}

/* The norm on this thread's landed A chunks of the K step at k0 (in place): x * inv * w,
 * rounded to x's dtype — what an RMSNORM task would store. `ws` holds the norm weight (f32). */
template <bool BF, int BM>
__device__ __forceinline__ void lt_norm_chunk(const lt_plan<BM>& p, long long k0,
                                              unsigned char* stage, const amk_norm_t* rinv,
                                              const float* ws) {
  const long long k = k0 + p.ch * 8;
  if (k >= p.K) return;
  const int dt = BF ? AMK_BF16 : AMK_F16;
#pragma unroll
  for (int q = 0; q < lt_dims<BM>::ACH; ++q) {
    if (!p.a[q]) continue;
    const int r = p.row0 + q * LT_RSTEP;
    uint4* c = (uint4*)(stage + lt_swz(r, p.ch));
    float f[8];
    const uint4 v = *c;
    amk_cvt8<false>(dt, v, v, f);
    const amk_norm_t inv = rinv[r];
#pragma unroll
    for (int e = 0; e < 8; ++e) f[e] = amk_rms_apply(f[e], inv, ws[k + e]);
    *c = amk_pack8(dt, f);
  }
}

/* The mma fragments of 16 of K (kk) for this warp's BM / 2 x 32: A rows wm * BM / 2 .., B rows
 * (the tile's columns) wn * 32 ... */
template <int BM>
__device__ __forceinline__ void lt_frags(uint32_t as, uint32_t bs, int wm, int wn, int kk,
                                         uint32_t (&af)[lt_dims<BM>::MI][4],
                                         uint32_t (&bf)[4][2]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < lt_dims<BM>::MI; ++i) {
    const int row = wm * (BM / 2) + i * 16 + (lane & 15);
    amk_ldmatrix_x4(as + lt_swz(row, kk * 2 + (lane >> 4)), af[i]);
  }
#pragma unroll
  for (int j = 0; j < 4; j += 2) {
    const int row = wn * 32 + (j + (lane >> 4)) * 8 + (lane & 7);
    uint32_t r[4];
    amk_ldmatrix_x4(bs + lt_swz(row, kk * 2 + ((lane >> 3) & 1)), r);
    bf[j][0] = r[0];
    bf[j][1] = r[1];
    bf[j + 1][0] = r[2];
    bf[j + 1][1] = r[3];
  }
}

/* The Hopper path (AMK_LT_WGMMA, compiled for sm_90a only): the same stages, read by wgmma
 * straight from shared memory instead of ldmatrix fragments. Each warpgroup (4 warps) takes
 * m64 x n of the tile: with BM = LT_BM2 rows warpgroup g the rows 64 g.. and all LT_BN columns,
 * with BM = LT_BM all the rows and the columns 64 g... A stage row is LT_BK 16-bit values (128
 * bytes) with its 16-byte chunks XOR-swizzled by row & 7 (lt_swz): the layout wgmma calls the
 * 128-byte swizzle, K-major, whose 8-row pattern (1,024 bytes) it finds from the address bits,
 * so every stage must start 1,024-byte aligned (AMK_SMEM_ALIGN). cp.async and the norm write
 * the stages through the generic proxy, wgmma reads them through the async one: each thread
 * fences its writes to that proxy before the barrier that publishes them. */
#if AMK_LT_WGMMA && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LT_WG 1
#else
#define LT_WG 0
#endif
/* 1: the 256-row tile on the wgmma path, for tasks of more than 128 rows without a norm;
 * otherwise such a task runs as 128-row blocks. The op asks for it in the kernels of programs
 * that hold such a task (lib.rs `task_defines`), 0 for the others: its 128 accumulators a
 * thread would weigh on every kernel. */
#ifndef AMK_LT_256
#define AMK_LT_256 0
#endif
/* The 256-row tile: two warpgroups of 128 rows, each two m64n128 wgmma a k16 into 128
 * accumulators a thread; two 48 KB stages in the same bytes; its f32 sums through shared memory
 * a warpgroup at a time (128 rows fit where 256 do not). Only for the kernels that ask for it,
 * and where two of its stages fit (not with LT_STAGES below 4). */
#define LT_WIDEST (LT_WG && AMK_LT_256 && LT_TILE_BYTES >= 2 * (LT_BM4 * LT_BK * 2 + LT_BN * LT_BK * 2))
#if LT_WG
static_assert(AMK_SMEM_ALIGN % 1024 == 0, "wgmma's 128-byte swizzle needs 1,024-byte aligned stages");
static_assert(LT_BK * 2 == 128 && LT_A_BYTES % 1024 == 0 && LT_STAGE % 1024 == 0 &&
                  (LT_BM2 * LT_BK * 2) % 1024 == 0, "stages of whole swizzle patterns");

/* The descriptor of a K-major operand at shared address `addr` (128-byte swizzle: the stride
 * between 8-row groups 1,024 bytes; the leading offset unused). */
__device__ __forceinline__ uint64_t lt_wg_desc(uint32_t addr) {
  return (uint64_t)((addr & 0x3FFFF) >> 4) | ((uint64_t)1 << 16) | ((uint64_t)(1024 >> 4) << 32) |
         ((uint64_t)1 << 62);
}

/* Keeps the compiler from moving the accumulators' reads and writes across the asynchronous
 * wgmma (their registers change between its issue and its wait). */
template <int N>
__device__ __forceinline__ void lt_wg_pin(float (&d)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

/* The accumulator operands of an m64nN wgmma (N / 2 registers a thread), for LT_WG_MMA. */
#define LT_WG_D32 "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define LT_WG_D64 LT_WG_D32, "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define LT_WG_R32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define LT_WG_R64 LT_WG_R32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
/* One m64nNk16 wgmma (A, B of type TY from descriptors da, db) into d, added to; A, B and S
 * number the operands after the N / 2 accumulators: the descriptors and scale-d (1). */
#define LT_WG_MMA(N, TY, R, D, A, B, S)                                                        \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #S ", 0;\n"                              \
               "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TY "." TY " {" R "}, %" #A    \
               ", %" #B ", p, 1, 1, 0, 0;\n}\n"                                                \
               : D                                                                           \
               : "l"(da), "l"(db), "r"(1))

/* One m64nNk16 wgmma of the warpgroup into its N / 2 accumulators (f32, added to): N = 64 or
 * 128, from the accumulators' count. */
template <bool BF, int R>
__device__ __forceinline__ void lt_wg_mma(float (&d)[R], uint64_t da, uint64_t db) {
  static_assert(R == 32 || R == 64, "m64n64 or m64n128");
  if constexpr (R == 32) {
    if (BF) LT_WG_MMA(64, "bf16", LT_WG_R32, LT_WG_D32, 32, 33, 34);
    else LT_WG_MMA(64, "f16", LT_WG_R32, LT_WG_D32, 32, 33, 34);
  } else {
    if (BF) LT_WG_MMA(128, "bf16", LT_WG_R64, LT_WG_D64, 64, 65, 66);
    else LT_WG_MMA(128, "f16", LT_WG_R64, LT_WG_D64, 64, 65, 66);
  }
}

/* The MMAs of one K step (LT_BK) of the stage at `as` / `bs` into this warpgroup's
 * accumulators, waited for: the stage is free again when it returns. */
template <bool BF, int BM, int N>
__device__ __forceinline__ void lt_wg_step(uint32_t as, uint32_t bs, float (&d)[N]) {
  const uint32_t g = threadIdx.x >> 7;
  lt_wg_pin(d);
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
  if constexpr (BM == LT_BM4) {
    /* Warpgroup g: rows 128 g.. as two m64 blocks, each into its half of the accumulators. */
    float(&d0)[N / 2] = *reinterpret_cast<float(*)[N / 2]>(&d[0]);
    float(&d1)[N / 2] = *reinterpret_cast<float(*)[N / 2]>(&d[N / 2]);
    const uint32_t a1 = as + g * 128 * LT_BK * 2;
#pragma unroll
    for (int kk = 0; kk < LT_BK / 16; ++kk) {
      lt_wg_mma<BF>(d0, lt_wg_desc(a1 + kk * 32), lt_wg_desc(bs + kk * 32));
      lt_wg_mma<BF>(d1, lt_wg_desc(a1 + 64 * LT_BK * 2 + kk * 32), lt_wg_desc(bs + kk * 32));
    }
  } else {
    const uint32_t a0 = as + (BM == LT_BM2 ? g * 64 * LT_BK * 2 : 0);
    const uint32_t b0 = bs + (BM == LT_BM2 ? 0 : g * 64 * LT_BK * 2);
#pragma unroll
    for (int kk = 0; kk < LT_BK / 16; ++kk) {
      lt_wg_mma<BF>(d, lt_wg_desc(a0 + kk * 32), lt_wg_desc(b0 + kk * 32));
    }
  }
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
  asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
  lt_wg_pin(d);
}
#endif

/* The tile is out of line (one copy of each instantiation — bf16 / f16 by 64 / 128 rows, and
 * 256 with AMK_LT_256 — for its callers), but on the wgmma path (sm_90a's default) it inlines
 * into the dispatcher and the dispatcher into the kernel's entry (AMK_DISPATCH_INLINE): wgmma
 * in a called function is serialized. */
#if LT_WG && AMK_DISPATCH_INLINE
#define LT_TILE_ATTR __forceinline__
#else
#define LT_TILE_ATTR __noinline__
#endif

/* Makes this thread's writes to the stages (cp.async, the norm) visible to wgmma's reads
 * after the next barrier; nothing on the ldmatrix path. */
__device__ __forceinline__ void lt_stage_fence() {
#if LT_WG
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

/* The K loop of a BM-row tensor-core tile into this warp's accumulators. `scales`: this tile is
 * its row block's first, so it works out the block's row scales into `rinv` (with the norm),
 * after issuing its first stages' copies so that their latency and the scales' overlap. */
template <bool BF, int BM>
__device__ __forceinline__ void lt_k_loop(const amk_task_ctx& ctx, const lt_args& a,
                                          const lt_plan<BM>& p, long long m0, amk_norm_t* rinv,
                                          const float* ws, unsigned char* smem, bool scales,
                                          float (&acc)[lt_dims<BM>::MI][4][4]) {
  typedef lt_dims<BM> D;
  const int warp = threadIdx.x >> 5;
  const int wm = warp >> 2, wn = warp & 3;
  (void)wm; /* the wgmma path takes its operands by warpgroup */
  (void)wn;
  const uint32_t s0 = (uint32_t)__cvta_generic_to_shared(smem);
  /* The 256-row tile runs only without a norm (its 256 rows' scales would not fit rinv). */
  const bool norm = BM != LT_BM4 && a.nw != nullptr;
  const int nk = (int)((p.K + LT_BK - 1) / LT_BK);
#pragma unroll
  for (int st = 0; st < D::STAGES - 1; ++st) {
    if (st < nk)
      lt_load_stage<BM>(p, (long long)st * LT_BK, s0 + st * D::STAGE,
                        s0 + st * D::STAGE + D::A_BYTES);
    else
      amk_cp_async_commit();
  }
  if (norm && scales) lt_row_scales16<BF>(a, m0, BM, rinv); /* published by the loop's first barrier */
  for (int kt = 0; kt < nk; ++kt) {
    const int st = kt % D::STAGES;
    const uint32_t as = s0 + st * D::STAGE, bs = as + D::A_BYTES;
    amk_cp_async_wait_group<D::STAGES - 2>();
    lt_stage_fence();
    __syncthreads(); /* stage kt landed for everyone; stage kt - 1 is consumed */
    if (kt == 0) amk_probe(ctx, 1); /* the first K step landed */
    if (norm) {
      lt_norm_chunk<BF, BM>(p, (long long)kt * LT_BK, smem + st * D::STAGE, rinv, ws);
      lt_stage_fence();
      __syncthreads();
    }
    {
      const int nx = kt + D::STAGES - 1, sn = nx % D::STAGES;
      if (nx < nk)
        lt_load_stage<BM>(p, (long long)nx * LT_BK, s0 + sn * D::STAGE,
                          s0 + sn * D::STAGE + D::A_BYTES);
      else
        amk_cp_async_commit();
    }
#if LT_WG
    lt_wg_step<BF, BM>(as, bs, reinterpret_cast<float(&)[D::MI * 16]>(acc));
#else
    /* Fragments double-buffered: 16 of K's ldmatrix issue before the previous 16's mma. */
    uint32_t af[2][D::MI][4], bf[2][4][2];
    lt_frags<BM>(as, bs, wm, wn, 0, af[0], bf[0]);
#pragma unroll
    for (int kk = 0; kk < LT_BK / 16; ++kk) {
      if (kk + 1 < LT_BK / 16)
        lt_frags<BM>(as, bs, wm, wn, kk + 1, af[(kk + 1) & 1], bf[(kk + 1) & 1]);
#pragma unroll
      for (int i = 0; i < D::MI; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j)
          amk_mma_16816<BF>(acc[i][j], af[kk & 1][i], bf[kk & 1][j][0], bf[kk & 1][j][1]);
    }
#endif
  }
  amk_cp_async_wait_all();
  __syncthreads(); /* every warp is past its last read of the stages */
}

#if LT_WG
/* A warp's share of the accumulators of one m64nN wgmma (d: NJ = N / 8 groups of four) into the
 * f32 tile: rows `row` and row + 8, two columns an n8 block from `cb`. */
template <int NJ>
__device__ __forceinline__ void lt_wg_store(float* cs, int row, int cb, const float* d) {
#pragma unroll
  for (int j = 0; j < NJ; ++j) {
    *(float2*)&cs[row * LT_LD + cb + 8 * j] = make_float2(d[4 * j], d[4 * j + 1]);
    *(float2*)&cs[(row + 8) * LT_LD + cb + 8 * j] = make_float2(d[4 * j + 2], d[4 * j + 3]);
  }
}
#endif

#if LT_WIDEST
/* The 256-row tile's sums, a warpgroup's 128 rows at a time (the f32 tile of 256 rows would not
 * fit the stages' bytes): into shared memory, the bias, the epilogue. Warp w of warpgroup g
 * holds rows 128 g + 64 s + 16 (w & 3) + lane / 4 (and 8 below) of the tile in d[64 s ..]. */
__device__ __forceinline__ void lt_wg_out_halves(const amk_task_ctx& ctx, const lt_args& a,
                                                 long long m0, long long c0, int cols, float* cs,
                                                 const float* fq, const float (&d)[128]) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int cb = (lane & 3) * 2;
  for (int h = 0; h < 2; ++h) {
    if ((warp >> 2) == h) {
#pragma unroll
      for (int s = 0; s < 2; ++s) lt_wg_store<16>(cs, 64 * s + 16 * (warp & 3) + (lane >> 2), cb, &d[64 * s]);
    }
    __syncthreads();
    if (h == 0) amk_probe(ctx, 5); /* the first half's sums in shared memory */
    if (a.bias) {
      lt_add_bias(a, c0, cols, LT_BM2, cs);
      __syncthreads();
    }
    lt_epilogue(a, m0 + h * LT_BM2, c0, cols, LT_BM2, cs, fq);
    __syncthreads();
  }
  amk_probe(ctx, 3); /* the epilogue stored */
}
#endif

/* One device tile of BM rows on the tensor cores: the K loop, the accumulators to shared memory
 * (f32, over the stages), the bias, the epilogue. */
template <bool BF, int BM>
__device__ LT_TILE_ATTR void lt_tile_mma(const amk_task_ctx& ctx, const lt_args& a, long long m0,
                                         long long c0, int cols, amk_norm_t* rinv,
                                         const float* ws, const float* fq, unsigned char* smem,
                                         bool scales) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int wm = warp >> 2, wn = warp & 3;
  const lt_plan<BM> p = lt_make_plan<BM>(a, m0, c0, cols);
  float acc[lt_dims<BM>::MI][4][4];
#pragma unroll
  for (int i = 0; i < lt_dims<BM>::MI; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
  lt_k_loop<BF, BM>(ctx, a, p, m0, rinv, ws, smem, scales, acc);
  amk_probe(ctx, 2); /* the K loop done */
  float* cs = (float*)smem;
#if LT_WIDEST
  if constexpr (BM == LT_BM4) {
    lt_wg_out_halves(ctx, a, m0, c0, cols, cs, fq,
                     reinterpret_cast<const float(&)[lt_dims<BM>::MI * 16]>(acc));
    return;
  }
#endif
#if LT_WG
  /* wgmma's m64 accumulators: warp w of warpgroup g holds rows 16 w + lane / 4 (and 8 below)
   * of its 64, two columns a n8 block. */
  {
    const float(&d)[lt_dims<BM>::MI * 16] = reinterpret_cast<const float(&)[lt_dims<BM>::MI * 16]>(acc);
    const int g = warp >> 2;
    const int row = (BM == LT_BM2 ? 64 * g : 0) + 16 * (warp & 3) + (lane >> 2);
    const int cb = (BM == LT_BM2 ? 0 : 64 * g) + (lane & 3) * 2;
    lt_wg_store<lt_dims<BM>::MI * 4>(cs, row, cb, d);
  }
  (void)wm;
  (void)wn;
#else
#pragma unroll
  for (int i = 0; i < lt_dims<BM>::MI; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int row = wm * (BM / 2) + i * 16 + (lane >> 2), col = wn * 32 + j * 8 + (lane & 3) * 2;
      *(float2*)&cs[row * LT_LD + col] = make_float2(acc[i][j][0], acc[i][j][1]);
      *(float2*)&cs[(row + 8) * LT_LD + col] = make_float2(acc[i][j][2], acc[i][j][3]);
    }
#endif
  __syncthreads();
  amk_probe(ctx, 5); /* the sums in shared memory */
  if (a.bias) {
    lt_add_bias(a, c0, cols, BM, cs);
    __syncthreads();
  }
  lt_epilogue(a, m0, c0, cols, BM, cs, fq);
  __syncthreads();
  amk_probe(ctx, 3); /* the epilogue stored */
}

/* The f32 tile of LT_BM2 rows, and the wide stages, fit the bytes of the 64-row ones. */
static_assert(LT_BM2 * LT_LD * 4 <= LT_TILE_BYTES, "wide f32 tile");
static_assert(lt_dims<LT_BM2>::STAGES >= 2, "wide pipeline");
#if LT_WIDEST
static_assert(lt_dims<LT_BM4>::STAGES >= 2 && LT_BM2 * LT_LD * 4 <= LT_TILE_BYTES,
              "widest pipeline, and its f32 sums a warpgroup at a time");
#endif

__device__ void amk_op_linear_tile(const amk_task_ctx& ctx) {
  const amk_params_t& p = ctx.inst->params;
  const int norm = p.ext[0], epi = p.ext[1];
  lt_args a;
  a.x = amk_in(ctx, 0);
  a.w = amk_in(ctx, 1);
  a.nw = norm ? amk_in(ctx, 2) : nullptr;
  const int has_bias = p.flags & 1;
  a.bias = has_bias ? amk_in(ctx, 2 + (norm ? 1 : 0)) : nullptr;
  const int extra = 2 + (norm ? 1 : 0) + has_bias;
  a.ex = epi ? amk_in(ctx, extra) : nullptr;
  a.fac = (epi == 3 && p.ext[2]) ? amk_in(ctx, extra + 1) : nullptr;
  a.y = amk_out(ctx, 0);
  a.K = p.K;
  a.epi = epi;
  a.hd = p.head_dim;
  a.eps = p.eps;
  a.m_end = (long long)p.m_off + p.M_tile;
  a.n_end = (long long)p.n_off + p.N_tile;
  const long long rows = a.K > 0 ? a.x->numel / a.K : 0;
  a.width = rows > 0 ? a.y->numel / rows : 0; /* the output viewed as [rows, width] */
  if (epi < 0 || epi > 3 || a.K <= 0 || a.width <= 0 || a.x->numel % a.K != 0 || a.w->numel % a.K != 0 ||
      a.y->numel % rows != 0 || (a.bias && a.bias->numel * a.K != a.w->numel) || a.m_end * a.K > a.x->numel || a.n_end * a.K > a.w->numel ||
      a.n_end > a.width || a.m_end * a.width > a.y->numel ||
      (epi == 3 && (a.hd <= 0 || a.hd > LT_BN || (a.hd & 1) || p.n_off % a.hd != 0 ||
                    p.N_tile % a.hd != 0 || a.ex->numel != rows))) {
    amk_fail(ctx, AMK_ERR_SHAPE, a.K);
    return;
  }
  const int dt = a.x->dtype;
  const bool half16 = dt == AMK_BF16 || dt == AMK_F16;
  const bool aligned = ((unsigned long long)a.x->ptr & 15) == 0 &&
                       ((unsigned long long)a.w->ptr & 15) == 0 &&
                       (epi != 2 || ((unsigned long long)a.ex->ptr & 15) == 0);
  /* The tensor-core tile is laid out for 8 warps (2 x 4, and its loads' per-thread counts). */
  const bool mma = AMK_THREADS == 256 && half16 && a.w->dtype == dt &&
                   (epi != 2 || a.ex->dtype == dt) && a.K % 8 == 0 && aligned;
  const int ydt = a.y->dtype;
  const bool fdt = ydt == AMK_F32 || ydt == AMK_BF16 || ydt == AMK_F16;
  a.vec_out = fdt && a.width % 8 == 0 && ((unsigned long long)a.y->ptr & 15) == 0 &&
              (epi != 1 || ((a.ex->dtype == AMK_F32 || a.ex->dtype == AMK_BF16 ||
                             a.ex->dtype == AMK_F16) &&
                            ((unsigned long long)a.ex->ptr & 15) == 0));
  /* Device tile columns: the gate's half with SwiGLU, whole heads with RoPE. */
  const int cols = epi == 2 ? LT_BN / 2 : epi == 3 ? (LT_BN / a.hd) * a.hd : LT_BN;
  amk_norm_t* rinv = (amk_norm_t*)(ctx.smem + LT_TILE_BYTES);
  float* fq = (float*)(ctx.smem + LT_TILE_BYTES + LT_BM2 * 8);
  float* ws = fq + LT_BN / 2;
  if (a.nw && mma) {
    if (a.K > LT_KMAX) { amk_fail(ctx, AMK_ERR_SHAPE, a.K); return; }
    /* 8 elements a 16-byte load (K % 8 == 0 on this path): one round trip for K up to 2048. */
    if (amk_is_vec(a.nw->dtype) && amk_al16(a.nw->ptr)) {
      for (long long u = threadIdx.x; u < (a.K >> 3); u += AMK_THREADS) {
        float f[8];
        amk_ld8(a.nw->ptr, a.nw->dtype, u, f);
#pragma unroll
        for (int e = 0; e < 8; ++e) ws[u * 8 + e] = f[e];
      }
    } else {
      for (long long k = threadIdx.x; k < a.K; k += AMK_THREADS) ws[k] = amk_ldf(a.nw, k);
    }
  }
  if (epi == 3)
    for (int k = threadIdx.x; k < a.hd / 2; k += AMK_THREADS)
      fq[k] = amk_rope_inv_freq_scaled(p.theta, k, a.hd / 2, a.fac);
  if (epi == 3) {
    for (long long m = p.m_off + threadIdx.x; m < a.m_end; m += AMK_THREADS) {
      const long long pos = amk_ldif(a.ex, m);
      if (pos < 0) { amk_fail(ctx, AMK_ERR_INDEX, pos); }
    }
    __syncthreads();
    if (*ctx.failed) return;
  }
  amk_probe(ctx, 0); /* checked, the norm weight and RoPE frequencies staged */
  for (long long m0 = p.m_off; m0 < a.m_end;) {
    /* More than LT_BM rows left on the tensor cores: the wide row block. */
    const bool wide = mma && a.m_end - m0 > LT_BM;
    /* More than LT_BM2 rows left on the wgmma path without a norm: the 256-row block. */
    const bool widest = LT_WIDEST && mma && !a.nw && a.m_end - m0 > LT_BM2;
    /* The tensor-core tiles work out the row scales themselves, behind their first copies. */
    if (a.nw && !mma) lt_row_scales(a, m0, rinv);
    __syncthreads();
    amk_probe(ctx, 4); /* the row block's scales (the generic path's) */
    for (long long c0 = p.n_off; c0 < a.n_end; c0 += cols) {
      const bool first = c0 == p.n_off;
#if LT_WIDEST
      if (widest && AMK_BF_OF(dt)) {
        lt_tile_mma<true, LT_BM4>(ctx, a, m0, c0, cols, rinv, ws, fq, ctx.smem, first);
        continue;
      } else if (widest) {
        lt_tile_mma<false, LT_BM4>(ctx, a, m0, c0, cols, rinv, ws, fq, ctx.smem, first);
        continue;
      }
#endif
      if (wide && AMK_BF_OF(dt)) {
        lt_tile_mma<true, LT_BM2>(ctx, a, m0, c0, cols, rinv, ws, fq, ctx.smem, first);
      } else if (wide) {
        lt_tile_mma<false, LT_BM2>(ctx, a, m0, c0, cols, rinv, ws, fq, ctx.smem, first);
      } else if (mma && AMK_BF_OF(dt)) {
        lt_tile_mma<true, LT_BM>(ctx, a, m0, c0, cols, rinv, ws, fq, ctx.smem, first);
      } else if (mma) {
        lt_tile_mma<false, LT_BM>(ctx, a, m0, c0, cols, rinv, ws, fq, ctx.smem, first);
      } else {
        lt_tile_generic(a, m0, c0, cols, rinv, (float*)ctx.smem);
        __syncthreads();
        if (a.bias) {
          lt_add_bias(a, c0, cols, LT_BM, (float*)ctx.smem);
          __syncthreads();
        }
        lt_epilogue(a, m0, c0, cols, LT_BM, (const float*)ctx.smem, fq);
        __syncthreads();
      }
    }
    m0 += widest ? LT_BM4 : wide ? LT_BM2 : LT_BM;
  }
}
