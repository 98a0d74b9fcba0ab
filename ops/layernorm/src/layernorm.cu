/* layernorm.cu — CUDA device function of LAYERNORM (amk_op_layernorm); the semantics are
 * ops/layernorm/src/reference.rs: every row (all leading dims) of x over the last dim `hidden`
 * becomes y = (x - mean) / sqrt(var + eps) * w + b (b = 0.0 when absent: still added, as the CPU
 * does, so -0.0 becomes +0.0 alike), biased variance, two-pass (mean, then mean((x - mean)^2)),
 * values read as f32, everything carried in f64, rounded once to f32 and cast on store. eps is
 * the f32 param widened to f64.
 *
 * Parallelisation: many short rows (rows > 1, hidden <= 1024, and rows >= AMK_WARPS / 2 or
 * hidden <= 256): one warp per row, lanes strided over the row, shuffle reduces. Otherwise the
 * whole block per row (block-strided, coalesced), rows one after the other.
 *
 * Vector path: x, w (and b) and out F32/BF16/F16 with 16-byte aligned bases, hidden a multiple of
 * 8 (every row 16-byte aligned) and at most 4 vectors of 8 elements per thread (block rows up to
 * 8192 elements, every warp row): each thread issues all its 16-byte loads of x, w and b before
 * it uses any, keeps x in registers through both reductions to the output (no reloads), waits
 * for w and b only at the output, and a block reduce takes one barrier.
 *
 * Scalar path (anything else: hidden not a multiple of 8, other dtypes, unaligned bases, wider
 * rows, an I4 output): the element loops. An I4 output (two elements per byte) is written by one
 * thread per row in block mode, so no two threads read-modify-write one byte. */

/* Vectors of 8 elements per thread on the vector path: block rows up to 8 * AMK_THREADS * LN_VB
 * elements (8192), warp rows (hidden <= 1024) up to 8 * 32 * LN_VW. Wider rows take the scalar
 * path. */
#define LN_VB 4
#define LN_VW 4


/* The thread's f64 sum of its elements of x (PASS 0), or of (x - mean)^2 (PASS 1). */
template <int G, int V, int PASS>
__device__ __forceinline__ double ln_part(int dt, long long hv, int t, const uint4* a,
                                          const uint4* b, double mean) {
  double s = 0.0;
#pragma unroll
  for (int q = 0; q < V; ++q) {
    if (t + (long long)q * G < hv) {
      float f[8];
      amk_cvt8(dt, a[q], b[q], f);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        if (PASS == 0) {
          s += (double)f[e];
        } else {
          const double d = (double)f[e] - mean;
          s += d * d;
        }
      }
    }
  }
  return s;
}

/* y = (float)(d * rstd * w + b) per element, d = x - mean (f64, as the reference; b = 0.0 when
 * absent, still added), cast on store (16-byte stores). */
template <int G, int V, bool HAS_B>
__device__ __forceinline__ void ln_store(void* op, int odt, long long ub, long long hv, int t,
                                         int xdt, const uint4* xa, const uint4* xb, int wdt,
                                         const uint4* wa, const uint4* wb, int bdt,
                                         const uint4* ba, const uint4* bb, double mean,
                                         double rstd) {
#pragma unroll
  for (int q = 0; q < V; ++q) {
    const long long u = t + (long long)q * G;
    if (u < hv) {
      float xf[8], wf[8], bf[8], o[8];
      amk_cvt8(xdt, xa[q], xb[q], xf);
      amk_cvt8(wdt, wa[q], wb[q], wf);
      if (HAS_B) amk_cvt8(bdt, ba[q], bb[q], bf);
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        const double d = (double)xf[e] - mean;
        const double bj = HAS_B ? (double)bf[e] : 0.0;
        o[e] = (float)(d * rstd * (double)wf[e] + bj);
      }
      amk_st8(op, odt, ub + u, o);
    }
  }
}

