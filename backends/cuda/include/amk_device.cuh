/* amk_device.cuh — what every op's device function may use.
 *
 * The contract (docs/adding-an-op.md has the long form):
 *   __device__ void amk_op_<name>(const amk_task_ctx& ctx);
 * - The whole block (blockDim.x == AMK_THREADS) calls it once per task; every thread returns,
 *   and control flow around __syncthreads() is block-uniform.
 * - Operands: amk_in(ctx, i) / amk_out(ctx, j); params: ctx.inst->params; dynamic shared
 *   memory: ctx.smem (ctx.smem_bytes bytes).
 * - fp32 math, cast on store (amk_ld / amk_st switch on the dtype, rounding like the CPU VM).
 *   Activations and KV caches are written inside the same launch: never read them through the
 *   read-only path (no __ldg, no const __restrict__).
 * - Never touches counters, never traps: errors go through amk_fail(), after which the function
 *   returns (block-uniformly).
 * - Reads nothing another task writes before its task's counters are met: the scheduler waits
 *   for them before calling the function, unless the op registered with `with_own_wait()`; then
 *   the function calls amk_task_wait(ctx) itself, once, block-uniformly, after the checks that
 *   read only its descriptors and params, and returns at once when it answers false.
 * - No fast-math intrinsics (__expf, __sinf, __powf, __fdividef, ...): fp32 results must stay
 *   within 1e-5 of the CPU VM.
 */
#ifndef AMK_DEVICE_CUH
#define AMK_DEVICE_CUH

/* AMK_TRACE_OFF: a device knob, defined with its default in amk_knobs.cuh. */

/* AMK_NO_F32, AMK_NO_F16, AMK_NO_BF16: device knobs, defined with their defaults in
 * amk_knobs.cuh. */
#define AMK_IS_F32(dt) (!AMK_NO_F32 && (dt) == AMK_F32)
#define AMK_IS_F16(dt) (!AMK_NO_F16 && (dt) == AMK_F16)
#define AMK_IS_BF16(dt) (!AMK_NO_BF16 && (dt) == AMK_BF16)
#define AMK_BF_OF(dt) (AMK_NO_F16 || (!AMK_NO_BF16 && (dt) == AMK_BF16))

/* AMK_THREADS: device knob, defined with its default in amk_knobs.cuh. */
#define AMK_WARPS (AMK_THREADS / 32)

/* An L2 prefetch of the 128-byte line holding `p` (a hint: never faults, holds no register). */
__device__ __forceinline__ void amk_prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

/* An L2 prefetch of the whole 16-byte units inside [a, a + n), L2 policy `pol`. sm_90+: one
 * bulk prefetch handed to the copy engine (the thread goes on at once; a per-line loop would
 * hold it for as long as the SM takes to request every line). Older GPUs: nothing. A hint: no
 * fault, nothing to wait for. One thread calls it. */
__device__ __forceinline__ void amk_prefetch_l2_bulk(uint64_t a, uint64_t n, unsigned long long pol) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint64_t a0 = (a + 15) & ~(uint64_t)15, a1 = (a + n) & ~(uint64_t)15;
  if (a1 > a0 && a1 - a0 < (1ull << 32))
    asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(a0),
                 "r"((uint32_t)(a1 - a0)), "l"(pol)
                 : "memory");
#else
  (void)a;
  (void)n;
  (void)pol;
#endif
}

struct amk_task_ctx {
  const amk_device_program_t* prog;
  const amk_instruction_t* inst; /* the scheduler's copy in shared memory (a FUSED step: global) */
  const amk_buffer_t* bufs; /* shared-memory copies of the operands' descriptors (inputs at
                               0.., outputs at AMK_MAX_INPUTS..), or null: prog->buffers */
  int32_t task;          /* the task's id (index into prog->instructions) */
  int32_t step;          /* FUSED step index, -1 for an ordinary task */
  unsigned char* smem;   /* dynamic shared memory */
  int32_t smem_bytes;
  int* failed;           /* block-shared: set by amk_fail */
  uint64_t* trace;       /* the task's trace words (thread 0 writes), or null */
  int32_t verify;        /* 1: the op runs its pre-wait checks (the task's record was written
                            after the load's amk_verify_tasks passed it, or a FUSED step);
                            0: amk_verify_tasks passed this record, the op may skip them */
  int32_t check_only;    /* 1: amk_verify_tasks runs the op for its checks alone: amk_task_wait
                            answers false (nothing is read, nothing written) */
};

/* One pre-wait check of an op's function template `template <bool CHECK>`: when CHECK and
 * `cond` does not hold, fails the task (`ctx`) and returns false; compiled away when !CHECK,
 * so a verified task's path to its wait is straight-line code (docs/perf-notes.md round 11). */
#define AMK_CHECK(cond, code, detail)                                                          \
  do {                                                                                         \
    if (CHECK && !(cond)) {                                                                    \
      amk_fail(ctx, (code), (detail));                                                         \
      return false;                                                                            \
    }                                                                                          \
  } while (0)

/* Waits until the task's counters are met (thread 0 spins; a barrier hands the outcome to the
 * block). Returns false when the launch is aborting (the
 * block is marked failed and the op must return), and in amk_verify_tasks (ctx.check_only: the
 * op has run its checks, nothing more). A FUSED step (ctx.step >= 0) returns true at once: its
 * task waited before its first step. Defined by the scheduler; the dispatcher calls it before
 * every op that does not wait itself (docs/adding-an-op.md, "Waiting for the task's
 * counters"). */
__device__ __noinline__ bool amk_task_wait(const amk_task_ctx& c);
/* For an op that waits itself and finds, from data it may read before its wait (a descriptor's
 * AMK_BUF_LAUNCH_CONST buffer), that this time it reads none of the inputs its waits guard and
 * writes nothing (ATTENTION_SPLIT's inactive splits): the task is done without waiting. Never
 * in amk_verify_tasks (check_only), whose ops return at their wait. */
__device__ __noinline__ void amk_task_skip_wait(const amk_task_ctx& c);

/* The device's nanosecond clock (one clock for all SMs). */
__device__ __forceinline__ uint64_t amk_globaltimer() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/* 16, 8 or 4 bytes global -> shared, asynchronously (sm_80+, cp.async): the threads go on at
 * once; amk_cp_async_commit closes a group of them and amk_cp_async_wait_all waits for every
 * group, amk_cp_async_wait_group for all but the newest (then a barrier makes the bytes visible
 * to the block). The 16-byte copies bypass L1
 * (.cg), the smaller ones go through it (.ca, the only kind PTX has for them). */
