/* copy.cu — CUDA device function of COPY (amk_op_copy);
 * the semantics are ops/copy/src/reference.rs.
 * Parallelisation: block-strided; same-dtype copies are 16-byte vector byte copies, F32/BF16/F16
 * casts go 8 elements per step, everything else element by element (whole bytes per thread
 * for an I4 output). */

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

/* Byte copy of `bytes` bytes between 16-byte aligned bases: uint4 body, byte tail. */
__device__ __forceinline__ void raw_copy(void* dst, const void* src, long long bytes) {
  const long long nv = bytes / 16;
  const uint4* s = (const uint4*)src;
  uint4* d = (uint4*)dst;
  for (long long v = threadIdx.x; v < nv; v += AMK_THREADS) d[v] = s[v];
  const unsigned char* sb = (const unsigned char*)src;
  unsigned char* db = (unsigned char*)dst;
  for (long long b = nv * 16 + threadIdx.x; b < bytes; b += AMK_THREADS) db[b] = sb[b];
}

/* Element size of the dtypes whose same-dtype COPY is the identity on the stored bits. */
__device__ __forceinline__ int raw_size(int dt) {
  switch (dt) {
    case AMK_F32: case AMK_I32: return 4;
    case AMK_F16: case AMK_BF16: return 2;
    case AMK_I8: case AMK_U8: return 1;
    default: return 0; /* BOOL (normalises to 0/1), fp8 (NaN codes), I4 (padding nibbles) */
  }
}

/* COPY x -> out (ops/copy/src/reference.rs): out[i] = x[i] cast on store, operands viewed.
 * Integer -> integer (I32/I8/I4/U8/BOOL both sides) goes through i64 (amk_ldi/amk_sti, exact,
 * saturating); every other pair through f32 (amk_ld/amk_st). */
__device__ void amk_op_copy(const amk_task_ctx& ctx) {
  const amk_buffer_t* x = amk_in(ctx, 0);
  const amk_buffer_t* out = amk_out(ctx, 0);
  const long long n = out->numel;
  if (x->numel != n) {
    amk_fail(ctx, AMK_ERR_SHAPE, x->numel);
    return;
  }
  const int sz = raw_size(x->dtype);
  if (x->dtype == out->dtype && sz > 0) {
    /* Same dtype, identity through the reference's round trip: plain vectorised byte copy. */
    raw_copy(out->ptr, x->ptr, n * sz);
    return;
  }
  const bool ints = is_int_dtype(x->dtype) && is_int_dtype(out->dtype);
  long long done = 0;
  if (!ints && is_vec_dtype(x->dtype) && is_vec_dtype(out->dtype)) {
    const long long nv = n / 8;
    for (long long u = threadIdx.x; u < nv; u += AMK_THREADS) {
      float f[8];
      ld8(x->ptr, x->dtype, u, f);
      st8(out->ptr, out->dtype, u, f);
    }
    done = nv * 8;
  }
  if (ints) {
    each_out(out, done, n, [&](long long i) { sti_f(out, i, ldi_f(x, i)); });
  } else {
    each_out(out, done, n, [&](long long i) { st_f(out, i, ld_f(x, i)); });
  }
}
