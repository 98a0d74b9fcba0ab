/* rmsnorm.cu — CUDA device function of RMSNORM (amk_op_rmsnorm); the semantics are
 * ops/rmsnorm/src/reference.rs: every row (all leading dims) of x over the last dim `hidden`
 * becomes y = x * rsqrt(mean(x^2) + eps) * w, with the values read as f32, the reduction and the
 * per-element products carried in f64, rounded once to f32 and cast on store. eps is the f32
 * param widened to f64 (as the CPU does after rounding it to f32).
 *
 * Parallelisation: many short rows (rows > 1, hidden <= 1024, and rows >= AMK_WARPS / 2 or
 * hidden <= 256): one warp per row, lanes strided over the row, shuffle reduce. Otherwise the
 * whole block per row (block-strided, coalesced), rows one after the other.
 *
 * Vector path (the decode case): x, w and out F32/BF16/F16 with 16-byte aligned bases, hidden a
 * multiple of 8 (so every row is 16-byte aligned) and at most 4 vectors of 8 elements per thread
 * (block rows up to 8192 elements, every warp row): each thread issues all its 16-byte loads of
 * w and of its row of x before it uses any, keeps x in registers from the sum of squares to the
 * output (no reload), waits for w only at the output, and the block reduce takes one barrier.
 * Decode latency: about one round trip for x and w together, one barrier, the stores.
 *
 * Scalar path (anything else: hidden not a multiple of 8, other dtypes, unaligned bases, wider
 * rows, an I4 output): the element loops. An I4 output (two elements per byte) is written by one
 * thread per row in block mode, so no two threads read-modify-write one byte. */

/* Vectors of 8 elements per thread on the vector path: block rows up to 8 * AMK_THREADS * RMS_VB
 * elements (8192), warp rows (hidden <= 1024) up to 8 * 32 * RMS_VW. Wider rows take the scalar
 * path. */
#define RMS_VB 4
#define RMS_VW 4


/* The thread's f64 sum of squares of its elements of x. */
template <int G, int V>
__device__ __forceinline__ double rms_sumsq(int dt, long long hv, int t, const uint4* a,
                                            const uint4* b) {
  double s = 0.0;
#pragma unroll
  for (int q = 0; q < V; ++q) {
    if (t + (long long)q * G < hv) {
      float f[8];
      amk_cvt8(dt, a[q], b[q], f);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const double v = (double)f[e];
        s += v * v;
      }
    }
  }
  return s;
}

/* y = (float)(x * inv * w) per element (f64, as the reference), cast on store (16-byte stores). */
template <int G, int V>
__device__ __forceinline__ void rms_store(void* op, int odt, long long ub, long long hv, int t,
                                          int xdt, const uint4* xa, const uint4* xb, int wdt,
                                          const uint4* wa, const uint4* wb, double inv) {
#pragma unroll
  for (int q = 0; q < V; ++q) {
    const long long u = t + (long long)q * G;
    if (u < hv) {
      float xf[8], wf[8], o[8];
      amk_cvt8(xdt, xa[q], xb[q], xf);
      amk_cvt8(wdt, wa[q], wb[q], wf);
#pragma unroll
      for (int e = 0; e < 8; ++e) o[e] = (float)((double)xf[e] * inv * (double)wf[e]);
      amk_st8(op, odt, ub + u, o);
    }
  }
}

/* Rows r0, r0 + rstep, .. < rows, each by a group of G threads (G = 32: one warp, t = lane,
 * shuffle reduce; G = AMK_THREADS: the whole block, t = threadIdx.x, r0 = 0, rstep = 1, so the
 * row loop and its barriers are block-uniform). Needs hidden % 8 == 0, hidden / 8 <= G * V, x,
 * w and out (base, dtype) F32/BF16/F16 with 16-byte aligned bases. w and the first row of x are
 * loaded together; each row's loads of x are all issued before any is used, x stays in
 * registers from the reduce to the store, and w (used only at the store) is waited for only
 * there, so with one row (decode) its HBM latency overlaps x's and the reduce. Out of line: its
 * own register allocation, so the megakernel's large dispatch function spills nothing in
 * flight. */