__device__ __forceinline__ void amk_cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(
                   (uint32_t)__cvta_generic_to_shared(dst)),
               "l"(src)
               : "memory");
}
__device__ __forceinline__ void amk_cp_async8(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"(
                   (uint32_t)__cvta_generic_to_shared(dst)),
               "l"(src)
               : "memory");
}
__device__ __forceinline__ void amk_cp_async4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(
                   (uint32_t)__cvta_generic_to_shared(dst)),
               "l"(src)
               : "memory");
}
__device__ __forceinline__ void amk_cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
__device__ __forceinline__ void amk_cp_async_wait_all() {
  asm volatile("cp.async.wait_all;" ::: "memory");
}
/* Waits until at most the N most recently committed groups are still in flight (groups
 * complete in commit order, so every older one has landed). */
template <int N>
__device__ __forceinline__ void amk_cp_async_wait_group() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
/* 16 bytes global -> shared at the shared-space address `dst`, zero-filled when !ok (a source
 * size of 0 reads nothing: `src` need only be a valid address). */
__device__ __forceinline__ void amk_cp_async16_zfill(uint32_t dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
               "r"(ok ? 16 : 0)
               : "memory");
}

/* ---- tensor-core fragments (sm_80+): the prefill ops' matrix tiles ---- */

/* Four 8x8 16-bit matrices from shared memory (ldmatrix .x4): lanes 8i .. 8i + 7 give the row
 * addresses of matrix i, register i receives it in the mma fragment layout. */
__device__ __forceinline__ void amk_ldmatrix_x4(uint32_t addr, uint32_t* r) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
/* amk_ldmatrix_x4, each matrix transposed (a row-major [k][n] tile as an mma B operand). */
__device__ __forceinline__ void amk_ldmatrix_x4_trans(uint32_t addr, uint32_t* r) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
/* c += a · b for one m16n8k16 tile: a (4 registers) and b (2) bf16 (BF) or f16, c f32. */
template <bool BF>
__device__ __forceinline__ void amk_mma_16816(float* c, const uint32_t* a, uint32_t b0,
                                              uint32_t b1) {
  if (BF)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Probe `k` (0 .. AMK_TRACE_PROBES - 1) of a traced task: the time an op reached a point of
 * its own (thread 0; the last stamp of a probe wins), trace word 8 + k. An op's probes say
 * where its time goes between the scheduler's points (docs/gpu-testing.md lists each op's);
 * nothing in an untraced kernel. Probes 6 and 7 are AMK_PROBE's in its diagnostic builds. */
__device__ __forceinline__ void amk_probe(const amk_task_ctx& ctx, int k) {
#if !AMK_TRACE_OFF
  if (ctx.trace && threadIdx.x == 0 && k >= 0 && k < AMK_TRACE_PROBES) ctx.trace[8 + k] = amk_globaltimer();
#else
  (void)ctx;
  (void)k;
#endif
}

/* AMK_PROBE: device knob, defined with its default in amk_knobs.cuh. */
#if AMK_PROBE && !AMK_TRACE_OFF
__shared__ uint64_t* amk_probe_tr;
#define AMK_PROBE_AT(slot, cond)                                                          \
  do {                                                                                    \
    if (threadIdx.x == 0 && amk_probe_tr && (cond)) amk_probe_tr[8 + (slot)] = amk_globaltimer(); \
  } while (0)
#else
#define AMK_PROBE_AT(slot, cond) \
  do {                           \
  } while (0)
#endif
/* A point of level `level` only: 1 the prologues' (the norm, the attention), 2 the bodies'
 * (amk_pre_run); 3 (cold then warm norms and fused attentions) and 4 (the SM clock, in the
 * scheduler) write theirs directly. */
#define AMK_PROBE_IF(level, slot, cond) AMK_PROBE_AT(slot, AMK_PROBE == (level) && (cond))

/* Operand descriptors: the scheduler staged them in shared memory before the wait (the wait's
 * acquire empties L1, so reading them from global memory after it costs L2 round trips). */
__device__ __forceinline__ const amk_buffer_t* amk_in(const amk_task_ctx& c, int i) {
  return c.bufs ? &c.bufs[i] : &c.prog->buffers[c.inst->inputs[i]];
}
__device__ __forceinline__ const amk_buffer_t* amk_out(const amk_task_ctx& c, int j) {
  return c.bufs ? &c.bufs[AMK_MAX_INPUTS + j] : &c.prog->buffers[c.inst->outputs[j]];
}

/* Per-block memory that lives across the tasks of one launch: the scheduler zeroes it when the
 * block starts, and an op may keep there values that each of its tasks on the block would
 * otherwise recompute (the same for every layer of a decode step), under a key of its own whose
 * word 0 is the op's code + 1 (so 0 never matches). One op owns it at a time: another op's task
 * overwrites it, and a task that finds a different key recomputes. */
#define AMK_BLOCK_CACHE_WORDS 264
__shared__ __align__(16) uint32_t amk_block_cache[AMK_BLOCK_CACHE_WORDS];

/* Records the launch's first error (task, op, code, detail), raises the abort flag so every
 * other block stops waiting (not in amk_verify_tasks, where no block waits), and marks this
 * block failed. Any number of threads may call it. */
__device__ __noinline__ void amk_fail(const amk_task_ctx& c, int code, long long detail) {
  amk_status_t* st = c.prog->status;
  if (atomicCAS(&st->code, 0, -1) == 0) {
    st->task = c.task;
    st->op = c.inst->op;
    st->step = c.step;
    st->detail = detail;
    __threadfence_system();
    *((volatile int32_t*)&st->code) = code;
    __threadfence_system();
  }
  if (!c.check_only) {
    *c.prog->abort_flag = -1;
    __threadfence_system();
  }
  *c.failed = 1;
}

/* ---- scalar conversions (bit-exact with the CPU VM's `half` crate and cast rules) ---- */

