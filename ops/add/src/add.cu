/* add.cu — CUDA device function of ADD (amk_op_add);
 * the semantics are ops/add/src/reference.rs.
 * Parallelisation: block-strided elementwise loop, 8 elements per thread step with 16-byte
 * vector accesses when every operand is F32/BF16/F16, scalar amk_ld/amk_st otherwise. */

/* ADD [a, b] -> out: out[i] = f32(a[i]) + f32(b[i]), cast on store (ops/add/src/reference.rs).
 * No broadcasting: operands are viewed and must have equal element counts. */
__device__ void amk_op_add(const amk_task_ctx& ctx) {
  const amk_buffer_t* in[2] = {amk_in(ctx, 0), amk_in(ctx, 1)};
  const amk_buffer_t* out = amk_out(ctx, 0);
  const long long n = out->numel;
  if (in[0]->numel != n || in[1]->numel != n) {
    amk_fail(ctx, AMK_ERR_SHAPE, in[0]->numel != n ? in[0]->numel : in[1]->numel);
    return;
  }
  amk_ew_apply<2>(in, out, n, [](const float* v) { return v[0] + v[1]; });
}