template <int G, int V>
__device__ __noinline__ void rms_rows(const void* xp, int xdt, const void* wp, int wdt, void* op,
                                      int odt, long long h, double eps, long long rows,
                                      long long r0, long long rstep, int t) {
  const long long hv = h >> 3;
  const double dh = (double)h;
  if (r0 >= rows) return; /* warp mode: a warp without rows (warp-uniform); block: no rows */
  uint4 wa[V], wb[V], xa[V], xb[V];
  amk_norm_ld<G, V>(wp, wdt, 0, hv, t, wa, wb);
  amk_norm_ld<G, V>(xp, xdt, r0 * hv, hv, t, xa, xb);
  int par = 0;
#pragma unroll 1
  for (long long r = r0;;) {
    double s = rms_sumsq<G, V>(xdt, hv, t, xa, xb);
    amk_norm_opaque<V>(xa, xb);
    if (G == 32) {
      s = amk_warp_sum_d(s);
    } else {
      s = amk_norm_block_sum(s, par);
      par ^= 1;
    }
    const double inv = 1.0 / sqrt(s / dh + eps);
    rms_store<G, V>(op, odt, r * hv, hv, t, xdt, xa, xb, wdt, wa, wb, inv);
    r += rstep;
    if (r >= rows) break;
    amk_norm_opaque<V>(wa, wb); /* w's conversion stays in the loop (waited for by now) */
    amk_norm_ld<G, V>(xp, xdt, r * hv, hv, t, xa, xb);
  }
}

__device__ void amk_op_rmsnorm(const amk_task_ctx& ctx) {
  const amk_params_t& p = ctx.inst->params;
  const amk_buffer_t* x = amk_in(ctx, 0);
  const amk_buffer_t* w = amk_in(ctx, 1);
  const amk_buffer_t* out = amk_out(ctx, 0);
  const long long h = p.hidden;
  const double eps = (double)p.eps;
  if (h <= 0) {
    amk_fail(ctx, AMK_ERR_PARAM, h);
    return;
  }
  if (amk_last_dim(x) != h || w->numel != h || out->numel != x->numel) {
    amk_fail(ctx, AMK_ERR_SHAPE, amk_last_dim(x));
    return;
  }
  const long long rows = x->numel / h;
  const bool i4 = out->dtype == AMK_I4;
  const bool warp_rows = !i4 && rows > 1 && h <= 1024 && (rows >= AMK_WARPS / 2 || h <= 256);
  const bool vec = (h & 7) == 0 && amk_is_vec(x->dtype) && amk_is_vec(w->dtype) &&
                   amk_is_vec(out->dtype) && amk_al16(x->ptr) && amk_al16(w->ptr) &&
                   amk_al16(out->ptr);
  if (warp_rows) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (vec && (h >> 3) <= 32 * RMS_VW) {
      rms_rows<32, RMS_VW>(x->ptr, x->dtype, w->ptr, w->dtype, out->ptr, out->dtype, h, eps, rows,
                           warp, AMK_WARPS, lane);
      return;
    }
    for (long long r = warp; r < rows; r += AMK_WARPS) {
      const long long base = r * h;
      double s = 0.0;
      for (long long j = lane; j < h; j += 32) {
        const double v = (double)amk_ldf(x, base + j);
        s += v * v;
      }
      s = amk_warp_sum_d(s);
      const double inv = 1.0 / sqrt(s / (double)h + eps);
      for (long long j = lane; j < h; j += 32) {
        const double v = (double)amk_ldf(x, base + j);
        amk_stf(out, base + j, (float)(v * inv * (double)amk_ldf(w, j)));
      }
    }
    return;
  }
  if (vec && (h >> 3) <= (long long)AMK_THREADS * RMS_VB) {
    rms_rows<AMK_THREADS, RMS_VB>(x->ptr, x->dtype, w->ptr, w->dtype, out->ptr, out->dtype, h,
                                  eps, rows, 0, 1, threadIdx.x);
    return;
  }
  for (long long r = 0; r < rows; ++r) {
    const long long base = r * h;
    double s = 0.0;
    for (long long j = threadIdx.x; j < h; j += AMK_THREADS) {
      const double v = (double)amk_ldf(x, base + j);
      s += v * v;
    }
    /* amk_block_sum_d starts and ends with a barrier: the previous row's I4 writes are done */
    s = amk_block_sum_d(s);
    const double inv = 1.0 / sqrt(s / (double)h + eps);
    const long long j0 = i4 ? (threadIdx.x == 0 ? 0 : h) : threadIdx.x;
    const long long js = i4 ? 1 : AMK_THREADS;
    for (long long j = j0; j < h; j += js) {
      const double v = (double)amk_ldf(x, base + j);
      amk_stf(out, base + j, (float)(v * inv * (double)amk_ldf(w, j)));
    }
  }
}
