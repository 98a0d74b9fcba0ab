// What the memory-path microbenchmarks (pollbench.cu, ctxbench.cu) share: the loads they time,
// the clock, the cold weight buffer they stream from and their percentiles.
#pragma once
#include <algorithm>
#include <cstdio>
#include <vector>

typedef unsigned int u32;

// 16-byte weight loads a lane in flight, as the megakernel's one-pass rows (3 for K = 576).
#define U 3
// Blocks of 256 threads: one per H100 SM.
#define MB_BLOCKS 132
// uint4 weights a block streams per launch (8 warps x 32 lanes x U).
#define MB_BLOCK_VECS (8LL * 32 * U)

// A weight load as the fused tiles issue it (L1 no-allocate). The `memory` clobber variant
// keeps it after an earlier asm poll: the compiler moves the plain one across such a poll.
__device__ __forceinline__ uint4 ldw(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ uint4 ldwm(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ u32 ld_acq(const u32* p) {
  u32 v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ u32 ld_rlx(const u32* p) {
  u32 v;
  asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ long long clk() {
  long long c;
  asm volatile("mov.u64 %0, %%clock64;" : "=l"(c)::"memory");
  return c;
}

// 1 GiB of weights (not zeros), handed out a launch's worth at a time in order, so that every
// launch reads lines no recent launch left in the 50 MB L2.
struct mb_weights {
  uint4* base = nullptr;
  long long per = 0, slots = 0, next_slot = 0;
  mb_weights() {
    const long long total = 1LL << 30;
    cudaMalloc(&base, total);
    cudaMemset(base, 0x5a, total);
    per = (long long)MB_BLOCKS * MB_BLOCK_VECS;
    slots = total / 16 / per;
  }
  const uint4* next() { return base + (next_slot++ % slots) * per; }
};

// The q-quantile of v (q in [0, 1]).
inline long long mb_pct(std::vector<long long> v, double q) {
  std::sort(v.begin(), v.end());
  return v[(size_t)(q * (double)(v.size() - 1))];
}
