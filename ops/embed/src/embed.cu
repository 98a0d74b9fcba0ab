/* embed.cu — CUDA device function of EMBED (amk_op_embed);
 * the semantics are ops/embed/src/reference.rs.
 * Parallelisation: ids validated block-wide first; then coalesced row copies, 16/8/4-byte
 * vectors for same-dtype rows, 8-element F32/BF16/F16 casts, scalar otherwise. */

/* Element load/store with exactly amk_ld/amk_st's results: F32/BF16/F16 inline, every other
 * dtype through one out-of-line call (keeps the megakernel's code size down). */
__device__ __noinline__ float ld_slow(const amk_buffer_t* b, long long i) { return amk_ld(b, i); }
__device__ __noinline__ void st_slow(const amk_buffer_t* b, long long i, float x) {
  amk_st(b, i, x);
}
__device__ __forceinline__ float ld_f(const amk_buffer_t* b, long long i) {
  const int dt = b->dtype;
  if (dt == AMK_F32) return ((const float*)b->ptr)[i];
  if (dt == AMK_BF16) return amk_bf16_to_f32(((const uint16_t*)b->ptr)[i]);
  if (dt == AMK_F16) return amk_f16_to_f32(((const uint16_t*)b->ptr)[i]);
  return ld_slow(b, i);
}
__device__ __forceinline__ void st_f(const amk_buffer_t* b, long long i, float x) {
  const int dt = b->dtype;
  if (dt == AMK_F32) ((float*)b->ptr)[i] = x;
  else if (dt == AMK_BF16) ((uint16_t*)b->ptr)[i] = amk_f32_to_bf16(x);
  else if (dt == AMK_F16) ((uint16_t*)b->ptr)[i] = amk_f32_to_f16(x);
  else st_slow(b, i, x);
}

__device__ __noinline__ long long ldi_slow(const amk_buffer_t* b, long long i) {
  return amk_ldi(b, i);
}
__device__ __noinline__ void sti_slow(const amk_buffer_t* b, long long i, long long x) {
  amk_sti(b, i, x);
}
/* amk_ldi / amk_sti with the I32 case inline. */
__device__ __forceinline__ long long ldi_f(const amk_buffer_t* b, long long i) {
  return b->dtype == AMK_I32 ? (long long)((const int32_t*)b->ptr)[i] : ldi_slow(b, i);
}
__device__ __forceinline__ void sti_f(const amk_buffer_t* b, long long i, long long x) {
  if (b->dtype == AMK_I32)
    ((int32_t*)b->ptr)[i] =
        (int32_t)(x < -2147483648LL ? -2147483648LL : (x > 2147483647LL ? 2147483647LL : x));
  else
    sti_slow(b, i, x);
}

/* ---- dtype helpers (local copies: every op file stands alone) ---- */

/* The CPU VM's DType::is_integer. */
__device__ __forceinline__ bool is_int_dtype(int dt) {
  return dt == AMK_I32 || dt == AMK_I8 || dt == AMK_I4 || dt == AMK_U8 || dt == AMK_BOOL;
}
/* Dtypes with a vectorised 8-element load/store (one or two 16-byte accesses). */
__device__ __forceinline__ bool is_vec_dtype(int dt) {
  return dt == AMK_F32 || dt == AMK_BF16 || dt == AMK_F16;
}

/* Elements 8u .. 8u+7 of an F32/BF16/F16 array as f32 (exact, as amk_ld). */
__device__ __forceinline__ void ld8(const void* p, int dt, long long u, float* f) {
  if (dt == AMK_F32) {
    const uint4* q = (const uint4*)p + 2 * u;
    const uint4 a = q[0], b = q[1];
    f[0] = __uint_as_float(a.x); f[1] = __uint_as_float(a.y);
    f[2] = __uint_as_float(a.z); f[3] = __uint_as_float(a.w);
    f[4] = __uint_as_float(b.x); f[5] = __uint_as_float(b.y);
    f[6] = __uint_as_float(b.z); f[7] = __uint_as_float(b.w);
  } else {
    const uint4 a = ((const uint4*)p)[u];
    const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint16_t lo = (uint16_t)(w[k] & 0xffffu), hi = (uint16_t)(w[k] >> 16);
      if (dt == AMK_BF16) {
        f[2 * k] = amk_bf16_to_f32(lo);
        f[2 * k + 1] = amk_bf16_to_f32(hi);
      } else {
        f[2 * k] = amk_f16_to_f32(lo);
        f[2 * k + 1] = amk_f16_to_f32(hi);
      }
    }
  }
}

