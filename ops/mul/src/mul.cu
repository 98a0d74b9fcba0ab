/* mul.cu — CUDA device function of MUL (amk_op_mul);
 * the semantics are ops/mul/src/reference.rs.
 * Parallelisation: block-strided elementwise loop, 8 elements per thread step with 16-byte
 * vector accesses when every operand is F32/BF16/F16, scalar amk_ld/amk_st otherwise. */

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

/* out[i] = f(in_0[i], .., in_{NIN-1}[i]) over n elements, f taking the f32 values (amk_ld) and
 * returning the f32 result (cast on store). When every operand is F32/BF16/F16 the body runs
 * 8 elements at a time with 16-byte loads/stores (bases are 256-byte aligned), the tail and
 * every other dtype combination element by element. */
template <int NIN, typename F>
__device__ __forceinline__ void ew_apply(const amk_buffer_t* const* in, const amk_buffer_t* out,
                                         long long n, F f) {
  bool vec = is_vec_dtype(out->dtype);
#pragma unroll
  for (int k = 0; k < NIN; ++k) vec = vec && is_vec_dtype(in[k]->dtype);
  long long done = 0;
  if (vec) {
    const long long nv = n / 8;
    for (long long u = threadIdx.x; u < nv; u += AMK_THREADS) {
      float a[NIN][8];
#pragma unroll
      for (int k = 0; k < NIN; ++k) ld8(in[k]->ptr, in[k]->dtype, u, a[k]);
      float r[8];
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        float t[NIN];
#pragma unroll
        for (int k = 0; k < NIN; ++k) t[k] = a[k][e];
        r[e] = f(t);
      }
      st8(out->ptr, out->dtype, u, r);
    }
    done = nv * 8;
  }
  each_out(out, done, n, [&](long long i) {
    float t[NIN];
#pragma unroll
    for (int k = 0; k < NIN; ++k) t[k] = ld_f(in[k], i);
    st_f(out, i, f(t));
  });
}

/* MUL: [a, b] -> out: out[i] = a[i] * b[i]; [x] -> out: out[i] = x[i] * scale (param `scale`,
 * default 1.0 when absent, ignored with two inputs). f32, cast on store (ops/mul/src/reference.rs).
 * No broadcasting: operands are viewed and must have equal element counts. */
__device__ void amk_op_mul(const amk_task_ctx& ctx) {
  const amk_params_t& p = ctx.inst->params;
  const amk_buffer_t* out = amk_out(ctx, 0);
  const long long n = out->numel;
  const int nin = ctx.inst->n_inputs;
  if (nin == 2) {
    const amk_buffer_t* in[2] = {amk_in(ctx, 0), amk_in(ctx, 1)};
    if (in[0]->numel != n || in[1]->numel != n) {
      amk_fail(ctx, AMK_ERR_SHAPE, in[0]->numel != n ? in[0]->numel : in[1]->numel);
      return;
    }
    ew_apply<2>(in, out, n, [](const float* v) { return v[0] * v[1]; });
  } else if (nin == 1) {
    const amk_buffer_t* in[1] = {amk_in(ctx, 0)};
    if (in[0]->numel != n) {
      amk_fail(ctx, AMK_ERR_SHAPE, in[0]->numel);
      return;
    }
    const float scale = amk_has(p, AMK_P_SCALE) ? p.scale : 1.0f;
    ew_apply<1>(in, out, n, [scale](const float* v) { return v[0] * scale; });
  } else {
    amk_fail(ctx, AMK_ERR_SHAPE, nin);
  }
}