__device__ __forceinline__ float amk_f16_to_f32(uint16_t h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ uint16_t amk_f32_to_f16(float f) {
  uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
__device__ __forceinline__ float amk_bf16_to_f32(uint16_t h) {
  return __uint_as_float(((uint32_t)h) << 16);
}
/* Round to nearest even; NaN stays a quiet NaN (as `half::bf16::from_f32`). */
__device__ __forceinline__ uint16_t amk_f32_to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}

/* fp8: exp bits, mantissa bits, bias; e4m3 has no infinity (only S.1111.111 is NaN). */
__device__ __forceinline__ float amk_f8_to_f32(uint8_t b, int eb, int mb, int bias, bool ieee) {
  float sign = (b & 0x80) ? -1.0f : 1.0f;
  int e = (b >> mb) & ((1 << eb) - 1);
  int m = b & ((1 << mb) - 1);
  int emax = (1 << eb) - 1;
  if (ieee && e == emax) return m == 0 ? sign * __int_as_float(0x7f800000) : __int_as_float(0x7fc00000);
  if (!ieee && e == emax && m == (1 << mb) - 1) return __int_as_float(0x7fc00000);
  float scale = (float)(1 << mb);
  if (e == 0) return sign * ((float)m / scale) * ldexpf(1.0f, 1 - bias);
  return sign * (1.0f + (float)m / scale) * ldexpf(1.0f, e - bias);
}
/* Nearest code, ties to the even code, saturating (the CPU's binary search, same answers). */
__device__ __noinline__ uint8_t amk_f32_to_f8(float x, int eb, int mb, int bias, bool ieee) {
  if (x != x) return 0x7f;
  uint8_t sign = (__float_as_uint(x) >> 31) ? 0x80 : 0;
  float a = fabsf(x);
  int max_code = ieee ? ((((1 << eb) - 2) << mb) | ((1 << mb) - 1)) : 0x7e;
  if (ieee && isinf(a)) return sign | (uint8_t)(((1 << eb) - 1) << mb);
  if (a >= amk_f8_to_f32((uint8_t)max_code, eb, mb, bias, ieee)) return sign | (uint8_t)max_code;
  int lo = 0, hi = max_code;
  while (lo < hi) {
    int mid = lo + (hi - lo + 1) / 2;
    if (amk_f8_to_f32((uint8_t)mid, eb, mb, bias, ieee) <= a) lo = mid; else hi = mid - 1;
  }
  float vb = amk_f8_to_f32((uint8_t)lo, eb, mb, bias, ieee);
  float va = amk_f8_to_f32((uint8_t)(lo + 1), eb, mb, bias, ieee);
  int code = (a - vb < va - a || (a - vb == va - a && lo % 2 == 0)) ? lo : lo + 1;
  return sign | (uint8_t)code;
}

/* Rust `as` casts from f32: truncate toward zero, saturate, NaN -> 0. */
__device__ __forceinline__ int32_t amk_f32_to_i32_sat(float x) {
  if (x != x) return 0;
  if (x >= 2147483647.0f) return 2147483647;
  if (x <= -2147483648.0f) return (int32_t)0x80000000;
  return (int32_t)x;
}
__device__ __forceinline__ long long amk_f32_to_i64_sat(float x) {
  if (x != x) return 0;
  if (x >= 9.2233720368547758e18f) return 0x7fffffffffffffffLL;
  if (x <= -9.2233720368547758e18f) return (long long)0x8000000000000000ULL;
  return (long long)x;
}

/* Element i of a row-packed I4 buffer: rows of ceil(K/2) bytes, K = last dim, low nibble first. */
__device__ __forceinline__ long long amk_i4_byte(const amk_buffer_t* b, long long i, int* shift) {
  long long k = b->rank > 0 ? b->shape[b->rank - 1] : 1;
  if (k < 1) k = 1;
  long long row = i / k, col = i % k;
  *shift = 4 * (int)(col & 1);
  return row * ((k + 1) / 2) + col / 2;
}

/* ---- element loads and stores by dtype (the CPU VM's get_f32 / set_f32 / get_i64 / set_i64) ---- */

__device__ __forceinline__ float amk_ld(const amk_buffer_t* b, long long i) {
  switch (b->dtype) {
    case AMK_F32: return ((const float*)b->ptr)[i];
    case AMK_F16: return amk_f16_to_f32(((const uint16_t*)b->ptr)[i]);
    case AMK_BF16: return amk_bf16_to_f32(((const uint16_t*)b->ptr)[i]);
    case AMK_I32: return (float)((const int32_t*)b->ptr)[i];
    case AMK_I8: return (float)((const int8_t*)b->ptr)[i];
    case AMK_U8: return (float)((const uint8_t*)b->ptr)[i];
    case AMK_BOOL: return ((const uint8_t*)b->ptr)[i] != 0 ? 1.0f : 0.0f;
    case AMK_F8E4M3: return amk_f8_to_f32(((const uint8_t*)b->ptr)[i], 4, 3, 7, false);
    case AMK_F8E5M2: return amk_f8_to_f32(((const uint8_t*)b->ptr)[i], 5, 2, 15, true);
    case AMK_I4: {
      int s;
      long long at = amk_i4_byte(b, i, &s);
      return (float)((((const uint8_t*)b->ptr)[at] >> s) & 0xf);
    }
    default: return __int_as_float(0x7fc00000);
  }
}

__device__ __forceinline__ void amk_st(const amk_buffer_t* b, long long i, float x) {
  switch (b->dtype) {
    case AMK_F32: ((float*)b->ptr)[i] = x; break;
    case AMK_F16: ((uint16_t*)b->ptr)[i] = amk_f32_to_f16(x); break;
    case AMK_BF16: ((uint16_t*)b->ptr)[i] = amk_f32_to_bf16(x); break;
    case AMK_I32: ((int32_t*)b->ptr)[i] = amk_f32_to_i32_sat(x); break;
    case AMK_I8: {
      int32_t v = amk_f32_to_i32_sat(x);
      ((int8_t*)b->ptr)[i] = (int8_t)(v < -128 ? -128 : (v > 127 ? 127 : v));
      break;
    }
    case AMK_U8: {
      int32_t v = amk_f32_to_i32_sat(x);
      ((uint8_t*)b->ptr)[i] = (uint8_t)(v < 0 ? 0 : (v > 255 ? 255 : v));
      break;
    }
    case AMK_BOOL: ((uint8_t*)b->ptr)[i] = (x != 0.0f) ? 1 : 0; break;
    case AMK_F8E4M3: ((uint8_t*)b->ptr)[i] = amk_f32_to_f8(x, 4, 3, 7, false); break;
    case AMK_F8E5M2: ((uint8_t*)b->ptr)[i] = amk_f32_to_f8(x, 5, 2, 15, true); break;
    case AMK_I4: {
      /* Two elements share a byte: callers writing I4 must give both nibbles of a byte to the
       * same thread (or serialise); this read-modify-write is not atomic. */
      int s;
      long long at = amk_i4_byte(b, i, &s);
      long long q = amk_f32_to_i64_sat(x);
      uint8_t v = (uint8_t)(q < 0 ? 0 : (q > 15 ? 15 : q));
      uint8_t* p = (uint8_t*)b->ptr + at;
      *p = (uint8_t)((*p & ~(0xf << s)) | (v << s));
      break;
    }
    default: break;
  }
}

__device__ __forceinline__ long long amk_ldi(const amk_buffer_t* b, long long i) {
  switch (b->dtype) {
    case AMK_I32: return ((const int32_t*)b->ptr)[i];
    case AMK_I8: return ((const int8_t*)b->ptr)[i];
    case AMK_U8: return ((const uint8_t*)b->ptr)[i];
    default: return amk_f32_to_i64_sat(amk_ld(b, i));
  }
}

__device__ __forceinline__ void amk_sti(const amk_buffer_t* b, long long i, long long x) {
  switch (b->dtype) {
    case AMK_I32:
      ((int32_t*)b->ptr)[i] = (int32_t)(x < -2147483648LL ? -2147483648LL : (x > 2147483647LL ? 2147483647LL : x));
      break;
    case AMK_I8: ((int8_t*)b->ptr)[i] = (int8_t)(x < -128 ? -128 : (x > 127 ? 127 : x)); break;
    case AMK_U8: ((uint8_t*)b->ptr)[i] = (uint8_t)(x < 0 ? 0 : (x > 255 ? 255 : x)); break;
    default: amk_st(b, i, (float)x); break;
  }
}

__device__ __forceinline__ bool amk_is_float(int dtype) {
  return dtype == AMK_F32 || dtype == AMK_F16 || dtype == AMK_BF16 || dtype == AMK_F8E4M3 ||
         dtype == AMK_F8E5M2;
}

/* a / b and a % b for sizes and indices: one 32-bit division when both are in [0, 2^32) — a
 * short inline sequence — else the 64-bit one, a subroutine of ~70 instructions. Every warp of
 * a block runs a task's checks, so on a task's path from its start to its wait each 64-bit
 * division cost the SM ~0.2 us (docs/perf-notes.md round 10). Exact for every input. */
__device__ __forceinline__ long long amk_udiv(long long a, long long b) {
  if ((((unsigned long long)a | (unsigned long long)b) >> 32) == 0)
    return (long long)((uint32_t)a / (uint32_t)b);
  return a / b;
}
__device__ __forceinline__ long long amk_urem(long long a, long long b) {
  if ((((unsigned long long)a | (unsigned long long)b) >> 32) == 0)
    return (long long)((uint32_t)a % (uint32_t)b);
  return a % b;
}

/* Last dim of a buffer (1 for rank 0), as the CPU VM's `last_dim`. */
__device__ __forceinline__ long long amk_last_dim(const amk_buffer_t* b) {
  return b->rank > 0 ? b->shape[b->rank - 1] : 1;
}

/* Bytes a buffer occupies (row-packed I4: rows of ceil(K/2) bytes). */
__device__ __forceinline__ long long amk_buffer_bytes(const amk_buffer_t* b) {
  switch (b->dtype) {
    case AMK_F32: case AMK_I32: return b->numel * 4;
    case AMK_F16: case AMK_BF16: return b->numel * 2;
    case AMK_I4: {
      long long k = amk_last_dim(b);
      if (k < 1) return 0;
      return (b->numel / k) * ((k + 1) / 2);
    }
    default: return b->numel;
  }
}

/* ---- fast element access and elementwise loops (shared by the ops) ---- */

/* amk_ld / amk_st / amk_ldi / amk_sti out of line: their fp8 and I4 cases are large, so the
 * megakernel keeps one copy of each and the inline helpers below call it for the rare dtypes. */
__device__ __noinline__ float amk_ld_slow(const amk_buffer_t* b, long long i) { return amk_ld(b, i); }
__device__ __noinline__ void amk_st_slow(const amk_buffer_t* b, long long i, float x) {
  amk_st(b, i, x);
}
__device__ __noinline__ long long amk_ldi_slow(const amk_buffer_t* b, long long i) {
  return amk_ldi(b, i);
}
__device__ __noinline__ void amk_sti_slow(const amk_buffer_t* b, long long i, long long x) {
  amk_sti(b, i, x);
}

/* amk_ld with F32/BF16/F16 inline, every other dtype through amk_ld_slow (same results). */
__device__ __forceinline__ float amk_ldf(const amk_buffer_t* b, long long i) {
  const int dt = b->dtype;
  if (AMK_IS_F32(dt)) return ((const float*)b->ptr)[i];
  if (AMK_IS_BF16(dt)) return amk_bf16_to_f32(((const uint16_t*)b->ptr)[i]);
  if (AMK_IS_F16(dt)) return amk_f16_to_f32(((const uint16_t*)b->ptr)[i]);
  return amk_ld_slow(b, i);
}
/* amk_st with F32/BF16/F16 inline, every other dtype through amk_st_slow (same results). */
__device__ __forceinline__ void amk_stf(const amk_buffer_t* b, long long i, float x) {
  const int dt = b->dtype;
  if (AMK_IS_F32(dt)) ((float*)b->ptr)[i] = x;
  else if (AMK_IS_BF16(dt)) ((uint16_t*)b->ptr)[i] = amk_f32_to_bf16(x);
  else if (AMK_IS_F16(dt)) ((uint16_t*)b->ptr)[i] = amk_f32_to_f16(x);
  else amk_st_slow(b, i, x);
}
/* amk_ld / amk_st with only F32 inline (smallest code), the rest out of line. */
__device__ __forceinline__ float amk_ldf32(const amk_buffer_t* b, long long i) {
  if (b->dtype == AMK_F32) return ((const float*)b->ptr)[i];
  return amk_ld_slow(b, i);
}
__device__ __forceinline__ void amk_stf32(const amk_buffer_t* b, long long i, float x) {
  if (b->dtype == AMK_F32) ((float*)b->ptr)[i] = x;
  else amk_st_slow(b, i, x);
}
/* amk_ldi / amk_sti with the I32 case inline. */
__device__ __forceinline__ long long amk_ldif(const amk_buffer_t* b, long long i) {
  return b->dtype == AMK_I32 ? (long long)((const int32_t*)b->ptr)[i] : amk_ldi_slow(b, i);
}
__device__ __forceinline__ void amk_stif(const amk_buffer_t* b, long long i, long long x) {
  if (b->dtype == AMK_I32)
    ((int32_t*)b->ptr)[i] =
        (int32_t)(x < -2147483648LL ? -2147483648LL : (x > 2147483647LL ? 2147483647LL : x));
  else
    amk_sti_slow(b, i, x);
}

/* The CPU VM's DType::is_integer. */
__device__ __forceinline__ bool amk_is_int(int dt) {
  return dt == AMK_I32 || dt == AMK_I8 || dt == AMK_I4 || dt == AMK_U8 || dt == AMK_BOOL;
}
/* Dtypes with a vectorised 8-element load/store (amk_ld8 / amk_st8). */
__device__ __forceinline__ bool amk_is_vec(int dt) {
  return dt == AMK_F32 || dt == AMK_BF16 || dt == AMK_F16;
}
/* Element size of the dtypes whose same-dtype copy is the identity on the stored bits, else 0. */
__device__ __forceinline__ int amk_raw_size(int dt) {
  switch (dt) {
    case AMK_F32: case AMK_I32: return 4;
    case AMK_F16: case AMK_BF16: return 2;
    case AMK_I8: case AMK_U8: return 1;
    default: return 0; /* BOOL (normalises to 0/1), fp8 (NaN codes), I4 (padding nibbles) */
  }
}

/* 16-byte alignment of a buffer base (the vector paths need it; arena buffers are 256-aligned). */
__device__ __forceinline__ bool amk_al16(const void* p) {
  return (((unsigned long long)p) & 15ull) == 0;
}

/* The raw bits of elements 8u .. 8u+7 of an F32/BF16/F16 array: one 16-byte load (a; b is 0)
 * for 16-bit dtypes, two (a, b) for F32; the base must be 16-byte aligned. Branch-free, so a
 * caller can put several in flight before it converts any (amk_cvt8). W32 = false: the caller
 * knows dt is BF16 or F16 (one load, b = 0, no registers for b once inlined). */
template <bool W32 = true>
__device__ __forceinline__ void amk_ld8_raw(const void* p, int dt, long long u, uint4& a,
                                            uint4& b) {
  const bool f32 = W32 && dt == AMK_F32;
  const uint4* q = (const uint4*)p + (f32 ? 2 * u : u);
  a = q[0];
  b = make_uint4(0u, 0u, 0u, 0u);
  if (f32) b = q[1];
}

/* The 8 f32 values of amk_ld8_raw's bits (exact, as amk_ld). W32 = false: dt is BF16 or F16. */
template <bool W32 = true>
__device__ __forceinline__ void amk_cvt8(int dt, const uint4& a, const uint4& b, float* f) {
  if (W32 && dt == AMK_F32) {
    f[0] = __uint_as_float(a.x); f[1] = __uint_as_float(a.y);
    f[2] = __uint_as_float(a.z); f[3] = __uint_as_float(a.w);
    f[4] = __uint_as_float(b.x); f[5] = __uint_as_float(b.y);
    f[6] = __uint_as_float(b.z); f[7] = __uint_as_float(b.w);
  } else {
    const uint32_t w[4] = {a.x, a.y, a.z, a.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint16_t lo = (uint16_t)(w[k] & 0xffffu), hi = (uint16_t)(w[k] >> 16);
      if (AMK_BF_OF(dt)) {
        f[2 * k] = amk_bf16_to_f32(lo);
        f[2 * k + 1] = amk_bf16_to_f32(hi);
      } else {
        f[2 * k] = amk_f16_to_f32(lo);
        f[2 * k + 1] = amk_f16_to_f32(hi);
      }
    }
  }
}

/* Elements 8u .. 8u+7 of an F32/BF16/F16 array as f32 (exact, as amk_ld): one or two 16-byte
 * loads, so the base must be 16-byte aligned. */
__device__ __forceinline__ void amk_ld8(const void* p, int dt, long long u, float* f) {
  uint4 a, b;
  amk_ld8_raw(p, dt, u, a, b);
  amk_cvt8(dt, a, b, f);
}

/* f[0..8) cast to BF16 or F16 (dt) exactly as amk_st, packed as stored (element 0 lowest). */
__device__ __forceinline__ uint4 amk_pack8(int dt, const float* f) {
  uint32_t w[4];
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    uint16_t lo, hi;
    if (AMK_BF_OF(dt)) {
      lo = amk_f32_to_bf16(f[2 * k]);
      hi = amk_f32_to_bf16(f[2 * k + 1]);
    } else {
      lo = amk_f32_to_f16(f[2 * k]);
      hi = amk_f32_to_f16(f[2 * k + 1]);
    }
    w[k] = (uint32_t)lo | ((uint32_t)hi << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

/* Stores f[0..8) at elements 8u .. 8u+7 of an F32/BF16/F16 array, cast on store exactly as
 * amk_st (16-byte stores). */
__device__ __forceinline__ void amk_st8(void* p, int dt, long long u, const float* f) {
  if (dt == AMK_F32) {
    uint4* q = (uint4*)p + 2 * u;
    q[0] = make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]),
                      __float_as_uint(f[3]));
    q[1] = make_uint4(__float_as_uint(f[4]), __float_as_uint(f[5]), __float_as_uint(f[6]),
                      __float_as_uint(f[7]));
  } else {
    ((uint4*)p)[u] = amk_pack8(dt, f);
  }
}

