/* KV_APPEND (code 16): writes new K or V rows into the cache at `pos`, in place.
 *
 * Inputs [new, cache] (the row: param pos) or [new, cache, pos] (the row: element 0 of that
 * integer buffer, read here: the scheduler waits for the task's counters before this op runs),
 * output 0 = the cache (the validator requires the output to be the cache input itself).
 * Mirrors ops/kv-append/src/reference.rs, with the cache geometry taken from the output as the
 * CPU does:
 * - rank 2/3 cache [max_seq, ...], rows of row = numel / max_seq elements: new holds
 *   rows = new.numel / row whole rows, written to cache rows [pos, pos + rows);
 * - rank 4 cache [B, max_seq, n_kv, hd]: new is [B, n_kv*hd] and cache[b, pos] = new[b].
 * With params n_off / N_tile (N_tile > 0; rank 2/3 only) the task writes only columns
 * [n_off, n_off + N_tile) of each of its rows (a row viewed as `row` elements): a chunk's
 * append split over several tasks, each its slice of every row.
 * Every check happens before any write; a position outside the cache fails with
 * AMK_ERR_INDEX (detail: pos). Values go through amk_ld / amk_st (the CPU's get_f32 /
 * set_f32, cast on store). Should the output ever be a different buffer from the cache input
 * (the CPU's "separate" path), the cache is first copied into it, then a barrier, then the rows.
 *
 * Parallelisation: the whole block streams the destination spans, consecutive threads on
 * consecutive elements (coalesced). F32/BF16/F16 new rows and cache (any pair) with spans and
 * offsets that are whole 8-element units (the decode case: one [n_kv, hd] row) go 8 elements
 * per 16-byte access, each thread issuing KVA_NB units' loads before storing any (kva_store8:
 * the same dtype as bits, other pairs through f32 exactly as amk_ld / amk_st); more than a round
 * of those in one span (a prefill chunk's rows) goes through shared memory instead
 * (kva_staged). Everything else element by element. An I4 cache (two elements per byte) is
 * written by one thread, since amk_st's nibble read-modify-write is not atomic.
 */

#define KVA_NB 4 /* 8-element units in flight per thread */


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

/* Unit u of the cache (dtype ddt) from the 8 elements a/b of new (dtype sdt; b only for F32).
 * The same dtype is the same bits: the round trip through f32 (amk_cvt8, amk_st8) is exact for
 * every value but a signalling NaN, which it would quiet. Converting every element cost a 1B
 * prefill chunk's 512-row append ~40 us of one SM's instructions (docs/perf-notes.md round
 * 38); other pairs convert as amk_ld / amk_st. */
__device__ __forceinline__ void kva_store8(void* cache, int sdt, int ddt, long long u, const uint4& a,
                                           const uint4& b) {
  if (sdt == ddt) {
    uint4* q = (uint4*)cache + (ddt == AMK_F32 ? 2 * u : u);
    q[0] = a;
    if (ddt == AMK_F32) q[1] = b;
    return;
  }
  float f[8];
  amk_cvt8(sdt, a, b, f);
  amk_st8(cache, ddt, u, f);
}

/* The staged path for many contiguous rows (a prefill chunk's 512 rows are 32,768 units):
 * units of new go global -> shared memory through cp.async in a ring of KVA_STAGES stages,
 * KVA_STAGES - 1 of them in flight while the block stores the oldest, so one block keeps three
 * quarters of its shared memory of loads in flight instead of the register path's KVA_NB units
 * a thread (16 KB a block): ~2 % of a SmolLM2 prefill chunk against the register path, both
 * copying bits (docs/perf-notes.md round 38). The same stores as the register path
 * (kva_store8), so the same values. False (nothing done) when the shared memory cannot hold
 * KVA_STAGES stages of a unit a thread. */
