/* nop.cu — CUDA device function of NOP (amk_op_nop): no operands, no effect (the validator and
 * the host already enforce 0 inputs / 0 outputs; ops/nop/src/reference.rs). */

__device__ void amk_op_nop(const amk_task_ctx&) {}
