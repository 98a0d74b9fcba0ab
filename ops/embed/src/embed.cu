/* embed.cu — CUDA device function of EMBED (amk_op_embed);
 * the semantics are ops/embed/src/reference.rs.
 * Parallelisation: one id (the decode case: the token lookup, and the reshape bridge with
 * ids = [0] over a [1, dim] activation) is read by every thread itself (same value, so a bad id
 * fails block-uniformly, no barrier) and its row copied with 16-byte accesses, each thread
 * keeping EMB_NB loads in flight; for a one-row table (the bridge: only id 0 is valid) the row
 * is loaded while the id is still in flight and stored only once the id checked out. Several
 * ids: validated block-wide first, then coalesced row copies, 16/8/4-byte vectors for
 * same-dtype rows, 8-element F32/BF16/F16 casts, scalar otherwise. */

#define EMB_NB 4 /* 16-byte loads in flight per thread */


/* d[v] = s[v] for v < units (16-byte units), each thread loading EMB_NB units before storing
 * any. check() runs once in every thread after the first loads were issued and before any
 * store; false stops the copy (it has failed the task). */
template <typename C>
__device__ __forceinline__ void emb_copy16(const uint4* s, uint4* d, long long units, C check) {
  long long b = 0;
  do {
    uint4 r[EMB_NB];
#pragma unroll
    for (int k = 0; k < EMB_NB; ++k) {
      const long long v = b + threadIdx.x + (long long)k * AMK_THREADS;
      r[k] = make_uint4(0u, 0u, 0u, 0u); /* defined on every path: no undef kept live */
      if (v < units) r[k] = s[v];
    }
    if (b == 0 && !check()) return;
#pragma unroll
    for (int k = 0; k < EMB_NB; ++k) {
      const long long v = b + threadIdx.x + (long long)k * AMK_THREADS;
      if (v < units) d[v] = r[k];
    }
    b += (long long)EMB_NB * AMK_THREADS;
  } while (b < units);
}

/* out[8v .. 8v+7] = table row elements 8v .. 8v+7 (F32/BF16/F16 cast, exact as amk_ld/amk_st)
 * for v < units, EMB_NB/2 units in flight per thread. */
__device__ __forceinline__ void emb_cast8(const void* src, int sdt, void* dst, int ddt,
                                          long long units) {
  constexpr int NB = EMB_NB / 2;
  const bool f32 = sdt == AMK_F32;
  for (long long b = 0; b < units; b += (long long)NB * AMK_THREADS) {
    uint4 w0[NB], w1[NB];
#pragma unroll
    for (int k = 0; k < NB; ++k) {
      const long long v = b + threadIdx.x + (long long)k * AMK_THREADS;
      w0[k] = w1[k] = make_uint4(0u, 0u, 0u, 0u);
      if (v < units) amk_ld8_raw(src, f32 ? AMK_F32 : AMK_BF16, v, w0[k], w1[k]);
    }
#pragma unroll
    for (int k = 0; k < NB; ++k) {
      const long long v = b + threadIdx.x + (long long)k * AMK_THREADS;
      if (v < units) {
        float f[8];
        amk_cvt8(sdt, w0[k], w1[k], f);
        amk_st8(dst, ddt, v, f);
      }
    }
  }
}

/* out row k (upr units of U) = table row ids[k]. Row-major: one row per step when rows are
 * wide, else flattened over (k, unit) so short rows still use every thread. */
template <typename U>
__device__ __forceinline__ void gather_raw(const amk_buffer_t* ids, const void* table, void* out,
                                           long long n_ids, long long upr) {
  const U* t = (const U*)table;
  U* o = (U*)out;
  if (upr >= AMK_THREADS) {
    for (long long k = 0; k < n_ids; ++k) {
      const long long id = amk_ldif(ids, k);
      const U* s = t + id * upr;
      U* d = o + k * upr;
      for (long long v = threadIdx.x; v < upr; v += AMK_THREADS) d[v] = s[v];
    }
  } else {
    const long long total = n_ids * upr;
    for (long long e = threadIdx.x; e < total; e += AMK_THREADS) {
      const long long k = e / upr, v = e - k * upr;
      o[e] = t[amk_ldif(ids, k) * upr + v];
    }
  }
}

/* EMBED [ids, table] -> out (ops/embed/src/reference.rs): out = table.index_select(0, ids),
 * viewed as out. rows = table.shape[0] (1 for rank 0), row = table.numel / rows elements. Every
 * id is checked before anything is written: id < 0 or >= rows fails AMK_ERR_INDEX with the
 * first bad id (never clamped). Cast on store through f32, or through i64 when table and out are
 * both integer dtypes. With ids = [0] over a [1, dim] activation this is the reshape bridge. */
