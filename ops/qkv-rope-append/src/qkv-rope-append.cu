/* qkv-rope-append.cu — CUDA device function of QKV_ROPE_APPEND (amk_op_qkv_rope_append); the
 * semantics are ops/qkv-rope-append/src/reference.rs (units, pairs, roundings).
 *
 * The fused-tile machinery is ops/oplib-tile/src/amk_tile.cuh: each warp takes one RoPE pair
 * at a time — the two weight rows r and r + head_dim/2 of one head, streamed together (4 16-byte
 * vectors of each in flight per lane) — rounds both sums to the destination's dtype, rotates them
 * (Q and K heads; ROPE's arithmetic, amk_rope_*, with cos and sin computed before the tile and
 * kept across the launch's layers: qkv_trig) and stores them into q or the cache row pos
 * (element 0 of the integer input 4, checked against the caches). It waits for its task's
 * counters itself (amk_task_wait), after its checks. With param rope_factors (ext[0]) = 1 the
 * last input holds per-pair frequency divisors; with qk_norm (ext[1]) = 1 two per-head norm
 * weights precede them (op_qkv_rope_append::optional_inputs): the tile (whole heads) then keeps
 * its Q and K heads' rounded sums in shared memory, and after every pair is summed one warp a
 * head normalises (RMSNORM's arithmetic, amk_rms_*), rounds, rotates and stores them. */

/* The pair unit u (even) starts: projection (0 Q, 1 K, 2 V), weight row, frequency index. 32-bit
 * (u < (n_heads + 2 n_kv_heads) * head_dim, int params the checks bound): two divisions per
 * unit and warp, inline instead of the 64-bit subroutine. */
__device__ __forceinline__ void qkv_pair(int u, int hd, int nh, int nkv, int& proj,
                                         long long& row, int& i) {
  const int head = u / hd;
  i = (u % hd) >> 1;
  int local = head;
  proj = 0;
  if (head >= nh + nkv) { proj = 2; local = head - nh - nkv; }
  else if (head >= nh) { proj = 1; local = head - nh; }
  row = (long long)local * hd + i;
}

/* cos and sin of pair frequency i at position pos, as ROPE computes them (fac: the frequency
 * factors, or null). */
__device__ __forceinline__ float2 qkv_cos_sin(int pos, float theta, int i, int half,
                                              const amk_buffer_t* fac) {
  const float ang = __fmul_rn((float)pos, amk_rope_inv_freq_scaled(theta, i, half, fac));
  return make_float2(amk_rope_trig(ang, 0), amk_rope_trig(ang, 1));
}

/* The block cache (amk_block_cache): a key of QKV_CS_KEY words (op code + 1, the position
 * buffer's address, theta, head_dim, the frequency factors' address), the position, then
 * (cos, sin) of frequencies i < head_dim / 2 (head_dim up to 2 * QKV_CS_MAX). */
#define QKV_CS_KEY 7
#define QKV_CS_POS QKV_CS_KEY
#define QKV_CS_MAX ((AMK_BLOCK_CACHE_WORDS - QKV_CS_KEY - 1) / 2)

/* The position (element 0 of `pb`, into `pos`) and (cos, sin) of every frequency i < hd / 2 at
 * it, in shared memory (null when hd is too large for the cache). The rotation's f64 power,
 * cosine and sine were a serial chain on each warp's first lane after every pair's sums (about
 * 2 us a tile on the H100); here every thread computes one frequency, and only once per launch
 * and block: a decode step's layers share the position, so every later tile on this block finds
 * them under the same key. When nothing in the launch writes the position (`launch_const`), a
 * hit also skips reading it: one global round trip less on the path to the tile's wait
 * (docs/perf-notes.md round 10). Called by the whole block; the caller checks the position. */