/* Rows r0, r0 + rstep, .. < rows, each by a group of G threads (G = 32: one warp, t = lane,
 * shuffle reduces; G = AMK_THREADS: the whole block, t = threadIdx.x, r0 = 0, rstep = 1, so the
 * row loop and its barriers are block-uniform). Needs hidden % 8 == 0, hidden / 8 <= G * V, every
 * operand (base, dtype) F32/BF16/F16 with a 16-byte aligned base. w, b and the first row of x
 * are loaded together; each row's loads of x are all issued before any is used, x stays in
 * registers through both reductions to the store, and w and b (used only at the store) are
 * waited for only there, so with one row their latency overlaps x's and the reductions. Out of
 * line: its own register allocation, so the megakernel's large dispatch function spills nothing
 * in flight. */
template <int G, int V, bool HAS_B>
__device__ __noinline__ void ln_rows(const void* xp, int xdt, const void* wp, int wdt,
                                     const void* bp, int bdt, void* op, int odt, long long h,
                                     double eps, long long rows, long long r0, long long rstep,
                                     int t) {
  const long long hv = h >> 3;
  const double dh = (double)h;
  if (r0 >= rows) return; /* warp mode: a warp without rows (warp-uniform); block: no rows */
  uint4 wa[V], wb[V], ba[V], bb[V], xa[V], xb[V];
  amk_norm_ld<G, V>(wp, wdt, 0, hv, t, wa, wb);
  if (HAS_B) amk_norm_ld<G, V>(bp, bdt, 0, hv, t, ba, bb);
  amk_norm_ld<G, V>(xp, xdt, r0 * hv, hv, t, xa, xb);
#pragma unroll 1
  for (long long r = r0;;) {
    /* block: the mean's reduce on slot 0, the variance's on slot 1 (alternating calls) */
    double s = ln_part<G, V, 0>(xdt, hv, t, xa, xb, 0.0);
    amk_norm_opaque<V>(xa, xb);
    s = G == 32 ? amk_warp_sum_d(s) : amk_norm_block_sum(s, 0);
    const double mean = s / dh;
    double qs = ln_part<G, V, 1>(xdt, hv, t, xa, xb, mean);
    amk_norm_opaque<V>(xa, xb);
    qs = G == 32 ? amk_warp_sum_d(qs) : amk_norm_block_sum(qs, 1);
    const double rstd = 1.0 / sqrt(qs / dh + eps);
    ln_store<G, V, HAS_B>(op, odt, r * hv, hv, t, xdt, xa, xb, wdt, wa, wb, bdt, ba, bb, mean,
                          rstd);
    r += rstep;
    if (r >= rows) break;
    /* w's and b's conversions stay in the loop (waited for by now) */
    amk_norm_opaque<V>(wa, wb);
    if (HAS_B) amk_norm_opaque<V>(ba, bb);
    amk_norm_ld<G, V>(xp, xdt, r * hv, hv, t, xa, xb);
  }
}

