/* allreduce-shard.cu — CUDA device function of ALLREDUCE_SHARD (amk_op_allreduce_shard);
 * the semantics are ops/allreduce-shard/src/reference.rs.
 * Parallelisation: block-strided elementwise loop, 8 elements per thread step with 16-byte
 * vector accesses when every operand is F32/BF16/F16, scalar amk_ld/amk_st otherwise; the
 * shards are added one after the other in input order. */

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
  bool vec = amk_is_vec(out->dtype);
  for (int k = 0; k < nin; ++k) {
    const amk_buffer_t* b = amk_in(ctx, k);
    if (b->numel != n) {
      amk_fail(ctx, AMK_ERR_SHAPE, k);
      return;
    }
    vec = vec && amk_is_vec(b->dtype);
  }
  long long done = 0;
  if (vec) {
    const long long nv = n / 8;
    for (long long u = threadIdx.x; u < nv; u += AMK_THREADS) {
      const amk_buffer_t* b0 = amk_in(ctx, 0);
      float acc[8];
      amk_ld8(b0->ptr, b0->dtype, u, acc);
      for (int k = 1; k < nin; ++k) {
        const amk_buffer_t* b = amk_in(ctx, k);
        float t[8];
        amk_ld8(b->ptr, b->dtype, u, t);
#pragma unroll
        for (int e = 0; e < 8; ++e) acc[e] += t[e];
      }
      amk_st8(out->ptr, out->dtype, u, acc);
    }
    done = nv * 8;
  }
  amk_each_out(out, done, n, [&](long long i) {
    float acc = amk_ldf(amk_in(ctx, 0), i);
    for (int k = 1; k < nin; ++k) acc += amk_ldf(amk_in(ctx, k), i);
    amk_stf(out, i, acc);
  });
}
