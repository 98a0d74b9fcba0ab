// Can the persistent megakernel run as thread-block clusters? (docs/attention-across-sms.md,
// Part 2: a KV head's splits as one cluster, merged through distributed shared memory.) For
// cluster sizes C = 1, 2, 4, 8, 16, a kernel shaped like the megakernel (256 threads, one CTA
// a SM: 120 KiB of dynamic shared memory):
//  1. how many clusters of C can be resident at once (cudaOccupancyMaxActiveClusters), so how
//     many of the device's SMs a grid of whole clusters can use;
//  2. whether a cooperative launch (every CTA resident, as the megakernel needs) of that many
//     clusters is accepted;
//  3. the cost of one merge step inside a persistent loop: each CTA writes a partial of 264
//     words (4 query heads of head_dim 64 plus m and l) to its shared memory, the cluster
//     meets at its barrier, every CTA sums the element it owns over the cluster's C partials
//     read through distributed shared memory, and the cluster meets again (ns a step).
// Every loop is gated: each CTA's sums must equal the host's closed form.
//
//   nvcc -arch=sm_90a -O3 -std=c++17 bench/clusterfit.cu -o clusterfit && ./clusterfit
#include <cooperative_groups.h>
#include "cudacheck.cuh"
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>
namespace cg = cooperative_groups;

constexpr int THREADS = 256;
constexpr int PART = 264;                 // words of one partial
constexpr int SMEM = 120 * 1024;          // dynamic shared memory: one CTA a SM
constexpr int SIZES[] = {1, 2, 4, 8, 16};

// `iters` merge steps. Step i: the CTA of rank r in its cluster writes r + i into every word of
// its partial; after the barrier, thread t sums word t over the cluster's partials (C·i +
// C(C-1)/2) into its total; a second barrier keeps a partial from being rewritten while
// another CTA still reads it. CTA 0 records the ns a step; `sums` gets each CTA's word-0 total.
__global__ void __launch_bounds__(THREADS, 1) merge_loop(int iters, u32* sums, u64* ns) {
  extern __shared__ u32 part[];
  cg::cluster_group cl = cg::this_cluster();
  const u32 rank = cl.block_rank(), c = cl.num_blocks();
  u32 total = 0;
  cl.sync();
  const u64 t0 = gtime();
  for (int i = 0; i < iters; ++i) {
    for (int w = threadIdx.x; w < PART; w += THREADS) part[w] = rank + (u32)i;
    cl.sync();
    if (threadIdx.x < PART) {
      u32 s = 0;
      for (u32 r = 0; r < c; ++r) s += cl.map_shared_rank(part, r)[threadIdx.x];
      total += s;
    }
    cl.sync();
  }
  const u64 t1 = gtime();
  if (threadIdx.x == 0) {
    sums[blockIdx.x] = total;
    if (blockIdx.x == 0) *ns = (t1 - t0) / (u64)iters;
  }
}

// The launch configuration of `ctas` CTAs in clusters of `c`, cooperative or not.
struct Launch {
  cudaLaunchConfig_t cfg = {};
  cudaLaunchAttribute attr[2];
  Launch(int ctas, int c, bool cooperative) {
    cfg.gridDim = dim3(ctas);
    cfg.blockDim = dim3(THREADS);
    cfg.dynamicSmemBytes = SMEM;
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = c;
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    attr[1].id = cudaLaunchAttributeCooperative;
    attr[1].val.cooperative = 1;
    cfg.attrs = attr;
    cfg.numAttrs = cooperative ? 2 : 1;
  }
};

int main() {
  int dev = 0, sms = 0;
  CHECK(cudaGetDevice(&dev));
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  CHECK(cudaFuncSetAttribute(merge_loop, cudaFuncAttributeMaxDynamicSharedMemorySize, SMEM));
  CHECK(cudaFuncSetAttribute(merge_loop, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  u32* d_sums;
  u64* d_ns;
  CHECK(cudaMalloc(&d_sums, sms * sizeof(u32)));
  CHECK(cudaMalloc(&d_ns, sizeof(u64)));
  const int iters = 20000;
  printf("SMs: %d\n\n", sms);
  printf("| C | clusters resident | CTAs | cooperative launch | merge step, ns (median of 5) |\n");
  printf("|---|---|---|---|---|\n");
  for (int c : SIZES) {
    Launch probe(c, c, false);
    int clusters = 0;
    const cudaError_t oe = cudaOccupancyMaxActiveClusters(&clusters, merge_loop, &probe.cfg);
    if (oe != cudaSuccess) {
      printf("| %d | refused: %s | | | |\n", c, cudaGetErrorString(oe));
      cudaGetLastError();
      continue;
    }
    const int ctas = std::min(clusters * c, sms / c * c);
    std::vector<double> steps;
    const char* coop = "accepted";
    for (int r = 0; r < 5; ++r) {
      Launch l(ctas, c, true);
      CHECK(cudaMemset(d_sums, 0, sms * sizeof(u32)));
      cudaError_t le = cudaLaunchKernelEx(&l.cfg, merge_loop, iters, d_sums, d_ns);
      if (le == cudaSuccess) le = cudaDeviceSynchronize();
      if (le != cudaSuccess) {
        coop = cudaGetErrorString(le);
        cudaGetLastError();
        break;
      }
      std::vector<u32> got(ctas);
      CHECK(cudaMemcpy(got.data(), d_sums, ctas * sizeof(u32), cudaMemcpyDeviceToHost));
      // sum over i < iters of (c·i + c(c-1)/2), modulo 2^32 as the device's u32 sums
      const u64 want = ((u64)c * ((u64)iters * (iters - 1) / 2) + (u64)iters * c * (c - 1) / 2) &
                       0xffffffffull;
      for (int b = 0; b < ctas; ++b)
        if (got[b] != (u32)want) {
          fprintf(stderr, "GATE: C = %d, CTA %d: %u, host %llu\n", c, b, got[b], want);
          return 2;
        }
      u64 ns;
      CHECK(cudaMemcpy(&ns, d_ns, sizeof(u64), cudaMemcpyDeviceToHost));
      steps.push_back((double)ns);
    }
    if (steps.size() < 5) {
      printf("| %d | %d | %d | %s | |\n", c, clusters, ctas, coop);
      continue;
    }
    std::sort(steps.begin(), steps.end());
    printf("| %d | %d | %d | %s | %.0f |\n", c, clusters, ctas, coop, steps[2]);
  }
  return 0;
}