__device__ void amk_op_embed(const amk_task_ctx& ctx) {
  __shared__ unsigned long long s_bad;
  const amk_buffer_t* ids = amk_in(ctx, 0);
  const amk_buffer_t* table = amk_in(ctx, 1);
  const amk_buffer_t* out = amk_out(ctx, 0);
  if (!amk_is_int(ids->dtype)) {
    amk_fail(ctx, AMK_ERR_DTYPE, ids->dtype);
    return;
  }
  const long long rows = table->rank > 0 ? table->shape[0] : 1;
  const long long row = table->numel / (rows > 1 ? rows : 1);
  const long long n_ids = ids->numel;
  const long long n = n_ids * row;
  if (out->numel != n) {
    amk_fail(ctx, AMK_ERR_SHAPE, out->numel);
    return;
  }
  const int sz = amk_raw_size(table->dtype);
  const bool same = table->dtype == out->dtype && sz > 0;
  const bool exact_ints = amk_is_int(table->dtype) && amk_is_int(out->dtype);
  const bool al16 = ((((unsigned long long)table->ptr) | ((unsigned long long)out->ptr)) & 15) == 0;
  if (n_ids == 1) {
    /* One id: every thread reads it (the same value: a failure is block-uniform). */
    const auto check = [&](long long id) -> bool {
      if (id < 0 || id >= rows) {
        amk_fail(ctx, AMK_ERR_INDEX, id);
        return false;
      }
      return true;
    };
    const long long rb = row * sz;
    const bool raw16 = same && rb % 16 == 0 && al16;
    if (raw16 && rows == 1) {
      /* Bit copy of the only row (the bridge): a one-row table admits only id 0, so the row's
       * loads are issued first and the id is read and checked while they are in flight
       * (nothing is stored before the check). */
      emb_copy16((const uint4*)table->ptr, (uint4*)out->ptr, rb / 16,
                 [&]() { return check(amk_ldif(ids, 0)); });
      return;
    }
    const long long id = amk_ldif(ids, 0);
    if (!check(id)) return;
    if (raw16) {
      /* Bit copy of row id. */
      emb_copy16((const uint4*)table->ptr + id * (rb / 16), (uint4*)out->ptr, rb / 16,
                 []() { return true; });
      return;
    }
    if (n == 0) return;
    if (!same && !exact_ints && amk_is_vec(table->dtype) && amk_is_vec(out->dtype) &&
        row % 8 == 0 && al16) {
      /* F32/BF16/F16 cast of the row (e.g. a bf16 table into f32 activations). */
      emb_cast8(table->dtype == AMK_F32 ? (const void*)((const float*)table->ptr + id * row)
                                        : (const void*)((const uint16_t*)table->ptr + id * row),
                table->dtype, out->ptr, out->dtype, row / 8);
      return;
    }
    /* Anything else: the general paths below (they read the id again, same value). */
  } else {
    /* Validate every id first (block-wide), report the first bad one as the CPU does. */
    __syncthreads(); /* s_bad may still be read by a previous call of this block */
    if (threadIdx.x == 0) s_bad = ~0ull;
    __syncthreads();
    for (long long k = threadIdx.x; k < n_ids; k += AMK_THREADS) {
      const long long id = amk_ldif(ids, k);
      if (id < 0 || id >= rows) atomicMin(&s_bad, (unsigned long long)k);
    }
    __syncthreads();
    const unsigned long long bad = s_bad;
    if (bad != ~0ull) {
      amk_fail(ctx, AMK_ERR_INDEX, amk_ldif(ids, (long long)bad));
      return;
    }
    if (n == 0) return;
  }
  if (same) {
    /* Same dtype: bit copy of whole rows, widest access the row length allows (row starts are
     * then aligned to it, both bases being 256-byte aligned). */
    const long long rb = row * sz;
    if (rb % 16 == 0) gather_raw<uint4>(ids, table->ptr, out->ptr, n_ids, rb / 16);
    else if (rb % 8 == 0) gather_raw<uint2>(ids, table->ptr, out->ptr, n_ids, rb / 8);
    else if (rb % 4 == 0) gather_raw<uint32_t>(ids, table->ptr, out->ptr, n_ids, rb / 4);
    else if (rb % 2 == 0) gather_raw<uint16_t>(ids, table->ptr, out->ptr, n_ids, rb / 2);
    else gather_raw<uint8_t>(ids, table->ptr, out->ptr, n_ids, rb);
    return;
  }
  if (!exact_ints && amk_is_vec(table->dtype) && amk_is_vec(out->dtype) && row % 8 == 0) {
    /* F32/BF16/F16 cast (e.g. a bf16 table into f32 activations): 8 elements per step. */
    const long long upr = row / 8, total = n_ids * upr;
    for (long long e = threadIdx.x; e < total; e += AMK_THREADS) {
      const long long k = e / upr, v = e - k * upr;
      float f[8];
      amk_ld8(table->ptr, table->dtype, amk_ldif(ids, k) * upr + v, f);
      amk_st8(out->ptr, out->dtype, e, f);
    }
    return;
  }
  amk_each_out(out, 0, n, [&](long long e) {
    const long long k = e / row, j = e - k * row;
    const long long src = amk_ldif(ids, k) * row + j;
    if (exact_ints) amk_stif(out, e, amk_ldif(table, src));
    else amk_stf(out, e, amk_ldf(table, src));
  });
}
