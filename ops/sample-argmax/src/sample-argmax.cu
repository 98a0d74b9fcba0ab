/* SAMPLE_ARGMAX (opcode 17): for every row of the logits (all leading dims; rank 0 is one row
 * of one), the lowest index of the largest non-NaN value along the last dim, written as I32.
 * NaN never wins; an all-NaN row gives 0; ties (including -0.0 == +0.0 and all -inf) go to
 * the lowest index.
 *
 * One block per row at a time: every thread keeps its best (value, index) over a block-strided
 * pass (F32 rows with a 16-byte aligned start: float4 loads, 4 in flight; everything else
 * scalar), visiting its own indices in increasing order so a strict `>` keeps the lowest index
 * among its ties; then a warp-shuffle and a cross-warp reduction with an explicit tie rule. */

/* (v, i) candidates; i < 0 means "none yet" (only NaNs or nothing seen). */
__device__ __forceinline__ void sa_take(float& bv, int& bi, float v, int i) {
  if (v == v && (bi < 0 || v > bv)) {
    bv = v;
    bi = i;
  }
}

/* Merge two candidates: a real one beats none, larger value wins, equal values: lower index. */
__device__ __forceinline__ void sa_merge(float& bv, int& bi, float ov, int oi) {
  if (oi < 0) return;
  if (bi < 0 || ov > bv || (ov == bv && oi < bi)) {
    bv = ov;
    bi = oi;
  }
}

__device__ void amk_op_sample_argmax(const amk_task_ctx& ctx) {
  __shared__ float s_v[AMK_WARPS];
  __shared__ int s_i[AMK_WARPS];
  if (ctx.inst->n_inputs != 1 || ctx.inst->n_outputs < 1) {
    amk_fail(ctx, AMK_ERR_SHAPE, ctx.inst->n_inputs);
    return;
  }
  const amk_buffer_t* xb = amk_in(ctx, 0);
  const amk_buffer_t* ob = amk_out(ctx, 0);
  if (!amk_is_float(xb->dtype)) { amk_fail(ctx, AMK_ERR_DTYPE, xb->dtype); return; }
  if (ob->dtype != AMK_I32) { amk_fail(ctx, AMK_ERR_DTYPE, ob->dtype); return; }
  const long long V = amk_last_dim(xb);
  if (V <= 0) { amk_fail(ctx, AMK_ERR_SHAPE, V); return; }
  const long long rows = xb->numel / V;
  if (ob->numel != rows) { amk_fail(ctx, AMK_ERR_SHAPE, ob->numel); return; }

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int dt = xb->dtype;
  int32_t* out = (int32_t*)ob->ptr;
  for (long long r = 0; r < rows; ++r) {
    float bv = 0.0f;
    int bi = -1;
    const long long base = r * V;
    if (dt == AMK_F32) {
      const float* row = (const float*)xb->ptr + base;
      const float4* row4 = (const float4*)row;
      /* float4 only when the row starts 16-byte aligned (always for V % 4 == 0). */
      const int nv = (((unsigned long long)row) & 15ull) == 0 ? (int)(V >> 2) : 0;
      constexpr int U = 4;
      for (int v0 = 0; v0 < nv; v0 += U * AMK_THREADS) {
        float4 f[U];
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int v = v0 + u * AMK_THREADS + tid;
          if (v < nv) f[u] = row4[v];
        }
#pragma unroll
        for (int u = 0; u < U; ++u) {
          const int v = v0 + u * AMK_THREADS + tid;
          if (v < nv) {
            sa_take(bv, bi, f[u].x, 4 * v);
            sa_take(bv, bi, f[u].y, 4 * v + 1);
            sa_take(bv, bi, f[u].z, 4 * v + 2);
            sa_take(bv, bi, f[u].w, 4 * v + 3);
          }
        }
      }
      /* The tail (V % 4 elements) comes after every vector index: still increasing per thread. */
      for (int j = 4 * nv + tid; j < V; j += AMK_THREADS) sa_take(bv, bi, row[j], j);
    } else if (dt == AMK_BF16 || dt == AMK_F16) {
      const uint16_t* row = (const uint16_t*)xb->ptr + base;
      const bool bf = dt == AMK_BF16;
      for (int j = tid; j < V; j += AMK_THREADS) {
        const uint16_t h = row[j];
        sa_take(bv, bi, bf ? amk_bf16_to_f32(h) : amk_f16_to_f32(h), j);
      }
    } else {
      for (int j = tid; j < V; j += AMK_THREADS) sa_take(bv, bi, amk_ld_slow(xb, base + j), j);
    }
    /* Warp reduce, then the warps' winners through shared memory. */
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
      sa_merge(bv, bi, ov, oi);
    }
    __syncthreads(); /* the previous row (or task) is done reading s_v / s_i */
    if (lane == 0) {
      s_v[warp] = bv;
      s_i[warp] = bi;
    }
    __syncthreads();
    if (tid == 0) {
      float v = s_v[0];
      int i = s_i[0];
      for (int w = 1; w < AMK_WARPS; ++w) sa_merge(v, i, s_v[w], s_i[w]);
      out[r] = i < 0 ? 0 : i;
    }
  }
}
