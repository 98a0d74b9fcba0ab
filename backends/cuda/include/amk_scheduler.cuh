/* amk_scheduler.cuh — the persistent megakernel: one block per SM queue, each running its
 * queue's tasks in order, waiting on counters before and signalling one after every task.
 *
 * Included by the generated source after every op and the generated amk_dispatch().
 * Deadlock freedom: the host orders every queue by one global topological order and launches
 * cooperatively (all blocks co-resident), so the earliest unfinished task is never blocked.
 */
#ifndef AMK_SCHEDULER_CUH
#define AMK_SCHEDULER_CUH

#ifndef AMK_SPIN_TIGHT
#define AMK_SPIN_TIGHT 64      /* spins before the first sleep */
#endif
#ifndef AMK_SPIN_SLEEP_NS
#define AMK_SPIN_SLEEP_NS 32   /* short sleeps: a late wait costs at most this much extra */
#endif
#ifndef AMK_SPIN_BACKOFF1
#define AMK_SPIN_BACKOFF1 256  /* spins before sleeping 16x longer */
#endif
#ifndef AMK_SPIN_BACKOFF2
#define AMK_SPIN_BACKOFF2 1024 /* spins before sleeping 64x longer (2 us) */
#endif
#ifndef AMK_ABORT_POLL_NS
#define AMK_ABORT_POLL_NS 100000 /* ns between reads of the host-mapped abort flag (a PCIe
                                    round trip: polled by time, not by spins, so that many
                                    idle blocks do not flood the bus) */
#endif


