/* allreduce-shard.cu — CUDA device function of ALLREDUCE_SHARD (amk_op_allreduce_shard);
 * the semantics are ops/allreduce-shard/src/reference.rs.
 * Parallelisation: block-strided elementwise loop, 8 elements per thread step with 16-byte
 * vector accesses when every operand is F32/BF16/F16, scalar amk_ld/amk_st otherwise; the
 * shards are added one after the other in input order. */

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

/* ALLREDUCE_SHARD [in_0 .. in_{k-1}] -> out (1 <= k <= 8): out[i] = ((in_0 + in_1) + in_2) + ..
 * summed in f32 in input order (two shards give exactly ADD's result), cast on store
 * (ops/allreduce-shard/src/reference.rs). Operands are viewed: element counts must agree. */
__device__ void amk_op_allreduce_shard(const amk_task_ctx& ctx) {
  const amk_buffer_t* out = amk_out(ctx, 0);
  const long long n = out->numel;
  const int nin = ctx.inst->n_inputs;
  if (nin < 1 || nin > AMK_MAX_INPUTS) {
    amk_fail(ctx, AMK_ERR_SHAPE, nin);
    return;
  }
  bool vec = is_vec_dtype(out->dtype);
  for (int k = 0; k < nin; ++k) {
    const amk_buffer_t* b = amk_in(ctx, k);
    if (b->numel != n) {
      amk_fail(ctx, AMK_ERR_SHAPE, k);
      return;
    }
    vec = vec && is_vec_dtype(b->dtype);
  }
  long long done = 0;
  if (vec) {
    const long long nv = n / 8;
    for (long long u = threadIdx.x; u < nv; u += AMK_THREADS) {
      const amk_buffer_t* b0 = amk_in(ctx, 0);
      float acc[8];
      ld8(b0->ptr, b0->dtype, u, acc);
      for (int k = 1; k < nin; ++k) {
        const amk_buffer_t* b = amk_in(ctx, k);
        float t[8];
        ld8(b->ptr, b->dtype, u, t);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] += t[e];
      }
      st8(out->ptr, out->dtype, u, acc);
    }
    done = nv * 8;
  }
  each_out(out, done, n, [&](long long i) {
    float acc = ld_f(amk_in(ctx, 0), i);
    for (int k = 1; k < nin; ++k) acc += ld_f(amk_in(ctx, k), i);
    st_f(out, i, acc);
  });
}