/* Calls g(e) for every output element e in [lo, n), block-strided and coalesced. An I4 output
 * packs two elements per byte (rows of ceil(K/2) bytes): there each thread owns whole bytes and
 * writes both nibbles itself, so no two threads read-modify-write one byte (lo must be 0). */
template <typename G>
__device__ __forceinline__ void amk_each_out(const amk_buffer_t* out, long long lo, long long n,
                                             G g) {
  if (out->dtype == AMK_I4) {
    const long long k = amk_last_dim(out);
    if (k < 1) return;
    const long long bpr = (k + 1) / 2;
    const long long nbytes = (n / k) * bpr;
    for (long long b = threadIdx.x; b < nbytes; b += AMK_THREADS) {
      const long long row = b / bpr, c = b - row * bpr;
      const long long e = row * k + 2 * c;
      g(e);
      if (2 * c + 1 < k) g(e + 1);
    }
    return;
  }
  for (long long i = lo + threadIdx.x; i < n; i += AMK_THREADS) g(i);
}

/* AMK_EW_UNROLL32, AMK_EW_UNROLL16: device knobs, defined with their defaults in amk_knobs.cuh. */

/* The vector body of amk_ew_apply over vectors [0, nv) (input k: base ip[k], dtype idt[k]; out:
 * op, odt; all F32/BF16/F16 with 16-byte aligned bases; W32 = false: every input is BF16/F16).
 * Rounds of U vectors per thread: every load of the round is issued before any is used, then
 * the values are computed and stored, so a latency-bound size (8192 elements: one round) waits
 * for memory once, not once per vector. Each thread reads and writes only its own elements, so
 * out may alias an input of the same dtype. Called out of line (amk_ew_vec): its own register
 * allocation, so the megakernel's large dispatch function does not spill the loads in flight. */
