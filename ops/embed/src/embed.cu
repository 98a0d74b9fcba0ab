/* embed.cu — CUDA device function of EMBED (amk_op_embed);
 * the semantics are ops/embed/src/reference.rs.
 * Parallelisation: ids validated block-wide first; then coalesced row copies, 16/8/4-byte
 * vectors for same-dtype rows, 8-element F32/BF16/F16 casts, scalar otherwise. */

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
  const int sz = amk_raw_size(table->dtype);
  if (table->dtype == out->dtype && sz > 0) {
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
  const bool exact_ints = amk_is_int(table->dtype) && amk_is_int(out->dtype);
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