#define KVA_STAGES 4
__device__ bool kva_staged(const amk_task_ctx& ctx, const amk_buffer_t* nw, unsigned units,
                           const amk_buffer_t* cache, long long d0) {
  const int sdt = nw->dtype, ddt = cache->dtype;
  const bool f32 = sdt == AMK_F32;
  const unsigned ub = f32 ? 32u : 16u; /* bytes of a unit of new */
  const unsigned stage = ((unsigned)ctx.smem_bytes / KVA_STAGES / ub) / AMK_THREADS * AMK_THREADS;
  if (stage == 0) return false;
  unsigned char* ring = ctx.smem;
  const unsigned char* s = (const unsigned char*)nw->ptr;
  const unsigned n_stages = (units + stage - 1) / stage;
  /* Stage i's units [i * stage, ...) into ring slot i % KVA_STAGES; always one commit group. */
  auto issue = [&](unsigned i) {
    if (i < n_stages) {
      unsigned char* slot = ring + (size_t)(i % KVA_STAGES) * stage * ub;
      const unsigned first = i * stage, n = min(stage, units - first);
      for (unsigned u = threadIdx.x; u < n; u += AMK_THREADS) {
        const unsigned char* from = s + (size_t)(first + u) * ub;
        amk_cp_async16(slot + (size_t)u * ub, from);
        if (f32) amk_cp_async16(slot + (size_t)u * ub + 16, from + 16);
      }
    }
    amk_cp_async_commit();
  };
#pragma unroll 1
  for (unsigned i = 0; i + 1 < KVA_STAGES; ++i) issue(i);
#pragma unroll 1
  for (unsigned i = 0; i < n_stages; ++i) {
    amk_cp_async_wait_group<KVA_STAGES - 2>(); /* this thread's copies of stage i landed */
    __syncthreads();                           /* and every other thread's */
    const unsigned char* slot = ring + (size_t)(i % KVA_STAGES) * stage * ub;
    const unsigned first = i * stage, n = min(stage, units - first);
    for (unsigned u = threadIdx.x; u < n; u += AMK_THREADS) {
      const uint4 a = *(const uint4*)(slot + (size_t)u * ub);
      const uint4 b = f32 ? *(const uint4*)(slot + (size_t)u * ub + 16) : make_uint4(0u, 0u, 0u, 0u);
      kva_store8(cache->ptr, sdt, ddt, d0 + first + u, a, b);
    }
    __syncthreads(); /* slot i % KVA_STAGES is read: stage i + KVA_STAGES - 1 may refill it */
    issue(i + KVA_STAGES - 1);
  }
  amk_cp_async_wait_all();
  return true;
}