template <int NIN, bool W32, typename F>
__device__ __forceinline__ void amk_ew_body(const void* const* ip, const int* idt, void* op,
                                            int odt, long long nv, F f) {
  constexpr int U = W32 ? AMK_EW_UNROLL32 : AMK_EW_UNROLL16;
  for (long long u0 = threadIdx.x; u0 < nv; u0 += (long long)U * AMK_THREADS) {
    uint4 ra[U][NIN], rb[U][NIN];
#pragma unroll
    for (int q = 0; q < U; ++q) {
      const long long u = u0 + (long long)q * AMK_THREADS;
#pragma unroll
      for (int k = 0; k < NIN; ++k) {
        /* defined when skipped: no value carried over from the previous round */
        ra[q][k] = rb[q][k] = make_uint4(0u, 0u, 0u, 0u);
        if (u < nv) amk_ld8_raw<W32>(ip[k], idt[k], u, ra[q][k], rb[q][k]);
      }
    }
#pragma unroll
    for (int q = 0; q < U; ++q) {
      const long long u = u0 + (long long)q * AMK_THREADS;
      if (u < nv) {
        float a[NIN][8];
#pragma unroll
        for (int k = 0; k < NIN; ++k) amk_cvt8<W32>(idt[k], ra[q][k], rb[q][k], a[k]);
        float r[8];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          float t[NIN];
#pragma unroll
          for (int k = 0; k < NIN; ++k) t[k] = a[k][e];
          r[e] = f(t);
        }
        amk_st8(op, odt, u, r);
      }
    }
  }
}
/* amk_ew_body out of line for one or two inputs (operands as scalars: no array in memory). */
template <int NIN, bool W32, typename F>
__device__ __noinline__ void amk_ew_vec(const void* p0, int d0, const void* p1, int d1, void* op,
                                        int odt, long long nv, F f) {
  const void* const ip[2] = {p0, p1};
  const int idt[2] = {d0, d1};
  amk_ew_body<NIN, W32>(ip, idt, op, odt, nv, f);
}