__device__ __noinline__ const float2* qkv_trig(const amk_buffer_t* pb, bool launch_const,
                                              float theta, int hd, const amk_buffer_t* fac,
                                              long long& pos) {
  const int half = hd >> 1;
  const unsigned long long pa = (unsigned long long)pb->ptr;
  const unsigned long long fa = fac ? (unsigned long long)fac->ptr : 0ull;
  const uint32_t key[QKV_CS_KEY] = {22u + 1u /* QKV_ROPE_APPEND's code + 1 */, (uint32_t)pa,
                                    (uint32_t)(pa >> 32), __float_as_uint(theta), (uint32_t)hd,
                                    (uint32_t)fa, (uint32_t)(fa >> 32)};
  float2* const cs = (float2*)(amk_block_cache + QKV_CS_KEY + 1);
  bool hit = half <= QKV_CS_MAX;
#pragma unroll
  for (int k = 0; k < QKV_CS_KEY; ++k) hit = hit && amk_block_cache[k] == key[k];
  if (hit && launch_const) { /* block-uniform: every thread read the same words */
    pos = (long long)amk_block_cache[QKV_CS_POS];
    return cs;
  }
  pos = amk_ldif(pb, 0);
  if (half > QKV_CS_MAX) return nullptr;
  if (hit && pos >= 0 && pos <= 0xffffffffLL && amk_block_cache[QKV_CS_POS] == (uint32_t)pos)
    return cs;
  __syncthreads(); /* every thread has read the old key before it changes */
  for (int i = threadIdx.x; i < half; i += AMK_THREADS)
    cs[i] = qkv_cos_sin((int)pos, theta, i, half, fac);
  if (threadIdx.x < QKV_CS_KEY) amk_block_cache[threadIdx.x] = key[threadIdx.x];
  /* A position beyond 32 bits is never cached as valid: the caller fails the task on it. */
  if (threadIdx.x == 0) amk_block_cache[QKV_CS_POS] = (uint32_t)pos;
  __syncthreads();
  return cs;
}

/* The tile's operands and params. */
struct qkv_args {
  const amk_buffer_t *x, *w[3], *pb, *nw, *fac, *dst[3], *qkn[2];
  long long K;
  int n_tile, n_off, hd, nh, nkv;
  float theta;
};

/* The operands from the descriptors and params; CHECK: also the checks that read only those
 * (the validator's, again on the device), failing the task (false) on the first that fails. */
template <bool CHECK>
__device__ __forceinline__ bool qkv_setup(const amk_task_ctx& ctx, qkv_args& a) {
  const amk_params_t& p = ctx.inst->params;
  const int nin = ctx.inst->n_inputs;
  const bool with_fac = amk_has(p, AMK_P_EXT0) && p.ext[0] == 1;
  const bool with_qk = amk_has(p, AMK_P_EXT0 + 1) && p.ext[1] == 1;
  const int fixed = 5 + (with_fac ? 1 : 0) + (with_qk ? 2 : 0);
  AMK_CHECK((nin == fixed || nin == fixed + 1) && ctx.inst->n_outputs == 3, AMK_ERR_SHAPE, nin);
  const bool with_norm = nin == fixed + 1;
  a.x = amk_in(ctx, 0);
  for (int c = 0; c < 3; ++c) {
    a.w[c] = amk_in(ctx, 1 + c);
    a.dst[c] = amk_out(ctx, c);
  }
  a.pb = amk_in(ctx, 4);
  a.fac = with_fac ? amk_in(ctx, nin - 1) : nullptr;
  a.nw = with_norm ? amk_in(ctx, 5) : nullptr;
  a.qkn[0] = with_qk ? amk_in(ctx, 5 + with_norm) : nullptr;
  a.qkn[1] = with_qk ? amk_in(ctx, 6 + with_norm) : nullptr;
  a.K = p.K;
  a.n_tile = p.N_tile;
  a.n_off = p.n_off;
  a.hd = p.head_dim;
  a.nh = p.n_heads;
  a.nkv = p.n_kv_heads;
  a.theta = p.theta;
  if (CHECK) {
    const int hd = a.hd, nh = a.nh, nkv = a.nkv, n_tile = a.n_tile, n_off = a.n_off;
    const long long K = a.K;
    AMK_CHECK(amk_is_int(a.pb->dtype) && a.pb->numel >= 1, AMK_ERR_DTYPE, a.pb->dtype);
    AMK_CHECK(!a.fac || (amk_is_float(a.fac->dtype) && a.fac->numel == hd / 2), AMK_ERR_SHAPE,
              a.fac ? a.fac->numel : 0);
    if (a.qkn[0]) {
      for (int c = 0; c < 2; ++c)
        AMK_CHECK(amk_is_float(a.qkn[c]->dtype) && a.qkn[c]->numel == hd, AMK_ERR_SHAPE,
                  a.qkn[c]->numel);
      /* whole heads, and the row plus the heads' sums (f32) within the shared memory */
      AMK_CHECK(hd > 0 && n_off % hd == 0 && n_tile % hd == 0 && amk_has(p, AMK_P_EPS) &&
                    4LL * (K + n_tile) <= (long long)ctx.smem_bytes,
                AMK_ERR_PARAM, n_tile);
    }
    if (!amk_fused_check(ctx, a.x, a.w, 3, a.nw, K)) return false;
    AMK_CHECK(hd > 0 && !(hd & 1) && nh > 0 && nkv > 0 && n_tile > 0 && !(n_tile & 1) &&
                  n_off >= 0 && !(n_off & 1) && a.theta > 0.0f,
              AMK_ERR_PARAM, hd);
    const long long row_len = (long long)nkv * hd;
    AMK_CHECK(a.w[0]->numel == (long long)nh * hd * K && a.w[1]->numel == row_len * K &&
                  a.w[2]->numel == row_len * K && a.dst[0]->numel == (long long)nh * hd &&
                  (long long)n_off + n_tile <= ((long long)nh + 2LL * nkv) * hd &&
                  (long long)n_off + n_tile <= 2147483647LL, /* qkv_pair's units are 32-bit */
              AMK_ERR_SHAPE, (long long)n_off + n_tile);
    for (int c = 0; c < 3; ++c) {
      AMK_CHECK(amk_is_vec(a.dst[c]->dtype), AMK_ERR_DTYPE, a.dst[c]->dtype);
      AMK_CHECK(c == 0 || (amk_urem(a.dst[c]->numel, row_len) == 0 && a.dst[c]->numel >= row_len),
                AMK_ERR_SHAPE, a.dst[c]->numel);
    }
  }
  return true;
}