__device__ void amk_op_kv_append(const amk_task_ctx& ctx) {
  const amk_params_t& p = ctx.inst->params;
  const amk_buffer_t* nw = amk_in(ctx, 0);
  const amk_buffer_t* src = amk_in(ctx, 1);
  const amk_buffer_t* cache = amk_out(ctx, 0);
  const bool separate = ctx.inst->inputs[1] != ctx.inst->outputs[0];
  long long pos = p.pos;
  if (ctx.inst->n_inputs > 2) {
    const amk_buffer_t* pb = amk_in(ctx, 2);
    if (!amk_is_int(pb->dtype) || pb->numel < 1) { amk_fail(ctx, AMK_ERR_DTYPE, pb->dtype); return; }
    pos = amk_ldif(pb, 0);
  }
  if (pos < 0) { amk_fail(ctx, AMK_ERR_INDEX, pos); return; }
  if (separate && src->numel != cache->numel) { amk_fail(ctx, AMK_ERR_SHAPE, src->numel); return; }

  /* Span s (of n_spans): cache[dst0 + s*dst_step + i] = new[src0 + s*src_step + i], i < len. */
  long long dst0, len, n_spans = 1, dst_step = 0, src0 = 0, src_step = 0;
  const bool cols = p.N_tile > 0;
  if (cache->rank == 2 || cache->rank == 3) {
    const long long max_seq = cache->shape[0];
    const long long row = max_seq > 0 ? cache->numel / max_seq : 0;
    if (row == 0) { amk_fail(ctx, AMK_ERR_SHAPE, cache->numel); return; }
    if (nw->numel % row != 0) { amk_fail(ctx, AMK_ERR_SHAPE, nw->numel); return; }
    const long long rows = nw->numel / row;
    if (pos + rows > max_seq) { amk_fail(ctx, AMK_ERR_INDEX, pos); return; }
    if (cols && (p.n_off < 0 || (long long)p.n_off + p.N_tile > row)) { amk_fail(ctx, AMK_ERR_SHAPE, p.n_off); return; }
    dst0 = pos * row + (cols ? p.n_off : 0);
    len = cols ? p.N_tile : rows * row;
    n_spans = cols ? rows : 1;
    dst_step = row;
    src0 = cols ? p.n_off : 0;
    src_step = row;
  } else if (cache->rank == 4) {
    const long long b = cache->shape[0], max_seq = cache->shape[1];
    const long long per = cache->shape[2] * cache->shape[3];
    if (nw->numel != b * per) { amk_fail(ctx, AMK_ERR_SHAPE, nw->numel); return; }
    if (pos >= max_seq) { amk_fail(ctx, AMK_ERR_INDEX, pos); return; }
    if (cols) { amk_fail(ctx, AMK_ERR_SHAPE, p.N_tile); return; }
    dst0 = pos * per;
    len = per;
    n_spans = per > 0 ? b : 0;
    dst_step = max_seq * per;
    src_step = per;
  } else {
    amk_fail(ctx, AMK_ERR_SHAPE, cache->rank);
    return;
  }

  /* Vector path: unit (src0 + s*src_step)/8 + i of new goes to cache unit
   * (dst0 + s*dst_step)/8 + i, for the task's unit u: span s = u / upr, i = u % upr. */
  if (!separate && amk_is_vec(nw->dtype) && amk_is_vec(cache->dtype) && len % 8 == 0 &&
      dst0 % 8 == 0 && dst_step % 8 == 0 && src0 % 8 == 0 && src_step % 8 == 0 &&
      n_spans * (len / 8) < 0x7fffffffLL &&
      ((((unsigned long long)nw->ptr) | ((unsigned long long)cache->ptr)) & 15) == 0) {
    const unsigned upr = (unsigned)(len / 8);
    const unsigned units = (unsigned)(n_spans * upr);
    const long long d0 = dst0 / 8, dstep = dst_step / 8, s0 = src0 / 8, sstep = src_step / 8;
    const int sdt = nw->dtype, ddt = cache->dtype;
    const bool f32 = sdt == AMK_F32;
    /* The staged path copies new from its first unit on: one span from the start of new. */
    if (n_spans == 1 && s0 == 0 && units > KVA_NB * AMK_THREADS &&
        kva_staged(ctx, nw, units, cache, d0))
      return;
    for (unsigned b = 0; b < units; b += KVA_NB * AMK_THREADS) {
      uint4 w0[KVA_NB], w1[KVA_NB];
#pragma unroll
      for (int k = 0; k < KVA_NB; ++k) {
        const unsigned u = b + threadIdx.x + (unsigned)k * AMK_THREADS;
        w0[k] = w1[k] = make_uint4(0u, 0u, 0u, 0u); /* defined on every path */
        if (u < units) {
          const unsigned s = n_spans == 1 ? 0u : u / upr;
          amk_ld8_raw(nw->ptr, f32 ? AMK_F32 : AMK_BF16, s0 + (long long)s * sstep + (u - s * upr),
                      w0[k], w1[k]);
        }
      }
#pragma unroll
      for (int k = 0; k < KVA_NB; ++k) {
        const unsigned u = b + threadIdx.x + (unsigned)k * AMK_THREADS;
        if (u < units) {
          const unsigned s = n_spans == 1 ? 0u : u / upr;
          kva_store8(cache->ptr, sdt, ddt, d0 + (long long)s * dstep + (u - s * upr),
                     w0[k], w1[k]);
        }
      }
    }
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
  const long long total = n_spans * len;
  for (long long k = t0; k < total; k += step) {
    const long long s = k / len;
    const long long i = k - s * len;
    kva_copy(cache, dst0 + s * dst_step + i, nw, src0 + s * src_step + i);
  }
}