/* out[i] = f(in_0[i], .., in_{NIN-1}[i]) over n elements, f taking the f32 values (amk_ld) and
 * returning the f32 result (cast on store). When every operand is F32/BF16/F16 with a 16-byte
 * aligned base (arena bases are 256-byte aligned) the body runs 8 elements per vector with
 * 16-byte loads/stores (amk_ew_body: every load of a round in flight at once; out of line for
 * one or two inputs); the tail and every other dtype combination go element by element
 * (amk_each_out). */
template <int NIN, typename F>
__device__ __forceinline__ void amk_ew_apply(const amk_buffer_t* const* in,
                                             const amk_buffer_t* out, long long n, F f) {
  const void* ip[NIN];
  int idt[NIN];
  void* const op = out->ptr;
  const int odt = out->dtype;
  bool vec = amk_is_vec(odt) && amk_al16(op);
  bool w32 = false;
#pragma unroll
  for (int k = 0; k < NIN; ++k) {
    ip[k] = in[k]->ptr;
    idt[k] = in[k]->dtype;
    vec = vec && amk_is_vec(idt[k]) && amk_al16(ip[k]);
    w32 = w32 || idt[k] == AMK_F32;
  }
  const long long nv = vec ? n / 8 : 0;
  if (nv > 0) {
    if constexpr (NIN <= 2) {
      const void* const p1 = ip[NIN - 1];
      const int d1 = idt[NIN - 1];
      if (w32) amk_ew_vec<NIN, true>(ip[0], idt[0], p1, d1, op, odt, nv, f);
      else amk_ew_vec<NIN, false>(ip[0], idt[0], p1, d1, op, odt, nv, f);
    } else {
      if (w32) amk_ew_body<NIN, true>(ip, idt, op, odt, nv, f);
      else amk_ew_body<NIN, false>(ip, idt, op, odt, nv, f);
    }
  }
  amk_each_out(out, nv * 8, n, [&](long long i) {
    float t[NIN];
#pragma unroll
    for (int k = 0; k < NIN; ++k) t[k] = amk_ldf(in[k], i);
    amk_stf(out, i, f(t));
  });
}

/* ---- block reductions (every thread calls; every thread gets the result) ---- */