/* The per-head norms' pass (qk_norm): after every pair of the tile is summed into hs, one warp
 * a Q or K head normalises its head_dim values (RMSNORM's row: amk_rms_sq in element order
 * within a lane, a warp sum, amk_rms_inv, amk_rms_apply; rounded to the destination's dtype),
 * rotates each pair (cs: the block's cos/sin, or computed) and stores it into q or the K
 * cache row pos. V heads were stored by the tile. */
__device__ __noinline__ void qkv_norm_heads(const amk_task_ctx& ctx, const qkv_args& a,
                                            const float* hs, const float2* cs, int pos,
                                            long long row_len) {
  __syncthreads(); /* every pair's sums are in hs (or the task failed: nothing to store) */
  if (*ctx.failed) return;
  const int hd = a.hd, half = hd >> 1, lane = threadIdx.x & 31;
  const int head0 = a.n_off / hd, n_heads = a.n_tile / hd;
  for (int t = threadIdx.x >> 5; t < n_heads; t += AMK_THREADS >> 5) {
    const int head = head0 + t;
    if (head >= a.nh + a.nkv) continue; /* a V head */
    const int proj = head >= a.nh ? 1 : 0;
    const int local = proj ? head - a.nh : head;
    const float* h = hs + (long long)t * hd;
    amk_norm_t ss = 0;
    for (int e = lane; e < hd; e += 32) ss = amk_rms_sq(ss, h[e]);
    const amk_norm_t inv = amk_rms_inv(amk_warp_reduce<amk_norm_t, false>(ss), hd, ctx.inst->params.eps);
    const amk_buffer_t* w = a.qkn[proj];
    const amk_buffer_t* d = a.dst[proj];
    const long long base = (proj ? (long long)pos * row_len : 0) + (long long)local * hd;
    for (int i = lane; i < half; i += 32) {
      const float x0 = amk_round_dt(d->dtype, amk_rms_apply(h[i], inv, amk_ldf(w, i)));
      const float x1 = amk_round_dt(d->dtype, amk_rms_apply(h[i + half], inv, amk_ldf(w, i + half)));
      const float2 c = cs ? cs[i] : qkv_cos_sin(pos, a.theta, i, half, a.fac);
      float y0, y1;
      amk_rope_pair(x0, x1, c.x, c.y, y0, y1);
      amk_stf(d, base + i, y0);
      amk_stf(d, base + i + half, y1);
    }
  }
}

/* qkv_setup<true> out of line: run unless amk_verify_tasks passed the task (ctx.verify). */
__device__ __noinline__ bool qkv_check(const amk_task_ctx& ctx) {
  qkv_args a;
  return qkv_setup<true>(ctx, a);
}

