/* amk_scheduler.cuh — the persistent megakernel: one block per SM queue, each running its
 * queue's tasks in order, waiting on counters before and signalling one after every task.
 *
 * Included by the generated source after every op and the generated amk_dispatch().
 * Deadlock freedom: the host orders every queue by one global topological order and launches
 * cooperatively (all blocks co-resident), so the earliest unfinished task is never blocked.
 */
#ifndef AMK_SCHEDULER_CUH
#define AMK_SCHEDULER_CUH

/* AMK_SPIN_TIGHT, AMK_SPIN_SLEEP_NS, AMK_SPIN_BACKOFF1, AMK_SPIN_BACKOFF2, AMK_ABORT_POLL_NS:
 * device knobs, defined with their defaults in amk_knobs.cuh. */

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

/* One release increment, after a block barrier that follows every thread's stores of the task
 * (the caller's): the release is cumulative, so it orders the stores the barrier ordered before
 * it (the pattern of CUTLASS's inter-block barriers). No extra fence. Thread 0 only. */
__device__ __forceinline__ void amk_signal(const amk_device_program_t& prog, int counter) {
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

/* What the scheduler keeps of a task in shared memory: its instruction, its operands'
 * descriptors (amk_in / amk_out read them), the id of the task after it in the queue (-1:
 * none), and whether amk_verify_tasks passed its record. 16-byte aligned,
 * so that every element of an array of stages is a cp.async destination. */
struct __align__(16) amk_stage_t {
  amk_instruction_t inst;
  amk_buffer_t bufs[AMK_TASK_SLOTS];
  int32_t next;
  int32_t verified;
};
static_assert(sizeof(amk_stage_t) % 16 == 0, "each stage of an array is a cp.async destination");

/* The stage's copies (amk_cp_async16/4, amk_device.cuh) read only what the host wrote before
 * the launch (instruction records, descriptors, queues), so no copy can see a stale line. */

/* Starts copying task t — the queue's entry i of [i, end) — into `s`: its instruction record,
 * its descriptor record (the host lays the operands' descriptors out per task, so nothing here
 * waits on an id read from the instruction) and the queue's next task id. One
 * round trip for all of it, issued by the whole block while it still runs the task before t
 * (docs/perf-notes.md round 7: staged after that task, the two dependent round trips were
 * ~2 us on every phase's critical path). */
__device__ __forceinline__ void amk_stage_issue(const amk_device_program_t& prog, int t, int i,
                                                int end, amk_stage_t* s) {
  constexpr int IV = (int)(sizeof(amk_instruction_t) / 16);
  constexpr int BV = (int)(sizeof(amk_buffer_t) * AMK_TASK_SLOTS / 16);
  const uint4* inst = (const uint4*)&prog.instructions[t];
  const uint4* bufs = (const uint4*)(prog.task_bufs + (long long)t * AMK_TASK_SLOTS);
  const int n = IV + BV;
  for (int k = threadIdx.x; k < n; k += AMK_THREADS) {
    if (k < IV) amk_cp_async16((uint4*)&s->inst + k, inst + k);
    else if (k < IV + BV) amk_cp_async16((uint4*)s->bufs + (k - IV), bufs + (k - IV));
  }
  if (threadIdx.x == AMK_THREADS - 1) {
    if (i + 1 < end) amk_cp_async4(&s->next, prog.queue_tasks + i + 1);
    else s->next = -1;
  }
  if (threadIdx.x == AMK_THREADS - 2) {
    if (prog.task_verified) amk_cp_async4(&s->verified, prog.task_verified + t);
    else s->verified = 0;
  }
  amk_cp_async_commit();
}

/* Every copy amk_stage_issue started has landed and is visible to the whole block. */
__device__ __forceinline__ void amk_stage_wait() {
  amk_cp_async_wait_all();
  __syncthreads();
}

/* amk_task_wait's block-shared state: the wait's outcome (written by thread 0 before the
 * wait's barrier, read after it), and whether the running task has waited (thread 0 clears it
 * before the dispatch and sets it after the wait; the scheduler reads it after the task's
 * closing barrier). */
__shared__ int amk_wait_go;
__shared__ int amk_task_waited;

/* The wait and the trace points around it (amk_device.cuh declares it).
 * Out of line: one copy for every op, so the code a ready task runs first is the code every
 * task ran last (docs/perf-notes.md round 8: the first instructions of an op's cold code cost
 * 1-2 us after its counter was met). */
__device__ __noinline__ bool amk_task_wait(const amk_task_ctx& c) {
  if (c.check_only) return false; /* amk_verify_tasks: the op's checks were all it runs */
  if (c.step >= 0) return true;   /* a FUSED step: the task waited before its first step */
#if !AMK_TRACE_OFF
  if (c.trace && threadIdx.x == 0) c.trace[7] = amk_globaltimer();
#endif
  const amk_device_program_t& prog = *c.prog;
  const bool ok = amk_wait_all(prog, c.inst, &amk_wait_go);
  if (threadIdx.x == 0) {
    amk_task_waited = 1;
    if (!ok) *c.failed = 1; /* the launch is aborting: the block stops after this task */
#if !AMK_TRACE_OFF
    if (c.trace) { c.trace[1] = amk_globaltimer(); c.trace[4] = 0; }
#endif
  }
  return ok;
}

/* A task that reads and writes nothing this time (amk_device.cuh): marked as having waited,
 * so the scheduler signals its counter, with no wait. */
__device__ __noinline__ void amk_task_skip_wait(const amk_task_ctx& c) {
  if (threadIdx.x == 0) {
    amk_task_waited = 1;
#if !AMK_TRACE_OFF
    if (c.trace) { c.trace[1] = amk_globaltimer(); c.trace[4] = 0; }
#endif
  }
}

/* amk_device_program::flags bit: the launch runs amk_verify_tasks instead of the queues. */
#define AMK_PROG_VERIFY 4

/* The megakernel with AMK_PROG_VERIFY, once when a program is loaded: what every task would
 * check on the device before its wait, its ids (amk_check_ids) and its op's own pre-wait checks
 * (each op that waits itself runs them and returns at amk_task_wait, which answers false here;
 * ops the scheduler waits for run nothing). A task that passes is marked in `task_verified`,
 * and the megakernel skips those checks for it: they re-proved, in every warp of the block, on
 * every task of every step, what the validator proved on the host, on the path from a task's
 * start to its wait (docs/perf-notes.md round 11). A failure is reported like a launch's
 * (`status`). Blocks take tasks blockIdx.x, blockIdx.x + gridDim.x, ... A mode of the
 * megakernel rather than a kernel of its own: a second entry would carry its own copy of
 * amk_dispatch, the bulk of the module. */
#ifndef AMK_VERIFY_DISPATCH
#define AMK_VERIFY_DISPATCH amk_dispatch /* its own with AMK_DISPATCH_INLINE (assemble.rs) */
#endif
__device__ __noinline__ void amk_verify_tasks(const amk_device_program_t& prog) {
  __shared__ int s_failed;
  for (int t = blockIdx.x; t < prog.n_instructions; t += gridDim.x) {
    if (threadIdx.x == 0) s_failed = 0;
    __syncthreads();
    amk_task_ctx c;
    c.prog = &prog;
    c.inst = &prog.instructions[t];
    c.bufs = prog.task_bufs + (long long)t * AMK_TASK_SLOTS;
    c.task = t;
    c.step = -1;
    c.smem = (unsigned char*)0; /* the checks read descriptors and params only */
    c.smem_bytes = prog.smem_bytes;
    c.failed = &s_failed;
    c.trace = (uint64_t*)0;
    c.verify = 1;
    c.check_only = 1;
    if (amk_check_ids(c)) AMK_VERIFY_DISPATCH(c);
    __syncthreads(); /* every thread's checks are done (s_failed is final) */
    if (threadIdx.x == 0 && !s_failed) prog.task_verified[t] = 1;
    __syncthreads(); /* s_failed read before the next task resets it */
  }
}

/* The block's copy of the launch's table, which every task context points at (`c.prog`).
 * The ops and amk_task_wait reach it through that pointer, so by a generic load: from the
 * __grid_constant__ parameter such a load goes through L1, which every task's acquire empties,
 * so the first `c.prog->` field read after a wait cost an L2 round trip, ~280 cycles more than
 * from shared memory (docs/perf-notes.md round 11). The scheduler itself reads the parameter
 * (constant bank). */
__shared__ amk_device_program_t amk_prog_block;

/* Thread 0 of a block that ran a producer of the step loop's gate, before its signal: the
 * host's cancel request (`cancel`, read before the task) becomes the launch's stop word, one
 * decision that every block reads after the gate. */
__device__ __forceinline__ void amk_gate_stop(const amk_device_program_t& prog, int cancel) {
  if (threadIdx.x == 0 && cancel) *prog.loop_stop = 1;
}

/* Runs queue q's tasks [begin, end) once (one pass), in order. Returns false when the launch
 * stops (a failed task, the abort flag). */
__device__ __forceinline__ bool amk_run_queue(const amk_device_program_t& prog, int q, int begin,
                                              int end, int* s_failed, amk_stage_t* s_stage) {
  extern __shared__ __align__(AMK_SMEM_ALIGN) unsigned char amk_smem[];
  int t = prog.queue_tasks[begin];
  amk_stage_issue(prog, t, begin, end, &s_stage[0]);
  for (int i = begin; i < end; ++i) {
    amk_stage_t* const st = &s_stage[(i - begin) & 1];
#if AMK_TRACE_OFF
    uint64_t* const tr = (uint64_t*)0; /* every trace point below folds away */
#else
    uint64_t* tr = prog.trace ? prog.trace + (long long)t * AMK_TRACE_WORDS : (uint64_t*)0;
#endif
    if (tr && threadIdx.x == 0) { tr[0] = amk_globaltimer(); tr[3] = (uint64_t)q; }
    /* Task t's stage has landed (and every thread is done with the other stage: the task
       before ended with a block barrier), so the next task's copy can start now. */
    amk_stage_wait();
    const int next = st->next;
    if (next >= 0) amk_stage_issue(prog, next, i + 1, end, &s_stage[(i + 1 - begin) & 1]);
    amk_task_ctx c;
    c.prog = &amk_prog_block;
    c.inst = &st->inst;
    c.bufs = st->bufs;
    c.task = t;
    c.step = -1;
    c.smem = amk_smem;
    c.smem_bytes = prog.smem_bytes;
    c.failed = s_failed;
    c.trace = tr;
    /* A record amk_verify_tasks passed skips the checks it ran: its ids here, and the pre-wait
       checks of the ops that honour `verify` (docs/perf-notes.md round 11). */
    c.verify = st->verified == 0;
    c.check_only = 0;
    if (c.verify && !amk_check_ids(c)) return false;
    /* The wait happens inside the dispatch: before the op for most ops, inside it for those
       that wait themselves (after their checks, so that their cold code runs before the
       counters are met). */
    if (threadIdx.x == 0) {
      amk_task_waited = 0;
      if (tr) tr[6] = amk_globaltimer();
#if AMK_PROBE && !AMK_TRACE_OFF
      amk_probe_tr = tr;
#endif
    }
#if AMK_PROBE == 4 && !AMK_TRACE_OFF
    /* the SM clock: probe 7 = dispatch time (word 6, a ns time) + the cycles the dispatch
       took, so that (probe 7 - word 6) / (returned - word 6) is cycles a ns */
    const long long probe_c0 = clock64();
#endif
    /* A producer of the step loop's gate reads the host's cancel word before its task (the
       load's latency hides behind the task) and acts on it before its signal. */
    const bool gate_task = prog.loop_words && c.inst->out_counter == prog.loop_gate;
    const int cancel = gate_task && threadIdx.x == 0 ? prog.loop_words[AMK_LOOP_CANCEL] : 0;
    amk_dispatch(c);
    if (tr && threadIdx.x == 0) tr[5] = amk_globaltimer();
#if AMK_PROBE == 4 && !AMK_TRACE_OFF
    if (tr && threadIdx.x == 0) tr[8 + 7] = tr[6] + (uint64_t)(clock64() - probe_c0);
#endif
    /* Every thread's stores of the task are done: the barrier before the signal (one barrier:
       the flags below are read after it too). */
    __syncthreads();
    /* An op that returned without waiting may have read data its producers had not written:
       the launch fails rather than signal (every thread reads the same flags). */
    const bool no_wait = !*s_failed && !amk_task_waited;
    if (no_wait) amk_fail(c, AMK_ERR_NO_WAIT, c.inst->op);
    if (*s_failed || no_wait) return false;
    if (gate_task) amk_gate_stop(prog, cancel);
    amk_signal(prog, c.inst->out_counter);
    /* progress for the host (its watchdog), off the gate's path */
    if (gate_task && threadIdx.x == 0) prog.loop_words[AMK_LOOP_DONE] = (int32_t)amk_prog_block.epoch;
    if (tr && threadIdx.x == 0) tr[2] = amk_globaltimer();
    t = next;
  }
  return true;
}

/* The end of pass `pass` (> 0) of a step loop: thread 0 waits until the gate counter holds
 * `pass` times its producers (every task of the pass is done: the validator proved that
 * every task reaches a producer of the gate), then reads the halt word and the stop word,
 * which the gate's producers wrote before they signalled. False: the loop ends here (also
 * when the host's watchdog raised the abort flag). */
__device__ __forceinline__ bool amk_pass_gate(const amk_device_program_t& prog, uint32_t pass) {
  __shared__ int s_go;
  if (threadIdx.x == 0) {
    const amk_counter_t* c = prog.counters + (long long)prog.loop_gate * AMK_COUNTER_STRIDE;
    const uint32_t target = prog.loop_gate_count * pass;
    int ok = 1;
    uint64_t next_poll = 0;
    for (uint32_t spins = 0; amk_ld_acquire(c) < target;) {
      if (++spins > AMK_SPIN_TIGHT) __nanosleep(AMK_SPIN_SLEEP_NS);
      if ((spins & 63) == 0) {
        const uint64_t now = amk_globaltimer();
        if (next_poll == 0) {
          next_poll = now + AMK_ABORT_POLL_NS;
        } else if (now >= next_poll) {
          if (*prog.abort_flag != 0) { ok = 0; break; }
          next_poll = now + AMK_ABORT_POLL_NS;
        }
      }
    }
    s_go = ok && prog.loop_halt[0] == 0 && *prog.loop_stop == 0;
  }
  __syncthreads();
  return s_go != 0;
}


/* `prog` is a __grid_constant__ parameter (the address of an ordinary one makes the compiler
 * copy the whole table into each thread's local memory first). */
extern "C" __global__ void __launch_bounds__(AMK_THREADS, 1)
amk_megakernel(const __grid_constant__ amk_device_program_t prog) {
  extern __shared__ __align__(AMK_SMEM_ALIGN) unsigned char amk_smem[];
#if AMK_PROBE && !AMK_TRACE_OFF
  if (threadIdx.x == 0) amk_probe_tr = (uint64_t*)0;
#endif
  if (prog.flags & AMK_PROG_VERIFY) {
    amk_verify_tasks(prog);
    return;
  }
  if (threadIdx.x == 0) amk_prog_block = prog; /* the first stage's barrier publishes it */
  __shared__ int s_failed;
  /* Two stages: the task running, and the next one, copied in while it runs. */
  __shared__ __align__(16) amk_stage_t s_stage[2];
  for (int k = threadIdx.x; k < AMK_BLOCK_CACHE_WORDS; k += AMK_THREADS) amk_block_cache[k] = 0u;
  if (threadIdx.x == 0) s_failed = 0;
  const int q = blockIdx.x;
  if (q >= prog.n_queues) return;
  const int begin = prog.queue_off[q], end = prog.queue_off[q + 1];
  if (begin >= end) return;
  const uint32_t passes = prog.loop_passes > 1u ? prog.loop_passes : 1u;
  for (uint32_t pass = 1;; ++pass) {
    if (!amk_run_queue(prog, q, begin, end, &s_failed, s_stage)) break;
    if (pass >= passes || !amk_pass_gate(prog, pass)) break;
    /* Pass `pass` + 1: its counter targets, and a block cache of its own (what a pass caches,
       e.g. QKV_ROPE_APPEND's position and rotation, belongs to that pass). */
    for (int k = threadIdx.x; k < AMK_BLOCK_CACHE_WORDS; k += AMK_THREADS) amk_block_cache[k] = 0u;
    if (threadIdx.x == 0) amk_prog_block.epoch = pass + 1;
    __syncthreads();
  }
  /* A block that stops early (a failed task, the abort flag) lets no copy outlive it. */
  amk_cp_async_wait_all();
}

/* Overwrites the instruction records named in `ids` with `recs` (per-token param patches:
 * one copy and one small launch instead of one copy per record). A rewritten record is no
 * longer the one amk_verify_tasks passed: its task runs its checks again (`verified`). */
extern "C" __global__ void amk_apply_patches(amk_instruction_t* instructions, const int32_t* ids,
                                             const amk_instruction_t* recs, int n,
                                             int32_t* verified) {
  const int words = (int)(sizeof(amk_instruction_t) / 4);
  for (long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x; k < (long long)n * words;
       k += (long long)gridDim.x * blockDim.x) {
    const int r = (int)(k / words), w = (int)(k % words);
    ((int32_t*)&instructions[ids[r]])[w] = ((const int32_t*)&recs[r])[w];
    if (w == 0 && verified) verified[ids[r]] = 0;
  }
}

#endif /* AMK_SCHEDULER_CUH */