__device__ __forceinline__ float amk_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ double amk_warp_sum_d(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float amk_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/* Warp reduce: fmaxf when MAX, else the float (or double) sum. */
template <typename T, bool MAX>
__device__ __forceinline__ T amk_warp_reduce(T v) {
  if constexpr (MAX) return amk_warp_max(v);
  else if constexpr (sizeof(T) == 8) return amk_warp_sum_d(v);
  else return amk_warp_sum(v);
}
/* The block reduction behind amk_block_sum / amk_block_sum_d / amk_block_max: warp reduce,
 * one partial per warp in shared memory, warp 0 reduces those, everyone reads the result.
 * Starts and ends with a barrier (callers rely on both). MAX: fmaxf, identity -inf; else sum,
 * identity 0. Each instantiation has its own 32-entry shared scratch. */
template <typename T, bool MAX>
__device__ __forceinline__ T amk_block_reduce(T v) {
  __shared__ T red[32];
  v = amk_warp_reduce<T, MAX>(v);
  const int w = threadIdx.x >> 5, l = threadIdx.x & 31;
  __syncthreads();
  if (l == 0) red[w] = v;
  __syncthreads();
  T t = (threadIdx.x < AMK_WARPS) ? red[threadIdx.x] : (MAX ? -__int_as_float(0x7f800000) : (T)0);
  if (w == 0) t = amk_warp_reduce<T, MAX>(t);
  if (threadIdx.x == 0) red[0] = t;
  __syncthreads();
  t = red[0];
  __syncthreads();
  return t;
}

__device__ __noinline__ float amk_block_sum(float v) { return amk_block_reduce<float, false>(v); }
__device__ __noinline__ double amk_block_sum_d(double v) { return amk_block_reduce<double, false>(v); }
/* amk_block_sum or amk_block_sum_d by the argument's type (the norms' amk_norm_t). */
__device__ __forceinline__ float amk_block_sum_of(float v) { return amk_block_sum(v); }
__device__ __forceinline__ double amk_block_sum_of(double v) { return amk_block_sum_d(v); }

/* ---- vector-row helpers of the norms (RMSNORM, LAYERNORM) ---- */

/* Block sum of per-thread f64 partials with one barrier: warp shuffle, one partial per warp in
 * shared memory, every thread adds the AMK_WARPS partials in the same order (all get the same
 * value). Calls alternate between two slots (par = call count & 1): a warp can only write a slot
 * again after the next call's barrier, by which time every thread has read it. The scheduler's
 * barrier after each task covers the first call of the next one. */
template <typename T>
__device__ __forceinline__ T amk_norm_block_sum(T s, int par) {
  __shared__ T red[2][AMK_WARPS];
  s = amk_warp_reduce<T, false>(s);
  if ((threadIdx.x & 31) == 0) red[par][threadIdx.x >> 5] = s;
  __syncthreads();
  T t = (T)0;
#pragma unroll
  for (int k = 0; k < AMK_WARPS; ++k) t += red[par][k];
  return t;
}

/* The vector path keeps only the raw bits of the row operands in registers (a uint4 pair per vector of 8
 * elements) and converts them where it uses them (one instruction per element); vector
 * u = t + q * G of a row (q < V, u < hv = hidden / 8), t the thread's index in its group of G
 * threads. */

/* Issues the 16-byte loads of the thread's vectors of the row at vector offset ub. */
template <int G, int V>
__device__ __forceinline__ void amk_norm_ld(const void* p, int dt, long long ub, long long hv, int t,
                                       uint4* a, uint4* b) {
#pragma unroll
  for (int q = 0; q < V; ++q) {
    const long long u = t + (long long)q * G;
    a[q] = b[q] = make_uint4(0u, 0u, 0u, 0u); /* defined when skipped (no carried value) */
    if (u < hv) amk_ld8_raw(p, dt, ub + u, a[q], b[q]);
  }
}

/* Hides the raw bits' origin from the optimiser (emits nothing): values converted after this are
 * converted again from the raw registers, instead of f32/f64 copies of every element being kept
 * live (or hoisted out of a row loop), which would not fit in the megakernel's registers. Only
 * for bits already waited for: it is a use. */
template <int V>
__device__ __forceinline__ void amk_norm_opaque(uint4* a, uint4* b) {
#pragma unroll
  for (int q = 0; q < V; ++q)
    asm volatile("" : "+r"(a[q].x), "+r"(a[q].y), "+r"(a[q].z), "+r"(a[q].w), "+r"(b[q].x),
                 "+r"(b[q].y), "+r"(b[q].z), "+r"(b[q].w));
}

/* ---- RoPE arithmetic shared by ROPE and QKV_ROPE_APPEND (ops/rope/src/reference.rs) ---- */

/* inv_freq[i] = 1 / theta^(i / half): the quotient and the reciprocal in fp32, the power in f64
 * rounded to fp32 (as the CPU reference). */
__device__ __forceinline__ float amk_rope_inv_freq(float theta, int i, int half) {
  const float e = __fdiv_rn((float)i, (float)half);
  const float pw = (float)pow((double)theta, (double)e);
  return __fdiv_rn(1.0f, pw);
}
/* amk_rope_inv_freq divided by the per-pair frequency factor fac[i] when the task has factors
 * (Llama 3's frequency scaling; one fp32 division, as the CPU reference). */
__device__ __forceinline__ float amk_rope_inv_freq_scaled(float theta, int i, int half,
                                                          const amk_buffer_t* fac) {
  const float f = amk_rope_inv_freq(theta, i, half);
  return fac ? __fdiv_rn(f, amk_ldf(fac, i)) : f;
}
/* The rotation of one pair, every product and sum rounded separately (no FMA contraction:
 * the CPU rounds each step). */
__device__ __forceinline__ void amk_rope_pair(float x1, float x2, float c, float s, float& ya,
                                          float& yb) {
  ya = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
  yb = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
}

/* cos (w == 0) or sin (w == 1) of an fp32 angle, rounded to fp32 from f64 as the CPU. */
__device__ __noinline__ float amk_rope_trig(float ang, int w) {
  return w ? (float)sin((double)ang) : (float)cos((double)ang);
}
/* Both of amk_rope_trig's values from one f64 argument reduction. */
__device__ __noinline__ void amk_rope_sincos(float ang, float& c, float& s) {
  double sd, cd;
  sincos((double)ang, &sd, &cd);
  c = (float)cd;
  s = (float)sd;
}

/* x as a dtype of the fused tiles (F32/F16/BF16) rounds it on store: the value read back. */
__device__ __forceinline__ float amk_round_dt(int dt, float x) {
  if (AMK_IS_BF16(dt)) return amk_bf16_to_f32(amk_f32_to_bf16(x));
  if (AMK_IS_F16(dt)) return amk_f16_to_f32(amk_f32_to_f16(x));
  return x;
}

/* ---- RMSNORM's vector path (also the fused decode tiles' prologue) ---- */

/* Vectors of 8 elements per thread on the vector path: block rows up to 8 * AMK_THREADS * AMK_RMS_VB
 * elements (8192), warp rows (hidden <= 1024) up to 8 * 32 * AMK_RMS_VW. Wider rows take the scalar
 * path. */
#define AMK_RMS_VB 4
#define AMK_RMS_VW 4


/* AMK_NORM_F32: device knob, defined with its default in amk_knobs.cuh. */
#if AMK_NORM_F32
typedef float amk_norm_t;
#else
typedef double amk_norm_t;
#endif

/* s + v * v in amk_norm_t (one fused multiply-add). */
__device__ __forceinline__ amk_norm_t amk_rms_sq(amk_norm_t s, float v) {
  const amk_norm_t d = (amk_norm_t)v;
  return fma(d, d, s);
}

/* 1 / rms from the row's sum of squares s over h elements: 1 / sqrt(s / h + eps) with IEEE
 * division and square root in f64; in f32 (AMK_NORM_F32) rsqrtf of the IEEE quotient plus
 * eps, as torch's rsqrt. */
__device__ __forceinline__ amk_norm_t amk_rms_inv(amk_norm_t s, long long h, float eps) {
#if AMK_NORM_F32
  return rsqrtf(__fadd_rn(__fdiv_rn(s, (float)h), eps));
#else
  return 1.0 / sqrt(s / (double)h + (double)eps);
#endif
}

/* One normalised element, x * inv * w in amk_norm_t (left to right), as f32. */
__device__ __forceinline__ float amk_rms_apply(float x, amk_norm_t inv, float w) {
#if AMK_NORM_F32
  return __fmul_rn(__fmul_rn(x, inv), w);
#else
  return (float)((double)x * inv * (double)w);
#endif
}

/* The thread's sum of squares of its elements of x (its vectors in order, each in order). */
template <int G, int V>
__device__ __forceinline__ amk_norm_t amk_rms_sumsq(int dt, long long hv, int t, const uint4* a,
                                                    const uint4* b) {
  amk_norm_t s = (amk_norm_t)0;
#pragma unroll
  for (int q = 0; q < V; ++q) {
    if (t + (long long)q * G < hv) {
      float f[8];
      amk_cvt8(dt, a[q], b[q], f);
#pragma unroll
      for (int e = 0; e < 8; ++e) s = amk_rms_sq(s, f[e]);
    }
  }
  return s;
}

/* y = x * inv * w per element (amk_rms_apply), cast on store (16-byte stores). */
template <int G, int V>
__device__ __forceinline__ void amk_rms_store(void* op, int odt, long long ub, long long hv, int t,
                                          int xdt, const uint4* xa, const uint4* xb, int wdt,
                                          const uint4* wa, const uint4* wb, amk_norm_t inv) {
#pragma unroll
  for (int q = 0; q < V; ++q) {
    const long long u = t + (long long)q * G;
    if (u < hv) {
      float xf[8], wf[8], o[8];
      amk_cvt8(xdt, xa[q], xb[q], xf);
      amk_cvt8(wdt, wa[q], wb[q], wf);
#pragma unroll
      for (int e = 0; e < 8; ++e) o[e] = amk_rms_apply(xf[e], inv, wf[e]);
      amk_st8(op, odt, ub + u, o);
    }
  }
}

/* A thread's vector of the norm weight (raw bits, amk_ld8_raw), loaded before a task's wait
 * (amk_norm_w_load); amk_rms_rows<G, 1, true> uses it instead of loading w. */
struct amk_norm_w {
  uint4 a, b;
};

/* Rows r0, r0 + rstep, .. < rows, each by a group of G threads (G = 32: one warp, t = lane,
 * shuffle reduce; G = AMK_THREADS: the whole block, t = threadIdx.x, r0 = 0, rstep = 1, so the
 * row loop and its barriers are block-uniform). Needs hidden % 8 == 0, hidden / 8 <= G * V, x,
 * w and out (base, dtype) F32/BF16/F16 with 16-byte aligned bases. w and the first row of x are
 * loaded together; each row's loads of x are all issued before any is used, x stays in
 * registers from the reduce to the store, and w (used only at the store) is waited for only
 * there, so with one row (decode) its HBM latency overlaps x's and the reduce. Out of line: its
 * own register allocation, so the megakernel's large dispatch function spills nothing in
 * flight. WPRE (one vector a thread): w's vector is `wpre`, loaded before the task's wait. */
template <int G, int V, bool WPRE = false>
__device__ __noinline__ void amk_rms_rows(const void* xp, int xdt, const void* wp, int wdt, void* op,
                                      int odt, long long h, float eps, long long rows,
                                      long long r0, long long rstep, int t,
                                      amk_norm_w wpre = amk_norm_w{}) {
  const long long hv = h >> 3;
  if (r0 >= rows) return; /* warp mode: a warp without rows (warp-uniform); block: no rows */
  uint4 wa[V], wb[V], xa[V], xb[V];
  if constexpr (WPRE) {
    static_assert(V == 1, "a preloaded norm weight is one vector a thread");
    wa[0] = wpre.a;
    wb[0] = wpre.b;
  } else {
    amk_norm_ld<G, V>(wp, wdt, 0, hv, t, wa, wb);
  }
  amk_norm_ld<G, V>(xp, xdt, r0 * hv, hv, t, xa, xb);
  int par = 0;
#pragma unroll 1
  for (long long r = r0;;) {
    amk_norm_t s = amk_rms_sumsq<G, V>(xdt, hv, t, xa, xb);
    AMK_PROBE_IF(1, 6, G != 32 && s != -1.0); /* x has landed */
    amk_norm_opaque<V>(xa, xb);
    if (G == 32) {
      s = amk_warp_reduce<amk_norm_t, false>(s);
    } else {
      s = amk_norm_block_sum(s, par);
      par ^= 1;
    }
    const amk_norm_t inv = amk_rms_inv(s, h, eps);
    AMK_PROBE_IF(1, 7, G != 32 && inv != -1.0); /* 1 / rms(x) */
    amk_rms_store<G, V>(op, odt, r * hv, hv, t, xdt, xa, xb, wdt, wa, wb, inv);
    r += rstep;
    if (r >= rows) break;
    amk_norm_opaque<V>(wa, wb); /* w's conversion stays in the loop (waited for by now) */
    amk_norm_ld<G, V>(xp, xdt, r * hv, hv, t, xa, xb);
  }
}

/* Max ignoring nothing: NaN propagates like fmaxf (NaN loses); callers needing NaN-aware
 * semantics handle them before reducing. */
__device__ __noinline__ float amk_block_max(float v) { return amk_block_reduce<float, true>(v); }

#endif /* AMK_DEVICE_CUH */
