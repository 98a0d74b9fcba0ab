/* copy.cu — CUDA device function of COPY (amk_op_copy);
 * the semantics are ops/copy/src/reference.rs.
 * Parallelisation: block-strided; same-dtype copies are 16-byte vector byte copies, F32/BF16/F16
 * casts go 8 elements per step, everything else element by element (whole bytes per thread
 * for an I4 output). */

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
  const int sz = amk_raw_size(x->dtype);
  if (x->dtype == out->dtype && sz > 0) {
    /* Same dtype, identity through the reference's round trip: plain vectorised byte copy. */
    raw_copy(out->ptr, x->ptr, n * sz);
    return;
  }
  const bool ints = amk_is_int(x->dtype) && amk_is_int(out->dtype);
  long long done = 0;
  if (!ints && amk_is_vec(x->dtype) && amk_is_vec(out->dtype)) {
    const long long nv = n / 8;
    for (long long u = threadIdx.x; u < nv; u += AMK_THREADS) {
      float f[8];
      amk_ld8(x->ptr, x->dtype, u, f);
      amk_st8(out->ptr, out->dtype, u, f);
    }
    done = nv * 8;
  }
  if (ints) {
    amk_each_out(out, done, n, [&](long long i) { amk_stif(out, i, amk_ldif(x, i)); });
  } else {
    amk_each_out(out, done, n, [&](long long i) { amk_stf(out, i, amk_ldf(x, i)); });
  }
}
