/* mul.cu — CUDA device function of MUL (amk_op_mul);
 * the semantics are ops/mul/src/reference.rs.
 * Parallelisation: block-strided elementwise loop, 8 elements per thread step with 16-byte
 * vector accesses when every operand is F32/BF16/F16, scalar amk_ld/amk_st otherwise. */

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
    amk_ew_apply<2>(in, out, n, [](const float* v) { return v[0] * v[1]; });
  } else if (nin == 1) {
    const amk_buffer_t* in[1] = {amk_in(ctx, 0)};
    if (in[0]->numel != n) {
      amk_fail(ctx, AMK_ERR_SHAPE, in[0]->numel);
      return;
    }
    const float scale = amk_has(p, AMK_P_SCALE) ? p.scale : 1.0f;
    amk_ew_apply<1>(in, out, n, [scale](const float* v) { return v[0] * scale; });
  } else {
    amk_fail(ctx, AMK_ERR_SHAPE, nin);
  }
}
