/* gate-up-silu.cu — CUDA device function of GATE_UP_SILU (amk_op_gate_up_silu); the semantics
 * are ops/gate-up-silu/src/reference.rs: columns [n_off, n_off + N_tile) of
 * silu(xn·Wg^T)·(xn·Wu^T), xn = x or rmsnorm(x, norm_w, eps) (a 4th input).
 *
 * The fused-tile machinery is ops/oplib-tile/src/amk_tile.cuh: each warp streams the gate and
 * the up row of one column together (4 16-byte vectors of each in flight per lane), rounds both
 * sums to the output's dtype and stores silu(g)·u. */

/* The tile's operands and params. */
struct gu_args {
  const amk_buffer_t *x, *wg, *wu, *nw, *y;
  long long K;
  int n_tile, n_off;
};

/* The operands from the descriptors and params; CHECK: also the checks that read only those
 * (the validator's, again on the device), failing the task (false) on the first that fails. */
template <bool CHECK>
__device__ __forceinline__ bool gu_setup(const amk_task_ctx& ctx, gu_args& a) {
  const amk_params_t& p = ctx.inst->params;
  const int nin = ctx.inst->n_inputs;
  AMK_CHECK(nin >= 3 && nin <= 4 && ctx.inst->n_outputs >= 1, AMK_ERR_SHAPE, nin);
  a.x = amk_in(ctx, 0);
  a.wg = amk_in(ctx, 1);
  a.wu = amk_in(ctx, 2);
  a.nw = nin == 4 ? amk_in(ctx, 3) : nullptr;
  a.y = amk_out(ctx, 0);
  a.K = p.K;
  a.n_tile = p.N_tile;
  a.n_off = p.n_off;
  if (CHECK) {
    const amk_buffer_t* w[2] = {a.wg, a.wu};
    if (!amk_fused_check(ctx, a.x, w, 2, a.nw, a.K)) return false;
    const long long n = amk_udiv(a.wg->numel, a.K);
    AMK_CHECK(a.n_tile > 0 && a.n_off >= 0, AMK_ERR_PARAM, a.n_tile <= 0 ? a.n_tile : a.n_off);
    const long long end = (long long)a.n_off + a.n_tile;
    AMK_CHECK(a.wu->numel == a.wg->numel && end <= n && end <= amk_last_dim(a.y) &&
                  a.y->numel == amk_last_dim(a.y),
              AMK_ERR_SHAPE, end);
    AMK_CHECK(amk_is_vec(a.y->dtype), AMK_ERR_DTYPE, a.y->dtype);
  }
  return true;
}

/* gu_setup<true> out of line: run unless amk_verify_tasks passed the task (ctx.verify). */
__device__ __noinline__ bool gu_check(const amk_task_ctx& ctx) {
  gu_args a;
  return gu_setup<true>(ctx, a);
}

#ifndef AMK_GU_TRIPLES
#define AMK_GU_TRIPLES 1
#endif

__device__ void amk_op_gate_up_silu(const amk_task_ctx& ctx) {
  if (ctx.verify && !gu_check(ctx)) return;
  gu_args a;
  gu_setup<false>(ctx, a);
  const amk_params_t& p = ctx.inst->params;
  const amk_buffer_t* x = a.x;
  const amk_buffer_t* nw = a.nw;
  const amk_buffer_t* y = a.y;
  const amk_buffer_t* wg = a.wg;
  const amk_buffer_t* wu = a.wu;
  const long long K = a.K;
  const int n_tile = a.n_tile, n_off = a.n_off;
  const int wdt = wg->dtype == wu->dtype ? wg->dtype : -1;
  const bool al = amk_al16(wg->ptr) && amk_al16(wu->ptr);
#if AMK_ROW_PRE
  /* AMK_GU_TRIPLES: on the pre path, three gate/up pairs a unit (a tile of a multiple of three
     pairs, at most AMK_WARPS units, rows of up to 3 vectors a lane): each warp sums its six rows
     against each vector of the row at once and their warp sums overlap, where three units ran
     one after the other (SmolLM2: -0.035 ms a token, docs/perf-notes.md round 22); each row's
     sum is the same, in the same order. Lanes 0..2 finish one pair each. */
  if (AMK_GU_TRIPLES && n_tile % 3 == 0 && amk_pre_ok<6, 3, 1>(ctx, x, nw, K, wdt, al, n_tile / 3)) {
    const auto rows = [=](int j, const amk_buffer_t* (&wb)[6], long long (&row)[6]) {
#pragma unroll
      for (int r = 0; r < 6; ++r) {
        wb[r] = (r & 1) ? wu : wg;
        row[r] = n_off + 3LL * j + (r >> 1);
      }
    };
    const auto epi = [=](int j, const float (&s)[6]) {
      const int lane = threadIdx.x & 31;
      if (lane < 3) {
        const float gs = lane == 0 ? s[0] : lane == 1 ? s[2] : s[4];
        const float us = lane == 0 ? s[1] : lane == 1 ? s[3] : s[5];
        const float g = amk_round_dt(y->dtype, gs), u = amk_round_dt(y->dtype, us);
        amk_stf(y, (long long)n_off + 3LL * j + lane, g / (1.0f + expf(-g)) * u);
      }
    };
    if constexpr (AMK_FUSED_HAS(AMK_TILE_W_BF16, 1)) {
      if (wdt == AMK_BF16) { amk_pre_fast<AMK_TILE_W_BF16, 6, 3, 1>(ctx, x, nw, K, p.eps, n_tile / 3, rows, epi); return; }
    }
    if constexpr (AMK_FUSED_HAS(AMK_TILE_W_F16, 1)) {
      if (wdt == AMK_F16) { amk_pre_fast<AMK_TILE_W_F16, 6, 3, 1>(ctx, x, nw, K, p.eps, n_tile / 3, rows, epi); return; }
    }
  }
#endif
  /* the checks read descriptors only: the tile waits from here */
  amk_fused_tile<2, AMK_FUSED_PAIR_OF(2)>(
      ctx, false, x, nw, K, p.eps, wdt, al, n_tile,
      [=](int j, const amk_buffer_t* (&wb)[2], long long (&row)[2]) {
        wb[0] = wg;
        wb[1] = wu;
        row[0] = row[1] = n_off + j;
      },
      [=](int j, const float (&s)[2]) {
        if ((threadIdx.x & 31) == 0) {
          const float g = amk_round_dt(y->dtype, s[0]), u = amk_round_dt(y->dtype, s[1]);
          amk_stf(y, (long long)n_off + j, g / (1.0f + expf(-g)) * u);
        }
      });
}