__device__ void amk_op_layernorm(const amk_task_ctx& ctx) {
  const amk_params_t& p = ctx.inst->params;
  const int nin = ctx.inst->n_inputs;
  if (nin < 2 || nin > 3) {
    amk_fail(ctx, AMK_ERR_SHAPE, nin);
    return;
  }
  const amk_buffer_t* x = amk_in(ctx, 0);
  const amk_buffer_t* w = amk_in(ctx, 1);
  const amk_buffer_t* b = nin == 3 ? amk_in(ctx, 2) : (const amk_buffer_t*)0;
  const amk_buffer_t* out = amk_out(ctx, 0);
  const long long h = p.hidden;
  const double eps = (double)p.eps;
  if (h <= 0) {
    amk_fail(ctx, AMK_ERR_PARAM, h);
    return;
  }
  if (amk_last_dim(x) != h || w->numel != h || (b && b->numel != h) || out->numel != x->numel) {
    amk_fail(ctx, AMK_ERR_SHAPE, amk_last_dim(x));
    return;
  }
  const long long rows = x->numel / h;
  const double dh = (double)h;
  const bool i4 = out->dtype == AMK_I4;
  const bool warp_rows = !i4 && rows > 1 && h <= 1024 && (rows >= AMK_WARPS / 2 || h <= 256);
  const bool vec = (h & 7) == 0 && amk_is_vec(x->dtype) && amk_is_vec(w->dtype) &&
                   amk_is_vec(out->dtype) && amk_al16(x->ptr) && amk_al16(w->ptr) &&
                   amk_al16(out->ptr) && (!b || (amk_is_vec(b->dtype) && amk_al16(b->ptr)));
  const long long hv = h >> 3;
  if (warp_rows) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (vec && hv <= 32 * LN_VW) {
      if (b)
        ln_rows<32, LN_VW, true>(x->ptr, x->dtype, w->ptr, w->dtype, b->ptr, b->dtype, out->ptr,
                                 out->dtype, h, eps, rows, warp, AMK_WARPS, lane);
      else
        ln_rows<32, LN_VW, false>(x->ptr, x->dtype, w->ptr, w->dtype, (const void*)0, AMK_F32,
                                  out->ptr, out->dtype, h, eps, rows, warp, AMK_WARPS, lane);
      return;
    }
    for (long long r = warp; r < rows; r += AMK_WARPS) {
      const long long base = r * h;
      double s = 0.0;
      for (long long j = lane; j < h; j += 32) s += (double)amk_ldf(x, base + j);
      const double mean = amk_warp_sum_d(s) / dh;
      double q = 0.0;
      for (long long j = lane; j < h; j += 32) {
        const double d = (double)amk_ldf(x, base + j) - mean;
        q += d * d;
      }
      const double rstd = 1.0 / sqrt(amk_warp_sum_d(q) / dh + eps);
      for (long long j = lane; j < h; j += 32) {
        const double d = (double)amk_ldf(x, base + j) - mean;
        const double bj = b ? (double)amk_ldf(b, j) : 0.0;
        amk_stf(out, base + j, (float)(d * rstd * (double)amk_ldf(w, j) + bj));
      }
    }
    return;
  }
  if (vec && hv <= (long long)AMK_THREADS * LN_VB) {
    if (b)
      ln_rows<AMK_THREADS, LN_VB, true>(x->ptr, x->dtype, w->ptr, w->dtype, b->ptr, b->dtype,
                                        out->ptr, out->dtype, h, eps, rows, 0, 1, threadIdx.x);
    else
      ln_rows<AMK_THREADS, LN_VB, false>(x->ptr, x->dtype, w->ptr, w->dtype, (const void*)0,
                                         AMK_F32, out->ptr, out->dtype, h, eps, rows, 0, 1,
                                         threadIdx.x);
    return;
  }
  for (long long r = 0; r < rows; ++r) {
    const long long base = r * h;
    double s = 0.0;
    for (long long j = threadIdx.x; j < h; j += AMK_THREADS) s += (double)amk_ldf(x, base + j);
    /* amk_block_sum_d starts and ends with a barrier: the previous row's I4 writes are done */
    const double mean = amk_block_sum_d(s) / dh;
    double q = 0.0;
    for (long long j = threadIdx.x; j < h; j += AMK_THREADS) {
      const double d = (double)amk_ldf(x, base + j) - mean;
      q += d * d;
    }
    const double rstd = 1.0 / sqrt(amk_block_sum_d(q) / dh + eps);
    const long long j0 = i4 ? (threadIdx.x == 0 ? 0 : h) : threadIdx.x;
    const long long js = i4 ? 1 : AMK_THREADS;
    for (long long j = j0; j < h; j += js) {
      const double d = (double)amk_ldf(x, base + j) - mean;
      const double bj = b ? (double)amk_ldf(b, j) : 0.0;
      amk_stf(out, base + j, (float)(d * rstd * (double)amk_ldf(w, j) + bj));
    }
  }
}
