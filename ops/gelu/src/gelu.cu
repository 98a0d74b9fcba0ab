/* gelu.cu — CUDA device function of GELU (amk_op_gelu);
 * the semantics are ops/gelu/src/reference.rs.
 * Parallelisation: block-strided elementwise loop, 8 elements per thread step with 16-byte
 * vector accesses when every operand is F32/BF16/F16, scalar amk_ld/amk_st otherwise. */

/* GELU x -> out: the exact (erf) GELU 0.5 * x * erfc(-x / sqrt(2)) (ops/gelu/src/reference.rs
 * evaluates the same erfc form in f64 and rounds once; here f32 erfcf, whose few-ulp error is
 * far inside 1e-5 and keeps the negative tail's relative precision). */
__device__ void amk_op_gelu(const amk_task_ctx& ctx) {
  const amk_buffer_t* in[1] = {amk_in(ctx, 0)};
  const amk_buffer_t* out = amk_out(ctx, 0);
  const long long n = out->numel;
  if (in[0]->numel != n) {
    amk_fail(ctx, AMK_ERR_SHAPE, in[0]->numel);
    return;
  }
  amk_ew_apply<1>(in, out, n, [](const float* v) {
    const float x = v[0];
    return 0.5f * x * erfcf(-x * 0.70710678118654752f);
  });
}
