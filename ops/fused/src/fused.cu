// FUSED (code 19): runs a task's recipe steps one after the other inside one block.
//
// The host expands the recipe when it loads the program: each step is a complete instruction
// in prog->fused_steps[fused_off[task] .. fused_off[task + 1]), its arguments already resolved
// to buffer ids (task inputs, or the scratch buffer a previous step wrote). A step whose `sm`
// field has bit 0 set writes a fresh scratch slot, which starts at zero as in the CPU
// reference. Nested FUSED never reaches the device: amk_dispatch_step has no FUSED case.

__device__ void amk_op_fused(const amk_task_ctx& ctx) {
  const amk_device_program_t* prog = ctx.prog;
  const int begin = prog->fused_off[ctx.task];
  const int end = prog->fused_off[ctx.task + 1];
  for (int k = begin; k < end; ++k) {
    const amk_instruction_t* step = &prog->fused_steps[k];
    if (step->sm & 1) {
      for (int o = 0; o < step->n_outputs; ++o) {
        const amk_buffer_t* b = &prog->buffers[step->outputs[o]];
        unsigned char* p = (unsigned char*)b->ptr;
        const long long n = amk_buffer_bytes(b);
        for (long long i = threadIdx.x; i < n; i += AMK_THREADS) p[i] = 0;
      }
      __syncthreads();
    }
    amk_task_ctx c = ctx;
    c.inst = step;
    c.bufs = nullptr; /* the step's operands are its own (read from prog->buffers) */
    c.step = k - begin;
    c.verify = 1; /* amk_verify_tasks checks a FUSED task's ids, not its steps */
    amk_dispatch_step(c);
    __syncthreads();
    if (*ctx.failed) return;
  }
}
