/* silu-mul.cu — CUDA device function of SILU_MUL (amk_op_silu_mul);
 * the semantics are ops/silu-mul/src/reference.rs.
 * Parallelisation: block-strided elementwise loop, 8 elements per thread step with 16-byte
 * vector accesses when every operand is F32/BF16/F16, scalar amk_ld/amk_st otherwise. */

/* SILU_MUL [gate, up] -> out: out[i] = gate / (1 + exp(-gate)) * up in f32, cast on store
 * (ops/silu-mul/src/reference.rs). Operands are viewed: only element counts must agree. */
__device__ void amk_op_silu_mul(const amk_task_ctx& ctx) {
  const amk_buffer_t* in[2] = {amk_in(ctx, 0), amk_in(ctx, 1)};
  const amk_buffer_t* out = amk_out(ctx, 0);
  const long long n = out->numel;
  if (in[0]->numel != n || in[1]->numel != n) {
    amk_fail(ctx, AMK_ERR_SHAPE, in[0]->numel != n ? in[0]->numel : in[1]->numel);
    return;
  }
  amk_ew_apply<2>(in, out, n, [](const float* v) {
    const float g = v[0];
    return g / (1.0f + expf(-g)) * v[1];
  });
}