__device__ void amk_op_qkv_rope_append(const amk_task_ctx& ctx) {
  if (ctx.verify && !qkv_check(ctx)) return;
  /* amk_verify_tasks: the checks are all it runs (the position below is data). */
  if (ctx.check_only) return;
  qkv_args a;
  qkv_setup<false>(ctx, a);
  const amk_params_t& p = ctx.inst->params;
  const amk_buffer_t* x = a.x;
  const amk_buffer_t* const* w = a.w;
  const amk_buffer_t* pb = a.pb;
  const amk_buffer_t* nw = a.nw;
  const amk_buffer_t* const* dst = a.dst;
  const long long K = a.K;
  const int n_tile = a.n_tile, n_off = a.n_off, hd = a.hd, nh = a.nh, nkv = a.nkv;
  const float theta = a.theta;
  const long long row_len = (long long)nkv * hd;
  /* The checks above read descriptors and params only; x waits for the task's counters. So
     does the position, unless nothing in the program writes it (the host's, from before the
     launch): then it and its cos/sin are ready before the wait, off the critical path. */
  const bool pos_early = (pb->flags & AMK_BUF_LAUNCH_CONST) != 0;
  if (!pos_early && !amk_task_wait(ctx)) return;
  long long pos_ll;
  const amk_buffer_t* fac = a.fac;
  const float2* const cs = qkv_trig(pb, pos_early, theta, hd, fac, pos_ll);
  /* The position comes from data: outside the caches it is an index error (as the CPU). */
  if (pos_ll < 0 || pos_ll >= amk_udiv(dst[1]->numel, row_len) ||
      pos_ll >= amk_udiv(dst[2]->numel, row_len)) {
    amk_fail(ctx, AMK_ERR_INDEX, pos_ll);
    return;
  }
  const int pos = (int)pos_ll;
  const int wdt = (w[0]->dtype == w[1]->dtype && w[1]->dtype == w[2]->dtype) ? w[0]->dtype : -1;
  const bool al = amk_al16(w[0]->ptr) && amk_al16(w[1]->ptr) && amk_al16(w[2]->ptr);
  const amk_buffer_t* wq = w[0];
  const amk_buffer_t* wk = w[1];
  const amk_buffer_t* wv = w[2];
  const amk_buffer_t* q = dst[0];
  const amk_buffer_t* kc = dst[1];
  const amk_buffer_t* vc = dst[2];
  const int half = hd >> 1;
  /* With the per-head norms: the Q and K heads' rounded sums, at the end of the shared memory
     (the row, when the tile keeps one there, is at its start; the checks bound both). */
  float* const hs = a.qkn[0] ? (float*)(ctx.smem + ctx.smem_bytes) - n_tile : nullptr;
  /* waited already unless pos_early */
  amk_fused_tile<2, AMK_FUSED_PAIR_OF(4)>(
      ctx, !pos_early, x, nw, K, p.eps, wdt, al, n_tile >> 1,
      [=](int j, const amk_buffer_t* (&wb)[2], long long (&row)[2]) {
        int proj, i;
        long long r0;
        qkv_pair(n_off + 2 * j, hd, nh, nkv, proj, r0, i);
        wb[0] = wb[1] = proj == 0 ? wq : proj == 1 ? wk : wv;
        row[0] = r0;
        row[1] = r0 + half;
      },
      [=](int j, const float (&s)[2]) {
        if ((threadIdx.x & 31) != 0) return;
        int proj, i;
        long long r0;
        qkv_pair(n_off + 2 * j, hd, nh, nkv, proj, r0, i);
        const amk_buffer_t* d = proj == 0 ? q : proj == 1 ? kc : vc;
        const float a = amk_round_dt(d->dtype, s[0]), b = amk_round_dt(d->dtype, s[1]);
        if (hs && proj < 2) { /* normalised with its whole head, below */
          float* const h = hs + (2 * j - (n_off + 2 * j) % hd);
          h[i] = a;
          h[i + half] = b;
          return;
        }
        float ya = a, yb = b;
        if (proj < 2) {
          const float2 t = cs ? cs[i] : qkv_cos_sin(pos, theta, i, half, fac);
          amk_rope_pair(a, b, t.x, t.y, ya, yb);
        }
        const long long base = proj == 0 ? r0 : (long long)pos * row_len + r0;
        amk_stf(d, base, ya);
        amk_stf(d, base + half, yb);
      });
  if (hs) qkv_norm_heads(ctx, a, hs, cs, pos, row_len);
}