/* Stores f[0..8) at elements 8u .. 8u+7, cast on store exactly as amk_st. */
__device__ __forceinline__ void st8(void* p, int dt, long long u, const float* f) {
  if (dt == AMK_F32) {
    uint4* q = (uint4*)p + 2 * u;
    q[0] = make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]),
                      __float_as_uint(f[3]));
    q[1] = make_uint4(__float_as_uint(f[4]), __float_as_uint(f[5]), __float_as_uint(f[6]),
                      __float_as_uint(f[7]));
  } else {
    uint32_t w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      uint16_t lo, hi;
      if (dt == AMK_BF16) {
        lo = amk_f32_to_bf16(f[2 * k]);
        hi = amk_f32_to_bf16(f[2 * k + 1]);
      } else {
        lo = amk_f32_to_f16(f[2 * k]);
        hi = amk_f32_to_f16(f[2 * k + 1]);
      }
      w[k] = (uint32_t)lo | ((uint32_t)hi << 16);
    }
    ((uint4*)p)[u] = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

/* Calls g(e) for every output element e in [lo, n), block-strided and coalesced. An I4 output
 * packs two elements per byte (rows of ceil(K/2) bytes): there each thread owns whole bytes and
 * writes both nibbles itself, so no two threads read-modify-write one byte (lo must be 0). */
template <typename G>
__device__ __forceinline__ void each_out(const amk_buffer_t* out, long long lo, long long n, G g) {
  if (out->dtype == AMK_I4) {
    const long long k = amk_last_dim(out);
    if (k < 1) return;
    const long long bpr = (k + 1) / 2;
    const long long nbytes = (n / k) * bpr;
    for (long long b = threadIdx.x; b < nbytes; b += AMK_THREADS) {
      const long long row = b / bpr, c = b - row * bpr;
      const long long e = row * k + 2 * c;
      g(e);
      if (2 * c + 1 < k) g(e + 1);
    }
    return;
  }
  for (long long i = lo + threadIdx.x; i < n; i += AMK_THREADS) g(i);
}

/* Element size of the dtypes whose same-dtype row copy is the identity on the stored bits. */
__device__ __forceinline__ int raw_size(int dt) {
  switch (dt) {
    case AMK_F32: case AMK_I32: return 4;
    case AMK_F16: case AMK_BF16: return 2;
    case AMK_I8: case AMK_U8: return 1;
    default: return 0; /* BOOL (normalises to 0/1), fp8 (NaN codes), I4 (padding nibbles) */
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
      const long long id = ldi_f(ids, k);
      const U* s = t + id * upr;
      U* d = o + k * upr;
      for (long long v = threadIdx.x; v < upr; v += AMK_THREADS) d[v] = s[v];
    }
  } else {
    const long long total = n_ids * upr;
    for (long long e = threadIdx.x; e < total; e += AMK_THREADS) {
      const long long k = e / upr, v = e - k * upr;
      o[e] = t[ldi_f(ids, k) * upr + v];
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
  if (!is_int_dtype(ids->dtype)) {
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
    const long long id = ldi_f(ids, k);
    if (id < 0 || id >= rows) atomicMin(&s_bad, (unsigned long long)k);
  }
  __syncthreads();
  const unsigned long long bad = s_bad;
  if (bad != ~0ull) {
    amk_fail(ctx, AMK_ERR_INDEX, ldi_f(ids, (long long)bad));
    return;
  }
  if (n == 0) return;
  const int sz = raw_size(table->dtype);
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
  const bool exact_ints = is_int_dtype(table->dtype) && is_int_dtype(out->dtype);
  if (!exact_ints && is_vec_dtype(table->dtype) && is_vec_dtype(out->dtype) && row % 8 == 0) {
    /* F32/BF16/F16 cast (e.g. a bf16 table into f32 activations): 8 elements per step. */
    const long long upr = row / 8, total = n_ids * upr;
    for (long long e = threadIdx.x; e < total; e += AMK_THREADS) {
      const long long k = e / upr, v = e - k * upr;
      float f[8];
      ld8(table->ptr, table->dtype, ldi_f(ids, k) * upr + v, f);
      st8(out->ptr, out->dtype, e, f);
    }
    return;
  }
  each_out(out, 0, n, [&](long long e) {
    const long long k = e / row, j = e - k * row;
    const long long src = ldi_f(ids, k) * row + j;
    if (exact_ints) sti_f(out, e, ldi_f(table, src));
    else st_f(out, e, ld_f(table, src));
  });
}