__device__ __forceinline__ uint32_t amk_ld_acquire(const amk_counter_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void amk_red_release_add(amk_counter_t* p, uint32_t v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

/* Thread 0 spins on every wait of `in`; the block learns the outcome through `go`.
 * Returns false when the abort flag was raised (by the host's watchdog or a failing task). */
__device__ __forceinline__ bool amk_wait_all(const amk_device_program_t& prog,
                                             const amk_instruction_t* in, volatile int* go) {
  if (threadIdx.x == 0) {
    int ok = 1;
    for (int w = 0; w < in->n_waits && ok; ++w) {
      const amk_counter_t* c = prog.counters + (long long)in->wait_counter[w] * AMK_COUNTER_STRIDE;
      const uint32_t target = (uint32_t)in->wait_threshold[w] * prog.epoch;
      uint32_t spins = 0;
      uint64_t next_poll = 0;
      while (amk_ld_acquire(c) < target) {
        ++spins;
        /* Short waits stay tight (a late wake costs at most AMK_SPIN_SLEEP_NS); long waits
           (a layer's attention) back off so that idle blocks do not load the L2 lines the
           working blocks need. */
        if (spins > AMK_SPIN_TIGHT)
          __nanosleep(spins < AMK_SPIN_BACKOFF1 ? AMK_SPIN_SLEEP_NS
                      : spins < AMK_SPIN_BACKOFF2 ? AMK_SPIN_SLEEP_NS * 16
                                                  : AMK_SPIN_SLEEP_NS * 64);
        if ((spins & 63) == 0) {
          const uint64_t now = amk_globaltimer();
          if (next_poll == 0) {
            next_poll = now + AMK_ABORT_POLL_NS;
          } else if (now >= next_poll) {
            if (*prog.abort_flag != 0) {
              ok = 0;
              break;
            }
            next_poll = now + AMK_ABORT_POLL_NS;
          }
        }
      }
    }
    /* The acquires order every later load of the block after the waits (the barrier below
       carries that to the other threads; an acquire at gpu scope also empties the SM's L1, so
       no thread reads a stale line). No extra fence. */
    *go = ok;
  }
  __syncthreads();
  return *go != 0;
}

/* Every thread's stores of the task are done (barrier), then one release increment: the
 * release is cumulative, so it orders the stores the barrier ordered before it (the pattern
 * of CUTLASS's inter-block barriers). No extra fence. */
__device__ __forceinline__ void amk_signal(const amk_device_program_t& prog, int counter) {
  __syncthreads();
  if (threadIdx.x == 0 && counter >= 0)
    amk_red_release_add(prog.counters + (long long)counter * AMK_COUNTER_STRIDE, 1u);
}

/* Ids an instruction names must be in range (the host checks too; this guards the device
 * against a corrupted table). */
__device__ __forceinline__ bool amk_check_ids(const amk_task_ctx& c) {
  const amk_instruction_t* in = c.inst;
  const int nb = c.prog->n_buffers, nc = c.prog->n_counters;
  bool ok = true;
  long long bad = 0;
  int code = AMK_OK;
  if (in->n_inputs < 0 || in->n_inputs > AMK_MAX_INPUTS || in->n_outputs < 0 ||
      in->n_outputs > AMK_MAX_OUTPUTS || in->n_waits < 0 || in->n_waits > AMK_MAX_WAITS) {
    ok = false; code = AMK_ERR_SHAPE; bad = in->n_inputs;
  }
  for (int i = 0; ok && i < in->n_inputs; ++i)
    if (in->inputs[i] < 0 || in->inputs[i] >= nb) { ok = false; code = AMK_ERR_BAD_BUFFER_ID; bad = in->inputs[i]; }
  for (int i = 0; ok && i < in->n_outputs; ++i)
    if (in->outputs[i] < 0 || in->outputs[i] >= nb) { ok = false; code = AMK_ERR_BAD_BUFFER_ID; bad = in->outputs[i]; }
  for (int i = 0; ok && i < in->n_waits; ++i)
    if (in->wait_counter[i] < 0 || in->wait_counter[i] >= nc) { ok = false; code = AMK_ERR_BAD_COUNTER_ID; bad = in->wait_counter[i]; }
  if (ok && in->out_counter >= nc) { ok = false; code = AMK_ERR_BAD_COUNTER_ID; bad = in->out_counter; }
  if (!ok) amk_fail(c, code, bad);
  return ok;
}

/* Copies task t's instruction, then the descriptors of its operands and its L2 prefetch
 * ranges, into shared memory (one round trip each for the whole block, before the wait: the
 * wait's acquire empties L1, and the op would otherwise fetch them from L2 one dependent load
 * after another). Returns false, the task failed, when the instruction names ids out of range. */
__device__ __forceinline__ bool amk_stage_task(const amk_device_program_t& prog, int t,
                                               amk_instruction_t* s_inst, amk_buffer_t* s_bufs,
                                               amk_prefetch_t* s_l2, const amk_task_ctx& c) {
  constexpr int IW = (int)(sizeof(amk_instruction_t) / 4);
  constexpr int BW = (int)(sizeof(amk_buffer_t) / 8);
  const int32_t* src = (const int32_t*)&prog.instructions[t];
  for (int k = threadIdx.x; k < IW; k += AMK_THREADS) ((int32_t*)s_inst)[k] = src[k];
  __syncthreads();
  if (!amk_check_ids(c)) return false;
  const int nin = s_inst->n_inputs, nout = s_inst->n_outputs;
  for (int k = threadIdx.x; k < (AMK_MAX_INPUTS + AMK_MAX_OUTPUTS) * BW; k += AMK_THREADS) {
    const int slot = k / BW, w = k % BW;
    const int id = slot < AMK_MAX_INPUTS ? (slot < nin ? s_inst->inputs[slot] : -1)
                 : (slot - AMK_MAX_INPUTS < nout ? s_inst->outputs[slot - AMK_MAX_INPUTS] : -1);
    if (id >= 0) ((uint64_t*)&s_bufs[slot])[w] = ((const uint64_t*)&prog.buffers[id])[w];
  }
  if (prog.l2_ranges && threadIdx.x < 2 * AMK_L2_RANGES)
    ((uint64_t*)s_l2)[threadIdx.x] =
        ((const uint64_t*)(prog.l2_ranges + (long long)t * AMK_L2_RANGES))[threadIdx.x];
  __syncthreads();
  return true;
}

/* Pulls the staged ranges (the first bytes of the weights the task will stream) into L2, so
 * that the memory system works while the op prepares its row and the tile's first loads find
 * their lines on the way. sm_90+: one bulk prefetch per range, handed to the copy engine (the
 * threads go on at once; a per-line prefetch loop holds the block for as long as the SM takes
 * to request every line). Older GPUs: nothing. A prefetch is a hint: no fault, nothing to wait
 * for. */
__device__ __forceinline__ void amk_l2_prefetch(const amk_prefetch_t* s_l2, int prog_flags) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (threadIdx.x < AMK_L2_RANGES) {
    const uint64_t a = s_l2[threadIdx.x].addr, n = s_l2[threadIdx.x].bytes;
    /* whole 16-byte units inside the range (the host hands out 16-byte aligned row ranges) */
    const uint64_t a0 = (a + 15) & ~(uint64_t)15, a1 = (a + n) & ~(uint64_t)15;
    /* the weight loads' L2 policy (evict-first by default): prefetched weights must not push
       out the activations, caches and tables every later task reads */
    const unsigned long long pol = amk_weight_policy(prog_flags);
    if (a1 > a0)
      asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(a0),
                   "r"((uint32_t)(a1 - a0)), "l"(pol)
                   : "memory");
  }
#else
  (void)s_l2;
  (void)prog_flags;
#endif
}

