/* KV_APPEND (code 16): writes new K or V rows into the cache at `pos`, in place.
 *
 * Inputs [new, cache], output 0 = the cache (the validator requires the output to be the cache
 * input itself). Mirrors ops/kv-append/src/reference.rs, with the cache geometry taken from
 * the output as the CPU does:
 * - rank 2/3 cache [max_seq, ...], rows of row = numel / max_seq elements: new holds
 *   rows = new.numel / row whole rows, written to cache rows [pos, pos + rows);
 * - rank 4 cache [B, max_seq, n_kv, hd]: new is [B, n_kv*hd] and cache[b, pos] = new[b].
 * Every check happens before any write; a position outside the cache fails with
 * AMK_ERR_INDEX (detail: pos). Values go through amk_ld / amk_st (the CPU's get_f32 /
 * set_f32, cast on store). Should the output ever be a different buffer from the cache input
 * (the CPU's "separate" path), the cache is first copied into it, then a barrier, then the rows.
 *
 * Parallelisation: the whole block streams the destination spans, consecutive threads on
 * consecutive elements (coalesced). An I4 cache (two elements per byte) is written by one
 * thread, since amk_st's nibble read-modify-write is not atomic.
 */

/* One element: fp32 -> fp32 and same-width 16-bit copies inline, anything else out of line. */
__device__ __noinline__ void kva_copy_any(const amk_buffer_t* d, long long i, const amk_buffer_t* s,
                                          long long j) {
  amk_st(d, i, amk_ld(s, j));
}
__device__ __forceinline__ void kva_copy(const amk_buffer_t* d, long long i, const amk_buffer_t* s,
                                         long long j) {
  if (d->dtype == AMK_F32 && s->dtype == AMK_F32) ((float*)d->ptr)[i] = ((const float*)s->ptr)[j];
  else kva_copy_any(d, i, s, j);
}

__device__ void amk_op_kv_append(const amk_task_ctx& ctx) {
  const amk_params_t& p = ctx.inst->params;
  const amk_buffer_t* nw = amk_in(ctx, 0);
  const amk_buffer_t* src = amk_in(ctx, 1);
  const amk_buffer_t* cache = amk_out(ctx, 0);
  const bool separate = ctx.inst->inputs[1] != ctx.inst->outputs[0];
  const long long pos = p.pos;
  if (pos < 0) { amk_fail(ctx, AMK_ERR_INDEX, pos); return; }
  if (separate && src->numel != cache->numel) { amk_fail(ctx, AMK_ERR_SHAPE, src->numel); return; }

  long long dst0, len, n_spans = 1, dst_step = 0;
  if (cache->rank == 2 || cache->rank == 3) {
    const long long max_seq = cache->shape[0];
    const long long row = max_seq > 0 ? cache->numel / max_seq : 0;
    if (row == 0) { amk_fail(ctx, AMK_ERR_SHAPE, cache->numel); return; }
    if (nw->numel % row != 0) { amk_fail(ctx, AMK_ERR_SHAPE, nw->numel); return; }
    const long long rows = nw->numel / row;
    if (pos + rows > max_seq) { amk_fail(ctx, AMK_ERR_INDEX, pos); return; }
    dst0 = pos * row;
    len = rows * row;
  } else if (cache->rank == 4) {
    const long long b = cache->shape[0], max_seq = cache->shape[1];
    const long long per = cache->shape[2] * cache->shape[3];
    if (nw->numel != b * per) { amk_fail(ctx, AMK_ERR_SHAPE, nw->numel); return; }
    if (pos >= max_seq) { amk_fail(ctx, AMK_ERR_INDEX, pos); return; }
    dst0 = pos * per;
    len = per;
    n_spans = per > 0 ? b : 0;
    dst_step = max_seq * per;
  } else {
    amk_fail(ctx, AMK_ERR_SHAPE, cache->rank);
    return;
  }

  const bool serial = cache->dtype == AMK_I4;
  const long long t0 = serial ? 0 : threadIdx.x;
  const long long step = serial ? 1 : AMK_THREADS;
  const bool active = !serial || threadIdx.x == 0;

  if (separate) {
    if (active)
      for (long long i = t0; i < src->numel; i += step) kva_copy(cache, i, src, i);
    __syncthreads();
  }
  if (!active) return;
  /* span s: cache[dst0 + s*dst_step + i] = new[s*len + i], i < len */
  const long long total = n_spans * len;
  for (long long k = t0; k < total; k += step) {
    const long long s = k / len;
    const long long i = k - s * len;
    kva_copy(cache, dst0 + s * dst_step + i, nw, k);
  }
}
