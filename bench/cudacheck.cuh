// What the cluster microbenchmarks share: short integer names, a CUDA call checked (the
// message, then exit 1), and the global timer in ns.
#pragma once
#include <cstdio>
#include <cstdlib>
typedef unsigned int u32;
typedef unsigned long long u64;

#define CHECK(x)                                                                          \
  do {                                                                                    \
    cudaError_t e_ = (x);                                                                 \
    if (e_ != cudaSuccess) {                                                              \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                            \
    }                                                                                     \
  } while (0)

__device__ __forceinline__ u64 gtime() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t)::"memory");
  return t;
}