extern "C" __global__ void __launch_bounds__(AMK_THREADS, 1)
amk_megakernel(const amk_device_program_t prog) {
  extern __shared__ __align__(16) unsigned char amk_smem[];
  __shared__ int s_go;
  __shared__ int s_failed;
  __shared__ __align__(16) amk_instruction_t s_inst;
  __shared__ __align__(16) amk_buffer_t s_bufs[AMK_MAX_INPUTS + AMK_MAX_OUTPUTS];
  __shared__ __align__(16) amk_prefetch_t s_l2[AMK_L2_RANGES];
  for (int k = threadIdx.x; k < AMK_BLOCK_CACHE_WORDS; k += AMK_THREADS) amk_block_cache[k] = 0u;
  if (threadIdx.x == 0) {
    s_failed = 0;
#if AMK_RING
    amk_ring_init();
#endif
  }
  __syncthreads();
  const int q = blockIdx.x;
  if (q >= prog.n_queues) return;
  for (int i = prog.queue_off[q]; i < prog.queue_off[q + 1]; ++i) {
    const int t = prog.queue_tasks[i];
    uint64_t* tr = prog.trace ? prog.trace + (long long)t * AMK_TRACE_WORDS : (uint64_t*)0;
    if (tr && threadIdx.x == 0) { tr[0] = amk_globaltimer(); tr[3] = (uint64_t)q; }
    amk_task_ctx c;
    c.prog = &prog;
    c.inst = &s_inst;
    c.bufs = s_bufs;
    c.task = t;
    c.step = -1;
    c.smem = amk_smem;
    c.smem_bytes = prog.smem_bytes;
    c.failed = &s_failed;
    c.trace = tr;
    if (!amk_stage_task(prog, t, &s_inst, s_bufs, s_l2, c)) return;
    if (prog.l2_ranges && (prog.flags & AMK_PROG_L2_PREFETCH_EARLY)) amk_l2_prefetch(s_l2, prog.flags);
#if AMK_RING
    /* A tile's weights do not depend on any counter: start streaming them now. */
    if (threadIdx.x == 0) amk_ring_prestart(c);
#endif
    if (!amk_wait_all(prog, c.inst, &s_go)) {
#if AMK_RING
      if (threadIdx.x == 0 && amk_ring_started == t) amk_ring_drain(); /* no copy outlives the block */
#endif
      return;
    }
    if (tr && threadIdx.x == 0) { tr[1] = amk_globaltimer(); tr[4] = 0; }
    /* By default after the wait: a prefetch issued while other blocks still stream the
       previous phase, or while the attention block waits on its loads, competes with them
       (docs/perf-notes.md round 6); issued here it fills the memory system while the op's
       prologue (checks, the row, its norm) runs. */
    if (prog.l2_ranges && !(prog.flags & AMK_PROG_L2_PREFETCH_EARLY)) amk_l2_prefetch(s_l2, prog.flags);
    amk_dispatch(c);
    if (tr && threadIdx.x == 0) tr[5] = amk_globaltimer();
    __syncthreads();
    if (s_failed) {
#if AMK_RING
      if (threadIdx.x == 0 && amk_ring_started == t) amk_ring_drain();
#endif
      return;
    }
    amk_signal(prog, c.inst->out_counter);
    if (tr && threadIdx.x == 0) tr[2] = amk_globaltimer();
  }
}

/* Overwrites the instruction records named in `ids` with `recs` (per-token param patches:
 * one copy and one small launch instead of one copy per record). */
extern "C" __global__ void amk_apply_patches(amk_instruction_t* instructions, const int32_t* ids,
                                             const amk_instruction_t* recs, int n) {
  const int words = (int)(sizeof(amk_instruction_t) / 4);
  for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < (long long)n * words;
       k += (long long)gridDim.x * blockDim.x) {
    const int r = (int)(k / words), w = (int)(k % words);
    ((int32_t*)&instructions[ids[r]])[w] = ((const int32_t*)&recs[r])[w];
  }
}

#endif /* AMK_SCHEDULER_CUH */
