/* rmsnorm.cu — CUDA device function of RMSNORM (amk_op_rmsnorm); the semantics are
 * ops/rmsnorm/src/reference.rs: every row (all leading dims) of x over the last dim `hidden`
 * becomes y = x * rsqrt(mean(x^2) + eps) * w, with the values read as f32, the reduction and the
 * per-element products carried in f64, rounded once to f32 and cast on store. eps is the f32
 * param widened to f64 (as the CPU does after rounding it to f32). A kernel built with
 * AMK_NORM_F32=1 carries them in f32 instead (amk_norm_t, amk_device.cuh): within the
 * tolerances of docs/ir.md ("Numerics") of the reference, not bit-equal to it.
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
 * Row tiles (params m_off, M_tile, n_off = 0, N_tile = hidden; M_tile > 0): only rows
 * [m_off, m_off + M_tile), so a prompt chunk's rows are normalised by tasks on many SMs. Such a
 * tile of rows up to 8 * 32 * AMK_RMS_VT elements (2048) takes a warp a row on the vector path.
 *
 * Scalar path (anything else: hidden not a multiple of 8, other dtypes, unaligned bases, wider
 * rows, an I4 output): the element loops. An I4 output (two elements per byte) is written by one
 * thread per row in block mode, so no two threads read-modify-write one byte. */

/* The vector path (amk_rms_rows, AMK_RMS_VB, AMK_RMS_VW) lives in amk_device.cuh: the fused decode
 * tiles normalise their row with it too. */

/* Vectors of 8 elements a lane for a row tile's warp rows. */
#define AMK_RMS_VT 8

__device__ void amk_op_rmsnorm(const amk_task_ctx& ctx) {
  const amk_params_t& p = ctx.inst->params;
  const amk_buffer_t* x = amk_in(ctx, 0);
  const amk_buffer_t* w = amk_in(ctx, 1);
  const amk_buffer_t* out = amk_out(ctx, 0);
  const long long h = p.hidden;
  const float eps = p.eps;
  if (h <= 0) {
    amk_fail(ctx, AMK_ERR_PARAM, h);
    return;
  }
  if (amk_last_dim(x) != h || w->numel != h || out->numel != x->numel) {
    amk_fail(ctx, AMK_ERR_SHAPE, amk_last_dim(x));
    return;
  }
  /* Rows [r0, r1): all of them, or the task's row tile (M_tile > 0). */
  const long long all_rows = x->numel / h;
  const bool tiled = p.M_tile > 0;
  const long long r0 = tiled ? p.m_off : 0, r1 = tiled ? p.m_off + p.M_tile : all_rows;
  if (r0 < 0 || r1 > all_rows) {
    amk_fail(ctx, AMK_ERR_SHAPE, r1);
    return;
  }
  const long long rows = r1 - r0;
  const bool i4 = out->dtype == AMK_I4;
  const bool vec = (h & 7) == 0 && amk_is_vec(x->dtype) && amk_is_vec(w->dtype) &&
                   amk_is_vec(out->dtype) && amk_al16(x->ptr) && amk_al16(w->ptr) &&
                   amk_al16(out->ptr);
  /* A row tile of rows up to 2048 elements: a warp a row, all of a row's loads in flight. */
  const bool tile_warps = tiled && !i4 && vec && rows > 1 && (h >> 3) <= 32 * AMK_RMS_VT;
  const bool warp_rows = tile_warps ||
                         (!i4 && rows > 1 && h <= 1024 && (rows >= AMK_WARPS / 2 || h <= 256));
  if (warp_rows) {
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    if (vec && (h >> 3) <= 32 * AMK_RMS_VW) {
      amk_rms_rows<32, AMK_RMS_VW>(x->ptr, x->dtype, w->ptr, w->dtype, out->ptr, out->dtype, h, eps, r1,
                           r0 + warp, AMK_WARPS, lane);
      return;
    }
    if (tile_warps) {
      amk_rms_rows<32, AMK_RMS_VT>(x->ptr, x->dtype, w->ptr, w->dtype, out->ptr, out->dtype, h, eps, r1,
                           r0 + warp, AMK_WARPS, lane);
      return;
    }
    for (long long r = r0 + warp; r < r1; r += AMK_WARPS) {
      const long long base = r * h;
      amk_norm_t s = 0;
      for (long long j = lane; j < h; j += 32) s = amk_rms_sq(s, amk_ldf(x, base + j));
      s = amk_warp_reduce<amk_norm_t, false>(s);
      const amk_norm_t inv = amk_rms_inv(s, h, eps);
      for (long long j = lane; j < h; j += 32)
        amk_stf(out, base + j, amk_rms_apply(amk_ldf(x, base + j), inv, amk_ldf(w, j)));
    }
    return;
  }
  if (vec && (h >> 3) <= (long long)AMK_THREADS * AMK_RMS_VB) {
    amk_rms_rows<AMK_THREADS, AMK_RMS_VB>(x->ptr, x->dtype, w->ptr, w->dtype, out->ptr, out->dtype, h,
                                  eps, r1, r0, 1, threadIdx.x);
    return;
  }
  for (long long r = r0; r < r1; ++r) {
    const long long base = r * h;
    amk_norm_t s = 0;
    for (long long j = threadIdx.x; j < h; j += AMK_THREADS) s = amk_rms_sq(s, amk_ldf(x, base + j));
    /* the block sum starts and ends with a barrier: the previous row's I4 writes are done */
    s = amk_block_sum_of(s);
    const amk_norm_t inv = amk_rms_inv(s, h, eps);
    const long long j0 = i4 ? (threadIdx.x == 0 ? 0 : h) : threadIdx.x;
    const long long js = i4 ? 1 : AMK_THREADS;
    for (long long j = j0; j < h; j += js)
      amk_stf(out, base + j, amk_rms_apply(amk_ldf(x, base + j), inv, amk_ldf(w, j)));
  }
}
